"""Generators: conditional DCGAN (images) and conditional MLP (tables). Plain ``nn.Module``s."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def one_hot(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[*y.shape, num_classes]`` float one-hot rows of the labels ``y`` (a comparison, not
    ``F.one_hot``, so that it runs under ``torch.func.vmap`` and ``torch.compile``: DP-SGD's per-sample
    gradients of the conditional critics; labels are checked where they enter, by the DataModule)."""
    return (y.long().unsqueeze(-1) == torch.arange(num_classes, device=y.device)).float()


def concat_label_maps(h: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
    """Append the one-hot label as constant feature maps (DCGAN ``conv_cond_concat``)."""
    maps = y_onehot[:, :, None, None].expand(-1, -1, h.shape[2], h.shape[3])
    return torch.cat([h, maps], dim=1)


def conv_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the memory layout its convolutions run fastest in: channels-last on the CPU, where oneDNN's 5×5
    convolutions over few channels (the label maps make 26 at ``gf_dim`` 8) forward and backward 2.3× faster that way
    (DP-MERF's generator at 1,000 fakes, one thread: 1.76 → 0.78 s; ``benchmarks/results/dpmerf_mnist_tuning.md``). The
    values are the same up to rounding; elsewhere (CUDA, unmeasured) the layout is left as it is."""
    return x.contiguous(memory_format=torch.channels_last) if x.device.type == "cpu" and x.dim() == 4 else x


#: Which of a 5×5 kernel's taps (padding 2) read each of the 3 low-resolution neighbours (offsets −1, 0, +1) of an
#: output pixel of phase 0 (even) or 1 (odd) after ×2 nearest upsampling: ``[phase, neighbour, tap]``.
_PHASE_TAPS = torch.tensor([[[1., 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]],
                            [[1., 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]]])


class NearestUpsampleConv(nn.Sequential):
    """×2 nearest-neighbour upsampling, then a 5×5 convolution (padding 2): the modules and weights of
    ``Sequential(Upsample, Conv2d)``, computed without the upsampled image.

    Each output pixel of phase ``(a, b)`` (its row and column parity) reads only 3×3 pixels of the low-resolution
    input, so the layer is one 3×3 convolution of the input into ``4·out`` phase maps, its weights sums of the 5×5
    taps (:data:`_PHASE_TAPS`), then ``pixel_shuffle`` (Shi et al., CVPR 2016): 36 instead of 100 multiplications per
    input pixel, and no upsampled copy of the input. Label maps (constant over the image) need no convolution at all:
    ``labels`` ``[n, K]`` adds each class's response to its constant map (computed once a call for the K classes)
    instead of convolving ``K`` more input channels. Equal to the upsample-then-convolve layer to rounding (a float64
    test); on one CPU thread DP-MERF's generator at 1,000 fakes runs its two such layers forward and backward 7× faster.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(in_channels, out_channels, 5, padding=2))

    def phase_weights(self) -> torch.Tensor:
        """The 3×3 weights ``[4·out, in, 3, 3]`` of the phase maps, in ``pixel_shuffle``'s channel order."""
        w = self[1].weight
        taps = _PHASE_TAPS.to(w)
        return torch.einsum("ark,bsl,oikl->oabirs", taps, taps, w).reshape(w.shape[0] * 4, w.shape[1], 3, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``[n, C, H, W]``, or with ``labels`` ``[n, K]`` the maps ``x`` and the labels' constant maps after them
        (``concat_label_maps(x, labels)``, never built); returns ``[n, out, 2H, 2W]``."""
        weight, bias = self.phase_weights(), self[1].bias.repeat_interleave(4)
        channels = x.shape[1]
        out = F.conv2d(conv_layout(x), weight[:, :channels], bias, padding=1)
        if labels is not None:
            k = labels.shape[1]
            constant = torch.eye(k, dtype=x.dtype, device=x.device)[:, :, None, None].expand(k, k, *x.shape[2:])
            per_class = F.conv2d(constant, weight[:, channels:], padding=1)  # [K, 4·out, H, W]: zero padding at the borders
            out = out + (labels.to(x.dtype) @ per_class.flatten(1)).view_as(out)
        return F.pixel_shuffle(out, 2)


def _upsample(in_channels: int, out_channels: int, kind: str) -> nn.Module:
    """×2 spatial upsampling with a 5×5 kernel: a transposed convolution or nearest + convolution."""
    if kind == "transposed":
        return nn.ConvTranspose2d(in_channels, out_channels, 5, stride=2, padding=2, output_padding=1)
    return NearestUpsampleConv(in_channels, out_channels)


def _upsample_with_labels(layer: nn.Module, h: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
    """``layer`` applied to ``h`` with the label maps after it (DCGAN ``conv_cond_concat``)."""
    if isinstance(layer, NearestUpsampleConv):
        return layer(h, y_onehot)
    return layer(conv_layout(concat_label_maps(h, y_onehot)))


class ConditionalDCGANGenerator(nn.Module):
    """DCGAN generator with the label concatenated to every layer, as in G-PATE's MNIST model
    (DCGAN-tensorflow ``generator`` with ``y_dim``): fc(1024) → fc(2·gf·s/4·s/4) → deconv → deconv.

    Args:
        z_dim: latent size.
        num_classes: label classes.
        out_shape: ``(C, H, W)`` with ``H`` and ``W`` divisible by 4.
        gf_dim: base channel width (64 in the paper).
        fc_dim: width of the first dense layer (1024 in the paper).
        upsample: ``"transposed"``: 5×5 transposed convolutions of stride 2 (DCGAN, the paper);
            ``"nearest"``: nearest-neighbour ×2 upsampling, then a 5×5 convolution (Odena, Dumoulin &
            Olah, "Deconvolution and Checkerboard Artifacts", Distill 2016). A 5×5 kernel at stride 2
            overlaps unevenly, so the transposed layers paint a period-2 lattice that only a
            discriminator's full gradient removes; G-PATE's student sees a few random projections
            of its teachers' gradients per step, and at 28×28 its samples stay lattices
            (``docs/results.md``). The architecture is a public choice: it costs no privacy.
    """

    UPSAMPLE = ("transposed", "nearest")

    def __init__(self, *, z_dim: int, num_classes: int, out_shape: Sequence[int], gf_dim: int = 64, fc_dim: int = 1024,
                 upsample: str = "transposed") -> None:
        super().__init__()
        c, h, w = out_shape
        if h % 4 or w % 4:
            raise ValueError(f"image side must be divisible by 4, got {h}x{w}")
        if upsample not in self.UPSAMPLE:
            raise ValueError(f"upsample must be one of {self.UPSAMPLE}, got {upsample!r}")
        self.num_classes, self.out_shape = num_classes, tuple(out_shape)
        self.h4, self.w4, self.gf = h // 4, w // 4, gf_dim
        self.fc0 = nn.Sequential(nn.Linear(z_dim + num_classes, fc_dim), nn.BatchNorm1d(fc_dim), nn.ReLU(True))
        self.fc1 = nn.Sequential(
            nn.Linear(fc_dim + num_classes, 2 * gf_dim * self.h4 * self.w4),
            nn.BatchNorm1d(2 * gf_dim * self.h4 * self.w4), nn.ReLU(True),
        )
        self.up1 = nn.Sequential(_upsample(2 * gf_dim + num_classes, 2 * gf_dim, upsample), nn.BatchNorm2d(2 * gf_dim), nn.ReLU(True))
        self.up2 = _upsample(2 * gf_dim + num_classes, c, upsample)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        yo = one_hot(y, self.num_classes)
        h = self.fc0(torch.cat([z, yo], 1))
        h = self.fc1(torch.cat([h, yo], 1)).view(-1, 2 * self.gf, self.h4, self.w4)
        upsample, norm, relu = self.up1
        h = relu(norm(_upsample_with_labels(upsample, h, yo)))
        return torch.tanh(_upsample_with_labels(self.up2, h, yo)).contiguous()


class ConditionalConvGenerator(nn.Module):
    """The all-convolutional conditional DCGAN generator of *Private GANs, Revisited* (Bie, Kamath &
    Zhang, TMLR 2023, after Radford et al. 2016): latent and one-hot label each projected by a
    transposed convolution to ``2g`` maps of side ⌈H/8⌉ (4×4 at 28×28), concatenated, then transposed
    convolutions 3×3/2 (``2g``, to H/4), 4×4/2 (``g``) and 4×4/2 (C) with LeakyReLU 0.2 and a tanh output.
    No normalisation (the fakes of a batch do not depend on each other). The 4×4 stride-2 layers overlap
    evenly (no checkerboard of the 5×5 ones, see :class:`ConditionalDCGANGenerator`).

    Args:
        z_dim: latent size (128 in the paper).
        num_classes: label classes.
        out_shape: ``(C, H, W)`` with ``H`` and ``W`` divisible by 4.
        gf_dim: ``g``, the width (128 in the paper's MNIST runs).
    """

    def __init__(self, *, z_dim: int, num_classes: int, out_shape: Sequence[int], gf_dim: int = 128) -> None:
        super().__init__()
        c, h, w = out_shape
        if h % 4 or w % 4:
            raise ValueError(f"image side must be divisible by 4, got {h}x{w}")
        self.num_classes, self.out_shape = num_classes, tuple(out_shape)
        h4, w4 = h // 4, w // 4
        start = (-(-h4 // 2), -(-w4 // 2))  # the 3×3/2 layer doubles it to 2·start − 1 (+1 where H/4 is even)
        self.latent_in = nn.ConvTranspose2d(z_dim, 2 * gf_dim, start)
        self.label_in = nn.ConvTranspose2d(num_classes, 2 * gf_dim, start)
        self.body = nn.Sequential(
            nn.ConvTranspose2d(4 * gf_dim, 2 * gf_dim, 3, stride=2, padding=1,
                               output_padding=(h4 - 2 * start[0] + 1, w4 - 2 * start[1] + 1)),
            nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(2 * gf_dim, gf_dim, 4, stride=2, padding=1), nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(gf_dim, c, 4, stride=2, padding=1), nn.Tanh(),
        )
        self.act = nn.LeakyReLU(0.2)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = z[:, :, None, None]
        yo = one_hot(y, self.num_classes)[:, :, None, None]
        return self.body(torch.cat([self.act(self.latent_in(z)), self.act(self.label_in(yo))], 1))


class TabularActivation(nn.Module):
    """Per-column output activations: tanh for numeric/binary values, softmax over one-hot blocks."""

    def __init__(self, spans: Sequence[Sequence]) -> None:
        super().__init__()
        self.spans = [(int(s), int(e), str(a)) for s, e, a in spans]
        self._all_tanh = all(a == "tanh" for _, _, a in self.spans)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self._all_tanh:
            return torch.tanh(h)
        return torch.cat([torch.tanh(h[:, s:e]) if a == "tanh" else torch.softmax(h[:, s:e], dim=1) for s, e, a in self.spans], dim=1)


def _norm1d(kind: str, width: int) -> nn.Module:
    return {"batch": lambda: nn.BatchNorm1d(width), "layer": lambda: nn.LayerNorm(width), "none": nn.Identity}[kind]()


class ConditionalMLPGenerator(nn.Module):
    """MLP generator for tables: [z, onehot(y)] → hidden (norm, ReLU) → per-column activations.

    Args:
        z_dim: latent size.
        num_classes: label classes.
        spans: ``(start, end, activation)`` per output column (from the data spec).
        hidden: hidden widths.
        norm: ``"batch"``, ``"layer"`` or ``"none"``.
    """

    def __init__(self, *, z_dim: int, num_classes: int, spans: Sequence[Sequence], hidden: Sequence[int] = (256, 256), norm: str = "batch") -> None:
        super().__init__()
        self.num_classes = num_classes
        layers, width = [], z_dim + num_classes
        for h in hidden:
            layers += [nn.Linear(width, h), _norm1d(norm, h), nn.ReLU(True)]
            width = h
        out_dim = int(spans[-1][1]) if len(spans) else 0
        layers.append(nn.Linear(width, out_dim))
        self.body = nn.Sequential(*layers)
        self.activation = TabularActivation(spans)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.activation(self.body(torch.cat([z, one_hot(y, self.num_classes)], 1)))
