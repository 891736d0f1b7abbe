"""SampleLogger: image grids (one labelled row per class, and one grid per class) or sample tables and
their marginals against real data, as MLflow artifacts."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.privacy.disclosure import is_private
from lightning_gpate.sampling import image_grid, load_reference, samples_to_frame, save_png
from lightning_gpate.tracking import mlflow_logger_of


class SampleLogger(PeriodicEvaluation):
    """Log generated samples to the MLflow run every ``every_n_steps`` steps and at the end of fitting.

    Artifacts (``<tag>`` is ``step000100`` … or ``final``):

    * images: ``samples/samples_<tag>.png`` (one row of ``per_class`` samples per class, its name at
      the row's start, small images enlarged to at least 48 pixels); at the end also
      ``samples_per_class/class_<i>_<name>.png`` (a ``per_class_grid_size``² grid per class). Real
      images of the same classes are drawn beside the samples for a non-private model (its real test
      split) or from ``reference``; a private model's grids never show its real data.
    * tables: ``samples/samples_<tag>.csv`` (``num_samples`` rows in the original schema) and
      ``plots/marginals_<tag>.png`` (each column's distribution, synthetic vs the real test split).

    Args:
        num_samples: rows in a logged table (and in its marginal plot).
        per_class: images per class (row) in the grid.
        every_n_steps: 0 logs only at the end.
        seed: seed of the latent draws (the same latents every time, so grids are comparable).
        per_class_grids: log one larger grid per class at the end.
        per_class_grid_size: side of a per-class grid (its images: the square of it).
        marginals: log the tables' marginal plots.
        reference: an ``.npz`` of images (``images`` in the dataset's range, ``labels``: what
            ``lightning-gpate sample`` writes) that you declare public, drawn beside the samples.
        enabled: ``False`` turns it off.
    """

    name = "samples"

    def __init__(
        self,
        num_samples: int = 200,
        per_class: int = 10,
        every_n_steps: int = 0,
        seed: int = 1234,
        *,
        per_class_grids: bool = True,
        per_class_grid_size: int = 8,
        marginals: bool = True,
        reference: str | None = None,
        enabled: bool = True,
    ) -> None:
        super().__init__(enabled=enabled, every_n_steps=every_n_steps)
        self.num_samples, self.per_class, self.seed = num_samples, per_class, seed
        self.per_class_grids, self.per_class_grid_size, self.marginals = per_class_grids, per_class_grid_size, marginals
        self.reference = reference

    def _reference_images(self, trainer: pl.Trainer, pl_module) -> tuple[Any, str]:
        """The real images drawn beside the samples, and their header: the given public reference,
        else a non-private model's real test split, else none."""
        if self.reference is not None:
            return load_reference(self.reference, pl_module.data_spec), f"reference ({Path(self.reference).name})"
        datamodule = trainer.datamodule
        if is_private(pl_module) or datamodule is None or not hasattr(datamodule, "model_space"):
            return None, ""
        x, y = datamodule.model_space("test")
        return ((x, y), "real (test split)") if len(y) else (None, "")

    def evaluate(self, trainer: pl.Trainer, pl_module, *, tag: str, final: bool) -> None:
        import torch

        logger = mlflow_logger_of(trainer)
        client, run_id = logger.experiment, logger.run_id
        spec = pl_module.data_spec
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            if spec["kind"] == "image":
                labels = torch.arange(spec["num_classes"]).repeat_interleave(self.per_class)
                x, y = pl_module.generate(len(labels), labels=labels, seed=self.seed)
                path = tmp / f"samples_{tag}.png"
                reference, title = self._reference_images(trainer, pl_module)
                save_png(image_grid(x, y, spec["class_names"], self.per_class, reference=reference, reference_title=title), path)
                client.log_artifact(run_id, str(path), "samples")
                if final and self.per_class_grids:
                    self._log_class_grids(client, run_id, pl_module, tmp)
            else:
                x, y = pl_module.generate(self.num_samples, seed=self.seed)
                frame = samples_to_frame(spec, x, y)
                path = tmp / f"samples_{tag}.csv"
                frame.to_csv(path, index=False)
                client.log_artifact(run_id, str(path), "samples")
                real = _real_test_frame(trainer.datamodule)
                if self.marginals and real is not None:
                    from lightning_gpate.evaluation.plots import marginal_plot

                    client.log_artifact(run_id, str(marginal_plot(real, frame, tmp / f"marginals_{tag}.png")), "plots")

    def _log_class_grids(self, client, run_id: str, pl_module, tmp: Path) -> None:
        import torch

        spec, side = pl_module.data_spec, self.per_class_grid_size
        for c, name in enumerate(spec["class_names"]):
            labels = torch.full((side * side,), c, dtype=torch.long)
            x, _ = pl_module.generate(len(labels), labels=labels, seed=self.seed + c)
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))[:40]
            path = tmp / f"class_{c}_{safe}.png"
            save_png(image_grid(x, labels, spec["class_names"], side, classes=[c], rows_per_class=side), path)
            client.log_artifact(run_id, str(path), "samples_per_class")


def _real_test_frame(datamodule):
    """The DataModule's real test rows (original schema), or None where there are none."""
    if datamodule is None or not hasattr(datamodule, "split_frame"):
        return None
    frame = datamodule.split_frame("test")
    return frame if len(frame) else None
