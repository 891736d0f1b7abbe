"""DP-MERF: the released sum of embeddings has L2 sensitivity 1 (checked on records added and removed),
its noise is secret and has the stated scale, the accountant charges exactly one Gaussian release
(its ε recomputed with dp-accounting and checked against the analytic Gaussian mechanism), and the
usual private-model contract (the release holds the generator and the public feature seed, a resume
releases nothing more, the generator learns the table)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch
from scipy.stats import norm

import small_models
from datamodules import TabularDataModule
from lightning_gpate.errors import ConfigError
from lightning_gpate.models import DPMERF
from lightning_gpate.privacy.merf import embedding_sum, fourier_features, fourier_frequencies, mean_embeddings, record_embeddings
from lightning_gpate.release import build_release


# ----------------------------------------------------------------------------- the mechanism
@pytest.mark.parametrize("count_weight", [0.1, 0.3, 0.9])
def test_one_record_added_or_removed_moves_the_released_sum_by_exactly_one(count_weight):
    torch.manual_seed(0)
    d, k = 20, 3
    frequencies = fourier_frequencies(400, d, length_scale=0.7, seed=5)
    x, y = torch.rand(50, d) * 2 - 1, torch.randint(0, k, (50,))
    base = embedding_sum(x, y, frequencies, k, count_weight=count_weight, chunk_size=7)
    # records of every kind: the corners of the domain, the origin, far outside it, random ones, each class
    extremes = [torch.ones(d), -torch.ones(d), torch.zeros(d), 100 * torch.randn(d), *(torch.rand(5, d) * 2 - 1)]
    for record in extremes:
        for label in range(k):
            added = embedding_sum(torch.cat([x, record[None]]), torch.cat([y, torch.tensor([label])]), frequencies, k,
                                  count_weight=count_weight, chunk_size=7)
            assert (added - base).norm().item() == pytest.approx(1.0, abs=1e-5)  # the bound, attained
    for i in (0, 17, 49):  # removing a record of the data
        keep = torch.arange(50) != i
        removed = embedding_sum(x[keep], y[keep], frequencies, k, count_weight=count_weight, chunk_size=7)
        assert (base - removed).norm().item() == pytest.approx(1.0, abs=1e-5)
    # the sum is the sum of the per-record embeddings; its last column counts each class (times b)
    np.testing.assert_allclose(base.numpy(), record_embeddings(x, y, frequencies, k, count_weight=count_weight).double().sum(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(base[:, -1].numpy(), count_weight * np.bincount(y.numpy(), minlength=k), atol=1e-9)
    means, counts = mean_embeddings(base, count_weight=count_weight)
    np.testing.assert_allclose(counts.numpy(), np.bincount(y.numpy(), minlength=k), atol=1e-9)
    np.testing.assert_allclose(means[1].numpy(), fourier_features(x[y == 1], frequencies).double().mean(0).numpy(), atol=1e-5)


def test_random_features_approximate_the_gaussian_kernel_and_come_from_the_public_seed():
    torch.manual_seed(1)
    x = torch.rand(6, 10) * 2 - 1
    frequencies = fourier_frequencies(20_000, 10, length_scale=1.5, seed=3)
    phi = fourier_features(x, frequencies).double()
    kernel = torch.exp(-torch.cdist(x.double(), x.double()) ** 2 / (2 * 1.5**2))
    np.testing.assert_allclose((phi @ phi.T).numpy(), kernel.numpy(), atol=0.03)
    np.testing.assert_allclose(phi.norm(dim=1).numpy(), 1.0, atol=1e-6)
    # several length scales: the mean of their Gaussian kernels, still of unit norm
    mixed = fourier_features(x, fourier_frequencies(20_000, 10, [0.5, 3.0], seed=3)).double()
    two = sum(torch.exp(-torch.cdist(x.double(), x.double()) ** 2 / (2 * s**2)) for s in (0.5, 3.0)) / 2
    np.testing.assert_allclose((mixed @ mixed.T).numpy(), two.numpy(), atol=0.03)
    np.testing.assert_allclose(mixed.norm(dim=1).numpy(), 1.0, atol=1e-6)
    assert torch.equal(fourier_frequencies(100, 10, 1.5, seed=3), fourier_frequencies(100, 10, 1.5, seed=3))
    assert not torch.equal(fourier_frequencies(100, 10, 1.5, seed=3), fourier_frequencies(100, 10, 1.5, seed=4))


# ----------------------------------------------------------------------------- the model's release
def _true_sum(model, dm):
    x, y = dm.model_space("train")
    return embedding_sum(x, y, model.frequencies, model.num_classes, count_weight=model.hparams.count_weight).float()


def test_the_noise_is_secret_and_has_the_stated_scale():
    """Same public seeds (seed_everything, feature_seed): the same random features, different noise; the
    noise is N(0, σ²) on every entry of the sum (sensitivity 1); a fixed noise_seed (tests) replays it."""
    released, models = [], []
    for noise_seed in (None, None, 4, 4):
        pl.seed_everything(0, verbose=False)
        model, dm = small_models.build("dpmerf", num_features=4000, feature_seed=123, noise_seed=noise_seed)
        small_models.fit(model, dm, steps=1)
        released.append(model.released_embedding.clone())
        models.append(model)
    assert all(torch.equal(m.frequencies, models[0].frequencies) for m in models)
    assert not torch.equal(released[0], released[1])  # OS-seeded: the public seeds do not replay it
    assert torch.equal(released[2], released[3])  # the only difference was the noise
    noise = released[0] - _true_sum(models[0], dm)
    sigma = models[0].noise_multiplier
    # 4.5 standard errors of the n entries' mean (σ/√n) and standard deviation (σ/√(2n)): a false failure in
    # ~1e-5 runs (a fixed 0.03σ on the mean was 2.7 standard errors at n = 8,002: ~1 run in 150 failed)
    n = noise.numel()
    assert noise.std().item() == pytest.approx(sigma, abs=4.5 * sigma / math.sqrt(2 * n))
    assert abs(noise.mean().item()) < 4.5 * sigma / math.sqrt(n)


def _analytic_gaussian_delta(epsilon: float, sigma: float) -> float:
    """δ(ε) of the Gaussian mechanism with L2 sensitivity 1 and noise σ, exactly (Balle & Wang, ICML
    2018, Theorem 8): Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ)."""
    return norm.cdf(0.5 / sigma - epsilon * sigma) - math.exp(epsilon) * norm.cdf(-0.5 / sigma - epsilon * sigma)


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_the_accountant_charges_exactly_one_gaussian_release(epsilon):
    from dp_accounting import GaussianDpEvent
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    model, dm = small_models.build("dpmerf", epsilon=epsilon)
    small_models.fit(model, dm, steps=6)
    counts = model.accountant.counts
    assert counts["subsampled_gaussian_events"] == 1 and counts["subsampled_gaussian_steps"] == 1
    assert sum(v for key, v in counts.items() if key.endswith("_events")) == 1  # nothing else was charged
    sigma = model.noise_multiplier
    # independently: dp-accounting's RDP accountant, one Gaussian of noise multiplier σ, on the same orders
    reference = RdpAccountant(orders=[float(a) for a in model.accountant.orders])
    reference.compose(GaussianDpEvent(sigma))
    assert model.spent_epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)
    assert 0.999 * epsilon <= model.spent_epsilon() <= epsilon  # σ calibrated to the budget
    # and it is a true (ε, δ) bound for the mechanism (RDP's conversion is loose by a few per cent only)
    assert _analytic_gaussian_delta(model.spent_epsilon(), sigma) <= 1e-5
    assert _analytic_gaussian_delta(0.85 * model.spent_epsilon(), sigma) > 1e-5
    # more steps cost nothing more: they train on the release
    small_models.fit(model, dm, steps=10)
    assert model.accountant.counts["subsampled_gaussian_events"] == 1


def test_a_resume_trains_on_the_same_release_without_a_second_one(tmp_path):
    model, dm = small_models.build("dpmerf")
    trainer = small_models.fit(model, dm, steps=3, enable_checkpointing=True, default_root_dir=tmp_path)
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed, dm2 = small_models.build("dpmerf")
    trainer = small_models.fit(resumed, dm2, steps=6, ckpt_path=str(ckpt))
    assert trainer.global_step == 6
    assert torch.equal(resumed.released_embedding, model.released_embedding)
    assert resumed.accountant.counts["subsampled_gaussian_events"] == 1
    assert resumed.spent_epsilon() == pytest.approx(model.spent_epsilon())


def test_the_release_holds_the_generator_shares_and_public_seed_not_the_embedding():
    pl.seed_everything(3, verbose=False)
    model, dm = small_models.build("dpmerf")
    small_models.fit(model, dm, steps=2)
    release = build_release(model)
    assert all(k.startswith("net.") or k == "label_ratio" for k in release["generator"])
    assert torch.equal(release["generator"]["label_ratio"], model.generator.label_ratio)
    assert not any("released" in k or "frequencies" in k for k in release["generator"])
    seed = release["hyper_parameters"]["feature_seed"]
    assert isinstance(seed, int) and seed == model.hparams.feature_seed
    from lightning_gpate.release import model_from_release

    loaded = model_from_release(release)
    assert torch.equal(loaded.frequencies, model.frequencies)  # redrawn from the stored seed
    x, y = model.eval().generate(30, seed=1)
    x2, y2 = loaded.generate(30, seed=1)
    assert torch.equal(y, y2) and torch.allclose(x, x2)


def test_a_noise_multiplier_over_the_budget_is_refused_in_one_line():
    model, dm = small_models.build("dpmerf", epsilon=1.0, noise_multiplier=0.5)
    with pytest.raises(ConfigError, match=r"raise noise_multiplier to at least 4\.\d+"):
        small_models.fit(model, dm, steps=1)
    with pytest.raises(ValueError, match="count_weight"):
        small_models.build("dpmerf", count_weight=1.0)
    with pytest.raises(ValueError, match="num_features"):
        small_models.build("dpmerf", num_features=301)


@pytest.mark.parametrize("name", ["dpmerf", "marginal"])
def test_a_one_process_model_refuses_a_trainer_of_several_processes_built_without_the_command_line(name):
    """Under DDP every process would read the split and release its own noisy embedding (or marginals) while
    the accountant charges one release: a Trainer or Synthesizer with devices > 1 must refuse, not only the CLI."""
    from types import SimpleNamespace

    model, _ = small_models.build(name)
    model._trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match="trains on one process only"):
        model.setup("fit")
    model._trainer = SimpleNamespace(world_size=1)
    model.setup("fit")


def test_it_learns_a_table_its_classes_and_a_feature_the_label_drives():
    rng = np.random.default_rng(0)
    n = 4000
    y = rng.binomial(1, 0.25, n)
    frame = pd.DataFrame({"a": np.clip(np.where(y == 1, 0.75, 0.25) + 0.08 * rng.normal(size=n), 0, 1).round(4),
                          "b": rng.uniform(-3, 3, n).round(4), "y": y})
    schema = {"a": {"min": 0, "max": 1}, "b": {"min": -3, "max": 3}, "y": {"categories": [0, 1]}}
    dm = TabularDataModule(frame=frame, label="y", schema=schema, test_fraction=0.0, val_fraction=0.0)
    pl.seed_everything(0, verbose=False)
    model = DPMERF(dm.spec, epsilon=10.0, delta=1e-5, num_features=2000, length_scale=0.5, z_dim=4,
                   generator_hidden=(64, 64), generator_batch_size=200, lr=0.005, lr_decay_steps=100)
    small_models.fit(model, dm, steps=400)
    assert model.generator.label_ratio[1].item() == pytest.approx(0.25, abs=0.02)  # the released class shares
    from lightning_gpate.evaluation.report import synthetic_table

    table = synthetic_table(model.eval(), 4000, seed=0)
    assert table["y"].mean() == pytest.approx(0.25, abs=0.03)
    by_class = table.groupby("y")["a"].mean()
    assert by_class[0] == pytest.approx(0.25, abs=0.07) and by_class[1] == pytest.approx(0.75, abs=0.07)
    assert table["b"].std() > 1.0  # spread over b's range, not collapsed
