"""Single (non-ensemble) conditional discriminators: DCGAN for images, MLP for tables."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from lightning_gpate.nets.generators import _norm1d, concat_label_maps, one_hot


def _norm2d(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":  # per-sample statistics: safe under DP-SGD's per-sample gradients
        return nn.GroupNorm(min(32, channels), channels)
    return nn.Identity()


class ConditionalDCGANDiscriminator(nn.Module):
    """DCGAN discriminator with the label concatenated to every layer (G-PATE's MNIST teacher shape):
    conv5x5/2 → conv5x5/2 (norm) → fc(1024) (norm) → fc(1). Returns logits ``[n]``.

    Args:
        in_shape: ``(C, H, W)``.
        num_classes: label classes.
        df_dim: base channel width (64 in the paper).
        fc_dim: dense width (1024 in the paper).
        norm: ``"batch"`` (non-private), ``"group"`` or ``"none"`` (DP-SGD needs per-sample norms).
    """

    def __init__(self, *, in_shape: Sequence[int], num_classes: int, df_dim: int = 64, fc_dim: int = 1024, norm: str = "batch") -> None:
        super().__init__()
        c, h, w = in_shape
        self.num_classes = num_classes
        self.conv0 = nn.Conv2d(c + num_classes, c + num_classes, 5, stride=2, padding=2)
        self.conv1 = nn.Conv2d(c + 2 * num_classes, df_dim + num_classes, 5, stride=2, padding=2)
        self.norm1 = _norm2d(norm, df_dim + num_classes)
        flat = (df_dim + num_classes) * ((h + 3) // 4) * ((w + 3) // 4)
        self.fc0 = nn.Linear(flat + num_classes, fc_dim)
        self.norm_fc = _norm1d("layer" if norm == "group" else norm, fc_dim)
        self.fc1 = nn.Linear(fc_dim + num_classes, 1)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        yo = one_hot(y, self.num_classes)
        h = self.act(self.conv0(concat_label_maps(x, yo)))
        h = self.act(self.norm1(self.conv1(concat_label_maps(h, yo))))
        h = self.act(self.norm_fc(self.fc0(torch.cat([h.flatten(1), yo], 1))))
        return self.fc1(torch.cat([h, yo], 1)).squeeze(1)


class LabelTapConv(nn.Module):
    """A convolution ``conv`` applied to constant maps (each input channel one value over the whole
    ``image`` of side H×W, e.g. a one-hot label's maps), computed from its kernel's taps: at each output
    position, the bias plus the taps of each channel that fall inside the image,
    ``b + (v · W) V`` with ``V[k, p] = 1`` where tap ``k`` falls inside the image at output position
    ``p``. Input ``v`` ``[n, C]``, output ``[n, O, H', W']``, equal to ``conv(v[:, :, None, None].expand(..., H, W))``.
    Holds ``conv`` without registering it (its parameters stay where they are: the state dict is
    unchanged); :func:`lightning_gpate.privacy.dpsgd.bookkeeping_clipped_sums` knows its per-sample gradient."""

    def __init__(self, conv: nn.Conv2d, image: Sequence[int]) -> None:
        super().__init__()
        self._conv = (conv,)  # a tuple: not a submodule
        kh, kw = conv.kernel_size
        taps = nn.functional.conv2d(torch.ones(1, 1, *image), torch.eye(kh * kw).view(kh * kw, 1, kh, kw),
                                    stride=conv.stride, padding=conv.padding)
        self.register_buffer("tap_mask", taps[0].flatten(1), persistent=False)  # V: [kh·kw, H'·W']
        self.out_side = tuple(taps.shape[2:])

    @property
    def conv(self) -> nn.Conv2d:
        return self._conv[0]

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        weight = self.conv.weight.flatten(2)  # [O, C, kh·kw]
        per_input = torch.einsum("nc,ock->nok", v, weight)
        out = torch.matmul(per_input, self.tap_mask.to(weight.dtype)) + self.conv.bias[:, None]
        return out.view(len(v), -1, *self.out_side)


class ConditionalConvDiscriminator(nn.Module):
    """The all-convolutional conditional DCGAN discriminator of *Private GANs, Revisited* (Bie, Kamath &
    Zhang, TMLR 2023, after Radford et al. 2016): the image and the one-hot label maps each through a
    4×4/2 convolution (``d/2`` channels), concatenated, 4×4/2 (``2d``), 3×3/2 (``4d``), then one
    convolution over the whole remaining map (4×4 at 28×28) to the logit; LeakyReLU 0.2, no dense layer.
    No normalisation by default: DP-SGD needs each record's gradient to depend on that record only
    (``norm="group"`` normalises within a sample). Returns logits ``[n]``.

    Args:
        in_shape: ``(C, H, W)``.
        num_classes: label classes.
        df_dim: ``d``, the width (128 in the paper's MNIST runs); even.
        norm: ``"none"`` (the paper) or ``"group"`` (GroupNorm after the 2d and 4d convolutions).
    """

    NORMS = ("none", "group")

    def __init__(self, *, in_shape: Sequence[int], num_classes: int, df_dim: int = 128, norm: str = "none") -> None:
        super().__init__()
        if df_dim < 2 or df_dim % 2:
            raise ValueError(f"df_dim must be even and >= 2, got {df_dim}")
        if norm not in self.NORMS:
            raise ValueError(f"norm must be one of {self.NORMS}, got {norm!r}")
        c, h, w = in_shape
        self.num_classes = num_classes
        self.image_in = nn.Conv2d(c, df_dim // 2, 4, stride=2, padding=1)
        self.label_in = nn.Conv2d(num_classes, df_dim // 2, 4, stride=2, padding=1)
        self.body = nn.Sequential(  # on the two branches' activations, concatenated
            nn.Conv2d(df_dim, 2 * df_dim, 4, stride=2, padding=1), _norm2d(norm, 2 * df_dim),
            nn.LeakyReLU(0.2), nn.Conv2d(2 * df_dim, 4 * df_dim, 3, stride=2, padding=1), _norm2d(norm, 4 * df_dim),
            nn.LeakyReLU(0.2),
        )
        side = lambda n: (n // 2 // 2 + 1) // 2  # noqa: E731 - the map's side after the three strided layers
        if min(side(h), side(w)) < 1:
            raise ValueError(f"images of at least 4x4 pixels, got {h}x{w}")
        self.out = nn.Conv2d(4 * df_dim, 1, (side(h), side(w)))
        self.act = nn.LeakyReLU(0.2)
        #: compute ``label_in`` of the one-hot maps by :class:`LabelTapConv` (the same function, about
        #: ten times fewer operations, and a sample's gradient a small einsum instead of a convolution):
        #: set by DP-SGD paths that compute per-sample gradients without opacus (whose hooks need
        #: ``label_in`` called).
        self.label_taps = False
        self.label_tap_conv = LabelTapConv(self.label_in, (h, w))

    def label_response(self, y: torch.Tensor) -> torch.Tensor:
        """``label_in`` applied to the constant one-hot label maps of ``y``, without building them
        (:class:`LabelTapConv`); ``[n, d/2, H', W']``."""
        return self.label_tap_conv(one_hot(y, self.num_classes).to(self.label_in.weight.dtype))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.label_taps:
            labels = self.label_tap_conv(one_hot(y, self.num_classes).to(x.dtype))
        else:
            labels = self.label_in(one_hot(y, self.num_classes)[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3]))
        h = torch.cat([self.act(self.image_in(x)), self.act(labels)], 1)
        return self.out(self.body(h)).flatten()


class ConditionalMLPDiscriminator(nn.Module):
    """MLP discriminator for tables: [x, onehot(y)] → hidden (norm, LeakyReLU 0.2) → logit ``[n]``."""

    def __init__(self, *, in_features: int, num_classes: int, hidden: Sequence[int] = (256, 256), norm: str = "none") -> None:
        super().__init__()
        self.num_classes = num_classes
        layers, width = [], in_features + num_classes
        for h in hidden:
            layers += [nn.Linear(width, h), _norm1d(norm, h), nn.LeakyReLU(0.2)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([x.flatten(1), one_hot(y, self.num_classes)], 1)).squeeze(1)
