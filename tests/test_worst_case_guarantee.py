"""The guarantee of a run whose costs depend on its mechanisms' outputs (Confident-GNMax: how many queries
the noisy threshold answers; G-PATE's vote units under ``group_fakes_by_label``: the labels drawn) is not
the ε of the realised costs. The budget stop is a privacy filter: it guarantees the budget; a run that
``max_steps`` ends earlier is guaranteed the smaller of the budget and the worst case of its steps. Each
expected value is computed here from the papers' formulas and the run's public counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

import small_models
from conftest import query_run
from lightning_gpate.privacy.disclosure import released_summary
from lightning_gpate.privacy.rdp import DEFAULT_ORDERS, pure_dp_rdp, rdp_to_epsilon
from lightning_gpate.tracking import GPATEMLFlowLogger

SIGMA1, SIGMA2 = 16.0, 8.0  # small_models' G-PATE


def _eps(rdp) -> float:
    return rdp_to_epsilon(rdp, DEFAULT_ORDERS, 1e-5)[0]


def test_a_run_ended_by_max_steps_is_guaranteed_the_worst_case_of_its_steps():
    """3 steps × 8 fakes × 4 projections = 96 Confident-GNMax queries, some unanswered: the guarantee is
    96·(λ/(2σ1²) + λ/σ2²) converted (Papernot et al. 2018, Prop. 8), not the realised answered count's."""
    model, dm = small_models.build("gpate", epsilon=50.0)
    small_models.fit(model, dm, steps=3, logger=GPATEMLFlowLogger(experiment_name="max-steps"))
    counts = model.accountant.counts
    assert counts["confident_gnmax_queries"] == 96 and counts["confident_gnmax_answered"] < 96  # some unanswered
    worst = _eps(96 * (DEFAULT_ORDERS / (2 * SIGMA1**2) + DEFAULT_ORDERS / SIGMA2**2))
    realised = _eps(96 * DEFAULT_ORDERS / (2 * SIGMA1**2) + counts["confident_gnmax_answered"] * DEFAULT_ORDERS / SIGMA2**2)
    assert realised < worst < 50.0
    run, _ = query_run("max-steps")
    assert run.data.metrics["epsilon_final"] == pytest.approx(worst, rel=1e-9)
    assert model.guarantee_epsilon() == pytest.approx(worst, rel=1e-9)
    # the order logged and released is the reported figure's (the worst case's), not the realised curve's
    worst_order = rdp_to_epsilon(96 * (DEFAULT_ORDERS / (2 * SIGMA1**2) + DEFAULT_ORDERS / SIGMA2**2), DEFAULT_ORDERS, 1e-5)[1]
    realised_order = rdp_to_epsilon(96 * DEFAULT_ORDERS / (2 * SIGMA1**2) + counts["confident_gnmax_answered"] * DEFAULT_ORDERS / SIGMA2**2,
                                    DEFAULT_ORDERS, 1e-5)[1]
    assert run.data.params["privacy/best_order"] == str(worst_order)
    summary = released_summary(model)
    assert summary["epsilon_realised_not_a_bound"] == pytest.approx(realised, rel=1e-9) and "epsilon_realised" not in summary
    if worst_order != realised_order:  # (the answered count is random: they are equal at 3 steps for most draws)
        assert summary["best_order"] == worst_order


def test_the_order_released_and_logged_is_the_guarantees_not_the_realised_curves():
    """40 Confident-GNMax queries of which 4 were answered: the guarantee is the worst case (all 40
    answered), whose best order (Papernot et al. 2018, Prop. 8 over the default orders) is below the
    realised curve's; what the run reports as ``best_order`` is the guarantee's."""
    from types import SimpleNamespace

    from lightning_gpate.privacy import ConfidentGNMaxEvent
    from lightning_gpate.privacy.disclosure import final_record

    model, _ = small_models.build("gpate", epsilon=50.0)
    votes = np.tile([[6, 4] + [0] * 8], (40, 1))
    answered = np.arange(40) < 4
    model.record(ConfidentGNMaxEvent(votes, answered, 5.0, SIGMA1, SIGMA2),
                 worst_case=ConfidentGNMaxEvent(votes, np.ones(40, dtype=bool), 5.0, SIGMA1, SIGMA2))
    worst, worst_order = rdp_to_epsilon(40 * (DEFAULT_ORDERS / (2 * SIGMA1**2) + DEFAULT_ORDERS / SIGMA2**2), DEFAULT_ORDERS, 1e-5)
    realised, realised_order = rdp_to_epsilon(40 * DEFAULT_ORDERS / (2 * SIGMA1**2) + 4 * DEFAULT_ORDERS / SIGMA2**2, DEFAULT_ORDERS, 1e-5)
    assert worst_order < realised_order and worst < 50.0
    summary = released_summary(model)
    assert summary["epsilon"] == pytest.approx(worst, rel=1e-9) and summary["best_order"] == worst_order
    assert summary["epsilon_realised_not_a_bound"] == pytest.approx(realised, rel=1e-9)
    trainer = SimpleNamespace(global_step=1, max_steps=1, max_epochs=None, current_epoch=0, should_stop=False)
    assert final_record(trainer, model)["params"]["privacy/best_order"] == str(worst_order)


def test_a_run_ended_by_its_budget_is_guaranteed_the_budget():
    """The stop rule keeps the realised ε within the budget, a privacy filter: the guarantee is the
    budget (Feldman & Zrnic 2021), not the realised value below it."""
    model, dm = small_models.build("gpate", epsilon=12.0)
    small_models.fit(model, dm, steps=500, logger=GPATEMLFlowLogger(experiment_name="budget"))
    assert model.budget_exhausted and 0 < model.global_step < 500
    counts = model.accountant.counts
    realised = _eps(counts["confident_gnmax_queries"] * DEFAULT_ORDERS / (2 * SIGMA1**2)
                    + counts["confident_gnmax_answered"] * DEFAULT_ORDERS / SIGMA2**2)
    assert realised < 12.0
    assert _eps(counts["confident_gnmax_queries"] * (DEFAULT_ORDERS / (2 * SIGMA1**2) + DEFAULT_ORDERS / SIGMA2**2)) > 12.0
    run, _ = query_run("budget")
    assert run.data.metrics["epsilon_final"] == 12.0
    assert run.data.params["privacy/epsilon_budget"] == "12.0"
    # the filter's limit is no one order's conversion: no order is claimed for it
    assert run.data.params["privacy/best_order"].startswith("none (the guarantee is the budget")
    assert released_summary(model)["best_order"] is None


def test_topagg_by_label_counts_every_class_in_the_worst_case():
    """Under ``group_fakes_by_label`` a TopAgg step aggregates one unit per label drawn: with 2 fakes of 2
    classes, 1 or 2 units. Each unit is a Gaussian mechanism of sensitivity 2√k (RDP 2kλ/σ²); the
    guarantee counts 2 per step."""
    topk, sigma = 2, 40.0
    model, dm = small_models.build("gpate", epsilon=50.0, aggregator="topagg", group_fakes_by_label=True, fake_batch_size=2,
                                   topk=topk, sigma_topagg=sigma, noise_seed=3)
    small_models.fit(model, dm, steps=6)
    drawn = model.accountant.counts["topagg_samples"]
    assert drawn < 12  # some step drew one class only
    per_unit = 2 * topk * DEFAULT_ORDERS / sigma**2
    assert model.guarantee_epsilon() == pytest.approx(_eps(12 * per_unit), rel=1e-9)
    assert model.realised_epsilon() == pytest.approx(_eps(drawn * per_unit), rel=1e-9)


def test_pategan_costs_read_no_output_its_realised_epsilon_is_its_guarantee():
    """PATE-GAN's votes cost 2λ-DP each whatever they output, and every step asks a fixed number: the
    realised ε is already the worst case (so is DP-GAN's, GS-WGAN's and MarginalTree's)."""
    model, dm = small_models.build("pategan")
    small_models.fit(model, dm, steps=3)
    queries = 3 * 16
    lam = model.lam
    expected = _eps(queries * pure_dp_rdp(2 * lam, DEFAULT_ORDERS))
    assert model.guarantee_epsilon() == pytest.approx(expected, rel=1e-9)
    assert model.realised_epsilon() == pytest.approx(expected, rel=1e-9)
    assert math.isclose(model.accountant.epsilon_worst_case(), model.accountant.epsilon(), rel_tol=1e-12)
    assert np.all(model.accountant.rdp_worst_case == model.accountant.rdp)
