"""Per-record keys, the train/val/test split and the teacher partition they decide, and the
per-teacher batches drawn from a partition.

Every ε of this project refers to **add/remove-one neighbouring datasets**: D and D' differ by one
record (row) of the data the user passes. PATE-style analyses then need that adding or removing a
record changes the data of exactly one teacher, and nothing else of the training. A partition made by
shuffling row indices does not have that property (one more row re-deals every teacher: the analysis
would hold for replace-one only), nor does a split made by a permutation (one more row moves others
between train and test). Here both are decided **per record, from its content**:

* :func:`record_keys` gives every record a 64-bit key computed from its bytes and label alone, plus
  its occurrence rank among identical records (so that duplicates spread over teachers instead of
  all landing on one, and one more copy changes one teacher only);
* the split (:func:`keyed_uniform` with ``split_seed``) and the teacher of a record
  (:meth:`TeacherPartition.create` with ``partition_seed``) are keyed hashes of that key.

Adding a record therefore adds it to one split and one teacher; removing one removes it from its
teacher; no other record moves. Teachers get unequal (binomial) shares, and a teacher may get no
record at all when there are few records per teacher: it then trains on a constant (all-zero) batch,
which is independent of the data (privacy is unaffected; its votes carry no information). The
partition is a pure function of the data and the seed: the same on every DDP rank, recomputed on
resume and compared with the checkpoint's fingerprint (of the record-key → teacher pairs, so the
order of the rows in the file does not matter).

A teacher's batches depend only on ``(seed, pass, teacher id)`` and its own multiset of records
(:class:`TeacherBatches`): its own passes over its own records, taken in record-key order (not row
order, which duplicates would make depend on other rows) and indexed by the global step, so neither
another teacher's data, the order of the file nor the DDP sharding changes them.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset

PARTITION_SCHEME = "record-key-hash/v1"
#: Steps in one "epoch" of teacher batches: a public constant, so that Lightning's epoch counter
#: (logged) reveals nothing about the size of the private partitions.
TEACHER_STEPS_PER_EPOCH = 100

_C1, _C2, _C3, _C4 = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
                      np.uint64(0x94D049BB133111EB), np.uint64(0xD6E8FEB86659FD93))


def _finalize(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64 with good avalanche)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C2
        x = (x ^ (x >> np.uint64(27))) * _C3
        return x ^ (x >> np.uint64(31))


def _to_unit(x: np.ndarray) -> np.ndarray:
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _as_int64(value: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no general uint64 arithmetic)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_T1, _T2, _T3, _T4 = (_as_int64(int(c)) for c in (_C1, _C2, _C3, _C4))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 tensors holding uint64 bits (``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _finalize_bits(x: torch.Tensor) -> torch.Tensor:
    """:func:`_finalize` on int64 tensors holding uint64 bits (multiplication wraps mod 2^64 alike)."""
    x = (x ^ _shift_right(x, 30)) * _as_int64(int(_C2))
    x = (x ^ _shift_right(x, 27)) * _as_int64(int(_C3))
    return x ^ _shift_right(x, 31)


def hashed_uniform(seed: int, epoch, teacher_ids, num_positions: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Uniforms in [0, 1) (float64) that depend only on ``(seed, epoch, global teacher id, position)``.

    ``epoch`` is a number (result ``[len(teacher_ids), num_positions]``) or an array ``[T, P]`` of
    per-teacher passes (result ``[T, P, num_positions]``). A teacher's shuffle is the same whichever
    other teachers a process owns, so 1 and N DDP processes draw the same batches. Computed with
    int64 tensor arithmetic on ``device`` (default: that of a tensor ``epoch``, else the CPU), with
    the same bits on every device: SplitMix64's finaliser of
    ``seed·C1 ⊕ epoch·C2 ⊕ teacher·C3 + position·C4`` (mod 2^64), its top 53 bits as the fraction.
    """
    if device is None:
        device = epoch.device if isinstance(epoch, torch.Tensor) else "cpu"
    teacher = torch.as_tensor(np.asarray(teacher_ids, dtype=np.int64) if not isinstance(teacher_ids, torch.Tensor)
                              else teacher_ids, dtype=torch.int64, device=device)
    epoch = torch.as_tensor(epoch, dtype=torch.int64, device=device)
    positions = torch.arange(num_positions, dtype=torch.int64, device=device)
    if epoch.ndim == 0:
        teacher, positions = teacher[:, None], positions[None, :]
    else:
        epoch, teacher, positions = epoch[:, :, None], teacher[:, None, None], positions[None, None, :]
    x = _as_int64(int(seed) * int(_C1)) ^ (epoch * _T2)
    x = x ^ (teacher * _T3)
    x = x + positions * _T4
    return _shift_right(_finalize_bits(x), 11).to(torch.float64) * (1.0 / (1 << 53))


def record_keys(features: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> np.ndarray:
    """One 64-bit key per record, from its content and its occurrence rank among identical records.

    The content digest is BLAKE2b of the record's stored bytes (features in their storage dtype) and
    label; the k-th copy of a record (in row order) gets rank k. A record's key therefore depends on
    nothing but itself (and, for duplicates, how many copies precede it): adding or removing a record
    changes no other record's key, except that removing one of several identical copies renumbers
    copies that are identical anyway.
    """
    x = features.numpy() if isinstance(features, torch.Tensor) else np.asarray(features)
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    n = len(y)
    rows = np.ascontiguousarray(x.reshape(n, -1))
    y = np.ascontiguousarray(y.astype(np.int64))
    digests = np.empty(n, dtype=np.uint64)
    for i in range(n):  # setup-time only (≈1 s per GB of data)
        h = hashlib.blake2b(rows[i].tobytes(), digest_size=8, person=b"lgpate-record")
        h.update(y[i].tobytes())
        digests[i] = int.from_bytes(h.digest(), "little")
    order = np.lexsort((np.arange(n), digests))
    sorted_digests = digests[order]
    starts = np.r_[True, sorted_digests[1:] != sorted_digests[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.empty(n, dtype=np.uint64)
    rank[order] = (np.arange(n) - group_start).astype(np.uint64)
    with np.errstate(over="ignore"):
        return _finalize(digests ^ _finalize(rank * _C4 + _C1))


def keyed_hash(keys: np.ndarray, seed: int, purpose: str) -> np.ndarray:
    """A keyed 64-bit hash of record keys: ``(seed, purpose)`` pick an independent hash function
    (the key is public: only its independence from other records matters)."""
    salt = int.from_bytes(hashlib.blake2b(f"{int(seed)}:{purpose}".encode(), digest_size=8).digest(), "little")
    with np.errstate(over="ignore"):
        return _finalize(np.asarray(keys, dtype=np.uint64) ^ _finalize(np.uint64(salt) + _C1))


def keyed_uniform(keys: np.ndarray, seed: int, purpose: str) -> np.ndarray:
    """Uniforms in [0, 1), one per record key (see :func:`keyed_hash`)."""
    return _to_unit(keyed_hash(keys, seed, purpose))


class TeacherPartition:
    """An assignment of training records to ``num_teachers`` disjoint teachers.

    Args:
        assignment: ``[num_rows]`` teacher id of every row, ``-1`` for a row no teacher sees.
        num_teachers: number of teachers.
        keys: the rows' :func:`record_keys` (the fingerprint is computed from them, so that it does
            not depend on the order of the rows); ``None`` fingerprints the assignment as given.

    Use :meth:`create` to make one.
    """

    def __init__(self, assignment: np.ndarray, num_teachers: int, *, keys: np.ndarray | None = None) -> None:
        assignment = np.asarray(assignment, dtype=np.int64)
        if assignment.ndim != 1:
            raise ValueError("assignment must be a 1-D array of teacher ids")
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
        if assignment.size and (assignment.max() >= num_teachers or assignment.min() < -1):
            raise ValueError("assignment holds a teacher id outside [-1, num_teachers)")
        if keys is not None and len(keys) != len(assignment):
            raise ValueError("keys must have one entry per row")
        self.assignment = assignment
        self.num_teachers = int(num_teachers)
        self.keys = None if keys is None else np.asarray(keys, dtype=np.uint64)
        order = np.argsort(assignment, kind="stable")
        counts = np.bincount(assignment[assignment >= 0], minlength=num_teachers)
        start = int((assignment < 0).sum())
        self._rows = order[start:]
        self._offsets = np.concatenate([[0], np.cumsum(counts)])

    @classmethod
    def create(cls, keys: np.ndarray, num_teachers: int, *, seed: int) -> "TeacherPartition":
        """Assign every record to the teacher ``keyed_hash(key, seed) mod num_teachers``.

        Args:
            keys: the training records' :func:`record_keys`.
            num_teachers: teachers to assign them to.
            seed: key of the hash (``partition_seed``; public).
        """
        keys = np.asarray(keys, dtype=np.uint64)
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
        if len(keys) < num_teachers:
            raise ValueError(  # without the row count: it is private (issue 20, finding 9)
                f"too few rows per teacher: the training rows cannot be split among {num_teachers} teachers "
                f"(each needs at least one); use fewer teachers"
            )
        teacher = (keyed_hash(keys, seed, "teacher") % np.uint64(num_teachers)).astype(np.int64)
        # Some teachers may receive no record (they then train on a constant batch: no data, no
        # information). Whether any does is a bit of the private data: not announced (docs/data.md).
        return cls(teacher, num_teachers, keys=keys)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self._offsets)

    @property
    def num_empty(self) -> int:
        """Teachers without any record."""
        return int((self.sizes == 0).sum())

    def rows_of(self, teacher: int) -> np.ndarray:
        """Row indices of one teacher, ordered by their record keys (by row index if no keys are known).

        The order of a teacher's rows decides its batch stream (:class:`TeacherBatches` shuffles
        positions in this list), so it must depend on the teacher's records only, not on where they sit
        in the file: in row order, removing one copy of a duplicated record hands the copy's rank (and
        so its teacher) to another copy at another row, which moves that copy among its teacher's other
        rows and reshuffles that teacher's whole stream. Keys are distinct per record and per copy, and
        the k-th copy's key is the same wherever the copies are, so in key order a teacher's list is a
        function of its multiset of records. (Ties, a 64-bit key collision, fall back to row order.)
        """
        rows = self._rows[self._offsets[teacher]:self._offsets[teacher + 1]]
        if self.keys is None:
            return np.sort(rows)
        return rows[np.lexsort((rows, self.keys[rows]))]

    def padded(self, teacher_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the given teachers as a ``[T, max_rows]`` matrix (padded with -1) and their sizes."""
        teacher_ids = np.asarray(teacher_ids, dtype=np.int64)
        sizes = self.sizes[teacher_ids]
        out = np.full((len(teacher_ids), max(1, int(sizes.max()))), -1, dtype=np.int64)
        for i, t in enumerate(teacher_ids):  # setup-time only, not per step
            out[i, : sizes[i]] = self.rows_of(int(t))
        return torch.from_numpy(out), torch.from_numpy(sizes)

    def fingerprint(self) -> str:
        """SHA-256 of the (record key, teacher) pairs (of the assignment if no keys are known):
        equal fingerprints mean the same records went to the same teachers, whatever the row order."""
        h = hashlib.sha256(f"{PARTITION_SCHEME}:{self.num_teachers}:".encode())
        if self.keys is None:
            h.update(self.assignment.tobytes())
        else:
            order = np.lexsort((self.assignment, self.keys))
            h.update(self.keys[order].tobytes() + self.assignment[order].tobytes())
        return h.hexdigest()

    def state_dict(self) -> dict:
        """What a checkpoint keeps to check a resume: the scheme, the number of teachers and the
        fingerprint (no per-row data: the partition is recomputed from the data and the seed)."""
        return {"scheme": PARTITION_SCHEME, "num_teachers": self.num_teachers, "fingerprint": self.fingerprint()}


class TeacherBatches(IterableDataset):
    """Per-step real batches for a set of teachers, each drawn only from that teacher's rows.

    Every item is ``(x, y)`` with ``x`` of shape ``[T, batch_size, *feature_shape]``: teacher ``i``
    of ``teacher_ids`` gets ``batch_size`` rows of its own partition. Each teacher walks through its
    own records in passes, each pass a fresh permutation that depends only on ``(seed, pass,
    global teacher id)``; step ``s`` takes positions ``[s·b, (s+1)·b)`` of that stream. A teacher's
    batches therefore depend on nothing but its own records, the seed and the step: not on other
    teachers' sizes, nor on which teachers this process owns. A teacher without records gets an
    all-zero batch (label 0). No Python loop over teachers: rows are gathered with index tensors.

    Everything per step happens on ``device`` (the training device): the stored rows are copied
    there once, and the shuffle keys, the gather and ``transform`` run there, so a step moves no
    batch from the host (at 2,000 MNIST teachers the gathered float batch is 188 MB; building it on
    the CPU and copying it took most of a GPU step).

    Args:
        features: all training rows (any storage; ``transform`` maps a gathered batch to model space).
        labels: ``[num_rows]`` class labels.
        partition: the fixed teacher partition.
        teacher_ids: the teachers this process owns (all of them on one device; r, r+W, … under DDP).
        batch_size: rows per teacher per step.
        seed: seed of the per-pass shuffles.
        transform: applied to gathered features (e.g. uint8 images to [-1, 1]).
        start_step: the step of the first item (the trainer's global step when resuming).
        steps_per_epoch: items per iteration over the dataset (Lightning's epoch; public).
        device: where the rows are kept and the batches built (default: the CPU).
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
        start_step: int = 0,
        steps_per_epoch: int = TEACHER_STEPS_PER_EPOCH,
        device: torch.device | str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"teacher batch size must be >= 1, got {batch_size}")
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.device = torch.device(device or "cpu")
        self.features = features.to(self.device)
        self.labels = labels.to(self.device)
        self.teacher_ids = list(teacher_ids)
        rows, sizes = partition.padded(self.teacher_ids)
        self._sizes = sizes.clamp(min=1).numpy()  # host copy: the passes a step spans, without a device sync
        self.rows, self.sizes = rows.to(self.device), sizes.to(self.device)
        self._padding = (self.rows < 0).unsqueeze(1)  # [T, 1, R]
        self._ids = torch.as_tensor(self.teacher_ids, dtype=torch.int64, device=self.device)
        self.empty = self.sizes == 0
        self.has_empty = bool((sizes == 0).any())
        self.batch_size = batch_size
        self.seed = seed
        self.transform = transform
        self.next_step = int(start_step)
        self.steps_per_epoch = int(steps_per_epoch)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def indices(self, step: int) -> torch.Tensor:
        """``[T, batch_size]`` row indices of step ``step`` (``-1`` for a teacher without records)."""
        b = self.batch_size
        span = int((((step + 1) * b - 1) // self._sizes - (step * b) // self._sizes).max()) + 1  # passes a step spans
        n = self.sizes.clamp(min=1).unsqueeze(1)  # [T, 1]
        pos = torch.arange(step * b, (step + 1) * b, device=self.device).unsqueeze(0)  # [1, b]
        passes, offsets = pos // n, pos % n  # [T, b]: each teacher in its own pass
        first = passes[:, :1]
        epochs = first + torch.arange(span, device=self.device).unsqueeze(0)  # [T, span] passes needed
        keys = hashed_uniform(self.seed, epochs, self._ids, self.rows.shape[1])  # [T, span, R]
        keys.masked_fill_(self._padding, 2.0)  # padding sorts last
        order = self.rows.unsqueeze(1).expand_as(keys).gather(2, keys.argsort(dim=2))  # [T, span, R]
        picked = order.gather(2, offsets.unsqueeze(1).expand(-1, span, -1))  # [T, span, b]
        return picked.gather(1, (passes - first).unsqueeze(1)).squeeze(1)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(step).clamp_(min=0)
        x, y = self.features[idx], self.labels[idx]
        if self.has_empty:  # no records: a constant, data-independent batch
            x = x.masked_fill(self.empty.view(-1, *[1] * (x.ndim - 1)), 0)
            y = y.masked_fill(self.empty.view(-1, 1), 0)
        if self.transform is not None:
            x = self.transform(x)
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps_per_epoch):
            step = self.next_step
            self.next_step += 1
            yield self.batch(step)
