"""A user's own images: a folder of class folders (torchvision's ``ImageFolder`` layout), an ``.npz``, or arrays.

The layout is ``root/<class>/<file>.png`` (PNG or JPEG; files in sub-folders of a class folder belong to it;
names starting with ``.`` are skipped, as a file browser hides them). Every image is decoded by torchvision's
readers to uint8 ``[C, H, W]``.

What is public and what is private:

* **The classes** are public only when declared (``classes``): each must be a class folder, and a class folder
  that is not declared is an error (its images would otherwise be dropped or coded silently). Without a
  declaration the folder names are read from the private data: listed as private metadata, which the private
  models refuse, as for an image CSV.
* **The size and the colour** are the format of the data, not its content: either declared (``image_size``: every
  image is resized to that square, a public transform; ``channels``: 1 grey, 3 colour, every image converted),
  or every image must have the same one, and a file that differs is an error naming it. The format is never
  *chosen* from the images (e.g. "colour if any file is colour"): one record more would change the generator's
  shape, which would leak it.

Every error is one line that names the file or folder (never its pixels or how many images there are), raised
while the data is read: before a run starts, before any privacy is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from datamodules.base import DataError

#: File name endings read as images (case-insensitive); anything else in the tree (but hidden files) is an error.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
CHANNELS = (1, 3)


def resize_uint8(images: torch.Tensor, size: int, *, antialias: bool = False) -> torch.Tensor:
    """[n, C, H, W] uint8 → [n, C, size, size] uint8 (bilinear; ``antialias`` low-pass filters when shrinking)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=antialias)
    return out.round().clamp(0, 255).to(torch.uint8)


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _decode(path: Path) -> torch.Tensor:
    """One file → uint8 ``[C, H, W]`` with C 1 (grey) or 3 (colour); an alpha channel is dropped."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        image = decode_image(str(path), mode=ImageReadMode.UNCHANGED)
    except (RuntimeError, OSError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise DataError(f"{path}: not a readable PNG or JPEG image, or truncated ({reason})") from None
    if image.dtype != torch.uint8:
        raise DataError(f"{path}: {str(image.dtype).removeprefix('torch.')} pixels; save it with 8 bits a channel")
    if image.ndim != 3 or image.shape[0] not in (1, 2, 3, 4):
        raise DataError(f"{path}: an image of shape {tuple(image.shape)} (expected grey or colour)")
    return image[:1] if image.shape[0] <= 2 else image[:3]


def _to_channels(image: torch.Tensor, channels: int) -> torch.Tensor:
    if image.shape[0] == channels:
        return image
    if channels == 3:
        return image.expand(3, -1, -1)
    # ITU-R BT.601 luma, as Pillow's convert("L")
    weights = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    return (image.float() * weights).sum(0, keepdim=True).round().clamp(0, 255).to(torch.uint8)


def check_format_options(image_size: int | None, channels: int | None) -> None:
    if image_size is not None and image_size < 4:
        raise DataError(f"image_size must be >= 4, got {image_size}")
    if channels is not None and channels not in CHANNELS:
        raise DataError(f"data.channels must be 1 (grey) or 3 (colour), got {channels}")


def _class_codes(found: Sequence[str], classes: Sequence[Any] | None, where: str) -> tuple[list[str], list[str]]:
    """Class names in code order and the private metadata they are (``["label"]`` when read from the data)."""
    if classes is None:
        return sorted(found), ["label"]
    declared = [str(c) for c in classes]
    undeclared = sorted(set(found) - set(declared))
    if undeclared:
        raise DataError(f"{where}: {undeclared[0]!r} is not among the declared data.classes {declared[:10]}: "
                        f"declare every class, or move its images out")
    return declared, []


def read_image_folder(
    root: str | Path, *, classes: Sequence[Any] | None = None, image_size: int | None = None, channels: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[str], list[str]]:
    """Read ``root/<class>/<file>`` images.

    Args:
        root: the folder of class folders.
        classes: the class folders' names, declared public (label codes follow this order). ``None``: read from
            the folder (private metadata).
        image_size: resize every image to this square (``None``: every image must have one square size).
        channels: 1 (grey) or 3 (colour), every image converted (``None``: every image must have the same).

    Returns:
        ``(images uint8 [n, C, S, S], labels int64 [n], class names, private metadata)``.

    Raises:
        DataError: one line naming the file or folder: a missing root, a file outside any class folder, an empty or
            undeclared class folder, a declared class without a folder, a file that is not a readable PNG/JPEG, an
            image of another size or colour than the first when none is declared, a non-square image.
    """
    from lightning_gpate.progress import progress

    check_format_options(image_size, channels)
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"image folder not found: {root.resolve()} (data.root: a folder of class folders, root/<class>/<image>.png)")
    entries = sorted(p for p in root.iterdir() if _visible(p))
    stray = [p for p in entries if not p.is_dir()]
    if stray:
        raise DataError(f"{stray[0]}: a file outside any class folder (the layout is root/<class>/<image>.png): "
                        f"move it into its class's folder, or out of {root}")
    folders = {p.name: p for p in entries}
    if not folders:
        raise DataError(f"{root}: no class folders (the layout is root/<class>/<image>.png)")
    names, private = _class_codes(list(folders), classes, str(root))
    missing = [n for n in names if n not in folders]
    if missing:
        raise DataError(f"{root / missing[0]}: the declared class {missing[0]!r} has no folder")
    files: list[tuple[Path, int]] = []
    for code, name in enumerate(names):
        found = sorted(p for p in folders[name].rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not found:
            raise DataError(f"{folders[name]}: an empty class folder (no images in it): add its images, or remove it "
                            f"(and its class from data.classes)")
        for path in found:
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise DataError(f"{path}: not a PNG or JPEG file (by its name): remove it or convert it")
            files.append((path, code))
    images, first = [], None
    # a percentage, not a count: how many images the folder holds is private (as in every message here)
    for path, _ in progress(files, desc=f"reading {root.name}", unit="image", show_count=False):
        image = _decode(path)
        if channels is not None:
            image = _to_channels(image, channels)
        if image_size is not None:
            image = resize_uint8(image.unsqueeze(0), image_size, antialias=True)[0]
        if first is None:
            first = path, tuple(image.shape)
            if image.shape[-1] != image.shape[-2]:
                raise DataError(f"{path}: a {image.shape[-1]}×{image.shape[-2]} image is not square: declare "
                                f"data.image_size to resize every image to one square size")
        elif tuple(image.shape) != first[1]:
            raise DataError(f"{path}: {_describe(image.shape)}, but {first[0]} is {_describe(first[1])}: declare "
                            + ("data.image_size to resize every image to one square size" if image.shape[1:] != first[1][1:]
                               else "data.channels (1 grey, 3 colour) to convert every image"))
        images.append(image)
    x = torch.stack(images)
    y = torch.tensor([code for _, code in files], dtype=torch.long)
    return x, y, names, private


def _describe(shape) -> str:
    c, h, w = shape
    return f"a {w}×{h} {'grey' if c == 1 else 'colour'} image"


def images_from_arrays(
    images: np.ndarray, labels: np.ndarray, *, classes: Sequence[Any] | None = None, image_size: int | None = None,
    where: str = "images",
) -> tuple[torch.Tensor, torch.Tensor, list[str], list[str], dict[str, Any]]:
    """Arrays of images and labels (the Python API, or an ``.npz`` with ``images`` and ``labels``).

    ``images``: ``[n, H, W]`` (grey), ``[n, H, W, C]`` or ``[n, C, H, W]`` with C 1 or 3; uint8 (or integers in 0..255),
    or floats in [0, 1]. Returns ``(images uint8 [n, C, S, S], labels, class names, private metadata, layout)``, where
    ``layout`` (``axes``, ``dtype``, ``value_max``, the class values as given) lets generated images come back in the
    form they came in.
    """
    check_format_options(image_size, None)
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim == 3:
        axes, x = "NHW", images[:, None]
    elif images.ndim == 4 and images.shape[-1] in CHANNELS:
        axes, x = "NHWC", np.moveaxis(images, -1, 1)
    elif images.ndim == 4 and images.shape[1] in CHANNELS:
        axes, x = "NCHW", images
    else:
        raise DataError(f"{where}: images of shape {images.shape[1:]}; give [n, H, W] (grey), [n, H, W, C] or [n, C, H, W] "
                        f"with C 1 (grey) or 3 (colour)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"{where}: labels must be one per image (a 1-d array as long as the images), got shape {labels.shape}")
    if len(images) == 0:
        raise DataError(f"{where}: no images")
    if np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
            raise DataError(f"{where}: float images must lie in [0, 1] without NaN (or give uint8 in 0..255)")
        pixels, value_max = np.round(x * 255.0).astype(np.uint8), 1.0
    elif np.issubdtype(x.dtype, np.integer) or x.dtype == bool:
        if x.min() < 0 or x.max() > 255:
            raise DataError(f"{where}: integer images must be grey levels in 0..255")
        pixels, value_max = x.astype(np.uint8), 255.0
    else:
        raise DataError(f"{where}: images of dtype {x.dtype}; give uint8 in 0..255 or floats in [0, 1]")
    tensor = torch.from_numpy(np.ascontiguousarray(pixels))
    if image_size is not None:
        tensor = resize_uint8(tensor, image_size, antialias=True)
    elif tensor.shape[-1] != tensor.shape[-2]:
        raise DataError(f"{where}: {tensor.shape[-1]}×{tensor.shape[-2]} images are not square: give image_size to resize them")
    present = np.unique(labels).tolist()
    if classes is None:  # read from the private labels, in their own order: private metadata
        values, names, private = present, [str(v) for v in present], ["label"]
    else:
        names, private, values = [str(c) for c in classes], [], list(classes)
        if {str(v) for v in present} - set(names):  # which labels is private (as for an image CSV): a folder is named, a label not
            raise DataError(f"{where}: some labels are not among the declared data.classes {names[:10]}: declare every "
                            f"class, or drop those images")
    code = {n: i for i, n in enumerate(names)}
    y = torch.tensor([code[str(v)] for v in labels.tolist()], dtype=torch.long)
    layout = {"axes": axes, "dtype": "uint8" if value_max == 255.0 else "float32", "value_max": value_max,
              "class_values": [v.item() if hasattr(v, "item") else v for v in values]}
    return tensor, y, names, private, layout


def read_npz(path: str | Path, *, classes: Sequence[Any] | None = None, image_size: int | None = None):
    """An ``.npz`` with ``images`` and ``labels`` (:func:`images_from_arrays`; the format ``sample`` writes)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path.resolve()}")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "images" not in data or "labels" not in data:
                raise DataError(f"{path}: an .npz needs arrays named 'images' and 'labels' (has {sorted(data.files)[:5]})")
            images, labels = data["images"], data["labels"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError) as err:
        raise DataError(f"{path}: not a readable .npz ({type(err).__name__})") from None
    return images_from_arrays(images, labels, classes=classes, image_size=image_size, where=str(path))
