"""GaussAgg: the Gaussian mechanism on the sum of the teachers' normalised directions (a G-PATE aggregator).

G-PATE's DPGradAgg (:mod:`.dpgradagg`) releases, per generated sample, the noisy plurality of ``k``
discretised random projections of the teachers' directions; DataLens' TopAgg (:mod:`.topagg`) the
thresholded signs of their top-k coordinates. Under the data-independent guarantee both are Gaussian
mechanisms on vote sums in disguise — GNMax's bound ``λ/σ²`` per query *is* the Gaussian mechanism's
on the whole histogram, so the argmax throws away information already paid for — and both compress
each teacher's direction to a few bits first. At 28×28 that caps what one aggregation tells the
student: with ``k = 10`` sign votes the released direction has a cosine of about ``√(2k/(πd)) ≈ 0.09``
with the teachers' consensus even without noise.

GaussAgg keeps the direction: every teacher's directions on the fakes of one aggregation
(``[units, d]``) form **one** vote vector, scaled to L2 norm 1 (:func:`normalized_votes`; an abstaining teacher's units
are zero, and a vote with an inf or NaN coordinate is zero as a whole); the votes are summed over teachers and N(0, σ²) is added to every coordinate once
(:func:`gaussian_sum_release`). One record changes one teacher's vote by at most 2 in L2, so an
aggregation is one Gaussian mechanism with sensitivity 2 (:class:`~lightning_gpate.privacy.accountant.
GaussianSumEvent`), the same analysis as DP-SGD's clipped sums (Abadi et al. 2016) with teachers in
the place of examples. Without noise the release is the mean of the teachers' unit directions.

Sums of teacher chunks and DDP ranks add before the noise. The noise must come from a mechanism
generator (:func:`~lightning_gpate.privacy.randomness.mechanism_generator`).
"""

from __future__ import annotations


import torch

__all__ = ["normalized_votes", "gaussian_sum_release"]


def normalized_votes(grads: torch.Tensor, voting: torch.Tensor | None = None) -> torch.Tensor:
    """Every teacher's vote: its directions on all units of the aggregation as one vector of L2 norm 1.

    Args:
        grads: ``[T, units, k]`` teachers' directions (a chunk of teachers is fine).
        voting: optional bool ``[T, units]``: teacher ``t`` votes on unit ``j`` only where true (an
            abstention decided from the teacher's own data; its units are zero before the scaling).

    Returns:
        ``[T, units, k]``: each teacher's slice has norm 1 (0 if it has no non-zero direction, or a
        non-finite one), so one teacher moves the sum over teachers by at most 2 in L2.

    A teacher whose vote holds an inf or NaN coordinate (a diverged teacher, an overflowing gradient) votes
    zero, all of it: a rule on the vote alone, so the sensitivity argument is unchanged (every slice has
    norm ≤ 1, whatever the data), and the released sum stays finite (one NaN would make every coordinate
    of it NaN). The whole vote and not just the bad coordinates: its scale is meaningless once one
    coordinate is inf (normalised, it would point along that axis), and a NaN says the teacher's
    computation failed, so its finite coordinates are no direction either. Finite votes are scaled by
    their largest coordinate before the norm, so that a huge but finite vote cannot overflow it.
    """
    if grads.ndim != 3:
        raise ValueError(f"expected grads [T, units, k], got {tuple(grads.shape)}")
    zero = torch.zeros((), device=grads.device, dtype=grads.dtype)
    if voting is not None:
        if voting.shape != grads.shape[:2]:
            raise ValueError(f"expected voting [T, units] = {tuple(grads.shape[:2])}, got {tuple(voting.shape)}")
        grads = torch.where(voting.to(device=grads.device, dtype=torch.bool).unsqueeze(-1), grads, zero)  # inf · 0 would be NaN
    finite = torch.isfinite(grads).flatten(1).all(dim=1).view(-1, 1, 1)
    grads = torch.where(finite, grads, zero)
    tiny = torch.finfo(grads.dtype).tiny
    grads = grads / grads.flatten(1).abs().amax(dim=1).view(-1, 1, 1).clamp_min(tiny)
    norm = grads.flatten(1).norm(dim=1).view(-1, 1, 1)
    return grads / norm.clamp_min(tiny)


def gaussian_sum_release(
    total: torch.Tensor, *, sigma: float, num_teachers: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The private direction ``(Σ_t v_t + N(0, σ² I)) / num_teachers``.

    Args:
        total: ``[units, k]`` the sum of :func:`normalized_votes` over all teachers (all chunks, ranks).
        sigma: σ of the noise on every coordinate (> 0).
        num_teachers: the number of teachers (public): without noise the release is their mean vote.
        generator: mechanism randomness on ``total.device``.
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if num_teachers < 1:
        raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
    noise = torch.randn(total.shape, generator=generator, device=total.device, dtype=total.dtype)
    return (total + float(sigma) * noise) / num_teachers
