"""DP-GAN: one clipped gradient per real record, the noise DP-SGD promises, Poisson batches, and an ε
that matches opacus' accountant and never passes the budget."""

import math

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch

from conftest import query_run
from datamodules import ImageDataModule, TabularDataModule
from lightning_gpate.models import DPGAN, load_generator
from lightning_gpate.tracking import GPATEMLFlowLogger

SMALL = dict(delta=1e-5, z_dim=8, generator_hidden=(16,), discriminator_hidden=(16, 16))


def _ready(model, dm, **trainer_kw):
    """Attach model and data to a trainer without training (optimizers and loaders configured)."""
    trainer = pl.Trainer(max_steps=0, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, **trainer_kw)
    trainer.fit(model, dm)
    return trainer


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def test_each_real_record_gives_one_clipped_gradient():
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, noise_multiplier=1.0, max_grad_norm=0.05, **SMALL)
    _ready(model, dm)
    dp_opt = model.optimizers()[1].optimizer
    dp_opt.noise_multiplier = 0.0  # isolate the clipping
    x, y = dm.model_space("train")
    real_x, real_y, fake_x, fake_y = x[:6], y[:6], x[6:12].flip(-1), y[6:12]

    dp_opt.zero_grad()
    model.paired_per_sample_gradients(real_x, real_y, fake_x, fake_y)
    dp_opt.pre_step()  # clip, sum, (no) noise, divide by the expected batch size
    got = _flat(p.grad for p in model.discriminator.parameters())

    # Independent reference: per record i, the gradient of D(fake_i) - D(real_i), clipped to C.
    critic = model.discriminator._module
    params = list(critic.parameters())
    model.discriminator.disable_hooks()
    pairs, real_only, fake_only = [], [], []
    for i in range(6):
        d_real = critic(real_x[i:i + 1], real_y[i:i + 1]).sum()
        d_fake = critic(fake_x[i:i + 1], fake_y[i:i + 1]).sum()
        pairs.append(_flat(torch.autograd.grad(d_fake - d_real, params, retain_graph=True)))
        real_only.append(_flat(torch.autograd.grad(-d_real, params, retain_graph=True)))
        fake_only.append(_flat(torch.autograd.grad(d_fake, params)))
    model.discriminator.enable_hooks()
    C, expected_batch = 0.05, model.expected_batch_size

    def clipped_sum(grads):
        return sum(g * min(1.0, C / float(g.norm())) for g in grads)

    assert min(float(g.norm()) for g in pairs) > C  # every record's gradient needed clipping
    assert torch.allclose(got, clipped_sum(pairs) / expected_batch, atol=1e-7, rtol=1e-4)
    assert float(got.norm()) * expected_batch <= 6 * C + 1e-6
    # clipping real and fake rows separately would be a different (2C-sensitive) gradient
    assert not torch.allclose(got, (clipped_sum(real_only) + clipped_sum(fake_only)) / expected_batch, rtol=1e-3)


def test_critic_noise_has_the_dp_sgd_scale_and_empty_batches_still_step():
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, noise_multiplier=1.3, max_grad_norm=0.7, delta=1e-5, z_dim=8,
                  generator_hidden=(16,), discriminator_hidden=(64, 64))
    _ready(model, dm)
    dp_opt = model.optimizers()[1].optimizer
    empty_x, empty_y = torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)
    dp_opt.zero_grad()
    model.paired_per_sample_gradients(empty_x, empty_y, empty_x, empty_y)  # a Poisson batch may be empty
    dp_opt.pre_step()
    noise = _flat(p.grad for p in model.discriminator.parameters())
    assert noise.numel() > 8000
    expected_std = 1.3 * 0.7 / model.expected_batch_size  # N(0, (σC)²) on the sum, divided by qN
    assert abs(float(noise.std()) / expected_std - 1) < 0.05
    assert abs(float(noise.mean())) < 4 * expected_std / math.sqrt(noise.numel())


def test_epsilon_matches_opacus_and_training_stops_before_the_budget():
    from opacus.accountants.analysis import rdp as opacus_rdp

    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=1.0, noise_multiplier=1.2, **SMALL)
    trainer = pl.Trainer(max_steps=1000, logger=GPATEMLFlowLogger(experiment_name="dpgan"), enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(model, dm)

    steps = int(model.critic_steps_taken)
    q = model.sampling_rate
    assert q == 32 / dm.spec["num_train"]
    assert model.budget_exhausted and steps == model.accountant.counts["subsampled_gaussian_steps"] > 0
    assert trainer.global_step == steps // 5  # five critic steps per generator step (a refused one: none)
    assert model.accountant.epsilon() <= 1.0 < model.epsilon_if(model.privacy_event())
    # opacus, independently: its RDP of `steps` Poisson-subsampled Gaussians, on the same orders
    orders = [float(a) for a in model.accountant.orders]
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=1.2, steps=steps, orders=orders)
    eps_opacus, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert math.isclose(model.accountant.epsilon(), eps_opacus, rel_tol=1e-6)
    assert model.opacus_accountant.history == [(1.2, q, steps)]  # the DP optimizer's own hook agrees
    run, client = query_run("dpgan")
    assert math.isclose(run.data.metrics["epsilon_final"], eps_opacus, rel_tol=1e-6)
    assert math.isclose(run.data.metrics["epsilon_opacus"], eps_opacus, rel_tol=1e-6)
    assert run.data.tags["stop_reason"].startswith("privacy budget reached")


def test_poisson_batches_checkpoint_and_group_norm_critic(tmp_path):
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, noise_multiplier=1.0, architecture="dcgan", gf_dim=4, df_dim=4, fc_dim=8,
                  delta=1e-5, z_dim=8)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    data = trainer.train_dataloader.dataset
    assert data.sample_rate == 32 / dm.spec["num_train"]
    steps = [item for _, item in zip(range(10), iter(trainer.train_dataloader))]
    assert all(len(item) == 5 for item in steps)  # one Poisson batch per critic step
    sizes = [len(y) for item in steps for _, y in item]
    assert len(set(sizes)) > 3 and abs(np.mean(sizes) - 32) < 6  # Poisson: variable, about 32
    assert int(model.critic_steps_taken) == 10
    trainer.save_checkpoint(tmp_path / "m.ckpt")  # a (private) training checkpoint: resuming restores opacus' accountant
    resumed = DPGAN.load_from_checkpoint(tmp_path / "m.ckpt")
    assert resumed.opacus_accountant.history == model.opacus_accountant.history
    released = load_generator(str(tmp_path / "m.ckpt"))  # its release: the generator and the project's accountant
    assert released.accountant.epsilon() == pytest.approx(model.accountant.epsilon())
    images, labels = released.generate(5, seed=0)
    assert images.shape == (5, 1, 8, 8) and labels.shape == (5,)

    with pytest.raises(ValueError, match="Poisson"):  # no DataModule: no known sampling rate
        pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False).fit(
            DPGAN(dm.spec, epsilon=1.0, **SMALL), train_dataloaders=dm.test_dataloader())
    table = TabularDataModule(frame=pd.DataFrame({"a": np.linspace(0, 1, 20), "y": [0, 1] * 10}), label="y",
                              schema={"a": {"min": 0, "max": 1}, "y": {"categories": [0, 1]}}, class_ratio=[0.5, 0.5])
    with pytest.raises(ValueError, match="for images"):
        DPGAN(table.spec, epsilon=1.0, architecture="dcgan", **SMALL)


def test_digits_config_runs_from_the_command_line():
    from pathlib import Path

    from lightning_gpate.cli import main

    config = Path(__file__).resolve().parents[1] / "configs" / "dpgan_digits.yaml"
    main(["fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
          "--utility.enabled=false", "--image_quality.enabled=false",
          "--trainer.log_every_n_steps=1", "--model.generator_hidden=[16]", "--model.discriminator_hidden=[16]"])
    run, client = query_run("digits")
    assert run.data.params["noise_multiplier"] == "1.1" and run.data.tags["privacy_guarantee"] == "true"
    assert len(client.get_metric_history(run.info.run_id, "g_loss")) == 2
    assert math.isclose(run.data.metrics["epsilon_final"], run.data.metrics["epsilon_opacus"], rel_tol=1e-6)
