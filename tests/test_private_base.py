"""The contract every private model inherits: stop before overshooting, resume keeps ε, a spent
budget refuses to train, ε reaches MLflow — shown on a minimal private model."""

import math

import pytest
import pytorch_lightning as pl
import torch

from conftest import query_run
from datamodules import ImageDataModule, TabularDataModule
from lightning_gpate.models.options import GeneratorNet
from lightning_gpate.models.private import BudgetExhaustedError, NoPrivateStepError, PrivateGenerativeModel, PrivateMetadataError
from lightning_gpate.privacy import PureDPEvent
from lightning_gpate.tracking import GPATEMLFlowLogger


class ToyPrivate(PrivateGenerativeModel):
    """Each step releases one ε=0.3 pure-DP answer, then takes one generator step."""

    def __init__(self, data_spec, epsilon=1.0, delta=1e-5, step_epsilon=0.3):
        super().__init__(data_spec, epsilon=epsilon, delta=delta, z_dim=4)
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = self.build_generator(GeneratorNet(gf_dim=4, fc_dim=8))
        self.updates = 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.generator.parameters(), lr=0.01)

    def training_step(self, batch, batch_idx):
        if not self.charge(PureDPEvent(self.hparams.step_epsilon, "toy")):
            return None
        opt = self.optimizers()
        loss = self.generator(self.latent(8), self.sample_labels(8)).pow(2).mean()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.updates += 1


def _trainer(**kw):
    return pl.Trainer(max_steps=100, logger=GPATEMLFlowLogger(experiment_name="toy"), enable_progress_bar=False,
                      enable_checkpointing=False, log_every_n_steps=1, **kw)


def test_budget_stops_before_an_update_would_exceed_it():
    dm = ImageDataModule("digits", batch_size=32)
    model = ToyPrivate(dm.spec, epsilon=1.0)
    _trainer().fit(model, dm)
    # pure-DP events compose as RDP min(eps, a*eps^2/2) per event; whatever the count, never above 1
    assert model.budget_exhausted and model.accountant.epsilon() <= 1.0
    assert model.updates == model.accountant.counts["pure_dp_events"] >= 1  # every applied update was paid
    one_more = model.accountant.epsilon_if(PureDPEvent(0.3, "toy"))
    assert one_more > 1.0  # it stopped exactly at the last affordable step
    run, client = query_run("toy")
    history = client.get_metric_history(run.info.run_id, "epsilon")
    assert len(history) == model.updates + 1  # logged every step, the refused one included
    assert max(m.value for m in history) <= 1.0
    assert run.data.tags["stop_reason"].startswith("privacy budget reached")
    assert run.data.tags["privacy_guarantee"] == "true"
    assert math.isclose(run.data.metrics["epsilon_final"], model.accountant.epsilon())


def test_resume_keeps_epsilon_and_a_spent_budget_refuses_to_train(tmp_path):
    dm = ImageDataModule("digits", batch_size=32)
    model = ToyPrivate(dm.spec, epsilon=5.0)
    trainer = pl.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, dm)
    spent = model.accountant.epsilon()
    trainer.save_checkpoint(tmp_path / "a.ckpt")

    resumed = ToyPrivate(dm.spec, epsilon=5.0)
    assert resumed.accountant.epsilon() == 0.0
    t2 = pl.Trainer(max_steps=5, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    t2.fit(resumed, dm, ckpt_path=tmp_path / "a.ckpt")
    assert resumed.accountant.epsilon() > spent  # continued from the checkpoint's ε, not from 0
    assert resumed.updates == 2
    reloaded = ToyPrivate.load_from_checkpoint(tmp_path / "a.ckpt")
    assert math.isclose(reloaded.accountant.epsilon(), spent)

    spent_model = ToyPrivate(dm.spec, epsilon=0.5)
    t3 = pl.Trainer(max_steps=50, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    t3.fit(spent_model, dm)
    assert spent_model.budget_exhausted
    t3.save_checkpoint(tmp_path / "spent.ckpt")
    again = ToyPrivate(dm.spec, epsilon=0.5)
    with pytest.raises(BudgetExhaustedError, match="budget is spent"):
        pl.Trainer(max_steps=60, logger=False, enable_progress_bar=False).fit(again, dm, ckpt_path=tmp_path / "spent.ckpt")


def test_a_budget_that_pays_for_no_step_fails_loudly_instead_of_releasing_an_untrained_generator():
    dm = ImageDataModule("digits", batch_size=32)
    model = ToyPrivate(dm.spec, epsilon=0.2, step_epsilon=0.3)  # the first step already costs more than the budget
    with pytest.raises(NoPrivateStepError, match="took no training step.*epsilon spent 0"):
        _trainer().fit(model, dm)
    assert model.updates == 0 and model.accountant.epsilon() == 0.0
    run, _ = query_run("toy")
    assert run.info.status == "FAILED"  # not a finished run with ε spent 0
    # one affordable step is a success, however short
    model = ToyPrivate(dm.spec, epsilon=0.35, step_epsilon=0.3)
    _trainer().fit(model, dm)
    assert model.updates == 1 and model.budget_exhausted


def test_bad_budgets_and_free_metadata_are_refused(mixed_frame):
    dm = ImageDataModule("digits")
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        ToyPrivate(dm.spec, epsilon=0.0)
    with pytest.raises(ValueError, match="delta must be in"):
        ToyPrivate(dm.spec, delta=1.0)
    table = TabularDataModule(frame=mixed_frame, label="outcome")
    with pytest.raises(PrivateMetadataError, match="read from the private data"):
        ToyPrivate(table.spec)


def test_private_hyperparameters_keep_no_private_count_or_ratio(tmp_path, mixed_frame):
    """The exact number of private rows and an empirical class ratio never reach a private model's
    hyperparameters (checkpoints, MLflow params)."""
    schema = {"age": {"min": 0, "max": 100}, "income": {"min": 0, "max": 200000}, "smoker": {"categories": ["no", "yes"]},
              "region": {"categories": ["east", "north", "south", "west"]}, "visits": {"min": 0, "max": 5},
              "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]}}
    dm = TabularDataModule(frame=mixed_frame, label="outcome", schema=schema)
    assert dm.spec["class_ratio_source"] == "data" and "num_train" in dm.spec
    with pytest.warns(UserWarning, match="sampling labels uniformly"):
        model = ToyPrivate(dm.spec)
    for spec in (model.hparams["data_spec"], model.hparams_initial["data_spec"], model.data_spec):
        assert "num_train" not in spec and spec["class_ratio"] == [0.5, 0.5]
    assert torch.allclose(model.class_ratio, torch.tensor([0.5, 0.5]))
    assert "num_train" in dm.spec  # the DataModule's own spec is untouched


@pytest.mark.parametrize("kind", ["dpmerf", "dpgan", "marginal"])
def test_a_model_whose_only_analysis_is_its_guarantee_refuses_paper_accounting(kind):
    """DP-MERF, DP-GAN and MarginalTree have no paper-style analysis: under ``budget_accounting: paper`` they
    spent the guarantee's ε at the guarantee's σ and were tagged not a guarantee. Refused in one line; models
    with a paper analysis (GS-WGAN's per-sample composition) still take it."""
    import small_models

    with pytest.raises(ValueError, match="has no paper-style analysis besides its guarantee") as refused:
        small_models.build(kind, budget_accounting="paper")
    assert "\n" not in str(refused.value) and "budget_accounting: guarantee" in str(refused.value)
    model, _ = small_models.build(kind)
    assert model.budget_accounting == "guarantee"
    assert small_models.build("gswgan", budget_accounting="paper")[0].budget_accounting == "paper"
