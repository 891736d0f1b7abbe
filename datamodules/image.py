"""Image data: embedded digits, MNIST and Fashion-MNIST (their IDX files), CelebA (torchvision), an image CSV, or a
user's own images (a folder of class folders, an ``.npz``, arrays: :mod:`datamodules.folder`).

Images are stored as uint8 and mapped to [-1, 1] per batch (the generators end in tanh); the spec's
``value_max`` maps generated images back to the dataset's own range.

MNIST and Fashion-MNIST keep their official split: the 60,000 training images are the training data
(the private data of a private model, partitioned among its teachers), the 10,000 test images are the
``test`` split (utility is measured on them; they select nothing). Their classes are public by the
definition of the data sets. The classes of an image CSV, a folder, an ``.npz`` or arrays are public only when
declared (``classes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from datamodules.base import DataError, GenerativeDataModule, read_data_csv

IMAGE_DATASETS = ("digits", "mnist", "fashion_mnist", "celeba", "csv", "folder", "npz", "arrays")
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def uint8_to_model_space(x: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] → float [-1, 1]."""
    return x.float().div_(127.5).sub_(1.0)


def model_space_to_unit(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] → [0, 1]."""
    return ((x.clamp(-1, 1) + 1.0) / 2.0)


class ImageDataModule(GenerativeDataModule):
    """Labelled images for conditional generators.

    Args:
        dataset: ``digits`` (scikit-learn's 8×8 digits, embedded, no download), ``mnist``,
            ``fashion_mnist`` (their four official IDX files, :mod:`datamodules.idx`), ``celeba``
            (label: ``celeba_attribute``, default gender), ``csv`` (``path`` to a CSV of flattened
            square grey images, last column the label, e.g. ``../shared/data/mnist_5k.csv.gz``), ``folder``
            (``root``: a folder of class folders, ``root/<class>/<image>.png``, PNG or JPEG, grey or colour),
            ``npz`` (``path`` to an ``.npz`` with ``images`` and ``labels``) or ``arrays`` (``images`` and
            ``labels`` given in memory: the Python API). See :mod:`datamodules.folder`.
        root: MNIST/Fashion-MNIST: the folder holding the four IDX files (``train-images-idx3-ubyte``
            etc., ``.gz`` or not), or torchvision's root with them under ``MNIST/raw`` /
            ``FashionMNIST/raw``; CelebA: torchvision's root; ``folder``: the folder of class folders.
        download: let torchvision download a missing dataset (into ``root``).
        verify_checksums: check MNIST/Fashion-MNIST files against their published MD5s (a mismatch
            is an error before any run starts; ``False``: only their headers and sizes are checked).
        image_size: resize to this square size, a public transform (``None``: native, and a folder's images
            must all have one square size; CelebA defaults to 64).
        channels: ``folder``: 1 (grey) or 3 (colour), every image converted (``None``: every image must
            have the same).
        path: CSV file for ``dataset="csv"``, ``.npz`` file for ``dataset="npz"``.
        images, labels: ``dataset="arrays"``: the images (``[n, H, W]``, ``[n, H, W, C]`` or ``[n, C, H, W]``,
            uint8 or floats in [0, 1]) and their labels; not hyperparameters (never saved in a checkpoint).
        csv_header: whether the CSV's first line is a header (``None``: detected — a header is a first
            line with a field that is not a number where the second line has one; the decision is
            logged, and no row is ever dropped without it).
        classes: the CSV's (folder's, arrays') classes, declared public (label codes follow this order; a
            label or class folder not among them is an error). ``None``: read from the labels, which is private metadata —
            private models refuse it (a record with a new class would change ``num_classes`` and
            every other record's label code).
        celeba_attribute: CelebA attribute used as the binary label.
        **kwargs: see :class:`GenerativeDataModule`.
    """

    def __init__(
        self,
        dataset: str = "digits",
        *,
        root: str = "data",
        download: bool = False,
        image_size: int | None = None,
        path: str | None = None,
        celeba_attribute: str = "Male",
        csv_header: bool | None = None,
        classes: list[Any] | None = None,
        verify_checksums: bool = True,
        channels: int | None = None,
        images: Any = None,
        labels: Any = None,
        batch_size: int = 64,
        num_teachers: int = 0,
        teacher_batch_size: int = 32,
        partition_seed: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_teachers=num_teachers, teacher_batch_size=teacher_batch_size,
            partition_seed=partition_seed, val_fraction=val_fraction,
            test_fraction=test_fraction, split_seed=split_seed, num_workers=num_workers,
        )
        if dataset not in IMAGE_DATASETS:
            raise DataError(f"unknown image dataset {dataset!r}; choose one of {IMAGE_DATASETS}")
        from datamodules.folder import check_format_options

        check_format_options(image_size, channels)
        if (dataset == "arrays") != (images is not None or labels is not None) or (dataset == "arrays" and (images is None or labels is None)):
            raise DataError("images and labels go together with dataset 'arrays' (the Python API), and only with it")
        self.dataset, self.root, self.download = dataset, root, download
        self.image_size, self.path, self.celeba_attribute = image_size, path, celeba_attribute
        self.csv_header = csv_header
        if classes is not None and len({str(c) for c in classes}) != len(classes):
            raise DataError(f"data.classes must be distinct, got {list(classes)}")
        if classes is not None and len(classes) < 2:
            raise DataError(f"data.classes needs at least 2 classes, got {list(classes)}")
        self.classes = None if classes is None else list(classes)
        self.verify_checksums, self.channels = verify_checksums, channels
        self._arrays = None if images is None else (images, labels)
        self.save_hyperparameters(ignore=["images", "labels"])
        self._transform = uint8_to_model_space

    def _load(self) -> dict[str, Any]:
        loader = {
            "digits": self._load_digits, "mnist": self._load_idx, "fashion_mnist": self._load_idx,
            "celeba": self._load_celeba, "csv": self._load_csv,
            "folder": self._load_folder, "npz": self._load_arrays, "arrays": self._load_arrays,
        }[self.dataset]
        self._layout = None
        splits, class_names, value_max, private = loader()
        size = self.image_size or (64 if self.dataset == "celeba" else None)
        if size is not None:
            from datamodules.folder import resize_uint8

            splits = {k: (resize_uint8(x, size), y) for k, (x, y) in splits.items()}
        x_train = splits["train"][0]
        spec = {
            "kind": "image",
            "dataset": self.dataset,
            "shape": list(x_train.shape[1:]),
            "num_classes": len(class_names),
            "class_names": class_names,
            # Uniform class ratio: a data-independent choice, so sampling labels from it costs nothing.
            "class_ratio": [1.0 / len(class_names)] * len(class_names),
            "class_ratio_source": "uniform",
            # the label's classes when they were read from the data (an undeclared CSV): private models refuse them
            "private_metadata": private,
            "value_max": value_max,
        }
        if self._layout is not None:  # arrays in: the form generated images go back out in (the Python API)
            spec["layout"] = self._layout
        return {"splits": splits, "spec": spec}

    def _load_folder(self):
        from datamodules.folder import read_image_folder

        x, y, names, private = read_image_folder(self.root, classes=self.classes, image_size=self.image_size, channels=self.channels)
        return {"train": (x, y)}, names, 255.0, private

    def _load_arrays(self):
        from datamodules.folder import images_from_arrays, read_npz

        if self.dataset == "npz":
            if self.path is None:
                raise DataError("dataset 'npz' needs data.path (an .npz with arrays 'images' and 'labels')")
            x, y, names, private, layout = read_npz(self.path, classes=self.classes, image_size=self.image_size)
        else:
            x, y, names, private, layout = images_from_arrays(*self._arrays, classes=self.classes, image_size=self.image_size)
        if self.channels is not None and x.shape[1] != self.channels:
            raise DataError(f"the images have {x.shape[1]} channels, data.channels says {self.channels}")
        self._layout = layout
        return {"train": (x, y)}, names, layout["value_max"], private

    def _load_digits(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.from_numpy(np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
        y = torch.from_numpy(digits.target.astype(np.int64))
        return {"train": (x, y)}, [str(i) for i in range(10)], 16.0, []

    def _load_idx(self):
        """The official IDX files, read and checked by :mod:`datamodules.idx` (torchvision only downloads)."""
        from datamodules.idx import find_idx_files, load_idx_splits

        if find_idx_files(self.root, self.dataset) is None:
            if not self.download:
                raise DataError(
                    f"no {self.dataset} IDX files in {Path(self.root).resolve()} (train-images-idx3-ubyte.gz etc., or "
                    f"torchvision's {'MNIST' if self.dataset == 'mnist' else 'FashionMNIST'}/raw/ under it): point "
                    f"data.root at the folder holding them, or set data.download: true on a machine with internet")
            import torchvision

            cls = torchvision.datasets.MNIST if self.dataset == "mnist" else torchvision.datasets.FashionMNIST
            try:
                cls(self.root, train=True, download=True)  # checks the published MD5s as it downloads
            except (RuntimeError, OSError) as err:
                raise DataError(f"{self.dataset} could not be downloaded into {Path(self.root).resolve()} ({err}); "
                                f"point data.root at a copy of the IDX files") from err
        raw = load_idx_splits(self.root, self.dataset, verify_checksums=self.verify_checksums)
        names = [str(i) for i in range(10)] if self.dataset == "mnist" else FASHION_CLASSES
        splits = {split: (torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)))
                  for split, (x, y) in raw.items()}
        return splits, names, 255.0, []

    def _load_celeba(self):
        import torchvision
        from torchvision.transforms import v2
        from lightning_gpate.progress import progress

        size = self.image_size or 64
        transform = v2.Compose([v2.PILToTensor(), v2.CenterCrop(178), v2.Resize(size, antialias=True)])
        splits = {}
        for split, name in (("train", "train"), ("test", "test")):
            try:
                ds = torchvision.datasets.CelebA(self.root, split=name, target_type="attr", download=self.download)
            except (RuntimeError, OSError) as err:
                raise DataError(
                    f"CelebA not found under {Path(self.root).resolve()} ({err}); set data.download: true "
                    f"or place the files (img_align_celeba/, list_attr_celeba.txt, list_eval_partition.txt) there"
                ) from err
            if self.celeba_attribute not in ds.attr_names:
                raise DataError(f"unknown CelebA attribute {self.celeba_attribute!r}; choose one of {ds.attr_names[:40]}")
            col = ds.attr_names.index(self.celeba_attribute)
            images = torch.empty(len(ds), 3, size, size, dtype=torch.uint8)
            for i in progress(range(len(ds)), desc=f"CelebA {name}", unit="image"):
                images[i] = transform(ds[i][0])
            splits[split] = (images, ds.attr[:, col].long())
        return splits, [f"not {self.celeba_attribute}", self.celeba_attribute], 255.0, []

    def _load_csv(self):
        if self.path is None:
            raise DataError("dataset 'csv' needs data.path (a CSV of flattened square images, label last)")
        path = Path(self.path)
        if not path.is_file():
            raise DataError(f"data file not found: {path.resolve()}")
        header = self.csv_header
        if header is None:
            header = csv_has_header(path)
            from pytorch_lightning.utilities import rank_zero_info

            rank_zero_info(f"{path.name}: the first line is {'a header' if header else 'an image (no header)'} "
                           f"(set data.csv_header to override)")
        frame = read_data_csv(path, header=0 if header else None)
        if len(frame) == 0:
            raise DataError(f"{path} has a header and no images")
        pixels = frame.iloc[:, :-1].to_numpy()
        if not np.issubdtype(pixels.dtype, np.number):
            raise DataError(f"{path}: pixel columns must be numbers (a header line after the first, or data.csv_header: false on a file with a header?)")
        side = int(round(np.sqrt(pixels.shape[1])))
        if side * side != pixels.shape[1]:
            raise DataError(f"{path}: {pixels.shape[1]} pixel columns is not a square image")
        if np.isnan(pixels).any() or pixels.min() < 0 or pixels.max() > 255:
            raise DataError(f"{path}: pixel values must be grey levels in 0..255 without missing values")
        labels = frame.iloc[:, -1].to_numpy()
        x = torch.from_numpy(pixels.astype(np.uint8).reshape(-1, 1, side, side))
        if self.classes is None:  # read from the private labels: listed as private metadata
            classes = np.unique(labels)
            y = torch.from_numpy(np.searchsorted(classes, labels).astype(np.int64))
            return {"train": (x, y)}, [str(c) for c in classes], 255.0, ["label"]
        code = {str(c): i for i, c in enumerate(self.classes)}
        if {str(v) for v in labels} - set(code):  # which labels is private (issue 20, finding 9)
            raise DataError(f"{path}: some labels are not among the declared data.classes "
                            f"{[str(c) for c in self.classes][:10]}: declare every class, or drop those rows")
        y = torch.tensor([code[str(v)] for v in labels], dtype=torch.long)
        return {"train": (x, y)}, [str(c) for c in self.classes], 255.0, []


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_has_header(path: str | Path) -> bool:
    """Whether an image CSV (flattened pixels, label last) starts with a header line.

    A header has a field that is not a number where the next line has a number (column names over
    grey levels); a file of one line has a header if one of its pixel fields is not a number. Labels
    that are names (``cat``) in every line do not make a header.
    """
    import pandas as pd

    try:
        lines = pd.read_csv(path, header=None, nrows=2, dtype=str, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        return False  # the full read says what is wrong (read_data_csv)
    if len(lines) == 0:
        return False
    first = [str(v).strip() for v in lines.iloc[0]]
    if len(lines) == 1:
        return not all(_is_number(v) for v in first[:-1])
    second = [str(v).strip() for v in lines.iloc[1]]
    return any(not _is_number(a) and _is_number(b) for a, b in zip(first, second))


def images_to_original_range(x: torch.Tensor, spec: dict[str, Any]) -> np.ndarray:
    """Generated images in [-1, 1] → the dataset's own range [0, value_max], float32."""
    return (model_space_to_unit(x) * float(spec["value_max"])).cpu().numpy().astype(np.float32)
