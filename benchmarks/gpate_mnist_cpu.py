"""G-PATE's (and GS-WGAN's) student on the official 28×28 MNIST with few teachers on a CPU: does the generator learn digits?

Not the paper's scale (``benchmarks/mnist_table.py`` on a GPU is): with 25 teachers each holds 2,400
digits, so the teachers are strong and the question is only whether the *student* — the generator
trained through the aggregator's projected votes — turns what they know into digits, and in how many
aggregations. Runs noise-free (σ ≈ 0, no budget) or with the noise scaled to what a config's σ means
at its own teacher count (``--noise-of``: the same σ per teacher, so the votes' signal-to-noise ratio
matches; the ε is *not* that config's guarantee). Each run: a fit of ``--steps`` aggregations from a
``configs/mnist`` config with ``--set`` overrides, a 10×10 grid every ``--every`` aggregations, then a
CNN trained on 5,000 generated digits and tested on the 10,000 real test digits.

GS-WGAN configs (``configs/mnist/gswgan_*``) run both stages: the discriminators' pretraining
(``--pretrain-iterations``, cached under ``--out-dir``/pretrained per teachers, iterations and nets, so
that rungs share it), then ``--steps`` private generator steps. The sanitiser's noise per step does not
depend on the number of discriminators, so a run with few of them has the noise of the config's row;
its ε is recorded at the config's N_D and the run's steps, in both accountings (``--noise-of`` does not
apply).

Usage::

    python benchmarks/gpate_mnist_cpu.py --name paper_nearest --config configs/mnist/gpate_eps10_guarantee.yaml \\
        --steps 400 --set generator_upsample=nearest
    python benchmarks/gpate_mnist_cpu.py --name paper10_noise --config configs/mnist/gpate_eps10_nearest_guarantee.yaml \\
        --steps 50 --noise-of 2000

Results: one JSON line per run appended to ``--results`` (default
``benchmarks/results/gpate_mnist_cpu.jsonl``), grids under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def smooth_projections(pool: int):
    """Gaussian random fields on a grid ``pool`` times coarser, bilinearly upsampled: a public,
    data-independent projection whose back-projection has no pixel-scale noise (an experiment)."""
    import torch
    import torch.nn.functional as F

    def projection(m, d, k, *, generator=None, device=None, dtype=torch.float32):
        side = int(round(math.sqrt(d)))
        g = torch.randn(m * k, 1, side // pool, side // pool, generator=generator, device=device or "cpu", dtype=dtype)
        up = F.interpolate(g, size=(side, side), mode="bilinear", align_corners=False)
        up = up / up.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * math.sqrt(d)  # columns as long as N(0, 1) ones
        return up.view(m, k, d).transpose(1, 2).contiguous().mul_(1.0 / math.sqrt(k))

    return projection


def accepted(config: dict, overrides: dict) -> dict:
    """The overrides the config's model takes (the G-PATE settings this script sets are not GS-WGAN's)."""
    import inspect

    from image_utility import _import

    params = inspect.signature(_import(config["model"]["class_path"]).__init__).parameters
    return {k: v for k, v in overrides.items() if k in params}


def pretrained_checkpoint(config: dict, a, model_over: dict, data_over: dict) -> Path:
    """GS-WGAN: the discriminators' pretraining (stage 1) for these teachers, iterations and nets, run once
    and cached under ``--out-dir``/pretrained (every rung of a ladder then starts from the same
    discriminators)."""
    import hashlib

    import pytorch_lightning as pl

    from image_utility import build

    init = config["model"]["init_args"]
    nets = {k: model_over.get(k, init.get(k)) for k in ("df_dim", "fc_dim", "z_dim", "pretrain_generator_hidden", "critic_steps", "lr")}
    key = json.dumps({"teachers": a.teachers, "iterations": a.pretrain_iterations, **nets}, sort_keys=True)
    path = Path(a.out_dir) / "pretrained" / f"gswgan_{hashlib.sha1(key.encode()).hexdigest()[:12]}.ckpt"
    if path.is_file():
        return path
    pl.seed_everything(0, verbose=False)
    dm, model = build(config, model_overrides={**model_over, "stage": "pretrain", "pretrain_iterations": a.pretrain_iterations},
                      data_overrides=data_over)
    trainer = pl.Trainer(max_steps=a.pretrain_iterations, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(model, dm)
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(path)
    path.with_suffix(".json").write_text(json.dumps({"key": json.loads(key), "pretrain_s": round(time.perf_counter() - start, 1)}))
    print(f"pretrained {a.teachers} discriminators for {a.pretrain_iterations} iterations in {time.perf_counter() - start:.0f} s: {path}",
          flush=True)
    return path


def gswgan_record(config: dict, model, a, steps: int) -> dict:
    """GS-WGAN's figures: pretraining iterations, σ, B, and the ε these steps would cost at the config's N_D."""
    from lightning_gpate.privacy import gswgan_epsilon

    hp = model.hparams
    n_d = int(config["data"]["init_args"]["num_teachers"])
    kw = dict(noise_multiplier=hp.noise_multiplier, num_discriminators=n_d, batch_size=hp.generator_batch_size, steps=steps,
              delta=hp.delta)
    return {"pretrain_iterations": a.pretrain_iterations, "noise_multiplier": hp.noise_multiplier, "generator_batch_size": hp.generator_batch_size,
            "discriminator_state": hp.discriminator_state, "config_discriminators": n_d,
            "epsilon_sound_at_config_scale": gswgan_epsilon(accounting="sound", **kw),
            "epsilon_paper_at_config_scale": gswgan_epsilon(accounting="paper", **kw)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--config", default="configs/mnist/gpate_eps10_nearest_guarantee.yaml")
    p.add_argument("--teachers", type=int, default=25)
    p.add_argument("--steps", type=int, default=150, help="aggregations")
    p.add_argument("--every", type=int, default=50, help="a grid every this many aggregations")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model overrides (YAML values)")
    p.add_argument("--noise-of", type=int, default=0, metavar="TEACHERS",
                   help="scale the config's sigmas by --teachers / TEACHERS (0: noise-free)")
    p.add_argument("--smooth-projection", type=int, default=1, metavar="POOL", help="experiment: smooth projections")
    p.add_argument("--pretrain-iterations", type=int, default=200, help="GS-WGAN: iterations of the discriminators' pretraining")
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out-dir", default=str(ROOT / "outputs" / "gpate_mnist_cpu"))
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "gpate_mnist_cpu.jsonl"))
    a = p.parse_args(argv)

    import pytorch_lightning as pl
    import torch
    import yaml

    from image_utility import build, grids_every, load_config
    from lightning_gpate.evaluation.image import cnn_utility

    config = load_config(a.config)
    init = config["model"]["init_args"]
    # No budget stop: these runs measure learning, not privacy. 1e18 because TopAgg at the noise-free
    # sigma 1e-3 spends ~2e10 per aggregation (30 fakes): a budget of 1e12 stopped it after 50.
    model_over = {"teacher_precision": "32", "teacher_chunk_size": None, "epsilon": 1e18}
    for kv in a.set:
        key, value = kv.split("=", 1)
        model_over[key] = yaml.safe_load(value)
    for key in ("sigma_threshold", "sigma_gnmax", "sigma_topagg"):
        if key in init or key in model_over:
            sigma = float(model_over.get(key, init.get(key)))
            model_over[key] = sigma * a.teachers / a.noise_of if a.noise_of else 1e-3
    if a.smooth_projection > 1:
        import lightning_gpate.models.gpate as gpate_module

        gpate_module.random_projection = smooth_projections(a.smooth_projection)
    torch.set_num_threads(a.threads)
    data_over = {"root": a.data_root, "download": False, "num_teachers": a.teachers}
    model_over = accepted(config, model_over)
    pretrain = pretrained_checkpoint(config, a, model_over, data_over) if init.get("stage") == "train" else None
    if pretrain is not None:
        model_over["pretrained_checkpoint"] = str(pretrain)
    pl.seed_everything(0, verbose=False)
    dm, model = build(config, model_overrides=model_over, data_overrides=data_over)
    out = Path(a.out_dir) / a.name
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[grids_every(out, a.every)])
    trainer.fit(model, dm)
    fit_s = time.perf_counter() - start
    x, y = model.generate(5000, seed=0)
    cnn = cnn_utility((x, y), dm.model_space("test"), num_classes=10, seed=0, device="cpu")
    record = {"name": a.name, "config": a.config, "teachers": a.teachers, "aggregations": int(trainer.global_step),
              "noise_of": a.noise_of, "set": a.set, "smooth_projection": a.smooth_projection, "fit_s": round(fit_s, 1),
              **{k: v for k, v in cnn.items() if k.startswith("cnn_accuracy")}}
    if pretrain is not None:
        record.update(gswgan_record(config, model, a, int(trainer.global_step)))
    with open(a.results, "a") as f:
        f.write(json.dumps(record) + "\n")
    print("RESULT " + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
