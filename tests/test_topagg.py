"""DataLens' TopAgg (Wang, Wu, Long et al., CCS 2021): top-k stochastic signs, summed votes, noisy thresholded release."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_gpate.privacy.topagg import sign_uniforms, topagg_release, topagg_votes, topk_stochastic_signs


def test_topk_stochastic_signs_hand_built():
    # one teacher, one sample: |g| order is coordinate 1 (1.0), 0 (0.5), 2 (0.1), 3 (0)
    g = torch.tensor([[[0.5, -1.0, 0.1, 0.0]]])
    index, sign = topk_stochastic_signs(g, 2, torch.tensor([[[0.7, 0.2]]]))
    assert index.tolist() == [[[1, 0]]]
    # b = 1: P(+1) = 1/2 + g/2 → coordinate 1: 0 (always −1); coordinate 0: 0.75 (u = 0.2 < 0.75: +1)
    assert sign.tolist() == [[[-1, 1]]]
    _, sign = topk_stochastic_signs(g, 2, torch.tensor([[[0.0, 0.8]]]))
    assert sign.tolist() == [[[-1, -1]]]  # u = 0.8 >= 0.75: −1
    # max_grad caps b: b = 0.25 makes P(+1) of coordinate 0 = 1/2 + 0.5/0.5 → clamped to 1
    _, sign = topk_stochastic_signs(g, 2, torch.tensor([[[0.0, 0.999]]]), max_grad=0.25)
    assert sign.tolist() == [[[-1, 1]]]


def test_stochastic_signs_are_unbiased_estimates_of_g_over_b():
    g = torch.tensor([0.8, -0.4, 0.2, -1.0]).expand(20000, 1, 4).contiguous()  # many teachers, same direction
    u = sign_uniforms(20000, 1, 4, generator=torch.Generator().manual_seed(0))
    index, sign = topk_stochastic_signs(g, 4, u)
    votes = topagg_votes(index, sign, 4)[0].double() / 20000
    torch.testing.assert_close(votes, torch.tensor([0.8, -0.4, 0.2, -1.0], dtype=torch.float64), atol=0.02, rtol=0)


def test_votes_sum_over_teachers_and_chunks_add():
    g = torch.randn(6, 3, 10, generator=torch.Generator().manual_seed(1))
    u = sign_uniforms(6, 3, 4, generator=torch.Generator().manual_seed(2))
    index, sign = topk_stochastic_signs(g, 4, u)
    votes = topagg_votes(index, sign, 10)
    dense = torch.zeros(6, 3, 10, dtype=torch.long).scatter_(2, index, sign.long())
    assert torch.equal(votes, dense.sum(0))
    assert (dense != 0).sum(-1).eq(4).all()  # exactly k non-zero votes per teacher and sample
    halves = topagg_votes(*topk_stochastic_signs(g[:2], 4, u[:2]), 10) + topagg_votes(*topk_stochastic_signs(g[2:], 4, u[2:]), 10)
    assert torch.equal(halves, votes)


def test_one_teacher_moves_the_votes_by_at_most_two_sqrt_k():
    gen = torch.Generator().manual_seed(3)
    k, d = 5, 12
    worst = 0.0
    for _ in range(200):
        g = torch.randn(4, 1, d, generator=gen)
        other = g.clone()
        other[2] = torch.randn(1, d, generator=gen)  # teacher 2's data changed
        u = sign_uniforms(4, 1, k, generator=gen)
        u_other = u.clone()
        u_other[2] = torch.rand(1, k, generator=gen)  # teacher 2's own randomness may differ too
        a = topagg_votes(*topk_stochastic_signs(g, k, u), d)
        b = topagg_votes(*topk_stochastic_signs(other, k, u_other), d)
        worst = max(worst, float((a - b).double().norm()))
    assert worst <= 2 * math.sqrt(k) + 1e-9
    # the bound is attained: same support, every sign flipped
    g = torch.tensor([[[2.0, 2.0, 0.0]]])  # |g| = b on the support: sure signs
    a = topagg_votes(*topk_stochastic_signs(g, 2, torch.zeros(1, 1, 2)), 3)
    b = topagg_votes(*topk_stochastic_signs(-g, 2, torch.zeros(1, 1, 2)), 3)
    assert float((a - b).double().norm()) == pytest.approx(2 * math.sqrt(2))


def test_release_on_hand_built_votes():
    votes = torch.tensor([[5, -3, 0, 1, -2]])
    # negligible noise: coordinates with |v| > 2.5 released as their sign, the others 0
    out = topagg_release(votes, threshold=2.5, sigma=1e-9, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[1.0, -1.0, 0.0, 0.0, 0.0]]
    assert out.dtype == torch.float32
    # real noise: the release is sign(v + σ·z) above the threshold, with z the generator's float64 normals
    gen, ref = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    out = topagg_release(votes, threshold=2.0, sigma=3.0, generator=gen)
    noisy = votes.double() + 3.0 * torch.randn(votes.shape, generator=ref, dtype=torch.float64)
    expected = [[(1.0 if v > 2 else -1.0 if v < -2 else 0.0) for v in row] for row in noisy.tolist()]
    assert out.tolist() == expected


def test_input_validation():
    g = torch.zeros(1, 1, 4)
    with pytest.raises(ValueError, match="topk"):
        topk_stochastic_signs(g, 5, torch.zeros(1, 1, 5))
    with pytest.raises(ValueError, match="uniforms"):
        topk_stochastic_signs(g, 2, torch.zeros(1, 1, 3))
    with pytest.raises(ValueError, match="max_grad"):
        topk_stochastic_signs(g, 2, torch.zeros(1, 1, 2), max_grad=0.0)
    with pytest.raises(ValueError, match="sigma"):
        topagg_release(torch.zeros(1, 4, dtype=torch.long), threshold=1.0, sigma=0.0)
    # an all-zero direction votes fair coins, never NaN
    _, sign = topk_stochastic_signs(g, 2, torch.tensor([[[0.3, 0.7]]]))
    assert sign.tolist() == [[[1, -1]]]


def test_abstaining_teachers_vote_zero():
    g = torch.tensor([[[1.0, -2.0]], [[3.0, 1.0]]])  # [T=2, m=1, d=2], sure signs with u = 0.5? b = max|g|
    index, sign = topk_stochastic_signs(g, 1, torch.full((2, 1, 1), 0.5))
    assert topagg_votes(index, sign, 2).tolist() == [[1, -1]]
    assert topagg_votes(index, sign, 2, voting=torch.tensor([[False], [True]])).tolist() == [[1, 0]]


def test_plain_signs_without_stochastic_rounding():
    g = torch.tensor([[[0.5, -1.0, 0.1, 0.0]]])
    index, sign = topk_stochastic_signs(g, 3, None)
    assert index.tolist() == [[[1, 0, 2]]] and sign.tolist() == [[[-1, 1, 1]]]
