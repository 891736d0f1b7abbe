"""Runs as a user sees them in MLflow: two runs of one config can be told apart by name, and the chart of
ε, flat at the budget once the worst case of the steps passes it, sits beside how much of the budget
the privacy filter has spent (the figure that climbs on and stops the run)."""

from __future__ import annotations

import pytest

import small_models
from clitools import tiny_gpate_config, write_tiny_table
from conftest import query_run
from lightning_gpate.privacy.disclosure import BUDGET_SPENT_METRIC, privacy_lines
from lightning_gpate.privacy.rdp import DEFAULT_ORDERS, rdp_to_epsilon
from lightning_gpate.tracking import GPATEMLFlowLogger

SIGMA1, SIGMA2 = 16.0, 8.0  # small_models' G-PATE


def _eps(rdp) -> float:
    return rdp_to_epsilon(rdp, DEFAULT_ORDERS, 1e-5)[0]


def test_two_fits_of_one_config_get_different_run_names(tmp_path):
    from lightning_gpate.cli import main

    write_tiny_table(tmp_path / "table.csv")
    config = tiny_gpate_config(tmp_path / "tiny.yaml", max_steps=1, experiment="twice")
    for _ in range(2):
        assert main(["fit", "--config", str(config), "--trainer.logger.init_args.run_name", "gpate-tiny"]) == 0
    run, client = query_run("twice")
    runs = client.search_runs([run.info.experiment_id])
    names = [r.info.run_name for r in runs]
    assert len(runs) == 2 and len(set(names)) == 2, names
    for r in runs:
        assert r.info.run_name.startswith("gpate-tiny-")  # the config's name first
        assert r.data.tags["config_run_name"] == "gpate-tiny"


def test_the_budget_spent_by_the_filter_is_logged_beside_epsilon():
    """A G-PATE run stopped by its budget: ``epsilon`` (the guarantee: min(budget, worst case of the steps))
    reaches the budget and stays there; the budget the filter has spent climbs on to the realised cost of
    the answered queries, computed here from the run's public counts (Papernot et al. 2018, Prop. 8:
    λ/(2σ1²) per threshold check, λ/σ2² per answered query), within the budget."""
    model, dm = small_models.build("gpate", epsilon=12.0, threshold_fraction=0.9)  # few answered: the filter outlasts the worst case
    small_models.fit(model, dm, steps=500, logger=GPATEMLFlowLogger(experiment_name="filter"))
    assert model.budget_exhausted
    run, client = query_run("filter")
    spent = [m.value for m in sorted(client.get_metric_history(run.info.run_id, BUDGET_SPENT_METRIC), key=lambda m: m.step)]
    epsilon = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "epsilon"), key=lambda m: m.step)]
    assert len(spent) == len(epsilon) >= model.global_step
    counts = model.accountant.counts
    realised = _eps(counts["confident_gnmax_queries"] * DEFAULT_ORDERS / (2 * SIGMA1**2)
                    + counts["confident_gnmax_answered"] * DEFAULT_ORDERS / SIGMA2**2)
    assert spent[-1] == pytest.approx(realised, rel=1e-6) and realised <= 12.0  # logged as float32
    assert all(a <= b for a, b in zip(spent, spent[1:]))  # it only climbs
    assert all(s <= e + 1e-9 for s, e in zip(spent, epsilon))  # never above the guarantee
    flat = [i for i, e in enumerate(epsilon) if e == 12.0]
    assert flat and spent[flat[0]] < spent[-1]  # epsilon is flat at the budget while the filter spends on
    assert run.data.metrics[f"epsilon_final_{BUDGET_SPENT_METRIC[len('epsilon_'):]}"] == pytest.approx(realised, rel=1e-9)
    lines = privacy_lines(model)  # the fit summary's: the guarantee first, then what the filter spent, in words
    assert lines[0].startswith("ε = 12.0000 of the budget ε = 12")
    assert lines[1] == (f"the privacy filter has spent ε = {realised:.4f} of the budget (the recorded costs its stop counts; "
                        f"not itself a guarantee)")


def test_no_filter_no_budget_spent_metric():
    """Under ``budget_accounting: paper`` the stop rule follows the paper's analysis: there is no filter
    whose spending to show."""
    model, dm = small_models.build("gpate", epsilon=50.0, budget_accounting="paper")
    small_models.fit(model, dm, steps=2, logger=GPATEMLFlowLogger(experiment_name="paper"))
    assert BUDGET_SPENT_METRIC not in query_run("paper")[0].data.metrics
