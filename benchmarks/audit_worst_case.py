"""``lightning-gpate audit`` of every model on the worst case, as one table.

For each config of ``configs/audit/`` (non-private GAN: the planted leak; PATE-GAN, G-PATE, DP-GAN at a
guaranteed ε=1), run the distinguishing game with ``--runs`` models per world (half train the random
forest, half test it) under both attacks, and write ``benchmarks/results/audit_worst_case.md`` (and
``.json``): ε claimed, ε spent, ε_emp, the largest ε_emp the number of test models can show, N, time.
The fits are resumable (``mlruns/audits/<config>-worst_case-r<rows>``): an interrupted run continues,
and the second attack reuses the first one's fits. Every audit is also an MLflow run (experiment
``audit``) with its ROC plot.

A second table shows what each generator learned, so that a small ε_emp means something: the share of
its synthetic rows at the data's point (0, 0, 0) among the rows of label 0, and at the target (1, 1, 1)
among the rows of label 1, in each world, beside the same configs' untrained generators (20 public
seeds, no step). A "## Notes" section already in the table's markdown file is kept when it is rewritten.

Usage (the committed table: 400 models per world, 2 worker processes)::

    python benchmarks/audit_worst_case.py --runs 400 --jobs 2
    python benchmarks/audit_worst_case.py --runs 400 --runs-of gpate=100   # a smaller N for one model
    python benchmarks/audit_worst_case.py --runs 20 --models gan           # a quick look
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
    parser.add_argument("--runs-of", nargs="*", default=[], metavar="MODEL=N",
                        help="a different number of models per world for some models (e.g. gpate=100)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--num_rows", type=int, default=1000)
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--attacks", nargs="+", default=["querybased", "groundhog"], choices=["querybased", "groundhog"])
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "audit_worst_case"))
    args = parser.parse_args()

    from lightning_gpate.audit import format_table, run_audit

    runs_of = {name: args.runs for name in args.models}
    for item in args.runs_of:
        name, _, runs = item.partition("=")
        if name not in CONFIGS or not runs.isdigit():
            parser.error(f"--runs-of takes MODEL=N with MODEL in {list(CONFIGS)}, got {item!r}")
        runs_of[name] = int(runs)
    commit, results, learned = _commit(), [], []
    for name in args.models:
        for attack in args.attacks:
            started = time.time()
            result, run_id = run_audit(CONFIGS[name], "worst_case", runs=runs_of[name], attack=attack, jobs=args.jobs,
                                       num_rows=args.num_rows)
            results.append(result)
            print(format_table([result]), f"\n(MLflow run {run_id}, {time.time() - started:.0f}s)", flush=True)
        learned.append(what_was_learned(name, runs_of[name], args.num_rows))
        _write(Path(args.output), results, learned, commit, args, runs_of)


POINTS = {"data (0,0,0) among label-0 rows": (0, 0, 0), "target (1,1,1) among label-1 rows": (1, 1, 1)}


def _shares(tables) -> list[float]:
    """Mean over ``tables`` of the share of rows at each point of :data:`POINTS` among the rows of its label."""
    import numpy as np

    out = []
    for x1, x2, y in POINTS.values():
        per_table = []
        for t in tables:
            rows = t[t["y"].astype(int) == y]
            per_table.append(float(((rows["x1"].astype(int) == x1) & (rows["x2"].astype(int) == x2)).mean()) if len(rows) else float("nan"))
        out.append(float(np.nanmean(per_table)))
    return out


def what_was_learned(name: str, runs: int, num_rows: int, untrained_seeds: int = 20) -> dict:
    """Shares of :data:`POINTS` in the audit's synthetic tables per world, and in untrained generators'."""
    import pytorch_lightning as pl
    import torch

    from datamodules import TabularDataModule
    from lightning_gpate.audit.game import AuditStore, import_class, load_settings, quiet
    from lightning_gpate.audit.runner import default_output
    from lightning_gpate.evaluation.report import synthetic_table

    settings = load_settings(CONFIGS[name], "worst_case", None, num_rows=num_rows)
    folder = default_output(CONFIGS[name], "worst_case", None, num_rows)  # where run_audit put the fits
    store = AuditStore(folder, json.loads((folder / "audit.json").read_text()))
    row = {"model": name, "runs": runs}
    for world in (0, 1):
        row[f"world{world}"] = _shares([store.load(world, i)[0] for i in range(runs)])
    threads, untrained = torch.get_num_threads(), []
    torch.set_num_threads(1)
    for seed in range(untrained_seeds):
        with quiet():
            pl.seed_everything(seed, verbose=False)
            datamodule = TabularDataModule(frame=settings.data.frame(0), test_fraction=0.0, val_fraction=0.0,
                                           **settings.data.data_options, **settings.training_options)
            model = import_class(settings.model_class)(datamodule.spec, **settings.model_args).eval()
            untrained.append(synthetic_table(model, num_rows, seed=seed))
    torch.set_num_threads(threads)
    row["untrained"] = _shares(untrained)
    return row


def _learned_table(learned) -> str:
    names = {"gan": "GAN", "pategan": "PATEGAN", "gpate": "GPATE", "dpgan": "DPGAN"}
    head = "| model | N per world | " + " | ".join(f"{p}: untrained / world 0 / world 1" for p in POINTS) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in learned:
        cells = [" / ".join(f"{row[k][j]:.2f}" for k in ("untrained", "world0", "world1")) for j in range(len(POINTS))]
        lines.append(f"| {names[row['model']]} | {row['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write(stem: Path, results, learned, commit: str, args, runs_of: dict) -> None:
    from lightning_gpate.audit import format_table

    stem.parent.mkdir(parents=True, exist_ok=True)
    other = [f"{m}={n}" for m, n in runs_of.items() if n != args.runs]
    other_runs = f" --runs-of {' '.join(other)}" if other else ""
    header = (
        f"# `lightning-gpate audit` on the worst case\n\n"
        f"D = 4 × (0, 0, 0), target (1, 1, 1) (label = third column; categories and class ratio [0.5, 0.5] declared "
        f"public). N models per world (the first half trains the random forest, the second half tests it), "
        f"{args.num_rows} synthetic rows per model, ε_emp at 95% confidence (two one-sided Clopper–Pearson bounds at "
        f"2.5%), δ of the claim (0 for the GAN). Configs: `configs/audit/<model>_worst_case.yaml`. Commit {commit}, "
        f"{platform.machine()} CPU, {args.jobs} worker processes on a shared 2-core machine (fit time per model is wall "
        f"time inside a worker; the wall time of a row covers the fits of both attacks, which share them).\n\n"
        f"Reproduce: `python benchmarks/audit_worst_case.py --runs {args.runs} --jobs {args.jobs}"
        f"{other_runs}` "
        f"(or one row: `lightning-gpate audit --config configs/audit/gan_worst_case.yaml --dataset worst_case "
        f"--runs {args.runs} --attack querybased --jobs {args.jobs}`).\n\n"
    )
    learned_header = (
        "\n\n## What the generators learned\n\nShare of the synthetic rows at the data's point among the rows of "
        "label 0, and at the target among the rows of label 1 (mean over the audit's tables of each world; "
        "untrained: the same config's generator before any step, 20 public seeds). A generator that learned "
        "D moves the first share up from its untrained value in both worlds; the second share is what the "
        "attack looks for.\n\n"
    )
    markdown = stem.with_suffix(".md")
    notes = ""
    if markdown.exists() and "\n## Notes" in markdown.read_text():
        notes = "\n" + markdown.read_text()[markdown.read_text().index("\n## Notes"):].rstrip() + "\n"
    markdown.write_text(header + format_table(results) + learned_header + _learned_table(learned) + "\n" + notes)
    stem.with_suffix(".json").write_text(json.dumps({"commit": commit, "results": [r.as_dict() for r in results],
                                                     "learned": learned, "learned_points": list(POINTS)}, indent=2, default=str))


if __name__ == "__main__":
    main()
