"""MNIST's IDX files: header parsing, checksums, truncated and corrupt files, the official split, and
(opt-in) the real files of ../shared/data/mnist; image CSV classes are public only when declared."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SHARED_DATA
from datamodules import DataError, ImageDataModule
from datamodules.idx import IDX_FILES, KNOWN_MD5, load_idx_splits, parse_idx, read_idx

MNIST_DIR = SHARED_DATA / "mnist"


def idx_bytes(values: np.ndarray) -> bytes:
    """An IDX file of uint8 values, written from the format's definition (not by the reader)."""
    header = b"\x00\x00\x08" + bytes([values.ndim]) + b"".join(struct.pack(">I", s) for s in values.shape)
    return header + values.astype(np.uint8).tobytes()


def write_mnist(folder: Path, *, train: int = 60, test: int = 10, compress: bool = True, side: int = 28) -> dict[str, np.ndarray]:
    """Four tiny IDX files under the official names; returns what they hold."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    held = {}
    for split, n in (("train", train), ("test", test)):
        images_name, labels_name = IDX_FILES[split]
        held[images_name] = rng.integers(0, 256, (n, side, side), dtype=np.uint8)
        held[labels_name] = (np.arange(n) % 10).astype(np.uint8)
    for name, values in held.items():
        data = idx_bytes(values)
        if compress:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return held


def test_the_header_gives_the_shape_and_the_values_follow_row_major():
    values = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    data = idx_bytes(values)
    assert data[:8] == bytes.fromhex("0000080300000002")  # magic 0x00000803, then 2 big-endian
    parsed = parse_idx(data, ndim=3)
    assert parsed.shape == (2, 3, 4) and np.array_equal(parsed, values)
    assert parse_idx(idx_bytes(np.array([7, 1, 9], dtype=np.uint8)), ndim=1).tolist() == [7, 1, 9]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:10], "truncated"),
    (lambda d: d[:2], "too short"),
    (lambda d: d + b"\x00", "trailing bytes"),
    (lambda d: b"\x00\x00\x0d" + d[3:], "value type 0x0d"),
    (lambda d: b"\x08\x03" + d[2:], "not an IDX file"),
    (lambda d: d[:3] + b"\x02" + d[4:], "2 dimensions in its header, expected 3"),
], ids=["one_byte_short", "cut_in_header", "no_header", "trailing", "float_type", "bad_magic", "wrong_ndim"])
def test_a_bad_header_or_size_is_a_one_line_data_error(mutate, message):
    data = idx_bytes(np.zeros((3, 5, 5), dtype=np.uint8))
    with pytest.raises(DataError, match=message) as err:
        parse_idx(mutate(data), name="f", ndim=3)
    assert "\n" not in str(err.value)


def test_gzip_and_plain_files_read_the_same(tmp_path):
    values = np.random.default_rng(1).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    (tmp_path / "a").write_bytes(idx_bytes(values))
    (tmp_path / "b.gz").write_bytes(gzip.compress(idx_bytes(values)))
    assert np.array_equal(read_idx(tmp_path / "a", ndim=3), values)
    assert np.array_equal(read_idx(tmp_path / "b.gz", ndim=3), values)


def test_a_truncated_gzip_file_is_a_data_error(tmp_path):
    data = gzip.compress(idx_bytes(np.zeros((50, 28, 28), dtype=np.uint8)))
    (tmp_path / "t.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupt or truncated"):
        read_idx(tmp_path / "t.gz", ndim=3)


def test_a_checksum_mismatch_is_an_error_before_reading(tmp_path):
    (tmp_path / "x.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((2, 28, 28), dtype=np.uint8))))
    expected = KNOWN_MD5["mnist"]["train-images-idx3-ubyte.gz"]
    with pytest.raises(DataError, match=f"is not the published {expected}"):
        read_idx(tmp_path / "x.gz", md5=expected)
    right = hashlib.md5((tmp_path / "x.gz").read_bytes()).hexdigest()
    assert read_idx(tmp_path / "x.gz", md5=right).shape == (2, 28, 28)


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "plain"])
def test_the_datamodule_keeps_the_official_split(tmp_path, compress):
    held = write_mnist(tmp_path / "mnist", train=60, test=10, compress=compress)
    dm = ImageDataModule("mnist", root=str(tmp_path / "mnist"), verify_checksums=False, val_fraction=0.0)
    dm.setup("fit")
    x_train, y_train = dm.splits["train"]
    x_test, y_test = dm.splits["test"]
    assert x_train.shape == (60, 1, 28, 28) and x_test.shape == (10, 1, 28, 28)
    assert x_train.dtype == torch.uint8 and y_train.dtype == torch.long
    # the test file is the test split, image for image; the training file only trains
    assert np.array_equal(x_test[:, 0].numpy(), held["t10k-images-idx3-ubyte"])
    assert np.array_equal(y_test.numpy(), held["t10k-labels-idx1-ubyte"])
    train_rows = {r.tobytes() for r in held["train-images-idx3-ubyte"]}
    assert {r.tobytes() for r in x_train[:, 0].numpy()} == train_rows
    spec = dm.spec
    assert spec["num_classes"] == 10 and spec["class_names"] == [str(i) for i in range(10)]
    assert spec["private_metadata"] == [] and spec["num_train"] == 60 and spec["shape"] == [1, 28, 28]
    # a validation split is cut from the training file only
    dm_val = ImageDataModule("mnist", root=str(tmp_path / "mnist"), verify_checksums=False, val_fraction=0.5)
    dm_val.setup("fit")
    assert len(dm_val.splits["train"][1]) + len(dm_val.splits["val"][1]) == 60 and len(dm_val.splits["test"][1]) == 10


def test_torchvision_layout_is_found(tmp_path):
    write_mnist(tmp_path / "MNIST" / "raw", compress=False)
    dm = ImageDataModule("mnist", root=str(tmp_path), verify_checksums=False, val_fraction=0.0)
    assert dm.spec["num_train"] == 60


def test_the_datamodule_checks_checksums_by_default(tmp_path):
    write_mnist(tmp_path, compress=True)
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: its MD5 is not the published f68b3c2d"):
        ImageDataModule("mnist", root=str(tmp_path)).spec  # noqa: B018
    # Fashion-MNIST has its own checksums for the same file names
    with pytest.raises(DataError, match="is not the published 8d4fb7e6"):
        ImageDataModule("fashion_mnist", root=str(tmp_path)).spec  # noqa: B018


def test_missing_or_inconsistent_files_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="no mnist IDX files in .*data.download: true"):
        ImageDataModule("mnist", root=str(tmp_path / "none")).spec  # noqa: B018
    write_mnist(tmp_path / "some", compress=False)
    (tmp_path / "some" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="holds 3 of the 4 mnist IDX files; missing: t10k-labels-idx1-ubyte"):
        ImageDataModule("mnist", root=str(tmp_path / "some"), verify_checksums=False).spec  # noqa: B018
    write_mnist(tmp_path / "uneven", compress=False)
    (tmp_path / "uneven" / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(9, dtype=np.uint8)))
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte hold different numbers of records"):
        load_idx_splits(tmp_path / "uneven", "mnist", verify_checksums=False)
    (tmp_path / "uneven" / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.full(10, 10, dtype=np.uint8)))
    with pytest.raises(DataError, match="some labels are not one of the 10 classes"):
        load_idx_splits(tmp_path / "uneven", "mnist", verify_checksums=False)


def test_a_truncated_file_fails_the_cli_before_any_run(tmp_path, capsys):
    from lightning_gpate.cli import main

    write_mnist(tmp_path / "mnist", compress=False)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    root = Path(__file__).resolve().parents[1]
    code = main(["fit", "--config", str(root / "configs" / "mnist" / "gan_nonprivate.yaml"), "--data.root", str(tmp_path / "mnist"),
                 "--data.verify_checksums", "false", "--trainer.max_steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "error:" in err and "it truncated" in err and len(err.strip().splitlines()) == 1
    assert not Path("private").exists()
    db = Path("mlruns") / "mlflow.db"  # the test's MLflow store (conftest): no run was started
    if db.exists():
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
        assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


# ----------------------------------------------------------------------------- image CSV classes (issue 20.5)
def _csv(path: Path, labels) -> Path:
    rng = np.random.default_rng(0)
    rows = [",".join([*map(str, rng.integers(0, 256, 16)), str(lab)]) for lab in labels]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_csv_classes_read_from_the_labels_are_refused_by_private_models(tmp_path):
    from lightning_gpate.models import GPATE, GAN
    from lightning_gpate.models.private import PrivateMetadataError

    dm = ImageDataModule("csv", path=str(_csv(tmp_path / "x.csv", [0, 1, 2] * 10)), num_teachers=3, val_fraction=0.0, test_fraction=0.0)
    assert dm.spec["private_metadata"] == ["label"]
    with pytest.raises(PrivateMetadataError, match="declare them in data.classes"):
        GPATE(dm.spec, epsilon=1.0)
    GAN(dm.spec)  # a non-private model may read them


def test_declared_csv_classes_fix_the_label_codes_whatever_the_records(tmp_path):
    from lightning_gpate.models import GPATE

    declared = [0, 1, 2, 3]
    a = ImageDataModule("csv", path=str(_csv(tmp_path / "a.csv", [1, 2] * 10)), classes=declared, num_teachers=2,
                        val_fraction=0.0, test_fraction=0.0)
    b = ImageDataModule("csv", path=str(_csv(tmp_path / "b.csv", [1, 2] * 10 + [0])), classes=declared, num_teachers=2,
                        val_fraction=0.0, test_fraction=0.0)
    # one record of a class the others lack changes neither the classes nor anyone's label code
    assert a.spec["class_names"] == b.spec["class_names"] == ["0", "1", "2", "3"] and a.spec["private_metadata"] == []
    assert sorted(set(a.splits["train"][1].tolist())) == [1, 2]
    GPATE(a.spec, epsilon=1.0)
    bad = ImageDataModule("csv", path=str(_csv(tmp_path / "c.csv", [1, 7] * 10)), classes=declared)
    with pytest.raises(DataError, match=r"some labels are not among the declared data.classes"):
        bad.spec  # noqa: B018


# ----------------------------------------------------------------------------- the real files (opt-in)
@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="needs ../shared/data/mnist (the official MNIST IDX files)")
def test_the_official_mnist_files_give_the_official_split():
    dm = ImageDataModule("mnist", root=str(MNIST_DIR), val_fraction=0.0)  # checksums verified
    dm.setup("fit")
    x_train, y_train = dm.splits["train"]
    x_test, y_test = dm.splits["test"]
    assert x_train.shape == (60_000, 1, 28, 28) and x_test.shape == (10_000, 1, 28, 28)
    # the published class counts of the training and test files
    assert torch.bincount(y_train, minlength=10).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert torch.bincount(y_test, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the first test digits, in file order
    assert dm.spec["private_metadata"] == []
