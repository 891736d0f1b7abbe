"""Seconds per G-PATE step inside a real ``lightning-gpate fit``, with where the time goes.

Each case builds the fit exactly as the command line does (``run_lightning_cli``: the config, its
DataModule on the official MNIST IDX files, the default callbacks, the MLflow logger and the progress
bar; evaluation callbacks and training checkpoints off), with ``--teachers`` teachers and an
unbounded budget (``model.epsilon`` 1e9: the per-step work is the same, only nothing stops the run),
and runs ``--warmup`` + ``--steps`` + ``--profile-steps`` steps. Reported per case:

* ``s/step``: median interval between consecutive ends of steps in the timed window (what a run of
  N steps costs: N × s/step; ``CPU s/step``: the process's CPU time, less sensitive to other load on
  a shared machine), split into ``data`` (from the end of one step to the start of the next:
  the batch's fetch and transfer, Lightning's loop), ``training_step`` (the model's step) and
  ``hooks`` (the callbacks' per-step hooks, logging, the progress bar);
* the phases of the training step (the ``gpate/*`` ranges of :class:`~lightning_gpate.models.GPATE`):
  ``teacher_step`` (fakes of the teachers' labels, forward, backward, Adam), ``fakes`` (the
  generator's batch to vote on), ``votes`` (every teacher's input gradient, projection, histograms),
  ``budget`` (the votes to the host, the accountant's check and record), ``aggregate`` (noise, release,
  back-projection) and ``generator_step``: on CUDA (``--phase-timer events``, the default there) the
  time between two CUDA events recorded on the stream at each range's ends — what the GPU spent from
  the phase's first to its last queued kernel, with no synchronisation added inside the step, so the
  phases tile the step as it runs in a fit; on the CPU (or ``--phase-timer sync``) the wall time of
  each range with the device synchronised at its ends; median over the timed steps (the table's phase
  columns; under torch 2.11 the profiler's device times of these ranges overlapped and exceeded the
  step), and ``torch.profiler``'s host (and kernel) times over ``--profile-steps`` more steps (in the
  JSON written beside ``--out``);
* the operators with the most (device or host) time, peak memory (``torch.cuda.max_memory_allocated``
  or the process's peak RSS) and the teachers' parameter + gradient + Adam memory (16 bytes per
  parameter and teacher).

The step boundaries synchronise the device (exact intervals; the step itself synchronises once,
when the votes go to the accountant). Each case runs in its own process (its peak memory alone).
Without ``--data-root`` holding MNIST's IDX files the case runs on random 28×28 digits of the same
shapes (a warning says so).

Usage::

    python benchmarks/gpate_step_profile.py --teachers 100 --threads 2                 # CPU
    python benchmarks/gpate_step_profile.py --teachers 100 --set model.teacher_fake_labels=teacher
    # GPU machine (../shared/gpu/README.md; carry .gpu/whl, .gpu/env.sh, .gpu/data/mnist):
    source .gpu/env.sh && python benchmarks/gpate_step_profile.py --device cuda --teachers 2000 4000 \\
        --data-root .gpu/data/mnist --out $OUT/gpate_step_profile_h100.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_CONFIG = "configs/mnist/gpate_paper_eps10_guarantee.yaml"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "mnist"
PHASES = ("teacher_step", "fakes", "votes", "budget", "aggregate", "generator_step")


def _random_mnist(folder: Path, rows: int) -> Path:
    """Random digits in MNIST's IDX layout (when the real files are not there): the shapes are what
    the step's time depends on."""
    import gzip

    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", rows), ("t10k", 100)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (folder / f"{name}-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x03" + np.array([n, 28, 28], ">u4").tobytes() + images.tobytes(), 1))
        (folder / f"{name}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01" + np.array([n], ">u4").tobytes() + labels.tobytes(), 1))
    return folder


def run_case(teachers: int, a: argparse.Namespace) -> dict:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    from lightning_gpate.cli import run_lightning_cli

    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    data_root, notes = Path(a.data_root).resolve(), []
    os.chdir(tempfile.mkdtemp())  # what the fit writes where it runs (its release without a logger) stays out of the project
    if not (data_root / "train-images-idx3-ubyte.gz").is_file() and not (data_root / "train-images-idx3-ubyte").is_file():
        data_root = _random_mnist(Path(tempfile.mkdtemp()) / "mnist", max(60_000, 20 * teachers))
        notes.append("random digits (no MNIST IDX files at --data-root)")
        extra = ["--data.verify_checksums", "false"]
    else:
        extra = []
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tempfile.mkdtemp()}/mlflow.db")
    total = a.warmup + a.steps + 1 + a.profile_steps
    args = ["--config", str(ROOT / a.config), "--data.root", str(data_root), "--data.download", "false",
            "--data.num_teachers", str(teachers), "--model.epsilon", "1e9", "--trainer.max_steps", str(total),
            "--trainer.accelerator", a.device, "--trainer.devices", "1", "--trainer.log_every_n_steps", "10",
            "--utility.enabled", "false", "--image_quality.enabled", "false",
            "--trainer.logger.init_args.experiment_name", "gpate-step-profile",
            # the timed steps are aggregations: a config's teacher warm-up steps train only the teachers (the H200
            # profile of gpate_eps10_gaussagg_guarantee timed 0.215 s of warm-up steps with no votes); --set brings it back
            "--model.teacher_warmup_steps", "0"]
    args += extra
    if a.chunk:
        args += ["--model.teacher_chunk_size", str(a.chunk)]
    if a.no_logger:
        args += ["--trainer.logger", "false"]
    for item in a.set or []:
        key, _, value = item.partition("=")
        args += [f"--{key}", value]
    cli = run_lightning_cli(args, run=False)
    trainer, model = cli.trainer, cli.model
    trainer.callbacks[:] = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]  # no 13 GB saves
    streams_match = None
    if cuda:  # the batches built on the GPU are the CPU's (the same hash and sort on either device)
        from datamodules.partition import TeacherBatches

        dm = cli.datamodule
        dm.setup("fit")
        x, y = dm.splits["train"]
        kw = dict(batch_size=dm.teacher_batch_size, seed=dm.partition_seed)
        on_cpu = TeacherBatches(x, y, dm.partition, range(teachers), **kw)
        on_gpu = TeacherBatches(x, y, dm.partition, range(teachers), device="cuda", **kw)
        streams_match = all(torch.equal(on_cpu.indices(s_), on_gpu.indices(s_).cpu()) for s_ in range(3))
        del on_cpu, on_gpu

    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=schedule(wait=a.warmup + a.steps, warmup=1, active=a.profile_steps))

    class Clock:
        """A: batch start, B/C: the training step, D: batch end (after every other callback's hook)."""

        def __init__(self) -> None:
            self.a, self.b, self.c, self.d, self.cpu = [], [], [], [], []

    clock = Clock()

    class StepStart(pl.Callback):  # the first callback
        def on_train_start(self, trainer, pl_module) -> None:
            prof.start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            sync()
            clock.a.append(time.perf_counter())

    class StepEnd(pl.Callback):  # the last callback
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            sync()
            clock.d.append(time.perf_counter())
            clock.cpu.append(time.process_time())
            prof.step()

        def on_train_end(self, trainer, pl_module) -> None:
            prof.stop()

    trainer.callbacks.insert(0, StepStart())
    trainer.callbacks.append(StepEnd())

    step = model.training_step

    def timed_step(*args, **kwargs):
        sync()
        clock.b.append(time.perf_counter())
        out = step(*args, **kwargs)
        sync()
        clock.c.append(time.perf_counter())
        return out

    model.training_step = timed_step

    import lightning_gpate.models.gpate as gpate_module

    phase_wall: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # step -> phase -> s
    phase_events: list[tuple[int, str, object, object]] = []  # (step, phase, start event, end event)
    profiler_range = gpate_module.record_function
    use_events = cuda and a.phase_timer == "events"

    @contextlib.contextmanager
    def synced_range(name: str):
        """The model's profiler range, timed on the wall clock with the device synchronised at both ends."""
        with profiler_range(name):
            sync()
            start_ = time.perf_counter()
            try:
                yield
            finally:
                sync()
                phase_wall[len(clock.b) - 1][name.split("/", 1)[1]] += time.perf_counter() - start_

    @contextlib.contextmanager
    def event_range(name: str):
        """The model's profiler range, timed by two CUDA events on the current stream (no synchronisation:
        read after the step's end, where the step synchronises anyway)."""
        with profiler_range(name):
            start_, end_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_.record()
            try:
                yield
            finally:
                end_.record()
                phase_events.append((len(clock.b) - 1, name.split("/", 1)[1], start_, end_))

    gpate_module.record_function = event_range if use_events else synced_range
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        trainer.fit(model, cli.datamodule)
    finally:
        gpate_module.record_function = profiler_range
    wall = time.perf_counter() - start

    torch.cuda.synchronize() if cuda else None
    for step_, phase_, start_, end_ in phase_events:
        phase_wall[step_][phase_] += start_.elapsed_time(end_) / 1e3
    window = range(a.warmup + 1, a.warmup + a.steps)  # steps with a previous step end, before the profiled ones
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    step_s = med([clock.d[i] - clock.d[i - 1] for i in window])
    cpu_s = med([clock.cpu[i] - clock.cpu[i - 1] for i in window])
    data_s = med([clock.a[i] - clock.d[i - 1] for i in window])
    train_s = med([clock.c[i] - clock.b[i] for i in window])
    hooks_s = med([(clock.b[i] - clock.a[i]) + (clock.d[i] - clock.c[i]) for i in window])
    phase_s = {p: med([phase_wall[i].get(p, 0.0) for i in window]) for p in PHASES}

    events = prof.key_averages()
    phases = {}
    for e in events:
        if e.key.startswith("gpate/"):
            device_us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
            phases[e.key.split("/", 1)[1]] = {"host_s": e.cpu_time_total / 1e6 / a.profile_steps,
                                              "device_s": device_us / 1e6 / a.profile_steps if cuda else None}
    sort_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    top = [(e.key, getattr(e, sort_key, 0.0) / 1e6 / a.profile_steps, e.count // a.profile_steps)
           for e in sorted((e for e in events if not e.key.startswith(("gpate/", "ProfilerStep"))),
                           key=lambda e: getattr(e, sort_key, 0.0), reverse=True)[:a.top]]
    mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    per_teacher = model.teachers.params_per_teacher()
    return {
        "teachers": teachers, "steps": len(clock.d), "wall_s": wall, "step_s": step_s, "cpu_s": cpu_s, "data_s": data_s,
        "training_step_s": train_s, "hooks_s": hooks_s, "phase_s": phase_s, "phases": phases, "top": top,
        "peak_mem_gib": mem, "mem_kind": "cuda_max_allocated" if cuda else "cpu_maxrss",
        "teacher_state_gib": per_teacher * 16 * teachers / 2**30, "params_per_teacher": per_teacher,
        "chunk": model.teacher_options.chunk_size, "batch": cli.datamodule.teacher_batch_size,
        "fake_labels": model.teacher_options.fake_labels, "notes": notes, "streams_match": streams_match,
        "device_name": torch.cuda.get_device_name() if cuda else f"cpu ({a.threads} threads)",
        "phase_timer": "cuda events" if use_events else "synchronised wall time",
        "torch": torch.__version__,
    }


def _fmt(v, digits: int = 3) -> str:
    return "–" if v is None or v != v else f"{v:.{digits}f}"


def _phase_words(timer: str) -> str:
    if timer == "cuda events":
        return "the time between CUDA events recorded on the stream at the ends of the model's ranges (no added syncs)"
    return "wall time of the model's ranges with the device synchronised at their ends"


def report(results: list[dict], a: argparse.Namespace, command: str) -> str:
    ok = [r for r in results if "error" not in r]
    lines = [f"# G-PATE step inside `fit` ({ok[0]['device_name'] if ok else a.device})", "",
             f"`{command}` (config `{a.config}`{', ' + ', '.join(a.set) if a.set else ''}), torch "
             f"{ok[0]['torch'] if ok else '?'}: median over {a.steps - 1} steps after {a.warmup} warm-up steps; "
             f"phases: {_phase_words(ok[0]['phase_timer'] if ok else '')}, median over the "
             f"same steps (torch.profiler's times over {a.profile_steps} more steps: the JSON beside this file).", ""]
    head = ["teachers", "batch", "chunk", "s/step", "CPU s/step", "data", "training_step", "hooks"] + [f"{p}" for p in PHASES] + ["peak mem GiB", "teachers+Adam GiB"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['teachers']} | error: {r['error']} |")
            continue
        cells = [str(r["teachers"]), str(r["batch"]), str(r["chunk"]), _fmt(r["step_s"]), _fmt(r["cpu_s"]), _fmt(r["data_s"]),
                 _fmt(r["training_step_s"]), _fmt(r["hooks_s"])]
        cells += [_fmt(r["phase_s"].get(p)) for p in PHASES]
        cells += [f"{r['peak_mem_gib']:.2f} ({r['mem_kind']})", f"{r['teacher_state_gib']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for r in ok:
        if r.get("streams_match") is not None:
            lines += ["", f"Teacher batches built on the GPU equal the CPU's (3 steps, {r['teachers']} teachers): {r['streams_match']}."]
        lines += ["", f"Top operators at {r['teachers']} teachers (s per step, calls per step){'; ' + '; '.join(r['notes']) if r['notes'] else ''}:", "",
                  "| operator | s/step | calls/step |", "|---|---|---|"]
        lines += [f"| `{k}` | {v:.4f} | {n} |" for k, v, n in r["top"]]
    return "\n".join(lines) + "\n"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="a G-PATE fit config (relative to the project root)")
    p.add_argument("--teachers", nargs="+", type=int, default=[100])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--data-root", default=str(DEFAULT_DATA), help="folder of MNIST's IDX files (else random digits)")
    p.add_argument("--chunk", type=int, default=0, help="teacher_chunk_size (0: the config's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="timed steps (median of their intervals)")
    p.add_argument("--profile-steps", type=_positive, default=2, help="steps under torch.profiler (at least 1)")
    p.add_argument("--top", type=int, default=12, help="operators listed per case")
    p.add_argument("--no-logger", action="store_true", help="no MLflow logger (default: the CLI's)")
    p.add_argument("--phase-timer", default="events", choices=["events", "sync"],
                   help="CUDA: phases timed by CUDA events (no added syncs) or synchronised wall time (CPU: always the latter)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more CLI overrides, e.g. model.teacher_fake_labels=teacher")
    p.add_argument("--out", default=None, help="also write the markdown report here")
    p.add_argument("--_case", type=int, default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    if a._case is not None:
        print("RESULT " + json.dumps(run_case(a._case, a)))
        return
    results = []
    for t in a.teachers:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--_case", str(t)], capture_output=True, text=True)
        line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("RESULT ")), None)
        if out.returncode != 0 or line is None:
            tail = (out.stderr.strip().splitlines() or ["?"])[-1]
            results.append({"teachers": t, "error": tail[:300]})
        else:
            results.append(json.loads(line[len("RESULT "):]))
        r = results[-1]
        print(f"teachers={t} " + (f"error={r['error']}" if "error" in r else
              f"s/step={r['step_s']:.4f} cpu_s/step={r['cpu_s']:.4f} data={r['data_s']:.4f} training_step={r['training_step_s']:.4f} hooks={r['hooks_s']:.4f} "
              + " ".join(f"{k}={v:.4f}" for k, v in r["phase_s"].items()) + " profiler: "
              + " ".join(f"{k}={v['host_s']:.4f}" + (f"/{v['device_s']:.4f}gpu" if v['device_s'] is not None else "") for k, v in r["phases"].items())
              + f" peak_mem_gib={r['peak_mem_gib']:.2f}"), flush=True)
    text = report(results, a, "python benchmarks/gpate_step_profile.py " + " ".join(argv))
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        Path(a.out).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
