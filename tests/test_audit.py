"""`lightning-gpate audit`: ε_emp is a lower bound that holds at its stated confidence, the bounds are
Clopper–Pearson's, the features count what they say, and the command runs, resumes and reports."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import beta

from clitools import run_cli
from lightning_gpate.audit import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    distinguish,
    empirical_epsilon,
    groundhog_features,
    max_measurable_epsilon,
    querybased_features,
    worst_case_data,
)
from lightning_gpate.audit.features import category_codes, target_matches

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("n", [1, 7, 50, 400, 5000])
@pytest.mark.parametrize("alpha", [0.025, 0.05, 0.3])
def test_clopper_pearson_bounds_are_the_beta_quantiles(n, alpha):
    # Independent route: the bounds solve the binomial tail equations; scipy's beta quantiles are the
    # closed form (Clopper & Pearson 1934: upper = Beta(1 - a; k + 1, n - k), lower = Beta(a; k, n - k + 1)).
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        upper = 1.0 if k == n else beta.ppf(1 - alpha, k + 1, n - k)
        lower = 0.0 if k == 0 else beta.ppf(alpha, k, n - k + 1)
        assert clopper_pearson_upper(k, n, alpha) == pytest.approx(upper, rel=1e-9, abs=1e-12)
        assert clopper_pearson_lower(k, n, alpha) == pytest.approx(lower, rel=1e-9, abs=1e-12)
        assert clopper_pearson_lower(k, n, alpha) <= k / n <= clopper_pearson_upper(k, n, alpha)
    with pytest.raises(ValueError):
        clopper_pearson_upper(3, 2, 0.05)


def test_the_largest_measurable_epsilon_of_the_replication_study():
    # REFERENCE.md: 400 test models per world at 95% (α/2 per bound) can show at most ε_emp ≈ 4.68.
    assert max_measurable_epsilon(400, 400, delta=1e-5) == pytest.approx(4.68, abs=0.005)
    p = 1 - 0.025 ** (1 / 200)  # 200 test models per world, no error at all
    assert max_measurable_epsilon(200, 200) == pytest.approx(math.log((1 - p) / p), rel=1e-12)
    # the formula, both terms: ln((1 - δ - FNR_hi) / FPR_hi) and ln((1 - δ - FPR_hi) / FNR_hi)
    b = empirical_epsilon(3, 100, 40, 100, delta=0.01)
    fpr, fnr = beta.ppf(0.975, 4, 97), beta.ppf(0.975, 41, 60)
    assert b.epsilon == pytest.approx(max(math.log((0.99 - fnr) / fpr), math.log((0.99 - fpr) / fnr)), rel=1e-9)
    assert empirical_epsilon(50, 100, 50, 100).epsilon == 0.0  # a coin flip proves nothing


def _randomized_response_errors(rng, epsilon, n, reps):
    """A mechanism that is exactly ε-DP: it reports the world's bit, flipped with probability 1/(1+e^ε).
    The attack "guess the reported bit" errs with FPR = FNR = 1/(1+e^ε)."""
    flip = 1.0 / (1.0 + math.exp(epsilon))
    return rng.binomial(n, flip, size=reps), rng.binomial(n, flip, size=reps)


def test_epsilon_emp_of_randomized_response_approaches_epsilon_from_below():
    rng, epsilon = np.random.default_rng(0), 1.0
    means = []
    for n in (100, 1000, 10_000, 100_000):
        fp, fn = _randomized_response_errors(rng, epsilon, n, 20)
        means.append(np.mean([empirical_epsilon(a, n, b, n).epsilon for a, b in zip(fp, fn)]))
    # from below (the bound holds; exceeding it at the stated rate is the next test's subject)
    assert means == sorted(means) and means[0] < 0.6 and 0.95 < means[-1] < epsilon


def test_epsilon_emp_exceeds_the_true_epsilon_no_more_often_than_its_confidence_allows():
    rng, epsilon, n, reps, confidence = np.random.default_rng(1), 1.0, 400, 1000, 0.8
    fp, fn = _randomized_response_errors(rng, epsilon, n, reps)
    bounded = np.array([empirical_epsilon(a, n, b, n, confidence=confidence).epsilon for a, b in zip(fp, fn)])
    # Point estimates without the bounds overshoot about half the time: the check below has teeth.
    naive = np.maximum(np.log((1 - fn / n) / (fp / n)), np.log((1 - fp / n) / (fn / n)))
    assert (naive > epsilon).mean() > 0.4
    # With Clopper–Pearson at 80% the overshoot rate is at most 20% (3 binomial sd of slack over 1000 draws).
    rate = (bounded > epsilon).mean()
    assert rate <= (1 - confidence) + 3 * math.sqrt(0.2 * 0.8 / reps)


def test_the_forest_attack_on_randomized_response_measures_close_to_epsilon_and_not_above():
    rng, epsilon, per_world = np.random.default_rng(2), 1.0, 3000
    worlds = np.repeat([0, 1], per_world)
    reported = np.where(rng.random(len(worlds)) < 1 / (1 + math.exp(epsilon)), 1 - worlds, worlds)
    features = np.column_stack([reported, rng.random(len(worlds))])  # the bit, and a useless column
    train = np.tile(np.arange(per_world) < per_world // 2, 2)
    outcome = distinguish(features, worlds, train, delta=0.0, seed=0, n_estimators=50)
    assert outcome.bound.negatives == outcome.bound.positives == per_world // 2
    assert 0.75 < outcome.bound.epsilon <= epsilon
    assert 0.7 < outcome.auc < 0.78  # P(correct) = e/(1+e) = 0.73


# ----------------------------------------------------------------------------- features
def _worst_case_spec():
    from datamodules import TabularDataModule

    data = worst_case_data()
    return data, TabularDataModule(frame=data.with_target, test_fraction=0.0, val_fraction=0.0, **data.data_options).spec


def test_querybased_counts_the_eight_points_of_the_cube_and_groundhog_its_statistics():
    data, spec = _worst_case_spec()
    assert data.without_target.values.tolist() == [[0, 0, 0]] * 4 and data.target == {"x1": 1, "x2": 1, "y": 1}
    assert len(data.with_target) == 5 and spec["label"]["name"] == "y" and spec["private_metadata"] == []
    rows = [(0, 0, 0)] * 3 + [(1, 1, 1)] * 2 + [(1, 0, 0), (0, 1, 1)]
    table = pd.DataFrame(rows, columns=["x1", "x2", "y"])
    counts = querybased_features(table, data.target, spec)
    # point j of {0,1}^3: bit i set <=> column i (x1, x2, y) is 1
    assert counts.tolist() == [3, 1, 0, 0, 0, 0, 1, 2]
    stats = groundhog_features(table, data.target, spec).reshape(5, 3)  # min, max, mean, median, var of x1, x2, y
    x = np.array(rows, dtype=float)
    expected = np.stack([x.min(0), x.max(0), x.mean(0), np.median(x, 0), x.var(0)])
    np.testing.assert_allclose(stats, expected)


def test_features_of_numeric_and_categorical_columns():
    spec = {
        "columns": [{"name": "age", "type": "numeric", "min": 0, "max": 100},
                    {"name": "city", "type": "categorical", "categories": ["a", "b", "c"]}],
        "label": {"name": "sick", "type": "binary", "categories": [0.0, 1.0]},
        "column_order": ["age", "city", "sick"],
    }
    target = {"age": 40, "city": "b", "sick": 1.0}
    table = pd.DataFrame({"age": [40, 44, 46, 10], "city": ["b", "b", "a", "b"], "sick": [1, 0, 1, 1]})
    matches = target_matches(table, target, spec)  # age within 5 of 40 (5% of the range), same city, same label
    assert matches.tolist() == [[True, True, True], [True, True, False], [False, False, True], [False, True, True]]
    assert querybased_features(table, target, spec).tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    # beyond max_full_columns: single columns, pairs, all
    assert querybased_features(table, target, spec, max_full_columns=2).tolist() == [2, 3, 3, 2, 1, 2, 1]
    stats = groundhog_features(table, target, spec).reshape(5, -1)  # columns: age/100, city a|b|c, sick
    np.testing.assert_allclose(stats[2], [0.35, 0.25, 0.75, 0.0, 0.75])
    assert category_codes(pd.Series(["1", "0.0", 2, "x"]), [0.0, 1.0]).tolist() == [1, 0, -1, -1]


# ----------------------------------------------------------------------------- the command
def _audit_args(tmp_path, *extra):
    return ["audit", "--config", str(ROOT / "configs/audit/gan_worst_case.yaml"), "--dataset", "worst_case", "--max_steps", "3",
            "--num_rows", "40", "--output", str(tmp_path / "audit"), "--no_progress", *extra]


def test_audit_command_trains_both_worlds_resumes_and_reports_to_mlflow(tmp_path, capsys):
    from conftest import query_run

    from lightning_gpate.cli import main

    assert main(_audit_args(tmp_path, "--runs", "2")) == 0  # in this process
    first = capsys.readouterr().out
    fits = tmp_path / "audit" / "fits"
    assert sorted(p.name for p in fits.glob("*.json")) == ["w0_00000.json", "w0_00001.json", "w1_00000.json", "w1_00001.json"]
    stamp = (fits / "w0_00000.csv").stat().st_mtime_ns
    # the command line, continuing the folder in two worker processes
    second = run_cli(*_audit_args(tmp_path, "--runs", "4", "--jobs", "2", "--attack", "groundhog"), cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (fits / "w0_00000.csv").stat().st_mtime_ns == stamp  # finished fits are not trained again
    infos = [json.loads(p.read_text()) for p in sorted(fits.glob("*.json"))]
    assert len(infos) == 8 and len({i["seed"] for i in infos}) == 8  # a distinct public seed per fit
    assert all(len(pd.read_csv(p)) == 40 for p in fits.glob("*.csv"))  # both worlds release as many rows
    for out in (first, second.stdout):
        assert "ε_emp" in out and "claimed epsilon = inf" in out and "logged to MLflow run" in out
    assert "| GAN | groundhog | ∞ (not private) |" in second.stdout and "| 4 (2) |" in second.stdout
    run, client = query_run("audit")
    assert run.data.params["attack"] == "groundhog" and run.data.params["runs"] == "4"
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert {"epsilon_emp", "epsilon_emp_max", "fit_seconds_mean"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(run.info.run_id, "audit")} >= {"audit/roc.png", "audit/audit.json"}

    # another audit in the same folder is refused in one line, before any fit
    assert main(_audit_args(tmp_path, "--runs", "2", "--num_rows", "41")) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightning-gpate audit: error:") and "num_rows" in err


def test_audit_says_why_a_fit_failed(tmp_path, capsys):
    from lightning_gpate.cli import main

    config = tmp_path / "dpgan.yaml"  # DP-GAN with its defaults: no declared rate
    config.write_text("trainer: {max_steps: 5}\nmodel:\n  class_path: lightning_gpate.models.DPGAN\n"
                      "  init_args: {epsilon: 1.0, delta: 1.0e-5}\n")
    args = ["audit", "--config", str(config), "--runs", "2", "--num_rows", "10", "--no_progress", "--output", str(tmp_path / "a")]
    assert main(args) == 2
    assert "fit 0 of world 0 (without the target) failed" in capsys.readouterr().err
    config.write_text(config.read_text().replace("delta: 1.0e-5", "delta: 1.0e-5, sampling_rate: 1.0"))
    assert main(args + ["--output", str(tmp_path / "b")]) == 2  # σ=1.1 at q=1: no step fits ε=1
    assert "NoPrivateStepError: DP-GAN can take no private step within epsilon=1" in capsys.readouterr().err


def test_audit_input_errors(tmp_path, capsys):
    from lightning_gpate.cli import main

    config = str(ROOT / "configs/audit/gan_worst_case.yaml")
    for extra, message in ((["--runs", "1"], "--runs must be >= 2"), (["--runs", "4", "--target", "0,0,1"], "target is (1, 1, 1)"),
                           (["--runs", "4", "--dataset", "missing.csv", "--target", "0"], "dataset file not found")):
        assert main(["audit", "--config", config, "--no_progress", *extra]) == 2
        assert message in capsys.readouterr().err


def test_a_malformed_dataset_file_is_refused_in_one_line_that_quotes_none_of_it(tmp_path, capsys):
    """The audit reads a dataset file with the DataModules' reader: a malformed private file (a row with a field
    too many, a non-UTF-8 file) ends in one line that names the file and what to check, never the line
    number or the content of the offending row (pandas' own message names both). A malformed --target row
    (the user's own input) is refused in one line too."""
    from lightning_gpate.cli import main

    config = tmp_path / "gan.yaml"
    config.write_text("trainer: {max_steps: 2}\nmodel: {class_path: lightning_gpate.models.GAN, init_args: {generator: {z_dim: 4}}}\n"
                      "data: {class_path: datamodules.TabularDataModule, init_args: {label: y, batch_size: 4}}\n")
    data = tmp_path / "private.csv"
    data.write_text("x1,x2,y\n0,1,0\n1,0,1\n0,0,1,SECRET-4242\n1,1,0\n")
    args = ["audit", "--config", str(config), "--runs", "2", "--no_progress", "--output", str(tmp_path / "a"), "--target", "0"]
    assert main([*args, "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightning-gpate audit: error: could not read") and str(data) in err and len(err.strip().splitlines()) == 1
    assert "SECRET" not in err and "line 4" not in err and "Traceback" not in err
    data.write_bytes(b"x1,x2,y\n0,1,0\n\xff\xfe,0,1\n")
    assert main([*args, "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and len(err.strip().splitlines()) == 1
    data.write_text("x1,x2,y\n0,1,0\n1,0,1\n")
    assert main([*args[:-1], "0,1,1,2", "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert "must give one value per column" in err and len(err.strip().splitlines()) == 1
    # an index past the end: refused in one line that states no row count of the private file (it said "rows 0..1")
    assert main([*args[:-1], "7", "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert "--target 7 is not a row of" in err and len(err.strip().splitlines()) == 1
    assert not any(str(n) in err.replace(str(data), "").replace("--target 7", "") for n in (1, 2)), err


def test_every_fit_draws_fresh_mechanism_noise_and_each_private_audit_config_trains(monkeypatch):
    # The audit must measure each model as deployed: the public seed repeats, the secret noise does not.
    import lightning_gpate.evaluation.report as report
    from lightning_gpate.audit.game import fit_once, load_settings

    outputs, table = [], report.synthetic_table

    def recording(model, num_samples, *, seed=0):  # the generator's raw output (before rounding to a table)
        outputs.append(model.generate(64, seed=seed)[0].detach().clone())
        return table(model, num_samples, seed=seed)

    monkeypatch.setattr(report, "synthetic_table", recording)

    def twice(name, max_steps=None):  # None: the config's, which the budget cuts short
        settings = load_settings(ROOT / f"configs/audit/{name}_worst_case.yaml", "worst_case", None, num_rows=50, max_steps=max_steps)
        outputs.clear()
        infos = [fit_once(settings, 1, 0, seed=11)[1] for _ in range(2)]
        return settings, infos, outputs[0], outputs[1]

    # the non-private GAN: its public seed fixes everything, so the same fit gives the same generator twice ...
    _, _, first, again = twice("gan", max_steps=10)
    assert torch.equal(first, again)
    # ... while each private model's changes with its OS-seeded noise; and each trains (at ε=1 on four
    # rows) until its budget, not the step limit, stops it: the audit measures a trained model
    for name in ("pategan", "dpgan", "gpate"):
        settings, [info, _], first, again = twice(name)
        assert settings.model_args.get("noise_seed") is None and settings.claimed() == (1.0, 1e-5)
        assert 0.9 < info["epsilon_spent"] <= 1.0 and 0 < info["steps"] < settings.max_steps, (name, info)
        assert info["stop_reason"].startswith("privacy budget reached"), (name, info)
        assert not torch.equal(first, again), name
