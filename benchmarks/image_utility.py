"""Image utility of every generator at ε ∈ {1, 10} (guaranteed) and noise-free, in one run.

Models: G-PATE with DPGradAgg (``gpate``) and with DataLens' TopAgg (``gpate_topagg``), DP-GAN,
GS-WGAN, PATE-GAN and the non-private GAN. Each case trains from a config of ``configs/`` (the
privacy budget ends most runs), then is evaluated on the real test split: CNN accuracy (last epoch
and validation-selected, never selected on the test split), Inception Score and FID with a feature
classifier trained on the real training split, and a logistic regression trained on 2,000 samples
(the quickstart's criterion). Every case writes one JSON record under
``benchmarks/results/image_utility_<preset>/``; the table (``image_utility_<preset>.md``) and the plot
of accuracy against ε (``image_utility_<preset>.png``) are rebuilt from all records, so a long run can
be split over several calls (``--models``, ``--eps``).

"noise-free" runs G-PATE with σ ≈ 0 and no budget (``epsilon=1e12``): what the mechanism's signal
can do at best; for the GAN it is its only row. DP-GAN, GS-WGAN and PATE-GAN have no noise-free row.

Preset: ``digits`` (scikit-learn's 8×8 digits, CPU-sized). The official MNIST (60,000 training and
10,000 test digits) has its own runner, with the papers' settings: ``benchmarks/mnist_table.py``.

Usage::

    python benchmarks/image_utility.py --preset digits --threads 2
    python benchmarks/image_utility.py --preset digits --models gpate gan --eps 10 inf
    python benchmarks/image_utility.py --preset digits --table-only   # rebuild table and plot
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

NOISE_FREE = "inf"
MODELS = ("gpate", "gpate_topagg", "dpgan", "gswgan", "pategan", "gan")
EPSILONS = ("1", "10", NOISE_FREE)

# G-PATE without noise and without a budget: the mechanism's best case (σ must stay > 0 for the event).
_GPATE_NOISE_FREE = {"epsilon": 1e12, "sigma_threshold": 1e-3, "sigma_gnmax": 1e-3, "sigma_topagg": 1e-3, "sigma_gaussian": 1e-3}


# preset -> data overrides, model -> {eps -> (config, model overrides, data overrides)}
PRESETS: dict[str, dict[str, Any]] = {
    "digits": {
        "data": {"dataset": "digits", "val_fraction": 0.0, "test_fraction": 0.2},
        "cases": {
            "gpate": {"1": ("configs/gpate_digits_eps1.yaml", {}, {}),
                      "10": ("configs/quickstart.yaml", {}, {}),
                      NOISE_FREE: ("configs/quickstart.yaml", _GPATE_NOISE_FREE, {})},
            "gpate_topagg": {"1": ("configs/gpate_topagg_digits.yaml", {"epsilon": 1.0, "sigma_topagg": 1500.0}, {}),
                             "10": ("configs/gpate_topagg_digits.yaml", {"epsilon": 10.0}, {}),
                             NOISE_FREE: ("configs/gpate_topagg_digits.yaml", _GPATE_NOISE_FREE, {})},
            "dpgan": {"1": ("configs/dpgan_digits.yaml", {"epsilon": 1.0}, {}),
                      "10": ("configs/dpgan_digits.yaml", {"epsilon": 10.0}, {})},
            "gswgan": {"1": ("configs/gswgan_digits.yaml", {"epsilon": 1.0}, {}),
                       "10": ("configs/gswgan_digits.yaml", {"epsilon": 10.0}, {})},
            "pategan": {"1": ("configs/pategan_digits.yaml", {"epsilon": 1.0}, {}),
                        "10": ("configs/pategan_digits.yaml", {"epsilon": 10.0}, {})},
            "gan": {NOISE_FREE: ("configs/gan_digits.yaml", {}, {})},
        },
    },
}


# ----------------------------------------------------------------------------------------------- one case
def _import(class_path: str):
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def load_config(path: str | Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT / path).read_text())


#: Where a config's settings came from (issue 58): every shipped config says it in one comment line,
#: ``# Settings from: <label> (<what, and the results page that shows it>)``; a table row's record carries the label.
SETTINGS_PROVENANCE = {
    "paper": "the paper's or its reference code's settings (sized to the budget or the machine), not tuned here",
    "validation": "chosen on a validation split of the training data (unaccounted tuning)",
    "test→validation": "first found in development runs scored on the test split, then re-checked on a validation split",
    "test": "chosen in development runs scored on the test split, not re-checked: its test figure is optimistic",
    "untuned": "not tuned for utility (a baseline, a smoke or audit config)",
}
PROVENANCE_LINE = "# Settings from: "


def settings_provenance(path: str | Path) -> tuple[str, str]:
    """``(label, detail)`` of a config's ``# Settings from:`` comment (continued on the comment lines indented by
    two spaces after it); the label is one of :data:`SETTINGS_PROVENANCE`. Raises ``ValueError`` when the config
    states none, or another."""
    lines = (ROOT / path).read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(PROVENANCE_LINE)]
    if len(starts) != 1:
        raise ValueError(f"{path} must state where its settings came from in one '{PROVENANCE_LINE.strip()}' line "
                         f"(found {len(starts)})")
    text = [lines[starts[0]].removeprefix(PROVENANCE_LINE)]
    for line in lines[starts[0] + 1:]:
        if not line.startswith("#  "):
            break
        text.append(line.removeprefix("#  "))
    full = " ".join(text)
    label = next((k for k in sorted(SETTINGS_PROVENANCE, key=len, reverse=True) if full.startswith(k + " (") or full == k), None)
    if label is None:
        raise ValueError(f"{path}: '{PROVENANCE_LINE.strip()}' must start with one of {list(SETTINGS_PROVENANCE)}, got {full[:40]!r}")
    return label, full[len(label):].strip().removeprefix("(").removesuffix(".").removesuffix(")")


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` model overrides of the benchmarks' ``--set`` (YAML values; a leading ``model.`` is dropped)."""
    import yaml

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        parsed = yaml.safe_load(value)
        if isinstance(parsed, str):  # YAML 1.1 reads 1e8 (no dot, no sign) as a string: a number is meant
            try:
                parsed = float(parsed)
            except ValueError:
                pass
        out[key.removeprefix("model.")] = parsed
    return out


def build(config: dict[str, Any], *, model_overrides: dict | None = None, data_overrides: dict | None = None):
    """``(datamodule, model)`` from a fit config (``data``/``model`` class paths and init args)."""
    data_cfg, model_cfg = config["data"], config["model"]
    data_args = {**data_cfg.get("init_args", {}), **(data_overrides or {})}
    dm = _import(data_cfg["class_path"])(**data_args)
    model_args = {**model_cfg.get("init_args", {}), **(model_overrides or {})}
    model = _import(model_cfg["class_path"])(data_spec=dm.spec, **model_args)
    return dm, model


def save_class_grid(model, path: Path) -> None:
    """A 10×10 grid of ``model``'s samples, a row per class, from fixed latents (``seed=1``), to ``path``."""
    import torch

    from lightning_gpate.sampling import image_grid, save_png

    x, y = model.generate(100, labels=torch.arange(10).repeat_interleave(10), seed=1)
    save_png(image_grid(x, y, 10, per_class=10), Path(path))


def grids_every(out: Path, every: int, describe=lambda trainer, module: ""):
    """A Lightning callback that writes :func:`save_class_grid` to ``out/stepNNNNNN.png`` every ``every``
    generator steps, printing ``describe(trainer, module)``."""
    import pytorch_lightning as pl

    class Grids(pl.Callback):
        last = None

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            step = trainer.global_step
            if step and step % every == 0 and self.last != step:
                self.last = step
                save_class_grid(pl_module, Path(out) / f"step{step:06d}.png")
                print(f"step {step}{describe(trainer, pl_module)}: grid written", flush=True)

    return Grids()


def logistic_regression_accuracy(model, dm, *, num_samples: int = 2000, seed: int = 0, split: str = "test") -> float:
    """Accuracy on the real ``split`` (test; ``"val"`` to tune settings) of a logistic regression trained on
    ``num_samples`` generated images (flattened pixels in [-1, 1]): does a plain classifier recognise the generated digits?"""
    from sklearn.linear_model import LogisticRegression

    x, y = model.generate(num_samples, seed=seed)
    xt, yt = dm.model_space(split)
    clf = LogisticRegression(max_iter=2000)
    clf.fit(x.flatten(1).numpy(), y.numpy())
    return float(clf.score(xt.flatten(1).numpy(), yt.numpy()))


def fit_and_evaluate(
    config: dict[str, Any], *, model_overrides: dict | None = None, data_overrides: dict | None = None,
    device: str = "cpu", max_steps: int | None = None, quality: bool = True, cnn: bool = True,
    num_samples: int | None = None, progress: bool = False, out_dir: str | Path | None = None,
    grid: str | Path | None = None,
) -> dict[str, Any]:
    """Train one config (no logger, no checkpoints) and evaluate it. Returns a flat record."""
    import pytorch_lightning as pl
    import torch

    from lightning_gpate.evaluation.store import evaluate_generator

    pl.seed_everything(int(config.get("seed_everything", 0)), verbose=False)
    dm, model = build(config, model_overrides=model_overrides, data_overrides=data_overrides)
    trainer_cfg = dict(config.get("trainer", {}))
    steps = int(max_steps or trainer_cfg.get("max_steps", 1000))
    trainer = pl.Trainer(
        max_steps=steps, accelerator=device, devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=progress, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    start = time.perf_counter()
    trainer.fit(model, dm)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    record: dict[str, Any] = {
        "model": type(model).__name__,
        "steps": int(trainer.global_step),
        "wall_s": wall,
        "stop_reason": getattr(model, "stop_reason", None) or "step limit",
    }
    if hasattr(model, "accountant"):
        record["epsilon_spent"] = float(model.accountant.epsilon())
        record["epsilon_budget"] = float(model.epsilon_budget)
        record["budget_accounting"] = model.budget_accounting
    model.eval()
    record["logreg_2000"] = logistic_regression_accuracy(model, dm)
    if grid is not None:
        from lightning_gpate.sampling import image_grid, save_png

        x, y = model.generate(200, labels=torch.arange(model.num_classes).repeat_interleave(20), seed=0)
        save_png(image_grid(x, y, model.num_classes), Path(grid))
    if cnn or quality:
        out = Path(out_dir or (ROOT / "outputs" / "image_utility"))
        # The papers' IS/FID (features trained on the real training split) for every model, so that the
        # figures compare across models and with the papers: a data owner's benchmark, not a shared log.
        metrics, _, notes = evaluate_generator(model, dm, out, utility=cnn, quality=quality, figures=False,
                                               num_samples=num_samples or len(dm.model_space("train")[1]), tag="benchmark",
                                               feature_split="train")
        record.update({k.rsplit("/", 1)[-1]: v for k, v in metrics.items()})
        if notes:
            record["notes"] = notes
    return record


# ----------------------------------------------------------------------------------------------- table, plot
COLUMNS = [
    ("model", "model"), ("eps", "ε target"), ("epsilon_spent", "ε spent"), ("steps", "steps"), ("wall_s", "wall s"),
    ("cnn_accuracy_final", "CNN acc final"), ("cnn_accuracy_val_selected", "CNN acc val-sel."),
    ("logreg_2000", "LogReg 2k"), ("inception_score", "IS"), ("fid", "FID"), ("stop_reason", "stopped by"),
]


def _fmt(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key == "epsilon_spent":
        return "∞ (noise-free)" if value > 1e6 else f"{value:.3f}"
    if key in ("wall_s",):
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.3f}" if key != "fid" else f"{value:.1f}"
    if key == "stop_reason":
        return "budget" if str(value).startswith("privacy budget") else str(value)
    return str(value)


def load_records(preset: str) -> list[dict]:
    folder = RESULTS / f"image_utility_{preset}"
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    order = {m: i for i, m in enumerate(MODELS)}
    return sorted(records, key=lambda r: (order.get(r["case"], 99), EPSILONS.index(r["eps"]) if r["eps"] in EPSILONS else 9))


def write_table(preset: str) -> Path | None:
    records = load_records(preset)
    if not records:
        return None
    lines = [f"# Image utility, preset `{preset}`", "",
             "Written by `benchmarks/image_utility.py` (one JSON record per case beside this file). "
             "CNN accuracy of generated images on the real test split (final epoch / epoch selected on held-out "
             "synthetic images), logistic regression trained on 2,000 generated images, IS and FID with a classifier "
             "trained on the real training split. ε is a guarantee (δ=1e-5) except noise-free rows.", ""]
    meta = records[0].get("machine", {})
    if meta:
        lines += [f"Machine: {meta.get('device')} ({meta.get('torch_threads')} threads), torch {meta.get('torch')}.", ""]
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for r in records:
        row = {**r, "model": r["case"], "eps": "noise-free" if r["eps"] == NOISE_FREE else r["eps"]}
        lines.append("| " + " | ".join(_fmt(k, row.get(k)) for k, _ in COLUMNS) + " |")
    if any("real_baseline" in r for r in records):
        base = next(r["real_baseline"] for r in records if "real_baseline" in r)
        lines += ["", "Real data: " + ", ".join(f"{k} {v:.3f}" for k, v in base.items())]
    path = RESULTS / f"image_utility_{preset}.md"
    path.write_text("\n".join(lines) + "\n")
    _plot(preset, records)
    return path


def _plot(preset: str, records: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    xs = {"1": 0, "10": 1, NOISE_FREE: 2}
    fig, ax = plt.subplots(figsize=(6, 4))
    for case in MODELS:
        pts = sorted((xs[r["eps"]], r.get("cnn_accuracy_val_selected")) for r in records if r["case"] == case and r["eps"] in xs)
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=case)
    ax.set_xticks([0, 1, 2], ["ε=1", "ε=10", "noise-free"])
    ax.set_ylabel("CNN accuracy (val-selected) on real test")
    ax.set_ylim(0, 1)
    ax.axhline(0.1, color="grey", lw=0.5, ls="--")
    ax.set_title(f"Image utility vs privacy ({preset})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"image_utility_{preset}.png", dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", "--data", dest="preset", default="digits", choices=sorted(PRESETS),
                   help="data set and its configs: digits (CPU; MNIST: benchmarks/mnist_table.py)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--eps", nargs="+", default=list(EPSILONS), choices=EPSILONS)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    p.add_argument("--max-steps", type=int, default=None, help="override every config's max_steps")
    p.add_argument("--num-samples", type=int, default=None, help="generated images for the CNN and IS/FID (default: train size)")
    p.add_argument("--no-quality", action="store_true", help="skip IS/FID")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--table-only", action="store_true", help="only rebuild the table and plot from the records")
    a = p.parse_args(argv)
    if a.table_only:
        print(write_table(a.preset))
        return
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    preset = PRESETS[a.preset]
    folder = RESULTS / f"image_utility_{a.preset}"
    folder.mkdir(parents=True, exist_ok=True)
    data = dict(preset["data"])
    for case in a.models:
        for eps in a.eps:
            spec = preset["cases"].get(case, {}).get(eps)
            if spec is None:
                continue
            config_path, model_over, data_over = spec
            config = load_config(config_path)
            if config["model"]["init_args"].get("epsilon") is not None and eps != NOISE_FREE and "epsilon" not in model_over:
                model_over = {**model_over, "epsilon": float(eps)}
            data_args = {**data, **data_over}
            print(f"== {case} eps={eps} ({config_path})", flush=True)
            try:
                record = fit_and_evaluate(config, model_overrides=model_over, data_overrides=data_args, device=a.device,
                                          max_steps=a.max_steps, quality=not a.no_quality, num_samples=a.num_samples,
                                          progress=a.progress)
            except Exception as err:  # noqa: BLE001 - one failing case must not lose the others
                record = {"error": f"{type(err).__name__}: {err}"}
                print(f"   failed: {record['error']}", flush=True)
            record.update({"case": case, "eps": eps, "config": config_path, "model_overrides": model_over,
                           "machine": {"device": a.device if a.device == "cpu" else torch.cuda.get_device_name(),
                                       "torch_threads": torch.get_num_threads(), "torch": torch.__version__}})
            base = {k: v for k, v in record.items() if k in ("inception_score_real", "fid_real_train_vs_reference", "feature_net_test_accuracy")}
            if base:
                record["real_baseline"] = base
            (folder / f"{case}_eps{eps}.json").write_text(json.dumps(record, indent=1, default=str))
            print("   " + " ".join(f"{k}={_fmt(k, record.get(k))}" for k, _ in COLUMNS[2:]), flush=True)
    print(write_table(a.preset))


if __name__ == "__main__":
    main()
