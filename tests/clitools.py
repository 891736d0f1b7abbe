"""Running ``lightning-gpate`` as a user does (a subprocess), and what it leaves in an MLflow store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
import yaml

from lightning_gpate.models.gpate import PAPER_SETTINGS

ROOT = Path(__file__).resolve().parents[1]


def cli_command() -> list[str]:
    """The installed console script beside this interpreter, else ``python -m lightning_gpate.cli``."""
    script = Path(sys.executable).parent / "lightning-gpate"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lightning_gpate.cli"]


def cli_env(cwd: Path) -> dict[str, str]:
    """The environment of a CLI subprocess: this checkout's code first, one thread, the store in ``cwd``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI to its end; past ``timeout`` it is killed with every process it started (DDP ranks)."""
    proc = subprocess.Popen([*cli_command(), *args], cwd=cwd, env=cli_env(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"lightning-gpate {' '.join(args)} did not finish in {timeout} s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# A process that imports the CLI once, then forks one child per command line: each child is a process of its
# own (its exit code, everything it writes to fds 1 and 2), without the ~10 s of imports a fresh one pays.
_FORKING_RUNNER = r"""
import json, os, sys, traceback
import lightning_gpate.cli as cli
import callbacks, datamodules, lightning_gpate.models, mlflow, pytorch_lightning.cli, sklearn  # what a command imports anyway: once
cases, parallel = json.loads(sys.stdin.read()), int(sys.argv[1])
codes, running = {}, {}
def reap():
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
for name, (args, out, err) in cases.items():
    while len(running) >= parallel:
        reap()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = ["lightning-gpate", *args]
            code = cli.main()
        except SystemExit as stop:  # what the interpreter makes of sys.exit(...): an int, None (0), or a message and 1
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    running[pid] = name
while running:
    reap()
print(json.dumps(codes))
"""


def run_cli_many(commands: dict[str, Sequence[str]], *, cwd: Path, parallel: int = 2,
                 timeout: float = 600) -> dict[str, subprocess.CompletedProcess]:
    """Run many command lines as :func:`run_cli` does, each in a process of its own, ``parallel`` at a time,
    forked from one process that imported the CLI once (what a console script does, without paying its
    imports per command). Returns each name's ``CompletedProcess``."""
    logs = cwd / ".cli_many"
    logs.mkdir(exist_ok=True)
    cases = {name: [list(args), str(logs / f"{name}.out"), str(logs / f"{name}.err")] for name, args in commands.items()}
    proc = subprocess.Popen([sys.executable, "-c", _FORKING_RUNNER, str(parallel)], cwd=cwd, env=cli_env(cwd),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(json.dumps(cases), timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"the command lines {sorted(commands)} did not finish in {timeout} s") from None
    assert proc.returncode == 0, err[-3000:]
    codes = json.loads(out.strip().splitlines()[-1])
    return {name: subprocess.CompletedProcess([*cli_command(), *args], codes[name], Path(o).read_text(), Path(e).read_text())
            for name, (args, o, e) in cases.items()}


def start_cli(*args: str, cwd: Path, log: Path) -> subprocess.Popen:
    """Start the CLI in the background, its output to the file ``log`` (a pipe nobody reads could fill up and block it)."""
    with open(log, "w") as out:
        return subprocess.Popen([*cli_command(), *args], cwd=cwd, env=cli_env(cwd), stdout=out, stderr=subprocess.STDOUT)


def assert_one_line_error(result: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    """Exit code 2, and stderr ends with one ``lightning-gpate <command>: error: ...`` line holding
    ``fragments``, with no traceback and no parser dump before it. Returns that line."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(f"lightning-gpate {command}: error: "), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, (fragment, last)
    assert [line for line in lines if "error:" in line] == [last], result.stderr[-3000:]  # said once
    for noise in ("Traceback", "Namespace(", "usage:", "Given value"):
        assert noise not in result.stderr, (noise, result.stderr[-3000:])
    return last


# ----------------------------------------------------------------------------- a tiny private table
TINY_SCHEMA = {"a": {"min": 0, "max": 1}, "b": {"min": 0, "max": 1}, "y": {"categories": [0, 1]}}


def write_tiny_table(path: Path, rows: int = 240) -> Path:
    """Two public-bounded features and a binary label: every bit of metadata is declared public."""
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"a": rng.uniform(0, 1, rows).round(4), "b": rng.uniform(0, 1, rows).round(4)})
    frame["y"] = (frame["a"] > frame["b"]).astype(int)
    frame.to_csv(path, index=False)
    return path


def tiny_gpate_config(path: Path, *, table: str = "table.csv", epsilon: float = 1e6, experiment: str = "tiny", max_steps: int = 100000,
                      checkpoints: str | None = None, every_n_train_steps: int = 10, **model) -> Path:
    """A G-PATE config on the tiny table that trains in well under a second per step on one CPU
    thread. With ``checkpoints``, a training checkpoint ``step=N.ckpt`` is kept every
    ``every_n_train_steps`` steps in that folder."""
    init = dict(**PAPER_SETTINGS, epsilon=epsilon, delta=1e-5, fake_batch_size=8, projection_dim=4, sigma_threshold=16.0, sigma_gnmax=8.0,
                threshold_fraction=0.3, hidden=[16], teacher_hidden=[8], z_dim=8)
    init.update(model)
    trainer = {"max_steps": max_steps, "accelerator": "cpu", "devices": 1, "log_every_n_steps": 1,
               "enable_progress_bar": False, "enable_checkpointing": checkpoints is not None,
               "logger": {"class_path": "lightning_gpate.tracking.GPATEMLFlowLogger", "init_args": {"experiment_name": experiment}}}
    if checkpoints is not None:
        trainer["callbacks"] = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {
            "dirpath": checkpoints, "filename": "{step}", "every_n_train_steps": every_n_train_steps, "save_top_k": -1}}]
    config = {
        "seed_everything": 0,
        "trainer": trainer,
        "model": {"class_path": "lightning_gpate.models.GPATE", "init_args": init},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": table, "label": "y", "schema": TINY_SCHEMA, "class_ratio": [0.5, 0.5], "num_teachers": 6,
            "teacher_batch_size": 8, "test_fraction": 0.2}},
        "utility": {"enabled": False},
        "image_quality": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- MLflow store contents
def store_snapshot(store: Path) -> dict:
    """Every run of an MLflow store with its status, params, metric histories, tags and artifact
    files (name and size): two equal snapshots mean no run was added, removed or changed."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            rid = run.info.run_id
            histories = {k: [(m.step, m.value) for m in client.get_metric_history(rid, k)] for k in run.data.metrics}
            runs[rid] = {"status": run.info.status, "end_time": run.info.end_time, "params": dict(run.data.params),
                         "metrics": histories, "tags": dict(run.data.tags)}
    artifacts = store / "artifacts"
    files = sorted((str(p.relative_to(store)), p.stat().st_size) for p in artifacts.rglob("*") if p.is_file()) if artifacts.exists() else []
    return {"runs": runs, "artifacts": files}


def assert_fit_ran(result: subprocess.CompletedProcess, *, processes: int) -> None:
    """A ``lightning-gpate fit`` on ``processes`` processes finished, and only rank 0 reported."""
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("lightning-gpate fit: done") == 1  # rank 0 only
    if processes > 1:
        assert f"Starting with {processes} processes" in result.stderr or f"MEMBER: {processes}/{processes}" in result.stderr


def assert_same_tensors(one: dict, two: dict, *, atol: float) -> None:
    """Two name → tensor maps hold the same names, shapes and values (within ``atol``); a failure
    names the tensor and its largest gap."""
    assert one.keys() == two.keys() and one
    for name, tensor in one.items():
        assert tensor.shape == two[name].shape, name
        assert torch.allclose(tensor.double(), two[name].double(), atol=atol, rtol=0), (
            name, float((tensor.double() - two[name].double()).abs().max()))
