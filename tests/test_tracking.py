"""MLflow experiments are model-training experiments: MLflow 3's UI opens an experiment without a kind
in its GenAI view (traces, judges, prompts), where a fit's metric charts and artifacts are not shown."""

from __future__ import annotations

import os

import mlflow

from lightning_gpate.tracking import GPATEMLFlowLogger, run_page_url, training_experiment_id

KIND = "mlflow.experimentKind"


def _client():
    return mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


def _kind(name: str):
    return _client().get_experiment_by_name(name).tags.get(KIND)


def test_a_fit_logger_creates_a_model_training_experiment():
    logger = GPATEMLFlowLogger(experiment_name="fits", run_name="r")
    run_id = logger.run_id
    assert _kind("fits") == "custom_model_development"
    assert _client().get_run(run_id).info.experiment_id == logger.experiment_id
    again = GPATEMLFlowLogger(experiment_name="fits")  # a second run joins the same experiment
    assert again.run_id != run_id and again.experiment_id == logger.experiment_id


def test_an_experiment_without_a_kind_gets_it_and_another_kind_is_kept():
    client = _client()
    old = client.create_experiment("older")  # as created before experiments had a kind
    assert _kind("older") is None
    assert GPATEMLFlowLogger(experiment_name="older").experiment_id == old
    assert _kind("older") == "custom_model_development"
    client.create_experiment("chosen", tags={KIND: "genai_development"})
    training_experiment_id(client, "chosen")
    assert _kind("chosen") == "genai_development"


def test_evaluate_into_a_new_run_creates_a_model_training_experiment():
    from datamodules import ImageDataModule
    from lightning_gpate.evaluation.store import evaluate_checkpoint
    from lightning_gpate.models import GAN
    from lightning_gpate.release import build_release, save_release

    dm = ImageDataModule("digits")
    model = GAN(dm.spec, z_dim=8, gf_dim=8, df_dim=8, fc_dim=16)
    save_release(build_release(model, datamodule=dm), "release.pt")  # no run: evaluate starts one
    _, run_id, _, _ = evaluate_checkpoint("release.pt", new_run_experiment="evaluations", utility=False, quality=False, figures=False)
    assert _kind("evaluations") == "custom_model_development"
    assert _client().get_run(run_id).info.experiment_id == _client().get_experiment_by_name("evaluations").experiment_id


def test_the_run_page_link_opens_the_model_training_view():
    # MLflow 3.17's UI picks its view with a switch the browser remembers (GenAI by default), not from
    # the experiment's kind; the fit summary's link selects the training view with its URL parameter
    assert run_page_url("sqlite:///mlruns/mlflow.db", "3", "abc") == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert run_page_url("https://mlflow.example.org/", "3", "abc") == "https://mlflow.example.org/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert run_page_url("databricks", "3", "abc") is None
