"""Progress bars of long work outside the training loop (evaluation classifiers, IS/FID, sampling).

One switch for all of them: bars show on a terminal (tqdm's own check: quiet when stderr is not a
TTY, e.g. in CI logs or a file) unless they are turned off with :func:`progress_bars` — the evaluation
callbacks turn them off when the Trainer has no progress bar (``--trainer.enable_progress_bar false``).
They run on global rank 0 only, where that work runs.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

_enabled = True


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Turn the bars of :func:`progress` on (where stderr is a terminal) or off inside the block."""
    global _enabled
    before, _enabled = _enabled, bool(enabled)
    try:
        yield
    finally:
        _enabled = before


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """``iterable`` with a transient tqdm bar (removed when done), unless bars are off."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True,
                disable=None if _enabled else True)
