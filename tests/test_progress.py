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
