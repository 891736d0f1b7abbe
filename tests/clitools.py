"""Running ``lightning-gpate`` as a user does (a subprocess), and what it leaves in an MLflow store."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
import yaml

from lightning_gpate.models.gpate import GPATE, PAPER_SETTINGS

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


# ----------------------------------------------------------------------------- the command line's processes
# A fresh ``lightning-gpate`` process spends ~10 s importing (pytorch_lightning imports torchmetrics, which imports
# torchvision and torch._dynamo) before it parses its first option: most of a small fit. The tests therefore start
# the command from a *fork server*: one process per pytest process that imports what the console script imports,
# once, then forks one child per command line. Each child is what the console script is after its imports: it
# becomes a process of its own (its own session, working folder, environment, stdin, stdout and stderr files, and
# an OS-seeded ``random`` / ``numpy`` state as a fresh interpreter has; the objects of the imports stay out of its
# garbage collections, as Python's docs advise a forking server), sets ``sys.argv`` and ``__main__`` as
# the script's run does (so that Lightning's DDP launcher re-executes ``python <script> <args>`` for the other
# ranks, and a spawn Pool imports the script, exactly as for a user), and leaves through ``sys.exit(main())``:
# the same argv parsing, the same ``main()``, the same interpreter exit (atexit handlers, SystemExit's code).
# Its exit status is the process's (``-9`` after SIGKILL). LIGHTNING_GPATE_TEST_SUBPROCESS=1 runs every
# command line in a fresh process instead.
_FORK_SERVER = r"""
import json, os, select, signal, sys
import lightning_gpate.cli as cli
import callbacks, datamodules, lightning_gpate.models, mlflow, pytorch_lightning.cli, sklearn  # what a command imports anyway
import alembic, cryptography.fernet, git, mlflow.store.tracking.sqlalchemy_store  # ... and what its MLflow run does (~1 s)
import gc
gc.freeze()  # the imports' objects, in every child, live to its end: its collections skip them instead of copying their pages (~1.5 s of CPU a child)

def serve():
    # -> the request of a forked child; the server itself never returns
    children, pending = {}, b""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            path = children.pop(pid)
            with open(path + ".tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(path + ".tmp", path)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the pytest process is gone: so are the command lines it started
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            os._exit(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                return request
            children[pid] = request["status"]
            sys.stdout.write(f"{pid}\n")
            sys.stdout.flush()

request = serve()
os.setsid()
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(out, 1)
os.dup2(os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if request["err"] != request["out"] else out, 2)
import random, numpy, torch, __main__
random.seed()  # a fresh interpreter's are OS-seeded
numpy.random.seed()
if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # what torch reads as it loads
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
script = request["script"]
if script:  # `lightning-gpate ...`: __main__ is the console script, sys.path starts at its folder
    __main__.__file__ = script
    sys.path[0] = os.path.dirname(script)
else:  # `python -m lightning_gpate.cli ...`: sys.path starts at the working folder
    import importlib.util
    __main__.__spec__ = importlib.util.find_spec("lightning_gpate.cli")
    __main__.__file__ = script = cli.__file__
    sys.path[0] = os.getcwd()
sys.argv = [script, *request["args"]]
del request, out
sys.exit(cli.main())
"""


class _ForkServer:
    """The fork server of this pytest process (started on first use, ended with it)."""

    _current: "_ForkServer | None" = None

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="lightning-gpate-forks-"))
        self.count = 0
        env = cli_env(self.folder)
        env.pop("MLFLOW_TRACKING_URI")  # each command line's own
        self.log = open(self.folder / "server.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], cwd=self.folder, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the CLI's fork server did not start:\n{(self.folder / 'server.log').read_text()[-3000:]}")
        atexit.register(self.close)

    @classmethod
    def get(cls) -> "_ForkServer":
        if cls._current is None or cls._current.proc.poll() is not None:
            cls._current = cls()
        return cls._current

    def start(self, args: Sequence[str], *, cwd: Path, out: Path, err: Path) -> "ForkedCLI":
        self.count += 1
        status = self.folder / f"{self.count}.status"
        script = cli_command()
        request = {"args": list(args), "cwd": str(cwd), "env": cli_env(Path(cwd)), "out": str(out), "err": str(err),
                   "status": str(status), "script": script[0] if len(script) == 1 else ""}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = int(self.proc.stdout.readline())
        return ForkedCLI(pid, [*script, *args], status)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class ForkedCLI:
    """A command line started by the fork server, with :class:`subprocess.Popen`'s ``pid``, ``args``,
    ``returncode``, ``poll``, ``wait`` and ``kill``."""

    def __init__(self, pid: int, args: list[str], status: Path) -> None:
        self.pid, self.args, self._status, self.returncode = pid, args, status, None

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _forking() -> bool:
    return hasattr(os, "fork") and os.environ.get("LIGHTNING_GPATE_TEST_SUBPROCESS", "") in ("", "0")


def _start(args: Sequence[str], *, cwd: Path, out: Path, err: Path):
    """The command line ``args`` started in ``cwd`` (its own session), stdout / stderr to the files ``out`` / ``err``
    (the same file for both if equal)."""
    if _forking():
        return _ForkServer.get().start(args, cwd=cwd, out=out, err=err)
    with open(out, "w") as stdout, (open(err, "w") if err != out else contextlib.nullcontext(stdout)) as stderr:
        return subprocess.Popen([*cli_command(), *args], cwd=cwd, env=cli_env(Path(cwd)), stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(proc, args: Sequence[str], out: Path, err: Path, timeout: float) -> subprocess.CompletedProcess:
    """Wait for ``proc``; past ``timeout`` it is killed with every process it started (DDP ranks)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"lightning-gpate {' '.join(args)} did not finish in {timeout} s:\n{err.read_text()[-3000:]}") from None
    result = subprocess.CompletedProcess([*cli_command(), *args], proc.returncode, out.read_text(), err.read_text())
    shutil.rmtree(out.parent)
    return result


def _log_files(name: str) -> tuple[Path, Path]:
    """Two new files for a command's stdout and stderr, outside the folder it runs in (in a folder of their own,
    removed once read)."""
    folder = Path(tempfile.mkdtemp(prefix="lightning-gpate-cli-"))
    return folder / f"{name}.out", folder / f"{name}.err"


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI to its end, as a user runs ``lightning-gpate ARGS`` in ``cwd``; past ``timeout`` it is killed
    with every process it started (DDP ranks)."""
    out, err = _log_files("cli")
    return _finish(_start(args, cwd=cwd, out=out, err=err), args, out, err, timeout)


def run_cli_many(commands: dict[str, Sequence[str]], *, cwd: Path, parallel: int = 2,
                 timeout: float = 600) -> dict[str, subprocess.CompletedProcess]:
    """Run many command lines as :func:`run_cli` does, each in a process of its own, ``parallel`` at a time.
    Returns each name's ``CompletedProcess``."""
    deadline = time.monotonic() + timeout
    waiting, running, done = list(commands.items()), {}, {}
    while waiting or running:
        while waiting and len(running) < parallel:
            name, args = waiting.pop(0)
            out, err = _log_files(name)
            running[name] = (_start(args, cwd=cwd, out=out, err=err), args, out, err)
        for name, (proc, args, out, err) in list(running.items()):
            if proc.poll() is not None:
                done[name] = _finish(proc, args, out, err, 0)
                del running[name]
        if time.monotonic() > deadline:
            for proc, *_ in running.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the command lines {sorted(commands)} did not finish in {timeout} s")
        time.sleep(0.02)
    return {name: done[name] for name in commands}


def start_cli(*args: str, cwd: Path, log: Path):
    """Start the CLI in the background, its stdout and stderr to the file ``log``; returns a process handle
    (``poll``, ``wait``, ``kill``, ``pid``)."""
    return _start(args, cwd=cwd, out=log, err=log)


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


def config_init_args(cls, options: dict) -> dict:
    """``options`` (flat names of before the option groups allowed) as a config of today writes them: the model's
    groups as mappings, G-PATE's aggregator as its ``class_path``/``init_args``."""
    return {k: v.as_hparams() if hasattr(v, "as_hparams") else v for k, v in cls.migrate_options(dict(options)).items()}


def tiny_gpate_config(path: Path, *, table: str = "table.csv", epsilon: float = 1e6, experiment: str = "tiny", max_steps: int = 100000,
                      checkpoints: str | None = None, every_n_train_steps: int = 10, **model) -> Path:
    """A G-PATE config on the tiny table that trains in well under a second per step on one CPU
    thread. With ``checkpoints``, a training checkpoint ``step=N.ckpt`` is kept every
    ``every_n_train_steps`` steps in that folder."""
    init = dict(**PAPER_SETTINGS, epsilon=epsilon, delta=1e-5, fake_batch_size=8, projection_dim=4, sigma_threshold=16.0, sigma_gnmax=8.0,
                threshold_fraction=0.3, hidden=[16], teacher_hidden=[8], z_dim=8)
    init.update(model)
    return _tiny_config(path, "GPATE", config_init_args(GPATE, init), table=table, experiment=experiment, max_steps=max_steps,
                        checkpoints=checkpoints, every_n_train_steps=every_n_train_steps)


def tiny_pategan_config(path: Path, *, table: str = "table.csv", experiment: str = "tiny", max_steps: int = 100000,
                        checkpoints: str | None = None, every_n_train_steps: int = 10, **model) -> Path:
    """A PATE-GAN config on the tiny table with its defaults (on a table: the warm start from the marginal model) but for
    few queries, 4 teachers and ``model`` (options of today's groups); ``checkpoints`` as :func:`tiny_gpate_config`."""
    init = {"epsilon": 10.0, "delta": 1e-5, "planned_queries": 64, "query_batch_size": 8, **model}
    return _tiny_config(path, "PATEGAN", init, table=table, experiment=experiment, max_steps=max_steps, checkpoints=checkpoints,
                        every_n_train_steps=every_n_train_steps, num_teachers=4)


def _tiny_config(path: Path, model_class: str, init: dict, *, table: str, experiment: str, max_steps: int, checkpoints: str | None,
                 every_n_train_steps: int, num_teachers: int = 6) -> Path:
    trainer = {"max_steps": max_steps, "accelerator": "cpu", "devices": 1, "log_every_n_steps": 1,
               "enable_progress_bar": False, "enable_checkpointing": checkpoints is not None,
               "logger": {"class_path": "lightning_gpate.tracking.GPATEMLFlowLogger", "init_args": {"experiment_name": experiment}}}
    if checkpoints is not None:
        trainer["callbacks"] = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {
            "dirpath": checkpoints, "filename": "{step}", "every_n_train_steps": every_n_train_steps, "save_top_k": -1}}]
    config = {
        "seed_everything": 0,
        "trainer": trainer,
        "model": {"class_path": f"lightning_gpate.models.{model_class}", "init_args": init},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": table, "label": "y", "schema": TINY_SCHEMA, "class_ratio": [0.5, 0.5], "num_teachers": num_teachers,
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
