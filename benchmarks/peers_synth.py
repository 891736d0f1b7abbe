"""Run one smartnoise-synth synthesizer on a CSV: the peers of ``benchmarks/tabular_utility.py``.

Runs under the interpreter of the optional ``peers`` environment (its own virtualenv: smartnoise-synth pins an old opacus)
and imports nothing from the project. The job on stdin is ``benchmarks/peers_pgm.py``'s; it writes ``num_rows`` rows to
``out_csv`` and one JSON line on stdout. Numeric columns use the declared (public) bounds, so no budget goes to
preprocessing: binned for MST and AIM ("cube" style), min-max scaled for the GANs; categories label-encoded (smartnoise's way).
"""

from __future__ import annotations

import json
import sys
import time
import warnings


def transformer_for(columns: dict, style: str, bins: int):
    from snsynth.transform import (
        BinTransformer, ChainTransformer, LabelTransformer, MinMaxTransformer, OneHotEncoder, TableTransformer,
    )

    out = []
    for spec in columns.values():
        if spec["type"] == "numeric":
            lo, hi = float(spec["min"]), float(spec["max"])
            out.append(BinTransformer(bins=bins, lower=lo, upper=hi) if style == "cube" else MinMaxTransformer(lower=lo, upper=hi))
        else:
            out.append(LabelTransformer() if style == "cube" else ChainTransformer([LabelTransformer(), OneHotEncoder()]))
    return TableTransformer(out)


def main() -> None:
    job = json.loads(sys.stdin.read())
    import numpy as np
    import pandas as pd
    import torch
    from snsynth import Synthesizer

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    seed = int(job.get("seed", 0))
    np.random.seed(seed)
    torch.manual_seed(seed)
    frame = pd.read_csv(job["train_csv"])
    columns = job["columns"]
    frame = frame[list(columns)]
    for name, spec in columns.items():  # clip to the declared bounds, as the project's models do
        if spec["type"] == "numeric":
            frame[name] = frame[name].clip(spec["min"], spec["max"])
    synth_name = job["synth"]
    style = "cube" if synth_name in ("mst", "aim") else "gan"
    options = {"epsilon": float(job["epsilon"])}
    if synth_name in ("mst", "aim", "pategan", "dpctgan"):
        options["delta"] = float(job["delta"])
    options.update(job.get("options", {}))
    start = time.perf_counter()
    synth = Synthesizer.create(synth_name, **options)
    synth.fit(frame, transformer=transformer_for(columns, style, int(job.get("bins", 10))), preprocessor_eps=0.0)
    synthetic = synth.sample(int(job["num_rows"]))
    if not isinstance(synthetic, pd.DataFrame):
        synthetic = pd.DataFrame(synthetic, columns=list(columns))
    synthetic.to_csv(job["out_csv"], index=False)
    print(json.dumps({"wall_s": time.perf_counter() - start, "rows": len(synthetic)}))


if __name__ == "__main__":
    main()
