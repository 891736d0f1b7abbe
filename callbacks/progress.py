"""StepProgress: a fit's progress in generator steps, with an estimate of the time left that a user can trust.

Lightning's bar counts epochs, and a private model's epoch is one batch: its bar would start again at every step,
and in a file each redraw is a carriage return. Its time left would come from the mean time of a step, the first
included, where a warm start may run for minutes. This bar counts the fit's steps towards the number it will reach,
and says it in the form the output can take:

* on a terminal, one tqdm bar for the whole fit (stages such as the warm start draw their own below it);
* elsewhere (a file, a pipe), one status line per tenth of the fit and at least one every :data:`STATUS_SECONDS`,
  never a carriage return.

The steps a fit will reach are ``trainer.max_steps``, or fewer where the privacy budget stops it first: estimated
from the worst case of the steps' privacy costs so far (:func:`steps_within_budget`, data-independent), so the
estimate is a function of public settings only. The time left is those steps at the recent pace of a step, the time
spent in stages that show their own progress (:func:`lightning_gpate.progress.stage_seconds`) left out.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ProgressBar

from lightning_gpate.privacy.rdp import rdp_to_epsilon
from lightning_gpate.progress import duration, is_terminal, stage_seconds, status_line

#: Where the output is not a terminal: a status line at least this often, however slow the steps.
STATUS_SECONDS = 60.0
#: ... and one per this fraction of the fit.
STATUS_FRACTION = 0.1
#: Steps whose pace the time left is estimated from.
PACE_WINDOW = 20
#: Metrics the bar leaves out (Lightning's version number of the run).
_HIDDEN_METRICS = ("v_num",)


def steps_within_budget(pl_module, since: tuple[int, np.ndarray] | None, step: int) -> int | None:
    """The generator steps a private model's budget allows in all, if its steps keep costing what they cost since
    ``since`` (a step and the accountant's worst-case RDP curve then): ``None`` where that is not known (a model
    without an accountant, a budget stop on another analysis than the RDP guarantee, no step cost measured yet),
    else ``step`` plus the largest number of such steps whose worst-case ε stays within the budget. The worst case
    is data-independent (every query answered): the estimate reads no private data."""
    accountant = getattr(pl_module, "accountant", None)
    if accountant is None or since is None or step <= since[0] or not pl_module.stop_rule_filters_rdp():
        return None
    now = accountant.rdp_worst_case
    per_step = (now - since[1]) / (step - since[0])
    if not np.any(per_step > 0):
        return None  # post-processing steps: free
    limit = pl_module.budget_limit()

    def fits(k: int) -> bool:
        return rdp_to_epsilon(now + k * per_step, accountant.orders, accountant.delta, conversion=accountant.conversion)[0] <= limit

    low, high = 0, 1
    while fits(high) and high < 10**9:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return step + low


class StepProgress(ProgressBar):
    """The fit's progress in steps (module doc): a bar on a terminal, status lines elsewhere.

    Args:
        stream: where it writes (default: stderr, as tqdm).
    """

    def __init__(self, stream=None) -> None:
        super().__init__()
        self._stream = stream
        self._enabled = True
        self._bar = None
        self._start = 0.0
        self._first_step = 0
        self._pace: deque[tuple[float, int]] = deque(maxlen=PACE_WINDOW)
        self._budget_base: tuple[int, np.ndarray] | None = None
        self._total: int | None = None
        self._estimated_at = -math.inf
        self._last_line = 0.0
        self._next_fraction = STATUS_FRACTION

    # ----------------------------------------------------------------- Lightning's ProgressBar
    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        text = sep.join(map(str, args))
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    # ----------------------------------------------------------------- the fit
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._last_line = time.monotonic()
        self._first_step = trainer.global_step
        self._pace.clear()
        self._pace.append((self._active_seconds(), trainer.global_step))
        self._budget_base, self._total, self._estimated_at = None, None, -math.inf
        self._next_fraction = STATUS_FRACTION
        if self._enabled and trainer.is_global_zero and is_terminal(self.stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self._max_steps(trainer), initial=trainer.global_step, desc="training", unit="step",
                             dynamic_ncols=True, leave=True, file=self.stream, smoothing=0,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}{postfix}]")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self._budget_base is None and step > self._first_step and hasattr(pl_module, "accountant"):
            # the first step pays what comes once (metadata, an anchor, a warm start): the steps' cost is measured after it
            self._budget_base = (step, pl_module.accountant.rdp_worst_case)
        if step == self._first_step + 1 and self._pace[-1][1] == self._first_step:
            self._pace.clear()  # the first step also measures and releases what is paid once: its time is no pace
        if not self._pace or step != self._pace[-1][1]:
            self._pace.append((self._active_seconds(), step))
        if not self._enabled or not trainer.is_global_zero:
            return
        total = self._estimated_total(trainer, pl_module, step)
        left = self._seconds_left(step, total)
        metrics = self._metrics_text(trainer, pl_module)
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = step
            eta = f"about {duration(left)} left" if left is not None and step < total else ""  # tqdm writes ", " before
            self._bar.set_postfix_str(" | ".join(p for p in (eta, metrics) if p), refresh=True)
            return
        now = time.monotonic()
        fraction = step / total if total else 0.0
        if step >= (total or math.inf):
            return  # the last step: on_train_end's line says it
        if now - self._last_line >= STATUS_SECONDS or fraction >= self._next_fraction or step == self._first_step + 1:
            while self._next_fraction <= fraction:
                self._next_fraction += STATUS_FRACTION
            self._line(status_line("training", step, total, "step", now - self._start, left) + (f" | {metrics}" if metrics else ""))
            self._last_line = now

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.total = max(self._bar.n, 1)
            self._bar.set_postfix_str(self._metrics_text(trainer, pl_module), refresh=True)
            self._bar.close()
            self._bar = None
        elif self._enabled and trainer.is_global_zero and trainer.global_step > self._first_step:  # else the summary says
            metrics = self._metrics_text(trainer, pl_module)
            self._line(f"training: {trainer.global_step - self._first_step:,} steps in {duration(time.monotonic() - self._start)}"
                       + (f" | {metrics}" if metrics else ""))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._bar is not None:  # the error's line starts on a line of its own
            self._bar.close()
            self._bar = None

    # ----------------------------------------------------------------- estimates
    def _active_seconds(self) -> float:
        """Seconds of the fit so far, less those of stages that show their own progress."""
        return time.monotonic() - stage_seconds()

    @staticmethod
    def _max_steps(trainer: pl.Trainer) -> int | None:
        if trainer.max_steps and trainer.max_steps > 0:
            return int(trainer.max_steps)
        batches, epochs = trainer.num_training_batches, trainer.max_epochs
        if epochs is not None and epochs > 0 and math.isfinite(batches):
            return int(batches * epochs)
        return None

    def _estimated_total(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> int | None:
        """The steps the fit will reach: max_steps, or fewer where the budget allows fewer (re-estimated at most every
        few seconds: each estimate converts a few RDP curves)."""
        now = time.monotonic()
        if now - self._estimated_at >= 2.0 or self._total is None:
            self._estimated_at = now
            most = self._max_steps(trainer)
            budget = steps_within_budget(pl_module, self._budget_base, step)
            self._total = min(t for t in (most, budget) if t is not None) if (most or budget) else None
        return None if self._total is None else max(self._total, step)

    def _seconds_left(self, step: int, total: int | None) -> float | None:
        """The steps left at the pace of the last :data:`PACE_WINDOW` steps."""
        if total is None or len(self._pace) < 2:
            return None
        (t0, s0), (t1, s1) = self._pace[0], self._pace[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return (total - step) * (t1 - t0) / (s1 - s0)

    def _metrics_text(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> str:
        metrics = self.get_metrics(trainer, pl_module)
        return ", ".join(f"{k} {_number(v)}" for k, v in metrics.items() if k not in _HIDDEN_METRICS)

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def _number(value: Any) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)
