"""The audit's result: a table row, a ROC plot with the region the claimed ε allows, an MLflow run."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_gpate.audit.attack import AttackOutcome

AUDIT_EXPERIMENT = "audit"


@dataclass
class AuditResult:
    """What ``lightning-gpate audit`` reports for one model, attack and dataset."""

    model: str
    dataset: str
    attack: str
    runs: int  # models trained per world
    test_models: int  # per world
    num_rows: int  # synthetic rows per model
    epsilon_claimed: float  # the budget (∞: not private)
    delta: float
    epsilon_spent_mean: float  # what the fits' accountants spent
    epsilon_emp: float
    epsilon_emp_max: float  # the largest ε_emp this many test models can show
    confidence: float
    fpr_hi: float
    fnr_hi: float
    fp: int
    fn: int
    threshold: float
    auc: float
    steps_mean: float
    fit_seconds_mean: float
    fit_seconds_total: float
    wall_seconds: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(epsilon_emp: float, epsilon_claimed: float, epsilon_max: float) -> str:
    """One line on what the numbers mean."""
    if epsilon_emp > epsilon_claimed:
        return f"VIOLATION: the attack proves epsilon >= {epsilon_emp:.2f} > the claimed {epsilon_claimed:g}"
    if math.isinf(epsilon_claimed):
        share = epsilon_emp / epsilon_max if epsilon_max > 0 else 0.0
        return f"not private: the attack reaches {share:.0%} of the largest measurable epsilon_emp"
    return "consistent with the claim (an audit can refute a claim, never prove one)"


def format_table(results: list[AuditResult]) -> str:
    """The per-model table: ε claimed, ε_emp, max measurable, N, time (markdown)."""
    head = ("| model | attack | ε claimed | ε spent (mean) | ε_emp | max measurable | N per world (test) | rows | "
            "FP / FN | AUC | fit s (mean) | wall time | verdict |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        claimed = "∞ (not private)" if math.isinf(r.epsilon_claimed) else f"{r.epsilon_claimed:g}"
        spent = "–" if math.isinf(r.epsilon_spent_mean) else f"{r.epsilon_spent_mean:.3f}"
        lines.append(
            f"| {r.model} | {r.attack} | {claimed} | {spent} | **{r.epsilon_emp:.2f}** | {r.epsilon_emp_max:.2f} | "
            f"{r.runs} ({r.test_models}) | {r.num_rows} | {r.fp} / {r.fn} | {r.auc:.3f} | {r.fit_seconds_mean:.2f} | "
            f"{_duration(r.wall_seconds)} | {r.verdict} |"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def dp_region_boundary(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The largest TPR an (ε, δ)-DP mechanism allows at each FPR (Kairouz et al. 2015)."""
    return np.clip(np.minimum(math.exp(epsilon) * fpr + delta, 1.0 - math.exp(-epsilon) * (1.0 - delta - fpr)), 0.0, 1.0)


def roc_plot(outcome: AttackOutcome, result: AuditResult, path: str | Path) -> Path:
    """The attack's test ROC, linear and log-log, with the chosen operating point and the boundary of
    what the claimed (ε, δ) allows (a point above it is a violation, up to sampling error)."""
    from sklearn.metrics import roc_curve

    from lightning_gpate.evaluation.plots import _figure

    fpr, tpr, _ = roc_curve(outcome.test_worlds, outcome.test_scores)
    fp, neg, fn, pos = result.fp, result.test_models, result.fn, result.test_models
    point = (fp / neg, 1 - fn / pos)
    fig = _figure(10, 4.6)
    floor = 0.5 / max(neg, 1)  # rates of 0 are drawn at half of one model in the log-log panel
    for ax, log in zip(fig.subplots(1, 2), (False, True)):
        grid = np.geomspace(floor, 1, 1001) if log else np.linspace(0, 1, 1001)
        lift = (lambda v: np.maximum(v, floor)) if log else (lambda v: v)
        ax.plot(lift(fpr), lift(tpr), drawstyle="steps-post", label=f"attack ({result.attack}), AUC {result.auc:.3f}")
        ax.plot(grid, grid, ":", color="grey", label="chance")
        if not math.isinf(result.epsilon_claimed):
            ax.plot(grid, lift(dp_region_boundary(grid, result.epsilon_claimed, result.delta)), "--", color="red",
                    label=f"limit of ε={result.epsilon_claimed:g}, δ={result.delta:g}")
        ax.plot(*lift(np.array(point)), "o", color="black", label=f"threshold {result.threshold:.3g}: ε_emp {result.epsilon_emp:.2f}")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(floor, 1)
            ax.set_ylim(floor, 1.05)
        ax.set_xlabel("false positive rate (world 0 called world 1)")
        ax.set_ylabel("true positive rate")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7, loc="lower right")
    claimed = "∞ (not private)" if math.isinf(result.epsilon_claimed) else f"{result.epsilon_claimed:g}"
    fig.suptitle(f"{result.model} on {result.dataset}: ε_emp {result.epsilon_emp:.2f} (max measurable "
                 f"{result.epsilon_emp_max:.2f}, {result.confidence:.0%} confidence, {result.test_models} test models per world), "
                 f"claimed ε {claimed}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def log_to_mlflow(result: AuditResult, outcome: AttackOutcome, features: np.ndarray, worlds: np.ndarray, *,
                  settings: dict[str, Any], tracking_uri: str | None = None, experiment: str = AUDIT_EXPERIMENT,
                  run_name: str | None = None) -> str:
    """Record the audit as an MLflow run of its own: params, metrics, the ROC plot, the report and
    the attack's features. Returns the run id."""
    import mlflow

    from lightning_gpate.tracking import default_tracking_uri, training_experiment_id

    client = mlflow.MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())
    exp_id = training_experiment_id(client, experiment)
    run_id = client.create_run(exp_id, run_name=run_name or f"audit-{result.model}-{result.attack}").info.run_id
    params = {k: v for k, v in result.as_dict().items() if isinstance(v, str) or k in ("runs", "test_models", "num_rows", "confidence", "delta")}
    params.update({f"setting/{k}": str(v)[:500] for k, v in settings.items()})
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for key in ("epsilon_claimed", "epsilon_spent_mean", "epsilon_emp", "epsilon_emp_max", "fpr_hi", "fnr_hi", "fp", "fn",
                "threshold", "auc", "steps_mean", "fit_seconds_mean", "fit_seconds_total", "wall_seconds"):
        value = float(getattr(result, key))
        if math.isfinite(value):
            client.log_metric(run_id, key, value)
    client.set_tag(run_id, "verdict", result.verdict)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        roc_plot(outcome, result, tmp / "roc.png")
        (tmp / "audit.json").write_text(json.dumps(result.as_dict(), indent=2, default=str))
        (tmp / "audit.md").write_text(format_table([result]) + "\n")
        header = ",".join(["world"] + [f"f{i}" for i in range(features.shape[1])])
        np.savetxt(tmp / "features.csv", np.column_stack([worlds, features]), delimiter=",", header=header, comments="", fmt="%.6g")
        for name in ("roc.png", "audit.json", "audit.md", "features.csv"):
            client.log_artifact(run_id, str(tmp / name), "audit")
    client.set_terminated(run_id)
    return run_id
