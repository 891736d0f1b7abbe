"""CPU threads: under the command line an OpenMP thread that waits for the others sleeps instead of
spinning (spinning threads took the cores the working ones needed: a quickstart step beside other jobs
took 12-36 times as long, ``benchmarks/results/quickstart_threads.md``), and every process of the test
suite runs one thread."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from clitools import ROOT


# GNU OpenMP reads its settings once, as torch's extension loads it: the process can end there (the rest of
# the CLI's imports, ~4 s of each process, cannot change what it read).
_END_ONCE_TORCH_IS_LOADED = """
import builtins, os, sys
_import = builtins.__import__
def _import_then_end_once_torch_is_loaded(*args, **kwargs):
    module = _import(*args, **kwargs)
    if "torch._C" in sys.modules:
        os._exit(0)
    return module
builtins.__import__ = _import_then_end_once_torch_is_loaded
"""


def _spin_count(code: str, **env: str) -> str:
    """How many times an idle OpenMP thread spins before it sleeps in a fresh process running ``code``
    (GNU OpenMP prints its settings as it loads)."""
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    clean.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_DISPLAY_ENV="verbose", **env)
    out = subprocess.run([sys.executable, "-c", _END_ONCE_TORCH_IS_LOADED + code], env=clean, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    if found is None:
        pytest.skip("torch does not use GNU OpenMP here")
    return found.group(1)


def test_openmp_threads_wait_passively_under_the_command_line():
    """Spin count 0 (sleep at once) instead of 300,000: the policy must be set before torch loads OpenMP,
    so importing the command line (what the ``lightning-gpate`` script does first) sets it before it
    imports torch. A user's OMP_WAIT_POLICY wins."""
    assert _spin_count("import lightning_gpate.cli") == "0"
    assert _spin_count("import torch; import lightning_gpate.cli") != "0"  # too late once torch is loaded
    assert _spin_count("import lightning_gpate.cli", OMP_WAIT_POLICY="ACTIVE") != "0"


def test_every_process_of_the_test_suite_runs_one_thread_by_default():
    """pytest-xdist runs a worker per core: with torch's default threads in each (and in each process a
    test starts), 2 workers on 2 cores ran 4 threads. One unless the user set ``OMP_NUM_THREADS``."""
    threads = os.environ["OMP_NUM_THREADS"]  # set by conftest.py when the user did not
    assert torch.get_num_threads() == int(threads)
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True, timeout=300)
    assert child.stdout.strip() == threads
