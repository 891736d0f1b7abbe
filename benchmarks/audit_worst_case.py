"""``lightning-gpate audit`` of every model on the worst case, as one table.

For each config of ``configs/audit/`` (non-private GAN: the planted leak; PATE-GAN, G-PATE, DP-GAN at a
guaranteed ε=1), run the distinguishing game with ``--runs`` models per world (half train the random
forest, half test it) under both attacks, and write ``benchmarks/results/audit_worst_case.md`` (and
``.json``): ε claimed, ε spent, ε_emp, the largest ε_emp the number of test models can show, N, time.
The fits are resumable (``mlruns/audits/<config>-worst_case-r<rows>``): an interrupted run continues,
and the second attack reuses the first one's fits. Every audit is also an MLflow run (experiment
``audit``) with its ROC plot.

Usage (the committed table: 400 models per world, 2 worker processes)::

    python benchmarks/audit_worst_case.py --runs 400 --jobs 2
    python benchmarks/audit_worst_case.py --runs 20 --models gan      # a quick look
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {name: ROOT / "configs" / "audit" / f"{name}_worst_case.yaml" for name in ("gan", "pategan", "gpate", "dpgan")}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400, help="models per world")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--num_rows", type=int, default=1000)
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--attacks", nargs="+", default=["querybased", "groundhog"], choices=["querybased", "groundhog"])
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "audit_worst_case"))
    args = parser.parse_args()

    from lightning_gpate.audit import format_table, run_audit

    commit, results = _commit(), []
    for name in args.models:
        for attack in args.attacks:
            started = time.time()
            result, run_id = run_audit(CONFIGS[name], "worst_case", runs=args.runs, attack=attack, jobs=args.jobs,
                                       num_rows=args.num_rows)
            results.append(result)
            print(format_table([result]), f"\n(MLflow run {run_id}, {time.time() - started:.0f}s)", flush=True)
            _write(Path(args.output), results, commit, args)


def _write(stem: Path, results, commit: str, args) -> None:
    from lightning_gpate.audit import format_table

    stem.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# `lightning-gpate audit` on the worst case\n\n"
        f"D = 4 × (0, 0, 0), target (1, 1, 1) (label = third column; categories and class ratio [0.5, 0.5] declared "
        f"public). {args.runs} models per world (the first half trains the random forest, the second half tests it), "
        f"{args.num_rows} synthetic rows per model, ε_emp at 95% confidence (two one-sided Clopper–Pearson bounds at "
        f"2.5%), δ of the claim (0 for the GAN). Configs: `configs/audit/<model>_worst_case.yaml`. Commit {commit}, "
        f"{platform.machine()} CPU, {args.jobs} worker processes on a shared 2-core machine (fit time per model is wall "
        f"time inside a worker; the wall time of a row covers the fits of both attacks, which share them).\n\n"
        f"Reproduce: `python benchmarks/audit_worst_case.py --runs {args.runs} --jobs {args.jobs}` "
        f"(or one row: `lightning-gpate audit --config configs/audit/gan_worst_case.yaml --dataset worst_case "
        f"--runs {args.runs} --attack querybased --jobs {args.jobs}`).\n\n"
    )
    stem.with_suffix(".md").write_text(header + format_table(results) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"commit": commit, "results": [r.as_dict() for r in results]}, indent=2, default=str))


if __name__ == "__main__":
    main()
