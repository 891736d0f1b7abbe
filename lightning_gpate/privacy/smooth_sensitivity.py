"""Smooth-sensitivity release of data-dependent PATE costs (Papernot et al., ICLR 2018, Section 4,
Appendices B–D; arXiv 1802.08908).

The data-dependent RDP of PATE queries (Theorem 6 / Proposition 10 of that paper; the moments
bound of Papernot et al. 2017 for Laplace votes) is much smaller than the data-independent bound
when teachers agree, but it is a function of the private vote histograms: publishing it leaks them.
Section 4 makes it publishable. At one Rényi order λ fixed in advance:

1. every query's data-dependent RDP ``β_i(D)`` gets local-sensitivity bounds at distance ``d``:
   ``LS_i(d) ≥ max |β_i(D') − β_i(D'')|`` over ``D'`` with at most ``d`` teachers changed and ``D''`` a
   neighbour of ``D'`` (Appendix B: threshold step from a table over ``max(h)``; GNMax by
   Algorithms 3–5 and Proposition 13);
2. the run's total ``β(D) = Σ_i β_i(D)`` has ``LS(d) ≤ Σ_i LS_i(d)`` and the smooth sensitivity
   ``SS_β(D) = max_{d ≥ 0} e^{−βd} LS(d)`` (Nissim, Raskhodnikova & Smith 2007);
3. the Gaussian noise with smooth sensitivity (GNSS) mechanism releases ``β(D) + SS_β(D)·σ_ss·Z``,
   ``Z ~ N(0, 1)``, and costs ``λe^{2β}/σ_ss² + (−½ln(1 − 2λβ) + βλ)/(λ − 1)`` at ``1 < λ < 1/(2β)``
   (Theorem 23). The released RDP at λ is the noisy sum plus that cost plus every data-independent
   cost at λ (e.g. DP metadata); it converts to (ε, δ) as any RDP value does.

Three points where this module is more careful than the published code (``research/pate_2018`` in
``tensorflow/privacy``), each making a bound larger, never smaller:

* ``ln(1 − p)`` of the threshold step comes from ``log_ndtr`` (:func:`~.pate.threshold_logq`), so a
  query far above the threshold keeps its tiny positive cost where ``core.py`` underflows to 0.
* A changed teacher may leave a query's histogram unchanged, so a dataset at distance ``d`` moves
  every query by *at most* ``d``; summing per-query bounds therefore needs the maximum over the ball
  of radius ``d`` (the running maximum over distances ≤ d). The reference's threshold bound is the
  maximum at distance *exactly* ``d`` (:func:`threshold_local_sensitivity_bounds` with
  ``ball=False`` reproduces it); for GNMax the two coincide (the walk of Algorithms 4–5 increases).
* Distances run over ``0…n`` (``n`` teachers, all of them changed), one more than the reference's
  ``0…n−1``.

Everything is batched with numpy: the threshold step's bound depends only on ``round(max h)``, so a
run keeps a count per value (:class:`ConfidentGNMaxLedger`); GNMax walks are run once per distinct
sorted histogram of a batch, vectorised across histograms; a ledger holds per-distance sums and never
the votes. A ledger is private state (training checkpoint only); only a :class:`GNSSRelease` leaves a run.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtri_exp

from .pate import (
    _laplace_alpha,
    _log1mexp,
    _to_numpy,
    _validate_gaps,
    _validate_votes,
    gaussian_rdp_given_logq,
    gnmax_logq,
    threshold_logq,
)
from .rdp import pure_dp_rdp, rdp_to_epsilon

__all__ = [
    "gnss_rdp",
    "gnss_rdp_curve",
    "GNSSParameters",
    "default_gnss_parameters",
    "smooth_sensitivity",
    "ball_maximum",
    "gnmax_rdp_at_order",
    "gnmax_logq0",
    "gnmax_logq1",
    "gnmax_conditions",
    "gnmax_local_sensitivity",
    "gnmax_local_sensitivity_bounds",
    "threshold_rdp_table",
    "threshold_local_sensitivity_table",
    "threshold_local_sensitivity_bounds",
    "laplace_rdp_table",
    "laplace_local_sensitivity_bounds",
    "walk_horizon",
    "ConfidentGNMaxLedger",
    "LaplaceVoteLedger",
    "GNSSRelease",
    "release",
    "ledger_from_state",
    "SmoothSensitivityAccountant",
]


def _positive(name: str, value) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _order(order) -> float:
    order = float(order)
    if not (order > 1 and math.isfinite(order)):
        raise ValueError(f"the Renyi order must be a finite number > 1, got {order}")
    return order


def _teachers(num_teachers) -> int:
    if int(num_teachers) != num_teachers or num_teachers < 1:
        raise ValueError(f"num_teachers must be an integer >= 1, got {num_teachers}")
    return int(num_teachers)


# --------------------------------------------------------------------------------------
# GNSS (Theorem 23) and its parameters
# --------------------------------------------------------------------------------------


def gnss_rdp(*, beta: float, sigma: float, order: float) -> float:
    """RDP at ``order`` of the GNSS mechanism ``f(D) + S(D)·σ·N(0, 1)`` with ``S`` a β-smooth upper
    bound on the local sensitivity of ``f`` (Papernot et al. 2018, Theorem 23)::

        λ e^{2β} / σ² + (−½ ln(1 − 2λβ) + βλ) / (λ − 1),   1 < λ < 1/(2β).

    Args:
        beta: β ≥ 0, the smoothness of ``S``.
        sigma: σ > 0, the noise multiplier of ``S``.
        order: λ, with ``1 < λ < 1/(2β)``.

    Raises:
        ValueError: outside that range.
    """
    beta, sigma, order = float(beta), _positive("sigma", sigma), _order(order)
    if not (beta >= 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    if beta > 0 and not order < 1.0 / (2.0 * beta):
        raise ValueError(f"GNSS needs 1 < order < 1/(2*beta) = {1 / (2 * beta):.6g}, got order={order:g}")
    return order * math.exp(2.0 * beta) / sigma**2 + (-0.5 * math.log1p(-2.0 * order * beta) + beta * order) / (order - 1.0)


def gnss_rdp_curve(*, beta: float, sigma: float, orders) -> np.ndarray:
    """:func:`gnss_rdp` on a grid of orders, ``inf`` where ``λ ≥ 1/(2β)`` (no bound there)."""
    orders = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    limit = math.inf if beta == 0 else 1.0 / (2.0 * beta)
    return np.array([gnss_rdp(beta=beta, sigma=sigma, order=o) if o < limit else math.inf for o in orders])


@dataclass(frozen=True)
class GNSSParameters:
    """The parameters of a smooth-sensitivity release, fixed before training (public).

    Attributes:
        order: λ, the Rényi order at which the data-dependent cost is released.
        beta: β, the smoothness (``0 < β < 1/(2λ)``).
        sigma: σ_ss, the GNSS noise multiplier: the release adds ``SS_β·σ_ss·N(0, 1)``.
        rule: how they were chosen (``"config"`` or ``"default"``).
    """

    order: float
    beta: float
    sigma: float
    rule: str = "config"

    def __post_init__(self):
        _order(self.order)
        _positive("beta", self.beta)
        _positive("sigma", self.sigma)
        gnss_rdp(beta=self.beta, sigma=self.sigma, order=self.order)  # validates 1 < λ < 1/(2β)

    @property
    def cost(self) -> float:
        """The GNSS RDP at ``order`` (Theorem 23)."""
        return gnss_rdp(beta=self.beta, sigma=self.sigma, order=self.order)

    def rdp_curve(self, orders) -> np.ndarray:
        """GNSS RDP on ``orders`` (``inf`` at orders ≥ 1/(2β)): what the release costs at every order,
        for the data-independent bound of everything a run releases."""
        return gnss_rdp_curve(beta=self.beta, sigma=self.sigma, orders=orders)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: β = BETA_FRACTION / λ in the default rule (the reference's search range is 0.3/λ … 0.495/λ).
BETA_FRACTION = 0.4
#: Default rule: the conversion term and GNSS's β-term take this fraction of the target ε ...
DEFAULT_FIXED_SHARE = 0.5
#: ... and GNSS's noise term λe^{2β}/σ_ss² this fraction.
DEFAULT_NOISE_SHARE = 0.1


def _conversion_epsilon(rdp: float, order: float, delta: float, conversion: str) -> float:
    return rdp_to_epsilon(np.array([rdp]), np.array([order]), delta, conversion=conversion)[0]


def default_gnss_parameters(*, epsilon: float, delta: float, conversion: str = "improved",
                            order: float | None = None, beta: float | None = None,
                            sigma: float | None = None) -> GNSSParameters:
    """The data-independent rule that fixes (λ, β, σ_ss) from the target (ε, δ) before training.

    Unset values follow the rule (given ones are kept; all are public):

    * β = 0.4/λ (inside the reference's search range 0.3/λ … 0.495/λ; GNSS needs β < 1/(2λ));
    * λ solves ``ε_conv(λ) + (−½ln(1 − 0.8) + 0.4)/(λ − 1) = ε/2``: converting RDP at λ to (ε, δ)
      plus GNSS's β-term take half of the target (``ε_conv`` is the RDP → (ε, δ) conversion of
      RDP 0 at λ, e.g. ``ln(1/δ)/(λ − 1)`` for the classic one);
    * σ_ss makes GNSS's noise term ``λe^{2β}/σ_ss²`` a tenth of the target.

    The rest, 0.4ε, is left for the data-dependent cost and the noise. ``lightning-gpate plan``
    estimates better values from public data (they are public too).

    Args:
        epsilon: the target ε the released ε must meet.
        delta: δ.
        conversion: the RDP → (ε, δ) conversion of the accountant.
        order, beta, sigma: values fixed by the user (``None``: by the rule).
    """
    epsilon, delta = _positive("epsilon", epsilon), float(delta)
    rule = "config" if None not in (order, beta, sigma) else "default"
    if order is None:
        frac = BETA_FRACTION if beta is None else None

        def excess(lam: float) -> float:
            b = frac / lam if frac is not None else beta
            if b >= 1.0 / (2.0 * lam):
                return math.inf
            fixed = _conversion_epsilon(0.0, lam, delta, conversion) if lam > 1.01 else math.inf
            if fixed == 0.0:  # the improved conversion gives 0 where the KL bound already gives δ
                fixed = math.log(1.0 / delta) / (lam - 1.0)
            return fixed + (-0.5 * math.log1p(-2.0 * lam * b) + b * lam) / (lam - 1.0) - DEFAULT_FIXED_SHARE * epsilon

        lo, hi = 1.02, 2.0
        while excess(hi) > 0:
            lo, hi = hi, hi * 2.0
            if hi > 1e6:
                raise ValueError(f"no Renyi order fits the target epsilon={epsilon:g} (delta={delta:g})")
        if excess(lo) <= 0:
            order = lo
        else:
            order = brentq(lambda x: excess(x) if math.isfinite(excess(x)) else 1e300, lo, hi, xtol=1e-9)
    order = _order(order)
    if beta is None:
        beta = BETA_FRACTION / order
    if sigma is None:
        sigma = math.sqrt(order * math.exp(2.0 * beta) / (DEFAULT_NOISE_SHARE * epsilon))
    return GNSSParameters(order=float(order), beta=float(beta), sigma=float(sigma), rule=rule)


# --------------------------------------------------------------------------------------
# Smooth sensitivity from local sensitivity at distances
# --------------------------------------------------------------------------------------


def smooth_sensitivity(local_sensitivity, beta: float) -> float:
    """``max_d e^{−βd} LS(d)`` over the distances ``d = 0, 1, …`` of ``local_sensitivity``.

    With ``LS(d)`` an upper bound on the local sensitivity of every dataset within distance ``d``
    (non-decreasing in ``d``) this is a β-smooth upper bound on the local sensitivity (Nissim,
    Raskhodnikova & Smith 2007, Definition 2.1/Lemma 2.3): the distances past the end are covered
    by the last entry, which must be the bound for every distance.
    """
    ls = np.asarray(local_sensitivity, dtype=np.float64)
    if ls.ndim != 1 or ls.size == 0:
        raise ValueError(f"local_sensitivity must be a non-empty 1-D array, got shape {ls.shape}")
    beta = float(beta)
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    return float(np.max(ls * np.exp(-beta * np.arange(ls.size))))


def ball_maximum(values: np.ndarray, center: int, size: int | None = None) -> np.ndarray:
    """``out[d] = max(values[max(0, c−d) : c+d+1])`` for ``d = 0 … size−1`` (default ``len(values)``):
    the maximum of a table over the values a statistic can take within ``d`` unit steps of ``c``."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    size = n if size is None else int(size)
    c = int(center)
    right = np.maximum.accumulate(values[c:])
    left = np.maximum.accumulate(values[c::-1])
    out = np.empty(size)
    out_r = right[np.minimum(np.arange(size), right.size - 1)]
    out_l = left[np.minimum(np.arange(size), left.size - 1)]
    np.maximum(out_r, out_l, out=out)
    return out


def _ball_sum(table: np.ndarray, counts: np.ndarray, size: int) -> np.ndarray:
    """``Σ_c counts[c] · ball_maximum(table, c)[0:size]`` (per-distance sum of tabulated bounds)."""
    total = np.zeros(size)
    for c in np.flatnonzero(counts):
        total += counts[c] * ball_maximum(table, c, size)
    return total


# --------------------------------------------------------------------------------------
# GNMax (Appendix B.4: Algorithms 3-5, Proposition 13)
# --------------------------------------------------------------------------------------


def _gnmax_dep_bound(logq: np.ndarray, sigma: float, order: float) -> np.ndarray:
    """Theorem 6 with the orders of Proposition 10, without its preconditions (the caller applies
    it only below ln q0, where they hold). ``ln q = −inf`` (a fixed output) gives 0."""
    logq = np.asarray(logq, dtype=np.float64)
    var = sigma**2
    out = np.zeros(logq.shape)
    fin = np.isfinite(logq)
    lq = logq[fin]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = sigma * np.sqrt(-lq)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / var, mu2 / var
        log1q = _log1mexp(lq)
        inner = np.minimum((lq + eps2) * (1.0 - 1.0 / mu2), 0.0)
        log_a = (order - 1.0) * (log1q - _log1mexp(inner))
        log_b = (order - 1.0) * (eps1 - lq / (mu1 - 1.0))
        out[fin] = np.logaddexp(log1q + log_a, lq + log_b) / (order - 1.0)
    return out


@functools.lru_cache(maxsize=512)
def gnmax_logq0(sigma: float, order: float) -> float:
    """ln q0: below it the data-dependent bound of Theorem 6 is smaller than the data-independent
    ``λ/σ²`` and valid (Papernot et al. 2018, Appendix B.4; ``compute_logq0_gnmax`` of the reference).

    Brackets the crossing between the natural upper bound
    ``min(−(1 + 1/σ)², −((λ − 0.99)/σ)², −1/σ²)`` and a lower bound found by scaling by 1.5, then
    solves with Brent's method. ``-inf`` when the data-dependent bound never wins (then GNMax's cost
    is data-independent and its local sensitivity 0).
    """
    sigma, order = _positive("sigma", sigma), _order(order)
    ind = order / sigma**2

    def gap(lq: float) -> float:
        return float(_gnmax_dep_bound(np.array([lq]), sigma, order)[0]) - ind

    def valid(lq: float) -> bool:
        mu2 = sigma * math.sqrt(-lq)
        mu1 = mu2 + 1.0
        if mu1 < order or mu2 <= 1.0:
            return False
        eps2 = mu2 / sigma**2
        return lq <= (mu2 - 1.0) * eps2 - mu2 * math.log(mu1 / (mu1 - 1.0) * mu2 / (mu2 - 1.0))

    logub = min(-((1.0 + 1.0 / sigma) ** 2), -(((order - 0.99) / sigma) ** 2), -1.0 / sigma**2)
    if not valid(logub):
        raise ValueError(f"Theorem 6 does not apply at the bracket ln q = {logub:g} (sigma={sigma:g}, order={order:g})")
    if gap(logub) < 0:
        return logub
    loglb = 2.0 * logub
    while gap(loglb) > 0:
        loglb *= 1.5
        if loglb < -1e15:
            return -math.inf
    logq0 = brentq(gap, loglb, logub, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)
    if not valid(logq0):
        raise ValueError(f"Theorem 6 does not apply at ln q0 = {logq0:g} (sigma={sigma:g}, order={order:g})")
    return float(logq0)


def _log_bl(logq: np.ndarray, sigma: float, num_classes: int) -> np.ndarray:
    """ln b_l(q), b_l(q) = (m−1)/2 · erfc(erfcinv(2q/(m−1)) + 1/σ): the smallest q of a neighbour
    (Appendix B.4, Proposition 13), in log space (``erfcinv(y) = −ndtri(y/2)/√2``)."""
    x = -ndtri_exp(np.asarray(logq, dtype=np.float64) - math.log(num_classes - 1)) / math.sqrt(2.0)
    return math.log(num_classes - 1) + log_ndtr(-math.sqrt(2.0) * (x + 1.0 / sigma))


def _log_bu(logq: np.ndarray, sigma: float, num_classes: int) -> np.ndarray:
    """ln b_u(q), b_u(q) = min(1, (m−1)/2 · erfc(erfcinv(2q/(m−1)) − 1/σ)): the largest q of a neighbour."""
    x = -ndtri_exp(np.asarray(logq, dtype=np.float64) - math.log(num_classes - 1)) / math.sqrt(2.0)
    return np.minimum(0.0, math.log(num_classes - 1) + log_ndtr(-math.sqrt(2.0) * (x - 1.0 / sigma)))


@functools.lru_cache(maxsize=512)
def gnmax_logq1(sigma: float, order: float, num_classes: int) -> float:
    """ln q1 = ln b_l(q0): queries with ln q in [ln q1, ln q0] all have the largest local
    sensitivity (the plateau of Algorithm 3)."""
    if num_classes < 2:
        raise ValueError(f"GNMax needs at least 2 classes, got {num_classes}")
    logq0 = gnmax_logq0(sigma, order)
    if not math.isfinite(logq0):
        return -math.inf
    return float(_log_bl(np.array([logq0]), sigma, num_classes)[0])


def gnmax_rdp_at_order(logq, sigma: float, order: float) -> np.ndarray:
    """β(q), GNMax's RDP at ``order`` as the smooth-sensitivity analysis defines it: the
    data-independent ``λ/σ²`` for ``ln q ≥ ln q0``, Theorem 6 below (``_compute_rdp_gnmax`` of the
    reference). Equal to :func:`~.pate.gaussian_rdp_given_logq` at that order up to the root's precision."""
    sigma, order = _positive("sigma", sigma), _order(order)
    logq = np.asarray(logq, dtype=np.float64)
    logq0 = gnmax_logq0(sigma, order)
    return _floor_positive(np.where(logq >= logq0, order / sigma**2, _gnmax_dep_bound(logq, sigma, order)), logq)


_NUDGE = 1e-11


def gnmax_local_sensitivity(logq, sigma: float, num_classes: int, order: float) -> np.ndarray:
    """Algorithm 3: an upper bound on GNMax's local sensitivity as a function of ln q,
    ``max(β(b_u(q)) − β(q), β(q) − β(b_l(q)))``, with ln q in [ln q1, ln q0] moved to ln q1
    (Proposition 13). Vectorised over ``logq``."""
    sigma, order = _positive("sigma", sigma), _order(order)
    logq = np.asarray(logq, dtype=np.float64)
    logq0 = gnmax_logq0(sigma, order)
    logq1 = gnmax_logq1(sigma, order, num_classes)
    if not math.isfinite(logq0):
        return np.zeros(logq.shape)
    lq = np.where((logq >= logq1) & (logq <= logq0), logq1, logq)
    beta = gnmax_rdp_at_order(lq, sigma, order)
    # β is non-decreasing in q and jumps to λ/σ² at q0, and b_u(b_l(q0)) = q0 exactly: a rounding
    # error must not drop b_u's q below q0. Nudging b_u's ln q up and b_l's down by 1e-11 relative
    # can only raise the bound.
    log_bu = _log_bu(lq, sigma, num_classes)
    log_bl = _log_bl(lq, sigma, num_classes)
    up = gnmax_rdp_at_order(np.minimum(log_bu + _NUDGE * np.abs(log_bu), 0.0), sigma, order)
    down = gnmax_rdp_at_order(log_bl - _NUDGE * np.abs(log_bl), sigma, order)
    return np.maximum(up - beta, beta - down)


@functools.lru_cache(maxsize=512)
def gnmax_conditions(sigma: float, num_classes: int, order: float) -> tuple[bool, bool]:
    """Conditions C5 and C6 of Papernot et al. (2018), Appendix B.4.2, under which Algorithm 3's
    bound is valid (Proposition 13): C5, Theorem 6's β(q) is non-decreasing on (0, q0); C6,
    ``β(b_u(q)) − β(q)`` is non-decreasing on (0, b_l(q0)).

    The reference (``check_conditions``) minimises the symbolic derivative numerically; here both
    functions are evaluated on a dense grid of ln q (20 001 points from ln q0, resp. ln b_l(q0), down
    to 10⁴ times it) and every increment must be ≥ −1e-12 relative to the largest value.
    ``(True, True)`` when the data-dependent bound never applies (ln q0 = −inf).
    """
    sigma, order = _positive("sigma", sigma), _order(order)
    logq0 = gnmax_logq0(sigma, order)
    if not math.isfinite(logq0):
        return True, True

    def non_decreasing(values: np.ndarray) -> bool:
        scale = max(float(np.max(np.abs(values))), 1e-300)
        return bool(np.all(np.diff(values) >= -1e-12 * scale))

    grid = -np.geomspace(1e4, 1.0, 20001)  # ascending ln q / |ln q_top|
    lq = grid * -logq0
    cond5 = non_decreasing(_gnmax_dep_bound(lq, sigma, order))
    if not cond5:
        return False, False
    logq1 = gnmax_logq1(sigma, order, num_classes)
    lq = grid * -logq1
    delta = _gnmax_dep_bound(_log_bu(lq, sigma, num_classes), sigma, order) - _gnmax_dep_bound(lq, sigma, order)
    return True, non_decreasing(delta)


@functools.lru_cache(maxsize=64)
def _log_tail_table(sigma: float, max_gap: int) -> np.ndarray:
    """``ln Φ̄(g/(√2σ))`` for the integer gaps ``g = 0 … max_gap``."""
    return log_ndtr(-np.arange(max_gap + 1) / (math.sqrt(2.0) * sigma))


def _integer_gnmax_logq(hist: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`~.pate.gnmax_logq` of integer histograms ``[..., B]`` (no validation), from a table of
    ``ln Φ̄`` over the integer gaps and a log-sum-exp over the classes but one argmax."""
    m = hist.shape[-1]
    top_idx = hist.argmax(axis=-1)
    top = np.take_along_axis(hist, top_idx[..., None], axis=-1)
    gaps = (top - hist).astype(np.int64)
    log_sf = _log_tail_table(float(sigma), int(gaps.max(initial=0)))[gaps]
    np.put_along_axis(log_sf, top_idx[..., None], -np.inf, axis=-1)
    peak = log_sf.max(axis=-1, keepdims=True)
    logq = peak[..., 0] + np.log(np.exp(log_sf - peak).sum(axis=-1))
    return np.minimum(logq, math.log1p(-1.0 / m))


def _walked_histograms(v: np.ndarray, left: np.ndarray, ds: np.ndarray) -> np.ndarray:
    """The histograms at distances ``ds`` along the walks of Algorithms 4–5, ``[rows, len(ds), B]``.

    Going right (``left`` False) ``d`` votes have moved from the top class to the runner-up.
    Going left the top class has gained ``d`` votes, each taken from the largest of the others (the
    reference's bubble sort after every step): the largest ``j`` others are levelled, with ``F_j``
    the votes it takes to bring them down to the ``j``-th largest, ``j`` the largest with ``F_j ≤ d``.
    Only the multiset matters (ln q is symmetric in the classes); the result is not re-sorted.
    """
    u, m = v.shape
    dd = ds[None, :].astype(np.float64)
    out = np.repeat(v[:, None, :], len(ds), axis=1)
    out[:, :, 0] += np.where(left[:, None], dd, -dd)
    right = ~left
    out[right, :, 1] += dd[0][None, :]
    if left.any() and m > 1:
        rest = v[left, 1:]  # [L, m-1], non-increasing
        k = np.arange(1, m)  # j = 1 .. m-1
        F = np.cumsum(rest, axis=1) - k[None, :] * rest  # F_j = Σ_{i<j} (r_i − r_j)
        dl = np.broadcast_to(dd, (rest.shape[0], len(ds)))
        j = (F[:, None, :] <= dl[:, :, None]).sum(axis=2)  # [L, D], in 1 .. m-1
        Fj = np.take_along_axis(F, j - 1, axis=1)
        rj = np.take_along_axis(rest, j - 1, axis=1)
        taken = dl - Fj
        level = rj - np.floor(taken / j)
        lower = taken - np.floor(taken / j) * j  # this many of the levelled ones are one below
        idx = k[None, None, :]  # position 1 .. m-1 in the rest
        new_rest = np.where(idx <= j[:, :, None],
                            level[:, :, None] - (idx > (j - lower)[:, :, None]),
                            rest[:, None, :])
        out[left, :, 1:] = new_rest
    return out


def _gnmax_walk_values(sorted_votes: np.ndarray, sigma: float, order: float, max_distance: int, chunk: int = 128):
    """Local-sensitivity bounds along the walks of Algorithms 4–5 (Papernot et al. 2018,
    Appendix B.4; the reference's ``compute_local_sensitivity_bounds_gnmax``), for distinct
    histograms sorted in non-increasing order.

    From ln q > ln q0 ("go left") a vote moves from the runner-up to the top class per step
    (decreasing q) while ln q > ln q0 and the runner-up has votes; from ln q < ln q1 ("go right") one
    moves from the top class to the runner-up (increasing q) while ln q < ln q1; histograms with
    ln q in [ln q1, ln q0] have the plateau value at every distance, as does every distance past a
    walk's end. Computed ``chunk`` distances at a time, vectorised over histograms and distances.

    Returns:
        ``(values, length)``: ``values[i, d]`` the bound of histogram i at distance d for
        ``d < length[i]`` (NaN elsewhere; ``length`` 0 for the plateau histograms).
    """
    v = np.asarray(sorted_votes, dtype=np.float64)
    u, m = v.shape
    logq0 = gnmax_logq0(sigma, order)
    logq1 = gnmax_logq1(sigma, order, m)
    logq = gnmax_logq(v, sigma)
    walking = ~((logq >= logq1) & (logq <= logq0))
    length = np.zeros(u, dtype=np.int64)
    rows = np.flatnonzero(walking)
    if rows.size == 0:
        return np.full((u, 0), np.nan), length
    left = logq[rows] > logq0
    blocks = []
    alive = np.ones(rows.size, dtype=bool)  # still walking at the start of the chunk
    start = 0
    while alive.any() and start <= max_distance:
        ds = np.arange(start, min(start + chunk, max_distance + 1))
        hist = np.maximum(_walked_histograms(v[rows], left, ds), 0.0)  # [R, D, m]; < 0 only past a walk's end
        lq = _integer_gnmax_logq(hist, sigma)
        runner_up = hist[:, :, 1:].max(axis=2) if m > 1 else np.zeros(lq.shape)
        # the walk records distance d iff it went on after every distance before d
        go_on = np.where(left[:, None], (lq > logq0) & (runner_up > 0), lq < logq1)
        recorded = np.concatenate([alive[:, None], np.cumprod(go_on[:, :-1], axis=1).astype(bool) & alive[:, None]], axis=1)
        values = np.full(lq.shape, np.nan)
        values[recorded] = gnmax_local_sensitivity(lq[recorded], sigma, m, order)
        blocks.append(values)
        length[rows] += recorded.sum(axis=1)
        alive = recorded[:, -1] & go_on[:, -1]
        start += len(ds)
    out = np.full((u, start), np.nan)
    out[rows] = np.concatenate(blocks, axis=1)
    width = int(length.max())
    return out[:, :width], length


def _sorted_votes(votes, num_teachers: int) -> np.ndarray:
    votes = _validate_votes(votes)
    if votes.shape[1] < 2:
        raise ValueError("GNMax smooth sensitivity needs at least 2 bins")
    if np.any(votes != np.round(votes)):
        raise ValueError("GNMax smooth sensitivity needs integer vote counts")
    if np.any(votes.sum(axis=1) > num_teachers):
        raise ValueError(f"a histogram has more than num_teachers={num_teachers} votes")
    return -np.sort(-votes, axis=1)


def gnmax_local_sensitivity_bounds(votes, num_teachers: int, sigma: float, order: float, *,
                                   ball: bool = True) -> np.ndarray:
    """Local-sensitivity bounds of GNMax's RDP at ``order`` at distances ``d = 0 … n`` (Algorithms 4–5).

    ``ball=False`` returns the values along the walk (the reference's
    ``compute_local_sensitivity_bounds_gnmax``, which stops at ``n − 1``); ``ball=True`` their running
    maximum, an upper bound for every histogram within distance ``d`` (what sums over queries need).

    Args:
        votes: ``[n_queries, n_bins]`` (or one ``[n_bins]``) integer vote histograms.
        num_teachers: n.
        sigma: σ2 of GNMax.
        order: λ.

    Returns:
        ``[n_queries, n + 1]`` (or ``[n + 1]`` for one histogram).
    """
    n = _teachers(num_teachers)
    single = np.ndim(_to_numpy(votes)) == 1
    v = _sorted_votes(np.atleast_2d(_to_numpy(votes)), n)
    sigma, order = _positive("sigma", sigma), _order(order)
    plateau = float(gnmax_local_sensitivity(np.array([gnmax_logq1(sigma, order, v.shape[1])]), sigma, v.shape[1], order)[0])
    out = np.full((v.shape[0], n + 1), plateau)
    values, length = _gnmax_walk_values(v, sigma, order, n)
    walked = ~np.isnan(values)
    out[:, : values.shape[1]][walked] = values[walked]
    if ball:
        out = np.maximum.accumulate(out, axis=1)
    return out[0] if single else out


# --------------------------------------------------------------------------------------
# Threshold step (Appendix B.4.1: a table over max(h))
# --------------------------------------------------------------------------------------


def threshold_rdp_table(num_teachers: int, threshold: float, sigma: float, order: float) -> np.ndarray:
    """RDP at ``order`` of the threshold check for ``round(max h) = v``, ``v = 0 … n``: Theorem 6
    with q_t = min(p, 1 − p), p = Φ̄((T − v)/σ1), noise √2·σ1 (sensitivity 1), capped by λ/(2σ1²)."""
    n = _teachers(num_teachers)
    sigma, order = _positive("sigma", sigma), _order(order)
    v = np.arange(n + 1, dtype=np.float64)[:, None]
    lq = threshold_logq(v, threshold, sigma)
    rdp = np.minimum(gaussian_rdp_given_logq(lq, math.sqrt(2.0) * sigma, [order])[:, 0], order / (2.0 * sigma**2))
    return _floor_positive(rdp, lq)


def _floor_positive(rdp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """A mechanism whose output is not fixed (finite ln q) has a positive cost: a value that
    underflowed to 0 becomes the smallest positive double, so every entry stays an upper bound."""
    return np.where(np.isfinite(logq), np.maximum(rdp, _TINY), rdp)


_TINY = float(np.nextafter(0.0, 1.0))


def threshold_local_sensitivity_table(num_teachers: int, threshold: float, sigma: float, order: float) -> np.ndarray:
    """``L(v) = max(|r(v−1) − r(v)|, |r(v+1) − r(v)|)`` for ``v = 0 … n``: one teacher moves
    ``max h`` by at most one."""
    return _neighbour_differences(threshold_rdp_table(num_teachers, threshold, sigma, order))


def threshold_local_sensitivity_bounds(votes, num_teachers: int, threshold: float, sigma: float, order: float, *,
                                       ball: bool = True) -> np.ndarray:
    """Local-sensitivity bounds of the threshold step's RDP at distances ``d = 0 … n``.

    ``ball=False``: the maximum of ``L`` at ``max h ± d`` exactly (the reference's
    ``compute_local_sensitivity_bounds_threshold``, 0 past both ends); ``ball=True``: over
    ``|v − max h| ≤ d``, an upper bound for every histogram within distance ``d``.

    Returns:
        ``[n_queries, n + 1]`` (or ``[n + 1]`` for one histogram).
    """
    n = _teachers(num_teachers)
    single = np.ndim(_to_numpy(votes)) == 1
    votes = _validate_votes(np.atleast_2d(_to_numpy(votes)))
    table = threshold_local_sensitivity_table(n, threshold, sigma, order)
    centers = np.clip(np.round(votes.max(axis=1)).astype(int), 0, n)
    out = np.zeros((len(centers), n + 1))
    d = np.arange(n + 1)
    for i, c in enumerate(centers):
        if ball:
            out[i] = ball_maximum(table, c, n + 1)
        else:
            up = np.where(c + d <= n, table[np.minimum(c + d, n)], 0.0)
            down = np.where(c - d >= 0, table[np.maximum(c - d, 0)], 0.0)
            out[i] = np.maximum(up, down)
    return out[0] if single else out


# --------------------------------------------------------------------------------------
# PATE-GAN's Laplace votes (moments bound of Papernot et al. 2017, Theorem 3)
# --------------------------------------------------------------------------------------


def laplace_rdp_table(num_teachers: int, lam: float, order: float) -> np.ndarray:
    """RDP at ``order`` of one two-class Laplace vote ``argmax(n_j + Lap(1/λ))`` for every gap
    ``|n0 − n1| = g`` with ``g ≡ n (mod 2)``, ``g = n mod 2, …, n`` (ascending): the data-dependent
    bound of :func:`~.pate.laplace_vote_rdp` (Theorem 3 of Papernot et al. 2017, capped by the
    2λ-DP bound ``min(2λ, 2λ²·order)``). One changed teacher moves ``g`` by 2 (``|g − 2|`` at the
    bottom), i.e. one step in this table."""
    n = _teachers(num_teachers)
    lam, order = _positive("lam", lam), _order(order)
    gaps = np.arange(n % 2, n + 1, 2, dtype=np.float64)
    ls = np.array([order - 1.0])
    rdp = _laplace_alpha(gaps, lam, ls)[:, 0] / ls[0]
    return np.minimum(rdp, pure_dp_rdp(2.0 * lam, [order])[0])


def laplace_local_sensitivity_bounds(vote_gaps, num_teachers: int, lam: float, order: float) -> np.ndarray:
    """Local-sensitivity bounds (over the ball of radius d) of the Laplace vote's RDP at ``order``
    at distances ``d = 0 … n``; ``[n_queries, n + 1]``."""
    n = _teachers(num_teachers)
    r = laplace_rdp_table(n, lam, order)
    table = _neighbour_differences(r)
    idx = _gap_index(vote_gaps, n)
    return np.stack([ball_maximum(table, c, n + 1) for c in idx]) if idx.size else np.zeros((0, n + 1))


def _neighbour_differences(r: np.ndarray) -> np.ndarray:
    """``L(k) = max |r(k') − r(k)|`` over the neighbours ``k' = k ± 1`` inside the table. (For the
    gaps of even n, gap 0's only neighbour is gap 2; for odd n, gap 1's are gaps 1 and 3: the same
    index steps.)"""
    diff = np.abs(np.diff(r))
    out = np.zeros_like(r)
    out[1:] = diff
    out[:-1] = np.maximum(out[:-1], diff)
    return out


def _gap_index(vote_gaps, n: int) -> np.ndarray:
    gaps = _validate_gaps(vote_gaps)
    if np.any(gaps != np.round(gaps)) or np.any(gaps > n) or np.any((gaps.astype(np.int64) - n) % 2):
        raise ValueError(f"vote gaps must be integers in [0, {n}] with the parity of num_teachers={n}")
    return (gaps.astype(np.int64) - n % 2) // 2


# --------------------------------------------------------------------------------------
# Ledgers: what a run keeps (privately) to release its data-dependent cost at one order
# --------------------------------------------------------------------------------------


def walk_horizon(beta: float, num_teachers: int, *, discount: float = 30.0) -> int:
    """``K = min(n, ⌈discount/β⌉)``: beyond K the discount ``e^{−βd} < e^{−30} ≈ 1e-13`` makes
    replacing GNMax's walk values by their plateau (an upper bound) change SS_β negligibly."""
    return int(min(_teachers(num_teachers), math.ceil(discount / _positive("beta", beta))))


class ConfidentGNMaxLedger:
    """Running data-dependent RDP of Confident-GNMax queries at one order, with the per-distance
    sums of their local-sensitivity bounds (Papernot et al. 2018, Section 4 and Appendix B).

    Every query pays the threshold step; answered queries also pay GNMax (the answered flags are
    the mechanism's output). The threshold step's cost and bounds depend only on ``round(max h)``,
    so the ledger counts queries per value; GNMax's bounds are added to a per-distance sum
    (``d = 0 … n``) batch by batch. Votes are never stored. Private: keep it in the training
    checkpoint only.

    Args:
        num_teachers: n (every histogram sums to at most n).
        threshold: T, an absolute count.
        sigma_threshold: σ1.
        sigma_gnmax: σ2.
        num_bins: B.
        order: λ.
        max_distance: K: GNMax walks stop there and every larger distance gets the walk's constant
            tail (the plateau, an upper bound for every distance). ``None``: n (exact).
            :func:`walk_horizon` gives the K past which the discount e^{−βd} makes the difference
            negligible.
    """

    kind = "confident_gnmax"

    def __init__(self, *, num_teachers: int, threshold: float, sigma_threshold: float, sigma_gnmax: float,
                 num_bins: int, order: float, max_distance: int | None = None):
        self.num_teachers = _teachers(num_teachers)
        self.threshold = float(threshold)
        self.sigma_threshold = _positive("sigma_threshold", sigma_threshold)
        self.sigma_gnmax = _positive("sigma_gnmax", sigma_gnmax)
        if int(num_bins) != num_bins or num_bins < 2:
            raise ValueError(f"num_bins must be an integer >= 2, got {num_bins}")
        self.num_bins = int(num_bins)
        self.order = _order(order)
        n = self.num_teachers
        self.max_distance = n if max_distance is None else int(min(max(int(max_distance), 0), n))
        self.max_counts = np.zeros(n + 1, dtype=np.int64)  # threshold step: queries per round(max h)
        self.gnmax_rdp = 0.0  # Σ β(q) over answered queries
        self.gnmax_ls = np.zeros(n + 1)  # Σ walk values (running maxima) at distance d
        self.gnmax_tail = np.zeros(n + 2)  # Σ of constant tails starting at d (prefix-summed on read)
        self.num_queries = 0
        self.num_answered = 0
        c5, c6 = gnmax_conditions(self.sigma_gnmax, self.num_bins, self.order)
        #: GNMax's data-dependent bound is used only where Algorithm 3 is proven (C5 and C6 hold);
        #: elsewhere GNMax is charged its data-independent λ/σ2² (local sensitivity 0).
        self.gnmax_data_dependent = bool(c5 and c6)
        if not self.gnmax_data_dependent:
            warnings.warn(
                f"conditions C5-C6 of the GNMax smooth-sensitivity analysis (Papernot et al. 2018, B.4.2) fail at "
                f"sigma_gnmax={self.sigma_gnmax:g}, {self.num_bins} bins, order={self.order:g}: GNMax queries are "
                f"charged their data-independent cost in the release (a smaller order or a larger sigma_gnmax avoids this)",
                stacklevel=2,
            )

    def matches(self, event) -> bool:
        """Whether ``event`` (a ConfidentGNMaxEvent) has this ledger's mechanism parameters."""
        return (event.votes.shape[1] == self.num_bins and float(event.threshold) == self.threshold
                and float(event.sigma_threshold) == self.sigma_threshold and float(event.sigma_gnmax) == self.sigma_gnmax)

    def add(self, votes, answered) -> None:
        """Adds a batch of queries: ``votes`` ``[n_queries, B]``, ``answered`` ``[n_queries]``."""
        votes = _validate_votes(votes)
        answered = np.asarray(_to_numpy(answered)).astype(bool).reshape(-1)
        if votes.shape[1] != self.num_bins or answered.shape != (votes.shape[0],):
            raise ValueError(f"expected votes [n, {self.num_bins}] and answered [n], got {votes.shape} and {answered.shape}")
        n = self.num_teachers
        sv = _sorted_votes(votes, n)
        top = np.clip(np.round(sv[:, 0]).astype(np.int64), 0, n)
        self.max_counts += np.bincount(top, minlength=n + 1)
        self.num_queries += int(votes.shape[0])
        if not answered.any():
            return
        uniq, counts = np.unique(sv[answered], axis=0, return_counts=True)
        counts = counts.astype(np.float64)
        self.num_answered += int(answered.sum())
        s2, lam = self.sigma_gnmax, self.order
        if not self.gnmax_data_dependent:
            self.gnmax_rdp += float(counts.sum()) * lam / s2**2
            return
        self.gnmax_rdp += float(counts @ gnmax_rdp_at_order(gnmax_logq(uniq, s2), s2, lam))
        plateau = self._plateau()
        values, length = _gnmax_walk_values(uniq, s2, lam, self.max_distance)
        # the ball of radius d: running maxima along each walk (d < length), then a constant tail
        runmax = np.where(np.isnan(values), 0.0, np.fmax.accumulate(values, axis=1))
        self.gnmax_ls[: values.shape[1]] += counts @ runmax
        last = runmax[np.arange(len(uniq)), np.maximum(length - 1, 0)] if values.shape[1] else np.zeros(len(uniq))
        tail = np.maximum(np.where(length > 0, last, plateau), plateau)
        np.add.at(self.gnmax_tail, length, counts * tail)

    def add_event(self, event) -> None:
        """Adds a :class:`~.accountant.ConfidentGNMaxEvent` (its parameters must match)."""
        if not self.matches(event):
            raise ValueError("a Confident-GNMax event with other parameters than this ledger's (threshold, sigmas, bins)")
        self.add(event.votes, event.answered)

    def _plateau(self) -> float:
        s2, lam, m = self.sigma_gnmax, self.order, self.num_bins
        return float(gnmax_local_sensitivity(np.array([gnmax_logq1(s2, lam, m)]), s2, m, lam)[0])

    def data_dependent_rdp(self) -> float:
        """Σ over the queries of their data-dependent RDP at ``order``: β(D). Private."""
        r = threshold_rdp_table(self.num_teachers, self.threshold, self.sigma_threshold, self.order)
        return float(self.max_counts @ r) + self.gnmax_rdp

    def local_sensitivity(self) -> np.ndarray:
        """Upper bounds on the local sensitivity of β(·) over the ball of radius d, ``d = 0 … n``. Private."""
        n = self.num_teachers
        table = threshold_local_sensitivity_table(n, self.threshold, self.sigma_threshold, self.order)
        return _ball_sum(table, self.max_counts, n + 1) + self.gnmax_ls + np.cumsum(self.gnmax_tail)[: n + 1]

    def smooth_sensitivity(self, beta: float) -> float:
        """SS_β of β(·). Private."""
        return smooth_sensitivity(self.local_sensitivity(), beta)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "num_teachers": self.num_teachers, "threshold": self.threshold,
            "sigma_threshold": self.sigma_threshold, "sigma_gnmax": self.sigma_gnmax, "num_bins": self.num_bins,
            "order": self.order, "max_distance": self.max_distance, "max_counts": self.max_counts.tolist(), "gnmax_rdp": self.gnmax_rdp,
            "gnmax_ls": self.gnmax_ls.tolist(), "gnmax_tail": self.gnmax_tail.tolist(),
            "num_queries": self.num_queries, "num_answered": self.num_answered,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "ConfidentGNMaxLedger":
        with warnings.catch_warnings():  # warned when the run started
            warnings.simplefilter("ignore")
            led = cls(num_teachers=state["num_teachers"], threshold=state["threshold"],
                      sigma_threshold=state["sigma_threshold"], sigma_gnmax=state["sigma_gnmax"],
                      num_bins=state["num_bins"], order=state["order"], max_distance=state.get("max_distance"))
        led.max_counts = np.asarray(state["max_counts"], dtype=np.int64)
        led.gnmax_rdp = float(state["gnmax_rdp"])
        led.gnmax_ls = np.asarray(state["gnmax_ls"], dtype=np.float64)
        led.gnmax_tail = np.asarray(state["gnmax_tail"], dtype=np.float64)
        led.num_queries, led.num_answered = int(state["num_queries"]), int(state["num_answered"])
        return led


class LaplaceVoteLedger:
    """Running data-dependent RDP at one order of PATE-GAN's two-class Laplace votes and the counts
    per vote gap its local-sensitivity bounds are computed from.

    The bound of Theorem 3 (Papernot et al. 2017) is a function of the gap ``|n0 − n1|`` alone and one
    changed teacher moves the gap by 2, so — like the threshold step — the local sensitivity at
    distance d is a maximum over a table (:func:`laplace_rdp_table`), exact for that bound, and a
    count per gap is all the ledger keeps. Private.

    Args:
        num_teachers: n.
        lam: λ of the vote noise Lap(1/λ).
        order: the Rényi order of the release.
    """

    kind = "laplace_vote"

    def __init__(self, *, num_teachers: int, lam: float, order: float):
        self.num_teachers = _teachers(num_teachers)
        self.lam = _positive("lam", lam)
        self.order = _order(order)
        self.gap_counts = np.zeros(self.num_teachers // 2 + 1, dtype=np.int64)
        self.num_queries = 0

    def matches(self, event) -> bool:
        return float(event.lam) == self.lam

    def add(self, vote_gaps) -> None:
        idx = _gap_index(vote_gaps, self.num_teachers)
        self.gap_counts += np.bincount(idx, minlength=self.gap_counts.size)
        self.num_queries += int(idx.size)

    def add_event(self, event) -> None:
        if not self.matches(event):
            raise ValueError(f"a Laplace vote event with lam={event.lam:g}, this ledger has lam={self.lam:g}")
        self.add(event.vote_gaps)

    def data_dependent_rdp(self) -> float:
        return float(self.gap_counts @ laplace_rdp_table(self.num_teachers, self.lam, self.order))

    def local_sensitivity(self) -> np.ndarray:
        n = self.num_teachers
        table = _neighbour_differences(laplace_rdp_table(n, self.lam, self.order))
        return _ball_sum(table, self.gap_counts, n + 1)

    def smooth_sensitivity(self, beta: float) -> float:
        return smooth_sensitivity(self.local_sensitivity(), beta)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_teachers": self.num_teachers, "lam": self.lam, "order": self.order,
                "gap_counts": self.gap_counts.tolist(), "num_queries": self.num_queries}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LaplaceVoteLedger":
        led = cls(num_teachers=state["num_teachers"], lam=state["lam"], order=state["order"])
        led.gap_counts = np.asarray(state["gap_counts"], dtype=np.int64)
        led.num_queries = int(state["num_queries"])
        return led


def ledger_from_state(state: dict[str, Any]):
    """A ledger from its ``state_dict``."""
    kinds = {ConfidentGNMaxLedger.kind: ConfidentGNMaxLedger, LaplaceVoteLedger.kind: LaplaceVoteLedger}
    if state.get("kind") not in kinds:
        raise ValueError(f"unknown smooth-sensitivity ledger kind {state.get('kind')!r}")
    return kinds[state["kind"]].from_state(state)


# --------------------------------------------------------------------------------------
# The release
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GNSSRelease:
    """What a smooth-sensitivity release publishes (all of it noised or public).

    Attributes:
        order, beta, sigma: the GNSS parameters (public, fixed before training).
        noisy_rdp: ``max(0, β(D) + SS_β(D)·σ_ss·Z)``, the released data-dependent RDP at ``order``.
        gnss_rdp: GNSS's own cost at ``order`` (Theorem 23).
        other_rdp: data-independent RDP at ``order`` of everything else recorded (e.g. DP metadata).
        total_rdp: their sum, the released RDP at ``order``.
        delta: δ.
        epsilon: ``total_rdp`` converted to (ε, δ) at ``order``.
        conversion: the conversion used.
        num_queries: queries covered (public: fixed by the run length and settings).
    """

    order: float
    beta: float
    sigma: float
    noisy_rdp: float
    gnss_rdp: float
    other_rdp: float
    total_rdp: float
    delta: float
    epsilon: float
    conversion: str
    num_queries: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def release(ledgers, params: GNSSParameters, *, z: float, delta: float, other_rdp: float = 0.0,
            conversion: str = "improved") -> GNSSRelease:
    """Release the data-dependent RDP of ``ledgers`` at ``params.order`` through GNSS.

    ``β(D) = Σ`` of the ledgers' data-dependent RDP, its local sensitivity the per-distance sum of
    theirs; the released value is ``max(0, β(D) + SS_β·σ_ss·z)`` (clipping at 0 is post-processing:
    a true RDP is never negative).

    Args:
        ledgers: one ledger or a list of them (their orders must equal ``params.order``).
        params: λ, β, σ_ss.
        z: a standard normal draw from the mechanism's secret generator
            (:func:`~.randomness.mechanism_generator`).
        delta: δ of the conversion.
        other_rdp: data-independent RDP at λ of the run's other releases.
        conversion: ``"improved"`` or ``"classic"``.
    """
    ledgers = list(ledgers) if isinstance(ledgers, (list, tuple)) else [ledgers]
    for led in ledgers:
        if led.order != params.order:
            raise ValueError(f"a ledger at order {led.order:g} cannot be released at order {params.order:g}")
    dd = sum(led.data_dependent_rdp() for led in ledgers)
    if ledgers:
        ls = np.sum([led.local_sensitivity() for led in _same_length(ledgers)], axis=0)
        ss = smooth_sensitivity(ls, params.beta)
    else:
        ss = 0.0
    noisy = max(0.0, dd + ss * params.sigma * float(z))
    cost = params.cost
    total = noisy + cost + float(other_rdp)
    eps = _conversion_epsilon(total, params.order, delta, conversion)
    return GNSSRelease(order=params.order, beta=params.beta, sigma=params.sigma, noisy_rdp=noisy, gnss_rdp=cost,
                       other_rdp=float(other_rdp), total_rdp=total, delta=float(delta), epsilon=eps,
                       conversion=conversion, num_queries=int(sum(led.num_queries for led in ledgers)))


def _same_length(ledgers):
    sizes = {led.num_teachers for led in ledgers}
    if len(sizes) != 1:
        raise ValueError(f"ledgers over different numbers of teachers {sorted(sizes)}")
    return ledgers


# --------------------------------------------------------------------------------------
# The accountant of a smooth-sensitivity run
# --------------------------------------------------------------------------------------


class SmoothSensitivityAccountant:
    """Accounts a run whose data-dependent PATE cost is released with smooth sensitivity.

    It receives the same events as the run's :class:`~.accountant.PrivacyAccountant` (which keeps
    the data-independent guarantee): Confident-GNMax and Laplace-vote events go to a ledger at the
    order λ of ``params``; every other event (e.g. DP metadata) is data-independent and is
    accumulated at λ. :meth:`release` publishes the ledger's data-dependent RDP through GNSS.

    Everything but :attr:`released` and :attr:`params` is private (the ledger's sums are functions
    of the votes): :meth:`state_dict` belongs in the training checkpoint only;
    :meth:`public_state` is what may be logged or put in a release artifact.

    Args:
        params: λ, β, σ_ss, fixed before training.
        num_teachers: n, the teachers voting on every query.
        delta: δ of the conversion.
        conversion: the RDP → (ε, δ) conversion.
        neighbouring: the neighbouring relation of the run's ε (PATE's local sensitivity is over
            teachers, one record changes one teacher's data under either relation).
        exact: walk GNMax's bounds over every distance (``True``) or up to :func:`walk_horizon`
            (``False``, default: an upper bound, within e^{−30} of the exact one).
    """

    def __init__(self, *, params: GNSSParameters, num_teachers: int, delta: float, conversion: str = "improved",
                 neighbouring: str = "add_remove", exact: bool = False):
        from .accountant import PrivacyAccountant

        self.params = params
        self.num_teachers = _teachers(num_teachers)
        self.delta = float(delta)
        self.conversion = conversion
        self.neighbouring = neighbouring
        self.exact = bool(exact)
        self.ledger: ConfidentGNMaxLedger | LaplaceVoteLedger | None = None
        self._other = PrivacyAccountant(delta=delta, orders=[params.order], conversion=conversion, neighbouring=neighbouring)
        self.released: GNSSRelease | None = None

    def _new_ledger(self, event):
        from .accountant import ConfidentGNMaxEvent, LaplaceVoteEvent

        lam = self.params.order
        if isinstance(event, ConfidentGNMaxEvent):
            horizon = None if self.exact else walk_horizon(self.params.beta, self.num_teachers)
            return ConfidentGNMaxLedger(num_teachers=self.num_teachers, threshold=event.threshold,
                                        sigma_threshold=event.sigma_threshold, sigma_gnmax=event.sigma_gnmax,
                                        num_bins=event.votes.shape[1], order=lam, max_distance=horizon)
        if isinstance(event, LaplaceVoteEvent):
            return LaplaceVoteLedger(num_teachers=self.num_teachers, lam=event.lam, order=lam)
        return None

    def record(self, event) -> None:
        """Adds ``event``: to the ledger if it is a PATE vote event, else to the data-independent part."""
        if self.released is not None:
            raise RuntimeError("the data-dependent cost was already released: record nothing after the release")
        ledger = self.ledger or self._new_ledger(event)
        if ledger is None:
            self._other.record(event)
            return
        if self.ledger is None:
            self.ledger = ledger
        self.ledger.add_event(event)

    def accepts(self, event) -> bool:
        """Whether ``event`` can be recorded (a PATE event must match the ledger's mechanism)."""
        from .accountant import ConfidentGNMaxEvent, LaplaceVoteEvent

        if not isinstance(event, (ConfidentGNMaxEvent, LaplaceVoteEvent)):
            return True
        if self.ledger is None:
            return True
        return type(event) is {"confident_gnmax": ConfidentGNMaxEvent, "laplace_vote": LaplaceVoteEvent}[self.ledger.kind] \
            and self.ledger.matches(event)

    def release(self, z: float) -> GNSSRelease:
        """Releases the data-dependent RDP at λ with the standard normal draw ``z`` (from the
        mechanism's secret generator). Once only."""
        if self.released is not None:
            raise RuntimeError("the data-dependent cost was already released")
        self.released = release([] if self.ledger is None else self.ledger, self.params, z=z, delta=self.delta,
                                other_rdp=float(self._other.rdp[0]), conversion=self.conversion)
        return self.released

    def public_state(self) -> dict[str, Any]:
        """The parameters and, once made, the release: nothing unnoised."""
        return {"params": self.params.to_dict(), "released": None if self.released is None else self.released.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        """PRIVATE state (ledger sums from the votes): for the training checkpoint only."""
        return {**self.public_state(), "num_teachers": self.num_teachers, "delta": self.delta,
                "conversion": self.conversion, "neighbouring": self.neighbouring, "exact": self.exact,
                "ledger": None if self.ledger is None else self.ledger.state_dict(),
                "other": self._other.state_dict()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "SmoothSensitivityAccountant":
        acc = cls(params=GNSSParameters(**state["params"]), num_teachers=state["num_teachers"], delta=state["delta"],
                  conversion=state["conversion"], neighbouring=state.get("neighbouring", "add_remove"),
                  exact=state.get("exact", False))
        if state.get("ledger") is not None:
            acc.ledger = ledger_from_state(state["ledger"])
        acc._other.load_state_dict(state["other"])
        if state.get("released") is not None:
            acc.released = GNSSRelease(**state["released"])
        return acc
