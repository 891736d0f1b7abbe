"""Tests of lightning_gpate.privacy.dp_stats."""

import numpy as np
import pytest

from lightning_gpate.privacy.dp_stats import dp_bounds, dp_histogram_ratio, dp_quantile


def test_histogram_ratio_is_a_distribution_close_to_truth():
    labels = np.array([0] * 900 + [1] * 100)
    ratio, eps = dp_histogram_ratio(labels, num_classes=2, epsilon=1.0, rng=np.random.default_rng(0))
    assert eps == 1.0
    assert ratio.shape == (2,) and np.all(ratio >= 0) and ratio.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(ratio, [0.9, 0.1], atol=0.02)


def test_histogram_ratio_reproducible_and_noisy():
    labels = np.array([0, 1, 1, 2])
    a, _ = dp_histogram_ratio(labels, num_classes=3, epsilon=0.5, rng=7)
    b, _ = dp_histogram_ratio(labels, num_classes=3, epsilon=0.5, rng=7)
    c, _ = dp_histogram_ratio(labels, num_classes=3, epsilon=0.5, rng=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_histogram_noise_scale_is_one_over_epsilon():
    # Laplace(1/ε) noise on counts: with 1000 per class, var of class-0 count ≈ 2/ε².
    rng = np.random.default_rng(1)
    labels = np.repeat([0, 1], 1000)
    draws = np.array([dp_histogram_ratio(labels, num_classes=2, epsilon=0.1, rng=rng)[0][0] for _ in range(2000)])
    # ratio ≈ (1000 + X0)/(2000 + X0 + X1): sd ≈ sqrt(2)·10/2000·sqrt(1/2) = 0.005
    assert 0.004 < draws.std() < 0.006


def test_histogram_validation():
    with pytest.raises(ValueError, match="labels"):
        dp_histogram_ratio([0, 3], num_classes=3, epsilon=1.0, rng=0)
    with pytest.raises(ValueError, match="labels must be integers"):
        dp_histogram_ratio([0.5], num_classes=3, epsilon=1.0, rng=0)
    with pytest.raises(ValueError, match="epsilon"):
        dp_histogram_ratio([0], num_classes=3, epsilon=0.0, rng=0)
    with pytest.raises(ValueError, match="num_classes"):
        dp_histogram_ratio([0], num_classes=0, epsilon=1.0, rng=0)


def test_bounds_cover_data_and_stay_in_public_range():
    rng = np.random.default_rng(0)
    values = rng.normal(50.0, 10.0, size=5000)
    covered = 0
    for _ in range(50):
        (lo, hi), eps = dp_bounds(values, epsilon=1.0, rng=rng, lower_guess=-100.0, upper_guess=200.0)
        assert eps == 1.0 and -100.0 <= lo <= hi <= 200.0
        covered += lo <= values.min() and hi >= values.max()
    assert covered >= 45


def test_quantile_median_accurate_with_large_epsilon():
    values = np.random.default_rng(2).uniform(0, 1, 10001)
    med = dp_quantile(values, quantile=0.5, epsilon=5.0, rng=3, lower=0.0, upper=1.0)
    assert abs(med - np.median(values)) < 0.01


def test_bounds_validation():
    with pytest.raises(ValueError, match="lower < upper"):
        dp_bounds([1.0], epsilon=1.0, rng=0, lower_guess=2.0, upper_guess=1.0)
    with pytest.raises(ValueError, match="NaN"):
        dp_bounds([np.nan], epsilon=1.0, rng=0, lower_guess=0.0, upper_guess=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        dp_bounds([1.0], epsilon=-1.0, rng=0, lower_guess=0.0, upper_guess=1.0)
    with pytest.raises(ValueError, match="quantile"):
        dp_quantile([1.0], quantile=2.0, epsilon=1.0, rng=0, lower=0.0, upper=1.0)
