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
@pytest.mark.parametrize("count_weight,length_scale", [(0.1, 0.7), (0.3, 0.7), (0.9, 0.7), (0.3, [0.3, 0.7, 2.0]), (0.1, [0.05, 50.0])])
def test_one_record_added_or_removed_moves_the_released_sum_by_exactly_one(count_weight, length_scale):
    """Every record's embedding has norm 1, one length scale or several in one embedding (each scale's share of
    the features), so one record added or removed moves the released sum by exactly 1: the sensitivity."""
    torch.manual_seed(0)
    d, k = 20, 3
    frequencies = fourier_frequencies(402, d, length_scale=length_scale, seed=5)
    psi = record_embeddings(torch.cat([torch.rand(30, d) * 2 - 1, 100 * torch.randn(5, d)]), torch.randint(0, k, (35,)), frequencies, k,
                            count_weight=count_weight)
    assert psi.flatten(1).norm(dim=1).max().item() <= 1 + 1e-6
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
    means, counts = mean_embeddings(base, count_weight=count_weight, noise_multiplier=0.0)
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


def test_a_class_count_the_noise_brought_low_is_floored_at_three_of_its_noise_deviations():
    """Each class's mean embedding divides its noisy sum by its noisy count taken as at least 3 standard deviations of
    the count's noise (z/b records; issue 59: a small class's count at the floor of 1 blew its target up). Computed here
    in numpy from the release: a class well above the floor is the plain quotient to the bit, a small class is divided
    by the floor, and over many releases the small class's target stays near the ball of possible means while the
    plain quotient's leaves it by orders of magnitude."""
    count_weight, z = 0.3, 9.0
    a, b = np.sqrt(1 - count_weight**2), count_weight
    floor = 3 * z / b  # 90 records
    frequencies = fourier_frequencies(500, 8, length_scale=2.0, seed=0)
    rng = np.random.default_rng(0)
    x = torch.rand(1030, 8) * 2 - 1
    y = torch.cat([torch.zeros(1000, dtype=torch.long), torch.ones(30, dtype=torch.long)])  # a big and a small class
    total = embedding_sum(x, y, frequencies, 2, count_weight=count_weight).numpy()
    floored_norms, plain_norms = [], []
    for _ in range(200):
        noisy = total + z * rng.standard_normal(total.shape)
        means, counts = (t.numpy() for t in mean_embeddings(torch.from_numpy(noisy), count_weight=count_weight, noise_multiplier=z))
        np.testing.assert_allclose(counts, noisy[:, -1] / b, rtol=1e-12)  # the counts themselves are not floored
        expected = noisy[:, :-1] / (a * np.maximum(noisy[:, -1] / b, floor))[:, None]
        np.testing.assert_allclose(means, expected, rtol=1e-12)
        if noisy[0, -1] / b > floor:  # above the floor: the former quotient (floored at one record), to the bit
            former = torch.from_numpy(noisy)
            former = former[:, :-1] / (float(a) * (former[:, -1] / b).clamp_min(1.0)[:, None])
            assert np.array_equal(means[0], former[0].numpy())
        floored_norms.append(np.linalg.norm(means[1]))
        plain_norms.append(np.linalg.norm(noisy[1, :-1] / (a * max(noisy[1, -1] / b, 1.0))))
    assert max(floored_norms) < 3 and max(plain_norms) > 30  # the sum's noise (norm ~ z·√500 = 200) over 90, not over ~1
    # noise-free sums (a marginal warm start's sampled rows) are floored at one record only
    means = mean_embeddings(torch.from_numpy(total), count_weight=count_weight, noise_multiplier=0.0)[0].numpy()
    np.testing.assert_allclose(means[1], fourier_features(x[y == 1], frequencies).double().mean(0).numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="noise_multiplier"):
        mean_embeddings(torch.from_numpy(total), count_weight=count_weight, noise_multiplier=float("nan"))


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


# ----------------------------------------------------------------------------- the public features under the command line
def _tiny_dpmerf_config(path, **model):
    """The tiny table's CLI config (tests/clitools.py) with DP-MERF, its feature seed and length scale left to
    the model (``null``), a training checkpoint every 2 steps."""
    import yaml
    from clitools import tiny_gpate_config

    tiny_gpate_config(path, epsilon=5.0, experiment="merf", max_steps=4, checkpoints="ckpts", every_n_train_steps=2)
    config = yaml.safe_load(path.read_text())
    config["seed_everything"] = 1
    config["model"] = {"class_path": "lightning_gpate.models.DPMERF", "init_args": {
        "epsilon": 5.0, "delta": 1e-5, "num_features": 64, "generator": {"z_dim": 4, "hidden": [16]}, "generator_batch_size": 16,
        "feature_seed": None, "length_scale": None, **model}}
    config["data"]["init_args"]["num_teachers"] = 0
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def test_the_command_line_stores_the_drawn_feature_seed_and_length_scale_and_a_resume_keeps_them(tmp_path):
    """R3 (third privacy review): under LightningCLI ``save_hyperparameters`` stores the config as given, so the
    checkpoint and the release held ``feature_seed: None`` and a resume under another ``seed_everything`` drew other
    features than its release was measured with. The values used are stored; a resume that gives ``None`` keeps the
    checkpoint's, one that gives another seed is refused."""
    import mlflow
    from clitools import assert_one_line_error, run_cli, run_cli_many, write_tiny_table
    from lightning_gpate.models.base import load_generator
    from lightning_gpate.privacy.merf import median_distance_of_uniform

    write_tiny_table(tmp_path / "table.csv")
    _tiny_dpmerf_config(tmp_path / "merf.yaml")
    first = run_cli("fit", "--config", "merf.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("merf").experiment_id])
    release = torch.load(run.data.tags["release_artifact"], weights_only=False)
    seed, scale = release["hyper_parameters"]["feature_seed"], release["hyper_parameters"]["length_scale"]
    assert isinstance(seed, int) and scale == pytest.approx(median_distance_of_uniform(2))  # two columns in [-1, 1]
    checkpoint = tmp_path / "ckpts" / "step=2.ckpt"
    stored = torch.load(checkpoint, weights_only=False)["hyper_parameters"]
    assert (stored["feature_seed"], stored["length_scale"]) == (seed, scale)
    assert run.data.params["feature_seed"] == str(seed)  # and what MLflow shows is what was used
    measured_with = load_generator(run.data.tags["release_artifact"]).frequencies

    ran = run_cli_many({"resumed": ["fit", "--config", "merf.yaml", "--ckpt_path", str(checkpoint), "--seed_everything", "7",
                                    "--trainer.max_steps", "6"],
                        "other": ["fit", "--config", "merf.yaml", "--ckpt_path", str(checkpoint), "--model.init_args.feature_seed",
                                  str(seed + 1)]}, cwd=tmp_path)
    assert ran["resumed"].returncode == 0, ran["resumed"].stderr[-3000:]
    assert_one_line_error(ran["other"], "fit", f"pins feature_seed={seed}", f"asks for feature_seed={seed + 1}")
    resumed = max(client.search_runs([client.get_experiment_by_name("merf").experiment_id]), key=lambda r: r.info.start_time)
    final = load_generator(resumed.data.tags["training_checkpoint"])
    assert final.hparams.feature_seed == seed and torch.equal(final.frequencies, measured_with)
    assert torch.load(resumed.data.tags["release_artifact"], weights_only=False)["hyper_parameters"]["feature_seed"] == seed


def test_a_resume_from_python_trains_against_the_features_its_release_was_measured_with(tmp_path):
    """A model built with ``feature_seed=None`` under another seed draws another seed; resuming adopts the
    checkpoint's (the features its noisy release is an embedding under), and a seed given that differs is refused."""
    from lightning_gpate.release import CheckpointError

    pl.seed_everything(1, verbose=False)
    model, dm = small_models.build("dpmerf", feature_seed=None)
    trainer = small_models.fit(model, dm, steps=2)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    pl.seed_everything(2, verbose=False)
    resumed, dm2 = small_models.build("dpmerf", feature_seed=None)
    assert resumed.hparams.feature_seed != model.hparams.feature_seed
    small_models.fit(resumed, dm2, steps=4, ckpt_path=str(tmp_path / "a.ckpt"))
    assert resumed.hparams.feature_seed == model.hparams.feature_seed and torch.equal(resumed.frequencies, model.frequencies)
    assert build_release(resumed)["hyper_parameters"]["feature_seed"] == model.hparams.feature_seed
    other, dm3 = small_models.build("dpmerf", feature_seed=model.hparams.feature_seed + 1)
    with pytest.raises(CheckpointError, match=f"pins feature_seed={model.hparams.feature_seed}"):
        small_models.fit(other, dm3, steps=4, ckpt_path=str(tmp_path / "a.ckpt"))


# ----------------------------------------------------------------------------- the anchor's levers, one mechanism
def _independent_sigma(epsilon: float, delta: float, orders) -> float:
    """The smallest σ (to 1e-6) whose one Gaussian release (sensitivity 1) dp-accounting's RDP accountant
    puts within ε at δ: bisection, not the model's calibration."""
    from dp_accounting import GaussianDpEvent
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    def eps(sigma: float) -> float:
        acc = RdpAccountant(orders=[float(a) for a in orders])
        acc.compose(GaussianDpEvent(sigma))
        return acc.get_epsilon(delta)

    lo, hi = 0.05, 100.0
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps(mid) > epsilon else (lo, mid)
    return hi


def test_several_scales_a_wide_generator_and_its_average_charge_one_release_with_the_stated_noise():
    """The anchor's levers on DP-MERF (several length scales in one embedding, 1,000-fake batches, unbiased gap,
    Adam betas, the weight average): still exactly one Gaussian release, its noise N(0, σ²) on every entry of the
    sum with σ computed independently from (ε, δ); the average is what samples and is released."""
    pl.seed_everything(0, verbose=False)
    model, dm = small_models.build("dpmerf", epsilon=2.0, num_features=4000, length_scale=[0.3, 1.0, 3.0], generator_batch_size=100,
                                   unbiased=True, generator_betas=(0.5, 0.999), ema_decay=0.9)
    small_models.fit(model, dm, steps=5)
    counts = model.accountant.counts
    assert counts["subsampled_gaussian_events"] == 1 and counts["subsampled_gaussian_steps"] == 1
    assert sum(v for key, v in counts.items() if key.endswith("_events")) == 1
    sigma = _independent_sigma(2.0, 1e-5, model.accountant.orders)
    assert model.noise_multiplier == pytest.approx(sigma, rel=1e-4)
    noise = (model.released_embedding - _true_sum(model, dm)).double().flatten()  # 2 × 4,001 entries
    n = noise.numel()
    # the sample variance of n normal draws: (n − 1)s²/σ² is χ² with n − 1 degrees of freedom
    from scipy.stats import chi2

    statistic = float((noise - noise.mean()).pow(2).sum()) / sigma**2
    assert chi2.cdf(statistic, n - 1) == pytest.approx(0.5, abs=0.4995)  # two-sided, p > 0.001
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(n)
    release = build_release(model)
    assert all(torch.equal(v, model.generator_ema.state_dict()[k]) for k, v in release["generator"].items())
    assert not all(torch.equal(v, model.generator.state_dict()[k]) for k, v in release["generator"].items())


def test_the_anchor_and_dpmerf_release_the_same_embedding_for_the_same_seeds_and_settings():
    """G-PATE's random-feature anchor and DP-MERF are one mechanism (lightning_gpate.privacy.merf.release_embedding_sum):
    the same data, features (seed, length scales), noise multiplier and mechanism seed give the same release, and the
    same loss of a generator towards it (class_mean_gap), up to DP-MERF's class weights and the anchor's scale."""
    from datamodules import ImageDataModule
    from lightning_gpate.models import GPATE
    from lightning_gpate.models.anchor import class_mean_gap

    dm = ImageDataModule("digits", num_teachers=5, teacher_batch_size=4, val_fraction=0.0)
    scales, seed = [2.0, 4.0], 11
    gpate = GPATE(dm.spec, epsilon=8.0, delta=1e-5, aggregator="gaussian", sigma_gaussian=4.0, fake_batch_size=8, z_dim=8, gf_dim=8,
                  fc_dim=32, generator_upsample="nearest", noise_seed=5, anchor_fraction=0.25, anchor_features=600,
                  anchor_length_scale=scales, anchor_feature_seed=seed)
    pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               accelerator="cpu", devices=1).fit(gpate, dm)
    dm2 = ImageDataModule("digits", num_teachers=0, val_fraction=0.0)
    merf = DPMERF(dm2.spec, epsilon=8.0, delta=1e-5, noise_multiplier=gpate.anchor_noise, num_features=600, length_scale=scales,
                  feature_seed=seed, count_weight=0.3, z_dim=8, gf_dim=8, fc_dim=32, generator_batch_size=40, noise_seed=5)
    small_models.fit(merf, dm2, steps=1)
    assert torch.equal(merf.frequencies, gpate.anchor_frequencies())
    means = mean_embeddings(merf.released_embedding, count_weight=0.3, noise_multiplier=merf.noise_multiplier)[0]
    assert torch.allclose(means, gpate.anchor_targets, atol=1e-6, rtol=1e-5)
    assert merf.accountant.counts["subsampled_gaussian_events"] == 1


# ----------------------------------------------------------------------------- defaults
def _mnist_shaped_spec() -> dict:
    """An image spec of MNIST's shape (the model reads no data to resolve its defaults)."""
    from datamodules import ImageDataModule

    return {**ImageDataModule("digits", num_teachers=0, val_fraction=0.0).spec, "shape": [1, 28, 28]}


def _config(name: str) -> dict:
    import yaml

    from pathlib import Path

    return yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "mnist" / f"{name}.yaml").read_text())


def test_the_defaults_are_the_validated_cpu_config_and_the_paper_config_states_every_setting_that_differs():
    """Issue 47: a model's defaults are its best configuration under a guarantee. ``DPMERF(spec, epsilon=…, delta=…)`` on
    28×28 images is ``configs/mnist/dpmerf_eps1_guarantee.yaml`` (length scale 10, 1,000 digits a step, gf_dim 8, …; its
    800 steps are the trainer's), and ``dpmerf_paper_eps1_guarantee.yaml`` is the defaults with ``PAPER_SETTINGS``."""
    from lightning_gpate.models.dpmerf import PAPER_SETTINGS, VALIDATED_MAX_STEPS

    spec = _mnist_shaped_spec()
    default = DPMERF(spec, epsilon=1.0, delta=1e-5)
    assert default.hparams.length_scale == pytest.approx(10.0) and default.hparams.generator_batch_size == 1000
    cpu, paper = _config("dpmerf_eps1_guarantee"), _config("dpmerf_paper_eps1_guarantee")
    assert cpu["trainer"]["max_steps"] == VALIDATED_MAX_STEPS and paper["trainer"]["max_steps"] == 600
    for key, value in cpu["model"]["init_args"].items():  # a group: the options the config names
        given = default.hparams[key] if not isinstance(value, dict) else {k: default.hparams[key][k] for k in value}
        assert given == pytest.approx(value) if isinstance(value, float) else given == value, key
    stated = paper["model"]["init_args"]
    assert all(stated[key] == value for key, value in PAPER_SETTINGS.items())  # every paper setting that differs is stated
    paper_model = DPMERF(spec, **{k: v for k, v in stated.items() if k not in PAPER_SETTINGS}, **PAPER_SETTINGS)
    assert (paper_model.hparams.length_scale, paper_model.hparams.generator_batch_size) == (20.5, 500)
    for key, value in stated.items():  # and the rest of it are the defaults
        given = default.hparams[key] if not isinstance(value, dict) else {k: default.hparams[key][k] for k in value}
        assert key in PAPER_SETTINGS or given == value, key


def test_the_default_length_scale_is_per_data_kind_tables_keep_theirs():
    """Images: the MNIST validation's 10 at 784 pixels, scaled with √d (8×8 digits: 10·8/28); tables: √(2d/3), as
    before the image default changed (the tabular benchmark passes its own scales anyway)."""
    from datamodules import ImageDataModule
    from lightning_gpate.models.dpmerf import default_length_scale

    digits = ImageDataModule("digits", num_teachers=0, val_fraction=0.0).spec
    assert default_length_scale(_mnist_shaped_spec()) == pytest.approx(10.0)
    assert default_length_scale(digits) == pytest.approx(10.0 * 8 / 28)
    assert DPMERF(digits, epsilon=1.0, delta=1e-5).hparams.length_scale == pytest.approx(10.0 * 8 / 28)
    table = small_models.public_table().spec
    dim = math.prod(table["shape"])
    assert default_length_scale(table) == pytest.approx(math.sqrt(2 * dim / 3))
    assert DPMERF(table, epsilon=1.0, delta=1e-5).hparams.length_scale == pytest.approx(math.sqrt(2 * dim / 3))
