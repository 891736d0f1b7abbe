"""DP-GAN on the official 28×28 MNIST on a CPU: the revisited recipe at reduced scale, its speed, and
the schedules a budget allows.

The MNIST table's DP-GAN rows (``benchmarks/mnist_table.py``) run on a GPU; this runner is where their
settings are chosen without one. Three commands:

* ``speed``: discriminator (critic) steps per second of a config (with ``--set`` overrides) on this
  machine: a few generator steps of ``d_steps`` critic steps each, timed after a warm-up step, in wall
  time and in this process's CPU time (which other processes' load does not inflate), with the load
  average at the time (the machine may be shared: say so beside any figure), and the top-level aten
  calls of one more training step (``torch.profiler``). Any image config times the same way
  (``--config configs/mnist/gswgan_eps10_guarantee.yaml``, G-PATE's: per training step).
  With ``--critic-step``: milliseconds per critic step of each DP-SGD path (``--paths``: ``opacus``,
  the reference's hooks and ``DPOptimizer``; ``functorch``, ``torch.func`` per-sample gradients (vmap)
  over the Poisson batch, eager; ``bookkeeping``, the clipped sums by book-keeping, eager (the default
  on a CPU); ``functorch_padded`` / ``bookkeeping_padded``, the same on the fixed physical batch
  B + 3√B; ``compiled``, the vmap step through ``torch.compile``; ``compiled_cudagraphs``, with CUDA
  graphs) for each critic ``--critics WIDTH:BATCH``, all in one process, the paths' steps interleaved
  (so that a shared machine's load falls on all of them alike), on one Poisson batch of the training
  digits and the same public fakes; with the host work of one step (top-level aten calls, the
  operators of most CPU time) on a CPU, the kernel launches per step on CUDA (``torch.profiler``).
* ``fit``: a guaranteed-ε run at reduced scale: ``--critic-steps`` T critic steps at the config's
  batch, the noise multiplier σ chosen by the project's accountant so that T steps spend ``--epsilon``
  (the budget then stops the run), smaller nets through ``--set``; then a CNN trained on 5,000 generated
  digits, tested on the 10,000 real test digits, after its last epoch and at the epoch chosen on 10% of
  the generated digits held out (synthetic validation; the test digits select nothing). One JSON line
  per run in ``--results``, a 10×10 grid every ``--every`` generator steps under ``--out-dir``.
* ``schedules``: for a budget ε and candidate (expected batch B, critic steps T), the σ at which T
  Poisson-subsampled Gaussian steps of rate B/60,000 spend ε (RDP, the guarantee DP-GAN enforces by
  default; and PLD, ``accountant: pld``), with B/σ (the clipped sum's signal against the noise's
  standard deviation, per unit of C) and B·T (the work): a Markdown table.

Usage::

    python benchmarks/dpgan_mnist_cpu.py speed --config configs/mnist/dpgan_eps10_guarantee.yaml --set gf_dim=32 df_dim=32
    python benchmarks/dpgan_mnist_cpu.py speed --critic-step --critics 8:128 48:512 --paths opacus functorch bookkeeping compiled
    python benchmarks/dpgan_mnist_cpu.py speed --config configs/mnist/gpate_paper_eps10_guarantee.yaml --data-set num_teachers=50
    python benchmarks/dpgan_mnist_cpu.py fit --name nd10_dim32 --critic-steps 20000 --set gf_dim=32 df_dim=32 d_steps=10
    python benchmarks/dpgan_mnist_cpu.py schedules --epsilon 10 --batch 128 256 512 --critic-steps 25000 50000 100000
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from image_utility import append_jsonl, build, load_average, load_config, parse_sets  # noqa: E402

CONFIG = "configs/mnist/dpgan_eps10_guarantee.yaml"
MNIST_TRAIN = 60_000  # public: the published size of MNIST's training split


def subsampled_gaussian_epsilon(sigma: float, batch: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps at rate ``batch / 60,000`` (the project's RDP
    accountant with its improved conversion, or the PLD of :mod:`lightning_gpate.privacy.pld`)."""
    if accountant == "pld":
        from lightning_gpate.privacy.pld import dpsgd_pld_epsilon

        return dpsgd_pld_epsilon(noise_multiplier=sigma, sampling_rate=batch / MNIST_TRAIN, steps=steps, delta=delta)
    from lightning_gpate.privacy import PrivacyAccountant, SubsampledGaussianEvent

    event = SubsampledGaussianEvent(noise_multiplier=sigma, sampling_rate=batch / MNIST_TRAIN, steps=steps)
    return PrivacyAccountant(delta=delta).epsilon_if(event)


def sigma_for(epsilon: float, batch: float, steps: int, delta: float, accountant: str = "rdp", tol: float = 1.002) -> float:
    """The smallest σ (to ``tol``, rounded up) at which ``steps`` steps spend at most ``epsilon``."""
    lo, hi = 0.2, 100.0
    while hi / lo > tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if subsampled_gaussian_epsilon(mid, batch, steps, delta, accountant) <= epsilon else (mid, hi)
    return math.ceil(hi * 1000) / 1000


def _build(a, model_over: dict):
    """``(config, datamodule, model)`` of ``--config`` with ``model_over`` (flat names of before the option groups
    moved to their groups, as the MNIST table's rows take them) and ``--data-set``."""
    from mnist_table import model_overrides

    config = load_config(a.config)
    dm, model = build(config, model_overrides=model_overrides(config, model_over),
                      data_overrides={"root": a.data_root, "download": False, **parse_sets(a.data_set)})
    return config, dm, model


PATHS = {"opacus": {"dp_sgd_impl": "opacus"},
         "functorch": {"dp_sgd_impl": "functorch", "compile_critic_step": "none", "per_sample_method": "vmap"},
         "bookkeeping": {"dp_sgd_impl": "functorch", "compile_critic_step": "none", "per_sample_method": "bookkeeping"},
         # the eager paths on the compiled paths' fixed physical batch (B + 3√B rows, padded): what padding costs
         "functorch_padded": {"dp_sgd_impl": "functorch", "compile_critic_step": "none", "per_sample_method": "vmap",
                              "physical_batch_size": "fixed"},
         "bookkeeping_padded": {"dp_sgd_impl": "functorch", "compile_critic_step": "none", "per_sample_method": "bookkeeping",
                                "physical_batch_size": "fixed"},
         "compiled": {"dp_sgd_impl": "functorch", "compile_critic_step": "default"},
         "compiled_cudagraphs": {"dp_sgd_impl": "functorch", "compile_critic_step": "reduce-overhead"}}


def _launches_per_step(step, device) -> dict:
    """Kernel launches (runtime calls: ``cudaLaunchKernel`` & co., a CUDA graph's launch counted once) and
    kernels run on the device in one ``step()``, by ``torch.profiler``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    launches = kernels = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif "LaunchKernel" in e.name or "GraphLaunch" in e.name:
            launches += 1
    return {"launches": launches, "kernels": kernels}


def host_ops_per_step(step) -> dict:
    """What one ``step()`` asks of the host, by ``torch.profiler`` (CPU): the aten operator calls not nested in
    another aten call (each about one kernel launch on a GPU) and the five operators of most self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    totals: dict[str, float] = {}
    for e in events:
        totals[e.name] = totals.get(e.name, 0.0) + e.self_cpu_time_total / 1000
    heavy = sorted(totals.items(), key=lambda kv: -kv[1])[:5]
    return {"aten_ops_per_step": _top_level_aten(events), "top_self_cpu_ms": {k: round(v, 2) for k, v in heavy}}


def _parents(event):
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def critic_step_speed(a) -> int:
    """Milliseconds per critic step of each DP-SGD path, same process, interleaved (see the module's docstring)."""
    import pytorch_lightning as pl
    import torch
    from image_utility import _import
    from mnist_table import model_overrides
    from lightning_gpate.privacy.dpsgd import physical_batch_size_for

    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    config = load_config(a.config)
    records = []
    for critic in a.critics:
        width, batch = (int(v) for v in critic.split(":"))
        data_args = {**config["data"].get("init_args", {}), "root": a.data_root, "download": False, "batch_size": batch,
                     **parse_sets(a.data_set)}
        dm = _import(config["data"]["class_path"])(**data_args)
        models, steps = {}, {}
        pl.seed_everything(0, verbose=False)
        for path in a.paths:
            over = {"epsilon": 1e6, "gf_dim": width, "df_dim": width, "sampling_rate": batch / MNIST_TRAIN, "d_steps": 1,
                    **parse_sets(a.set), **PATHS[path]}
            if over.get("physical_batch_size") == "fixed":
                over["physical_batch_size"] = physical_batch_size_for(batch)
            init = {**config["model"]["init_args"], **model_overrides(config, over)}
            torch.manual_seed(0)  # the same initial critic for every path
            model = _import(config["model"]["class_path"])(data_spec=dm.spec, **init)
            pl.Trainer(max_steps=0, accelerator=device.type, devices=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False).fit(model, dm)
            models[path] = model.to(device)
        x, y = dm.model_space("train")
        rows = torch.nonzero(torch.rand(len(y), generator=torch.Generator().manual_seed(1)) < batch / MNIST_TRAIN).flatten()
        real = (x[rows].to(device), y[rows].to(device))  # one Poisson batch (a benchmark's: not a mechanism's draw)
        first = next(iter(models.values()))
        fakes = tuple(t.to(device) for t in first.public_fakes())
        for path, model in models.items():
            steps[path] = (lambda m: lambda: m.discriminator_step(*real, fakes))(model)
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        compile_s = {}
        for path, step in steps.items():  # warm-up (and compilation)
            start = time.perf_counter()
            for _ in range(3):
                step()
            sync()
            compile_s[path] = round(time.perf_counter() - start, 1)
        load_before = load_average()
        wall, cpu = {p: [] for p in steps}, {p: [] for p in steps}
        for _ in range(a.reps):
            for path, step in steps.items():
                w, c = time.perf_counter(), time.process_time()
                for _ in range(a.inner):
                    step()
                sync()
                wall[path].append((time.perf_counter() - w) * 1000 / a.inner)
                cpu[path].append((time.process_time() - c) * 1000 / a.inner)
        for path, model in models.items():
            record = {"command": "speed --critic-step", "path": path, "width": width, "expected_batch": batch,
                      "real_rows": len(rows), "physical_batch": (model.physical_batch_size if model._critic_step_compiled or "physical_batch_size" in PATHS[path]
                                         else len(rows)) if path != "opacus" else None,
                      "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      "threads": a.threads, "reps": a.reps, "inner": a.inner,
                      "ms_per_step_wall": round(statistics.median(wall[path]), 2),
                      "ms_per_step_cpu": round(statistics.median(cpu[path]), 2),
                      "warmup_s_3_steps": compile_s[path], "critic_params": sum(p.numel() for p in model.discriminator.parameters()),
                      "load_average_before": load_before, "load_average_after": load_average(), "torch": torch.__version__}
            if device.type == "cuda":
                record.update(_launches_per_step(steps[path], device))
            else:
                record.update(host_ops_per_step(steps[path]))
            if path != "opacus":
                record["per_sample_method"] = model.per_sample_method_used
            records.append(record)
            append_jsonl(a.results, record)
            print("RESULT " + json.dumps(record), flush=True)
    base = {r["width"]: r for r in records if r["path"] == "opacus"}
    print("| critic (width, expected batch) | path | ms per step (CPU time) | ms per step (wall) | × opacus (CPU time) |"
          + (" launches / kernels |" if device.type == "cuda" else " aten ops |"))
    for r in records:
        ref = base.get(r["width"])
        ratio = f"{ref['ms_per_step_cpu'] / r['ms_per_step_cpu']:.2f}" if ref else "-"
        print(f"| {r['width']}, {r['expected_batch']} | {r['path']} | {r['ms_per_step_cpu']} | {r['ms_per_step_wall']} | {ratio} |"
              + (f" {r['launches']} / {r['kernels']} |" if device.type == "cuda" else f" {r['aten_ops_per_step']} |"))
    return 0


def speed(a) -> int:
    """Critic steps per second: median over the timed generator steps (each ``d_steps`` critic steps
    and one generator step, data included), after one warm-up step; and the host work of one more
    training step (``torch.profiler``: top-level aten calls). Any image config (``--config``: GS-WGAN's,
    G-PATE's) is timed the same way, per training step (its critic steps per second where it has ``d_steps``)."""
    if a.critic_step:
        return critic_step_speed(a)
    import pytorch_lightning as pl
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(a.threads)
    pl.seed_everything(0, verbose=False)
    _, dm, model = _build(a, {"epsilon": 1e6, **parse_sets(a.set)})
    stamps, profiled = [], {}

    class Stamps(pl.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            if len(stamps) == a.steps + 1:  # one more step, under the profiler (not timed)
                profiled["prof"] = profile(activities=[ProfilerActivity.CPU]).__enter__()

        def on_train_batch_end(self, trainer, *args) -> None:
            if "prof" in profiled and "events" not in profiled:
                profiled["prof"].__exit__(None, None, None)
                profiled["events"] = profiled["prof"].events()
                return
            stamps.append((time.perf_counter(), time.process_time()))

    load_before = load_average()
    trainer = pl.Trainer(max_steps=a.steps + 2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Stamps()])
    trainer.fit(model, dm)
    gaps = [b[0] - c[0] for c, b in zip(stamps[:-1], stamps[1:])]
    cpu = [b[1] - c[1] for c, b in zip(stamps[:-1], stamps[1:])]  # this process's CPU time: what a shared machine's load does not inflate
    n_d = model.hparams.get("d_steps") or model.hparams.get("critic_steps")  # DP-GAN, GS-WGAN (G-PATE: none)
    per_step, cpu_step = statistics.median(gaps), statistics.median(cpu)
    record = {"command": "speed", "config": a.config, "set": a.set, "data_set": a.data_set, "threads": a.threads,
              "model": type(model).__name__, "d_steps": n_d, "batch_size": getattr(dm, "batch_size", None),
              "generator_steps_timed": len(gaps), "s_per_generator_step": round(per_step, 4),
              "cpu_s_per_generator_step": round(cpu_step, 4),
              "aten_ops_per_training_step": _top_level_aten(profiled.get("events", [])),
              "generator_params": sum(p.numel() for p in model.generator.parameters()),
              "load_average_before": load_before, "load_average_after": load_average(), "torch": torch.__version__}
    if n_d is not None and hasattr(model, "discriminator"):
        record.update(critic_steps_per_s=round(n_d / per_step, 3), critic_steps_per_cpu_s=round(n_d / cpu_step, 3),
                      critic_params=sum(p.numel() for p in model.discriminator.parameters()))
    append_jsonl(a.results, record)
    print("RESULT " + json.dumps(record), flush=True)
    return 0


def _top_level_aten(events) -> int:
    """aten operator calls not nested in another aten call (each about one kernel launch on a GPU)."""
    events = [e for e in events if e.name.startswith("aten::")]
    ids = {id(e) for e in events}
    return sum(1 for e in events if not any(id(p) in ids for p in _parents(e)))


def fit(a) -> int:
    import pytorch_lightning as pl
    import torch

    from image_utility import grids_every
    from lightning_gpate.evaluation.image import cnn_utility
    from lightning_gpate.sampling import image_grid, save_png

    torch.set_num_threads(a.threads)
    pl.seed_everything(0, verbose=False)
    over = parse_sets(a.set)
    config, dm, _ = _build(a, over)
    init = {**config["model"]["init_args"], **over}
    batch = float(dm.batch_size)
    sigma = sigma_for(a.epsilon, batch, a.critic_steps, float(init["delta"]), init.get("accountant", "rdp"))
    model_over = {**over, "epsilon": a.epsilon, "noise_multiplier": sigma, "sampling_rate": batch / MNIST_TRAIN}
    _, dm, model = _build(a, model_over)
    out = Path(a.out_dir) / a.name
    out.mkdir(parents=True, exist_ok=True)
    labels = torch.arange(10).repeat_interleave(10)
    describe = lambda trainer, m: (f" (critic steps {int(m.critic_steps_taken)}, epsilon {m.spent_epsilon():.3f}, "  # noqa: E731
                                   f"{time.perf_counter() - start:.0f} s)")
    start = time.perf_counter()
    load_before = load_average()
    trainer = pl.Trainer(max_steps=10**9, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[grids_every(out, a.every, describe)])
    trainer.fit(model, dm)
    fit_s = time.perf_counter() - start
    x, y = model.generate(100, labels=labels, seed=1)
    save_png(image_grid(x, y, 10, per_class=10), out / "final.png")
    x, y = model.generate(a.num_samples, seed=0)
    cnn = cnn_utility((x, y), dm.model_space("test"), num_classes=10, seed=0, device="cpu")
    ema = getattr(model, "generator_ema", None)
    if ema is not None:  # the same run's generator itself, beside its weight average (what is released)
        model.generator_ema = None
        x, y = model.generate(a.num_samples, seed=0)
        raw = cnn_utility((x, y), dm.model_space("test"), num_classes=10, seed=0, device="cpu")
        cnn.update({f"{k}_without_ema": v for k, v in raw.items() if k.startswith("cnn_accuracy")})
        model.generator_ema = ema
    record = {"command": "fit", "name": a.name, "config": a.config, "set": a.set, "data_set": a.data_set,
              "epsilon_budget": a.epsilon, "epsilon_spent": round(model.spent_epsilon(), 4), "noise_multiplier": sigma,
              "batch_size": batch, "critic_steps": int(model.critic_steps_taken), "generator_steps": int(trainer.global_step),
              "stopped_by": model.stop_reason, "fit_s": round(fit_s, 1), "threads": a.threads,
              "load_average_before": load_before, "load_average_after": load_average(), "num_samples": a.num_samples,
              "grid": str(out / "final.png"), **{k: v for k, v in cnn.items() if k.startswith("cnn_accuracy")}}
    append_jsonl(a.results, record)
    print("RESULT " + json.dumps(record), flush=True)
    return 0


def schedules(a) -> int:
    lines = [f"| B (q = B/60,000) | critic steps T | σ for ε = {a.epsilon:g} (RDP) | B/σ | σ (PLD) | B/σ (PLD) | B·T (samples) |",
             "|---|---|---|---|---|---|---|"]
    for batch in a.batch:
        for steps in a.critic_steps:
            rdp = sigma_for(a.epsilon, batch, steps, a.delta, "rdp")
            pld = sigma_for(a.epsilon, batch, steps, a.delta, "pld", tol=1.01) if a.pld else float("nan")
            lines.append(f"| {batch:g} | {steps:,} | {rdp:.3f} | {batch / rdp:.0f} | {pld:.3f} | {batch / pld:.0f} | "
                         f"{batch * steps / 1e6:.1f}M |")
            print(lines[-1], flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("speed", "fit"):
        s = sub.add_parser(name)
        s.add_argument("--config", default=CONFIG)
        s.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model overrides (YAML values)")
        s.add_argument("--data-set", nargs="*", default=[], metavar="KEY=VALUE", help="data overrides, e.g. batch_size=64")
        s.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "mnist"))
        s.add_argument("--threads", type=int, default=1)
        s.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "dpgan_mnist_cpu.jsonl"))
    sp = sub.choices["speed"]
    sp.add_argument("--steps", type=int, default=3, help="generator steps timed (after one warm-up)")
    sp.add_argument("--critic-step", action="store_true", help="ms per critic step of each DP-SGD path instead")
    sp.add_argument("--critics", nargs="+", default=["8:128", "48:512"], metavar="WIDTH:BATCH",
                    help="critic width (gf_dim = df_dim) and expected Poisson batch")
    sp.add_argument("--paths", nargs="+", default=["opacus", "functorch", "bookkeeping", "compiled"], choices=sorted(PATHS))
    sp.add_argument("--reps", type=int, default=5, help="timed rounds (median), each path's steps interleaved")
    sp.add_argument("--inner", type=int, default=3, help="critic steps per path and round")
    sp.add_argument("--device", default="cpu", help="cpu or cuda")
    f = sub.choices["fit"]
    f.add_argument("--name", required=True)
    f.add_argument("--epsilon", type=float, default=10.0)
    f.add_argument("--critic-steps", type=int, required=True, help="T: sigma is chosen so that T critic steps spend --epsilon")
    f.add_argument("--every", type=int, default=200, help="a grid every this many generator steps")
    f.add_argument("--num-samples", type=int, default=5000)
    f.add_argument("--out-dir", default=str(ROOT / "outputs" / "dpgan_mnist_cpu"))
    s = sub.add_parser("schedules")
    s.add_argument("--epsilon", type=float, default=10.0)
    s.add_argument("--delta", type=float, default=1e-5)
    s.add_argument("--batch", type=float, nargs="+", default=[128.0, 256.0, 512.0])
    s.add_argument("--critic-steps", type=int, nargs="+", default=[25_000, 50_000, 100_000, 200_000, 450_000])
    s.add_argument("--pld", action="store_true", help="also the PLD accountant's sigma (slower)")
    s.add_argument("--out", default=None, help="write the Markdown table here")
    a = p.parse_args(argv)
    return {"speed": speed, "fit": fit, "schedules": schedules}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
