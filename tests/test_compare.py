"""`lightning-gpate evaluate` (a finished run's report, attached to its MLflow run) and
`lightning-gpate compare` (the runs of an experiment side by side)."""

from pathlib import Path

import pytest
import torch

from conftest import query_run
from lightning_gpate import Synthesizer
from lightning_gpate.api import model_classes
from lightning_gpate.cli import main

ROOT = Path(__file__).resolve().parents[1]
NO_EVAL = ["--utility.enabled", "false", "--image_quality.enabled", "false", "--trainer.enable_progress_bar", "false"]
FAST = "LogisticRegression,DecisionTree"


def _fit_table(mixed_frame, experiment="table", steps="2"):
    mixed_frame.to_csv("table.csv", index=False)
    main(["fit", "--config", str(ROOT / "configs" / "gan_breast_cancer.yaml"), "--data.builtin", "null", "--data.path", "table.csv",
          "--data.label", "outcome", "--data.batch_size", "16", "--model.generator.hidden", "[16]", "--model.discriminator.hidden", "[16]",
          "--trainer.max_steps", steps,
          "--trainer.logger.init_args.experiment_name", experiment, *NO_EVAL])
    return query_run(experiment)


def test_evaluate_attaches_the_report_to_the_checkpoints_run(mixed_frame, capsys):
    run, client = _fit_table(mixed_frame)
    assert not any(k.startswith("utility/") for k in run.data.metrics)
    ckpt = run.data.tags["release_artifact"]
    assert torch.load(ckpt, weights_only=True)["mlflow_run"]["run_id"] == run.info.run_id  # the release knows its run
    assert main(["evaluate", "--ckpt_path", ckpt, "--classifiers", FAST, "--output", "report.json"]) == 0
    out = capsys.readouterr().out
    assert f"logged to MLflow run {run.info.run_id}" in out and "utility/B/auroc_mean" in out
    after, _ = query_run("table")
    m = after.data.metrics
    for key in ("utility/A/auroc_mean", "utility/B/auroc_mean", "utility/C/auroc_mean", "utility/ranking_agreement_AC",
                "utility/feature_ranking_spearman", "utility/B/auroc/LogisticRegression", "utility/fidelity/tvd_1way",
                "utility/fidelity/tvd_2way", "utility/fidelity/corr_mae", "utility/A/fidelity/tvd_1way"):
        assert key in m, key
    assert [h.step for h in client.get_metric_history(run.info.run_id, "utility/B/auroc_mean")] == [2]  # the checkpoint's step
    artifacts = sorted(a.path for a in client.list_artifacts(run.info.run_id, "evaluation"))
    assert artifacts == ["evaluation/marginals_evaluate.png", "evaluation/report_evaluate.json", "evaluation/spearman_evaluate.png",
                         "evaluation/spearman_real_evaluate.csv", "evaluation/spearman_synthetic_evaluate.csv"]
    assert after.data.tags["evaluated_checkpoint"] == str(Path(ckpt).resolve())
    assert Path("report.json").is_file()
    # the same report again: evaluation is seeded
    main(["evaluate", "--ckpt_path", ckpt, "--classifiers", FAST, "--no_figures"])
    values = [h.value for h in client.get_metric_history(run.info.run_id, "utility/B/auroc_mean")]
    assert values[0] == values[1]
    capsys.readouterr()
    assert main(["compare", "--experiment", "table"]) == 0  # fidelity beside AUROC
    header = capsys.readouterr().out.splitlines()[0].split()
    assert {"auroc_B", "tvd_1way", "tvd_2way", "corr_mae"} <= set(header), header


def test_evaluate_finds_the_run_by_its_checkpoint_tag(mixed_frame):
    run, client = _fit_table(mixed_frame)
    ckpt = run.data.tags["release_artifact"]
    checkpoint = torch.load(ckpt, weights_only=False)
    del checkpoint["mlflow_run"]  # a checkpoint from before run ids were stored
    torch.save(checkpoint, ckpt)
    assert main(["evaluate", "--ckpt_path", ckpt, "--classifiers", "LogisticRegression", "--settings", "B", "--no_figures"]) == 0
    assert "utility/B/auroc_mean" in query_run("table")[0].data.metrics


def test_evaluate_of_an_in_memory_table_needs_the_data(mixed_frame, capsys):
    synth = Synthesizer("gan", max_steps=1, experiment="api", progress_bar=False, evaluate=False, log_samples=False, hidden=(8,))
    synth.fit(mixed_frame, label="outcome", batch_size=16)
    ckpt = synth.release_path
    assert main(["evaluate", "--ckpt_path", ckpt]) == 2
    assert "in-memory DataFrame: pass --data" in capsys.readouterr().err
    mixed_frame.to_csv("same.csv", index=False)
    assert main(["evaluate", "--ckpt_path", ckpt, "--data", "same.csv", "--classifiers", "LogisticRegression", "--no_figures"]) == 0
    assert "utility/B/auroc_mean" in query_run("api")[0].data.metrics
    mixed_frame.drop(columns=["region"]).to_csv("other.csv", index=False)
    assert main(["evaluate", "--ckpt_path", ckpt, "--data", "other.csv"]) == 2
    assert "does not match the model" in capsys.readouterr().err


def test_evaluate_an_image_run_and_compare_the_runs(capsys, mixed_frame):
    main(["fit", "--config", str(ROOT / "configs" / "gan_digits.yaml"), "--model.generator.z_dim", "8", "--model.generator.gf_dim", "8",
          "--model.discriminator.df_dim", "8", "--model.generator.fc_dim", "16", "--model.discriminator.fc_dim", "16", "--trainer.max_steps", "2", "--trainer.logger.init_args.run_name", "gan-a", *NO_EVAL])
    run, client = query_run("digits")
    assert main(["evaluate", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "400"]) == 0
    m = query_run("digits")[0].data.metrics
    for key in ("quality/inception_score", "quality/fid", "quality/inception_score_real", "utility/cnn_accuracy_val_selected"):
        assert key in m, key
    if "pategan" in model_classes():  # a private run in the same experiment: its ε is listed
        Synthesizer("pategan", epsilon=1.0, delta=1e-5, max_steps=1, experiment="digits", run_name="pategan-b", progress_bar=False,
                    evaluate=False, log_samples=False, planned_queries=2000, noise_seed=0).fit(
            mixed_frame, label="outcome", num_teachers=3, teacher_batch_size=8, class_ratio=[0.7, 0.3],
            schema={"age": {"min": 18, "max": 90}, "income": {"min": 0, "max": 120000}, "smoker": {"categories": ["no", "yes"]},
                    "region": {"categories": ["east", "north", "south", "west"]}, "visits": {"min": 0, "max": 2},
                    "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]}})
    capsys.readouterr()
    assert main(["compare", "--experiment", "digits", "--output", "runs.csv"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    for column in ("run", "model", "epsilon", "delta", "IS", "FID", "cnn_acc", "steps", "wall"):
        assert column in header, column
    import pandas as pd

    table = pd.read_csv("runs.csv")
    gan = table[table["run"].str.startswith("gan-a-")].iloc[0]
    assert gan["model"] == "GAN" and gan["steps"] == 2 and pd.isna(gan["epsilon"])
    assert gan["FID"] == pytest.approx(m["quality/fid"], rel=1e-6)
    if "pategan" in model_classes():
        private = table[table["run"].str.startswith("pategan-b-")].iloc[0]
        assert private["model"] == "PATEGAN" and 0 < private["epsilon"] <= 1.0 and private["delta"] == 1e-5
        assert str(private["guarantee"]).lower() == "false"  # noise_seed fixed above (tests): replayable noise


def test_compare_errors_are_clear(capsys):
    assert main(["compare", "--experiment", "nope"]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err
