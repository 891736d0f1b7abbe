"""DP-MERF's few-shot release (DP-Kernel's recipe): every step a Poisson-subsampled batch's noisy embedding sum. Its planned
ε is dp-accounting's composition of Poisson-subsampled Gaussians, one a step for all blocks; one record added or removed
moves a step's blocks, in units of their noise, by at most 1 (brute force); a step reads the private data only through
the noisy sums; a resume keeps ε and a spent budget refuses to train; one-shot configs are unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from datamodules import ImageDataModule
from lightning_gpate.errors import BudgetExhaustedError
from lightning_gpate.release import CheckpointError, build_release, model_from_release
from lightning_gpate.models import DPMERF
from lightning_gpate.models import dpmerf as dpmerf_module
from lightning_gpate.privacy.merf import feature_sum
from small_models import fit

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [{"map": "pixels", "features": 64}, {"map": "scattering_rff", "features": 40, "share": 2.0}]
#: 1,417 training digits of 8x8: an expected batch of 140
FEW_SHOT = {"sampling_rate": 0.1, "expected_batch_size": 140, "steps": 12}


def _digits():
    dm = ImageDataModule("digits", num_teachers=0, val_fraction=0.0, batch_size=16)
    dm.setup("fit")
    return dm


def _model(dm, **options):
    options = {"epsilon": 1.0, "delta": 1e-5, "num_features": 64, "generator": {"z_dim": 4, "gf_dim": 4, "fc_dim": 16},
               "generator_batch_size": 40, "feature_seed": 3, "feature_maps": BLOCKS, "few_shot": FEW_SHOT, **options}
    return DPMERF(dm.spec, **options)


def _reference_epsilon(sigma: float, q: float, steps: int, orders) -> float:
    """dp-accounting alone: ``steps`` compositions of the Poisson-subsampled Gaussian, on the same orders."""
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    reference = RdpAccountant(orders=[float(a) for a in orders])
    reference.compose(SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps))
    return reference.get_epsilon(1e-5)


def test_the_planned_noise_fills_the_budget_as_dp_accounting_composes_one_subsampled_gaussian_a_step():
    """σ is the smallest (to 1%) for which the planned steps fit: their ε is dp-accounting's composition of that many
    Poisson-subsampled Gaussians (one a step, whatever the blocks), within the budget and filling it, and 1.1% less noise
    would not fit; a fit asked for more steps stops where the budget is spent."""
    dm = _digits()
    model = _model(dm)
    sigma, q, steps = model.noise_multiplier, FEW_SHOT["sampling_rate"], FEW_SHOT["steps"]
    planned = _reference_epsilon(sigma, q, steps, model.accountant.orders)
    assert 0.97 <= planned <= 1.0
    assert _reference_epsilon(sigma / 1.011, q, steps, model.accountant.orders) > 1.0
    trainer = fit(model, dm, steps=steps + 10)
    counts = model.accountant.counts
    taken = trainer.global_step
    assert steps <= taken < steps + 10 and "budget reached" in model.stop_reason
    assert counts["subsampled_gaussian_events"] == taken and counts["subsampled_gaussian_steps"] == taken
    assert sum(v for key, v in counts.items() if key.endswith("_events")) == taken  # nothing else, one event a step
    assert model.spent_epsilon() == pytest.approx(_reference_epsilon(sigma, q, taken, model.accountant.orders), rel=1e-9)
    assert model.spent_epsilon() <= 1.0 < _reference_epsilon(sigma, q, taken + 1, model.accountant.orders)


def _extreme_records(shape) -> torch.Tensor:
    ones = torch.ones(shape)
    lit = -torch.ones(shape)
    lit[..., shape[-2] // 2, shape[-1] // 2] = 1.0
    return torch.stack([ones, -ones, torch.zeros(shape), lit, 50 * torch.randn(shape, generator=torch.Generator().manual_seed(1))])


def test_one_record_moves_a_steps_blocks_by_at_most_one_unit_of_the_charged_noise(monkeypatch):
    """Brute force over neighbours of a step's batch: adding or removing one record (in the domain or far out, any
    class) moves the blocks' sums that the step adds noise to, each measured in its noise σ_i, by at most ``1/σ`` jointly
    (``Σ_i ‖ΔS_i‖²/σ_i² ≤ 1/σ²``), σ the charged subsampled Gaussian's multiplier: the step is that mechanism."""
    dm = _digits()
    model = _model(dm, noise_multiplier=3.0)
    monkeypatch.setattr(model, "charge", lambda event: True)
    seen = []
    real = dpmerf_module.noisy_release

    def spy(total, *, noise_multiplier, generator):
        seen.append((total.clone(), noise_multiplier))
        return real(total, noise_multiplier=noise_multiplier, generator=generator)

    monkeypatch.setattr(dpmerf_module, "noisy_release", spy)

    def step_sums(x, y):
        seen.clear()
        model.release_embedding(x, y)
        assert len(seen) == len(BLOCKS)
        return seen[:]

    (event,) = model.release_events()
    assert event.sampling_rate == FEW_SHOT["sampling_rate"] and event.noise_multiplier == 3.0
    x, y = (part[:10] for part in dm.model_space("train"))
    base = step_sums(x, y)
    shape = tuple(x.shape[1:])
    moved = []
    for record in _extreme_records(shape):
        for label in range(model.num_classes):
            added = step_sums(torch.cat([x, record[None]]), torch.cat([y, torch.tensor([label])]))
            moved.append(sum(((a - b).norm() / s) ** 2 for (a, s), (b, _) in zip(added, base)).sqrt().item())
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        removed = step_sums(x[keep], y[keep])
        moved.append(sum(((a - b).norm() / s) ** 2 for (a, s), (b, _) in zip(removed, base)).sqrt().item())
    assert max(moved) <= (1 + 1e-6) / event.noise_multiplier
    assert [s for _, s in base] == pytest.approx(model.block_noise_multipliers(), rel=1e-12)


def test_a_step_reads_the_private_data_only_through_the_noisy_sums(monkeypatch):
    """With the noisy sums replaced by values of their shapes alone, the generator trains the same on the digits and
    on other images with other labels: every read of the data goes through the noisy release, once a block a step."""
    calls = []

    def fixed(total, *, noise_multiplier, generator):
        calls.append(noise_multiplier)
        return torch.linspace(-1, 3, total.numel(), dtype=total.dtype).view_as(total)

    monkeypatch.setattr(dpmerf_module, "noisy_release", fixed)

    def run(swap: bool):
        pl.seed_everything(0, workers=True)
        dm = _digits()
        if swap:
            x, y = dm.splits["train"]
            dm.splits["train"] = (torch.zeros_like(x), torch.flip(y, [0]) % 3)
        model = _model(dm, noise_multiplier=3.0)
        fit(model, dm, steps=4)
        return torch.cat([p.detach().flatten() for p in model.generator.parameters()]), model.generator.label_ratio.clone()

    (weights, shares), (weights_swapped, shares_swapped) = run(False), run(True)
    assert len(calls) == 2 * 4 * len(BLOCKS)
    assert torch.equal(weights, weights_swapped) and torch.equal(shares, shares_swapped)


def test_a_resume_keeps_epsilon_and_a_spent_budget_refuses_to_train(tmp_path):
    dm = _digits()
    model = _model(dm, noise_seed=4)
    trainer = fit(model, dm, steps=5)
    trainer.save_checkpoint(tmp_path / "five.ckpt")
    sigma, orders = model.noise_multiplier, model.accountant.orders
    resumed = _model(_digits())
    trainer = fit(resumed, dm, steps=9, ckpt_path=str(tmp_path / "five.ckpt"))
    assert trainer.global_step == 9 and resumed.noise_multiplier == sigma
    assert resumed.accountant.counts["subsampled_gaussian_events"] == 9
    assert resumed.spent_epsilon() == pytest.approx(_reference_epsilon(sigma, FEW_SHOT["sampling_rate"], 9, orders), rel=1e-9)
    assert torch.equal(resumed.released_counts_sum.bool(), torch.ones(resumed.num_classes, dtype=torch.bool))
    release = build_release(resumed)  # the generator and its class shares, no step's release or count
    assert all(k.startswith("net.") or k == "label_ratio" for k in release["generator"])
    loaded = model_from_release(release)
    assert loaded.few_shot == resumed.few_shot and loaded.noise_multiplier == sigma
    torch.testing.assert_close(loaded.generate(20, seed=1)[0], resumed.eval().generate(20, seed=1)[0])
    fit(resumed, dm, steps=40, ckpt_path=str(tmp_path / "five.ckpt"))  # on to the budget's end
    assert resumed.budget_exhausted and resumed.spent_epsilon() <= 1.0
    spent = resumed.spent_epsilon()
    resumed.trainer.save_checkpoint(tmp_path / "spent.ckpt")
    again = _model(_digits())
    with pytest.raises(BudgetExhaustedError, match="budget is spent"):
        fit(again, dm, steps=60, ckpt_path=str(tmp_path / "spent.ckpt"))
    assert again.spent_epsilon() == pytest.approx(spent, rel=1e-12)
    with pytest.raises(CheckpointError, match="few_shot"):
        fit(_model(_digits(), few_shot={**FEW_SHOT, "sampling_rate": 0.05}), dm, steps=9, ckpt_path=str(tmp_path / "five.ckpt"))


def test_a_one_shot_config_is_unchanged_and_a_bad_few_shot_is_refused_in_one_line():
    """The scattering config (no few_shot): one Gaussian release a block over the whole split, no few-shot state; its
    model's state holds the keys a DP-MERF checkpoint of before the feature maps holds (it loads strictly)."""
    import yaml

    config = yaml.safe_load((ROOT / "configs" / "mnist" / "dpmerf_scattering_eps1_guarantee.yaml").read_text())["model"]["init_args"]
    spec = {**ImageDataModule("digits", num_teachers=0, val_fraction=0.0).spec, "shape": [1, 28, 28]}
    model = DPMERF(spec, **{**config, "feature_seed": 7})
    assert model.few_shot is None and model.hparams.get("few_shot") is None and model.train_sampling == {"kind": "full"}
    assert [(e.sampling_rate, e.steps) for e in model.release_events()] == [(1.0, 1), (1.0, 1)]
    assert "released_counts_sum" not in model.state_dict()
    old = torch.load(ROOT / "tests" / "data" / "before_feature_maps" / "dpmerf_digits.step2.ckpt", weights_only=False)["state_dict"]
    small = _model(_digits(), feature_maps=None, few_shot=None)
    assert set(small.state_dict()) == set(old)
    for bad, message in (({"expected_batch_size": 140}, "sampling_rate must be declared public"),
                         ({"sampling_rate": 0.1}, "expected_batch_size must be declared public"),
                         ({**FEW_SHOT, "steps": 0}, "steps must be an integer"),
                         ({**FEW_SHOT, "rate": 1}, "few_shot has no option 'rate'")):
        with pytest.raises(ValueError, match=message):
            _model(_digits(), few_shot=bad)
    assert math.isfinite(_model(_digits(), few_shot={**FEW_SHOT, "steps": 3}).noise_multiplier)
