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
from lightning_gpate.privacy.distributed import DPSumOptimizer
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent

# q declared public: 32 expected rows of the 1258 in the (public) training split of the digits
Q = 0.025
SMALL = dict(delta=1e-5, sampling_rate=Q, z_dim=8, generator_hidden=(16,), discriminator_hidden=(16, 16))


def _ready(model, dm, **trainer_kw):
    """Attach model and data to a trainer without training (optimizers and loaders configured)."""
    trainer = pl.Trainer(max_steps=0, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, **trainer_kw)
    trainer.fit(model, dm)
    return trainer


def _flat(tensors):
    return torch.cat([torch.zeros(0), *(t.reshape(-1) for t in tensors)])


#: The two recipes: Xie et al.'s WGAN critic (MLP, weight clipping) and Bie et al.'s non-saturating loss
#: with the all-convolutional DCGAN critic (no weight clipping, Adam).
#: The reference DP-SGD path (opacus' hooks and DPOptimizer): these tests read its per-sample gradients;
#: tests/test_dpgan_functorch.py checks the functorch path against the same references.
RECIPES = {
    "wgan_mlp": dict(noise_multiplier=1.0, max_grad_norm=0.05, dp_sgd_impl="opacus", **SMALL),
    "nonsaturating_conv": dict(noise_multiplier=1.0, max_grad_norm=0.05, loss="nonsaturating", optimizer="adam",
                               weight_clip=None, architecture="conv", gf_dim=8, df_dim=8, dp_sgd_impl="opacus", **SMALL),
}


def _loop_gradients(model, x, y, loss):
    """Independent reference: per sample, the plain autograd gradient of ``loss(D(x_i, y_i))``, flat."""
    critic = model.discriminator._module
    params = list(critic.parameters())
    model.discriminator.disable_hooks()
    try:
        return [_flat(torch.autograd.grad(loss(critic(x[i:i + 1], y[i:i + 1])).sum(), params)) for i in range(len(y))]
    finally:
        model.discriminator.enable_hooks()


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_critics_per_sample_gradients_equal_a_loop_over_samples(recipe):
    """Real rows and fakes share one vectorised backward pass: the real rows' per-sample gradients must be
    each record's own gradient, the fake term the mean of each fake's clipped gradient, and the DP sum the
    clipped real gradients (noise aside) over the expected batch."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, **RECIPES[recipe])
    _ready(model, dm)
    dp_opt = model.optimizers()[1].optimizer
    dp_opt.noise_multiplier = 0.0  # isolate the clipping
    x, y = dm.model_space("train")
    real_x, real_y = x[:6], y[:6]

    dp_opt.zero_grad()
    model._public_seed, model._public_gen = 3, None
    fake_term, _, _ = model.critic_per_sample_gradients(real_x, real_y)
    per_sample = torch.cat([p.grad_sample.reshape(6, -1) for p in model.discriminator.parameters()], dim=1)
    dp_opt.pre_step()  # clip, sum, (no) noise, divide by the expected batch size
    got = _flat(p.grad for p in model.discriminator.parameters())

    real_loss = lambda s: model.critic_losses(s, s)[0]  # noqa: E731
    fake_loss = lambda s: model.critic_losses(s, s)[1]  # noqa: E731
    real_loop = _loop_gradients(model, real_x, real_y, real_loss)
    for i in range(6):
        assert torch.allclose(per_sample[i], real_loop[i], atol=1e-7, rtol=1e-4)
    C, expected_batch = 0.05, model.expected_batch_size
    assert min(float(g.norm()) for g in real_loop) > C  # every record's gradient needed clipping
    assert torch.allclose(got, sum(g * C / float(g.norm()) for g in real_loop) / expected_batch, atol=1e-7, rtol=1e-4)
    assert float(got.norm()) * expected_batch <= 6 * C + 1e-6

    model._public_seed, model._public_gen = 3, None  # the same public fakes again
    fakes, labels = model.public_fakes()
    fake_loop = _loop_gradients(model, fakes, labels, fake_loss)
    clipped = sum(g * min(1.0, C / float(g.norm())) for g in fake_loop) / len(labels)
    assert len(labels) == expected_batch and torch.allclose(_flat(fake_term), clipped, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_record_moves_the_critic_gradient_by_at_most_c_and_the_fake_term_ignores_the_batch(recipe):
    """Issue 20, finding 3: the subsampled Gaussian's sensitivity C holds for the whole critic
    gradient (noise aside), and the generator's released BatchNorm buffers do not see the private
    batch. Fails on pairing fake i with real row i (every fake moves when a record is added)."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, **RECIPES[recipe])
    _ready(model, dm)
    dp_opt = model.optimizers()[1].optimizer
    dp_opt.noise_multiplier = 0.0
    critic_params = list(model.discriminator.parameters())
    if model.training_options.weight_clip is not None:
        with torch.no_grad():  # weight clipping after the step is then a no-op: the critic stays the same
            for p in critic_params:
                p.clamp_(-model.training_options.weight_clip, model.training_options.weight_clip)
    grads = []
    dp_opt.original_optimizer.step = lambda *a, **k: grads.append(_flat(p.grad for p in critic_params))  # record, no update
    x, y = dm.model_space("train")
    before = _flat(b.float() for b in model.generator.buffers())
    buffers = []
    for n in (30, 31):  # neighbouring batches: record 30 added
        torch.manual_seed(0)
        model._public_seed, model._public_gen = 0, None
        model.discriminator_step(x[:n], y[:n])
        buffers.append(_flat(b.float() for b in model.generator.buffers()))
    C, expected_batch = 0.05, model.expected_batch_size
    assert len(grads) == 2 and float(grads[0].norm()) > 0
    moved = float((grads[1] - grads[0]).norm()) * expected_batch
    assert 0 < moved <= C * (1 + 1e-4)
    assert torch.equal(buffers[0], before) and torch.equal(buffers[1], before)


def test_critic_noise_has_the_dp_sgd_scale_and_empty_batches_still_step():
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, noise_multiplier=1.3, max_grad_norm=0.7, delta=1e-5, sampling_rate=Q, z_dim=8,
                  generator_hidden=(16,), discriminator_hidden=(64, 64), dp_sgd_impl="opacus")
    _ready(model, dm)
    dp_opt = model.optimizers()[1].optimizer
    assert isinstance(dp_opt, DPSumOptimizer)  # under DDP: noise once, on rank 0 (test_cli_ddp checks it on 2 processes)
    empty_x, empty_y = torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)
    dp_opt.zero_grad()
    model.critic_per_sample_gradients(empty_x, empty_y)  # a Poisson batch may be empty
    dp_opt.pre_step()
    noise = _flat(p.grad for p in model.discriminator.parameters())
    assert noise.numel() > 8000
    expected_std = 1.3 * 0.7 / 32  # N(0, (σC)²) on the sum, divided by the declared expected batch
    assert abs(float(noise.std()) / expected_std - 1) < 0.05
    assert abs(float(noise.mean())) < 4 * expected_std / math.sqrt(noise.numel())


def test_epsilon_matches_opacus_and_training_stops_before_the_budget():
    from opacus.accountants.analysis import rdp as opacus_rdp

    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=1.0, noise_multiplier=1.2, **SMALL)
    trainer = pl.Trainer(max_steps=1000, logger=GPATEMLFlowLogger(experiment_name="dpgan"), enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(model, dm)

    steps = int(model.critic_steps_taken)
    q = model.sampling_rate
    assert q == Q  # declared, not read from the data
    assert model.budget_exhausted and steps == model.accountant.counts["subsampled_gaussian_steps"] > 0
    assert trainer.global_step == steps // 5  # five critic steps per generator step (a refused one: none)
    # the d_steps critic steps of a generator step are paid together, before the first is applied
    assert model.accountant.epsilon() <= 1.0 < model.epsilon_if(model.generator_step_event())
    # opacus, independently: its RDP of `steps` Poisson-subsampled Gaussians, on the same orders
    orders = [float(a) for a in model.accountant.orders]
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=1.2, steps=steps, orders=orders)
    eps_opacus, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert math.isclose(model.accountant.epsilon(), eps_opacus, rel_tol=1e-6)
    assert model.opacus_accountant.history == [(1.2, q, steps)]  # the DP optimizer's own hook agrees
    run, client = query_run("dpgan")
    assert math.isclose(run.data.metrics["epsilon_final"], eps_opacus, rel_tol=1e-6)
    assert math.isclose(run.data.metrics["epsilon_opacus_worst_case"], eps_opacus, rel_tol=1e-6)
    assert run.data.tags["stop_reason"].startswith("privacy budget reached")


def test_a_generator_step_consumes_its_n_d_critic_steps_as_subsampled_gaussian_events():
    """n_D = 7 critic steps per generator step (Bie et al.'s recipe, small): each is one Poisson-subsampled
    Gaussian in both accountants, paid before the step; the ε equals dp-accounting's own RDP accountant
    composing the same number of steps (an independent computation of composition and conversion)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=2.0, d_steps=7, **{**RECIPES["nonsaturating_conv"], "noise_multiplier": 1.0,
                                                        "max_grad_norm": 1.0, "ema_decay": 0.9})
    trainer = pl.Trainer(max_steps=1000, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    steps = int(model.critic_steps_taken)
    assert model.budget_exhausted and steps == 7 * trainer.global_step > 7
    assert model.accountant.counts["subsampled_gaussian_steps"] == steps
    assert model.opacus_accountant.history == [(1.0, Q, steps)]  # every critic step's DP optimizer hook
    reference = RdpAccountant([float(a) for a in model.accountant.orders])
    reference.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(1.0)), count=steps)
    assert math.isclose(model.accountant.epsilon(), reference.get_epsilon(1e-5), rel_tol=1e-9)
    further = RdpAccountant([float(a) for a in model.accountant.orders])  # the refused generator step: 7 more
    further.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(1.0)), count=steps + 7)
    assert model.accountant.epsilon() <= 2.0 < further.get_epsilon(1e-5)
    # the sampled generator is the weight average, and it is what the release holds
    assert model.generator_module is model.generator_ema
    assert not torch.equal(_flat(model.generator_ema.parameters()), _flat(model.generator.parameters()))


def test_the_adaptive_n_d_moves_up_the_ladder_and_every_critic_step_is_paid(tmp_path):
    """Bie et al.'s adaptive n_D: with threshold 1 (always reached) and a grace of 2 generator steps, n_D goes
    1 → 2 → 5 → 10 every two generator steps; the DataModule serves the new count from its next item, and
    each generator step pays for exactly the batches it received. A resumed run continues at its n_D."""
    dm = ImageDataModule("digits", batch_size=32)
    adaptive = {"threshold": 1.0, "grace": 2, "decay": 0.5}
    model = former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps=adaptive, **RECIPES["nonsaturating_conv"])
    served = []
    step = model.training_step
    model.training_step = lambda batch, batch_idx: (served.append(len(batch)), step(batch, batch_idx))[1]
    trainer = pl.Trainer(max_steps=7, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(model, dm)
    assert int(model.d_steps_now) == 10 and sorted(served) == served  # n_D changed after generator steps 2, 4, 6
    assert served[:6] == [1, 1, 2, 2, 5, 5] or served[:6] == [1, 1, 1, 2, 2, 5]  # served from the next item (or the one after)
    assert int(model.critic_steps_taken) == sum(served) == model.accountant.counts["subsampled_gaussian_steps"]
    assert model.opacus_accountant.history == [(1.0, Q, sum(served))]
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    resumed = former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps=adaptive, **RECIPES["nonsaturating_conv"])
    served.clear()
    step = resumed.training_step
    resumed.training_step = lambda batch, batch_idx: (served.append(len(batch)), step(batch, batch_idx))[1]
    pl.Trainer(max_steps=8, logger=False, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=tmp_path).fit(resumed, dm, ckpt_path=tmp_path / "m.ckpt")
    assert served == [10] and int(resumed.critic_steps_taken) == int(model.critic_steps_taken) + 10
    with pytest.raises(ValueError, match="first n_D"):
        former(DPGAN, dm.spec, epsilon=50.0, d_steps=3, adaptive_d_steps=adaptive, loss="nonsaturating", **SMALL)
    with pytest.raises(ValueError, match="threshold, grace and decay"):
        former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps={"threshold": 0.6}, loss="nonsaturating", **SMALL)
    with pytest.raises(ValueError, match="needs training.loss: nonsaturating"):
        former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps=adaptive, **SMALL)


def _rdp_epsilon(q, sigma, steps, orders, delta=1e-5):
    """dp-accounting's own RDP accountant: ``steps`` Poisson-subsampled Gaussian steps, on ``orders``."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    reference = RdpAccountant([float(a) for a in orders])
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count=steps)
    return reference.get_epsilon(delta)


def _pld_epsilon(q, sigma, steps, delta=1e-5):
    """dp-accounting's own PLD accountant (interval 1e-3, as the model's): ``steps`` Poisson-subsampled Gaussians."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return reference.get_epsilon(delta)


def test_the_adaptive_schedules_worst_case_is_its_fastest_climb_and_the_reviews_example_costs_3_83():
    """The worst case of an adaptive n_D, per generator step, is what the schedule's own code serves when the
    critic's signal allows every move (fake accuracy 0 after every step), for integer and fractional graces.
    The privacy review's example: ``dpgan_eps10_guarantee`` (n_D from 1, grace 200, σ 1.135, q = 512/60000)
    ended after 1,000 generator steps of a schedule that never moved took 1,000 critic steps (RDP ε 1.376,
    what was reported) where the schedule allowed 7,600: its guarantee is dp-accounting's ε of 7,600, 3.827."""
    dm = ImageDataModule("digits", batch_size=32)
    config = dict(delta=1e-5, sampling_rate=0.0085333, noise_multiplier=1.135, loss="nonsaturating", d_steps=1,
                  architecture="conv", gf_dim=4, df_dim=4, z_dim=8)
    for grace, steps in ((200, 1300), (2.5, 40), (1, 15)):
        climbing = former(DPGAN, dm.spec, epsilon=10.0, adaptive_d_steps={"threshold": 0.6, "grace": grace, "decay": 0.99}, **config)
        fastest = []
        for _ in range(steps):
            fastest.append(int(climbing.d_steps_now))
            climbing.adapt_d_steps(0.0)
        assert [climbing.most_critic_steps(t) for t in range(steps)] == fastest, grace
        assert [climbing.most_critic_steps_in(t) for t in range(steps + 1)] == [sum(fastest[:t]) for t in range(steps + 1)]
    assert fastest[-1] == 5000 and fastest[:4] == [1, 2, 5, 10]  # grace 1: one rung a step, up to the ladder's top

    model = former(DPGAN, dm.spec, epsilon=10.0, adaptive_d_steps={"threshold": 0.6, "grace": 200, "decay": 0.99}, **config)
    assert model.most_critic_steps_in(1000) == 200 * (1 + 2 + 5 + 10 + 20)
    for _ in range(1000):
        assert model.pay_for_generator_step(1)  # n_D stayed 1: the schedule never moved
    worst, taken = _rdp_epsilon(0.0085333, 1.135, 7600, model.accountant.orders), _rdp_epsilon(0.0085333, 1.135, 1000, model.accountant.orders)
    assert round(worst, 3) == 3.827 and round(taken, 3) == 1.376
    assert math.isclose(model.guarantee_epsilon(), worst, rel_tol=1e-9)  # what the run reports
    assert math.isclose(model.spent_epsilon(), worst, rel_tol=1e-9)
    assert math.isclose(model.realised_epsilon(), taken, rel_tol=1e-9)  # what the budget's filter compares


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_run_whose_adaptive_schedule_never_moved_reports_the_worst_case(accountant, tmp_path):
    """A critic that catches every fake keeps the adaptive n_D at 5 (grace 2): six generator steps take 30 critic
    steps where the schedule allowed 5 + 5 + 10 + 10 + 20 + 20 = 70. The run (ended by max_steps) reports and logs
    the ε of 70 steps by dp-accounting's own accountant (RDP; PLD with ``accountant: pld``), not that of the 30
    taken; under RDP the filter's figure, logged beside it, is the 30 steps'. A checkpoint written before
    ``generator_steps_paid`` existed loads with a count that does not understate the schedule's position."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=50.0, d_steps=5, adaptive_d_steps={"threshold": 0.6, "grace": 2, "decay": 0.5},
                  accountant=accountant, **RECIPES["nonsaturating_conv"])
    adapt = model.adapt_d_steps
    model.adapt_d_steps = lambda fake_accuracy: adapt(1.0)  # every fake caught: the average never falls to 0.6
    trainer = pl.Trainer(max_steps=6, logger=GPATEMLFlowLogger(experiment_name=f"dpgan-worst-{accountant}"), enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1, default_root_dir=tmp_path)
    trainer.fit(model, dm)
    assert int(model.d_steps_now) == 5 and int(model.critic_steps_taken) == 30 and int(model.generator_steps_paid) == 6
    assert not model.budget_exhausted and model.critic_steps_worst_case() == 70
    if accountant == "rdp":
        worst, taken = (_rdp_epsilon(Q, 1.0, n, model.accountant.orders) for n in (70, 30))
        assert math.isclose(model.guarantee_epsilon(), worst, rel_tol=1e-9)
        assert math.isclose(model.realised_epsilon(), taken, rel_tol=1e-9)
    else:
        worst, taken = _pld_epsilon(Q, 1.0, 70), _pld_epsilon(Q, 1.0, 30)
        assert math.isclose(model.guarantee_epsilon(), worst, rel_tol=1e-6)
        assert math.isclose(model.accountant.epsilon_worst_case(), _rdp_epsilon(Q, 1.0, 70, model.accountant.orders), rel_tol=1e-9)
    assert worst > 1.15 * taken  # today's code reported the taken steps' ε
    run, _ = query_run(f"dpgan-worst-{accountant}")
    assert math.isclose(run.data.metrics["epsilon_final"], worst, rel_tol=1e-6)
    # opacus' cross-check counts the schedule's worst case (it logged the 30 steps taken as "epsilon_opacus")
    assert "epsilon_opacus" not in run.data.metrics
    assert math.isclose(run.data.metrics["epsilon_opacus_worst_case"], _rdp_epsilon(Q, 1.0, 70, model.accountant.orders), rel_tol=1e-6)
    if accountant == "rdp":
        assert math.isclose(run.data.metrics["epsilon_final_budget_spent_by_filter"], taken, rel_tol=1e-6)
        trainer.save_checkpoint(tmp_path / "m.ckpt")
        checkpoint = torch.load(tmp_path / "m.ckpt", weights_only=False)
        del checkpoint["state_dict"]["generator_steps_paid"]  # as written before the count existed
        torch.save(checkpoint, tmp_path / "old.ckpt")
        assert int(DPGAN.load_from_checkpoint(tmp_path / "old.ckpt").generator_steps_paid) == 30  # >= the 6 taken


def test_a_checkpoint_from_before_the_worst_case_was_kept_resumes_with_the_schedules_worst_case(tmp_path):
    """The fourth privacy review's S1. A DP-GAN checkpoint written before ``generator_steps_paid`` existed, with an
    adaptive n_D, held a worst-case RDP curve of the critic steps taken only (each step was recorded as its own
    worst case). Here the schedule climbs as fast as it may (n_D from 1, grace 4): 8 generator steps take
    1·4 + 2·4 = 12 critic steps. Made "old", its count of generator steps becomes the 12 critic steps (never an
    understatement), and the 12 generator steps the schedule allows that many could have taken 4·1 + 4·2 + 4·5 =
    32 critic steps: loaded, and resumed to 10 generator steps (the next two at most 10 each, rung 3 of t = 12,
    13), the run reports dp-accounting's ε of 32 and of 52 steps, not of the 12 and 32 its curve held."""
    dm = ImageDataModule("digits", batch_size=32)
    adaptive = {"threshold": 0.6, "grace": 4, "decay": 0.5}
    model = former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps=adaptive, **RECIPES["nonsaturating_conv"])
    adapt = model.adapt_d_steps
    model.adapt_d_steps = lambda fake_accuracy: adapt(0.0)  # no fake caught: n_D moves whenever the grace allows
    kw = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer = pl.Trainer(max_steps=8, enable_checkpointing=False, **kw)
    trainer.fit(model, dm)
    assert int(model.critic_steps_taken) == 12 and int(model.generator_steps_paid) == 8
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    checkpoint = torch.load(tmp_path / "m.ckpt", weights_only=False)
    state = checkpoint["state_dict"]
    del state["generator_steps_paid"]  # as written before the count existed ...
    accountant = state["_extra_state"]["accountant"]
    accountant["rdp_worst_case"] = list(accountant["rdp"])  # ... when every step was recorded as its own worst case
    torch.save(checkpoint, tmp_path / "old.ckpt")
    orders = model.accountant.orders

    old = DPGAN.load_from_checkpoint(tmp_path / "old.ckpt")
    assert int(old.generator_steps_paid) == 12 and old.most_critic_steps_in(12) == 32
    assert math.isclose(old.guarantee_epsilon(), _rdp_epsilon(Q, 1.0, 32, orders), rel_tol=1e-9)
    assert math.isclose(old.realised_epsilon(), _rdp_epsilon(Q, 1.0, 12, orders), rel_tol=1e-9)

    resumed = former(DPGAN, dm.spec, epsilon=50.0, d_steps=1, adaptive_d_steps=adaptive, **RECIPES["nonsaturating_conv"])
    pl.Trainer(max_steps=10, enable_checkpointing=False, **kw).fit(resumed, dm, ckpt_path=tmp_path / "old.ckpt")
    assert int(resumed.generator_steps_paid) == 14 and resumed.most_critic_steps_in(14) == 52
    worst = _rdp_epsilon(Q, 1.0, 52, orders)
    assert math.isclose(resumed.guarantee_epsilon(), worst, rel_tol=1e-9)
    assert worst > _rdp_epsilon(Q, 1.0, 32, orders) + 0.1  # what the curve held without the top-up: 12 + 2 × 10 (1.71, not 1.88)


def test_poisson_batches_checkpoint_and_group_norm_critic(tmp_path):
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, noise_multiplier=1.0, architecture="dcgan", gf_dim=4, df_dim=4, fc_dim=8,
                  delta=1e-5, sampling_rate=Q, z_dim=8)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    data = trainer.train_dataloader.dataset
    assert data.sample_rate == Q
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
            former(DPGAN, dm.spec, epsilon=1.0, **SMALL), train_dataloaders=dm.test_dataloader())
    table = TabularDataModule(frame=pd.DataFrame({"a": np.linspace(0, 1, 20), "y": [0, 1] * 10}), label="y",
                              schema={"a": {"min": 0, "max": 1}, "y": {"categories": [0, 1]}}, class_ratio=[0.5, 0.5])
    with pytest.raises(ValueError, match="for images"):
        former(DPGAN, table.spec, epsilon=1.0, architecture="dcgan", **SMALL)


def test_digits_config_runs_from_the_command_line():
    from pathlib import Path

    from lightning_gpate.cli import main

    config = Path(__file__).resolve().parents[1] / "configs" / "dpgan_digits.yaml"
    main(["fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
          "--utility.enabled=false", "--image_quality.enabled=false",
          "--trainer.log_every_n_steps=1", "--model.generator.hidden=[16]", "--model.critic.hidden=[16]"])
    run, client = query_run("digits")
    assert run.data.params["noise_multiplier"] == "1.1" and run.data.tags["privacy_guarantee"] == "true"
    assert len(client.get_metric_history(run.info.run_id, "g_loss")) == 2
    assert math.isclose(run.data.metrics["epsilon_final"], run.data.metrics["epsilon_opacus_worst_case"], rel_tol=1e-6)


def _worst_case(rows: int, **data_kw):
    """The auditing worst case: ``rows - 1`` records (0, 0, 0) and one (1, 1, 1); label c, all public."""
    frame = pd.DataFrame({k: [0] * (rows - 1) + [1] for k in "abc"})
    schema = {k: {"type": "binary", "categories": [0, 1]} for k in "abc"}
    return TabularDataModule(frame=frame, label="c", schema=schema, class_ratio=[0.5, 0.5], test_fraction=0.0,
                             val_fraction=0.0, **data_kw)


def test_empty_poisson_batches_are_noise_only_steps_on_tiny_data():
    pl.seed_everything(0)
    dm = _worst_case(5, batch_size=1)  # q = 0.2: a batch is empty with probability 0.8^5 = 0.33
    model = former(DPGAN, dm.spec, epsilon=50.0, noise_multiplier=2.0, **{**SMALL, "sampling_rate": 0.2})
    sizes, step = [], model.discriminator_step

    def recording_step(real_x, real_y, fakes=None):
        sizes.append(len(real_y))
        return step(real_x, real_y, fakes)

    model.discriminator_step = recording_step
    pl.Trainer(max_steps=8, logger=False, enable_progress_bar=False, enable_checkpointing=False,
               enable_model_summary=False).fit(model, dm)
    assert len(sizes) == 40 and sizes.count(0) >= 3  # P(fewer than 3 empty of 40) < 1e-4
    # every step, empty or not, was a noised DP-SGD step and is counted by both accountants
    assert int(model.critic_steps_taken) == model.accountant.counts["subsampled_gaussian_steps"] == 40
    assert model.opacus_accountant.history == [(2.0, 0.2, 40)]


def test_the_sampling_rate_is_declared_and_a_run_that_affords_no_step_says_so():
    from lightning_gpate.models.private import NoPrivateStepError

    trainer = dict(max_steps=5, logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    dm = _worst_case(5, batch_size=64)
    no_rate = former(DPGAN, dm.spec, epsilon=1.0, **{**SMALL, "sampling_rate": None})
    with pytest.raises(ValueError, match="sampling rate declared public"):
        pl.Trainer(**trainer).fit(no_rate, dm)
    # The defaults (σ=1.1, 5 critic steps) at q=1 cost ε≈9 per generator step: at ε=1 no step fits.
    model = former(DPGAN, dm.spec, epsilon=1.0, **{**SMALL, "sampling_rate": 1.0})
    with pytest.raises(NoPrivateStepError, match=r"no private step within epsilon=1 .*noise_multiplier \(>= ([0-9.]+)"):
        pl.Trainer(**trainer).fit(model, dm)
    assert model.accountant.epsilon() == 0.0 and int(model.critic_steps_taken) == 0
    # the σ the message suggests does afford a step (independently: opacus' RDP accountant)
    from opacus.accountants.analysis import rdp as opacus_rdp

    sigma = model.noise_multiplier_for_one_step()
    orders = [float(a) for a in model.accountant.orders]
    for s, fits in ((sigma, True), (sigma / 1.02, False)):
        rdp = opacus_rdp.compute_rdp(q=1.0, noise_multiplier=s, steps=5, orders=orders)
        assert (opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)[0] <= 1.0) == fits
    trained = former(DPGAN, dm.spec, epsilon=1.0, **{**SMALL, "sampling_rate": 1.0, "noise_multiplier": sigma})
    pl.Trainer(**trainer).fit(trained, dm)
    assert int(trained.critic_steps_taken) == 5 and 0 < trained.accountant.epsilon() <= 1.0


def test_the_number_of_steps_does_not_depend_on_the_private_row_count():
    steps = []
    for rows in (40, 41):  # neighbouring tables: same declared q, same mechanism, same number of steps
        dm = _worst_case(rows, batch_size=4)
        model = former(DPGAN, dm.spec, epsilon=3.0, noise_multiplier=1.5, **{**SMALL, "sampling_rate": 0.1})
        pl.Trainer(max_steps=10_000, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False).fit(model, dm)
        steps.append(int(model.critic_steps_taken))
        assert model.budget_exhausted and model.expected_batch_size == 4
    assert steps[0] == steps[1] > 5


def test_poisson_shards_of_processes_are_disjoint_and_make_up_the_one_process_batch():
    """Under DDP each process keeps the drawn rows it owns: with equal generators (a fixed test seed) the
    shards are the one-process Poisson batch, split; each row is still decided by one Bernoulli draw."""
    from datamodules.base import PoissonBatches

    x, y = torch.arange(200.0).unsqueeze(1), torch.arange(200)

    def batches(shard):
        data = PoissonBatches(x, y, sample_rate=0.1, batches=3, generator=torch.Generator().manual_seed(5), shard=shard)
        return [[by.tolist() for _, by in item] for item in data]

    whole, shards = batches((0, 1)), [batches((r, 2)) for r in (0, 1)]
    assert len(whole) == len(shards[0]) == len(shards[1])  # every process takes the same number of steps
    for k, item in enumerate(whole):
        for b, rows in enumerate(item):
            mine, theirs = shards[0][k][b], shards[1][k][b]
            assert sorted(mine + theirs) == sorted(rows) and not set(mine) & set(theirs)
            assert all(r % 2 == 0 for r in mine) and all(r % 2 == 1 for r in theirs)
    assert sum(len(rows) for item in whole for rows in item) > 0


def test_the_minimal_config_trains_with_the_best_guaranteed_settings():
    """``configs/dpgan_digits_minimal.yaml`` (the model class, ε = 10, the declared Poisson rate and the data: no other
    model option) trains Private GANs, Revisited's recipe (the all-convolutional nets for images, the non-saturating
    loss, Adam, the adaptive n_D, a weight average) within its budget; the architecture resolved is stored."""
    from pathlib import Path

    import yaml

    from lightning_gpate.models.dpgan import PAPER_SETTINGS
    from small_models import public_table

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "dpgan_digits_minimal.yaml").read_text())
    assert config["model"]["class_path"].endswith("DPGAN") and set(config["model"]["init_args"]) == {"epsilon", "sampling_rate"}
    pl.seed_everything(0)
    dm = ImageDataModule(**config["data"]["init_args"])
    model = DPGAN(dm.spec, **config["model"]["init_args"])
    hp = model.hparams
    assert (hp.architecture, hp.training["loss"], hp.training["optimizer"], hp.training["weight_clip"], hp.adaptive_d_steps is not None,
            hp.generator["ema_decay"]) == (
        "conv", "nonsaturating", "adam", None, True, 0.995)
    paper = DPGAN.migrate_options(dict(PAPER_SETTINGS))  # its flat names in their groups
    assert all(hp[k] != v if not isinstance(v, dict) else any(hp[k][o] != x for o, x in v.items()) for k, v in paper.items())
    assert DPGAN(public_table().spec, epsilon=1.0, sampling_rate=0.1).hparams.architecture == "mlp"  # tables
    trainer = pl.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, dm)
    assert 0 < model.accountant.epsilon() <= 10.0 and int(model.critic_steps_taken) == 3
    x, _ = model.generate(20, seed=0)
    assert x.shape == (20, *dm.spec["shape"]) and torch.isfinite(x).all()
