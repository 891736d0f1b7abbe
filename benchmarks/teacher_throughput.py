"""Throughput of one G-PATE iteration: vectorized teacher ensemble vs a per-teacher Python loop.

One iteration = (1) every teacher takes one Adam step on BCE (its own real batch → 1, the shared
fake batch → 0); (2) every teacher's descent direction on the fakes; (3) DPGradAgg (random
projection, vote histograms, Confident-GNMax, back-projection); (4) one generator Adam step on
Σ (G(z, y) − x̂)², x̂ = x + Δx^priv. The two implementations share (3) and (4).

Also reported: the median process CPU time per iteration (``*_cpu_s``), which is far less sensitive
than wall time to other processes competing for the cores of a shared machine.

``--fit`` adds, per case, the time of one iteration inside a real ``Trainer.fit`` of ``GPATE`` on random
data of the same shapes (``fit_s``: median interval between consecutive training batches, so it includes
the data loader, Lightning's loop and hooks, the accountant and G-PATE's own DCGAN generator, which is
larger than this benchmark's generator) beside the kernel-only time ``vectorized_s``.

``--precision bf16`` runs the vectorized teachers under bf16 autocast and reports how often their votes
agree with fp32 on the same teachers, fakes and projections: ``vote_agree`` (a teacher's bin, over all
teachers and queries) and ``argmax_agree`` (the histogram's top bin, i.e. the noise-free answer, per query).

Each (kind, teachers, implementation) case runs in its own subprocess, so the reported peak memory
is that case's alone: ``torch.cuda.max_memory_allocated`` on a GPU (``mem=cuda_max_allocated``),
the process's peak resident set size from ``resource.getrusage`` on CPU (``mem=cpu_maxrss``; it
includes the ≈0.3-0.5 GB of the Python/torch runtime). Timings: ``--warmup`` iterations, then the
median of ``--repeats`` timed iterations (fewer if ``--max-seconds`` would be exceeded).

Usage::

    python benchmarks/teacher_throughput.py --kinds mlp conv --teachers 500 1000 2000 --threads 2
    python benchmarks/teacher_throughput.py --device cuda --kinds conv --teachers 500 1000 2000 4000
    python benchmarks/teacher_throughput.py --device cuda --kinds conv --teachers 2000 --impls vectorized --fit --precision bf16
    python benchmarks/teacher_throughput.py --device cuda --kinds conv --teachers 2000 --impls vectorized --conv-impl bmm
    python benchmarks/teacher_throughput.py --device cuda --kinds conv --teachers 2000 --impls vectorized --conv-impl cpu --cudnn-benchmark

Output, one line per case::

    kind=mlp teachers=1000 vectorized_s=0.0123 loop_s=0.456 ratio=37.1 peak_mem_mb=412 loop_peak_mem_mb=398 mem=cpu_maxrss ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_gpate.nets.ensemble import (  # noqa: E402
    CONV_IMPLS,
    ConvTeacherEnsemble,
    LoopTeacherEnsemble,
    MLPTeacherEnsemble,
)
from lightning_gpate.privacy.dpgradagg import aggregate, project, random_projection, vote_histograms  # noqa: E402

# Paper settings: Kaggle credit (ε≈1) for mlp, MNIST ε=10 for conv (REFERENCE.md, G-PATE table).
DEFAULTS = {
    "mlp": dict(batch=32, m=32, k=5, sigma_threshold=1500.0, sigma_gnmax=600.0, chunk={"cpu": 250, "cuda": 0}),
    # CPU: small chunks keep a chunk's activations in cache (25-50 measured fastest, 2x faster than 250)
    "conv": dict(batch=30, m=30, k=10, sigma_threshold=600.0, sigma_gnmax=100.0, chunk={"cpu": 50, "cuda": 500}),
}


# ------------------------------------------------------------------------------------ generators
class MLPGen(nn.Module):
    def __init__(self, z_dim: int, num_classes: int, out: int, hidden: int = 128) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.net = nn.Sequential(nn.Linear(z_dim + num_classes, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, out), nn.Tanh())

    def forward(self, z, y):
        return self.net(torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], 1))


class ConvGen(nn.Module):
    """Small conditional deconv generator for 1×28×28 (labels concatenated to every layer)."""

    def __init__(self, z_dim: int = 100, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.num_classes, self.width = num_classes, width
        self.fc = nn.Linear(z_dim + num_classes, 2 * width * 7 * 7)
        self.up1 = nn.ConvTranspose2d(2 * width + num_classes, width, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(width + num_classes, 1, 4, stride=2, padding=1)

    def forward(self, z, y):
        yo = F.one_hot(y, self.num_classes).to(z.dtype)
        ym = yo[:, :, None, None]
        h = F.relu(self.fc(torch.cat([z, yo], 1))).view(-1, 2 * self.width, 7, 7)
        h = F.relu(self.up1(torch.cat([h, ym.expand(-1, -1, 7, 7)], 1)))
        return torch.sigmoid(self.up2(torch.cat([h, ym.expand(-1, -1, 14, 14)], 1)))


# ------------------------------------------------------------------------------------ one case
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _bins(U: torch.Tensor, clip: float, bins: int) -> torch.Tensor:
    """Each teacher's bin per query (the rule of ``vote_histograms``)."""
    return torch.floor((U.clamp(-clip, clip) + clip) * (bins / (2.0 * clip))).long().clamp_(0, bins - 1)


def vote_agreement(ens, x, y, P, *, chunk, clip: float, bins: int, device: torch.device) -> dict:
    """How often bf16 teachers vote as fp32 teachers do, on the same teachers, fakes and projection."""
    with _autocast(device, "bf16"):
        low = [g for _, _, g in ens.iter_input_grads(x, y, chunk_size=chunk)]
    agree = total = 0
    hist = {"32": 0, "bf16": 0}
    for (_, _, g32), g16 in zip(ens.iter_input_grads(x, y, chunk_size=chunk), low):
        b32, b16 = _bins(project(g32.float(), P), clip, bins), _bins(project(g16.float(), P), clip, bins)
        agree += int((b32 == b16).sum())
        total += b32.numel()
        for key, b_ in (("32", b32), ("bf16", b16)):
            hist[key] = hist[key] + F.one_hot(b_, bins).sum(0)
    return {"vote_agree": agree / total, "argmax_agree": float((hist["32"].argmax(-1) == hist["bf16"].argmax(-1)).float().mean())}


def run_case(kind: str, T: int, impl: str, a: argparse.Namespace) -> dict:
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    torch.manual_seed(0)
    d = DEFAULTS[kind]
    b, m, k = a.batch or d["batch"], a.m or d["m"], a.k or d["k"]
    chunk = a.chunk if a.chunk is not None else d["chunk"][device.type]
    chunk = chunk or None
    if kind == "mlp":
        Y, z_dim, shape = 2, 32, (30,)
        ens = MLPTeacherEnsemble(T, in_features=30, num_classes=Y, hidden=(64,), seed=0)
        gen = MLPGen(z_dim, Y, 30)
    else:
        Y, z_dim, shape = 10, 100, (1, 28, 28)
        ens = ConvTeacherEnsemble(T, in_shape=shape, num_classes=Y, seed=0, conv_impl=a.conv_impl)
        gen = ConvGen(z_dim, Y)
    ens, gen = ens.to(device), gen.to(device)
    dim = math.prod(shape)
    g_opt = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    if impl == "vectorized":
        # fused: one pass over the stacked tensors (still elementwise, i.e. per-teacher moments)
        t_opt = torch.optim.Adam(ens.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=a.fused_adam)
        loop = None
    else:
        loop = LoopTeacherEnsemble.from_ensemble(ens, lr=1e-3, betas=(0.5, 0.999))
        del ens
        ens = None
    cg = torch.Generator(device=device).manual_seed(1)  # mechanism randomness (shared across DDP ranks)
    real_x = torch.rand(T, b, *shape, device=device) * 2 - 1
    real_y = torch.randint(0, Y, (T, b), device=device)
    thr = 0.5 * T
    phases = {"teacher": [], "grads": [], "agg": [], "gen": []}

    def iteration() -> None:
        ts = [time.perf_counter()]
        z = torch.rand(m, z_dim, device=device) * 2 - 1
        fy = torch.randint(0, Y, (m,), device=device)
        x = gen(z, fy)
        xd = x.detach()
        # (1) teacher step
        if loop is None:
            t_opt.zero_grad(set_to_none=True)
            with _autocast(device, a.precision):
                ens.accumulate_teacher_grads(real_x, real_y, xd, fy, chunk_size=chunk)
            t_opt.step()
        else:
            loop.teacher_step(real_x, real_y, xd, fy)
        _sync(device); ts.append(time.perf_counter())
        # (2) per-teacher directions, streamed into (3) vote histograms
        P = random_projection(m, dim, k, generator=cg, device=device)
        if loop is None:
            votes = None
            with _autocast(device, a.precision):
                for _, _, g in ens.iter_input_grads(xd, fy, chunk_size=chunk):
                    v = vote_histograms(project(g.float(), P), clip=a.clip, num_bins=a.bins)
                    votes = v if votes is None else votes + v
        else:
            votes = vote_histograms(project(loop.per_teacher_input_grads(xd, fy), P), clip=a.clip, num_bins=a.bins)
        _sync(device); ts.append(time.perf_counter())
        delta, answered = aggregate(votes, P, clip=a.clip, num_bins=a.bins, threshold=thr,
                                    sigma_threshold=a.sigma_threshold or d["sigma_threshold"],
                                    sigma_gnmax=a.sigma_gnmax or d["sigma_gnmax"], generator=cg)
        _sync(device); ts.append(time.perf_counter())
        # (4) generator step toward x̂
        x_hat = (xd + delta.view_as(xd)).detach()
        g_opt.zero_grad(set_to_none=True)
        (x - x_hat).pow(2).sum().backward()
        g_opt.step()
        _sync(device); ts.append(time.perf_counter())
        for key, t0, t1 in zip(phases, ts[:-1], ts[1:]):
            phases[key].append(t1 - t0)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(a.warmup):
        iteration()
    times, cpu_times = [], []
    start = time.perf_counter()
    for _ in range(a.repeats):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        iteration()
        _sync(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        if a.max_seconds and time.perf_counter() - start > a.max_seconds:
            break
    if device.type == "cuda":
        mem, mem_kind = torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    else:
        mem, mem_kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_maxrss"
    n = len(times)
    extra = {}
    if loop is None and a.precision == "bf16":  # after training a few iterations: teachers that have moved
        z = torch.rand(m, z_dim, device=device) * 2 - 1
        fy = torch.randint(0, Y, (m,), device=device)
        with torch.no_grad():
            xd = gen(z, fy)
        P = random_projection(m, dim, k, generator=cg, device=device)
        extra = vote_agreement(ens, xd, fy, P, chunk=chunk, clip=a.clip, bins=a.bins, device=device)
    return {**extra, "time": statistics.median(times), "cpu": statistics.median(cpu_times), "n": n, "mem": mem, "mem_kind": mem_kind,
            "phases": {k_: statistics.median(v[-n:]) for k_, v in phases.items()},
            "params_per_teacher": (ConvTeacherEnsemble if kind == "conv" else MLPTeacherEnsemble)(
                1, **({} if kind == "conv" else dict(in_features=30, num_classes=2))).params_per_teacher()}


def run_fit_case(kind: str, T: int, a: argparse.Namespace) -> dict:
    """Seconds per iteration inside ``Trainer.fit`` of ``GPATE`` with the case's shapes and settings."""
    import numpy as np
    import pandas as pd
    import pytorch_lightning as pl

    from datamodules.base import GenerativeDataModule
    from datamodules.tabular import TabularDataModule
    from lightning_gpate.models import GPATE
    from lightning_gpate.models.gpate import PAPER_SETTINGS

    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    d = DEFAULTS[kind]
    b, m, k = a.batch or d["batch"], a.m or d["m"], a.k or d["k"]
    chunk = a.chunk if a.chunk is not None else d["chunk"][device.type]
    rows = T * b  # one batch per teacher and pass
    rng = np.random.default_rng(0)
    if kind == "mlp":
        frame = pd.DataFrame(rng.uniform(0, 1, (rows, 30)), columns=[f"c{i}" for i in range(30)])
        frame["y"] = rng.integers(0, 2, rows)
        schema = {**{f"c{i}": {"min": 0, "max": 1} for i in range(30)}, "y": {"categories": [0, 1]}}
        dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], num_teachers=T,
                               teacher_batch_size=b, val_fraction=0.0, test_fraction=0.0)
        model_kw = dict(z_dim=32, teacher_hidden=(64,))
    else:
        class RandomImages(GenerativeDataModule):
            def _load(self):
                x = torch.from_numpy(rng.integers(0, 256, (rows, 1, 28, 28), dtype=np.uint8))
                y = torch.from_numpy(rng.integers(0, 10, rows))
                spec = {"kind": "image", "dataset": "random", "shape": [1, 28, 28], "num_classes": 10,
                        "class_names": [str(i) for i in range(10)], "class_ratio": [0.1] * 10,
                        "class_ratio_source": "uniform", "private_metadata": [], "value_max": 255.0}
                return {"splits": {"train": (x, y)}, "spec": spec}

        from datamodules.image import uint8_to_model_space

        dm = RandomImages(num_teachers=T, teacher_batch_size=b, val_fraction=0.0, test_fraction=0.0)
        dm._transform = uint8_to_model_space
        model_kw = dict(z_dim=100)
    settings = {**PAPER_SETTINGS, "num_bins": a.bins}  # the paper's per-fake DPGradAgg votes, as the kernels timed
    model = GPATE(dm.spec, **settings, epsilon=1e9, fake_batch_size=m, projection_dim=k, clip=a.clip,
                  sigma_threshold=a.sigma_threshold or d["sigma_threshold"], sigma_gnmax=a.sigma_gnmax or d["sigma_gnmax"],
                  teacher_chunk_size=chunk or None, teacher_fake_labels="class_ratio", teacher_precision=a.precision,
                  teacher_conv_impl=a.conv_impl, noise_seed=1, **model_kw)

    class Clock(pl.Callback):
        def __init__(self):
            self.stamps = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            _sync(device)
            self.stamps.append(time.perf_counter())

    clock = Clock()
    steps = a.warmup + a.repeats + 1
    trainer = pl.Trainer(max_steps=steps, accelerator=device.type, devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    trainer.fit(model, dm)
    gaps = [t1 - t0 for t0, t1 in zip(clock.stamps[:-1], clock.stamps[1:])][a.warmup:]
    return {"time": statistics.median(gaps), "n": len(gaps)}


def _case_in_subprocess(kind: str, T: int, impl: str, argv: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--_case", kind, str(T), impl]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", default=["mlp", "conv"], choices=["mlp", "conv"])
    p.add_argument("--teachers", nargs="+", type=int, default=[500, 1000, 2000])
    p.add_argument("--impls", nargs="+", default=["vectorized", "loop"], choices=["vectorized", "loop"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop timing a case after this long (≥1 iteration)")
    p.add_argument("--batch", type=int, default=0, help="real batch per teacher (default: paper, 32 mlp / 30 conv)")
    p.add_argument("--m", type=int, default=0, help="fake batch (default: paper, = batch per teacher)")
    p.add_argument("--k", type=int, default=0, help="projection dim (default: 5 mlp / 10 conv)")
    p.add_argument("--clip", type=float, default=1e-4)
    p.add_argument("--bins", type=int, default=10)
    p.add_argument("--sigma-threshold", type=float, default=0.0)
    p.add_argument("--sigma-gnmax", type=float, default=0.0)
    p.add_argument("--fused-adam", type=int, default=1, help="fused Adam for the vectorized ensemble (1/0)")
    p.add_argument("--chunk", type=int, default=None, help="teachers per chunk (0 = all; default conv 50 cpu / 500 cuda, mlp 250 cpu / all cuda)")
    p.add_argument("--precision", default="32", choices=["32", "bf16"], help="vectorized teachers under bf16 autocast (with vote agreement)")
    p.add_argument("--conv-impl", default="auto", choices=CONV_IMPLS,
                   help="the conv teachers' kernels (ConvTeacherEnsemble's conv_impl; 'bmm': im2col + batched matmuls)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True (cuDNN times its algorithms on the warm-up iterations and "
                        "keeps the fastest for these fixed shapes; Lightning's Trainer(benchmark=True), a config's "
                        "trainer.benchmark)")
    p.add_argument("--fit", action="store_true", help="also time one iteration inside a real Trainer.fit of GPATE")
    p.add_argument("--_case", nargs=3, default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    if a._case:
        kind, T, impl = a._case
        torch.backends.cudnn.benchmark = a.cudnn_benchmark  # --fit's Trainer(benchmark=None) keeps this session's value
        print(json.dumps(run_fit_case(kind, int(T), a) if impl == "fit" else run_case(kind, int(T), impl, a)))
        return
    print(f"# device={a.device} threads={a.threads} torch={torch.__version__} warmup={a.warmup} repeats={a.repeats} "
          f"precision={a.precision} conv_impl={a.conv_impl} cudnn_benchmark={int(a.cudnn_benchmark)}", flush=True)
    for kind in a.kinds:
        for T in a.teachers:
            res = {impl: _case_in_subprocess(kind, T, impl, argv) for impl in a.impls + (["fit"] if a.fit else [])}
            vec, loop, fit = res.get("vectorized", {}), res.get("loop", {}), res.get("fit", {})
            fields = [f"kind={kind}", f"teachers={T}"]
            vt, lt = vec.get("time"), loop.get("time")
            fields.append(f"vectorized_s={vt:.4f}" if vt is not None else "vectorized_s=NA")
            fields.append(f"loop_s={lt:.4f}" if lt is not None else "loop_s=NA")
            fields.append(f"ratio={lt / vt:.2f}" if vt and lt else "ratio=NA")
            if a.fit:
                fields.append(f"fit_s={fit['time']:.4f}" if "time" in fit else f"fit_error={fit.get('error')!r}")
            if "vote_agree" in vec:
                fields.append(f"vote_agree={vec['vote_agree']:.4f} argmax_agree={vec['argmax_agree']:.4f}")
            fields.append(f"peak_mem_mb={vec['mem']:.0f}" if "mem" in vec else "peak_mem_mb=NA")
            fields.append(f"loop_peak_mem_mb={loop['mem']:.0f}" if "mem" in loop else "loop_peak_mem_mb=NA")
            fields.append(f"mem={(vec or loop).get('mem_kind', 'NA')}")
            if "cpu" in vec and "cpu" in loop:  # process CPU time: robust to other load on a shared machine
                fields.append(f"vectorized_cpu_s={vec['cpu']:.4f} loop_cpu_s={loop['cpu']:.4f} "
                              f"cpu_ratio={loop['cpu'] / vec['cpu']:.2f}")
            fields.append(f"n={vec.get('n', 0)}/{loop.get('n', 0)}")
            for name, r in (("vec", vec), ("loop", loop)):
                if "phases" in r:
                    fields.append(f"{name}_phases=" + ",".join(f"{k_}:{v:.3f}" for k_, v in r["phases"].items()))
                if "error" in r:
                    fields.append(f"{name}_error={r['error']!r}")
            print(" ".join(fields), flush=True)


if __name__ == "__main__":
    main()
