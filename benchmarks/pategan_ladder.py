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

**MNIST** (``--dataset mnist``): the image rows' ladder on the official MNIST, a CPU proxy at the paper's
scale of noise. A rung trains a ``configs/mnist/pategan_*`` config (``--config``, ``--set`` overrides)
with ``--teachers`` teachers (few, each with thousands of digits) while the vote noise is that of
``--noise-of`` teachers (the config's count by default): λ is planned as the config plans it at its
budget (after its measured mean images, whose noise is the config's: the same 60,000 digits), then
multiplied by ``noise-of / teachers``, so the Laplace noise relative to the number of teachers is the
config's. The proxy is not a guarantee: its votes are not charged (the run takes the config's
``planned_queries``); its ε is the config's by construction. ``--votes off`` replaces the noisy labels by
fair coin flips (what the measured mean images alone buy), ``--votes noise-free`` uses λ = 1000. After
training: the teachers' vote statistics on 200 fresh samples (private diagnostics, WITHOUT noise), and a
CNN trained on 5,000 generated digits, tested on the 10,000 real test digits (final and selected on
synthetic validation). Records: ``benchmarks/results/pategan_ladder_mnist.jsonl``; table ``.md`` beside it::

    python benchmarks/pategan_ladder.py --dataset mnist --name eps10 --config configs/mnist/pategan_eps10_guarantee.yaml --teachers 20
"""

from __future__ import annotations

import argparse
import json
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
    from lightning_gpate.models.pategan import PAPER_SETTINGS
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
    model = PATEGAN(dm.spec, **{**PAPER_SETTINGS, "delta": DELTA, **privacy, **model_options})  # the rungs ran the former defaults
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


# ----------------------------------------------------------------------------------------------- MNIST (images)
OUT_MNIST = ROOT / "benchmarks" / "results" / "pategan_ladder_mnist"
VOTES = ("noisy", "off", "noise-free")


def run_mnist(args) -> dict:
    """One rung of the MNIST ladder (see the module doc)."""
    import pytorch_lightning as pl
    import torch
    import yaml

    from image_utility import build, load_config
    from lightning_gpate.evaluation.image import cnn_utility
    from lightning_gpate.privacy import LaplaceVoteEvent
    from lightning_gpate.sampling import image_grid, save_png
    from pategan_vote_signal import vote_statistics

    config = load_config(args.config)
    init, data_init = config["model"]["init_args"], config["data"]["init_args"]
    overrides = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    noise_of = args.noise_of or int(data_init["num_teachers"])
    pl.seed_everything(args.seed, verbose=False)
    dm, model = build(config, model_overrides=overrides,
                      data_overrides={"root": args.data_root, "download": False, "num_teachers": args.teachers})
    planned_lam = model.lam
    model.lam = 1000.0 if args.votes == "noise-free" else planned_lam * noise_of / args.teachers
    charge, queries = model.charge, []

    def charge_anchor_only(event, **kw):  # the proxy's votes are uncharged (the config's queries, by construction)
        if isinstance(event, LaplaceVoteEvent):
            queries.append(len(event.vote_gaps))
            return True
        return charge(event, **kw)

    model.charge = charge_anchor_only
    if args.votes == "off":  # fair coins instead of the votes: what the measured mean images alone buy
        model.noisy_labels = lambda counts: torch.randint(2, (counts.shape[0],), device=counts.device).float()
        model.teacher_votes = lambda x, y: torch.zeros(x.shape[0], 2, dtype=torch.float64)  # unused: no teacher work
        model._teacher_step = lambda *batch: torch.zeros(())
    m = int(model.hparams.query_batch_size) * int(model.hparams.student_steps)
    steps = args.steps or int(model.hparams.planned_queries) // m
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(model, dm)
    fit_s = time.perf_counter() - start
    votes = vote_statistics(model, n=200) if args.votes != "off" else {k: float("nan") for k in ("real_votes", "unanimous", "gap", "flip", "student_real")}
    x, y = model.generate(5000, seed=0)
    cnn = cnn_utility((x, y), dm.model_space("test"), num_classes=10, seed=0, device="cpu")
    grid_dir = Path(args.out).with_suffix("")
    grid_dir.mkdir(parents=True, exist_ok=True)
    gx, gy = model.generate(100, labels=torch.arange(10).repeat_interleave(10), seed=1)
    save_png(image_grid(gx, gy, 10, per_class=10), grid_dir / f"{args.name}.png")
    return {"name": args.name, "config": args.config, "set": args.set, "votes": args.votes, "teachers": args.teachers,
            "noise_of": noise_of, "epsilon": float(init["epsilon"]), "planned_lam": planned_lam, "lam": model.lam,
            "anchor_epsilon": float(model.spent_epsilon()) if model.marginal_noise is not None else 0.0,
            "marginal_fraction": float(model.hparams.marginal_fraction), "queries": int(sum(queries)), "steps": int(trainer.global_step),
            **votes, **{k: v for k, v in cnn.items() if k.startswith("cnn_accuracy")}, "fit_s": round(fit_s, 1), "grid": f"{grid_dir.name}/{args.name}.png"}


def report_mnist(out: Path) -> None:
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    lines = ["# PATE-GAN's ladder on the official MNIST (CPU proxy at the paper's scale of noise)", "",
             "Generated by `benchmarks/pategan_ladder.py --dataset mnist` (its docstring defines the rungs). `teachers`: the "
             "proxy's teachers (each with 60,000/teachers digits); the vote noise is that of `noise of` teachers at the config's ε "
             "(λ × noise-of/teachers; not a guarantee for the proxy). Vote statistics on 200 fresh samples without noise (a private "
             "diagnostic); CNN on 5,000 generated digits, tested on the 10,000 real test digits (chance 0.10).", "",
             "| rung | config | options | votes | teachers | noise of | ε | anchor ε | λ (proxy) | queries | steps | real votes | unanimous | "
             "flip | CNN final | CNN val-sel. | grid |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | `{Path(r['config']).stem}` | {', '.join(r['set']) or '–'} | {r['votes']} | {r['teachers']} | "
                     f"{r['noise_of']} | {r['epsilon']:g} | {r['anchor_epsilon']:.2f} | {r['lam']:.4g} | {r['queries']} | {r['steps']} | "
                     f"{r['real_votes']:.3f} | {r['unanimous']:.2f} | {r['flip']:.3f} | {r['cnn_accuracy_final']:.3f} | "
                     f"{r['cnn_accuracy_val_selected']:.3f} | [grid]({r['grid']}) |")
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
    mnist = parser.add_argument_group("MNIST (--dataset mnist)")
    mnist.add_argument("--dataset", default="cervical", choices=["cervical", "mnist"])
    mnist.add_argument("--name", default="rung")
    mnist.add_argument("--config", default="configs/mnist/pategan_eps10_guarantee.yaml")
    mnist.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model overrides (YAML values)")
    mnist.add_argument("--teachers", type=int, default=20)
    mnist.add_argument("--noise-of", type=int, default=0, help="vote noise of this many teachers (0: the config's)")
    mnist.add_argument("--votes", default="noisy", choices=VOTES)
    mnist.add_argument("--steps", type=int, default=0, help="generator steps (0: the config's planned queries)")
    mnist.add_argument("--seed", type=int, default=0)
    mnist.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if args.dataset == "mnist":
        out = Path(args.out if args.out != str(OUT) else OUT_MNIST)
        if not args.report_only:
            record = run_mnist(args)
            print("RESULT " + json.dumps(record), flush=True)
            with out.with_suffix(".jsonl").open("a") as f:
                f.write(json.dumps(record, default=float) + "\n")
        report_mnist(out)
        return
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
