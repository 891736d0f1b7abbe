"""Tests of lightning_gpate.privacy.rdp (RDP curves and RDP → (ε, δ) conversion)."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from lightning_gpate.privacy.rdp import (
    DEFAULT_ORDERS,
    gaussian_rdp,
    pure_dp_rdp,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)


def test_default_orders_is_reference_grid():
    assert DEFAULT_ORDERS[0] == 1.1
    np.testing.assert_array_equal(DEFAULT_ORDERS[1:], np.arange(2, 200))
    assert DEFAULT_ORDERS.shape == (199,)


def test_classic_conversion_closed_form_gaussian():
    # A Gaussian with σ² = 50: RDP(λ) = λρ with ρ = 1/(2σ²) = 0.01.
    # min over real λ of λρ + ln(1/δ)/(λ−1) is at λ* = 1 + sqrt(ln(1/δ)/ρ),
    # ε* = ρ + 2 sqrt(ρ ln(1/δ)). With ln(1/δ) = 9: λ* = 31 (on the grid), ε* = 0.61.
    rdp = gaussian_rdp(math.sqrt(50.0), DEFAULT_ORDERS)
    eps, order = rdp_to_epsilon(rdp, DEFAULT_ORDERS, math.exp(-9.0), conversion="classic")
    assert order == 31.0
    assert eps == pytest.approx(0.61, rel=1e-12)


@pytest.mark.parametrize("sigma,steps", [(0.5, 1), (1.0, 10), (3.0, 100), (30.0, 1)])
def test_improved_conversion_matches_dp_accounting(sigma, steps):
    rdp = steps * gaussian_rdp(sigma, DEFAULT_ORDERS)
    eps, order = rdp_to_epsilon(rdp, DEFAULT_ORDERS, 1e-5)
    ref_eps, ref_order = compute_epsilon(DEFAULT_ORDERS, rdp, 1e-5)
    assert eps == pytest.approx(float(ref_eps), rel=1e-12)
    assert order == float(ref_order)
    classic, _ = rdp_to_epsilon(rdp, DEFAULT_ORDERS, 1e-5, conversion="classic")
    assert eps <= classic


def test_improved_conversion_kl_branch_and_tiny_rdp():
    orders = np.array([1.1, 2.0, 3.0])
    eps, _ = rdp_to_epsilon(np.zeros(3), orders, 1e-5)
    assert eps == 0.0
    eps, _ = rdp_to_epsilon(np.full(3, 1e-12), orders, 0.5)
    assert eps == 0.0  # δ² > 1 − e^{−rdp}
    ref, _ = compute_epsilon(orders, np.full(3, 1e-12), 0.5)
    assert eps == ref


@pytest.mark.parametrize("conversion", ["improved", "classic"])
def test_zero_rdp_is_zero_epsilon(conversion):
    assert rdp_to_epsilon(np.zeros(199), DEFAULT_ORDERS, 1e-5, conversion=conversion) == (0.0, 1.1)


def test_infinite_rdp_gives_infinite_epsilon():
    eps, _ = rdp_to_epsilon(np.full(3, np.inf), np.array([2.0, 3.0, 4.0]), 1e-5)
    assert eps == math.inf


@pytest.mark.parametrize("conversion", ["improved", "classic"])
def test_smaller_delta_gives_larger_epsilon(conversion):
    rdp = 100 * gaussian_rdp(5.0, DEFAULT_ORDERS)
    eps = [rdp_to_epsilon(rdp, DEFAULT_ORDERS, d, conversion=conversion)[0] for d in (1e-3, 1e-5, 1e-8)]
    assert eps[0] < eps[1] < eps[2]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(delta=float("nan")), "delta"),
        (dict(delta=1e-5, rdp=np.ones(3)), "shape"),
        (dict(delta=1e-5, rdp=np.array([1.0, np.nan])), "NaN"),
        (dict(delta=1e-5, rdp=np.array([1.0, -1.0])), ">= 0"),
        (dict(delta=1e-5, orders=np.array([1.0, 2.0])), "order"),
        (dict(delta=1e-5, conversion="fancy"), "conversion"),
    ],
)
def test_rdp_to_epsilon_rejects_bad_inputs(kwargs, match):
    args = dict(rdp=np.ones(2), orders=np.array([2.0, 3.0]), delta=1e-5)
    args.update(kwargs)
    conversion = args.pop("conversion", "improved")
    with pytest.raises(ValueError, match=match):
        rdp_to_epsilon(args["rdp"], args["orders"], args["delta"], conversion=conversion)


def test_gaussian_and_pure_dp_rdp():
    orders = np.array([1.5, 2.0, 10.0, 100.0])
    np.testing.assert_allclose(gaussian_rdp(2.0, orders), orders / 8.0)
    # ε-DP ⇒ min(ε, λε²/2).
    np.testing.assert_allclose(pure_dp_rdp(0.1, orders), np.minimum(0.1, orders * 0.005))
    assert pure_dp_rdp(0.1, [1000.0])[0] == 0.1
    with pytest.raises(ValueError, match="noise_multiplier"):
        gaussian_rdp(0.0, orders)
    with pytest.raises(ValueError, match="epsilon"):
        pure_dp_rdp(-1.0, orders)


def _dp_accounting_eps(event, relation, orders, delta=1e-5):
    acc = dp_accounting.rdp.RdpAccountant(orders=orders, neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta), acc.rdp


def test_subsampled_gaussian_poisson_matches_dp_accounting():
    orders = DEFAULT_ORDERS[:40]
    rdp = subsampled_gaussian_rdp(
        noise_multiplier=1.1, sampling_rate=64 / 60000, steps=1000, orders=orders
    )
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(64 / 60000, dp_accounting.GaussianDpEvent(1.1)), 1000
    )
    ref_eps, ref_rdp = _dp_accounting_eps(event, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, orders)
    np.testing.assert_allclose(rdp, ref_rdp, rtol=1e-12)
    assert rdp_to_epsilon(rdp, orders, 1e-5)[0] == pytest.approx(ref_eps, rel=1e-12)


def test_subsampled_gaussian_without_replacement_matches_dp_accounting():
    orders = np.array([1.1, 2.0, 3.0, 5.0, 8.0, 12.0])
    rdp = subsampled_gaussian_rdp(
        noise_multiplier=2.0, sampling_rate=0.01, steps=50, orders=orders,
        sampling="without_replacement", neighboring="replace_one",
    )
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(100, 1, dp_accounting.GaussianDpEvent(2.0)), 50
    )
    _, ref_rdp = _dp_accounting_eps(event, dp_accounting.NeighboringRelation.REPLACE_ONE, orders)
    np.testing.assert_allclose(rdp, ref_rdp, rtol=1e-12)


def test_subsampled_gaussian_linear_in_steps_and_validation():
    orders = np.array([2.0, 4.0, 8.0])
    one = subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=1, orders=orders)
    ten = subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=10, orders=orders)
    np.testing.assert_allclose(ten, 10 * one)
    assert not subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=0, orders=orders).any()
    with pytest.raises(ValueError, match="neighboring"):
        subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=1, orders=orders,
                                neighboring="replace_one")
    with pytest.raises(ValueError, match="sampling_rate"):
        subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=1.5, steps=1, orders=orders)
    with pytest.raises(ValueError, match="sampling"):
        subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=1, orders=orders,
                                sampling="shuffle")
    with pytest.raises(ValueError, match="steps"):
        subsampled_gaussian_rdp(noise_multiplier=1.0, sampling_rate=0.1, steps=-1, orders=orders)
