"""Base of the callbacks that evaluate or log samples every N steps and at the end of fitting."""

from __future__ import annotations

import warnings

import pytorch_lightning as pl

from lightning_gpate.tracking import mlflow_logger_of


class PeriodicEvaluation(pl.Callback):
    """Calls :meth:`evaluate` every ``every_n_steps`` generator steps and once at the end of fitting,
    on global rank 0, when the trainer has an MLflow logger.

    Evaluation happens after training: an error in it is reported (a warning and the run tag
    ``<name>_error``) instead of failing the fit, so the release artifact is still written.

    Args:
        enabled: ``False`` turns the callback off (e.g. ``--utility.enabled false``).
        every_n_steps: evaluate every N generator steps as well (0: only at the end).
    """

    name = "evaluation"

    def __init__(self, *, enabled: bool = True, every_n_steps: int = 0) -> None:
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        self.enabled, self.every_n_steps = enabled, every_n_steps
        self._last_step = -1

    def evaluate(self, trainer: pl.Trainer, pl_module, *, tag: str, final: bool) -> None:
        raise NotImplementedError

    def _run(self, trainer, pl_module, tag: str, final: bool) -> None:
        logger = mlflow_logger_of(trainer)
        if not self.enabled or logger is None or not trainer.is_global_zero or not pl_module.has_release:
            return
        self._last_step = trainer.global_step
        try:
            self.evaluate(trainer, pl_module, tag=tag, final=final)
        except Exception as err:  # noqa: BLE001 - reported in the run; training already happened
            message = f"{type(self).__name__} failed at step {trainer.global_step}: {type(err).__name__}: {err}"
            warnings.warn(message, stacklevel=2)
            logger.experiment.set_tag(logger.run_id, f"{self.name}_error", message[:5000])

    def on_fit_start(self, trainer, pl_module) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is not None and trainer.is_global_zero:  # what `lightning-gpate compare` lists
            logger.experiment.set_tag(logger.run_id, "model_class", type(pl_module).__name__)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._last_step:
            self._run(trainer, pl_module, f"step{step:06d}", final=False)

    def on_fit_end(self, trainer, pl_module) -> None:
        logger = mlflow_logger_of(trainer)
        if logger is not None and trainer.is_global_zero:
            logger.experiment.set_tag(logger.run_id, "steps", str(trainer.global_step))
        self._run(trainer, pl_module, "final", final=True)
