"""Writes this folder's fixture with the code from BEFORE DP-MERF's feature maps (run at commit a610449, in a checkout of
it: ``git archive a610449 | tar -x -C /tmp/base && cd /tmp/base && PYTHONPATH=$PWD OMP_NUM_THREADS=1 python
<this file>``): the images and labels that ``tests/data/before_option_groups/dpmerf_image.release.pt`` (a DP-MERF release
of the 8x8 digits, nearest generator) samples with ``generate(16, seed=0)`` there, and the shape of the release buffer
and the first frequencies of the DP-MERF config of the MNIST table (``configs/mnist/dpmerf_eps1_guarantee.yaml``) with
feature seed 7. ``tests/test_feature_maps.py`` compares today's code with them.

``python <this file> checkpoint`` (run at commit abb411e, the same way) writes ``dpmerf_digits.step2.ckpt``, a DP-MERF
training checkpoint of the 8x8 digits after its release and 2 steps, and ``checkpoint.json``: its spent ε, noise
multiplier and release's shape and sum, which a resume with today's code must keep."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parent
OUT = HERE / "expected.json"


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


def checkpoint(repo: Path) -> None:
    import pytorch_lightning as pl

    sys.path.insert(0, str(repo))
    from datamodules import ImageDataModule
    from lightning_gpate.models import DPMERF

    pl.seed_everything(0, workers=True)
    dm = ImageDataModule("digits", num_teachers=0, val_fraction=0.0, batch_size=16)
    model = DPMERF(dm.spec, epsilon=1.0, delta=1e-5, num_features=64, generator={"z_dim": 4, "gf_dim": 4, "fc_dim": 16},
                   generator_batch_size=40, feature_seed=3, noise_seed=11)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(model, dm)
    trainer.save_checkpoint(HERE / "dpmerf_digits.step2.ckpt")
    out = {"spent_epsilon": model.spent_epsilon(), "noise_multiplier": model.noise_multiplier,
           "released_shape": list(model.released_embedding.shape), "released_sum": float(model.released_embedding.double().sum())}
    (HERE / "checkpoint.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    (checkpoint if sys.argv[1:] == ["checkpoint"] else main)(Path.cwd())
