"""Small, fast instances of every model on a table whose metadata is all declared public, for the tests
that must hold for every model (release artifact, mechanism randomness, what reaches MLflow)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch

from datamodules import TabularDataModule
from lightning_gpate.models import DPGAN, DPMERF, GAN, GPATE, GSWGAN, PATEGAN, MarginalTree
from lightning_gpate.models.gpate import PAPER_SETTINGS

PRIVATE = ("gpate", "pategan", "dpgan", "gswgan", "dpmerf")
ALL = ("gan", *PRIVATE)
#: MarginalTree: private, tables only; one fit reads the data once and spends the whole budget.
MARGINAL = "marginal"
HIDDEN = (96, 96)  # a generator of ~12k parameters: the accountant's state is small beside it


#: Every column's bounds or categories declared public: the data spec reads nothing from the rows.
SCHEMA = {"a": {"min": 0, "max": 1}, "b": {"min": -3, "max": 3}, "c": {"min": 0, "max": 9, "dtype": "int64"},
          "y": {"categories": [0, 1]}}


def public_frame(rows: int = 240, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"a": rng.uniform(0, 1, rows).round(4), "b": rng.normal(0, 1, rows).clip(-3, 3).round(4),
                          "c": rng.integers(0, 10, rows)})
    frame["y"] = (frame["a"] + 0.3 * frame["b"] > 0.5).astype(int)
    return frame


def public_table(num_teachers: int = 0, rows: int = 240, test_fraction: float = 0.0, frame: pd.DataFrame | None = None) -> TabularDataModule:
    frame = public_frame(rows) if frame is None else frame
    return TabularDataModule(frame=frame, label="y", schema=SCHEMA, class_ratio=[0.5, 0.5], num_teachers=num_teachers,
                             teacher_batch_size=8, batch_size=32, test_fraction=test_fraction)


def former(cls, *args, **options):
    """``cls(*args, **options)`` with the model's former defaults (its paper's settings, ``PAPER_SETTINGS`` of its module)
    wherever ``options`` is silent: what the tests written before issue 47 made the defaults the best guaranteed
    configuration relied on, stated."""
    paper = cls.migrate_options(dict(importlib.import_module(cls.__module__).PAPER_SETTINGS))
    options = cls.migrate_options(dict(options))
    merged = {**paper, **{k: {**paper[k], **v} if isinstance(v, dict) and isinstance(paper.get(k), dict) else v
                          for k, v in options.items()}}  # a group's options over the paper's, one by one
    return cls(*args, **merged)


def assert_old_releases_load(model, option: str, other_value) -> None:
    """A release of the trained ``model`` written before its class's ``REMOVED_OPTIONS`` were removed (holding each
    one's "off" value) loads the same generator; one that held ``option=other_value`` is refused in one line."""
    from lightning_gpate.release import CheckpointError, build_release, model_from_release

    release = build_release(model)
    old = {**release, "hyper_parameters": {**release["hyper_parameters"], **type(model).REMOVED_OPTIONS}}
    loaded = model_from_release(old)
    for key, value in loaded.generator_module.state_dict().items():
        assert torch.equal(value, model.generator_module.state_dict()[key].cpu())
    with pytest.raises(CheckpointError, match=f"{option}={other_value!r}"):
        model_from_release({**release, "hyper_parameters": {**release["hyper_parameters"], option: other_value}})


def build(kind: str, *, rows: int = 240, test_fraction: float = 0.0, **options):
    """``(model, datamodule)`` of a small ``kind`` model on :func:`public_table` (``rows``, ``test_fraction``);
    ``options`` override model arguments."""
    if kind == "gan":
        dm = public_table(rows=rows, test_fraction=test_fraction)
        return GAN(dm.spec, z_dim=8, hidden=HIDDEN, **options), dm
    if kind == "gpate":
        dm = public_table(num_teachers=12, rows=rows, test_fraction=test_fraction)
        kw = dict(**PAPER_SETTINGS, epsilon=50.0, fake_batch_size=8, projection_dim=4, sigma_threshold=16.0, sigma_gnmax=8.0,
                  threshold_fraction=0.3, hidden=HIDDEN, teacher_hidden=(8,), z_dim=8, target_scale=1e3)
        return GPATE(dm.spec, **{**kw, **options}), dm
    if kind == "pategan":
        dm = public_table(num_teachers=6, rows=rows, test_fraction=test_fraction)
        kw = dict(epsilon=10.0, lam=0.05, teacher_steps=1, student_steps=1, query_batch_size=16, z_dim=8,
                  generator_hidden=list(HIDDEN), teacher_hidden=[8], student_hidden=[8])
        return former(PATEGAN, dm.spec, **{**kw, **options}), dm
    if kind == "dpgan":
        dm = public_table(rows=rows, test_fraction=test_fraction)
        kw = dict(epsilon=50.0, delta=1e-5, sampling_rate=32 / 240, noise_multiplier=1.0, d_steps=2, z_dim=8, generator_hidden=HIDDEN,
                  discriminator_hidden=(8,))
        return former(DPGAN, dm.spec, **{**kw, **options}), dm
    if kind == "gswgan":
        dm = public_table(num_teachers=5, rows=rows, test_fraction=test_fraction)
        kw = dict(epsilon=1e4, delta=1e-5, noise_multiplier=4.0, generator_batch_size=8, z_dim=8,
                  generator_hidden=HIDDEN, discriminator_hidden=(8,), critic_steps=2)
        return former(GSWGAN, dm.spec, **{**kw, **options}), dm
    if kind == "dpmerf":
        dm = public_table(rows=rows, test_fraction=test_fraction)
        kw = dict(epsilon=5.0, delta=1e-5, num_features=200, z_dim=8, generator_batch_size=32, generator_hidden=HIDDEN)
        return DPMERF(dm.spec, **{**kw, **options}), dm
    if kind == MARGINAL:
        dm = public_table(rows=rows, test_fraction=test_fraction)
        return MarginalTree(dm.spec, **{**dict(epsilon=5.0, delta=1e-5), **options}), dm
    raise ValueError(kind)


def fit(model, dm, *, steps: int = 3, callbacks=(), logger=False, ckpt_path=None, **trainer_kw):
    trainer_kw.setdefault("enable_checkpointing", False)
    trainer = pl.Trainer(max_steps=steps, logger=logger, callbacks=list(callbacks), enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1, accelerator="cpu", devices=1, **trainer_kw)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="GS-WGAN trains without pretrained discriminators")
        trainer.fit(model, dm, ckpt_path=ckpt_path)
    return trainer
