"""Private quantile bins: OpenDP's exponential-mechanism quantile against an independent computation of its
law and its ε; the bins depend on the data only through the release (a spy); the piecewise transform is exact
and integer columns come back integral; a skewed column survives a MarginalTree fit and ``sample``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from datamodules import DataError, TabularDataModule, TabularTransformer
from lightning_gpate.privacy import quantiles as dp_quantiles
from lightning_gpate.privacy.accountant import ExponentialMechanismEvent, PrivacyAccountant, PureDPEvent
from lightning_gpate.privacy.dp_stats import metadata_events


def smith_probabilities(data: np.ndarray, candidates: np.ndarray, alpha: float, scale: float) -> np.ndarray:
    """The exponential mechanism on a grid (Smith 2011), written from its definition: candidate ``c`` with probability
    ∝ exp(−|#(x < c) − α·(n − #(x = c))| / scale)."""
    n = len(data)
    scores = np.array([abs(np.sum(data < c) - alpha * (n - np.sum(data == c))) for c in candidates])
    weights = np.exp(-(scores - scores.min()) / scale)
    return weights / weights.sum()


def test_opendp_quantile_draws_the_exponential_mechanism_and_its_epsilon_holds_on_neighbours():
    data = np.array([1.0, 2.0, 2.0, 3.0, 5.0, 8.0, 9.0, 9.5])
    candidates = np.array([0.5, 1.5, 2.0, 2.5, 4.0, 6.0, 8.5, 10.0])
    epsilon, alpha = 1.5, 0.75
    draws = np.concatenate([dp_quantiles.private_quantiles(data, candidates, [alpha] * 500, epsilon=epsilon)
                            for _ in range(6)])
    scale = 2 * max(alpha, 1 - alpha) / epsilon * 1.001
    law = smith_probabilities(data, candidates, alpha, scale)
    seen = np.array([np.mean(draws == c) for c in candidates])
    assert 0.5 * np.abs(seen - law).sum() < 0.05  # 3,000 draws: the TV distance of their histogram is ~0.02
    # ε, independently: the largest log ratio of the law on a dataset and a neighbour (one record added or removed,
    # at every place), and its range (bounded range: what the zCDP conversion ε²/8 assumes)
    worst_ratio = worst_range = 0.0
    neighbours = [np.delete(data, i) for i in range(len(data))] + [np.sort(np.append(data, v)) for v in [0.0, 2.0, 4.0, 9.0, 11.0]]
    for other in neighbours:
        log_ratio = np.log(law) - np.log(smith_probabilities(other, candidates, alpha, scale))
        worst_ratio = max(worst_ratio, np.abs(log_ratio).max())
        worst_range = max(worst_range, log_ratio.max() - log_ratio.min())
    assert worst_ratio <= epsilon and worst_range <= epsilon
    assert worst_range > 0.9 * epsilon  # the bound is nearly reached: no ε is thrown away


def test_the_release_is_charged_as_bounded_range_events_within_its_epsilon():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.lognormal(3, 1, 3000), "b": rng.normal(0, 1, 3000), "y": rng.integers(0, 2, 3000)})
    schema = {"a": {"min": 0, "max": 1e4}, "b": {"min": -10, "max": 10}, "y": {"categories": [0, 1]}}
    eps_q = 0.4
    dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], quantile_epsilon=eps_q)
    costs = dm.spec["metadata_cost"]
    events = metadata_events(costs)
    count = [e for e in events if isinstance(e, PureDPEvent)]
    selections = [e for e in events if isinstance(e, ExponentialMechanismEvent)]
    assert len(count) == 1 and len(selections) == costs[1]["events"] and len(selections) % 2 == 0  # 2 columns alike
    assert len(selections) == 2 * 7  # 3,000 rows, about 2,400 of them training rows, at this budget: 7 quantiles a column (8 bins)
    # their zCDP costs add up to the release's eps_q²/8: the count eps²/2, each selection eps²/8
    rho = count[0].epsilon ** 2 / 2 + sum(e.epsilon ** 2 / 8 for e in selections)
    assert rho == pytest.approx(eps_q ** 2 / 8, rel=1e-9)
    # the accountant charges them at the RDP of bounded range, min(ε, λε²/8) each, and λε²/2 for the Laplace count
    accountant = PrivacyAccountant(delta=1e-5)
    for event in events:
        accountant.record(event)
    ours = accountant.rdp
    lam = np.asarray(accountant.orders, dtype=np.float64)
    each = selections[0].epsilon
    expected_selections = len(selections) * np.minimum(each, lam * each ** 2 / 8)
    assert np.all(ours >= expected_selections - 1e-12)
    # the columns' edges: private, released, within the declared bounds; fewer bins than candidates
    for column in dm.spec["columns"]:
        assert column["edges_source"] == "dp_quantiles" and column["min"] <= column["edges"][0] < column["edges"][-1] <= column["max"]
    assert "a" not in dm.spec["private_metadata"]


def test_the_bins_depend_on_the_data_only_through_the_release(monkeypatch):
    """A spy in place of the two mechanisms that read the data (the noisy count and the quantile draws): two tables that
    share nothing but their schema get the same spec when the mechanisms answer the same."""
    calls = []

    def fake_quantiles(values, candidates, levels, *, epsilon):
        calls.append(len(values))
        return np.quantile(candidates, np.asarray(levels))  # a function of public inputs only

    monkeypatch.setattr(dp_quantiles, "private_quantiles", fake_quantiles)
    monkeypatch.setattr(dp_quantiles, "noisy_count", lambda n, *, epsilon, rng: 5000.0)
    schema = {"a": {"min": 0, "max": 1e4}, "k": {"min": 0, "max": 30, "dtype": "int64"}, "y": {"categories": [0, 1]}}
    specs = []
    for seed, n in ((1, 400), (2, 900)):
        rng = np.random.default_rng(seed)
        frame = pd.DataFrame({"a": rng.lognormal(seed, 2, n), "k": rng.integers(0, 30, n), "y": rng.integers(0, 2, n)})
        specs.append(TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], quantile_epsilon=0.5).spec)
    assert specs[0]["columns"] == specs[1]["columns"] and specs[0]["metadata_cost"] == specs[1]["metadata_cost"]
    assert calls and all(isinstance(c, int) for c in calls)


def test_the_dp_metadata_reads_the_training_rows_only(monkeypatch):
    """Spies on every mechanism that reads the rows (the bounds, the row count, the quantiles, the class ratio): each
    sees the training split's rows, never the held-out ones; and the split itself is the one the same table gets
    without DP metadata, whatever the noise drew."""
    from datamodules import tabular

    seen = {}

    def spy(name, mechanism):
        def wrapped(values, *args, **kwargs):
            seen.setdefault(name, []).append(np.sort(np.asarray(values, dtype=np.float64)) if np.ndim(values) else values)
            return mechanism(values, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(dp_quantiles, "private_quantiles", spy("quantiles", dp_quantiles.private_quantiles))
    monkeypatch.setattr(dp_quantiles, "noisy_count", spy("count", dp_quantiles.noisy_count))
    monkeypatch.setattr(tabular, "dp_bounds", spy("bounds", tabular.dp_bounds))
    monkeypatch.setattr(tabular, "dp_histogram_ratio", spy("ratio", tabular.dp_histogram_ratio))
    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"a": rng.lognormal(3, 1, 3000), "b": rng.normal(50, 10, 3000), "y": rng.integers(0, 2, 3000)})
    schema = {"a": {"min": 0, "max": 1e4}, "b": {"guess": [0, 100]}, "y": {"categories": [0, 1]}}
    options = dict(frame=frame, label="y", schema=schema, val_fraction=0.2, test_fraction=0.2, split_seed=3)
    dm = TabularDataModule(**options, metadata_epsilon=1.0, label_ratio_epsilon=0.5, quantile_epsilon=1.0)
    train = dm.split_frame("train")
    assert 0.5 < len(train) / len(frame) < 0.7  # val and test held out
    assert seen["count"] == [len(train)]
    assert len(seen["bounds"]) == 1 and np.array_equal(seen["bounds"][0], np.sort(train["b"].to_numpy()))
    assert np.array_equal(seen["quantiles"][0], np.sort(np.clip(train["a"].to_numpy(), 0, 1e4)))
    b = dm.spec["columns"][1]
    assert np.array_equal(seen["quantiles"][-1], np.sort(np.clip(train["b"].to_numpy(), b["min"], b["max"])))
    assert np.array_equal(seen["ratio"][0], np.sort(train["y"].to_numpy()))
    # the split: the same rows under every draw of the noise, and those of the same table binned on its declared bounds
    declared = dict(options, schema={**schema, "b": {"min": 0, "max": 100}}, class_ratio=[1, 1])
    splits = [TabularDataModule(**declared, quantile_epsilon=q).split_indices for q in (1.0, 1.0, 0.0)]
    for split in ("train", "val", "test"):
        assert splits[0][split].tolist() == splits[1][split].tolist() == splits[2][split].tolist()
    # resumed on its released spec: the same split; a spec written before keeps splitting on its released features
    from datamodules.partition import record_keys

    for released in (dm.spec, {k: v for k, v in dm.spec.items() if k != "split_keys"}):
        resumed = TabularDataModule(**options, metadata_epsilon=1.0, label_ratio_epsilon=0.5, quantile_epsilon=1.0)
        assert resumed.adopt_released_spec(released)
        if "split_keys" in released:
            assert resumed.split_indices["test"].tolist() == dm.split_indices["test"].tolist()
        else:
            features, labels = resumed.transformer.transform(frame)
            keys = record_keys(features.astype(np.float32), labels)
            assert resumed.split_indices["test"].tolist() == resumed.split_rows(keys)["test"].tolist()


def test_the_piecewise_transform_is_exact_and_integer_columns_come_back_integral():
    from datamodules.tabular import ColumnSpec

    income = ColumnSpec("income", "numeric", "float64", min=0.0, max=1e6, public=True)
    income.set_edges([10.0, 100.0, 1000.0, 5000.0, 1e5], 0.0, 50.0, source="dp_quantiles")
    kids = ColumnSpec("kids", "numeric", "int64", min=0.0, max=20.0, public=True)
    kids.set_edges([-0.5, 0.5, 1.5, 3.5, 8.5], 0.0, 1.0, source="dp_quantiles")
    label = ColumnSpec("y", "binary", "int64", categories=[0, 1], public=True)
    t = TabularTransformer([income, kids], label, ["income", "kids", "y"])
    frame = pd.DataFrame({"income": [10.0, 55.5, 100.0, 4999.0, 99_999.0], "kids": [0, 1, 2, 5, 8], "y": [0, 1, 0, 1, 0]})
    x, y = t.transform(frame)
    assert x[:, 0].tolist()[0] == -1.0 and x[2, 0] == pytest.approx(-0.5)  # the edges at the bins' ends
    assert np.all(np.diff(x[:, 0]) > 0) and np.all(np.abs(x) <= 1)
    back = t.inverse_transform(x, y)
    assert np.allclose(back["income"], frame["income"]) and back["kids"].tolist() == frame["kids"].tolist()
    # any point of the generator's space decodes to an integer of the bin it lies in
    grid = np.linspace(-1, 1, 401)
    decoded = t.inverse_transform(np.stack([grid, grid], 1), np.zeros(401, dtype=np.int64))["kids"]
    assert decoded.dtype == np.int64 and decoded.between(0, 8).all()
    bins = np.clip(np.floor((grid + 1) / 2 * 4), 0, 3).astype(int)
    assert all(kids.edges[b] < v < kids.edges[b + 1] for b, v in zip(bins, decoded))
    # a value beyond the outer edges is clipped onto them; beyond the declared bounds: a console warning too
    with pytest.warns(UserWarning, match=r"column 'income': values outside its declared bounds \[0, 1e\+06\] were clipped"):
        x, _ = t.transform(pd.DataFrame({"income": [5.0, 2e6], "kids": [0, 30], "y": [0, 0]}))
    assert x[:, 0].tolist() == [-1.0, 1.0]


def test_a_spec_written_before_edges_decodes_as_it_did():
    old = {"columns": [{"name": "age", "type": "numeric", "dtype": "int64", "min": 10.0, "max": 90.0, "categories": [], "public": True}],
           "label": {"name": "y", "type": "binary", "dtype": "int64", "min": None, "max": None, "categories": [0, 1], "public": True},
           "column_order": ["age", "y"]}
    t = TabularTransformer.from_spec(old)
    x = np.array([[-1.0], [-0.33], [0.2], [1.0]])
    expected = np.round((x[:, 0] + 1) / 2 * 80 + 10)
    assert t.inverse_transform(x, np.zeros(4, dtype=np.int64))["age"].tolist() == expected.tolist()


def test_declared_bins_and_log_scale_are_public_and_cost_nothing():
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"a": rng.lognormal(3, 1, 300), "b": rng.uniform(1, 1000, 300), "y": rng.integers(0, 2, 300)})
    schema = {"a": {"bins": [0, 10, 20, 50, 100, 1000]}, "b": {"min": 1, "max": 1000, "scale": "log"}, "y": {"categories": [0, 1]}}
    dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], quantile_epsilon=0.3)
    a, b = dm.spec["columns"]
    assert a["edges"] == [0, 10, 20, 50, 100, 1000] and a["edges_source"] == "declared" and (a["min"], a["max"]) == (0, 1000)
    assert b["edges_source"] == "log" and len(b["edges"]) == 11 and b["edges"][1] - b["edges"][0] < b["edges"][-1] - b["edges"][-2]
    assert dm.spec["metadata_cost"] == []  # every numeric column has declared bins: nothing to release
    with pytest.raises(DataError, match="bins must be at least two finite, strictly increasing edges"):
        TabularDataModule(frame=frame, label="y", schema={**schema, "a": {"bins": [0, 10, 5]}}, class_ratio=[0.5, 0.5])
    with pytest.raises(DataError, match="scale must be one of"):
        TabularDataModule(frame=frame, label="y", schema={**schema, "b": {"min": 1, "max": 1000, "scale": "sqrt"}}, class_ratio=[0.5, 0.5])


def test_a_lognormal_column_survives_a_fit_and_sample():
    """MarginalTree at ε = 1 with the default share of its budget on quantile edges: the median of a log-normal
    column declared on a range 100 times wider than its data within 1.5x, integer columns integral."""
    import pytorch_lightning as pl

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import MarginalTree

    rng = np.random.default_rng(0)
    n = 4000
    y = rng.integers(0, 2, n)
    frame = pd.DataFrame({"popul": np.round(rng.lognormal(3 + y, 1.8, n)).clip(0, 10_000).astype(int),
                          "income": rng.lognormal(9, 1, n), "kids": rng.poisson(1 + y, n).clip(0, 10), "y": y})
    schema = {"popul": {"min": 0, "max": 10_000, "dtype": "int64"}, "income": {"min": 0, "max": 1e6},
              "kids": {"min": 0, "max": 20, "dtype": "int64"}, "y": {"categories": [0, 1]}}
    dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5],
                           quantile_epsilon=dp_quantiles.default_quantile_epsilon(1.0, 1e-5))
    model = MarginalTree(dm.spec, epsilon=1.0, delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False, accelerator="cpu").fit(model, datamodule=dm)
    assert model.guarantee_epsilon() <= 1.0 + 1e-9
    assert model.accountant.counts["exponential_mechanism_events"] >= len(dm.spec["metadata_cost"][1]["columns"])
    synthetic = synthetic_table(model, 3000, seed=0)
    for name in ("popul", "income"):
        ratio = synthetic[name].median() / frame[name].median()
        assert 1 / 1.5 <= ratio <= 1.5, (name, frame[name].median(), synthetic[name].median())
    assert synthetic["popul"].dtype == np.int64 and synthetic["kids"].dtype == np.int64
    assert synthetic["kids"].between(0, 20).all()


def test_the_command_line_gives_a_private_models_table_its_quantile_bins(tmp_path):
    """``lightning-gpate fit`` with a config that leaves ``data.quantile_epsilon`` unset: a share of the model's budget
    buys the bins, charged in its accountant; ``quantile_epsilon: 0`` keeps the declared range's bins."""
    import yaml

    from lightning_gpate.cli import run_lightning_cli
    from small_models import SCHEMA, public_frame

    # 1,000 rows: the noisy row count sizes the bins, and near 300 rows it asks for none in about 1 draw of 30
    public_frame(1000).to_csv(tmp_path / "t.csv", index=False)
    config = {"trainer": {"max_steps": 1, "accelerator": "cpu", "devices": 1, "logger": False},
              "model": {"class_path": "lightning_gpate.models.MarginalTree", "init_args": {"epsilon": 1.0, "delta": 1e-5}},
              "data": {"class_path": "datamodules.TabularDataModule",
                       "init_args": {"path": str(tmp_path / "t.csv"), "label": "y", "schema": SCHEMA}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cli = run_lightning_cli(["--config", str(tmp_path / "c.yaml")], run=False)
    assert cli.datamodule.quantile_epsilon == pytest.approx(dp_quantiles.default_quantile_epsilon(1.0, 1e-5))
    sources = {c["name"]: c["edges_source"] for c in cli.model.data_spec["columns"] if c["type"] == "numeric"}
    assert sources == {"a": "dp_quantiles", "b": "dp_quantiles", "c": "integers"}  # c: the integers 0-9, one bin each
    assert cli.model.accountant.counts["exponential_mechanism_events"] == cli.datamodule.spec["metadata_cost"][1]["events"]
    cli = run_lightning_cli(["--config", str(tmp_path / "c.yaml"), "--data.init_args.quantile_epsilon", "0"], run=False)
    assert cli.model.data_spec["metadata_cost"] == [] and cli.model.data_spec["columns"][0]["edges"] is None


def test_a_budget_too_small_for_informative_quantiles_keeps_the_declared_ranges_and_its_share():
    """Breast-cancer-sized (455 rows, 30 numeric columns) at a tiny ε: no quantile would follow the data more than the
    public grid, so the columns keep their declared ranges' bins and only the count is charged."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    schema = {c: {"min": 0, "max": 5000} for c in frame.columns if c != "target"}
    dm = TabularDataModule(frame=frame, label="target", schema={**schema, "target": {"categories": [0, 1]}}, class_ratio=[0.5, 0.5],
                           quantile_epsilon=0.05)
    assert [c["what"] for c in dm.spec["metadata_cost"]] == ["row count sizing the quantile bins (Laplace)"]
    assert all(c["edges"] is None for c in dm.spec["columns"])
    assert dp_quantiles.quantiles_per_column(569, 0.05, 30) == 0 < dp_quantiles.quantiles_per_column(569, 5.0, 30)


def test_a_column_of_declared_values_comes_back_on_them_and_costs_nothing():
    """Codes stored as numbers (an age band 17.5, 22, …) declared with ``values``: one bin each, public (no quantile is
    bought for them), every generated value one of them, and the original values exact through the transform."""
    import pytorch_lightning as pl

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import MarginalTree

    bands = [17.5, 22.0, 27.0, 32.0, 37.0, 42.0]
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 2000)
    frame = pd.DataFrame({"age": rng.choice(bands, 2000, p=[0.05, 0.3, 0.25, 0.2, 0.1, 0.1]), "y": y})
    schema = {"age": {"min": 15, "max": 45, "values": bands}, "y": {"categories": [0, 1]}}
    dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], quantile_epsilon=0.3)
    age = dm.spec["columns"][0]
    assert dm.spec["metadata_cost"] == [] and age["edges_source"] == "values" and age["values"] == bands
    assert (age["min"], age["max"]) == (15, 45) and len(age["edges"]) == len(bands) + 1
    x, labels = dm.transformer.transform(frame)
    assert dm.transformer.inverse_transform(x, labels)["age"].tolist() == frame["age"].tolist()
    grid = np.linspace(-1, 1, 301)[:, None]
    assert set(dm.transformer.inverse_transform(grid, np.zeros(301, dtype=np.int64))["age"]) == set(bands)
    with pytest.warns(UserWarning, match="not among its declared values were moved to the nearest one"):
        x, _ = dm.transformer.transform(pd.DataFrame({"age": [19.0, 42.0], "y": [0, 1]}))
    assert dm.transformer.inverse_transform(x, np.zeros(2, dtype=np.int64))["age"].tolist() == [17.5, 42.0]
    model = MarginalTree(dm.spec, epsilon=1.0, delta=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False, accelerator="cpu").fit(model, datamodule=dm)
    synthetic = synthetic_table(model, 2000, seed=0)
    assert set(synthetic["age"]) <= set(bands) and synthetic["age"].nunique() >= 4
    for bad, message in (({"min": 15, "max": 45, "values": bands, "bins": [15, 30, 45]}, "declare values, or bins"),
                         ({"min": 20, "max": 45, "values": bands}, "reach beyond its bounds"),
                         ({"categories": bands, "values": bands}, "are for numeric columns"),
                         ({"values": [22, 17.5]}, "values must be at least two finite, strictly increasing numbers")):
        with pytest.raises(DataError, match=message):
            TabularDataModule(frame=frame, label="y", schema={**schema, "age": bad}, class_ratio=[0.5, 0.5])


def test_rows_on_a_declared_bound_come_back_on_it():
    """Half the rows are zeros and a sixth sit on the cap: the quantiles released on the two bounds give each bound a bin
    of its own, one candidate wide, and those bins decode to the bound itself (not spread over the values beside it);
    the other rows decode where they were."""
    from datamodules.tabular import ColumnSpec

    rng = np.random.default_rng(5)
    n = 4000
    share = np.where(rng.random(n) < 0.5, 0.0, np.where(rng.random(n) < 0.35, 1.0, rng.uniform(0.05, 0.95, n)))
    released = dp_quantiles.quantile_edges(share, lower=0.0, upper=1.0, integer=False, num_bins=10, epsilon=1.0)
    edges, candidates = released["edges"], dp_quantiles.candidate_grid(0.0, 1.0, integer=False)
    assert released["point_masses"] == [[0, 0.0], [len(edges) - 2, 1.0]]
    assert (edges[0], edges[1], edges[-2], edges[-1]) == (0.0, candidates[1], candidates[-2], 1.0)
    column = ColumnSpec("share", "numeric", "float64", min=0.0, max=1.0, public=True)
    column.set_edges(edges, released["offset"], released["scale"], source="dp_quantiles")
    column.point_masses = released["point_masses"]
    label = ColumnSpec("y", "binary", "int64", categories=[0, 1], public=True)
    t = TabularTransformer([column], label, ["share", "y"])
    x, y = t.transform(pd.DataFrame({"share": share, "y": np.zeros(n, dtype=np.int64)}))
    back = t.inverse_transform(x, y)["share"].to_numpy()
    np.testing.assert_allclose(back, share)
    grid = np.linspace(-1, 1, 2001)[:, None]
    decoded = t.inverse_transform(grid, np.zeros(len(grid), dtype=np.int64))["share"].to_numpy()
    first, last = grid[:, 0] < -1 + 2 / (len(edges) - 1), grid[:, 0] >= 1 - 2 / (len(edges) - 1)
    assert (decoded[first] == 0.0).all() and (decoded[last] == 1.0).all()
    assert ((decoded > 0) & (decoded < 1)).sum() == (~first & ~last).sum()
    # quantiles released off the bounds keep the bins they had (the draws are OpenDP's secret noise: post-processing
    # alone is deterministic)
    inner = np.array([candidates[5], candidates[200], candidates[-3]])
    kept, masses = dp_quantiles.bound_masses(inner, candidates, np.array([0.0, *inner, 1.0]))
    assert masses == [] and kept.tolist() == [0.0, *inner.tolist(), 1.0]


def test_an_integer_column_of_a_short_range_buys_no_quantile_and_leaves_the_budget_to_the_others(monkeypatch):
    """A 0–6 code (dtype integer) gets one public bin per integer: it keeps exactly those bins, every value coming back as
    itself, and the release buys quantiles for the skewed column only,
    at the ε that one column's share gives each (computed here from the release's rule, not read from it)."""
    monkeypatch.setattr(dp_quantiles, "noisy_count", lambda n, *, epsilon, rng: 2000.0)  # the count's noise aside
    rng = np.random.default_rng(6)
    n = 2500
    frame = pd.DataFrame({"popul": rng.lognormal(3, 2, n).clip(0, 1e4), "pid": rng.integers(0, 7, n), "y": rng.integers(0, 2, n)})
    schema = {"popul": {"min": 0, "max": 1e4}, "pid": {"min": 0, "max": 6, "dtype": "int64"}, "y": {"categories": [0, 1]}}
    eps_q = 0.3
    dm = TabularDataModule(frame=frame, label="y", schema=schema, class_ratio=[0.5, 0.5], quantile_epsilon=eps_q)
    popul, pid = dm.spec["columns"]
    assert pid["edges"] == [k - 0.5 for k in range(8)] and pid["edges_source"] == "integers"
    assert popul["edges_source"] == "dp_quantiles"
    x, labels = dm.transformer.transform(frame)
    assert dm.transformer.inverse_transform(x, labels)["pid"].tolist() == frame["pid"].tolist()
    # one column's quantiles: the most m <= bins - 1 (√2000/6 ≈ 7 bins) whose draws' scale 2/ε_m stays within a third
    # of a bin's rows, 2000/(m+1), with ε_m = ε·√(0.95/m) of the release (zCDP composition over one column's m draws)
    m = max(m for m in range(1, 7) if 2 / (eps_q * math.sqrt(0.95 / m)) <= 2000 / (3 * (m + 1)))
    cost = dm.spec["metadata_cost"][1]
    assert cost["columns"] == ["popul"] and cost["events"] == m
    assert cost["epsilon_each"] == pytest.approx(eps_q * math.sqrt(0.95 / m), rel=1e-12)
    rho = dm.spec["metadata_cost"][0]["epsilon"] ** 2 / 2 + m * cost["epsilon_each"] ** 2 / 8
    assert rho == pytest.approx(eps_q ** 2 / 8, rel=1e-9)
    # a table of such codes only releases nothing (no count either); so does a count of 0–15 (sixteen integers, as many
    # bins as a release buys a column at most: a count of diagnoses, of children), one bin each, where the range's tenths
    # would join two integers in a bin; a range of seventeen integers buys its quantiles
    only = TabularDataModule(frame=frame[["pid", "y"]], label="y", schema={k: schema[k] for k in ("pid", "y")},
                             class_ratio=[0.5, 0.5], quantile_epsilon=eps_q)
    assert only.spec["metadata_cost"] == [] and only.spec["columns"][0]["edges"] == pid["edges"]
    counts = TabularDataModule(frame=frame[["pid", "y"]], label="y", class_ratio=[0.5, 0.5], quantile_epsilon=eps_q,
                               schema={"pid": {"min": 0, "max": 15, "dtype": "int64"}, "y": schema["y"]})
    assert counts.spec["metadata_cost"] == [] and counts.spec["columns"][0]["edges"] == [k - 0.5 for k in range(17)]
    x, labels = counts.transformer.transform(frame[["pid", "y"]])
    assert counts.transformer.inverse_transform(x, labels)["pid"].tolist() == frame["pid"].tolist()
    wide = TabularDataModule(frame=frame, label="y", class_ratio=[0.5, 0.5], quantile_epsilon=eps_q,
                             schema={**schema, "pid": {"min": 0, "max": 16, "dtype": "int64"}})
    assert wide.spec["metadata_cost"][1]["columns"] == ["popul", "pid"]


def test_a_few_quantiles_cut_the_bulk_of_a_skewed_column_not_its_outer_percentiles():
    """Two quantiles a column (a small table with several numeric columns): they sit at the thirds, so the bulk of a
    log-normal column declared on a range far wider than its data is cut near its median, not left in one bin between
    its 1st and 99th percentiles; from ``TAILS_FROM`` quantiles on, the outer levels are the tails again."""
    assert dp_quantiles.quantile_levels(1).tolist() == [0.5]
    assert dp_quantiles.quantile_levels(2) == pytest.approx([1 / 3, 2 / 3])
    m = dp_quantiles.TAILS_FROM
    assert dp_quantiles.quantile_levels(m - 1) == pytest.approx(np.arange(1, m) / m)
    assert dp_quantiles.quantile_levels(m)[[0, -1]] == pytest.approx([dp_quantiles.TAIL, 1 - dp_quantiles.TAIL])
    values = np.random.default_rng(7).lognormal(3, 1.5, 800)
    released = dp_quantiles.quantile_edges(values, lower=0.0, upper=1e4, integer=False, num_bins=3, epsilon=20.0)
    q20, q50, q80 = np.quantile(values, [0.2, 0.5, 0.8])
    edges = np.asarray(released["edges"])
    assert np.any((edges > q20) & (edges < q50)) and np.any((edges > q50) & (edges < q80)), (edges[:6], q20, q50, q80)
