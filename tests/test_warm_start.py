"""The private warm start (issue 56): one DP-MERF release charged once in the model's accountant, composed with the
model's own steps (against dp-accounting), generator steps that read nothing but the release, a resume that never
measures twice, and options that fail in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from datamodules import ImageDataModule
from lightning_gpate.models import DPGAN
from lightning_gpate.models.private import NoPrivateStepError
from lightning_gpate.models.warm_start import WarmStart, WarmStartRelease

Q = 0.025  # declared public: 32 expected rows of the 1258 in the digits' training split
#: A small warm-started DP-GAN on the 8x8 digits: DP-MERF's generator family, a fixed n_D
SMALL = dict(delta=1e-5, sampling_rate=Q, noise_multiplier=1.0, loss="nonsaturating", architecture="conv", df_dim=8,
             generator_architecture="dcgan", generator_upsample="nearest", gf_dim=8, fc_dim=32, z_dim=5,
             d_steps=2, adaptive_d_steps=None, ema_decay=0.0)
WARM = {"fraction": 0.4, "features": 200, "steps": 3, "batch_size": 40, "anchor_weight": 0.5}


def _trainer(max_steps: int, tmp_path: Path) -> pl.Trainer:
    return pl.Trainer(max_steps=max_steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, default_root_dir=tmp_path)


def _dp_accounting_epsilon(orders, release_sigma: float, critic_steps: int, sigma: float = 1.0, q: float = Q) -> float:
    """dp-accounting's RDP accountant, on the model's orders: one Gaussian mechanism (the release, sensitivity 1) and
    ``critic_steps`` Poisson-subsampled Gaussians."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    reference = RdpAccountant([float(a) for a in orders])
    reference.compose(dp_accounting.GaussianDpEvent(release_sigma))
    if critic_steps:
        reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count=critic_steps)
    return reference.get_epsilon(1e-5)


def test_the_warm_start_is_one_release_composed_with_the_critic_steps_also_after_a_resume(tmp_path):
    """ε reported = dp-accounting's composition of one Gaussian release (its noise planned for 40% of ε alone) and the
    critic steps; a resume continues from the release in the checkpoint (measured once, its steps not repeated)."""
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, warm_start=WARM, **SMALL)
    release = model.warm_release
    assert isinstance(release, WarmStartRelease) and model.hparams.warm_start["length_scale"] == pytest.approx(10 * 8 / 28)
    trainer = _trainer(3, tmp_path)
    trainer.fit(model, dm)
    assert bool(release.measured) and int(release.steps_done) == 3 and int(model.critic_steps_taken) == 6
    orders = model.accountant.orders
    # the release alone costs 40% of the budget: its σ is what that ε buys (an independent check of the plan)
    assert _dp_accounting_epsilon(orders, release.noise_multiplier, 0) == pytest.approx(4.0, rel=1e-3)
    assert math.isclose(model.guarantee_epsilon(), _dp_accounting_epsilon(orders, release.noise_multiplier, 6), rel_tol=1e-9)
    # opacus' cross-check (epsilon_opacus_worst_case) holds the release too: the same composition, outside our accountant
    assert model.opacus_epsilon() == pytest.approx(_dp_accounting_epsilon(orders, release.noise_multiplier, 6), rel=1e-6)
    assert model.accountant.counts["subsampled_gaussian_events"] == 1 + 3  # the release, then one event a generator step
    released = release.released.clone()
    assert released.abs().sum() > 0
    trainer.save_checkpoint(tmp_path / "m.ckpt")

    pl.seed_everything(5, verbose=False)  # another public random state: another feature seed drawn ...
    resumed = DPGAN(dm.spec, epsilon=10.0, warm_start={**WARM, "steps": 4, "anchor_weight": 0.1}, **SMALL)
    assert resumed.hparams.warm_start["feature_seed"] != model.hparams.warm_start["feature_seed"]
    measured = []
    original = WarmStartRelease.measure
    WarmStartRelease.measure = lambda self, *a, **k: (measured.append(1), original(self, *a, **k))[1]
    try:
        _trainer(5, tmp_path).fit(resumed, dm, ckpt_path=tmp_path / "m.ckpt")
    finally:
        WarmStartRelease.measure = original
    assert measured == [] and torch.equal(resumed.warm_release.released, released)
    # ... replaced by the checkpoint's (the frequencies the release was measured with); its fourth step taken on resume
    assert resumed.hparams.warm_start["feature_seed"] == model.hparams.warm_start["feature_seed"]
    assert torch.equal(resumed.warm_release.frequencies, release.frequencies)
    assert int(resumed.warm_release.steps_done) == 4 and int(resumed.critic_steps_taken) == 10
    assert math.isclose(resumed.guarantee_epsilon(), _dp_accounting_epsilon(orders, release.noise_multiplier, 10), rel_tol=1e-9)
    assert resumed.accountant.counts["subsampled_gaussian_events"] == 1 + 5
    shares = " ".join(resumed.budget_shares())
    assert "40% of the budget (ε 4 alone) bought the warm start" in shares and "10 DP-SGD critic steps" in shares
    # a release option asked otherwise is refused in one line
    from lightning_gpate.release import CheckpointError

    other = DPGAN(dm.spec, epsilon=10.0, warm_start={**WARM, "fraction": 0.3}, **SMALL)
    with pytest.raises(CheckpointError, match="pins fraction=0.4"):
        _trainer(6, tmp_path).fit(other, dm, ckpt_path=tmp_path / "m.ckpt")


def test_the_warm_start_steps_read_nothing_but_the_release(tmp_path, monkeypatch):
    """Post-processing: two fits on different private digits with the same release (the measurement replaced by a
    fixed one), the same public seeds and a frozen generator afterwards (generator_lr 0) end with the same generator.
    Were a warm-start step to read a private batch, the two would differ."""
    fixed = torch.rand(10, WARM["features"] + 1, generator=torch.Generator().manual_seed(0)) + 0.5

    def measure(self, x, y, *, generator, chunk_size=2048):  # the same release whatever the data
        self.released.copy_(fixed)
        self.measured.fill_(True)

    monkeypatch.setattr(WarmStartRelease, "measure", measure)
    generators = []
    for invert in (False, True):
        dm = ImageDataModule("digits", batch_size=32)
        dm.setup("fit")  # before the seed in both runs: the same public random state from the seed on
        if invert:  # other private digits: every pixel inverted, the labels rolled
            train = dm.model_space("train")
            monkeypatch.setattr(dm, "model_space", lambda split, _t=train: (-_t[0], (_t[1] + 1) % 10) if split == "train" else
                                ImageDataModule.model_space(dm, split))
        pl.seed_everything(3, verbose=False)
        model = DPGAN(dm.spec, epsilon=10.0, warm_start={**WARM, "feature_seed": 1, "anchor_weight": 0.0}, generator_lr=0.0,
                      **SMALL)
        _trainer(1, tmp_path).fit(model, dm)
        assert int(model.warm_release.steps_done) == 3
        generators.append(torch.cat([p.detach().flatten() for p in model.generator.state_dict().values() if p.is_floating_point()]))
    assert torch.equal(generators[0], generators[1])


def test_a_budget_the_release_leaves_nothing_of_is_refused_before_any_step():
    """A release on 99% of ε leaves no critic step: refused before the data is read, in a message that says the
    release came first."""
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=1.0, warm_start={**WARM, "fraction": 0.99}, **SMALL)
    with pytest.raises(NoPrivateStepError, match="after the warm start's release"):
        _trainer(2, Path(".")).fit(model, dm)
    assert model.accountant.epsilon() == 0.0 and not bool(model.warm_release.measured)


def test_warm_start_options_are_checked_where_defined():
    with pytest.raises(ValueError, match="has no option 'stepz'"):
        WarmStart.of({"stepz": 3})
    with pytest.raises(ValueError, match="fraction must lie in"):
        WarmStart(fraction=1.0)
    with pytest.raises(ValueError, match="nothing reads"):
        WarmStart(steps=0, anchor_weight=0.0)
    with pytest.raises(ValueError, match="even integer"):
        WarmStart(features=101)
    with pytest.raises(TypeError):
        WarmStart(0.5)  # keyword-only, as every privacy parameter


def test_under_pld_accounting_the_release_is_composed_with_the_critic_steps_as_dp_accounting_composes_them(tmp_path):
    """``accountant: pld``: the guarantee is the PLD of the warm start's Gaussian (sensitivity 1, its planned σ) composed
    with the critic steps (dp-accounting's PLDAccountant on the same events, interval 1e-3), smaller than the RDP
    bound of the same events; and the budget's most critic steps leave room for the release."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    dm = ImageDataModule("digits", batch_size=32)
    pl.seed_everything(0)
    model = DPGAN(dm.spec, epsilon=10.0, warm_start=WARM, **{**SMALL, "accountant": "pld"})
    _trainer(3, tmp_path).fit(model, dm)
    sigma, steps = model.warm_release.noise_multiplier, int(model.critic_steps_taken)
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    reference.compose(dp_accounting.GaussianDpEvent(sigma))
    worst = min(model.critic_steps_worst_case(), model._pld_max_steps())
    reference.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(1.0)), -(-worst // 10) * 10)
    assert steps == 6 and model.guarantee_epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    assert model.guarantee_epsilon() < _dp_accounting_epsilon(model.accountant.orders, sigma, steps)  # RDP: looser
    without = DPGAN(dm.spec, epsilon=10.0, **{**SMALL, "accountant": "pld"})
    assert model._pld_max_steps() < without._pld_max_steps()  # the release takes its share of the budget


def test_a_warm_started_release_samples_digits_and_holds_no_release_of_the_data(tmp_path):
    """The release artifact holds the generator (and the options to rebuild it), not the noisy embedding: that stays in
    the private training checkpoint, as DP-MERF's does."""
    from lightning_gpate.release import build_release, model_from_release

    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, warm_start=WARM, **SMALL)
    _trainer(1, tmp_path).fit(model, dm)
    release = build_release(model)
    assert not any("warm_release" in k for k in release["generator"])
    assert release["hyper_parameters"]["warm_start"]["feature_seed"] == model.hparams.warm_start["feature_seed"]
    loaded = model_from_release(release)
    x, y = loaded.generate(20, seed=0)
    assert x.shape == (20, 1, 8, 8) and np.isfinite(x.numpy()).all()
    assert bool(loaded.warm_release.measured) is False  # a release carries no measurement


def test_the_command_line_takes_the_warm_start_as_one_option_group(tmp_path, monkeypatch, capsys):
    """``--model.warm_start.<option>`` over a config: the fit's summary says what the warm start's share bought."""
    from lightning_gpate.cli import main

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "configs" / "dpgan_digits_minimal.yaml"
    args = ["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false",
            "--model.generator_architecture", "dcgan", "--model.generator.upsample", "nearest", "--model.generator.gf_dim", "8",
            "--model.generator.fc_dim", "32", "--model.critic.fc_dim", "32", "--model.generator.z_dim", "5", "--model.critic.df_dim", "8", "--model.adaptive_d_steps", "null",
            "--model.warm_start.fraction", "0.3", "--model.warm_start.features", "200", "--model.warm_start.steps", "2",
            "--model.warm_start.batch_size", "20", "--utility.enabled", "false", "--image_quality.enabled", "false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "30% of the budget (ε 3 alone) bought the warm start" in out and "2 of 2 warm-start generator steps" in out


@pytest.mark.parametrize("kind", ["pategan", "gswgan", "gpate"])
def test_pate_gan_gs_wgan_and_g_pate_take_the_warm_start_and_pay_its_release_once(kind, tmp_path):
    """PATE-GAN, GS-WGAN and G-PATE take the same option: the release is charged once before their own steps, and their
    guarantee's RDP curve is their own steps' plus exactly the Gaussian mechanism's λ/(2σ²) (Mironov 2017, Cor. 3),
    computed here from the formula; their own noise (λ, σ) is planned for what the release leaves (G-PATE's aggregator
    noise is its config's: the budget stops it). G-PATE's warm start takes the class anchor's place."""
    from lightning_gpate.models import GPATE, GSWGAN, PATEGAN
    from lightning_gpate.privacy.accountant import GaussianSumEvent, GSWGANStepEvent, LaplaceVoteEvent, PrivacyAccountant

    dm = ImageDataModule("digits", batch_size=16, num_teachers=5)
    common = dict(gf_dim=8, fc_dim=32, df_dim=8, generator_upsample="nearest", z_dim=5)
    if kind == "pategan":
        def build(warm):
            return PATEGAN(dm.spec, epsilon=10.0, delta=1e-5, planned_queries=200, warm_start=warm, **common)
        own_noise = lambda m: m.lam  # noqa: E731
    elif kind == "gswgan":
        def build(warm):
            return GSWGAN(dm.spec, epsilon=10.0, planned_steps=50, critic_steps=1, warm_start=warm, **common)
        own_noise = lambda m: m.hparams.noise_multiplier  # noqa: E731
    else:
        def build(warm):
            return GPATE(dm.spec, epsilon=10.0, aggregator={"class_path": "GaussAgg", "init_args": {"sigma": 200.0}},
                         generator={"gf_dim": 8, "fc_dim": 32, "z_dim": 5, "upsample": "nearest"}, warm_start=warm,
                         teachers={"fc": 16, "channels": [4, 8]}, fake_batch_size=8)
        own_noise = None
    plain, warm = build(None), build({**WARM, "fraction": 0.3})
    if own_noise is not None:
        assert own_noise(warm) != own_noise(plain)  # planned for what the release leaves
    if kind == "pategan":
        assert warm.hparams.marginals["fraction"] == 0.0  # the release replaces the class-mean images
    if kind == "gpate":
        assert plain.anchor_noise is not None and warm.anchor_noise is None  # the release takes the anchor's place
        assert warm.hparams.anchor["fraction"] == 0.0
        with pytest.raises(ValueError, match="release the classes twice"):
            GPATE(dm.spec, epsilon=10.0, anchor={"fraction": 0.5}, warm_start={**WARM, "fraction": 0.3})
    pl.seed_everything(0, verbose=False)
    _trainer(2, tmp_path).fit(warm, dm)
    release = warm.warm_release
    assert bool(release.measured) and int(release.steps_done) == WARM["steps"]
    assert "30% of the budget (ε 3 alone) bought the warm start" in " ".join(warm.budget_shares())
    # the model's own steps, recorded alone from what it counted; plus the one Gaussian mechanism by its formula
    own = PrivacyAccountant(delta=1e-5, orders=warm.accountant.orders)
    counts = warm.accountant.counts
    if kind == "pategan":
        own.record(LaplaceVoteEvent(np.zeros(int(counts["laplace_vote_queries"])), warm.lam))
    elif kind == "gpate":  # each aggregation one Gaussian sum of votes of norm <= 1 (L2 sensitivity 2), by its formula
        assert counts["gaussian_sums"] >= 1 and counts["gaussian_sum_events"] == counts["gaussian_sums"]
        own.record(GaussianSumEvent(num_sums=int(counts["gaussian_sums"]), sensitivity=2.0, sigma=200.0))
        np.testing.assert_allclose(own.rdp_worst_case, np.asarray(own.orders) * counts["gaussian_sums"] * 4 / (2 * 200.0 ** 2))
    else:
        own.record(GSWGANStepEvent(noise_multiplier=warm.hparams.noise_multiplier, num_discriminators=5,
                                   batch_size=warm.hparams.generator_batch_size, steps=int(counts["gswgan_steps"])))
    gaussian = np.asarray(warm.accountant.orders) / (2 * release.noise_multiplier ** 2)
    assert counts["subsampled_gaussian_events"] == 1  # the release, once
    np.testing.assert_allclose(warm.accountant.rdp_worst_case, own.rdp_worst_case + gaussian, rtol=1e-9)


def test_the_critic_warms_up_before_the_first_generator_update_and_its_steps_are_paid(tmp_path):
    """``critic_warmup_steps``: the first training steps take (and pay for) their critic steps only; the generator
    moves from the next one on, and ``max_steps`` still counts generator updates."""
    dm = ImageDataModule("digits", batch_size=32)
    model = DPGAN(dm.spec, epsilon=10.0, critic_warmup_steps=3, **SMALL)
    before = [p.detach().clone() for p in model.generator.parameters()]
    frozen_until = []
    step = model.generator_step
    model.generator_step = lambda: (frozen_until.append(int(model.generator_steps_paid)), step())[1]
    trainer = _trainer(2, tmp_path)
    trainer.fit(model, dm)
    assert trainer.global_step == 2 and frozen_until == [4, 5]  # the generator stepped on the 4th and 5th paid steps
    assert int(model.critic_steps_taken) == 10 == model.accountant.counts["subsampled_gaussian_steps"]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.generator.parameters()))
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        DPGAN(dm.spec, epsilon=10.0, critic_warmup_steps=-1, **SMALL)


#: A warm start from the marginal model on the small public table: its share buys MarginalTree's fit
MARGINAL_WARM = {"source": "marginals", "fraction": 0.5, "features": 300, "length_scale": [0.25, 1.0, 4.0], "steps": 3,
                 "batch_size": 40, "sample_rows": 500, "anchor_weight": 0.5}


def _table_pategan(warm: dict, *, epsilon: float = 10.0, rows: int = 600, **options):
    from lightning_gpate.models import PATEGAN
    from small_models import HIDDEN, public_table

    dm = public_table(num_teachers=6, rows=rows)
    model = PATEGAN(dm.spec, epsilon=epsilon, delta=1e-5, planned_queries=64, teacher_steps=1, student_steps=1, query_batch_size=16,
                    z_dim=8, generator_hidden=list(HIDDEN), teacher_hidden=[8], student_hidden=[8], marginals={"fraction": 0.0},
                    warm_start=warm, **options)
    return model, dm


def _formula_rdp(orders, events) -> np.ndarray:
    """RDP of the marginal model's events by their formulas: a Gaussian of noise multiplier σ is α/(2σ²) (Mironov 2017,
    Prop. 7); an ε-exponential mechanism, ε-bounded range, is min(ε, αε²/8) (Cesar & Rogers 2021)."""
    from lightning_gpate.privacy import ExponentialMechanismEvent, SubsampledGaussianEvent

    alpha, total = np.asarray(orders, dtype=float), np.zeros(len(orders))
    for event in events:
        if isinstance(event, SubsampledGaussianEvent):
            assert event.sampling_rate == 1.0 and event.steps == 1
            total += alpha / (2 * event.noise_multiplier ** 2)
        else:
            assert isinstance(event, ExponentialMechanismEvent)
            total += np.minimum(event.epsilon, alpha * event.epsilon ** 2 / 8)
    return total


def test_a_warm_start_from_the_marginal_model_pays_its_planned_fit_once_and_embeds_rows_sampled_from_it(tmp_path, monkeypatch):
    """``source: marginals``: the share buys MarginalTree's fit (its planned events, charged once: the model's RDP is its
    own votes' plus the events' formulas), the tree is fitted once on the training split, and what the generator reads
    is the embedding of ``sample_rows`` rows sampled from the tree, not of the private rows; a resume measures nothing."""
    from lightning_gpate.models import MarginalTree
    from lightning_gpate.models import warm_start as warm_start_module
    from lightning_gpate.privacy import LaplaceVoteEvent, PrivacyAccountant
    from small_models import fit

    fitted, embedded = [], []
    original_fit, original_embed = MarginalTree.fit_marginals, warm_start_module.embedding_sum
    monkeypatch.setattr(MarginalTree, "fit_marginals", lambda self, codes, labels: (fitted.append(len(codes)), original_fit(self, codes, labels))[1])
    monkeypatch.setattr(warm_start_module, "embedding_sum", lambda x, *a, **k: (embedded.append(x.shape[0]), original_embed(x, *a, **k))[1])
    model, dm = _table_pategan(MARGINAL_WARM)
    release = model.warm_release
    tree = MarginalTree(dm.spec, epsilon=5.0, delta=1e-5, **warm_start_module.TREE_FRACTIONS)  # the share alone: ε 5 of 10
    assert release.events() == tree.planned_event_list() and len(release.events()) == 2 + 2 * 3
    trainer = fit(model, dm, steps=2, default_root_dir=tmp_path)
    assert fitted == [600] and embedded == [MARGINAL_WARM["sample_rows"]]  # the tree read the split; the embedding its rows
    assert bool(release.measured) and int(release.steps_done) == MARGINAL_WARM["steps"]
    from lightning_gpate.privacy.merf import mean_embeddings

    _, counts = mean_embeddings(release.released.double(), count_weight=release.options.count_weight,
                                noise_multiplier=release.embedding_noise)
    assert float(counts.sum()) == pytest.approx(MARGINAL_WARM["sample_rows"], rel=1e-4)  # sampled rows, no noise
    own = PrivacyAccountant(delta=1e-5, orders=model.accountant.orders)
    own.record(LaplaceVoteEvent(np.zeros(int(model.accountant.counts["laplace_vote_queries"])), model.lam))
    np.testing.assert_allclose(model.accountant.rdp_worst_case, own.rdp_worst_case + _formula_rdp(own.orders, tree.planned_event_list()),
                               rtol=1e-9)
    assert "MarginalTree's noisy marginals" in " ".join(model.budget_shares())
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    released = release.released.clone()

    resumed, _ = _table_pategan({**MARGINAL_WARM, "steps": 4})
    fit(resumed, dm, steps=3, default_root_dir=tmp_path, ckpt_path=tmp_path / "m.ckpt")
    assert fitted == [600] and torch.equal(resumed.warm_release.released, released)  # measured once, the rows not re-read
    assert int(resumed.warm_release.steps_done) == 4
    assert resumed.accountant.counts["exponential_mechanism_events"] == model.accountant.counts["exponential_mechanism_events"] == 3


def test_the_marginal_warm_start_carries_the_tables_association_to_the_generator(tmp_path):
    """What the warm start is for: the label drives ``a`` (y = 1 when a + 0.3·b > 0.5); after the warm start from the
    marginal model (its steps; the one private step leaves the generator: lr 0), the generator's class-1 rows hold a
    larger ``a`` than its class-0 rows, as the real ones do (a gap of 0.71 in the generator's space; 0.69 after 300 steps,
    0.17 after one)."""
    from small_models import fit

    model, dm = _table_pategan({**MARGINAL_WARM, "steps": 300, "sample_rows": 5000}, epsilon=20.0, rows=2000, lr=0.0)
    pl.seed_everything(0, verbose=False)
    fit(model, dm, steps=1, default_root_dir=tmp_path)  # the warm start, then one private step that leaves the generator (lr 0)
    assert int(model.warm_release.steps_done) == 300
    model.eval()
    x, y = model.generate(4000, labels=torch.arange(2).repeat(2000), seed=0)
    assert dm.spec["columns"][0]["name"] == "a"
    gap = float(x[y == 1, 0].mean() - x[y == 0, 0].mean())  # generator space: a in [-1, 1] over its declared [0, 1]
    assert gap > 0.4, gap


def test_the_marginal_warm_start_is_refused_where_it_cannot_be_measured():
    with pytest.raises(ValueError, match="source must be one of"):
        WarmStart(source="tree")
    with pytest.raises(ValueError, match="sample_rows must be an integer >= 100"):
        WarmStart(source="marginals", sample_rows=10)
    dm = ImageDataModule("digits", batch_size=32)
    with pytest.raises(ValueError, match="measures a table's marginals"):
        DPGAN(dm.spec, epsilon=10.0, warm_start={**WARM, "source": "marginals"}, **SMALL)
    from small_models import HIDDEN, public_table

    table = public_table()
    with pytest.raises(ValueError, match="needs accountant: rdp"):
        DPGAN(table.spec, epsilon=10.0, delta=1e-5, sampling_rate=32 / 240, noise_multiplier=1.0, accountant="pld",
              generator_hidden=HIDDEN, discriminator_hidden=(8,), warm_start=MARGINAL_WARM)


def test_pate_gans_default_warm_start_is_the_marginal_models_on_tables_and_none_on_images():
    """``warm_start: auto`` (issue 59): on a table under the guarantee PATE-GAN buys MarginalTree's fit with 80% of ε
    (``TABLE_WARM_START``) and its class marginals are off; images, the data-dependent accounting and ``warm_start:
    null`` get none (the marginals back at half of ε); the hyperparameters hold the resolved choice, never "auto"."""
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.models.pategan import TABLE_WARM_START
    from lightning_gpate.models.warm_start import MarginalWarmStartRelease
    from small_models import public_table

    table = public_table(num_teachers=6).spec
    model = PATEGAN(table, epsilon=1.0, delta=1e-5)
    assert isinstance(model.warm_release, MarginalWarmStartRelease)
    stored = model.hparams["warm_start"]
    assert {k: stored[k] for k in TABLE_WARM_START} == {**TABLE_WARM_START, "length_scale": [0.25, 1.0, 4.0]}
    assert stored["source"] == "marginals" and stored["fraction"] == 0.8 and isinstance(stored["feature_seed"], int)
    assert model.marginal_options.fraction == 0.0 and model.hparams["marginals"]["fraction"] == 0.0
    assert ("80% of the budget (ε 0.8 alone) bought the warm start (warm_start: auto, this model's default for the data): "
            "MarginalTree's noisy marginals") in " ".join(model.budget_shares())
    for off in (PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start=None),
                PATEGAN(table, epsilon=1.0, delta=1e-5, budget_accounting="paper", marginals={"fraction": 0.0}),
                PATEGAN(ImageDataModule("digits", num_teachers=5).spec, epsilon=1.0, delta=1e-5)):
        assert off.warm_release is None and off.hparams["warm_start"] is None
    assert PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start=None).marginal_options.fraction == 0.5
    with pytest.raises(ValueError, match="warm_start must be a mapping of its options, 'auto'"):
        PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start="on")


def test_a_checkpoint_trained_without_a_warm_start_resumes_only_with_warm_start_null(tmp_path):
    """A table checkpoint of PATE-GAN from before its default warm start (or with ``warm_start: null``) is refused in one
    line that names the way to resume it, rather than resumed with a release it never paid for; with null it resumes."""
    from lightning_gpate.release import CheckpointError
    from small_models import fit

    model, dm = _table_pategan(None)
    trainer = fit(model, dm, steps=2, default_root_dir=tmp_path)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    spent = model.guarantee_epsilon()
    resumed, _ = _table_pategan("auto")
    assert resumed.warm_release is not None
    with pytest.raises(CheckpointError, match=r"warm_start: auto, this model's default for this data, chose one: resume with warm_start: null"):
        fit(resumed, dm, steps=3, default_root_dir=tmp_path, ckpt_path=tmp_path / "m.ckpt")
    resumed, _ = _table_pategan(None)
    fit(resumed, dm, steps=3, default_root_dir=tmp_path, ckpt_path=tmp_path / "m.ckpt")
    assert resumed.guarantee_epsilon() > spent and resumed.warm_release is None



def test_a_warm_start_given_in_part_over_pate_gans_table_default_changes_only_what_it_names():
    """On a table a mapping over ``warm_start: auto`` (what ``--model.warm_start.steps 100`` gives: a group with the
    other options left None) keeps the table warm start (MarginalTree's fit, 80% of ε, class marginals off) and changes
    what it names, and the summary says so; it used to replace it by DP-MERF's release on half of ε. A resume's ``auto``
    asks for the checkpoint's warm start (its feature seed the one the checkpoint drew)."""
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.models.pategan import TABLE_WARM_START
    from small_models import public_table

    table = public_table(num_teachers=6).spec
    auto = PATEGAN(table, epsilon=1.0, delta=1e-5)
    for given in ({"steps": 100}, WarmStart(steps=100), {"steps": 100, "feature_seed": None}):
        model = PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start=given)
        stored = model.hparams["warm_start"]
        assert {k: stored[k] for k in TABLE_WARM_START} == {**TABLE_WARM_START, "steps": 100}, given
        assert model.marginal_options.fraction == 0.0 and model.lam == pytest.approx(auto.lam, rel=1e-9)
        assert ("80% of the budget (ε 0.8 alone) bought the warm start (warm_start: auto, this model's default for the "
                "data, with steps 100): MarginalTree's noisy marginals") in " ".join(model.budget_shares())
    assert "bought the warm start (warm_start: auto, this model's default for the data): " in " ".join(auto.budget_shares())
    for given in ({"feature_seed": None}, WarmStart(anchor_weight=10.0)):  # nothing changed: the table warm start itself
        stored = PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start=given).hparams["warm_start"]
        assert {k: stored[k] for k in TABLE_WARM_START} == TABLE_WARM_START
    # a group of every option it changes is that warm start; images have no table default: DP-MERF's release
    assert "warm_start: auto" not in " ".join(PATEGAN(table, epsilon=1.0, delta=1e-5, warm_start={**TABLE_WARM_START, "steps": 5}).budget_shares())
    digits = ImageDataModule("digits", num_teachers=5).spec
    assert PATEGAN(digits, epsilon=1.0, delta=1e-5, warm_start={"steps": 100}).hparams["warm_start"]["source"] == "features"
    # what a resume from the command line compares: auto as the checkpoint resolved it
    saved = {"warm_start": auto.hparams["warm_start"]}
    for asked in ("auto", {"feature_seed": None}):
        answered = PATEGAN.answer_on_resume({"warm_start": asked, "budget_accounting": "guarantee"}, saved, table)
        assert answered["warm_start"] == auto.hparams["warm_start"], asked
    steps = PATEGAN.answer_on_resume({"warm_start": {"steps": 7}, "budget_accounting": "guarantee"}, saved, table)["warm_start"]
    assert steps == {**auto.hparams["warm_start"], "steps": 7}


def _dp_metadata_table(rows: int = 600, metadata_epsilon: float = 0.2):
    """The small public table with the bounds of ``a`` and ``b`` estimated with DP (``metadata_epsilon`` of the budget)."""
    from datamodules import TabularDataModule
    from small_models import public_frame

    schema = {"a": {"guess": [0, 1]}, "b": {"guess": [-3, 3]}, "c": {"min": 0, "max": 9, "dtype": "int64"}, "y": {"categories": [0, 1]}}
    return TabularDataModule(frame=public_frame(rows), label="y", schema=schema, class_ratio=[0.5, 0.5], num_teachers=6,
                             teacher_batch_size=8, batch_size=32, metadata_epsilon=metadata_epsilon)


def test_under_dp_metadata_the_marginal_warm_starts_tree_alone_costs_the_share_it_states(tmp_path):
    """With DP metadata (ε 0.2 of 1) the marginal warm start's tree is planned for its share alone (0.8; the model's
    accountant pays the metadata, once): its events, composed independently (dp-accounting's RDP for the Gaussians, the
    exponential mechanism's min(ε, αε²/8) by formula, Canonne, Kamath & Steinke 2020 Prop. 12), cost what the summary
    and the MLflow param state. The tree used to pay the metadata again inside its plan (0.600)."""
    import dp_accounting

    from lightning_gpate.models import PATEGAN
    from lightning_gpate.privacy import ExponentialMechanismEvent
    from small_models import fit

    dm = _dp_metadata_table()
    assert sum(c["epsilon"] for c in dm.spec["metadata_cost"]) == pytest.approx(0.2)
    model = PATEGAN(dm.spec, epsilon=1.0, delta=1e-5, planned_queries=64, query_batch_size=16, teacher_steps=1, student_steps=1,
                    z_dim=8, generator_hidden=[16], teacher_hidden=[8], student_hidden=[8],
                    warm_start={**MARGINAL_WARM, "fraction": 0.8})
    events = model.warm_release.events()
    orders = np.asarray(model.accountant.orders, dtype=float)
    gaussians = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    for event in events:
        if not isinstance(event, ExponentialMechanismEvent):
            assert event.sampling_rate == 1.0 and event.steps == 1
            gaussians.compose(dp_accounting.GaussianDpEvent(event.noise_multiplier))
    rdp = np.asarray(gaussians._rdp) + sum(np.minimum(e.epsilon, orders * e.epsilon ** 2 / 8) for e in events
                                           if isinstance(e, ExponentialMechanismEvent))
    ok = orders > 1.01
    alone = (rdp[ok] + np.log((orders[ok] - 1) / orders[ok]) - (np.log(1e-5) + np.log(orders[ok])) / (orders[ok] - 1)).min()
    assert 0.999 * 0.8 < alone <= 0.8 * (1 + 1e-9)
    assert model.budget_split()["warm_start_epsilon_alone"] == pytest.approx(0.8)
    assert "80% of the budget (ε 0.8 alone) bought the warm start" in " ".join(model.budget_shares())
    fit(model, dm, steps=1, default_root_dir=tmp_path)
    counts = model.accountant.counts
    assert counts["pure_dp_events"] == 2  # the two columns' bounds, paid once, by the model
    assert counts["exponential_mechanism_events"] + counts["subsampled_gaussian_events"] == len(events)
    assert model.warm_release.marginal_model().accountant.counts["pure_dp_events"] == 0  # the tree pays none of it


def test_the_opacus_cross_check_counts_a_marginal_warm_starts_release(tmp_path):
    """``epsilon_opacus_worst_case`` of a DP-GAN warm-started from the marginal model holds the tree's events: its
    Gaussians as they are, each ε-exponential mechanism as the Gaussian of its zCDP ε²/8 (noise multiplier 2/ε, Cesar
    & Rogers 2021), composed with the critic steps by dp-accounting; a bound at or above the guarantee."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from lightning_gpate.privacy import ExponentialMechanismEvent
    from small_models import HIDDEN, fit, public_table

    dm = public_table(rows=600)
    q = 32 / 600
    model = DPGAN(dm.spec, epsilon=10.0, delta=1e-5, sampling_rate=q, noise_multiplier=1.0, d_steps=2, adaptive_d_steps=None,
                  z_dim=8, generator_hidden=HIDDEN, discriminator_hidden=(8,), warm_start=MARGINAL_WARM)
    assert model.opacus_epsilon() == 0.0  # nothing released yet
    fit(model, dm, steps=2, default_root_dir=tmp_path)
    reference = RdpAccountant([float(a) for a in model.accountant.orders])
    for event in model.warm_release.events():
        sigma = 2 / event.epsilon if isinstance(event, ExponentialMechanismEvent) else event.noise_multiplier
        reference.compose(dp_accounting.GaussianDpEvent(sigma))
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)), int(model.critic_steps_taken))
    assert int(model.critic_steps_taken) == 4
    assert model.opacus_epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    assert model.opacus_epsilon() >= model.guarantee_epsilon()


def test_a_pate_gan_release_saved_before_the_warm_start_existed_loads_without_one():
    """A PATE-GAN table release written before ``warm_start`` existed (the flat-options fixture, the option taken out)
    had none: it loads without one (no tree planned, no share of the budget said to be bought and "not released yet"),
    the generator it holds; ``warm_start: auto``, the default since, would have made it a warm-started model."""
    import sys

    from lightning_gpate.release import load_release, model_from_release

    before = Path(__file__).resolve().parent / "data" / "before_option_groups"
    release = load_release(before / "pategan_table.release.pt")
    assert release["hyper_parameters"]["data_spec"]["kind"] == "tabular" and release["hyper_parameters"]["budget_accounting"] == "guarantee"
    older = {**release, "hyper_parameters": {k: v for k, v in release["hyper_parameters"].items() if k != "warm_start"}}
    model = model_from_release(older)
    assert model.warm_release is None and model.hparams["warm_start"] is None and model.budget_shares() == []
    sys.path.insert(0, str(before))
    try:
        import make_fixtures
    finally:
        sys.path.remove(str(before))
    assert make_fixtures.generator_digest(model) == make_fixtures.generator_digest(model_from_release(release))


def test_the_marginal_warm_start_samples_labels_from_the_class_ratio_it_paid_for(tmp_path):
    """A table whose class ratio is neither declared nor paid for: PATE-GAN's labels come from the class ratio the
    marginal model measured with its share (noisy, paid for), not uniformly; kept in the release (a buffer)."""
    import pandas as pd

    from datamodules import TabularDataModule
    from lightning_gpate.models import PATEGAN
    from small_models import HIDDEN, SCHEMA, fit, public_frame

    frame = public_frame(3000)
    frame = pd.concat([frame[frame.y == 1], frame[frame.y == 0].iloc[:900]], ignore_index=True)  # 70% positive
    share = float((frame.y == 1).mean())
    dm = TabularDataModule(frame=frame, label="y", schema=SCHEMA, num_teachers=6, teacher_batch_size=8, batch_size=32, test_fraction=0.0)
    with pytest.warns(UserWarning, match="class ratio was read from the private data"):
        model = PATEGAN(dm.spec, epsilon=10.0, delta=1e-5, planned_queries=64, teacher_steps=1, student_steps=1, query_batch_size=16,
                        z_dim=8, generator_hidden=list(HIDDEN), teacher_hidden=[8], student_hidden=[8], marginals={"fraction": 0.0},
                        warm_start=MARGINAL_WARM)
    assert model.class_ratio.tolist() == [0.5, 0.5]  # before the release: uniform
    fit(model, dm, steps=1, default_root_dir=tmp_path)
    assert float(model.class_ratio[1]) == pytest.approx(share, abs=0.05)
    _, labels = model.generate(4000, seed=0)
    assert float(labels.float().mean()) == pytest.approx(share, abs=0.05)
    assert "class_ratio" in dict(model.named_buffers())


def test_the_marginal_warm_start_fits_on_private_quantile_bins(tmp_path):
    """On private quantile bins the data's paid metadata (a row count and the quantile edges, bounded-range events like
    the tree's selections) is the model's to pay, once: the inner tree records its planned events alone (the release
    checks it) and the fit stays within the budget."""
    from datamodules import TabularDataModule
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.privacy.quantiles import default_quantile_epsilon
    from small_models import HIDDEN, SCHEMA, fit, public_frame

    dm = TabularDataModule(frame=public_frame(2000), label="y", schema=SCHEMA, class_ratio=[0.5, 0.5], num_teachers=6,
                           teacher_batch_size=8, batch_size=32, test_fraction=0.0, quantile_epsilon=default_quantile_epsilon(10.0, 1e-5))
    assert [c["edges_source"] for c in dm.spec["columns"]] == ["dp_quantiles", "dp_quantiles", "integers"]  # c: 0-9, a bin each
    model = PATEGAN(dm.spec, epsilon=10.0, delta=1e-5, planned_queries=64, teacher_steps=1, student_steps=1, query_batch_size=16,
                    z_dim=8, generator_hidden=list(HIDDEN), teacher_hidden=[8], student_hidden=[8], marginals={"fraction": 0.0},
                    warm_start=MARGINAL_WARM)
    fit(model, dm, steps=1, default_root_dir=tmp_path)
    assert bool(model.warm_release.measured) and model.guarantee_epsilon() <= 10.0
