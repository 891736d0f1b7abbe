"""Disclosure: what may leave a private run, decided in one place.

A run's outputs — the per-step and final MLflow record, the end-of-fit summary, the release artifact,
what ``sample`` and ``evaluate`` read and log — are built from the functions here; the callbacks
(:mod:`callbacks.privacy`, :mod:`callbacks.summary`, :mod:`callbacks.artifacts`) and
:mod:`lightning_gpate.release` only write what these return. Nothing here imports Lightning, MLflow,
the models or the callbacks: a private model is read through its attributes (``accountant``,
``budget_accounting``, ``smooth_sensitivity``, …).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from .accountant import DATA_DEPENDENT, GUARANTEE

#: Prefix of evaluation figures of a private model computed from its real training split without noise.
PRIVATE_PREFIX = "private/"


# ----------------------------------------------------------------------------- ε, summaries, artifact
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
    """The ε values that may be logged now: ``epsilon`` (the ε in force: the guarantee, or after a
    smooth-sensitivity release the released ε, see ``epsilon_in_force``) and, where
    :func:`paper_analysis_released`, ``epsilon_<analysis>`` (never in smooth_sensitivity mode: its
    data-dependent ε leaves the run only once, noised)."""
    acc = pl_module.accountant
    out = {"epsilon": pl_module.epsilon_in_force()}
    if out["epsilon"] != acc.epsilon() and pl_module.smooth_sensitivity is None:
        out["epsilon_rdp"] = acc.epsilon()  # a tighter analysis than RDP is in force (DP-GAN's PLD): RDP beside it
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
    if pl_module.smooth_sensitivity is None and pl_module.guarantee_epsilon() != summary["epsilon"]:
        summary.update(epsilon=pl_module.guarantee_epsilon(), epsilon_rdp=summary["epsilon"])
    if acc.paper_label != GUARANTEE and not paper_analysis_released(pl_module):
        summary.update(epsilon_paper=summary["epsilon"], best_order_paper=summary["best_order"],
                       analysis=GUARANTEE, withheld_analysis=acc.paper_label)
    return summary


def released_smooth_sensitivity(pl_module) -> dict[str, Any] | None:
    """What a smooth-sensitivity run releases about its ε (``None`` in the other modes): the GNSS
    parameters, the released (noised) values, the ε in force and which analysis gave it, the hard
    cap and the release decision. Never the ledger (sums over the private votes)."""
    ss = getattr(pl_module, "smooth_sensitivity", None)
    if ss is None:
        return None
    out = {**ss.public_state(), "epsilon_hard_cap": pl_module.epsilon_hard_cap,
           "release_allowed": pl_module.release_allowed()}
    if ss.released is not None:
        out["epsilon"], out["epsilon_analysis"] = pl_module.released_epsilon()
        out["epsilon_data_independent"] = pl_module.accountant.epsilon()
    return out


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
        "smooth_sensitivity": released_smooth_sensitivity(pl_module),
    }


def privacy_lines(pl_module) -> list[str]:
    acc = getattr(pl_module, "accountant", None)
    if acc is None or not hasattr(pl_module, "epsilon_budget"):
        return ["none: a non-private model (no privacy guarantee)"]
    budget, delta = pl_module.epsilon_budget, acc.delta
    label = acc.paper_label
    if pl_module.budget_accounting == "paper":
        return [
            f"ε = {acc.epsilon_paper():.4f} spent of the budget ε = {budget:g} (δ = {delta:g}) by the paper's "
            f"{label.replace('_', '-')} analysis: NOT a guarantee",
            f"the guarantee in force is ε = {acc.epsilon():.4f}",
        ]
    if getattr(pl_module, "smooth_sensitivity", None) is not None:
        return smooth_sensitivity_lines(pl_module, budget, delta)
    lines = [f"ε = {acc.epsilon():.4f} spent of the budget ε = {budget:g} (δ = {delta:g}): an (ε, δ)-DP guarantee"]
    if label != "guarantee" and not math.isclose(acc.epsilon_paper(), acc.epsilon(), rel_tol=1e-6):
        lines.append(f"the paper's {label.replace('_', '-')} analysis gives ε = {acc.epsilon_paper():.4f} (not a guarantee)")
    return lines


def smooth_sensitivity_lines(pl_module, budget: float, delta: float) -> list[str]:
    """A smooth-sensitivity run: the ε in force (released, or the data-independent bound if the
    release did not happen), against the target ``epsilon`` and the hard cap."""
    info = released_smooth_sensitivity(pl_module)
    independent = pl_module.accountant.epsilon()
    if info is None or info.get("released") is None:
        return [f"ε = {independent:.4f} (δ = {delta:g}) by the data-independent bound (hard cap "
                f"{pl_module.epsilon_hard_cap:g}): an (ε, δ)-DP guarantee; no smooth-sensitivity release was made"]
    released = info["released"]["epsilon"]
    return [f"ε = {info['epsilon']:.4f} (δ = {delta:g}) in force, target ε = {budget:g}: an (ε, δ)-DP guarantee "
            f"({info['epsilon_analysis'].replace('_', '-')})",
            f"smooth-sensitivity release ε = {released:.4f} (noised); data-independent bound of everything "
            f"released ε = {independent:.4f} (hard cap {pl_module.epsilon_hard_cap:g})"]


# ----------------------------------------------------------------------------- the release decision, the stop reason
def release_allowed(pl_module) -> bool:
    """Whether the model's release artifact may be written: ``False`` only for a
    ``budget_accounting: smooth_sensitivity`` run whose released ε exceeds its target (or before
    its release; :meth:`~lightning_gpate.models.private.PrivateGenerativeModel.release_allowed`)."""
    check = getattr(pl_module, "release_allowed", None)
    return True if check is None else bool(check())


def stop_reason(trainer, pl_module) -> str:
    """Why training stopped: the model's own reason (e.g. the privacy budget), else the Trainer's limits."""
    reason = getattr(pl_module, "stop_reason", None)
    if reason:
        return reason
    if trainer.global_step == 0:
        return "no training step"
    if trainer.max_steps is not None and trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
        return f"max_steps={trainer.max_steps} reached"
    if trainer.max_epochs is not None and trainer.max_epochs >= 0 and trainer.current_epoch >= trainer.max_epochs:
        return f"max_epochs={trainer.max_epochs} reached"
    if trainer.should_stop:
        return "stopped by a callback (e.g. early stopping)"
    return "step or epoch limit reached"


# ----------------------------------------------------------------------------- evaluation
def is_private(model) -> bool:
    """Whether ``model`` is a private generator (it holds a privacy accountant)."""
    return getattr(model, "accountant", None) is not None


def real_baselines_allowed(model, requested: bool | None = None) -> bool:
    """Whether evaluation may compute figures from the real training split without noise (Setting A,
    ranking agreements with A, a feature network trained on it).

    ``requested``: an explicit choice; ``None`` (default): always for a non-private model, for a
    private one only when it logs private diagnostics (``log_private_diagnostics: true``).
    """
    if requested is not None:
        return bool(requested)
    return not is_private(model) or bool(getattr(model, "log_private_diagnostics", False))


def split_private(model, metrics: Mapping[str, float], private: Callable[[str], bool]) -> tuple[dict[str, float], dict[str, float]]:
    """``metrics`` as ``(public, private)``: for a private model, the names ``private`` picks go to the
    second dict (to be logged under :data:`PRIVATE_PREFIX`); a non-private model keeps everything public."""
    if not is_private(model):
        return dict(metrics), {}
    return ({k: v for k, v in metrics.items() if not private(k)}, {k: v for k, v in metrics.items() if private(k)})
