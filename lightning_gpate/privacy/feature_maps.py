"""Data-independent feature maps of images for DP-MERF's release, every record's vector of norm at most 1.

DP-MERF (:mod:`lightning_gpate.privacy.merf`) releases the sum over the records of ``e_y ⊗ [a·ψ(x), b]`` plus
Gaussian noise; its sensitivity is exactly 1 whenever ``‖ψ(x)‖ ≤ 1`` for every possible record. The random Fourier
features of pixels (the paper's ``ψ``) have norm exactly 1. The maps here are other fixed functions of an image,
chosen before any data is seen (their filters and frequencies come from public constants and a public seed), each
normalised per record so that the bound holds for every input, in the domain or not:

* **pixels**: random Fourier features of the pixels (DP-MERF's; a Gaussian kernel on images).
* **dct**: random Fourier features of the ``k × k`` lowest frequencies of the image's orthonormal 2-D DCT-II: a
  Gaussian kernel on the image's low-pass projection (what a blur keeps), in ``k²`` instead of ``H·W`` dimensions.
* **scattering**: wavelet scattering coefficients (Mallat 2012; Bruna & Mallat 2013) of the first and second order at
  ``J = 2`` scales and ``L = 8`` orientations (Oyallon & Mallat's ScatterNet; Tramèr & Boneh, ICLR 2021, use
  the same ``81 × H/4 × W/4`` coefficients): local averages of the moduli of oriented wavelet responses, stable to
  small translations and deformations. Each order's coefficients are scaled to norm ``1/√3`` per record (the three
  orders weigh alike and the whole vector has norm at most 1): its mean embedding is a linear kernel on them.
* **scattering_rff**: random Fourier features of those normalised coefficients: a Gaussian kernel on the scattering
  representation.

The scattering filters are this module's own fixed bank, not a library's: Morlet wavelets (kymatio's definition:
``σ = 0.8``, ``ξ = 3π/4``, slant ``4/L``, zero mean) on a ``7 × 7`` support, applied as convolutions of stride 2 (the
modulus of a wavelet response varies slowly enough to be sampled at half the rate; a pointwise modulus of the strided
response is the subsampled modulus); the second scale is the same filter on the image blurred and subsampled by 2
(the wavelet pyramid), or on the first modulus, which is sampled at that scale already; the averaging ``φ`` is a
Gaussian blur (of the image, with a stride of 4; of the first modulus, with a stride of 2), so every output has
``H/4 × W/4`` positions per channel. Gaussian blurs with strides are small dense matrices applied to rows and columns
(GEMMs on a CPU). At 28 × 28 the convolutions cost ``0.5`` GMAC per 1,000 images (those of full rate would cost 1.8).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lightning_gpate.privacy.merf import fourier_features, fourier_frequencies

__all__ = ["FEATURE_MAPS", "Scattering2D", "FeatureMap", "PixelFourier", "DCTFourier", "ScatteringFeatures",
           "ScatteringFourier", "unit_rows", "build_feature_map"]

#: The feature maps :func:`build_feature_map` builds (module doc).
FEATURE_MAPS = ("pixels", "dct", "scattering", "scattering_rff")
#: The maps made of random Fourier features (they take ``features``, ``length_scale`` and a seed).
FOURIER_MAPS = ("pixels", "dct", "scattering_rff")


def unit_rows(v: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Each row of ``v`` ``[n, D]`` scaled to norm 1 (a zero row stays zero): every row has norm at most 1."""
    return v / v.norm(dim=1, keepdim=True).clamp_min(eps)


# ----------------------------------------------------------------------------------------------- scattering
def morlet_filters(size: int = 7, sigma: float = 0.8, xi: float = 0.75 * math.pi, orientations: int = 8,
                   slant: float | None = None) -> torch.Tensor:
    """The ``[2L, size, size]`` real and imaginary parts (real parts first) of ``L`` Morlet wavelets
    ``ψ_θ(u) = (e^{iξ⟨u, e_θ⟩} − κ)·exp(−uᵀR_θ diag(1, s²) R_θᵀu / (2σ²)) / (2πσ²/s)`` on a ``size × size`` grid centred at 0,
    ``κ`` making each zero-mean on the grid (no response to a constant image); angles ``θ = (L/2 − 1 − ℓ)π/L`` and slant
    ``s = 4/L`` as kymatio's ``morlet_2d``."""
    slant = 4.0 / orientations if slant is None else slant
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    xx, yy = r[:, None], r[None, :]
    out = []
    for ell in range(orientations):
        theta = (int(orientations - orientations / 2 - 1) - ell) * math.pi / orientations
        c, s = math.cos(theta), math.sin(theta)
        along, across = c * xx + s * yy, -s * xx + c * yy
        envelope = torch.exp(-(along**2 + slant**2 * across**2) / (2 * sigma**2))
        wave = envelope * torch.exp(1j * xi * along)
        out.append((wave - wave.sum() / envelope.sum() * envelope) / (2 * math.pi * sigma**2 / slant))
    psi = torch.stack(out)
    return torch.cat([psi.real, psi.imag]).float()


def blur_stride_matrix(n: int, stride: int, sigma: float) -> torch.Tensor:
    """``[n, n // stride]``: column ``m`` a normalised Gaussian of deviation ``sigma`` centred on the middle of the
    ``m``-th block of ``stride`` pixels (zero outside the image): ``z @ M`` blurs and subsamples the last axis."""
    i = torch.arange(n, dtype=torch.float64)[:, None]
    centre = torch.arange(n // stride, dtype=torch.float64)[None, :] * stride + (stride - 1) / 2
    w = torch.exp(-((i - centre) ** 2) / (2 * sigma**2))
    return (w / w.sum(0, keepdim=True)).float()


class _Modulus(torch.autograd.Function):
    """``√(re² + im² + 10⁻¹²)`` of ``r`` ``[m, g, 2, ...]`` (real parts at index 0 of axis 2, imaginary at 1) → ``[m, g, ...]``,
    with a one-pass backward (autograd's would keep and fill a zero tensor per part)."""

    @staticmethod
    def forward(ctx, r):
        modulus = (r[:, :, 0].square() + r[:, :, 1].square()).add_(1e-12).sqrt_()
        ctx.save_for_backward(r, modulus)
        return modulus

    @staticmethod
    def backward(ctx, grad):
        r, modulus = ctx.saved_tensors
        return r * (grad / modulus).unsqueeze(2)


def _blur_stride(z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rowsᵀ · z · cols`` over the last two axes of ``z`` ``[..., H, W]`` as two large matrix products."""
    *batch, h, w = z.shape
    out = (z.reshape(-1, w) @ cols).view(*batch, h, cols.shape[1])
    out = (out.transpose(-1, -2).reshape(-1, h) @ rows).view(*batch, cols.shape[1], rows.shape[1])
    return out.transpose(-1, -2)


class Scattering2D(nn.Module):
    """The wavelet scattering transform of order 2 at ``J = 2`` scales and ``L`` orientations (module doc): images
    ``[n, C, H, W]`` in ``[-1, 1]`` (``H``, ``W`` divisible by 4) → ``[n, C·(1 + 2L + L²), H/4, W/4]`` (81 channels a
    colour at ``L = 8``: the low-pass, ``L`` first-order at each of the 2 scales, ``L²`` second-order from scale 0 to 1).
    Pixels are taken as intensities ``(x + 1)/2`` (a blank background is 0). Fixed: every tensor is a non-persistent
    buffer, rebuilt from the constants."""

    def __init__(self, shape: Sequence[int], *, orientations: int = 8, kernel_size: int = 7) -> None:
        super().__init__()
        c, h, w = (int(s) for s in shape)
        if h % 4 or w % 4:
            raise ValueError(f"the scattering transform takes images whose sides are divisible by 4, got {h}x{w}")
        self.shape, self.orientations, self.kernel_size = (c, h, w), int(orientations), int(kernel_size)
        self.channels = c * (1 + 2 * self.orientations + self.orientations**2)
        filters = morlet_filters(kernel_size, orientations=self.orientations)[:, None]  # [2L, 1, k, k]
        self.register_buffer("filters", filters, persistent=False)
        # the second-order convolutions: every first-order modulus map with every wavelet (groups of one map each)
        self.register_buffer("grouped_filters", filters.repeat(self.orientations, 1, 1, 1), persistent=False)
        for name, n in (("h", h), ("w", w)):
            self.register_buffer(f"half_{name}", blur_stride_matrix(n, 2, 0.8), persistent=False)  # the image to scale 1
            self.register_buffer(f"quarter_{name}", blur_stride_matrix(n, 4, 1.6), persistent=False)  # φ of the image
            self.register_buffer(f"half_of_half_{name}", blur_stride_matrix(n // 2, 2, 0.8), persistent=False)  # φ of scale 0

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return self.channels, self.shape[1] // 4, self.shape[2] // 4

    def _modulus(self, z: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
        """``|z ∗ ψ|`` of ``z`` ``[m, groups, h, w]`` for every wavelet, sampled at every other pixel: ``[m, groups·L, h/2,
        w/2]`` (the modulus is pointwise: a convolution of stride 2 gives exactly the subsampled modulus, whose envelope
        varies slowly enough for half the rate)."""
        r = F.conv2d(z, weight, stride=2, padding=self.kernel_size // 2, groups=groups)
        return _Modulus.apply(r.view(r.shape[0], groups, 2, self.orientations, *r.shape[2:])).flatten(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        c, h, w = self.shape
        u = ((x.reshape(n * c, 1, h, w) + 1.0) / 2.0).to(self.filters.dtype)
        quarter = (self.quarter_h, self.quarter_w)
        half = (self.half_h, self.half_w)
        half_of_half = (self.half_of_half_h, self.half_of_half_w)
        order0 = _blur_stride(u, *quarter)                                             # [nc, 1, H/4, W/4]
        first0 = self._modulus(u, self.filters, 1)                                    # [nc, L, H/2, W/2]: scale 0
        order1_scale0 = _blur_stride(first0, *half_of_half)                           # [nc, L, H/4, W/4]
        order1_scale1 = self._modulus(_blur_stride(u, *half), self.filters, 1)        # [nc, L, H/4, W/4]: scale 1
        order2 = self._modulus(first0, self.grouped_filters, self.orientations)       # [nc, L², H/4, W/4]: scales 0 → 1
        out = torch.cat([order0, order1_scale0, order1_scale1, order2], 1)
        return out.reshape(n, self.channels, h // 4, w // 4)

    def order_slices(self) -> list[slice]:
        """The channels of each order in the output of one colour: ``[0]``, the first order, the second order."""
        L = self.orientations
        return [slice(0, 1), slice(1, 1 + 2 * L), slice(1 + 2 * L, 1 + 2 * L + L * L)]


# ----------------------------------------------------------------------------------------------- feature maps
class FeatureMap(nn.Module):
    """A fixed map of images ``[n, C, H, W]`` to ``[n, dim]`` whose every row has norm at most 1 (exactly 1 for the
    Fourier maps) for every input: what :func:`~lightning_gpate.privacy.merf.feature_sum` sums with sensitivity 1."""

    dim: int

    def class_means(self, x: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
        """``assignmentᵀ · ψ(x)``: ``[K, dim]`` from ``assignment`` ``[n, K]`` (each class's column its records' weights, e.g.
        ``1/n_c``): the generator's class means, differentiable in ``x``."""
        return assignment.t().to(x.dtype) @ self(x)


class _FourierOf(FeatureMap):
    """Random Fourier features of a fixed representation ``r(x)`` ``[n, d]`` (``represent``), frequencies drawn from a
    public seed: ``φ(r(x))``, rows of norm exactly 1."""

    def __init__(self, num_features: int, input_dim: int, length_scale: float | Sequence[float], seed: int) -> None:
        super().__init__()
        self.register_buffer("frequencies", fourier_frequencies(num_features, input_dim, length_scale, seed), persistent=False)
        self.dim = int(num_features)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fourier_features(self.represent(x), self.frequencies)

    def class_means(self, x: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
        return fourier_class_means(self.represent(x), self.frequencies, assignment)


class PixelFourier(_FourierOf):
    """DP-MERF's map: random Fourier features of the pixels (a Gaussian kernel of length ``length_scale`` on images)."""

    def __init__(self, shape: Sequence[int], num_features: int, length_scale: float | Sequence[float], seed: int) -> None:
        super().__init__(num_features, math.prod(int(s) for s in shape), length_scale, seed)


def dct_matrix(n: int, k: int) -> torch.Tensor:
    """The ``[k, n]`` first rows of the orthonormal DCT-II matrix (row ``f``: ``√(2/n)·cos(π(2i + 1)f / (2n))``, row 0
    ``√(1/n)``)."""
    i = torch.arange(n, dtype=torch.float64)
    f = torch.arange(k, dtype=torch.float64)[:, None]
    m = torch.cos(math.pi * (2 * i + 1) * f / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m.float()


class DCTFourier(_FourierOf):
    """Random Fourier features of the ``k × k`` lowest frequencies of each colour's orthonormal DCT-II (module doc)."""

    def __init__(self, shape: Sequence[int], num_features: int, length_scale: float | Sequence[float], seed: int, *, size: int) -> None:
        c, h, w = (int(s) for s in shape)
        if not 1 <= size <= min(h, w):
            raise ValueError(f"dct_size must lie in [1, {min(h, w)}] for {h}x{w} images, got {size}")
        super().__init__(num_features, c * size * size, length_scale, seed)
        self.register_buffer("rows", dct_matrix(h, size), persistent=False)
        self.register_buffer("cols", dct_matrix(w, size), persistent=False)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        return (self.rows @ x.to(self.rows.dtype) @ self.cols.t()).flatten(1)


class ScatteringFeatures(FeatureMap):
    """The scattering coefficients of :class:`Scattering2D`, each order scaled to norm ``1/√3`` per record (module doc)."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.scattering = Scattering2D(shape)
        self.dim = math.prod(self.scattering.out_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scattering(x)
        s = s.view(s.shape[0], self.scattering.shape[0], -1, *s.shape[2:])  # [n, C, 81, h, w]
        orders = [unit_rows(s[:, :, part].flatten(1)) for part in self.scattering.order_slices()]
        return torch.cat(orders, 1) / math.sqrt(len(orders))


class ScatteringFourier(_FourierOf):
    """Random Fourier features of :class:`ScatteringFeatures` (a Gaussian kernel of length ``length_scale`` on the
    normalised coefficients, whose vectors have norm at most 1)."""

    def __init__(self, shape: Sequence[int], num_features: int, length_scale: float | Sequence[float], seed: int) -> None:
        scattering = ScatteringFeatures(shape)
        super().__init__(num_features, scattering.dim, length_scale, seed)
        self.scattering = scattering

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        return self.scattering(x)


def build_feature_map(kind: str, shape: Sequence[int], *, num_features: int | None = None,
                      length_scale: float | Sequence[float] | None = None, seed: int | None = None,
                      dct_size: int | None = None) -> FeatureMap:
    """The feature map ``kind`` (:data:`FEATURE_MAPS`) of images of ``shape`` ``(C, H, W)``; the Fourier maps need
    ``num_features``, ``length_scale`` and the public ``seed``, ``dct`` its ``dct_size``."""
    if kind not in FEATURE_MAPS:
        raise ValueError(f"feature map must be one of {FEATURE_MAPS}, got {kind!r}")
    if kind == "scattering":
        return ScatteringFeatures(shape)
    if num_features is None or length_scale is None or seed is None:
        raise ValueError(f"the feature map {kind!r} needs num_features, length_scale and seed")
    if kind == "pixels":
        return PixelFourier(shape, num_features, length_scale, seed)
    if kind == "dct":
        return DCTFourier(shape, num_features, length_scale, seed, size=int(dct_size or 0))
    return ScatteringFourier(shape, num_features, length_scale, seed)


# ----------------------------------------------------------------------------------------------- a fused gradient
class _FourierClassMeans(torch.autograd.Function):
    """``assignmentᵀ·φ(r)`` with ``φ(r) = [cos(rωᵀ), sin(rωᵀ)]/√M``, its gradient in ``r`` computed from the saved
    cosines and sines in one fused pass (no ``[n, 2M]`` concatenation, division or negation kept for autograd)."""

    @staticmethod
    def forward(ctx, r, frequencies, assignment):
        h = r @ frequencies.t()
        cos, sin = torch.cos(h), torch.sin(h)
        scale = 1.0 / math.sqrt(frequencies.shape[0])
        a = assignment.t().to(h.dtype)
        ctx.save_for_backward(cos, sin, frequencies, assignment)
        ctx.scale = scale
        return torch.cat([a @ cos, a @ sin], 1) * scale

    @staticmethod
    def backward(ctx, grad):
        cos, sin, frequencies, assignment = ctx.saved_tensors
        m = frequencies.shape[0]
        a = assignment.to(grad.dtype) * ctx.scale
        g_cos, g_sin = a @ grad[:, :m], a @ grad[:, m:]  # [n, M] each
        dh = torch.addcmul(g_sin * cos, g_cos, sin, value=-1.0)
        return dh @ frequencies, None, None


def fourier_class_means(r: torch.Tensor, frequencies: torch.Tensor, assignment: torch.Tensor) -> torch.Tensor:
    """``assignmentᵀ · fourier_features(r, frequencies)`` ``[K, 2M]`` (differentiable in ``r``), with a fused backward."""
    return _FourierClassMeans.apply(r.to(frequencies.dtype), frequencies, assignment)
