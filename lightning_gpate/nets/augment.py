"""Data augmentation of the teachers' inputs (private training, not released)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_translate(x: torch.Tensor, shift: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image moved by its own offset, uniform in ``[-shift, shift]`` pixels along each axis, the border
    replicated (DiffAugment's translation, Zhao et al., NeurIPS 2020, Section 3, with edge padding instead of
    zeros so that a digit's background stays background in any value range).

    A teacher of G-PATE holds ~30 digits at 2,000 teachers and sees all of them at every step; translated
    copies are a prior that small shifts keep a digit a digit, so the teacher generalises from more than its
    30 exact images. Each teacher's inputs stay its own partition's records: the privacy analysis is unchanged.
    Measured (GaussAgg, ε = 10 proxy with teachers of 30 digits, ``benchmarks/results/gpate_mnist_cpu.md`` row 25):
    shift 2 made blocky strokes, 0.560 against 0.672 without, so G-PATE's ``teacher_augment_shift`` defaults to 0.

    Args:
        x: images ``[..., C, H, W]``.
        shift: the largest offset in pixels (0: ``x`` itself).
        generator: the random source of the offsets (training randomness, not a mechanism's).

    Returns:
        A tensor of ``x``'s shape and dtype.
    """
    if shift <= 0:
        return x
    *lead, C, H, W = x.shape
    flat = x.reshape(-1, C, H, W)
    n = flat.shape[0]
    padded = F.pad(flat, (shift, shift, shift, shift), mode="replicate")  # [n, C, H + 2s, W + 2s]
    dy, dx = torch.randint(0, 2 * shift + 1, (2, n, 1), device=x.device, generator=generator)
    rows = (dy + torch.arange(H, device=x.device)).view(n, 1, H, 1).expand(n, C, H, W + 2 * shift)
    cols = (dx + torch.arange(W, device=x.device)).view(n, 1, 1, W).expand(n, C, H, W)
    return padded.gather(2, rows).gather(3, cols).view(*lead, C, H, W)
