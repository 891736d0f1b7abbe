"""Evaluation after the fact: a finished run's report (from its release artifact) attached to its MLflow
run, and a table comparing the runs of an experiment. Behind ``lightning-gpate evaluate`` and
``lightning-gpate compare``."""

from __future__ import annotations

import importlib
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lightning_gpate.evaluation.report import (
    PRIVATE_PREFIX, QUALITY_PREFIX, UTILITY_PREFIX, feature_split_of, generated_images, image_quality_evaluator, image_utility,
    is_private, log_files, log_metrics, real_baselines_allowed, split_private, tabular_utility, uses_training_split, write_report,
)
from lightning_gpate.evaluation.tabular import SETTINGS

MLFLOW_RUN_KEY = "mlflow_run"  # written by callbacks.artifacts.ReleaseArtifact (release and training checkpoints)
RELEASE_TAGS = ("release_artifact", "final_checkpoint")  # the run's tag with the file's path (final_checkpoint: older runs)
DATA_CLASSES = {"tabular": "datamodules.TabularDataModule", "image": "datamodules.ImageDataModule"}
DATA_FILE_SUFFIXES = (".csv", ".gz", ".tsv", ".txt")


# ----------------------------------------------------------------------------- data of a checkpoint
def _import(class_path: str):
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def datamodule_for(release: dict[str, Any], model, data: str | None = None):
    """The DataModule a release was trained on, rebuilt from its stored data config.

    Args:
        release: the release artifact (:func:`lightning_gpate.release.load_release`).
        model: the loaded model (its ``data_spec`` must match the data).
        data: ``None`` (the stored DataModule), a YAML file (a fit config with a ``data:`` section, or
            that section itself: ``class_path`` + ``init_args``, or bare init args) whose arguments
            override the stored ones, or a data file (CSV) replacing the stored ``path``.

    Raises:
        ValueError: the release has no stored DataModule and no ``data`` was given, or the data
            does not match the model.
    """
    section = release.get("datamodule") or {}
    stored = dict(section.get("init_args") or {})
    class_path = section.get("class_path") or DATA_CLASSES[model.data_spec["kind"]]
    if data is not None:
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"--data file not found: {path.resolve()}")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            section = yaml.safe_load(path.read_text()) or {}
            section = section.get("data", section)
            if "class_path" in section:
                if section["class_path"] != class_path:  # another DataModule: the stored arguments do not apply
                    stored = {}
                class_path = section["class_path"]
                args = dict(section.get("init_args") or {})
            else:
                args = dict(section)
            stored.update(args)
        elif path.suffix.lower() in DATA_FILE_SUFFIXES:
            stored["path"] = str(path)
            if model.data_spec["kind"] == "image":
                stored["dataset"] = "csv"
        else:
            raise ValueError(f"--data must be a YAML config or a CSV data file, got {path.name!r}")
    elif not stored:
        raise ValueError("the release does not say which data it was trained on: pass --data (a YAML data config or a CSV)")
    if class_path.endswith("TabularDataModule") and not stored.get("path") and not stored.get("builtin"):
        raise ValueError("this model was trained on an in-memory DataFrame: pass --data with the table (CSV) or a data config")
    datamodule = _import(class_path)(**stored)
    # the run's paid metadata, not a new DP draw: other bins would move the splits (keyed on the records)
    datamodule.adopt_released_spec(model.data_spec)
    check_data_matches(model.data_spec, datamodule.spec)
    return datamodule


def real_test_split(model, release: dict[str, Any]):
    """The real test split of a **non-private** model's data (rebuilt from the release's data config),
    to draw beside its samples: ``(images, labels)`` or a DataFrame; ``None`` for a private model (its
    pictures never show real data unless a public reference is given) or where the data cannot be read."""
    if is_private(model):
        return None
    try:
        datamodule = datamodule_for(release, model)
        if model.data_spec["kind"] == "tabular":
            frame = datamodule.split_frame("test")
            return frame if len(frame) else None
        x, y = datamodule.model_space("test")
        return (x, y) if len(y) else None
    except (OSError, ValueError, KeyError):
        return None


def check_data_matches(model_spec: dict[str, Any], data_spec: dict[str, Any]) -> None:
    """Refuse to evaluate a model against data of another shape, classes or columns."""
    for key in ("kind", "shape", "num_classes", "class_names", "column_order"):
        if key in model_spec and model_spec.get(key) != data_spec.get(key):
            raise ValueError(f"the data does not match the model: {key} is {data_spec.get(key)!r} in the data, "
                             f"{model_spec.get(key)!r} in the model")


# ----------------------------------------------------------------------------- the report
def evaluate_generator(
    model,
    datamodule,
    out_dir: str | Path,
    *,
    utility: bool = True,
    quality: bool = True,
    figures: bool = True,
    num_samples: int | None = None,
    seed: int = 0,
    classifiers: Sequence[str] | None = None,
    settings: Sequence[str] = SETTINGS,
    cnn_epochs: int | None = None,
    val_source: str = "synthetic",
    feature_net: str = "auto",
    inception_weights: str | None = None,
    feature_epochs: int | None = None,
    tag: str = "evaluate",
    real_baselines: bool | None = None,
    feature_split: str | None = None,
) -> tuple[dict[str, float], list[Path], list[str]]:
    """The report the callbacks log during a fit, for a finished model.

    A private model's report follows the callbacks' rules (:mod:`lightning_gpate.evaluation.report`):
    Setting A and the ranking agreements with it only with ``real_baselines`` (default: the model's
    ``log_private_diagnostics``), named ``private/utility/...``; the IS/FID feature classifier on a
    held-out split unless ``feature_split`` says otherwise (``train``: every ``quality/`` figure
    becomes ``private/quality/``).

    Returns:
        ``(metrics, files, notes)``: metrics named as in MLflow (``utility/...``, ``quality/...``),
        the figure/report files written to ``out_dir``, and messages (e.g. IS/FID skipped).
    """
    from lightning_gpate.evaluation.image import FeatureNetUnavailable

    out_dir = Path(out_dir)
    metrics: dict[str, float] = {}
    files: list[Path] = []
    notes: list[str] = []
    kind = model.data_spec["kind"]
    allowed = real_baselines_allowed(model, real_baselines)
    if utility:
        if kind == "tabular":
            result, synthetic = tabular_utility(model, datamodule, num_samples=num_samples, seed=seed, classifiers=classifiers,
                                                settings=[s for s in settings if allowed or s.upper() != "A"])
            if figures:
                from lightning_gpate.evaluation.plots import tabular_figures

                files += tabular_figures(datamodule.split_frame("test"), synthetic, out_dir, tag=tag)
            result, private = split_private(model, result, uses_training_split)
        else:
            result, private = image_utility(model, datamodule, num_samples=num_samples, epochs=cnn_epochs,
                                            val_source=val_source, seed=seed), {}
        metrics.update({f"{UTILITY_PREFIX}{k}": v for k, v in result.items()})
        metrics.update({f"{PRIVATE_PREFIX}{UTILITY_PREFIX}{k}": v for k, v in private.items()})
    if quality and kind == "image":
        split = feature_split_of(model, datamodule, feature_split)
        prefix = PRIVATE_PREFIX + QUALITY_PREFIX if is_private(model) and split == "train" else QUALITY_PREFIX
        try:
            evaluator = image_quality_evaluator(datamodule, model.num_classes, feature_net=feature_net, feature_split=split,
                                                inception_weights=inception_weights, epochs=feature_epochs, seed=seed)
        except FeatureNetUnavailable as err:
            notes.append(str(err))
        else:
            scores = {**evaluator.real_baseline(), **evaluator.score(generated_images(model, num_samples or len(evaluator.reference), seed=seed))}
            metrics.update({f"{prefix}{k}": v for k, v in scores.items()})
    files.append(write_report(metrics, out_dir / f"report_{tag}.json", notes=notes))
    return metrics, files, notes


# ----------------------------------------------------------------------------- runs in the store
def tracking_uri_for(explicit: str | None = None, checkpoint: dict[str, Any] | None = None) -> str:
    """``explicit`` > ``MLFLOW_TRACKING_URI`` > the release's store (if reachable) > the default store."""
    from lightning_gpate.tracking import default_tracking_uri

    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    stored = ((checkpoint or {}).get(MLFLOW_RUN_KEY) or {}).get("tracking_uri")
    if stored and (not stored.startswith("sqlite:///") or Path(stored[len("sqlite:///"):]).is_file()):
        return stored
    return default_tracking_uri()


def find_run_of_checkpoint(client, ckpt_path: str | Path, checkpoint: dict[str, Any]) -> str | None:
    """The MLflow run that produced a release (or checkpoint): the run id stored in it, else the run
    whose ``release_artifact`` tag is this file."""
    from mlflow.exceptions import MlflowException

    run_id = (checkpoint.get(MLFLOW_RUN_KEY) or {}).get("run_id")
    if run_id:
        try:
            client.get_run(run_id)
            return run_id
        except MlflowException:
            pass
    target = str(Path(ckpt_path).resolve())
    experiments = client.search_experiments()
    if not experiments:
        return None
    for tag in RELEASE_TAGS:
        runs = client.search_runs([e.experiment_id for e in experiments], filter_string=f"tags.{tag} = '{target}'")
        if runs:
            return runs[0].info.run_id
    return None


def _fmt_seconds(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


COMPARE_METRICS = {
    "auroc_B": "utility/B/auroc_mean",
    "auprc_B": "utility/B/auprc_mean",
    "auroc_A": "utility/A/auroc_mean",
    "sra_AC": "utility/ranking_agreement_AC",
    "tvd_1way": "utility/fidelity/tvd_1way",
    "tvd_2way": "utility/fidelity/tvd_2way",
    "corr_mae": "utility/fidelity/corr_mae",
    "qtvd_1way": "utility/fidelity/quantile_tvd_1way",
    "qtvd_2way": "utility/fidelity/quantile_tvd_2way",
    "w1_scaled": "utility/fidelity/w1_scaled",
    "cnn_acc": "utility/cnn_accuracy_val_selected",
    "cnn_acc_final": "utility/cnn_accuracy_final",
    "IS": "quality/inception_score",
    "FID": "quality/fid",
}


def runs_table(experiment: str, *, tracking_uri: str | None = None) -> pd.DataFrame:
    """One row per run of ``experiment``: model, ε, δ, whether ε is a guarantee, utility, fidelity, IS/FID,
    steps, wall time, status, newest first. Columns without any value are left out.

    Raises:
        ValueError: no such experiment in the store.
    """
    import mlflow

    uri = tracking_uri_for(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"no experiment {experiment!r} in {uri}; experiments there: {names}")
    rows = []
    for run in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1000):
        m, p, t = run.data.metrics, run.data.params, run.data.tags
        eps = m.get("epsilon_final", m.get("epsilon"))
        steps = t.get("steps")
        if steps is None:
            key = next((k for k in ("epsilon", "g_loss") if k in m), next(iter(m), None))
            history = client.get_metric_history(run.info.run_id, key) if key else []
            steps = max((h.step for h in history), default=None)
        end = run.info.end_time
        wall = (end - run.info.start_time) / 1000 if end and run.info.start_time else None
        row = {
            "run": run.info.run_name,
            "run_id": run.info.run_id[:8],
            "model": t.get("model_class", "-"),
            "epsilon": eps if eps is not None else float("nan"),
            "delta": _as_float(p.get("privacy/delta", p.get("delta"))),
            "guarantee": t.get("privacy_guarantee", "-" if eps is None else "?"),
        }
        row.update({name: m.get(key, m.get("private/" + key, float("nan"))) for name, key in COMPARE_METRICS.items()})
        row.update({"steps": int(steps) if steps is not None else None, "wall": _fmt_seconds(wall), "status": run.info.status})
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    keep = [c for c in table.columns if c not in COMPARE_METRICS or table[c].notna().any()]
    return table[keep]


def evaluate_checkpoint(
    ckpt_path: str | Path,
    *,
    data: str | None = None,
    run_id: str | None = None,
    tracking_uri: str | None = None,
    new_run_experiment: str | None = None,
    **options: Any,
) -> tuple[dict[str, float], str, list[str], dict[str, Any]]:
    """Compute :func:`evaluate_generator` for a release artifact and attach it to its MLflow run (metrics
    at the release's step, files under the artifact folder ``evaluation/``, tag ``evaluated_checkpoint``).

    Args:
        ckpt_path: a release artifact (a private training checkpoint works too: its release is
            extracted in memory; nothing of it is logged).
        data: see :func:`datamodule_for`.
        run_id: the run to attach to (default: the checkpoint's run).
        tracking_uri: the MLflow store (default: see :func:`tracking_uri_for`).
        new_run_experiment: when the checkpoint's run is not in the store, start a new run in this
            experiment instead of failing.
        **options: passed to :func:`evaluate_generator`.

    Returns:
        ``(metrics, run_id, notes, data_spec)``: the last the release's public spec (what its columns' bins came from).
    """
    import mlflow

    from lightning_gpate.release import load_release, model_from_release

    checkpoint = load_release(ckpt_path)
    model = model_from_release(checkpoint, source=str(ckpt_path))
    datamodule = datamodule_for(checkpoint, model, data)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri_for(tracking_uri, checkpoint))
    run_id = run_id or find_run_of_checkpoint(client, ckpt_path, checkpoint)
    if run_id is None:
        if new_run_experiment is None:
            raise ValueError(
                f"no MLflow run in {client.tracking_uri} produced {ckpt_path}: pass --run_id, --tracking_uri, "
                f"or --new_run to record the report in a new run"
            )
        from lightning_gpate.tracking import training_experiment_id

        exp_id = training_experiment_id(client, new_run_experiment)
        run_id = client.create_run(exp_id, run_name=f"evaluate-{Path(ckpt_path).stem}").info.run_id
        client.set_tag(run_id, "model_class", type(model).__name__)
        client.set_terminated(run_id)
    with tempfile.TemporaryDirectory() as tmp:
        metrics, files, notes = evaluate_generator(model, datamodule, tmp, **options)
        log_metrics(client, run_id, metrics, prefix="", step=int(checkpoint.get("global_step", 0)))
        log_files(client, run_id, files, "evaluation")
    client.set_tag(run_id, "evaluated_checkpoint", str(Path(ckpt_path).resolve()))
    for note in notes:
        client.set_tag(run_id, "quality/skipped", note[:5000])
    return metrics, run_id, notes, model.data_spec
