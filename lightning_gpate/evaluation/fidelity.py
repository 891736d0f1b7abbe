"""Fidelity of a synthetic table: how close its distribution is to the real one, column by column and
pair by pair (the measures of the DP synthetic-data literature: NIST 2018 challenge, MST and AIM,
McKenna et al. 2021/2022; SDMetrics' TVComplement / ContingencySimilarity / CorrelationSimilarity).

* ``tvd_1way``: the mean over columns of the total variation distance ``½ Σ_v |p(v) − q(v)|`` between
  the real and the synthetic one-way marginals;
* ``tvd_2way``: the same over every pair of columns, of the two-way marginals;
* ``tvd_3way``: the same over column triples, of the three-way marginals: every triple, or
  ``max_triples`` of them drawn with a fixed public seed when there are more (AIM's and MargNet's
  workload of 3-way marginals);
* ``corr_mae``: the mean over pairs of columns of ``|r_ij − s_ij|``, the difference of the Pearson
  correlations of the real and the synthetic table (numeric columns as values, binary and categorical
  columns as the index of their category in the declared order; an undefined correlation counts as 0).

All columns count, the label included. Numeric columns are cut into ``num_bins`` equal-width bins of
their bounds **in the data spec** (declared public, or estimated with DP), never of a range read from
the data, so the binning itself reveals nothing and is the same for every model. A value outside the
spec's categories (or a missing one) falls into one extra "other" cell of its column.

Equal-width bins of a declared range cannot see a skewed column: when 95% of the real values fall into
the first bin, a synthesizer that fills that bin uniformly scores well and gets every value a user reads
wrong. So beside them, **value-level fidelity** of every numeric column (:func:`value_fidelity`), on the
real column itself (the reference split handed in: the evaluator's data, never the model's):

* ``quantile_tvd_1way``: the TVD of the column on 10 bins cut at the real column's deciles (tied deciles
  merged), the mean over numeric columns (``_max``: the worst column);
* ``quantile_tvd_2way``: the same over every pair of numeric columns, of their joint decile bins;
* ``w1_scaled``: the Wasserstein-1 distance of the real and synthetic values divided by the real
  column's ``q95 − q05`` (its spread, robust to the tails), the mean over numeric columns (``_max``);
* per column ``column/<name>/{quantile_tvd, w1_scaled, median_real, median_synthetic}``: the worst column is the
  one of the largest ``quantile_tvd`` (:func:`worst_column`); a column whose median or W1 is far off is one a
  user reading its values would notice (:func:`columns_off`), and ``fit``'s summary names it.

Why not SDMetrics: it bins numeric columns on the real column's own range (``np.histogram_bin_edges``
of the real data) rather than public bounds, and it requires pandas < 3, which this project pins.
"""

from __future__ import annotations

import math
import itertools
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

FIDELITY_BINS = 10
#: Column triples whose 3-way TVD is averaged (all of them when a table has fewer): 23 columns have 1,771.
MAX_TRIPLES = 300


def spec_columns(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every column of a tabular data spec (features, then the label), in the table's column order."""
    by_name = {c["name"]: c for c in list(spec["columns"]) + [spec["label"]]}
    order = spec.get("column_order") or list(by_name)
    return [by_name[name] for name in order]


def discretize(frame: pd.DataFrame, columns: Sequence[Mapping[str, Any]], num_bins: int = FIDELITY_BINS) -> tuple[np.ndarray, list[int]]:
    """Codes ``[n, d]`` and cardinalities of ``frame``'s columns: numeric values in ``num_bins``
    equal-width bins of ``[min, max]`` from the spec (values outside are clipped into the end bins),
    categories by their index in the spec's list (compared as strings). Each column has one extra
    code, its last, for a missing value or one outside the spec's categories."""
    if int(num_bins) != num_bins or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins}")
    missing = [c["name"] for c in columns if c["name"] not in frame.columns]
    if missing:
        raise ValueError(f"the table lacks the columns {missing[:10]}")
    codes = np.zeros((len(frame), len(columns)), dtype=np.int64)
    cards = []
    for j, c in enumerate(columns):
        series = frame[c["name"]]
        if c["type"] == "numeric":
            card = int(num_bins)
            values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
            lo, hi = float(c["min"]), float(c["max"])
            with np.errstate(invalid="ignore"):
                scaled = np.zeros_like(values) if hi <= lo else (np.clip(values, lo, hi) - lo) / (hi - lo) * card
            # a value on a bin edge belongs to the upper bin, whatever the last bit of the division says
            col = np.clip(np.floor(np.nan_to_num(scaled) + 1e-9), 0, card - 1).astype(np.int64)
            col[np.isnan(values)] = card
        else:
            categories = [str(v) for v in c["categories"]]
            card = len(categories)
            lookup = {v: i for i, v in enumerate(categories)}
            col = series.map(lambda v: lookup.get(str(_plain(v)), card) if pd.notna(v) else card).to_numpy(dtype=np.int64)
        codes[:, j] = col
        cards.append(card + 1)
    return codes, cards


def _plain(value: Any) -> Any:
    """A float that is an integer as an int (a category 1 read back as 1.0 is still 1); others unchanged."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value.item() if isinstance(value, np.generic) else value


def _distribution(codes: np.ndarray, size: int) -> np.ndarray:
    counts = np.bincount(codes, minlength=size).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def tvd(p: np.ndarray, q: np.ndarray) -> float:
    """Total variation distance ``½ Σ |p − q|`` of two distributions on the same cells."""
    return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)).sum())


def marginal_tvds(real: np.ndarray, synthetic: np.ndarray, cards: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per column and per pair of columns (``itertools.combinations`` order), the TVD of the real and
    synthetic marginals of the codes (:func:`discretize`)."""
    d = len(cards)
    one = np.array([tvd(_distribution(real[:, j], cards[j]), _distribution(synthetic[:, j], cards[j])) for j in range(d)])
    two = []
    for i, j in itertools.combinations(range(d), 2):
        size = cards[i] * cards[j]
        two.append(tvd(_distribution(real[:, i] * cards[j] + real[:, j], size),
                       _distribution(synthetic[:, i] * cards[j] + synthetic[:, j], size)))
    return one, np.array(two)


def column_triples(d: int, max_triples: int = MAX_TRIPLES, *, seed: int = 0) -> list[tuple[int, int, int]]:
    """The column triples of :func:`triple_tvds`: all ``C(d, 3)`` in ``itertools.combinations`` order, or ``max_triples``
    of them drawn without replacement with a fixed public seed (the same for every system compared)."""
    triples = list(itertools.combinations(range(d), 3))
    if len(triples) <= max_triples:
        return triples
    chosen = np.random.default_rng(seed).choice(len(triples), size=max_triples, replace=False)
    return [triples[i] for i in sorted(chosen)]


def triple_tvds(real: np.ndarray, synthetic: np.ndarray, cards: Sequence[int],
                triples: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Per column triple, the TVD of the real and synthetic 3-way marginals of the codes (:func:`discretize`)."""
    out = []
    for i, j, k in triples:
        size = cards[i] * cards[j] * cards[k]
        cell = lambda c: (c[:, i] * cards[j] + c[:, j]) * cards[k] + c[:, k]  # noqa: E731
        out.append(tvd(_distribution(cell(real), size), _distribution(cell(synthetic), size)))
    return np.array(out)


def numeric_frame(frame: pd.DataFrame, columns: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """``[n, d]`` numbers for correlations: numeric columns as values, others as the index of their
    category in the spec (NaN when missing or unknown)."""
    out = np.zeros((len(frame), len(columns)))
    for j, c in enumerate(columns):
        series = frame[c["name"]]
        if c["type"] == "numeric":
            out[:, j] = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
        else:
            lookup = {str(v): i for i, v in enumerate(c["categories"])}
            out[:, j] = series.map(lambda v: lookup.get(str(_plain(v)), np.nan) if pd.notna(v) else np.nan).to_numpy(dtype=np.float64)
    return out


def pearson_matrix(values: np.ndarray) -> np.ndarray:
    """Pearson correlations of the columns (pairwise complete rows); an undefined one (a constant
    column) is 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        corr = pd.DataFrame(values).corr(method="pearson").to_numpy()
    return np.nan_to_num(corr, nan=0.0)


def fidelity(real: pd.DataFrame, synthetic: pd.DataFrame, spec: Mapping[str, Any], *, num_bins: int = FIDELITY_BINS,
             max_triples: int = MAX_TRIPLES) -> dict[str, float]:
    """``tvd_1way``, ``tvd_2way``, ``tvd_3way``, ``corr_mae`` of ``synthetic`` against ``real`` (see the module doc),
    and the worst column's, pair's and triple's TVD (``tvd_1way_max``, ``tvd_2way_max``, ``tvd_3way_max``); then the
    value-level figures of the numeric columns (:func:`value_fidelity`).

    Args:
        real: a real split, original schema.
        synthetic: the synthetic table, same columns.
        spec: the tabular data spec of the model (its public bounds and categories).
        num_bins: equal-width bins of a numeric column's bounds.
        max_triples: column triples of ``tvd_3way`` (:func:`column_triples`).
    """
    columns = spec_columns(spec)
    if len(real) == 0 or len(synthetic) == 0:
        raise ValueError("fidelity needs rows in both tables")
    codes_real, cards = discretize(real, columns, num_bins)
    codes_syn, _ = discretize(synthetic, columns, num_bins)
    one, two = marginal_tvds(codes_real, codes_syn, cards)
    three = triple_tvds(codes_real, codes_syn, cards, column_triples(len(columns), max_triples))
    r, s = pearson_matrix(numeric_frame(real, columns)), pearson_matrix(numeric_frame(synthetic, columns))
    iu = np.triu_indices(len(columns), k=1)
    nan = float("nan")
    return {
        **value_fidelity(real, synthetic, spec),
        "tvd_1way": float(one.mean()),
        "tvd_1way_max": float(one.max()),
        "tvd_2way": float(two.mean()) if len(two) else nan,
        "tvd_2way_max": float(two.max()) if len(two) else nan,
        "tvd_3way": float(three.mean()) if len(three) else nan,
        "tvd_3way_max": float(three.max()) if len(three) else nan,
        "corr_mae": float(np.abs(r[iu] - s[iu]).mean()) if len(iu[0]) else nan,
    }


QUANTILE_BINS = 10


def quantile_codes(real: np.ndarray, values: np.ndarray, num_bins: int = QUANTILE_BINS) -> tuple[np.ndarray, int]:
    """``values`` in the bins cut at the real column's ``1/num_bins, …, (num_bins−1)/num_bins`` quantiles (ties
    merged; a value on an edge belongs to the upper bin), and the number of bins."""
    edges = np.unique(np.quantile(real, np.linspace(0.0, 1.0, num_bins + 1)[1:-1]))
    return np.searchsorted(edges, values, side="right"), len(edges) + 1


def wasserstein_1(a: np.ndarray, b: np.ndarray) -> float:
    """The Wasserstein-1 distance of two samples: the area between their empirical CDFs, ``∫ |F_a − F_b| dx``."""
    a, b = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    points = np.concatenate([a, b])
    points.sort(kind="mergesort")
    widths = np.diff(points)
    cdf_a = np.searchsorted(a, points[:-1], side="right") / len(a)
    cdf_b = np.searchsorted(b, points[:-1], side="right") / len(b)
    return float(np.sum(np.abs(cdf_a - cdf_b) * widths))


def metric_name(column: str) -> str:
    """A column's name as MLflow accepts it in a metric key (letters, digits, ``_-. :/``; others become ``_``)."""
    return "".join(ch if ch.isalnum() or ch in "_-. :" else "_" for ch in str(column))


def value_fidelity(real: pd.DataFrame, synthetic: pd.DataFrame, spec: Mapping[str, Any], *,
                   num_bins: int = QUANTILE_BINS) -> dict[str, float]:
    """Value-level fidelity of the numeric columns of ``synthetic`` against ``real`` (see the module doc):
    ``quantile_tvd_1way`` (and ``_max``), ``quantile_tvd_2way`` (and ``_max``), ``w1_scaled`` (and ``_max``), and per
    column ``column/<name>/{quantile_tvd, w1_scaled, median_real, median_synthetic}``. Empty for a table without
    numeric columns; a missing synthetic value counts in none of the bins (the TVD sees it as lost mass).

    Args:
        real: a real split, original schema (its deciles cut the bins: the evaluator's data).
        synthetic: the synthetic table, same columns.
        spec: the tabular data spec (which columns are numeric).
        num_bins: quantile bins of a column.
    """
    names = [c["name"] for c in spec_columns(spec) if c["type"] == "numeric"]
    if not names:
        return {}
    out: dict[str, float] = {}
    codes_real, codes_syn, cards, one, w1 = [], [], [], [], []
    for name in names:
        r = pd.to_numeric(real[name], errors="coerce").to_numpy(dtype=np.float64)
        s = pd.to_numeric(synthetic[name], errors="coerce").to_numpy(dtype=np.float64)
        r, s = r[~np.isnan(r)], s[~np.isnan(s)]
        if len(r) == 0 or len(s) == 0:
            raise ValueError(f"column {name!r} has no values in the {'real' if len(r) == 0 else 'synthetic'} table")
        cr, card = quantile_codes(r, r, num_bins)
        cs, _ = quantile_codes(r, s, num_bins)
        codes_real.append(cr)
        codes_syn.append(cs)
        cards.append(card)
        one.append(tvd(_distribution(cr, card), _distribution(cs, card)))
        q05, q95 = np.quantile(r, [0.05, 0.95])
        spread = q95 - q05 if q95 > q05 else (r.max() - r.min() if r.max() > r.min() else 1.0)
        w1.append(wasserstein_1(r, s) / spread)
        key = f"column/{metric_name(name)}/"
        out.update({key + "quantile_tvd": one[-1], key + "w1_scaled": w1[-1], key + "median_real": float(np.median(r)),
                    key + "median_synthetic": float(np.median(s))})
    two = []
    complete_real = len({len(c) for c in codes_real}) == 1
    complete_syn = len({len(c) for c in codes_syn}) == 1
    if complete_real and complete_syn:  # pairs need rows with every numeric value (a missing one drops its row's pairs)
        for i, j in itertools.combinations(range(len(names)), 2):
            size = cards[i] * cards[j]
            two.append(tvd(_distribution(codes_real[i] * cards[j] + codes_real[j], size),
                           _distribution(codes_syn[i] * cards[j] + codes_syn[j], size)))
    nan = float("nan")
    out.update({"quantile_tvd_1way": float(np.mean(one)), "quantile_tvd_1way_max": float(np.max(one)),
                "quantile_tvd_2way": float(np.mean(two)) if two else nan, "quantile_tvd_2way_max": float(np.max(two)) if two else nan,
                "w1_scaled": float(np.mean(w1)), "w1_scaled_max": float(np.max(w1))})
    return out


def column_figures(metrics: Mapping[str, float], prefix: str = "") -> dict[str, dict[str, float]]:
    """The per-column figures among ``prefix + "column/<name>/<measure>"`` metrics: ``{name: {measure: value}}``."""
    head = prefix + "column/"
    columns: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith(head):
            name, _, measure = key[len(head):].rpartition("/")
            columns.setdefault(name, {})[measure] = value
    return columns


def worst_column(metrics: Mapping[str, float], prefix: str = "") -> tuple[str, dict[str, float]] | None:
    """The column of the largest ``quantile_tvd`` among ``prefix + "column/<name>/…"`` figures, and its figures
    (``quantile_tvd``, ``w1_scaled``, ``median_real``, ``median_synthetic``); ``None`` when there is none."""
    columns = column_figures(metrics, prefix)
    scored = [(v["quantile_tvd"], name) for name, v in columns.items() if "quantile_tvd" in v and np.isfinite(v["quantile_tvd"])]
    if not scored:
        return None
    name = max(scored)[1]
    return name, columns[name]


#: A numeric column comes back off when its synthetic median is more than ``MEDIAN_RATIO`` times from the real one (both
#: positive) or its W1 ÷ (q95 − q05) exceeds ``W1_SCALED``: a user reading its values would notice.
MEDIAN_RATIO, W1_SCALED = 1.5, 0.10


def columns_off(metrics: Mapping[str, float], prefix: str = "", *, limit: int | None = 3) -> list[tuple[str, dict[str, float], float]]:
    """The numeric columns whose values come back off (:data:`MEDIAN_RATIO`, :data:`W1_SCALED`), worst first, at most
    ``limit`` (``None``: all): ``(name, figures, severity)``, the severity being how many times over the larger bar it is
    (``max(W1 / W1_SCALED, log(ratio) / log(MEDIAN_RATIO))``, above 1)."""
    out = []
    for name, v in column_figures(metrics, prefix).items():
        med_r, med_s, w1 = v.get("median_real", np.nan), v.get("median_synthetic", np.nan), v.get("w1_scaled", np.nan)
        severity = w1 / W1_SCALED if np.isfinite(w1) else 0.0
        if np.isfinite(med_r) and np.isfinite(med_s) and med_r > 0 and med_s > 0:
            severity = max(severity, abs(math.log(med_s / med_r)) / math.log(MEDIAN_RATIO))
        if severity > 1.0:
            out.append((name, v, float(severity)))
    return sorted(out, key=lambda item: -item[2])[:limit]


#: What a column's schema entry can declare to bring its values back, by where its bins came from (``edges_source``:
#: None for the declared range's equal-width bins, ``dp_quantiles`` for the private quantiles the budget affords).
_SKEWED_OR_CODES = ("declare `scale: log` for a skewed one (counts, amounts, sizes), `dtype: int64` for one of a few "
                    "integer codes or `values: [...]` for other codes, or public `bins: [...]` (free: no budget)")
BINNING_FIXES = {None: _SKEWED_OR_CODES, "dp_quantiles": _SKEWED_OR_CODES,
                 "log": "declare public `bins: [...]` where its values are (free)",
                 "declared": "declare finer public `bins: [...]` where its values are (free)"}


def value_advice(metrics: Mapping[str, float], spec: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The numeric columns whose values come back off (:func:`columns_off` of the ``prefix + "column/…"`` figures, worst
    first; the worst three that a declaration can fix) with their figures, grouped by the schema declaration that brings
    most such columns back (:data:`BINNING_FIXES`; none for declared ``values:`` or a short integer range's own bins,
    which come back as themselves). The figures are the
    evaluation split's (printed, like every figure of it); the advice reads only the public spec."""
    sources = {metric_name(c["name"]): c.get("edges_source") for c in spec.get("columns", []) if c.get("type") == "numeric"}
    by_fix: dict[str, list[str]] = {}
    fixable = [(name, figures) for name, figures, _ in columns_off(metrics, prefix, limit=None)
               if BINNING_FIXES.get(sources.get(name)) is not None]
    for name, figures in fixable[:3]:  # the worst three a user can fix by a declaration
        by_fix.setdefault(BINNING_FIXES[sources.get(name)], []).append(
            f"{name!r} (median real {figures.get('median_real', math.nan):.4g} → synthetic "
            f"{figures.get('median_synthetic', math.nan):.4g}, W1 ÷ (q95 − q05) {figures.get('w1_scaled', math.nan):.2g})")
    return [f"values off (a median over {MEDIAN_RATIO:g}× away or W1 ÷ (q95 − q05) over {W1_SCALED:g}) in "
            f"{', '.join(columns)}: in the schema, {fix}" for fix, columns in by_fix.items()]


def uniform_table(spec: Mapping[str, Any], num_rows: int, *, seed: int = 0) -> pd.DataFrame:
    """A table of independent uniform columns in the spec's schema (numeric: uniform on the bounds,
    rounded for integer columns; others: uniform over the categories): the worst-case reference a
    synthesizer that learned nothing would produce."""
    rng = np.random.default_rng(seed)
    data = {}
    for c in spec_columns(spec):
        if c["type"] == "numeric":
            v = rng.uniform(float(c["min"]), float(c["max"]), num_rows)
            data[c["name"]] = np.round(v).astype(c["dtype"]) if str(c["dtype"]).startswith(("int", "uint", "Int", "UInt")) else v
        else:
            values = pd.Series(np.asarray(c["categories"], dtype=object)[rng.integers(len(c["categories"]), size=num_rows)])
            data[c["name"]] = values.astype(c["dtype"]) if c["dtype"] != "object" else values
    return pd.DataFrame(data)
