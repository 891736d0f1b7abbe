"""What every DataModule of the project shares: splits, the data spec, the teacher partition."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from datamodules.partition import REMAINDER_POLICIES, TeacherBatches, TeacherPartition

#: How a LightningModule may ask for its training batches (its ``train_sampling`` attribute, a dict
#: with ``"kind"``): the privacy analysis of DP-GAN needs Poisson sampling, GS-WGAN one teacher per step.
TRAIN_SAMPLINGS = ("default", "poisson", "one_teacher")


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


class PoissonBatches(torch.utils.data.IterableDataset):
    """Poisson-sampled batches (the sampling DP-SGD's subsampled Gaussian analysis assumes): each
    batch holds every row independently with probability ``sample_rate`` (opacus'
    ``UniformWithReplacementSampler``), so sizes vary and may be 0. Every item is a list of
    ``batches`` such ``(x, y)`` batches; one pass yields about one expected epoch of rows.
    The draws use torch's global random generator (``seed_everything``); the guarantee assumes that
    randomness is not known to an adversary.

    Args:
        features: all training rows.
        labels: ``[num_rows]`` class labels.
        sample_rate: q, the inclusion probability of a row in a batch.
        batches: batches per item.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, *, sample_rate: float, batches: int = 1,
                 transform: Callable | None = None) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        self.features, self.labels, self.transform = features, labels, transform
        self.sample_rate, self.batches = float(sample_rate), int(batches)

    def __len__(self) -> int:
        return max(1, int(round(1.0 / (self.sample_rate * self.batches))))

    def __iter__(self):
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        for _ in range(len(self)):
            sampler = UniformWithReplacementSampler(num_samples=len(self.labels), sample_rate=self.sample_rate, steps=self.batches)
            items = []
            for rows in sampler:
                rows = torch.as_tensor(rows, dtype=torch.long)
                x = self.features[rows]
                items.append((self.transform(x) if self.transform is not None else x, self.labels[rows]))
            yield items


class OneTeacherBatches(torch.utils.data.IterableDataset):
    """Per step, one teacher drawn uniformly at random and real batches from its own rows only.

    GS-WGAN's generator step uses one of its N_D discriminators, chosen uniformly (the subsampling
    its privacy analysis amplifies), and trains it on its own disjoint subset. Every item is
    ``(teacher, x, y)`` with ``teacher`` a 0-d long tensor, ``x`` ``[batches, batch_size, ...]`` and
    ``y`` ``[batches, batch_size]``: ``batches·batch_size`` rows of that teacher's partition drawn
    without replacement (a partition smaller than that is cycled through in fresh permutations).
    The draws use torch's global random generator (``seed_everything``): like any DP sampling, the
    guarantee assumes that randomness is not known to an adversary.

    Args:
        features: all training rows.
        labels: ``[num_rows]`` class labels.
        partition: the fixed teacher partition.
        batches: real batches per step (GS-WGAN: its critic steps per generator step).
        batch_size: rows per batch.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
    """

    def __init__(
        self, features: torch.Tensor, labels: torch.Tensor, partition: TeacherPartition, *,
        batches: int, batch_size: int, transform: Callable | None = None,
    ) -> None:
        if batches < 1 or batch_size < 1:
            raise ValueError(f"batches and batch_size must be >= 1, got {batches} and {batch_size}")
        self.features, self.labels, self.transform = features, labels, transform
        self.rows, self.sizes = partition.padded(range(partition.num_teachers))
        self.batches, self.batch_size = int(batches), int(batch_size)

    def __len__(self) -> int:
        return len(self.sizes)  # one "epoch": as many steps as teachers

    def __iter__(self):
        need = self.batches * self.batch_size
        for _ in range(len(self)):
            teacher = int(torch.randint(len(self.sizes), (1,)))
            own = self.rows[teacher, : int(self.sizes[teacher])]
            picks = torch.cat([own[torch.randperm(len(own))] for _ in range(-(-need // len(own)))])[:need]
            x = self.features[picks]
            if self.transform is not None:
                x = self.transform(x)
            yield (torch.tensor(teacher), x.reshape(self.batches, self.batch_size, *x.shape[1:]),
                   self.labels[picks].reshape(self.batches, self.batch_size))


class GenerativeDataModule(pl.LightningDataModule):
    """Base DataModule: loads once, splits with a seed, and serves either plain shuffled batches
    (GAN) or, when ``num_teachers > 0``, per-teacher batches from a fixed disjoint partition.
    A model whose privacy analysis needs another sampling says so with a ``train_sampling``
    attribute: ``{"kind": "poisson", "batches": k}`` (DP-SGD: :meth:`poisson_dataloader`) or
    ``{"kind": "one_teacher", "batches": k}`` (GS-WGAN: :meth:`one_teacher_dataloader`).

    Subclasses implement :meth:`_load` (returning features, labels and the data spec) and may set
    ``self._transform`` to map stored features to the generator's space.

    Args:
        batch_size: rows per batch for non-teacher models.
        num_teachers: teachers to partition the training split among (0: no partition).
        teacher_batch_size: rows per teacher per step.
        teacher_steps_per_epoch: at least this many teacher batches per training epoch (whole passes
            over the partitions; the batches are the same for any value, 1 = one pass per epoch).
            Every epoch costs the trainer a start and an end, and with few rows per teacher a pass
            is a single step.
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
        teacher_steps_per_epoch: int = 100,
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
        if teacher_steps_per_epoch < 1:
            raise DataError(f"teacher_steps_per_epoch must be >= 1, got {teacher_steps_per_epoch}")
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
        self.teacher_steps_per_epoch = teacher_steps_per_epoch
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

    def requested_sampling(self) -> dict[str, Any]:
        """The attached model's ``train_sampling`` (``{"kind": "default"}`` when it asks for none)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        sampling = dict(getattr(module, "train_sampling", None) or {"kind": "default"})
        if sampling.get("kind") not in TRAIN_SAMPLINGS:
            raise DataError(f"train_sampling kind must be one of {TRAIN_SAMPLINGS}, got {sampling.get('kind')!r}")
        return sampling

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    @property
    def sampling_rate(self) -> float:
        """Poisson sampling rate q = batch_size / training rows (the expected batch is ``batch_size``)."""
        self._ensure_loaded()
        return min(1.0, self.batch_size / len(self.splits["train"][1]))

    def poisson_dataloader(self, batches: int = 1):
        """Poisson-sampled batches for DP-SGD (see :class:`PoissonBatches`): every training row enters
        each batch independently with probability :attr:`sampling_rate`; each step gets ``batches``
        such batches (DP-GAN: one per critic step)."""
        self.setup("fit")
        if self.num_teachers > 0:
            raise DataError("Poisson sampling draws from the whole training split: set num_teachers: 0")
        if self._world_size() > 1:
            raise DataError("Poisson sampling for DP-SGD is implemented for a single process only")
        x, y = self.splits["train"]
        dataset = PoissonBatches(x, y, sample_rate=self.sampling_rate, batches=batches, transform=self._transform)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def one_teacher_dataloader(self, batches: int = 1):
        """One uniformly drawn teacher per step with ``batches`` batches of ``teacher_batch_size`` rows
        from its own partition (see :class:`OneTeacherBatches`)."""
        self.setup("fit")
        if self.num_teachers < 1:
            raise DataError("one-teacher sampling needs a teacher partition: set num_teachers > 0")
        if self._world_size() > 1:
            raise DataError("one-teacher sampling is implemented for a single process only")
        x, y = self.splits["train"]
        dataset = OneTeacherBatches(x, y, self.partition, batches=batches, batch_size=self.teacher_batch_size, transform=self._transform)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def train_dataloader(self):
        self.setup("fit")
        sampling = self.requested_sampling()
        if sampling["kind"] == "poisson":
            return self.poisson_dataloader(int(sampling.get("batches", 1)))
        if sampling["kind"] == "one_teacher":
            return self.one_teacher_dataloader(int(sampling.get("batches", 1)))
        x, y = self.splits["train"]
        if self.num_teachers > 0:
            batches = TeacherBatches(
                x, y, self.partition, self.owned_teachers(),
                batch_size=self.teacher_batch_size, seed=self.partition_seed, transform=self._transform,
                min_steps_per_epoch=self.teacher_steps_per_epoch,
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
