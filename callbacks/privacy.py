"""PrivacyBudget: ε on the progress bar and in MLflow every step, and the run's privacy record at the end.
What it writes is decided by :mod:`lightning_gpate.privacy.disclosure`; this callback only writes it."""

from __future__ import annotations

import pytorch_lightning as pl

from lightning_gpate.errors import NoPrivateStepError
from lightning_gpate.privacy.disclosure import final_record, released_epsilons
from lightning_gpate.tracking import mlflow_logger_of


class PrivacyBudget(pl.Callback):
    """Report the privacy of a :class:`~lightning_gpate.models.private.PrivateGenerativeModel`.

    Every private model adds this callback itself (``configure_callbacks``); the budget and the stop
    *before* an over-budget update are enforced by the model (``charge``), so a run without this
    callback is just as private. It writes what the disclosure policy returns: per step
    :func:`~lightning_gpate.privacy.disclosure.released_epsilons` (``epsilon``, the guarantee, also on
    the progress bar), at the end :func:`~lightning_gpate.privacy.disclosure.final_record` (final ε
    metrics, ``privacy/*`` params, tags ``stop_reason``, ``privacy_guarantee``, ``privacy_scope``, and
    the released accountant state as ``privacy/accountant.json``).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, value in released_epsilons(pl_module).items():
            pl_module.log(name, value, prog_bar=name == "epsilon", on_step=True, on_epoch=False, rank_zero_only=True)
        if pl_module.budget_exhausted:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.finalize_privacy()  # the smooth-sensitivity release, before anything is logged
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        client, run_id = logger.experiment, logger.run_id
        record = final_record(trainer, pl_module)
        step = last_logged_step(trainer)
        for name, value in record["metrics"].items():
            client.log_metric(run_id, name, value, step=step)
        for name, value in record["params"].items():
            client.log_param(run_id, name, value)
        for name, value in record["tags"].items():
            client.set_tag(run_id, name, value)
        client.log_dict(run_id, record["accountant_state"], "privacy/accountant.json")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # A budget that refused the first step (NoPrivateStepError) fails the run: it still says why.
        # The reason is computed from public settings and the accountant only (never from data values).
        logger = mlflow_logger_of(trainer)
        if (not isinstance(exception, NoPrivateStepError) or logger is None or trainer.global_rank != 0
                or getattr(logger, "_run_id", None) is None or not pl_module.stop_reason):
            return
        logger.experiment.set_tag(logger.run_id, "stop_reason", pl_module.stop_reason)


def last_logged_step(trainer) -> int:
    """The step of the last per-step metric Lightning logged: its loggers count batches
    (``_batches_that_stepped``), which exceed ``global_step`` when batches step no Lightning optimizer
    (G-PATE's free teacher warm-up). A final value logged at a smaller step would not be the run's
    latest value in MLflow."""
    batches = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", 0)
    return max(int(trainer.global_step), int(batches))
