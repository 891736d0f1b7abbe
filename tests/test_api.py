"""The Python API: fit a named model on a DataFrame, sample DataFrames back, the same MLflow run."""

import json
from pathlib import Path

import pytest

from conftest import query_run
from lightning_gpate import Synthesizer
from lightning_gpate.api import model_class, model_classes
from lightning_gpate.models import GAN
from lightning_gpate.models.private import PrivateMetadataError

FAST = ["LogisticRegression", "DecisionTree"]
PUBLIC_SCHEMA = {  # mixed_frame's metadata, declared public
    "age": {"min": 18, "max": 90}, "income": {"min": 0, "max": 120000}, "smoker": {"categories": ["no", "yes"]},
    "region": {"categories": ["east", "north", "south", "west"]}, "visits": {"min": 0, "max": 2},
    "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]},
}


def test_models_are_found_by_name():
    known = model_classes()
    assert known["gan"] is GAN
    assert model_class("GAN") is GAN and model_class("lightning_gpate.models.GAN") is GAN and model_class(GAN) is GAN
    for name in ("pategan", "gpate", "dpgan", "gswgan"):
        if name in known:
            assert model_class(name.upper()) is known[name]
    if "pategan" in known:
        assert model_class("PATE-GAN") is known["pategan"]
    with pytest.raises(ValueError, match="unknown model 'vae'; choose one of"):
        model_class("vae")


def test_fit_and_sample_a_dataframe_with_the_run_in_mlflow(mixed_frame):
    synth = Synthesizer("gan", max_steps=3, experiment="api", run_name="gan-api", progress_bar=False,
                        utility_options={"classifiers": FAST}, hidden=(16,), z_dim=8)
    assert synth.fit(mixed_frame, label="outcome", batch_size=16) is synth
    out = synth.sample(30, seed=3)
    assert list(out.columns) == list(mixed_frame.columns) and len(out) == 30
    assert (out.dtypes == mixed_frame.dtypes).all()
    assert set(out["region"]) <= set(mixed_frame["region"]) and out["age"].between(18, 89).all()
    assert out.equals(synth.sample(30, seed=3))  # seeded
    assert synth.epsilon is None and synth.privacy == {}

    run, client = query_run("api")
    assert run.info.run_id == synth.run_id and run.info.run_name.startswith("gan-api-")
    assert run.data.params["generator/z_dim"] == "8" and run.data.params["label"] == "outcome"
    assert run.data.metrics["utility/B/auroc_mean"] == pytest.approx(synth.report["B/auroc_mean"])
    assert "utility/ranking_agreement_AC" in run.data.metrics
    call = json.loads(Path(client.download_artifacts(run.info.run_id, "synthesizer.json")).read_text())
    assert call["model"] == "lightning_gpate.models.gan.GAN" and call["label"] == "outcome"
    assert synth.release_path == run.data.tags["release_artifact"]
    again = Synthesizer.load(synth.release_path)
    assert again.sample(30, seed=3).equals(out)


def test_private_model_epsilon_in_mlflow_and_live_on_the_progress_bar(mixed_frame):
    if "pategan" not in model_classes():
        pytest.skip("PATE-GAN is not in lightning_gpate.models")
    synth = Synthesizer("pategan", epsilon=1.0, delta=1e-5, max_steps=2, experiment="api-private", progress_bar=True,
                        evaluate=False, log_samples=False, trainer_options={"log_every_n_steps": 1}, planned_queries=2000, noise_seed=0)
    synth.fit(mixed_frame, label="outcome", schema=PUBLIC_SCHEMA, class_ratio=[0.7, 0.3], num_teachers=3, teacher_batch_size=8)
    spent = synth.epsilon
    assert 0 < spent <= 1.0 and synth.privacy["delta"] == 1e-5
    bar = synth.trainer.progress_bar_callback.get_metrics(synth.trainer, synth.model)
    assert float(bar["epsilon"]) == pytest.approx(spent, rel=1e-6)  # the bar shows the ε spent, live
    run, client = query_run("api-private")
    history = client.get_metric_history(run.info.run_id, "epsilon")
    assert len(history) == synth.trainer.global_step and history[-1].value == pytest.approx(spent, rel=1e-6)
    loaded = Synthesizer.load(synth.release_path)
    assert loaded.epsilon == pytest.approx(spent) and len(loaded.sample(5)) == 5


def test_privacy_arguments_and_bad_input_are_refused_clearly(mixed_frame):
    with pytest.raises(ValueError, match="GAN is not private"):
        Synthesizer("gan", epsilon=1.0)
    with pytest.raises(RuntimeError, match="fit the Synthesizer first"):
        Synthesizer("gan").sample(3)
    with pytest.raises(TypeError, match="DataFrame"):
        Synthesizer("gan").fit(mixed_frame.to_numpy(), label="outcome")
    private = [name for name in ("pategan", "dpgan", "gswgan", "gpate", "dpmerf", "marginaltree") if name in model_classes()]
    for name in private:  # epsilon is the user's choice; delta has one default, as on the command line
        with pytest.raises(ValueError, match="give epsilon=..."):
            Synthesizer(name, delta=1e-5)
        assert Synthesizer(name, epsilon=1.0).delta == 1e-5
    if "pategan" in private:  # bounds read from the private data are not free
        with pytest.raises(PrivateMetadataError):
            Synthesizer("pategan", epsilon=1.0, delta=1e-5, max_steps=1, progress_bar=False).fit(
                mixed_frame, label="outcome", num_teachers=3)
