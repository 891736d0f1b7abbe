"""DP-MERF's mechanism: one Gaussian release of the summed random-feature embeddings of (record, label).

Harder, Adamczewski & Park, "DP-MERF: Differentially Private Mean Embeddings with Random Features for
Practical Privacy-preserving Data Generation", AISTATS 2021 (code ``ParkLabML/DP-MERF``). The data's
kernel mean embedding under a Gaussian kernel is approximated with random Fourier features (Rahimi &
Recht 2007; the paper's Eq. 3, its code's ``rff_sphere``)::

    φ(x) = [cos(ω_1ᵀx), …, cos(ω_Mᵀx), sin(ω_1ᵀx), …, sin(ω_Mᵀx)] / √M,   ω_j ~ N(0, I/ℓ²),

so that ``φ(x)ᵀφ(x') ≈ exp(−‖x − x'‖²/(2ℓ²))``, and the label enters as an outer product with its
one-hot vector (Eq. 6): the embedding of a labelled record is the ``K × 2M`` matrix whose row ``y``
is ``φ(x)`` and whose other rows are 0. The frequencies ω are drawn from a **public** seed
(:func:`fourier_frequencies`): they depend on no data, and anyone can redraw them from the release.

**What is released, and its sensitivity.** Each record contributes the ``K × (2M + 1)`` matrix

    ψ(x, y) = e_y ⊗ [a·φ(x), b],   a² + b² = 1,

whose Frobenius norm is exactly ``√(a²‖φ(x)‖² + b²) = 1`` for every record, because
``‖φ(x)‖² = Σ_j (cos² + sin²)/M = 1``. The mechanism releases the **sum** ``S(D) = Σ_i ψ(x_i, y_i)`` plus
``N(0, σ²)`` noise on every entry. Adding or removing one record changes ``S`` by that record's ``ψ``,
so the L2 sensitivity under add/remove neighbours is exactly 1 whatever the record, and the release is
the Gaussian mechanism with noise multiplier σ (Mironov 2017, Corollary 3: RDP ``λ/(2σ²)``). The last
column holds ``b`` times the class counts: the normalisation of the mean embedding is released with it
(:func:`mean_embeddings`), so the private number of records is never read without noise. The paper
releases the mean ``S/n`` with sensitivity ``2/n`` under replace-one neighbours, which takes ``n`` as
public; releasing the sum needs no such assumption.

Everything else — the per-class means, the class ratio, the generator trained to match them — is
post-processing of the one noisy release.

**Other feature maps.** Nothing above needs ``φ`` to be Fourier features: any fixed map ``ψ`` with ``‖ψ(x)‖ ≤ 1`` for
every record (:mod:`lightning_gpate.privacy.feature_maps`: low DCT frequencies, wavelet scattering coefficients) keeps
``‖e_y ⊗ [a·ψ(x), b]‖ ≤ 1``, hence sensitivity at most 1: :func:`feature_sum` sums it, :func:`noisy_release` adds the noise.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

__all__ = ["fourier_frequencies", "fourier_features", "record_embeddings", "feature_sum", "embedding_sum", "noisy_release", "release_embedding_sum",
           "mean_embeddings", "batch_mean_embeddings", "median_distance_of_uniform", "COUNT_FLOOR_SIGMAS"]


def median_distance_of_uniform(dim: int) -> float:
    """A public length scale for data in the generator's space ``[-1, 1]^d``: the root-mean-square
    distance of two independent uniform points, ``√(2d/3)`` (a data-independent stand-in for the
    median heuristic, which reads the private data)."""
    return math.sqrt(2.0 * dim / 3.0)


def _length_scales(length_scale: float | Sequence[float]) -> list[float]:
    """One length scale or several, as a list of floats."""
    return [float(length_scale)] if isinstance(length_scale, (int, float)) else [float(s) for s in length_scale]


def fourier_frequencies(num_features: int, dim: int, length_scale: float | Sequence[float], seed: int) -> torch.Tensor:
    """The ``[num_features/2, dim]`` frequencies ω ~ N(0, I/ℓ²) of a Gaussian kernel of length scale ℓ,
    drawn on the CPU from the public ``seed`` (the same on every machine and device).

    Several length scales ``[ℓ_1, …, ℓ_k]`` share the frequencies equally (ω of the k-th share ~
    N(0, I/ℓ_k²)): the kernel is then the mean of the k Gaussian kernels (a shift-invariant kernel
    whose spectral measure is the mixture), coarse and fine at once; ‖φ(x)‖ stays 1."""
    scales = _length_scales(length_scale)
    if int(num_features) != num_features or num_features < 2 * len(scales) or num_features % 2:
        raise ValueError(f"num_features must be an even integer >= 2 per length scale (cosines and sines), got {num_features}")
    if not scales or not all(s > 0 and math.isfinite(s) for s in scales):
        raise ValueError(f"length_scale must be a finite number > 0 or a list of them, got {length_scale}")
    gen = torch.Generator().manual_seed(int(seed))
    frequencies = torch.randn(int(num_features) // 2, int(dim), generator=gen)
    share = torch.arange(len(frequencies)) * len(scales) // len(frequencies)  # the k-th share of rows takes ℓ_k
    return frequencies / torch.tensor(scales)[share][:, None]


def kernel_curvature_scale(length_scale: float | Sequence[float]) -> float:
    """ℓ² of the one Gaussian kernel equal to the kernel of ``length_scale`` (one ℓ or the mean of several) to
    second order at 0: ``mean_k exp(−r²/(2ℓ_k²)) ≈ 1 − (r²/2)·mean_k ℓ_k⁻²``, so ``1 / mean_k ℓ_k⁻²`` (ℓ² for one)."""
    scales = _length_scales(length_scale)
    return 1.0 / (sum(s**-2 for s in scales) / len(scales))


def fourier_features(x: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """φ(x) ``[n, 2M]`` of flattened rows ``x`` ``[n, d]``: cosines then sines over √M; every row has
    norm 1 (DP-MERF's ``rff_sphere``)."""
    h = x.reshape(x.shape[0], -1).to(frequencies.dtype) @ frequencies.T
    return torch.cat([torch.cos(h), torch.sin(h)], dim=1) / math.sqrt(frequencies.shape[0])


def _weights(count_weight: float) -> tuple[float, float]:
    """``(a, b)`` with ``b = count_weight`` and ``a² + b² = 1``."""
    if not 0.0 < count_weight < 1.0:
        raise ValueError(f"count_weight must lie in (0, 1), got {count_weight}")
    return math.sqrt(1.0 - count_weight**2), float(count_weight)


def record_embeddings(x: torch.Tensor, y: torch.Tensor, frequencies: torch.Tensor, num_classes: int, *, count_weight: float) -> torch.Tensor:
    """Every record's contribution ψ(x_i, y_i) ``[n, K, 2M + 1]`` to the released sum (row ``y_i`` is
    ``[a·φ(x_i), b]``, the other rows 0): Frobenius norm 1 each."""
    a, b = _weights(count_weight)
    rows = torch.cat([a * fourier_features(x, frequencies), torch.full((len(y), 1), b, dtype=frequencies.dtype, device=frequencies.device)], 1)
    out = torch.zeros(len(y), num_classes, rows.shape[1], dtype=rows.dtype, device=rows.device)
    out[torch.arange(len(y), device=rows.device), y.long().to(rows.device)] = rows
    return out


def feature_sum(x: torch.Tensor, y: torch.Tensor, features: Callable[[torch.Tensor], torch.Tensor], dim: int, num_classes: int, *,
                count_weight: float, device: torch.device | str | None = None, chunk_size: int = 2048) -> torch.Tensor:
    """``S(D) = Σ_i e_{y_i} ⊗ [a·ψ(x_i), b]`` ``[K, dim + 1]`` (float64) for a feature map ``features`` (records → ``[n, dim]``)
    whose every row has norm at most 1 (:mod:`lightning_gpate.privacy.feature_maps`; the random Fourier features exactly
    1), computed on ``device`` in chunks of records: what :func:`noisy_release` adds noise to, at L2 sensitivity at most
    1 under add/remove. A function of the private data: never released without it."""
    a, b = _weights(count_weight)
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{int(y.min())}, {int(y.max())}]")
    total = torch.zeros(num_classes, int(dim) + 1, dtype=torch.float64, device=device)
    for start in range(0, len(y), chunk_size):
        xs, ys = x[start:start + chunk_size].to(total.device), y[start:start + chunk_size].long().to(total.device)
        total[:, :-1].index_add_(0, ys, (a * features(xs)).double())
        total[:, -1].index_add_(0, ys, torch.full((len(ys),), b, dtype=torch.float64, device=total.device))
    return total


def embedding_sum(x: torch.Tensor, y: torch.Tensor, frequencies: torch.Tensor, num_classes: int, *, count_weight: float,
                  chunk_size: int = 2048) -> torch.Tensor:
    """:func:`feature_sum` of the random Fourier features of ``frequencies`` (DP-MERF's ``S(D)`` ``[K, 2M + 1]``)."""
    return feature_sum(x, y, lambda xs: fourier_features(xs, frequencies), 2 * frequencies.shape[0], num_classes,
                       count_weight=count_weight, device=frequencies.device, chunk_size=chunk_size)


def noisy_release(total: torch.Tensor, *, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on ``total`` (L2 sensitivity 1 under add/remove): ``total + N(0, σ²)`` on
    every entry, the noise from ``generator`` (a secret mechanism generator,
    :func:`~lightning_gpate.privacy.randomness.mechanism_generator`)."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
    noise = torch.randn(total.shape, generator=generator, dtype=torch.float64, device=generator.device)
    return total + float(noise_multiplier) * noise.to(total.device)


def release_embedding_sum(x: torch.Tensor, y: torch.Tensor, frequencies: torch.Tensor, num_classes: int, *, count_weight: float,
                          noise_multiplier: float, generator: torch.Generator, chunk_size: int = 2048) -> torch.Tensor:
    """DP-MERF's one release ``[K, 2M + 1]`` (float64): :func:`embedding_sum` of the records plus the Gaussian noise of
    :func:`noisy_release`. The one implementation of the mechanism, used by :class:`~lightning_gpate.models.DPMERF` and
    G-PATE's random-feature anchor (:mod:`lightning_gpate.models.anchor`); the caller charges it first."""
    total = embedding_sum(x, y, frequencies, num_classes, count_weight=count_weight, chunk_size=chunk_size)
    return noisy_release(total, noise_multiplier=noise_multiplier, generator=generator)


#: A class's noisy count in the denominator of its mean embedding is taken as at least this many standard deviations of
#: its noise (``z/b`` records): below it the count is mostly noise (MST's and MarginalTree's rule for rare values, 3σ).
#: Issue 59: cervical's 35 positive rows at ε = 0.5 (count noise ≈ 26 records) had G-PATE's anchor divide its noisy sum
#: by a count of 1 in some runs (anchor loss 4·10⁵ against 120, the run's AUROC below chance); chosen over 1σ on a
#: validation split of the five development tables (``benchmarks/results/tabular_utility_notes.md``). On MNIST (5,400+
#: digits a class; 180 records at ε = 0.2) it never binds.
COUNT_FLOOR_SIGMAS = 3.0


def mean_embeddings(released: torch.Tensor, *, count_weight: float, noise_multiplier: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-processing of a release ``[K, 2M + 1]``: the per-class mean embeddings ``[K, 2M]`` and the noisy class
    counts ``[K]`` (may be ≤ 0 for a tiny class).

    A class's mean embedding is its noisy sum over its noisy count, the count taken as at least
    :data:`COUNT_FLOOR_SIGMAS` standard deviations of its noise (``z/b``) and at least 1. Dividing by a count that the
    noise brought near zero would blow the sum up into a target far outside the ball of possible means (every ``φ(x)``
    has norm 1) that drags the class to the edge of the domain; over the floor, a small class's mean shrinks towards 0
    instead (a spread class), and a class above it is unchanged to the bit.

    Args:
        released: the release (or a noise-free embedding sum).
        count_weight: its ``b``.
        noise_multiplier: the noise std ``z`` on every entry of ``released`` (public; 0 for a noise-free sum).
    """
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    a, b = _weights(count_weight)
    counts = released[:, -1] / b
    floor = max(1.0, COUNT_FLOOR_SIGMAS * float(noise_multiplier) / b)
    means = released[:, :-1] / (a * counts.clamp_min(floor)[:, None])
    return means, counts


def batch_mean_embeddings(released: torch.Tensor, *, count_weight: float, expected_counts: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-processing of one Poisson batch's release ``[K, dim + 1]`` (a few-shot step): the per-class mean embeddings
    ``[K, dim]``, each class's noisy sum over its **expected** count in a batch (public: the expected batch size times the
    class's share, at least 1), as DP-SGD divides its noisy sum by the expected batch size; and the noisy counts ``[K]``.
    Unbiased for the class's mean embedding when the expected count is right: the sum's expectation is ``q·n_c`` times
    it."""
    a, b = _weights(count_weight)
    counts = released[:, -1] / b
    means = released[:, :-1] / (a * expected_counts.to(released).clamp_min(1.0)[:, None])
    return means, counts
