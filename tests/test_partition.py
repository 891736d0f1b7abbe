import numpy as np
import pytest
import torch

from datamodules import DataError, ImageDataModule, TeacherBatches, TeacherPartition


@pytest.mark.parametrize("num_rows,num_teachers", [(100, 7), (1000, 1000), (1797, 250), (10, 3)])
def test_spread_partition_is_disjoint_and_covers_every_row(num_rows, num_teachers):
    part = TeacherPartition.create(num_rows, num_teachers, seed=3, remainder="spread")
    sets = [set(part.rows_of(t).tolist()) for t in range(num_teachers)]
    assert sum(len(s) for s in sets) == num_rows == len(set().union(*sets))  # disjoint + covering
    assert part.sizes.max() - part.sizes.min() <= 1
    assert (part.sizes[: num_rows % num_teachers] == num_rows // num_teachers + 1).all()


def test_drop_partition_leaves_the_remainder_unused():
    part = TeacherPartition.create(103, 10, seed=0, remainder="drop")
    assert (part.sizes == 10).all()
    assert (part.assignment == -1).sum() == 3


def test_partition_is_a_pure_function_of_its_seed():
    a = TeacherPartition.create(500, 20, seed=1)
    assert a.fingerprint() == TeacherPartition.create(500, 20, seed=1).fingerprint()
    assert a.fingerprint() != TeacherPartition.create(500, 20, seed=2).fingerprint()


def test_too_few_rows_per_teacher_is_a_clear_error():
    with pytest.raises(ValueError, match="too few rows per teacher"):
        TeacherPartition.create(50, 100, seed=0)


def test_state_dict_round_trip_and_corruption_detected():
    part = TeacherPartition.create(300, 11, seed=5)
    state = part.state_dict()
    assert TeacherPartition.from_state_dict(state).fingerprint() == part.fingerprint()
    state["assignment"] = state["assignment"].clone()
    state["assignment"][[0, 1]] = state["assignment"][[1, 0]] + 0  # swap two rows' teachers
    if int(state["assignment"][0]) != int(state["assignment"][1]):
        with pytest.raises(ValueError, match="fingerprint"):
            TeacherPartition.from_state_dict(state)


def test_teacher_batches_only_draw_from_the_teachers_own_rows():
    n, teachers = 230, 9
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # feature = row id
    y = torch.zeros(n, dtype=torch.long)
    part = TeacherPartition.create(n, teachers, seed=0)
    before = part.fingerprint()
    owned = [1, 4, 7]
    batches = TeacherBatches(x, y, part, owned, batch_size=30, seed=0)  # 30 > rows per teacher: cycles
    for _ in range(3):  # several passes
        for xb, yb in batches:
            assert xb.shape == (3, 30, 1)
            for i, t in enumerate(owned):
                assert set(xb[i, :, 0].long().tolist()) <= set(part.rows_of(t).tolist())
    assert part.fingerprint() == before


def test_datamodule_partition_is_fixed_and_restored_from_state():
    dm = ImageDataModule("digits", num_teachers=40, teacher_batch_size=8)
    dm.setup("fit")
    first = dm.partition.fingerprint()
    for _ in dm.train_dataloader():
        pass
    dm.setup("fit")
    assert dm.partition.fingerprint() == first  # never re-drawn during a run
    state = dm.state_dict()

    other = ImageDataModule("digits", num_teachers=40, teacher_batch_size=8, partition_seed=99)
    other.setup("fit")
    other.load_state_dict(state)  # resume: the checkpoint's partition wins
    assert other.partition.fingerprint() == first

    wrong = ImageDataModule("digits", num_teachers=41)
    wrong.setup("fit")
    with pytest.raises(DataError, match="does not fit this data"):
        wrong.load_state_dict(state)


def test_teacher_batches_cover_each_partition_once_per_pass():
    n, teachers, b = 120, 4, 10
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    part = TeacherPartition.create(n, teachers, seed=0)
    batches = TeacherBatches(x, torch.zeros(n, dtype=torch.long), part, range(teachers), batch_size=b, seed=1)
    seen = [[] for _ in range(teachers)]
    for xb, _ in batches:
        for t in range(teachers):
            seen[t] += xb[t, :, 0].long().tolist()
    for t in range(teachers):
        assert sorted(seen[t]) == sorted(part.rows_of(t).tolist())
    assert np.array_equal(part.sizes, [30] * 4)


def test_a_teachers_batches_do_not_depend_on_which_teachers_a_process_owns():
    n = 300
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    y = torch.zeros(n, dtype=torch.long)
    part = TeacherPartition.create(n, 6, seed=0)
    everyone = list(TeacherBatches(x, y, part, range(6), batch_size=7, seed=3))
    rank1_of_2 = list(TeacherBatches(x, y, part, [1, 3, 5], batch_size=7, seed=3))
    for (xa, _), (xb, _) in zip(everyone, rank1_of_2):
        assert torch.equal(xa[[1, 3, 5]], xb)


def test_many_steps_per_epoch_give_the_same_batches_as_one_pass_per_epoch():
    """An epoch of several passes yields exactly the batches that as many one-pass epochs yield, in order."""
    n = 50
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    y = torch.arange(n) % 3
    part = TeacherPartition.create(n, 20, seed=0)  # 2-3 rows per teacher, batch 2: 2 steps per pass
    one = TeacherBatches(x, y, part, range(20), batch_size=2, seed=4)
    many = TeacherBatches(x, y, part, range(20), batch_size=2, seed=4, min_steps_per_epoch=7)
    assert len(one) == 2 and len(many) == 8  # whole passes: 4 of them
    reference = [b for _ in range(8) for b in one]  # 8 one-pass epochs
    got = [b for _ in range(2) for b in many]  # 2 epochs of 4 passes
    assert len(got) == len(reference) == 16
    for (xa, ya), (xb, yb) in zip(reference, got):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(reference[0][0], reference[2][0])  # passes differ: the pass counter runs on


def test_datamodule_teacher_loader_has_many_steps_per_epoch():
    from datamodules import ImageDataModule

    dm = ImageDataModule("digits", num_teachers=700, teacher_batch_size=2, teacher_steps_per_epoch=100)
    dm.setup("fit")
    assert len(dm.train_dataloader()) >= 100
    single = ImageDataModule("digits", num_teachers=700, teacher_batch_size=2, teacher_steps_per_epoch=1)
    single.setup("fit")
    assert len(single.train_dataloader()) == -(-int(single.partition.sizes.max()) // 2)  # one pass per epoch
