"""Every benchmark script with a command line builds it: ``--help`` prints its usage and exits 0.

The commands in ``benchmarks/results/*.md`` are how results get rerun; an argument added twice (as a merge of two
branches did to ``quickstart_check.py --config``) makes a script fail before it parses anything, and no other test
runs the scripts' ``main``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if "ArgumentParser" in p.read_text())


def test_the_scripts_with_a_command_line_are_found():
    names = {p.name for p in SCRIPTS}
    assert {"mnist_table.py", "quickstart_check.py", "dpgan_mnist_cpu.py", "tabular_utility.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_prints_its_usage(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
