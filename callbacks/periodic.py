"""Base of the callbacks that evaluate or log samples every N steps and at the end of fitting."""

from __future__ import annotations

import warnings

import pytorch_lightning as pl

from lightning_gpate.privacy.disclosure import is_private, release_allowed
from lightning_gpate.progress import progress_bars
from lightning_gpate.tracking import mlflow_logger_of


class PeriodicEvaluation(pl.Callback):
    """Calls :meth:`evaluate` every ``every_n_steps`` generator steps and once at the end of fitting,
    on global rank 0, when the trainer has an MLflow logger.

    A ``budget_accounting: smooth_sensitivity`` run is evaluated only at the end, once its released ε
    meets the target (``release_allowed``): an evaluation is a function of the generator, and until
    then nothing of the generator leaves the run.

    Evaluation happens after training: an error in it is reported (a warning and the run tag
    ``<name>_error``) instead of failing the fit, so the release artifact is still written.

    Under DDP only rank 0 evaluates, so :meth:`evaluate` must not enter a collective (no
    ``torch.distributed`` call, no metric that syncs across processes): the other ranks are not there.
    The final evaluation runs at ``on_fit_end``, after every collective of the fit (the final
    training checkpoint is written at ``on_train_end``); a periodic one holds the other ranks at their next
    collective until it is done. Its progress bars (:mod:`lightning_gpate.progress`) follow the
    Trainer's: off with ``--trainer.enable_progress_bar false``.

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

    def logged_metrics(self) -> dict[str, float]:
        """The latest figures, under the names they were logged with (e.g. ``utility/B/auroc_mean``,
        ``private/utility/A/auroc_mean``): what the end-of-fit summary reads."""
        prefix = getattr(self, "_prefix", f"{self.name}/")
        out = {prefix + k: v for k, v in getattr(self, "real_metrics", {}).items()}
        out.update({prefix + k: v for k, v in getattr(self, "last_metrics", {}).items()})
        out.update({f"private/{self.name}/{k}": v for k, v in getattr(self, "private_metrics", {}).items()})
        return out

    def _run(self, trainer, pl_module, tag: str, final: bool) -> None:
        logger = mlflow_logger_of(trainer)
        if not self.enabled or logger is None or not trainer.is_global_zero or not pl_module.has_release:
            return
        if not release_allowed(pl_module):  # smooth_sensitivity: nothing of the generator leaves the run
            return                          # before its ε is released and meets the target

        self._last_step = trainer.global_step
        try:
            with progress_bars(trainer.progress_bar_callback is not None):
                self.evaluate(trainer, pl_module, tag=tag, final=final)
        except Exception as err:  # noqa: BLE001 - reported in the run; training already happened
            message = f"{type(self).__name__} failed at step {trainer.global_step}: {type(err).__name__}"
            warnings.warn(f"{message}: {err}", stacklevel=2)
            # A private run's log gets the type only: a message may describe the real data (as the summary's error tag).
            logged = f"{message} (the message was printed, not logged)" if is_private(pl_module) else f"{message}: {err}"
            logger.experiment.set_tag(logger.run_id, f"{self.name}_error", logged[:5000])

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
