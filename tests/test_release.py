"""The release artifact holds the generator and public state only, is what MLflow gets and what
`sample` reads; the training checkpoint (teachers, discriminators, optimizers) stays private on disk."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import small_models
from callbacks import ReleaseArtifact
from conftest import query_run
from lightning_gpate.cli import main
from lightning_gpate.models import CheckpointError, load_generator
from lightning_gpate.release import RELEASE_ENTRIES, count_numbers, generator_parameter_count, load_release
from lightning_gpate.tracking import GPATEMLFlowLogger

ROOT = Path(__file__).resolve().parents[1]
#: Entries of a training checkpoint (private state): none may appear as a key anywhere in a release.
PRIVATE_KEYS = {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks", "gpate_teachers", "pategan_vote_noise",
                "opacus_rdp_accountant", "partition", "assignment", "TabularDataModule", "ImageDataModule"}


def _keys(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{prefix}{k}"
            yield from _keys(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v, prefix)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensors(v)


def _artifact_files(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _artifact_files(client, run_id, item.path) if item.is_dir else [item.path]
    return out


@pytest.mark.parametrize("kind", small_models.ALL)
def test_release_of_every_model_holds_the_generator_and_public_state_only(kind, tmp_path):
    model, dm = small_models.build(kind)
    small_models.fit(model, dm, steps=2, callbacks=[ReleaseArtifact()], logger=GPATEMLFlowLogger(experiment_name=f"rel-{kind}"),
                     enable_checkpointing=True)
    run, client = query_run(f"rel-{kind}")
    path = Path(run.data.tags["release_artifact"])
    release = torch.load(path, weights_only=True)  # a plain file of tensors, lists, dicts, strings and numbers

    assert sorted(release) == sorted(RELEASE_ENTRIES)
    generator = {k: v for k, v in model.generator_module.state_dict().items()}
    assert release["generator"].keys() == generator.keys()
    assert all(torch.equal(release["generator"][k], v.cpu()) for k, v in generator.items())
    params = sum(p.numel() for p in model.generator_module.parameters())
    assert generator_parameter_count(release) == params
    assert count_numbers(release) <= 1.2 * params, (count_numbers(release), params)
    n_train = dm.spec["num_train"]
    assert not any(n_train in t.shape for t in _tensors(release))  # nothing indexed by private rows
    leaked = [k for k in _keys(release) if k.split(".")[-1] in PRIVATE_KEYS]
    assert not leaked, leaked
    if kind != "gan":  # private models keep no private row count
        assert "num_train" not in release["hyper_parameters"]["data_spec"]
    assert release["mlflow_run"]["run_id"] == run.info.run_id
    if kind in small_models.PRIVATE:
        privacy = release["privacy"]
        assert privacy["summary"]["epsilon"] == pytest.approx(model.guarantee_epsilon()) == privacy["epsilon"]
        assert privacy["summary"]["epsilon_realised_not_a_bound"] == pytest.approx(model.accountant.epsilon())
        assert privacy["summary"]["best_order"] == model.guarantee_order()
        assert privacy["epsilon_budget"] == model.epsilon_budget and privacy["delta"] == 1e-5

    # MLflow holds the release and no training checkpoint; the training checkpoint is local and private
    files = _artifact_files(client, run.info.run_id)
    assert "release/release.pt" in files and not any(f.endswith(".ckpt") for f in files), files
    private = Path(run.data.tags["training_checkpoint"])
    assert private.is_file() and private.name == "last.ckpt" and "private" in private.parts
    assert not str(private.resolve()).startswith(str((tmp_path / "mlruns" / "artifacts").resolve()))

    # `sample` reads the release: the same samples as the trained model
    assert main(["sample", "--ckpt_path", str(path), "--num_samples", "25", "--output", "s.csv", "--seed", "3"]) == 0
    out = pd.read_csv("s.csv")
    assert len(out) == 25 and list(out.columns) == ["a", "b", "c", "y"]
    model.eval()
    x, _ = model.generate(25, seed=3)
    x_rel, _ = load_generator(str(path)).generate(25, seed=3)
    assert torch.allclose(x, x_rel)


def test_a_private_checkpoint_is_read_as_its_release_and_a_release_cannot_train(tmp_path):
    model, dm = small_models.build("pategan")
    trainer = small_models.fit(model, dm, steps=2)
    trainer.save_checkpoint(tmp_path / "private.ckpt")
    full = torch.load(tmp_path / "private.ckpt", weights_only=False)
    assert any(k.startswith("teachers.") for k in full["state_dict"])  # the training checkpoint has everything
    release = load_release(tmp_path / "private.ckpt")
    assert sorted(release) == sorted(RELEASE_ENTRIES) and count_numbers(release) <= 1.2 * generator_parameter_count(release)
    loaded = load_generator(str(tmp_path / "private.ckpt"))
    assert loaded.is_release
    assert torch.allclose(loaded.generate(10, seed=1)[0], model.eval().generate(10, seed=1)[0])
    assert loaded.accountant.epsilon() == pytest.approx(model.accountant.epsilon())
    with pytest.raises(RuntimeError, match="release artifact"):
        small_models.fit(loaded, dm, steps=1)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a lightning-gpate generator checkpoint: neither a release artifact"):
        load_generator(str(tmp_path / "other.pt"))


def test_gpate_teacher_state_is_written_only_when_checkpoints_are_asked_for(tmp_path):
    model, dm = small_models.build("gpate")
    small_models.fit(model, dm, steps=2, callbacks=[ReleaseArtifact()], logger=GPATEMLFlowLogger(experiment_name="no-ckpt"))
    run, _ = query_run("no-ckpt")
    assert "training_checkpoint" not in run.data.tags
    assert not list(tmp_path.rglob("*.ckpt"))  # no teacher state anywhere on disk
    assert "gpate_teachers" not in torch.load(run.data.tags["release_artifact"], weights_only=True)

    model, dm = small_models.build("gpate")
    release = ReleaseArtifact()
    small_models.fit(model, dm, steps=2, callbacks=[release], logger=GPATEMLFlowLogger(experiment_name="ckpt"),
                     enable_checkpointing=True)
    private = torch.load(release.training_checkpoint_path, weights_only=False)
    assert private["gpate_teachers"]["params"][model.teachers.param_names[0]].shape[0] == 12
    # Lightning's ModelCheckpoint writes into the same private folder, never into the MLflow store
    ckpts = sorted(tmp_path.rglob("*.ckpt"))
    assert ckpts and all("private" in p.relative_to(tmp_path).parts and "artifacts" not in p.parts for p in ckpts)
    # and resuming from the private checkpoint continues the same ε
    again, dm2 = small_models.build("gpate")
    small_models.fit(again, dm2, steps=3, ckpt_path=release.training_checkpoint_path)
    assert again.accountant.epsilon() > model.accountant.epsilon() and again.global_step == 3


def test_cli_quickstart_logs_only_the_release_and_resumes_from_the_private_checkpoint(tmp_path, capsys):
    quick = ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--data.num_teachers", "40",
             "--trainer.enable_progress_bar", "false", "--utility.enabled", "false", "--image_quality.enabled", "false",
             "--trainer.logger.init_args.experiment_name", "quick"]
    main([*quick, "--trainer.max_steps", "2", "--trainer.enable_checkpointing", "true"])
    run, client = query_run("quick")
    printed = capsys.readouterr().out
    release, private = run.data.tags["release_artifact"], run.data.tags["training_checkpoint"]
    assert release in printed and private in printed
    files = _artifact_files(client, run.info.run_id)
    assert sorted(f for f in files if not f.startswith("samples")) == ["config.yaml", "privacy/accountant.json", "release/release.pt"]
    assert Path(private).relative_to(tmp_path / "private")  # ./private/<experiment>/<run>/last.ckpt
    main([*quick, "--trainer.max_steps", "3", "--ckpt_path", private])
    resumed, _ = query_run("quick")
    assert resumed.info.run_id != run.info.run_id
    assert resumed.data.metrics["epsilon_final"] > run.data.metrics["epsilon_final"]
    assert main(["sample", "--ckpt_path", resumed.data.tags["release_artifact"], "--num_samples", "5", "--output", "q.npz"]) == 0
    assert np.load("q.npz")["images"].shape == (5, 1, 8, 8)


def test_release_artifacts_inside_the_mlflow_store_refuse_checkpoint_folders(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    from callbacks.artifacts import PrivateCheckpointError

    model, dm = small_models.build("gan")
    inside = ModelCheckpoint(dirpath=str(tmp_path / "mlruns" / "artifacts" / "oops"), every_n_train_steps=1)
    with pytest.raises(PrivateCheckpointError, match="inside the MLflow artifact store"):
        small_models.fit(model, dm, steps=1, callbacks=[ReleaseArtifact(), inside], logger=GPATEMLFlowLogger(experiment_name="bad"),
                         enable_checkpointing=True)
