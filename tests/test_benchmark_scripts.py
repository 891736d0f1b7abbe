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


@pytest.mark.parametrize("model", ["gpate", "pategan", "dpgan", "gswgan"])
def test_paper_defaults_override_the_minimal_configs_model_with_its_papers_settings(model, monkeypatch):
    """``quickstart_check.py --config configs/<model>_digits_minimal.yaml --paper-defaults`` compares a model's
    defaults with its former ones: every entry of the model's ``PAPER_SETTINGS`` the config leaves to the defaults
    becomes an override the command line parses (null, lists, booleans as YAML)."""
    import importlib

    import yaml

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quickstart_check import paper_default_overrides

    config = BENCHMARKS.parent / "configs" / f"{model}_digits_minimal.yaml"
    settings = importlib.import_module(f"lightning_gpate.models.{model}").PAPER_SETTINGS
    given = yaml.safe_load(config.read_text())["model"]["init_args"]
    overrides = paper_default_overrides(config)
    pairs = dict(zip(overrides[::2], overrides[1::2]))
    assert set(pairs) == {f"--model.{k}" for k in settings if k not in given}
    for key, text in pairs.items():
        value = settings[key.removeprefix("--model.")]
        assert yaml.safe_load(text) == (list(value) if isinstance(value, tuple) else value)
