"""What a run prints while it works: the progress of long stages (warm start, evaluation classifiers, IS/FID,
sampling), and none of the known noise.

One switch for all of them: on a terminal (stderr a TTY) a stage shows a tqdm bar, removed when done; where stderr
is a file or a pipe (``> fit.log``, CI logs) it writes a status line at most every :data:`STATUS_SECONDS` seconds,
with what is done and an estimate of the time left, and a last line if it wrote any, never a carriage return. Both
are off inside :func:`progress_bars` ``(False)`` — the evaluation callbacks turn them off when the Trainer has no
progress bar (``--trainer.enable_progress_bar false``). They run on global rank 0 only, where that work runs.

The time spent in stages is counted (:func:`stage_seconds`): the training's own progress
(:class:`callbacks.StepProgress`) leaves it out of its rate, so a warm start inside the first step does not make
the estimate of the steps' time hours long.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
import warnings
from contextlib import contextmanager
from typing import Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")

#: Where stderr is not a terminal: a stage's first status line once it has run this long, then one this often.
FIRST_STATUS_SECONDS = 5.0
STATUS_SECONDS = 30.0

_enabled = True
_stage_seconds = 0.0  # finished stages' time
_stage_started: list[float] = []  # the running stages' start times (nested: the outermost counts)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Turn the bars and status lines of :func:`progress` on or off inside the block."""
    global _enabled
    before, _enabled = _enabled, bool(enabled)
    try:
        yield
    finally:
        _enabled = before


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stderr by default) is a terminal: bars there, status lines elsewhere."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False


def stage_seconds() -> float:
    """Seconds spent in :func:`progress` stages so far in this process, the running one included."""
    running = time.monotonic() - _stage_started[0] if _stage_started else 0.0
    return _stage_seconds + running


def duration(seconds: float) -> str:
    """``4.2 s``, ``1 min 05 s``, ``2 h 03 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def status_line(what: str, done: int, total: int | None, unit: str, elapsed: float, left: float | None, *,
                show_count: bool = True) -> str:
    """One status line: ``warm start: 500/2,000 steps (25%), 20.0 s, about 1 min 00 s left`` (without the counts
    where they are private: ``reading digits: 25%, ...``)."""
    if not show_count:
        count = f"{100 * done / total:.0f}%" if total else "working"
    else:
        count = f"{done:,}/{total:,} {unit}s ({100 * done / total:.0f}%)" if total else f"{done:,} {unit}s"
    eta = f", about {duration(left)} left" if left is not None and math.isfinite(left) else ""
    return f"{what}: {count}, {duration(elapsed)}{eta}"


def _timed(iterable: Iterable[T]) -> Iterator[T]:
    """``iterable``, its time counted in :func:`stage_seconds` (the outermost stage only)."""
    global _stage_seconds
    _stage_started.append(time.monotonic())
    try:
        yield from iterable
    finally:
        start = _stage_started.pop()
        if not _stage_started:
            _stage_seconds += time.monotonic() - start


def _status_lines(iterable: Iterable[T], *, desc: str, total: int | None, unit: str, stream: TextIO,
                  show_count: bool) -> Iterator[T]:
    """``iterable`` with a status line after :data:`FIRST_STATUS_SECONDS`, then every :data:`STATUS_SECONDS`, and a
    last one if any was written."""
    start = time.monotonic()
    done, wrote, wait = 0, False, FIRST_STATUS_SECONDS
    last = start
    for item in iterable:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= wait and (total is None or done < total):
            left = (total - done) * (now - start) / done if total else None
            print(status_line(desc, done, total, unit, now - start, left, show_count=show_count), file=stream, flush=True)
            last, wrote, wait = now, True, STATUS_SECONDS
    if wrote:
        what = f"{done:,} {unit}s" if show_count else "done"
        print(f"{desc}: {what} in {duration(time.monotonic() - start)}", file=stream, flush=True)


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it",
             show_count: bool = True) -> Iterable[T]:
    """``iterable`` with its progress shown: a transient tqdm bar on a terminal, status lines elsewhere (module
    doc), nothing when turned off. Its time counts in :func:`stage_seconds` either way. ``show_count=False`` shows
    a percentage only: where how many there are is private (the images of a private folder)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if not _enabled:
        shown: Iterable[T] = iterable
    elif is_terminal():
        from tqdm.auto import tqdm

        shown = tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True,
                     **({} if show_count else {"bar_format": "{desc}: {percentage:3.0f}% {elapsed}"}))
    else:
        shown = _status_lines(iterable, desc=desc, total=total, unit=unit, stream=sys.stderr, show_count=show_count)
    return _timed(shown)


def close_bars() -> None:
    """Close every bar still drawn (an error stopped its loop), so that the next line starts on a line of its own."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


# ----------------------------------------------------------------------------- known noise
#: Warnings Lightning and torch give about what this project does on purpose, by the start of their message, with
#: why each is harmless here.
HARMLESS_WARNINGS = (
    # the DataModules' iterable datasets know their length (an epoch's batches) and load in the main process
    # (num_workers 0): the duplication it warns of needs several workers
    "Your `IterableDataset` has `__len__` defined",
    # a private model's epoch is one batch (the whole split, or one Poisson batch): Lightning counts the logging
    # interval over batches, across epochs, so every tenth step is logged all the same
    "The number of training batches",
    # LightningCLI's seed_everything without a seed: the next line, "Seed set to 0", says the same
    "No seed found, seed set to",
    # Lightning 2.6's own pytree helper on torch 2.9+: its deprecation is theirs to follow, not the user's
    "`isinstance(treespec, LeafSpec)` is deprecated",
)
#: Lightning's advertisement printed at every fit.
_LIGHTNING_TIP = "💡 Tip:"


class _DropTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_LIGHTNING_TIP)


def quiet_known_noise() -> None:
    """Silence what every fit printed that says nothing about this run: :data:`HARMLESS_WARNINGS`, Lightning's
    tip to install another logger, MLflow's notes on creating its database. Idempotent; everything else is kept."""
    for message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message))
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTip) for f in logger.filters):
            logger.addFilter(_DropTip())
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
