"""PATE-GAN and GS-WGAN through ``lightning-gpate fit`` on 2 CPU processes (DDP, gloo), as a user runs
them, against the same command on 1 process under the same strategy: one MLflow run, the same ε, and —
with the test-only noise seed and ``--seed_everything`` fixed — the same release, every tensor of it
(BatchNorm buffers included). One pair of runs (per stage) serves every assertion of a model."""

from __future__ import annotations

import math
import os

import mlflow
import pytest
import torch
import yaml

import lightning_gpate.models
from clitools import ROOT, TINY_SCHEMA, assert_fit_ran, assert_same_tensors, config_init_args, run_cli, write_tiny_table
from lightning_gpate.models.pategan import PAPER_SETTINGS as PATEGAN_PAPER

ROOT_DOCS = ROOT / "docs"

FIXED = ["--seed_everything", "11", "--model.init_args.noise_seed", "0", "--trainer.strategy", "ddp"]
INIT = {
    "PATEGAN": {**{k: list(v) if isinstance(v, tuple) else v for k, v in PATEGAN_PAPER.items()},  # the former defaults
                "epsilon": 5.0, "teacher_steps": 2, "student_steps": 2, "query_batch_size": 16,
                "marginal_fraction": 0.3},  # the measured marginals too: the same noisy tables on every rank
    "GSWGAN": {"epsilon": 50.0, "delta": 1e-5, "stage": "pretrain", "critic_steps": 2, "pretrain_iterations": 3,
               "generator_batch_size": 8, "noise_multiplier": 4.0},
}


def _fit(folder, model: str, devices: int, experiment: str, *extra: str):
    """``lightning-gpate fit`` of ``model`` on the tiny table (5 teachers: 3 on rank 0, 2 on rank 1),
    3 steps, default callbacks; returns the experiment's runs."""
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 3, "enable_progress_bar": False},
        "model": {"class_path": f"lightning_gpate.models.{model}",
                  "init_args": config_init_args(getattr(lightning_gpate.models, model), INIT[model])},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": "table.csv", "label": "y", "class_ratio": [0.5, 0.5], "num_teachers": 5, "schema": TINY_SCHEMA}},
    }
    (folder / "c.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("fit", "--config", "c.yaml", "--trainer.devices", str(devices), *FIXED, *extra,
                     "--trainer.logger.init_args.experiment_name", experiment, cwd=folder, timeout=600)
    assert_fit_ran(result, processes=devices)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlruns' / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def _the_bins_of(runs):
    """A block within which a fit takes the DP metadata (the table's private quantile bins, drawn with secret noise) of
    the one MLflow run in ``runs``: two runs are then compared on the same bins, as noise_seed gives them one noise."""
    from datamodules import shared_released_spec

    (run,) = runs
    return shared_released_spec(_checkpoint(run)["hyper_parameters"]["data_spec"])


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if torch.is_tensor(v)}


def assert_same_state(one: dict, two: dict) -> None:
    assert_same_tensors(_tensors(one), _tensors(two), atol=1e-6)


def assert_same_optimizer_states(one: list, two: list) -> None:
    assert len(one) == len(two)
    for a, b in zip(one, two):
        assert a["state"].keys() == b["state"].keys()
        for p in a["state"]:
            assert_same_state(a["state"][p], b["state"][p])


def _checkpoint(run) -> dict:
    return torch.load(run.data.tags["training_checkpoint"], map_location="cpu", weights_only=False)


def _release(run) -> dict:
    return torch.load(run.data.tags["release_artifact"], map_location="cpu", weights_only=False)


def assert_one_finished_run_each_with_the_same_epsilon(runs_one, runs_two) -> tuple:
    (one,), (two,) = runs_one, runs_two  # exactly one MLflow run for the two processes
    for run in (one, two):
        assert run.info.status == "FINISHED"
        assert not [t for t in run.data.tags if t.endswith("_error")], run.data.tags  # every evaluation ran
    assert math.isclose(one.data.metrics["epsilon_final"], two.data.metrics["epsilon_final"], rel_tol=1e-12)
    assert one.data.tags["stop_reason"] == two.data.tags["stop_reason"]
    return one, two


# ------------------------------------------------------------------------------------------ PATE-GAN
@pytest.fixture(scope="module")
def pategan_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pategan_ddp")
    write_tiny_table(folder / "table.csv")
    one = _fit(folder, "PATEGAN", 1, "one")
    with _the_bins_of(one):
        return one, _fit(folder, "PATEGAN", 2, "two")


@pytest.mark.xdist_group("ddp_pategan")  # one module fixture's runs: one worker (pytest-xdist)
def test_pategan_on_two_processes_is_one_run_with_the_epsilon_and_the_release_of_one(pategan_runs):
    one, two = assert_one_finished_run_each_with_the_same_epsilon(*pategan_runs)
    assert one.data.tags["stop_reason"] == "max_steps=3 reached" and one.data.metrics["epsilon_final"] > 0
    # the generator, BatchNorm running statistics included, is what the release samples from
    assert_same_state(_release(one)["generator"], _release(two)["generator"])


@pytest.mark.xdist_group("ddp_pategan")  # one module fixture's runs: one worker (pytest-xdist)
def test_pategan_training_checkpoint_of_two_processes_holds_every_teacher_in_order(pategan_runs):
    # rank 0 writes the checkpoint: it gathers the teachers (and their Adam moments) of both ranks,
    # so the checkpoint is the one process's, resumable with any number of processes
    (one,), (two,) = pategan_runs
    c1, c2 = _checkpoint(one), _checkpoint(two)
    assert c2["state_dict"]["teachers.teacher_ids"].tolist() == [0, 1, 2, 3, 4]
    assert bool(c2["state_dict"]["marginals_measured"])  # compared below with the one process's noisy tables
    assert_same_state(c1["state_dict"], c2["state_dict"])
    assert_same_optimizer_states(c1["optimizer_states"], c2["optimizer_states"])


# ------------------------------------------------------------------------------------------ GS-WGAN
@pytest.fixture(scope="module")
def gswgan_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gswgan_ddp")
    write_tiny_table(folder / "table.csv")
    pre = {1: _fit(folder, "GSWGAN", 1, "pretrain1")}
    with _the_bins_of(pre[1]):
        pre[2] = _fit(folder, "GSWGAN", 2, "pretrain2")
    # the private stage draws no metadata: it trains on, and pays for, its pretraining's
    train = {d: _fit(folder, "GSWGAN", d, f"train{d}", "--model.init_args.stage", "train",
                     "--model.init_args.pretrained_checkpoint", pre[d][0].data.tags["training_checkpoint"])
             for d in (1, 2)}
    return pre, train


@pytest.mark.xdist_group("ddp_gswgan")  # one module fixture's runs: one worker (pytest-xdist)
def test_gswgan_pretraining_on_two_processes_checkpoints_every_discriminator_as_one_process(gswgan_runs):
    pre, _ = gswgan_runs
    one, two = assert_one_finished_run_each_with_the_same_epsilon(pre[1], pre[2])
    c1, c2 = _checkpoint(one), _checkpoint(two)
    assert c2["state_dict"]["discriminators.w0"].shape[0] == 5  # 3 from rank 0, 2 from rank 1
    assert c2["state_dict"]["discriminators.teacher_ids"].tolist() == [0, 1, 2, 3, 4]  # in global order
    assert_same_state(c1["state_dict"], c2["state_dict"])
    assert_same_optimizer_states(c1["optimizer_states"], c2["optimizer_states"])


@pytest.mark.xdist_group("ddp_gswgan")  # one module fixture's runs: one worker (pytest-xdist)
def test_gswgan_private_stage_on_two_processes_is_one_run_with_the_epsilon_and_the_release_of_one(gswgan_runs):
    # with noise_seed 0 the 3 steps draw discriminators 4, 2, 1: rank 0 sanitises twice, then rank 1
    # (its broadcast, and both ranks' skipped noise, are on the path to the release compared here)
    _, train = gswgan_runs
    one, two = assert_one_finished_run_each_with_the_same_epsilon(train[1], train[2])
    assert one.data.tags["stop_reason"] == "max_steps=3 reached" and one.data.metrics["epsilon_final"] > 0
    assert_same_state(_release(one)["generator"], _release(two)["generator"])
    # the secret choice of discriminator is not logged (it is only with log_private_diagnostics)
    assert not [m for m in two.data.metrics if "discriminator" in m]
    assert os.path.exists(two.data.tags["training_checkpoint"])


@pytest.mark.xdist_group("ddp_gswgan")  # one module fixture's runs: one worker (pytest-xdist)
def test_gswgan_s_two_stages_on_a_table_use_and_pay_for_one_draw_of_the_quantile_bins(gswgan_runs):
    pre, train = gswgan_runs
    for d in (1, 2):
        pretrained = _checkpoint(pre[d][0])["hyper_parameters"]["data_spec"]
        release = _release(train[d][0])
        spec, counts = release["hyper_parameters"]["data_spec"], release["privacy"]["accountant"]["counts"]
        count, quantiles = spec["metadata_cost"]  # the default quantile bins: a noisy row count and the edges
        assert quantiles["mechanism"] == "exponential" and quantiles["events"] > 0
        # the private stage's bins are its pretraining's (the discriminators' partition is cut on them) ...
        assert spec["columns"] == pretrained["columns"] and spec["metadata_cost"] == pretrained["metadata_cost"]
        # ... and the run's guarantee pays for them once: the count's epsilon and one exponential event per edge
        assert math.isclose(counts["pure_dp_epsilon"], count["epsilon"], rel_tol=1e-12)
        assert counts["exponential_mechanism_events"] == quantiles["events"] and counts["gswgan_steps"] == 3


# ------------------------------------------------------------------------------------------ the pieces
def test_a_rank_that_skips_the_sanitiser_noise_draws_the_next_step_s_noise_as_the_owner_does():
    # under DDP with a fixed test seed the rank without the step's discriminator only advances its
    # (identically seeded) noise generator: the next step's noise is then the owner's, never a repeat
    from lightning_gpate.privacy.sanitizer import GradientSanitizer

    for secure in (False, True):
        sanitizer = GradientSanitizer(clip_bound=1.0, noise_multiplier=1.0, secure_mode=secure)
        owner, other = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        grad = torch.randn(8, 5)
        first = sanitizer(grad, reduction="sum", generator=owner)
        sanitizer.skip_noise(grad, generator=other)
        zero = torch.zeros_like(grad)
        second_owner = sanitizer(zero, reduction="sum", generator=owner)
        second_other = sanitizer(zero, reduction="sum", generator=other)
        assert torch.equal(second_owner, second_other)
        assert not torch.allclose(second_owner, first - sanitizer.clip(grad))  # fresh noise, not the first step's


def test_a_checkpoint_of_every_member_is_sliced_to_a_rank_s_members_without_touching_live_state():
    from lightning_gpate.models.sharding import select_members

    live = {"exp_avg": torch.arange(5.0).view(5, 1), "step": torch.tensor(3.0)}
    checkpoint = {"state_dict": {"teachers.w": torch.arange(10.0).view(5, 2), "generator.w": torch.ones(3)},
                  "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(3)}}}, {"state": {0: live}}]}
    select_members(checkpoint, owned=[1, 3], prefixes=["teachers."], optimizer_indices=[1])
    assert checkpoint["state_dict"]["teachers.w"].tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert checkpoint["state_dict"]["generator.w"].shape == (3,)  # replicated: whole
    assert checkpoint["optimizer_states"][1]["state"][0]["exp_avg"].flatten().tolist() == [1.0, 3.0]
    assert checkpoint["optimizer_states"][1]["state"][0]["step"] == 3.0
    assert checkpoint["optimizer_states"][0]["state"][0]["exp_avg"].shape == (3,)  # not a member optimizer
    assert live["exp_avg"].shape == (5, 1)  # the dict it came from is not modified


def test_gswgan_that_keeps_discriminator_state_is_refused_on_two_processes_in_one_line(tmp_path, capsys):
    from lightning_gpate.cli import main

    write_tiny_table(tmp_path / "table.csv")
    config = {
        "trainer": {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_steps": 1},
        "model": {"class_path": "lightning_gpate.models.GSWGAN", "init_args": {
            "epsilon": 1.0, "delta": 1e-5, "discriminator_state": "kept", "budget_accounting": "paper", "noise_multiplier": 1.07}},
        "data": {"class_path": "datamodules.TabularDataModule", "init_args": {
            "path": "table.csv", "label": "y", "class_ratio": [0.5, 0.5], "num_teachers": 4, "schema": TINY_SCHEMA}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", "c.yaml"]) == 2  # refused before any process is launched
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "lightning-gpate fit: error: GSWGAN trains on one process only (discriminator_state: kept")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_processes_of_a_fit_train_on_one_draw_of_the_dp_metadata_and_refuse_two(tmp_path):
    """Private quantile bins (and any DP metadata) are drawn once: processes started inside the launching process's
    ``shared_released_spec`` (as lightning-gpate fit starts its DDP ranks) all hold that draw and pay for it once;
    processes that each drew their own (started apart, e.g. one per node) are refused in one line at setup."""
    from datamodules import TabularDataModule, shared_released_spec
    from ddp_workers import data_spec_of_ranks
    from lightning_gpate.models.private import release_spec
    from small_models import SCHEMA, public_frame

    options = {"label": "y", "schema": SCHEMA, "class_ratio": [0.5, 0.5], "quantile_epsilon": 1.0, "test_fraction": 0.0}

    def ranks(folder):
        folder.mkdir()
        torch.multiprocessing.start_processes(data_spec_of_ranks, args=(2, _free_port(), str(folder), options), nprocs=2,
                                              start_method="fork")
        return [torch.load(folder / f"{r}.pt") for r in (0, 1)]

    apart = ranks(tmp_path / "apart")
    for rank in apart:
        assert rank["error"].startswith("the processes of this fit hold different data: process 1 has another data spec")
        assert "\n" not in rank["error"]
    launcher = TabularDataModule(frame=public_frame(), **options)
    with shared_released_spec(release_spec(launcher.spec), launcher):
        shared = ranks(tmp_path / "shared")
    assert "error" not in shared[0] and "error" not in shared[1], shared
    drawn = {c["name"]: c["edges"] for c in launcher.spec["columns"]}
    assert drawn["a"] is not None and len(drawn["a"]) > 2  # quantile bins were drawn ...
    assert shared[0]["edges"] == shared[1]["edges"] == drawn  # ... once, and every process trains on them
    # the cost each process's model charges is that of the one draw: the row count and the quantiles
    assert shared[0]["metadata_cost"] == shared[1]["metadata_cost"] == launcher.spec["metadata_cost"]
    assert [cost["what"] for cost in launcher.spec["metadata_cost"]][0].startswith("row count")
    assert len(launcher.spec["metadata_cost"]) == 2


def _documented_noise(model: str) -> str:
    """The 'mechanism's noise' cell of ``model``'s row in docs/multi-gpu.md's trust table."""
    rows = [line.split("|") for line in (ROOT_DOCS / "multi-gpu.md").read_text().splitlines() if line.startswith(f"| {model} |")]
    assert len(rows) == 2, model  # the table of what is split, and the table of who must be trusted
    return rows[1][2]


def test_under_ddp_who_can_replay_the_noise_is_what_the_docs_say(tmp_path):
    """2 gloo processes, no noise_seed. GS-WGAN: the rank that holds the drawn discriminator adds noise
    from its own OS-seeded generator, so the other rank (whose generator was a copy of the owner's, one
    broadcast seed, before issue 33) cannot draw that noise and subtract it from the sanitised gradient it
    receives. G-PATE and PATE-GAN: every rank draws the same vote noise. docs/multi-gpu.md says which. A warm start's
    release, measured on every rank with one noise, is measured with one feature seed too: rank 0's, which every rank
    takes in ``setup`` whatever seed its own random state drew (its hyperparameters name the frequencies it uses)."""
    from ddp_workers import mechanism_noise_of_ranks

    port = _free_port()
    steps = 4
    # forked, not spawned (no imports again): the ranks then also share this process's `random` and numpy states,
    # which can only make a rank's noise easier to replay
    torch.multiprocessing.start_processes(mechanism_noise_of_ranks, args=(2, port, str(tmp_path), steps), nprocs=2, start_method="fork")
    ranks = [torch.load(tmp_path / f"{r}.pt")["gswgan"] for r in (0, 1)]
    choices = [[k for k, _ in r["drawn"]] for r in ranks]
    assert choices[0] == choices[1] and len(choices[0]) == steps  # every rank drew the same discriminators
    added = [iter(r["added"]) for r in ranks]
    for step, k in enumerate(choices[0]):
        owner = k % 2
        noise = next(added[owner])
        assert noise.abs().max() > 1.0  # noise of std 2Cσ = 8 was added
        # the replay is the right attempt: on the owner it is exactly the noise added ...
        assert torch.allclose(ranks[owner]["drawn"][step][1], noise, atol=1e-4)
        # ... and the other rank's own generator gives something else
        assert not torch.allclose(ranks[1 - owner]["drawn"][step][1], noise, atol=1.0), step
    assert "from its own OS-seeded generator" in _documented_noise("GS-WGAN")
    for model, key in (("G-PATE", "gpate"), ("PATE-GAN", "pategan")):
        draws = [torch.load(tmp_path / f"{r}.pt")[key] for r in (0, 1)]
        assert torch.equal(draws[0], draws[1]), model  # one noise for every rank ...
        assert "drawn alike on every rank" in _documented_noise(model)  # ... as documented
    assert "one trusted curator" in (ROOT_DOCS / "privacy.md").read_text()
    from lightning_gpate.privacy.merf import fourier_frequencies

    warm = [torch.load(tmp_path / f"{r}.pt")["warm_start"] for r in (0, 1)]
    assert warm[0]["feature_seed"] == warm[1]["feature_seed"]
    for w in warm:  # the frequencies a rank measured with are those its hyperparameters name
        assert torch.equal(w["frequencies"], fourier_frequencies(200, w["frequencies"].shape[1], w["length_scale"], w["feature_seed"]))
    assert torch.equal(warm[0]["released"], warm[1]["released"])
