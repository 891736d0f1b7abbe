"""Tabular data: schema, the exact transform to the generator's space and back, the DataModule.

The generator emits, per feature column: numeric and binary columns as one value in [-1, 1], categorical
columns as a one-hot block (binary as -1/+1). A numeric column is mapped to [-1, 1] either linearly from its
bounds, or, when it has **edges** ``e_0 < … < e_K`` (its bins), piecewise: bin ``k`` becomes the ``k``-th of
``K`` equal parts of [-1, 1], a value inside it placed linearly in ``asinh((v − offset)/scale)`` (or in ``v``),
values outside ``[e_0, e_K]`` clipped. Every model that discretises ([-1, 1] in equal parts: MarginalTree, the
marginal warm start, PATE-GAN's marginals) then bins on the edges, and every model that scales (the GANs) spends
its resolution where the values are. Edges are declared (``bins: [...]``, ``scale: log``) or released with DP
(private quantiles, :mod:`lightning_gpate.privacy.quantiles`, paid from the model's budget: ``quantile_epsilon``).
Bounds, categories and edges are *metadata*; where they are read from the private data instead of declared
in the config, the spec lists the column under ``private_metadata`` so private models can refuse it
or pay for it (see ``lightning_gpate.privacy.dp_stats``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from datamodules.base import DataError, GenerativeDataModule, read_data_csv
from datamodules.partition import record_keys
from lightning_gpate.privacy import quantiles as dp_quantiles
from lightning_gpate.privacy.dp_stats import dp_bounds, dp_histogram_ratio
from lightning_gpate.privacy.randomness import secret_seed

COLUMN_TYPES = ("numeric", "binary", "categorical")
BUILTIN_TABLES = ("breast_cancer",)


@dataclass
class ColumnSpec:
    """One column: its type, original dtype and metadata (bounds or categories)."""

    name: str
    type: str
    dtype: str
    min: float | None = None
    max: float | None = None
    categories: list[Any] = field(default_factory=list)
    public: bool = False  # metadata declared by the user (not read from the private data)
    # A numeric column's bins (None: the bounds' linear scale), filled in asinh((v − edges_offset)/edges_scale)
    # (edges_scale None: in v); edges_source "declared", "log" (scale: log), "values" (declared), "dp_quantiles" (paid for)
    # or "integers" (one bin per integer of a short declared range: public, no quantile bought).
    edges: list[float] | None = None
    edges_offset: float = 0.0
    edges_scale: float | None = None
    edges_source: str | None = None
    # The values a numeric column takes (declared: codes stored as numbers), one bin each: a value comes back as itself.
    values: list[float] | None = None
    # Bins of released edges that hold a point mass, ``[[k, value], …]``: bin k comes back as that one value.
    point_masses: list[list[float]] | None = None

    @property
    def width(self) -> int:
        return len(self.categories) if self.type == "categorical" else 1

    @property
    def is_integer(self) -> bool:
        return self.dtype.startswith(("int", "uint", "Int", "UInt"))

    def set_edges(self, edges: Sequence[float], offset: float = 0.0, scale: float | None = None, *, source: str) -> None:
        self.edges, self.edges_offset, self.edges_scale, self.edges_source = [float(e) for e in edges], float(offset), scale, source

    def set_values(self, values: Sequence[float]) -> None:
        """The column takes ``values`` (declared): bin ``k`` holds the ``k``-th, its edges halfway to its neighbours and
        the bounds at the ends."""
        self.values = [float(v) for v in values]
        middles = [(a + b) / 2.0 for a, b in zip(self.values[:-1], self.values[1:])]
        self.set_edges([self.min, *middles, self.max], source="values")


#: Schema keys of a numeric column's binning: ``bins`` (public edges, or their number with ``scale: log``), ``scale``,
#: and ``values`` (the values it takes: one bin each).
SCALES = ("linear", "log")
LOG_BINS = 10


def _py(value: Any) -> Any:
    """numpy scalar -> plain Python (for JSON/YAML specs)."""
    return value.item() if isinstance(value, np.generic) else value


def _numeric_values(series: pd.Series, name: str) -> pd.Series:
    values = pd.to_numeric(series, errors="coerce")
    bad = values.isna() & series.notna()
    if bad.any():  # the first one, for the console only: the exception's message is printed, never logged
        row = bad.idxmax()
        raise DataError(
            f"column {name!r} is numeric but row {row} holds {series[row]!r}, which is not a number (and maybe more "
            f"rows: pandas.to_numeric(frame[{name!r}], errors='coerce').isna() finds them); declare such markers "
            f"missing with na_values, or declare the column categorical in the schema"
        )
    return values


def _among(values: np.ndarray, declared: Sequence[float]) -> np.ndarray:
    """Whether each value is one of ``declared`` (to within 1e-4 of their closest gap: codes stored rounded)."""
    points = np.asarray(declared, dtype=np.float64)
    tolerance = 1e-4 * float(np.min(np.diff(points))) if len(points) > 1 else 0.0
    i = np.clip(np.searchsorted(points, values), 1, max(len(points) - 1, 1))
    nearest = np.minimum(np.abs(values - points[i - 1]), np.abs(values - points[np.minimum(i, len(points) - 1)]))
    return nearest <= tolerance


def _declared_categories_dtype(categories: Sequence[Any]) -> str:
    """The dtype that the declared categories themselves have (read from the declaration, never the data)."""
    if categories and all(isinstance(c, (bool, np.bool_)) for c in categories):
        return "bool"
    if categories and all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in categories):
        return "int64"
    if categories and all(isinstance(c, (int, float, np.integer, np.floating)) and not isinstance(c, (bool, np.bool_))
                          for c in categories):
        return "float64"
    return "object"


def infer_schema(
    frame: pd.DataFrame, label: str, declared: dict[str, dict[str, Any]] | None = None, *,
    estimated: Sequence[str] = (),
) -> tuple[list[ColumnSpec], ColumnSpec]:
    """Column types and metadata: declared entries win, the rest is inferred from ``frame``.

    A column with declared metadata (``min``/``max`` or ``categories``; or listed in ``estimated``: its
    bounds are paid for with DP) takes its ``type`` and ``dtype`` from the declaration too, never from
    the data, since they are released with the metadata (issue 20, finding 4: one record with age 25.5
    flipped a declared column from int64 to float64 in the release): ``type`` defaults to numeric for
    bounds, to binary for two declared categories and categorical otherwise; ``dtype`` to ``float64``
    for numeric columns (declare ``dtype: int64`` for integer outputs, which are then rounded) and to
    the declared categories' own type (all ints: ``int64``, all numbers: ``float64``, all bools:
    ``bool``, else ``object``).

    A column with nothing declared is inferred from the data (and is private metadata, which private
    models refuse): non-numeric values → categorical (two distinct values → binary); numeric with two
    distinct values → binary; otherwise numeric (integer dtype kept, outputs rounded).

    Args:
        frame: the table.
        label: the label column.
        declared: per-column declarations (``type``, ``dtype``, ``min``/``max``, ``categories``).
        estimated: numeric columns whose bounds are estimated with DP (``guess`` ranges).
    """
    declared = dict(declared or {})
    unknown = sorted(set(declared) - set(frame.columns))
    if unknown:
        raise DataError(f"schema names columns not in the data: {unknown}; columns are {list(frame.columns)}")
    specs = {}
    for name in frame.columns:
        decl = dict(declared.get(name, {}))
        col_type = decl.pop("type", None)
        if col_type is not None and col_type not in COLUMN_TYPES:
            raise DataError(f"column {name!r}: type must be one of {COLUMN_TYPES}, got {col_type!r}")
        data_blind = "categories" in decl or "min" in decl or "max" in decl or name in estimated
        if col_type is None and data_blind:  # the declaration decides, not the data
            col_type = ("binary" if len(decl["categories"]) == 2 else "categorical") if "categories" in decl else "numeric"
        series = frame[name]
        is_numeric = pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)
        if not is_numeric and col_type == "numeric":
            series = _numeric_values(series, name)
            is_numeric = True
        if not is_numeric and col_type is None:
            as_numbers = pd.to_numeric(series, errors="coerce")
            if as_numbers.notna().mean() > 0.5:  # mostly numbers: a stray marker, not a category
                _numeric_values(series, name)
        distinct = pd.unique(series.dropna())
        if col_type is None:
            col_type = "binary" if len(distinct) == 2 else ("numeric" if is_numeric else "categorical")
        if not data_blind:  # nothing declared: read from the data (private metadata)
            dtype = "bool" if pd.api.types.is_bool_dtype(series) else (str(series.dtype) if is_numeric else "object")
        elif col_type == "numeric":
            dtype = "float64"
        else:
            dtype = _declared_categories_dtype(decl.get("categories", []))
        spec = ColumnSpec(name=name, type=col_type, dtype=str(decl.pop("dtype", dtype)))
        bins, scale, points = decl.pop("bins", None), decl.pop("scale", "linear"), decl.pop("values", None)
        if (bins is not None or scale != "linear" or points is not None) and col_type != "numeric":
            raise DataError(f"column {name!r}: bins, scale and values are for numeric columns, and it is {col_type}")
        if scale not in SCALES:
            raise DataError(f"column {name!r}: scale must be one of {SCALES}, got {scale!r}")
        if points is not None and (bins is not None or scale != "linear"):
            raise DataError(f"column {name!r}: values are its bins already: declare values, or bins / scale, not both")
        if isinstance(bins, (list, tuple)) or points is not None:
            edges = _declared_edges(name, bins if points is None else points, "bins" if points is None else "values")
            decl.setdefault("min", edges[0])
            decl.setdefault("max", edges[-1])
        elif bins is not None and (scale != "log" or isinstance(bins, bool) or not isinstance(bins, int) or bins < 1):
            raise DataError(f"column {name!r}: bins must be a list of increasing edges, or a number of bins with scale: log; "
                            f"got {bins!r}")
        if col_type == "numeric":
            if "min" in decl and "max" in decl:
                spec.min, spec.max, spec.public = float(decl.pop("min")), float(decl.pop("max")), True
                if spec.max < spec.min:
                    raise DataError(f"column {name!r}: declared max {spec.max} < min {spec.min}")
            elif "min" in decl or "max" in decl:
                raise DataError(f"column {name!r}: declare both min and max, or neither")
            else:
                spec.min, spec.max = float(series.min()), float(series.max())
            if isinstance(bins, (list, tuple)) or points is not None:
                if edges[0] < spec.min or edges[-1] > spec.max:
                    raise DataError(f"column {name!r}: its {'bins' if points is None else 'values'} {edges} reach beyond its "
                                    f"bounds [{spec.min:g}, {spec.max:g}]")
                if points is None:
                    spec.set_edges(edges, source="declared")
                else:
                    spec.set_values(edges)
            elif scale == "log":
                if not spec.public or spec.max <= spec.min:
                    raise DataError(f"column {name!r}: scale: log cuts its declared range: declare min < max")
                released = dp_quantiles.log_edges(spec.min, spec.max, bins or LOG_BINS)
                spec.set_edges(released["edges"], released["offset"], released["scale"], source="log")
        else:
            if "categories" in decl:
                spec.categories, spec.public = [_py(c) for c in decl.pop("categories")], True
                outside = ~series.map(str).isin({str(c) for c in spec.categories}) & series.notna()
                if outside.any():  # the first one, for the console only (the message is printed, never logged)
                    row = outside.idxmax()
                    raise DataError(f"column {name!r}: row {row} holds {series[row]!r}, which is not among its declared "
                                    f"categories {spec.categories[:10]}: declare every value it can take, or drop those "
                                    f"rows before training")
            else:
                spec.categories = sorted((_py(v) for v in distinct), key=lambda v: (str(type(v)), v))
            if col_type == "binary" and len(spec.categories) != 2:
                raise DataError(f"column {name!r} is binary but {len(spec.categories)} categories are declared"
                                if spec.public else f"column {name!r} is declared binary but its values are not two "
                                f"categories: declare its two categories (categories: [a, b]) or another type")
        if decl:
            raise DataError(f"column {name!r}: unknown schema keys {sorted(decl)}")
        specs[name] = spec
    if label not in specs:
        raise DataError(f"label column {label!r} is not in the data; columns are {list(frame.columns)}")
    label_spec = specs.pop(label)
    if label_spec.type == "numeric":
        label_spec.type = "categorical"
        label_spec.categories = sorted(_py(v) for v in pd.unique(frame[label].dropna()))
        label_spec.public = "categories" in declared.get(label, {})
    if len(label_spec.categories) < 2:
        raise DataError(f"label column {label!r} has fewer than two classes")
    return list(specs.values()), label_spec


def _declared_edges(name: str, bins: Any, key: str = "bins") -> list[float]:
    """Public edges (or values) from the schema: at least two finite, strictly increasing numbers."""
    try:
        edges = [float(b) for b in bins]
    except (TypeError, ValueError):
        raise DataError(f"column {name!r}: {key} must be a list of numbers, got {bins!r}") from None
    if len(edges) < 2 or not np.all(np.isfinite(edges)) or not np.all(np.diff(edges) > 0):
        raise DataError(f"column {name!r}: {key} must be at least two finite, strictly increasing "
                        f"{'edges' if key == 'bins' else 'numbers'}, got {list(bins)!r}")
    return edges


def quantile_metadata(frame: pd.DataFrame, columns: Sequence[ColumnSpec], *, epsilon: float,
                      rng: np.random.Generator) -> list[dict[str, Any]]:
    """Cut the numeric columns that have public (or paid-for) bounds and no declared bins at private quantiles, in place.

    A noisy row count (Laplace) sizes the bins (:func:`~lightning_gpate.privacy.quantiles.quantiles_per_column`: none
    when the budget cannot make them informative, and the columns keep their declared ranges), then every
    edge is an exponential-mechanism quantile (:func:`~lightning_gpate.privacy.quantiles.quantile_edges`); the release
    costs what one ``epsilon``-bounded-range mechanism costs (``ε²/8``-zCDP), split as the module doc of
    :mod:`lightning_gpate.privacy.quantiles` says. An integer column of a short range (codes, ratings, small counts:
    :func:`~lightning_gpate.privacy.quantiles.integer_bins`) gets one bin per integer instead, public, and buys no
    quantile. Nothing else of the data reaches the spec.

    Returns:
        The metadata cost: the count (pure DP) and the quantiles (``mechanism: exponential``: ``events`` draws of
        ``epsilon_each``), for the model to charge at init.
    """
    chosen = [c for c in columns if c.type == "numeric" and c.edges is None and c.max > c.min]
    for c in chosen:  # an integer column of a short range: one bin per integer, public, no quantile bought
        own = dp_quantiles.integer_bins(c.min, c.max) if c.is_integer else None
        if own is not None:
            c.set_edges(own, source="integers")
    chosen = [c for c in chosen if c.edges is None]
    if not chosen:
        return []
    eps_count = dp_quantiles.count_epsilon(epsilon)
    n_hat = dp_quantiles.noisy_count(len(frame), epsilon=eps_count, rng=rng)
    count = {"what": "row count sizing the quantile bins (Laplace)", "epsilon": float(eps_count), "neighbouring": "add_remove"}
    per_column = dp_quantiles.quantiles_per_column(n_hat, epsilon, len(chosen))
    if per_column == 0:  # too few rows for this budget: the declared ranges' bins, the quantiles' share left to the model
        return [count]
    num_bins = per_column + 1  # per_column - 1 bins between quantiles, a tail bin at each end
    events = len(chosen) * per_column
    eps_each = dp_quantiles.epsilon_per_quantile(epsilon, events)
    for c in chosen:
        values = _numeric_values(frame[c.name], c.name).to_numpy(dtype=np.float64)
        released = dp_quantiles.quantile_edges(values, lower=c.min, upper=c.max, integer=c.is_integer, num_bins=num_bins,
                                               epsilon=eps_each)
        c.set_edges(released["edges"], released["offset"], released["scale"], source="dp_quantiles")
        c.point_masses = released["point_masses"] or None
    names = [c.name for c in chosen]
    return [count,
            {"what": f"quantile edges of {len(names)} numeric columns (exponential mechanism, {num_bins} bins each)",
             "epsilon": float(eps_each * events), "mechanism": "exponential", "epsilon_each": float(eps_each),
             "events": int(events), "columns": names, "neighbouring": "add_remove"}]


def split_guesses(schema: dict[str, dict[str, Any]] | None) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[float, float]]]:
    """Separate the public guess ranges (``guess: [lo, hi]``, used only by :func:`dp_metadata`) from
    the rest of the schema declarations."""
    rest, guesses = {}, {}
    for name, decl in (schema or {}).items():
        decl = dict(decl or {})
        if "guess" in decl:
            guess = decl.pop("guess")
            try:
                lo, hi = (float(v) for v in guess)
            except (TypeError, ValueError):
                raise DataError(f"column {name!r}: guess must be [lo, hi], got {guess!r}") from None
            if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise DataError(f"column {name!r}: guess must be two finite numbers lo < hi, got {guess!r}")
            guesses[name] = (lo, hi)
        rest[name] = decl
    return rest, guesses


def dp_metadata(
    frame: pd.DataFrame,
    columns: Sequence[ColumnSpec],
    guesses: dict[str, tuple[float, float]],
    *,
    epsilon: float | None,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """Replace the data-read bounds of undeclared numeric columns by ε-DP bounds, in place.

    ε is split equally among those columns (sequential composition); each column's bounds come from
    :func:`~lightning_gpate.privacy.dp_stats.dp_bounds` (two exponential-mechanism quantiles, Smith
    2011) over its public guess range, rounded outwards for integer columns (post-processing). The
    empirical min/max are overwritten and never reach the spec. Undeclared categories cannot be
    estimated this way: they must be declared.

    Returns:
        The metadata cost, ``[{"what", "epsilon", "columns", "neighbouring"}]`` per paid column (empty
        when ``epsilon`` is None; ε under add/remove-one, as the model's accountant converts it), for
        the model to charge at init (``PrivateGenerativeModel``).
    """
    unknown = sorted(set(guesses) - {c.name for c in columns if c.type == "numeric"})
    if unknown:
        raise DataError(f"guess ranges are given for {unknown}, which are not numeric feature columns")
    if epsilon is None:
        return []
    numeric = [c for c in columns if c.type == "numeric" and not c.public]
    undeclared = [c.name for c in columns if c.type != "numeric" and not c.public]
    if undeclared:
        raise DataError(
            f"metadata_epsilon estimates numeric bounds only; declare the categories of {undeclared} "
            f"in data.schema (e.g. categories: [0, 1])"
        )
    no_guess = [c.name for c in numeric if c.name not in guesses]
    if no_guess:
        raise DataError(
            f"columns {no_guess} need a public guess range for their DP bounds (schema: {{col: {{guess: [lo, hi]}}}}) "
            f"or declared min/max"
        )
    if not numeric:
        return []
    per_column = float(epsilon) / len(numeric)
    costs = []
    for c in numeric:
        values = _numeric_values(frame[c.name], c.name).to_numpy(dtype=np.float64)
        lo_guess, hi_guess = guesses[c.name]
        (lo, hi), eps = dp_bounds(values, epsilon=per_column, rng=rng, lower_guess=lo_guess, upper_guess=hi_guess)
        if c.is_integer:
            lo, hi = float(np.floor(lo)), float(np.ceil(hi))
        c.min, c.max = float(lo), float(hi)
        costs.append({"what": f"bounds of {c.name!r} (dp_bounds)", "epsilon": float(eps), "columns": [c.name],
                      "neighbouring": "add_remove"})
    return costs


class TabularTransformer:
    """Exact, invertible map between a frame in its original schema and the generator's space."""

    def __init__(self, columns: Sequence[ColumnSpec], label: ColumnSpec, column_order: Sequence[str]) -> None:
        self.columns = list(columns)
        self.label = label
        self.column_order = list(column_order)

    @property
    def output_dim(self) -> int:
        return sum(c.width for c in self.columns)

    def spans(self) -> list[tuple[int, int, str]]:
        """``(start, end, activation)`` per column of the generator's output: tanh or softmax."""
        out, start = [], 0
        for c in self.columns:
            out.append((start, start + c.width, "softmax" if c.type == "categorical" else "tanh"))
            start += c.width
        return out

    def transform(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Frame → (``[n, output_dim]`` float64 features, ``[n]`` int64 class indices).

        Numeric values outside the bounds are clipped to them (declared bounds bound each record's
        influence; this is what makes them part of the privacy analysis), with a warning on the console that
        names the column (not how many values: a count of private rows); then to the column's outer edges.
        """
        blocks = []
        for c in self.columns:
            series = frame[c.name]
            if c.type == "numeric":
                v = _numeric_values(series, c.name).to_numpy(dtype=np.float64)
                if c.public and ((v < c.min) | (v > c.max)).any():
                    warnings.warn(f"column {c.name!r}: values outside its declared bounds [{c.min:g}, {c.max:g}] were clipped "
                                  f"to them; declare wider bounds if they are real", stacklevel=2)
                if c.values and not _among(v, c.values).all():
                    warnings.warn(f"column {c.name!r}: values that are not among its declared values were moved to the "
                                  f"nearest one; declare every value it takes if they are real", stacklevel=2)
                blocks.append(self.scale_numeric(np.clip(v, c.min, c.max), c)[:, None])
            else:
                codes = self._codes(series, c)
                if c.type == "binary":
                    blocks.append((2.0 * codes - 1.0)[:, None])
                else:
                    blocks.append(np.eye(len(c.categories))[codes])
        features = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(frame), 0))
        return features, self._codes(frame[self.label.name], self.label)

    @staticmethod
    def scale_numeric(values: np.ndarray, c: ColumnSpec) -> np.ndarray:
        """A numeric column's values (within its bounds) in [-1, 1]: linear in its bounds, or bin ``k`` of its ``K``
        edges onto ``[-1 + 2k/K, -1 + 2(k+1)/K]``, placed linearly in the edges' scale (the module doc)."""
        if c.edges is None:
            span = c.max - c.min
            return np.zeros_like(values) if span == 0 else 2.0 * (values - c.min) / span - 1.0
        edges = np.asarray(c.edges, dtype=np.float64)
        k_bins = len(edges) - 1
        if c.values:  # a declared value: the middle of its own bin
            k = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, k_bins - 1)
            return -1.0 + (2.0 * k + 1.0) / k_bins
        t = dp_quantiles.warp(np.clip(values, edges[0], edges[-1]), c.edges_offset, c.edges_scale)
        te = dp_quantiles.warp(edges, c.edges_offset, c.edges_scale)
        k = np.clip(np.searchsorted(te, t, side="right") - 1, 0, k_bins - 1)
        width = te[k + 1] - te[k]
        within = np.where(width > 0, (t - te[k]) / np.where(width > 0, width, 1.0), 0.0)
        return -1.0 + 2.0 * (k + within) / k_bins

    @staticmethod
    def unscale_numeric(scaled: np.ndarray, c: ColumnSpec) -> np.ndarray:
        """The inverse of :meth:`scale_numeric` (values in [-1, 1] → the column's units, within its bounds); with edges,
        an integer column's values are the nearest integers of their own bins."""
        scaled = np.clip(scaled, -1.0, 1.0)
        if c.edges is None:
            return np.clip((scaled + 1.0) / 2.0 * (c.max - c.min) + c.min, c.min, c.max)
        edges = np.asarray(c.edges, dtype=np.float64)
        k_bins = len(edges) - 1
        te = dp_quantiles.warp(edges, c.edges_offset, c.edges_scale)
        position = (scaled + 1.0) / 2.0 * k_bins
        k = np.clip(np.floor(position).astype(np.int64), 0, k_bins - 1)
        if c.values:  # a declared value comes back as itself
            return np.asarray(c.values, dtype=np.float64)[k]
        t = te[k] + (position - k) * (te[k + 1] - te[k])
        values = np.clip(dp_quantiles.unwarp(t, c.edges_offset, c.edges_scale), edges[0], edges[-1])
        if c.is_integer:  # the nearest integer of the value's own bin (a bin's end, unwarped, may round out of it)
            lo, hi = np.ceil(edges[k]), np.floor(edges[k + 1])
            values = np.where(lo <= hi, np.clip(np.floor(values + 0.5), lo, hi), np.floor(values + 0.5))
        for bin_index, point in c.point_masses or ():  # a point mass's bin: its one value
            values = np.where(k == int(bin_index), float(point), values)
        return values

    @staticmethod
    def _codes(series: pd.Series, c: ColumnSpec) -> np.ndarray:
        lookup = {str(cat): i for i, cat in enumerate(c.categories)}
        as_str = series.map(str)
        codes = as_str.map(lookup)
        if codes.isna().any():  # the categories and the offending value only where declared (public), for the console
            row = codes.isna().idxmax()
            declared = f" {c.categories[:10]}: row {row} holds {series[row]!r}" if c.public else ""
            raise DataError(f"column {c.name!r} has values that are not among its categories{declared}; declare "
                            f"every value it can take, or drop those rows")
        return codes.to_numpy(dtype=np.int64)

    def inverse_transform(self, features: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
        """Generator space → frame with the original column names, order, dtypes, ranges, categories."""
        features = np.asarray(features, dtype=np.float64)
        if features.ndim != 2 or features.shape[1] != self.output_dim:
            raise DataError(f"expected features of shape [n, {self.output_dim}], got {features.shape}")
        data, start = {}, 0
        for c in self.columns:
            block = features[:, start:start + c.width]
            start += c.width
            if c.type == "numeric":
                v = self.unscale_numeric(block[:, 0], c)
                if c.is_integer and c.edges is not None:  # integers of their own bins (unscale_numeric), within the bounds
                    v = np.clip(v, math.ceil(c.min), math.floor(c.max))
                elif c.is_integer:
                    v = np.round(v)
                data[c.name] = pd.Series(v).astype(c.dtype)
            else:
                codes = (block[:, 0] >= 0).astype(np.int64) if c.type == "binary" else block.argmax(axis=1)
                data[c.name] = self._decode_categories(codes, c)
        data[self.label.name] = self._decode_categories(np.asarray(labels, dtype=np.int64), self.label)
        return pd.DataFrame(data)[self.column_order]

    @staticmethod
    def _decode_categories(codes: np.ndarray, c: ColumnSpec) -> pd.Series:
        values = pd.Series(np.asarray(c.categories, dtype=object)[codes])
        if c.dtype != "object":
            values = values.astype(c.dtype)
        return values

    def to_spec(self) -> dict[str, Any]:
        return {
            "columns": [asdict(c) for c in self.columns],
            "label": asdict(self.label),
            "column_order": self.column_order,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "TabularTransformer":
        return cls(
            [ColumnSpec(**c) for c in spec["columns"]], ColumnSpec(**spec["label"]), spec["column_order"]
        )


def load_builtin_table(name: str) -> tuple[pd.DataFrame, str]:
    """A table that ships with scikit-learn (no download), and its label column."""
    if name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        frame = load_breast_cancer(as_frame=True).frame
        return frame, "target"
    raise DataError(f"unknown builtin table {name!r}; choose one of {BUILTIN_TABLES}")


class TabularDataModule(GenerativeDataModule):
    """A table from a CSV file, a DataFrame, or a builtin, with a label column for conditional models.

    Args:
        path: CSV file (ignored when ``frame`` or ``builtin`` is given).
        label: label column (class of the conditional generator).
        frame: a pandas DataFrame (Python API).
        builtin: ``"breast_cancer"`` (ships with scikit-learn; its label is ``target``).
        sep: CSV separator.
        na_values: extra strings that mean "missing" (e.g. ``["?"]``).
        missing: what to do with rows that have missing values: ``"error"`` or ``"drop"``.
        drop_columns: columns to leave out (ids).
        schema: per-column declarations ``{name: {type, min, max, categories, dtype}}``; declared
            bounds/categories are public, the rest is inferred and listed as private metadata.
        class_ratio: class ratio of the label declared public (else the empirical ratio is recorded
            as private metadata that private models must not use for free).
        metadata_epsilon: ε spent (pure DP, from the model's budget) on the bounds of the numeric
            columns whose ``min``/``max`` are not declared, split equally among them; each column needs
            a public guess range ``schema: {col: {guess: [lo, hi]}}`` (see :func:`dp_metadata`).
        label_ratio_epsilon: ε spent (pure DP) on the label's class ratio (Laplace counts,
            ``dp_histogram_ratio``; G-PATE spends 0.01 on credit), instead of declaring ``class_ratio``.
        quantile_epsilon: ε of the private quantile edges of the numeric columns whose bins are not declared
            (``None``: a share of a private model's budget under ``lightning-gpate fit``; ``0``: none, equal-width
            bins of the bounds). Bins are declared with ``bins: [...]`` or ``scale: log`` in the schema. The edges
            are a noisy row count and one exponential-mechanism quantile per edge, costing what one ε-bounded-range
            mechanism does (``ε²/8``-zCDP; :func:`quantile_metadata`), charged in the model's accountant with the
            rest of its budget. ``None`` is filled in by ``lightning-gpate fit`` and ``Synthesizer``
            (:func:`~lightning_gpate.privacy.quantiles.default_quantile_epsilon`); a DataModule built by hand with
            ``None`` bins on the bounds.
        metadata_seed: seed of the DP metadata noise (the bounds, the row count, the class ratio; the quantile
            edges draw OpenDP's own secure noise whatever it is). ``None`` (default) draws fresh OS entropy: a
            seed anyone can read (e.g. in a logged config) lets them remove the noise, so a run with one
            is tagged ``privacy_guarantee=false`` (for tests only).
        **kwargs: see :class:`GenerativeDataModule` (batch size, teachers, splits).
    """

    def __init__(
        self,
        path: str | None = None,
        label: str | None = None,
        *,
        frame: pd.DataFrame | None = None,
        builtin: str | None = None,
        sep: str = ",",
        na_values: list[str] | None = None,
        missing: str = "error",
        drop_columns: list[str] | None = None,
        schema: dict[str, dict[str, Any]] | None = None,
        class_ratio: list[float] | None = None,
        metadata_epsilon: float | None = None,
        label_ratio_epsilon: float | None = None,
        quantile_epsilon: float | None = None,
        metadata_seed: int | None = None,
        batch_size: int = 64,
        num_teachers: int = 0,
        teacher_batch_size: int = 32,
        partition_seed: int = 0,
        val_fraction: float = 0.0,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size, num_teachers=num_teachers, teacher_batch_size=teacher_batch_size,
            partition_seed=partition_seed, val_fraction=val_fraction,
            test_fraction=test_fraction, split_seed=split_seed, num_workers=num_workers,
        )
        if missing not in ("error", "drop"):
            raise DataError(f"missing must be 'error' or 'drop', got {missing!r}")
        if frame is None and builtin is None and path is None:
            raise DataError("give a CSV path, a DataFrame (frame=...) or builtin='breast_cancer'")
        self.path, self.label, self.frame, self.builtin = path, label, frame, builtin
        self.sep, self.na_values, self.missing = sep, na_values, missing
        self.drop_columns = list(drop_columns or [])
        self.schema, self.class_ratio = schema, class_ratio
        for name, eps in (("metadata_epsilon", metadata_epsilon), ("label_ratio_epsilon", label_ratio_epsilon)):
            if eps is not None and not (0 < float(eps) < float("inf")):
                raise DataError(f"{name} must be a finite number > 0 (or unset), got {eps}")
        if label_ratio_epsilon is not None and class_ratio is not None:
            raise DataError("give either class_ratio (declared public) or label_ratio_epsilon (paid with DP), not both")
        if quantile_epsilon is not None and not (0 <= float(quantile_epsilon) < float("inf")):
            raise DataError(f"quantile_epsilon must be a finite number >= 0 (0: bins on the declared bounds), got {quantile_epsilon}")
        self.metadata_epsilon, self.label_ratio_epsilon = metadata_epsilon, label_ratio_epsilon
        self.quantile_epsilon = quantile_epsilon
        self.metadata_seed = metadata_seed
        self.save_hyperparameters(ignore=["frame"])
        self._ensure_loaded()  # fail at construction on a bad file, column or value

    def read_frame(self) -> pd.DataFrame:
        """The table as given, before any transform (with missing-value handling applied)."""
        if self.frame is not None:
            frame = self.frame.copy()
        elif self.builtin is not None:
            frame, builtin_label = load_builtin_table(self.builtin)
            self.label = self.label or builtin_label
        else:
            path = Path(self.path)
            if not path.is_file():
                raise DataError(f"data file not found: {path.resolve()}")
            frame = read_data_csv(path, sep=self.sep, na_values=self.na_values)
            if frame.shape[1] == 1 and self.sep == "," and ";" in frame.columns[0]:
                raise DataError(f"{path} has one column {frame.columns[0][:60]!r}...: is it ';'-separated? set sep: ';'")
        if self.label is None:
            raise DataError("no label column given (label: NAME)")
        missing_drop = sorted(set(self.drop_columns) - set(frame.columns))
        if missing_drop:
            raise DataError(f"drop_columns names columns not in the data: {missing_drop}")
        frame = frame.drop(columns=self.drop_columns)
        if self.label not in frame.columns:
            raise DataError(f"label column {self.label!r} is not in the data; columns are {list(frame.columns)}")
        holes = frame.isna()
        if holes.any().any():
            if self.missing == "drop":  # a per-record transformation: neighbouring inputs stay neighbours
                frame = frame[~holes.any(axis=1)]  # the index kept: an error names a row as it was read
            else:
                columns = [k for k, v in holes.any().items() if v]  # not how many: a private count
                raise DataError(
                    f"missing values (NaN) in columns {columns}; set missing: drop to drop those rows, "
                    f"or fill them before training"
                )
        if len(frame) == 0:
            raise DataError("the table has no rows (after dropping rows with missing values)")
        return frame

    def split_frame(self, split: str) -> pd.DataFrame:
        """A split (``train``, ``val``, ``test``) as the original frame's rows, untransformed."""
        self._ensure_loaded()
        return self._frame.iloc[self.split_indices[split].numpy()].reset_index(drop=True)

    #: Data-spec entries that may hold metadata estimated with DP (and what follows from it).
    RELEASED_METADATA_KEYS = ("metadata_cost", "columns", "label", "column_order", "class_ratio", "class_ratio_source",
                              "shape", "spans", "class_names", "split_keys")
    #: ``split_keys`` of a spec whose split was decided on the rows in their declared scale, before any DP draw (a spec
    #: without it split its rows by their features in the released bins: it keeps doing so when resumed).
    DECLARED_SPLIT_KEYS = "declared_schema"

    def _released_metadata_differs(self, released: dict[str, Any]) -> bool:
        mine = self.spec
        return any(mine.get(k) != released.get(k) for k in self.RELEASED_METADATA_KEYS)

    @staticmethod
    def _declared_keys(frame: pd.DataFrame, columns: Sequence[ColumnSpec], label: ColumnSpec) -> np.ndarray:
        """The rows' split keys from the columns as declared, before any DP draw: each row's features on its declared
        bounds and bins, a numeric column whose bounds are drawn with DP by its value itself; so the split depends on
        nothing but each record, the public seed and fractions (and equals the split of the same table without DP
        metadata, whose features these are)."""
        declared = TabularTransformer(columns, label, list(frame.columns))
        with warnings.catch_warnings():  # the fit's own transform warns of clipped values once
            warnings.simplefilter("ignore")
            features, labels = declared.transform(frame)
        for (start, _, _), c in zip(declared.spans(), columns):
            if c.type == "numeric" and not c.public:
                features[:, start] = _numeric_values(frame[c.name], c.name).to_numpy(dtype=np.float64)
        return record_keys(features.astype(np.float32), labels)

    def _load(self) -> dict[str, Any]:
        frame = self.read_frame()
        self._frame = frame
        schema, guesses = split_guesses(self.schema)
        columns, label_spec = infer_schema(frame, self.label, schema, estimated=list(guesses))
        if self._released_spec is not None:  # resumed, or shared by the fit's processes: released metadata, not a new DP estimate
            released = self._released_spec
            if [c["name"] for c in released["columns"]] != [c.name for c in columns] or released["label"]["name"] != label_spec.name:
                raise DataError("the released data spec this fit continues (its checkpoint's) has other columns than this data: "
                                "continue with the data it was drawn from")
            keys = (self._declared_keys(frame, columns, label_spec)
                    if released.get("split_keys") == self.DECLARED_SPLIT_KEYS else None)
            self.transformer = TabularTransformer.from_spec(released)
            features, labels = self.transformer.transform(frame)
            spec = {k: released[k] for k in self.RELEASED_METADATA_KEYS if k in released}
            spec.update(kind="tabular", num_classes=int(released["num_classes"]), private_metadata=[])
            tensors = (torch.from_numpy(features.astype(np.float32)), torch.from_numpy(labels.copy()))
            return {"splits": {"train": tensors}, "spec": spec, "keys": keys}
        # The split first, from public seeds and fractions: every DP draw then reads the training rows only (held-out
        # rows neither shape the bins nor cost privacy). Where the columns' transform takes DP draws (bounds, quantile
        # bins), the split is decided on the columns as declared; else on the features themselves, as it always was.
        draws_columns = self.metadata_epsilon is not None or bool(self.quantile_epsilon)
        if draws_columns:
            keys = self._declared_keys(frame, columns, label_spec)
        else:
            self.transformer = TabularTransformer(columns, label_spec, list(frame.columns))
            features, labels = self.transformer.transform(frame)
            keys = record_keys(features.astype(np.float32), labels)
        train_rows = self.split_rows(keys)["train"].numpy()
        train = frame.iloc[train_rows]
        rng = np.random.default_rng(secret_seed() if self.metadata_seed is None else self.metadata_seed)
        paid = dp_metadata(train, columns, guesses, epsilon=self.metadata_epsilon, rng=rng)
        if self.quantile_epsilon:  # after the bounds: the quantiles' candidates lie within public (or paid) ones
            bounded = {c.name for c in columns if c.public} | {n for cost in paid for n in cost.get("columns", [])}
            paid += quantile_metadata(train, [c for c in columns if c.name in bounded], epsilon=float(self.quantile_epsilon), rng=rng)
        if draws_columns:  # the features in the drawn bounds and bins
            self.transformer = TabularTransformer(columns, label_spec, list(frame.columns))
            features, labels = self.transformer.transform(frame)
        num_classes = len(label_spec.categories)
        if self.class_ratio is not None:
            if len(self.class_ratio) != num_classes or min(self.class_ratio) < 0 or sum(self.class_ratio) <= 0:
                raise DataError(f"class_ratio must give {num_classes} non-negative weights, got {self.class_ratio}")
            ratio, source = list(np.asarray(self.class_ratio) / sum(self.class_ratio)), "public"
        elif self.label_ratio_epsilon is not None:
            ratio, eps = dp_histogram_ratio(labels[train_rows], num_classes=num_classes, epsilon=self.label_ratio_epsilon, rng=rng)
            ratio, source = list(ratio), "dp"
            paid.append({"what": f"class ratio of {label_spec.name!r} (Laplace counts)", "epsilon": float(eps),
                         "neighbouring": "add_remove"})
        else:
            ratio, source = list(np.bincount(labels[train_rows], minlength=num_classes) / len(train_rows)), "data"
        if self.metadata_seed is not None:  # replayable noise: the run's ε is no guarantee (privacy.disclosure)
            paid = [{**cost, "mechanism_seed": "fixed"} for cost in paid]
        paid_columns = {name for cost in paid for name in cost.get("columns", [])}
        private = [c.name for c in columns if not c.public and c.name not in paid_columns]
        if not label_spec.public:
            private.append(label_spec.name)
        spec = {
            "metadata_cost": paid,
            "kind": "tabular",
            "shape": [self.transformer.output_dim],
            "num_classes": num_classes,
            "class_names": [str(c) for c in label_spec.categories],
            "class_ratio": [float(r) for r in ratio],
            "class_ratio_source": source,
            "private_metadata": private,
            "spans": [list(s) for s in self.transformer.spans()],
            **self.transformer.to_spec(),
        }
        if draws_columns:
            spec["split_keys"] = self.DECLARED_SPLIT_KEYS
        tensors = (torch.from_numpy(features.astype(np.float32)), torch.from_numpy(labels.copy()))
        return {"splits": {"train": tensors}, "spec": spec, "keys": keys}
