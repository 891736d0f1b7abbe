"""Files the project writes: whole or not at all, with the permissions their use calls for.

What a run releases (the release artifact, samples, their pictures, a folder of sampled images) is meant to be shared:
it gets the permissions of any file the user creates (``0666`` or ``0777`` less the umask, ``-rw-r--r--`` under the
usual ``022``), although it is written under a temporary name first and renamed (``tempfile`` creates those
owner-only). What holds private state (training checkpoints) lives in an owner-only folder whatever the umask.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

#: Permissions of a private folder: the owner's only.
OWNER_ONLY_FOLDER = 0o700
OWNER_ONLY_FILE = 0o600


def umask() -> int:
    """The process's umask, read without changing it where the OS says it (Linux), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def shared_mode(*, folder: bool = False) -> int:
    """The permissions the user's umask gives a new file (``0666``) or folder (``0777``)."""
    return (0o777 if folder else 0o666) & ~umask()


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(temporary path)``, then the file renamed to ``path`` with the user's permissions (:func:`shared_mode`):
    a reader never sees half a file, and a failure leaves none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)  # savez and savefig read it
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, shared_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def folder_atomically(output: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``output`` to fill; renamed to ``output`` (which must not exist, or be empty) with the
    user's permissions when the block ends, removed if it fails."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}."))
    try:
        yield tmp
        os.chmod(tmp, shared_mode(folder=True))
        if output.is_dir():
            output.rmdir()  # empty: replaced by the written folder
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def owner_only_folder(path: str | Path, *, root: str | Path) -> Path:
    """``path`` (inside ``root``) created if need be, it and every folder from ``root`` down to it owner-only
    (:data:`OWNER_ONLY_FOLDER`): nothing written inside is readable by another user, whatever its own mode."""
    path, root = Path(path), Path(root)
    path.mkdir(parents=True, exist_ok=True, mode=OWNER_ONLY_FOLDER)
    for folder in [path, *path.relative_to(root).parents]:
        target = folder if folder is path else root / folder
        if os.stat(target).st_mode & 0o777 != OWNER_ONLY_FOLDER:
            os.chmod(target, OWNER_ONLY_FOLDER)
    return path
