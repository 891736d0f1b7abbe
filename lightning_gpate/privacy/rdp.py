"""Rényi differential privacy (RDP) curves and their conversion to (ε, δ)-DP.

An RDP curve is a vector of RDP values, one per Rényi order λ of a fixed grid
(``orders``). Curves of mechanisms applied to the same data add (Mironov 2017,
Proposition 1), and the total curve converts to (ε, δ)-DP with
:func:`rdp_to_epsilon`.

Mechanisms covered here:

* the Gaussian mechanism (Mironov 2017, Corollary 3),
* pure ε-DP mechanisms (Bun & Steinke 2016, Proposition 3.3),
* subsampled Gaussians (Poisson or without replacement), delegated to
  dp-accounting's ``RdpAccountant`` (Mironov, Talwar & Zhang 2019;
  Wang, Balle & Kasiviswanathan 2019).
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np

__all__ = [
    "DEFAULT_ORDERS",
    "rdp_to_epsilon",
    "gaussian_rdp",
    "pure_dp_rdp",
    "subsampled_gaussian_rdp",
    "validate_orders",
]

#: Reference grid of Rényi orders of G-PATE (Long et al. 2021) and PATE
#: (Papernot et al. 2018): 1.1, 2, 3, ..., 199.
DEFAULT_ORDERS: np.ndarray = np.concatenate([[1.1], np.arange(2, 200, dtype=np.float64)])
DEFAULT_ORDERS.setflags(write=False)

Conversion = Literal["improved", "classic"]
_CONVERSIONS = ("improved", "classic")


def validate_orders(orders) -> np.ndarray:
    """Returns ``orders`` as a 1-D float array, checking that every order is > 1.

    Args:
        orders: Rényi orders (scalar or 1-D array-like).

    Returns:
        A 1-D ``float64`` array.

    Raises:
        ValueError: If the orders are empty, not 1-D, NaN or not all > 1.
    """
    arr = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"orders must be a non-empty 1-D array, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError("orders contain NaN")
    if np.any(arr <= 1.0):
        raise ValueError(f"every Renyi order must be > 1, got min(orders)={arr.min()}")
    return arr


def _validate_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):  # also rejects NaN
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta}")
    return delta


def rdp_to_epsilon(
    rdp,
    orders,
    delta: float,
    *,
    conversion: Conversion = "improved",
) -> tuple[float, float]:
    """Converts an RDP curve into (ε, δ)-DP, minimising over the orders.

    ``conversion="classic"`` is Mironov (2017), Proposition 3::

        ε = min_λ rdp(λ) + ln(1/δ) / (λ − 1)

    (with ε = 0 at an order whose RDP is exactly 0: identical distributions,
    so that an accountant with nothing recorded reports ε = 0).

    ``conversion="improved"`` is the conversion of dp-accounting's
    ``RdpAccountant`` (``dp_accounting.rdp.compute_epsilon``): Canonne, Kamath
    & Steinke (2020), Proposition 12 / Balle et al. (2020), Theorem 21::

        ε = min_λ rdp(λ) + ln((λ − 1)/λ) − (ln δ + ln λ) / (λ − 1),

    applied only for λ > 1.01 (numerically unstable below), with ε = 0 for
    orders where the KL bound already gives δ (δ² > 1 − e^{−rdp}), and the
    result clipped at ≥ 0. It reproduces ``compute_epsilon`` exactly and is
    never larger than the classic bound (for λ > 1.01).

    Args:
        rdp: RDP values, one per order (may contain ``+inf``).
        orders: The Rényi orders (all > 1), same shape as ``rdp``.
        delta: Target δ in (0, 1).
        conversion: ``"improved"`` (default) or ``"classic"``.

    Returns:
        ``(epsilon, best_order)`` as Python floats. ε is ``inf`` if every order
        has infinite RDP.

    Raises:
        ValueError: If δ is outside (0, 1), the shapes differ, values are NaN or
            negative, orders are not > 1, or the conversion is unknown.
    """
    if conversion not in _CONVERSIONS:
        raise ValueError(f"conversion must be one of {_CONVERSIONS}, got {conversion!r}")
    delta = _validate_delta(delta)
    orders = validate_orders(orders)
    rdp = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if rdp.shape != orders.shape:
        raise ValueError(f"rdp shape {rdp.shape} does not match orders shape {orders.shape}")
    if np.isnan(rdp).any():
        raise ValueError("rdp contains NaN")
    if np.any(rdp < 0):
        raise ValueError(f"rdp values must be >= 0, got min(rdp)={rdp.min()}")

    with np.errstate(over="ignore", invalid="ignore"):
        if conversion == "classic":
            eps = rdp + math.log(1.0 / delta) / (orders - 1.0)
            # RDP 0 at an order means identical output distributions: (0, 0)-DP.
            eps = np.where(rdp == 0.0, 0.0, eps)
        else:
            # Mirrors dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon.
            eps = np.where(
                orders > 1.01,
                rdp + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0),
                np.inf,
            )
            kl_ok = delta**2 + np.expm1(-rdp) > 0  # δ ≥ sqrt(1 − e^{−KL})
            eps = np.where(kl_ok, 0.0, eps)
    idx = int(np.argmin(eps))
    return max(0.0, float(eps[idx])), float(orders[idx])


def gaussian_rdp(noise_multiplier: float, orders) -> np.ndarray:
    """RDP of the Gaussian mechanism with L2 sensitivity 1 (Mironov 2017, Cor. 3).

    ``RDP(λ) = λ / (2σ²)``.

    Args:
        noise_multiplier: σ, the noise standard deviation over the sensitivity (> 0).
        orders: Rényi orders (> 1).

    Returns:
        RDP values, shape of ``orders`` (1-D).

    Raises:
        ValueError: If σ is not positive or the orders are invalid.
    """
    sigma = float(noise_multiplier)
    if not sigma > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    orders = validate_orders(orders)
    return orders / (2.0 * sigma**2)


def pure_dp_rdp(epsilon: float, orders) -> np.ndarray:
    """RDP of an ε-DP mechanism: ``min(ε, λε²/2)``.

    ε-DP implies RDP ε at every order (Mironov 2017, Proposition 3 remark) and
    (ε²/2)-zCDP, i.e. RDP λε²/2 (Bun & Steinke 2016, Proposition 3.3).

    Args:
        epsilon: The pure-DP ε (≥ 0).
        orders: Rényi orders (> 1).

    Returns:
        RDP values, shape of ``orders`` (1-D).

    Raises:
        ValueError: If ε is negative, NaN or infinite.
    """
    epsilon = float(epsilon)
    if not (0.0 <= epsilon < math.inf):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    orders = validate_orders(orders)
    return np.minimum(epsilon, orders * epsilon**2 / 2.0)


def exponential_mechanism_rdp(epsilon: float, orders) -> np.ndarray:
    """RDP of an ε-DP exponential mechanism: ``min(ε, λε²/8)``.

    The exponential mechanism with parameter ε (selection probability ∝ exp(ε·q/(2Δ)) for a quality of
    sensitivity Δ) is ε-bounded-range (Durfee & Rogers 2019), and ε-bounded range implies
    (ε²/8)-zCDP (Cesar & Rogers 2021, Lemma 3.2), i.e. RDP λε²/8 at every order λ: four times less
    than the ``λε²/2`` that :func:`pure_dp_rdp` gives any ε-DP mechanism. It is also ε-DP (RDP ε).

    Args:
        epsilon: ε of the exponential mechanism (≥ 0).
        orders: Rényi orders (> 1).

    Returns:
        RDP values, shape of ``orders`` (1-D).
    """
    epsilon = float(epsilon)
    if not (0.0 <= epsilon < math.inf):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    orders = validate_orders(orders)
    return np.minimum(epsilon, orders * epsilon**2 / 8.0)


Sampling = Literal["poisson", "without_replacement"]
Neighboring = Literal["add_remove", "replace_one"]


@functools.lru_cache(maxsize=256)
def _cached_single_step_rdp(
    noise_multiplier: float,
    sampling_rate: float,
    sampling: str,
    orders: tuple[float, ...],
    source_size: int | None,
    sample_size: int | None,
) -> np.ndarray:
    """RDP of ONE subsampled Gaussian step through dp-accounting (cached).

    dp-accounting is a pure-Python per-order loop (seconds for orders up to 199
    without replacement), and training records the same step thousands of
    times, so the per-step curve is cached; composition is linear in the count
    (dp-accounting itself multiplies by ``count`` for a SelfComposedDpEvent).
    """
    import dp_accounting  # deferred: import cost only when used

    NR = dp_accounting.NeighboringRelation
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)
        relation = NR.ADD_OR_REMOVE_ONE
    else:
        if source_size is None:
            # Only the ratio enters the analysis (q = sample_size / source_size).
            event = _wor_event_from_rate(sampling_rate, gaussian)
        else:
            event = dp_accounting.SampledWithoutReplacementDpEvent(
                source_size, sample_size, gaussian
            )
        relation = NR.REPLACE_ONE
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders), neighboring_relation=relation)
    acc.compose(event, 1)
    curve = np.asarray(acc.rdp, dtype=np.float64)  # public property: per-order RDP
    curve.setflags(write=False)
    return curve


def _wor_event_from_rate(rate: float, gaussian):
    """A SampledWithoutReplacementDpEvent whose sample_size/source_size equals ``rate``.

    dp-accounting only uses the ratio; a rational approximation with a large
    denominator keeps it exact for rates such as 1/N or B/N.
    """
    import dp_accounting
    from fractions import Fraction

    frac = Fraction(rate).limit_denominator(10**12)
    return dp_accounting.SampledWithoutReplacementDpEvent(
        frac.denominator, frac.numerator, gaussian
    )


def subsampled_gaussian_rdp(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    orders,
    sampling: Sampling = "poisson",
    neighboring: Neighboring = "add_remove",
) -> np.ndarray:
    """RDP of ``steps`` compositions of a subsampled Gaussian, via dp-accounting.

    Composes ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), steps)``
    (Mironov, Talwar & Zhang 2019) or, for sampling without replacement,
    ``SampledWithoutReplacementDpEvent`` (Wang, Balle & Kasiviswanathan 2019,
    Theorem 27) on a dp-accounting ``RdpAccountant`` built on ``orders`` and
    reads its per-order RDP. dp-accounting supports Poisson sampling with the
    add/remove relation and sampling without replacement with replace-one; the
    other combinations raise ``ValueError``.

    Args:
        noise_multiplier: σ of the Gaussian relative to the L2 sensitivity (> 0).
        sampling_rate: q in [0, 1] (batch / dataset, or 1/N_D for GS-WGAN).
        steps: Number of compositions (≥ 0).
        orders: Rényi orders (> 1).
        sampling: ``"poisson"`` or ``"without_replacement"``.
        neighboring: ``"add_remove"`` or ``"replace_one"``.

    Returns:
        Total RDP, shape of ``orders`` (1-D).

    Raises:
        ValueError: On invalid parameters or an unsupported sampling/neighbouring pair.
    """
    sigma = float(noise_multiplier)
    if not sigma > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    q = float(sampling_rate)
    if not (0.0 <= q <= 1.0):
        raise ValueError(f"sampling_rate must lie in [0, 1], got {sampling_rate}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps}")
    if sampling not in ("poisson", "without_replacement"):
        raise ValueError(f"sampling must be 'poisson' or 'without_replacement', got {sampling!r}")
    if neighboring not in ("add_remove", "replace_one"):
        raise ValueError(f"neighboring must be 'add_remove' or 'replace_one', got {neighboring!r}")
    expected = "add_remove" if sampling == "poisson" else "replace_one"
    if neighboring != expected:
        raise ValueError(
            f"dp-accounting's RdpAccountant supports sampling={sampling!r} only with "
            f"neighboring={expected!r}, got {neighboring!r}"
        )
    orders = validate_orders(orders)
    if steps == 0 or q == 0.0:
        return np.zeros_like(orders)
    step = _cached_single_step_rdp(sigma, q, sampling, tuple(orders.tolist()), None, None)
    return int(steps) * step
