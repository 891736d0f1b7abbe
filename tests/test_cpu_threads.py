"""CPU threads: the command line runs on one unless the user chose (many small kernels, each parallel
region waiting for its slowest thread: a second thread loses several times over beside a busy process,
``benchmarks/results/quickstart_threads.md``), and so does every process of the test suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from clitools import ROOT

#: Prints the threads a ``lightning-gpate`` process runs with after its command line started (``nope``: an
#: unknown command, which ends at once).
PROBE = ("import os, sys, torch; from lightning_gpate.cli import main; sys.argv = ['lightning-gpate', 'nope']; main(); "
         "print(torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def _threads(**env: str) -> list[str]:
    return _run(PROBE, **env).stdout.split()


def test_the_command_line_runs_on_one_thread_by_default():
    assert _threads() == ["1", "1"]  # exported too: DDP's processes and DataLoader workers start with it


def test_a_users_thread_setting_wins():
    assert _threads(OMP_NUM_THREADS="2") == ["2", "2"]
    assert _threads(MKL_NUM_THREADS="2")[1] == "None"  # MKL_NUM_THREADS alone is a choice too: left alone


def _spin_count(code: str, **env: str) -> str:
    shown = _run(code, OMP_DISPLAY_ENV="verbose", **env).stderr  # GNU OpenMP prints its settings as it loads
    found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", shown)
    if found is None:
        pytest.skip("torch does not use GNU OpenMP here")
    return found.group(1)


def test_openmp_threads_wait_passively_under_the_command_line():
    """A thread > 1 that waits for the others sleeps at once (spin count 0) instead of spinning 300,000
    times: the policy must be set before torch loads OpenMP, so importing the command line must set it
    before importing torch. A user's OMP_WAIT_POLICY wins."""
    assert _spin_count("import lightning_gpate.cli") == "0"
    assert _spin_count("import torch; import lightning_gpate.cli") != "0"  # too late once torch is loaded
    assert _spin_count("import lightning_gpate.cli", OMP_WAIT_POLICY="ACTIVE") != "0"


def test_main_called_from_python_leaves_the_programs_threads(capsys):
    from lightning_gpate.cli import main

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["nope"]) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_every_process_of_the_test_suite_runs_one_thread_by_default():
    """pytest-xdist runs a worker per core: with torch's default threads in each (and in each process a
    test starts), 2 workers on 2 cores ran 4 threads. One unless the user set ``OMP_NUM_THREADS``."""
    threads = os.environ["OMP_NUM_THREADS"]  # set by conftest.py when the user did not
    assert torch.get_num_threads() == int(threads)
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True, timeout=300)
    assert child.stdout.strip() == threads
