"""Fixed, disjoint teacher partitions and the per-teacher batches drawn from them.

PATE-style models are private only if every record reaches at most one teacher, and only if that
assignment never changes during a run (a record that moves between teachers is seen by two). The
partition is therefore made once from a seed, checked for disjointness, stored in the DataModule's
state (and so in every checkpoint), and compared on resume.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset

REMAINDER_POLICIES = ("spread", "drop")


def hashed_uniform(seed: int, epoch: int, teacher_ids: np.ndarray, num_positions: int) -> np.ndarray:
    """``[len(teacher_ids), num_positions]`` uniforms in [0, 1) that depend only on
    ``(seed, epoch, global teacher id, position)`` (SplitMix64 finaliser): a teacher's shuffle is
    the same whichever other teachers a process owns, so 1 and N DDP processes draw the same batches.
    """
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(epoch) * np.uint64(0xBF58476D1CE4E5B9))
        x = x ^ (np.asarray(teacher_ids, dtype=np.uint64)[:, None] * np.uint64(0x94D049BB133111EB))
        x = x + np.arange(num_positions, dtype=np.uint64)[None, :] * np.uint64(0xD6E8FEB86659FD93)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class TeacherPartition:
    """An assignment of training rows to ``num_teachers`` disjoint teachers.

    Args:
        assignment: ``[num_rows]`` teacher id of every row, ``-1`` for a row no teacher sees.
        num_teachers: number of teachers.

    Use :meth:`create` to make one.
    """

    def __init__(self, assignment: np.ndarray, num_teachers: int) -> None:
        assignment = np.asarray(assignment, dtype=np.int64)
        if assignment.ndim != 1:
            raise ValueError("assignment must be a 1-D array of teacher ids")
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
        if assignment.size and (assignment.max() >= num_teachers or assignment.min() < -1):
            raise ValueError("assignment holds a teacher id outside [-1, num_teachers)")
        self.assignment = assignment
        self.num_teachers = int(num_teachers)
        order = np.argsort(assignment, kind="stable")
        counts = np.bincount(assignment[assignment >= 0], minlength=num_teachers)
        start = int((assignment < 0).sum())
        self._rows = order[start:]
        self._offsets = np.concatenate([[0], np.cumsum(counts)])
        if (counts == 0).any():
            raise ValueError(f"{int((counts == 0).sum())} teachers have no rows")

    @classmethod
    def create(
        cls, num_rows: int, num_teachers: int, *, seed: int, remainder: str = "spread"
    ) -> "TeacherPartition":
        """Shuffle rows with ``seed`` and deal them to teachers in equal shares.

        Args:
            num_rows: rows of the training split.
            num_teachers: teachers to deal them to.
            seed: seed of the shuffle (the partition is a pure function of the three numbers).
            remainder: what happens to the ``num_rows mod num_teachers`` rows left over:
                ``"spread"`` gives the first ones one extra row each, ``"drop"`` leaves them unused.
        """
        if remainder not in REMAINDER_POLICIES:
            raise ValueError(f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}")
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
        if num_rows < num_teachers:
            raise ValueError(
                f"too few rows per teacher: {num_rows} training rows cannot be split among "
                f"{num_teachers} teachers (each needs at least one); use fewer teachers"
            )
        perm = np.random.default_rng(seed).permutation(num_rows)
        share = num_rows // num_teachers
        assignment = np.full(num_rows, -1, dtype=np.int64)
        used = share * num_teachers if remainder == "drop" else num_rows
        # Row perm[i] goes to teacher i mod n: equal shares, extra rows to the first teachers.
        assignment[perm[:used]] = np.arange(used) % num_teachers
        return cls(assignment, num_teachers)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self._offsets)

    def rows_of(self, teacher: int) -> np.ndarray:
        """Row indices of one teacher (sorted)."""
        return np.sort(self._rows[self._offsets[teacher]:self._offsets[teacher + 1]])

    def padded(self, teacher_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the given teachers as a ``[T, max_rows]`` matrix (padded with -1) and their sizes."""
        teacher_ids = np.asarray(teacher_ids, dtype=np.int64)
        sizes = self.sizes[teacher_ids]
        out = np.full((len(teacher_ids), int(sizes.max())), -1, dtype=np.int64)
        for i, t in enumerate(teacher_ids):  # setup-time only, not per step
            out[i, : sizes[i]] = self.rows_of(int(t))
        return torch.from_numpy(out), torch.from_numpy(sizes)

    def fingerprint(self) -> str:
        """SHA-256 of the assignment: equal fingerprints mean the same partition."""
        return hashlib.sha256(self.assignment.tobytes() + str(self.num_teachers).encode()).hexdigest()

    def state_dict(self) -> dict:
        return {
            "assignment": torch.from_numpy(self.assignment.copy()),
            "num_teachers": self.num_teachers,
            "fingerprint": self.fingerprint(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> "TeacherPartition":
        assignment = state["assignment"]
        if isinstance(assignment, torch.Tensor):
            assignment = assignment.numpy()
        part = cls(np.asarray(assignment), int(state["num_teachers"]))
        if "fingerprint" in state and part.fingerprint() != state["fingerprint"]:
            raise ValueError("teacher partition in the checkpoint is corrupt (fingerprint mismatch)")
        return part


class TeacherBatches(IterableDataset):
    """Per-step real batches for a set of teachers, each drawn only from that teacher's rows.

    Every item is ``(x, y)`` with ``x`` of shape ``[T, batch_size, *feature_shape]``: teacher ``i``
    of ``teacher_ids`` gets ``batch_size`` rows of its own partition, shuffled once per pass
    (a teacher with fewer rows than ``batch_size`` cycles through its rows). No Python loop over
    teachers: rows are gathered with one index tensor. A teacher's batches depend only on the seed,
    the pass and its global id, not on which other teachers this process owns.

    One iteration over the dataset (a training epoch) runs as many whole passes as make at least
    ``min_steps_per_epoch`` steps. A pass is short when teachers hold few rows (one step for 2 rows
    per teacher) and every epoch costs the trainer an epoch's start and end; passes are numbered
    across epochs, so the sequence of batches is the same for any ``min_steps_per_epoch``.

    Args:
        features: all training rows (any storage; ``transform`` maps a gathered batch to model space).
        labels: ``[num_rows]`` class labels.
        partition: the fixed teacher partition.
        teacher_ids: the teachers this process owns (all of them on one device; r, r+W, … under DDP).
        batch_size: rows per teacher per step.
        seed: seed of the per-pass shuffles.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
        min_steps_per_epoch: at least this many steps per iteration over the dataset (see above).
    """

    def __init__(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        partition: TeacherPartition,
        teacher_ids: Sequence[int],
        *,
        batch_size: int,
        seed: int,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        min_steps_per_epoch: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"teacher batch size must be >= 1, got {batch_size}")
        if min_steps_per_epoch < 1:
            raise ValueError(f"min_steps_per_epoch must be >= 1, got {min_steps_per_epoch}")
        self.features = features
        self.labels = labels
        self.teacher_ids = list(teacher_ids)
        self.rows, self.sizes = partition.padded(self.teacher_ids)
        self.batch_size = batch_size
        self.seed = seed
        self.transform = transform
        self.epoch = 0  # passes drawn so far (the shuffle of pass p depends on p)
        self.steps_per_pass = max(1, int(np.ceil(self.sizes.max().item() / batch_size)))
        self.passes_per_epoch = -(-int(min_steps_per_epoch) // self.steps_per_pass)

    def __len__(self) -> int:
        return self.steps_per_pass * self.passes_per_epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.passes_per_epoch):
            yield from self._one_pass()

    def _one_pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        num_teachers, max_rows = self.rows.shape
        keys = torch.from_numpy(hashed_uniform(self.seed, self.epoch, np.asarray(self.teacher_ids), max_rows))
        self.epoch += 1
        keys[self.rows < 0] = 2.0  # padding sorts last
        order = self.rows.gather(1, keys.argsort(dim=1))
        sizes = self.sizes.unsqueeze(1)
        for step in range(self.steps_per_pass):
            pos = torch.arange(step * self.batch_size, (step + 1) * self.batch_size).unsqueeze(0)
            idx = order.gather(1, (pos % sizes))  # [T, b], wraps for small partitions
            x = self.features[idx]
            if self.transform is not None:
                x = self.transform(x)
            yield x, self.labels[idx]
