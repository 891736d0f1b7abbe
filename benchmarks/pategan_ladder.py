"""PATE-GAN's sanity ladder on cervical: does it learn the data's marginals without noise, at ε = 100, at ε = 10?

Each rung trains PATE-GAN on cervical (split seed = seed) with the same settings and a different
privacy level: ``noise-free`` (λ = 1000, a Laplace scale of 0.001 teacher votes, under a budget that
never binds: no privacy, the learning logic alone), then guaranteed ε = 100 and ε = 10 (λ planned for
the run's queries). After training, on 2,000 fresh generated samples (private diagnostics: computed
from the teachers WITHOUT noise, for this investigation only):

* ``real_votes``: mean fraction of teachers voting "real" (the teachers' vote split);
* ``unanimous``: fraction of samples on which ≥ 95% of the teachers agree;
* ``flip``: mean probability that the Laplace noise flips a sample's majority (``½·e^{−λg}(1 + λg/2)``
  for a vote gap g);
* ``student_real``: the fraction of the generated samples the student calls real (what the generator
  is pushed by), ``noisy_real``: the fraction of the noisy labels that said real during training;

and the synthetic table's fidelity against the real training split (1-way and 2-way TVD, correlation
gap) and the Setting-B AUROC of logistic regression and random forest (mean). The uniform table's
fidelity is the reference (a generator that learned nothing). Cells are appended to
``benchmarks/results/pategan_ladder.jsonl``; ``<out>.md`` is rebuilt from it.

Usage::

    python benchmarks/pategan_ladder.py --variant paper                  # the benchmark's settings
    python benchmarks/pategan_ladder.py --variant fixed --seeds 0 1 2    # after the fix
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "pategan_ladder"
RUNGS = {"noise-free": None, "eps100": 100.0, "eps10": 10.0, "eps1": 1.0}
#: Settings by variant: the data options, the model options, and the planned queries per ε.
VARIANTS = {
    # the settings of benchmarks/tabular_utility.py before the fix
    "before": ({"num_teachers": 500, "teacher_batch_size": 8},
               {"teacher_steps": 1, "student_steps": 1, "query_batch_size": 16, "query_labels": "uniform", "lr": 1e-3,
                "teacher_lr": 1e-3}, 8000),
    # the fix: teachers and student see generated rows as released (discrete_samples), relative votes,
    # 4x the queries (500 teachers keep the vote gaps far above the Laplace noise at ε = 10)
    "fixed": ({"num_teachers": 500, "teacher_batch_size": 8},
              {"teacher_steps": 1, "student_steps": 1, "query_batch_size": 16, "query_labels": "uniform", "lr": 1e-3,
               "teacher_lr": 1e-3, "discrete_samples": True, "teacher_vote": "relative"}, 32000),
}


def run(variant: str, rung: str, seed: int, options: dict | None = None, data: dict | None = None,
        queries: int | None = None) -> dict:
    import pytorch_lightning as pl
    import torch

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import PATEGAN
    from pategan_vote_signal import vote_statistics
    from tabular_utility import DELTA, datamodule, score

    data_options, model_options, planned = VARIANTS[variant]
    queries = queries or planned
    model_options = {**model_options, **(options or {})}
    data_options = {**data_options, **(data or {})}
    pl.seed_everything(seed, verbose=False)
    dm = datamodule("cervical", seed, **data_options)
    epsilon = RUNGS[rung]
    privacy = dict(epsilon=1e9, lam=1000.0) if epsilon is None else dict(epsilon=epsilon, planned_queries=queries)
    model = PATEGAN(dm.spec, delta=DELTA, **privacy, **model_options)
    steps = queries // (model_options["query_batch_size"] * model_options["student_steps"])
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    noisy_real = []
    original = model.noisy_labels

    def spy(counts):
        labels = original(counts)
        noisy_real.append(float(labels.float().mean()))
        return labels

    model.noisy_labels = spy
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    votes = vote_statistics(model)
    train, test = dm.split_frame("train"), dm.split_frame("test")
    synthetic = synthetic_table(model, 2000, seed=seed)
    s = score(train, test, synthetic, "Biopsy", seed, ["LogisticRegression", "RandomForest"], dm.spec)
    return {"variant": variant, "rung": rung, "seed": seed, "queries": queries, "options": {**(data or {}), **(options or {})}, "epsilon": epsilon, "lam": model.lam,
            "relative_median": "per class", "steps": int(trainer.global_step), "eps_spent": float(model.spent_epsilon()) if epsilon is not None else None,
            **votes, "noisy_real": float(np.mean(noisy_real)) if noisy_real else float("nan"),
            "tvd_1way": s["tvd_1way"], "tvd_2way": s["tvd_2way"], "corr_mae": s["corr_mae"], "auroc_lr_rf": s["auroc"], "wall_s": wall}


def uniform_reference(seed: int) -> dict:
    from lightning_gpate.evaluation.fidelity import fidelity, uniform_table
    from tabular_utility import datamodule

    dm = datamodule("cervical", seed)
    return fidelity(dm.split_frame("train"), uniform_table(dm.spec, 2000, seed=seed), dm.spec)


def report(out: Path) -> None:
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    uniform = uniform_reference(0)
    lines = ["# PATE-GAN's sanity ladder on cervical", "",
             "Generated by `benchmarks/pategan_ladder.py` (its docstring defines the columns). Fidelity against the real "
             "training split; AUROC: mean of logistic regression and random forest, Setting B, 2,000 synthetic rows. "
             f"Reference: independent uniform columns score 1-way TVD {uniform['tvd_1way']:.3f}, 2-way {uniform['tvd_2way']:.3f}, "
             f"corr Δ {uniform['corr_mae']:.3f} (split seed 0).", "",
             "Relative votes before the per-class median (`relative median: pooled`) compared a teacher's logit with its "
             "median over generated samples of every class.", "",
             "| variant | options | relative median | rung | seed | queries | λ | steps | ε spent | real votes | unanimous | flip | noisy real | student real | "
             "1-way TVD | 2-way TVD | corr Δ | AUROC |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spent = "–" if r["eps_spent"] is None else f"{r['eps_spent']:.2f}"
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "–"
        vote = {**VARIANTS[r["variant"]][1], **r["options"]}.get("teacher_vote", "logit")
        median = r.get("relative_median", "pooled") if vote == "relative" else "–"
        lines.append(f"| {r['variant']} | {opts} | {median} | {r['rung']} | {r['seed']} | {r.get('queries', VARIANTS[r['variant']][2])} | {r['lam']:.4g} | {r['steps']} | {spent} | "
                     f"{r['real_votes']:.3f} | {r['unanimous']:.2f} | {r['flip']:.3f} | {r['noisy_real']:.3f} | {r['student_real']:.3f} | "
                     f"{r['tvd_1way']:.3f} | {r['tvd_2way']:.3f} | {r['corr_mae']:.3f} | {r['auroc_lr_rf']:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="before", choices=list(VARIANTS))
    parser.add_argument("--rungs", nargs="+", default=["noise-free", "eps100", "eps10"], choices=list(RUNGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--options", default="{}", help="JSON: model options over the variant's")
    parser.add_argument("--data-options", default="{}", help="JSON: data options over the variant's (num_teachers, ...)")
    parser.add_argument("--queries", type=int, default=None, help="planned queries (default: the variant's)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for seed in args.seeds:
            for rung in args.rungs:
                record = run(args.variant, rung, seed, json.loads(args.options), json.loads(args.data_options), args.queries)
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}, flush=True)
                with out.with_suffix(".jsonl").open("a") as f:
                    f.write(json.dumps(record, default=float) + "\n")
    report(out)


if __name__ == "__main__":
    main()
