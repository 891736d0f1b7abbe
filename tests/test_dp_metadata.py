"""Tabular metadata paid with DP: numeric bounds (``metadata_epsilon``) and the class ratio
(``label_ratio_epsilon``). The spec lists what was paid, never holds the raw empirical values of a paid
item, and a private model charges it at construction."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from datamodules import DataError, TabularDataModule, TabularTransformer
from lightning_gpate.models import PATEGAN
from lightning_gpate.models.private import PrivateMetadataError
from small_models import former  # the former defaults (the paper's) where a test is silent

DECLARED = {"smoker": {"categories": ["no", "yes"]}, "region": {"categories": ["east", "north", "south", "west"]},
            "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]}}
GUESSES = {"age": {"guess": [0, 120], "dtype": "int64"}, "income": {"guess": [0, 200_000]}, "visits": {"guess": [0, 50]}}


def dm_with(frame, **kw):
    return TabularDataModule(frame=frame, label="outcome", num_teachers=4, **kw)


def test_dp_bounds_replace_the_empirical_ones_and_are_listed_as_paid(mixed_frame):
    dm = dm_with(mixed_frame, schema={**DECLARED, **GUESSES}, metadata_epsilon=0.3, metadata_seed=0)
    spec = dm.spec
    assert spec["private_metadata"] == []
    cost = {c["columns"][0]: c["epsilon"] for c in spec["metadata_cost"]}
    assert cost == pytest.approx({"age": 0.1, "income": 0.1, "visits": 0.1})  # ε split equally
    columns = {c["name"]: c for c in spec["columns"]}
    text = json.dumps(spec)
    for name, (lo, hi) in {"age": (0, 120), "income": (0, 200_000), "visits": (0, 50)}.items():
        empirical = (float(mixed_frame[name].min()), float(mixed_frame[name].max()))
        dp = (columns[name]["min"], columns[name]["max"])
        assert lo <= dp[0] <= dp[1] <= hi
        if name != "visits":  # visits: 0..2, integer bounds rounded outwards may coincide
            assert dp != empirical
        assert repr(empirical[0]) not in text or name == "visits"
    assert columns["age"]["min"] == int(columns["age"]["min"])  # declared integer column: rounded outwards
    # the bounds are what the transform uses (values clipped to them, generator space within [-1, 1])
    x, _ = TabularTransformer.from_spec(spec).transform(mixed_frame)
    assert x.min() >= -1 and x.max() <= 1


def test_dp_bounds_enclose_the_data_inside_the_guess():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"v": rng.uniform(10, 20, 5000), "outcome": rng.choice([0, 1], 5000)})
    for seed in range(5):
        dm = TabularDataModule(frame=frame, label="outcome", schema={"v": {"guess": [-100, 100]},
                               "outcome": {"categories": [0, 1]}}, metadata_epsilon=1.0, metadata_seed=seed)
        v = dm.spec["columns"][0]
        # dp_bounds' 0- and 1-quantiles fall at or outside the data's range (rarely clipping it)
        assert -100 <= v["min"] <= frame["v"].min() + 0.01 and frame["v"].max() - 0.01 <= v["max"] <= 100


def test_fresh_noise_unless_seeded(mixed_frame):
    kw = dict(schema={**DECLARED, **GUESSES}, metadata_epsilon=0.3)
    bounds = [dm_with(mixed_frame, **kw).spec["columns"][1]["min"] for _ in range(2)]
    assert bounds[0] != bounds[1]  # OS entropy by default: nobody can replay the noise
    seeded = [dm_with(mixed_frame, metadata_seed=5, **kw).spec["columns"][1]["min"] for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_dp_label_ratio(mixed_frame):
    dm = dm_with(mixed_frame, schema={**DECLARED, **GUESSES}, metadata_epsilon=0.3, label_ratio_epsilon=0.05,
                 metadata_seed=0)
    spec = dm.spec
    assert spec["class_ratio_source"] == "dp"
    assert sum(spec["class_ratio"]) == pytest.approx(1.0)
    empirical = list(np.bincount(mixed_frame["outcome"]) / len(mixed_frame))
    assert spec["class_ratio"] != pytest.approx(empirical, abs=1e-9)
    paid = [c for c in spec["metadata_cost"] if "class ratio" in c["what"]]
    assert [c["epsilon"] for c in paid] == [0.05]


def test_private_model_charges_what_was_paid(mixed_frame):
    dm = dm_with(mixed_frame, schema={**DECLARED, **GUESSES}, metadata_epsilon=0.3, label_ratio_epsilon=0.05)
    model = former(PATEGAN, dm.spec, epsilon=1.0, lam=0.01)
    counts = model.accountant.counts
    assert counts["pure_dp_events"] == 4 and counts["pure_dp_epsilon"] == pytest.approx(0.35)
    assert model.accountant.epsilon() > 0.0
    with pytest.raises(ValueError, match="already costs"):
        former(PATEGAN, dm.spec, epsilon=0.3, lam=0.01)


def test_undeclared_metadata_stays_private_without_a_budget(mixed_frame):
    dm = dm_with(mixed_frame, schema={**DECLARED, **GUESSES})  # guesses alone pay for nothing
    assert set(dm.spec["private_metadata"]) == {"age", "income", "visits"}
    assert dm.spec["metadata_cost"] == []
    with pytest.raises(PrivateMetadataError):
        former(PATEGAN, dm.spec, epsilon=1.0, lam=0.01)


@pytest.mark.parametrize("kw, match", [
    (dict(schema={**DECLARED, "age": {"guess": [0, 120]}}, metadata_epsilon=0.1), r"\['income', 'visits'\] need a public guess"),
    (dict(schema=GUESSES, metadata_epsilon=0.1), "declare the categories"),
    (dict(schema={**DECLARED, **GUESSES, "smoker": {"guess": [0, 1], "categories": ["no", "yes"]}}, metadata_epsilon=0.1),
     "not numeric feature columns"),
    (dict(schema={**DECLARED, "age": {"guess": [5, 1]}}, metadata_epsilon=0.1), "lo < hi"),
    (dict(schema={**DECLARED, "age": {"guess": "wide"}}, metadata_epsilon=0.1), r"guess must be \[lo, hi\]"),
    (dict(schema={**DECLARED, **GUESSES}, metadata_epsilon=0.0), "metadata_epsilon must be"),
    (dict(schema=DECLARED, class_ratio=[0.5, 0.5], label_ratio_epsilon=0.1), "not both"),
    (dict(schema=DECLARED, label_ratio_epsilon=-1.0), "label_ratio_epsilon must be"),
])
def test_bad_metadata_options_are_clear_errors(mixed_frame, kw, match):
    with pytest.raises(DataError, match=match):
        dm_with(mixed_frame, **kw)
