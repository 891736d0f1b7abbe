"""The evaluation callbacks in a real fit: every figure lands in the MLflow run (metrics and artifacts)."""

import json
import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from callbacks import DownstreamUtility, ImageQuality, ReleaseArtifact, SampleLogger
from conftest import query_run
from datamodules import ImageDataModule, TabularDataModule
from lightning_gpate.models import GAN
from lightning_gpate.tracking import GPATEMLFlowLogger

FAST = ["LogisticRegression", "DecisionTree", "GaussianNB"]


def _fit(model, dm, callbacks, experiment, max_steps=3):
    trainer = pl.Trainer(max_steps=max_steps, logger=GPATEMLFlowLogger(experiment_name=experiment), callbacks=callbacks,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(model, dm)
    return trainer


def _artifacts(client, run_id, path=None):
    return sorted(a.path for a in client.list_artifacts(run_id, path))


def test_digits_run_has_is_fid_and_cnn_accuracy_every_n_steps_and_at_the_end():
    pl.seed_everything(0)
    dm = ImageDataModule("digits", batch_size=32)
    model = GAN(dm.spec, z_dim=8, gf_dim=8, df_dim=8, fc_dim=16)
    utility = DownstreamUtility(every_n_steps=2, cnn_epochs=2)
    quality = ImageQuality(every_n_steps=2)
    _fit(model, dm, [utility, quality, SampleLogger(), ReleaseArtifact()], "digits-eval")
    run, client = query_run("digits-eval")
    m = run.data.metrics
    for key in ("quality/inception_score", "quality/fid", "quality/inception_score_real", "quality/fid_real_train_vs_reference",
                "quality/feature_net_test_accuracy", "utility/cnn_accuracy_final", "utility/cnn_accuracy_val_selected",
                "utility/cnn_accuracy_best_on_test_paper_style"):
        assert key in m, key
    assert m["quality/inception_score"] == pytest.approx(quality.last_metrics["inception_score"])
    assert m["quality/fid"] > 10 * m["quality/fid_real_train_vs_reference"]  # 3 steps of training: far from real
    assert m["quality/inception_score_real"] > 8.5
    # at step 2 and at the end (step 3)
    assert [h.step for h in client.get_metric_history(run.info.run_id, "quality/fid")] == [2, 3]
    assert [h.step for h in client.get_metric_history(run.info.run_id, "utility/cnn_accuracy_final")] == [2, 3]
    assert len(client.get_metric_history(run.info.run_id, "quality/inception_score_real")) == 1  # logged once
    assert _artifacts(client, run.info.run_id, "samples") == ["samples/samples_final.png"]
    per_class = _artifacts(client, run.info.run_id, "samples_per_class")
    assert per_class == [f"samples_per_class/class_{i}_{i}.png" for i in range(10)]
    assert run.data.tags["model_class"] == "GAN" and run.data.tags["steps"] == "3"


def _table_dm(mixed_frame):
    return TabularDataModule(frame=mixed_frame, label="outcome", batch_size=16)


def test_table_run_has_the_utility_report_figures_and_marginals(mixed_frame):
    pl.seed_everything(0)
    dm = _table_dm(mixed_frame)
    model = GAN(dm.spec, z_dim=8, hidden=(16,))
    utility = DownstreamUtility(classifiers=FAST)
    _fit(model, dm, [utility, SampleLogger(num_samples=50), ReleaseArtifact()], "table-eval")
    run, client = query_run("table-eval")
    m = run.data.metrics
    for s in "ABC":
        for name in FAST:
            assert f"utility/{s}/auroc/{name}" in m and f"utility/{s}/auprc/{name}" in m
        assert f"utility/{s}/auroc_mean" in m
    for key in ("ranking_agreement_AC", "feature_ranking_spearman", "feature_ranking_top5_overlap", "spearman_corr_mae"):
        assert f"utility/{key}" in m
    assert m["utility/num_synthetic"] == len(dm.split_frame("train"))
    assert _artifacts(client, run.info.run_id, "evaluation") == [
        "evaluation/report_final.json", "evaluation/spearman_final.png",
        "evaluation/spearman_real_final.csv", "evaluation/spearman_synthetic_final.csv",
    ]
    assert _artifacts(client, run.info.run_id, "plots") == ["plots/marginals_final.png"]
    report = json.loads(Path(client.download_artifacts(run.info.run_id, "evaluation/report_final.json")).read_text())
    for key, value in report["metrics"].items():  # the JSON report is what the metrics say
        assert (value is None and math.isnan(m[f"utility/{key}"])) or m[f"utility/{key}"] == pytest.approx(value)
    png = Path(client.download_artifacts(run.info.run_id, "plots/marginals_final.png")).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluation_leaves_the_training_run_unchanged(mixed_frame):
    """Generation and evaluation are seeded apart from training: a run evaluated every step trains
    exactly the same generator as a run that is not evaluated."""
    weights = []
    for callbacks in ([DownstreamUtility(every_n_steps=1, classifiers=["LogisticRegression"], figures=False), SampleLogger(every_n_steps=1, marginals=False)], []):
        pl.seed_everything(0)
        dm = _table_dm(mixed_frame)
        model = GAN(dm.spec, z_dim=8, hidden=(16,))
        _fit(model, dm, callbacks, "same", max_steps=4)
        weights.append({k: v.clone() for k, v in model.generator.state_dict().items()})
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_disabled_and_failing_evaluation_never_break_the_fit(mixed_frame):
    dm = _table_dm(mixed_frame)
    model = GAN(dm.spec, z_dim=8, hidden=(16,))
    _fit(model, dm, [DownstreamUtility(enabled=False), ReleaseArtifact()], "off", max_steps=1)
    run, _ = query_run("off")
    assert not any(k.startswith("utility/") for k in run.data.metrics)
    with pytest.warns(UserWarning, match="DownstreamUtility failed"):
        _fit(model, dm, [DownstreamUtility(settings=("Z",)), ReleaseArtifact()], "broken", max_steps=1)
    run, _ = query_run("broken")
    assert "unknown settings" in run.data.tags["utility_error"]
    assert "release_artifact" in run.data.tags  # the release is still written


def test_image_quality_ignores_tables(mixed_frame):
    dm = _table_dm(mixed_frame)
    quality = ImageQuality()
    _fit(GAN(dm.spec, z_dim=8, hidden=(16,)), dm, [quality], "tab-quality", max_steps=1)
    run, _ = query_run("tab-quality")
    assert not any(k.startswith("quality/") for k in run.data.metrics) and quality.last_metrics == {}
