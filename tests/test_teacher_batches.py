"""Teacher batch streams built on the training device: the same batches as the stream's definition,
computed independently here (SplitMix64 on Python integers, one teacher at a time)."""

from __future__ import annotations

import pytest
import torch

from datamodules.partition import TeacherBatches, TeacherPartition, hashed_uniform, record_keys

M64 = (1 << 64) - 1
C1, C2, C3, C4 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93


def splitmix_uniform(seed: int, epoch: int, teacher: int, position: int) -> float:
    """The stream's key of one position, from its definition (uint64 arithmetic on Python ints)."""
    x = ((seed * C1) & M64) ^ ((epoch * C2) & M64)
    x ^= (teacher * C3) & M64
    x = (x + position * C4) & M64
    x = ((x ^ (x >> 30)) * C2) & M64
    x = ((x ^ (x >> 27)) * C3) & M64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def reference_stream(rows: list[int], seed: int, teacher: int, length: int) -> list[int]:
    """Teacher ``teacher``'s first ``length`` rows: pass after pass, each a permutation of its rows
    ordered by the keys of their positions."""
    out, epoch = [], 0
    while len(out) < length:
        keys = [splitmix_uniform(seed, epoch, teacher, j) for j in range(len(rows))]
        out += [rows[j] for j in sorted(range(len(rows)), key=keys.__getitem__)]
        epoch += 1
    return out[:length]


def test_hashed_uniform_is_splitmix64():
    epochs = torch.tensor([[0, 7], [3, 2**40]])
    u = hashed_uniform(11, epochs, [5, 2**33 + 1], 4)
    for t, teacher in enumerate([5, 2**33 + 1]):
        for p in range(2):
            for j in range(4):
                assert u[t, p, j].item() == splitmix_uniform(11, int(epochs[t, p]), teacher, j)


@pytest.mark.parametrize("batch", [3, 7, 25], ids=["within_a_pass", "across_passes", "several_passes"])
def test_every_teachers_batches_follow_its_stream(batch):
    x = torch.arange(90, dtype=torch.uint8).view(90, 1)  # 90 distinct records
    y = torch.zeros(90, dtype=torch.long)
    part = TeacherPartition.create(record_keys(x, y), 9, seed=2)
    owned = [1, 4, 8]  # a DDP shard's teachers
    stream = TeacherBatches(x, y, part, owned, batch_size=batch, seed=5)
    steps = 6
    for i, t in enumerate(owned):
        rows = [int(r) for r in part.rows_of(t)]
        expected = reference_stream(rows, 5, t, steps * batch)
        got = torch.cat([stream.indices(s)[i] for s in range(steps)]).tolist()
        assert got == expected
    xb, yb = stream.batch(2)
    assert xb.shape == (3, batch, 1) and torch.equal(xb[:, :, 0].long(), stream.indices(2))  # the records themselves


def test_batches_are_built_on_the_given_device_without_a_host_batch():
    x = torch.randint(0, 256, (40, 1, 4, 4), dtype=torch.uint8)
    y = torch.randint(0, 3, (40,))
    part = TeacherPartition.create(record_keys(x, y), 4, seed=0)
    stream = TeacherBatches(x, y, part, range(4), batch_size=5, seed=1, transform=lambda v: v.float() / 255, device="cpu")
    assert stream.features.device.type == stream.rows.device.type == "cpu"
    xb, yb = stream.batch(0)
    assert xb.dtype == torch.float32 and xb.shape == (4, 5, 1, 4, 4) and yb.shape == (4, 5)
    if torch.cuda.is_available():  # the GPU machine: the same streams on the device
        gpu = TeacherBatches(x, y, part, range(4), batch_size=5, seed=1, device="cuda")
        for s in range(5):
            assert torch.equal(gpu.indices(s).cpu(), stream.indices(s))
