"""DownstreamUtility: what the synthetic data is good for, logged to MLflow as ``utility/*``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.evaluation.report import UTILITY_PREFIX, image_utility, log_files, log_metrics, tabular_utility, write_report
from lightning_gpate.evaluation.tabular import SETTINGS
from lightning_gpate.tracking import mlflow_logger_of


class DownstreamUtility(PeriodicEvaluation):
    """Train classifiers on generated data and test them on the DataModule's real test split.

    Tables (PATE-GAN Sec. 5; :func:`lightning_gpate.evaluation.evaluate_tabular`): the 12 classifiers
    with AUROC/AUPRC in Settings A (real→real), B (synthetic→real), C (synthetic→synthetic), the
    ranking agreement between A and C, feature-ranking agreement and the Spearman-correlation gap;
    at the end also the correlation heatmaps and matrices and ``report_final.json`` under the
    artifact folder ``evaluation/``. Images (G-PATE Sec. 5): a CNN trained on labelled generated
    images, its final-epoch and validation-selected test accuracy.

    Generation and evaluation are seeded and never touch the training run's random state.
    Setting A does not depend on the generator: it is computed once and reused.

    Args:
        enabled: ``False`` turns it off.
        every_n_steps: evaluate every N generator steps too (0: only at the end).
        num_samples: generated rows/images (default: the size of the real training split).
        seed: seed of generation, classifiers and splits.
        classifiers: tabular classifier names (default: all 12).
        settings: tabular settings to run.
        reference: real split the tables' distributions are compared with (``test`` or ``train``).
        figures: log the correlation figures at the end.
        cnn_epochs: epochs of the image CNN (default: enough for ~300 steps).
        val_source: image epoch selection on ``"synthetic"`` (held-out generated images) or
            ``"real_val"`` (the real validation split) — never on the test split.
    """

    name = "utility"

    def __init__(
        self,
        *,
        enabled: bool = True,
        every_n_steps: int = 0,
        num_samples: int | None = None,
        seed: int = 0,
        classifiers: Sequence[str] | None = None,
        settings: Sequence[str] = SETTINGS,
        reference: str = "test",
        figures: bool = True,
        cnn_epochs: int | None = None,
        val_source: str = "synthetic",
    ) -> None:
        super().__init__(enabled=enabled, every_n_steps=every_n_steps)
        self.num_samples, self.seed = num_samples, seed
        self.classifiers = list(classifiers) if classifiers is not None else None
        self.settings, self.reference, self.figures = list(settings), reference, figures
        self.cnn_epochs, self.val_source = cnn_epochs, val_source
        self._real_metrics = None
        self.last_metrics: dict[str, float] = {}

    def evaluate(self, trainer, pl_module, *, tag: str, final: bool) -> None:
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ValueError("DownstreamUtility needs the trainer's DataModule (trainer.fit(model, datamodule=...))")
        logger = mlflow_logger_of(trainer)
        client, run_id = logger.experiment, logger.run_id
        if pl_module.data_spec["kind"] == "tabular":
            metrics, synthetic = tabular_utility(
                pl_module, datamodule, num_samples=self.num_samples, seed=self.seed, classifiers=self.classifiers,
                settings=self.settings, reference=self.reference, reuse=self._real_metrics,
            )
            self._real_metrics = metrics
            if final and self.figures:
                from lightning_gpate.evaluation.plots import tabular_figures

                real = datamodule.split_frame(self.reference)
                with tempfile.TemporaryDirectory() as tmp:
                    paths = tabular_figures(real, synthetic, tmp, tag=tag, marginals=False)
                    paths.append(write_report(metrics, Path(tmp) / f"report_{tag}.json", step=trainer.global_step,
                                              settings=self.settings, reference=self.reference))
                    log_files(client, run_id, paths, "evaluation")
        else:
            metrics = image_utility(pl_module, datamodule, num_samples=self.num_samples, epochs=self.cnn_epochs,
                                    val_source=self.val_source, seed=self.seed)
        log_metrics(client, run_id, metrics, prefix=UTILITY_PREFIX, step=trainer.global_step)
        self.last_metrics = metrics
