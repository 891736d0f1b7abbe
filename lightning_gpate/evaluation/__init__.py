"""Evaluation of synthetic data, computed the same way for every model.

* :mod:`~lightning_gpate.evaluation.tabular`: PATE-GAN's 12 classifiers in Settings A/B/C, ranking
  agreement, feature-ranking agreement, Spearman correlations (:func:`evaluate_tabular`);
* :mod:`~lightning_gpate.evaluation.image`: CNN accuracy, Inception Score and FID;
* :mod:`~lightning_gpate.evaluation.plots`: marginal and correlation figures;
* :mod:`~lightning_gpate.evaluation.report`: a generator against its DataModule, logged to MLflow
  (shared by the callbacks, ``lightning-gpate evaluate`` and :class:`lightning_gpate.Synthesizer`).
"""

from lightning_gpate.evaluation.image import FeatureNetUnavailable, ImageQualityEvaluator, cnn_utility, frechet_distance, inception_score
from lightning_gpate.evaluation.tabular import CLASSIFIERS, SETTINGS, evaluate_tabular, ranking_agreement

__all__ = [
    "CLASSIFIERS", "FeatureNetUnavailable", "ImageQualityEvaluator", "SETTINGS", "cnn_utility", "evaluate_tabular",
    "frechet_distance", "inception_score", "ranking_agreement",
]
