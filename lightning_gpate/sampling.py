"""Turn generated samples into files in the original data's form.

Tables become a CSV with the original column names, order, dtypes, ranges and categories; images an
``.npz`` (``images`` in the dataset's own range, ``labels``) plus a PNG grid with one row per class.
Files are written to a temporary name and renamed, so a failure never leaves a half-written output.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch


def samples_to_frame(spec: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> pd.DataFrame:
    """Generated tabular samples → a frame in the original schema."""
    from datamodules.tabular import TabularTransformer

    return TabularTransformer.from_spec(spec).inverse_transform(x.double().numpy(), y.numpy())


def image_grid(x: torch.Tensor, y: torch.Tensor, num_classes: int, per_class: int = 10) -> torch.Tensor:
    """A ``[C, H, W]`` grid in [0, 1]: one row per class with up to ``per_class`` samples of it."""
    from torchvision.utils import make_grid

    from datamodules.image import model_space_to_unit

    tiles = []
    blank = torch.zeros_like(x[0])
    for c in range(num_classes):
        of_class = x[y == c][:per_class]
        tiles += list(of_class) + [blank] * (per_class - len(of_class))
    return make_grid(model_space_to_unit(torch.stack(tiles)), nrow=per_class, padding=1, pad_value=1.0)


def save_png(grid: torch.Tensor, path: Path) -> None:
    from torchvision.utils import save_image

    save_image(grid, path)


def _atomic(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_samples(model, num_samples: int, output: str | Path, *, seed: int | None = None) -> list[Path]:
    """Generate ``num_samples`` rows/images with ``model`` and write them to ``output``.

    Tables: ``output`` is a ``.csv``. Images: ``output`` is a ``.npz`` and a ``.png`` grid is written
    beside it. Returns the written paths.
    """
    if num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {num_samples}")
    output = Path(output)
    spec = model.data_spec
    if spec["kind"] == "tabular":
        if output.suffix.lower() != ".csv":
            raise ValueError(f"tabular samples are written as CSV: give an output ending in .csv, not {output.name!r}")
        x, y = model.generate(num_samples, seed=seed)
        frame = samples_to_frame(spec, x, y)
        return [_atomic(output, lambda p: frame.to_csv(p, index=False))]
    if output.suffix.lower() != ".npz":
        raise ValueError(f"image samples are written as .npz (plus a .png grid): give an output ending in .npz, not {output.name!r}")
    from datamodules.image import images_to_original_range

    x, y = model.generate(num_samples, seed=seed)
    images = images_to_original_range(x, spec)
    classes = np.asarray(spec["class_names"])
    npz = _atomic(output, lambda p: np.savez_compressed(p, images=images, labels=y.numpy(), class_names=classes))
    png = _atomic(output.with_suffix(".png"), lambda p: save_png(image_grid(x, y, len(classes)), p))
    return [npz, png]
