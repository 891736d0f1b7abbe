"""TopAgg: DataLens' private gradient aggregation (Wang, Wu, Long et al., CCS 2021, Algorithm 2).

For every generated sample ``j`` every teacher ``t`` compresses its descent direction
``Δx_{t,j}`` (``[d]``) to its ``k`` coordinates of largest magnitude and replaces each by a
*stochastic sign*: +1 with probability ``½ + g/(2b)``, −1 otherwise (``b`` the teacher's largest
``|g|`` on that sample, optionally capped by ``max_grad``; values beyond ``±b`` give a sure sign), so
the sign is an unbiased estimate of ``g/b``. The other coordinates vote 0. The votes are summed over
teachers (integer counts in ``[−T, T]``; sums of teacher chunks and DDP ranks simply add), Gaussian
noise N(0, σ²) is added to every coordinate once, and the coordinates whose noisy sum exceeds
``threshold`` in magnitude are released as ±1 (the others 0). The generator steps towards
``x + α·sign``.

Privacy: one teacher's vote has exactly ``k`` entries ±1, so one teacher changes the sum by at most
``2√k`` in L2 and every sample is a Gaussian mechanism with that sensitivity
(:class:`~lightning_gpate.privacy.accountant.TopAggEvent`); the threshold and the signs are
post-processing. DataLens' own code accounts with a data-dependent formula on the noisy votes, which
is not a guarantee; this project uses the data-independent bound.

Randomness (stochastic signs and noise) must come from a mechanism generator
(:func:`~lightning_gpate.privacy.randomness.mechanism_generator`). For identical results under any
sharding of the teachers, the stochastic signs' uniforms are drawn for *all* teachers in a fixed
order (:func:`sign_uniforms`) and each shard reads the rows of its own teachers.
"""

from __future__ import annotations

import torch

__all__ = ["sign_uniforms", "topk_stochastic_signs", "topagg_votes", "topagg_release"]


def sign_uniforms(
    num_teachers: int, m: int, k: int, *, generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniforms ``[num_teachers, m, k]`` for the stochastic signs of every teacher (global ids as rows)."""
    if device is None:
        device = generator.device if generator is not None else "cpu"
    return torch.rand(num_teachers, m, k, generator=generator, device=device)


def topk_stochastic_signs(
    grads: torch.Tensor, k: int, uniforms: torch.Tensor | None, *, max_grad: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every teacher's top-k coordinates and their stochastic signs (DataLens ``stochastic`` top-k).

    Args:
        grads: ``[T, m, d]`` teachers' descent directions (a chunk of teachers is fine).
        k: coordinates kept per teacher and sample (``1 ≤ k ≤ d``).
        uniforms: ``[T, m, k]`` U(0, 1) draws (rows of :func:`sign_uniforms` for these teachers), or
            ``None`` for the plain signs of the coordinates (DataLens without ``--stochastic``; a
            zero coordinate then votes +1). Either way a vote has exactly ``k`` entries ±1.
        max_grad: cap on ``b`` (DataLens ``max_grad``); ``None``: ``b`` = the teacher's largest
            ``|g|`` on the sample.

    Returns:
        ``(index, sign)``: int64 ``[T, m, k]`` coordinates and int8 ``[T, m, k]`` signs (±1).
    """
    if grads.ndim != 3:
        raise ValueError(f"expected grads [T, m, d], got {tuple(grads.shape)}")
    T, m, d = grads.shape
    if not 1 <= int(k) <= d:
        raise ValueError(f"topk must be in [1, {d}], got {k}")
    if uniforms is not None and uniforms.shape != (T, m, int(k)):
        raise ValueError(f"expected uniforms of shape {(T, m, int(k))}, got {tuple(uniforms.shape)}")
    if max_grad is not None and not max_grad > 0:
        raise ValueError(f"max_grad must be > 0, got {max_grad}")
    g = grads.float()
    top, index = g.abs().topk(int(k), dim=-1)  # [T, m, k]
    if uniforms is None:
        return index, torch.where(g.gather(-1, index) >= 0, 1, -1).to(torch.int8)
    b = top[..., :1]  # the row's largest |g|
    if max_grad is not None:
        b = b.clamp(max=float(max_grad))
    value = g.gather(-1, index)
    p_plus = (0.5 + value / (2.0 * b.clamp_min(torch.finfo(g.dtype).tiny))).clamp_(0.0, 1.0)
    sign = torch.where(uniforms.to(p_plus.dtype) < p_plus, 1, -1).to(torch.int8)
    return index, sign


def topagg_votes(index: torch.Tensor, sign: torch.Tensor, d: int, voting: torch.Tensor | None = None) -> torch.Tensor:
    """Summed votes ``[m, d]`` (int64) of teachers' top-k signs; sums of chunks / ranks add.

    ``voting`` (optional bool ``[T, m]``): teacher ``t`` votes on sample ``j`` only where true; an
    abstaining teacher's vote is 0 (which keeps one teacher's L2 change of the sum ≤ 2√k).
    """
    if index.shape != sign.shape or index.ndim != 3:
        raise ValueError("index and sign must both be [T, m, k]")
    T, m, _ = index.shape
    flat = (index + torch.arange(m, device=index.device).view(1, m, 1) * int(d)).reshape(-1)
    weight = sign.long()
    if voting is not None:
        if voting.shape != (T, m):
            raise ValueError(f"expected voting [T, m] = {(T, m)}, got {tuple(voting.shape)}")
        weight = weight * voting.to(device=index.device, dtype=torch.long).unsqueeze(-1)
    votes = torch.zeros(m * int(d), dtype=torch.long, device=index.device)
    votes.scatter_add_(0, flat, weight.reshape(-1))
    return votes.view(m, int(d))


def topagg_release(
    votes: torch.Tensor, *, threshold: float, sigma: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The private direction: ``sign(v + N(0, σ²))`` where ``|v + noise| > threshold``, else 0.

    Args:
        votes: ``[m, d]`` summed votes (all teachers, all ranks).
        threshold: absolute vote count β·T.
        sigma: σ of the Gaussian noise (> 0).
        generator: mechanism randomness on ``votes.device``.

    Returns:
        ``[m, d]`` float32 in {−1, 0, 1}.
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    noisy = votes.to(torch.float64) + float(sigma) * torch.randn(
        votes.shape, generator=generator, device=votes.device, dtype=torch.float64)
    return torch.where(noisy.abs() > float(threshold), torch.sign(noisy), 0.0).to(torch.float32)
