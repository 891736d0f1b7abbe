"""Writes this folder's fixture with the code from BEFORE DP-MERF's feature maps (run at commit a610449, in a checkout of
it: ``git archive a610449 | tar -x -C /tmp/base && cd /tmp/base && PYTHONPATH=$PWD OMP_NUM_THREADS=1 python
<this file>``): the images and labels that ``tests/data/before_option_groups/dpmerf_image.release.pt`` (a DP-MERF release
of the 8x8 digits, nearest generator) samples with ``generate(16, seed=0)`` there, and the shape of the release buffer
and the first frequencies of the DP-MERF config of the MNIST table (``configs/mnist/dpmerf_eps1_guarantee.yaml``) with
feature seed 7. ``tests/test_feature_maps.py`` compares today's code with them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

OUT = Path(__file__).resolve().parent / "expected.json"


def main(repo: Path) -> None:
    sys.path.insert(0, str(repo))
    from datamodules import ImageDataModule
    from lightning_gpate.models import DPMERF
    from lightning_gpate.release import load_release, model_from_release

    model = model_from_release(load_release(repo / "tests/data/before_option_groups/dpmerf_image.release.pt"))
    x, y = model.generate(16, seed=0)
    config = yaml.safe_load((repo / "configs/mnist/dpmerf_eps1_guarantee.yaml").read_text())["model"]["init_args"]
    spec = {**ImageDataModule("digits", num_teachers=0, val_fraction=0.0).spec, "shape": [1, 28, 28]}
    mnist = DPMERF(spec, **{**config, "feature_seed": 7})
    out = {"samples": x.flatten(1).tolist(), "labels": y.tolist(), "released_shape": list(mnist.released_embedding.shape),
           "frequencies_head": mnist.frequencies[:3, :5].tolist(), "noise_multiplier": mnist.noise_multiplier}
    OUT.write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path.cwd())
