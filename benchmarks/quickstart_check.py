"""Does the README's quickstart deliver what it promises? Time, ε, and whether its digits are recognisable.

Runs ``lightning-gpate fit --config configs/quickstart.yaml`` exactly as a new user would (the real
CLI, MLflow, the default evaluation callbacks) in a fresh MLflow store, with ``--threads`` CPU threads,
then loads the run's release artifact, generates 2,000 labelled digits, trains a logistic regression
on them and tests it on the real test split of the same DataModule. Writes
``benchmarks/results/quickstart.md`` (one line per call appended to ``quickstart.jsonl``).

Usage::

    python benchmarks/quickstart_check.py --threads 2 [--repeats 3] [-- extra CLI overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "benchmarks" / "results"


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of finished child processes: on a shared machine the wall time
    overstates; CPU time / threads is what the run would take alone."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(threads: int, extra: list[str], seed: int) -> dict:
    import mlflow
    import yaml

    from image_utility import logistic_regression_accuracy
    from datamodules import ImageDataModule
    from lightning_gpate.models.base import load_generator

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "OMP_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [sys.executable, "-c", "import sys; from lightning_gpate.cli import main; sys.exit(main())",
               "fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--seed_everything", str(seed),
               "--trainer.enable_progress_bar", "false", *extra]
        start, cpu_start = time.perf_counter(), _children_cpu_s()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, _children_cpu_s() - cpu_start
        if out.returncode != 0:
            return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "fit failed", "wall_s": wall,
                    "cpu_s": cpu}
        client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        exp = client.get_experiment_by_name("quickstart")
        run = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])[0]
        release_path = run.data.tags["release_artifact"]  # what a user samples from (the fit summary prints it)
        if not os.path.isabs(release_path):
            release_path = os.path.join(tmp, release_path)
        from lightning_gpate.release import load_release

        model = load_generator(release_path)
        steps = int(load_release(release_path)["global_step"])
        hp = model.hparams
        data_args = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())["data"]["init_args"]
        dm = ImageDataModule(**{k: v for k, v in data_args.items() if k != "num_teachers"})  # the quickstart's split
        acc = logistic_regression_accuracy(model, dm, num_samples=2000, seed=0)
        metrics = run.data.metrics
        return {
            "seed": seed, "threads": threads, "wall_s": wall, "cpu_s": cpu, "load_avg_1min": os.getloadavg()[0],
            "logreg_2000": acc,
            "epsilon": metrics.get("epsilon_final"), "epsilon_budget": float(hp.epsilon), "delta": float(hp.delta),
            "budget_accounting": hp.budget_accounting, "steps": steps,
            "cnn_accuracy_final": metrics.get("utility/cnn_accuracy_final"),
            "cnn_accuracy_val_selected": metrics.get("utility/cnn_accuracy_val_selected"),
            "stop_reason": run.data.tags.get("stop_reason"), "extra": extra,
            "summary": out.stdout[out.stdout.find("lightning-gpate fit: done"):].replace(tmp, "/…"),
        }


def write_table() -> Path:
    rows = [json.loads(line) for line in (RESULTS / "quickstart.jsonl").read_text().splitlines() if line.strip()]
    lines = ["# Quickstart check", "",
             "`benchmarks/quickstart_check.py`: `lightning-gpate fit --config configs/quickstart.yaml` through the real CLI "
             "(MLflow, default evaluation callbacks), timed end to end (wall time on a machine shared with other jobs: "
             "`load` is the 1-minute load average at the end; CPU s is the fit's user + system time, all threads); then a logistic regression trained on 2,000 "
             "generated digits, tested on the real test split (360 digits). Done when: ≤ 5 min on 2 CPU cores, a "
             "guaranteed ε ≤ 10, LogReg ≥ 0.3.", "",
             "| seed | threads | wall s | CPU s | load | steps | ε (guarantee) | stopped by | LogReg 2k | CNN final | CNN val-sel. | overrides |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=3: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        lines.append(f"| {r.get('seed')} | {r.get('threads')} | {f(r.get('wall_s'), 0)} | {f(r.get('cpu_s'), 0)} | {f(r.get('load_avg_1min'), 1)} | {r.get('steps', '–')} | {f(r.get('epsilon'))} | "
                     f"{(r.get('stop_reason') or r.get('error') or '–')[:40]} | {f(r.get('logreg_2000'))} | "
                     f"{f(r.get('cnn_accuracy_final'))} | {f(r.get('cnn_accuracy_val_selected'))} | {' '.join(r.get('extra') or []) or '–'} |")
    path = RESULTS / "quickstart.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="runs with seeds 0, 1, ...")
    p.add_argument("extra", nargs="*", help="extra CLI overrides after --")
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in range(a.repeats):
        record = run_once(a.threads, a.extra, seed)
        print(json.dumps(record), flush=True)
        if "error" not in record:
            print(f"seed {seed}: wall {record['wall_s']:.0f} s (CPU {record['cpu_s']:.0f} s, {a.threads} threads), "
                  f"{record['steps']} steps, epsilon {record['epsilon']:.3f} ({record['budget_accounting']}), "
                  f"LogReg on 2,000 samples {record['logreg_2000']:.3f}", flush=True)
        with open(RESULTS / "quickstart.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
    print(write_table())


if __name__ == "__main__":
    main()
