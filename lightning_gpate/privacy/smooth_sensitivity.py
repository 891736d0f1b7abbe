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
run keeps a count per value; GNMax walks are run once per distinct sorted histogram of a batch,
vectorised across histograms.

This module is the analysis alone: functions of vote histograms and public parameters, each matched
against the reference (``tests/test_smooth_sensitivity.py``). What a run keeps and releases — the
GNSS parameters, the ledgers of its queries, the release and its accountant — is
:mod:`~lightning_gpate.privacy.smooth_release`.
"""

from __future__ import annotations

import functools
import math

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
from .rdp import pure_dp_rdp

__all__ = [
    "gnss_rdp",
    "gnss_rdp_curve",
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
# Ledgers' horizon
# --------------------------------------------------------------------------------------


def walk_horizon(beta: float, num_teachers: int, *, discount: float = 30.0) -> int:
    """``K = min(n, ⌈discount/β⌉)``: beyond K the discount ``e^{−βd} < e^{−30} ≈ 1e-13`` makes
    replacing GNMax's walk values by their plateau (an upper bound) change SS_β negligibly."""
    return int(min(_teachers(num_teachers), math.ceil(discount / _positive("beta", beta))))
