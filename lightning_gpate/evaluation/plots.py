"""Figures of a synthetic table against a real one: marginals and Spearman correlation matrices.

Drawn on ``matplotlib.figure.Figure`` objects rendered by the Agg canvas, without pyplot: files only,
never shown, and the backend of the user's session (e.g. a notebook's) is left alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_gpate.evaluation.tabular import FeatureEncoder


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def marginal_plot(
    real: pd.DataFrame | None,
    synthetic: pd.DataFrame,
    path: str | Path,
    *,
    max_columns: int = 48,
    max_categories: int = 20,
    columns: list[str] | None = None,
    real_label: str = "real",
) -> Path:
    """One panel per column: overlaid density histograms (numeric, bins over the real range) or side by
    side category frequencies (other columns), real vs synthetic; the synthetic alone where ``real`` is
    ``None`` (e.g. the picture beside a private model's samples). Writes ``path`` (PNG).

    Args:
        columns: the columns to draw (default: the first ``max_columns``).
        real_label: the legend's name of ``real`` (e.g. a public reference set).
    """
    base = real if real is not None else synthetic
    numeric, _ = FeatureEncoder.column_kinds(base)
    columns = (list(columns) if columns is not None else list(base.columns))[:max_columns]
    ncols = min(6, len(columns))
    nrows = math.ceil(len(columns) / ncols)
    fig = _figure(3.0 * ncols, 2.4 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, name in zip(axes.flat, columns):
        r, s = (real[name] if real is not None else None), synthetic[name]
        if name in numeric and base[name].nunique(dropna=True) > 2:
            rv = pd.to_numeric(r, errors="coerce").dropna().to_numpy(float) if r is not None else None
            sv = pd.to_numeric(s, errors="coerce").dropna().to_numpy(float)
            ranged = rv if rv is not None else sv
            lo, hi = (ranged.min(), ranged.max()) if len(ranged) else (0.0, 1.0)
            bins = np.linspace(lo, hi if hi > lo else lo + 1.0, 21)
            if rv is not None:
                ax.hist(rv, bins=bins, density=True, alpha=0.5, label=real_label)
            ax.hist(np.clip(sv, bins[0], bins[-1]), bins=bins, density=True, alpha=0.5, label="synthetic", color="C1")
        else:
            rc = FeatureEncoder._as_category(r) if r is not None else None
            sc = FeatureEncoder._as_category(s)
            cats = pd.Series(rc if rc is not None else sc).value_counts().index[:max_categories].tolist()
            pos = np.arange(len(cats))
            width = 0.4 if rc is not None else 0.8
            if rc is not None:
                ax.bar(pos - 0.2, [np.mean(rc == c) for c in cats], width=width, label=real_label)
            ax.bar(pos + (0.2 if rc is not None else 0.0), [np.mean(sc == c) for c in cats], width=width, label="synthetic", color="C1")
            ax.set_xticks(pos, [str(c)[:8] for c in cats], fontsize=6, rotation=45)
        ax.set_title(str(name)[:30], fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    return path


def correlation_plot(real_corr: pd.DataFrame, synthetic_corr: pd.DataFrame, path: str | Path) -> Path:
    """Three heatmaps: the real and the synthetic Spearman correlation matrices and their |difference|."""
    n = len(real_corr)
    size = max(4.0, min(12.0, 0.25 * n + 2))
    fig = _figure(3 * size, size)
    axes = fig.subplots(1, 3)
    diff = (real_corr.fillna(0) - synthetic_corr.fillna(0)).abs()
    for ax, (title, m, cmap, vmin) in zip(axes, (("real", real_corr, "coolwarm", -1), ("synthetic", synthetic_corr, "coolwarm", -1), ("|real - synthetic|", diff, "viridis", 0))):
        im = ax.imshow(m.to_numpy(dtype=float), cmap=cmap, vmin=vmin, vmax=1)
        ax.set_title(f"Spearman: {title}")
        labels = [str(c)[:20] for c in m.columns]
        ax.set_xticks(range(n), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(n), labels, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    return path


def tabular_figures(real: pd.DataFrame, synthetic: pd.DataFrame, out_dir: str | Path, *, tag: str = "final", marginals: bool = True) -> list[Path]:
    """Spearman correlation heatmaps (``spearman_<tag>.png``), the two matrices as CSV
    (``spearman_real_<tag>.csv``, ``spearman_synthetic_<tag>.csv``) and, if asked, the marginals
    (``marginals_<tag>.png``), written to ``out_dir``. Returns the paths."""
    from lightning_gpate.evaluation.tabular import spearman_matrices

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    real_corr, syn_corr = spearman_matrices(real, synthetic)
    paths = [correlation_plot(real_corr, syn_corr, out_dir / f"spearman_{tag}.png")]
    for name, corr in (("real", real_corr), ("synthetic", syn_corr)):
        corr.to_csv(out_dir / f"spearman_{name}_{tag}.csv")
        paths.append(out_dir / f"spearman_{name}_{tag}.csv")
    if marginals:
        paths.append(marginal_plot(real, synthetic, out_dir / f"marginals_{tag}.png"))
    return paths
