"""Differentially private metadata for tabular data (pure ε-DP).

Each function returns the statistic and the ε it spent, so that the caller can
record a :class:`~lightning_gpate.privacy.accountant.PureDPEvent` with the
same accountant as the generator (G-PATE spends 0.01 of its credit-card budget
on the label ratio, Long et al. 2021, Section 5).

Neighbouring datasets differ by adding or removing one row.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["dp_histogram_ratio", "dp_bounds", "dp_quantile", "metadata_events"]


def _rng(rng) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        raise ValueError("rng is required (a numpy Generator or an int seed)")
    return np.random.default_rng(rng)


def _epsilon(epsilon) -> float:
    epsilon = float(epsilon)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    return epsilon


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def dp_histogram_ratio(labels, *, num_classes: int, epsilon: float, rng) -> tuple[np.ndarray, float]:
    """ε-DP class proportions by the Laplace mechanism (Dwork et al. 2006).

    Counts per class get Lap(1/ε) noise (adding/removing a row changes one
    count by 1: L1 sensitivity 1), are clipped at 0 and normalised; if every
    noisy count is ≤ 0 the uniform ratio is returned. Post-processing keeps ε.

    Args:
        labels: Integer labels in [0, num_classes).
        num_classes: Number of classes.
        epsilon: ε spent (> 0).
        rng: ``numpy.random.Generator`` (or an int seed).

    Returns:
        ``(ratio, epsilon)``: ratio of shape ``[num_classes]`` summing to 1.

    Raises:
        ValueError: On labels outside [0, num_classes), non-integer labels or bad ε.
    """
    epsilon = _epsilon(epsilon)
    if int(num_classes) != num_classes or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes}")
    num_classes = int(num_classes)
    labels = _as_numpy(labels).ravel()
    if labels.size and not np.all(np.mod(labels, 1) == 0):
        raise ValueError("labels must be integers")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{labels.min()}, {labels.max()}]")
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    noisy = np.clip(counts + _rng(rng).laplace(0.0, 1.0 / epsilon, size=num_classes), 0.0, None)
    total = noisy.sum()
    ratio = noisy / total if total > 0 else np.full(num_classes, 1.0 / num_classes)
    return ratio, epsilon


def dp_quantile(values, *, quantile: float, epsilon: float, rng, lower: float, upper: float) -> float:
    """ε-DP quantile by the exponential mechanism (Smith 2011).

    The values are clipped to the public range [lower, upper] and sorted,
    x_0 = lower ≤ x_1 ≤ … ≤ x_n ≤ x_{n+1} = upper. Interval i = [x_i, x_{i+1}]
    has utility u_i = −|i − quantile·n| (sensitivity 1 under add/remove) and is
    chosen with probability ∝ (x_{i+1} − x_i)·exp(ε u_i / 2); the output is
    uniform in the chosen interval.

    Args:
        values: 1-D data.
        quantile: Target quantile in [0, 1].
        epsilon: ε (> 0).
        rng: ``numpy.random.Generator`` (or an int seed).
        lower: Public lower end of the range.
        upper: Public upper end of the range (> lower).

    Returns:
        The DP quantile in [lower, upper].
    """
    epsilon = _epsilon(epsilon)
    lower, upper = float(lower), float(upper)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError(f"need finite lower < upper, got [{lower}, {upper}]")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1], got {quantile}")
    x = _as_numpy(values).astype(np.float64).ravel()
    if np.isnan(x).any():
        raise ValueError("values contain NaN")
    x = np.concatenate([[lower], np.sort(np.clip(x, lower, upper)), [upper]])
    n = x.size - 2
    widths = np.diff(x)
    ranks = np.arange(n + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logw = np.log(widths) - 0.5 * epsilon * np.abs(ranks - quantile * n)
    gen = _rng(rng)
    # Gumbel-max sampling of the interval (log-space, no overflow).
    i = int(np.argmax(logw + gen.gumbel(size=logw.size)))
    return float(gen.uniform(x[i], x[i + 1]))


def dp_bounds(values, *, epsilon: float, rng, lower_guess: float, upper_guess: float) -> tuple[tuple[float, float], float]:
    """ε-DP minimum and maximum of a column, inside a public range.

    Method: two :func:`dp_quantile` calls (exponential mechanism, Smith 2011)
    for the 0- and 1-quantiles over the public range [lower_guess,
    upper_guess], each with ε/2 (sequential composition). With the 0-quantile
    the interval [lower_guess, min(values)] has the best utility, so the DP
    lower bound falls at or below the true minimum with high probability (and
    symmetrically for the maximum): data are rarely clipped, and the bounds are
    at most as loose as the public guesses. Values outside the public range are
    clipped to it first. The pair is sorted.

    Args:
        values: 1-D numeric data.
        epsilon: Total ε (> 0).
        rng: ``numpy.random.Generator`` (or an int seed).
        lower_guess: Public lower end of the range.
        upper_guess: Public upper end of the range (> lower_guess).

    Returns:
        ``((lower, upper), epsilon)``.
    """
    epsilon = _epsilon(epsilon)
    gen = _rng(rng)
    kw = dict(epsilon=epsilon / 2.0, rng=gen, lower=lower_guess, upper=upper_guess)
    lo = dp_quantile(values, quantile=0.0, **kw)
    hi = dp_quantile(values, quantile=1.0, **kw)
    lo, hi = min(lo, hi), max(lo, hi)
    return (lo, hi), epsilon


def metadata_events(costs) -> list:
    """The accountant's events of a data spec's ``metadata_cost`` entries: a pure ε-DP release (the default) is one
    :class:`~lightning_gpate.privacy.accountant.PureDPEvent`; an entry with ``mechanism: exponential`` (the private
    quantile edges) is ``events`` exponential mechanisms of ``epsilon_each`` each, accounted as bounded range."""
    from lightning_gpate.privacy.accountant import ADD_REMOVE, ExponentialMechanismEvent, PureDPEvent

    out = []
    for cost in costs:
        what = str(cost.get("what", "metadata"))
        if cost.get("mechanism") == "exponential":
            if cost.get("neighbouring", ADD_REMOVE) != ADD_REMOVE:
                raise ValueError(f"{what}: an exponential mechanism's metadata is accounted under add/remove only")
            out += [ExponentialMechanismEvent(float(cost["epsilon_each"]), what)] * int(cost["events"])
        else:
            out.append(PureDPEvent(float(cost["epsilon"]), what, neighbouring=cost.get("neighbouring", ADD_REMOVE)))
    return out
