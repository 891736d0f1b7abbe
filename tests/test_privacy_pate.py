"""Tests of lightning_gpate.privacy.pate against REFERENCE.md and hand derivations."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from lightning_gpate.privacy.pate import (
    confident_gnmax_rdp,
    gaussian_rdp_given_logq,
    gnmax_logq,
    laplace_vote_rdp,
    moments_to_epsilon,
    pate_laplace_moments,
    threshold_logq,
)
from lightning_gpate.privacy.rdp import DEFAULT_ORDERS, rdp_to_epsilon

O = DEFAULT_ORDERS
REF_VOTES = np.array([[0, 0, 0, 0, 1900, 100, 0, 0, 0, 0]])


# ----------------------------------------------------------------------------- Confident-GNMax


def test_reference_logq():
    # REFERENCE.md: 2000 teachers, σ2 = 100 → ln q = −84.468.
    assert abs(gnmax_logq(REF_VOTES, 100.0)[0] - (-84.468)) < 5e-4


def test_reference_epsilon_1000_answered_queries():
    # REFERENCE.md: T = 1000, σ1 = 600, σ2 = 100, 1000 answered queries → ε = 0.2543 (δ = 1e-5),
    # with the classic conversion on the reference grid.
    votes = np.repeat(REF_VOTES, 1000, axis=0)
    rdp = confident_gnmax_rdp(votes, np.ones(1000, bool), threshold=1000, sigma_threshold=600,
                              sigma_gnmax=100, orders=O)
    eps, _ = rdp_to_epsilon(rdp, O, 1e-5, conversion="classic")
    assert abs(eps - 0.2543) < 5e-5


def test_data_independent_one_answered_one_unanswered():
    votes = np.array([[5, 3, 2], [4, 4, 2]])
    s1, s2 = 7.0, 3.0
    rdp = confident_gnmax_rdp(votes, np.array([True, False]), threshold=5, sigma_threshold=s1,
                              sigma_gnmax=s2, orders=O, data_independent=True)
    np.testing.assert_allclose(rdp, O / s2**2 + 2 * O / (2 * s1**2), rtol=1e-14)


@pytest.mark.parametrize("seed", [0, 1])
def test_4000_teachers_is_effectively_data_independent(seed):
    # REFERENCE.md: 4000 teachers, σ1 = 3000, σ2 = 1000 → λ/σ2² + λ/(2σ1²) per answered query.
    rng = np.random.default_rng(seed)
    votes = np.concatenate([
        np.array([[4000] + [0] * 9, [2000, 2000] + [0] * 8]),
        rng.multinomial(4000, rng.dirichlet(np.full(10, 0.2)), size=50),
    ])
    answered = np.ones(len(votes), bool)
    kw = dict(threshold=2000, sigma_threshold=3000, sigma_gnmax=1000, orders=O)
    dep = confident_gnmax_rdp(votes, answered, **kw)
    ind = confident_gnmax_rdp(votes, answered, data_independent=True, **kw)
    np.testing.assert_allclose(dep, ind, rtol=1e-12)
    np.testing.assert_allclose(ind, len(votes) * (O / 1000**2 + O / (2 * 3000**2)), rtol=1e-12)


def test_unanimous_votes_smaller_than_data_independent():
    votes = np.array([[2000] + [0] * 9])
    kw = dict(threshold=1000, sigma_threshold=600, sigma_gnmax=100, orders=O)
    dep = confident_gnmax_rdp(votes, [True], **kw)
    ind = confident_gnmax_rdp(votes, [True], data_independent=True, **kw)
    assert np.all(dep <= ind)
    assert np.all(dep[:50] < 0.1 * ind[:50])


def _theorem6_direct(q, sigma, lam):
    """Theorem 6 / Prop. 10 of Papernot et al. 2018 evaluated in linear space."""
    mu2 = sigma * math.sqrt(-math.log(q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / sigma**2, mu2 / sigma**2
    a = (1 - q) / (1 - (q * math.exp(e2)) ** ((mu2 - 1) / mu2))
    b = math.exp(e1) / q ** (1 / (mu1 - 1))
    return min(lam / sigma**2, math.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1))


def test_theorem6_matches_linear_space_evaluation():
    q, sigma = 1e-6, 10.0  # μ2 ≈ 37.2, conditions of Prop. 10 hold
    orders = np.array([1.1, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0])
    got = gaussian_rdp_given_logq([math.log(q)], sigma, orders)[0]
    want = [_theorem6_direct(q, sigma, lam) for lam in orders]
    np.testing.assert_allclose(got, want, rtol=1e-8)  # linear space loses digits near λ = 1
    assert np.all(got < orders / sigma**2)
    # Beyond μ1 the data-independent bound is used.
    far = gaussian_rdp_given_logq([math.log(q)], sigma, np.array([50.0, 100.0]))[0]
    np.testing.assert_allclose(far, np.array([50.0, 100.0]) / sigma**2)


def test_fixed_output_is_free_and_large_q_is_data_independent():
    orders = np.array([2.0, 10.0])
    np.testing.assert_array_equal(gaussian_rdp_given_logq([-np.inf], 5.0, orders)[0], [0.0, 0.0])
    np.testing.assert_allclose(gaussian_rdp_given_logq([math.log(0.4)], 5.0, orders)[0], orders / 25)


def test_threshold_logq_uses_rounded_max_and_min_tail():
    votes = np.array([[10.4, 3.0], [10.6, 0.0], [100.0, 0.0]])
    got = threshold_logq(votes, threshold=12.0, sigma_threshold=2.0)
    z = (12.0 - np.array([10.0, 11.0, 100.0])) / 2.0  # round(10.4) = 10, round(10.6) = 11
    np.testing.assert_allclose(got, np.minimum(norm.logsf(z), norm.logcdf(z)), rtol=1e-12)
    assert np.isfinite(got).all()  # ln(1 − p) ≈ −972.7 is not lost to cancellation


def test_gnmax_logq_union_bound_and_cap():
    votes = np.array([[10, 7, 4], [5, 5, 5]])
    got = gnmax_logq(votes, 2.0)
    s = math.sqrt(2) * 2.0
    q0 = norm.sf(3 / s) + norm.sf(6 / s)
    assert got[0] == pytest.approx(math.log(q0), rel=1e-12)
    assert got[1] == pytest.approx(math.log(1 - 1 / 3), rel=1e-12)  # capped at 1 − 1/B


def test_vectorised_equals_sum_of_single_queries():
    rng = np.random.default_rng(3)
    votes = rng.multinomial(200, rng.dirichlet(np.full(10, 0.3)), size=40)
    answered = rng.random(40) < 0.6
    kw = dict(threshold=100, sigma_threshold=30, sigma_gnmax=10, orders=O)
    batch = confident_gnmax_rdp(votes, answered, **kw)
    single = sum(confident_gnmax_rdp(votes[i:i + 1], answered[i:i + 1], **kw) for i in range(40))
    np.testing.assert_allclose(batch, single, rtol=1e-10)
    # Answered as 0/1 integers is accepted.
    np.testing.assert_allclose(confident_gnmax_rdp(votes, answered.astype(int), **kw), batch)


@pytest.mark.parametrize(
    "votes,answered,kw,match",
    [
        (np.ones(3), [True], {}, "votes"),
        (np.ones((2, 3)), [True], {}, "answered"),
        (-np.ones((1, 3)), [True], {}, "non-negative"),
        (np.full((1, 3), np.nan), [True], {}, "NaN"),
        (np.ones((1, 3)), [True], {"sigma_gnmax": 0.0}, "sigma_gnmax"),
        (np.ones((1, 3)), [True], {"sigma_threshold": -1.0}, "sigma_threshold"),
        (np.ones((1, 3)), [True], {"orders": [1.0, 2.0]}, "order"),
        (np.ones((1, 3)), [2], {}, "boolean"),
    ],
)
def test_confident_gnmax_rejects_bad_inputs(votes, answered, kw, match):
    args = dict(threshold=1.0, sigma_threshold=1.0, sigma_gnmax=1.0, orders=O)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        confident_gnmax_rdp(votes, answered, **args)


# ----------------------------------------------------------------------------- PATE-GAN moments


@pytest.mark.parametrize(
    "gap,ref",
    [
        (10, [0.00174, 0.00900, 0.05584, 0.34313, 1.38735]),
        (6, [0.06240, 0.28685, 1.13026, 2.76699, 4.70380]),
        (0, [4, 12, 24, 40, 60]),
    ],
)
def test_reference_laplace_moments(gap, ref):
    alpha = pate_laplace_moments([gap], lam=1.0, num_moments=5)
    assert np.all(np.abs(alpha - np.array(ref)) < 5e-6)


def test_precondition_fallback_is_data_independent():
    # gap 0: q = 1/2 ≥ (e^{2λ}−1)/(e^{4λ}−1) → 2λ² l(l+1) exactly.
    lam = 0.3
    ls = np.arange(1, 21)
    np.testing.assert_allclose(pate_laplace_moments([0, 0], lam=lam, num_moments=20),
                               2 * 2 * lam**2 * ls * (ls + 1), rtol=1e-14)


@pytest.mark.parametrize("lam,ref", [(1.0, 10.2575), (0.1, 51.5129)])
def test_reference_moments_epsilon(lam, ref):
    alpha = pate_laplace_moments(np.full(1000, 10), lam=lam, num_moments=100)
    eps, best_l = moments_to_epsilon(alpha, 1e-5)
    assert abs(eps - ref) < 5e-5
    assert 1 <= best_l <= 100


def test_moments_data_dependent_never_exceeds_data_independent_and_sign_ignored():
    ls = np.arange(1, 101)
    for gap in (0, 1, 3, 10, 50):
        alpha = pate_laplace_moments([gap], lam=0.5)
        assert np.all(alpha <= 2 * 0.25 * ls * (ls + 1) + 1e-12)
    np.testing.assert_array_equal(pate_laplace_moments([-7, 7], lam=1.0), 2 * pate_laplace_moments([7], lam=1.0))


def test_smaller_delta_larger_moments_epsilon():
    alpha = pate_laplace_moments(np.full(100, 4), lam=0.5)
    assert moments_to_epsilon(alpha, 1e-3)[0] < moments_to_epsilon(alpha, 1e-6)[0]


def test_laplace_vote_rdp_matches_moments_at_integer_orders():
    gaps = np.array([10, 10, 6, 3, 0, 25])
    lam = 1.0
    ls = np.arange(1, 101)
    orders = ls + 1.0
    rdp = laplace_vote_rdp(gaps, lam=lam, orders=orders)
    # Per query RDP(l + 1) = α(l)/l, capped by the pure 2λ-DP bound (binding for gap 0).
    want = sum(np.minimum(pate_laplace_moments([g], lam=lam) / ls, 2 * lam) for g in gaps)
    np.testing.assert_allclose(rdp, want, rtol=1e-12)
    no_zero = laplace_vote_rdp(gaps[gaps > 0], lam=lam, orders=orders[:3])
    alpha = pate_laplace_moments(gaps[gaps > 0], lam=lam, num_moments=3)
    np.testing.assert_allclose(no_zero, alpha / ls[:3], rtol=1e-12)
    # The classic conversion on orders 2..101 is the moments accountant's ε̂ (REFERENCE 10.2575).
    rdp = laplace_vote_rdp(np.full(1000, 10), lam=1.0, orders=orders)
    assert abs(rdp_to_epsilon(rdp, orders, 1e-5, conversion="classic")[0] - 10.2575) < 5e-5


def test_laplace_vote_rdp_data_independent_and_fractional_orders():
    orders = np.array([1.1, 1.5, 2.0, 10.0])
    ind = laplace_vote_rdp([1, 2, 3], lam=0.2, orders=orders, data_independent=True)
    np.testing.assert_allclose(ind, 3 * np.minimum(0.4, 2 * 0.04 * orders), rtol=1e-14)
    dep = laplace_vote_rdp([1, 2, 3], lam=0.2, orders=orders)
    assert np.all(np.isfinite(dep)) and np.all(dep <= ind + 1e-15)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: pate_laplace_moments([1], lam=0.0), "lam"),
        (lambda: pate_laplace_moments([np.nan], lam=1.0), "NaN"),
        (lambda: pate_laplace_moments([1], lam=1.0, num_moments=0), "num_moments"),
        (lambda: moments_to_epsilon([1.0, 2.0], 0.0), "delta"),
        (lambda: moments_to_epsilon([], 1e-5), "alpha"),
        (lambda: laplace_vote_rdp([1], lam=1.0, orders=[0.5]), "order"),
    ],
)
def test_laplace_rejects_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
