"""What every DataModule of the project shares: splits, the data spec, the teacher partition."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Iterator

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from datamodules.partition import TeacherBatches, TeacherPartition, keyed_uniform, record_keys
from lightning_gpate.errors import UserError
from lightning_gpate.privacy.randomness import mechanism_generator

#: How a LightningModule may ask for its training batches (its ``train_sampling`` attribute, a dict
#: with ``"kind"``): the privacy analysis of DP-GAN needs Poisson sampling, GS-WGAN one teacher per step.
#: A mechanism that reads every record once (noisy marginals) asks for ``"full"``: the whole split as one batch.
TRAIN_SAMPLINGS = ("default", "poisson", "one_teacher", "full")
#: DataModule arguments a private model's accounting depends on (the teacher count; the budgets of DP
#: metadata): a training checkpoint pins them, and a resumed fit that asks for other values is refused.
#: The arguments by which a DataModule estimates metadata with DP (each estimate a release, paid for once).
DP_METADATA_PARAMETERS = ("metadata_epsilon", "label_ratio_epsilon", "quantile_epsilon")
PRIVACY_PARAMETERS = ("num_teachers", *DP_METADATA_PARAMETERS)
#: The environment variable that names the file of the data spec a fit's processes share (:func:`shared_released_spec`).
RELEASED_SPEC_ENV = "LIGHTNING_GPATE_RELEASED_DATA_SPEC"


class DataError(UserError, ValueError):
    """Bad input data or options; the message names the problem and what to do."""


def read_data_csv(path: Path, **options):
    """``pandas.read_csv(path, **options)`` of a data file. A failure is a :class:`DataError` that says
    what to check without pandas' own text, which names the line of a malformed row and quotes it: a
    position in, or a piece of, the private data. The parser's error is not chained either."""
    import pandas as pd

    try:
        return pd.read_csv(path, **options)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path} is empty: no header and no rows") from None
    except pd.errors.ParserError:
        raise DataError(
            f"could not read {path} as CSV (sep={options.get('sep', ',')!r}): a line has another number of fields "
            f"than the header, or a quote is not closed (which line is not shown: it is part of the data); "
            f"check the separator and the quoting"
        ) from None
    except UnicodeDecodeError:
        raise DataError(f"could not read {path} as CSV: it is not UTF-8 text (save it as UTF-8)") from None


@contextlib.contextmanager
def shared_released_spec(released: dict[str, Any], datamodule: "GenerativeDataModule | None" = None) -> Iterator[None]:
    """Within the block, ``datamodule`` and every DataModule built in this process or in a process started from it (the
    other ranks that Lightning's DDP launches as subprocesses of this command or script) take the DP metadata of
    ``released`` instead of drawing their own (:meth:`GenerativeDataModule.adopt_released_spec`, at construction).
    A script under DDP: ``with shared_released_spec(model.data_spec, dm): trainer.fit(model, dm)``.

    DP metadata (bounds, quantile bins, a class ratio) is drawn with secret noise: each process drawing its own
    would train its share on other bins, and release several draws while the accountant pays for one. So it is drawn
    once and handed on: through a file readable by this user only (removed at the end of the block), named in the
    environment that the child processes inherit. It holds the released spec only (``released``: a model's
    ``data_spec``, or a checkpoint's: what the release artifact holds too), never the row count.

    Nothing happens when ``released`` holds no DP metadata, or inside another such block (a child process, whose
    DataModule has already taken the spec of its parent).
    """
    if os.environ.get(RELEASED_SPEC_ENV) or not released.get("metadata_cost"):
        yield
        return
    if released.get("class_ratio_source") == "data":
        raise ValueError("a released data spec holds no class ratio read from the data: pass the model's data_spec")
    text = json.dumps({k: v for k, v in released.items() if k != "num_train"})  # the exact row count is private
    fd, path = tempfile.mkstemp(prefix="lightning-gpate-data-spec-", suffix=".json")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.environ[RELEASED_SPEC_ENV] = path
        if datamodule is not None:  # the very spec the other processes read
            datamodule.adopt_released_spec(json.loads(text))
        yield
    finally:
        os.environ.pop(RELEASED_SPEC_ENV, None)
        os.unlink(path)


def _shared_spec_from_environment() -> dict[str, Any] | None:
    """The spec of an enclosing :func:`shared_released_spec` block (of this process or of its parent), if any."""
    path = os.environ.get(RELEASED_SPEC_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read the data spec that the launching process shared ({RELEASED_SPEC_ENV}={path}): "
                        f"{err}; start every process of a fit from one lightning-gpate fit") from None


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
    The draws come from a mechanism generator (:mod:`lightning_gpate.privacy.randomness`: seeded
    from the OS, never from ``seed_everything``): the subsampled Gaussian's amplification assumes
    nobody knows which rows were drawn.

    Args:
        features: all training rows.
        labels: ``[num_rows]`` class labels.
        sample_rate: q, the inclusion probability of a row in a batch.
        batches: batches per item.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
        generator: the CPU ``torch.Generator`` of the draws (default: a fresh OS-seeded one).
        shard: ``(rank, world)``: this process keeps the drawn rows ``r`` with ``r % world == rank``
            (DDP). Every row's inclusion is still one Bernoulli(q) draw, made by the one process that
            owns the row, so the union of the shards is a Poisson batch of the whole data, whether the
            processes' generators are independent (OS-seeded) or equal (a fixed test seed: then the
            union is the one-process batch).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, *, sample_rate: float, batches: int = 1,
                 transform: Callable | None = None, generator: torch.Generator | None = None,
                 shard: tuple[int, int] = (0, 1)) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        self.features, self.labels, self.transform = features, labels, transform
        self.sample_rate, self.batches = float(sample_rate), int(batches)
        self.generator = generator if generator is not None else mechanism_generator("cpu")
        self.rank, self.world = int(shard[0]), int(shard[1])
        if not 0 <= self.rank < self.world:
            raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard}")

    def __len__(self) -> int:
        return max(1, int(round(1.0 / (self.sample_rate * self.batches))))

    def __iter__(self):
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        for _ in range(len(self)):
            sampler = UniformWithReplacementSampler(num_samples=len(self.labels), sample_rate=self.sample_rate,
                                                    steps=self.batches, generator=self.generator)
            items = []
            for rows in sampler:
                rows = torch.as_tensor(rows, dtype=torch.long)
                if self.world > 1:
                    rows = rows[rows % self.world == self.rank]
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
    The draws come from a mechanism generator (OS-seeded, never ``seed_everything``): GS-WGAN's
    amplification by subsampling assumes nobody knows which discriminator was drawn.

    Args:
        features: all training rows.
        labels: ``[num_rows]`` class labels.
        partition: the fixed teacher partition.
        batches: real batches per step (GS-WGAN: its critic steps per generator step).
        batch_size: rows per batch.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
        generator: the CPU ``torch.Generator`` of the draws (default: a fresh OS-seeded one).
    """

    def __init__(
        self, features: torch.Tensor, labels: torch.Tensor, partition: TeacherPartition, *,
        batches: int, batch_size: int, transform: Callable | None = None, generator: torch.Generator | None = None,
    ) -> None:
        if batches < 1 or batch_size < 1:
            raise ValueError(f"batches and batch_size must be >= 1, got {batches} and {batch_size}")
        self.features, self.labels, self.transform = features, labels, transform
        self.rows, self.sizes = partition.padded(range(partition.num_teachers))
        self.batches, self.batch_size = int(batches), int(batch_size)
        self.generator = generator if generator is not None else mechanism_generator("cpu")

    def __len__(self) -> int:
        return len(self.sizes)  # one "epoch": as many steps as teachers

    def __iter__(self):
        need = self.batches * self.batch_size
        for _ in range(len(self)):
            teacher = int(torch.randint(len(self.sizes), (1,), generator=self.generator))
            own = self.rows[teacher, : int(self.sizes[teacher])]
            if len(own) == 0:  # a teacher without records: a constant, data-independent batch
                picks = torch.zeros(need, dtype=torch.long)
                x, y = torch.zeros_like(self.features[picks]), torch.zeros_like(self.labels[picks])
            else:
                picks = torch.cat([own[torch.randperm(len(own), generator=self.generator)] for _ in range(-(-need // len(own)))])[:need]
                x, y = self.features[picks], self.labels[picks]
            if self.transform is not None:
                x = self.transform(x)
            yield (torch.tensor(teacher), x.reshape(self.batches, self.batch_size, *x.shape[1:]),
                   y.reshape(self.batches, self.batch_size))


class GenerativeDataModule(pl.LightningDataModule):
    """Base DataModule: loads once, splits with a seed, and serves either plain shuffled batches
    (GAN) or, when ``num_teachers > 0``, per-teacher batches from a fixed disjoint partition.
    A model whose privacy analysis needs another sampling says so with a ``train_sampling``
    attribute: ``{"kind": "poisson", "batches": k, "sample_rate": q}`` (DP-SGD: :meth:`poisson_dataloader`, q declared
    public by the model) or ``{"kind": "one_teacher", "batches": k}`` (GS-WGAN: :meth:`one_teacher_dataloader`),
    optionally with ``"mechanism_seed"`` (a fixed seed of the sampling, for tests only; default: OS-seeded).

    Subclasses implement :meth:`_load` (returning features, labels and the data spec) and may set
    ``self._transform`` to map stored features to the generator's space.

    Args:
        batch_size: rows per batch for non-teacher models (under Poisson sampling: the expected batch
            size, a declared constant that DP-SGD divides the noisy gradient sum by).
        num_teachers: teachers to partition the training split among (0: no partition).
        teacher_batch_size: rows per teacher per step.
        partition_seed: seed of the teacher partition (fixed for the whole run).
        val_fraction: share of the training data held out for validation (model selection).
        test_fraction: share held out as the real test split (ignored where the dataset has one).
        split_seed: seed of the train/val/test split.

    The split and the teacher partition are decided per record by a keyed hash of its content
    (:mod:`datamodules.partition`): adding or removing a record changes neither any other record's
    split nor its teacher, which is what the add/remove-one guarantees of the private models need.
    Split sizes are therefore binomial around the fractions, and teachers' shares unequal.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        *,
        batch_size: int = 64,
        num_teachers: int = 0,
        teacher_batch_size: int = 32,
        partition_seed: int = 0,
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
        for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= frac < 1.0:
                raise DataError(f"{name} must be in [0, 1), got {frac}")
        self.batch_size = batch_size
        self.num_teachers = num_teachers
        self.teacher_batch_size = teacher_batch_size
        self.partition_seed = partition_seed
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.num_workers = num_workers
        self._loaded = False
        self._transform: Callable | None = None
        self.partition: TeacherPartition | None = None
        #: The data spec whose DP metadata replaces a new estimate (:meth:`adopt_released_spec`): a resumed run's,
        #: or the one the processes of a fit share (:func:`shared_released_spec`).
        self._released_spec: dict[str, Any] | None = _shared_spec_from_environment()
        self._processes_checked = False

    # ----------------------------------------------------------------- released metadata
    def adopt_released_spec(self, released: dict[str, Any]) -> bool:
        """Use the metadata a run already released (``released``: the data spec in its checkpoint)
        instead of this DataModule's own DP estimate of it, and reload the data with it.

        A resumed run must not estimate DP metadata (bounds, class ratio) again: it was paid for once,
        and a second estimate would be released (in the release artifact, through the transform)
        without being charged. Returns whether anything changed (nothing does when no metadata was
        estimated with DP: declared metadata gives the same spec again). Subclasses that estimate
        metadata with DP implement :meth:`_released_metadata_differs` and use ``self._released_spec``
        in :meth:`_load`. Before its first load the DataModule draws nothing: it loads with ``released`` when used.
        """
        if not self._loaded and released.get("metadata_cost"):
            self._released_spec = dict(released)
            return True
        if not self.spec.get("metadata_cost") and not released.get("metadata_cost"):
            return False
        if not self._released_metadata_differs(released):
            return False
        self._released_spec = dict(released)
        self._loaded = False
        self.partition = None
        self._ensure_loaded()
        if self.trainer is not None or self.num_teachers > 0:
            self.setup("fit")
        return True

    def _released_metadata_differs(self, released: dict[str, Any]) -> bool:
        raise DataError(f"{type(self).__name__} cannot resume with released DP metadata")

    # ----------------------------------------------------------------- loading
    def _load(self) -> dict[str, Any]:
        """Return ``{"splits": {name: (x, y)}, "spec": dict}``, and optionally ``"keys"`` (the rows' split keys, see
        :meth:`split_rows`; default: :func:`~datamodules.partition.record_keys` of ``train``); ``splits`` has ``train``
        and may have ``test`` (then only ``val`` is cut from train)."""
        raise NotImplementedError

    def split_rows(self, keys: np.ndarray, *, has_test: bool = False) -> dict[str, torch.Tensor]:
        """The row indices of the ``train``, ``val`` and ``test`` splits: each record's by its key alone, the public
        ``split_seed`` and the fractions, so a DataModule can decide the split before it reads anything else of the
        rows (and draw its DP metadata on the training rows only). ``has_test``: the dataset brings its own test split
        (then only ``val`` is cut)."""
        u = torch.from_numpy(keyed_uniform(keys, self.split_seed, "split"))
        test_fraction = 0.0 if has_test else self.test_fraction
        is_test = u < test_fraction
        is_val = ~is_test & (u < test_fraction + self.val_fraction)
        is_train = ~(is_test | is_val)
        if not is_train.any():
            raise DataError("no training rows left after the val/test split: lower data.val_fraction and "
                            "data.test_fraction, or give more data")
        return {name: mask.nonzero().flatten() for name, mask in (("train", is_train), ("val", is_val), ("test", is_test))}

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        loaded = self._load()
        splits = dict(loaded["splits"])
        x, y = splits.pop("train")
        # Per record, from its content: one record more or less moves no other record between splits.
        keys = loaded.get("keys")
        if keys is None:
            keys = record_keys(x, y)
        rows = self.split_rows(keys, has_test="test" in splits)
        train_idx, val_idx, test_idx = rows["train"], rows["val"], rows["test"]
        n_train = int(len(train_idx))
        if n_train < self.num_teachers:  # refused here, when the data is loaded: before any run starts
            raise DataError(  # no row counts in messages: they are private (issue 20, finding 9)
                f"too few rows per teacher: the training rows (after the val/test split) cannot be split among "
                f"{self.num_teachers} teachers, each needs at least one: set fewer data.num_teachers or give more data"
            )
        self.split_indices = {"train": train_idx, "val": val_idx, "test": test_idx}
        self.train_keys = keys[train_idx.numpy()]
        self.splits = {"train": (x[train_idx], y[train_idx]), "val": (x[val_idx], y[val_idx])}
        self.splits["test"] = splits["test"] if "test" in splits else (x[test_idx], y[test_idx])
        self._spec = loaded["spec"]
        self._spec["num_train"] = int(len(train_idx))
        self._spec["num_teachers"] = int(self.num_teachers)
        self._loaded = True
        self._processes_checked = False

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
            self.partition = TeacherPartition.create(self.train_keys, self.num_teachers, seed=self.partition_seed)
        from lightning_gpate.privacy.distributed import is_distributed  # (imports opacus: not at import time)

        if not self._processes_checked and is_distributed():  # once per load, after the process group started
            self._check_every_process_holds_this_data()
            self._processes_checked = True

    def _check_every_process_holds_this_data(self) -> None:
        """Under DDP (a collective: every process calls it), refuse in one line when the processes hold other data
        specs or other training rows: a process that drew its own DP metadata (bins, bounds, a class ratio) would
        train on other bins, and the run would release more draws than its accountant pays for; one that read another
        file (another node) would train on other data. Only a digest leaves each process."""
        import torch.distributed as dist

        digest = hashlib.sha256(json.dumps(self._spec, sort_keys=True, default=str).encode())
        digest.update(np.ascontiguousarray(self.train_keys).tobytes())
        digests: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(digests, digest.hexdigest())
        other = [rank for rank, d in enumerate(digests) if d != digests[0]]
        if other:
            raise DataError(
                f"the processes of this fit hold different data: process {', '.join(map(str, other))} has another data "
                f"spec or other training rows than process 0 (its own draw of the DP metadata, or another data file). "
                f"Start every process from one lightning-gpate fit, or from a script that calls trainer.fit inside "
                f"datamodules.shared_released_spec(model.data_spec, datamodule) (the processes then share the metadata drawn once), "
                f"or declare the metadata public in data.schema; and give every node the same data file"
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

    def poisson_dataloader(self, batches: int = 1, *, sample_rate: float, mechanism_seed: int | None = None):
        """Poisson-sampled batches for DP-SGD (see :class:`PoissonBatches`): every training row enters
        each batch independently with probability ``sample_rate``, the rate the model declared public
        (never derived here from the private row count); each step gets ``batches`` such batches
        (DP-GAN: one per critic step). The sampling is drawn from an OS-seeded generator
        (``mechanism_seed``: a fixed seed, for tests only); under DDP each process keeps its shard of
        the rows (see :class:`PoissonBatches`)."""
        self.setup("fit")
        if self.num_teachers > 0:
            raise DataError("Poisson sampling draws from the whole training split: set num_teachers: 0")
        x, y = self.splits["train"]
        shard = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        dataset = PoissonBatches(x, y, sample_rate=sample_rate, batches=batches, transform=self._transform,
                                 generator=mechanism_generator("cpu", mechanism_seed), shard=shard)
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def one_teacher_dataloader(self, batches: int = 1, *, mechanism_seed: int | None = None):
        """One uniformly drawn teacher per step with ``batches`` batches of ``teacher_batch_size`` rows
        from its own partition (see :class:`OneTeacherBatches`), drawn from an OS-seeded generator
        (``mechanism_seed``: a fixed seed, for tests only; under DDP, the model's secret seed that rank 0
        drew and broadcast, so that every process draws the same teacher)."""
        self.setup("fit")
        if self.num_teachers < 1:
            raise DataError("one-teacher sampling needs a teacher partition: set num_teachers > 0")
        if self._world_size() > 1 and mechanism_seed is None:  # each process would draw its own teacher
            raise DataError("one-teacher sampling on several processes needs one mechanism seed shared by every process")
        x, y = self.splits["train"]
        dataset = OneTeacherBatches(x, y, self.partition, batches=batches, batch_size=self.teacher_batch_size,
                                    transform=self._transform, generator=mechanism_generator("cpu", mechanism_seed))
        return DataLoader(dataset, batch_size=None, num_workers=0)

    def full_dataloader(self):
        """The whole training split as one batch ``(x, y)`` per epoch, for a mechanism that reads every
        record once (e.g. :class:`~lightning_gpate.models.MarginalTree`'s noisy marginals)."""
        self.setup("fit")
        if self.num_teachers > 0:
            raise DataError("full-split sampling reads the whole training split: set num_teachers: 0")
        x, y = self.splits["train"]
        return DataLoader([(self._transform(x) if self._transform else x.float(), y)], batch_size=None, num_workers=0)

    def train_dataloader(self):
        self.setup("fit")
        sampling = self.requested_sampling()
        if sampling["kind"] == "full":
            return self.full_dataloader()
        if sampling["kind"] == "poisson":
            if sampling.get("sample_rate") is None:
                raise DataError("Poisson sampling needs the model's declared public rate: train_sampling['sample_rate']")
            return self.poisson_dataloader(int(sampling.get("batches", 1)), sample_rate=float(sampling["sample_rate"]),
                                           mechanism_seed=sampling.get("mechanism_seed"))
        if sampling["kind"] == "one_teacher":
            return self.one_teacher_dataloader(int(sampling.get("batches", 1)), mechanism_seed=sampling.get("mechanism_seed"))
        x, y = self.splits["train"]
        if self.num_teachers > 0:
            batches = TeacherBatches(
                x, y, self.partition, self.owned_teachers(),
                batch_size=self.teacher_batch_size, seed=self.partition_seed, transform=self._transform,
                start_step=self.trainer.global_step if self.trainer is not None else 0,  # resume: continue the streams
                device=self.trainer.strategy.root_device if self.trainer is not None else None,  # batches built there
            )
            return DataLoader(batches, batch_size=None, num_workers=0)
        if len(y) < self.batch_size:
            raise DataError(f"batch_size {self.batch_size} exceeds the number of training rows: lower data.batch_size")
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
        """Check on resume that this data gives the checkpoint's partition (it is recomputed from the
        data and ``partition_seed``, never read from the checkpoint)."""
        if "partition" not in state:
            return
        saved = state["partition"]
        self.setup("fit")
        if self.partition is None or saved.get("num_teachers") != self.num_teachers or \
                saved.get("fingerprint") != self.partition.fingerprint():
            raise DataError(
                f"the checkpoint's teacher partition ({saved.get('num_teachers')} teachers, "
                f"{saved.get('scheme', 'row-permutation')}) does not fit this data ({self.num_teachers} teachers): "
                f"resume with the same data, num_teachers and partition_seed"
            )
