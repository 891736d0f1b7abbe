"""``lightning-gpate audit``: play the distinguishing game for a config and report ε_emp beside the
claimed ε (see :mod:`lightning_gpate.audit`)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lightning_gpate.audit.attack import distinguish
from lightning_gpate.audit.features import FEATURIZERS
from lightning_gpate.audit.game import WORST_CASE, AuditError, AuditStore, load_settings, run_fits
from lightning_gpate.audit.report import AUDIT_EXPERIMENT, AuditResult, format_table, log_to_mlflow, verdict
from lightning_gpate.audit.stats import max_measurable_epsilon

DEFAULT_OUTPUT_ROOT = Path("mlruns") / "audits"


def default_output(config: str | Path, dataset: str, target: str | None, num_rows: int) -> Path:
    """``mlruns/audits/<config>-<dataset>[-<target>]-r<rows>`` (git-ignored, beside the MLflow store)."""
    parts = [Path(config).stem, Path(dataset).stem if dataset != WORST_CASE else WORST_CASE]
    if target is not None and dataset != WORST_CASE:
        parts.append(f"t{target}")
    parts.append(f"r{num_rows}")
    return DEFAULT_OUTPUT_ROOT / re.sub(r"[^\w.\-]+", "_", "-".join(parts))


def run_audit(
    config: str | Path,
    dataset: str = WORST_CASE,
    target: str | None = None,
    *,
    runs: int,
    attack: str = "querybased",
    jobs: int = 1,
    output: str | Path | None = None,
    num_rows: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    max_steps: int | None = None,
    device: str = "cpu",
    tracking_uri: str | None = None,
    experiment: str = AUDIT_EXPERIMENT,
    log: bool = True,
    progress: bool = True,
) -> tuple[AuditResult, str | None]:
    """Train ``runs`` models per world (resuming from ``output``), attack them, report ε_emp.

    Args:
        config: a ``lightning-gpate fit`` config (its model, training data options and max_steps).
        dataset: ``"worst_case"`` or a CSV file.
        target: the target record: a row index of the file or comma-separated values (worst case:
            ``1,1,1``, the default).
        runs: models per world; the first half of each world trains the attack, the rest tests it.
        attack: ``"querybased"`` or ``"groundhog"`` (features; the fits are shared: switching the
            attack on a finished folder trains nothing).
        jobs: worker processes.
        output: the resumable folder (default :func:`default_output`).
        num_rows: synthetic rows per model, the same in both worlds.
        confidence: 1 − α of ε_emp (two one-sided Clopper–Pearson bounds at α/2).
        seed: base of the fits' distinct public seeds and of the forest.
        max_steps: overrides the config's ``trainer.max_steps``.
        device: Lightning accelerator of the fits.
        tracking_uri, experiment: where the report goes (an MLflow run of its own); ``log=False``: nowhere.
        progress: show a progress bar.

    Returns:
        The result and the MLflow run id (``None`` without logging).
    """
    if attack not in FEATURIZERS:
        raise AuditError(f"--attack must be one of {sorted(FEATURIZERS)}, got {attack!r}")
    if runs < 2:
        raise AuditError(f"--runs must be >= 2 (half of the models train the attack, half test it), got {runs}")
    if jobs < 1:
        raise AuditError(f"--jobs must be >= 1, got {jobs}")
    if not 0 < confidence < 1:
        raise AuditError(f"--confidence must be in (0, 1), got {confidence}")
    target = target if target is not None or dataset != WORST_CASE else None
    settings = load_settings(config, dataset, target, num_rows=num_rows, max_steps=max_steps, accelerator=device)
    epsilon_claimed, delta = settings.claimed()
    pinned = sorted(k for k in ("noise_seed", "metadata_seed") if {**settings.model_args, **settings.data.data_options}.get(k) is not None)
    if pinned:  # the audit measures what the config does; say that this is not a private deployment
        print(f"warning: {', '.join(pinned)} fixed in the config: every fit draws the same mechanism noise, which a "
              f"deployment must never do (the audit measures it as configured)", file=sys.stderr)
    identity = {
        "model_class": settings.model_class, "model_args": settings.model_args,
        "training_options": settings.training_options, "data_options": settings.data.data_options,
        "max_steps": settings.max_steps, "num_rows": settings.num_rows, "seed": int(seed), **settings.data.identity,
    }
    store = AuditStore(output or default_output(config, dataset, target, num_rows), identity)
    started = time.perf_counter()
    try:
        run_fits(settings, store, identity, runs=runs, seed=seed, jobs=jobs, progress=progress)
    finally:  # an interrupted audit's fits are kept, and so is the time they took
        wall = _add_wall_time(store, time.perf_counter() - started)

    spec = _public_spec(settings)
    featurize = FEATURIZERS[attack]
    features, worlds, indices, infos = [], [], [], []
    for index in range(runs):
        for world in (0, 1):
            table, info = store.load(world, index)
            features.append(featurize(table, settings.data.target, spec))
            worlds.append(world)
            indices.append(index)
            infos.append(info)
    features, worlds, indices = np.stack(features), np.asarray(worlds), np.asarray(indices)
    outcome = distinguish(features, worlds, indices < runs // 2, delta=delta, confidence=confidence, seed=seed)
    bound = outcome.bound
    emp_max = max_measurable_epsilon(bound.negatives, bound.positives, delta=delta, confidence=confidence)
    spent = [i["epsilon_spent"] for i in infos]
    model_name = settings.model_class.rpartition(".")[2]
    result = AuditResult(
        model=model_name, dataset=settings.data.name, attack=attack, runs=runs, test_models=bound.negatives,
        num_rows=num_rows, epsilon_claimed=epsilon_claimed, delta=delta,
        epsilon_spent_mean=float(np.mean(spent)) if all(math.isfinite(s) for s in spent) else math.inf,
        epsilon_emp=bound.epsilon, epsilon_emp_max=emp_max, confidence=confidence, fpr_hi=bound.fpr_hi,
        fnr_hi=bound.fnr_hi, fp=bound.fp, fn=bound.fn, threshold=outcome.threshold, auc=outcome.auc,
        steps_mean=float(np.mean([i["steps"] for i in infos])),
        fit_seconds_mean=float(np.mean([i["fit_seconds"] for i in infos])),
        fit_seconds_total=float(np.sum([i["fit_seconds"] for i in infos])), wall_seconds=wall,
        verdict=verdict(bound.epsilon, epsilon_claimed, emp_max),
    )
    (store.folder / f"result-{attack}-{runs}.json").write_text(json.dumps(result.as_dict(), indent=2, default=str))
    run_id = None
    if log:
        described = {"config": str(config), "dataset": dataset, "target": target or "1,1,1", "output": str(store.folder),
                     "seed": seed, "max_steps": settings.max_steps, "device": device}
        run_id = log_to_mlflow(result, outcome, features, worlds, settings=described, tracking_uri=tracking_uri,
                               experiment=experiment, run_name=f"audit-{model_name}-{Path(dataset).stem}-{attack}")
    return result, run_id


def _public_spec(settings) -> dict[str, Any]:
    """The data spec of the audit's (public) schema, for the featurizers."""
    from datamodules import TabularDataModule
    from lightning_gpate.audit.game import quiet

    with quiet():
        return TabularDataModule(frame=settings.data.frame(1), test_fraction=0.0, val_fraction=0.0,
                                 **settings.data.data_options).spec


def _add_wall_time(store: AuditStore, seconds: float) -> float:
    """Wall time spent on this folder's fits, over every (resumed) invocation."""
    path = store.folder / "wall_seconds.json"
    total = (json.loads(path.read_text()) if path.exists() else 0.0) + seconds
    path.write_text(json.dumps(total))
    return float(total)


def audit_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate audit",
        description="Measure the privacy a model really gives: train --runs models on D and --runs on D ∪ {target} "
                    "with the config, attack their synthetic tables with a random forest (half the models train it, "
                    "half test it) and report the empirical epsilon_emp (a lower bound on the true epsilon at the "
                    "stated confidence) beside the claimed epsilon. Resumable: rerun the same command to continue.",
    )
    parser.add_argument("--config", required=True, help="a lightning-gpate fit config (model, data options, trainer.max_steps)")
    parser.add_argument("--dataset", default=WORST_CASE, help="'worst_case' (D = 4 x (0,0,0), target (1,1,1)) or a CSV file")
    parser.add_argument("--target", default=None, help="the target: a row index of the CSV file, or its comma-separated values")
    parser.add_argument("--runs", type=int, required=True, help="models trained per world (e.g. 400)")
    parser.add_argument("--attack", default="querybased", choices=sorted(FEATURIZERS), help="the attack's features")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    parser.add_argument("--output", default=None, help="resumable folder of the fits (default: mlruns/audits/<config>-<dataset>-r<rows>)")
    parser.add_argument("--num_rows", type=int, default=1000, help="synthetic rows per model, the same in both worlds")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the epsilon_emp lower bound")
    parser.add_argument("--seed", type=int, default=0, help="base of the fits' public seeds and the attack's seed")
    parser.add_argument("--max_steps", type=int, default=None, help="override the config's trainer.max_steps")
    parser.add_argument("--device", default="cpu", help="Lightning accelerator of the fits (cpu, gpu, auto)")
    parser.add_argument("--tracking_uri", default=None, help="MLflow store (default: MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--experiment", default=AUDIT_EXPERIMENT, help="MLflow experiment of the report")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    result, run_id = run_audit(
        args.config, args.dataset, args.target, runs=args.runs, attack=args.attack, jobs=args.jobs, output=args.output,
        num_rows=args.num_rows, confidence=args.confidence, seed=args.seed, max_steps=args.max_steps, device=args.device,
        tracking_uri=args.tracking_uri, experiment=args.experiment, progress=not args.no_progress,
    )
    print(format_table([result]))
    print(f"\nepsilon_emp = {result.epsilon_emp:.3f} at {result.confidence:.0%} confidence (the largest {result.runs - result.runs // 2} "
          f"test models per world can show: {result.epsilon_emp_max:.3f}); claimed epsilon = {result.epsilon_claimed:g}")
    print(result.verdict)
    if run_id:
        print(f"logged to MLflow run {run_id} (experiment {args.experiment!r}): ROC plot audit/roc.png")
    return 0
