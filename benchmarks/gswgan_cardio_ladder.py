"""GS-WGAN on cardio under the sound analysis: what a CPU-sized run reaches at ε ≤ 10 (issue 12).

Each rung trains GS-WGAN (``budget_accounting: guarantee``) on the full cardio split of the tabular
benchmark (``benchmarks/tabular_utility.py``: 56,000 train / 14,000 test rows, declared schema and
class ratio) with the settings given on the command line, then scores 5,000 synthetic rows with
logistic regression and random forest (Setting B, real test split). Stage 1 (non-private
discriminator pretraining) is cached per (seed, discriminators, nets, iterations) in the temp dir, as
in the benchmark. One JSON line per rung is appended to ``--out`` (default
``benchmarks/results/gswgan_cardio_ladder.jsonl``); ``--report`` prints the rungs as a Markdown table.

Usage::

    python benchmarks/gswgan_cardio_ladder.py --discriminators 3000 --sigma 2.4 --steps 4000 --generator-lr 1e-3
    python benchmarks/gswgan_cardio_ladder.py --report
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "gswgan_cardio_ladder.jsonl"


def run(args) -> dict:
    import pytorch_lightning as pl
    import torch

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import GSWGAN
    from tabular_utility import DELTA, _trainer, datamodule, score

    torch.set_num_threads(1)
    data = dict(num_teachers=args.discriminators, teacher_batch_size=args.teacher_batch)
    model_opts = dict(noise_multiplier=args.sigma, clip_bound=1.0, generator_batch_size=args.batch, critic_steps=args.critic_steps,
                      z_dim=32, generator_hidden=tuple(args.generator_hidden), discriminator_hidden=(128,),
                      pretrain_generator_hidden=(64,), pretrain_iterations=args.pretrain, ema_decay=args.ema,
                      lr=args.lr, generator_lr=args.generator_lr, betas=tuple(args.betas), generator_betas=tuple(args.generator_betas))
    pl.seed_everything(args.seed, verbose=False)
    dm = datamodule("cardio", args.seed, **data)
    privacy = {"epsilon": args.epsilon, "delta": DELTA}
    pre_keys = dict(data=data, pretrain=args.pretrain, critic_steps=args.critic_steps, lr=args.lr, gen=args.generator_hidden)
    digest = hashlib.sha1(json.dumps(pre_keys, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / "lightning_gpate_benchmark" / f"gswgan-ladder-cardio-{args.seed}-{digest}.ckpt"
    start = time.perf_counter()
    pretrain_s = 0.0
    if not path.exists():
        pre = GSWGAN(dm.spec, stage="pretrain", **privacy, **model_opts)
        trainer = _trainer(args.pretrain)
        trainer.fit(pre, datamodule=dm)
        path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        dm = datamodule("cardio", args.seed, **data)
        pretrain_s = time.perf_counter() - start
    model = GSWGAN(dm.spec, stage="train", pretrained_checkpoint=str(path), **privacy, **model_opts)
    trainer = _trainer(args.steps)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    train_s = time.perf_counter() - t0
    model.eval()
    synthetic = synthetic_table(model, 5000, seed=args.seed)
    scores = score(dm.split_frame("train"), dm.split_frame("test"), synthetic, "cardio", args.seed,
                   ["LogisticRegression", "RandomForest"], dm.spec)
    record = {k: v for k, v in vars(args).items() if k not in ("out", "report")}
    record.update(lr_auroc=scores["per_classifier"].get("LogisticRegression"), rf_auroc=scores["per_classifier"].get("RandomForest"),
                  eps_spent=float(model.guarantee_epsilon()), steps_taken=int(trainer.global_step),
                  stop_reason=model.stop_reason or "max_steps reached", pretrain_s=pretrain_s, train_s=train_s)
    return record


def report(out: Path) -> None:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    print("| N_D | σ | B | steps | pretrain it. | lr D / G | G betas | critic steps | ε spent | LR AUROC | RF AUROC | train s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eps = f"{r['eps_spent']:.2f}" if r["eps_spent"] < 1e3 else "not private"
        print(f"| {r['discriminators']} | {r['sigma']} | {r['batch']} | {r['steps_taken']} | {r['pretrain']} | {r['lr']:g} / {r['generator_lr'] or r['lr']:g} | "
              f"{tuple(r['generator_betas'])} | {r['critic_steps']} | {eps} | {r['lr_auroc']:.3f} | {r['rf_auroc']:.3f} | {r['train_s']:.0f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--discriminators", type=int, default=1500)
    p.add_argument("--sigma", type=float, default=2.6)
    p.add_argument("--batch", type=int, default=32, help="generated samples per generator step (B)")
    p.add_argument("--teacher-batch", type=int, default=32, help="real rows per critic step")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--pretrain", type=int, default=100)
    p.add_argument("--critic-steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--generator-lr", type=float, default=None)
    p.add_argument("--betas", type=float, nargs=2, default=(0.5, 0.9))
    p.add_argument("--generator-betas", type=float, nargs=2, default=(0.5, 0.9))
    p.add_argument("--generator-hidden", type=int, nargs="+", default=(256, 256))
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--epsilon", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--report", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.report:
        report(out)
        return
    record = run(args)
    print(json.dumps(record), flush=True)
    with out.open("a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
