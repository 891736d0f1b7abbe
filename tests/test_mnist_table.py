"""The MNIST table's runner (benchmarks/mnist_table.py) in its smoke mode: rows trained for a few steps on
tiny data, the table and the grids written, and a second call that continues from the first's state."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_smoke_table_is_written_and_a_second_call_continues_it(tmp_path):
    from mnist_table import ROWS, main

    first, second = tmp_path / "call1", tmp_path / "call2"
    absent = tmp_path / "no_data"  # no IDX files: random digits, whatever the machine holds
    assert main(["--smoke", "--data-root", str(absent), "--state", str(first), "--rows", "gan_nonprivate", "gpate_paper_eps10_guarantee"]) == 0
    done_first = json.loads((first / "results.json").read_text())["rows"]
    assert {k for k, v in done_first.items() if v["status"] == "done"} == {"gan_nonprivate", "gpate_paper_eps10_guarantee"}

    # the next call gets the first's state and runs only what is missing
    assert main(["--smoke", "--data-root", str(absent), "--state", str(second), "--resume-from", str(first),
                 "--rows", "gan_nonprivate", "gpate_paper_eps10_guarantee", "gswgan_eps10_paper", "gswgan_eps1_guarantee"]) == 0
    rows = json.loads((second / "results.json").read_text())["rows"]
    assert rows["gpate_paper_eps10_guarantee"]["row_s"] == done_first["gpate_paper_eps10_guarantee"]["row_s"]  # not run again
    assert rows["gswgan_eps10_paper"]["status"] == "done" and rows["gswgan_eps10_paper"]["pretrain_iterations"] == 2
    # GS-WGAN's rows share one pretraining of their discriminators: made by the first, found by the second
    assert (rows["gswgan_eps10_paper"]["pretrain_cached"], rows["gswgan_eps1_guarantee"]["pretrain_cached"]) == (False, True)
    assert len(list((second / "pretrained").glob("*.ckpt"))) == 1

    headline = (second / "results" / "mnist_table.md").read_text()  # one row per (model, ε): the headline configs
    assert headline.startswith("# SMOKE RUN (not results)")
    rows_shown = {line.split("`")[1]: line for line in headline.splitlines() if line.startswith("| ") and "`" in line}
    assert set(rows_shown) == {r.name for r in ROWS if r.headline} and "gpate_paper_eps10_guarantee" not in rows_shown
    assert "gpate_eps10_hybrid_guarantee" in rows_shown and "dpmerf_eps1_best" in rows_shown and "dpmerf_eps1_guarantee" not in rows_shown
    gan = rows_shown["gan_nonprivate"]  # run by this call: its hardware, date and a current config
    assert "CPU" in gan and time.strftime("%Y-%m-%d", time.gmtime()) in gan and gan.endswith("| current |")
    # where each row's settings came from (issue 58): in its record, from its config, and in the table
    assert rows["gan_nonprivate"]["settings_from"] == "paper" and rows["gpate_paper_eps10_guarantee"]["settings_from"] == "paper"
    assert "| settings from |" in headline and "| test→validation |" in rows_shown["dpmerf_eps1_best"]
    assert rows_shown["pategan_eps10_guarantee"].endswith("| not run yet |")
    table = (second / "results" / "mnist_table_archive.md").read_text()  # every row
    assert table.startswith("# SMOKE RUN (not results)")
    lines = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines() if line.startswith("| `")}
    assert set(lines) == {r.name for r in ROWS}  # every row of the table, run or not
    header = next(line for line in table.splitlines() if line.startswith("| row |"))
    for column in ("ε spent (guarantee, δ=1e-5 unless said)", "steps", "s/step", "CNN acc final", "CNN acc val-sel. (synthetic)",
                   "paper", "IS", "FID", "samples"):
        assert f" {column} |" in header
    gpate = lines["gpate_paper_eps10_guarantee"].split(" | ")
    assert gpate[5].endswith(" of 10") and 0 < float(gpate[5].split()[0]) <= 10  # a guarantee within the budget
    assert gpate[7] == "2" and "0.8092" in lines["gpate_paper_eps10_guarantee"]  # steps; the paper's figure beside it
    assert float(gpate[10]) >= 0 and gpate[14] == "paper" and float(gpate[16]) >= 1.0  # CNN accuracy, settings from, IS
    assert "– (non-private)" in lines["gan_nonprivate"] and "0.9653" in lines["gan_nonprivate"]
    assert "the paper's accounting, not a guarantee" in lines["gswgan_eps10_paper"]  # labelled, never as the guarantee
    assert "not run yet" in lines["dpgan_eps10_guarantee"]
    for name in ("gan_nonprivate", "gpate_paper_eps10_guarantee", "gswgan_eps10_paper", "gswgan_eps1_guarantee"):
        assert f"[grid](mnist_table/{name}.png)" in lines[name]
        assert (second / "results" / "mnist_table" / f"{name}.png").stat().st_size > 0
    assert "Real digits, the same evaluation" in table


def test_a_failed_evaluation_keeps_the_fit_and_runners_side_by_side_merge(tmp_path, monkeypatch):
    import mnist_table

    absent = tmp_path / "no_data"

    def broken(*args, **kwargs):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(mnist_table, "evaluate_row", broken)
    a, b, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    assert mnist_table.main(["--smoke", "--data-root", str(absent), "--state", str(a), "--rows", "gpate_paper_eps10_guarantee"]) == 1
    row = json.loads((a / "results.json").read_text())["rows"]["gpate_paper_eps10_guarantee"]
    # what the fit measured stays: steps and the ε it spent, with where it failed
    assert row["status"] == "error" and row["error"].startswith("evaluation: RuntimeError: Expected all tensors")
    assert row["steps"] == 2 and 0 < row["epsilon_guarantee"] <= 10
    monkeypatch.undo()

    assert mnist_table.main(["--smoke", "--data-root", str(absent), "--state", str(b), "--no-baseline",
                             "--rows", "gpate_paper_eps10_guarantee", "gan_nonprivate"]) == 0
    assert mnist_table.main(["--state", str(merged), "--merge-from", str(a), str(b), "--results", str(merged / "results"),
                             "--note", "rows ran side by side"]) == 0
    data = json.loads((merged / "results.json").read_text())
    assert {k: v["status"] for k, v in data["rows"].items()} == {"gpate_paper_eps10_guarantee": "done", "gan_nonprivate": "done"}
    assert data["meta"]["real_baseline"] == json.loads((a / "results.json").read_text())["meta"]["real_baseline"]
    table = (merged / "results" / "mnist_table_archive.md").read_text()
    assert "* rows ran side by side" in table
    # a later merge of the failed record does not replace the finished row; a finished rerun would
    assert mnist_table.main(["--state", str(merged), "--merge-from", str(a), "--results", str(merged / "results")]) == 0
    assert json.loads((merged / "results.json").read_text())["rows"]["gpate_paper_eps10_guarantee"]["status"] == "done"
    rerun = json.loads((b / "results.json").read_text())
    rerun["rows"]["gan_nonprivate"]["steps"] = 99
    (b / "results.json").write_text(json.dumps(rerun))
    assert mnist_table.main(["--state", str(merged), "--merge-from", str(b), "--results", str(merged / "results")]) == 0
    assert json.loads((merged / "results.json").read_text())["rows"]["gan_nonprivate"]["steps"] == 99
    for name in ("gpate_paper_eps10_guarantee", "gan_nonprivate"):
        assert (merged / "results" / "mnist_table" / f"{name}.png").is_file()


def test_the_prepared_device_call_dry_runs_every_row_side_by_side_on_the_cpu(tmp_path):
    """Issue 57: ``DRY_RUN=1 bash benchmarks/mnist_table_gpu.sh`` is the prepared device call (benchmarks/device_call.txt,
    one runner a line, each with its own time scale) on this CPU for a few steps, so that the first device call cannot
    fail on an import, a path, a config key or a missing wheel: its plan is printed first, every row of every runner
    trains and is evaluated, and the runners' states are merged into one table and packed."""
    import os
    import subprocess
    import tarfile

    from mnist_table import runner_spec

    lines = [line for line in (ROOT / "benchmarks" / "device_call.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
    runners = [runner_spec(line) for line in lines]
    rows = [name for _, names in runners for name in names]
    assert rows[:2] == ["gpate_eps10_hybrid_guarantee", "gpate_eps10_gaussagg_guarantee"]  # the priority order
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "WORK": str(tmp_path / "work"), "DATA_ROOT": str(tmp_path / "no_data"),
           "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "mnist_table_gpu.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    plan = out.stdout[:out.stdout.index("rc=")]  # printed before any runner ended
    for i, (scale, names) in enumerate(runners, 1):
        assert f"runner {i} (time x{scale:g}):" in plan and all(f"  {name}: " in plan for name in names)
    # a row with a GPU measurement says the steps its time reaches: G-PATE's at 3x its 120 s on the H200 of 2026-11-27
    assert "gpate_eps10_hybrid_guarantee: train 360 s + ~50 s; max_steps 3,000; ~991 steps at 0.363 s/step" in plan
    with tarfile.open(tmp_path / "mnist_table_call.tgz") as tar:
        names = set(tar.getnames())
        merged = json.loads(tar.extractfile("./merged/results.json").read())
    assert {k: v["status"] for k, v in merged["rows"].items()} == dict.fromkeys(rows, "done")
    assert f"{len(runners)} runners side by side on one GPU: s/step includes the sharing" in merged["meta"]["notes"]
    assert f"({' '.join(runners[6][1])}, time x{runners[6][0]:g})" in out.stdout  # a runner's own time scale
    assert {"./merged/results/mnist_table.md", "./merged/grids/dpgan_eps1_guarantee.png"} <= names


def test_a_split_rows_checkpoint_travels_with_the_merged_state(tmp_path):
    """A row split over calls (DP-GAN's) continues from its training checkpoint: merging a runner's state
    into the one the next call resumes from brings the checkpoint along (and the next call resumes it)."""
    import mnist_table

    source, merged = tmp_path / "runner", tmp_path / "merged"
    (source / "ckpt").mkdir(parents=True)
    (source / "ckpt" / "dpgan_eps10_guarantee.ckpt").write_bytes(b"training state")
    record = {"row": "dpgan_eps10_guarantee", "status": "partial", "checkpoint": "ckpt/dpgan_eps10_guarantee.ckpt",
              "train_s_used": 470.0}
    mnist_table.save_state(source, {"rows": {"dpgan_eps10_guarantee": record}, "meta": {}})
    assert mnist_table.main(["--state", str(merged), "--merge-from", str(source), "--results", str(merged / "results")]) == 0
    assert (merged / "ckpt" / "dpgan_eps10_guarantee.ckpt").read_bytes() == b"training state"
    assert json.loads((merged / "results.json").read_text())["rows"]["dpgan_eps10_guarantee"] == record


def test_a_row_that_nearly_fits_the_call_runs_shortened_and_big_rows_keep_time_for_their_evaluation():
    """An H100 call lost both its G-PATE rows: one was planned to fill the call exactly and waited (its runner
    started a second later than the plan), the other (4,000 teachers) trained its whole budget and was stopped
    inside its evaluation, before anything was written."""
    from mnist_table import BY_NAME, MIN_TRAIN_SHARE, row_overhead, training_seconds

    assert training_seconds(480, 0, 45, 600, splittable=False) == 480  # fits
    assert training_seconds(480, 0, 45, 520, splittable=False) == 475  # a few seconds short: runs shortened
    assert training_seconds(480, 0, 45, 45 + MIN_TRAIN_SHARE * 480 - 1, splittable=False) is None  # waits
    assert training_seconds(850, 0, 10, 100, splittable=True) == 90  # split over calls
    assert training_seconds(850, 0, 10, 30, splittable=True) is None
    assert training_seconds(300, 240, 30, 400, splittable=False) is None  # the pretraining counts too
    # G-PATE's teachers: ~45 s at 2,000 teachers on the H200, more at 4,000; DP-GAN has none
    assert 40 <= row_overhead(BY_NAME["gpate_eps10_ladder_guarantee"]) < row_overhead(BY_NAME["gpate_eps1_ladder_guarantee"])
    assert row_overhead(BY_NAME["dpgan_eps10_guarantee"]) <= 15


def test_set_overrides_reach_the_rows_whose_model_takes_them_and_the_table_names_them():
    """``--set teacher_conv_impl=bmm`` (the GPU kernel lever): a G-PATE row's model gets it, a DP-GAN row's model
    (which has no such argument) does not, and the table names it beside the row that ran with it."""
    import argparse

    import pytest

    import image_utility
    import mnist_table

    a = argparse.Namespace(set=["model.teacher_conv_impl=bmm", "ema_decay=0.995"], smoke=False, data_root=Path("x"))
    _, gpate_over, _, _ = mnist_table.row_settings(mnist_table.BY_NAME["gpate_eps10_gaussagg_guarantee"], a)
    assert gpate_over["teachers"]["conv_impl"] == "bmm" and gpate_over["generator"]["ema_decay"] == 0.995
    # an aggregator's flat name of before the groups reaches G-PATE, whose config's aggregator takes it
    a_agg = argparse.Namespace(set=["sigma_gnmax=5"], smoke=False, data_root=Path("x"))
    _, paper_over, _, _ = mnist_table.row_settings(mnist_table.BY_NAME["gpate_paper_eps10_guarantee"], a_agg)
    assert paper_over["sigma_gnmax"] == 5
    _, dpgan_over, _, _ = mnist_table.row_settings(mnist_table.BY_NAME["dpgan_eps10_guarantee"], a)
    assert "teacher_conv_impl" not in dpgan_over
    record = {"status": "done", "model": "GPATE", "steps": 3, "set": {"teacher_conv_impl": "bmm"}}
    lines = mnist_table.table_lines({"rows": {"gpate_eps10_gaussagg_guarantee": record}, "meta": {}}, smoke=True)
    assert any(line.startswith("| `gpate_eps10_gaussagg_guarantee` (teacher_conv_impl: bmm) |") for line in lines)
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        image_utility.parse_sets(["teacher_conv_impl"])
    # the tuning ladder's noise-free rung (`--set epsilon=1e8`): YAML 1.1 reads 1e8 as a string; a number is meant
    sets = image_utility.parse_sets(["epsilon=1e8", "length_scale=[7, 10, 14]", "model.mechanism=gaussian"])
    assert sets == {"epsilon": 1e8, "length_scale": [7, 10, 14], "mechanism": "gaussian"}


def test_a_row_trains_with_cudnn_s_algorithm_search_where_its_config_asks_for_it(tmp_path, monkeypatch):
    """G-PATE's configs set ``trainer.benchmark: true`` (its grouped convolutions have fixed shapes: 0.35 -> 0.13 s an
    aggregation at 2,000 teachers on an H200); the runner's own ``Trainer`` must follow the row's config, which
    DP-GAN's (Poisson-sampled batches of varying size) leaves unset."""
    import argparse

    import pytest

    import mnist_table

    asked = {}

    class Built(Exception):
        pass

    def trainer(a, *, max_steps, callbacks, benchmark=None):
        asked["benchmark"] = benchmark
        raise Built

    monkeypatch.setattr(mnist_table, "_trainer", trainer)
    data = mnist_table.smoke_data(tmp_path / "no_data", tmp_path / "digits")  # random digits
    a = argparse.Namespace(set=None, smoke=True, smoke_steps=2, data_root=data, device="cpu")
    for row, expected in (("gpate_eps10_hybrid_guarantee", True), ("dpgan_eps10_guarantee", None)):
        with pytest.raises(Built):
            mnist_table.fit_row(mnist_table.BY_NAME[row], a, seconds=60, state=tmp_path, resume=None)
        assert asked.pop("benchmark") is expected, row


def test_tuning_fits_on_the_tuning_split_and_scores_on_the_validation_split_never_reading_the_test_digits(tmp_path, monkeypatch):
    """--tune (issue 46): settings are chosen on a validation split of the training digits; the run reads the training
    split's two parts (fit, score) and never the test digits, and records what it scored on."""
    from datamodules.base import GenerativeDataModule
    from mnist_table import TUNE_VAL_FRACTION, main

    read = []
    original = GenerativeDataModule.model_space
    monkeypatch.setattr(GenerativeDataModule, "model_space", lambda self, split: (read.append(split), original(self, split))[1])
    out = tmp_path / "tuning.jsonl"
    assert main(["--smoke", "--tune", "--data-root", str(tmp_path / "no_data"), "--state", str(tmp_path / "state"), "--rows",
                 "dpmerf_eps1_guarantee", "--steps", "2", "--tune-results", str(out), "--name", "probe", "--set", "length_scale=10",
                 "--score-at", "1", "2"]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert "test" not in read and "val" in read
    assert record["name"] == "probe" and record["steps"] == 2 and record["set"] == {"length_scale": 10}
    assert [point["steps"] for point in record["validation_curve"]] == [1, 2]  # --score-at: the steps lever in one run
    assert all(0 <= point["validation_cnn_accuracy_final"] <= 1 for point in record["validation_curve"])
    assert 0 <= record["validation_cnn_accuracy_final"] <= 1 and "cnn_accuracy_final" not in record
    total = record["num_tuning"] + record["num_validation"]
    assert abs(record["num_validation"] - TUNE_VAL_FRACTION * total) < 0.05 * total


def test_scoring_during_a_tuning_run_leaves_the_runs_random_state_as_it_was():
    """--score-at scores mid-run (generating, training a CNN): the run's own draws after it are the ones it would
    have made without it."""
    from types import SimpleNamespace

    import torch
    from mnist_table import ValidationCurve

    curve = ValidationCurve([5], lambda model, dm: {"draw": float(torch.rand(()))})
    trainer = SimpleNamespace(global_step=5, datamodule=None)
    torch.manual_seed(0)
    curve.on_train_batch_end(trainer, None, None, None, 0)
    after_scoring = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_scoring, torch.rand(3)) and len(curve.curve) == 1
    curve.on_train_batch_end(trainer, None, None, None, 1)  # the same step again (a second batch end): scored once
    assert len(curve.curve) == 1


def test_a_row_whose_config_changed_since_its_run_is_marked_stale_and_comments_or_speed_settings_do_not_count(tmp_path, monkeypatch):
    import mnist_table

    config = tmp_path / "configs" / "mnist" / "gan_nonprivate.yaml"
    config.parent.mkdir(parents=True)
    config.write_text((ROOT / "configs" / "mnist" / "gan_nonprivate.yaml").read_text())
    monkeypatch.setattr(mnist_table, "ROOT", tmp_path)
    row = mnist_table.BY_NAME["gan_nonprivate"]
    record = {"status": "done", "privacy": "none", "machine": "NVIDIA H200", "date": "2026-11-26",
              "config_fingerprint": mnist_table.config_fingerprint(config)}
    assert mnist_table.row_status(row, record) == "current"
    assert "\ntrainer:\n" in config.read_text()
    config.write_text("# a new comment\n" + config.read_text().replace("\ntrainer:\n", "\ntrainer:\n  benchmark: true\n"))
    assert mnist_table.row_status(row, record) == "current"  # comments and cuDNN's search change no result
    config.write_text(config.read_text().replace("z_dim: 100", "z_dim: 64"))
    assert mnist_table.row_status(row, record).startswith("STALE")
    assert mnist_table.row_status(row, {k: v for k, v in record.items() if k != "config_fingerprint"}).startswith("STALE")
    lines = mnist_table.headline_lines({"rows": {"gan_nonprivate": record}}, smoke=False)
    assert any("`gan_nonprivate`" in line and "NVIDIA H200" in line and "2026-11-26" in line and "STALE" in line for line in lines)


def test_a_record_of_a_config_as_written_before_the_option_groups_is_current_where_the_groups_kept_its_settings():
    """Issue 60 moved flat names into groups in every config's text, not its settings (tests/test_option_groups.py): a
    record whose fingerprint is its config's at the last flat commit (benchmarks/flat_config_fingerprints.json) is
    current; one of any other text is stale."""
    import subprocess

    import mnist_table

    row = mnist_table.BY_NAME["dpgan_warm_eps10_guarantee"]
    flat = subprocess.run(["git", "show", f"54b4527:{row.config}"], cwd=ROOT, capture_output=True, text=True)
    if flat.returncode != 0:  # a shallow clone: the fingerprints file is what the table reads
        flat_print = mnist_table.flat_fingerprint(row.config)
    else:
        written = ROOT / "benchmarks" / "results" / ".flat_config_probe.yaml"
        try:
            written.write_text(flat.stdout)
            flat_print = mnist_table.config_fingerprint(written)
        finally:
            written.unlink(missing_ok=True)
        assert flat_print == mnist_table.flat_fingerprint(row.config)
    assert flat_print != mnist_table.config_fingerprint(ROOT / row.config)  # the text moved to groups
    record = {"status": "done", "privacy": "guarantee", "stopped_by": "max_steps=200", "steps": 200, "max_steps": 200,
              "epsilon_guarantee": 7.43, "epsilon_budget": 10.0, "config_fingerprint": flat_print}
    assert mnist_table.row_status(row, record) == "current"
    assert mnist_table.row_status(row, {**record, "config_fingerprint": "0123456789abcdef"}).startswith("STALE")
    new_row = mnist_table.BY_NAME["gswgan_warm_eps1_cpu_guarantee"]  # written after the groups: no flat fingerprint
    assert mnist_table.flat_fingerprint(new_row.config) is None
    assert mnist_table.row_status(new_row, {k: v for k, v in record.items() if k != "config_fingerprint"}).startswith("STALE")


def test_a_one_release_row_stopped_by_its_time_before_its_steps_is_partial_though_its_whole_epsilon_is_spent():
    """DP-MERF spends all of ε in its first step: a row its time stopped at step 357 of 800 must not read as the
    config's result (the headline table would show it as current)."""
    import mnist_table

    row = mnist_table.BY_NAME["dpmerf_eps1_guarantee"]
    record = {"status": "done", "privacy": "guarantee", "model": "DPMERF", "epsilon_guarantee": 1.0, "epsilon_budget": 1.0,
              "stopped_by": "row time budget", "steps": 357, "max_steps": 800,
              "config_fingerprint": mnist_table.config_fingerprint(ROOT / row.config)}
    assert mnist_table.row_status(row, record) == "partial: stopped by the row's time at step 357 of 800"
    assert mnist_table.row_status(row, {**record, "steps": 800, "stopped_by": "max_steps=800"}) == "current"
    gpate = {**record, "model": "GPATE", "epsilon_guarantee": 9.89, "epsilon_budget": 10.0, "max_steps": 20000}
    assert mnist_table.row_status(row, gpate) == "current"  # ε nearly spent: its budget, not its time, bounds it
    # stopped by its config's own max_steps with ε left (a fine-tuning stopped where validation was flat): the config's
    # result; stopped by the row's time with ε left: partial
    warm = {**gpate, "epsilon_guarantee": 7.43, "steps": 200, "max_steps": 200, "stopped_by": "max_steps=200"}
    assert mnist_table.row_status(row, warm) == "current"
    assert mnist_table.row_status(row, {**warm, "steps": 120, "stopped_by": "row time budget"}).startswith("partial: stopped by row time budget")


def test_a_ceiling_run_starts_from_a_saved_warm_start_s_networks_under_its_own_budget(tmp_path, monkeypatch):
    """--tune-weights-from (issue 56's noise-free ceiling): a tuning run starts from a saved run's generator, critic and
    warm-start release, not measuring the release again, under its own settings and budget (here σ ≈ 0, no budget);
    a wider critic starts fresh and is named; a generator of another shape is refused; a resume excludes it."""
    import pytest
    from lightning_gpate.models.warm_start import WarmStartRelease
    from mnist_table import main

    common = ["--smoke", "--tune", "--data-root", str(tmp_path / "no_data"), "--state", str(tmp_path / "state"), "--rows",
              "dpgan_warm_eps10_guarantee", "--tune-results", str(tmp_path / "tuning.jsonl")]
    saved = tmp_path / "warm.ckpt"
    assert main([*common, "--steps", "1", "--tune-save", str(saved), "--name", "warm"]) == 0
    measured = []
    original = WarmStartRelease.measure
    monkeypatch.setattr(WarmStartRelease, "measure", lambda self, *a, **k: (measured.append(1), original(self, *a, **k))[1])
    ceiling = ["--tune-weights-from", str(saved), "--steps", "2", "--set", "noise_multiplier=0.01", "epsilon=1e18"]
    assert main([*common, *ceiling, "--name", "ceiling"]) == 0
    assert main([*common, *ceiling, "critic.df_dim=16", "--name", "wider"]) == 0
    warm, ceiling_run, wider = [json.loads(line) for line in (tmp_path / "tuning.jsonl").read_text().splitlines()]
    assert measured == []  # the saved release is the one the ceiling fine-tunes from
    assert warm["privacy"] == "guarantee" and ceiling_run["privacy"].startswith("none (noise-free")
    assert ceiling_run["weights_from"] == {"checkpoint": str(saved), "fresh": []}
    assert wider["weights_from"]["fresh"] == ["discriminator"]
    with pytest.raises(SystemExit, match="do not match"):
        main([*common, *ceiling, "generator.gf_dim=16", "--name", "other"])
    with pytest.raises(SystemExit):
        main([*common, *ceiling, "--tune-from", str(saved)])
