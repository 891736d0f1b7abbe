"""PATE-GAN's learning levers on tables: teachers and student judge generated rows as they are released
(binary at ±1, categories one-hot, straight-through gradients), and the student may learn the noisy
share of "real" votes, which the guarantee already pays for. Neither changes what is charged."""

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules import TabularDataModule
from lightning_gpate.models import PATEGAN
from test_pategan import SMALL, fit, id_datamodule
from small_models import former  # the former defaults (the paper's) where a test is silent


def _mixed_datamodule(n=64, teachers=4):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(0, 1, n).round(3), "b": rng.choice([0, 1], n),
                          "colour": rng.choice(["red", "green", "blue"], n), "y": rng.choice([0, 1], n)})
    schema = {"x": {"min": -4, "max": 4}, "b": {"type": "binary", "categories": [0, 1]},
              "colour": {"categories": ["blue", "green", "red"]}, "y": {"type": "binary", "categories": [0, 1]}}
    return TabularDataModule(frame=frame, label="y", schema=schema, num_teachers=teachers, class_ratio=[0.5, 0.5],
                             teacher_batch_size=4, test_fraction=0.0)


def test_discrete_samples_are_released_rows_with_straight_through_gradients():
    dm = _mixed_datamodule()
    model = former(PATEGAN, dm.spec, epsilon=10.0, lam=0.5, discrete_samples=True, **SMALL)
    y = torch.tensor([0, 1] * 8)
    torch.manual_seed(0)
    soft = model.generator(model.latent(16), y)
    torch.manual_seed(0)
    x = model._fakes(y, grad=True)
    (start_x, _, _), (start_b, _, _), (start_c, end_c, _) = dm.spec["spans"]
    assert set(x[:, start_b].tolist()) <= {-1.0, 1.0}  # binary: the sign, as sampling decodes it
    assert torch.equal(x[:, start_b], torch.where(soft[:, start_b] >= 0, 1.0, -1.0))
    block = x[:, start_c:end_c]
    assert torch.equal(block.sum(1), torch.ones(16)) and set(block.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(block.argmax(1), soft[:, start_c:end_c].argmax(1))
    assert torch.allclose(x[:, start_x], soft[:, start_x])  # numeric columns unchanged
    # a released row decodes to the same values as the soft output it came from
    pd.testing.assert_frame_equal(dm.transformer.inverse_transform(x.detach().numpy(), y.numpy()),
                                  dm.transformer.inverse_transform(soft.detach().numpy(), y.numpy()))
    x.sum().backward()  # straight-through: the generator still gets gradients through the hard values
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.generator.parameters() if p.requires_grad)
    # what the teachers train on and vote on is the released form too
    model_hard_votes = []
    original = model.teachers.forward_shared
    model.teachers.forward_shared = lambda x, y: model_hard_votes.append(x.detach()) or original(x, y)
    fit(model, dm, steps=2)
    for seen in model_hard_votes:
        assert set(seen[:, start_b].tolist()) <= {-1.0, 1.0}


def test_share_labels_are_the_noisy_vote_share_at_the_same_price():
    dm = id_datamodule(teachers=4)
    share = former(PATEGAN, dm.spec, epsilon=1e9, lam=1e6, student_labels="share", **SMALL)  # λ = 1e6: noise ~1e-6 votes
    counts = torch.tensor([[4.0, 0.0], [3.0, 1.0], [1.0, 3.0], [0.0, 4.0]], dtype=torch.float64)
    np.testing.assert_allclose(share.noisy_labels(counts).numpy(), [0.0, 0.25, 0.75, 1.0], atol=1e-5)
    # with noise: 1/2 + (ñ1 − ñ0)/(2T), clipped; its mean over many draws is the vote share (no clipping at 2 of 4)
    noisy = former(PATEGAN, dm.spec, epsilon=10.0, lam=2.0, student_labels="share", **SMALL)
    draws = noisy.noisy_labels(torch.tensor([[2.0, 2.0]], dtype=torch.float64).expand(100_000, 2))
    assert float(draws.mean()) == pytest.approx(0.5, abs=0.005) and 0.0 <= float(draws.min()) < float(draws.max()) <= 1.0
    # the same queries are charged whatever the student learns from them
    spent = {}
    for labels in ("argmax", "share"):
        model = former(PATEGAN, id_datamodule(teachers=4).spec, epsilon=10.0, lam=0.5, student_labels=labels, **SMALL)
        fit(model, id_datamodule(teachers=4), steps=3)
        spent[labels] = (model.accountant.counts["laplace_vote_queries"], model.spent_epsilon())
    assert spent["argmax"] == spent["share"]
    with pytest.raises(ValueError, match="guarantee"):
        former(PATEGAN, dm.spec, epsilon=10.0, lam=0.5, student_labels="share", budget_accounting="paper", **SMALL)
    with pytest.raises(ValueError, match="student.labels"):
        former(PATEGAN, dm.spec, epsilon=10.0, lam=0.5, student_labels="soft", **SMALL)
