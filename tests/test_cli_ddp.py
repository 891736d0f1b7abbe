"""``lightning-gpate fit`` on 2 CPU processes (DDP, gloo) with the default callbacks, as a user runs it."""

from __future__ import annotations

import contextlib
import math
import os

import mlflow
import torch
import yaml

from clitools import (ROOT, TINY_SCHEMA, assert_fit_ran, assert_one_line_error, assert_same_tensors, run_cli,
                      store_snapshot, tiny_gpate_config, write_tiny_table)
from conftest import query_run
from datamodules import shared_released_spec
from ddp_workers import noise_of_one_dpgan_step
from lightning_gpate.cli import main
from lightning_gpate.release import load_release

# The quickstart, shortened: fewer teachers and steps, short evaluation trainings; every default
# callback (samples, final checkpoint, utility CNN, IS/FID, privacy, summary) stays on.
QUICK = ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--data.init_args.num_teachers", "40",
         "--trainer.max_steps", "3", "--model.init_args.noise_seed", "0", "--trainer.enable_progress_bar", "false",
         "--utility.cnn_epochs", "2", "--image_quality.feature_epochs", "2"]


def _experiment_runs(experiment: str):
    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])  # this test's store, whatever an earlier fit set
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id])


def _artifact_tensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of a release artifact (generator weights and buffers, and any other), by its path."""
    found = {}

    def walk(prefix, obj):
        if isinstance(obj, torch.Tensor):
            found[prefix] = obj
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}/{key}", value)
        elif isinstance(obj, (list, tuple)):
            for k, value in enumerate(obj):
                walk(f"{prefix}/{k}", value)

    walk("", load_release(path))
    return found


def _assert_same_release(path_one: str, path_two: str, *, atol: float) -> None:
    one, two = _artifact_tensors(path_one), _artifact_tensors(path_two)
    assert any("running_mean" in k for k in one)  # BatchNorm buffers included
    assert_same_tensors(one, two, atol=atol)


@contextlib.contextmanager
def _one_process_under_ddp():
    """A fit in this process with ``--trainer.strategy ddp --trainer.devices 1`` (a process group of one,
    the code path of every rank); the group and the variables Lightning set are removed afterwards."""
    environ = dict(os.environ)
    # as in the CLI's processes (clitools.cli_env): else Lightning gives this one process every core's thread
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield ["--trainer.strategy", "ddp", "--trainer.devices", "1"]
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)


def _two_processes(args: list[str], experiment: str, cwd) -> tuple:
    """``args`` on 2 gloo processes through the CLI: (completed process, its one MLflow run)."""
    two = run_cli(*args, "--trainer.devices", "2", "--trainer.strategy", "ddp",
                  "--trainer.logger.init_args.experiment_name", experiment, cwd=cwd, timeout=600)
    assert_fit_ran(two, processes=2)
    (run_two,) = _experiment_runs(experiment)  # exactly one run for the two processes
    return two, run_two


def _one_and_two_processes(args: list[str], cwd) -> tuple:
    """``args`` on 2 gloo processes (experiment ``two``), then in this process under DDP (``one``) on the DP metadata
    that the two drew (a table's private quantile bins: secret noise, which no seed replays): (run one, run two, the
    MLflow client)."""
    _, run_two = _two_processes(args, "two", cwd)
    released = load_release(run_two.data.tags["release_artifact"])["hyper_parameters"]["data_spec"]
    with shared_released_spec(released), _one_process_under_ddp() as ddp_one:
        assert main([*args, *ddp_one, "--trainer.logger.init_args.experiment_name", "one"]) == 0
    run_one, client = query_run("one")
    return run_one, run_two, client


def test_two_processes_finish_with_one_run_and_the_generator_and_epsilon_of_one(tmp_path, capsys):
    # Both under the `ddp` strategy, and both with one thread per process (the CLI's environment and the
    # test's): CPU kernels (BatchNorm, ConvTranspose) round differently with the thread count, and
    # G-PATE's sign votes and Adam turn such last-bit differences into visibly different generators
    # (1e-2 in BatchNorm running means after one step, for 1 process on 2 threads vs 1 process on 1
    # thread alike): Lightning gives each of W CPU processes 1/W of the cores unless OMP_NUM_THREADS is set.
    two, run_two = _two_processes(QUICK, "two", tmp_path)
    with _one_process_under_ddp() as ddp_one:
        assert main([*QUICK, *ddp_one, "--trainer.logger.init_args.experiment_name", "one"]) == 0
    summary = two.stdout.split("lightning-gpate fit: done\n")[1]
    # noise_seed is fixed for the comparison: the summary says the run is no guarantee
    assert "stopped   max_steps=3 reached" in summary and "of the budget ε = 10 (δ = 1e-05): NOT a guarantee (noise_seed fixed" in summary
    for figure in ("CNN accuracy on real test (final epoch)", "Inception Score", "FID"):
        assert figure in summary

    run_one, _ = query_run("one")
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED"
        assert not [t for t in run.data.tags if t.endswith("_error")], run.data.tags  # every evaluation ran
        assert {"utility/cnn_accuracy_final", "quality/inception_score", "quality/fid"} <= set(run.data.metrics)
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    assert run_one.data.tags["stop_reason"] == run_two.data.tags["stop_reason"] == "max_steps=3 reached"
    _assert_same_release(run_one.data.tags["release_artifact"], run_two.data.tags["release_artifact"], atol=1e-5)


DPGAN_QUICK = ["fit", "--config", str(ROOT / "configs" / "dpgan_digits.yaml"), "--trainer.max_steps", "3",
               "--seed_everything", "11", "--model.init_args.noise_seed", "0", "--trainer.enable_progress_bar", "false",
               "--utility.cnn_epochs", "2", "--image_quality.feature_epochs", "2"]


def test_dpgan_on_two_processes_releases_the_generator_and_epsilon_of_one(tmp_path):
    """Each process clips its shard of the Poisson batch, the noise is added once (rank 0), the sums are
    all-reduced: with the noise seed fixed, the same release as one process up to the order of the sums."""
    run_one, run_two, _ = _one_and_two_processes(DPGAN_QUICK, tmp_path)
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED" and run.data.tags["stop_reason"] == "max_steps=3 reached"
        assert not [t for t in run.data.tags if t.endswith("_error")], run.data.tags
        assert {"utility/cnn_accuracy_final", "quality/fid"} <= set(run.data.metrics)
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    assert math.isclose(run_one.data.metrics["epsilon_opacus_worst_case"], run_two.data.metrics["epsilon_opacus_worst_case"], rel_tol=1e-9)
    # RMSprop scales a coordinate's update by 1/sqrt(its mean square): float-level differences of the
    # summation order (two partial sums vs one) stay float-level, well under 1e-4 after 3 steps
    _assert_same_release(run_one.data.tags["release_artifact"], run_two.data.tags["release_artifact"], atol=1e-4)


#: DP-GAN warm-started (issue 56): the release and its steps before the first critic step, its pull in every generator step
DPGAN_WARM_QUICK = [*DPGAN_QUICK, "--model.warm_start.fraction", "0.3", "--model.warm_start.features", "200",
                    "--model.warm_start.steps", "3", "--model.warm_start.batch_size", "40", "--model.warm_start.anchor_weight", "0.5",
                    "--model.generator_architecture", "dcgan", "--model.generator.upsample", "nearest", "--model.generator.gf_dim", "8",
                    "--model.generator.fc_dim", "32", "--model.critic.fc_dim", "32", "--model.generator.z_dim", "5"]


def test_a_warm_started_dpgan_on_two_processes_releases_the_generator_and_epsilon_of_one(tmp_path):
    """Every rank measures the same release (one secret seed, broadcast) and takes the same warm-start steps (their
    gradients averaged over the ranks), then DP-SGD as above: the same release as one process, one release charged."""
    _two_processes(DPGAN_WARM_QUICK, "warm-two", tmp_path)
    (run_two,) = _experiment_runs("warm-two")
    with _one_process_under_ddp() as ddp_one:
        assert main([*DPGAN_WARM_QUICK, *ddp_one, "--trainer.logger.init_args.experiment_name", "warm-one"]) == 0
    run_one, _ = query_run("warm-one")
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED" and not [t for t in run.data.tags if t.endswith("_error")], run.data.tags
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    _assert_same_release(run_one.data.tags["release_artifact"], run_two.data.tags["release_artifact"], atol=1e-4)


# Bie et al.'s recipe, small; the adaptive n_D moves every generator step (threshold 1, grace 1): 1, 2, 5
DPGAN_REVISITED = [*DPGAN_QUICK, "--model.init_args.training.loss", "nonsaturating", "--model.init_args.training.optimizer", "adam",
                   "--model.init_args.training.lr", "0.0002", "--model.init_args.training.weight_clip", "null",
                   "--model.init_args.architecture", "conv", "--model.init_args.generator.gf_dim", "8", "--model.init_args.critic.df_dim", "8",
                   "--model.init_args.generator.ema_decay", "0.9", "--model.init_args.d_steps", "1",
                   "--model.init_args.adaptive_d_steps", "{threshold: 1.0, grace: 1, decay: 0.5}", "--trainer.log_every_n_steps", "1"]


def test_dpgan_revisited_recipe_on_two_processes_releases_the_generator_and_epsilon_of_one(tmp_path):
    """Under DDP each process decides the adaptive n_D from the same critic and the same public fakes: the
    processes stay in step (a process serving another number of batches would change the ε, or hang the
    all-reduce), and the release (the EMA generator) and ε are one process's."""
    run_one, run_two, client = _one_and_two_processes(DPGAN_REVISITED, tmp_path)
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED" and run.data.tags["stop_reason"] == "max_steps=3 reached"
        history = {key: [m.value for m in client.get_metric_history(run.info.run_id, key)] for key in ("d_steps", "d_steps_next")}
        assert history == {"d_steps": [1.0, 2.0, 5.0], "d_steps_next": [2.0, 5.0, 10.0]}  # paid for, then served next
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    one, two_ = (_artifact_tensors(run.data.tags["release_artifact"]) for run in (run_one, run_two))
    assert_same_tensors(one, two_, atol=1e-3)  # Adam's normalised steps: float-level sums, float-level releases


def test_dpgan_noise_is_added_once_per_step_on_two_processes(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sigma, clip = 1.3, 0.7
    # forked: fresh interpreters would import torch and opacus again; the mechanism's generator is OS-seeded either way
    torch.multiprocessing.start_processes(noise_of_one_dpgan_step, args=(2, port, str(tmp_path), sigma, clip, 32.0), nprocs=2,
                                          start_method="fork")
    noise = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    assert torch.equal(noise[0], noise[1])  # every process applies the same noisy gradient
    d = noise[0].numel()
    assert d > 4000
    # ||N(0, σ²C²I_d)|| = σC√d (1 ± 1/√(2d)): once, not √2 times (one draw per process)
    assert abs(float(noise[0].norm()) / (sigma * clip * math.sqrt(d)) - 1) < 0.05


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


def test_a_resumed_two_process_fit_continues_epsilon_on_every_rank(tmp_path):
    """Kill-and-resume under DDP: every rank restores the accountant from the checkpoint. Each rank makes the
    budget decision from its own accountant (the votes and the noise are the same on all): a rank that
    restarted from ε = 0 would go on after its peers stopped and wait at a collective (the timeout), and
    rank 0 restarting from 0 would log a smaller ε and stop ~10 steps late."""
    write_tiny_table(tmp_path / "table.csv")
    # large noise and a budget of ~30 steps (tests/test_cli_resume.py): the stop comes from the budget
    tiny_gpate_config(tmp_path / "tiny.yaml", epsilon=0.9, experiment="ddp_resume", checkpoints="ckpts", every_n_train_steps=10,
                      sigma_threshold=200.0, sigma_gnmax=200.0)
    ddp = ["--trainer.devices", "2", "--trainer.strategy", "ddp"]
    unbroken = run_cli("fit", "--config", "tiny.yaml", *ddp, cwd=tmp_path, timeout=600)
    assert_fit_ran(unbroken, processes=2)
    (tmp_path / "ckpts" / "kept.ckpt").write_bytes((tmp_path / "ckpts" / "step=10.ckpt").read_bytes())  # written again below
    resumed = run_cli("fit", "--config", "tiny.yaml", *ddp, "--ckpt_path", "ckpts/kept.ckpt", cwd=tmp_path, timeout=600)
    assert_fit_ran(resumed, processes=2)
    assert "in this run, resumed at step 10)" in resumed.stdout

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    first, second = sorted(_experiment_runs("ddp_resume"), key=lambda r: r.info.start_time)
    for run in (first, second):
        assert run.info.status == "FINISHED" and run.data.tags["stop_reason"].startswith("privacy budget reached")
        assert run.data.metrics["epsilon_final"] <= 0.9
    # the logged guarantee is a function of the step count (the worst case of the steps taken, capped by the
    # budget the stop rule keeps): the resumed run's from step 11 on is the unbroken run's
    unbroken_eps = {m.step: m.value for m in client.get_metric_history(first.info.run_id, "epsilon")}
    resumed_eps = sorted((m.step, m.value) for m in client.get_metric_history(second.info.run_id, "epsilon"))
    assert resumed_eps[0][0] == 10  # Lightning logs global step 11 at MLflow step 10: steps 1..10 were not run again
    common = [(step, eps) for step, eps in resumed_eps if step in unbroken_eps]
    assert len(common) >= 15 and all(math.isclose(eps, unbroken_eps[step], rel_tol=1e-6) for step, eps in common)
    # where the stop comes depends on the realised costs (how many noisy threshold checks passed): the same
    # within a few steps, not ~10 more
    steps = [int(load_release(run.data.tags["release_artifact"])["global_step"]) for run in (first, second)]
    assert abs(steps[0] - steps[1]) <= 5, steps
    # the table's default quantile bins: drawn once by the launching process (the other rank took them, else setup
    # refuses), paid for once, and taken by the resumed run from its checkpoint
    releases = [load_release(run.data.tags["release_artifact"]) for run in (first, second)]
    specs = [release["hyper_parameters"]["data_spec"] for release in releases]
    assert specs[0]["columns"] == specs[1]["columns"] and specs[0]["metadata_cost"] == specs[1]["metadata_cost"]
    assert specs[0]["metadata_cost"][0]["what"].startswith("row count sizing the quantile bins")
    for spec, release in zip(specs, releases):
        counts = release["privacy"]["accountant"]["counts"]
        exponential = [c for c in spec["metadata_cost"] if c.get("mechanism") == "exponential"]
        assert math.isclose(counts["pure_dp_epsilon"], sum(c["epsilon"] for c in spec["metadata_cost"] if c not in exponential))
        assert counts["exponential_mechanism_events"] == sum(c["events"] for c in exponential)


def test_pategan_warm_started_from_the_marginal_model_on_two_processes_releases_the_generator_and_epsilon_of_one(tmp_path):
    """PATE-GAN's default on tables (issue 59: the warm start from MarginalTree's fit, here sized down): every rank fits
    the same tree (one secret seed, broadcast), embeds the same sampled rows and takes the same warm-start steps, then
    the teachers' votes as on one process: the same release and ε as one process, the tree's events charged once."""
    write_tiny_table(tmp_path / "table.csv")
    warm = {"source": "marginals", "fraction": 0.8, "features": 200, "steps": 3, "batch_size": 40, "sample_rows": 400,
            "anchor_weight": 1.0, "length_scale": [0.25, 1.0, 4.0]}
    config = {
        "seed_everything": 0,
        "trainer": {"max_steps": 3, "accelerator": "cpu", "log_every_n_steps": 1, "enable_progress_bar": False,
                    "logger": {"class_path": "lightning_gpate.tracking.GPATEMLFlowLogger", "init_args": {"experiment_name": "x"}}},
        "model": {"class_path": "lightning_gpate.models.PATEGAN", "init_args": {
            "epsilon": 10.0, "delta": 1e-5, "noise_seed": 0, "planned_queries": 64, "query_batch_size": 8, "warm_start": warm,
            "generator": {"hidden": [16]}, "student": {"hidden": [8]}, "teachers": {"hidden": [8]}}},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": "table.csv", "label": "y", "schema": TINY_SCHEMA, "class_ratio": [0.5, 0.5], "num_teachers": 4,
            "teacher_batch_size": 8, "test_fraction": 0.2}},
        "utility": {"enabled": False},
        "image_quality": {"enabled": False},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    args = ["fit", "--config", str(tmp_path / "c.yaml")]
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        run_one, run_two, _ = _one_and_two_processes(args, tmp_path)
    finally:
        os.chdir(previous)
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED" and not [t for t in run.data.tags if t.endswith("_error")], run.data.tags
        assert float(run.data.params["privacy_split/warm_start_epsilon_alone"]) == 8.0
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    assert_same_tensors(_artifact_tensors(run_one.data.tags["release_artifact"]), _artifact_tensors(run_two.data.tags["release_artifact"]),
                        atol=1e-4)
