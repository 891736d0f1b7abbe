"""Where runs are tracked: the embedded MLflow store by default.

MLflow 3 refuses a plain ``./mlruns`` file store, so runs go to a SQLite database with artifacts in a
folder beside it. ``MLFLOW_TRACKING_URI`` (or the logger's ``tracking_uri``) overrides the default.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import MLFlowLogger

DEFAULT_STORE_DIR = Path("mlruns")
DEFAULT_EXPERIMENT = "lightning-gpate"
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


class GPATEMLFlowLogger(MLFlowLogger):
    """Lightning's MLFlowLogger with this project's defaults (embedded SQLite store, artifacts beside it)."""

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
