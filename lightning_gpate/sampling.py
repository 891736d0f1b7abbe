"""Turn generated samples into files in the original data's form.

Tables become a CSV with the original column names, order, dtypes, ranges and categories; images an
``.npz`` (``images`` in the dataset's own range, ``labels``). Beside either, a picture to look at: for
images a grid with one labelled class per row (:func:`image_grid`, which draws every image grid of
the project), for tables the marginals of a few columns. Real data appears in these pictures only for
a non-private model (its real test split) or when the user gives a reference set they declare public:
a private model's pictures show synthetic data only. Files are written to a temporary name and
renamed, so a failure never leaves a half-written output.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from lightning_gpate.files import folder_atomically, write_atomically


def samples_to_frame(spec: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> pd.DataFrame:
    """Generated tabular samples → a frame in the original schema."""
    from datamodules.tabular import TabularTransformer

    return TabularTransformer.from_spec(spec).inverse_transform(x.double().numpy(), y.numpy())


#: Smallest side, in pixels, of one image in a grid: small images (8×8 digits) are enlarged to it.
MIN_TILE_PX = 48
_GAP_PX = 2
_BACKGROUND = (255, 255, 255)
_GAP = (200, 200, 200)


def _tiles_uint8(x: torch.Tensor, scale: int) -> np.ndarray:
    """Images in the generator's space [-1, 1], ``[n, C, H, W]`` → ``[n, H·scale, W·scale, 3]`` uint8,
    enlarged by repeating pixels (nearest neighbour: no smoothing invents detail)."""
    from datamodules.image import model_space_to_unit

    unit = model_space_to_unit(x.detach().float().cpu())
    if unit.shape[1] == 1:
        unit = unit.expand(-1, 3, -1, -1)
    arr = (unit[:, :3].permute(0, 2, 3, 1).numpy() * 255.0).round().astype(np.uint8)
    return arr.repeat(scale, axis=1).repeat(scale, axis=2)


def image_grid(
    x: torch.Tensor,
    y: torch.Tensor,
    class_names: Sequence[str] | int,
    per_class: int = 10,
    *,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
    reference_title: str = "real",
    per_class_reference: int | None = None,
    classes: Sequence[int] | None = None,
    rows_per_class: int = 1,
    title: str = "synthetic",
    min_tile: int = MIN_TILE_PX,
):
    """A labelled grid of images, one class per row: every image of the project's pictures (the
    ``sample`` command's PNG, the MLflow sample grids, the README's picture) is drawn by it.

    Each class gets ``rows_per_class`` rows of ``per_class`` of its images (in the order of ``x``),
    with its name at the start of its first row; a class with fewer images leaves blanks. Small
    images are enlarged by an integer factor (nearest neighbour) to at least ``min_tile`` pixels.
    ``reference`` images of the same classes (e.g. the real test split of a non-private run, or a
    public reference set a user gives; never a private model's training data) are drawn to the right,
    under the header ``reference_title``.

    Args:
        x: images in the generator's space [-1, 1], ``[n, C, H, W]`` (grey or RGB).
        y: their labels, ``[n]``.
        class_names: the names of the classes (a number: the classes are named 0, 1, …).
        per_class: images per row.
        reference: ``(images, labels)`` to draw beside, in the same space.
        reference_title: header over the reference images.
        per_class_reference: reference images per row (default: half of ``per_class``, at least 1).
        classes: the classes to draw, in this order (default: all).
        rows_per_class: rows of each class.
        title: header over the generated images.
        min_tile: smallest side of one image, in pixels.

    Returns:
        A ``PIL.Image.Image`` (RGB); :func:`save_png` writes it.
    """
    from PIL import Image, ImageDraw, ImageFont

    names = [str(c) for c in range(class_names)] if isinstance(class_names, int) else [str(n) for n in class_names]
    classes = list(range(len(names))) if classes is None else [int(c) for c in classes]
    height, width = int(x.shape[-2]), int(x.shape[-1])
    scale = max(1, -(-min_tile // max(height, width)))
    tile_h, tile_w = height * scale, width * scale
    font = ImageFont.load_default(size=max(12, min(20, tile_h // 3)))
    text_w = lambda s: int(math.ceil(font.getlength(s)))  # noqa: E731
    label_w = max([text_w(names[c]) for c in classes] + [0]) + 3 * _GAP_PX + 6
    header_h = int(font.size * 1.6)
    n_ref = 0 if reference is None else (per_class_reference or max(1, per_class // 2))
    block_w = lambda n: n * tile_w + (n - 1) * _GAP_PX  # noqa: E731
    synth_w = block_w(per_class)
    ref_x0 = label_w + synth_w + 4 * tile_w // 3  # a gap of a third of a tile between the two blocks
    total_w = (ref_x0 + block_w(n_ref) if n_ref else label_w + synth_w) + _GAP_PX
    rows = len(classes) * rows_per_class
    total_h = header_h + rows * tile_h + (rows - 1) * _GAP_PX + _GAP_PX
    canvas = Image.new("RGB", (total_w, total_h), _BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    draw.text((label_w, header_h // 2), title, fill=(0, 0, 0), font=font, anchor="lm")
    if n_ref:
        draw.text((ref_x0, header_h // 2), reference_title, fill=(0, 0, 0), font=font, anchor="lm")

    def paste(images: torch.Tensor, x0: int, top: int, count: int) -> None:
        tiles = _tiles_uint8(images, scale) if len(images) else []
        for i in range(count):
            left = x0 + i * (tile_w + _GAP_PX)
            if i < len(tiles):
                canvas.paste(Image.fromarray(tiles[i]), (left, top))
            else:  # a blank where the class has no more images
                draw.rectangle([left, top, left + tile_w - 1, top + tile_h - 1], fill=_GAP)

    y = y.detach().cpu()
    ref_y = None if reference is None else reference[1].detach().cpu()
    for row_of_class, c in enumerate(classes):
        of_class = x[y == c]
        ref_of_class = reference[0][ref_y == c] if reference is not None else None
        for r in range(rows_per_class):
            top = header_h + (row_of_class * rows_per_class + r) * (tile_h + _GAP_PX)
            if r == 0:
                draw.text((label_w - 2 * _GAP_PX - 3, top + tile_h // 2), names[c], fill=(0, 0, 0), font=font, anchor="rm")
            paste(of_class[r * per_class:(r + 1) * per_class], label_w, top, per_class)
            if n_ref:
                paste(ref_of_class[r * n_ref:(r + 1) * n_ref], ref_x0, top, n_ref)
    return canvas


def save_png(image, path: Path) -> None:
    """Write a grid (a ``PIL.Image`` from :func:`image_grid`) as PNG."""
    image.save(path, format="PNG", optimize=True)


#: Columns drawn in the picture beside a sampled table (the label first).
MARGINAL_COLUMNS = 6


def load_reference(path: str | Path, spec: dict[str, Any]):
    """A reference set a user gives (declared public) to draw beside the samples: an ``.npz`` with
    ``images`` in the dataset's own range [0, value_max] and ``labels`` (the format ``sample`` writes)
    for images, a CSV with the data's columns for tables. Returns ``(images in [-1, 1], labels)`` or a
    DataFrame."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference file not found: {path}")
    if spec["kind"] == "tabular":
        frame = pd.read_csv(path)
        missing = [c for c in spec.get("column_order", []) if c not in frame.columns]
        if missing:
            raise ValueError(f"the reference table {path.name} lacks the data's columns {missing[:5]}")
        return frame
    with np.load(path, allow_pickle=False) as data:
        if "images" not in data or "labels" not in data:
            raise ValueError(f"the reference {path.name} must be an .npz with 'images' and 'labels' (as `lightning-gpate sample` writes)")
        images, labels = torch.as_tensor(data["images"]).float(), torch.as_tensor(data["labels"]).long()
    if tuple(images.shape[1:]) != tuple(spec["shape"]):
        raise ValueError(f"the reference images have shape {tuple(images.shape[1:])}, the model's {tuple(spec['shape'])}")
    return images / float(spec["value_max"]) * 2.0 - 1.0, labels


def write_samples(
    model, num_samples: int, output: str | Path, *, seed: int | None = None, reference=None, reference_title: str = "real"
) -> list[Path]:
    """Generate ``num_samples`` rows/images with ``model`` and write them to ``output``, with a picture
    beside it (same name, ``.png``).

    Tables: ``output`` is a ``.csv``; the picture shows the marginals of a few columns. Images:
    ``output`` is an ``.npz``, or a new folder (a name without a suffix) of PNGs in class folders,
    ``output/<class>/<n>.png``: the layout a folder of a user's images has (:func:`write_image_folder`); the
    picture is a grid with one labelled class per row (:func:`image_grid`), beside it (``output.png``). ``reference`` (``(images, labels)`` in [-1, 1] or a DataFrame, see
    :func:`load_reference` and :func:`lightning_gpate.evaluation.store.real_test_split`) is drawn beside the synthetic data under
    ``reference_title``. Returns the written paths.
    """
    if num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {num_samples}")
    output = Path(output)
    spec = model.data_spec
    if spec["kind"] == "tabular":
        if output.suffix.lower() != ".csv":
            raise ValueError(f"tabular samples are written as CSV: give an output ending in .csv, not {output.name!r}")
        from lightning_gpate.evaluation.plots import marginal_plot

        x, y = model.generate(num_samples, seed=seed)
        frame = samples_to_frame(spec, x, y)
        csv = write_atomically(output, lambda p: frame.to_csv(p, index=False))
        label = spec["label"]["name"]
        columns = [label] + [c for c in frame.columns if c != label][:MARGINAL_COLUMNS - 1]
        png = write_atomically(output.with_suffix(".png"), lambda p: marginal_plot(reference, frame, p, columns=columns, real_label=reference_title))
        return [csv, png]
    as_folder = output.suffix == "" or output.is_dir()
    if not as_folder and output.suffix.lower() != ".npz":
        raise ValueError(f"image samples are written as .npz, or as PNGs in class folders (an output without a suffix: "
                         f"a new folder), each with a .png grid beside it: not {output.name!r}")
    if as_folder and output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"{output} exists and is not an empty folder: give a new folder for the PNGs (nothing is overwritten)")
    from datamodules.image import images_to_original_range

    x, y = model.generate(num_samples, seed=seed)
    if as_folder:
        folder = write_image_folder(x, y, spec["class_names"], output)
        grid = image_grid(x, y, list(spec["class_names"]), reference=reference, reference_title=reference_title)
        return [folder, write_atomically(output.with_name(output.name + ".png"), lambda p: save_png(grid, p))]
    images = images_to_original_range(x, spec)
    classes = np.asarray(spec["class_names"])
    npz = write_atomically(output, lambda p: np.savez_compressed(p, images=images, labels=y.numpy(), class_names=classes))
    grid = image_grid(x, y, list(classes), reference=reference, reference_title=reference_title)
    png = write_atomically(output.with_suffix(".png"), lambda p: save_png(grid, p))
    return [npz, png]


def class_folder_name(name: str) -> str:
    """A class name as a folder name: path separators and a leading dot replaced (``T-shirt/top`` → ``T-shirt_top``)."""
    safe = str(name).replace("/", "_").replace("\\", "_").strip() or "_"
    return "_" + safe[1:] if safe.startswith(".") else safe


def write_image_folder(x: torch.Tensor, y: torch.Tensor, class_names: Sequence[str], output: str | Path) -> Path:
    """Generated images (``[n, C, H, W]`` in [-1, 1]) as 8-bit PNGs in class folders, ``output/<class>/<n>.png`` (grey
    or RGB as the data), the layout :class:`~datamodules.ImageDataModule` reads with ``dataset: folder``. Written in a
    hidden folder beside ``output`` and renamed: a failure leaves no partial folder. ``output`` must not exist, or be
    empty. Every class gets its folder, also one that drew no image."""
    from PIL import Image

    from datamodules.image import model_space_to_unit

    output = Path(output)
    names = [class_folder_name(n) for n in class_names]
    if len(set(names)) != len(names):
        raise ValueError(f"two classes have the same folder name: {names}")
    pixels = (model_space_to_unit(x.detach().float().cpu()) * 255.0).round().to(torch.uint8).numpy()
    labels = y.detach().cpu().numpy()
    with folder_atomically(output) as tmp:
        counts = [0] * len(names)
        for name in names:
            (tmp / name).mkdir()
        for image, label in zip(pixels, labels):
            mode_image = image[0] if image.shape[0] == 1 else image[:3].transpose(1, 2, 0)
            Image.fromarray(np.ascontiguousarray(mode_image)).save(tmp / names[label] / f"{counts[label]:06d}.png", format="PNG")
            counts[label] += 1
    return output


def image_arrays(model, num_samples: int, *, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``num_samples`` generated images and labels as numpy arrays in the form the data came in (its spec's ``layout``
    for arrays: axes, uint8 or floats in [0, 1], the class values as given; otherwise uint8 ``[n, H, W]`` (grey) or
    ``[n, H, W, C]`` for a dataset of 8-bit images, floats in its own range for others, the class names as labels)."""
    from datamodules.image import images_to_original_range

    spec = model.data_spec
    layout = spec.get("layout") or {
        "axes": "NHW" if spec["shape"][0] == 1 else "NHWC", "value_max": float(spec["value_max"]),
        "dtype": "uint8" if float(spec["value_max"]) == 255.0 else "float32", "class_values": list(spec["class_names"]),
    }
    x, y = model.generate(num_samples, seed=seed)
    images = images_to_original_range(x, spec)  # [n, C, H, W] in [0, value_max]
    if layout["dtype"] == "uint8":
        images = np.round(images).clip(0, 255).astype(np.uint8)
    axes = layout["axes"]
    if axes == "NHW":
        images = images[:, 0]
    elif axes == "NHWC":
        images = np.moveaxis(images, 1, -1)
    values = layout["class_values"]
    labels = np.asarray([values[i] for i in y.tolist()])
    return np.ascontiguousarray(images), labels
