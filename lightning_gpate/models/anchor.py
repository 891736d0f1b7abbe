"""The class-mean anchor of an image generator: each class's mean image, measured once with the Gaussian
mechanism, and the generator's distance to it.

The image analogue of the per-class marginals that made PATE-GAN's tables learn (``marginals.fraction``):
a share of ε buys, once before training, per class the sum of its images (pixels mapped to [0, 1]) and its
count, each entry plus N(0, (z·√(d + 1))²): one record moves one class's sum by its image (L2 at most √d)
and its count by one, so the L2 sensitivity is √(d + 1) and the release is one Gaussian mechanism of noise
multiplier z (:class:`~lightning_gpate.privacy.SubsampledGaussianEvent` with sampling rate 1). The
ratio (with the noisy count at least 1, clipped to [0, 1]) is a DP release: public from then on, and
every later use (the generator's loss towards it) is post-processing. On the official MNIST (~6,000
digits a class) the noise on a mean pixel is z·28/6,000: 0.04 at the z of ε = 0.5 alone.

Used by PATE-GAN (``marginals.fraction`` on images) and G-PATE (``anchor.fraction``); the share of ε each
spends is planned by :meth:`~lightning_gpate.models.private.PrivateGenerativeModel.plan_gaussian_noise`.

G-PATE can anchor to more than the mean (``anchor.features``): each class's mean *embedding* under random
Fourier features of a Gaussian kernel, DP-MERF's release (:mod:`~lightning_gpate.privacy.merf`: every record
contributes a vector of norm exactly 1, so the same noise multiplier z buys it at L2 sensitivity 1). The mean
pixel is the embedding's first-order term: for ‖x − x'‖ ≪ ℓ, ``φ(x)ᵀφ(x') ≈ 1 − ‖x − x'‖²/(2ℓ²)``, so ℓ²
times the squared gap of mean embeddings is the squared gap of mean images to first order, and the higher
orders carry the spread within a class that the mean image lacks.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from lightning_gpate.privacy.merf import mean_embeddings, release_embedding_sum

FEATURE_COUNT_WEIGHT = 0.3  # b: the share of a record's unit norm that its class count takes (DP-MERF's default)


def noisy_class_means(x: torch.Tensor, y: torch.Tensor, *, num_classes: int, noise_multiplier: float,
                      generator: torch.Generator) -> torch.Tensor:
    """The noisy mean image of every class, in the generator's space [-1, 1].

    Args:
        x: the whole training split in the generator's space, ``[n, C, H, W]`` (or any ``[n, ...]``).
        y: its labels, ``[n]``.
        num_classes: classes (a class without records gets the noise over a count of at least 1).
        noise_multiplier: z; the noise std on every sum and count is ``z·√(d + 1)``.
        generator: the mechanism's secret (OS-seeded) random source.

    Returns:
        ``[num_classes, *x.shape[1:]]``, float32.
    """
    unit = ((x.flatten(1).double() + 1.0) / 2.0).clamp(0.0, 1.0)
    labels = y.long().to(unit.device)
    d = unit.shape[1]
    sums = torch.zeros(num_classes, d, dtype=torch.float64, device=unit.device).index_add_(0, labels, unit)
    counts = torch.bincount(labels, minlength=num_classes).double()
    sigma = float(noise_multiplier) * math.sqrt(d + 1)
    noise = sigma * torch.randn(num_classes, d + 1, generator=generator, device=generator.device, dtype=torch.float64)
    noise = noise.to(unit.device)
    means = ((sums + noise[:, :d]) / (counts + noise[:, d]).clamp_min(1.0).unsqueeze(1)).clamp(0.0, 1.0)
    return (2.0 * means - 1.0).float().view(num_classes, *x.shape[1:])


def noisy_class_feature_means(x: torch.Tensor, y: torch.Tensor, frequencies: torch.Tensor, *, num_classes: int,
                              noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """The noisy mean embedding ``[num_classes, 2M]`` of every class under the random Fourier features of
    ``frequencies`` ``[M, d]`` (:func:`~lightning_gpate.privacy.merf.fourier_features`): DP-MERF's one Gaussian
    release of ``Σ_i e_{y_i} ⊗ [a·φ(x_i), b]`` (L2 sensitivity 1, noise std z), divided by the noisy counts floored at
    3 deviations of their noise (:func:`~lightning_gpate.privacy.merf.mean_embeddings`)."""
    released = release_embedding_sum(x.flatten(1), y, frequencies, num_classes, count_weight=FEATURE_COUNT_WEIGHT,
                                     noise_multiplier=noise_multiplier, generator=generator)
    return mean_embeddings(released, count_weight=FEATURE_COUNT_WEIGHT, noise_multiplier=noise_multiplier)[0].float()


def class_mean_gap(generate: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor, batch_size: int,
                   features: Callable[[torch.Tensor], torch.Tensor] | None = None, *, unbiased: bool = False) -> torch.Tensor:
    """Per class, the mean over coordinates of the squared difference between the mean of the generator's images
    of that class (``n = ceil(batch_size / classes)`` each) and the measured mean: ``[classes]``.

    The plain estimate is biased: its expectation is the squared gap of the generator's true class mean plus
    ``S²/n``, the spread of the class's images over their count, so minimising it also shrinks the spread,
    a pull towards one image per class that is strongest for few images a class. ``unbiased`` subtracts
    the sample variance over ``n`` (``(1/(n(n−1)))·Σ_i (φ_i − mean)²``, the U-statistic of the squared gap:
    Gretton et al., JMLR 2012, eq. 3), whose expectation is the squared gap alone.

    Args:
        generate: labels ``[m]`` → images ``[m, ...]`` (fresh latents; differentiable).
        targets: the measured means ``[classes, ...]`` (of ``features`` of the images when given).
        batch_size: generated images per call, every class equally often (at least 2 a class when ``unbiased``).
        features: images ``[m, ...]`` → ``[m, f]`` (differentiable) whose class means are compared; ``None``: the pixels.
        unbiased: subtract the spread term (see above).
    """
    y = balanced_labels(targets.shape[0], batch_size, device=targets.device, unbiased=unbiased)
    return class_gap(generate(y), y, targets, features, unbiased=unbiased)


def balanced_labels(num_classes: int, batch_size: int, *, device: torch.device | None = None, unbiased: bool = False) -> torch.Tensor:
    """``n = ceil(batch_size / K)`` labels of each class in order, ``[K·n]``: the fakes of :func:`class_mean_gap`."""
    n = -(-int(batch_size) // num_classes)
    if unbiased and n < 2:
        raise ValueError(f"the unbiased gap needs at least 2 images a class (ceil(batch_size / {num_classes})): "
                         f"batch_size > {num_classes}, got {batch_size}")
    return torch.arange(num_classes, device=device).repeat_interleave(n)


def class_gap(x: torch.Tensor, y: torch.Tensor, targets: torch.Tensor, features: Callable[[torch.Tensor], torch.Tensor] | None = None,
              *, unbiased: bool = False) -> torch.Tensor:
    """:func:`class_mean_gap` of given fakes ``x`` of the :func:`balanced_labels` ``y`` (several feature maps can then
    read one batch). A map with a ``class_means`` method (:class:`~lightning_gpate.privacy.feature_maps.FeatureMap`)
    computes the class means itself (a fused gradient) unless ``unbiased`` needs every fake's features."""
    k = targets.shape[0]
    n = len(y) // k
    per_class = F.one_hot(y, k).to(x.dtype) / n  # images → their class's mean
    if features is not None and not unbiased and hasattr(features, "class_means"):
        means = features.class_means(x, per_class)
    else:
        x = x.flatten(1) if features is None else features(x)
        means = per_class.t() @ x
    gap = (means - targets.flatten(1).to(means.dtype)).pow(2).mean(1)
    if unbiased:  # minus S²/n = Σ_i (φ_i − mean)² / (n(n − 1))
        gap = gap - (per_class.t() @ (x - means[y]).pow(2)).mean(1) / (n - 1)
    return gap
