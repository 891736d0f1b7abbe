"""Progress bars of long non-training work: shown on a terminal, off when asked (or not a terminal)."""

from __future__ import annotations

import io
import sys

import pytorch_lightning as pl
import torch

import lightning_gpate.progress as progress_module
from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.progress import progress, progress_bars


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _drawn(monkeypatch, stream) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    for _ in progress(range(50), desc="work", total=50):
        pass
    return stream.getvalue()


def test_bars_show_on_a_terminal_and_not_elsewhere(monkeypatch):
    assert "work" in _drawn(monkeypatch, _Terminal())
    assert _drawn(monkeypatch, io.StringIO()) == ""  # a log file or a CI pipe


def test_bars_can_be_turned_off(monkeypatch):
    with progress_bars(False):
        assert _drawn(monkeypatch, _Terminal()) == ""
    assert "work" in _drawn(monkeypatch, _Terminal())  # restored after the block


class _Recorder(PeriodicEvaluation):
    def evaluate(self, trainer, pl_module, *, tag, final):
        self.bars = progress_module._enabled


def test_evaluation_follows_the_trainers_progress_bar(tmp_path):
    from lightning_gpate.models import GAN
    from lightning_gpate.tracking import GPATEMLFlowLogger
    from datamodules import ImageDataModule

    for enabled in (True, False):
        dm = ImageDataModule("digits", batch_size=32)
        model = GAN(dm.spec, z_dim=8, gf_dim=8, df_dim=8, fc_dim=16)
        recorder = _Recorder()
        trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=GPATEMLFlowLogger(experiment_name="bars"), callbacks=[recorder],
                             enable_progress_bar=enabled, enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path)
        torch.manual_seed(0)
        trainer.fit(model, dm)
        assert recorder.bars is enabled


# ----------------------------------------------------------------------------- the fit's own progress
class _Trainer:
    """What StepProgress reads of a Trainer."""

    def __init__(self, max_steps: int) -> None:
        self.global_step, self.max_steps, self.max_epochs = 0, max_steps, None
        self.num_training_batches, self.is_global_zero = 1, True


class _Budgeted:
    """What StepProgress reads of a private model: its accountant and budget."""

    def __init__(self, limit: float) -> None:
        from lightning_gpate.privacy import PrivacyAccountant

        self.accountant, self.limit = PrivacyAccountant(delta=1e-5), limit

    def budget_limit(self) -> float:
        return self.limit

    def stop_rule_filters_rdp(self) -> bool:
        return True


def _fit(monkeypatch, module, steps: int, *, seconds_a_step: float, record=None, max_steps: int | None = None) -> list[str]:
    """StepProgress through ``steps`` steps of a fit written to a file (not a terminal), each ``seconds_a_step`` long."""
    import callbacks.progress as step_progress
    from callbacks import StepProgress

    clock = [0.0]
    monkeypatch.setattr(step_progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(step_progress, "stage_seconds", lambda: 0.0)
    stream = io.StringIO()
    bar, trainer = StepProgress(stream=stream), _Trainer(max_steps=max_steps or steps)
    monkeypatch.setattr(bar, "get_metrics", lambda trainer, module: {"epsilon": 1.5, "v_num": 3})
    bar.on_train_start(trainer, module)
    for _ in range(steps):
        clock[0] += seconds_a_step
        if record is not None:
            record()
        trainer.global_step += 1
        bar.on_train_batch_end(trainer, module, None, None, 0)
    bar.on_train_end(trainer, module)
    return stream.getvalue().splitlines()


def test_a_long_fit_written_to_a_file_gets_a_line_a_tenth_and_a_minute(monkeypatch):
    lines = _fit(monkeypatch, object(), 600, seconds_a_step=0.5)  # 5 minutes
    assert 10 <= len(lines) <= 12 and lines[0].startswith("training: 1/600 steps (0%), 0.5 s | epsilon 1.5")
    assert lines[5] == "training: 300/600 steps (50%), 2 min 30 s, about 2 min 30 s left | epsilon 1.5", lines
    assert lines[-1] == "training: 600 steps in 5 min 00 s | epsilon 1.5" and "v_num" not in "".join(lines)
    slow = _fit(monkeypatch, object(), 100, seconds_a_step=30.0)  # 50 minutes: a line a minute at least
    assert 50 <= len(slow) <= 62


def test_the_steps_a_private_fit_will_reach_are_those_its_budget_allows(monkeypatch):
    """The estimate the bar counts towards: the worst case of the steps so far, repeated until the budget is spent,
    against the accountant's own answer step by step."""
    from lightning_gpate.privacy import SubsampledGaussianEvent

    step_event = SubsampledGaussianEvent(noise_multiplier=20.0, sampling_rate=1.0)
    module = _Budgeted(limit=3.0)
    first = [True]

    def record():  # the first step also pays a one-off release, as an anchor or a warm start does
        if first[0]:
            module.accountant.record(SubsampledGaussianEvent(noise_multiplier=2.0, sampling_rate=1.0))
            first[0] = False
        module.accountant.record(step_event)

    lines = _fit(monkeypatch, module, 10, seconds_a_step=1.0, record=record, max_steps=100_000)
    expected = 10
    while module.accountant.epsilon_if(*[step_event] * (expected + 1 - 10)) <= 3.0:
        expected += 1
    assert f"/{expected} steps (10%)" in "\n".join(lines), (expected, lines)
    assert 20 < expected < 10_000  # many steps beyond those taken, few enough to be reached


def test_a_bar_an_error_stopped_is_cleared_before_the_error_s_line(monkeypatch):
    """An image folder's reading stopped by a bad file: the bar's line is cleared, so the one-line error that the
    command line prints next starts a line of its own."""
    from tqdm import tqdm

    from lightning_gpate.progress import close_bars

    stream = _Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        for i in progress(range(50), desc="reading mnist04", total=50, show_count=False):
            if i == 3:
                raise ValueError("a bad image")
    except ValueError:
        pass
    assert "reading mnist04" in stream.getvalue() and "3/50" not in stream.getvalue()  # how many: private
    close_bars()
    assert stream.getvalue().endswith("\r") and not list(tqdm._instances)
