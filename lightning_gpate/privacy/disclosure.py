"""Disclosure: what may leave a private run, decided in one place.

A run's outputs — the per-step and final MLflow record, the end-of-fit summary, the release artifact,
the lines printed at a smooth-sensitivity release, what ``sample``, ``evaluate`` and the Python API read
and log — are built from the functions here; the callbacks (:mod:`callbacks.privacy`,
:mod:`callbacks.summary`, :mod:`callbacks.artifacts`, the evaluation callbacks) and
:mod:`lightning_gpate.release` only write what these return. Nothing here imports Lightning, MLflow,
the models or the callbacks: a private model is read through its attributes (``accountant``,
``budget_accounting``, ``smooth_sensitivity``, ``guarantee_epsilon()``, …).

What each ε figure is, per ``budget_accounting``:

* ``epsilon`` (every mode): the (ε, δ)-DP guarantee of everything the run released, for adding or
  removing one record: the smaller of the budget the stop rule enforced (not in ``paper`` mode) and
  the worst case of the steps taken (:meth:`~lightning_gpate.models.private.PrivateGenerativeModel.guarantee_epsilon`);
  in ``smooth_sensitivity`` mode the data-independent bound, within ``epsilon_hard_cap``. It is no
  guarantee when a mechanism seed was fixed (:func:`fixed_mechanism_seeds`): the tag
  ``privacy_guarantee`` then says ``false``.
* ``epsilon_<analysis>`` (``data_dependent``, ``per_sample_composition``): the paper's analysis, NOT a
  guarantee. A data-dependent one is computed (and shown) only under ``budget_accounting: paper``: it is
  a function of the private votes without noise.
* ``epsilon_smooth_sensitivity`` (``smooth_sensitivity`` mode, at the end): the data-dependent ε,
  released with smooth sensitivity (Papernot et al. 2018) as an upper bound that holds with
  probability 1 − δ′: what decides whether the release artifact is written; not a DP guarantee.
* ``epsilon_rdp`` (DP-GAN with ``accountant: pld``): the RDP bound beside the tighter PLD one in force.
* ``epsilon_budget_spent_by_filter`` (every step, where the stop rule is a privacy filter): how much of
  the budget the filter has spent (the guarantee's analysis of the costs recorded,
  :meth:`~lightning_gpate.models.private.PrivateGenerativeModel.realised_epsilon`). It climbs on after
  ``epsilon`` has reached the budget when answered queries cost less than their worst case, and the run
  stops when its next step could take it past the budget; not a guarantee itself (``epsilon`` is).

Scope (:data:`PRIVACY_SCOPE`): ε covers the release artifact and the training logs. Evaluations on the
held-out rows of the same data (test and validation splits) use those rows without noise.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .accountant import DATA_DEPENDENT, GUARANTEE

#: The per-step metric of how much of the budget the privacy filter has spent (see the module's list).
BUDGET_SPENT_METRIC = "epsilon_budget_spent_by_filter"
#: Prefix of evaluation figures of a private model computed from its real training split without noise.
PRIVATE_PREFIX = "private/"
#: What a private run's ε covers (the tag ``privacy_scope``, the artifact's ``scope``, the summary).
PRIVACY_SCOPE = ("epsilon covers the release artifact and the training logs; evaluations on held-out rows "
                 "(utility/*, quality/*, evaluation/, plots/) are not private")


# ----------------------------------------------------------------------------- is it a guarantee
def fixed_mechanism_seeds(model) -> list[str]:
    """The mechanism seeds fixed for this run (``noise_seed`` of the model, ``metadata_seed`` of the
    DP metadata): with one, anyone who knows it can replay the noise, so the run carries no guarantee.
    They exist for tests."""
    hparams = getattr(model, "hparams", None) or {}
    seeds = ["noise_seed"] if hparams.get("noise_seed") is not None else []
    spec = getattr(model, "data_spec", None) or {}
    if any(cost.get("mechanism_seed") == "fixed" for cost in spec.get("metadata_cost", [])):
        seeds.append("metadata_seed")
    return seeds


def is_guarantee(model) -> bool:
    """Whether the run's ``epsilon`` is an (ε, δ)-DP guarantee: not under ``budget_accounting: paper``
    (the budget then follows a paper's analysis), and no mechanism seed fixed."""
    return model.budget_accounting != "paper" and not fixed_mechanism_seeds(model)


def not_a_guarantee_because(model) -> str | None:
    """Why the run is not a guarantee, in words (``None`` when it is one)."""
    reasons = []
    if model.budget_accounting == "paper":
        reasons.append(f"the budget follows the paper's {model.accountant.paper_label.replace('_', '-')} analysis")
    seeds = fixed_mechanism_seeds(model)
    if seeds:
        reasons.append(f"{' and '.join(seeds)} fixed: anyone who knows {'it' if len(seeds) == 1 else 'them'} can replay the noise")
    return "; ".join(reasons) or None


# ----------------------------------------------------------------------------- ε, summaries, artifact
def paper_analysis_released(pl_module) -> bool:
    """Whether the accountant's paper-style ε may leave the run (be logged or released).

    A data-dependent analysis (PATE's ε from the vote histograms, without smooth sensitivity) is a
    function of the private votes without noise: it is computed and released only when the user asked
    for paper-style accounting (``budget_accounting: paper``, whose run is tagged as not a guarantee).
    A data-independent paper analysis (GS-WGAN's per-sample composition) depends on public settings
    only and is always released.
    """
    label = pl_module.accountant.paper_label
    if label == GUARANTEE:
        return False  # no separate analysis
    if pl_module.budget_accounting == "paper":
        return True
    return DATA_DEPENDENT not in label.split("+")


def _rdp_beside(pl_module) -> float | None:
    """The RDP guarantee where a tighter analysis is in force (DP-GAN's ``accountant: pld``), else None."""
    rdp = getattr(pl_module, "rdp_guarantee_epsilon", None)
    if rdp is None or pl_module.smooth_sensitivity is not None:
        return None
    value = rdp()
    return value if value != pl_module.guarantee_epsilon() else None


def released_epsilons(pl_module) -> dict[str, float]:
    """The ε values that may be logged at every step: ``epsilon`` (the guarantee,
    ``guarantee_epsilon``), :data:`BUDGET_SPENT_METRIC` where the stop rule is a privacy filter (its
    costs are functions of the mechanisms' released outputs: post-processing), ``epsilon_rdp`` beside
    a tighter analysis, and, where :func:`paper_analysis_released`, ``epsilon_<analysis>``."""
    acc = pl_module.accountant
    out = {"epsilon": pl_module.guarantee_epsilon()}
    if pl_module.stop_rule_filters_rdp():
        out[BUDGET_SPENT_METRIC] = pl_module.realised_epsilon()
    rdp = _rdp_beside(pl_module)
    if rdp is not None:
        out["epsilon_rdp"] = rdp
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


#: The key of the release summary's ε of the costs recorded: the name says it is no guarantee.
#: Artifacts written before issue 33 call it ``epsilon_realised``.
REALISED_KEY = "epsilon_realised_not_a_bound"


def released_summary(pl_module) -> dict[str, Any]:
    """The accountant's summary as it may be released: ``epsilon`` the guarantee and ``best_order`` its
    Rényi order (``None`` where the guarantee is the budget stop's limit or a PLD bound:
    :meth:`~lightning_gpate.models.private.PrivateGenerativeModel.guarantee_order`);
    ``epsilon_realised_not_a_bound`` (:data:`REALISED_KEY`) the guarantee's analysis of the costs
    recorded, which is not a bound for a run that ended before its budget; ``epsilon_worst_case`` that
    of the worst case of the steps taken; the paper-style ε only where it may be released (else equal to
    ``epsilon``); δ, counts."""
    acc = pl_module.accountant
    summary = acc.summary()
    summary[REALISED_KEY] = summary["epsilon"]
    summary["epsilon"] = pl_module.guarantee_epsilon()
    summary["best_order"] = pl_module.guarantee_order()
    rdp = _rdp_beside(pl_module)
    if rdp is not None:
        summary["epsilon_rdp"] = rdp
    if not paper_analysis_released(pl_module):
        summary.update(epsilon_paper=summary["epsilon"], best_order_paper=summary["best_order"], analysis=GUARANTEE)
        if acc.paper_label != GUARANTEE:
            summary["withheld_analysis"] = acc.paper_label
    return summary


def released_smooth_sensitivity(pl_module) -> dict[str, Any] | None:
    """What a smooth-sensitivity run releases about its ε (``None`` in the other modes): the GNSS
    parameters, the release (noised: the data-dependent ε as an upper bound with probability 1 − δ′),
    the hard cap and the release decision. Never the ledger (sums over the private votes)."""
    ss = getattr(pl_module, "smooth_sensitivity", None)
    if ss is None:
        return None
    out = {**ss.public_state(), "epsilon_hard_cap": pl_module.epsilon_hard_cap,
           "release_allowed": pl_module.release_allowed()}
    if ss.released is not None:
        out["epsilon_data_dependent"] = pl_module.smooth_sensitivity_epsilon()
    return out


def released_privacy(pl_module) -> dict[str, Any]:
    """Everything about a private model's privacy that its release artifact holds."""
    return {
        "epsilon": float(pl_module.guarantee_epsilon()),
        "epsilon_budget": float(pl_module.epsilon_budget),
        "delta": float(pl_module.delta),
        "budget_accounting": pl_module.budget_accounting,
        "privacy_guarantee": is_guarantee(pl_module),
        "not_a_guarantee_because": not_a_guarantee_because(pl_module),
        "scope": PRIVACY_SCOPE,
        "neighbouring_relation": pl_module.accountant.neighbouring,
        "budget_exhausted": bool(pl_module.budget_exhausted),
        "stop_reason": pl_module.stop_reason,
        "summary": released_summary(pl_module),
        "accountant": released_accountant_state(pl_module),
        "smooth_sensitivity": released_smooth_sensitivity(pl_module),
    }


# ----------------------------------------------------------------------------- the MLflow record of a run
def guarantee_tag(pl_module) -> str:
    """The ``privacy_guarantee`` tag: ``"true"`` or ``"false"`` (:func:`is_guarantee`)."""
    return str(is_guarantee(pl_module)).lower()


def final_record(trainer, pl_module) -> dict[str, dict[str, Any]]:
    """What the end of a fit logs to MLflow: ``{"metrics", "params", "tags", "accountant_state"}``.

    Metrics ``epsilon_final*`` (:func:`released_epsilons`) and, after a smooth-sensitivity release,
    ``epsilon_smooth_sensitivity`` (the released data-dependent ε), ``smooth_sensitivity_noisy_rdp``
    (the released upper bound of the data-dependent RDP at λ) and ``smooth_sensitivity_gnss_rdp``;
    params ``privacy/*`` (δ, analysis, relation, conversion, best order, orders, budget, accounting;
    λ, β, σ_ss, δ′, the rule and the hard cap of a smooth-sensitivity release); tags ``stop_reason``,
    ``privacy_guarantee``, ``privacy_scope`` (and ``not_a_guarantee_because``, ``release_allowed``).
    Never an unnoised data-dependent ε nor the smooth sensitivity itself.
    """
    summary = released_summary(pl_module)
    metrics = {name.replace("epsilon", "epsilon_final", 1): value for name, value in released_epsilons(pl_module).items()}
    params: dict[str, Any] = {f"privacy/{key}": str(summary[key])[:500]
                              for key in ("delta", "analysis", "neighbouring_relation", "conversion", "best_order", "orders")}
    if summary["best_order"] is None:
        params["privacy/best_order"] = "none (the guarantee is the budget the stop rule kept, or a PLD bound)"
    params.update({"privacy/epsilon_budget": pl_module.epsilon_budget, "privacy/budget_accounting": pl_module.budget_accounting})
    tags = {"stop_reason": stop_reason(trainer, pl_module), "privacy_guarantee": guarantee_tag(pl_module),
            "privacy_scope": PRIVACY_SCOPE}
    why = not_a_guarantee_because(pl_module)
    if why:
        tags["not_a_guarantee_because"] = why
    info = released_smooth_sensitivity(pl_module)
    if info is not None:
        for key in ("order", "beta", "sigma", "rule", "delta_prime"):
            params[f"privacy/smooth_sensitivity_{key}"] = info["params"][key]
        params["privacy/epsilon_hard_cap"] = info["epsilon_hard_cap"]
        tags["release_allowed"] = str(info["release_allowed"]).lower()
        released = info["released"]
        if released is not None:
            metrics.update(epsilon_smooth_sensitivity=released["epsilon"], smooth_sensitivity_noisy_rdp=released["noisy_rdp"],
                           smooth_sensitivity_gnss_rdp=released["gnss_rdp"])
    return {"metrics": metrics, "params": params, "tags": tags, "accountant_state": released_accountant_state(pl_module)}


# ----------------------------------------------------------------------------- what people read
def _guarantee_words(pl_module) -> str:
    why = not_a_guarantee_because(pl_module)
    return f"NOT a guarantee ({why})" if why else "an (ε, δ)-DP guarantee"


def privacy_lines(pl_module) -> list[str]:
    """The fit summary's privacy lines: the guarantee first, then every other released ε and what it
    means, then what ε covers. Only what :func:`released_epsilons` and :func:`released_smooth_sensitivity`
    release is shown."""
    acc = getattr(pl_module, "accountant", None)
    if acc is None or not hasattr(pl_module, "epsilon_budget"):
        return ["none: a non-private model (no privacy guarantee)"]
    budget, delta = pl_module.epsilon_budget, acc.delta
    epsilons = released_epsilons(pl_module)
    guarantee = epsilons.pop("epsilon")
    if pl_module.budget_accounting == "paper":
        label = acc.paper_label
        paper = epsilons.pop(f"epsilon_{label}", None)
        lines = [f"ε = {paper if paper is not None else acc.epsilon_paper():.4f} spent of the budget ε = {budget:g} "
                 f"(δ = {delta:g}) by the paper's {label.replace('_', '-')} analysis: NOT a guarantee",
                 f"the guarantee of the steps taken is ε = {guarantee:.4f} (the worst case of every mechanism's output)"]
    elif pl_module.smooth_sensitivity is not None:
        lines = smooth_sensitivity_lines(pl_module, guarantee, delta)
    else:
        lines = [f"ε = {guarantee:.4f} of the budget ε = {budget:g} (δ = {delta:g}): {_guarantee_words(pl_module)}"]
    for name, value in epsilons.items():
        what = name[len("epsilon_"):]
        if what == "rdp":
            lines.append(f"the RDP analysis of the same steps gives ε = {value:.4f} (also a guarantee)")
        elif name == BUDGET_SPENT_METRIC:
            lines.append(f"the privacy filter has spent ε = {value:.4f} of the budget (the recorded costs its stop counts; "
                         f"not itself a guarantee)")
        else:
            lines.append(f"the paper's {what.replace('_', '-')} analysis gives ε = {value:.4f} (not a guarantee)")
    lines += pl_module.budget_shares() if hasattr(pl_module, "budget_shares") else []
    lines.append(PRIVACY_SCOPE)
    return lines


def smooth_sensitivity_lines(pl_module, guarantee: float, delta: float) -> list[str]:
    """A smooth-sensitivity run: the guarantee (the data-independent bound, within the hard cap), then
    the released data-dependent ε against the target and the release decision."""
    info = released_smooth_sensitivity(pl_module)
    cap = pl_module.epsilon_hard_cap
    first = (f"ε = {guarantee:.4f} (δ = {delta:g}), data-independent bound of everything released (hard cap "
             f"{cap:g}): {_guarantee_words(pl_module)}")
    if info is None or info.get("released") is None:
        return [first, "no smooth-sensitivity release was made"]
    released = info["released"]
    decision = "written" if info["release_allowed"] else "NOT written"
    return [first,
            f"data-dependent ε = {released['epsilon']:.4f} (δ = {delta:g}), released with smooth sensitivity (Papernot "
            f"et al. 2018) as an upper bound that holds with probability 1 − {released['delta_prime']:g}; not a "
            f"guarantee. Target ε = {pl_module.epsilon_budget:g}: release artifact {decision}"]


def smooth_sensitivity_release_lines(pl_module) -> list[str]:
    """What a smooth-sensitivity release prints when it is made (rank 0)."""
    released = pl_module.smooth_sensitivity.released
    lines = [f"Smooth-sensitivity release at order {released.order:g} (beta={released.beta:.4g}, sigma_ss={released.sigma:.4g}, "
             f"delta'={released.delta_prime:g}): data-dependent epsilon={released.epsilon:.4f} (an upper bound with "
             f"probability 1 - delta', not a guarantee); guarantee (data-independent bound of everything released): "
             f"epsilon={pl_module.guarantee_epsilon():.4f}."]
    if not pl_module.release_allowed():
        lines.append(f"NOT RELEASED: {pl_module.stop_reason}")
    return lines


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


# ----------------------------------------------------------------------------- diagnostics and evaluation
def private_diagnostics_allowed(model) -> bool:
    """Whether figures computed from the private data without noise (teacher and critic losses,
    batch sizes, Setting A) may be logged: only when the user asked (``log_private_diagnostics: true``),
    and then under :data:`PRIVATE_PREFIX`."""
    return bool(getattr(model, "log_private_diagnostics", False))


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
    return not is_private(model) or private_diagnostics_allowed(model)


def split_private(model, metrics: Mapping[str, float], private: Callable[[str], bool]) -> tuple[dict[str, float], dict[str, float]]:
    """``metrics`` as ``(public, private)``: for a private model, the names ``private`` picks go to the
    second dict (to be logged under :data:`PRIVATE_PREFIX`); a non-private model keeps everything public."""
    if not is_private(model):
        return dict(metrics), {}
    return ({k: v for k, v in metrics.items() if not private(k)}, {k: v for k, v in metrics.items() if private(k)})
