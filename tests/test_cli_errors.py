"""Bad input on the command line, run as a user runs it (subprocesses): one line, exit code 2, and
the MLflow store as it was.

All cases share one folder with a finished earlier run in its store; they run two at a time, each a process
of its own forked from one that imported the CLI once (a fresh process spends most of its time importing
torch), then every case is checked on its own.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

from clitools import assert_one_line_error, run_cli_many, store_snapshot, tiny_gpate_config, write_tiny_table

# One module fixture runs every case's command once: keep its tests on one worker (pytest-xdist).
pytestmark = pytest.mark.xdist_group("cli_errors")

# name: (command line, expected fragments of the one-line error)
CASES = {
    "epsilon_not_positive": (["fit", "--config", "tiny.yaml", "--model.init_args.epsilon", "0"], ["epsilon must be > 0, got 0"]),
    "delta_outside_0_1": (["fit", "--config", "tiny.yaml", "--model.init_args.delta", "1.5"], ["delta must be in (0, 1), got 1.5"]),
    "unknown_label_column": (["fit", "--config", "tiny.yaml", "--data.init_args.label", "outcome"],
                             ["label column 'outcome' is not in the data", "columns are ['a', 'b', 'y']"]),
    "missing_file": (["fit", "--config", "tiny.yaml", "--data.init_args.path", "missing.csv"], ["data file not found", "missing.csv"]),
    "empty_csv": (["fit", "--config", "tiny.yaml", "--data.init_args.path", "empty.csv"], ["empty.csv is empty"]),
    "nan_with_missing_error": (["fit", "--config", "tiny.yaml", "--data.init_args.path", "holes.csv"],
                               ["missing values (NaN) in columns ['a']", "missing: drop"]),
    "string_category_undeclared": (["fit", "--config", "tiny.yaml", "--data.init_args.path", "colors.csv"],
                                   ["columns ['color']", "read from the private data", "Declare them public"]),
    "more_teachers_than_rows": (["fit", "--config", "tiny.yaml", "--data.init_args.num_teachers", "1000"],
                                ["too few rows per teacher", "1000 teachers", "data.num_teachers"]),
    "too_few_rows_per_teacher_after_split": (["fit", "--config", "tiny.yaml", "--data.init_args.num_teachers", "239"],
                                             ["too few rows per teacher", "(after the val/test split)", "239 teachers"]),
    "fit_from_a_file_that_is_not_a_checkpoint": (["fit", "--config", "tiny.yaml", "--ckpt_path", "notes.txt"],
                                                 ["notes.txt is not a readable PyTorch file"]),
    "fit_from_a_missing_checkpoint": (["fit", "--config", "tiny.yaml", "--ckpt_path", "gone.ckpt"], ["checkpoint not found", "gone.ckpt"]),
    "fit_from_another_models_checkpoint": (["fit", "--config", "tiny.yaml", "--ckpt_path", "foreign.ckpt"],
                                           ["holds a something.Else, but the config trains a lightning_gpate.models.gpate.GPATE"]),
    "sample_from_a_file_that_is_not_a_checkpoint": (["sample", "--ckpt_path", "notes.txt", "--num_samples", "5", "--output", "s.csv"],
                                                    ["notes.txt is not a readable PyTorch file"]),
    "unknown_config_key": (["fit", "--config", "tiny.yaml", "--model.init_args.epsilonn", "1"],
                           ["unknown option model.init_args.epsilonn; did you mean model.init_args.epsilon?"]),
}
# --debug adds the traceback.
OTHER_CASES = {
    "debug": ["fit", "--config", "tiny.yaml", "--model.init_args.epsilon", "-1", "--debug"],
}


def _prepare(folder: Path) -> None:
    write_tiny_table(folder / "table.csv")
    tiny_gpate_config(folder / "tiny.yaml", max_steps=2)  # a case that wrongly trains ends soon (and fails the store check)
    (folder / "empty.csv").write_text("")
    lines = (folder / "table.csv").read_text().splitlines()
    (folder / "holes.csv").write_text("\n".join([lines[0], ",".join(["", *lines[1].split(",")[1:]]), *lines[2:]]) + "\n")
    colors = ["red", "green", "blue"]
    (folder / "colors.csv").write_text("\n".join([lines[0] + ",color"] + [f"{line},{colors[i % 3]}" for i, line in enumerate(lines[1:])]) + "\n")
    (folder / "notes.txt").write_text("this is not a checkpoint\n")
    torch.save({"lightning_gpate": {"format": 1, "model_class": "something.Else"}, "state_dict": {}}, folder / "foreign.ckpt")


@contextlib.contextmanager
def _in(folder: Path):
    old_cwd, old_uri = Path.cwd(), os.environ.get("MLFLOW_TRACKING_URI")
    os.chdir(folder)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlruns' / 'mlflow.db'}"
    try:
        yield
    finally:
        os.chdir(old_cwd)
        if old_uri is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old_uri


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The shared folder, the store before, the store after, and every case's CompletedProcess."""
    from lightning_gpate.cli import main

    folder = tmp_path_factory.mktemp("cli_errors")
    _prepare(folder)
    with _in(folder):  # an earlier, finished run that no failed run may touch
        torch.set_num_threads(1)
        assert main(["fit", "--config", "tiny.yaml"]) == 0
    before = store_snapshot(folder / "mlruns")
    assert len(before["runs"]) == 1
    every = {**{k: v[0] for k, v in CASES.items()}, **OTHER_CASES}
    results = run_cli_many(every, cwd=folder)
    return folder, before, store_snapshot(folder / "mlruns"), results


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_ends_in_one_line_and_exit_code_2(ran, case):
    _, _, _, results = ran
    command = CASES[case][0][0]
    assert_one_line_error(results[case], command, *CASES[case][1])


def test_no_failed_run_touches_the_store(ran):
    folder, before, after, _ = ran
    assert after == before  # no run added (all of them fail before a run starts), none changed
    assert not (folder / "s.csv").exists()


def test_debug_shows_the_traceback_then_the_line(ran):
    result = ran[3]["debug"]
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "lightning-gpate fit: error: epsilon must be > 0, got -1.0"
