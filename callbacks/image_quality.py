"""ImageQuality: Inception Score and FID of generated images, logged to MLflow as ``quality/*``."""

from __future__ import annotations

import warnings

from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.evaluation.image import FeatureNetUnavailable, ImageQualityEvaluator
from lightning_gpate.evaluation.report import QUALITY_PREFIX, generated_images, image_quality_evaluator, log_metrics
from lightning_gpate.tracking import mlflow_logger_of


class ImageQuality(PeriodicEvaluation):
    """IS and FID (:class:`lightning_gpate.evaluation.image.ImageQualityEvaluator`) of generated images
    against the DataModule's real ``reference`` split.

    Grey (MNIST-like) images use a CNN classifier trained once on the real training split as the
    feature network; RGB images use Inception-v3 when its weights are on disk — otherwise a message
    says how to provide them, the run is tagged ``quality/skipped``, and training goes on. Logged
    once: the real data's own figures (``quality/inception_score_real``,
    ``quality/fid_real_train_vs_reference``, ``quality/feature_net_test_accuracy``) so a generated
    figure can be read against them; every evaluation: ``quality/inception_score``,
    ``quality/inception_score_std``, ``quality/fid``. Tables are not evaluated here.

    Args:
        enabled: ``False`` turns it off.
        every_n_steps: evaluate every N generator steps too (0: only at the end).
        num_samples: generated images (default: the size of the reference split).
        feature_net: ``"auto"``, ``"classifier"`` or ``"inception"``.
        inception_weights: path of torchvision Inception-v3 weights (default: the torch hub cache).
        feature_epochs: epochs of the feature classifier (default: enough for ~300 steps).
        splits: Inception Score splits (fewer when a split would hold under 250 images).
        seed: seed of generation and of the feature classifier.
        cache_dir: folder to keep trained feature classifiers in across processes.
        reference: the real split compared with (``test`` or ``val``).
    """

    name = "quality"

    def __init__(
        self,
        *,
        enabled: bool = True,
        every_n_steps: int = 0,
        num_samples: int | None = None,
        feature_net: str = "auto",
        inception_weights: str | None = None,
        feature_epochs: int | None = None,
        splits: int = 10,
        seed: int = 0,
        cache_dir: str | None = None,
        reference: str = "test",
    ) -> None:
        super().__init__(enabled=enabled, every_n_steps=every_n_steps)
        self.num_samples, self.feature_net, self.inception_weights = num_samples, feature_net, inception_weights
        self.feature_epochs, self.splits, self.seed, self.cache_dir, self.reference = feature_epochs, splits, seed, cache_dir, reference
        self._evaluator: ImageQualityEvaluator | None = None
        self._skipped: str | None = None
        self.last_metrics: dict[str, float] = {}
        self.real_metrics: dict[str, float] = {}

    def evaluate(self, trainer, pl_module, *, tag: str, final: bool) -> None:
        if pl_module.data_spec["kind"] != "image" or self._skipped:
            return
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ValueError("ImageQuality needs the trainer's DataModule (trainer.fit(model, datamodule=...))")
        logger = mlflow_logger_of(trainer)
        client, run_id = logger.experiment, logger.run_id
        if self._evaluator is None:
            try:
                self._evaluator = image_quality_evaluator(
                    datamodule, pl_module.num_classes, feature_net=self.feature_net, inception_weights=self.inception_weights,
                    epochs=self.feature_epochs, seed=self.seed, cache_dir=self.cache_dir, splits=self.splits, reference=self.reference,
                ).to(pl_module.device)
            except FeatureNetUnavailable as err:
                self._skipped = str(err)
                warnings.warn(self._skipped, stacklevel=2)
                client.set_tag(run_id, "quality/skipped", self._skipped[:5000])
                return
            self.real_metrics = self._evaluator.real_baseline()
            log_metrics(client, run_id, self.real_metrics, prefix=QUALITY_PREFIX, step=trainer.global_step)
        n = self.num_samples or len(self._evaluator.reference)
        metrics = self._evaluator.score(generated_images(pl_module, n, seed=self.seed))
        log_metrics(client, run_id, metrics, prefix=QUALITY_PREFIX, step=trainer.global_step)
        self.last_metrics = metrics

