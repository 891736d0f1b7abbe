"""Run artifacts: the resolved config and the release artifact in MLflow; the private training
checkpoint on local disk only."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import SaveConfigCallback

from lightning_gpate.files import OWNER_ONLY_FILE, owner_only_folder
from lightning_gpate.privacy.disclosure import release_allowed
from lightning_gpate.tracking import mlflow_logger_of


class MLflowSaveConfig(SaveConfigCallback):
    """Store the resolved LightningCLI config as ``config.yaml`` in the MLflow run."""

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        text = self.parser.dump(self.config, skip_none=False)
        logger.experiment.log_text(logger.run_id, text, "config.yaml")


MLFLOW_RUN_KEY = "mlflow_run"
RELEASE_ARTIFACT_DIR = "release"
RELEASE_FILE = "release.pt"
TRAINING_CHECKPOINT_FILE = "last.ckpt"
PRIVATE_DIR = "private"


class PrivateCheckpointError(RuntimeError):
    """A training checkpoint (private state) would be written where MLflow would publish it."""


def _local_path(uri: str | None) -> Path | None:
    if not uri:
        return None
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path)).resolve()
    if "://" not in uri:
        return Path(uri).resolve()
    return None  # a remote store: never a local checkpoint folder


def mlflow_run_of(trainer: pl.Trainer) -> dict | None:
    """``{"run_id", "experiment_id", "tracking_uri"}`` of the trainer's MLflow run (rank 0), else ``None``."""
    logger = mlflow_logger_of(trainer)
    if logger is None or trainer.global_rank != 0 or logger.run_id is None:
        return None
    return {"run_id": logger.run_id, "experiment_id": logger.experiment_id, "tracking_uri": getattr(logger, "_tracking_uri", None)}


def private_dir(trainer: pl.Trainer) -> Path:
    """Where this run's training checkpoints go: ``<default_root_dir>/private/<experiment id>/<run id>``
    (``<default_root_dir>/private`` without MLflow). The same on every rank."""
    root = Path(trainer.default_root_dir) / PRIVATE_DIR
    run = mlflow_run_of(trainer)
    path = root / str(run["experiment_id"]) / str(run["run_id"]) if run else root
    return Path(trainer.strategy.broadcast(str(path)))


class ReleaseArtifact(pl.Callback):
    """Write the run's **release artifact** and keep its **training checkpoint** private.

    At the end of fitting (global rank 0) the release (:mod:`lightning_gpate.release`: generator
    weights, released data spec, released accountant state, model class, hyperparameters, data
    config) is logged to the MLflow run as ``release/release.pt``; the run's ``release_artifact`` tag
    holds its local path (:attr:`release_path`, which the CLI's end-of-fit summary prints with the
    command that samples from it). Without an MLflow logger it is written to
    ``<default_root_dir>/release/release.pt``.

    The training checkpoint (teachers, discriminators, critic, optimizer states, the accountant's
    full state) is written **only** to ``<default_root_dir>/private/<experiment>/<run>/`` and only when
    the user asked for checkpoints (``enable_checkpointing`` / a ``ModelCheckpoint``), or when the run
    has no release of its own (GS-WGAN's discriminator pretraining, whose checkpoint is its output):
    then ``last.ckpt`` there holds the final state (resume with ``--ckpt_path``). Every
    ``ModelCheckpoint`` without a ``dirpath`` writes into that folder too. Nothing private is ever
    logged to MLflow: a ``ModelCheckpoint`` folder inside the MLflow artifact store, or an MLflow
    logger that uploads checkpoints (``log_model``), is refused before training.

    Every checkpoint written while this callback is active records its MLflow run
    (``checkpoint["mlflow_run"]``), as does the release, so ``lightning-gpate evaluate`` can report
    back to the run.

    Attributes:
        release_path: the release artifact's local path after fitting (``None`` before, or for a
            run without a release).
        training_checkpoint_path: the private training checkpoint written at the end of fitting
            (``None`` when none was written).
    """

    def __init__(self) -> None:
        self.release_path: Path | None = None
        self.training_checkpoint_path: Path | None = None
        self._private_dir: Path | None = None

    # ----------------------------------------------------------------- before training
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._private_dir = private_dir(trainer)
        if self.checkpoints_requested(trainer, pl_module):  # owner-only before anything private is written into it
            owner_only_folder(self._private_dir, root=Path(trainer.default_root_dir) / PRIVATE_DIR)
        logger = mlflow_logger_of(trainer)
        if logger is not None and getattr(logger, "_log_model", False):
            raise PrivateCheckpointError(
                "the MLflow logger has log_model enabled: it would upload the training checkpoints (private "
                "state: teachers, discriminators, optimizer moments) to MLflow. Use log_model=False; the "
                "release artifact is logged by the ReleaseArtifact callback."
            )
        artifact_root = self._artifact_root(trainer)
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
                callback.dirpath = str(self._private_dir)
            folder = _local_path(str(callback.dirpath)) if isinstance(callback, ModelCheckpoint) else None
            if artifact_root is not None and folder is not None and folder.is_relative_to(artifact_root):
                raise PrivateCheckpointError(
                    f"a ModelCheckpoint writes to {folder}, inside the MLflow artifact store {artifact_root}: training "
                    f"checkpoints hold private state and must stay out of it (leave dirpath unset: they go to {self._private_dir})"
                )

    @staticmethod
    def _artifact_root(trainer: pl.Trainer) -> Path | None:
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0 or logger.run_id is None:
            return None
        experiment = logger.experiment.get_experiment(logger.experiment_id)
        return _local_path(experiment.artifact_location)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        run = mlflow_run_of(trainer)
        if run is not None:
            checkpoint[MLFLOW_RUN_KEY] = run

    # ----------------------------------------------------------------- after training
    @staticmethod
    def checkpoints_requested(trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Whether the final training state is written: the user asked for checkpoints, or the run
        has no release (its training checkpoint is its only output)."""
        return bool(trainer.checkpoint_callbacks) or not getattr(pl_module, "has_release", True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A smooth-sensitivity run releases its ε first: the training checkpoint must record that the
        # release was made (a resume would otherwise release the same ledger again, with fresh noise).
        finalize = getattr(pl_module, "finalize_privacy", None)
        if finalize is not None:
            finalize()
        # A collective under DDP (G-PATE gathers its teachers into the checkpoint), so it is written
        # here, by every rank, before the evaluation that rank 0 alone runs at on_fit_end.
        if self.checkpoints_requested(trainer, pl_module):
            folder = owner_only_folder(self._private_dir or private_dir(trainer), root=Path(trainer.default_root_dir) / PRIVATE_DIR)
            path = folder / TRAINING_CHECKPOINT_FILE
            trainer.save_checkpoint(path, weights_only=False)  # the whole state, to resume; a collective under DDP
            if path.exists():
                path.chmod(OWNER_ONLY_FILE)
            self.training_checkpoint_path = path.resolve()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank != 0:  # no collective from here on: the other ranks may have left
            return
        logger = mlflow_logger_of(trainer)
        if self.training_checkpoint_path is not None and logger is not None:
            logger.experiment.set_tag(logger.run_id, "training_checkpoint", str(self.training_checkpoint_path))
        if pl_module.has_release and not release_allowed(pl_module):
            # smooth_sensitivity: the released ε exceeds the target (a decision on the released value)
            if logger is not None:
                logger.experiment.set_tag(logger.run_id, "release_artifact", "not written: the released epsilon exceeds the target")
        elif pl_module.has_release:
            self.release_path = self._write_release(trainer, pl_module)

    def _write_release(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Path:
        from lightning_gpate.release import build_release, save_release

        release = build_release(pl_module, datamodule=trainer.datamodule, mlflow_run=mlflow_run_of(trainer), global_step=trainer.global_step)
        logger = mlflow_logger_of(trainer)
        if logger is None:
            return save_release(release, Path(trainer.default_root_dir) / RELEASE_ARTIFACT_DIR / RELEASE_FILE).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            path = save_release(release, Path(tmp) / RELEASE_FILE)
            logger.experiment.log_artifact(logger.run_id, str(path), RELEASE_ARTIFACT_DIR)
        uri = f"{logger.experiment.get_run(logger.run_id).info.artifact_uri}/{RELEASE_ARTIFACT_DIR}/{RELEASE_FILE}"
        local = _local_path(uri)
        location = str(local) if local is not None else uri
        logger.experiment.set_tag(logger.run_id, "release_artifact", location)
        return Path(location) if local is not None else Path(uri)
