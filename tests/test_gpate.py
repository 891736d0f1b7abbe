"""G-PATE system: teacher isolation, budget stop without overshoot, resume keeping ε and teachers,
the fixed partition in checkpoints, CLI fit → sample, and DDP (2 processes = 1 process)."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch

from conftest import query_run
from datamodules import ImageDataModule, TabularDataModule
from lightning_gpate.cli import main
from lightning_gpate.models import GPATE
from lightning_gpate.privacy import ConfidentGNMaxEvent
from lightning_gpate.tracking import GPATEMLFlowLogger

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(fake_batch_size=8, projection_dim=4, sigma_threshold=16.0, sigma_gnmax=8.0, threshold_fraction=0.3,
             hidden=(16,), teacher_hidden=(8,), z_dim=8, noise_seed=0)


@pytest.fixture
def public_table() -> TabularDataModule:
    """A table whose metadata is all declared public, so private models accept it."""
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame({"a": rng.uniform(0, 1, n), "b": rng.normal(0, 1, n).clip(-3, 3), "c": rng.integers(0, 10, n)})
    frame["y"] = (frame["a"] + 0.3 * frame["b"] > 0.5).astype(int)
    schema = {"a": {"min": 0, "max": 1}, "b": {"min": -3, "max": 3}, "c": {"min": 0, "max": 9}, "y": {"categories": [0, 1]}}
    return TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], num_teachers=20,
                             teacher_batch_size=8, test_fraction=0.0)


def _trainer(steps, **kw):
    kw.setdefault("logger", False)
    return pl.Trainer(max_steps=steps, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, accelerator="cpu", **kw)


def test_teacher_isolation_changing_one_partition_changes_only_that_teacher(public_table):
    """One iteration from the same state with teacher 3's real rows replaced: only teacher 3's
    parameters change, and each vote histogram moves by at most one vote (L1 <= 2)."""
    public_table.setup("fit")
    batch = next(iter(public_table.train_dataloader()))
    altered = (batch[0].clone(), batch[1].clone())
    altered[0][3] = torch.rand_like(altered[0][3]) * 2 - 1

    def one_step(b):
        torch.manual_seed(0)
        model = GPATE(public_table.spec, epsilon=100.0, **SMALL)
        assert model.teachers.num_teachers == 20
        fakes = model.generator(model.latent(8, generator=torch.Generator().manual_seed(1)), torch.zeros(8, dtype=torch.long)).detach()
        y = torch.zeros(8, dtype=torch.long)
        model._teacher_opt.zero_grad()
        model.teachers.accumulate_teacher_grads(b[0], b[1], fakes, y)
        model._teacher_opt.step()
        P = torch.randn(8, fakes.shape[1], 4, generator=torch.Generator().manual_seed(2)) / 2
        from lightning_gpate.privacy.dpgradagg import project, vote_histograms
        per_teacher = [vote_histograms(project(model.teachers.per_teacher_input_grads(fakes, y)[t:t + 1], P), clip=1e-4, num_bins=10)
                       for t in range(20)]
        return model.teachers, torch.stack(per_teacher)

    t_a, votes_a = one_step(batch)
    t_b, votes_b = one_step(altered)
    diff = torch.stack([(getattr(t_a, n) - getattr(t_b, n)).flatten(1).abs().amax(1) for n in t_a.param_names]).amax(0)
    assert diff[3] > 0 and torch.all(diff[torch.arange(20) != 3] == 0)
    changed = (votes_a != votes_b).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() in ([3], [])
    assert (votes_a.sum(0) - votes_b.sum(0)).abs().sum(-1).max() <= 2


def test_budget_stop_without_overshoot_and_epsilon_in_mlflow(public_table):
    model = GPATE(public_table.spec, epsilon=12.0, **SMALL)
    _trainer(200, logger=GPATEMLFlowLogger(experiment_name="gpate-budget"), log_every_n_steps=1).fit(model, public_table)
    acc = model.accountant
    assert model.budget_exhausted and model.global_step < 200
    assert 0 < acc.epsilon() <= 12.0 and model.global_step >= 2
    # the step it refused would have exceeded the budget in the worst case (every query answered)
    n_queries = SMALL["fake_batch_size"] * SMALL["projection_dim"]
    worst = ConfidentGNMaxEvent(np.full((n_queries, 10), 2), np.ones(n_queries, bool), model.threshold, 16.0, 8.0)
    assert acc.epsilon_if(worst) > 12.0
    assert acc.counts["confident_gnmax_events"] == model.global_step  # every applied update was paid
    assert acc.counts["confident_gnmax_queries"] == model.global_step * n_queries
    run, client = query_run("gpate-budget")
    eps = [m.value for m in client.get_metric_history(run.info.run_id, "epsilon")]
    assert eps == sorted(eps) and max(eps) <= 12.0
    assert "epsilon_data_dependent" not in run.data.metrics  # a function of the private votes: paper accounting only
    assert run.data.tags["stop_reason"].startswith("privacy budget reached")
    assert math.isclose(run.data.metrics["epsilon_final"], acc.epsilon(), rel_tol=1e-9)


def test_resume_keeps_epsilon_teachers_and_partition(tmp_path, public_table):
    model = GPATE(public_table.spec, epsilon=50.0, **SMALL)
    trainer = _trainer(3)
    trainer.fit(model, public_table)
    spent = model.accountant.epsilon()
    partition = public_table.partition.fingerprint()
    trainer.save_checkpoint(tmp_path / "g.ckpt")
    ckpt = torch.load(tmp_path / "g.ckpt", weights_only=False)
    assert ckpt["TabularDataModule"]["partition"]["fingerprint"] == partition
    assert ckpt["gpate_teachers"]["params"][model.teachers.param_names[0]].shape[0] == 20
    assert not any(k.startswith("_teachers") for k in ckpt["state_dict"])  # teachers are not in the generator's state

    resumed = GPATE(public_table.spec, epsilon=50.0, **SMALL)
    resumed_trainer = _trainer(3)  # same max_steps: restores and stops at once, state intact
    resumed_trainer.fit(resumed, public_table, ckpt_path=tmp_path / "g.ckpt")
    assert math.isclose(resumed.accountant.epsilon(), spent)
    for name in model.teachers.param_names:
        assert torch.equal(getattr(resumed.teachers, name), getattr(model.teachers, name))
    adam_a, adam_b = model._teacher_opt.state_dict()["state"], resumed._teacher_opt.state_dict()["state"]
    assert torch.equal(adam_a[0]["exp_avg_sq"], adam_b[0]["exp_avg_sq"])

    more = GPATE(public_table.spec, epsilon=50.0, **SMALL)
    _trainer(5).fit(more, public_table, ckpt_path=tmp_path / "g.ckpt")
    assert more.accountant.epsilon() > spent and more.global_step == 5
    assert public_table.partition.fingerprint() == partition


def test_needs_teachers_and_refuses_free_metadata(mixed_frame):
    with pytest.raises(ValueError, match="set data.num_teachers"):
        GPATE(ImageDataModule("digits").spec)
    with pytest.raises(ValueError, match="read from the private data"):
        GPATE(TabularDataModule(frame=mixed_frame, label="outcome", num_teachers=5).spec)


def test_cli_quickstart_fit_then_sample():
    main(["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_steps", "2",
          "--data.num_teachers", "50", "--trainer.enable_progress_bar", "false",
          "--trainer.logger.init_args.experiment_name", "quick"])
    run, client = query_run("quick")
    assert float(run.data.params["privacy/epsilon_budget"]) == 1.0
    assert run.data.metrics["epsilon"] <= 1.0
    assert main(["sample", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "20", "--output", "q.npz"]) == 0
    assert np.load("q.npz")["images"].shape == (20, 1, 8, 8)


def _ddp_table() -> TabularDataModule:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"a": rng.uniform(0, 1, 240), "b": rng.uniform(0, 1, 240)})
    frame["y"] = (frame["a"] > frame["b"]).astype(int)
    return TabularDataModule(frame=frame, label="y", schema={"a": {"min": 0, "max": 1}, "b": {"min": 0, "max": 1},
                             "y": {"categories": [0, 1]}}, class_ratio=[0.5, 0.5], num_teachers=6,
                             teacher_batch_size=8, test_fraction=0.0)


def _ddp_model(dm):
    torch.manual_seed(0)
    return GPATE(dm.spec, epsilon=1e6, **SMALL)


@pytest.mark.timeout(300) if hasattr(pytest.mark, "timeout") else (lambda f: f)
def test_two_ddp_processes_train_the_same_generator_as_one():
    dm1, dm2 = _ddp_table(), _ddp_table()
    single = _ddp_model(dm1)
    _trainer(4).fit(single, dm1)
    double = _ddp_model(dm2)
    _trainer(4, devices=2, strategy="ddp_spawn").fit(double, dm2)
    for (name, a), b in zip(single.generator.state_dict().items(), double.generator.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert math.isclose(single.accountant.epsilon(), double.accountant.epsilon(), rel_tol=1e-9)
