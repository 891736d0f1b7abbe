"""The evaluation a fit runs by default (``lightning-gpate fit`` adds DownstreamUtility and ImageQuality)
logs, for a private model, nothing computed from the real training split without noise: Setting A and
the ranking agreements with it only on request and then under ``private/``, IS/FID features trained on
a held-out split, no training-split size. A non-private GAN keeps the papers' full report."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import small_models
from callbacks import DownstreamUtility, FitSummary, ImageQuality, ReleaseArtifact, SampleLogger
from conftest import query_run
from datamodules import ImageDataModule
from lightning_gpate.evaluation import image as image_evaluation
from lightning_gpate.models import DPGAN
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent

FAST = ["LogisticRegression", "DecisionTree", "GaussianNB"]
ROWS, TEST_FRACTION = 300, 0.3
#: What a private model's default tabular evaluation may log: Settings B and C (trained on synthetic
#: data), distribution comparisons with the real test split, the size of the generated sample.
PUBLIC_TABULAR = ("utility/B/", "utility/C/", "utility/feature_ranking_", "utility/spearman_corr_mae", "utility/num_synthetic",
                  "utility/fidelity/")


def _fit_with_default_evaluation(kind, experiment, **options):
    model, dm = small_models.build(kind, rows=ROWS, test_fraction=TEST_FRACTION, **options)
    utility = DownstreamUtility(classifiers=FAST)  # the CLI's defaults, fewer classifiers (speed)
    small_models.fit(model, dm, steps=2, callbacks=[utility, ImageQuality(), SampleLogger(per_class_grids=False),
                                                    ReleaseArtifact(), FitSummary()],
                     logger=GPATEMLFlowLogger(experiment_name=experiment))
    run, client = query_run(experiment)
    return run, client, dm, model


@pytest.mark.parametrize("kind", [*small_models.PRIVATE, small_models.MARGINAL])
def test_default_evaluation_of_a_private_model_logs_nothing_from_the_training_split(kind):
    run, client, dm, _ = _fit_with_default_evaluation(kind, f"eval-{kind}")
    assert "utility_error" not in run.data.tags, run.data.tags.get("utility_error")
    evaluation = {k for k in run.data.metrics if k.startswith(("utility/", "quality/", "private/"))}
    assert evaluation and all(k.startswith(PUBLIC_TABULAR) for k in evaluation), sorted(evaluation)
    assert "utility/B/auroc_mean" in evaluation and "utility/C/auroc_mean" in evaluation
    assert {"utility/fidelity/tvd_1way", "utility/fidelity/tvd_2way", "utility/fidelity/corr_mae"} <= evaluation  # vs the test split
    # The sample has the size of the (held-out) test split, not of the private training split.
    assert run.data.metrics["utility/num_synthetic"] == len(dm.split_frame("test")) != len(dm.split_frame("train"))
    report = client.download_artifacts(run.info.run_id, "evaluation/report_final.json")
    assert '"A/' not in open(report).read() and "ranking_agreement_A" not in open(report).read()


def test_setting_a_of_a_private_model_is_opt_in_and_labelled_private():
    run, _, _, _ = _fit_with_default_evaluation("pategan", "eval-opt-in", log_private_diagnostics=True)
    metrics = run.data.metrics
    assert {"private/utility/A/auroc_mean", "private/utility/ranking_agreement_AC", "private/utility/A/fidelity/tvd_1way"} <= set(metrics)
    assert not any(k.startswith(("utility/A/", "utility/ranking_agreement_A")) for k in metrics)
    assert "utility/B/auroc_mean" in metrics


def test_a_non_private_gan_keeps_setting_a():
    run, _, _, _ = _fit_with_default_evaluation("gan", "eval-gan")
    assert {"utility/A/auroc_mean", "utility/ranking_agreement_AC", "utility/B/auroc_mean", "utility/A/fidelity/tvd_2way"} <= set(run.data.metrics)
    assert not any(k.startswith("private/") for k in run.data.metrics)


def _evaluate(callback, model, dm, experiment):
    """One evaluation of ``model`` against ``dm``'s real splits, as at the end of a fit."""
    trainer = SimpleNamespace(datamodule=dm, loggers=[GPATEMLFlowLogger(experiment_name=experiment)], global_step=2)
    callback.evaluate(trainer, model, tag="final", final=True)
    return dict(callback.last_metrics)


@pytest.mark.parametrize("kind", ["gpate", "dpgan"])
def test_default_evaluation_of_a_private_model_is_the_same_whatever_the_training_split(kind):
    """The same generator evaluated against two data sets with the same held-out rows and entirely
    different training rows (other rows, labels flipped) logs the same figures: none is a function
    of the training split."""
    model, dm = small_models.build(kind, rows=ROWS, test_fraction=TEST_FRACTION)
    other = small_models.public_frame(400, seed=1)
    other["y"] = 1 - other["y"]
    other_train = small_models.public_table(frame=other, test_fraction=TEST_FRACTION).split_frame("train")
    held_out = pd.concat([dm.split_frame("test"), dm.split_frame("val")], ignore_index=True)
    dm2 = small_models.public_table(frame=pd.concat([held_out, other_train], ignore_index=True), test_fraction=TEST_FRACTION)
    pd.testing.assert_frame_equal(dm2.split_frame("test"), dm.split_frame("test"))  # per-record splits
    assert len(dm2.split_frame("train")) != len(dm.split_frame("train"))
    first = _evaluate(DownstreamUtility(classifiers=FAST), model, dm, "first")
    second = _evaluate(DownstreamUtility(classifiers=FAST), model, dm2, "second")
    assert first == pytest.approx(second, nan_ok=True)
    opted_in = DownstreamUtility(classifiers=FAST, real_baselines=True)
    _evaluate(opted_in, model, dm, "third")
    a_first = dict(opted_in.private_metrics)
    _evaluate(opted_in := DownstreamUtility(classifiers=FAST, real_baselines=True), model, dm2, "fourth")
    assert a_first["A/auroc_mean"] != pytest.approx(opted_in.private_metrics["A/auroc_mean"])  # A does depend on it


def test_image_evaluation_of_a_private_model_never_trains_on_the_training_split(monkeypatch):
    """IS/FID's feature classifier of a private model trains on a held-out split; the utility CNN on
    generated images; no figure is logged from a network trained on the training split."""
    torch.set_num_threads(1)
    dm = ImageDataModule("digits", batch_size=32)
    train_x = dm.model_space("train")[0]
    trained_on = []
    original = image_evaluation.train_classifier

    def spy(x, y, **kwargs):
        trained_on.append(x)
        return original(x, y, **kwargs)

    monkeypatch.setattr(image_evaluation, "train_classifier", spy)
    image_evaluation._FEATURE_CLASSIFIERS.clear()
    model = former(DPGAN, dm.spec, epsilon=50.0, delta=1e-5, sampling_rate=32 / 1200, noise_multiplier=1.0, d_steps=1, z_dim=8,
                  generator_hidden=(32,), discriminator_hidden=(8,))
    quality = ImageQuality(feature_epochs=2)
    small_models.fit(model, dm, steps=2, callbacks=[DownstreamUtility(cnn_epochs=1), quality, ReleaseArtifact()],
                     logger=GPATEMLFlowLogger(experiment_name="eval-digits"))
    run, _ = query_run("eval-digits")
    assert not any(k.endswith("_error") for k in run.data.tags), run.data.tags
    assert len(trained_on) == 2  # the feature classifier and the utility CNN
    assert not any(x.shape == train_x.shape and torch.equal(x, train_x) for x in trained_on)
    assert any(torch.equal(x, dm.model_space("val")[0]) for x in trained_on)  # features: held out of training
    metrics = set(run.data.metrics)
    assert {"quality/inception_score", "quality/fid", "quality/inception_score_real", "quality/fid_real_val_vs_reference",
            "utility/cnn_accuracy_final"} <= metrics
    assert not any("real_train" in k or k.startswith("private/") for k in metrics), sorted(metrics)
    assert run.data.metrics["utility/cnn_num_train"] < len(dm.model_space("test")[1])  # 90% of a test-sized sample


def test_evaluate_rebuilds_the_runs_splits_from_its_released_bins_not_a_new_draw(tmp_path):
    """``evaluate`` rebuilds a private table's DataModule from the release: with the bins the run released and paid
    for, not a new quantile draw (fresh noise gives other bins, and the splits, keyed on the transformed records, would
    put training rows into the test split that every figure is scored on)."""
    import numpy as np

    from datamodules import TabularDataModule
    from lightning_gpate.evaluation.store import datamodule_for
    from lightning_gpate.models import MarginalTree
    from lightning_gpate.release import build_release

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.lognormal(3.0, 1.0, 600).round(2), "b": rng.normal(50, 10, 600).round(2),
                          "y": rng.integers(0, 2, 600)})
    frame.to_csv(tmp_path / "t.csv", index=False)
    schema = {"a": {"min": 0, "max": 1000}, "b": {"min": 0, "max": 100}, "y": {"categories": [0, 1]}}
    dm = TabularDataModule(path=str(tmp_path / "t.csv"), label="y", schema=schema, quantile_epsilon=0.5, test_fraction=0.3)
    model = MarginalTree(dm.spec, epsilon=5.0)
    release = build_release(model, datamodule=dm)
    for _ in range(3):  # each new draw would move the split with probability ~1
        rebuilt = datamodule_for(release, model)
        assert rebuilt.spec["columns"] == dm.spec["columns"]
        pd.testing.assert_frame_equal(rebuilt.split_frame("test"), dm.split_frame("test"))
