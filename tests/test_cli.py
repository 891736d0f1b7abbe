"""End to end through the command line: fit → MLflow run → sample, and the CLI's errors."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import query_run
from lightning_gpate.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL_GAN = ["--model.generator.z_dim", "16", "--model.generator.gf_dim", "8", "--model.discriminator.df_dim", "8",
             "--model.generator.fc_dim", "32", "--model.discriminator.fc_dim", "32",
             "--trainer.max_steps", "4", "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1"]


def _fit(config: str, *extra: str):
    main(["fit", "--config", str(ROOT / "configs" / config), *SMALL_GAN, *extra])


def test_fit_then_sample_digits(capsys):
    _fit("gan_digits.yaml")
    run, client = query_run("digits")
    assert run.data.params["generator/z_dim"] == "16"
    assert run.data.params["dataset"] == "digits"
    assert {"d_loss", "g_loss"} <= set(run.data.metrics)
    assert len(client.get_metric_history(run.info.run_id, "g_loss")) == 4  # one per generator step
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "release", "samples"} <= artifacts
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml")).read_text()
    assert "ImageDataModule" in config and "max_steps: 4" in config
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == ["samples/samples_final.png"]

    ckpt = run.data.tags["release_artifact"]
    summary = capsys.readouterr().out.split("lightning-gpate fit: done\n")[1]  # the end of fit, whatever the progress bar
    assert "  model     GAN\n" in summary and "digits, images 1×8×8, 10 classes" in summary
    assert "  training  4 steps in " in summary and "stopped   max_steps=4 reached" in summary
    assert "privacy   none: a non-private model (no privacy guarantee)" in summary
    assert f"release   {ckpt}\n" in summary and f"run {run.info.run_id} in experiment 'digits'" in summary
    # samples go to a folder the repository ignores, one per run (not samples.npz in the project's root)
    assert f"sample    lightning-gpate sample --ckpt_path {ckpt} --num_samples 1000 --output outputs/{run.info.run_name}/samples.npz" in summary
    assert "/outputs/" in (ROOT / ".gitignore").read_text().splitlines()
    printed = next(line for line in summary.splitlines() if line.startswith("  sample ")).split()[2:]
    assert main(printed) == 0 and Path(f"outputs/{run.info.run_name}/samples.png").is_file()
    assert "browse    mlflow ui --backend-store-uri sqlite:///" in summary
    view = f"then http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning"
    assert f"\n            {view}  (MLflow's model-training view)\n" in summary
    assert main(["sample", "--ckpt_path", ckpt, "--num_samples", "25", "--output", "out/s.npz", "--seed", "1"]) == 0
    data = np.load("out/s.npz")
    assert data["images"].shape == (25, 1, 8, 8) and data["labels"].shape == (25,)
    assert 0.0 <= data["images"].min() and data["images"].max() <= 16.0  # the digits' own range
    assert Path("out/s.png").stat().st_size > 0
    again = np.load(main(["sample", "--ckpt_path", ckpt, "--num_samples", "25", "--output", "out/t.npz", "--seed", "1"]) or "out/t.npz")
    assert np.array_equal(again["images"], data["images"])  # seeded


def test_fit_then_sample_table_in_original_schema(tmp_path, mixed_frame):
    mixed_frame.to_csv("table.csv", index=False)
    main(["fit", "--config", str(ROOT / "configs" / "gan_breast_cancer.yaml"),
          "--data.builtin", "null", "--data.path", "table.csv", "--data.label", "outcome", "--data.batch_size", "16",
          "--model.generator.hidden", "[16]", "--model.discriminator.hidden", "[16]", "--trainer.max_steps", "3", "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
          "--trainer.logger.init_args.experiment_name", "table"])
    run, client = query_run("table")
    assert "g_loss" in run.data.metrics
    table_artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert table_artifacts == ["samples/samples_final.csv"]
    assert main(["sample", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "40", "--output", "s.csv"]) == 0
    out = pd.read_csv("s.csv")
    assert list(out.columns) == list(mixed_frame.columns) and len(out) == 40
    assert (out.dtypes == pd.read_csv("table.csv").dtypes).all()
    assert out["age"].between(mixed_frame["age"].min(), mixed_frame["age"].max()).all()
    assert set(out["region"]) <= set(mixed_frame["region"]) and set(out["outcome"]) <= {0, 1}


def test_sample_errors_are_clear_and_write_nothing(tmp_path, capsys):
    torch.save({"state_dict": {}}, "other.ckpt")
    assert main(["sample", "--ckpt_path", "other.ckpt", "--num_samples", "5", "--output", "x.csv"]) == 2
    assert "not a lightning-gpate generator checkpoint" in capsys.readouterr().err
    assert main(["sample", "--ckpt_path", "missing.ckpt", "--num_samples", "5", "--output", "x.csv"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sample", "--ckpt_path", "other.ckpt", "--num_samples", "0", "--output", "x.csv"])
    assert "--num_samples must be >= 1" in capsys.readouterr().err
    assert not Path("x.csv").exists()


def test_wrong_output_kind_writes_nothing(capsys):
    _fit("gan_digits.yaml", "--trainer.max_steps", "1")
    run, _ = query_run("digits")
    assert main(["sample", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "5", "--output", "x.csv"]) == 2
    assert ".npz" in capsys.readouterr().err
    assert not Path("x.csv").exists()
