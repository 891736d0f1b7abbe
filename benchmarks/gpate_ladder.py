"""The ladder of G-PATE variants tried on a CPU-sized data set: one line per experiment.

Each call trains one variant of a base config (``--set model.key=value data.key=value``), evaluates it
(logistic regression on 2,000 generated images and, unless ``--no-cnn``, the CNN accuracy of as many
generated images as real training images, both on the real test split) and appends a JSON line to
``benchmarks/results/gpate_ladder_<tag>.jsonl``; ``--table`` rewrites ``gpate_ladder_<tag>.md`` from
all lines. Wall times are from a shared 2-core machine (other jobs running): compare them loosely.

Usage::

    python benchmarks/gpate_ladder.py --name baseline --base configs/quickstart.yaml --threads 1
    python benchmarks/gpate_ladder.py --name k64 --set model.projection_dim=64 --set data.num_teachers=100
    python benchmarks/gpate_ladder.py --table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_utility import RESULTS, fit_and_evaluate, load_config  # noqa: E402


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def write_table(tag: str) -> Path:
    path = RESULTS / f"gpate_ladder_{tag}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [f"# G-PATE ladder ({tag})", "",
           "Written by `benchmarks/gpate_ladder.py` from `gpate_ladder_" + tag + ".jsonl` (every experiment, in order). "
           "Accuracies on the real test split: logistic regression trained on 2,000 generated images (LogReg) and "
           "the CNN of `cnn_utility` (final epoch / epoch selected on held-out synthetic images). ε is the guarantee "
           "spent (δ=1e-5); `∞` = noise-free (σ≈0, no budget). Wall time on a shared 2-core machine. Changes are "
           "relative to the base config as it was when the row was added (rows 1–20: the ε=1 quickstart of commit "
           "f1a5449; the quickstart is now row Q1's settings with an EMA generator, at ε=10).", "",
           "| # | name | changes vs base | steps | ε spent | wall s | LogReg 2k | CNN final | CNN val-sel. | note |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        eps = r.get("epsilon_spent")
        eps_s = "–" if eps is None else ("∞" if eps > 1e6 else f"{eps:.2f}")
        f = lambda k: "–" if r.get(k) is None else f"{r[k]:.3f}"  # noqa: E731
        changes = ", ".join(f"{k}={v}" for k, v in r.get("changes", {}).items()) or "–"
        out.append(f"| {i} | {r['name']} | {changes} (base {Path(r['base']).name}) | {r.get('steps', '–')} | {eps_s} | "
                   f"{r.get('wall_s', 0):.0f} | {f('logreg_2000')} | {f('cnn_accuracy_final')} | "
                   f"{f('cnn_accuracy_val_selected')} | {r.get('note', '') or r.get('error', '')} |")
    md = RESULTS / f"gpate_ladder_{tag}.md"
    md.write_text("\n".join(out) + "\n")
    return md


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default=None)
    p.add_argument("--base", default="configs/quickstart.yaml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="model.x=... or data.x=...")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-cnn", action="store_true")
    p.add_argument("--note", default="")
    p.add_argument("--tag", default="digits")
    p.add_argument("--table", action="store_true", help="only rewrite the markdown table")
    p.add_argument("--grid", default=None, help="also write a PNG grid of samples (one row per class) here")
    a = p.parse_args(argv)
    if a.table:
        print(write_table(a.tag))
        return
    import torch

    torch.set_num_threads(a.threads)
    changes, model_over, data_over = {}, {}, {}
    for item in a.set:
        key, _, text = item.partition("=")
        section, _, name = key.partition(".")
        value = _value(text)
        {"model": model_over, "data": data_over}[section][name] = value
        changes[key] = value
    if a.max_steps is not None:
        changes["max_steps"] = a.max_steps
    record = {"name": a.name or "+".join(a.set) or "base", "base": a.base, "changes": changes, "note": a.note}
    try:
        record.update(fit_and_evaluate(load_config(a.base), model_overrides=model_over, data_overrides=data_over,
                                       device=a.device, max_steps=a.max_steps, quality=False, cnn=not a.no_cnn,
                                       grid=a.grid))
    except Exception as err:  # noqa: BLE001 - record the failure in the ladder too
        record["error"] = f"{type(err).__name__}: {err}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"gpate_ladder_{a.tag}.jsonl", "a") as fh:
        fh.write(json.dumps(record, default=str) + "\n")
    print(json.dumps({k: record.get(k) for k in ("name", "steps", "epsilon_spent", "wall_s", "logreg_2000",
                                                  "cnn_accuracy_final", "cnn_accuracy_val_selected", "stop_reason", "error")}))
    write_table(a.tag)


if __name__ == "__main__":
    main()
