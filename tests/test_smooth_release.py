"""budget_accounting: smooth_sensitivity in the PATE models: a fixed run length, the data-independent
hard cap, the GNSS release at the end, the decision to release, MLflow (nothing unnoised), checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch

from callbacks import ReleaseArtifact, SampleLogger
from conftest import query_run
from datamodules import TabularDataModule
from lightning_gpate.models import DPGAN, GPATE, PATEGAN
from lightning_gpate.models.gpate import PAPER_SETTINGS
from lightning_gpate.models.private import BudgetExhaustedError
from lightning_gpate.privacy.pate import confident_gnmax_rdp, laplace_vote_rdp
from lightning_gpate.privacy.randomness import mechanism_generator
from lightning_gpate.privacy.rdp import rdp_to_epsilon
from lightning_gpate.privacy.smooth_release import GNSSParameters
from lightning_gpate.privacy.smooth_sensitivity import gnss_rdp
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent

GPATE_SMALL = dict(**PAPER_SETTINGS, fake_batch_size=8, projection_dim=4, sigma_threshold=16.0, sigma_gnmax=8.0, threshold_fraction=0.3,
                   hidden=(16,), teacher_hidden=(8,), z_dim=8, noise_seed=0)
PATEGAN_SMALL = dict(generator_hidden=[8], student_hidden=[8], teacher_hidden=[8], z_dim=4, teacher_steps=1,
                     student_steps=1, query_batch_size=8, noise_seed=0, lam=0.05)
SS = {"order": 4.0, "beta": 0.1, "sigma": 2.0}  # λ = 4 lies on the accountant's grid
DELTA_PRIME = 5e-6  # the default: δ/2


def shift(delta_prime: float = DELTA_PRIME) -> float:
    """c = Φ⁻¹(1 − δ′), from mpmath's erfinv (independent of the scipy function the code uses)."""
    import mpmath

    return float(mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * mpmath.mpf(delta_prime)))


def gnss_cost(beta: float, sigma: float, order: float, delta_prime: float | None = DELTA_PRIME) -> float:
    """Theorem 23 of Papernot et al. (2018) written out, at the noise multiplier σ/κ of the shifted
    release, κ = 1 + c·σ·(e^β − 1) (the derivation in lightning_gpate.privacy.smooth_release)."""
    kappa = 1.0 if delta_prime is None else 1.0 + shift(delta_prime) * sigma * (math.exp(beta) - 1.0)
    s = sigma / kappa
    return order * math.exp(2 * beta) / s**2 + (-0.5 * math.log(1 - 2 * order * beta) + beta * order) / (order - 1)


def recording(model) -> list:
    """The vote events ``model`` records, captured (the accountant of a guarantee or smooth-sensitivity
    run computes no data-dependent curve: the test computes it from these)."""
    events, record = [], model.record

    def spy(event, **kw):
        events.append(event)
        record(event, **kw)

    model.record = spy
    return events


def table(seed: int = 0, flip: bool = False, teachers: int = 20) -> TabularDataModule:
    rng = np.random.default_rng(seed)
    n = 400
    frame = pd.DataFrame({"a": rng.uniform(0, 1, n), "b": rng.normal(0, 1, n).clip(-3, 3)})
    frame["y"] = (frame["a"] + 0.3 * frame["b"] > 0.5).astype(int)
    if flip:
        frame["y"] = 1 - frame["y"]
    schema = {"a": {"min": 0, "max": 1}, "b": {"min": -3, "max": 3}, "y": {"categories": [0, 1]}}
    return TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], num_teachers=teachers,
                             teacher_batch_size=8, test_fraction=0.0)


def trainer(steps, **kw):
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(max_steps=steps, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **kw)


def order_index(model, order):
    return int(np.flatnonzero(model.accountant.orders == order)[0])


def test_gpate_release_is_the_upper_bound_of_the_data_dependent_rdp_plus_gnss():
    dm = table()
    model = GPATE(dm.spec, epsilon=30.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    events = recording(model)
    trainer(5, logger=GPATEMLFlowLogger(experiment_name="ss-gpate"), log_every_n_steps=1).fit(model, dm)
    assert model.global_step == 5 and not model.budget_exhausted
    ss = model.smooth_sensitivity
    rel = ss.released
    assert rel is not None and rel.num_queries == 5 * 8 * 4 == model.accountant.counts["confident_gnmax_queries"]
    # the ledger's data-dependent RDP at λ = the paper's bound of the recorded votes at λ
    dd = ss.ledger.data_dependent_rdp()
    paper = sum(confident_gnmax_rdp(e.votes, e.answered, threshold=e.threshold, sigma_threshold=e.sigma_threshold,
                                    sigma_gnmax=e.sigma_gnmax, orders=[4.0], data_independent=False)[0] for e in events)
    assert dd == pytest.approx(paper, rel=1e-7)
    # the release is SS·σ_ss·(z + c) above it, z from the mechanism's generator (seeded here for the
    # test), c = Φ⁻¹(1 − δ′): an upper bound with probability 1 − δ′
    z = torch.randn(1, generator=mechanism_generator("cpu", 0 + 7919)).item()
    smooth = ss.ledger.smooth_sensitivity(SS["beta"])
    assert rel.noisy_rdp == pytest.approx(max(0.0, dd + smooth * SS["sigma"] * (z + shift())), rel=1e-12)
    assert rel.gnss_rdp == pytest.approx(gnss_cost(0.1, 2.0, 4.0), rel=1e-12)
    total = rel.noisy_rdp + rel.gnss_rdp
    assert rel.epsilon == pytest.approx(rdp_to_epsilon([total], [4.0], 1e-5 - DELTA_PRIME)[0])
    # the released value is the data-dependent ε and decides the release; the guarantee is the
    # data-independent bound of everything released, the GNSS release (at σ/κ) included
    assert model.smooth_sensitivity_epsilon() == rel.epsilon
    assert model.release_allowed() == (rel.epsilon <= 30.0)
    assert model.accountant.counts["gnss_events"] == 1
    guarantee = model.guarantee_epsilon()
    counts, orders = model.accountant.counts, model.accountant.orders
    worst = (counts["confident_gnmax_queries"] * (orders / (2 * 16.0**2) + orders / 8.0**2)
             + np.array([gnss_cost(0.1, 2.0, o) if o < 5 else np.inf for o in orders]))
    assert guarantee == pytest.approx(min(400.0, rdp_to_epsilon(worst, orders, 1e-5)[0]), rel=1e-9)

    run, client = query_run("ss-gpate")
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    assert not any("data_dependent" in k for k in metrics), metrics.keys()  # nothing unnoised
    assert metrics["epsilon_smooth_sensitivity"] == pytest.approx(rel.epsilon)
    assert metrics["smooth_sensitivity_noisy_rdp"] == pytest.approx(rel.noisy_rdp)
    assert metrics["epsilon"] == pytest.approx(guarantee) and metrics["epsilon_final"] == pytest.approx(guarantee)
    assert float(params["privacy/smooth_sensitivity_order"]) == 4.0 and float(params["privacy/smooth_sensitivity_beta"]) == 0.1
    assert float(params["privacy/smooth_sensitivity_sigma"]) == 2.0 and params["privacy/smooth_sensitivity_rule"] == "config"
    assert float(params["privacy/smooth_sensitivity_delta_prime"]) == DELTA_PRIME
    # noise_seed is fixed in these tests: the run is no guarantee, and says so
    assert tags["privacy_guarantee"] == "false" and "noise_seed" in tags["not_a_guarantee_because"]
    assert tags["release_allowed"] == str(model.release_allowed()).lower()
    # during training, epsilon was the data-independent bound with the release reserved
    history = [m.value for m in client.get_metric_history(run.info.run_id, "epsilon")]
    assert max(history) == pytest.approx(guarantee, rel=1e-6)  # logged as float32
    with open(client.download_artifacts(run.info.run_id, "privacy/accountant.json", ".")) as f:
        state = json.load(f)
    assert state["rdp_paper"] == state["rdp"] and state["data_dependent"] is False and not state["labels"]


def test_final_epsilon_is_the_runs_latest_value_after_a_teacher_warmup():
    # warm-up batches step no Lightning optimizer: the logger's step runs ahead of global_step, and the
    # released ε must still be the run's `epsilon` in MLflow (its latest value), and the summary's
    from callbacks.summary import FitSummary

    dm = table()
    model = GPATE(dm.spec, epsilon=1000.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, teacher_warmup_steps=3, **GPATE_SMALL)
    t = trainer(2, logger=GPATEMLFlowLogger(experiment_name="ss-warmup"), log_every_n_steps=1)
    t.fit(model, dm)
    assert t.fit_loop.epoch_loop._batches_that_stepped > t.global_step == 2
    guarantee, released = model.guarantee_epsilon(), model.smooth_sensitivity_epsilon()
    run, client = query_run("ss-warmup")
    history = client.get_metric_history(run.info.run_id, "epsilon")
    (release,) = client.get_metric_history(run.info.run_id, "epsilon_smooth_sensitivity")
    # the final values are logged at the last step: MLflow shows a run's value at its largest step
    assert release.step >= max(m.step for m in history) >= 4
    assert run.data.metrics["epsilon"] == pytest.approx(guarantee)
    assert run.data.metrics["epsilon_smooth_sensitivity"] == pytest.approx(released)
    text = FitSummary().text(t, model)
    assert f"ε = {guarantee:.4f} (δ = 1e-05), data-independent bound of everything released (hard cap 400)" in text
    assert (f"data-dependent ε = {released:.4f} (δ = 1e-05), released with smooth sensitivity (Papernot et al. 2018) "
            f"as an upper bound that holds with probability 1 − 5e-06; not a guarantee. Target ε = 1000: release "
            f"artifact written") in text


def test_release_refused_when_the_released_epsilon_exceeds_the_target(capsys):
    dm = table()
    model = GPATE(dm.spec, epsilon=0.05, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    artifact = ReleaseArtifact()
    trainer(2, logger=GPATEMLFlowLogger(experiment_name="ss-refused"), callbacks=[artifact, SampleLogger()]).fit(model, dm)
    assert not model.release_allowed()
    assert "release artifact is not written" in model.stop_reason
    out = capsys.readouterr().out
    assert "NOT RELEASED" in out  # the CLI summary adds its "release  NOT written" line
    assert artifact.release_path is None and not list(Path(".").rglob("release.pt"))
    run, client = query_run("ss-refused")
    assert run.data.tags["release_allowed"] == "false"
    assert "not written" in run.data.tags["stop_reason"] and "not written" in run.data.tags["release_artifact"]
    assert not [a for a in client.list_artifacts(run.info.run_id) if a.path in ("release", "samples")]


def test_release_written_when_the_released_epsilon_meets_the_target():
    dm = table()
    model = GPATE(dm.spec, epsilon=1000.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    artifact = ReleaseArtifact()
    trainer(2, logger=GPATEMLFlowLogger(experiment_name="ss-allowed"), callbacks=[artifact]).fit(model, dm)
    assert model.release_allowed() and artifact.release_path is not None and artifact.release_path.is_file()
    from lightning_gpate.release import load_release

    release = load_release(artifact.release_path)
    privacy = release["privacy"]["smooth_sensitivity"]
    assert privacy["released"]["noisy_rdp"] == model.smooth_sensitivity.released.noisy_rdp
    assert privacy["epsilon_data_dependent"] == model.smooth_sensitivity_epsilon() and privacy["release_allowed"] is True
    assert release["privacy"]["epsilon"] == model.guarantee_epsilon()
    assert "ledger" not in privacy  # sums over the private votes stay in the training checkpoint


def test_hard_cap_stops_training_on_public_quantities_only():
    """The stop rule reads no votes: the data-independent ε it checks is a function of the number of
    queries and of the answered flags (the mechanism's released output) alone, with the GNSS release
    reserved; the step it refused would have crossed the cap in the worst case (every query answered);
    and the ε of everything released stays within the cap."""
    dm = table(seed=1)
    model = GPATE(dm.spec, epsilon=5.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=60.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    trainer(500).fit(model, dm)
    assert model.budget_exhausted and model.stop_reason.startswith("privacy epsilon_hard_cap reached")
    assert 1 < model.global_step < 500
    acc = model.accountant
    assert acc.counts["confident_gnmax_events"] == model.global_step
    orders = acc.orders
    counts = acc.counts
    public = (counts["confident_gnmax_queries"] * orders / (2 * 16.0**2) + counts["confident_gnmax_answered"] * orders / 8.0**2
              + np.array([gnss_cost(0.1, 2.0, o) if o < 5 else np.inf for o in orders]))
    np.testing.assert_allclose(acc.rdp, public, rtol=1e-12)
    assert model.smooth_sensitivity.released is not None  # released at the (public) end of training
    assert acc.epsilon() <= 60.0 and model.guarantee_epsilon() <= 60.0
    worst_step = 8 * 4 * (orders / (2 * 16.0**2) + orders / 8.0**2)
    assert rdp_to_epsilon(acc.rdp + worst_step, orders, 1e-5)[0] > 60.0


def test_fixed_run_length_and_configuration_errors():
    dm = table()
    with pytest.raises(ValueError, match="epsilon_hard_cap"):
        GPATE(dm.spec, epsilon=5.0, budget_accounting="smooth_sensitivity", **GPATE_SMALL)
    with pytest.raises(ValueError, match="only with budget_accounting: smooth_sensitivity"):
        GPATE(dm.spec, epsilon=5.0, epsilon_hard_cap=10.0, **GPATE_SMALL)
    with pytest.raises(ValueError, match="unknown"):
        GPATE(dm.spec, epsilon=5.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=10.0,
              smooth_sensitivity={"lambda": 3}, **GPATE_SMALL)
    with pytest.raises(ValueError, match="1/\\(2\\*beta\\)"):
        GPATE(dm.spec, epsilon=5.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=10.0,
              smooth_sensitivity={"order": 10.0, "beta": 0.1}, **GPATE_SMALL)
    with pytest.raises(ValueError, match="no data-dependent analysis"):
        former(DPGAN, dm.spec, epsilon=5.0, delta=1e-5, budget_accounting="smooth_sensitivity")
    model = GPATE(dm.spec, epsilon=5.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=100.0, **GPATE_SMALL)
    assert model.smooth_sensitivity.params.rule == "default"
    with pytest.raises(ValueError, match="trainer.max_steps"):
        pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False).fit(model, dm)


def test_resume_keeps_the_ledger_and_releases_once(tmp_path):
    dm = table()
    kw = dict(epsilon=30.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0, smooth_sensitivity=SS, **GPATE_SMALL)
    model = GPATE(dm.spec, **kw)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(4, enable_checkpointing=True, callbacks=[ckpt]).fit(model, dm)
    mid = tmp_path / "epoch=0-step=2.ckpt"
    saved = torch.load(mid, weights_only=False)["state_dict"]
    extra = next(v for k, v in saved.items() if k.endswith("_extra_state"))
    assert extra["smooth_sensitivity"]["released"] is None  # not released mid-run
    assert extra["smooth_sensitivity"]["ledger"]["num_queries"] == 2 * 32

    resumed = GPATE(dm.spec, **kw)
    trainer(4).fit(resumed, dm, ckpt_path=mid)
    led = resumed.smooth_sensitivity.ledger
    assert led.num_queries == 4 * 32 == resumed.accountant.counts["confident_gnmax_queries"]
    assert resumed.accountant.counts["gnss_events"] == 1
    final = tmp_path / "final.pt"
    torch.save(resumed.state_dict(), final)
    again = GPATE(dm.spec, **kw)
    again.load_state_dict(torch.load(final, weights_only=False))
    assert again.smooth_sensitivity.released == resumed.smooth_sensitivity.released
    with pytest.raises(BudgetExhaustedError, match="already released"):
        trainer(8).fit(again, dm)


def test_pategan_release_of_laplace_moments():
    dm = table(teachers=7)
    model = former(PATEGAN, dm.spec, epsilon=50.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=500.0,
                    smooth_sensitivity=SS, **PATEGAN_SMALL)
    events = recording(model)
    trainer(3).fit(model, dm)
    ss = model.smooth_sensitivity
    assert ss.ledger.kind == "laplace_vote" and ss.ledger.num_queries == 3 * 8
    paper = sum(laplace_vote_rdp(e.vote_gaps, lam=e.lam, orders=[4.0], data_independent=False)[0] for e in events)
    assert ss.ledger.data_dependent_rdp() == pytest.approx(paper, rel=1e-9)
    assert ss.released.total_rdp == pytest.approx(ss.released.noisy_rdp + ss.released.gnss_rdp)
    assert model.accountant.epsilon() <= 500.0


def test_metadata_cost_enters_the_release_at_its_order():
    dm = table()
    spec = {**dm.spec, "metadata_cost": [{"what": "label ratio", "epsilon": 0.5}]}
    model = GPATE(spec, epsilon=30.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    rel = model.smooth_sensitivity.release(z=0.0)
    assert rel.other_rdp == pytest.approx(min(0.5, 4.0 * 0.25 / 2))  # pure DP: min(ε, λε²/2)
    assert rel.noisy_rdp == 0.0 and rel.total_rdp == pytest.approx(rel.other_rdp + gnss_cost(0.1, 2.0, 4.0))


def test_a_refused_or_unfinished_run_has_no_release_even_from_its_training_checkpoint(tmp_path):
    from lightning_gpate.release import CheckpointError, load_release

    dm = table()
    model = GPATE(dm.spec, epsilon=0.05, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    fitted = trainer(2)
    fitted.fit(model, dm)
    fitted.save_checkpoint(tmp_path / "refused.ckpt")
    with pytest.raises(CheckpointError, match="no release"):
        load_release(tmp_path / "refused.ckpt")


def test_two_ddp_processes_release_the_same_value_as_one():
    """Under DDP every rank holds the same ledger (votes are all-reduced) and the release's noise is
    drawn once and broadcast: 2 processes release what 1 does (fixed noise seed, for the test)."""
    kw = dict(epsilon=1000.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0, smooth_sensitivity=SS,
              **GPATE_SMALL)
    dm1, dm2 = table(teachers=6), table(teachers=6)
    torch.manual_seed(0)
    single = GPATE(dm1.spec, **kw)
    trainer(3).fit(single, dm1)
    torch.manual_seed(0)
    double = GPATE(dm2.spec, **kw)
    trainer(3, devices=2, strategy="ddp_fork").fit(double, dm2)  # ddp_spawn's launcher, the ranks forked: no imports again
    a, b = single.smooth_sensitivity.released, double.smooth_sensitivity.released
    assert b is not None and b.num_queries == a.num_queries
    assert b.noisy_rdp == pytest.approx(a.noisy_rdp, rel=1e-9) and b.epsilon == pytest.approx(a.epsilon, rel=1e-9)


# ----------------------------------------------------------------------------- the upper bound, derived
def _ledger(votes, answered, n=80):
    from lightning_gpate.privacy.smooth_release import ConfidentGNMaxLedger

    led = ConfidentGNMaxLedger(num_teachers=n, threshold=40, sigma_threshold=10, sigma_gnmax=6, num_bins=10, order=6.0)
    led.add(votes, answered)
    return led


def test_shifted_release_against_an_independent_computation():
    """release() = max(0, β + SS·σ·(z + c)) converted at δ − δ′, with β the paper's data-dependent RDP,
    SS the discounted maximum of the summed per-query ball bounds (the functions matched against the
    reference), c = Φ⁻¹(1 − δ′) and GNSS charged at σ/κ: each computed here by hand."""
    from lightning_gpate.privacy.smooth_release import release
    from lightning_gpate.privacy.smooth_sensitivity import gnmax_local_sensitivity_bounds, threshold_local_sensitivity_bounds

    rng = np.random.default_rng(2)
    n, lam, beta, sigma, delta, delta_prime = 80, 6.0, 0.05, 3.0, 1e-5, 4e-6
    votes = rng.multinomial(n, rng.dirichlet(np.full(10, 0.3)), size=60)
    answered = rng.random(60) < 0.7
    dd = confident_gnmax_rdp(votes, answered, threshold=40, sigma_threshold=10, sigma_gnmax=6, orders=[lam],
                             data_independent=False)[0]
    ls = (threshold_local_sensitivity_bounds(votes, n, 40, 10, lam).sum(axis=0)
          + gnmax_local_sensitivity_bounds(votes[answered], n, 6.0, lam).sum(axis=0))
    ss = max(ls[d] * math.exp(-beta * d) for d in range(n + 1))
    params = GNSSParameters(order=lam, beta=beta, sigma=sigma, delta_prime=delta_prime)
    for z in (-3.0, 0.0, 0.7):
        rel = release(_ledger(votes, answered), params, z=z, delta=delta, conversion="classic")
        upper = max(0.0, dd + ss * sigma * (z + shift(delta_prime)))
        assert rel.noisy_rdp == pytest.approx(upper, rel=1e-9)
        assert rel.gnss_rdp == pytest.approx(gnss_cost(beta, sigma, lam, delta_prime), rel=1e-12)
        # the classic conversion (Mironov 2017, Prop. 3) at δ − δ′
        assert rel.epsilon == pytest.approx(upper + rel.gnss_rdp + math.log(1 / (delta - delta_prime)) / (lam - 1), rel=1e-9)
        assert rel.delta == delta and rel.delta_prime == delta_prime
    # without δ′: the reference's unshifted release, GNSS at σ
    plain = release(_ledger(votes, answered), GNSSParameters(order=lam, beta=beta, sigma=sigma), z=0.7, delta=delta)
    assert plain.noisy_rdp == pytest.approx(dd + ss * sigma * 0.7, rel=1e-9)
    assert plain.gnss_rdp == pytest.approx(gnss_rdp(beta=beta, sigma=sigma, order=lam))


def test_shifted_release_covers_the_data_dependent_cost_with_probability_1_minus_delta_prime():
    from lightning_gpate.privacy.smooth_release import release

    rng = np.random.default_rng(3)
    votes = rng.multinomial(80, rng.dirichlet(np.full(10, 0.3)), size=40)
    answered = rng.random(40) < 0.7
    led = _ledger(votes, answered)
    dd = led.data_dependent_rdp()
    for delta_prime in (0.05, 0.3):
        params = GNSSParameters(order=6.0, beta=0.05, sigma=3.0, delta_prime=delta_prime)
        z = rng.standard_normal(3000)
        covered = np.mean([release(led, params, z=float(v), delta=0.5).noisy_rdp >= dd for v in z])
        assert covered == pytest.approx(1 - delta_prime, abs=4 * math.sqrt(delta_prime * (1 - delta_prime) / 3000))


@pytest.mark.parametrize("seed", range(6))
def test_kappa_smooth_sensitivity_bounds_the_shifted_statistic_between_neighbours(seed):
    """The derivation's lemma, checked on neighbouring vote histories (one teacher's votes changed in
    every query, answered flags kept): SS is β-smooth, and g = β + c·σ·SS moves by at most κ·SS(D) with
    κ = 1 + c·σ·(e^β − 1), so κ·SS is a β-smooth bound on g's local sensitivity and GNSS applies at σ/κ."""
    rng = np.random.default_rng(seed)
    n, k, beta, sigma = 80, 12, 0.05, 3.0
    votes = rng.multinomial(n - 3, rng.dirichlet(np.full(10, 0.3 + seed)), size=k)  # 3 teachers abstain
    answered = rng.random(k) < 0.7
    moved = votes.copy()
    for i in range(k):  # the changed teacher moves its vote, stops voting, or starts
        action = rng.integers(3)
        if action < 2:
            moved[i, rng.choice(np.flatnonzero(moved[i] > 0))] -= 1
        if action != 1:
            moved[i, rng.integers(10)] += 1
    c = shift(1e-6)
    kappa = 1 + c * sigma * math.expm1(beta)
    a, b = _ledger(votes, answered), _ledger(moved, answered)
    ss_a, ss_b = a.smooth_sensitivity(beta), b.smooth_sensitivity(beta)
    assert math.exp(-beta) * ss_a * (1 - 1e-9) <= ss_b <= math.exp(beta) * ss_a * (1 + 1e-9)
    assert abs(a.data_dependent_rdp() - b.data_dependent_rdp()) <= a.local_sensitivity()[0] * (1 + 1e-9)
    g_a, g_b = a.data_dependent_rdp() + c * sigma * ss_a, b.data_dependent_rdp() + c * sigma * ss_b
    assert abs(g_a - g_b) <= kappa * ss_a * (1 + 1e-9)
    assert GNSSParameters(order=6.0, beta=beta, sigma=sigma, delta_prime=1e-6).kappa == pytest.approx(kappa, rel=1e-9)


def test_the_training_checkpoint_is_written_after_the_release(tmp_path):
    """ReleaseArtifact writes the final training checkpoint at the end of training; in a smooth-sensitivity
    run it holds the release already, so a resume from it cannot release the same ledger again."""
    from lightning_gpate.release import load_release

    dm = table()
    model = GPATE(dm.spec, epsilon=1000.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity=SS, **GPATE_SMALL)
    artifact = ReleaseArtifact()
    trainer(2, enable_checkpointing=True, default_root_dir=tmp_path, callbacks=[artifact]).fit(model, dm)
    saved = torch.load(artifact.training_checkpoint_path, weights_only=False)["state_dict"]
    extra = next(v for k, v in saved.items() if k.endswith("_extra_state"))
    assert extra["smooth_sensitivity"]["released"] is not None
    assert extra["accountant"]["counts"]["gnss_events"] == 1
    assert load_release(artifact.training_checkpoint_path)["privacy"]["smooth_sensitivity"]["released"] is not None
