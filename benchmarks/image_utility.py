"""The benchmarks' shared helpers: a fit config read, built and overridden, its settings' provenance, sample grids,
JSON-lines records and the machine's load.

The runners import what they need from here (``sys.path`` holds ``benchmarks/``), so that reading a config, parsing
``--set KEY=VALUE``, building a model and appending a record exist once: ``mnist_table.py`` (the MNIST table, its
tuning, its rows' CPU smoke; it also resolves a row's overrides into the option groups, ``model_overrides``, for the
others), ``gpate_mnist_cpu.py`` (G-PATE's and PATE-GAN's CPU proxy), ``dpgan_mnist_cpu.py`` (DP-GAN's speed and
schedules), ``quickstart_check.py`` (the README's quickstart) and ``utility_vs_epsilon.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


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


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON-lines file ``path`` (its folder made when missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file, in order (none when it does not exist)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def markdown_table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table: ``header``, its rule, and a line per row of cells (text, ``|`` already escaped)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(cells) + " |" for cells in rows)]


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages: beside a timing on a shared machine, how busy it was."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
