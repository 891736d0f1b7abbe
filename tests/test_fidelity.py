"""Fidelity of synthetic tables (1-way and 2-way TVD on public bins, Pearson correlation gap), against
values computed by hand; the real floor only where the training split may be read."""

import math

import numpy as np
import pandas as pd
import pytest

from lightning_gpate.evaluation.fidelity import column_triples, discretize, fidelity, spec_columns, uniform_table
from lightning_gpate.evaluation.tabular import evaluate_tabular

SPEC = {
    "columns": [{"name": "x", "type": "numeric", "min": 0.0, "max": 10.0, "dtype": "float64", "categories": []},
                {"name": "c", "type": "categorical", "categories": ["a", "b", "c"], "dtype": "object"}],
    "label": {"name": "y", "type": "binary", "categories": [0, 1], "dtype": "int64"},
    "column_order": ["x", "c", "y"],
}
REAL = pd.DataFrame({"x": [1.0, 2.0, 7.0, 9.0], "c": ["a", "a", "b", "c"], "y": [0, 0, 1, 1]})
SYNTHETIC = pd.DataFrame({"x": [1.0, 6.0, 6.0, 6.0], "c": ["a", "b", "b", "b"], "y": [0, 1, 1, 1]})


def test_tvds_and_correlation_gap_by_hand():
    m = fidelity(REAL, SYNTHETIC, SPEC, num_bins=2)
    # 1-way (x in 2 bins of [0, 10]: [0,5), [5,10]): x (.5,.5) vs (.25,.75) -> .25; c (.5,.25,.25) vs (.25,.75,0) -> .5;
    # y (.5,.5) vs (.25,.75) -> .25
    assert m["tvd_1way"] == pytest.approx((0.25 + 0.5 + 0.25) / 3)
    assert m["tvd_1way_max"] == pytest.approx(0.5)
    # 2-way: (x,c) {(0,a):.5,(1,b):.25,(1,c):.25} vs {(0,a):.25,(1,b):.75} -> .5; (x,y) -> .25; (c,y) -> .5
    assert m["tvd_2way"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
    assert m["tvd_2way_max"] == pytest.approx(0.5)
    # 3-way, the one triple (x,c,y): real {(0,a,0):.5,(1,b,1):.25,(1,c,1):.25} vs {(0,a,0):.25,(1,b,1):.75} -> .5
    assert m["tvd_3way"] == pytest.approx(0.5) and m["tvd_3way_max"] == pytest.approx(0.5)
    # Pearson on (x, category index, label): the synthetic columns are all affine in one indicator (r = 1);
    # real: r(x,c) = 10.75/sqrt(44.75*2.75), r(x,y) = 6.5/sqrt(44.75), r(c,y) = 1.5/sqrt(2.75) (centred sums)
    real_r = [10.75 / math.sqrt(44.75 * 2.75), 6.5 / math.sqrt(44.75), 1.5 / math.sqrt(2.75)]
    assert m["corr_mae"] == pytest.approx(np.mean([1 - r for r in real_r]))


def test_same_table_is_at_zero_and_bins_come_from_the_spec_not_the_data():
    assert fidelity(REAL, REAL, SPEC)["tvd_2way"] == 0.0
    # all real x within [1, 9]: the bins are the spec's [0, 10] in tenths, so 1.0 and 1.5 share a bin ...
    codes, cards = discretize(pd.DataFrame({"x": [1.0, 1.5, 9.99, 10.0, 55.0, -3.0, np.nan], "c": ["a"] * 7, "y": [0] * 7}),
                              spec_columns(SPEC), num_bins=10)
    assert codes[:, 0].tolist() == [1, 1, 9, 9, 9, 0, 10]  # ... values outside are clipped, a missing one is its own cell
    assert cards == [11, 4, 3]
    # an unknown category or a missing label is its own cell; a float 1.0 label is the category 1
    codes, _ = discretize(pd.DataFrame({"x": [0.0] * 3, "c": ["a", "zzz", None], "y": [1.0, np.nan, 0]}), spec_columns(SPEC))
    assert codes[:, 1].tolist() == [0, 3, 3] and codes[:, 2].tolist() == [1, 2, 0]


def test_a_uniform_table_is_far_and_a_resample_is_near():
    rng = np.random.default_rng(0)
    n = 4000
    y = rng.binomial(1, 0.2, n)
    real = pd.DataFrame({"x": np.clip(rng.normal(2 + 4 * y, 1.0), 0, 10), "c": np.where(y == 1, "c", rng.choice(["a", "b"], n)), "y": y})
    near = real.sample(n, replace=True, random_state=1).reset_index(drop=True)
    uniform = uniform_table(SPEC, n, seed=0)
    assert set(uniform["c"]) == {"a", "b", "c"} and uniform["x"].between(0, 10).all() and set(uniform["y"]) == {0, 1}
    good, bad = fidelity(real, near, SPEC), fidelity(real, uniform, SPEC)
    assert good["tvd_1way"] < 0.03 and good["tvd_2way"] < 0.05 and good["corr_mae"] < 0.03
    assert bad["tvd_1way"] > 0.25 and bad["tvd_2way"] > 0.4 and bad["corr_mae"] > 0.4


def test_report_adds_fidelity_and_the_real_floor_only_with_setting_a():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"x": rng.uniform(0, 10, 200), "c": rng.choice(["a", "b", "c"], 200), "y": rng.integers(0, 2, 200)})
    train, test = frame.iloc[:120].reset_index(drop=True), frame.iloc[120:].reset_index(drop=True)
    fast = ["LogisticRegression"]
    without_a = evaluate_tabular(train, test, SYNTHETIC, label="y", classifiers=fast, settings=("B",), spec=SPEC)
    assert without_a["fidelity/tvd_1way"] == pytest.approx(fidelity(test, SYNTHETIC, SPEC)["tvd_1way"])  # against the test split
    assert not any(k.startswith("A/") for k in without_a)
    with_a = evaluate_tabular(train, test, SYNTHETIC, label="y", classifiers=fast, settings=("A", "B"), spec=SPEC)
    assert with_a["A/fidelity/tvd_2way"] == pytest.approx(fidelity(test, train, SPEC)["tvd_2way"])
    assert "fidelity/tvd_1way" not in evaluate_tabular(train, test, SYNTHETIC, label="y", classifiers=fast, settings=("B",))


def test_fit_summary_prints_fidelity_beside_auroc():
    from callbacks.summary import _metric_lines

    lines = _metric_lines({"utility/B/auroc_mean": 0.81, "utility/fidelity/tvd_1way": 0.0734, "utility/fidelity/tvd_2way": 0.131,
                           "private/utility/A/fidelity/tvd_1way": 0.025})
    assert "AUROC synthetic→real (B) 0.81" in lines
    assert any(line.startswith("fidelity: 1-way TVD") and line.endswith(" 0.0734") for line in lines)
    assert any(line.startswith("fidelity: 2-way TVD") and line.endswith(" 0.131") for line in lines)
    assert any("floor" in line and "private diagnostic" in line and line.endswith(" 0.025") for line in lines)


def test_three_way_tvd_counts_every_triple_or_a_fixed_sample_of_them():
    """Against pandas' crosstab, an independent count: the mean over every triple of 5 columns; with more triples than
    ``max_triples`` a fixed draw, the same for every synthetic table."""
    rng = np.random.default_rng(3)
    names = list("abcde")
    spec = {"columns": [{"name": c, "type": "categorical", "categories": [0, 1, 2], "dtype": "int64"} for c in names[:-1]],
            "label": {"name": "e", "type": "binary", "categories": [0, 1], "dtype": "int64"}, "column_order": names}
    real = pd.DataFrame({c: rng.integers(0, 3 if c != "e" else 2, 300) for c in names})
    fake = pd.DataFrame({c: rng.integers(0, 3 if c != "e" else 2, 200) for c in names})
    expected = []
    for triple in column_triples(5):
        cols = [names[i] for i in triple]
        p = real.groupby(cols).size() / len(real)
        q = fake.groupby(cols).size() / len(fake)
        expected.append(0.5 * p.sub(q, fill_value=0).abs().sum())
    assert len(column_triples(5)) == 10
    assert fidelity(real, fake, spec)["tvd_3way"] == pytest.approx(np.mean(expected))
    assert column_triples(23) == column_triples(23) and len(column_triples(23)) == 300 and len(set(column_triples(23))) == 300
    assert fidelity(real, fake, spec, max_triples=4)["tvd_3way"] == pytest.approx(np.mean([expected[i] for i in
        [list(column_triples(5)).index(t) for t in column_triples(5, 4)]]))


def test_a_private_gan_fitted_on_a_table_is_told_the_marginal_model_did_better():
    from callbacks.summary import table_advice
    from lightning_gpate.api import model_classes

    class Fitted:
        def __init__(self, kind):
            self.data_spec = {"kind": kind}

    models = model_classes()
    for name in ("pategan", "gpate", "dpgan", "gswgan"):
        fitted = type(models[name].__name__, (Fitted,), {})("tabular")
        assert "MarginalTree gave a lower 2-way TVD than this model on every table and ε measured" in table_advice(fitted)
        assert " and a higher mean AUROC on every one" in table_advice(fitted)
        assert table_advice(type(models[name].__name__, (Fitted,), {})("image")) is None
    for name in ("marginaltree", "dpmerf", "gan"):
        assert table_advice(type(models[name].__name__, (Fitted,), {})("tabular")) is None


VALUE_SPEC = {"columns": [{"name": "income", "type": "numeric", "min": 0.0, "max": 1e6, "dtype": "float64", "categories": []},
                          {"name": "age", "type": "numeric", "min": -10.0, "max": 10.0, "dtype": "float64", "categories": []},
                          {"name": "c", "type": "binary", "categories": [0, 1], "dtype": "int64"}],
              "label": {"name": "y", "type": "binary", "categories": [0, 1], "dtype": "int64"},
              "column_order": ["income", "age", "c", "y"]}


def test_value_fidelity_against_scipy_on_known_distributions():
    """Decile TVD against the normal CDF (scipy) at the real deciles, W1 against scipy's wasserstein_distance, the
    medians against numpy; a skewed column that equal-width bins of its declared range cannot see."""
    from scipy import stats

    from lightning_gpate.evaluation.fidelity import value_fidelity, wasserstein_1

    rng = np.random.default_rng(5)
    n = 60_000
    real = pd.DataFrame({"income": rng.lognormal(7, 1.5, n), "age": rng.normal(0, 1, n), "c": rng.integers(0, 2, n), "y": 0})
    # the synthetic income: right median, the tail smeared uniformly over the declared range; age shifted by 0.5
    fake = pd.DataFrame({"income": np.where(rng.random(n) < 0.5, rng.lognormal(7, 1.5, n), rng.uniform(0, 1e6, n)),
                         "age": rng.normal(0.5, 1, n), "c": rng.integers(0, 2, n), "y": 0})
    m = value_fidelity(real, fake, VALUE_SPEC)
    deciles = stats.norm.ppf(np.linspace(0, 1, 11)[1:-1])
    expected_age = 0.5 * np.abs(np.diff(stats.norm.cdf(np.concatenate([[-np.inf], deciles, [np.inf]]), loc=0.5)) - 0.1).sum()
    assert m["column/age/quantile_tvd"] == pytest.approx(expected_age, abs=0.01)
    assert wasserstein_1(real["age"], fake["age"]) == pytest.approx(stats.wasserstein_distance(real["age"], fake["age"]), rel=1e-9)
    spread = stats.norm.ppf(0.95) - stats.norm.ppf(0.05)
    assert m["column/age/w1_scaled"] == pytest.approx(0.5 / spread, rel=0.02)  # a shift by 0.5 moves every value by 0.5
    assert m["column/income/w1_scaled"] == pytest.approx(
        stats.wasserstein_distance(real["income"], fake["income"]) / np.subtract(*np.quantile(real["income"], [0.95, 0.05])), rel=1e-9)
    assert m["column/income/median_real"] == pytest.approx(np.median(real["income"]))
    assert m["column/income/median_synthetic"] == pytest.approx(np.median(fake["income"]))
    # half the synthetic incomes uniform on [0, 1e6]: ~half of them above the real top decile -> TVD ~0.45
    share_above = 0.5 * (1 - stats.lognorm.cdf(np.quantile(real["income"], 0.9), 1.5, scale=np.exp(7))) + 0.5 * (1 - np.quantile(real["income"], 0.9) / 1e6)
    assert m["column/income/quantile_tvd"] >= share_above - 0.1 - 0.01
    assert m["column/income/w1_scaled"] > 10  # the values a user reads: far off
    assert m["quantile_tvd_1way"] == pytest.approx((m["column/income/quantile_tvd"] + m["column/age/quantile_tvd"]) / 2)
    assert m["quantile_tvd_1way_max"] == m["column/income/quantile_tvd"]
    # equal-width bins of the declared [0, 1e6] put ~97% of both incomes into the first bin: they see little
    assert fidelity(real, fake, VALUE_SPEC)["tvd_1way"] < m["quantile_tvd_1way"]
    # 2-way: independent columns, so the joint decile TVD of a resample of the real rows is near 0, of the fake far
    resample = real.sample(n, replace=True, random_state=0)
    assert value_fidelity(real, resample, VALUE_SPEC)["quantile_tvd_2way"] < 0.03
    assert value_fidelity(real, fake, VALUE_SPEC)["quantile_tvd_2way"] > m["quantile_tvd_1way"]
    assert "column/c/quantile_tvd" not in m  # numeric columns only


def test_value_fidelity_ties_worst_column_and_names():
    from lightning_gpate.evaluation.fidelity import metric_name, value_fidelity, worst_column

    spec = {"columns": [{"name": "Num of pregnancies", "type": "numeric", "min": 0, "max": 15, "dtype": "int64", "categories": []},
                        {"name": "STDs: (number)", "type": "numeric", "min": 0, "max": 12, "dtype": "int64", "categories": []}],
            "label": {"name": "y", "type": "binary", "categories": [0, 1], "dtype": "int64"},
            "column_order": ["Num of pregnancies", "STDs: (number)", "y"]}
    real = pd.DataFrame({"Num of pregnancies": [0, 0, 0, 1, 1, 2, 2, 3, 4, 9], "STDs: (number)": [0] * 9 + [1], "y": [0, 1] * 5})
    fake = pd.DataFrame({"Num of pregnancies": [0, 0, 0, 1, 1, 2, 2, 3, 4, 9], "STDs: (number)": [1] * 10, "y": [0, 1] * 5})
    m = value_fidelity(real, fake, spec)
    assert m["column/Num of pregnancies/quantile_tvd"] == 0.0
    # tied deciles merge: bins (-inf, 0) [0, 1) [1, inf) hold 0, .9, .1 real and 0, 0, 1 fake
    assert m[f"column/{metric_name('STDs: (number)')}/quantile_tvd"] == pytest.approx(0.9)
    name, figures = worst_column({f"utility/fidelity/{k}": v for k, v in m.items()}, "utility/fidelity/")
    assert name == "STDs: _number_" and figures["median_real"] == 0.0 and figures["median_synthetic"] == 1.0
    from callbacks.summary import _metric_lines

    assert any("worst column 'STDs: _number_'" in line and "median real 0 → synthetic 1" in line
               for line in _metric_lines({f"utility/fidelity/{k}": v for k, v in m.items()}))


def test_the_summary_names_columns_whose_values_come_back_off_and_the_declaration_that_fixes_them():
    """A user reads values: a column whose median is far off (or whose W1 is) is named, with what to declare for it;
    a column within the bars, or one whose declared values come back as themselves, is not."""
    from lightning_gpate.evaluation.fidelity import columns_off, metric_name, value_advice

    def figures(name, med_r, med_s, w1):
        key = f"utility/fidelity/column/{metric_name(name)}/"
        return {key + "median_real": med_r, key + "median_synthetic": med_s, key + "w1_scaled": w1, key + "quantile_tvd": 0.1}

    metrics = {**figures("popul (k)", 22.0, 337.0, 0.29), **figures("ClinLR", 2.0, 2.9, 0.07), **figures("age", 45.0, 47.0, 0.03),
               **figures("income", 17.0, 16.0, 0.15), **figures("PID", 3.0, 6.0, 0.2), **figures("debt", 0.0, 100.0, 0.05)}
    off = columns_off(metrics, "utility/fidelity/")
    # popul: log(337/22)/log(1.5) = 6.7 bars; PID: log 2/log 1.5 = 1.7, its W1 2 bars; income: W1 1.5 bars; ClinLR: 0.91 (within)
    assert [name for name, _, _ in off] == ["popul _k_", "PID", "income"]
    assert off[0][2] == pytest.approx(math.log(337 / 22) / math.log(1.5))
    assert columns_off(metrics, "utility/fidelity/", limit=1)[0][0] == "popul _k_"
    spec = {"columns": [{"name": "popul (k)", "type": "numeric", "edges_source": "dp_quantiles"},
                        {"name": "income", "type": "numeric", "edges_source": "log"},
                        {"name": "PID", "type": "numeric", "edges_source": "values"}]}
    lines = value_advice(metrics, spec, "utility/fidelity/")
    assert len(lines) == 2  # PID's declared values come back as themselves: nothing to declare
    assert "'popul _k_' (median real 22 → synthetic 337" in lines[0] and "`scale: log`" in lines[0] and "PID" not in lines[0]
    assert "'income'" in lines[1] and "`bins: [...]`" in lines[1] and "`scale: log`" not in lines[1]
    assert value_advice(figures("age", 45.0, 47.0, 0.03), spec, "utility/fidelity/") == []
    # a column nothing can be declared for does not take the place of one that can: three worse coded columns first
    codes = {f"code{k}": {"name": f"code{k}", "type": "numeric", "edges_source": "integers"} for k in range(3)}
    crowded = {**metrics, **{k: v for k in codes for k, v in figures(k, 1.0, 9.0, 1.0).items()}}
    lines = value_advice(crowded, {"columns": [*spec["columns"], *codes.values()]}, "utility/fidelity/")
    assert "'popul _k_'" in lines[0] and "'income'" in lines[1] and "'code" not in " ".join(lines)
