"""Where runs are tracked: the embedded MLflow store by default.

MLflow 3 refuses a plain ``./mlruns`` file store, so runs go to a SQLite database with artifacts in a
folder beside it. ``MLFLOW_TRACKING_URI`` (or the logger's ``tracking_uri``) overrides the default.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import MLFlowLogger
from pytorch_lightning.loggers.logger import rank_zero_experiment

DEFAULT_STORE_DIR = Path("mlruns")
DEFAULT_EXPERIMENT = "lightning-gpate"
#: The experiment tag MLflow 3's UI reads to choose its view, and the kind of ours: model training
#: (runs with metric charts and artifacts), not the GenAI view (traces, judges, prompts) it opens
#: for an experiment without a kind.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: MLflow 3.17's UI chooses its view with a switch (GenAI / Model training, remembered by the browser,
#: GenAI by default) and not from the experiment's kind: this URL parameter opens the training view.
UI_TRAINING_VIEW = "workflowType=machine_learning"
MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
#: The tag holding a run's name as configured (the run itself is named :func:`unique_run_name`).
CONFIG_RUN_NAME_TAG = "config_run_name"
_MLFLOW_UNSAFE = re.compile(r"[^\w\-. :/]")  # MLflow: alphanumerics, _ - . space : / only


def default_tracking_uri() -> str:
    """The tracking URI in force: ``MLFLOW_TRACKING_URI`` or the embedded SQLite store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    DEFAULT_STORE_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{DEFAULT_STORE_DIR / 'mlflow.db'}"


def default_artifact_location(tracking_uri: str) -> str | None:
    """Artifacts live under ``mlruns/artifacts`` for the embedded store (an absolute file URI)."""
    if tracking_uri.startswith("sqlite:///"):
        db_path = Path(tracking_uri[len("sqlite:///"):])
        return (db_path.parent / "artifacts").resolve().as_uri()
    return None


def training_experiment_id(client, name: str) -> str:
    """The id of the MLflow experiment ``name``, created as a model-training experiment if it does not
    exist (artifacts under ``mlruns/artifacts`` for the embedded store). An existing experiment
    without a kind (e.g. created by an older version) gets the training kind; another kind is kept.
    Every experiment this project creates comes from here.

    Args:
        client: an ``mlflow.MlflowClient``.
        name: the experiment's name.
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, artifact_location=default_artifact_location(client.tracking_uri),
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in experiment.tags and experiment.lifecycle_stage != "deleted":
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def unique_run_name(name: str) -> str:
    """``name`` followed by the local start time and 4 random hex digits (``quickstart-20261126-124005-3fa2``):
    every run of a config carries the config's name, and two of them can be told apart in the runs
    table and the comparison (MLflow allows equal names). The digits come from the OS (``secrets``), never from
    the seeded random state: two runs of one seed get two names."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def data_name(datamodule: Any) -> str | None:
    """A short name of a DataModule's data for a run's name: the dataset (``digits``, ``mnist``), a file's or
    folder's name without its suffixes (``cervical``), the built-in table, or what the Python API was given."""
    if datamodule is None:
        return None
    dataset = getattr(datamodule, "dataset", None)
    path = getattr(datamodule, "path", None) or (getattr(datamodule, "root", None) if dataset == "folder" else None)
    if path:
        name = Path(str(path)).name.split(".")[0]
    elif dataset and dataset not in ("csv", "arrays", "npz"):
        name = dataset
    elif getattr(datamodule, "builtin", None):
        name = datamodule.builtin
    elif getattr(datamodule, "frame", None) is not None:
        name = "table"
    else:
        name = "images" if dataset else None
    return _MLFLOW_UNSAFE.sub("_", name) if name else None


def run_title(model: Any, datamodule: Any = None) -> str:
    """What a run is, as its name starts: the model, the data and a private model's ε (``gpate-digits-eps10``)."""
    epsilon = getattr(model, "epsilon_budget", None)
    parts = [type(model).__name__.lower(), data_name(datamodule), f"eps{epsilon:g}" if epsilon is not None else None]
    return "-".join(p for p in parts if p)


def run_page_url(tracking_uri: str | None, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, in its model-training view: on the tracking server itself, or on
    the ``mlflow ui`` a user starts for a local store (its default address). ``None`` for Databricks."""
    uri = tracking_uri or ""
    if uri.startswith("databricks"):
        return None
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else MLFLOW_UI_DEFAULT
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_TRAINING_VIEW}"


class GPATEMLFlowLogger(MLFlowLogger):
    """Lightning's MLFlowLogger with this project's defaults (embedded SQLite store, artifacts beside it).

    A new run given ``run_name`` is named :func:`unique_run_name` of it, with the name as given in the
    tag ``config_run_name`` (a config's name is the same for each of its runs); one given none is named after its
    model, data and ε when the fit starts (:meth:`name_run`).
    """

    def name_run(self, title: str) -> None:
        """Name a run not yet started that was given no ``run_name``: :func:`unique_run_name` of ``title`` (the
        model, data and ε, :func:`run_title`). Without it MLflow picks a random name from Python's random state,
        which ``seed_everything`` makes the same for every run of a seed."""
        if self._run_id is None and not self._initialized and self._run_name is None:
            self._run_name = unique_run_name(title)

    def __init__(
        self,
        experiment_name: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        artifact_location: str | None = None,
        run_id: str | None = None,
    ) -> None:
        tracking_uri = tracking_uri or default_tracking_uri()
        if run_name is not None and run_id is None:
            tags = {**(tags or {}), CONFIG_RUN_NAME_TAG: run_name}
            run_name = unique_run_name(run_name)
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        super().__init__(
            experiment_name=experiment_name,
            run_name=run_name,
            tracking_uri=tracking_uri,
            tags=tags,
            artifact_location=artifact_location or default_artifact_location(tracking_uri),
            run_id=run_id,
            log_model=False,
        )

    @property
    @rank_zero_experiment
    def experiment(self):
        """Lightning's MLflow client, with the experiment looked up or created as a model-training
        experiment (:func:`training_experiment_id`) before Lightning's own lookup would create it
        without a kind."""
        if not self._initialized and self._run_id is None and self._experiment_id is None:
            self._experiment_id = training_experiment_id(self._mlflow_client, self._experiment_name)
        return super().experiment

    def log_hyperparams(self, params) -> None:
        """Lightning's flattening, with characters MLflow refuses in a parameter name (e.g. the
        parentheses of a column called ``Smokes (years)`` in a data schema) replaced by ``_``."""
        from lightning_fabric.utilities.logger import _convert_params, _flatten_dict

        flat = _flatten_dict(_convert_params(params))
        super().log_hyperparams({_MLFLOW_UNSAFE.sub("_", str(k)): v for k, v in flat.items()})


def mlflow_logger_of(trainer) -> MLFlowLogger | None:
    """The trainer's MLflow logger, if it has one."""
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            return logger
    return None
