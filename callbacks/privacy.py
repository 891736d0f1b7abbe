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
    ``epsilon_data_dependent``, which is NOT itself a guarantee; not in smooth_sensitivity mode). At
    the end: the accountant's summary as ``privacy/*`` params, the final ε as metrics, and tags
    ``stop_reason`` and ``privacy_guarantee`` (``false`` when the budget used paper-style
    accounting, ``smooth_sensitivity`` for a smooth-sensitivity release, see
    :func:`log_smooth_sensitivity_release`).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        acc = pl_module.accountant
        pl_module.log("epsilon", pl_module.epsilon_in_force(), prog_bar=True, on_step=True, on_epoch=False, rank_zero_only=True)
        # A separate paper-style analysis exists: log it beside (never in smooth_sensitivity mode,
        # where the data-dependent ε is released only once, with noise, at the end).
        if acc.paper_label != "guarantee" and pl_module.smooth_sensitivity is None:
            pl_module.log(f"epsilon_{acc.paper_label}", acc.epsilon_paper(), on_step=True, on_epoch=False, rank_zero_only=True)
        if pl_module.budget_exhausted:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.finalize_privacy()  # the smooth-sensitivity release, before anything is logged
        reason = pl_module.stop_reason
        if reason is None:
            reason = "step or epoch limit reached" if trainer.global_step > 0 else "no training step"
        logger = mlflow_logger_of(trainer)
        if logger is None or trainer.global_rank != 0:
            return
        client, run_id = logger.experiment, logger.run_id
        summary = pl_module.accountant.summary()
        ss = pl_module.smooth_sensitivity
        state = pl_module.accountant.state_dict()
        if ss is None:
            client.log_metric(run_id, "epsilon_final", summary["epsilon"])
            client.log_metric(run_id, f"epsilon_final_{summary['analysis']}", summary["epsilon_paper"])
        else:
            log_smooth_sensitivity_release(client, run_id, pl_module, step=trainer.global_step)
            summary["analysis"] = "guarantee"  # the data-dependent curve is withheld: it is not released
            state.update(rdp_paper=list(state["rdp"]), labels=[], withheld_analysis="data_dependent")
        for key in ("delta", "analysis", "conversion", "best_order", "orders"):
            client.log_param(run_id, f"privacy/{key}", str(summary[key])[:500])
        client.log_param(run_id, "privacy/epsilon_budget", pl_module.epsilon_budget)
        client.log_param(run_id, "privacy/budget_accounting", pl_module.budget_accounting)
        client.set_tag(run_id, "stop_reason", reason)
        guarantee = "smooth_sensitivity" if ss is not None else str(pl_module.budget_accounting == "guarantee").lower()
        client.set_tag(run_id, "privacy_guarantee", guarantee)
        client.log_dict(run_id, state, "privacy/accountant.json")


def log_smooth_sensitivity_release(client, run_id: str, pl_module, *, step: int) -> None:
    """MLflow record of a smooth-sensitivity release: only public or noised values.

    Metrics: ``epsilon`` and ``epsilon_final`` (the ε in force: :meth:`released_epsilon`),
    ``epsilon_smooth_sensitivity`` (the released ε), ``epsilon_data_independent`` (the guarantee of
    everything released, ≤ ``epsilon_hard_cap``), ``smooth_sensitivity_noisy_rdp`` (the released
    noisy data-dependent RDP at λ) and ``smooth_sensitivity_gnss_rdp``. Params: λ, β, σ_ss, how they
    were chosen, the hard cap. Tags: ``release_allowed``, ``epsilon_analysis``. Never the
    unnoised data-dependent ε nor the smooth sensitivity itself.
    """
    ss = pl_module.smooth_sensitivity
    released = ss.released
    final, analysis = pl_module.released_epsilon()
    for key, value in (("epsilon", final), ("epsilon_final", final), ("epsilon_smooth_sensitivity", released.epsilon),
                       ("epsilon_data_independent", pl_module.accountant.epsilon()),
                       ("smooth_sensitivity_noisy_rdp", released.noisy_rdp), ("smooth_sensitivity_gnss_rdp", released.gnss_rdp)):
        client.log_metric(run_id, key, value, step=step)
    for key, value in (("order", ss.params.order), ("beta", ss.params.beta), ("sigma", ss.params.sigma), ("rule", ss.params.rule)):
        client.log_param(run_id, f"privacy/smooth_sensitivity_{key}", value)
    client.log_param(run_id, "privacy/epsilon_hard_cap", pl_module.epsilon_hard_cap)
    client.set_tag(run_id, "release_allowed", str(pl_module.release_allowed()).lower())
    client.set_tag(run_id, "epsilon_analysis", analysis)
