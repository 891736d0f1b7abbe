"""The CPU proxy's learning-curve picture (``benchmarks/gpate_mnist_cpu.py --plot``): it draws what was recorded."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _record(name: str, selected: float, curve: dict, **steps) -> dict:
    return {"name": name, "cnn_accuracy_val_selected": selected, "cnn_accuracy_final": 0.0,
            "curve": {str(k): {"cnn_accuracy_val_selected": v, "cnn_accuracy_final": 0.0} for k, v in curve.items()}, **steps}


def test_a_curve_is_the_selected_accuracy_at_each_evaluation_then_at_the_end():
    from gpate_mnist_cpu import learning_curve

    anchor = _record("a", 0.90, {300: 0.86, 150: 0.80}, generator_steps=400)
    fit = _record("f", 0.70, {100: 0.40}, aggregations=250, generator_steps=None)
    assert learning_curve(anchor) == ([150, 300, 400], [0.80, 0.86, 0.90])
    assert learning_curve(fit) == ([100, 250], [0.40, 0.70])


def test_plot_draws_the_last_record_of_each_run_and_refuses_an_unknown_one_in_one_line(tmp_path, monkeypatch):
    import gpate_mnist_cpu

    results = tmp_path / "runs.jsonl"
    records = [_record("a", 0.10, {}, generator_steps=100), _record("a", 0.90, {150: 0.8}, generator_steps=300),
               _record("b", 0.60, {}, aggregations=50)]
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = {}
    import matplotlib.axes

    draw = matplotlib.axes.Axes.plot

    def plot(self, x, y, **kwargs):  # what each run's line is drawn from
        drawn[kwargs["label"]] = (list(x), list(y))
        return draw(self, x, y, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    png = tmp_path / "out" / "curves.png"
    assert gpate_mnist_cpu.main(["--plot", str(png), "--results", str(results), "--runs", "a=anchor", "b",
                                 "--targets", "0.8=target", "0.6"]) == 0
    assert png.stat().st_size > 0
    assert drawn == {"anchor": ([150, 300], [0.8, 0.90]), "b": ([50], [0.60])}
    with pytest.raises(SystemExit, match="no run named 'c'"):
        gpate_mnist_cpu.main(["--plot", str(png), "--results", str(results), "--runs", "c"])


def test_device_cuda_without_a_gpu_refuses_in_one_line_before_reading_anything(tmp_path):
    import torch

    import gpate_mnist_cpu

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpate_mnist_cpu.main(["--name", "x", "--device", "cuda", "--results", str(tmp_path / "r.jsonl"),
                              "--data-root", str(tmp_path / "absent")])
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("anchor_only", [True, False], ids=["anchor-only", "fit"])
def test_a_run_stopped_early_keeps_its_measured_points_in_one_record(tmp_path, monkeypatch, anchor_only):
    """Ctrl-C (and kill / timeout, which the script turns into it) after an ``--eval-at`` point: the run's record
    holds its curve so far and says where it stopped, with no final figures, and its learning curve draws it."""
    import image_utility
    import mnist_table

    import gpate_mnist_cpu

    data = mnist_table.smoke_data(tmp_path / "none", tmp_path / "digits")  # random digits, not the official files
    build = image_utility.build
    monkeypatch.setattr(image_utility, "build", lambda config, *, model_overrides, data_overrides: build(
        config, model_overrides=model_overrides, data_overrides={**data_overrides, "verify_checksums": False}))

    def progress(what, step, steps, start, **kwargs):  # the user's Ctrl-C, in the third step
        if step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(gpate_mnist_cpu, "report_progress", progress)
    import lightning_gpate.evaluation.image as evaluation  # its CNN is not what is tested: a fixed score, at once

    monkeypatch.setattr(evaluation, "cnn_utility", lambda *args, **kwargs: {"cnn_accuracy_final": 0.25, "cnn_accuracy_val_selected": 0.5})
    results = tmp_path / "r.jsonl"
    argv = ["--name", "stopped", "--config", "configs/mnist/gpate_eps10_hybrid_guarantee.yaml", "--steps", "50",
            "--eval-at", "2", "--threads", "1", "--num-samples", "20", "--teachers", "2", "--data-root", str(data),
            "--results", str(results), "--out-dir", str(tmp_path / "out"),
            "--set", "anchor_batch_size=20", "anchor_features=64", "teacher_warmup_steps=0", "fake_batch_size=8"]
    if anchor_only:
        assert gpate_mnist_cpu.main([*argv, "--anchor-only"]) == 1
    else:
        with pytest.raises(SystemExit) as stop:  # Lightning's own exit after a KeyboardInterrupt
            gpate_mnist_cpu.main(argv)
        assert stop.value.code == 1
    [record] = [json.loads(line) for line in results.read_text().splitlines()]
    unit = "generator steps" if anchor_only else "aggregations"
    assert record["stopped"] == f"KeyboardInterrupt after {2 if anchor_only else 3} {unit} of 50"
    assert set(record["curve"]) == {"2"} and "cnn_accuracy_val_selected" not in record
    assert record.get("anchor_only", False) == anchor_only and record.get("teachers", 2) == 2
    assert gpate_mnist_cpu.learning_curve(record) == ([2], [0.5])
