"""G-PATE's (and GS-WGAN's) student on the official 28×28 MNIST with few teachers on a CPU: does the generator learn digits?

Not the paper's scale (``benchmarks/mnist_table.py`` on a GPU is): with 25 teachers each holds 2,400
digits, so the teachers are strong and the question is only whether the *student* — the generator
trained through the aggregator's projected votes — turns what they know into digits, and in how many
aggregations. Runs noise-free (σ ≈ 0, no budget) or with the noise scaled to what a config's σ means
at its own teacher count (``--noise-of``: the same σ per teacher, so the votes' signal-to-noise ratio
matches; the ε is *not* that config's guarantee). Each run: a fit of ``--steps`` aggregations from a
``configs/mnist`` config with ``--set`` overrides, a 10×10 grid every ``--every`` aggregations, then a
CNN trained on 5,000 generated digits (``--num-samples``: more counts scored beside it; the GPU
table's is 10,000) and tested on the 10,000 real test digits.

PATE-GAN configs (``configs/mnist/pategan_*``) keep their privacy budget: it plans λ and the per-class mean
image's noise, and stops the votes after the row's planned queries; ``--noise-of`` scales the Laplace noise
on the vote counts to the same share of the vote range as at that many teachers (not a guarantee for the
proxy's teachers). GS-WGAN configs (``configs/mnist/gswgan_*``) run both stages: the discriminators' pretraining
(``--pretrain-iterations``, cached under ``--out-dir``/pretrained per teachers, iterations and nets, so
that rungs share it), then ``--steps`` private generator steps. The sanitiser's noise per step does not
depend on the number of discriminators, so a run with few of them has the noise of the config's row;
its ε is recorded at the config's N_D and the run's steps, in both accountings (``--noise-of`` does not
apply).

Usage::

    python benchmarks/gpate_mnist_cpu.py --name paper_nearest --config configs/mnist/gpate_paper_eps10_guarantee.yaml \\
        --steps 400 --set generator_upsample=nearest
    python benchmarks/gpate_mnist_cpu.py --name paper10_noise --config configs/mnist/gpate_eps10_nearest_guarantee.yaml \\
        --steps 50 --noise-of 2000

``--eval-at`` adds CNN accuracies at earlier aggregation counts (a learning curve from one run);
``--extra-ema`` keeps more weight averages of the same generator (post-processing: free) and evaluates each
at the end and at ``--eval-at`` (the EMA lever without another fit);
``--warm-cache DIR`` keeps the teachers after their free warm-up (``teacher_warmup_steps``, a third of a
short run's CPU time) and starts later runs with the same teacher settings from them; ``--budget-of``
runs exactly the aggregations the config's privacy budget allows at the config's own teacher count and
σ (the data-independent guarantee the GPU row would stop on), not ``--steps``; ``--records-per-teacher 30``
gives each teacher as few digits as at the paper's 2,000 teachers (the faithful proxy: the H200 run of
``gpate_eps10_gaussagg_guarantee`` reached 0.638 after 893 aggregations where the strong-teacher proxy had
0.788 after 800); ``--anchor-only`` trains the generator on its anchor's term alone, without teachers (with
``--set anchor_fraction=...``): the reference that says what the votes add to an anchor.

Results: one JSON line per run appended to ``--results`` (default
``benchmarks/results/gpate_mnist_cpu.jsonl``), grids under ``--out-dir``; a run stopped early (Ctrl-C, ``kill``,
``timeout``) after an ``--eval-at`` point still writes one, its curve so far with ``"stopped"`` saying where.
``--plot PNG --runs NAME[=LABEL] ... [--targets ACC[=LABEL] ...]`` runs nothing: it draws recorded runs' learning
curves in one picture.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MNIST_TRAIN = 60_000  # the official training digits (a public count)
SCORES = ("cnn_accuracy_final", "cnn_accuracy_val_selected")  # what each CNN evaluation records
HEADLINE = (*SCORES, "cnn_accuracy_best_on_test_paper_style")  # the run's final score also keeps the test-selected figure, labelled
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from image_utility import append_jsonl  # noqa: E402


def flat_aggregator(init: dict) -> dict:
    """G-PATE's model options with its aggregator group (``class_path``/``init_args``) in the flat names of before the
    option groups (``aggregator: gaussian``, ``sigma_gaussian``), which the noise scaling and the budget here read."""
    from lightning_gpate.models.aggregators import AGGREGATORS

    group = init.get("aggregator")
    if not isinstance(group, dict):
        return init
    name = group["class_path"].rsplit(".", 1)[-1]
    key, cls = next((key, cls) for key, cls in AGGREGATORS.items() if cls.__name__ == name)
    args = group.get("init_args") or {}
    return {**{flat: args[own] for flat, own in cls.FLAT.items() if own in args}, **init, "aggregator": key}


def pretrained_checkpoint(config: dict, a, model_over: dict, data_over: dict) -> Path:
    """GS-WGAN: the discriminators' pretraining (stage 1) for these teachers, iterations and nets, run once
    and cached under ``--out-dir``/pretrained (every rung of a ladder then starts from the same
    discriminators)."""
    import hashlib

    import pytorch_lightning as pl

    from image_utility import build
    from mnist_table import flat_option, model_overrides

    init = {**config["model"]["init_args"], **model_over}
    nets = {k: flat_option(config, model_over, k) for k in ("df_dim", "z_dim", "pretrain_generator_hidden", "critic_steps", "lr")}
    nets["fc_dim"] = (init.get("discriminator") or {}).get("fc_dim", init.get("fc_dim"))  # the discriminators' (the generator has one too)
    what = {"teachers": a.teachers, "iterations": a.pretrain_iterations, **nets}
    if a.records_per_teacher:  # keys of the full-data discriminators unchanged
        what["records_per_teacher"] = a.records_per_teacher
    key = json.dumps(what, sort_keys=True)
    path = Path(a.out_dir) / "pretrained" / f"gswgan_{hashlib.sha1(key.encode()).hexdigest()[:12]}.ckpt"
    if path.is_file():
        return path
    pl.seed_everything(0, verbose=False)
    stage1 = model_overrides(config, {**model_over, "stage": "pretrain", "pretrain_iterations": a.pretrain_iterations})
    dm, model = build(config, model_overrides=stage1,
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


def warm_key(config: dict, model_over: dict, teachers: int, seed: int, records_per_teacher: int = 0) -> str:
    """File name of the teachers after warm-up: everything their warm-up depends on (teacher and generator
    settings, teacher batch, teacher count, their data, seed), hashed."""
    import hashlib

    init = {**config["model"]["init_args"], **model_over}
    generator = init.pop("generator", None) or {}  # the flat names of before the option groups: the same keys
    init.update({f"teacher_{k}": v for k, v in (init.pop("teachers", None) or {}).items()})
    init.update({{"upsample": "generator_upsample"}.get(k, k): v for k, v in generator.items() if k in ("z_dim", "gf_dim", "fc_dim", "upsample")})
    keys = sorted(k for k in init if k.startswith("teacher") or k in ("z_dim", "gf_dim", "fc_dim", "generator_upsample"))
    data = config["data"]["init_args"]
    what = [{k: init[k] for k in keys}, data.get("teacher_batch_size"), teachers, seed]
    if records_per_teacher:  # keys of the full-data teachers unchanged
        what.append({"records_per_teacher": records_per_teacher})
    what = json.dumps(what, sort_keys=True, default=str)
    return f"warm_{hashlib.sha256(what.encode()).hexdigest()[:16]}.pt"


def budget_aggregations(config: dict, overrides: list[str]) -> int:
    """How many aggregations the config's (ε, δ) budget allows under the data-independent guarantee, at the
    config's own teacher count and σ: every aggregation at its worst case (DPGradAgg: every query of the
    most units answered), as the model's budget stop counts it."""
    from image_utility import parse_sets
    from lightning_gpate.models.private import plan_gaussian_noise
    from lightning_gpate.privacy import (DEFAULT_ORDERS, ConfidentGNMaxEvent, GaussianSumEvent, PrivacyAccountant,
                                         SubsampledGaussianEvent, TopAggEvent, rdp_to_epsilon)

    init = flat_aggregator({**config["model"]["init_args"], **parse_sets(overrides)})
    teachers = int(config["data"]["init_args"]["num_teachers"])
    m = int(init.get("fake_batch_size", 32))
    units = min(m, 10) if init.get("group_fakes_by_label") else m
    aggregator = init.get("aggregator", "dpgradagg")
    if aggregator == "gaussian":
        event = GaussianSumEvent(num_sums=1, sensitivity=2.0, sigma=float(init["sigma_gaussian"]))
    elif aggregator == "topagg":
        event = TopAggEvent(num_samples=units, topk=int(init["topk"]), sigma=float(init["sigma_topagg"]))
    else:
        queries = units * int(init.get("projection_dim", 10))
        bins = int(init.get("num_bins", 10))
        event = ConfidentGNMaxEvent(np.zeros((queries, bins)), np.ones(queries, dtype=bool),
                                    float(init.get("threshold_fraction", 0.5)) * teachers,
                                    float(init["sigma_threshold"]), float(init["sigma_gnmax"]))
    delta = float(init.get("delta", 1e-5))
    conversion = init.get("conversion", "improved")
    per_step = PrivacyAccountant(delta=delta, data_dependent=False).rdp_of(event)[0]  # RDP at DEFAULT_ORDERS
    budget = float(init["epsilon"])
    before = np.zeros_like(per_step)
    anchor_fraction = float(init.get("anchor_fraction") or (init.get("anchor") or {}).get("fraction") or 0.0)
    if anchor_fraction > 0:  # the class-mean anchor, paid before the first aggregation
        z = plan_gaussian_noise(anchor_fraction * budget, delta=delta, conversion=conversion)
        before = PrivacyAccountant(delta=delta).rdp_of(SubsampledGaussianEvent(noise_multiplier=z, sampling_rate=1.0))[0]

    def epsilon(n: int) -> float:
        return rdp_to_epsilon(before + n * per_step, DEFAULT_ORDERS, delta, conversion=conversion)[0]

    lo, hi = 0, 1  # the largest n with epsilon(n) <= budget
    while epsilon(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if epsilon(mid) <= budget else (lo, mid)
    return lo


def write_record(results: str, record: dict) -> None:
    """Append a run's record to the results (one JSON line) and print it."""
    append_jsonl(results, record)
    print("RESULT " + json.dumps(record), flush=True)


def recorded_curve(curve: dict) -> dict:
    """The ``--eval-at`` points as a record holds them (what :func:`learning_curve` reads back): by step, as text."""
    return {str(k): v for k, v in sorted(curve.items())}


def stopped_record(a, curve: dict, step: int, unit: str, why: BaseException, **run) -> None:
    """A run stopped before its end (Ctrl-C, SIGTERM) keeps what it measured: its ``--eval-at`` points, without the
    final figures it never reached (nothing is written when it measured nothing)."""
    if not curve:
        return
    write_record(a.results, {"name": a.name, "config": a.config, **run, unit: step, "set": a.set, "seed": a.seed,
                             "num_samples": a.num_samples[0], "noise_of": a.noise_of,
                             "stopped": f"{type(why).__name__} after {step} {unit.replace('_', ' ')} of {a.steps}",
                             "curve": recorded_curve(curve)})


def anchor_share(model) -> float:
    """The share of ε G-PATE's class-mean anchor is measured with (its option, or the model's default share)."""
    from lightning_gpate.models.gpate import DEFAULT_ANCHOR_FRACTION

    fraction = model.anchor_options.fraction
    return float(DEFAULT_ANCHOR_FRACTION if fraction is None else fraction)


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def learning_curve(record: dict) -> tuple[list[int], list[float]]:
    """A record's CNN accuracy selected on synthetic validation (its first ``--num-samples``) at each ``--eval-at``
    step and at its end (a stopped run's record has no end), against generator steps (aggregations for a fit)."""
    points = {int(k): v["cnn_accuracy_val_selected"] for k, v in record.get("curve", {}).items()}
    if "cnn_accuracy_val_selected" in record:
        points[int(record.get("aggregations") or record["generator_steps"])] = record["cnn_accuracy_val_selected"]
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def plot_curves(results: str, runs: list[str], path: Path, targets: list[tuple[float, str]]) -> Path:
    """The named runs' learning curves in one picture (``NAME`` or ``NAME=LABEL``; a name run twice: its last
    record), with the targets (accuracy, label or "") as dotted lines: where a ladder stands at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = Path(results).read_text().splitlines()
    records = {record["name"]: record for record in (json.loads(line) for line in lines if line.strip())}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for run in runs:
        name, _, label = run.partition("=")
        if name not in records:
            raise SystemExit(f"--plot: no run named {name!r} in {results}")
        steps, accuracy = learning_curve(records[name])
        ax.plot(steps, accuracy, marker="o", label=label or name)
    for accuracy, label in targets:
        ax.axhline(accuracy, linestyle=":", color="grey", linewidth=1)
        if label:
            ax.annotate(label, (0, accuracy), xycoords=("axes fraction", "data"), xytext=(3, 2),
                        textcoords="offset points", fontsize=7, color="grey")
    ax.set_xlabel("generator steps (aggregations)")
    ax.set_ylabel("CNN accuracy on the real test digits\n(selected on synthetic validation)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_progress(what: str, step: int, steps: int, start: float, *, every: int = 50) -> None:
    """Every ``every`` steps, a line in a long run's log: seconds per step and the minutes left."""
    if step % every == 0:
        spent = time.perf_counter() - start
        print(f"{what} {step} of {steps}: {spent / step:.2f} s each, ~{spent / step * (steps - step) / 60:.0f} min left", flush=True)


def anchor_only(model, dm, a, out: Path, start: float, evaluate, extra: dict, curve: dict, *, record_anchor) -> int:
    """``--anchor-only``: the anchor measured as the row measures it (on all 60,000 digits with
    ``--records-per-teacher``), then ``--steps`` generator steps on ``anchor_weight`` times its term alone, with the
    model's optimiser and weight average; a grid and the CNN as for a fit."""
    from image_utility import save_class_grid
    from lightning_gpate.models.base import average_step

    if record_anchor is None:
        raise SystemExit("--anchor-only needs a G-PATE config with anchor_fraction > 0 (--set anchor_fraction=...)")
    dm.setup("fit")
    model.setup("fit")
    model._measure_mean_images(*(t.to(model.device) for t in dm.model_space("train")))
    opt = model.configure_optimizers()
    step = 0
    try:
        for step in range(1, a.steps + 1):
            loss = model.anchor_options.weight * model.anchor_loss()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if model.generator_options.averaged:
                average_step(model.generator_ema, model.generator, model.generator_options.ema_decay, step)
            for decay, ema in extra.items():
                average_step(ema, model.generator, decay, step)
            report_progress("generator step", step, a.steps, start)
            if step in a.eval_at:
                curve[step] = evaluate(model)
                print(f"step {step}: {curve[step]}", flush=True)
    except KeyboardInterrupt as stop:
        stopped_record(a, curve, step - 1, "generator_steps", stop, anchor_only=True)  # the step it was in did not finish
        return 1
    model.eval()
    save_class_grid(model, out / f"step{a.steps:06d}.png")
    fit_s = round(time.perf_counter() - start, 1)
    record = {"name": a.name, "config": a.config, "anchor_only": True, "generator_steps": a.steps, "set": a.set, "seed": a.seed,
              "fit_s": fit_s, "num_samples": a.num_samples[0], **evaluate(model, HEADLINE),
              "anchor_noise_multiplier": float(record_anchor), "anchor_records": MNIST_TRAIN if a.records_per_teacher else int(len(dm.splits["train"][1]))}
    if curve:
        record["curve"] = recorded_curve(curve)
    write_record(a.results, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="the run's name (required unless --plot)")
    p.add_argument("--config", default="configs/mnist/gpate_eps10_nearest_guarantee.yaml")
    p.add_argument("--teachers", type=int, default=25)
    p.add_argument("--steps", type=int, default=150, help="aggregations")
    p.add_argument("--every", type=int, default=50, help="a grid every this many aggregations")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model overrides (YAML values)")
    p.add_argument("--noise-of", type=int, default=0, metavar="TEACHERS",
                   help="scale the config's sigmas by --teachers / TEACHERS (0: noise-free)")
    p.add_argument("--pretrain-iterations", type=int, default=200, help="GS-WGAN: iterations of the discriminators' pretraining")
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the model and the evaluation CNN run (the proxy's figures are device-independent: "
                        "--anchor-only's 1,000 images a step are ~12 s a step on one CPU thread)")
    p.add_argument("--records-per-teacher", type=int, default=0, metavar="N",
                   help="teachers as weak as at the paper's scale (30 digits each at 2,000 teachers): only ~N x teachers "
                        "of the 60,000 training digits are partitioned (the rest is held out as an unused val split)")
    p.add_argument("--seed", type=int, default=0, help="seed_everything (generator init, data order)")
    p.add_argument("--eval-at", type=int, nargs="*", default=[], metavar="N", help="also a CNN after N aggregations")
    p.add_argument("--extra-ema", type=float, nargs="*", default=[], metavar="DECAY",
                   help="also evaluate EMAs of the generator with these decays (the run's ema_decay must be > 0)")
    p.add_argument("--num-samples", type=int, nargs="+", default=[5000], metavar="N",
                   help="generated digits the CNN trains on: the first is the headline figure, the others are recorded "
                        "beside it (the GPU table, mnist_table.py, uses 10,000; rows 1-53 used 5,000)")
    p.add_argument("--warm-cache", default=None, metavar="DIR", help="reuse the teachers after their warm-up")
    p.add_argument("--anchor-only", action="store_true",
                   help="G-PATE with an anchor: train the generator on the anchor's term alone (no teachers, no votes) for "
                        "--steps generator steps, with the config's optimiser and EMA: what the votes add")
    p.add_argument("--budget-of", action="store_true",
                   help="run the aggregations the config's budget allows at its own teachers and sigmas (ignores --steps)")
    p.add_argument("--out-dir", default=str(ROOT / "outputs" / "gpate_mnist_cpu"))
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "gpate_mnist_cpu.jsonl"))
    p.add_argument("--plot", default=None, metavar="PNG", help="no run: draw the learning curves of --runs from --results")
    p.add_argument("--runs", nargs="*", default=[], metavar="NAME[=LABEL]", help="--plot: the runs, in the legend's order")
    p.add_argument("--targets", nargs="*", default=[], metavar="ACC[=LABEL]", help="--plot: dotted lines at these accuracies")
    a = p.parse_args(argv)
    if a.plot:
        if not a.runs:
            p.error("--plot needs --runs NAME[=LABEL] ...")
        targets = []
        for target in a.targets:
            accuracy, _, label = target.partition("=")
            try:
                targets.append((float(accuracy), label))
            except ValueError:
                p.error(f"--targets: {target!r} is not ACC or ACC=LABEL")
        print(plot_curves(a.results, a.runs, Path(a.plot), targets))
        return 0
    if not a.name:
        p.error("--name is required")

    import pytorch_lightning as pl
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA device (leave --device out to run on the CPU)")

    from image_utility import build, grids_every, load_config, parse_sets
    from mnist_table import model_overrides
    from lightning_gpate.evaluation.image import cnn_utility
    from lightning_gpate.models.base import average_step
    from lightning_gpate.models.private import plan_gaussian_noise

    config = load_config(a.config)
    init = config["model"]["init_args"]
    if a.budget_of:
        a.steps = budget_aggregations(config, a.set)
        print(f"the budget allows {a.steps} aggregations", flush=True)
    # No budget stop: these runs measure learning, not privacy. 1e18 because TopAgg at the noise-free
    # sigma 1e-3 spends ~2e10 per aggregation (30 fakes): a budget of 1e12 stopped it after 50.
    model_over = {"teacher_precision": "32", "teacher_chunk_size": None, "epsilon": 1e18}
    pategan = config["model"]["class_path"].endswith("PATEGAN")
    if pategan:  # the config's budget: it plans λ and the anchor's noise and stops the votes where the row would
        del model_over["epsilon"]
    model_over.update(parse_sets(a.set))
    sigmas = flat_aggregator(init)
    for key in ("sigma_threshold", "sigma_gnmax", "sigma_topagg", "sigma_gaussian"):
        if key in sigmas or key in model_over:
            sigma = float(model_over.get(key, sigmas.get(key)))
            model_over[key] = sigma * a.teachers / a.noise_of if a.noise_of else 1e-3
    torch.set_num_threads(a.threads)
    data_over = {"root": a.data_root, "download": False, "num_teachers": a.teachers}
    if a.records_per_teacher:  # the official MNIST's public 60,000 training digits; the split is keyed per record
        data_over["val_fraction"] = 1.0 - a.records_per_teacher * a.teachers / MNIST_TRAIN
    model_over = model_overrides(config, model_over)
    pretrain = pretrained_checkpoint(config, a, model_over, data_over) if init.get("stage") == "train" else None
    if pretrain is not None:
        model_over["pretrained_checkpoint"] = str(pretrain)
    pl.seed_everything(a.seed, verbose=False)
    dm, model = build(config, model_overrides=model_over, data_overrides=data_over)
    if pategan and a.noise_of:
        # Lap(1/λ) on counts out of --teachers as large, next to the vote range, as at --noise-of teachers (the
        # noisy share the student learns from has the row's noise); λ, its accounting and the stop stay the row's
        row_noise = model.vote_noise
        model.vote_noise = lambda shape: row_noise(shape) * (a.teachers / a.noise_of)
    if getattr(model, "anchor_noise", None) is not None and "epsilon" in model_over and a.noise_of:
        # G-PATE's class-mean anchor with the noise of the row's own budget (not of the proxy's unbounded one)
        model.anchor_noise = plan_gaussian_noise(anchor_share(model) * float(init["epsilon"]), delta=model.delta,
                                                 orders=model.accountant.orders, conversion=model.accountant.conversion,
                                                 neighbouring=model.neighbouring_relation)
    anchor_noise = getattr(model, "marginal_noise", None) if pategan else getattr(model, "anchor_noise", None)
    if anchor_noise is not None:  # said at the start: a run meant at the row's noise once ran noise-free unnoticed (row 57)
        whose = ("the row's, from its share of the config's ε" if pategan or a.noise_of
                 else "noise-free: the proxy's budget is unbounded without --noise-of")
        print(f"anchor noise multiplier {float(anchor_noise):.3g} ({whose})", flush=True)
    if a.records_per_teacher and anchor_noise is not None:
        # The row measures each class's mean image on the whole training split (its teachers hold all 60,000
        # digits); the proxy's teachers hold 750-1,500, and the noise on means of so few would be 40-80x the
        # row's (0.104 at eps=1 against 0.729 measured on all). So the anchor reads the set-aside digits too.
        measure_on_split = model._measure_mean_images

        def measure_on_all(x, y):
            held_out_x, held_out_y = dm.model_space("val")
            return measure_on_split(torch.cat([x, held_out_x.to(x.device)]), torch.cat([y, held_out_y.to(y.device)]))

        model._measure_mean_images = measure_on_all
    warm_path = None
    if a.warm_cache:
        warm_path = Path(a.warm_cache) / warm_key(config, model_over, a.teachers, a.seed, a.records_per_teacher)
        if warm_path.exists():
            model._pending_teacher_state = torch.load(warm_path)
            print(f"teachers after warm-up from {warm_path}", flush=True)
    out = Path(a.out_dir) / a.name
    out.mkdir(parents=True, exist_ok=True)

    curve = {}
    extra = {}  # decay -> EMA generator (the model's own EMA is ema_decay's)

    def cnn_now(pl_module, decay=None, n=None):
        n = n or a.num_samples[0]
        was_training = pl_module.training
        pl_module.eval()
        if decay is None:
            x, y = pl_module.generate(n, seed=0)
        else:  # sample from the extra EMA in the model's place
            own = copy.deepcopy(pl_module.generator_ema.state_dict())
            pl_module.generator_ema.load_state_dict(extra[decay].state_dict())
            x, y = pl_module.generate(n, seed=0)
            pl_module.generator_ema.load_state_dict(own)
        pl_module.train(was_training)
        return cnn_utility((x, y), dm.model_space("test"), num_classes=10, seed=0, device=a.device)

    def evaluate(pl_module, headline_keys=SCORES) -> dict:
        """The CNN on the model's generator at the first ``--num-samples`` (the headline keys), then on each extra
        EMA and at each further count (``ema0.995``, ``n10000``, ``ema0.995_n10000``: final and selected)."""
        out = {}
        for decay in [None, *extra]:
            for n in a.num_samples:
                cnn = cnn_now(pl_module, decay, n)
                if decay is None and n == a.num_samples[0]:
                    out.update({k: v for k, v in cnn.items() if k in headline_keys})
                    continue
                label = f"ema{decay:g}" if decay is not None else ""
                if n != a.num_samples[0]:
                    label = f"{label}_n{n}" if label else f"n{n}"
                out[label] = {k: v for k, v in cnn.items() if k in SCORES}
        return out

    class Curve(pl.Callback):  # extra EMAs, the warm-up cache and the learning curve (grids_every draws the grids)
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            if trainer.global_step != getattr(self, "averaged", 0):  # after each generator update, as the model's average
                self.averaged = trainer.global_step
                for decay, ema in extra.items():
                    average_step(ema, pl_module.generator, decay, trainer.global_step)
            if warm_path is not None and not warm_path.exists() and pl_module.teacher_warmup_done == pl_module.teacher_options.warmup_steps:
                warm_path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(pl_module._local_teacher_state(), warm_path)
            step = trainer.global_step
            if step and step != getattr(self, "reported", 0):  # once per generator step: the hook runs on every batch
                self.reported = step
                report_progress("aggregation", step, a.steps, start)
            if step in a.eval_at and step not in curve:
                curve[step] = evaluate(pl_module)
                print(f"aggregation {step}: {curve[step]}", flush=True)

        def on_exception(self, trainer, pl_module, exception) -> None:
            stopped_record(a, curve, int(trainer.global_step), "aggregations", exception, teachers=a.teachers,
                           records_per_teacher=a.records_per_teacher or None)

    if a.extra_ema and not model.generator_options.averaged:  # the extra averages sample in generator_ema's place
        raise SystemExit("--extra-ema needs a config (or --set ema_decay=...) with ema_decay > 0")
    for decay in a.extra_ema:  # from the generator's initial weights, as the model's own average
        extra[decay] = copy.deepcopy(model.generator).requires_grad_(False)
    model.to(a.device)
    for ema in extra.values():
        ema.to(a.device)
    start = time.perf_counter()
    if a.anchor_only:
        return anchor_only(model, dm, a, out, start, evaluate, extra, curve, record_anchor=anchor_noise)
    trainer = pl.Trainer(max_steps=a.steps, accelerator="gpu" if a.device == "cuda" else "cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         benchmark=config["trainer"].get("benchmark"), callbacks=[Curve(), grids_every(out, a.every)])
    trainer.fit(model, dm)  # stopped early: Lightning calls on_exception, then exits with 1
    fit_s = time.perf_counter() - start
    results = evaluate(model, HEADLINE)
    record = {"name": a.name, "config": a.config, "teachers": a.teachers, "aggregations": int(trainer.global_step),
              "records_per_teacher": a.records_per_teacher or None, "private_records": int(len(dm.splits["train"][1])),
              "noise_of": a.noise_of, "set": a.set, "seed": a.seed,
              "fit_s": round(fit_s, 1), "num_samples": a.num_samples[0], **results}
    if curve:
        record["curve"] = recorded_curve(curve)
    if pretrain is not None:
        record.update(gswgan_record(config, model, a, int(trainer.global_step)))
    if pategan:  # the row's accounting (λ, the anchor), not a guarantee for the proxy's teachers when --noise-of
        from lightning_gpate.privacy.disclosure import released_privacy

        released = released_privacy(model)
        record.update({"lam": model.lam, "epsilon_of_the_row": float(released["summary"]["epsilon"]),
                       "budget_exhausted": released["budget_exhausted"]})
    if anchor_noise is not None:  # the class-mean anchor: its noise multiplier and the digits it was measured on
        record.update({"anchor_noise_multiplier": float(anchor_noise),
                       "anchor_records": MNIST_TRAIN if a.records_per_teacher else record["private_records"]})
    write_record(a.results, record)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # kill / timeout stop a run as Ctrl-C does: see stopped_record
    sys.exit(main())
