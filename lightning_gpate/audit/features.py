"""What the attack sees of a synthetic table: a fixed-length feature vector.

* **Querybased** (Houssiau et al. 2022, TAPAS; the replication study's worst case): each column is
  discretised into two bins, "the target's value" (categories: equal; numeric columns: within
  ``tolerance`` of the declared range) and "anything else"; the features count the synthetic rows in
  each of the ``2^d`` points of that neighbourhood. For the worst case (three 0/1 columns, target
  (1, 1, 1)) these are exactly the counts of the 8 points of {0, 1}³. Beyond ``max_full_columns``
  columns, the counts of rows matching the target on every single column, every pair and all columns.
* **GroundHog** (Stadler, Oprisanu & Troncoso 2022, "naive" features): per encoded column (numeric
  scaled to [0, 1] by its declared bounds, binary 0/1, categorical and the label one-hot) the min,
  max, mean, median and variance over the synthetic rows.

Both read only the public schema (the data spec's column types, bounds and categories).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

__all__ = ["FEATURIZERS", "querybased_features", "groundhog_features", "target_matches", "encode", "category_codes"]


def _columns(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Column specs in the table's column order (features and label)."""
    by_name = {c["name"]: c for c in [*spec["columns"], spec["label"]]}
    return [by_name[name] for name in spec["column_order"]]


def category_codes(values: pd.Series, categories: list[Any]) -> np.ndarray:
    """Index of each value among ``categories`` (−1 if none): equal as text, or as numbers (so that a
    table read back from CSV, ``1`` or ``1.0``, matches either spelling)."""
    text = {str(c): i for i, c in enumerate(categories)}
    numbers = {}
    for i, c in enumerate(categories):
        try:
            numbers.setdefault(float(c), i)
        except (TypeError, ValueError):
            pass
    out = []
    for v in values.tolist():
        code = text.get(str(v))
        if code is None:
            try:
                code = numbers.get(float(v))
            except (TypeError, ValueError):
                code = None
        out.append(-1 if code is None else code)
    return np.asarray(out, dtype=np.int64)


def target_matches(table: pd.DataFrame, target: Mapping[str, Any], spec: Mapping[str, Any], *, tolerance: float = 0.05) -> np.ndarray:
    """``[rows, columns]`` booleans: does a row fall in the target's bin of each column?

    Categorical, binary and label columns: the same category. Numeric columns: within
    ``tolerance × (max − min)`` of the target's value (declared bounds).
    """
    out = []
    for c in _columns(spec):
        values, want = table[c["name"]], target[c["name"]]
        if c["type"] == "numeric":
            width = tolerance * (float(c["max"]) - float(c["min"]))
            v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
            out.append(np.abs(v - float(want)) <= width)
        else:
            codes = category_codes(values, c["categories"])
            want_code = category_codes(pd.Series([want]), c["categories"])[0]
            out.append((codes == want_code) & (want_code >= 0))
    return np.stack(out, axis=1) if out else np.zeros((len(table), 0), dtype=bool)


def querybased_features(table: pd.DataFrame, target: Mapping[str, Any], spec: Mapping[str, Any], *,
                        tolerance: float = 0.05, max_full_columns: int = 10) -> np.ndarray:
    """Counts of synthetic rows at each point of the target's discretised neighbourhood (see the
    module docstring). Point ``j`` of the ``2^d`` has bit ``i`` set when column ``i`` takes the
    target's value; for 0/1 columns and target (1, …, 1) that is the row ``bits(j)`` itself."""
    matches = target_matches(table, target, spec, tolerance=tolerance)
    d = matches.shape[1]
    if d <= max_full_columns:
        codes = matches.astype(np.int64) @ (1 << np.arange(d, dtype=np.int64))
        return np.bincount(codes, minlength=1 << d).astype(np.float64)
    subsets = [(i,) for i in range(d)] + list(itertools.combinations(range(d), 2)) + [tuple(range(d))]
    return np.array([matches[:, list(s)].all(axis=1).sum() for s in subsets], dtype=np.float64)


def encode(table: pd.DataFrame, spec: Mapping[str, Any]) -> np.ndarray:
    """The table as numbers by its public schema: numeric columns scaled to [0, 1] by their declared
    bounds, binary columns 0/1, categorical columns (and the label) one-hot."""
    blocks = []
    for c in _columns(spec):
        values = table[c["name"]]
        if c["type"] == "numeric":
            lo, hi = float(c["min"]), float(c["max"])
            v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
            blocks.append(((v - lo) / (hi - lo) if hi > lo else v - lo)[:, None])
        else:
            codes = category_codes(values, c["categories"])
            onehot = (codes[:, None] == np.arange(len(c["categories"]))[None, :]).astype(np.float64)
            blocks.append(onehot[:, 1:] if c["type"] == "binary" else onehot)
    return np.concatenate(blocks, axis=1)


def groundhog_features(table: pd.DataFrame, target: Mapping[str, Any], spec: Mapping[str, Any]) -> np.ndarray:
    """Min, max, mean, median and variance of every encoded column (:func:`encode`; the target is
    not used), grouped by statistic."""
    encoded = encode(table, spec)
    stats = [encoded.min(0), encoded.max(0), encoded.mean(0), np.median(encoded, axis=0), encoded.var(0)]
    return np.concatenate(stats).astype(np.float64)


FEATURIZERS: dict[str, Callable[..., np.ndarray]] = {"querybased": querybased_features, "groundhog": groundhog_features}
