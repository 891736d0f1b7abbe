"""GaussAgg: the Gaussian sum of the teachers' normalised directions (a G-PATE aggregator) — its basis,
votes, release and cost, checked against independent computations (scipy's DCT, dp-accounting)."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.fft
import torch

from lightning_gpate.privacy import DEFAULT_ORDERS, GaussianSumEvent, PrivacyAccountant
from lightning_gpate.privacy.gaussagg import gaussian_sum_release, normalized_votes


def test_each_teachers_vote_has_norm_one_and_abstentions_vote_zero():
    grads = torch.randn(5, 3, 7, dtype=torch.float64)
    grads[4] = 0.0  # a teacher without direction votes 0
    votes = normalized_votes(grads)
    torch.testing.assert_close(votes[:4].flatten(1).norm(dim=1), torch.ones(4, dtype=torch.float64))
    assert torch.equal(votes[4], torch.zeros(3, 7, dtype=torch.float64))
    torch.testing.assert_close(votes[1], grads[1] / grads[1].norm())  # one scale over all units of a teacher
    voting = torch.tensor([[True, False, True]] * 4 + [[False, False, False]])
    masked = normalized_votes(grads, voting)
    assert torch.equal(masked[:, 1], torch.zeros(5, 7, dtype=torch.float64))
    torch.testing.assert_close(masked[0], grads[0] * voting[0, :, None] / (grads[0] * voting[0, :, None]).norm())
    with pytest.raises(ValueError, match="voting"):
        normalized_votes(grads, voting[:, :2])


def test_one_teacher_moves_the_sum_by_at_most_two():
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(200):
        grads = torch.randn(6, 4, 9, generator=g)
        changed = grads.clone()
        changed[2] = torch.randn(4, 9, generator=g) * 100.0  # teacher 2's data replaced: any direction
        voting = torch.rand(6, 4, generator=g) > 0.3
        changed_voting = voting.clone()
        changed_voting[2] = torch.rand(4, generator=g) > 0.5
        move = (normalized_votes(grads, voting).sum(0) - normalized_votes(changed, changed_voting).sum(0)).norm()
        worst = max(worst, float(move))
    assert worst <= 2.0 + 1e-5 and worst > 1.5


def test_a_teacher_with_an_inf_or_nan_coordinate_votes_zero_and_the_release_stays_finite():
    """One teacher's direction with an inf coordinate, one with a NaN (a diverged teacher): each votes zero as a
    whole, the sum and the release are finite (before: NaN everywhere), the finite teachers' votes are their own
    unit directions, and one teacher turning non-finite moves the sum by at most 1 (its vote gone), within the
    sensitivity 2. A huge but finite vote keeps norm 1 (no overflow to a zero vote)."""
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(5, 3, 4, generator=g)
    grads[1, 2, 0] = float("inf")
    grads[3, 0, 3] = float("nan")
    grads[4] *= 1e37  # its squared norm overflows float32
    votes = normalized_votes(grads)
    assert torch.isfinite(votes).all()
    assert torch.equal(votes[1], torch.zeros(3, 4)) and torch.equal(votes[3], torch.zeros(3, 4))
    for t in (0, 2, 4):
        torch.testing.assert_close(votes[t], (grads[t].double() / grads[t].double().norm()).float())
    release = gaussian_sum_release(votes.sum(0), sigma=1.0, num_teachers=5, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(release).all()
    clean = grads.clone()
    clean[1], clean[3] = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    for t in (1, 3):  # teacher t alone turned non-finite: its unit vote leaves the sum, nothing else moves
        one_bad = clean.clone()
        one_bad[t] = grads[t]
        move = (normalized_votes(clean).sum(0) - normalized_votes(one_bad).sum(0)).norm()
        assert math.isclose(float(move), 1.0, rel_tol=1e-5)
    voting = torch.ones(5, 3, dtype=torch.bool)
    voting[1, 2] = False  # the inf is on a unit teacher 1 abstains from: the rest of its vote counts
    masked = normalized_votes(grads, voting)
    kept = grads[1].clone()
    kept[2] = 0.0
    torch.testing.assert_close(masked[1], kept / kept.norm())


def test_release_is_the_mean_vote_plus_gaussian_noise_of_sigma_over_teachers():
    total = torch.full((400, 250), 3.0)
    release = gaussian_sum_release(total, sigma=2.0, num_teachers=4, generator=torch.Generator().manual_seed(1))
    assert release.mean().item() == pytest.approx(0.75, abs=0.005)
    assert release.std().item() == pytest.approx(0.5, rel=0.01)
    again = gaussian_sum_release(total, sigma=2.0, num_teachers=4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(release, again)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_sum_release(total, sigma=0.0, num_teachers=4)


def test_gaussian_sum_event_is_the_gaussian_mechanism_of_sensitivity_two():
    n, sigma = 700, 35.2
    acc = PrivacyAccountant(delta=1e-5)
    for _ in range(n):
        acc.record(GaussianSumEvent(num_sums=1, sensitivity=2.0, sigma=sigma))
    np.testing.assert_allclose(acc.rdp, n * 4.0 * DEFAULT_ORDERS / (2 * sigma**2), rtol=1e-12)  # λΔ²/(2σ²) each
    ref = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    ref.compose(dp_accounting.GaussianDpEvent(sigma / 2.0), n)
    assert acc.epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    assert acc.counts["gaussian_sum_events"] == n and acc.counts["gaussian_sums"] == n
    np.testing.assert_array_equal(acc.rdp, acc.rdp_paper)  # data-independent: the paper curve is the guarantee
    for bad in ({"num_sums": 1, "sensitivity": 0.0, "sigma": 1.0}, {"num_sums": 1, "sensitivity": 2.0, "sigma": -1.0},
                {"num_sums": 0.5, "sensitivity": 2.0, "sigma": 1.0}):
        with pytest.raises(ValueError):
            GaussianSumEvent(**bad)
