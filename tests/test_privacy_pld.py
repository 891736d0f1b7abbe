"""PLD accounting of DP-SGD: against dp-accounting's PLDAccountant driven through its DpEvent API, the
issue's reference figures, and DP-GAN's `accountant: pld` option (more steps for the same budget)."""

import math

import dp_accounting
import pytest
import pytorch_lightning as pl
from dp_accounting.pld import pld_privacy_accountant

from datamodules import ImageDataModule
from lightning_gpate.models import DPGAN
from conftest import query_run
from lightning_gpate.privacy.pld import dpsgd_pld_epsilon, dpsgd_pld_max_steps
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent


def _independent(q, sigma, steps, delta, interval=1e-3):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("q, sigma, steps", [(64 / 60000, 1.1, 10_000), (0.1, 2.0, 300), (0.01, 0.8, 1000)])
def test_pld_epsilon_matches_dp_accounting(q, sigma, steps):
    got = dpsgd_pld_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=1e-5)
    assert math.isclose(got, _independent(q, sigma, steps, 1e-5), rel_tol=1e-6)


def test_pld_is_about_31_percent_below_rdp_at_the_reference_setting():
    q, sigma, steps = 64 / 60000, 1.1, 10_000
    pld = dpsgd_pld_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=1e-5)
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    assert pld == pytest.approx(0.457, abs=1e-3) and rdp.get_epsilon(1e-5) == pytest.approx(0.662, abs=1e-3)


def test_pure_releases_compose_and_max_steps_is_the_last_that_fits():
    pure_only = dpsgd_pld_epsilon(noise_multiplier=1.0, sampling_rate=0.01, steps=0, delta=1e-5, pure_epsilon=0.3)
    assert pure_only == pytest.approx(0.3, abs=2e-3)
    base = dict(noise_multiplier=1.0, sampling_rate=0.05, delta=1e-5, pure_epsilon=0.1)
    t = dpsgd_pld_max_steps(epsilon=2.0, **base)
    assert dpsgd_pld_epsilon(steps=t, **base) <= 2.0 < dpsgd_pld_epsilon(steps=t + 1, **base)
    assert dpsgd_pld_max_steps(epsilon=0.05, **base) == 0  # the pure release alone exceeds it


def test_dpgan_with_pld_takes_more_steps_and_reports_the_pld_epsilon():
    dm = ImageDataModule("digits", batch_size=32)
    steps = {}
    for accountant in ("rdp", "pld"):
        model = former(DPGAN, dm.spec, epsilon=1.0, delta=1e-5, noise_multiplier=1.2, sampling_rate=32 / 1150, z_dim=8, generator_hidden=(16,),
                      discriminator_hidden=(16, 16), accountant=accountant)
        pl.Trainer(max_steps=2000, logger=GPATEMLFlowLogger(experiment_name=f"dpgan-{accountant}"), enable_progress_bar=False,
                   enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1).fit(model, dm)
        steps[accountant] = int(model.critic_steps_taken)
        assert model.budget_exhausted
        q = model.sampling_rate
        if accountant == "pld":
            exact = _independent(q, 1.2, steps["pld"], 1e-5)
            # a generator step's 5 critic steps are paid together: the stop is before the 5 that would cross
            assert steps["pld"] % 5 == 0 and exact <= 1.0 < _independent(q, 1.2, steps["pld"] + 5, 1e-5)
            assert exact <= model.guarantee_epsilon() + 1e-9 and model.guarantee_epsilon() <= 1.0  # same PLD, float noise
            assert model.accountant.epsilon() > 1.0  # the RDP bound of the same steps is looser
            run, _ = query_run("dpgan-pld")  # the logged epsilon is the one in force, RDP beside it
            assert run.data.metrics["epsilon_final"] == pytest.approx(model.guarantee_epsilon())
            assert run.data.metrics["epsilon_final_rdp"] == pytest.approx(model.accountant.epsilon())
    assert steps["pld"] > 1.2 * steps["rdp"]


@pytest.mark.parametrize("change", [{"noise_multiplier": 0.3}, {"sampling_rate": 0.1}, {"accountant": "rdp"},
                                    {"d_steps": 2}])
def test_a_resume_with_another_noise_rate_accountant_or_schedule_is_refused(change, tmp_path):
    """The PLD bound composes every critic step of the run at one σ and q (and the adaptive worst case counts
    them under one schedule): a resume from Python that asks for another σ, q, accountant or n_D is refused in
    one line naming both values, before any step (the review's resume reported 0.061 where its steps cost 1.644)."""
    from lightning_gpate.models.base import CheckpointError

    dm = ImageDataModule("digits", batch_size=32)
    kw = dict(epsilon=5.0, delta=1e-5, noise_multiplier=1.2, sampling_rate=32 / 1150, z_dim=8, generator_hidden=(16,),
              discriminator_hidden=(16, 16), accountant="pld")
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(former(DPGAN, dm.spec, **kw), dm)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    resumed = former(DPGAN, dm.spec, **{**kw, **change})
    with pytest.raises(CheckpointError) as refused:
        pl.Trainer(max_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=tmp_path).fit(resumed, dm, ckpt_path=tmp_path / "m.ckpt")
    (name, value), = change.items()
    message = str(refused.value)
    assert "\n" not in message and f"asks for {name}={value!r}" in message and f"pins {name}=" in message
    assert int(resumed.critic_steps_taken) == 0 and resumed.accountant.epsilon() == 0.0  # nothing ran
    same = former(DPGAN, dm.spec, **kw)  # the same settings resume
    pl.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
               default_root_dir=tmp_path).fit(same, dm, ckpt_path=tmp_path / "m.ckpt")
    steps = int(same.critic_steps_taken)
    assert steps == 15 and math.isclose(same.guarantee_epsilon(), _independent(same.sampling_rate, 1.2, 20, 1e-5), rel_tol=1e-6)
