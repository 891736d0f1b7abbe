"""Private quantile edges of a numeric column: bins that follow the data, paid for.

A column cut into equal-width bins of a declared range wastes them where the data is not: incomes, money
amounts, counts, lab values and waiting times are skewed, and 95% of a column can fall into its first bin of
ten. This cuts each numeric column at its quantiles instead, released with differential privacy:

* a noisy row count ``n̂`` (the Laplace mechanism, pure DP) sizes the number of bins, :func:`bins_for_rows`, no more
  than the budget keeps informative (:func:`quantiles_per_column`; none on a small table at a small ε: the declared
  range's bins, and the quantiles' share stays with the model);
* each edge is one exponential-mechanism quantile over a public grid of candidates (Smith 2011, on a grid) at a
  level of :func:`quantile_levels` (from the 1st to the 99th percentile; where the count affords a column only a
  handful, at the levels of equal mass, so that a skewed column's bulk is cut and not only its tails),
  OpenDP's ``make_private_quantile``: a candidate ``c`` is drawn with probability
  ``∝ exp(−|#(x < c) − α·(n − #(x = c))| / s)``. The score moves by at most ``Δ = max(α, 1 − α)`` when one
  record is added or removed, so the draw is ε-DP and ε-bounded range with ``ε = 2Δ / s``
  (:class:`~lightning_gpate.privacy.ExponentialMechanismEvent`; ``ε²/8``-zCDP, which OpenDP's own privacy map
  reports and :func:`private_quantiles` checks);
* the edges are then post-processed (no data read): sorted, the two outer bins no wider than twice their
  neighbours in the interpolation's scale (:func:`cap_outer_bins`: the exponential mechanism at a level near
  0 or 1 drifts into the empty part of the range, where every candidate scores alike, and a wide end bin filled
  evenly would put synthetic values far beyond the data), one tail bin added at each end, as wide as its
  neighbour (:func:`tail_bins`: the values beyond the outer quantiles stay near the data instead of being
  spread to the declared bounds), the declared range's tenths joined to them, beyond the tail bins too
  (:func:`with_range_edges`: public; no value is clipped onto the tails), integer columns' edges on half-integers
  (an integer column of at most ``INTEGER_BINS`` integers gets one bin each, :func:`integer_bins`, and buys no quantile),
  and a declared bound that a quantile was released on (many rows on it: zeros, a cap) given a bin of its own that
  comes back as the bound itself (:func:`bound_masses`).

The budget is stated as ``epsilon``: the whole release costs what one ε-bounded-range mechanism of that ε
costs (``ε²/8``-zCDP): the count takes ``COUNT_SHARE`` of it and the ``M`` quantiles ``ε_q = ε·√((1 −
COUNT_SHARE)/M)`` each (zCDP composition). :func:`default_quantile_epsilon` derives it from a model's
budget: ``QUANTILE_SHARE`` of the zCDP budget ``ρ`` of its ``(ε, δ)``.

The randomness is OpenDP's (the operating system's entropy, never a seed) for the quantiles, the caller's
secret generator for the count.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

#: Share of a model's zCDP budget ρ that buys the quantile edges by default (:func:`default_quantile_epsilon`).
QUANTILE_SHARE = 0.1
#: Share of the quantile release's own ρ that buys the noisy row count.
COUNT_SHARE = 0.05
#: Candidates of a quantile: points of the declared range, evenly spaced in ``asinh(v / s)`` (log-like away from 0).
CANDIDATES = 400
#: Levels of the edges: evenly spaced in ``[TAIL, 1 − TAIL]`` (from ``TAILS_FROM`` quantiles a column).
TAIL = 0.01
#: Fewer quantiles than this a column sit at the levels of equal mass ``i/(m + 1)`` (:func:`quantile_levels`): two of a
#: handful spent on the outer percentiles leave a skewed column's bulk in one wide bin; ``2``: the tails from two on.
TAILS_FROM = 6
#: Bins of a column sized from the noisy row count: ``√n̂ / ROWS_PER_BIN_ROOT`` within ``[MIN_BINS, MAX_BINS]``.
MIN_BINS, MAX_BINS, ROWS_PER_BIN_ROOT = 6, 16, 6.0
#: A quantile's noise (the exponential mechanism's scale, in rows) at most this fraction's inverse of a bin's rows.
RANK_NOISE_BINS = 3.0
#: The outer bins' width, at most this many times their neighbour's (in the interpolation's scale).
OUTER_BIN_RATIO = 2.0
#: The tail bins' width, this many times their neighbour's (in the interpolation's scale).
TAIL_BIN_RATIO = 1.0
#: Equal-width bins of the declared range whose edges join the quantiles' (:func:`with_range_edges`).
RANGE_BINS = 10
#: An integer column of at most this many integers in its declared range gets one bin each, public (:func:`integer_bins`):
#: as many as the most bins a release buys a column.
INTEGER_BINS = MAX_BINS
#: Whether the declared range's tenths beyond the tail bins are kept as bins too (the range is never cut off).
RANGE_BEYOND = True
#: The interpolation's scale (:func:`interpolation_scale`): ``"median_width"`` of the released bins, or
#: ``"smallest_draw"``, the smallest positive magnitude of a released quantile.
SCALE_FROM = "median_width"
#: Whether a quantile released on a declared bound makes that bound a point mass of its own bin (:func:`bound_masses`).
BOUND_MASSES = True


def zcdp_budget(epsilon: float, delta: float, conversion: str = "improved") -> float:
    """The largest ρ whose ρ-zCDP Gaussian mechanism the project's accountant keeps within ``(epsilon, delta)``."""
    return _zcdp_budget(float(epsilon), float(delta), conversion)


@lru_cache(maxsize=64)
def _zcdp_budget(epsilon: float, delta: float, conversion: str) -> float:
    from lightning_gpate.privacy.accountant import PrivacyAccountant, SubsampledGaussianEvent

    def fits(rho: float) -> bool:
        accountant = PrivacyAccountant(delta=delta, conversion=conversion)
        accountant.record(SubsampledGaussianEvent(noise_multiplier=math.sqrt(1.0 / (2.0 * rho)), sampling_rate=1.0))
        return accountant.epsilon() <= epsilon

    lo, hi = 0.0, max(1.0, epsilon)
    while fits(hi):
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def default_quantile_epsilon(epsilon: float, delta: float, share: float = QUANTILE_SHARE) -> float:
    """The ε of the quantile release when a model's budget is ``(epsilon, delta)``: ``share`` of its zCDP budget,
    ``√(8·share·ρ)`` (an ε-bounded-range release is ``ε²/8``-zCDP)."""
    return math.sqrt(8.0 * share * zcdp_budget(epsilon, delta))


def bins_for_rows(n_hat: float) -> int:
    """Bins of a numeric column for a noisy row count: ``√n̂ / ROWS_PER_BIN_ROOT`` within ``[MIN_BINS, MAX_BINS]``
    (6 bins below ~1,300 rows, 12 at 5,000, 16 from ~9,000)."""
    return int(min(MAX_BINS, max(MIN_BINS, round(math.sqrt(max(n_hat, 0.0)) / ROWS_PER_BIN_ROOT))))


def quantiles_per_column(n_hat: float, epsilon: float, num_columns: int) -> int:
    """How many quantiles each of ``num_columns`` columns gets (0: none): at most ``bins_for_rows(n̂) − 1``, and no more
    than keep every draw informative, the exponential mechanism's scale ``2/ε_q`` (in rows) at most a
    ``1/RANK_NOISE_BINS`` of the rows a bin holds, ``n̂ / (m + 1)``. Below that the draws would follow the public grid
    more than the data (a small table at a small ε): the column keeps its declared range's bins, and the budget the
    quantiles would have taken stays with the model."""
    for m in range(bins_for_rows(n_hat) - 1, 0, -1):
        if 2.0 / epsilon_per_quantile(epsilon, num_columns * m) <= max(n_hat, 0.0) / (RANK_NOISE_BINS * (m + 1)):
            return m
    return 0


def grid_scale(lower: float, upper: float) -> float:
    """The public scale ``s`` of the candidates' ``asinh(v / s)`` spacing: 1e-5 of the range's largest magnitude."""
    return max(abs(lower), abs(upper), 1e-12) * 1e-5


def candidate_grid(lower: float, upper: float, *, integer: bool, size: int = CANDIDATES) -> np.ndarray:
    """The public candidates of an edge in ``[lower, upper]``: ``size`` points evenly spaced in ``asinh(v / s)``
    (:func:`grid_scale`: log-spaced away from 0, so a skewed column gets candidates where its values are); an integer
    column's candidates are half-integers (every half-integer when the range holds at most ``size``)."""
    if integer:
        lo, hi = math.ceil(lower), math.floor(upper)
        if hi - lo + 2 <= size:
            return np.arange(lo, hi + 2, dtype=np.float64) - 0.5
    s = grid_scale(lower, upper)
    grid = s * np.sinh(np.linspace(math.asinh(lower / s), math.asinh(upper / s), size))
    grid = np.clip(grid, lower, upper)
    if integer:
        grid = np.clip(np.floor(grid) + 0.5, math.ceil(lower) - 0.5, math.floor(upper) + 0.5)
    return np.unique(grid)


def quantile_levels(num_quantiles: int, tail: float | None = None) -> np.ndarray:
    """The levels of ``m = num_quantiles`` edges: evenly spaced in ``[tail, 1 − tail]`` (``TAIL``) from ``TAILS_FROM``
    quantiles on; fewer sit at ``i/(m + 1)`` (one edge: the median), bins of equal mass, where two of a handful spent on
    the outer percentiles would leave the bulk of a skewed column in one wide bin."""
    tail, m = (TAIL if tail is None else tail), int(num_quantiles)
    return np.arange(1, m + 1) / (m + 1.0) if m < max(TAILS_FROM, 2) else np.linspace(tail, 1.0 - tail, m)


def epsilon_per_quantile(epsilon: float, num_quantiles: int) -> float:
    """Each quantile's ε when ``num_quantiles`` of them share the release's ``epsilon`` less the count's share."""
    return float(epsilon) * math.sqrt((1.0 - COUNT_SHARE) / max(int(num_quantiles), 1))


def count_epsilon(epsilon: float) -> float:
    """The pure-DP ε of the row count: ``COUNT_SHARE`` of the release's ρ (a pure ε-DP release is ``ε²/2``-zCDP)."""
    return math.sqrt(2.0 * COUNT_SHARE * float(epsilon) ** 2 / 8.0)


def noisy_count(n: int, *, epsilon: float, rng: np.random.Generator) -> float:
    """The row count plus Laplace noise of scale ``1/ε`` (sensitivity 1 under add/remove)."""
    return float(n + rng.laplace(0.0, 1.0 / epsilon))


def private_quantiles(values: np.ndarray, candidates: np.ndarray, levels: np.ndarray, *, epsilon: float) -> np.ndarray:
    """One exponential-mechanism quantile per level over ``candidates``, each ε-DP (OpenDP's ``make_private_quantile``
    under add/remove, scale ``2·max(α, 1−α)/ε`` and 0.1% more, levels to 4 decimals); the draws in the order of ``levels``.

    Raises:
        RuntimeError: OpenDP's privacy map disagrees with ``ε²/8``-zCDP (a changed library: refuse to release).
    """
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    data = np.asarray(values, dtype=np.float64)
    out = []
    for alpha in levels:
        alpha = round(float(alpha), 4)  # OpenDP's granularity of α; 0.1% more noise covers its rounding of the scale
        scale = 2.0 * max(alpha, 1.0 - alpha) / epsilon * 1.001
        measurement = dp.m.make_private_quantile(domain, dp.symmetric_distance(), dp.zero_concentrated_divergence(),
                                                 candidates=[float(c) for c in candidates], alpha=float(alpha), scale=scale)
        rho = measurement.map(1)
        if not rho <= epsilon ** 2 / 8.0 * (1.0 + 1e-9):
            raise RuntimeError(f"OpenDP's quantile costs {rho:.6g}-zCDP, not the {epsilon ** 2 / 8:.6g} accounted")
        out.append(float(measurement(data)))
    return np.asarray(out)


def warp(values: np.ndarray, offset: float, scale: float | None) -> np.ndarray:
    """A column's values in the scale its bins are filled in: ``asinh((v − offset) / scale)``, or as they are."""
    values = np.asarray(values, dtype=np.float64)
    return values if scale is None else np.arcsinh((values - offset) / scale)


def unwarp(values: np.ndarray, offset: float, scale: float | None) -> np.ndarray:
    """The inverse of :func:`warp`."""
    values = np.asarray(values, dtype=np.float64)
    return values if scale is None else offset + scale * np.sinh(values)


def interpolation_scale(edges: np.ndarray) -> float:
    """The scale of released edges' interpolation (post-processing): the median width of their bins, so that a bin
    is filled evenly where bins are alike and log-like where they widen (a skewed column's tail); with ``SCALE_FROM``
    ``"smallest_draw"``, the smallest positive magnitude among them (log-like above it)."""
    if SCALE_FROM == "smallest_draw":
        positive = np.abs(np.asarray(edges, dtype=np.float64))
        positive = positive[positive > 0]
        if len(positive):
            return float(positive.min())
    widths = np.diff(np.asarray(edges, dtype=np.float64))
    widths = widths[widths > 0]
    return float(np.median(widths)) if len(widths) else 1.0


def cap_outer_bins(edges: np.ndarray, scale: float, *, ratio: float | None = None) -> np.ndarray:
    """The first and last bins no wider than ``ratio`` times their neighbour in ``asinh(v / scale)`` (post-processing)."""
    ratio = OUTER_BIN_RATIO if ratio is None else ratio
    edges = np.asarray(edges, dtype=np.float64)
    t = warp(edges, 0.0, scale)
    out = edges.copy()  # the edges it leaves as they are stay exact (no round trip through the warp)
    if len(t) >= 4:
        if t[-1] > t[-2] + ratio * (t[-2] - t[-3]):
            out[-1] = unwarp(t[-2] + ratio * (t[-2] - t[-3]), 0.0, scale)
        if t[0] < t[1] - ratio * (t[2] - t[1]):
            out[0] = unwarp(t[1] - ratio * (t[2] - t[1]), 0.0, scale)
    return out


def tail_bins(edges: np.ndarray, scale: float, lower: float, upper: float, *, ratio: float | None = None) -> np.ndarray:
    """``edges`` with one more bin at each end for the tails beyond the outer quantiles, ``ratio`` times as wide as its
    neighbour in ``asinh(v / scale)`` and within the declared ``[lower, upper]`` (post-processing): the values beyond
    land there, close to the data, not spread to the declared bounds."""
    ratio = TAIL_BIN_RATIO if ratio is None else ratio
    t = warp(np.asarray(edges, dtype=np.float64), 0.0, scale)
    if len(t) >= 2:
        low = unwarp(t[0] - ratio * (t[1] - t[0]), 0.0, scale)
        high = unwarp(t[-1] + ratio * (t[-1] - t[-2]), 0.0, scale)
        edges = np.concatenate([[max(lower, float(low))], edges, [min(upper, float(high))]])
    return np.unique(np.clip(edges, lower, upper))


def with_range_edges(edges: np.ndarray, lower: float, upper: float, num_bins: int | None = None) -> np.ndarray:
    """``edges`` and the edges of ``num_bins`` equal-width bins of the declared ``[lower, upper]`` that fall between
    them (public): no bin straddles a tenth of the declared range, so a view of the column in equal-width bins of
    its range (the usual histogram; ``fidelity``'s equal-width TVD) stays as exact as with those bins alone. With
    ``RANGE_BEYOND`` those beyond them too, to the declared bounds: no value of the range is clipped."""
    grid = np.linspace(lower, upper, int(RANGE_BINS if num_bins is None else num_bins) + 1)
    keep = np.ones(len(grid), dtype=bool) if RANGE_BEYOND else (grid > edges[0]) & (grid < edges[-1])
    return np.unique(np.concatenate([edges, grid[keep]]))


def on_half_integers(edges: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """An integer column's ``edges`` moved to the half-integer below them, within ``[lower, upper]`` (post-processing)."""
    return np.unique(np.clip(np.floor(np.asarray(edges, dtype=np.float64)) + 0.5, lower, upper))


def integer_bins(lower: float, upper: float) -> np.ndarray | None:
    """An integer column's public edges, one bin for each integer of its declared ``[lower, upper]``, where the range
    holds at most ``INTEGER_BINS`` integers (codes, ratings, small counts); else ``None``. A quantile cannot cut finer
    than an integer, and each integer's bin keeps the range's tenths apart: such a column is left out of the release,
    and its share of the budget goes to the other columns. Decided from the declared range and the dtype only
    (public)."""
    lo, hi = math.ceil(lower) - 0.5, math.floor(upper) + 0.5
    return np.arange(lo, hi + 0.5) if hi > lo and round(hi - lo) <= INTEGER_BINS else None


def bound_masses(draws: np.ndarray, candidates: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, list[list[float]]]:
    """``edges`` with a bin of its own at each declared bound that a quantile was released on, and those bins,
    ``[[k, bound], …]`` (post-processing of the released ``draws``).

    A quantile lands on a bound (the first or last candidate) when many rows sit on it: a column's zeros, a cap. Its
    bin ends at the next candidate and comes back as the bound itself, not spread over the values beside it.

    An outer level's quantile can also land on a bound with no row there: every candidate beyond the data scores alike
    for it, and where only a few candidates lie beyond (a column's top 1% within a grid step of the declared maximum,
    the grid being coarsest there), the bound is one draw in a few. That bin then holds only the rows within a grid
    step of the bound, and those come back on the bound instead of spread over that step; the released draws cannot
    tell the two cases apart."""
    lower, upper = float(candidates[0]), float(candidates[-1])
    on_lower = bool(np.any(draws <= lower)) and edges[0] == lower and edges[1] >= candidates[1]
    on_upper = bool(np.any(draws >= upper)) and edges[-1] == upper and edges[-2] <= candidates[-2]
    edges = np.unique(np.concatenate([edges, [candidates[1]] if on_lower else [], [candidates[-2]] if on_upper else []]))
    masses = [[0, lower]] if on_lower else []
    if on_upper:
        masses.append([len(edges) - 2, upper])
    return edges, masses


def quantile_edges(values: np.ndarray, *, lower: float, upper: float, integer: bool, num_bins: int,
                   epsilon: float) -> dict[str, Any]:
    """A column's released edges (see the module doc): ``{"edges", "offset", "scale", "point_masses"}`` of
    :class:`~datamodules.tabular.ColumnSpec`. ``values`` are clipped to the declared ``[lower, upper]`` first.

    ``num_bins − 1`` quantiles at the levels of :func:`quantile_levels` (their outer bins capped,
    :func:`cap_outer_bins`), then a tail bin at each end (:func:`tail_bins`), the declared range's tenths
    (:func:`with_range_edges`) and the bounds' point masses (:func:`bound_masses`); fewer bins where edges coincide,
    up to ``RANGE_BINS + 1`` more.

    Args:
        values: the column (private).
        lower, upper: its declared (public) bounds.
        integer: whether its values are integers (edges on half-integers).
        num_bins: bins to cut.
        epsilon: each quantile's ε (:func:`epsilon_per_quantile`).
    """
    x = np.clip(np.asarray(values, dtype=np.float64), lower, upper)
    candidates = candidate_grid(lower, upper, integer=integer)
    edges = draws = np.unique(private_quantiles(x, candidates, quantile_levels(num_bins - 1), epsilon=epsilon))
    if integer:
        lower, upper = math.ceil(lower) - 0.5, math.floor(upper) + 0.5
    if len(edges) < 2:  # one quantile: the declared bounds (public) are the other edges
        edges = np.unique(np.concatenate([edges, [lower, upper]]))
    scale = interpolation_scale(edges)
    edges = tail_bins(cap_outer_bins(edges, scale), scale, lower, upper)
    edges = with_range_edges(edges, lower, upper)
    if integer:  # its own bins hold one integer where they are that narrow
        edges = on_half_integers(edges, lower, upper)
    masses = []
    if BOUND_MASSES and not integer and len(candidates) > 2:
        edges, masses = bound_masses(draws, candidates, edges)
    return {"edges": [float(e) for e in edges], "offset": 0.0, "scale": scale, "point_masses": masses}


def log_edges(lower: float, upper: float, num_bins: int) -> dict[str, Any]:
    """Public edges for ``scale: log``: ``num_bins`` bins evenly spaced in ``asinh((v − lower) / s)`` with
    ``s = (upper − lower)/1000`` (log-spaced from about ``lower + s`` to ``upper``), filled in the same scale."""
    s = (upper - lower) / 1000.0
    t = np.linspace(0.0, math.asinh((upper - lower) / s), int(num_bins) + 1)
    edges = lower + s * np.sinh(t)
    edges[0], edges[-1] = lower, upper
    return {"edges": [float(e) for e in edges], "offset": float(lower), "scale": float(s)}
