"""DPGradAgg (G-PATE Algorithm 2): projection, discretisation, votes, Confident-GNMax, aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_gpate.privacy.dpgradagg import (
    aggregate,
    bin_centers,
    confident_gnmax,
    dp_grad_agg,
    project,
    random_projection,
    vote_histograms,
)

C = 1e-4  # the paper's clip (step size)
B = 10


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_random_projection_shape_scale_and_seed():
    P = random_projection(4, 300, 8, generator=_gen(1))
    assert P.shape == (4, 300, 8) and P.dtype == torch.float32
    assert abs(P.var().item() - 1 / 8) < 0.01  # N(0, 1/k)
    assert torch.equal(P, random_projection(4, 300, 8, generator=_gen(1)))
    assert not torch.equal(P[0], P[1])  # a fresh projection per sample


def test_project_is_per_sample_matmul():
    g = torch.randn(3, 4, 6, dtype=torch.float64)
    P = torch.randn(4, 6, 2, dtype=torch.float64)
    U = project(g, P)
    assert U.shape == (3, 4, 2)
    for t in range(3):
        for j in range(4):
            torch.testing.assert_close(U[t, j], g[t, j] @ P[j])


def test_bin_centers():
    torch.testing.assert_close(bin_centers(clip=1.0, num_bins=4, dtype=torch.float64),
                               torch.tensor([-0.75, -0.25, 0.25, 0.75], dtype=torch.float64))


def test_vote_histograms_hand_built():
    # 3 teachers, 1 sample, 2 projected dims, c = 1, B = 4 bins: [-1,-.5) [-.5,0) [0,.5) [.5,1]
    U = torch.tensor([
        [[-1.0, 0.6]],   # teacher 0: exactly -c → bin 0; 0.6 → bin 3
        [[-5.0, 1.0]],   # teacher 1: beyond -c → bin 0; exactly +c → last bin
        [[0.1, 7.0]],    # teacher 2: 0.1 → bin 2; beyond +c → last bin
    ])
    v = vote_histograms(U, clip=1.0, num_bins=4)
    assert v.dtype == torch.int64 and v.shape == (1, 2, 4)
    assert v[0, 0].tolist() == [2, 0, 1, 0]
    assert v[0, 1].tolist() == [0, 0, 0, 3]
    # interior edges are half-open [lo, hi): -0.5 → bin 1, 0 → bin 2, 0.5 → bin 3
    e = vote_histograms(torch.tensor([[[-0.5]], [[0.0]], [[0.5]]]), clip=1.0, num_bins=4)
    assert e[0, 0].tolist() == [0, 1, 1, 1]


def test_vote_histograms_paper_clip_and_sum():
    T, m, k = 37, 5, 3
    U = torch.randn(T, m, k) * 2 * C
    v = vote_histograms(U, clip=C, num_bins=B)
    assert v.shape == (m, k, B)
    assert (v.sum(-1) == T).all()
    # histograms of teacher chunks add up (DDP all-reduce)
    v2 = vote_histograms(U[:20], clip=C, num_bins=B) + vote_histograms(U[20:], clip=C, num_bins=B)
    assert torch.equal(v, v2)


def test_noise_free_recovers_majority_direction():
    T, m, d, k = 9, 3, 12, 4
    g = torch.randn(m, d) * 1e-5
    grads = g.expand(T, m, d).clone()
    delta, votes, answered = dp_grad_agg(grads, k=k, clip=C, num_bins=B, threshold=0.0,
                                         sigma_threshold=0.0, sigma_gnmax=0.0, generator=_gen(0))
    assert answered.all()
    assert (votes.amax(-1) == T).all()  # unanimous
    cos = torch.nn.functional.cosine_similarity(delta, g, dim=1)
    assert (cos > 0).all()


def test_identity_projection_returns_bin_center():
    T, m, d = 5, 2, 3
    g = torch.tensor([[0.33e-4, -0.71e-4, 2e-4], [-3e-4, 0.05e-4, -0.15e-4]])
    grads = g.expand(T, m, d).clone()
    P = torch.eye(d).expand(m, d, d).clone()  # k = d, P = I
    delta, votes, answered = dp_grad_agg(grads, k=d, clip=C, num_bins=B, threshold=0.0, sigma_threshold=0.0,
                                         sigma_gnmax=0.0, generator=_gen(0), projection=P)
    centers = bin_centers(clip=C, num_bins=B)
    w = 2 * C / B
    expect_idx = torch.clamp(torch.floor((g.clamp(-C, C) + C) / w), 0, B - 1).long()
    torch.testing.assert_close(delta, centers[expect_idx])
    # e.g. 0.33e-4 lies in [0.2e-4, 0.4e-4) → centre 0.3e-4; 2e-4 clips to +c → last centre 0.9e-4
    assert math.isclose(delta[0, 0].item(), 0.3e-4, rel_tol=1e-5)
    assert math.isclose(delta[0, 2].item(), 0.9e-4, rel_tol=1e-5)
    assert math.isclose(delta[1, 0].item(), -0.9e-4, rel_tol=1e-5)


def test_unanswered_outputs_zero():
    T, m, d, k = 6, 4, 10, 3
    grads = torch.randn(T, m, d) * 1e-4
    delta, votes, answered = dp_grad_agg(grads, k=k, clip=C, num_bins=B, threshold=T + 1,
                                         sigma_threshold=0.0, sigma_gnmax=0.0, generator=_gen(0))
    assert not answered.any()
    assert torch.count_nonzero(delta) == 0
    assert answered.shape == (m, k) and votes.shape == (m, k, B)


def test_partial_answers_only_answered_dims_contribute():
    votes = torch.zeros(1, 3, 4, dtype=torch.long)
    votes[0, 0, 3] = 10          # unanimous → answered
    votes[0, 1, :] = torch.tensor([3, 3, 2, 2])  # max 3 < threshold 6 → unanswered
    votes[0, 2, 0] = 10
    P = torch.eye(3).unsqueeze(0)
    delta, answered = aggregate(votes, P, clip=1.0, num_bins=4, threshold=6, sigma_threshold=0.0,
                                sigma_gnmax=0.0, generator=_gen(0))
    assert answered.tolist() == [[True, False, True]]
    torch.testing.assert_close(delta, torch.tensor([[0.75, 0.0, -0.75]]))


def test_teacher_isolation_changes_at_most_one_vote():
    T, m, d, k = 11, 4, 20, 5
    grads = torch.randn(T, m, d) * 1e-4
    P = random_projection(m, d, k, generator=_gen(3))
    v = vote_histograms(project(grads, P), clip=C, num_bins=B)
    other = grads.clone()
    other[4] = torch.randn(m, d) * 1e-3  # teacher 4's data changes arbitrarily
    v2 = vote_histograms(project(other, P), clip=C, num_bins=B)
    l1 = (v - v2).abs().sum(-1)
    assert (l1 <= 2).all()
    assert ((v - v2).sum(-1) == 0).all()


def test_noise_reproducible_with_generator():
    votes = torch.randint(0, 50, (6, 5, B))
    a1, w1 = confident_gnmax(votes, threshold=30, sigma_threshold=10.0, sigma_gnmax=5.0, generator=_gen(7))
    a2, w2 = confident_gnmax(votes, threshold=30, sigma_threshold=10.0, sigma_gnmax=5.0, generator=_gen(7))
    assert torch.equal(a1, a2) and torch.equal(w1, w2)
    grads = torch.randn(8, 3, 16) * 1e-4
    kw = dict(k=4, clip=C, num_bins=B, threshold=4.0, sigma_threshold=2.0, sigma_gnmax=2.0)
    r1 = dp_grad_agg(grads, generator=_gen(11), **kw)
    r2 = dp_grad_agg(grads, generator=_gen(11), **kw)
    for x, y in zip(r1, r2):
        assert torch.equal(x, y)


def test_gnmax_noise_scale():
    # Two bins with a gap of g votes: P(second wins) = Φ̄(g / (√2 σ2)).
    sigma2, gap, n = 20.0, 20.0, 40000
    votes = torch.zeros(n, 2)
    votes[:, 0] = gap
    _, winner = confident_gnmax(votes, threshold=0.0, sigma_threshold=0.0, sigma_gnmax=sigma2, generator=_gen(5))
    p_emp = winner.double().mean().item()
    p_th = 0.5 * math.erfc(gap / (math.sqrt(2) * sigma2) / math.sqrt(2))
    assert abs(p_emp - p_th) < 4 * math.sqrt(p_th * (1 - p_th) / n)
    # Threshold noise: P(answered) = Φ̄((T - max h)/σ1)
    sigma1 = 15.0
    votes = torch.zeros(n, 3)
    votes[:, 1] = 50.0
    answered, _ = confident_gnmax(votes, threshold=60.0, sigma_threshold=sigma1, sigma_gnmax=0.0, generator=_gen(6))
    p_emp = answered.double().mean().item()
    p_th = 0.5 * math.erfc((60.0 - 50.0) / sigma1 / math.sqrt(2))
    assert abs(p_emp - p_th) < 4 * math.sqrt(p_th * (1 - p_th) / n)


def test_accountant_shapes_compatible():
    grads = torch.randn(7, 3, 9) * 1e-4
    _, votes, answered = dp_grad_agg(grads, k=2, clip=C, num_bins=B, threshold=3.5, sigma_threshold=1.0,
                                     sigma_gnmax=1.0, generator=_gen(0))
    assert votes.reshape(-1, B).shape == (6, B)
    assert answered.reshape(-1).dtype == torch.bool


def test_input_validation():
    with pytest.raises(ValueError):
        vote_histograms(torch.zeros(2, 3, 4), clip=0.0, num_bins=B)
    with pytest.raises(ValueError):
        project(torch.zeros(2, 3, 4), torch.zeros(3, 5, 2))


def test_abstaining_teachers_cast_no_vote():
    U = torch.tensor([[[0.5], [-0.5]], [[0.5], [0.5]], [[-0.5], [-0.5]]])  # [T=3, m=2, k=1]
    voting = torch.tensor([[True, False], [True, True], [False, True]])
    votes = vote_histograms(U, clip=1.0, num_bins=2, voting=voting)
    assert votes[:, 0].tolist() == [[0, 2], [1, 1]]  # sample 0: teachers 0, 1; sample 1: teachers 1, 2
    full = vote_histograms(U, clip=1.0, num_bins=2)
    assert full.sum(-1).eq(3).all()
    with pytest.raises(ValueError, match="voting"):
        vote_histograms(U, clip=1.0, num_bins=2, voting=voting[:2])
