"""Utility against ε across models, drawn from the committed benchmark results (nothing is trained here).

Panels:

* **cervical** and **cardio** (tables): mean AUROC of PATE-GAN's 12 classifiers trained on synthetic
  rows and tested on real ones (Setting B), mean ± sd over seeds, from ``tabular_utility.jsonl``
  (``benchmarks/tabular_utility.py``); cardio shows the logistic regression's AUROC (its larger
  benchmark scored fewer systems). Real data (Setting A) and the non-private GAN are lines.
* **images**: accuracy on the real test digits of a logistic regression trained on 2,000 generated
  digits: the quickstart's runs (``quickstart.jsonl``, ``benchmarks/quickstart_check.py``) and the G-PATE
  ladder (``gpate_ladder_digits.jsonl``: ε≈10 and noise-free variants). Noise-free runs sit at the right edge,
  labelled "no noise".

``--mnist`` draws the README's MNIST figure instead: the CNN accuracy (epoch chosen on synthetic digits) on the
10,000 real test digits against ε of every model's headline row of ``mnist_table.json``
(``benchmarks/mnist_table.py``) and of DP-MERF's feature-map rows (a line of their own), each point labelled with its
hardware; stale or partial runs hollow.

Every ε is a guarantee (δ = 1e-5). Writes ``docs/img/utility_vs_epsilon.png`` (``docs/img/mnist_accuracy_vs_epsilon.png``)::

    python benchmarks/utility_vs_epsilon.py [--out docs/img/utility_vs_epsilon.png]
    python benchmarks/utility_vs_epsilon.py --mnist
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

NO_NOISE_X = 100.0  # where noise-free runs are drawn on the log ε axis
CHANCE_DIGITS = 0.1


def tabular_cells(path: Path) -> dict[tuple[str, str], dict[float, list[float]]]:
    """(dataset, system) → ε → the seeds' scores (AUROC on cervical, LR AUROC on cardio), one per cell."""
    from tabular_utility import cell_key, load_results

    cells: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    last = {cell_key(r): r for r in load_results(path) if r.get("status") == "ok"}
    for r in last.values():
        score = r.get("lr_auroc") if r["dataset"] == "cardio" else r.get("auroc")
        if score is not None and not math.isnan(float(score)):
            cells[(r["dataset"], r["system"])][float(r["epsilon"])].append(float(score))
    return cells


def image_points() -> list[dict]:
    """Every committed image result with a logistic-regression score: ``{series, epsilon, score}``."""
    from image_utility import read_jsonl

    points = []
    for r in read_jsonl(RESULTS / "quickstart.jsonl"):
        if r.get("logreg_2000") is None or r.get("extra") or r.get("paper_defaults") or r.get("scored_on", "test") != "test":
            continue
        config = r.get("config")
        if config is None:  # before issue 47
            points.append({"series": "G-PATE, the former quickstart (700 teachers × 2 digits)", "epsilon": r["epsilon"], "score": r["logreg_2000"]})
        elif config in ("configs/quickstart.yaml", "configs/gpate_digits_eps1.yaml"):
            points.append({"series": "G-PATE, the quickstart (anchor + votes; ε = 1: gpate_digits_eps1)", "epsilon": r["epsilon"],
                           "score": r["logreg_2000"]})
    for r in read_jsonl(RESULTS / "gpate_ladder_digits.jsonl"):
        if r.get("logreg_2000") is None or r.get("epsilon_spent") is None:
            continue
        noise_free = r["epsilon_budget"] > 1e6
        points.append({"series": "G-PATE ladder variants (digits)", "epsilon": math.inf if noise_free else r["epsilon_spent"],
                       "score": r["logreg_2000"]})
    return points


def _x(eps: float) -> float:
    return NO_NOISE_X if math.isinf(eps) else eps


def draw(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tabular_utility import NAMES, PEERS

    cells = tabular_cells(RESULTS / "tabular_utility.jsonl")
    fig, axes = plt.subplots(1, 3, figsize=(16, 6.4))
    for ax, dataset, ylabel in ((axes[0], "cervical", "mean AUROC of 12 classifiers (synthetic → real)"),
                                (axes[1], "cardio", "logistic regression AUROC (synthetic → real)")):
        systems = sorted({s for (d, s) in cells if d == dataset}, key=lambda s: list(NAMES).index(s) if s in NAMES else 99)
        for i, system in enumerate(systems):
            by_eps = cells[(dataset, system)]
            if system in ("real", "gan"):
                value = float(np.mean(by_eps[math.inf]))
                ax.axhline(value, ls=":", color="black" if system == "gan" else "grey", label=f"{NAMES[system]}: {value:.2f}")
                continue
            eps = sorted(by_eps)
            means = [float(np.mean(by_eps[e])) for e in eps]
            sds = [float(np.std(by_eps[e])) for e in eps]
            peer = system in PEERS  # smartnoise and private-pgm: dashed
            ax.errorbar([e * (1 + 0.04 * (i - len(systems) / 2)) for e in eps], means, yerr=sds, marker="o", capsize=3,
                        ls="--" if peer else "-", label=NAMES.get(system, system))
        ax.axhline(0.5, color="lightgrey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks([1, 10], ["1", "10"])
        ax.set_xlabel("ε (guarantee, δ = 1e-5)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{dataset} (table)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)

    ax = axes[2]
    series: dict[str, list[dict]] = defaultdict(list)
    for p in image_points():
        series[p["series"]].append(p)
    markers = iter("o^Dv<>p*")
    for name, pts in sorted(series.items(), key=lambda kv: "quickstart" in kv[0]):  # the quickstart drawn last, on top
        quickstart = "quickstart" in name
        ax.scatter([_x(p["epsilon"]) for p in pts], [p["score"] for p in pts], label=name, alpha=0.9,
                   marker="*" if quickstart else next(markers, "o"), s=180 if quickstart else 30, zorder=3 if quickstart else 2,
                   edgecolors="black" if quickstart else "none")
    ax.axhline(CHANCE_DIGITS, color="lightgrey", lw=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_xlim(0.7, NO_NOISE_X * 1.6)
    ax.set_xticks([1, 10, NO_NOISE_X], ["1", "10", "no noise"])
    ax.set_ylim(0, 1)
    ax.set_xlabel("ε (guarantee, δ = 1e-5)")
    ax.set_ylabel("accuracy on real test digits (LogReg on 2,000 samples)")
    measured_mnist = any("mnist" in name for name in series)
    ax.set_title("8×8 digits (images)" + ("" if measured_mnist else "; MNIST: awaiting a GPU run"))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)
    fig.suptitle("Utility against ε across models (from benchmarks/results/, every ε a guarantee)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


#: The field's published MNIST figures without public data (``../shared/REFERENCE.md``, δ = 1e-5 unless said), each with
#: its protocol (their classifiers and synthetic sets differ from this table's CNN on 10,000 digits): drawn as anchors.
PUBLISHED_MNIST = {
    "DPDM (CNN on 60k)": {0.2: 0.863, 1: 0.953, 10: 0.981},
    "FETA-Pro (ResNets on 55k)": {0.2: 0.862, 1: 0.971, 10: 0.986},
    "DP-MERF's paper recipe (DPDM's Table 1)": {10: 0.821},
}


def draw_mnist(out: Path) -> Path:
    """CNN accuracy (val-selected) against ε for every model's headline MNIST row (``mnist_table.json``), beside the
    field's published figures (:data:`PUBLISHED_MNIST`, open markers, their own protocols)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mnist_table import DPMERF_SCATTERING, ROWS, row_status

    table = json.loads((RESULTS / "mnist_table.json").read_text())
    records = table["rows"]
    by_model: dict[str, list[tuple[float, float, str, str]]] = defaultdict(list)
    gan = None
    # beside each model's headline rows, DP-MERF's feature-map config (seed 0, δ = 1e-5): a second recipe, its own line
    feature_maps = {row.name for row in DPMERF_SCATTERING if not row.seed and "delta" not in row.overrides}
    for row in (r for r in ROWS if r.headline or r.name in feature_maps):
        r = records.get(row.name)
        if r is None or r.get("status") != "done" or r.get("cnn_accuracy_val_selected") is None:
            continue
        if r.get("privacy") != "guarantee":
            gan = (float(r["cnn_accuracy_val_selected"]), r.get("machine", "?"))
            continue
        series = r["model"] + (" warm-started" if "_warm_" in row.name else "")  # another recipe: its own line
        series += " (pixels + scattering features)" if row.name in feature_maps else ""
        by_model[series].append((float(r["epsilon_budget"]), float(r["cnn_accuracy_val_selected"]), r.get("machine", "?"),
                                     row_status(row, r)))
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for i, (model, pts) in enumerate(sorted(by_model.items())):
        pts.sort()
        color = f"C{i}"
        machines = ", ".join(sorted({m for _, _, m, _ in pts}))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, alpha=0.6, label=f"{model} ({machines})")
        for eps, acc, _, status in pts:
            current = status == "current"
            ax.scatter([eps], [acc], s=60, color=color if current else "white", edgecolors=color, zorder=3)
            if not current:
                ax.annotate(status.split(":")[0].lower(), (eps, acc), textcoords="offset points", xytext=(6, -3), fontsize=7, color=color)
    for j, (name, points) in enumerate(PUBLISHED_MNIST.items()):
        eps = sorted(points)
        ax.plot(eps, [points[e] for e in eps], ls="--", lw=0.8, marker=("D", "s", "^")[j % 3], markersize=5,
                markerfacecolor="white", color="dimgrey", alpha=0.8, label=f"published: {name}")
    if gan is not None:
        ax.axhline(gan[0], ls=":", color="black", label=f"non-private GAN: {gan[0]:.3f} ({gan[1]})")
    real = table.get("meta", {}).get("real_baseline", {}).get("cnn_accuracy_val_selected")
    if real is not None:
        ax.axhline(real, ls=":", color="grey", label=f"real training digits: {real:.3f}")
    ax.axhline(CHANCE_DIGITS, color="lightgrey", lw=0.8, label="chance")
    ax.set_xscale("log")
    epsilons = [p[0] for pts in by_model.values() for p in pts] + [e for points in PUBLISHED_MNIST.values() for e in points]
    ticks = [t for t in (0.2, 0.5, 1, 2, 5, 10) if min(epsilons) / 1.5 <= t <= max(epsilons) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(min(epsilons) / 1.4, max(epsilons) * 1.4)
    ax.set_ylim(0, 1)
    ax.set_xlabel("ε (guarantee, δ = 1e-5)")
    ax.set_ylabel("CNN accuracy on the 10,000 real test digits")
    ax.set_title("MNIST, each model's headline row and DP-MERF's feature-map rows; hollow: stale or partial; grey: published", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mnist", action="store_true", help="the MNIST figure (mnist_table.json) instead")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.mnist:
        print(f"wrote {draw_mnist(Path(args.out or ROOT / 'docs' / 'img' / 'mnist_accuracy_vs_epsilon.png'))}")
    else:
        print(f"wrote {draw(Path(args.out or ROOT / 'docs' / 'img' / 'utility_vs_epsilon.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
