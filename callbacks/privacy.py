"""PrivacyBudget: ε on the progress bar and in MLflow every step, and why training stopped; and the
one place that decides which privacy quantities may leave a run (logs, release artifact)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from lightning_gpate.privacy.accountant import DATA_DEPENDENT, GUARANTEE
from lightning_gpate.tracking import mlflow_logger_of


# ----------------------------------------------------------------------------- what may be released
def paper_analysis_released(pl_module) -> bool:
    """Whether the accountant's paper-style ε may leave the run (be logged or released).

    A data-dependent analysis (PATE's ε from the vote histograms, without smooth sensitivity) is a
    function of the private votes without noise: it is released only when the user asked for
    paper-style accounting (``budget_accounting: paper``, whose run is tagged as not a guarantee).
    A data-independent paper analysis (GS-WGAN's per-sample composition) depends on public settings
    only and is always released.
    """
    label = pl_module.accountant.paper_label
    if label == GUARANTEE:
        return False  # no separate analysis
    if pl_module.budget_accounting == "paper":
        return True
    return DATA_DEPENDENT not in label.split("+")


def released_epsilons(pl_module) -> dict[str, float]:
    """The ε values that may be logged now: ``epsilon`` (the guarantee) and, where
    :func:`paper_analysis_released`, ``epsilon_<analysis>``."""
    acc = pl_module.accountant
    out = {"epsilon": pl_module.guarantee_epsilon()}
    if out["epsilon"] != acc.epsilon():  # a tighter analysis than RDP is in force (DP-GAN's PLD): RDP beside it
        out["epsilon_rdp"] = acc.epsilon()
    if paper_analysis_released(pl_module):
        out[f"epsilon_{acc.paper_label}"] = acc.epsilon_paper()
    return out


def released_accountant_state(pl_module) -> dict[str, Any]:
    """The accountant's state as it may be released: a paper-style curve that may not be
    (:func:`paper_analysis_released`) is replaced by the guarantee's, and its name is kept under
    ``withheld_analysis``. The full state stays in the private training checkpoint."""
    acc = pl_module.accountant
    state = acc.state_dict()
    if acc.paper_label != GUARANTEE and not paper_analysis_released(pl_module):
        state["rdp_paper"] = list(state["rdp"])
        state["labels"] = []
        state["withheld_analysis"] = acc.paper_label
    return state


def released_summary(pl_module) -> dict[str, Any]:
    """The accountant's summary (ε, δ, analysis, best order, counts) as it may be released."""
    acc = pl_module.accountant
    summary = acc.summary()
    if pl_module.guarantee_epsilon() != summary["epsilon"]:
        summary.update(epsilon=pl_module.guarantee_epsilon(), epsilon_rdp=summary["epsilon"])
    if acc.paper_label != GUARANTEE and not paper_analysis_released(pl_module):
        summary.update(epsilon_paper=summary["epsilon"], best_order_paper=summary["best_order"],
                       analysis=GUARANTEE, withheld_analysis=acc.paper_label)
    return summary


def released_privacy(pl_module) -> dict[str, Any]:
    """Everything about a private model's privacy that its release artifact holds."""
    return {
        "epsilon_budget": float(pl_module.epsilon_budget),
        "delta": float(pl_module.delta),
        "budget_accounting": pl_module.budget_accounting,
        "privacy_guarantee": pl_module.budget_accounting == "guarantee",
        "neighbouring_relation": pl_module.accountant.neighbouring,
        "budget_exhausted": bool(pl_module.budget_exhausted),
        "stop_reason": pl_module.stop_reason,
        "summary": released_summary(pl_module),
        "accountant": released_accountant_state(pl_module),
    }


class PrivacyBudget(pl.Callback):
    """Log the privacy spent by a :class:`~lightning_gpate.models.private.PrivateGenerativeModel`.

    Every private model adds this callback itself (``configure_callbacks``); the budget and the stop
    *before* an over-budget update are enforced by the model (``charge``), so a run without this
    callback is just as private. What it logs is decided in one place, :func:`released_epsilons` /
    :func:`released_summary` / :func:`released_accountant_state`: per step ``epsilon`` (the guarantee
    in force, also on the progress bar) and, where it may be released, ``epsilon_<analysis>`` (a
    paper-style analysis: GS-WGAN's data-independent per-sample composition always; PATE's
    data-dependent ε only under ``budget_accounting: paper``, since it is a function of the private
    votes without noise). At the end: the released summary as ``privacy/*`` params, the final ε as
    metrics, the released accountant state (``privacy/accountant.json``), and tags ``stop_reason``
    and ``privacy_guarantee`` (``false`` when the budget used paper-style accounting).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, value in released_epsilons(pl_module).items():
            pl_module.log(name, value, prog_bar=name == "epsilon", on_step=True, on_epoch=False, rank_zero_only=True)
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
        for name, value in released_epsilons(pl_module).items():
            client.log_metric(run_id, name.replace("epsilon", "epsilon_final", 1), value)
        summary = released_summary(pl_module)
        for key in ("delta", "analysis", "neighbouring_relation", "conversion", "best_order", "orders"):
            client.log_param(run_id, f"privacy/{key}", str(summary[key])[:500])
        client.log_param(run_id, "privacy/epsilon_budget", pl_module.epsilon_budget)
        client.log_param(run_id, "privacy/budget_accounting", pl_module.budget_accounting)
        client.set_tag(run_id, "stop_reason", reason)
        client.set_tag(run_id, "privacy_guarantee", str(pl_module.budget_accounting == "guarantee").lower())
        client.log_dict(run_id, released_accountant_state(pl_module), "privacy/accountant.json")
