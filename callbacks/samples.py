"""SampleLogger: image grids (one row per class) or sample tables, as MLflow artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytorch_lightning as pl

from lightning_gpate.sampling import image_grid, samples_to_frame, save_png
from lightning_gpate.tracking import mlflow_logger_of


class SampleLogger(pl.Callback):
    """Log generated samples to the MLflow run every ``every_n_steps`` steps and at the end of fitting.

    Args:
        num_samples: rows in a logged table (images: ``per_class`` per class in the grid).
        per_class: images per class (row) in a grid.
        every_n_steps: 0 logs only at the end.
        seed: seed of the latent draws (the same latents every time, so grids are comparable).
    """

    def __init__(self, num_samples: int = 200, per_class: int = 10, every_n_steps: int = 0, seed: int = 1234) -> None:
        self.num_samples, self.per_class, self.every_n_steps, self.seed = num_samples, per_class, every_n_steps, seed

    def _log(self, trainer: pl.Trainer, pl_module, tag: str) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        spec = pl_module.data_spec
        with tempfile.TemporaryDirectory() as tmp:
            if spec["kind"] == "image":
                import torch

                labels = torch.arange(spec["num_classes"]).repeat_interleave(self.per_class)
                x, y = pl_module.generate(len(labels), labels=labels, seed=self.seed)
                path = Path(tmp) / f"samples_{tag}.png"
                save_png(image_grid(x, y, spec["num_classes"], self.per_class), path)
            else:
                x, y = pl_module.generate(self.num_samples, seed=self.seed)
                path = Path(tmp) / f"samples_{tag}.csv"
                samples_to_frame(spec, x, y).to_csv(path, index=False)
            logger.experiment.log_artifact(logger.run_id, str(path), "samples")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0:
            self._log(trainer, pl_module, f"step{step:06d}")

    def on_fit_end(self, trainer, pl_module) -> None:
        self._log(trainer, pl_module, "final")
