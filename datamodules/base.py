"""What every DataModule of the project shares: splits, the data spec, the teacher partition."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from datamodules.partition import REMAINDER_POLICIES, TeacherBatches, TeacherPartition


class DataError(ValueError):
    """Bad input data or options; the message names the problem and what to do."""


class _TransformedTensors(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Callable | None) -> None:
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


class GenerativeDataModule(pl.LightningDataModule):
    """Base DataModule: loads once, splits with a seed, and serves either plain shuffled batches
    (GAN, DP-GAN) or, when ``num_teachers > 0``, per-teacher batches from a fixed disjoint partition.

    Subclasses implement :meth:`_load` (returning features, labels and the data spec) and may set
    ``self._transform`` to map stored features to the generator's space.

    Args:
        batch_size: rows per batch for non-teacher models.
        num_teachers: teachers to partition the training split among (0: no partition).
        teacher_batch_size: rows per teacher per step.
        partition_seed: seed of the teacher partition (fixed for the whole run).
        remainder: ``"spread"`` or ``"drop"`` the rows left over after equal shares.
        val_fraction: share of the training data held out for validation (model selection).
        test_fraction: share held out as the real test split (ignored where the dataset has one).
        split_seed: seed of the train/val/test split.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        *,
        batch_size: int = 64,
        num_teachers: int = 0,
        teacher_batch_size: int = 32,
        partition_seed: int = 0,
        remainder: str = "spread",
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        if num_teachers < 0:
            raise DataError(f"num_teachers must be >= 0, got {num_teachers}")
        if remainder not in REMAINDER_POLICIES:
            raise DataError(f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}")
        for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= frac < 1.0:
                raise DataError(f"{name} must be in [0, 1), got {frac}")
        self.batch_size = batch_size
        self.num_teachers = num_teachers
        self.teacher_batch_size = teacher_batch_size
        self.partition_seed = partition_seed
        self.remainder = remainder
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.num_workers = num_workers
        self._loaded = False
        self._transform: Callable | None = None
        self.partition: TeacherPartition | None = None

    # ----------------------------------------------------------------- loading
    def _load(self) -> dict[str, Any]:
        """Return ``{"splits": {name: (x, y)}, "spec": dict}``; ``splits`` has ``train`` and may have
        ``test`` (then only ``val`` is cut from train)."""
        raise NotImplementedError

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        loaded = self._load()
        splits = dict(loaded["splits"])
        x, y = splits.pop("train")
        n = len(y)
        perm = torch.from_numpy(np.random.default_rng(self.split_seed).permutation(n))
        n_test = 0 if "test" in splits else int(round(self.test_fraction * n))
        n_val = int(round(self.val_fraction * n))
        if n - n_test - n_val < 1:
            raise DataError(f"no training rows left after the val/test split of {n} rows")
        test_idx, val_idx, train_idx = perm[:n_test], perm[n_test:n_test + n_val], perm[n_test + n_val:]
        self.split_indices = {"train": train_idx, "val": val_idx, "test": test_idx}
        self.splits = {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx])}
        self.splits["test"] = splits["test"] if "test" in splits else (x[test_idx], y[test_idx])
        self._spec = loaded["spec"]
        self._spec["num_train"] = int(len(train_idx))
        self._spec["num_teachers"] = int(self.num_teachers)
        self._loaded = True

    @property
    def spec(self) -> dict[str, Any]:
        """What a model needs to know about its data (JSON-serialisable; stored in hyperparameters)."""
        self._ensure_loaded()
        return self._spec

    def model_space(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole split as (features in the generator's space, labels)."""
        self._ensure_loaded()
        x, y = self.splits[split]
        return (self._transform(x) if self._transform else x.float()), y

    # ----------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        self._ensure_loaded()
        if self.num_teachers > 0 and self.partition is None:
            self.partition = TeacherPartition.create(
                len(self.splits["train"][1]), self.num_teachers,
                seed=self.partition_seed, remainder=self.remainder,
            )

    def owned_teachers(self) -> list[int]:
        """Teachers this process trains: r, r+W, … under DDP, all of them on one process."""
        rank, world = 0, 1
        if self.trainer is not None:
            rank, world = self.trainer.global_rank, self.trainer.world_size
        return list(range(rank, self.num_teachers, world))

    def train_dataloader(self):
        self.setup("fit")
        x, y = self.splits["train"]
        if self.num_teachers > 0:
            batches = TeacherBatches(
                x, y, self.partition, self.owned_teachers(),
                batch_size=self.teacher_batch_size, seed=self.partition_seed, transform=self._transform,
            )
            return DataLoader(batches, batch_size=None, num_workers=0)
        if len(y) < self.batch_size:
            raise DataError(f"batch_size {self.batch_size} exceeds the {len(y)} training rows")
        return DataLoader(
            _TransformedTensors(x, y, self._transform), batch_size=self.batch_size,
            shuffle=True, drop_last=True, num_workers=self.num_workers,
        )

    def _eval_loader(self, split: str):
        self._ensure_loaded()
        x, y = self.splits[split]
        return DataLoader(_TransformedTensors(x, y, self._transform), batch_size=max(self.batch_size, 256))

    def test_dataloader(self):
        return self._eval_loader("test")

    # ----------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"partition": self.partition.state_dict()} if self.partition is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "partition" not in state:
            return
        restored = TeacherPartition.from_state_dict(state["partition"])
        self._ensure_loaded()
        n_train = len(self.splits["train"][1])
        if restored.assignment.size != n_train or restored.num_teachers != self.num_teachers:
            raise DataError(
                f"the checkpoint's teacher partition ({restored.num_teachers} teachers over "
                f"{restored.assignment.size} rows) does not fit this data ({self.num_teachers} teachers, "
                f"{n_train} rows): resume with the same data and num_teachers"
            )
        self.partition = restored
