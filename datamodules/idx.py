"""The IDX files of MNIST and Fashion-MNIST, read without torchvision (LeCun et al., "The MNIST database").

An IDX file is a big-endian header — two zero bytes, a type code (``0x08``: unsigned bytes, the
only type these data sets use), the number of dimensions, then one 32-bit size per dimension — and
the values, row-major. MNIST ships four of them, gzip-compressed; torchvision's ``MNIST/raw`` folder
holds them (and, after a download, their decompressed copies) under the same names.

Every file is checked before any run starts: its MD5 against the published checksum when one is
known (:data:`KNOWN_MD5`; gzip or decompressed), its header (type, dimensions) and that its size is
exactly what the header announces. A corrupt, truncated or foreign file is one line of
:class:`~datamodules.base.DataError`, never a crash in the middle of training.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path

import numpy as np

from datamodules.base import DataError

#: The four files of a data set: split → (images file, labels file), without ``.gz``.
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
#: torchvision's folder of the raw files under its ``root``, per data set.
TORCHVISION_RAW = {"mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw"}
#: Official (split → images, labels) sizes; a file with other sizes is read, and the sizes are reported.
OFFICIAL_SIZES = {"train": 60_000, "test": 10_000}

#: MD5 of the published files, per data set and file name. The ``.gz`` values are the published
#: checksums (those torchvision verifies on download); MNIST's decompressed values are the MD5s of
#: those same files decompressed (computed from the verified ``.gz``), so both forms are checked.
KNOWN_MD5 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}

_UBYTE = 0x08
_GZIP_MAGIC = b"\x1f\x8b"


def md5_of(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(path: str | Path, expected: str) -> None:
    """Raise :class:`DataError` when ``path``'s MD5 is not ``expected``."""
    actual = md5_of(path)
    if actual != expected:
        raise DataError(
            f"{path}: its MD5 is not the published {expected}: the file is corrupt, truncated or not the "
            f"official one; download it again (data.download: true), or set data.verify_checksums: false to read "
            f"it anyway (its header and size are still checked)"
        )


def _raw_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] != _GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
        raise DataError(f"{path}: not a readable gzip file ({err}): it is corrupt or truncated; download it again") from err


def parse_idx(data: bytes, *, name: str = "IDX data", ndim: int | None = None) -> np.ndarray:
    """The array of an IDX file's bytes (uint8 values only).

    Args:
        data: the whole (decompressed) file.
        name: what error messages call it.
        ndim: the number of dimensions it must have (``None``: any).

    Raises:
        DataError: a bad magic number, another value type, the wrong number of dimensions, or a
            size that is not the header's (truncated or with trailing bytes).
    """
    if len(data) < 4:
        raise DataError(f"{name}: too short for an IDX header (4 bytes, then the sizes): truncated?")
    zero, kind, dims = data[:2], data[2], data[3]
    if zero != b"\x00\x00":
        raise DataError(f"{name}: not an IDX file (it starts with {data[:4].hex()}, not 0000 then the type and dimensions)")
    if kind != _UBYTE:
        raise DataError(f"{name}: IDX value type 0x{kind:02x} is not 0x08 (unsigned bytes), the type of MNIST's files")
    if ndim is not None and dims != ndim:
        raise DataError(f"{name}: {dims} dimensions in its header, expected {ndim} "
                        f"({'images: count, rows, columns' if ndim == 3 else 'labels: count'})")
    header = 4 + 4 * dims
    if len(data) < header:
        raise DataError(f"{name}: the header announces {dims} dimensions but the file ends inside the header: truncated")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=dims, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        # Neither the sizes nor the file's length: the record count is private (issue 20, finding 9).
        raise DataError(f"{name}: the file is {'shorter' if len(data) < expected else 'longer'} than the sizes in its "
                        f"header say: it {what}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx(path: str | Path, *, ndim: int | None = None, md5: str | None = None) -> np.ndarray:
    """Read one IDX file (gzip-compressed or not, detected from its first bytes).

    Args:
        path: the file.
        ndim: the number of dimensions it must have.
        md5: its expected MD5 (of the file as stored), checked first; ``None``: not checked.
    """
    path = Path(path)
    if md5 is not None:
        check_md5(path, md5)
    return parse_idx(_raw_bytes(path), name=str(path), ndim=ndim)


def find_idx_files(root: str | Path, dataset: str) -> dict[str, Path] | None:
    """The four IDX files of ``dataset`` in ``root`` (the folder holding them) or in torchvision's
    layout under it (``root/MNIST/raw``), the ``.gz`` preferred where both exist; ``None`` when
    none is there. Raises :class:`DataError` when only some are."""
    root = Path(root)
    names = [n for pair in IDX_FILES.values() for n in pair]
    for folder in (root, root / TORCHVISION_RAW[dataset]):
        found = {}
        for name in names:
            for candidate in (folder / f"{name}.gz", folder / name):
                if candidate.is_file():
                    found[name] = candidate
                    break
        if len(found) == len(names):
            return found
        if found:
            missing = [n for n in names if n not in found]
            raise DataError(f"{folder.resolve()} holds {len(found)} of the 4 {dataset} IDX files; missing: {', '.join(missing)} (.gz or not)")
    return None


def load_idx_splits(root: str | Path, dataset: str, *, num_classes: int = 10, verify_checksums: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The official splits of MNIST or Fashion-MNIST from their IDX files: ``{"train": (images
    [n, 28, 28] uint8, labels [n] uint8), "test": (...)}``.

    Raises:
        DataError: files missing (``None`` is never returned), a checksum, header or size wrong,
            images and labels of different counts, or a label outside ``0..num_classes-1``.
    """
    files = find_idx_files(root, dataset)
    if files is None:
        raise DataError(f"no {dataset} IDX files in {Path(root).resolve()} (nor under {TORCHVISION_RAW[dataset]}/ there)")
    known = KNOWN_MD5.get(dataset, {}) if verify_checksums else {}
    splits = {}
    for split, (images_name, labels_name) in IDX_FILES.items():
        images_path, labels_path = files[images_name], files[labels_name]
        images = read_idx(images_path, ndim=3, md5=known.get(images_path.name))
        labels = read_idx(labels_path, ndim=1, md5=known.get(labels_path.name))
        if len(images) != len(labels):
            raise DataError(f"{images_path.name} and {labels_path.name} hold different numbers of records")  # counts: private
        if len(labels) and int(labels.max()) >= num_classes:
            raise DataError(f"{labels_path}: some labels are not one of the {num_classes} classes 0..{num_classes - 1}")
        splits[split] = (images, labels)
    return splits
