"""Where PATE-GAN's signal goes under a guarantee: teacher votes, the Laplace noise, and the utility.

For PATE-GAN on cervical (split seed 0) at guaranteed ε ∈ {1, 10}, a grid over the number of teachers
(rows per teacher), the planned number of queries (hence λ), teacher steps per generator step and the
query labels. After training, on 2,000 fresh generated samples (private diagnostics: computed from the
teachers WITHOUT noise, for this investigation only):

* ``real_votes``: mean fraction of teachers voting "real";
* ``unanimous``: fraction of samples on which ≥ 95% of teachers agree (a unanimous "fake" teaches the
  student nothing: every sample gets the same label);
* ``gap``: mean |n_real − n_fake| / T;
* ``flip``: mean probability that the Laplace noise flips the majority, ``½·e^{−λg}(1 + λg/2)`` for a
  vote gap g (the difference of two Lap(1/λ) exceeds g);

and the Setting-B AUROC of logistic regression and random forest (mean). Writes
``benchmarks/results/pategan_vote_signal.{md,csv}``.

Usage: ``python benchmarks/pategan_vote_signal.py [--seeds 0 1]``
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GRID = {
    "num_teachers": [50, 150, 500],
    "planned_queries": [500, 4000],
    "teacher_steps": [1, 5],
}


def run(epsilon: float, seed: int, num_teachers: int, planned_queries: int, teacher_steps: int, teacher_vote: str = "logit",
        query_labels: str = "uniform"):
    import pytorch_lightning as pl
    import torch

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.models.pategan import PAPER_SETTINGS
    from tabular_utility import DELTA, datamodule, score

    pl.seed_everything(seed, verbose=False)
    dm = datamodule("cervical", seed, num_teachers=num_teachers, teacher_batch_size=8)
    model = PATEGAN(dm.spec, **{**PAPER_SETTINGS, **dict(  # the former defaults (the paper's) beyond these, as measured
        epsilon=epsilon, delta=DELTA, planned_queries=planned_queries, teacher_steps=teacher_steps, student_steps=1,
        query_batch_size=16, query_labels=query_labels, lr=1e-3, teacher_lr=1e-3, teacher_vote=teacher_vote)})
    trainer = pl.Trainer(max_steps=planned_queries // 16, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    votes = vote_statistics(model)
    synthetic = synthetic_table(model, 2000, seed=seed)
    s = score(dm.split_frame("train"), dm.split_frame("test"), synthetic, "Biopsy", seed, ["LogisticRegression", "RandomForest"], dm.spec)
    return {"epsilon": epsilon, "seed": seed, "teacher_vote": teacher_vote, "num_teachers": num_teachers, "rows_per_teacher": round(dm.spec["num_train"] / num_teachers, 1),
            "planned_queries": planned_queries, "lam": model.lam, "teacher_steps": teacher_steps, "steps": trainer.global_step,
            "eps_spent": model.spent_epsilon(), **votes, "auroc_lr_rf": s["auroc"], "wall_s": wall}


def vote_statistics(model, n: int = 2000) -> dict:
    """The teachers' votes on ``n`` fresh generated samples, WITHOUT noise (a private diagnostic, for
    this investigation only): ``real_votes``, ``unanimous``, ``gap``, ``flip`` (see the module doc) and
    ``student_real``, the share of the samples the student calls real."""
    import torch

    model.eval()
    with torch.no_grad():
        y = model.query_labels(n)
        x = model._fakes(y)  # as the teachers see them in training
        counts = model.teacher_votes(x, y).cpu().numpy()
        student_real = float((model.student(x, y) > 0).float().mean())
    t = counts.sum(1)
    frac_real = counts[:, 1] / t
    gap = np.abs(counts[:, 1] - counts[:, 0])
    flip = 0.5 * np.exp(-model.lam * gap) * (1 + model.lam * gap / 2)
    return {"real_votes": float(frac_real.mean()), "unanimous": float(((frac_real >= 0.95) | (frac_real <= 0.05)).mean()),
            "gap": float((gap / t).mean()), "flip": float(flip.mean()), "student_real": student_real}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 10.0])
    parser.add_argument("--teachers", nargs="+", type=int, default=GRID["num_teachers"])
    parser.add_argument("--queries", nargs="+", type=int, default=GRID["planned_queries"])
    parser.add_argument("--teacher-steps", nargs="+", type=int, default=GRID["teacher_steps"])
    parser.add_argument("--teacher-vote", nargs="+", default=["logit"], choices=["logit", "relative"])
    parser.add_argument("--append", action="store_true", help="add to the existing CSV instead of replacing it")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pategan_vote_signal"))
    parser.add_argument("--report-only", action="store_true", help="rewrite the Markdown table from the CSV")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rows = []
    grid = itertools.product(args.teacher_vote, args.teachers, args.queries, args.teacher_steps)
    for epsilon, seed, (vote, nt, pq, ts) in ([] if args.report_only else itertools.product(args.epsilons, args.seeds, grid)):
        rows.append(run(epsilon, seed, nt, pq, ts, vote))
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    frame = pd.DataFrame(rows)
    out = Path(args.out)
    if (args.append or args.report_only) and out.with_suffix(".csv").exists():
        frame = pd.concat([pd.read_csv(out.with_suffix(".csv")), frame], ignore_index=True)
    frame["teacher_vote"] = frame["teacher_vote"].fillna("logit") if "teacher_vote" in frame else "logit"
    frame.to_csv(out.with_suffix(".csv"), index=False)
    lines = ["# PATE-GAN on cervical under a guarantee: where the vote signal goes", "",
             "Generated by `benchmarks/pategan_vote_signal.py` (its docstring defines the columns; seed = split seed, "
             "student_steps 1, query batch 16, lr 1e-3, uniform query labels). AUROC: mean of logistic regression and random forest, "
             "Setting B, 2,000 synthetic rows.", "",
             "| ε | seed | vote | teachers | rows/teacher | queries | λ | teacher steps | gen. steps | ε spent | real votes | unanimous | gap | flip | AUROC |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in frame.iterrows():
        lines.append(f"| {r.epsilon:g} | {r.seed} | {r.get('teacher_vote', 'logit')} | {r.num_teachers} | {r.rows_per_teacher} | {r.planned_queries} | {r.lam:.4f} | {r.teacher_steps} | "
                     f"{r.steps} | {r.eps_spent:.3f} | {r.real_votes:.3f} | {r.unanimous:.2f} | {r.gap:.3f} | {r.flip:.3f} | {r.auroc_lr_rf:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
