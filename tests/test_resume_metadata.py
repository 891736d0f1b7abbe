"""Resuming a private fit from its training checkpoint reuses the data spec it released (DP bounds, DP quantile
bins, DP class ratio), never a second DP estimate of the same metadata: that estimate would be released by the
resumed run (its release artifact, its transform) without being charged."""

from __future__ import annotations

import torch
import yaml

from clitools import run_cli, tiny_gpate_config, write_tiny_table
from small_models import former  # the former defaults (the paper's) where a test is silent

GUESSED = {"a": {"guess": [-5, 5]}, "b": {"guess": [-5, 5]}, "y": {"categories": [0, 1]}}


def _released(path):
    release = torch.load(path, weights_only=True)
    return release["hyper_parameters"]["data_spec"], release["privacy"]["accountant"]


def _metadata(spec):
    return {"columns": [(c["name"], c.get("min"), c.get("max"), c.get("edges")) for c in spec["columns"]],
            "class_ratio": spec["class_ratio"], "metadata_cost": spec["metadata_cost"]}


def test_a_resumed_fit_releases_the_checkpoints_dp_metadata_not_a_new_estimate(tmp_path):
    write_tiny_table(tmp_path / "table.csv")
    config = tiny_gpate_config(tmp_path / "tiny.yaml", experiment="meta", max_steps=2, checkpoints="ckpts", every_n_train_steps=2)
    data = yaml.safe_load(config.read_text())
    init = data["data"]["init_args"]
    init.pop("class_ratio")
    init.update(schema=GUESSED, metadata_epsilon=0.5, label_ratio_epsilon=0.5)
    config.write_text(yaml.safe_dump(data, sort_keys=False))

    first = run_cli("fit", "--config", "tiny.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    released = next(line.split()[-1] for line in first.stdout.splitlines() if line.strip().startswith("release "))
    spec, accountant = _released(released)
    assert spec["class_ratio_source"] == "dp"
    # every piece of DP metadata the fit drew: the guessed bounds, the default quantile bins (sized by a noisy row
    # count, then cut inside those bounds) and the class ratio
    assert [cost["what"].split(" (")[0] for cost in spec["metadata_cost"]] == [
        "bounds of 'a'", "bounds of 'b'", "row count sizing the quantile bins", "quantile edges of 2 numeric columns",
        "class ratio of 'y'"]
    assert all(len(c["edges"]) > 2 for c in spec["columns"])

    resumed = run_cli("fit", "--config", "tiny.yaml", "--ckpt_path", str(tmp_path / "ckpts" / "step=2.ckpt"),
                      "--trainer.max_steps", "4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    released_again = next(line.split()[-1] for line in resumed.stdout.splitlines() if line.strip().startswith("release "))
    spec_again, accountant_again = _released(released_again)
    # The metadata (fresh OS-seeded noise would give other bounds and ratio) is the checkpoint's ...
    assert _metadata(spec_again) == _metadata(spec)
    # ... and charged once: the metadata's pure-DP ε is the same in both releases.
    for count in ("pure_dp_epsilon", "exponential_mechanism_events"):
        assert accountant_again["counts"][count] == accountant["counts"][count] > 0


def test_a_resumed_dpgan_fit_reuses_the_released_metadata_in_process(tmp_path):
    """DP-GAN has no teacher partition whose check would catch a new estimate: the resumed fit (a new
    DataModule, fresh OS-seeded metadata noise) trains on, and releases, the checkpoint's metadata."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    import small_models
    from datamodules import TabularDataModule
    from lightning_gpate.models import DPGAN

    frame = small_models.public_frame(240)
    schema = {"a": {"guess": [-5, 5]}, "b": {"guess": [-5, 5]}, "c": {"min": 0, "max": 9}, "y": {"categories": [0, 1]}}

    def build():
        dm = TabularDataModule(frame=frame, label="y", schema=schema, metadata_epsilon=0.5, label_ratio_epsilon=0.5,
                               batch_size=32, test_fraction=0.0)
        return former(DPGAN, dm.spec, epsilon=50.0, delta=1e-5, sampling_rate=32 / 240, noise_multiplier=1.0, d_steps=1, z_dim=8,
                     generator_hidden=(16,), discriminator_hidden=(8,)), dm

    model, dm = build()
    small_models.fit(model, dm, steps=2, enable_checkpointing=True,
                     callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=2, save_top_k=-1)])
    first = _metadata(model.data_spec)
    resumed, dm2 = build()
    assert _metadata(resumed.data_spec) != first  # a fresh estimate (fresh noise) ...
    small_models.fit(resumed, dm2, steps=4, ckpt_path=str(tmp_path / "step=2.ckpt"))
    assert _metadata(resumed.data_spec) == first == _metadata(dm2.spec)  # ... replaced by the released one
    assert resumed.accountant.counts["pure_dp_epsilon"] == model.accountant.counts["pure_dp_epsilon"]
    x, _ = dm2.model_space("train")
    assert torch.equal(x, dm.model_space("train")[0])  # the data is transformed with the released bounds
