"""lightning-gpate plan: steps that fit a target ε under each analysis, from public or synthetic votes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightning_gpate.cli import main
from lightning_gpate.models.aggregators import DPGradAgg
from lightning_gpate.models.gpate import GPATE, PAPER_SETTINGS
from lightning_gpate.planning import plan, synthetic_probe
from lightning_gpate.privacy import PrivacyAccountant
from lightning_gpate.privacy.pate import confident_gnmax_rdp
from lightning_gpate.privacy.rdp import pure_dp_rdp
from clitools import config_init_args
from small_models import former  # the former defaults (the paper's) where a test is silent

ROOT = Path(__file__).resolve().parents[1]
#: the quickstart with G-PATE's Confident-GNMax votes (the paper's settings): what ``plan`` plans
QUICK = ["--config", str(ROOT / "configs" / "quickstart.yaml"), "--data.num_teachers", "60",
         "--trainer.enable_progress_bar", "false",
         *[item for key, value in config_init_args(GPATE, PAPER_SETTINGS).items() for item in (
             [f"--model.{key}", str(value)] if not isinstance(value, dict) else
             ["--model.aggregator", value["class_path"], *[x for o, v in value["init_args"].items() for x in (f"--model.aggregator.{o}", str(v))]]
             if key == "aggregator" else [x for o, v in value.items() for x in (f"--model.{key}.{o}", str(v))])],
         "--model.anchor.features", "0"]


class _Model:
    """What plan reads of a G-PATE model: its accountant, settings and teachers."""

    def __init__(self, n=200, s1=40.0, s2=10.0, delta=1e-5):
        self.accountant = PrivacyAccountant(delta=delta)
        self.num_teachers, self.threshold, self.data_spec = n, 0.5 * n, {}

        class H:
            fake_batch_size, epsilon = 4, 3.0
        self.hparams = H()
        self.aggregator = DPGradAgg(num_bins=10, projection_dim=5, sigma_threshold=s1, sigma_gnmax=s2)

    def events_before_first_step(self):
        return []


def test_extrapolation_matches_the_analyses_step_by_step():
    model = _Model()
    probe = synthetic_probe(model, [0.95], steps=4, seed=1)
    result = plan(probe, epsilon=10.0)  # at ε = 3 the smooth-sensitivity release's own costs leave about 1 step
    rows = {r.analysis: r for r in result.rows}
    # data-independent, worst case: 20 queries per step, every one answered
    step = confident_gnmax_rdp(np.zeros((20, 10)), np.ones(20, bool), threshold=100, sigma_threshold=40.0,
                               sigma_gnmax=10.0, orders=model.accountant.orders, data_independent=True)
    acc = PrivacyAccountant(delta=1e-5)
    from lightning_gpate.privacy.rdp import rdp_to_epsilon

    def eps(t):
        return rdp_to_epsilon(t * step, acc.orders, 1e-5)[0]
    t = rows["data-independent, worst case (the stop rule)"].steps
    assert eps(t) <= 10.0 < eps(t + 1)
    # the paper's data-dependent cost of the same (identical) votes
    votes = probe.events[0].votes
    dep = sum(confident_gnmax_rdp(e.votes, e.answered, threshold=100, sigma_threshold=40.0, sigma_gnmax=10.0,
                                  orders=acc.orders) for e in probe.events) / 4
    tp = rows["data-dependent (paper)"].steps
    assert rdp_to_epsilon(tp * dep, acc.orders, 1e-5)[0] <= 10.0 < rdp_to_epsilon((tp + 1) * dep, acc.orders, 1e-5)[0]
    assert votes[0, 0] == 190 and tp > 10 * t  # teachers agree: far more steps than the worst case
    ss = [rows[f"smooth sensitivity, allowed w.p. ~{q}"].steps for q in ("50%", "84%", "98%")]
    assert ss[0] >= ss[1] >= ss[2] > t
    rec = result.recommended
    assert rec["trainer.max_steps"] == ss[2]
    order = rec["model.smooth_sensitivity"]["order"]
    assert min(abs(rec["model.smooth_sensitivity"]["beta"] * order - f) for f in (0.1, 0.2, 0.3, 0.4)) < 1e-4
    assert rec["model.smooth_sensitivity"]["delta_prime"] == 5e-6
    assert rec["model.epsilon_hard_cap"] > 10.0  # the worst case of that many steps is weaker


def test_a_plan_starts_from_what_the_run_pays_before_its_first_step():
    """PATE-GAN's measured marginals (one Gaussian, paid at the first step) count before the votes."""
    import pandas as pd

    from datamodules import TabularDataModule
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.privacy.rdp import rdp_to_epsilon

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.uniform(0, 1, 80).round(3), "y": rng.choice([0, 1], 80)})
    dm = TabularDataModule(frame=frame, label="y", schema={"x": {"min": 0, "max": 1}, "y": {"type": "binary", "categories": [0, 1]}},
                           num_teachers=4, class_ratio=[0.5, 0.5], test_fraction=0.0)
    model = former(PATEGAN, dm.spec, epsilon=5.0, delta=1e-5, planned_queries=400, marginal_fraction=0.5, query_batch_size=8,
                    student_steps=1, noise_seed=0)
    probe = synthetic_probe(model, [1.0], steps=3)
    t = {r.analysis: r.steps for r in plan(probe, epsilon=5.0).rows}["data-independent, worst case (the stop rule)"]
    orders = model.accountant.orders
    gaussian = orders / (2 * model.marginal_noise ** 2)  # RDP of the Gaussian mechanism, by formula
    vote_step = 8 * pure_dp_rdp(2 * model.lam, orders)  # 8 queries per step, each 2λ-DP

    def eps(curve):
        return rdp_to_epsilon(curve, orders, 1e-5)[0]
    assert eps(gaussian + t * vote_step) <= 5.0 < eps(gaussian + (t + 1) * vote_step)
    assert eps((t + 5) * vote_step) <= 5.0  # without the marginals the plan would promise more steps


def test_plan_rejects_non_pate_probes_and_bad_shares():
    with pytest.raises(ValueError, match="shares"):
        synthetic_probe(_Model(), [0.9, 0.3], steps=2)


def test_cli_plan_from_synthetic_votes(capsys):
    assert main(["plan", *QUICK, "--vote_shares", "0.9,0.05", "--probe_steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "AN ESTIMATE" in out and "data-independent, worst case" in out and "smooth sensitivity" in out


def test_cli_plan_needs_a_declaration_that_the_votes_are_not_private(capsys):
    assert main(["plan", *QUICK]) == 2
    assert "--data_is_public" in capsys.readouterr().err


def test_cli_plan_from_a_public_probe_run_logs_nothing(capsys):
    assert main(["plan", *QUICK, "--data_is_public", "--probe_steps", "2", "--data.teacher_batch_size", "1"]) == 0
    out = capsys.readouterr().out
    assert "from public run (2 probe steps)" in out
    import os

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert [e.name for e in client.search_experiments()] in ([], ["Default"])
