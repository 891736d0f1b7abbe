"""Errors and warnings about the data say what is wrong and how to fix it, never a count read from the
private rows: two datasets that differ in one record give the same message on every failing path (row counts,
records per teacher, labels). A bad value is named with its column and its first row (the message is printed on
the console, never logged), so a record added after it changes nothing."""

from __future__ import annotations

import gzip
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules import ImageDataModule, TabularDataModule
from datamodules.idx import load_idx_splits, parse_idx
from datamodules.partition import TeacherPartition, record_keys
from lightning_gpate.evaluation.tabular import LabelEncoder


def message(build) -> str:
    with pytest.raises(Exception) as err:  # noqa: PT011 - the message is what is compared
        build()
    return f"{type(err.value).__name__}: {err.value}"


def neighbours(frame: pd.DataFrame, extra: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """D and D + one record."""
    return frame, pd.concat([frame, pd.DataFrame([extra])], ignore_index=True)


def same_message(build, pair, folders=()) -> str:
    """The one message both datasets of ``pair`` give (``folders``: each one's own directory, named alike)."""
    texts = [message(lambda d=d: build(d)) for d in pair]
    texts = [t.replace(str(f), "<data>") for t, f in zip(texts, folders)] if folders else texts
    assert texts[0] == texts[1]
    return texts[0]


def test_tabular_errors_are_the_same_for_neighbouring_tables(mixed_frame, tmp_path):
    row = mixed_frame.iloc[0].to_dict()
    # a non-numeric marker in a numeric column (one more record with another marker)
    marked = mixed_frame.astype({"income": object})
    marked.loc[5, "income"] = "?"
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder, frame in zip(folders, neighbours(marked, {**row, "income": "unknown"})):
        folder.mkdir()
        frame.to_csv(folder / "t.csv", index=False)
    text = same_message(lambda f: TabularDataModule(str(f / "t.csv"), label="outcome"), folders, folders)
    assert "column 'income' is numeric but row 5 holds '?', which is not a number" in text and "unknown" not in text
    # a value outside the declared categories (one more record with another such value)
    declared = {"region": {"categories": ["east", "north", "south"]}}
    text = same_message(lambda f: TabularDataModule(frame=f, label="outcome", schema=declared),
                        neighbours(mixed_frame, {**row, "region": "north-west"}))
    first = int((mixed_frame["region"] == "west").idxmax())
    assert f"column 'region': row {first} holds 'west', which is not among its declared categories" in text
    assert "north-west" not in text
    # missing values (one more record with one)
    holes = mixed_frame.astype({"income": float})
    holes.loc[[1, 2], "income"] = np.nan
    text = same_message(lambda f: TabularDataModule(frame=f, label="outcome"), neighbours(holes, {**row, "income": np.nan}))
    assert "missing values (NaN) in columns ['income']" in text
    # more teachers than training rows (one more row)
    text = same_message(lambda f: TabularDataModule(frame=f, label="outcome", num_teachers=500), neighbours(mixed_frame, row))
    assert "too few rows per teacher" in text and "500 teachers" in text
    # a batch larger than the training split (the non-private loader; one more row)
    small = mixed_frame.iloc[:20]
    text = same_message(lambda f: TabularDataModule(frame=f, label="outcome", batch_size=64, test_fraction=0.0).train_dataloader(),
                        neighbours(small, row))
    assert "batch_size 64 exceeds the number of training rows" in text


def test_whether_a_teacher_is_empty_is_not_announced():
    """7 records among 4 teachers fill every teacher; without the last one, a teacher is empty. A warning
    about empty teachers would tell the two apart: one bit of the private data."""
    x = torch.arange(7, dtype=torch.float32).unsqueeze(1)
    keys = record_keys(x, torch.zeros(7, dtype=torch.long))
    texts, empty = [], []
    for n in (6, 7):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            empty.append(TeacherPartition.create(keys[:n], 4, seed=0).num_empty)
        texts.append([str(w.message) for w in caught])
    assert empty == [1, 0]
    assert texts[0] == texts[1] == []
    text = same_message(lambda n: TeacherPartition.create(record_keys(torch.zeros(n, 1), torch.arange(n)), 8, seed=0), (5, 6))
    assert "too few rows per teacher" in text


def test_a_malformed_csv_line_is_not_named(tmp_path):
    """pandas' parser error names the line of a malformed row (and a decoding error the byte's
    position and value): the data modules say what to check instead, the same for neighbouring files."""
    header, rows = "a,b,y", [f"{i / 10},{i % 7},{i % 2}" for i in range(20)]
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder, bad in zip(folders, (5, 6)):  # the malformed row: at line 7, or at line 8 of a file one row longer
        folder.mkdir()
        lines = [header, *rows[:bad], "0.5,1,0,9", *rows[bad:]]
        (folder / "t.csv").write_text("\n".join(lines) + "\n")
        (folder / "latin.csv").write_bytes(("\n".join([header, *rows[:bad], "0.5,\xe9,1"]) + "\n").encode("latin-1"))
        (folder / "img.csv").write_text("\n".join([",".join(["1"] * 5)] * (bad + 2) + [",".join(["1"] * 6)]) + "\n")
    text = same_message(lambda f: TabularDataModule(str(f / "t.csv"), label="y").spec, folders, folders)
    assert "a line has another number of fields than the header" in text and "line 7" not in text and "line 8" not in text
    text = same_message(lambda f: TabularDataModule(str(f / "latin.csv"), label="y").spec, folders, folders)
    assert "not UTF-8 text" in text and "position" not in text
    text = same_message(lambda f: ImageDataModule("csv", path=str(f / "img.csv"), classes=[0, 1]).spec, folders, folders)
    assert "a line has another number of fields" in text


def _image_csv(path, labels):
    rng = np.random.default_rng(0)
    path.write_text("".join(",".join([*map(str, rng.integers(0, 256, 16)), str(lab)]) + "\n" for lab in labels))
    return str(path)


def _idx(values: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, values.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in values.shape)
    return header + values.astype(np.uint8).tobytes()


def test_image_errors_are_the_same_for_neighbouring_datasets(tmp_path):
    # CSV labels outside the declared classes (one more record of another unseen class)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder, labels in zip(folders, ([1, 7] * 10, [1, 7] * 10 + [8])):
        folder.mkdir()
        _image_csv(folder / "x.csv", labels)
    text = same_message(lambda f: ImageDataModule("csv", path=str(f / "x.csv"), classes=[0, 1, 2, 3]).spec, folders, folders)
    assert "some labels are not among the declared data.classes ['0', '1', '2', '3']" in text and "'7'" not in text
    # IDX: a truncated file, labels outside 0..9, image and label files of different lengths (one more record each)
    text = same_message(lambda n: parse_idx(_idx(np.zeros((n, 4, 4)))[:-1], name="f", ndim=3), (3, 4))
    assert "truncated" in text
    for i, n in enumerate((10, 11)):
        folder = tmp_path / f"idx{i}"
        folder.mkdir()
        for split, count in (("train", n), ("t10k", 10)):
            (folder / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(np.zeros((count, 28, 28)))))
            (folder / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(np.full(count - (split == "train"), 12))))
    folders = (tmp_path / "idx0", tmp_path / "idx1")
    text = same_message(lambda f: load_idx_splits(f, "mnist", verify_checksums=False), folders, folders)
    assert "hold different numbers of records" in text
    for folder in (tmp_path / "idx0", tmp_path / "idx1"):  # now as many labels as images, one of them 12 (or 13)
        n = 10 if folder.name == "idx0" else 11
        labels = np.r_[np.zeros(n - 1), 12 + (n == 11)]
        (folder / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(labels)))
    text = same_message(lambda f: load_idx_splits(f, "mnist", verify_checksums=False), folders, folders)
    assert "some labels are not one of the 10 classes" in text


def test_evaluation_errors_do_not_name_real_labels():
    a, b = pd.Series([3, 3, 3]), pd.Series([3, 3, 3, 3])
    text = same_message(lambda s: LabelEncoder([s]), (a, b))
    assert "fewer than two classes" in text and "3" not in text
    real = LabelEncoder([pd.Series([0, 1, 1])])
    text = same_message(lambda s: real.encode(s, "real test"), (pd.Series([0, 5]), pd.Series([0, 5, 6])))
    assert "some real test labels" in text and "5" not in text


def test_a_private_runs_failed_evaluation_logs_the_error_type_only():
    """The error tag of a periodic evaluation: a private run logs the exception's type, not its message
    (which may describe the real data; it is printed), as the run's own error tag does."""
    import small_models
    from callbacks import DownstreamUtility, ReleaseArtifact
    from conftest import query_run
    from lightning_gpate.tracking import GPATEMLFlowLogger

    model, dm = small_models.build(small_models.MARGINAL, rows=120, test_fraction=0.3)
    with pytest.warns(UserWarning, match=r"DownstreamUtility failed at step \d+: ValueError: unknown settings"):
        small_models.fit(model, dm, steps=1, callbacks=[DownstreamUtility(settings=("Z",)), ReleaseArtifact()],
                         logger=GPATEMLFlowLogger(experiment_name="private-eval-error"))
    run, _ = query_run("private-eval-error")
    tag = run.data.tags["utility_error"]
    assert tag.startswith("DownstreamUtility failed at step ") and tag.endswith(": ValueError (the message was printed, not logged)")
