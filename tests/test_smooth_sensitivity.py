"""Smooth-sensitivity release (Papernot et al. 2018, Section 4, Appendix B) against the published
reference implementation.

``data/smooth_sensitivity_reference.json`` holds values produced by RUNNING ``research/pate_2018`` of
tensorflow/privacy (``core.py``, ``smooth_sensitivity.py``) with ``data/make_smooth_sensitivity_reference.py``;
the reference code itself is not in this repository. Where the reference's ``core.py`` lets ln(1 − p)
underflow, the check is against an exact mpmath computation instead.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest

from lightning_gpate.privacy.pate import confident_gnmax_rdp, gaussian_rdp_given_logq, gnmax_logq, laplace_vote_rdp
from lightning_gpate.privacy.smooth_release import (
    ConfidentGNMaxLedger,
    GNSSParameters,
    LaplaceVoteLedger,
    default_gnss_parameters,
    ledger_from_state,
    release,
)
from lightning_gpate.privacy.smooth_sensitivity import (
    ball_maximum,
    gnmax_conditions,
    gnmax_local_sensitivity_bounds,
    gnmax_logq0,
    gnmax_logq1,
    gnmax_rdp_at_order,
    gnss_rdp,
    laplace_local_sensitivity_bounds,
    laplace_rdp_table,
    smooth_sensitivity,
    threshold_local_sensitivity_bounds,
    threshold_local_sensitivity_table,
    threshold_rdp_table,
    walk_horizon,
)

REF = json.loads((Path(__file__).parent / "data" / "smooth_sensitivity_reference.json").read_text())
RTOL = 1e-6


def rle(pairs) -> np.ndarray:
    return np.concatenate([np.full(k, v) for v, k in pairs])


def assert_rel(actual, expected, rtol=RTOL):
    actual, expected = np.asarray(actual, float), np.asarray(expected, float)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=0)


# ----------------------------------------------------------------------------- GNMax


@pytest.mark.parametrize("case", REF["gnmax_local_sensitivity"], ids=lambda c: f"{c['votes'][:3]}-s{c['sigma']}-l{c['order']}")
def test_gnmax_local_sensitivity_matches_reference(case):
    n = case["n"]
    ours = gnmax_local_sensitivity_bounds(np.array(case["votes"]), n, case["sigma"], case["order"], ball=False)
    assert ours.shape == (n + 1,)
    assert_rel(ours[:n], rle(case["ls"]))  # the reference stops at distance n − 1
    assert_rel(gnmax_logq0(case["sigma"], case["order"]), case["logq0"], rtol=1e-9)
    assert_rel(gnmax_logq1(case["sigma"], case["order"], len(case["votes"])), case["logq1"], rtol=1e-9)


def test_gnmax_going_left_matches_reference_test():
    # The reference test's second case: [0]*298 + [2.777e-7, 2.109e-6] + [2.731e-6]*1700.
    case = REF["gnmax_going_left"]
    ours = gnmax_local_sensitivity_bounds(np.array(case["votes"]), case["n"], case["sigma"], case["order"], ball=False)
    assert np.all(ours[: case["zeros_before"]] == 0)
    assert case["zeros_before"] == 298
    assert_rel(ours[290:310], rle(case["ls_290_310"]))
    assert_rel(ours[310:], np.full(case["n"] + 1 - 310, case["plateau"]))
    assert_rel(case["plateau"], 2.73113623988e-6, rtol=1e-10)  # the reference test's literal


def test_gnmax_bounds_batched_equal_one_by_one():
    rng = np.random.default_rng(3)
    votes = rng.multinomial(60, rng.dirichlet(np.full(6, 0.4)), size=25)
    batch = gnmax_local_sensitivity_bounds(votes, 60, 4.0, 6.0)
    for i, v in enumerate(votes):
        np.testing.assert_array_equal(batch[i], gnmax_local_sensitivity_bounds(v, 60, 4.0, 6.0))


def test_gnmax_rdp_at_order_equals_the_accountants_data_dependent_bound():
    rng = np.random.default_rng(0)
    votes = np.concatenate([rng.multinomial(200, rng.dirichlet(np.full(10, a)), size=40) for a in (0.05, 0.5, 5)])
    for sigma, order in ((10.0, 5.0), (20.0, 12.0), (50.0, 3.0)):
        lq = gnmax_logq(votes, sigma)
        ours = gnmax_rdp_at_order(lq, sigma, order)
        acc = gaussian_rdp_given_logq(lq, sigma, [order])[:, 0]
        np.testing.assert_allclose(ours, acc, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("case", REF["conditions"], ids=lambda c: f"s{c['sigma']}-m{c['num_classes']}-l{c['order']}")
def test_conditions_c5_c6_match_reference(case):
    c5, c6 = gnmax_conditions(case["sigma"], case["num_classes"], case["order"])
    assert (c5, c5 and c6) == (case["c5"], case["c5"] and case["c6"])


# ----------------------------------------------------------------------------- threshold


@pytest.mark.parametrize("case", REF["threshold_local_sensitivity"],
                         ids=lambda c: f"n{c['n']}-T{c['threshold']}-s{c['sigma']}-l{c['order']}")
def test_threshold_local_sensitivity_matches_reference(case):
    n, t, s, o = case["n"], case["threshold"], case["sigma"], case["order"]
    assert_rel(threshold_rdp_table(n, t, s, o), rle(case["rdp_table"]))
    for votes, expected in zip(case["votes"], case["ls"]):
        votes = np.array(votes)
        ours = threshold_local_sensitivity_bounds(votes, n, t, s, o, ball=False)
        expected = rle(expected)
        # The reference's loop stops one distance short: at d = max(v, n − v) (an end of the range
        # is still reachable) it reports 0; ours is the table's value at that end.
        top = int(votes.max())
        edge = max(top, n - top)
        keep = np.arange(n) != edge
        assert_rel(ours[:n][keep], expected[keep])
        assert expected[edge] == 0
        table = rle(case["rdp_table"])
        at_ends = [abs(table[0] - table[1])] * (top - edge == 0) + [abs(table[n] - table[n - 1])] * (top + edge == n)
        assert_rel(ours[edge], max(at_ends))
        ball = threshold_local_sensitivity_bounds(votes, n, t, s, o)
        np.testing.assert_array_equal(ball, np.maximum.accumulate(ours))


@pytest.mark.parametrize("case", REF["threshold_underflow"], ids=lambda c: f"l{c['order']}")
def test_threshold_underflow_is_the_exact_upper_bound_not_zero(case):
    # Far above the threshold p = 1 − Φ((T − v)/σ) rounds to 1 and the reference's core.py sets the
    # cost to exactly 0 (v ≥ 59 here). The true cost, Theorem 6 at q = Φ((T − v)/σ) with noise √2σ
    # (or λ/(2σ²) where that is smaller), is positive, and at order 25 close to the data-independent λ/(2σ²): evaluated with mpmath.
    n, t, s, o = case["n"], case["threshold"], case["sigma"], case["order"]
    table = threshold_rdp_table(n, t, s, o)
    mpmath.mp.dps = 800  # values down to 1e-300 next to 1 in the logarithm's argument
    saw_underflow = False
    for v, ref_value in case["rdp_at"]:
        q = mpmath.ncdf((t - v) / s)  # = 1 − p, exactly (no cancellation)
        sig = mpmath.sqrt(2) * s
        mu2 = sig * mpmath.sqrt(-mpmath.log(q))
        mu1 = mu2 + 1
        e1, e2 = mu1 / sig**2, mu2 / sig**2
        a = (1 - q) / (1 - (q * mpmath.exp(e2)) ** ((mu2 - 1) / mu2))
        b = mpmath.exp(e1) / q ** (1 / (mu1 - 1))
        dep = mpmath.log((1 - q) * a ** (o - 1) + q * b ** (o - 1)) / (o - 1)
        assert o < mu1  # Theorem 6 applies
        exact = min(dep, mpmath.mpf(o) / (2 * s**2))
        if float(exact) == 0.0:  # below the doubles: the smallest positive one bounds it
            assert exact > 0 and table[v] == np.nextafter(0.0, 1.0)
        else:
            assert_rel(table[v], float(exact), rtol=1e-6)
        if ref_value == 0.0:
            saw_underflow = True
            assert table[v] > 0
            if o == 25.0 and v < 80:
                assert table[v] > 1.0  # the reference reports 0 for a cost close to λ/(2σ²)
        else:
            assert_rel(table[v], ref_value, rtol=1e-6)
    assert saw_underflow


# ----------------------------------------------------------------------------- GNSS


@pytest.mark.parametrize("case", REF["gnss_rdp"], ids=lambda c: f"b{c['beta']}-s{c['sigma']}-l{c['order']}")
def test_gnss_rdp_matches_reference(case):
    assert_rel(gnss_rdp(beta=case["beta"], sigma=case["sigma"], order=case["order"]), case["rdp"], rtol=1e-12)


def test_gnss_order_range():
    with pytest.raises(ValueError, match="1/\\(2\\*beta\\)"):
        gnss_rdp(beta=0.1, sigma=1.0, order=5.0)
    with pytest.raises(ValueError, match="1/\\(2\\*beta\\)"):
        GNSSParameters(order=10.0, beta=0.05, sigma=3.0)
    curve = GNSSParameters(order=4.0, beta=0.1, sigma=3.0).rdp_curve([2.0, 4.0, 4.99, 5.0, 7.0])
    assert np.all(np.isfinite(curve[:3])) and np.all(np.isinf(curve[3:]))


def test_smooth_sensitivity_is_the_discounted_maximum():
    ls = np.array([0.0, 1.0, 3.0, 3.5, 3.5])
    assert smooth_sensitivity(ls, 0.0) == 3.5
    assert math.isclose(smooth_sensitivity(ls, 0.5), max(ls * np.exp(-0.5 * np.arange(5))))


# ----------------------------------------------------------------------------- a run's ledger and release


def _batch():
    b = REF["confident_gnmax_batch"]
    led = ConfidentGNMaxLedger(num_teachers=b["n"], threshold=b["threshold"], sigma_threshold=b["sigma_threshold"],
                               sigma_gnmax=b["sigma_gnmax"], num_bins=10, order=b["order"])
    return b, led


def test_ledger_matches_reference_sums():
    b, led = _batch()
    votes, answered = np.array(b["votes"]), np.array(b["answered"])
    led.add(votes[:7], answered[:7])  # in two batches: sums are incremental
    led.add(votes[7:], answered[7:])
    assert_rel(led.data_dependent_rdp(), b["data_dependent_rdp"])
    edge = b["compare_up_to"]
    ls = led.local_sensitivity()
    assert ls.shape == (b["n"] + 1,)
    assert_rel(ls[:edge], rle(b["ls_sum"]))
    for beta, ss in b["smooth_sensitivity"].items():
        assert_rel(smooth_sensitivity(ls[:edge], float(beta)), ss)
        assert led.smooth_sensitivity(float(beta)) >= ss * (1 - 1e-9)  # distances beyond can only add
        params = GNSSParameters(order=b["order"], beta=float(beta), sigma=b["sigma_ss"])
        assert_rel(params.cost, b["gnss_rdp"][beta], rtol=1e-12)
    # The released ε: RDP + SS·σ_ss·z + GNSS, classic conversion at the order (reference arithmetic).
    beta = 0.06  # its discounted maximum lies within the compared distances
    params = GNSSParameters(order=b["order"], beta=beta, sigma=b["sigma_ss"])
    assert led.smooth_sensitivity(beta) == pytest.approx(b["smooth_sensitivity"]["0.06"], rel=1e-6)
    rel = release(led, params, z=b["z"], delta=1e-5, conversion="classic")
    assert_rel(rel.epsilon, b["eps_classic_delta_1e-5"]["0.06"])
    assert rel.num_queries == len(votes)


def test_ledger_data_dependent_rdp_equals_the_accountants():
    rng = np.random.default_rng(1)
    votes = rng.multinomial(100, rng.dirichlet(np.full(10, 0.2)), size=300)
    answered = rng.random(300) < 0.6
    led = ConfidentGNMaxLedger(num_teachers=100, threshold=50, sigma_threshold=15, sigma_gnmax=10, num_bins=10, order=8.0)
    led.add(votes, answered)
    acc = confident_gnmax_rdp(votes, answered, threshold=50, sigma_threshold=15, sigma_gnmax=10, orders=[8.0])[0]
    assert led.data_dependent_rdp() == pytest.approx(acc, rel=1e-7)


def test_ledger_equals_sum_of_per_query_ball_bounds_and_round_trips():
    rng = np.random.default_rng(2)
    n = 80
    votes = rng.multinomial(n, rng.dirichlet(np.full(10, 0.3)), size=60)
    answered = rng.random(60) < 0.7
    led = ConfidentGNMaxLedger(num_teachers=n, threshold=40, sigma_threshold=10, sigma_gnmax=6, num_bins=10, order=6.0)
    for chunk in np.array_split(np.arange(60), 4):
        led.add(votes[chunk], answered[chunk])
    expected = threshold_local_sensitivity_bounds(votes, n, 40, 10, 6.0).sum(axis=0)
    expected += gnmax_local_sensitivity_bounds(votes[answered], n, 6.0, 6.0).sum(axis=0)
    np.testing.assert_allclose(led.local_sensitivity(), expected, rtol=1e-12)
    again = ledger_from_state(json.loads(json.dumps(led.state_dict())))
    np.testing.assert_array_equal(again.local_sensitivity(), led.local_sensitivity())
    assert again.data_dependent_rdp() == led.data_dependent_rdp()


def test_gnmax_falls_back_to_data_independent_when_conditions_fail():
    assert gnmax_conditions(20.0, 10, 25.0) == (True, False)  # the reference test's case
    with pytest.warns(UserWarning, match="C5"):
        led = ConfidentGNMaxLedger(num_teachers=100, threshold=50, sigma_threshold=15, sigma_gnmax=20,
                                   num_bins=10, order=25.0)
    led.add(np.array([[100] + [0] * 9]), [True])
    table = threshold_rdp_table(100, 50, 15, 25.0)
    assert led.data_dependent_rdp() == pytest.approx(table[100] + 25.0 / 20**2)
    np.testing.assert_allclose(led.local_sensitivity(), ball_maximum(threshold_local_sensitivity_table(100, 50, 15, 25.0), 100, 101))


# ----------------------------------------------------------------------------- soundness by enumeration


def _histograms(n, bins):
    for cut in itertools.combinations(range(n + bins - 1), bins - 1):
        edges = (-1,) + cut + (n + bins - 1,)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(bins))


def _neighbours(h):
    for i, j in itertools.permutations(range(len(h)), 2):
        if h[i] > 0:
            g = list(h)
            g[i] -= 1
            g[j] += 1
            yield tuple(g)


@pytest.mark.parametrize("sigma,order", [(1.0, 2.0), (2.0, 3.0), (0.7, 1.5)])
def test_bounds_cover_every_dataset_within_distance(sigma, order):
    """Exhaustively over all histograms of n = 9 teachers and 3 bins: for every h and d, every h'
    within d moves and every neighbour h'' of h', |β(h') − β(h'')| ≤ the ball bound at (h, d), for
    the threshold step and for GNMax (where conditions C5–C6 hold)."""
    n, bins = 9, 3
    hs = list(_histograms(n, bins))
    index = {h: i for i, h in enumerate(hs)}
    arr = np.array(hs, dtype=float)
    beta_g = gnmax_rdp_at_order(gnmax_logq(arr, sigma), sigma, order)
    beta_t = threshold_rdp_table(n, 5, sigma, order)[arr.max(axis=1).astype(int)]
    ls_true = {}
    for name, beta in (("gnmax", beta_g), ("threshold", beta_t)):
        ls_true[name] = np.array([max(abs(beta[i] - beta[index[g]]) for g in _neighbours(h)) for i, h in enumerate(hs)])
    # distances by breadth-first search over single-vote moves
    dist = np.full((len(hs), len(hs)), 10**9)
    for s, h in enumerate(hs):
        dist[s, s], frontier = 0, [h]
        while frontier:
            nxt = []
            for f in frontier:
                for g in _neighbours(f):
                    if dist[s, index[g]] > dist[s, index[f]] + 1:
                        dist[s, index[g]] = dist[s, index[f]] + 1
                        nxt.append(g)
            frontier = nxt
    bound_g = gnmax_local_sensitivity_bounds(arr, n, sigma, order)
    bound_t = threshold_local_sensitivity_bounds(arr, n, 5, sigma, order)
    c5, c6 = gnmax_conditions(sigma, bins, order)
    for s in range(len(hs)):
        for d in range(n + 1):
            within = dist[s] <= d
            assert ls_true["threshold"][within].max() <= bound_t[s, d] * (1 + 1e-9) + 1e-15
            if c5 and c6:
                assert ls_true["gnmax"][within].max() <= bound_g[s, d] * (1 + 1e-9) + 1e-15


# ----------------------------------------------------------------------------- PATE-GAN's Laplace votes


@pytest.mark.parametrize("case", REF["laplace_rdp_table"], ids=lambda c: f"n{c['n']}-lam{c['lam']}-l{c['order']}")
def test_laplace_rdp_table_matches_reference(case):
    n, lam, order = case["n"], case["lam"], case["order"]
    assert_rel(laplace_rdp_table(n, lam, order), rle(case["rdp_table"]), rtol=1e-9)


def test_laplace_ledger_bounds_by_enumeration_and_accountant():
    n, lam, order = 11, 0.4, 6.0
    table = laplace_rdp_table(n, lam, order)
    gaps = np.arange(1, n + 1, 2)
    # one teacher moves n0 − n1 by ±2: |g ± 2| (|1 − 2| = 1 at the bottom)
    true_ls = np.array([max(abs(table[(abs(g + s) - 1) // 2] - table[(g - 1) // 2])
                            for s in (-2, 2) if abs(g + s) <= n) for g in gaps])
    bounds = laplace_local_sensitivity_bounds(gaps, n, lam, order)
    for i in range(len(gaps)):
        for d in range(n + 1):
            reach = [j for j in range(len(gaps)) if abs(j - i) <= d]
            assert true_ls[reach].max() == pytest.approx(bounds[i, d])
    led = LaplaceVoteLedger(num_teachers=n, lam=lam, order=order)
    sample = np.array([1, 1, 5, 11, 7, 3])
    led.add(sample)
    np.testing.assert_allclose(led.local_sensitivity(), laplace_local_sensitivity_bounds(sample, n, lam, order).sum(axis=0))
    assert led.data_dependent_rdp() == pytest.approx(laplace_vote_rdp(sample, lam=lam, orders=[order])[0], rel=1e-12)
    with pytest.raises(ValueError, match="parity"):
        led.add(np.array([2]))


# ----------------------------------------------------------------------------- the default rule


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_default_rule(epsilon):
    p = default_gnss_parameters(epsilon=epsilon, delta=1e-5, conversion="classic")
    assert p.beta == pytest.approx(0.4 / p.order)
    fixed = math.log(1e5) / (p.order - 1) + (-0.5 * math.log(1 - 0.8) + 0.4) / (p.order - 1)
    assert fixed == pytest.approx(epsilon / 2, rel=1e-6)
    assert p.order * math.exp(2 * p.beta) / p.sigma**2 == pytest.approx(epsilon / 10)
    assert p.rule == "default"
    q = default_gnss_parameters(epsilon=epsilon, delta=1e-5, order=p.order, beta=p.beta, sigma=3.0)
    assert q.sigma == 3.0 and q.rule == "config"


def test_walk_horizon_is_an_upper_bound_and_nearly_exact():
    rng = np.random.default_rng(5)
    n = 400
    votes = rng.multinomial(n, rng.dirichlet(np.full(10, 0.05)), size=50)
    kw = dict(num_teachers=n, threshold=200, sigma_threshold=120, sigma_gnmax=8, num_bins=10, order=4.0)
    exact, cut = ConfidentGNMaxLedger(**kw), ConfidentGNMaxLedger(**kw, max_distance=walk_horizon(0.1, n, discount=3.0))
    assert cut.max_distance == 30
    exact.add(votes, np.ones(50, bool))
    cut.add(votes, np.ones(50, bool))
    assert np.all(cut.local_sensitivity() >= exact.local_sensitivity() * (1 - 1e-12))
    assert np.any(cut.local_sensitivity() > exact.local_sensitivity())  # the walks were cut
    assert cut.smooth_sensitivity(0.1) >= exact.smooth_sensitivity(0.1)
    assert cut.data_dependent_rdp() == exact.data_dependent_rdp()
