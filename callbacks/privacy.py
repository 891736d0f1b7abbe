"""PrivacyBudget: ε on the progress bar and in MLflow every step, and why training stopped."""

from __future__ import annotations

import pytorch_lightning as pl

from lightning_gpate.tracking import mlflow_logger_of


class PrivacyBudget(pl.Callback):
    """Log the privacy spent by a :class:`~lightning_gpate.models.private.PrivateGenerativeModel`.

    Every private model adds this callback itself (``configure_callbacks``); the budget and the stop
    *before* an over-budget update are enforced by the model (``charge``), so a run without this
    callback is just as private. Logged per step: ``epsilon`` (the guarantee in force, also on the
    progress bar) and ``epsilon_<analysis>`` (the paper-style analysis, e.g.
    ``epsilon_data_dependent``, which is NOT itself a guarantee). At the end: the accountant's
    summary as ``privacy/*`` params, the final ε as metrics, and tags ``stop_reason`` and
    ``privacy_guarantee`` (``false`` when the budget used paper-style accounting).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        acc = pl_module.accountant
        pl_module.log("epsilon", pl_module.guarantee_epsilon(), prog_bar=True, on_step=True, on_epoch=False, rank_zero_only=True)
        if acc.paper_label != "guarantee":  # a separate paper-style analysis exists: log it beside
            pl_module.log(f"epsilon_{acc.paper_label}", acc.epsilon_paper(), on_step=True, on_epoch=False, rank_zero_only=True)
        if pl_module.budget_exhausted:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        reason = pl_module.stop_reason
        if reason is None:
            reason = "step or epoch limit reached" if trainer.global_step > 0 else "no training step"
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        client, run_id = logger.experiment, logger.run_id
        summary = pl_module.accountant.summary()
        client.log_metric(run_id, "epsilon_final", pl_module.guarantee_epsilon())
        if pl_module.guarantee_epsilon() != summary["epsilon"]:  # a tighter analysis than RDP is in force
            client.log_metric(run_id, "epsilon_final_rdp", summary["epsilon"])
        client.log_metric(run_id, f"epsilon_final_{summary['analysis']}", summary["epsilon_paper"])
        for key in ("delta", "analysis", "conversion", "best_order", "orders"):
            client.log_param(run_id, f"privacy/{key}", str(summary[key])[:500])
        client.log_param(run_id, "privacy/epsilon_budget", pl_module.epsilon_budget)
        client.log_param(run_id, "privacy/budget_accounting", pl_module.budget_accounting)
        client.set_tag(run_id, "stop_reason", reason)
        client.set_tag(run_id, "privacy_guarantee", str(pl_module.budget_accounting == "guarantee").lower())
        client.log_dict(run_id, pl_module.accountant.state_dict(), "privacy/accountant.json")
