"""GS-WGAN: the sanitiser clips and noises exactly as the paper says, only the discriminator→sample
gradient is perturbed, discriminators only ever see their own subset, pretraining is its own resumable
stage, and ε follows the sound (or, labelled, the paper's) accounting and stops at the budget."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch

from conftest import SHARED_DATA, query_run
from datamodules import ImageDataModule, TabularDataModule
from lightning_gpate.models import GSWGAN, load_generator
from lightning_gpate.models.gswgan import wgan_gp_critic_loss
from lightning_gpate.nets import ConditionalMLPDiscriminator
from lightning_gpate.privacy import gswgan_epsilon
from lightning_gpate.privacy.sanitizer import GradientSanitizer
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent

ROOT = Path(__file__).resolve().parents[1]
N_D, SIGMA, B = 5, 4.0, 8  # one (σ, N_D, B) for every test: the accountant's curve is computed once
SMALL = dict(delta=1e-5, noise_multiplier=SIGMA, generator_batch_size=B, z_dim=4, generator_hidden=(16,),
             discriminator_hidden=(16,), pretrain_generator_hidden=(8,), critic_steps=2, pretrain_iterations=3)
pytestmark = pytest.mark.filterwarnings("ignore:GS-WGAN trains without pretrained discriminators")


def _table(partition_seed=0, **options) -> TabularDataModule:
    rng = np.random.default_rng(0)
    n = 200
    frame = pd.DataFrame({
        "x1": rng.uniform(0, 10, n).round(3), "x2": rng.normal(0, 1, n).clip(-3, 3),
        "colour": rng.choice(["red", "green", "blue"], n), "y": rng.choice([0, 1], n),
    })
    schema = {"x1": {"min": 0, "max": 10}, "x2": {"min": -3, "max": 3},
              "colour": {"categories": ["red", "green", "blue"]}, "y": {"categories": [0, 1]}}
    return TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], num_teachers=N_D,
                             teacher_batch_size=8, partition_seed=partition_seed, **options)


def _trainer(max_steps, **kw):
    kw.setdefault("logger", False)
    return pl.Trainer(max_steps=max_steps, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, log_every_n_steps=1, **kw)


def _members(model):
    return {n: getattr(model.discriminators, n).detach().clone() for n, _ in model.discriminators.named_parameters()}


# ------------------------------------------------------------------------------------- sanitizer
def test_sanitizer_clips_every_sample_gradient_to_the_bound():
    g = torch.randn(64, 3, 5) * torch.logspace(-2, 2, 64).view(-1, 1, 1)
    sanitizer = GradientSanitizer(clip_bound=1.5, noise_multiplier=0.0)
    out = sanitizer(g, reduction="sum")
    n_in, n_out = g.flatten(1).norm(dim=1), out.flatten(1).norm(dim=1)
    assert (n_out <= 1.5 * (1 + 1e-6)).all()
    small = n_in <= 1.5
    assert 0 < small.sum() < 64
    assert torch.equal(out[small], g[small])  # within the bound: untouched
    assert torch.allclose(n_out[~small], torch.full_like(n_out[~small], 1.5))  # beyond: scaled to C
    cos = torch.nn.functional.cosine_similarity(out.flatten(1), g.flatten(1))
    assert torch.allclose(cos, torch.ones(64), atol=1e-5)  # direction kept
    # a mean loss's gradient (g / B) is sanitised as (clip(g) + noise) / B
    assert torch.allclose(sanitizer(g / 64, reduction="mean"), out / 64)


def test_sanitizer_noise_is_2_c_sigma_over_b_as_in_the_official_code():
    batch, dim, clip, sigma = 16, 4096, 0.5, 1.3
    sanitizer = GradientSanitizer(clip_bound=clip, noise_multiplier=sigma)
    noise = sanitizer(torch.zeros(batch, dim), reduction="mean", generator=torch.Generator().manual_seed(0))
    assert abs(float(noise.std()) / (2 * clip * sigma / batch) - 1) < 0.02
    assert abs(float(noise.mean())) < 4 * (2 * clip * sigma / batch) / math.sqrt(noise.numel())
    summed = sanitizer(torch.zeros(batch, dim), reduction="sum", generator=torch.Generator().manual_seed(0))
    assert abs(float(summed.std()) / (2 * clip * sigma) - 1) < 0.02
    # official GS-WGAN hook: clip the mean-loss gradient at C/B, add (C/B)·σ·2·N(0, 1)
    g = torch.randn(batch, dim) / batch
    ours = sanitizer(g, reduction="mean", generator=torch.Generator().manual_seed(1))
    bound = clip / batch
    coef = (bound / (g.norm(dim=1, keepdim=True) + 1e-10)).clamp(max=1.0)
    official = coef * g + bound * sigma * 2 * torch.randn(batch, dim, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(ours, official, atol=1e-6)


def test_sanitizer_rejects_bad_settings():
    for kw, match in [({"clip_bound": 0.0, "noise_multiplier": 1.0}, "clip_bound"),
                      ({"clip_bound": 1.0, "noise_multiplier": -1.0}, "noise_multiplier"),
                      ({"clip_bound": math.inf, "noise_multiplier": 1.0}, "finite clip_bound")]:
        with pytest.raises(ValueError, match=match):
            GradientSanitizer(**kw)
    with pytest.raises(ValueError, match="reduction"):
        GradientSanitizer(clip_bound=1.0, noise_multiplier=1.0)(torch.zeros(2, 3), reduction="none")


# ------------------------------------------------------------------------------------- only D→G is perturbed
def test_only_the_discriminator_to_sample_gradient_is_perturbed():
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, **SMALL)
    _trainer(0).fit(model, dm)  # optimizers and data attached, nothing trained
    critic, generator = model.discriminator, model.generator

    # σ = 0 and C = ∞: the generator's gradient is exactly the plain autograd gradient
    model.sanitizer = GradientSanitizer(clip_bound=math.inf, noise_multiplier=0.0)
    torch.manual_seed(1)
    model.sanitized_generator_gradient(critic)
    got = [p.grad.clone() for p in generator.parameters()]
    torch.manual_seed(1)
    labels = model.sample_labels(B)
    fake = generator(model.latent(B), labels)
    plain = torch.autograd.grad(-critic(fake, labels).mean(), list(generator.parameters()))
    for a, b in zip(got, plain):
        assert torch.allclose(a, b, atol=1e-7)
    assert all(p.grad is None for p in critic.parameters())

    # with noise: the critic is neither noised nor trained by the generator step; G moves
    model.sanitizer = GradientSanitizer(clip_bound=1.0, noise_multiplier=SIGMA)
    critic_before = [p.detach().clone() for p in critic.parameters()]
    gen_before = [p.detach().clone() for p in generator.parameters()]
    model.generator_step(critic)
    assert all(torch.equal(a, p) for a, p in zip(critic_before, critic.parameters()))
    assert all(p.grad is None for p in critic.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(gen_before, generator.parameters()))


def test_critic_steps_leave_the_generator_untouched():
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, **SMALL)
    _trainer(0).fit(model, dm)
    teacher, real_x, real_y = next(iter(model.trainer.train_dataloader))
    generator_state = {k: v.clone() for k, v in model.generator.state_dict().items()}
    model.train_critic(int(teacher), real_x, real_y)
    # fakes for the critic are made with the real batch's labels: BatchNorm statistics must not keep them
    assert all(torch.equal(v, model.generator.state_dict()[k]) for k, v in generator_state.items())
    assert any("running_mean" in k for k in generator_state)


@pytest.mark.parametrize("state", ["reset", "kept"])
def test_a_generator_step_trains_only_the_drawn_discriminator(state):
    """``kept`` (the official code, paper accounting only): the drawn discriminator keeps its training and
    its own Adam state. ``reset`` (the default): no draw leaves a trace in any discriminator's state, so
    none depends on the secret history of draws."""
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, discriminator_state=state, budget_accounting="paper" if state == "kept" else "guarantee",
                   **SMALL)
    drawn = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            drawn.append(int(batch[0]))

    before = _members(model)
    _trainer(6, callbacks=[Record()]).fit(model, dm)
    after = _members(model)
    assert len(drawn) == 6
    for k in range(N_D):
        changed = any(not torch.equal(before[n][k], after[n][k]) for n in before)
        assert changed == (state == "kept" and k in drawn), (k, drawn)
        if state == "kept":
            assert int(model.discriminator_adam.steps[k]) == 2 * drawn.count(k)
    # reset: no per-member optimizer state exists that a draw could leave a trace in
    assert hasattr(model, "discriminator_adam") == (state == "kept")


def test_a_drawn_discriminator_starts_from_its_state_at_the_start_of_training():
    """Under the guarantee a step's critic is a function of its own subset, the generator and fresh
    randomness: drawing the same discriminator twice in a row trains it from the same weights with a
    fresh Adam state (equal critics for equal batches and latents)."""
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, **SMALL)
    _trainer(0).fit(model, dm)
    teacher, real_x, real_y = next(iter(model.trainer.train_dataloader))
    critics = []
    for _ in range(2):
        torch.manual_seed(0)
        model.train_critic(int(teacher), real_x, real_y)
        critics.append([p.detach().clone() for p in model.discriminator.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*critics))
    with pytest.raises(ValueError, match="budget_accounting: paper"):
        former(GSWGAN, dm.spec, epsilon=1e4, discriminator_state="kept", **SMALL)


def test_the_generator_has_its_own_adam_settings_and_the_paper_shares_one():
    dm = _table()
    shared = former(GSWGAN, dm.spec, epsilon=1e4, **SMALL)
    _trainer(0).fit(shared, dm)
    (g_opt, d_opt) = (o.optimizer for o in shared.optimizers())
    assert g_opt.param_groups[0]["lr"] == d_opt.param_groups[0]["lr"] == 1e-4  # the paper's: one lr, one betas
    assert g_opt.param_groups[0]["betas"] == d_opt.param_groups[0]["betas"] == (0.5, 0.9)
    own = former(GSWGAN, dm.spec, epsilon=1e4, generator_lr=1e-3, generator_betas=(0.9, 0.999), **SMALL)
    _trainer(0).fit(own, dm)
    (g_opt, d_opt) = (o.optimizer for o in own.optimizers())
    assert (g_opt.param_groups[0]["lr"], g_opt.param_groups[0]["betas"]) == (1e-3, (0.9, 0.999))
    assert (d_opt.param_groups[0]["lr"], d_opt.param_groups[0]["betas"]) == (1e-4, (0.5, 0.9))
    with pytest.raises(ValueError, match="generator_lr"):
        former(GSWGAN, dm.spec, epsilon=1.0, generator_lr=0.0, **SMALL)


def test_the_sampled_average_of_the_generator_warms_up_as_the_official_code():
    """exp_mov_avg of the official main.py: alpha = min(1 − 1/(iter + 1), 0.999), so the average is the
    generator after the first step and weighs the early steps equally, not its random initialisation."""
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, ema_decay=0.999, **SMALL)
    initial = [p.detach().clone() for p in model.generator.parameters()]
    snapshots = []

    class Snapshot(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            snapshots.append([p.detach().clone() for p in pl_module.generator.parameters()])

    _trainer(3, callbacks=[Snapshot()]).fit(model, dm)
    expected = snapshots[0]
    for t, snapshot in enumerate(snapshots[1:], start=2):  # the mean of the first t generators
        expected = [e + (s - e) / t for e, s in zip(expected, snapshot)]
    for avg, e, g0 in zip(model.generator_ema.parameters(), expected, initial):
        torch.testing.assert_close(avg, e)
    assert any(not torch.allclose(avg, g0) for avg, g0 in zip(model.generator_ema.parameters(), initial))


# ------------------------------------------------------------------------------------- disjoint subsets
def test_every_discriminator_only_ever_sees_its_own_subset():
    dm = _table()
    dm.setup("fit")
    features = dm.model_space("train")[0]
    own = {k: {tuple(r) for r in features[dm.partition.rows_of(k)].tolist()} for k in range(N_D)}
    assert sum(len(v) for v in own.values()) == len(features)  # disjoint and complete

    def rows_of(x):
        return {tuple(r) for r in x.reshape(-1, x.shape[-1]).tolist()}

    # stage train: the drawn discriminator's real batches come from its own rows; draws are uniform
    model = former(GSWGAN, dm.spec, epsilon=1e4, **SMALL)
    trainer = _trainer(0)
    trainer.fit(model, dm)
    torch.manual_seed(0)
    counts = np.zeros(N_D)
    draws = [item for _ in range(20) for item in trainer.train_dataloader]  # 20 passes of N_D steps
    for teacher, x, y in draws:
        k = int(teacher)
        counts[k] += 1
        assert x.shape[:2] == (2, 8) and rows_of(x) <= own[k]
    assert counts.min() >= 8  # ~20 each

    # stage pretrain: member t's batch is from subset t, and its loss ignores the other members' data
    pre = former(GSWGAN, dm.spec, epsilon=1e4, stage="pretrain", **SMALL)
    seen = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(batch[0].clone())

    _trainer(10, callbacks=[Record()]).fit(pre, dm)
    assert len(seen) == 3 * 2  # 3 iterations of 2 critic steps: stops by itself at pretrain_iterations
    for x in seen:
        assert all(rows_of(x[t]) <= own[t] for t in range(N_D))
    real_x, real_y = seen[0], torch.zeros(N_D, 8, dtype=torch.long)
    fake = torch.randn_like(real_x)

    def member_grads(rx):
        torch.manual_seed(3)
        loss = wgan_gp_critic_loss(pre.discriminators, rx, real_y, fake)
        return torch.autograd.grad(loss, list(pre.discriminators.parameters()))

    base = member_grads(real_x)
    altered = real_x.clone()
    altered[1:] = torch.rand_like(altered[1:])  # every other member's data changed
    other = member_grads(altered)
    assert all(torch.allclose(a[0], b[0]) for a, b in zip(base, other))
    assert any(not torch.allclose(a[1], b[1]) for a, b in zip(base, other))


def test_stacked_members_compute_what_each_network_computes_alone():
    from lightning_gpate.models.gswgan import StackedModules

    nets = [ConditionalMLPDiscriminator(in_features=3, num_classes=2, hidden=(4,)) for _ in range(3)]
    stacked = StackedModules(nets)
    x, y = torch.randn(3, 5, 3), torch.randint(0, 2, (3, 5))
    out = stacked(x, y)
    for k, net in enumerate(nets):
        assert torch.allclose(out[k], net(x[k], y[k]), atol=1e-6)
    fresh = ConditionalMLPDiscriminator(in_features=3, num_classes=2, hidden=(4,))
    stacked.load_member(2, fresh)
    assert torch.allclose(fresh(x[0], y[0]), nets[2](x[0], y[0]))


# ------------------------------------------------------------------------------------- stages
def test_vectorised_pretraining_equals_a_loop_over_discriminators():
    """Stage pretrain trains the N_D discriminators and their throwaway generators as stacked ensembles
    (one backward, one Adam over the stacked tensors). Every member must end where it would have
    ended trained alone, as the official pretrain.py does (one network, one Adam each), from the same
    initial weights on the same batches, latents and interpolation weights."""
    from lightning_gpate.models.dpgan import build_mlp_generator

    n, b, critic_steps = 3, 4, 2
    dm = ImageDataModule("digits", num_teachers=n, teacher_batch_size=b)
    model = former(GSWGAN, dm.spec, epsilon=1e4, delta=1e-5, stage="pretrain", z_dim=4, df_dim=4, fc_dim=8, pretrain_generator_hidden=(8,),
                   critic_steps=critic_steps, pretrain_iterations=3)
    discriminators = [model.discriminators.export_teacher(k) for k in range(n)]
    generators = [build_mlp_generator(model, hidden=(8,)) for _ in range(n)]
    for k, g in enumerate(generators):
        model.pretrain_generators.load_member(k, g)
    calls = []
    vectorised_step = model._pretrain_step

    def recording(real_x, real_y):
        calls.append((torch.get_rng_state(), real_x.clone(), real_y.clone()))
        return vectorised_step(real_x, real_y)

    model._pretrain_step = recording
    _trainer(10, precision="64-true").fit(model, dm)  # float64: Adam's first steps would amplify float32 rounding
    assert len(calls) == 3 * critic_steps  # stopped by itself after pretrain_iterations
    discriminators, generators = [d.double() for d in discriminators], [g.double() for g in generators]
    torch.set_default_dtype(torch.float64)  # as under the trainer's 64-true precision: the same draws
    try:
        loop_over_members(model, calls, discriminators, generators, n, b, critic_steps)
    finally:
        torch.set_default_dtype(torch.float32)
    for k in range(n):
        stacked_d, stacked_g = model.discriminators.export_teacher(k), build_mlp_generator(model, hidden=(8,)).double()
        model.pretrain_generators.load_member(k, stacked_g)
        for own, alone in ((stacked_d, discriminators[k]), (stacked_g, generators[k])):
            for name, value in alone.state_dict().items():
                torch.testing.assert_close(own.state_dict()[name], value, rtol=1e-9, atol=1e-12)
    first = discriminators[0].state_dict()["conv0.weight"]
    assert not torch.allclose(first, model.discriminators.export_teacher(1).state_dict()["conv0.weight"])


def loop_over_members(model, calls, discriminators, generators, n, b, critic_steps):
    """The official pretraining, member by member, replaying the draws of the recorded stacked steps."""
    adam = lambda params: torch.optim.Adam(params, lr=1e-4, betas=(0.5, 0.9))  # noqa: E731
    d_opts, g_opts = [adam(d.parameters()) for d in discriminators], [adam(g.parameters()) for g in generators]
    for i, (rng, real_x, real_y) in enumerate(calls):  # the same draws, in the same order, member by member
        torch.set_rng_state(rng)
        z, eps = model.latent(n * b).view(n, b, -1), torch.rand(n, b, 1, 1, 1)
        for k in range(n):
            with torch.no_grad():
                fake = generators[k](z[k], real_y[k])
            d_opts[k].zero_grad()
            wgan_gp_critic_loss(discriminators[k], real_x[k], real_y[k], fake, eps=eps[k]).backward()
            d_opts[k].step()
        if (i + 1) % critic_steps == 0:
            labels, z = model.sample_labels(n * b).view(n, b), model.latent(n * b).view(n, b, -1)
            for k in range(n):
                g_opts[k].zero_grad()
                (-discriminators[k](generators[k](z[k], labels[k]), labels[k]).mean()).backward()
                g_opts[k].step()


def test_pretraining_is_a_resumable_stage_whose_discriminators_the_train_stage_loads(tmp_path):
    dm = _table()
    pre = former(GSWGAN, dm.spec, epsilon=1e4, stage="pretrain", **SMALL)
    initial = _members(pre)
    trainer = _trainer(2)
    trainer.fit(pre, dm)  # interrupted by max_steps after 2 of 3 iterations
    trainer.save_checkpoint(tmp_path / "pre2.ckpt")
    resumed = former(GSWGAN, dm.spec, epsilon=1e4, stage="pretrain", **SMALL)
    t2 = _trainer(100)
    t2.fit(resumed, dm, ckpt_path=tmp_path / "pre2.ckpt")
    assert t2.global_step == 3 and int(resumed.critic_steps_taken) == 6  # continued, then stopped at 3
    assert resumed.accountant.epsilon() == 0.0  # pretraining releases nothing
    t2.save_checkpoint(tmp_path / "pre.ckpt")
    pretrained = _members(resumed)
    assert all(not torch.equal(initial[n], pretrained[n]) for n in initial)

    model = former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "pre.ckpt"), ema_decay=0.5, **SMALL)
    _trainer(0).fit(model, _table())
    assert bool(model.pretrained_loaded)
    assert all(torch.equal(pretrained[n], v) for n, v in _members(model).items())
    t3 = _trainer(2)
    t3.fit(model, dm)  # a fitted train run keeps its own discriminators; sampling uses the EMA
    t3.save_checkpoint(tmp_path / "train.ckpt")
    # the private stage's checkpoint holds no discriminators (reset: they are the pretrained ones, unchanged):
    # a resume reloads them from the pretrained checkpoint and goes on
    saved = torch.load(tmp_path / "train.ckpt", weights_only=False)
    assert not [k for k in saved["state_dict"] if k.startswith("discriminators.")]
    resumed_train = former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "pre.ckpt"), ema_decay=0.5, **SMALL)
    t4 = _trainer(4)
    t4.fit(resumed_train, dm, ckpt_path=tmp_path / "train.ckpt")
    assert t4.global_step == 4 and resumed_train.accountant.counts["gswgan_steps"] == 4
    assert all(torch.equal(pretrained[n], v) for n, v in _members(resumed_train).items())
    loaded = load_generator(str(tmp_path / "train.ckpt"))
    assert loaded.generator_module is loaded.generator_ema
    rows, labels = loaded.generate(7, seed=0)
    assert rows.shape == (7, dm.spec["shape"][0])

    with pytest.raises(ValueError, match="different data partition"):
        other = former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "pre.ckpt"), **SMALL)
        _trainer(0).fit(other, _table(partition_seed=1))
    with pytest.raises(ValueError, match="not a GS-WGAN stage: pretrain checkpoint"):
        _trainer(0).fit(former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "train.ckpt"), **SMALL), dm)


def test_the_private_stage_trains_on_and_pays_once_for_the_quantile_bins_of_its_pretraining(tmp_path):
    """A table's private quantile bins are drawn with secret noise: the private stage's DataModule would draw other
    bins (and so another partition), a second release of the data. It takes the pretraining's released spec instead
    (lightning-gpate fit does so itself), and the run's epsilon pays for that one draw once."""
    from lightning_gpate.privacy import PrivacyAccountant
    from lightning_gpate.privacy.accountant import GSWGANStepEvent
    from lightning_gpate.privacy.dp_stats import metadata_events

    pre_dm = _table(quantile_epsilon=1.0)
    trainer = _trainer(1)
    trainer.fit(former(GSWGAN, pre_dm.spec, epsilon=1e4, stage="pretrain", **SMALL), pre_dm)
    trainer.save_checkpoint(tmp_path / "pre.ckpt")
    released = torch.load(tmp_path / "pre.ckpt", weights_only=False)["hyper_parameters"]["data_spec"]
    dm = _table(quantile_epsilon=1.0)
    assert dm.spec["columns"] != released["columns"]  # a new draw: other bins
    with pytest.raises(ValueError, match="pretrained with DP metadata"):
        _trainer(0).fit(former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "pre.ckpt"), **SMALL), dm)
    dm.adopt_released_spec(released)
    model = former(GSWGAN, dm.spec, epsilon=1e4, pretrained_checkpoint=str(tmp_path / "pre.ckpt"), **SMALL)
    _trainer(2).fit(model, dm)
    assert bool(model.pretrained_loaded) and model.data_spec["columns"] == released["columns"]
    count, quantiles = released["metadata_cost"]
    assert model.accountant.counts["pure_dp_epsilon"] == count["epsilon"]
    assert model.accountant.counts["exponential_mechanism_events"] == quantiles["events"] > 0

    def epsilon(draws: int) -> float:
        accountant = PrivacyAccountant(delta=1e-5)
        for event in metadata_events(released["metadata_cost"]) * draws:
            accountant.record(event)
        accountant.record(GSWGANStepEvent(noise_multiplier=SIGMA, num_discriminators=N_D, batch_size=B, steps=2))
        return accountant.epsilon()

    assert math.isclose(model.accountant.epsilon(), epsilon(1), rel_tol=1e-9) and epsilon(1) < epsilon(2)


# ------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("mode", ["guarantee", "paper"])
def test_epsilon_is_gswgan_epsilon_in_both_accounting_modes(mode):
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=1e4, budget_accounting=mode, **SMALL)
    _trainer(3, logger=GPATEMLFlowLogger(experiment_name="gswgan")).fit(model, dm)
    kw = dict(noise_multiplier=SIGMA, num_discriminators=N_D, batch_size=B, steps=3, delta=1e-5)
    sound, paper = gswgan_epsilon(accounting="sound", **kw), gswgan_epsilon(accounting="paper", **kw)
    assert math.isclose(model.accountant.epsilon(), sound, rel_tol=1e-9)
    assert math.isclose(model.accountant.epsilon_paper(), paper, rel_tol=1e-9)
    assert math.isclose(model.spent_epsilon(), sound if mode == "guarantee" else paper, rel_tol=1e-9)
    run, _ = query_run("gswgan")
    assert run.data.tags["privacy_guarantee"] == ("true" if mode == "guarantee" else "false")
    assert math.isclose(run.data.metrics["epsilon_final"], sound, rel_tol=1e-9)  # the guarantee, always
    assert math.isclose(run.data.metrics["epsilon_final_per_sample_composition"], paper, rel_tol=1e-9)


def test_training_stops_before_the_step_that_would_exceed_the_budget():
    kw = dict(noise_multiplier=SIGMA, num_discriminators=N_D, batch_size=B, delta=1e-5)
    budget = (gswgan_epsilon(steps=2, **kw) + gswgan_epsilon(steps=3, **kw)) / 2
    dm = _table()
    model = former(GSWGAN, dm.spec, epsilon=budget, **SMALL)
    trainer = _trainer(50)
    trainer.fit(model, dm)
    assert model.budget_exhausted and trainer.global_step == 2
    assert model.accountant.counts["gswgan_steps"] == 2 and model.accountant.epsilon() <= budget
    assert int(model.critic_steps_taken) == 2 * 2  # the refused step trained no discriminator either


def test_bad_settings_are_refused():
    dm = _table()
    with pytest.raises(ValueError, match="num_teachers"):
        former(GSWGAN, {**dm.spec, "num_teachers": 0}, epsilon=1.0, **SMALL)
    with pytest.raises(ValueError, match="stage"):
        former(GSWGAN, dm.spec, epsilon=1.0, stage="warmup", **SMALL)
    with pytest.raises(ValueError, match="noise_multiplier"):
        former(GSWGAN, dm.spec, epsilon=1.0, **{**SMALL, "noise_multiplier": 0.0})


@pytest.mark.skipif(not (SHARED_DATA / "cardio_train.csv").is_file(), reason="needs ../shared/data/cardio_train.csv")
def test_cardio_config_declares_all_metadata_public():
    import yaml

    config = yaml.safe_load((ROOT / "configs" / "gswgan_cardio.yaml").read_text())
    data = dict(config["data"]["init_args"], path=str(SHARED_DATA / "cardio_train.csv"))
    dm = TabularDataModule(**data)
    assert dm.spec["private_metadata"] == [] and dm.spec["class_ratio_source"] == "public"
    model = GSWGAN(dm.spec, **config["model"]["init_args"])
    # the thesis' subsampling rate 1/1500 and batch 32, and a run length the sound analysis can pay for
    assert model.num_discriminators == 1500 and model.hparams.generator_batch_size == 32
    assert model.budget_accounting == "guarantee"
    assert gswgan_epsilon(noise_multiplier=model.hparams.noise_multiplier, num_discriminators=1500, batch_size=32,
                          steps=config["trainer"]["max_steps"], delta=1e-5) <= config["model"]["init_args"]["epsilon"]
    assert config["utility"]["classifiers"] == ["LogisticRegression"]
    assert any(cb["class_path"].endswith("ModelCheckpoint") and cb["init_args"]["every_n_train_steps"] == 1000
               for cb in config["trainer"]["callbacks"])


def test_digits_config_runs_both_stages_from_the_command_line():
    from lightning_gpate.cli import main

    small = ["--config", str(ROOT / "configs" / "gswgan_digits.yaml"), f"--data.num_teachers={N_D}",
             f"--model.noise_multiplier={SIGMA}", f"--model.generator_batch_size={B}", "--model.generator.gf_dim=4",
             "--model.discriminator.df_dim=4", "--model.generator.fc_dim=8", "--model.discriminator.fc_dim=8", "--model.pretraining.generator_hidden=[8]",
             "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1", "--utility.enabled=false",
             "--image_quality.enabled=false"]
    main(["fit", *small, "--model.stage=pretrain", "--model.pretraining.iterations=1"])
    pre, _ = query_run("digits")
    assert pre.data.params["stage"] == "pretrain" and "pretrain/d_loss" not in pre.data.metrics  # non-private losses: opt-in
    main(["fit", *small, f"--model.pretrained_checkpoint={pre.data.tags['training_checkpoint']}", "--trainer.max_steps=2"])
    run, client = query_run("digits")
    assert run.info.run_id != pre.info.run_id and run.data.params["stage"] == "train"
    assert len(client.get_metric_history(run.info.run_id, "epsilon")) == 2 and "g_loss" not in run.data.metrics
    assert math.isclose(run.data.metrics["epsilon_final"], gswgan_epsilon(
        noise_multiplier=SIGMA, num_discriminators=N_D, batch_size=B, steps=2, delta=1e-5), rel_tol=1e-9)


def test_pretraining_stage_is_not_evaluated_as_a_release():
    """Stage 1 only prepares discriminators: evaluation callbacks skip it instead of scoring its
    throwaway generator (which on large data would cost minutes)."""
    from callbacks.periodic import PeriodicEvaluation

    calls = []

    class Probe(PeriodicEvaluation):
        name = "probe"

        def evaluate(self, trainer, pl_module, *, tag, final):
            calls.append(tag)

    class FakeTrainer:
        is_global_zero, global_step, progress_bar_callback = True, 3, None
        loggers = [GPATEMLFlowLogger(experiment_name="probe")]

    for stage, expected in (("pretrain", []), ("train", ["x"])):
        calls.clear()
        model = former(GSWGAN, ImageDataModule("digits", num_teachers=4).spec, stage=stage, epsilon=10.0, delta=1e-5)
        Probe()._run(FakeTrainer(), model, "x", final=True)
        assert calls == expected


def test_the_minimal_config_plans_its_noise_and_trains_with_the_best_guaranteed_settings():
    """``configs/gswgan_digits_minimal.yaml`` (the model class, ε = 10 and the data: no other model option) plans σ so
    that its ``planned_steps`` fit the guarantee (the paper's σ = 1.07 buys almost nothing under it), stores the σ it
    planned, samples a weight average, and trains within its budget."""
    import yaml

    from lightning_gpate.models.gswgan import PAPER_SETTINGS

    config = yaml.safe_load((ROOT / "configs" / "gswgan_digits_minimal.yaml").read_text())
    assert config["model"]["class_path"].endswith("GSWGAN") and set(config["model"]["init_args"]) == {"epsilon"}
    pl.seed_everything(0)
    dm = ImageDataModule(**config["data"]["init_args"])
    model = GSWGAN(dm.spec, **config["model"]["init_args"], gf_dim=8, df_dim=8, fc_dim=16)  # small nets: seconds
    hp, planned = model.hparams, config["trainer"]["max_steps"]
    assert hp.planned_steps == planned and hp.generator["ema_decay"] == 0.99
    sigma = hp.noise_multiplier
    at = lambda s: gswgan_epsilon(noise_multiplier=s, num_discriminators=20, batch_size=32, steps=planned, delta=1e-5)  # noqa: E731
    assert at(sigma) <= 10.0 < at(sigma / 1.02)  # the least noise (to 1%) for which the planned steps fit
    assert at(PAPER_SETTINGS["noise_multiplier"]) > 1000  # the paper's σ
    _trainer(3).fit(model, dm)
    assert 0 < model.accountant.epsilon() <= 10.0 and model.generator_ema is not None
    x, _ = model.generate(20, seed=0)
    assert x.shape == (20, *dm.spec["shape"]) and torch.isfinite(x).all()
