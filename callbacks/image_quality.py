"""ImageQuality: Inception Score and FID of generated images, logged to MLflow as ``quality/*``."""

from __future__ import annotations

import warnings

from callbacks.periodic import PeriodicEvaluation
from lightning_gpate.evaluation.image import FeatureNetUnavailable, ImageQualityEvaluator
from lightning_gpate.evaluation.report import (PRIVATE_PREFIX, QUALITY_PREFIX, feature_split_of, generated_images,
                                               image_quality_evaluator, is_private, log_metrics)
from lightning_gpate.tracking import mlflow_logger_of


class ImageQuality(PeriodicEvaluation):
    """IS and FID (:class:`lightning_gpate.evaluation.image.ImageQualityEvaluator`) of generated images
    against the DataModule's real ``reference`` split.

    Grey (MNIST-like) images use a CNN classifier trained once on a real split as the feature
    network: the training split for non-private models (as the papers do), a held-out split for
    private ones (``feature_split``; the validation split, else the reference): a network trained on
    the private training split would make every IS/FID an unnoised function of it. RGB images use
    Inception-v3 when its weights are on disk — otherwise a message says how to provide them, the
    run is tagged ``quality/skipped``, and training goes on. Logged once: the real data's own
    figures (``quality/inception_score_real``, ``quality/fid_real_<feature split>_vs_reference``,
    ``quality/feature_net_test_accuracy``; the last two only when the feature split is not the
    reference) so a generated figure can be read against them; every evaluation:
    ``quality/inception_score``, ``quality/inception_score_std``, ``quality/fid``. A private model
    whose feature network is asked to train on the training split (``feature_split: train``) logs
    all of these under ``private/quality/*``. Tables are not evaluated here.

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
        feature_split: the real split the feature classifier trains on (``train``, ``val``,
            ``test``); ``None`` (default): ``train`` for non-private models, a held-out split for
            private ones.
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
        feature_split: str | None = None,
    ) -> None:
        super().__init__(enabled=enabled, every_n_steps=every_n_steps)
        self.num_samples, self.feature_net, self.inception_weights = num_samples, feature_net, inception_weights
        self.feature_epochs, self.splits, self.seed, self.cache_dir, self.reference = feature_epochs, splits, seed, cache_dir, reference
        self.feature_split = feature_split
        self._prefix = QUALITY_PREFIX
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
            split = feature_split_of(pl_module, datamodule, self.feature_split, reference=self.reference)
            # Every figure of a private model is an unnoised function of the training split if its features are.
            self._prefix = PRIVATE_PREFIX + QUALITY_PREFIX if is_private(pl_module) and split == "train" else QUALITY_PREFIX
            try:
                self._evaluator = image_quality_evaluator(
                    datamodule, pl_module.num_classes, feature_net=self.feature_net, inception_weights=self.inception_weights,
                    epochs=self.feature_epochs, seed=self.seed, cache_dir=self.cache_dir, splits=self.splits, reference=self.reference,
                    feature_split=split,
                ).to(pl_module.device)
            except FeatureNetUnavailable as err:
                self._skipped = str(err)
                warnings.warn(self._skipped, stacklevel=2)
                client.set_tag(run_id, "quality/skipped", self._skipped[:5000])
                return
            self.real_metrics = self._evaluator.real_baseline(self.cache_dir)
            log_metrics(client, run_id, self.real_metrics, prefix=self._prefix, step=trainer.global_step)
        n = self.num_samples or len(self._evaluator.reference)
        metrics = self._evaluator.score(generated_images(pl_module, n, seed=self.seed))
        log_metrics(client, run_id, metrics, prefix=self._prefix, step=trainer.global_step)
        self.last_metrics = metrics

