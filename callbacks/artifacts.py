"""Run artifacts in MLflow: the resolved config and the final checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.cli import SaveConfigCallback

from lightning_gpate.tracking import mlflow_logger_of


class MLflowSaveConfig(SaveConfigCallback):
    """Store the resolved LightningCLI config as ``config.yaml`` in the MLflow run."""

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        text = self.parser.dump(self.config, skip_none=False)
        logger.experiment.log_text(logger.run_id, text, "config.yaml")


MLFLOW_RUN_KEY = "mlflow_run"


class FinalCheckpoint(pl.Callback):
    """Save the final checkpoint at the end of training and attach it to the MLflow run
    (artifact ``checkpoints/final.ckpt``); the run gets a ``final_checkpoint`` tag with its path,
    also kept as :attr:`release_path` (what the end-of-fit summary prints).
    Every checkpoint saved while it is active records its MLflow run (``checkpoint["mlflow_run"]``:
    ``run_id``, ``experiment_id``, ``tracking_uri``) so ``lightning-gpate evaluate`` can report back to it.

    The save happens at ``on_train_end`` on every rank (it is a collective under DDP: teacher
    models gather their teachers), so it precedes the rank-0-only evaluation of ``on_fit_end``.
    """

    def __init__(self) -> None:
        self.release_path: str | None = None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is not None and logger.run_id is not None:
            checkpoint[MLFLOW_RUN_KEY] = {
                "run_id": logger.run_id, "experiment_id": logger.experiment_id,
                "tracking_uri": getattr(logger, "_tracking_uri", None),
            }

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger = mlflow_logger_of(trainer)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "final.ckpt"
            trainer.save_checkpoint(path)  # collective under DDP: every rank calls it
            if logger is None or trainer.global_rank != 0:
                return
            logger.experiment.log_artifact(logger.run_id, str(path), "checkpoints")
        run = logger.experiment.get_run(logger.run_id)
        uri = f"{run.info.artifact_uri}/checkpoints/final.ckpt"
        local = uri[len("file://"):] if uri.startswith("file://") else uri
        logger.experiment.set_tag(logger.run_id, "final_checkpoint", local)
        self.release_path = local
