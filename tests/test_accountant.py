"""Tests of lightning_gpate.privacy.accountant."""

import json
import time

import dp_accounting
import numpy as np
import pytest

from lightning_gpate.privacy.accountant import (
    ConfidentGNMaxEvent,
    GSWGANStepEvent,
    LaplaceVoteEvent,
    PrivacyAccountant,
    PureDPEvent,
    SubsampledGaussianEvent,
)
from lightning_gpate.privacy.gswgan import gswgan_rdp
from lightning_gpate.privacy.pate import confident_gnmax_rdp, laplace_vote_rdp
from lightning_gpate.privacy.rdp import DEFAULT_ORDERS, pure_dp_rdp

REF_VOTES = np.array([[0, 0, 0, 0, 1900, 100, 0, 0, 0, 0]])
SMALL_ORDERS = DEFAULT_ORDERS[:30]  # dp-accounting's w/o-replacement bound is slow at high orders


def _gnmax_event(n=1000, answered=True):
    return ConfidentGNMaxEvent(np.repeat(REF_VOTES, n, axis=0), np.full(n, answered), 1000, 600, 100)


def test_confident_gnmax_guarantee_and_paper_curves():
    acc = PrivacyAccountant(delta=1e-5, conversion="classic")
    assert acc.paper_label == "guarantee" and acc.epsilon() == 0.0
    ev = _gnmax_event()
    acc.record(ev)
    kw = dict(threshold=1000, sigma_threshold=600, sigma_gnmax=100, orders=DEFAULT_ORDERS)
    np.testing.assert_allclose(acc.rdp, confident_gnmax_rdp(ev.votes, ev.answered, data_independent=True, **kw))
    np.testing.assert_allclose(acc.rdp_paper, confident_gnmax_rdp(ev.votes, ev.answered, **kw))
    assert acc.paper_label == "data_dependent"
    # REFERENCE.md: data-dependent ε of 1000 answered queries = 0.2543 (classic conversion).
    assert abs(acc.epsilon_paper() - 0.2543) < 5e-5
    assert acc.epsilon() > acc.epsilon_paper()
    assert acc.counts["confident_gnmax_queries"] == 1000
    assert acc.counts["confident_gnmax_answered"] == 1000
    assert acc.counts["confident_gnmax_events"] == 1


def test_stepwise_recording_adds_curves():
    acc = PrivacyAccountant(delta=1e-5)
    for _ in range(4):
        acc.record(_gnmax_event(250))
    bulk = PrivacyAccountant(delta=1e-5).record(_gnmax_event(1000))
    np.testing.assert_allclose(acc.rdp, bulk.rdp, rtol=1e-12)
    np.testing.assert_allclose(acc.rdp_paper, bulk.rdp_paper, rtol=1e-12)
    assert acc.counts["confident_gnmax_events"] == 4


def test_epsilon_if_does_not_mutate_and_predicts():
    acc = PrivacyAccountant(delta=1e-5).record(_gnmax_event(10))
    before = (acc.rdp, acc.rdp_paper, acc.counts, acc.epsilon())
    ev = _gnmax_event(20, answered=False)
    predicted = acc.epsilon_if(ev)
    np.testing.assert_array_equal(acc.rdp, before[0])
    np.testing.assert_array_equal(acc.rdp_paper, before[1])
    assert acc.counts == before[2] and acc.epsilon() == before[3]
    acc.record(ev)
    assert acc.epsilon() == predicted > before[3]


def test_budget_stop_before_crossing():
    budget = 1.0
    acc = PrivacyAccountant(delta=1e-5)
    steps = 0
    while True:
        ev = _gnmax_event(64)
        if acc.epsilon_if(ev) > budget:
            break
        acc.record(ev)
        steps += 1
    assert steps > 0 and acc.epsilon() <= budget < acc.epsilon_if(_gnmax_event(64))


def test_laplace_vote_event():
    gaps = np.full(1000, 10)
    acc = PrivacyAccountant(delta=1e-5, orders=np.arange(2, 102, dtype=float), conversion="classic")
    acc.record(LaplaceVoteEvent(gaps, lam=1.0))
    # REFERENCE.md PATE-GAN ε̂ = 10.2575 is the paper-style (data-dependent) analysis.
    assert abs(acc.epsilon_paper() - 10.2575) < 5e-5
    np.testing.assert_allclose(acc.rdp, laplace_vote_rdp(gaps, lam=1.0, orders=acc.orders, data_independent=True))
    assert acc.counts["laplace_vote_queries"] == 1000 and acc.paper_label == "data_dependent"


def test_gswgan_event_sound_vs_paper():
    acc = PrivacyAccountant(delta=1e-5, orders=SMALL_ORDERS)
    for _ in range(5):
        acc.record(GSWGANStepEvent(4.0, 1000, 32, steps=4000))
    kw = dict(noise_multiplier=4.0, num_discriminators=1000, batch_size=32, steps=20000, orders=SMALL_ORDERS)
    np.testing.assert_allclose(acc.rdp, gswgan_rdp(**kw), rtol=1e-12)
    np.testing.assert_allclose(acc.rdp_paper, gswgan_rdp(accounting="paper", **kw), rtol=1e-12)
    assert abs(acc.epsilon() - 2.841) < 5e-4  # REFERENCE.md, sound σ = 4
    assert acc.paper_label == "per_sample_composition"
    assert acc.counts["gswgan_steps"] == 20000


def test_subsampled_gaussian_event_matches_dp_accounting():
    orders = SMALL_ORDERS
    acc = PrivacyAccountant(delta=1e-5, orders=orders)
    acc.record(SubsampledGaussianEvent(1.1, 64 / 60000, steps=500))
    ref = dp_accounting.rdp.RdpAccountant(orders=orders)
    ref.compose(dp_accounting.PoissonSampledDpEvent(64 / 60000, dp_accounting.GaussianDpEvent(1.1)), 500)
    assert acc.epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-12)
    np.testing.assert_array_equal(acc.rdp, acc.rdp_paper)
    assert acc.paper_label == "guarantee"


def test_pure_dp_and_mixed_events_and_paper_analysis_option():
    events = [PureDPEvent(0.01, "label ratio"), _gnmax_event(5),
              GSWGANStepEvent(4.0, 1000, 32, steps=10)]
    acc = PrivacyAccountant(delta=1e-5, orders=SMALL_ORDERS)
    for ev in events:
        acc.record(ev)
    assert acc.paper_label == "data_dependent+per_sample_composition"
    assert acc.counts["pure_dp_events"] == 1 and acc.counts["pure_dp_epsilon"] == 0.01

    same = PrivacyAccountant(delta=1e-5, orders=SMALL_ORDERS, paper_analysis="guarantee")
    only_dd = PrivacyAccountant(delta=1e-5, orders=SMALL_ORDERS, paper_analysis="data_dependent")
    for ev in events:
        same.record(ev)
        only_dd.record(ev)
    np.testing.assert_array_equal(same.rdp_paper, same.rdp)
    np.testing.assert_allclose(same.rdp, acc.rdp)
    assert same.paper_label == "guarantee" and only_dd.paper_label == "data_dependent"
    # Only the GNMax event uses its data-dependent curve.
    _, gn_paper = acc.rdp_of(events[1])
    gn_guar, _ = acc.rdp_of(events[1])
    np.testing.assert_allclose(only_dd.rdp_paper, acc.rdp - gn_guar + gn_paper, rtol=1e-12)

    pure = PrivacyAccountant(delta=1e-5).record(PureDPEvent(0.5))
    np.testing.assert_allclose(pure.rdp, pure_dp_rdp(0.5, DEFAULT_ORDERS))


def test_state_dict_round_trip_through_json():
    acc = PrivacyAccountant(delta=1e-6, conversion="classic")
    acc.record(_gnmax_event(30)).record(PureDPEvent(0.01)).record(LaplaceVoteEvent([3, 4], lam=0.5))
    state = json.loads(json.dumps(acc.state_dict()))
    restored = PrivacyAccountant(delta=0.1)
    restored.load_state_dict(state)
    assert restored.delta == 1e-6 and restored.conversion == "classic"
    np.testing.assert_array_equal(restored.rdp, acc.rdp)
    np.testing.assert_array_equal(restored.rdp_paper, acc.rdp_paper)
    np.testing.assert_array_equal(restored.orders, acc.orders)
    assert restored.counts == acc.counts
    assert restored.paper_label == acc.paper_label
    assert restored.epsilon() == acc.epsilon() and restored.epsilon_paper() == acc.epsilon_paper()
    # Continue recording after restore.
    restored.record(_gnmax_event(1))
    assert restored.epsilon() > acc.epsilon()


def test_summary_is_flat_and_mlflow_friendly():
    acc = PrivacyAccountant(delta=1e-5).record(_gnmax_event(10))
    s = acc.summary()
    for key in ("epsilon", "delta", "best_order", "epsilon_paper", "analysis", "conversion", "orders"):
        assert key in s
    assert s["analysis"] == "data_dependent" and s["delta"] == 1e-5
    assert s["epsilon"] == acc.epsilon() and s["orders"].startswith("1.1,2,3")
    assert all(isinstance(v, (int, float, str)) for v in s.values())
    json.dumps(s)


def test_record_640_queries_is_fast():
    rng = np.random.default_rng(0)
    votes = rng.multinomial(2000, rng.dirichlet(np.full(10, 0.5)), size=640)
    ev = ConfidentGNMaxEvent(votes, rng.random(640) < 0.5, 1000, 600, 100)
    acc = PrivacyAccountant(delta=1e-5)
    acc.record(ev)
    start = time.perf_counter()
    for _ in range(10):
        acc.record(ev)
    assert (time.perf_counter() - start) / 10 < 0.1


def test_event_and_accountant_validation():
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant(delta=0.0)
    with pytest.raises(ValueError, match="conversion"):
        PrivacyAccountant(delta=1e-5, conversion="tight")
    with pytest.raises(ValueError, match="paper_analysis"):
        PrivacyAccountant(delta=1e-5, paper_analysis="optimistic")
    with pytest.raises(ValueError, match="order"):
        PrivacyAccountant(delta=1e-5, orders=[0.5, 2.0])
    with pytest.raises(ValueError, match="answered"):
        ConfidentGNMaxEvent(np.ones((3, 2)), [True], 1, 1, 1)
    with pytest.raises(ValueError, match="sigma_gnmax"):
        ConfidentGNMaxEvent(np.ones((1, 2)), [True], 1, 1, 0)
    with pytest.raises(ValueError, match="lam"):
        LaplaceVoteEvent([1, 2], lam=-1.0)
    with pytest.raises(ValueError, match="sampling"):
        SubsampledGaussianEvent(1.0, 0.1, sampling="poisson", neighboring="replace_one")
    with pytest.raises(ValueError, match="batch_size"):
        GSWGANStepEvent(1.0, 10, 0)
    with pytest.raises(ValueError, match="epsilon"):
        PureDPEvent(-0.1)
    acc = PrivacyAccountant(delta=1e-5)
    with pytest.raises(ValueError, match="unsupported privacy event"):
        acc.record("not an event")
    with pytest.raises(ValueError, match="missing keys"):
        acc.load_state_dict({"delta": 1e-5})
    bad = acc.state_dict()
    bad["rdp"] = [0.0]
    with pytest.raises(ValueError, match="shapes"):
        acc.load_state_dict(bad)


def test_events_are_frozen_copies():
    votes = np.array([[3, 1]])
    ev = ConfidentGNMaxEvent(votes, [True], 2, 1.0, 1.0)
    votes[0, 0] = 0
    assert ev.votes[0, 0] == 3
    with pytest.raises(Exception):
        ev.threshold = 5
    with pytest.raises(ValueError):
        ev.votes[0, 0] = 1


def test_budget_check_uses_the_data_independent_guarantee_only_and_equals_the_full_computation():
    """epsilon_if skips the data-dependent analysis (and caches the per-query curves); its value is
    exactly the one computed from confident_gnmax_rdp(data_independent=True) without any cache."""
    from lightning_gpate.privacy.rdp import rdp_to_epsilon

    rng = np.random.default_rng(0)
    acc = PrivacyAccountant(delta=1e-5)
    acc.record(PureDPEvent(0.1))
    for step in range(3):
        votes = rng.multinomial(200, rng.dirichlet(np.ones(10)), size=64)
        answered = rng.random(64) < 0.6
        event = ConfidentGNMaxEvent(votes, answered, 100, 150.0 + step, 40.0)
        independent = confident_gnmax_rdp(votes, answered, threshold=100, sigma_threshold=150.0 + step, sigma_gnmax=40.0,
                                          orders=acc.orders, data_independent=True)
        expected = rdp_to_epsilon(acc.rdp + independent, acc.orders, 1e-5)[0]
        assert acc.epsilon_if(event) == expected  # bit for bit
        g, _ = acc.rdp_of(event)
        np.testing.assert_array_equal(g, independent)
        acc.record(event)
        assert acc.epsilon() == expected


def test_topagg_event_is_a_gaussian_mechanism_with_sensitivity_two_sqrt_k():
    from lightning_gpate.privacy.accountant import TopAggEvent

    m, k, sigma = 32, 200, 5000.0
    acc = PrivacyAccountant(delta=1e-5)
    for _ in range(50):
        acc.record(TopAggEvent(num_samples=m, topk=k, sigma=sigma))
    # closed form: 2kλ/σ² per sample (DataLens, CCS 2021; Mironov 2017 Cor. 3 with Δ = 2√k)
    np.testing.assert_allclose(acc.rdp, 50 * m * 2 * k * DEFAULT_ORDERS / sigma**2, rtol=1e-12)
    # dp-accounting's Gaussian mechanism with noise multiplier σ/Δ, composed 50·m times
    ref = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    ref.compose(dp_accounting.GaussianDpEvent(sigma / (2 * np.sqrt(k))), 50 * m)
    assert acc.epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    assert acc.counts["topagg_events"] == 50 and acc.counts["topagg_samples"] == 50 * m
    np.testing.assert_array_equal(acc.rdp, acc.rdp_paper)  # no data-dependent analysis: the paper curve is the guarantee
    assert acc.paper_label == "guarantee"
    with pytest.raises(ValueError):
        TopAggEvent(num_samples=1, topk=0, sigma=1.0)
    with pytest.raises(ValueError):
        TopAggEvent(num_samples=1, topk=3, sigma=0.0)


# ----------------------------------------------------------------------------- worst case, no data-dependent curve
def test_worst_case_curve_answers_every_confident_gnmax_query():
    """The guarantee of a batch depends on how many queries the noisy threshold answered; its worst case
    answers them all: n·λ/(2σ1²) + n·λ/σ2² (Papernot et al. 2018, Theorem 8 and Proposition 8), whatever
    the votes."""
    acc = PrivacyAccountant(delta=1e-5)
    acc.record(_gnmax_event(30, answered=False)).record(_gnmax_event(10))
    orders = acc.orders
    np.testing.assert_allclose(acc.rdp, 40 * orders / (2 * 600.0**2) + 10 * orders / 100.0**2, rtol=1e-12)
    np.testing.assert_allclose(acc.rdp_worst_case, 40 * (orders / (2 * 600.0**2) + orders / 100.0**2), rtol=1e-12)
    assert acc.epsilon_worst_case() > acc.epsilon()
    # events whose guarantee reads no output are their own worst case; a larger worst case may be given
    other = PrivacyAccountant(delta=1e-5).record(PureDPEvent(0.5)).record(LaplaceVoteEvent([3, 4], lam=0.5))
    np.testing.assert_array_equal(other.rdp_worst_case, other.rdp)
    bigger = PrivacyAccountant(delta=1e-5).record(_gnmax_event(5), worst_case=_gnmax_event(8))
    np.testing.assert_allclose(bigger.rdp_worst_case, 8 * (orders / (2 * 600.0**2) + orders / 100.0**2), rtol=1e-12)
    with pytest.raises(ValueError, match="worst_case costs less"):
        PrivacyAccountant(delta=1e-5).record(_gnmax_event(5), worst_case=_gnmax_event(2))
    # epsilon_worst_case(*events) adds their worst cases without recording them
    assert acc.epsilon_worst_case(_gnmax_event(10, answered=False)) == pytest.approx(
        PrivacyAccountant(delta=1e-5).record(_gnmax_event(50)).epsilon(), rel=1e-12)


def test_worst_case_curve_in_the_state_and_unknown_in_an_old_state():
    acc = PrivacyAccountant(delta=1e-5).record(_gnmax_event(30, answered=False))
    restored = PrivacyAccountant(delta=0.1)
    restored.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    np.testing.assert_array_equal(restored.rdp_worst_case, acc.rdp_worst_case)
    old = acc.state_dict()
    del old["rdp_worst_case"]
    restored.load_state_dict(old)  # unanswered queries, no worst case recorded: unknown, so unbounded
    assert restored.epsilon_worst_case() == np.inf
    answered = PrivacyAccountant(delta=1e-5).record(_gnmax_event(3)).state_dict()
    del answered["rdp_worst_case"]
    restored.load_state_dict(answered)
    np.testing.assert_array_equal(restored.rdp_worst_case, restored.rdp)


def test_no_data_dependent_curve_is_computed_unless_asked(monkeypatch):
    """``data_dependent=False``: PATE events add their guarantee to rdp_paper, and the data-dependent
    bound (a pass over the private votes) is never evaluated; GS-WGAN's per-sample composition (public
    settings only) still is."""
    import lightning_gpate.privacy.accountant as accountant

    def refuse(*args, data_independent=False, **kwargs):
        if not data_independent:
            raise AssertionError("a data-dependent bound was computed")
        return laplace_vote_rdp(*args, data_independent=True, **kwargs)

    monkeypatch.setattr(accountant, "confident_gnmax_rdp", lambda *a, **k: (_ for _ in ()).throw(AssertionError("computed")))
    monkeypatch.setattr(accountant, "laplace_vote_rdp", refuse)
    acc = PrivacyAccountant(delta=1e-5, data_dependent=False)
    acc.record(_gnmax_event(10)).record(LaplaceVoteEvent([3, 4], lam=0.5)).record(GSWGANStepEvent(4.0, 100, 8, steps=3))
    assert acc.paper_label == "per_sample_composition"
    kw = dict(noise_multiplier=4.0, num_discriminators=100, batch_size=8, steps=3, orders=acc.orders)
    np.testing.assert_allclose(acc.rdp_paper, acc.rdp - gswgan_rdp(accounting="sound", **kw) + gswgan_rdp(accounting="paper", **kw),
                               rtol=1e-12)
    assert acc.state_dict()["data_dependent"] is False
