"""Image data: embedded digits, MNIST, Fashion-MNIST, CelebA (torchvision), or an image CSV.

Images are stored as uint8 and mapped to [-1, 1] per batch (the generators end in tanh); the spec's
``value_max`` maps generated images back to the dataset's own range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from datamodules.base import DataError, GenerativeDataModule

IMAGE_DATASETS = ("digits", "mnist", "fashion_mnist", "celeba", "csv")
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def uint8_to_model_space(x: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] → float [-1, 1]."""
    return x.float().div_(127.5).sub_(1.0)


def model_space_to_unit(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] → [0, 1]."""
    return ((x.clamp(-1, 1) + 1.0) / 2.0)


def _resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """[n, C, H, W] uint8 → [n, C, size, size] uint8 (bilinear)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False)
    return out.round().clamp(0, 255).to(torch.uint8)


class ImageDataModule(GenerativeDataModule):
    """Labelled images for conditional generators.

    Args:
        dataset: ``digits`` (scikit-learn's 8×8 digits, embedded, no download), ``mnist``,
            ``fashion_mnist``, ``celeba`` (label: ``celeba_attribute``, default gender) or ``csv``
            (``path`` to a CSV of flattened square grey images, last column the label, with or without a
            header row, e.g.
            ``../shared/data/mnist_5k.csv.gz``).
        root: folder of the torchvision datasets.
        download: let torchvision download a missing dataset.
        image_size: resize to this square size (``None``: native; CelebA defaults to 64).
        path: CSV file for ``dataset="csv"``.
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
        batch_size: int = 64,
        num_teachers: int = 0,
        teacher_batch_size: int = 32,
        teacher_steps_per_epoch: int = 100,
        partition_seed: int = 0,
        remainder: str = "spread",
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_teachers=num_teachers, teacher_batch_size=teacher_batch_size, teacher_steps_per_epoch=teacher_steps_per_epoch,
            partition_seed=partition_seed, remainder=remainder, val_fraction=val_fraction,
            test_fraction=test_fraction, split_seed=split_seed, num_workers=num_workers,
        )
        if dataset not in IMAGE_DATASETS:
            raise DataError(f"unknown image dataset {dataset!r}; choose one of {IMAGE_DATASETS}")
        if image_size is not None and image_size < 4:
            raise DataError(f"image_size must be >= 4, got {image_size}")
        self.dataset, self.root, self.download = dataset, root, download
        self.image_size, self.path, self.celeba_attribute = image_size, path, celeba_attribute
        self.save_hyperparameters()
        self._transform = uint8_to_model_space

    def _load(self) -> dict[str, Any]:
        loader = {
            "digits": self._load_digits, "mnist": self._load_torchvision, "fashion_mnist": self._load_torchvision,
            "celeba": self._load_celeba, "csv": self._load_csv,
        }[self.dataset]
        splits, class_names, value_max = loader()
        size = self.image_size or (64 if self.dataset == "celeba" else None)
        if size is not None:
            splits = {k: (_resize_uint8(x, size), y) for k, (x, y) in splits.items()}
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
            "private_metadata": [],
            "value_max": value_max,
        }
        return {"splits": splits, "spec": spec}

    def _load_digits(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.from_numpy(np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
        y = torch.from_numpy(digits.target.astype(np.int64))
        return {"train": (x, y)}, [str(i) for i in range(10)], 16.0

    def _load_torchvision(self):
        import torchvision

        cls = torchvision.datasets.MNIST if self.dataset == "mnist" else torchvision.datasets.FashionMNIST
        try:
            train = cls(self.root, train=True, download=self.download)
            test = cls(self.root, train=False, download=self.download)
        except RuntimeError as err:
            raise DataError(
                f"{self.dataset} not found under {Path(self.root).resolve()} ({err}); "
                f"set data.download: true on a machine with internet, or point data.root at a copy"
            ) from err
        names = [str(i) for i in range(10)] if self.dataset == "mnist" else FASHION_CLASSES
        splits = {
            "train": (train.data.unsqueeze(1).clone(), train.targets.clone().long()),
            "test": (test.data.unsqueeze(1).clone(), test.targets.clone().long()),
        }
        return splits, names, 255.0

    def _load_celeba(self):
        import torchvision
        from torchvision.transforms import v2
        from tqdm.auto import tqdm

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
            for i in tqdm(range(len(ds)), desc=f"CelebA {name}", unit="img"):
                images[i] = transform(ds[i][0])
            splits[split] = (images, ds.attr[:, col].long())
        return splits, [f"not {self.celeba_attribute}", self.celeba_attribute], 255.0

    def _load_csv(self):
        import pandas as pd

        if self.path is None:
            raise DataError("dataset 'csv' needs data.path (a CSV of flattened square images, label last)")
        path = Path(self.path)
        if not path.is_file():
            raise DataError(f"data file not found: {path.resolve()}")
        # A header row is optional (mnist_*.csv.gz have none): the first row is data when every field is a number.
        first = pd.read_csv(path, header=None, nrows=1)
        has_header = not pd.to_numeric(first.iloc[0], errors="coerce").notna().all()
        frame = pd.read_csv(path, header=0 if has_header else None)
        pixels = frame.iloc[:, :-1].to_numpy()
        side = int(round(np.sqrt(pixels.shape[1])))
        if side * side != pixels.shape[1]:
            raise DataError(f"{path}: {pixels.shape[1]} pixel columns is not a square image")
        if np.isnan(pixels).any() or pixels.min() < 0 or pixels.max() > 255:
            raise DataError(f"{path}: pixel values must be grey levels in 0..255 without missing values")
        labels = frame.iloc[:, -1].to_numpy()
        classes = np.unique(labels)
        y = torch.from_numpy(np.searchsorted(classes, labels).astype(np.int64))
        x = torch.from_numpy(pixels.astype(np.uint8).reshape(-1, 1, side, side))
        return {"train": (x, y)}, [str(c) for c in classes], 255.0


def images_to_original_range(x: torch.Tensor, spec: dict[str, Any]) -> np.ndarray:
    """Generated images in [-1, 1] → the dataset's own range [0, value_max], float32."""
    return (model_space_to_unit(x) * float(spec["value_max"])).cpu().numpy().astype(np.float32)
