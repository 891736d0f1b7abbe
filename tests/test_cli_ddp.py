"""``lightning-gpate fit`` on 2 CPU processes (DDP, gloo) with the default callbacks, as a user runs it."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch
import yaml

from clitools import ROOT, TINY_SCHEMA, assert_one_line_error, run_cli, store_snapshot, write_tiny_table
from conftest import query_run
from lightning_gpate.cli import main
from lightning_gpate.models.base import load_generator

# The quickstart, shortened: fewer teachers and steps, short evaluation trainings; every default
# callback (samples, final checkpoint, utility CNN, IS/FID, privacy, summary) stays on.
QUICK = ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--data.init_args.num_teachers", "40",
         "--trainer.max_steps", "3", "--model.init_args.noise_seed", "0", "--trainer.enable_progress_bar", "false",
         "--utility.cnn_epochs", "2", "--image_quality.feature_epochs", "2"]


def _experiment_runs(experiment: str):
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id])


def test_two_processes_finish_with_one_run_and_the_generator_and_epsilon_of_one(tmp_path, capsys):
    assert main([*QUICK, "--trainer.logger.init_args.experiment_name", "one"]) == 0
    two = run_cli(*QUICK, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.logger.init_args.experiment_name", "two",
                  cwd=tmp_path, timeout=600)
    assert two.returncode == 0, two.stderr[-4000:]
    assert two.stdout.count("lightning-gpate fit: done") == 1  # rank 0 only
    summary = two.stdout.split("lightning-gpate fit: done\n")[1]
    # noise_seed is fixed for the comparison: the summary says the run is no guarantee
    assert "stopped   max_steps=3 reached" in summary and "of the budget ε = 10 (δ = 1e-05): NOT a guarantee (noise_seed fixed" in summary
    for figure in ("CNN accuracy on real test (final epoch)", "Inception Score", "FID"):
        assert figure in summary
    assert "Starting with 2 processes" in two.stderr or "MEMBER: 2/2" in two.stderr

    (run_two,) = _experiment_runs("two")  # exactly one run for the two processes
    run_one, _ = query_run("one")
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED"
        assert not [t for t in run.data.tags if t.endswith("_error")], run.data.tags  # every evaluation ran
        assert {"utility/cnn_accuracy_final", "quality/inception_score", "quality/fid"} <= set(run.data.metrics)
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    assert run_one.data.tags["stop_reason"] == run_two.data.tags["stop_reason"] == "max_steps=3 reached"
    g1 = load_generator(run_one.data.tags["release_artifact"]).generator_module.state_dict()  # what samples (EMA)
    g2 = load_generator(run_two.data.tags["release_artifact"]).generator_module.state_dict()
    for name, tensor in g1.items():
        assert torch.allclose(tensor.float(), g2[name].float(), atol=1e-5), name


def test_marginaltree_under_ddp_is_refused_in_one_line_before_anything_starts(tmp_path):
    write_tiny_table(tmp_path / "table.csv")
    config = {
        "trainer": {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_steps": 1},
        "model": {"class_path": "lightning_gpate.models.MarginalTree", "init_args": {"epsilon": 1.0, "delta": 1e-5}},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": "table.csv", "label": "y", "num_teachers": 0, "schema": TINY_SCHEMA}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("fit", "--config", "c.yaml", cwd=tmp_path, timeout=120)  # a hang would time out
    assert_one_line_error(result, "fit", "MarginalTree trains on one process only", "--trainer.devices 1")
    assert store_snapshot(tmp_path / "mlruns")["runs"] == {}  # refused before any process or MLflow run started


def test_the_gan_under_plain_ddp_is_told_which_strategy_it_needs(capsys):
    args = ["fit", "--config", str(ROOT / "configs" / "gan_digits.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    assert main([*args, "--trainer.strategy", "ddp"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lightning-gpate fit: error: GAN has parameters that some of its steps do not use: under DDP, "
        "set --trainer.strategy ddp_find_unused_parameters_true")
