"""DP-GAN's functorch DP-SGD path (``dp_sgd_impl: functorch``, its clipped sums by vmap or by book-keeping):
fixed-shape padded Poisson batches whose masked rows change nothing, per-sample gradients equal to a loop,
sensitivity C, one event per critic step at the Poisson rate, and a compiled step equal to the eager one."""

import math

import pytest
import pytorch_lightning as pl
import torch

from datamodules import ImageDataModule
from lightning_gpate.models import DPGAN
from lightning_gpate.models.dpgan import critic_bookkeeping_function, critic_gradient_function
from lightning_gpate.privacy import dpsgd
from lightning_gpate.privacy.dpsgd import padded_batches, per_sample_gradients
from test_dpgan import Q, RECIPES, _flat, _ready
from small_models import former  # the former defaults (the paper's) where a test is silent

#: every recipe with each way to the clipped sums (eager)
FUNCTORCH = {f"{name}-{method}": {**kw, "dp_sgd_impl": "functorch", "compile_critic_step": "none", "per_sample_method": method}
             for name, kw in RECIPES.items() for method in ("vmap", "bookkeeping")}


def _recorded_gradients(model):
    """The gradients the critic's optimizer is handed, recorded instead of applied (the critic stays the same)."""
    dp_opt = model.optimizers()[1].optimizer
    params = list(model.discriminator.parameters())
    grads = []
    dp_opt.original_optimizer.step = lambda *a, **k: grads.append(_flat(p.grad for p in params))
    return dp_opt, grads


def test_padded_batches_use_every_record_once_and_mask_only_the_padding():
    x, y = torch.arange(11.0).view(11, 1), torch.arange(11)
    for size, chunks in ((11, 1), (16, 1), (4, 3), (1, 11)):
        out = padded_batches(x, y, size)
        assert len(out) == chunks and all(bx.shape == (size, 1) and by.shape == (size,) for bx, by, _ in out)
        mask = torch.cat([m for _, _, m in out])
        assert mask.sum() == 11 and torch.equal(mask[:11], torch.ones(11)) and not mask[11:].any()
        assert torch.equal(torch.cat([by for _, by, _ in out])[:11], y)  # every drawn record, in order, once
    (ex, ey, em), = padded_batches(x[:0], y[:0], 8)  # an empty Poisson batch: one all-masked physical batch
    assert ex.shape == (8, 1) and not em.any()
    assert dpsgd.physical_batch_size_for(512) == 584 and dpsgd.physical_batch_size_for(128) == 168


@pytest.mark.parametrize("recipe", FUNCTORCH)
def test_masked_padding_rows_change_nothing(recipe):
    """The same Poisson batch cut into one exact, one padded and several physical batches gives the same
    clipped sum and, with the same noise draw, the same noised gradient; a physical batch of masked rows
    alone adds exactly zero."""
    dm = ImageDataModule("digits", batch_size=32)
    x, y = dm.model_space("train")
    real_x, real_y = x[:13], y[:13]
    got = {}
    for size in (13, 16, 5, 64):
        torch.manual_seed(0)  # the same critic for every size
        model = former(DPGAN, dm.spec, epsilon=10.0, physical_batch_size=size, noise_seed=7, **FUNCTORCH[recipe])
        _ready(model, dm)
        dp_opt, grads = _recorded_gradients(model)
        dp_opt.generator.manual_seed(123)  # the same noise draw for every size
        model._public_seed, model._public_gen = 0, None
        model.discriminator_step(real_x, real_y)
        got[size] = grads[0]
        if size == 5:  # 3 physical batches, the last with 2 masked rows
            critic = model.discriminator._module
            step = model.critic_gradient_step()
            named = {k: p.detach() for k, p in critic.named_parameters()}
            buffers = dict(critic.named_buffers())
            fakes, labels = model.public_fakes()
            (px, py, pm), = padded_batches(real_x[:0], real_y[:0], 5)
            padding_sum, _, _, _ = step(named, buffers, px + 0.5, py, pm, fakes[:0], labels[:0])
            assert torch.equal(padding_sum, torch.zeros_like(padding_sum))  # exactly zero, not merely small
    assert float(got[13].norm()) > 0
    for size in (16, 5, 64):
        assert torch.allclose(got[size], got[13], atol=1e-7, rtol=1e-5), size


@pytest.mark.parametrize("recipe", FUNCTORCH)
def test_functorch_per_sample_gradients_equal_a_loop_over_samples(recipe, monkeypatch):
    """Each row's vmap gradient is its own autograd gradient (computed by the critic's ordinary forward,
    label maps and all); the step's clipped sum and fake term (by vmap, or by book-keeping: per-sample norms
    materialised per layer or by ghost norms) are the loop's gradients clipped to C, summed over the real
    rows and averaged over the fakes."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, **FUNCTORCH[recipe])
    _ready(model, dm)
    critic = model.discriminator._module
    x, y = dm.model_space("train")
    real_x, real_y = x[:6], y[:6]
    model._public_seed, model._public_gen = 3, None
    fakes, labels = model.public_fakes()
    params = {k: p.detach() for k, p in critic.named_parameters()}
    buffers = dict(critic.named_buffers())

    def reference(rows_x, rows_y, loss):  # one sample at a time, the module's own forward
        if hasattr(critic, "label_taps"):
            critic.label_taps = False
        try:
            return [_flat(torch.autograd.grad(loss(critic(rows_x[i:i + 1], rows_y[i:i + 1])).sum(), list(critic.parameters())))
                    for i in range(len(rows_y))]
        finally:
            if hasattr(critic, "label_taps"):
                critic.label_taps = True

    real_loss = lambda s: model.critic_losses(s, s)[0]  # noqa: E731
    fake_loss = lambda s: model.critic_losses(s, s)[1]  # noqa: E731
    grads, _ = per_sample_gradients(critic, lambda s, f: real_loss(s), params, buffers, real_x, real_y,
                                    torch.zeros(6, dtype=torch.bool))
    vmapped = torch.cat([g.reshape(6, -1) for g in grads.values()], dim=1)
    loop = reference(real_x, real_y, real_loss)
    for i in range(6):
        assert torch.allclose(vmapped[i], loop[i], atol=1e-7, rtol=1e-4)

    C = 0.05
    fake_loop = reference(fakes, labels, fake_loss)
    assert min(float(g.norm()) for g in loop) > C  # every record's gradient needed clipping
    bookkeeping = model.critic_step_options.per_sample_method == "bookkeeping"
    build = critic_bookkeeping_function if bookkeeping else critic_gradient_function
    for ghost_above in ((dpsgd.GHOST_ABOVE, 0) if bookkeeping else (None,)):  # 0: every convolution it can by ghost norms
        monkeypatch.setattr(dpsgd, "GHOST_ABOVE", ghost_above)
        step = build(critic, loss=model.training_options.loss, max_grad_norm=C, fake_count=len(labels))
        real_sum, fake_term, scores, _ = step(params, buffers, real_x, real_y, torch.ones(6), fakes, labels)
        assert torch.allclose(real_sum, sum(g * C / float(g.norm()) for g in loop), atol=1e-7, rtol=1e-4)
        clipped = sum(g * min(1.0, C / float(g.norm())) for g in fake_loop) / len(labels)
        assert torch.allclose(fake_term, clipped, atol=1e-7, rtol=1e-4)
        assert torch.allclose(scores, critic(real_x, real_y), atol=1e-6)


@pytest.mark.parametrize("recipe", FUNCTORCH)
def test_a_record_moves_the_functorch_critic_gradient_by_at_most_c(recipe):
    """Neighbouring Poisson batches (record 30 added), no noise: the whole critic gradient (clipped real
    sum over B plus the fake term) moves by at most C / B, and the fake term does not see the batch."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, physical_batch_size=16, **FUNCTORCH[recipe])  # 30 and 31 rows: 2 physical batches
    _ready(model, dm)
    dp_opt, grads = _recorded_gradients(model)
    dp_opt.noise_multiplier = 0.0
    if model.training_options.weight_clip is not None:
        with torch.no_grad():
            for p in model.discriminator.parameters():
                p.clamp_(-model.training_options.weight_clip, model.training_options.weight_clip)
    x, y = dm.model_space("train")
    for n in (30, 31):
        model._public_seed, model._public_gen = 0, None
        model.discriminator_step(x[:n], y[:n])
    C, expected_batch = 0.05, model.expected_batch_size
    assert len(grads) == 2 and float(grads[0].norm()) > 0
    moved = float((grads[1] - grads[0]).norm()) * expected_batch
    assert 0 < moved <= C * (1 + 1e-4)


def test_n_d_critic_steps_charge_n_d_events_at_the_poisson_rate_and_use_every_drawn_record(monkeypatch):
    """n_D = 7 on the functorch path: every critic step is one Poisson-subsampled Gaussian at the declared
    rate (both accountants; ε = dp-accounting's RdpAccountant of the same count), the DataModule's draw is
    still Poisson at that rate, and every record it drew went into the step's physical batches."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    import lightning_gpate.models.dpgan as dpgan_module

    drawn, used = [], []

    def recording(x, y, size):
        out = padded_batches(x, y, size)
        drawn.append(len(y))
        used.append(float(sum(m.sum() for _, _, m in out)))
        return out

    monkeypatch.setattr(dpgan_module, "padded_batches", recording)
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=2.0, d_steps=7, physical_batch_size=24,
                   **{**FUNCTORCH["nonsaturating_conv-bookkeeping"], "noise_multiplier": 1.0, "max_grad_norm": 1.0})
    trainer = pl.Trainer(max_steps=1000, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    steps = int(model.critic_steps_taken)
    assert trainer.train_dataloader.dataset.sample_rate == Q
    assert model.budget_exhausted and steps == 7 * trainer.global_step and trainer.global_step > 1
    assert len(drawn) == steps and used == [float(n) for n in drawn] and max(drawn) > 24  # some took 2 physical batches
    assert model.accountant.counts["subsampled_gaussian_steps"] == steps
    assert model.opacus_accountant.history == [(1.0, Q, steps)]
    reference = RdpAccountant([float(a) for a in model.accountant.orders])
    reference.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(1.0)), count=steps)
    assert math.isclose(model.accountant.epsilon(), reference.get_epsilon(1e-5), rel_tol=1e-9)


def test_the_functorch_step_has_the_dp_sgd_noise_scale_on_an_empty_batch():
    """An empty Poisson batch is a noise-only step: N(0, σ²C²) on the sum, over the expected batch."""
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, noise_multiplier=1.3, max_grad_norm=0.7, delta=1e-5, sampling_rate=Q, z_dim=8,
                  generator_hidden=(16,), discriminator_hidden=(64, 64), dp_sgd_impl="functorch")
    _ready(model, dm)
    _, grads = _recorded_gradients(model)
    model._public_seed, model._public_gen = 0, None
    fakes = model.public_fakes()
    model.discriminator_step(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long), fakes)
    model.discriminator_step(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long), fakes)
    noise = grads[0] - grads[1]  # the same fake term twice: the difference of two noise draws
    expected_std = math.sqrt(2) * 1.3 * 0.7 / 32
    assert noise.numel() > 8000 and abs(float(noise.std()) / expected_std - 1) < 0.05


def test_compiled_and_eager_steps_agree():
    """The critic step through torch.compile (vmap) equals the eager one (book-keeping, what ``auto`` picks
    eagerly; float tolerance), step after step, with the same noise; the step compiles once (the shapes never
    change)."""
    pytest.importorskip("torch._inductor")
    dm = ImageDataModule("digits", batch_size=32)
    x, y = dm.model_space("train")
    from torch._dynamo.utils import counters

    out = {}
    for mode in ("none", "default"):
        torch.manual_seed(0)
        model = former(DPGAN, dm.spec, epsilon=10.0, noise_seed=5, **{**FUNCTORCH["nonsaturating_conv-vmap"], "compile_critic_step": mode,
                                                             "per_sample_method": "auto"})
        _ready(model, dm)
        initial = _flat(p.detach().clone() for p in model.discriminator.parameters())
        model._public_seed, model._public_gen = 0, None
        counters.clear()
        for k in range(3):  # Adam steps of 9, 10, 11 rows: the critic changes, the physical shape does not
            model.discriminator_step(x[10 * k:10 * k + 9 + k], y[10 * k:10 * k + 9 + k])
        out[mode] = _flat(p.detach() for p in model.discriminator.parameters())
        assert not torch.allclose(out[mode], initial)
        if mode == "default":
            assert counters["stats"]["unique_graphs"] == 1  # compiled once, no recompilation
        assert model.per_sample_method_used == {"none": "bookkeeping", "default": "vmap"}[mode]
    assert torch.allclose(out["default"], out["none"], atol=1e-5, rtol=1e-4)


def test_compilation_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    from lightning_gpate.models.dpgan import compiled_or_eager

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", no_compiler)
    f = compiled_or_eager(lambda a: a * 2, "default")
    with pytest.warns(UserWarning, match=r"torch.compile is unavailable here \(RuntimeError: no C\+\+ compiler found\); "
                                         r"the DP-SGD step runs eagerly"):
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))  # no second warning (pytest's filter would error)


def test_checkpoints_move_between_the_implementations(tmp_path):
    dm = ImageDataModule("digits", batch_size=32)
    model = former(DPGAN, dm.spec, epsilon=10.0, **FUNCTORCH["nonsaturating_conv-bookkeeping"])
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, dm)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    opacus = DPGAN.load_from_checkpoint(tmp_path / "m.ckpt", critic_step={"impl": "opacus"})
    assert type(opacus.discriminator).__name__ == "GradSampleModule"
    assert torch.equal(_flat(opacus.discriminator.parameters()), _flat(model.discriminator.parameters()))
    with pytest.raises(ValueError, match="critic_step.impl must be one of"):
        former(DPGAN, dm.spec, epsilon=1.0, **{**RECIPES["wgan_mlp"], "dp_sgd_impl": "jax"})


def test_patch_gradient_convolutions_give_each_samples_own_gradient():
    """PatchGradConv2d (the wide critics' convolutions on the functorch path) keeps the function and
    gives, under vmap, each sample's own weight gradient, and in a plain backward the batch's gradients
    (weights and input), as nn.Conv2d does."""
    from lightning_gpate.nets.discriminators import ConditionalConvDiscriminator
    from lightning_gpate.privacy.dpsgd import PatchGradConv2d, use_patch_grad_convs

    torch.manual_seed(0)
    critic = ConditionalConvDiscriminator(in_shape=(1, 12, 12), num_classes=10, df_dim=6)
    x, y = torch.randn(4, 1, 12, 12, requires_grad=True), torch.tensor([0, 3, 3, 9])
    params = list(critic.parameters())
    loop = [_flat(torch.autograd.grad(critic(x[i:i + 1], y[i:i + 1]).sum() ** 2, params)) for i in range(4)]
    batch = torch.autograd.grad((critic(x, y) ** 2).sum(), [*params, x])
    before = critic(x, y).detach()
    assert use_patch_grad_convs(critic, min_patch=1) == 5  # every convolution (label_in too)
    assert all(type(m) is PatchGradConv2d for m in critic.modules() if isinstance(m, torch.nn.Conv2d))
    assert torch.allclose(critic(x, y), before, atol=1e-6)
    named = {k: p.detach() for k, p in critic.named_parameters()}
    grads, _ = per_sample_gradients(critic, lambda s, f: s ** 2, named, dict(critic.named_buffers()), x.detach(), y,
                                    torch.zeros(4, dtype=torch.bool))
    vmapped = torch.cat([g.reshape(4, -1) for g in grads.values()], dim=1)
    for i in range(4):
        assert torch.allclose(vmapped[i], loop[i], atol=1e-6, rtol=1e-4)
    patched = torch.autograd.grad((critic(x, y) ** 2).sum(), [*params, x])
    for a, b in zip(patched, batch):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_opacus_dpgan_on_two_processes_releases_the_generator_and_epsilon_of_one(tmp_path):
    """DDP on the reference path (``dp_sgd_impl: opacus``; tests/test_cli_ddp.py runs the default,
    functorch, the same way): Bie et al.'s recipe, small, adaptive n_D; each process clips its shard, rank 0
    adds the noise once, the sums are all-reduced: the release and ε of one process (noise seed fixed)."""
    from clitools import assert_same_tensors
    from test_cli_ddp import DPGAN_REVISITED, _artifact_tensors, _one_and_two_processes

    run_one, run_two, client = _one_and_two_processes([*DPGAN_REVISITED, "--model.init_args.critic_step.impl", "opacus"], tmp_path)
    for run in (run_one, run_two):
        assert run.info.status == "FINISHED" and run.data.tags["stop_reason"] == "max_steps=3 reached"
        assert run.data.params["critic_step/impl"] == "opacus"
        assert [m.value for m in client.get_metric_history(run.info.run_id, "d_steps")] == [1.0, 2.0, 5.0]
    assert math.isclose(run_one.data.metrics["epsilon_final"], run_two.data.metrics["epsilon_final"], rel_tol=1e-9)
    one, two = (_artifact_tensors(run.data.tags["release_artifact"]) for run in (run_one, run_two))
    assert_same_tensors(one, two, atol=1e-3)


def test_bookkeeping_is_for_critics_of_linear_and_convolutional_layers_only():
    """A critic with other parameters (the DCGAN critic's GroupNorm) takes vmap under ``auto``; asking for
    book-keeping there, or with a compiled step, is refused in one line."""
    from lightning_gpate.privacy.dpsgd import bookkeeping_supports

    dm = ImageDataModule("digits", batch_size=32)
    dcgan = dict(RECIPES["nonsaturating_conv"], architecture="dcgan", dp_sgd_impl="functorch", compile_critic_step="none")
    model = DPGAN(dm.spec, epsilon=10.0, **dcgan)
    _ready(model, dm)
    assert not bookkeeping_supports(model.discriminator._module)
    model.critic_gradient_step()
    assert model.per_sample_method_used == "vmap"
    with pytest.raises(ValueError, match="handles critics of Linear and Conv2d layers only, not this ConditionalDCGANDiscriminator"):
        refused = DPGAN(dm.spec, epsilon=10.0, **{**dcgan, "per_sample_method": "bookkeeping"})
        _ready(refused, dm)
        refused.critic_gradient_step()
    with pytest.raises(ValueError, match="'bookkeeping' runs eagerly"):
        refused = DPGAN(dm.spec, epsilon=10.0, **{**FUNCTORCH["nonsaturating_conv-bookkeeping"], "compile_critic_step": "default"})
        _ready(refused, dm)
        refused.critic_gradient_step()
    with pytest.raises(ValueError, match="critic_step.per_sample_method must be one of"):
        DPGAN(dm.spec, epsilon=1.0, **{**dcgan, "per_sample_method": "ghost"})


def test_an_eager_step_takes_the_poisson_batch_unpadded(monkeypatch):
    """Eagerly (no fixed shape to keep) the Poisson batch is one physical batch of its own size, every record in
    it, no padding; compiled, or with ``physical_batch_size`` set, the fixed size."""
    import lightning_gpate.models.dpgan as dpgan_module

    sizes = []
    monkeypatch.setattr(dpgan_module, "padded_batches", lambda x, y, size: sizes.append((len(y), size)) or padded_batches(x, y, size))
    dm = ImageDataModule("digits", batch_size=32)
    x, y = dm.model_space("train")
    for kw in ({}, {"physical_batch_size": 24}):
        model = DPGAN(dm.spec, epsilon=10.0, **{**FUNCTORCH["nonsaturating_conv-bookkeeping"], **kw})
        _ready(model, dm)
        model._public_seed, model._public_gen = 0, None
        for n in (29, 0):
            model.discriminator_step(x[:n], y[:n])
    assert sizes == [(29, 29), (0, 1), (29, 24), (0, 24)]


def test_label_taps_are_the_label_convolution_of_the_label_maps():
    from lightning_gpate.nets.discriminators import ConditionalConvDiscriminator
    from lightning_gpate.nets.generators import one_hot

    torch.manual_seed(0)
    critic = ConditionalConvDiscriminator(in_shape=(1, 28, 28), num_classes=10, df_dim=8)
    y = torch.tensor([0, 4, 9, 4])
    maps = one_hot(y, 10)[:, :, None, None].expand(-1, -1, 28, 28)
    assert torch.allclose(critic.label_response(y), critic.label_in(maps), atol=1e-6)
    assert "label_tap_conv.tap_mask" not in critic.state_dict() and set(critic.state_dict()) == {
        k for k, _ in critic.named_parameters()}  # the state dict is unchanged: parameters only
