"""Evaluate a generator against its DataModule's real splits, and log the result to MLflow.

One place for what the callbacks (:class:`callbacks.DownstreamUtility`, :class:`callbacks.ImageQuality`),
``lightning-gpate evaluate`` and the Python API compute, so a finished run and a live run get the same
report. Metric names in MLflow: ``utility/<name>`` (downstream utility) and ``quality/<name>`` (IS/FID).

What a private model's evaluation may log by default is decided by :mod:`lightning_gpate.privacy.disclosure`
(:func:`is_private`, :func:`real_baselines_allowed`, :func:`split_private`) with :func:`uses_training_split`: nothing computed from the real **training**
split without noise (Setting A, the A/B and A/C ranking agreements, a feature network trained on
it, the training split's size). Those are the data owner's diagnostics: computed only on request and
then logged under ``private/`` (:data:`PRIVATE_PREFIX`). Evaluation against the held-out real splits
(validation, test) is not covered by the model's ε either: the DataModule holds those records out of
training, so the ε is about the training split only, and the held-out splits are the evaluator's data.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from lightning_gpate.evaluation.tabular import SETTINGS, evaluate_tabular
from lightning_gpate.privacy.disclosure import PRIVATE_PREFIX, is_private, real_baselines_allowed, split_private  # noqa: F401 (their home is the disclosure policy)

UTILITY_PREFIX = "utility/"
QUALITY_PREFIX = "quality/"


def uses_training_split(name: str) -> bool:
    """Whether a metric of the tabular report (:func:`evaluate_tabular`) is computed from the real
    training split: Setting A (real→real, and the real fidelity floor ``A/fidelity/*``) and every
    ranking agreement with it."""
    return name.startswith("A/") or name.startswith("ranking_agreement_A")


def default_num_samples(model, datamodule) -> int:
    """Generated rows/images of an evaluation when none is given: as many as the real training split
    for a non-private model (the papers' setting); for a private model the size of the real test
    split, because the training split's size is a private count (it would be logged as
    ``num_synthetic``/``cnn_num_train``)."""
    split = "test" if is_private(model) else "train"
    n = len(datamodule.model_space(split)[1])
    if n == 0:
        raise ValueError(f"the DataModule has an empty {split} split: pass num_samples")
    return n


def synthetic_table(model, num_samples: int, *, seed: int | None = 0) -> pd.DataFrame:
    """``num_samples`` generated rows in the original schema (labels from the model's class ratio)."""
    from lightning_gpate.sampling import samples_to_frame

    x, y = model.generate(num_samples, seed=seed)
    return samples_to_frame(model.data_spec, x, y)


def tabular_utility(
    model,
    datamodule,
    *,
    num_samples: int | None = None,
    seed: int = 0,
    classifiers: Sequence[str] | None = None,
    settings: Sequence[str] = SETTINGS,
    reference: str = "test",
    reuse: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], pd.DataFrame]:
    """:func:`evaluate_tabular` of ``num_samples`` generated rows (default: :func:`default_num_samples`)
    against the DataModule's real train/test splits. Returns the metrics and the synthetic table."""
    train, test = datamodule.split_frame("train"), datamodule.split_frame("test")
    if len(test) == 0:
        raise ValueError("the DataModule has an empty test split: set data.test_fraction > 0 to evaluate")
    synthetic = synthetic_table(model, num_samples or default_num_samples(model, datamodule), seed=seed)
    label = model.data_spec["label"]["name"]
    metrics = evaluate_tabular(train, test, synthetic, label=label, classifiers=classifiers, settings=settings,
                               seed=seed, reference=reference, reuse=reuse, spec=model.data_spec)
    metrics["num_synthetic"] = float(len(synthetic))
    return metrics, synthetic


def image_utility(
    model,
    datamodule,
    *,
    num_samples: int | None = None,
    epochs: int | None = None,
    val_source: str = "synthetic",
    seed: int = 0,
) -> dict[str, float]:
    """CNN accuracy (see :func:`lightning_gpate.evaluation.image.cnn_utility`) of ``num_samples``
    generated images (default: :func:`default_num_samples`) on the real test split. The CNN trains on
    generated images only.

    Args:
        val_source: ``"synthetic"`` (hold out 10% of the generated images) or ``"real_val"`` (the
            DataModule's validation split) for epoch selection — never the test split.
    """
    from lightning_gpate.evaluation.image import cnn_utility

    if val_source not in ("synthetic", "real_val"):
        raise ValueError(f"val_source must be 'synthetic' or 'real_val', got {val_source!r}")
    test = datamodule.model_space("test")
    val = datamodule.model_space("val") if val_source == "real_val" else None
    if val is not None and len(val[1]) == 0:
        raise ValueError("val_source='real_val' needs a validation split: set data.val_fraction > 0")
    synthetic = model.generate(num_samples or default_num_samples(model, datamodule), seed=seed)
    return cnn_utility(synthetic, test, num_classes=model.num_classes, val=val, epochs=epochs, seed=seed, device=model.device)


FEATURE_SPLITS = ("train", "val", "test")


def feature_split_of(model, datamodule, requested: str | None = None, *, reference: str = "test") -> str:
    """The real split the IS/FID feature classifier trains on: ``requested``, else ``train`` for a
    non-private model (as G-PATE and GS-WGAN do) and a held-out split for a private one (``val``
    when it holds at least 100 images, else ``reference``): a network trained on the private training
    split would make every IS/FID a function of it without noise."""
    if requested is not None:
        if requested not in FEATURE_SPLITS:
            raise ValueError(f"feature_split must be one of {FEATURE_SPLITS}, got {requested!r}")
        return requested
    if not is_private(model):
        return "train"
    return "val" if len(datamodule.model_space("val")[1]) >= 100 else reference


def image_quality_evaluator(datamodule, num_classes: int, *, reference: str = "test", feature_split: str = "train", **kwargs):
    """The IS/FID evaluator of a DataModule: feature classifier on its real ``feature_split``, FID
    against its ``reference`` split (see :class:`lightning_gpate.evaluation.image.ImageQualityEvaluator`)."""
    from lightning_gpate.evaluation.image import ImageQualityEvaluator

    ref = datamodule.model_space(reference)
    if len(ref[1]) < 2:
        raise ValueError(f"the real {reference} split has fewer than 2 images: FID needs at least 2")
    features = datamodule.model_space(feature_split)
    if len(features[1]) == 0:
        raise ValueError(f"the real {feature_split} split is empty: the IS/FID feature classifier cannot train on it")
    return ImageQualityEvaluator(features, ref, num_classes=num_classes, feature_split=feature_split,
                                 same_split=feature_split == reference, **kwargs)


def generated_images(model, num_samples: int, *, seed: int = 0, batch_size: int = 500) -> torch.Tensor:
    """``num_samples`` generated images in [-1, 1] (labels from the model's class ratio)."""
    return model.generate(num_samples, seed=seed, batch_size=batch_size)[0]


def write_report(metrics: Mapping[str, float], path: str | Path, **info: Any) -> Path:
    """The metrics (NaN as null) and ``info`` as a JSON file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    path.write_text(json.dumps({"metrics": clean, **info}, indent=2, default=str))
    return path


def log_metrics(client, run_id: str, metrics: Mapping[str, float], *, prefix: str, step: int = 0) -> None:
    """Log ``metrics`` (as ``prefix + name``) to an MLflow run in one batch."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(f"{prefix}{k}", float(v), now, int(step)) for k, v in metrics.items()]
    for i in range(0, len(batch), 500):
        client.log_batch(run_id, metrics=batch[i:i + 500])


def log_files(client, run_id: str, paths: Sequence[str | Path], artifact_dir: str) -> None:
    for p in paths:
        client.log_artifact(run_id, str(p), artifact_dir)
