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
def test_paper_defaults_override_the_minimal_configs_model_with_its_papers_settings(model, monkeypatch, tmp_path):
    """``quickstart_check.py --config configs/<model>_digits_minimal.yaml --paper-defaults`` compares a model's
    defaults with its former ones: every entry of the model's ``PAPER_SETTINGS`` the config leaves to the defaults
    becomes an override at its place in the option groups (a flat name at its group's, G-PATE's aggregator by its
    class), as YAML (null, lists, booleans), and the command line takes them all (flat names fail there)."""
    import importlib

    import yaml

    from lightning_gpate.cli import run_lightning_cli
    from lightning_gpate.models.aggregators import AGGREGATORS

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quickstart_check import paper_default_overrides

    config = BENCHMARKS.parent / "configs" / f"{model}_digits_minimal.yaml"
    module = importlib.import_module(f"lightning_gpate.models.{model}")
    settings, cls = module.PAPER_SETTINGS, getattr(module, yaml.safe_load(config.read_text())["model"]["class_path"].rsplit(".", 1)[1])
    given = yaml.safe_load(config.read_text())["model"]["init_args"]
    overrides = paper_default_overrides(config)
    pairs = dict(zip(overrides[::2], overrides[1::2]))
    aggregator = AGGREGATORS.get(settings.get("aggregator"))
    expected = {}
    for key, value in settings.items():
        if key in given:
            continue
        if key == "aggregator":
            expected["--model.aggregator"] = aggregator.__name__
        elif aggregator is not None and key in aggregator.FLAT:
            expected[f"--model.aggregator.{aggregator.FLAT[key]}"] = value
        else:
            expected.update({f"--model.{place}": value for place in cls.FLAT_OPTIONS.get(key, (key,))})
    assert set(pairs) == set(expected)
    for key, text in pairs.items():
        value = expected[key]
        assert yaml.safe_load(text) == (list(value) if isinstance(value, tuple) else value)
    monkeypatch.chdir(tmp_path)
    cli = run_lightning_cli(["--config", str(config), *overrides, "--trainer.logger", "false"], run=False)
    if aggregator is not None:
        assert type(cli.model.aggregator).__name__ == aggregator.__name__


def test_every_shipped_config_says_where_its_settings_came_from_and_the_table_rows_agree(monkeypatch):
    """Issue 58 (S3): every config in configs/ states in one ``# Settings from:`` line whether its settings are a paper's,
    chosen on a validation split, first found on the test split and re-checked on validation, chosen on the test split
    (labelled so) or untuned; the MNIST table's rows read it from their configs."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from image_utility import SETTINGS_PROVENANCE, settings_provenance
    from mnist_table import ROWS, settings_from

    configs = sorted(p.relative_to(BENCHMARKS.parent) for p in (BENCHMARKS.parent / "configs").rglob("*.yaml"))
    assert len(configs) > 50
    labels = {str(c): settings_provenance(c) for c in configs}
    assert all(label in SETTINGS_PROVENANCE and len(detail) > 10 for label, detail in labels.values())
    # what the fourth privacy review found: the quickstart's teachers and DP-MERF's length and batch were first seen on
    # the test digits, and the DP-MERF GPU config is the anchor's test-tuned recipe
    assert labels["configs/quickstart.yaml"][0] == "test→validation" and "140 teachers" in labels["configs/quickstart.yaml"][1]
    assert labels["configs/mnist/dpmerf_eps1_guarantee.yaml"][0] == "test→validation"
    assert labels["configs/mnist/dpmerf_eps1_gpu_guarantee.yaml"][0] == "test"
    for row in ROWS:
        assert settings_from(row, None) == labels[row.config][0]
        assert settings_from(row, {"settings_from": "validation"}) in ("validation", f"validation (config now: {labels[row.config][0]})")
    for config in configs:  # no config claims the test digits chose nothing
        text = config.read_text() if config.is_absolute() else (BENCHMARKS.parent / config).read_text()
        assert "chose nothing" not in text and "never on the test digits" not in text, config


def test_a_tuning_run_of_the_quickstart_check_reads_no_test_digit(monkeypatch):
    """Issue 58 (S3): ``quickstart_check.py --tune`` scores on the validation split and turns off the fit's own
    evaluation, which scores on the test split (its tuning records carried test-digit CNN accuracies)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quickstart_check import run_once

    config = BENCHMARKS.parent / "configs" / "gpate_digits_minimal.yaml"
    record = run_once(1, ["--trainer.max_steps", "2"], 0, config=config, tune=True)
    assert "error" not in record, record.get("error")
    assert record["scored_on"] == "val" and 0.0 <= record["logreg_2000"] <= 1.0
    assert record["test_split_metrics"] == [] and record["cnn_accuracy_final"] is None
    assert record["settings_from"] == "test"


def test_the_tabular_bar_table_pairs_seeds_and_names_what_misses_the_bar(monkeypatch, tmp_path):
    # Issue 59's bar, checked by the runner: MarginalTree's 2-way TVD against MST's (<= 0.9x) and AIM's (<= 1x) on the
    # seeds each peer was measured on, AUROC against both, fit <= 5 s; a cell meeting everything says "met".
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from tabular_utility import bar_table, load_results

    def cell(system, seed, tvd2, auroc, wall=1.0, eps=1.0, **extra):
        return {"dataset": "fair", "system": system, "epsilon": eps, "seed": seed, "status": "ok", "classifiers": 12,
                "tvd_1way": 0.01, "tvd_2way": tvd2, "tvd_3way": 0.02, "auroc": auroc, "wall_s": wall, **extra}

    records = [cell("marginaltree", 0, 0.008, 0.72, clique_size_chosen=3), cell("marginaltree", 1, 0.012, 0.70, clique_size_chosen=3),
               cell("mst_pgm", 0, 0.010, 0.70, wall=120.0), cell("aim_pgm", 0, 0.009, 0.71, wall=300.0),
               cell("marginaltree", 0, 0.004, 0.70, wall=7.0, eps=10.0, clique_size_chosen=3), cell("mst_pgm", 0, 0.004, 0.71, eps=10.0)]
    met, missed = bar_table(records).splitlines()[2:]
    # paired: ours on seed 0 (0.008) against MST's 0.010 and AIM's 0.009, not our two-seed mean (0.010)
    assert "| fair | 1 | 2 / 1 / 1 | 0.0100 | 0.80 | 0.89 |" in met and met.endswith("| met |")
    assert "2-way TVD 1.00× MST's" in missed and "AUROC -0.010 vs MST" in missed and "fit 7.0 s" in missed and "AIM not run" in missed
    # a MarginalTree cell from before the auto width (no clique_size_chosen) is the tree's, not the default's
    import json

    (tmp_path / "cells.jsonl").write_text(json.dumps(cell("marginaltree", 2, 0.02, 0.5)) + "\n")
    assert load_results(tmp_path / "cells.jsonl")[0]["system"] == "marginaltree2"


def test_the_tabular_defaults_table_counts_single_runs_below_chance_on_the_gans_seeds(monkeypatch):
    # Issue 59: "never below chance" is about single runs, which a table's mean hides; the table counts them per cell
    # and per system, on the seeds the GANs' defaults were measured on (a peer's other seeds are not counted).
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from tabular_utility import defaults_table

    def cell(system, seed, auroc, eps=1.0):
        return {"dataset": "randhie", "system": system, "epsilon": eps, "seed": seed, "status": "ok", "classifiers": 12,
                "tvd_1way": 0.01, "tvd_2way": 0.02, "auroc": auroc, "wall_s": 2.0}

    records = [cell("gpate_default", 0, 0.60), cell("gpate_default", 1, 0.44), cell("aim_pgm", 0, 0.45), cell("aim_pgm", 1, 0.70),
               cell("aim_pgm", 7, 0.10), cell("marginaltree", 0, 0.58), cell("gpate_default", 0, 0.40, eps=10.0)]
    header, _, row, mean, below = defaults_table(records).splitlines()
    columns = [c.strip() for c in header.split("|")[3:-1]]
    cells = dict(zip(columns, [c.strip() for c in row.split("|")[3:-1]]))
    assert cells["G-PATE (defaults)"] == "0.520 · 2 s · 1 of 2 below chance"
    assert cells["private-pgm AIM"] == "0.575 · 2 s · 1 of 2 below chance"  # seed 7 is not a GAN seed
    assert cells["MarginalTree (this project; defaults)"] == "0.580* (1 seed) · 2 s"
    counts = dict(zip(columns, [c.strip() for c in below.split("|")[3:-1]]))
    assert counts["G-PATE (defaults)"] == "1 of 2" and counts["MarginalTree (this project; defaults)"] == "0 of 1"
    assert counts["PATE-GAN (defaults: warm start from the marginal model)"] == "–"
    assert "0.400 · 2 s · 1 of 1 below chance" in defaults_table(records, 10.0)


def test_the_candidates_table_counts_every_repeated_run_and_the_lowest_per_table(monkeypatch):
    # Issue 59's G-PATE rule reads per table a candidate's mean, its lowest run and its runs below chance over cells
    # repeated with fresh noise (the same split seed twice is two runs); a candidate missing a table has no mean of lowest
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from tabular_utility import candidates_table

    def cell(candidate, dataset, auroc, rnd=2):
        return {"dataset": dataset, "system": "gpate_default", "epsilon": 1.0, "seed": 0, "auroc": auroc, "candidate": candidate,
                "round": rnd}

    records = [cell("A", "cervical", 0.8), cell("A", "cervical", 0.4), cell("A", "fair", 0.7), cell("K3", "cervical", 0.6),
               cell("K3", "cervical", 0.9), cell("K3", "fair", 0.65), cell("B", "cervical", 0.7, rnd=1),
               {"dataset": "fair", "system": "gpate_default", "epsilon": 1.0, "seed": 0, "auroc": 0.1}]  # untagged: not counted
    header, _, a, k3, b = candidates_table(records).splitlines()
    assert header.startswith("| round | candidate | cervical: mean / lowest | fair: mean / lowest |")
    assert a == "| 2 | A | 0.600 / 0.400 (2) | 0.700 / 0.700 (1) | 1 of 3 | 0.550 |"
    assert k3 == "| 2 | K3 | 0.750 / 0.600 (2) | 0.650 / 0.650 (1) | 0 of 3 | 0.625 |"
    assert b == "| 1 | B | 0.700 / 0.700 (1) | – | 0 of 1 | – |"


def test_a_ladder_rung_over_the_defaults_is_a_system_of_its_own_in_the_reports_and_the_resume(monkeypatch, tmp_path):
    # A cell run with --default-options (a rung over a GAN's defaults) is neither counted as the defaults in the tables
    # nor taken for a cell of the defaults when a run resumes (issue 59: the rungs of the warm-start ladder were)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import json

    from tabular_utility import defaults_table, load_results, rung_key, system_name

    def cell(options=None, seed=0, auroc=0.7):
        return {"dataset": "randhie", "schema": "values", "system": "pategan_default", "epsilon": 1.0, "seed": seed, "status": "ok",
                "classifiers": 12, "tvd_1way": 0.01, "tvd_2way": 0.02, "auroc": auroc, "wall_s": 2.0,
                **({"options": options} if options else {})}

    path = tmp_path / "cells.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in [cell(), cell({"warm_start": {"anchor_weight": 1.0}}, auroc=0.2)]))
    records = load_results(path)
    assert [r["system"] for r in records] == ["pategan_default", 'pategan_default+{"warm_start": {"anchor_weight": 1.0}}']
    assert rung_key("pategan_default", {}) == "pategan_default" and rung_key("marginaltree", {"width": 3}) == "marginaltree"
    assert system_name(records[1]["system"]).endswith('(defaults: warm start from the marginal model) with {"warm_start": {"anchor_weight": 1.0}}')
    assert "0.700 (1)" in defaults_table(records) and "0.200" not in defaults_table(records)


def test_cells_of_a_former_schema_or_former_bins_are_history_not_the_defaults(monkeypatch, tmp_path):
    # A cell measured before a table's schema changed (fair's codes declared as values) is its own table, and a MarginalTree
    # cell on the first or second private quantile bins is its own system: neither is counted as today's defaults, nor skipped on resume
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import json

    from tabular_utility import BINS_VERSION, load_results

    base = {"system": "marginaltree", "epsilon": 1.0, "seed": 0, "status": "ok", "quantile_epsilon": 0.1, "clique_size_chosen": 2}
    cells = [{**base, "dataset": "fair"}, {**base, "dataset": "fair", "schema": "values"},
             {**base, "dataset": "fair", "schema": "values", "bins_version": 2},
             {**base, "dataset": "fair", "schema": "values", "bins_version": 3},
             {**base, "dataset": "fair", "schema": "values", "bins_version": 4},
             {**base, "dataset": "fair", "schema": "values", "bins_version": 5},
             {**base, "dataset": "fair", "schema": "values", "bins_version": BINS_VERSION},
             {**base, "dataset": "fair", "system": "real", "epsilon": float("inf")}]
    path = tmp_path / "cells.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in cells))
    assert [(r["dataset"], r["system"]) for r in load_results(path)] == [
        ("fair_before_values", "marginaltree_q1"), ("fair", "marginaltree_q1"), ("fair", "marginaltree_q2"), ("fair", "marginaltree_q3"),
        ("fair", "marginaltree_q4"), ("fair", "marginaltree_q5"), ("fair", "marginaltree"),
        ("fair", "real")]

