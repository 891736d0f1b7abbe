"""Kill -9 during a fit, then resume from its training checkpoint, as a user would (subprocesses)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import mlflow
import pytest
import torch

from clitools import (ROOT, assert_one_line_error, run_cli, run_cli_many, start_cli, store_snapshot, tiny_gpate_config,
                      tiny_pategan_config, write_tiny_table)
from lightning_gpate.models.base import load_generator
from lightning_gpate.release import load_release

# Large noise and a budget of about 35 steps of the tiny G-PATE: training stops on the budget, and
# the kill comes at about step 20 (once step=20.ckpt exists, step=10.ckpt is complete).
EPSILON = 0.9
NOISE = {"sigma_threshold": 200.0, "sigma_gnmax": 200.0}


def _runs(tmp_path, experiment: str):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def _history(client, run, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def _kill_once_written(fit, checkpoint: Path, log: Path) -> None:
    """SIGKILL ``fit`` as soon as ``checkpoint`` exists (the one before it is then complete)."""
    deadline = time.monotonic() + 300
    while not checkpoint.exists():
        assert fit.poll() is None, f"the fit ended before it was killed:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {checkpoint.name} after 300 s"
        time.sleep(0.02)
    fit.kill()
    assert fit.wait() == -9


def test_kill_then_resume_continues_epsilon_stops_at_the_budget_and_refuses_a_spent_one(tmp_path):
    write_tiny_table(tmp_path / "table.csv")
    tiny_gpate_config(tmp_path / "tiny.yaml", epsilon=EPSILON, experiment="resume", checkpoints="ckpts", every_n_train_steps=10, **NOISE)

    # 1. a fit killed with SIGKILL in the middle of training
    fit = start_cli("fit", "--config", "tiny.yaml", cwd=tmp_path, log=tmp_path / "killed.log")
    _kill_once_written(fit, tmp_path / "ckpts" / "step=20.ckpt", tmp_path / "killed.log")
    checkpoint = tmp_path / "ckpts" / "step=10.ckpt"
    eps_at_checkpoint = load_generator(str(checkpoint)).guarantee_epsilon()
    client, (killed,) = _runs(tmp_path, "resume")
    assert killed.info.status == "RUNNING"  # nobody could close it
    # Lightning logs the metrics of global step s at MLflow step s - 1
    assert math.isclose(dict(_history(client, killed, "epsilon"))[9], eps_at_checkpoint, rel_tol=1e-6)  # as logged (float32)

    # 2. resume: ε continues from the checkpoint's, steps from its step, and the run stops at the budget
    resumed = run_cli("fit", "--config", "tiny.yaml", "--ckpt_path", str(checkpoint), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stopped   privacy budget reached" in resumed.stdout
    assert "in this run, resumed at step 10)" in resumed.stdout
    client, (_, run) = _runs(tmp_path, "resume")
    assert run.info.status == "FINISHED"
    history = _history(client, run, "epsilon")
    assert history[0][0] == 10 and history[0][1] > eps_at_checkpoint  # global step 11: steps 1..10 are not run (nor paid) again
    values = [v for _, v in history]
    assert values == sorted(values)
    assert eps_at_checkpoint < run.data.metrics["epsilon_final"] <= EPSILON
    assert run.data.tags["stop_reason"].startswith("privacy budget reached")
    assert run.data.tags["privacy_guarantee"] == "true"
    final = run.data.tags["training_checkpoint"]  # the private training checkpoint of the final state
    assert load_generator(final).budget_exhausted
    assert f"private   training checkpoint {final} (never logged, keep it private; the budget is spent" in resumed.stdout

    # 3. resuming the spent budget refuses in one line, before any run starts; so does a resume that asks
    #    for another budget than the checkpoint's (it used to run on, silently keeping the checkpoint's)
    # 4. a failure after the run started (a checkpoint whose teacher partition does not fit this data):
    #    one line, and the run is FAILED with the error's type, not a finished run with a final ε
    before = store_snapshot(tmp_path / "mlruns")
    ran = run_cli_many({"again": ["fit", "--config", "tiny.yaml", "--ckpt_path", final],
                        "more": ["fit", "--config", "tiny.yaml", "--model.init_args.epsilon", "20", "--ckpt_path", str(checkpoint)],
                        "broken": ["fit", "--config", "tiny.yaml", "--ckpt_path", str(checkpoint), "--data.init_args.partition_seed", "5"]},
                       cwd=tmp_path)
    assert_one_line_error(ran["again"], "fit", "privacy budget is spent", f"of {EPSILON:g}", "start a new run with a new budget")
    assert_one_line_error(ran["more"], "fit", f"pins epsilon={EPSILON}", "asks for epsilon=20.0")
    assert_one_line_error(ran["broken"], "fit", "teacher partition", "does not fit this data", "resume with the same data")
    client, runs = _runs(tmp_path, "resume")
    failed = runs[-1]
    assert len(runs) == 3 and failed.info.status == "FAILED"  # the refusals of step 3 started no run
    assert failed.data.tags["error"].startswith("DataError")
    assert not {"stop_reason", "release_artifact", "training_checkpoint"} & set(failed.data.tags)
    assert "epsilon_final" not in failed.data.metrics
    after = store_snapshot(tmp_path / "mlruns")
    assert {k: v for k, v in after["runs"].items() if k in before["runs"]} == before["runs"]  # earlier runs untouched


# Each asks for another value of something the accountant depends on than the checkpoint of a 2-step fit pins.
CHANGED = {
    "delta": (["--model.init_args.delta", "1e-3"], ["pins delta=1e-05", "asks for delta=0.001"]),
    "noise scale": (["--model.init_args.aggregator.sigma_gnmax", "5"], ["pins aggregator=", "'sigma_gnmax': 8.0", "'sigma_gnmax': 5.0"]),
    "teacher count": (["--data.init_args.num_teachers", "5"], ["pins num_teachers=6", "asks for num_teachers=5"]),
    "accounting mode": (["--model.init_args.budget_accounting", "paper"],
                        ["pins budget_accounting='guarantee'", "asks for budget_accounting='paper'"]),
    "two at once": (["--model.init_args.epsilon", "3", "--model.init_args.aggregator.sigma_threshold", "4"],
                    ["pins epsilon=1000000.0, aggregator=", "asks for epsilon=3.0, aggregator=", "'sigma_threshold': 4.0"]),
}


def test_a_resume_that_asks_for_other_privacy_parameters_refuses_in_one_line_before_anything_runs(tmp_path, capsys):
    """Each change of CHANGED is refused in one line before any run starts; the same config resumes, a warm start's
    length scale and feature seed (left to the model, resolved in the checkpoint) answered by the checkpoint's, its
    release continued (measured once, its steps not taken again)."""
    import small_models
    from lightning_gpate.cli import main
    from lightning_gpate.models.base import CheckpointError

    write_tiny_table(tmp_path / "table.csv")
    tiny_gpate_config(tmp_path / "tiny.yaml", experiment="pinned", max_steps=2, checkpoints="ckpts", every_n_train_steps=2,
                      warm_start={"fraction": 0.3, "features": 200, "steps": 3, "batch_size": 40})
    assert main(["fit", "--config", "tiny.yaml"]) == 0
    checkpoint = str(tmp_path / "ckpts" / "step=2.ckpt")
    before = store_snapshot(tmp_path / "mlruns")
    capsys.readouterr()
    for name, (options, fragments) in CHANGED.items():
        assert main(["fit", "--config", "tiny.yaml", *options, "--ckpt_path", checkpoint]) == 2, name
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert lines[-1].startswith("lightning-gpate fit: error: ") and [ln for ln in lines if "error:" in ln] == lines[-1:], (name, lines)
        assert all(f in lines[-1] for f in fragments), (name, lines[-1])
    assert store_snapshot(tmp_path / "mlruns") == before  # no run created, none changed
    assert main(["fit", "--config", "tiny.yaml", "--trainer.max_steps", "3", "--ckpt_path", checkpoint]) == 0
    out = capsys.readouterr().out
    assert "in this run, resumed at step 2)" in out and "released once" in out and "3 of 3 warm-start generator steps" in out
    resumed = load_generator(out.split("private   training checkpoint ")[1].split(" ")[0])
    assert resumed.accountant.counts["subsampled_gaussian_events"] == 1  # the release, once

    # the same promise holds for a resume from Python, whose model the caller builds
    from pytorch_lightning.callbacks import ModelCheckpoint

    model, dm = small_models.build("gpate")
    small_models.fit(model, dm, steps=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="g", every_n_train_steps=1)],
                     enable_checkpointing=True)
    richer, dm2 = small_models.build("gpate", epsilon=500.0)
    with pytest.raises(CheckpointError, match=r"pins epsilon=50\.0, but this run asks for epsilon=500\.0"):
        small_models.fit(richer, dm2, steps=2, ckpt_path=str(tmp_path / "g.ckpt"))


#: A warm-started DP-GAN on the digits, small (its default all-convolutional nets, whose generator has no BatchNorm): the
#: release and its 3 warm-start steps in the first training step, a fixed n_D of one critic step after. The generator
#: stays where the warm start left it (generator_lr 0): the DP steps after a checkpoint draw their noise from streams a
#: resume starts afresh (never checkpointed, by design), so what a resume must give back exactly is the warm start's
#: state and the accountant's.
WARM_DPGAN = ["fit", "--config", str(ROOT / "configs" / "dpgan_digits_minimal.yaml"), "--seed_everything", "3",
              "--model.noise_seed", "0", "--trainer.enable_progress_bar", "false", "--utility.enabled", "false",
              "--image_quality.enabled", "false", "--model.generator.gf_dim", "8", "--model.critic.df_dim", "8",
              "--model.adaptive_d_steps", "null", "--model.d_steps", "1", "--model.training.generator_lr", "0",
              "--model.warm_start.fraction", "0.3", "--model.warm_start.features", "200", "--model.warm_start.steps", "3",
              "--model.warm_start.batch_size", "20", "--model.warm_start.anchor_weight", "0.5"]
CHECKPOINTS = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath", "ckpts", "--trainer.callbacks.filename",
               "{step}", "--trainer.callbacks.every_n_train_steps", "2", "--trainer.callbacks.save_top_k", "-1"]


def test_a_warm_started_run_killed_after_its_checkpoint_resumes_to_the_epsilon_and_generator_of_an_unbroken_run(tmp_path):
    """The warm start's options the model resolves itself (its length scale, its feature seed) no longer stop a resume
    from the command line: killed after step 2, resumed to step 4, the run ends with the ε and the generator of a run
    never interrupted (the release paid and measured once, its warm-start steps not taken again)."""
    killed = start_cli(*WARM_DPGAN, *CHECKPOINTS, "--trainer.max_steps", "1000", "--trainer.logger.init_args.experiment_name",
                       "killed", cwd=tmp_path, log=tmp_path / "killed.log")
    unbroken = start_cli(*WARM_DPGAN, "--trainer.max_steps", "4", "--trainer.logger.init_args.experiment_name", "unbroken",
                         cwd=tmp_path, log=tmp_path / "unbroken.log")
    _kill_once_written(killed, tmp_path / "ckpts" / "step=4.ckpt", tmp_path / "killed.log")
    assert unbroken.wait(timeout=300) == 0, (tmp_path / "unbroken.log").read_text()[-3000:]
    resumed = run_cli(*WARM_DPGAN, "--trainer.max_steps", "4", "--trainer.logger.init_args.experiment_name", "resumed",
                      "--ckpt_path", "ckpts/step=2.ckpt", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "in this run, resumed at step 2)" in resumed.stdout
    assert "30% of the budget (ε 3 alone) bought the warm start" in resumed.stdout and "3 of 3 warm-start generator steps" in resumed.stdout
    (one,), (two,) = (_runs(tmp_path, name)[1] for name in ("unbroken", "resumed"))
    assert math.isclose(one.data.metrics["epsilon_final"], two.data.metrics["epsilon_final"], rel_tol=1e-9)
    final = load_generator(two.data.tags["training_checkpoint"])
    assert final.accountant.counts["subsampled_gaussian_events"] == 1 + 4  # the release once, then one event a generator step
    released = [load_release(run.data.tags["release_artifact"])["generator"] for run in (one, two)]
    assert released[0].keys() == released[1].keys()
    assert all(torch.equal(released[0][k], released[1][k]) for k in released[0])


#: PATE-GAN's default warm start on a table (warm_start: auto, MarginalTree's fit), shrunk by options given over it
SMALL_TABLE_WARM_START = ["--model.warm_start.steps", "3", "--model.warm_start.features", "200", "--model.warm_start.sample_rows",
                          "400", "--model.warm_start.batch_size", "40"]


def test_pate_gans_table_default_resumes_from_the_command_line(tmp_path, capsys):
    """What PATE-GAN resolves itself on a table (its network sizes by the data's shape; ``warm_start: auto`` stored as
    the table warm start it chose, here with options given over it) answers a resume that leaves it to the model: the
    resume continues the release (MarginalTree's planned events charged once, its steps not taken again) and ε; a
    release option asked otherwise is still refused in one line."""
    from conftest import query_run
    from lightning_gpate.cli import main

    write_tiny_table(tmp_path / "table.csv")
    tiny_pategan_config(tmp_path / "c.yaml", experiment="table", max_steps=2, checkpoints="ckpts", every_n_train_steps=2)
    fit = ["fit", "--config", "c.yaml", *SMALL_TABLE_WARM_START]
    assert main(fit) == 0
    spent = load_generator("ckpts/step=2.ckpt").guarantee_epsilon()
    capsys.readouterr()
    assert main([*fit, "--trainer.max_steps", "3", "--ckpt_path", "ckpts/step=2.ckpt"]) == 0
    out = capsys.readouterr().out
    assert "in this run, resumed at step 2)" in out and "released once" in out and "3 of 3 warm-start generator steps" in out
    run, _ = query_run("table")
    final = load_generator(run.data.tags["training_checkpoint"])
    assert final.guarantee_epsilon() > spent
    assert final.hparams["warm_start"]["source"] == "marginals" and final.hparams["warm_start"]["fraction"] == 0.8
    assert float(run.data.params["privacy_split/warm_start_epsilon_alone"]) == 8.0
    counts = final.accountant.counts
    from lightning_gpate.privacy import ExponentialMechanismEvent, SubsampledGaussianEvent
    from lightning_gpate.privacy.dp_stats import metadata_events

    metadata = [e for e in metadata_events(final.data_spec["metadata_cost"])  # the quantile bins', paid once by the model
                if isinstance(e, (ExponentialMechanismEvent, SubsampledGaussianEvent))]
    assert counts["exponential_mechanism_events"] + counts["subsampled_gaussian_events"] == len(final.warm_release.planned) + len(metadata)
    assert main([*fit, "--model.warm_start.fraction", "0.5", "--trainer.max_steps", "3", "--ckpt_path", "ckpts/step=2.ckpt"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[-1].startswith("lightning-gpate fit: error: ckpts/step=2.ckpt pins warm_start=") and "'fraction': 0.5" in err[-1]
