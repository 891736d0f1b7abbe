"""Evaluate a generator against its DataModule's real splits, and log the result to MLflow.

One place for what the callbacks (:class:`callbacks.DownstreamUtility`, :class:`callbacks.ImageQuality`),
``lightning-gpate evaluate`` and the Python API compute, so a finished run and a live run get the same
report. Metric names in MLflow: ``utility/<name>`` (downstream utility) and ``quality/<name>`` (IS/FID).
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

UTILITY_PREFIX = "utility/"
QUALITY_PREFIX = "quality/"


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
    """:func:`evaluate_tabular` of ``num_samples`` generated rows (default: as many as the real
    training split) against the DataModule's real train/test splits. Returns the metrics and the
    synthetic table."""
    train, test = datamodule.split_frame("train"), datamodule.split_frame("test")
    if len(test) == 0:
        raise ValueError("the DataModule has an empty test split: set data.test_fraction > 0 to evaluate")
    synthetic = synthetic_table(model, num_samples or len(train), seed=seed)
    label = model.data_spec["label"]["name"]
    metrics = evaluate_tabular(train, test, synthetic, label=label, classifiers=classifiers, settings=settings,
                               seed=seed, reference=reference, reuse=reuse)
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
    generated images (default: as many as the real training split) on the real test split.

    Args:
        val_source: ``"synthetic"`` (hold out 10% of the generated images) or ``"real_val"`` (the
            DataModule's validation split) for epoch selection — never the test split.
    """
    from lightning_gpate.evaluation.image import cnn_utility

    if val_source not in ("synthetic", "real_val"):
        raise ValueError(f"val_source must be 'synthetic' or 'real_val', got {val_source!r}")
    train_y = datamodule.model_space("train")[1]
    test = datamodule.model_space("test")
    val = datamodule.model_space("val") if val_source == "real_val" else None
    if val is not None and len(val[1]) == 0:
        raise ValueError("val_source='real_val' needs a validation split: set data.val_fraction > 0")
    synthetic = model.generate(num_samples or len(train_y), seed=seed)
    return cnn_utility(synthetic, test, num_classes=model.num_classes, val=val, epochs=epochs, seed=seed, device=model.device)


def image_quality_evaluator(datamodule, num_classes: int, *, reference: str = "test", **kwargs):
    """The IS/FID evaluator of a DataModule: feature classifier on its real train split, FID against
    its ``reference`` split (see :class:`lightning_gpate.evaluation.image.ImageQualityEvaluator`)."""
    from lightning_gpate.evaluation.image import ImageQualityEvaluator

    ref = datamodule.model_space(reference)
    if len(ref[1]) < 2:
        raise ValueError(f"the real {reference} split has {len(ref[1])} images: FID needs at least 2")
    return ImageQualityEvaluator(datamodule.model_space("train"), ref, num_classes=num_classes, **kwargs)


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
