"""DownstreamUtility: what the synthetic data is good for, logged to MLflow as ``utility/*``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.evaluation.report import (PRIVATE_PREFIX, UTILITY_PREFIX, image_utility, is_private, log_files, log_metrics,
                                               real_baselines_allowed, split_private, tabular_utility, uses_training_split,
                                               write_report)
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

    A **private** model's evaluation logs nothing computed from the real training split without
    noise: Setting A and the ranking agreements with it are left out unless ``real_baselines`` (or
    the model's ``log_private_diagnostics``) asks for them, and then they are logged under
    ``private/utility/*``; the generated sample has the size of the real test split (the training
    split's size is a private count), and distributions are compared with the test split only.
    Settings B and C and the CNN (trained on generated images) read the training split not at all.

    Args:
        enabled: ``False`` turns it off.
        every_n_steps: evaluate every N generator steps too (0: only at the end).
        num_samples: generated rows/images (default: the test split's size for a private model, else the training
            split's). A private model's training split has a private size, which the logged count would disclose.
        seed: seed of generation, classifiers and splits.
        classifiers: tabular classifier names (default: all 12).
        settings: tabular settings to run.
        reference: real split the tables' distributions are compared with (``test`` or ``train``;
            ``train`` for a private model only with ``real_baselines``, then logged as private).
        figures: log the correlation figures at the end.
        cnn_epochs: epochs of the image CNN (default: enough for ~300 steps).
        val_source: image epoch selection on ``"synthetic"`` (held-out generated images) or
            ``"real_val"`` (the real validation split) — never on the test split.
        real_baselines: compute what needs the real training split (tables: Setting A, ranking
            agreements A/B and A/C). ``None`` (default): yes for non-private models; for private ones
            only with ``log_private_diagnostics: true``. A private model's are logged under
            ``private/utility/*`` (unnoised functions of the private data: never for shared logs).
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
        real_baselines: bool | None = None,
    ) -> None:
        super().__init__(enabled=enabled, every_n_steps=every_n_steps)
        self.num_samples, self.seed = num_samples, seed
        self.classifiers = list(classifiers) if classifiers is not None else None
        self.settings, self.reference, self.figures = list(settings), reference, figures
        self.cnn_epochs, self.val_source = cnn_epochs, val_source
        self.real_baselines = real_baselines
        self._real_metrics = None
        self.last_metrics: dict[str, float] = {}
        #: A private model's figures computed from its real training split (logged under ``private/utility/``).
        self.private_metrics: dict[str, float] = {}

    def evaluate(self, trainer, pl_module, *, tag: str, final: bool) -> None:
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ValueError("DownstreamUtility needs the trainer's DataModule (trainer.fit(model, datamodule=...))")
        logger = mlflow_logger_of(trainer)
        client, run_id = logger.experiment, logger.run_id
        allowed = real_baselines_allowed(pl_module, self.real_baselines)
        private_reference = is_private(pl_module) and self.reference == "train"
        if private_reference and not allowed:
            raise ValueError("reference: train compares the synthetic table with the private training split without noise: "
                             "use reference: test for a private model (or opt in with real_baselines: true, logged as private)")
        if pl_module.data_spec["kind"] == "tabular":
            settings = [s for s in self.settings if allowed or s.upper() != "A"]
            metrics, synthetic = tabular_utility(
                pl_module, datamodule, num_samples=self.num_samples, seed=self.seed, classifiers=self.classifiers,
                settings=settings, reference=self.reference, reuse=self._real_metrics,
            )
            self._real_metrics = metrics
            metrics, private = split_private(pl_module, metrics, lambda k: private_reference or uses_training_split(k))
            if final and self.figures and not private_reference:
                from lightning_gpate.evaluation.plots import tabular_figures

                real = datamodule.split_frame(self.reference)
                with tempfile.TemporaryDirectory() as tmp:
                    paths = tabular_figures(real, synthetic, tmp, tag=tag, marginals=False)
                    report = {**metrics, **{PRIVATE_PREFIX + k: v for k, v in private.items()}}
                    paths.append(write_report(report, Path(tmp) / f"report_{tag}.json", step=trainer.global_step,
                                              settings=settings, reference=self.reference))
                    log_files(client, run_id, paths, "evaluation")
        else:
            metrics, private = image_utility(pl_module, datamodule, num_samples=self.num_samples, epochs=self.cnn_epochs,
                                             val_source=self.val_source, seed=self.seed), {}
        log_metrics(client, run_id, metrics, prefix=UTILITY_PREFIX, step=trainer.global_step)
        log_metrics(client, run_id, private, prefix=PRIVATE_PREFIX + UTILITY_PREFIX, step=trainer.global_step)
        self.last_metrics, self.private_metrics = metrics, private
