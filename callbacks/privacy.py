"""PrivacyBudget: ε on the progress bar and in MLflow every step, and why training stopped. What may be
logged is decided by :mod:`lightning_gpate.privacy.disclosure`."""

from __future__ import annotations

import pytorch_lightning as pl

from lightning_gpate.errors import NoPrivateStepError
from lightning_gpate.privacy.disclosure import (
    released_accountant_state,
    released_epsilons,
    released_smooth_sensitivity,
    released_summary,
    stop_reason,
)
from lightning_gpate.tracking import mlflow_logger_of


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
    and ``privacy_guarantee`` (``false`` when the budget used paper-style accounting,
    ``smooth_sensitivity`` for a smooth-sensitivity release: :func:`log_smooth_sensitivity_release`).
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, value in released_epsilons(pl_module).items():
            pl_module.log(name, value, prog_bar=name == "epsilon", on_step=True, on_epoch=False, rank_zero_only=True)
        if pl_module.budget_exhausted:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.finalize_privacy()  # the smooth-sensitivity release, before anything is logged
        reason = stop_reason(trainer, pl_module)
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
        guarantee = str(pl_module.budget_accounting == "guarantee").lower()
        if pl_module.smooth_sensitivity is not None:
            guarantee = "smooth_sensitivity"
            log_smooth_sensitivity_release(client, run_id, pl_module, step=last_logged_step(trainer))
        client.set_tag(run_id, "privacy_guarantee", guarantee)
        client.log_dict(run_id, released_accountant_state(pl_module), "privacy/accountant.json")


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


def log_smooth_sensitivity_release(client, run_id: str, pl_module, *, step: int) -> None:
    """MLflow record of a smooth-sensitivity release (:func:`released_smooth_sensitivity`): only
    public or noised values.

    Metrics: ``epsilon`` (the ε in force after the release, at the last step),
    ``epsilon_smooth_sensitivity`` (the released ε), ``epsilon_data_independent`` (the guarantee of
    everything released, ≤ ``epsilon_hard_cap``), ``smooth_sensitivity_noisy_rdp`` (the released
    noisy data-dependent RDP at λ) and ``smooth_sensitivity_gnss_rdp``. Params: λ, β, σ_ss, how they
    were chosen, the hard cap. Tags: ``release_allowed``, ``epsilon_analysis``. Never the unnoised
    data-dependent ε nor the smooth sensitivity itself.
    """
    info = released_smooth_sensitivity(pl_module)
    released, params = info["released"], info["params"]
    for key, value in (("epsilon", info["epsilon"]), ("epsilon_smooth_sensitivity", released["epsilon"]),
                       ("epsilon_data_independent", info["epsilon_data_independent"]),
                       ("smooth_sensitivity_noisy_rdp", released["noisy_rdp"]),
                       ("smooth_sensitivity_gnss_rdp", released["gnss_rdp"])):
        client.log_metric(run_id, key, value, step=step)
    for key in ("order", "beta", "sigma", "rule"):
        client.log_param(run_id, f"privacy/smooth_sensitivity_{key}", params[key])
    client.log_param(run_id, "privacy/epsilon_hard_cap", info["epsilon_hard_cap"])
    client.set_tag(run_id, "release_allowed", str(info["release_allowed"]).lower())
    client.set_tag(run_id, "epsilon_analysis", info["epsilon_analysis"])
