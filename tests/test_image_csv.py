"""Image CSVs (flattened grey pixels, label last): a header is detected, and no row is ever dropped."""

from __future__ import annotations

import numpy as np
import pytest

from datamodules import DataError, ImageDataModule
from datamodules.image import csv_has_header

SIDE = 4


def _rows(n: int, labels=None) -> list[str]:
    rng = np.random.default_rng(0)
    labels = labels if labels is not None else [str(i % 3) for i in range(n)]
    return [",".join([*map(str, rng.integers(0, 256, SIDE * SIDE)), str(labels[i])]) for i in range(n)]


def _images(path, **kwargs) -> int:
    dm = ImageDataModule("csv", path=str(path), val_fraction=0.0, test_fraction=0.0, **kwargs)
    dm.setup("fit")
    return len(dm.splits["train"][1])


HEADERS = {
    "names": ",".join([f"pixel{i}" for i in range(SIDE * SIDE)] + ["label"]),
    "numbered_pixels": ",".join([*map(str, range(SIDE * SIDE)), "label"]),  # numbers over numbers, but the label name
    "quoted": ",".join([f'"p{i}"' for i in range(SIDE * SIDE)] + ['"y"']),
}


@pytest.mark.parametrize("header", sorted(HEADERS))
def test_a_header_is_detected_and_every_image_kept(tmp_path, header):
    path = tmp_path / "x.csv"
    path.write_text("\n".join([HEADERS[header], *_rows(30)]) + "\n")
    assert csv_has_header(path)
    assert _images(path) == 30


@pytest.mark.parametrize("labels", [None, ["cat", "dog", "cow"] * 10], ids=["numeric_labels", "named_labels"])
def test_a_file_without_header_keeps_its_first_image(tmp_path, labels):
    path = tmp_path / "x.csv.gz"
    import gzip

    with gzip.open(path, "wt") as f:
        f.write("\n".join(_rows(30, labels)) + "\n")
    assert not csv_has_header(path)
    assert _images(path) == 30


def test_the_decision_can_be_forced(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("\n".join(_rows(30)) + "\n")
    assert _images(path, csv_header=False) == 30
    assert _images(path, csv_header=True) == 29  # asked for: the first line is a header


def test_a_header_alone_or_an_empty_file_is_a_clear_error(tmp_path):
    (tmp_path / "h.csv").write_text(HEADERS["names"] + "\n")
    with pytest.raises(DataError, match="has a header and no images"):
        _images(tmp_path / "h.csv")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(DataError, match="is empty"):
        _images(tmp_path / "e.csv")
