"""DPGradAgg: G-PATE's differentially private gradient aggregation (Long et al. 2021, Algorithm 2).

For every generated sample ``j`` the teachers' descent directions ``Δx_{t,j}`` (``[T, d]``) are
projected by a fresh random matrix ``P_j`` (``[d, k]``, entries N(0, 1/k)), clipped to ``[−c, c]`` and
discretised into ``B`` bins of width ``2c/B``; every teacher casts one vote per projected
dimension. Each of the ``m·k`` vote histograms is one Confident-GNMax query (Papernot et al. 2018):
answered if ``max(h) + N(0, σ1²) ≥ threshold``, then the centre of the bin
``argmax(h + N(0, σ2²))`` is released, an unanswered dimension releases 0. The private direction
is back-projected: ``Δx_j^priv = P_j v_j``.

Everything is batched over samples, dimensions and teachers (no Python loops). Histograms are
plain integer counts, so histograms of different teacher chunks or DDP ranks simply add
(``all_reduce(SUM)``) before :func:`confident_gnmax` / :func:`aggregate`. For identical results on
every rank, draw ``P`` and the noise from a ``torch.Generator`` seeded identically on all ranks.

The privacy cost is paid by the accountant from the returned votes and ``answered`` mask, e.g.
``confident_gnmax_rdp(votes.reshape(-1, B), answered.reshape(-1), threshold=..., ...)``.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "random_projection",
    "project",
    "vote_histograms",
    "bin_centers",
    "confident_gnmax",
    "aggregate",
    "dp_grad_agg",
]


def random_projection(
    m: int,
    d: int,
    k: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A fresh Gaussian random projection per generated sample (G-PATE Alg. 2, line "draw P").

    Args:
        m: Number of generated samples (one projection each).
        d: Dimension of a sample (flattened).
        k: Projected dimension.
        generator: Source of randomness; must live on ``device`` (seed it identically on every
            DDP rank so that every rank uses the same projections).
        device: Device of the result (default: the generator's device, else CPU).
        dtype: Floating dtype of the result.

    Returns:
        ``P`` of shape ``[m, d, k]`` with i.i.d. entries N(0, 1/k).
    """
    if min(m, d, k) <= 0:
        raise ValueError("m, d and k must be positive")
    if device is None:
        device = generator.device if generator is not None else "cpu"
    p = torch.randn(m, d, k, generator=generator, device=device, dtype=dtype)
    return p.mul_(1.0 / math.sqrt(k))


def project(grads: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Project every teacher's per-sample direction with that sample's projection.

    Args:
        grads: ``[T, m, d]`` teachers' directions (any teacher chunk).
        P: ``[m, d, k]`` projections from :func:`random_projection`.

    Returns:
        ``U`` ``[T, m, k]`` with ``U[t, j] = grads[t, j] @ P[j]``.
    """
    if grads.ndim != 3 or P.ndim != 3 or grads.shape[1:] != P.shape[:2]:
        raise ValueError(f"expected grads [T, m, d] and P [m, d, k], got {tuple(grads.shape)} and {tuple(P.shape)}")
    return torch.einsum("tmd,mdk->tmk", grads, P.to(grads.dtype))


def _check_bins(clip: float, num_bins: int) -> None:
    if not clip > 0:
        raise ValueError(f"clip must be positive, got {clip}")
    if int(num_bins) < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")


def vote_histograms(U: torch.Tensor, *, clip: float, num_bins: int, voting: torch.Tensor | None = None) -> torch.Tensor:
    """Discretise projected directions and count one vote per teacher per (sample, dimension).

    Values are clipped to ``[−clip, clip]`` and put into ``num_bins`` bins of width ``2·clip/num_bins``
    (half-open ``[lo, hi)``; a value at ``+clip`` or beyond goes to the last bin, at ``−clip`` or
    below to the first — the convention of ``numpy.histogram`` used by the official code).

    Args:
        U: ``[T, m, k]`` projected directions (a chunk of teachers is fine).
        clip: ``c``, the clipping bound (G-PATE ``step_size``, e.g. 1e-4).
        num_bins: ``B``.
        voting: optional bool ``[T, m]``: teacher ``t`` votes on sample ``j`` only where true (an
            abstention decided from the teacher's own data keeps the sensitivity: one teacher still
            moves at most one vote per histogram).

    Returns:
        ``[m, k, B]`` int64 vote counts; each ``(j, l)`` histogram sums to the number of voting
        teachers (``T`` without ``voting``). Histograms from disjoint teacher chunks / ranks add.
    """
    _check_bins(clip, num_bins)
    if U.ndim != 3:
        raise ValueError(f"expected U [T, m, k], got {tuple(U.shape)}")
    T, m, k = U.shape
    B = int(num_bins)
    scale = B / (2.0 * clip)
    idx = torch.floor((U.clamp(-clip, clip) + clip) * scale).long().clamp_(0, B - 1)  # [T, m, k]
    base = torch.arange(m * k, device=U.device, dtype=torch.long).view(1, m, k) * B
    flat = (idx + base).reshape(-1)
    votes = torch.zeros(m * k * B, dtype=torch.long, device=U.device)
    if voting is None:
        weight = torch.ones_like(flat)
    else:
        if voting.shape != (T, m):
            raise ValueError(f"expected voting [T, m] = {(T, m)}, got {tuple(voting.shape)}")
        weight = voting.to(device=U.device, dtype=torch.long).unsqueeze(-1).expand(T, m, k).reshape(-1)
    votes.scatter_add_(0, flat, weight)
    return votes.view(m, k, B)


def bin_centers(
    *, clip: float, num_bins: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Centres ``−c + (i + ½)·2c/B`` of the ``B`` bins, ``[B]``."""
    _check_bins(clip, num_bins)
    B = int(num_bins)
    width = 2.0 * clip / B
    return (torch.arange(B, device=device, dtype=torch.float64) + 0.5).mul_(width).sub_(clip).to(dtype)


def confident_gnmax(
    votes: torch.Tensor,
    *,
    threshold: float,
    sigma_threshold: float,
    sigma_gnmax: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident-GNMax (Papernot et al. 2018, Alg. 1) on a batch of histograms (G-PATE Alg. 2).

    Noise is drawn in a fixed order (all threshold noise, then all GNMax noise, each with the shape
    of the batch), so equal generators give equal answers on every rank.

    Args:
        votes: ``[..., B]`` vote counts.
        threshold: Absolute vote count T (e.g. ``0.5 × number of teachers``).
        sigma_threshold: σ1 of the threshold check.
        sigma_gnmax: σ2 of the noisy argmax.
        generator: Source of noise, on ``votes.device`` (default RNG if None).

    Returns:
        ``(answered, winner)``: bool ``[...]`` (``max(h) + N(0, σ1²) ≥ threshold``) and int64 ``[...]``
        (``argmax(h + N(0, σ2²))``; computed for every query, only meaningful where answered).
    """
    if sigma_threshold < 0 or sigma_gnmax < 0:
        raise ValueError("noise scales must be non-negative")
    h = votes.to(torch.float64)
    n1 = torch.randn(h.shape[:-1], generator=generator, device=h.device, dtype=h.dtype)
    n2 = torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)
    answered = h.amax(dim=-1) + sigma_threshold * n1 >= threshold
    winner = torch.argmax(h + sigma_gnmax * n2, dim=-1)
    return answered, winner


def aggregate(
    votes: torch.Tensor,
    P: torch.Tensor,
    *,
    clip: float,
    num_bins: int,
    threshold: float,
    sigma_threshold: float,
    sigma_gnmax: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Private direction from (summed) vote histograms: Confident-GNMax per (sample, dim) + back-projection.

    Args:
        votes: ``[m, k, B]`` histograms (summed over all teachers / ranks).
        P: ``[m, d, k]`` the projections the votes were cast under.
        clip, num_bins: As in :func:`vote_histograms`.
        threshold, sigma_threshold, sigma_gnmax, generator: As in :func:`confident_gnmax`.

    Returns:
        ``(delta, answered)``: ``Δx^priv`` ``[m, d]`` (``P_j v_j``, ``v_jl`` the winning bin centre or 0
        if unanswered) in ``P``'s dtype, and the bool ``[m, k]`` mask of answered queries.
    """
    if votes.ndim != 3 or P.ndim != 3 or votes.shape[:2] != (P.shape[0], P.shape[2]) or votes.shape[2] != num_bins:
        raise ValueError(f"expected votes [m, k, B] and P [m, d, k], got {tuple(votes.shape)} and {tuple(P.shape)}")
    answered, winner = confident_gnmax(
        votes, threshold=threshold, sigma_threshold=sigma_threshold, sigma_gnmax=sigma_gnmax, generator=generator
    )
    centers = bin_centers(clip=clip, num_bins=num_bins, device=P.device, dtype=P.dtype)
    v = centers[winner] * answered.to(P.dtype)  # [m, k]
    delta = torch.einsum("mdk,mk->md", P, v)
    return delta, answered


def dp_grad_agg(
    grads: torch.Tensor,
    *,
    k: int,
    clip: float,
    num_bins: int,
    threshold: float,
    sigma_threshold: float,
    sigma_gnmax: float,
    generator: torch.Generator | None = None,
    projection: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPGradAgg (G-PATE Algorithm 2) for one batch of generated samples, all teachers at once.

    Draws ``P`` (unless ``projection`` is given) and then the Confident-GNMax noise from
    ``generator``, in that order. For teacher chunks or DDP, call :func:`project` and
    :func:`vote_histograms` per chunk, add (all-reduce) the votes, then :func:`aggregate`.

    Args:
        grads: ``[T, m, d]`` teachers' descent directions ``Δx_t = −∂L_G,t/∂x``.
        k: Projected dimension.
        clip: Clipping bound ``c`` of the projected values.
        num_bins: Number of bins ``B``.
        threshold: Absolute vote threshold (``thresh × T``).
        sigma_threshold: σ1.
        sigma_gnmax: σ2.
        generator: Randomness for ``P`` and the noise (on ``grads.device``).
        projection: Optional ``[m, d, k]`` projection to use instead of drawing one.

    Returns:
        ``(delta, votes, answered)``: ``[m, d]`` private update to add to the samples, ``[m, k, B]``
        int64 votes and ``[m, k]`` bool answered mask (both needed by the privacy accountant).
    """
    if grads.ndim != 3:
        raise ValueError(f"expected grads [T, m, d], got {tuple(grads.shape)}")
    _, m, d = grads.shape
    P = projection if projection is not None else random_projection(
        m, d, k, generator=generator, device=grads.device, dtype=grads.dtype
    )
    votes = vote_histograms(project(grads, P), clip=clip, num_bins=num_bins)
    delta, answered = aggregate(
        votes, P, clip=clip, num_bins=num_bins, threshold=threshold,
        sigma_threshold=sigma_threshold, sigma_gnmax=sigma_gnmax, generator=generator,
    )
    return delta, votes, answered
