"""What a new user meets in the first hour: runs that keep their names, outputs others can open, one default δ,
logs a file can hold, progress on long stages, a summary that says what a fit did."""

from __future__ import annotations

import multiprocessing
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from clitools import ROOT, TINY_SCHEMA, start_cli, write_tiny_table
from lightning_gpate.cli import main

#: A run's name: what it is, when it started, a random id (``marginaltree-table-eps1-20261207-132540-c700``).
RUN_NAME = r"-\d{8}-\d{6}-[0-9a-f]{4}$"


@contextmanager
def umask(mask: int):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _table_fit_args(table: Path, model: str, *extra: str) -> list[str]:
    schema = str(TINY_SCHEMA).replace("'", "")  # {a: {min: 0, max: 1}, ...}: YAML
    return ["fit", "--model", model, "--model.epsilon", "1", "--data", "TabularDataModule", "--data.path", str(table),
            "--data.label", "y", "--data.schema", schema, "--data.class_ratio", "[0.5, 0.5]",
            "--trainer.logger.init_args.experiment_name", "first-hour", *extra]


def _synthesizer_run_name(frame, connection) -> None:
    from conftest import query_run
    from lightning_gpate import Synthesizer
    from test_api import PUBLIC_SCHEMA

    synth = Synthesizer("marginaltree", epsilon=1.0, delta=1e-5, seed=0, evaluate=False, log_samples=False, progress_bar=False,
                        experiment="names").fit(frame, label="outcome", schema=PUBLIC_SCHEMA)
    run, _ = query_run("names")
    connection.send((synth.run_id == run.info.run_id, run.info.run_name))


def test_two_synthesizer_fits_of_one_seed_in_two_processes_get_two_readable_names(mixed_frame):
    names = []
    context = multiprocessing.get_context("fork")
    for _ in range(2):  # one after the other: the store is one SQLite file
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_synthesizer_run_name, args=(mixed_frame, send))
        process.start()
        assert receive.poll(300), "the fit did not finish"
        same, name = receive.recv()
        process.join(60)
        assert same and process.exitcode == 0
        names.append(name)
    assert names[0] != names[1]
    for name in names:  # the model, the data, ε, the start, a short random id
        assert re.match(r"^marginaltree-table-eps1" + RUN_NAME, name), name


def test_a_table_model_fits_without_delta_shares_its_outputs_and_keeps_its_checkpoint_private(tmp_path, monkeypatch, capfd):
    """MarginalTree on a table, as the quickstart's follow-up: no --model.delta, the summary says what it did, the
    release and the samples have the user's permissions, the training checkpoint is owner-only."""
    monkeypatch.chdir(tmp_path)
    table = write_tiny_table(tmp_path / "table.csv")
    with umask(0o022):
        assert main(_table_fit_args(table, "MarginalTree", "--trainer.enable_checkpointing", "true",
                                    "--utility.classifiers", "[LogisticRegression]")) == 0
        out, err = capfd.readouterr()
        assert main(["sample", "--ckpt_path", _row(out, "release"), "--num_samples", "50", "--output", "out/s.csv"]) == 0
    release, checkpoint = Path(_row(out, "release")), Path(_row(out, "private").split()[2])
    assert "0 steps" not in out and "measured the marginals of 3 columns" in _row(out, "training")
    assert re.search(r"outputs/marginaltree-table-eps1" + RUN_NAME[:-1] + "/samples.csv", out), _row(out, "sample")
    for noise in ("configure_optimizers", "Tip:", "litlogger", "IterableDataset", "logging interval", "\r"):
        assert noise not in out + err, noise
    assert _mode(release) == 0o644 and _mode(tmp_path / "out" / "s.csv") == 0o644 and _mode(tmp_path / "out" / "s.png") == 0o644
    assert _mode(checkpoint) == 0o600 and _mode(checkpoint.parent) == 0o700 and _mode(tmp_path / "private") == 0o700
    import torch

    assert torch.load(release, weights_only=False)["hyper_parameters"]["delta"] == 1e-5  # the default every model has


def test_an_image_model_fits_without_delta_and_its_samples_are_shared(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    with umask(0o022):
        assert main(["fit", "--model", "DPMERF", "--model.epsilon", "1", "--model.num_features", "200",
                     "--model.generator_batch_size", "100", "--data", "ImageDataModule", "--data.dataset", "digits",
                     "--trainer.max_steps", "2", "--utility.enabled", "false", "--image_quality.enabled", "false"]) == 0
        release = _row(capfd.readouterr().out, "release")
        assert main(["sample", "--ckpt_path", release, "--num_samples", "20", "--output", "s.npz"]) == 0
        assert main(["sample", "--ckpt_path", release, "--num_samples", "20", "--output", "folder"]) == 0
    assert _mode(tmp_path / "s.npz") == 0o644 and _mode(tmp_path / "s.png") == 0o644
    assert _mode(tmp_path / "folder") == 0o755 and _mode(tmp_path / "folder.png") == 0o644
    pictures = list((tmp_path / "folder").rglob("*.png"))
    assert len(pictures) == 20 and all(_mode(p) == 0o644 for p in pictures)
    assert all(_mode(p) == 0o755 for p in (tmp_path / "folder").iterdir())


def test_the_quickstart_redirected_to_a_file_has_no_carriage_returns_and_fits_a_screen(tmp_path):
    """The quickstart's config, shortened to a few steps (its evaluations kept), its stdout and stderr to one file."""
    log = tmp_path / "fit.log"
    process = start_cli("fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_steps", "4",
                        "--utility.cnn_epochs", "2", "--image_quality.feature_epochs", "2", cwd=tmp_path, log=log)
    assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) <= 60, text
    progress = [line for line in lines if line.startswith("training: ")]
    assert progress[0].startswith("training: 1/4 steps") and progress[-1].startswith("training: 4 steps in"), progress
    assert "Epoch" not in text and "Tip:" not in text and "lightning-gpate fit: done" in text
    assert re.search(r"FID of real data \(estimated from halves of the held-out split\) \d", text)  # the FID's yardstick


def test_the_warm_start_of_pategan_s_table_default_shows_its_own_progress(mixed_frame, monkeypatch, capfd):
    import lightning_gpate.models.pategan as pategan
    import lightning_gpate.progress as progress
    from lightning_gpate import Synthesizer
    from test_api import PUBLIC_SCHEMA

    monkeypatch.setattr(progress, "FIRST_STATUS_SECONDS", 0.0)  # a status line every step, as a slow one gets every 30 s
    monkeypatch.setattr(progress, "STATUS_SECONDS", 0.0)
    monkeypatch.setattr(pategan, "TABLE_WARM_START", {**pategan.TABLE_WARM_START, "steps": 25, "sample_rows": 500})
    synth = Synthesizer("pategan", epsilon=1.0, max_steps=1, evaluate=False, log_samples=False, experiment="warm")
    synth.fit(mixed_frame, label="outcome", schema=PUBLIC_SCHEMA, class_ratio=[0.7, 0.3], num_teachers=3, teacher_batch_size=8)
    assert synth.model.hparams["warm_start"]["source"] == "marginals"  # the table default
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warm start: ")]
    assert re.match(r"warm start: 1/25 steps \(4%\), [\d.]+ s, about [\d.]+ s left$", lines[0]), lines
    assert re.match(r"warm start: 25 steps in [\d.]+ s$", lines[-1]), lines
    assert "\r" not in err


def _row(summary: str, key: str) -> str:
    """The value of a row of the fit summary."""
    found = re.search(rf"^  {key} +(.+)$", summary, re.M)
    assert found, (key, summary)
    return found.group(1).strip()
