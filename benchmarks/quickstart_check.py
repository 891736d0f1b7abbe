"""Does the README's quickstart deliver what it promises? Time, ε, and whether its digits are recognisable.

Runs ``lightning-gpate fit --config configs/quickstart.yaml`` exactly as a new user would (the real
CLI, MLflow, the default evaluation callbacks) in a fresh MLflow store, with ``--threads`` CPU threads
(default: no thread variable set, the CLI's own choice),
then loads the run's release artifact, generates 2,000 labelled digits, trains a logistic regression
on them and tests it on the real test split of the same DataModule. Writes
``benchmarks/results/quickstart.md`` (one line per call appended to ``quickstart.jsonl``).

Usage::

    python benchmarks/quickstart_check.py [--threads 2] [--repeats 3] [--chart docs/img/quickstart_budget_spent.png] [-- extra CLI overrides]
    python benchmarks/quickstart_check.py --threads 2 -- --model.target_scale 0      # the votes ignored: the anchor alone
    python benchmarks/quickstart_check.py --threads 2 --config configs/gpate_digits_eps1.yaml
    python benchmarks/quickstart_check.py --threads 2 --config configs/gpate_digits_minimal.yaml [--paper-defaults]
    python benchmarks/quickstart_check.py --config configs/pategan_digits_minimal.yaml [--paper-defaults]   # also dpgan_, gswgan_
    python benchmarks/quickstart_check.py --threads 2 --tune -- --model.target_scale 0.5   # choose a setting: scored on validation

``--config`` runs another digits config the same way; ``--paper-defaults`` adds the config's model's former defaults
(the paper's settings: ``PAPER_SETTINGS`` of :mod:`~lightning_gpate.models.gpate`, ``pategan``, ``dpgan``, ``gswgan``) as
overrides, except what the config sets itself; ``--tune`` holds out a
validation split of the training digits (unaccounted tuning), scores the logistic regression on it instead of
the test digits, and turns off the fit's own evaluation (CNN accuracy, IS/FID: it scores on the test split): settings
are chosen that way, the test digits only score what was chosen.

The ``--thread-matrix`` mode (seconds per quickstart step under each CPU thread setting, beside a busy neighbour) was
removed in issue 60: its one measurement is ``benchmarks/results/quickstart_threads.md`` (rerun at commit 54b4527).
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
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
from image_utility import append_jsonl, read_jsonl  # noqa: E402


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of finished child processes: on a shared machine the wall time
    overstates; CPU time / threads is what the run would take alone."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: The thread variables a run clears before it sets its own (``--threads 0``: none set, the CLI's default)
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def draw_budget_chart(client, run_id: str, path: Path) -> None:
    """The run's ``epsilon`` (the guarantee) and ``epsilon_budget_spent_by_filter`` over the steps, as
    MLflow draws them side by side (docs/mlflow.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_gpate.privacy.disclosure import BUDGET_SPENT_METRIC

    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for key, style in (("epsilon", "-"), (BUDGET_SPENT_METRIC, "--")):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        ax.plot([m.step for m in history], [m.value for m in history], style, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("ε")
    ax.set_title("the quickstart's ε (guarantee) and the budget the filter spent", fontsize=10)
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


#: ``--tune``: settings are chosen on a validation split of the training digits (unaccounted tuning), never on the test digits
TUNING_VAL_FRACTION = 0.2
#: ``--tune``: the CLI's end-of-fit evaluation (CNN accuracy, IS/FID) scores on the test split; a tuning fit turns it off
#: (the fourth privacy review's S3: tuning records carried test-digit CNN accuracies)
TUNING_EVALUATION_OFF = ("--utility.enabled", "false", "--image_quality.enabled", "false")


def run_once(threads: int, extra: list[str], seed: int, chart: Path | None = None, config: Path = QUICKSTART,
             tune: bool = False, samples: Path | None = None) -> dict:
    import mlflow
    import yaml

    from image_utility import logistic_regression_accuracy
    from datamodules import ImageDataModule
    from lightning_gpate.models.base import load_generator

    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARIABLES}  # threads 0: the CLI's default
        env.update({"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-c", "import sys; from lightning_gpate.cli import main; sys.exit(main())",
               "fit", "--config", str(config), "--seed_everything", str(seed),
               "--trainer.enable_progress_bar", "false", *extra]
        if tune:  # the fit's own evaluation scores on the test split: off, so that nothing reads the test digits
            cmd += ["--data.val_fraction", str(TUNING_VAL_FRACTION), *TUNING_EVALUATION_OFF]
        start, cpu_start = time.perf_counter(), _children_cpu_s()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, _children_cpu_s() - cpu_start
        config = Path(config).resolve()
        from image_utility import settings_provenance

        record = {"config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
                  "settings_from": settings_provenance(config)[0] if config.is_relative_to(ROOT) else None,
                  "date": time.strftime("%Y-%m-%d", time.gmtime()), "scored_on": "val" if tune else "test", "seed": seed,
                  "threads": threads, "wall_s": wall, "cpu_s": cpu, "load_avg_1min": os.getloadavg()[0], "extra": extra}
        if out.returncode != 0:  # recorded as the run it was (a refused config is a result too)
            return {**record, "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "fit failed"}
        client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        run = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 order_by=["attributes.start_time DESC"])[0]  # the fresh store holds this run only
        release_path = run.data.tags["release_artifact"]  # what a user samples from (the fit summary prints it)
        if not os.path.isabs(release_path):
            release_path = os.path.join(tmp, release_path)
        from lightning_gpate.release import load_release

        model = load_generator(release_path)
        steps = int(load_release(release_path)["global_step"])
        hp = model.hparams
        data_args = yaml.safe_load(config.read_text())["data"]["init_args"]
        if tune:
            data_args["val_fraction"] = TUNING_VAL_FRACTION
        dm = ImageDataModule(**{k: v for k, v in data_args.items() if k != "num_teachers"})  # the config's split (the real test digits)
        acc = logistic_regression_accuracy(model, dm, num_samples=2000, seed=0, split="val" if tune else "test")
        metrics = run.data.metrics
        if chart is not None:
            draw_budget_chart(client, run.info.run_id, chart)
        if samples is not None:  # the picture `lightning-gpate sample` writes from the run's release, as the README shows
            subprocess.run([sys.executable, "-c", "import sys; from lightning_gpate.cli import main; sys.exit(main())", "sample",
                            "--ckpt_path", release_path, "--num_samples", "1000", "--output", f"{tmp}/samples.npz"],
                           cwd=tmp, env=env, check=True, capture_output=True)
            samples.write_bytes(Path(f"{tmp}/samples.png").read_bytes())
        return {
            **record, "logreg_2000": acc,
            "epsilon": metrics.get("epsilon_final"), "epsilon_budget": float(hp.epsilon), "delta": float(hp.delta),
            "budget_accounting": hp.budget_accounting, "steps": steps,
            # what the fit's own evaluation logged of the test split (none under --tune)
            "test_split_metrics": sorted(k for k in metrics if k.startswith(("utility/", "quality/"))),
            "cnn_accuracy_final": metrics.get("utility/cnn_accuracy_final"),
            "cnn_accuracy_val_selected": metrics.get("utility/cnn_accuracy_val_selected"),
            "stop_reason": run.data.tags.get("stop_reason"),
            "summary": out.stdout[out.stdout.find("lightning-gpate fit: done"):].replace(tmp, "/…"),
        }


def write_table() -> Path:
    rows = read_jsonl(RESULTS / "quickstart.jsonl")
    lines = ["# Quickstart check", "",
             "`benchmarks/quickstart_check.py`: `lightning-gpate fit --config configs/quickstart.yaml` through the real CLI "
             "(MLflow, default evaluation callbacks), timed end to end (wall time on a machine shared with other jobs: "
             "`load` is the 1-minute load average at the end; CPU s is the fit's user + system time, all threads); then a logistic regression trained on 2,000 "
             "generated digits, tested on the real test split (380 digits; `val`: a validation split of the training digits, "
             "`--tune`, how settings were chosen). Issue 47's targets: the quickstart ≤ 3 min on 2 CPU cores at a guaranteed "
             "ε = 10 with LogReg ≥ 0.80, its ε = 1 config ≥ 0.60, and the minimal G-PATE config "
             "(`configs/gpate_digits_minimal.yaml`) ≥ 0.3 above G-PATE's former defaults (`--paper-defaults`); the same comparison "
             "for PATE-GAN, DP-GAN and GS-WGAN (`configs/<model>_digits_minimal.yaml`, with and without `--paper-defaults`: "
             "each model's new defaults against its papers' settings, each run as its config says, `--threads 1`). Rows whose "
             "config reads *stale* ran an earlier quickstart (700 teachers of two digits, Confident-GNMax sign votes): "
             "without a date, before 2026-11-28 and without the anchor; dated 2026-11-28, with the anchor (2,000 features, "
             "length scale 6.5, 200 generated images a step) on half of ε. `CNN final` and `CNN val-sel.` are the fit's own "
             "evaluation, on the test split: a `val` row (`--tune`) has none since issue 58 turned that evaluation off for "
             "tuning; the `val` rows before it carry the test-split figures the fit logged (marked †: logged, not read to "
             "choose — the LogReg on the validation split chose). Where each setting of the configs came from: "
             "[their provenance](../../docs/results.md#where-the-settings-came-from).", "",
             "| date | config | scored on | seed | threads | wall s | CPU s | load | steps | ε (guarantee) | stopped by | LogReg 2k | CNN final | CNN val-sel. | overrides |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=3: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        # a tuning run's test-split figure (logged by the fit's evaluation before issue 58): shown, marked
        cnn = (lambda v: "–" if v is None else f"{v:.3f} †") if r.get("scored_on") == "val" else f
        config = r.get("config", "quickstart.yaml (stale: the previous config)").replace("configs/", "")
        lines.append(f"| {r.get('date', '–')} | {config} | {r.get('scored_on', 'test')} | {r.get('seed')} | {r.get('threads') or 'default'} | {f(r.get('wall_s'), 0)} | {f(r.get('cpu_s'), 0)} | {f(r.get('load_avg_1min'), 1)} | {r.get('steps', '–')} | {f(r.get('epsilon'))} | "
                     f"{(r.get('stop_reason') or r.get('error') or '–').removeprefix('lightning-gpate fit: error: ')[:40]} | {f(r.get('logreg_2000'))} | "
                     f"{cnn(r.get('cnn_accuracy_final'))} | {cnn(r.get('cnn_accuracy_val_selected'))} | {' '.join((['--paper-defaults'] if r.get('paper_defaults') else []) + (r.get('extra') or [])) or '–'} |")
    path = RESULTS / "quickstart.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def paper_default_places(cls, settings: dict) -> list[tuple[str, object]]:
    """``(place, value)`` of each entry of a model's ``PAPER_SETTINGS`` where the command line takes it now: a flat name
    of before the option groups at its group's places (``ema_decay`` → ``generator.ema_decay``), G-PATE's aggregator by
    its class (``aggregator: dpgradagg`` → ``aggregator`` ``DPGradAgg``) and that aggregator's parameters under it
    (``num_bins`` → ``aggregator.num_bins``), any other name as it is."""
    from lightning_gpate.models.aggregators import AGGREGATORS

    aggregator = AGGREGATORS.get(settings.get("aggregator")) if isinstance(settings.get("aggregator"), str) else None
    out = []
    for key, value in settings.items():
        if key == "aggregator" and aggregator is not None:
            out.append(("aggregator", aggregator.__name__))
        elif aggregator is not None and key in aggregator.FLAT:
            out.append((f"aggregator.{aggregator.FLAT[key]}", value))
        else:
            out += [(place, value) for place in getattr(cls, "FLAT_OPTIONS", {}).get(key, (key,))]
    return out


def paper_default_overrides(config: Path) -> list[str]:
    """``--model.<place> <value>`` for every entry of the config's model class's ``PAPER_SETTINGS`` (its former
    defaults, the paper's settings: G-PATE, PATE-GAN, DP-GAN, GS-WGAN) that the config does not set itself, at its
    place in the option groups (:func:`paper_default_places`)."""
    import importlib

    import yaml

    model = yaml.safe_load(Path(config).read_text())["model"]
    module, _, name = model["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    settings = getattr(importlib.import_module(cls.__module__), "PAPER_SETTINGS", None)
    if settings is None:
        raise SystemExit(f"--paper-defaults: {model['class_path']} has no PAPER_SETTINGS (its defaults are its paper's)")
    given = model.get("init_args") or {}

    def set_by_config(place: str) -> bool:
        group, _, option = place.partition(".")
        if not option:
            return group in given
        options = given.get(group) or {}
        return option in options.get("init_args", options)  # a class's group (the aggregator) keeps them in init_args

    def text(value) -> str:  # YAML, as the command line parses it (5.0e-05: YAML 1.1 reads 5e-05 as a string)
        value = list(value) if isinstance(value, tuple) else value
        return value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()

    return [item for place, value in paper_default_places(cls, settings) if not set_by_config(place)
            for item in (f"--model.{place}", text(value))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=QUICKSTART, help="the config to run as the quickstart is run (default: configs/quickstart.yaml)")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of the fit (0: none set, the CLI's default)")
    p.add_argument("--chart", type=Path, default=None, help="also draw the first run's epsilon and budget spent by the filter here (PNG)")
    p.add_argument("--repeats", type=int, default=1, help="runs with seeds 0, 1, ...")
    p.add_argument("--samples", type=Path, default=None, help="also copy the first run's samples.png (`lightning-gpate sample`) here")
    p.add_argument("--paper-defaults", action="store_true",
                   help="override with the config's model's former defaults, the paper's settings (its PAPER_SETTINGS)")
    p.add_argument("--tune", action="store_true", help="score on a validation split of the training digits (choosing settings)")
    p.add_argument("extra", nargs="*", help="extra CLI overrides after --")
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = list(a.extra)
    if a.paper_defaults:
        extra += paper_default_overrides(a.config)
    for seed in range(a.repeats):
        record = run_once(a.threads, extra, seed, chart=a.chart if seed == 0 else None, config=a.config.resolve(), tune=a.tune,
                          samples=a.samples if seed == 0 else None)
        if a.paper_defaults:
            record.update(extra=list(a.extra), paper_defaults=True)
        print(json.dumps(record), flush=True)
        if "error" not in record:
            print(f"seed {seed}: wall {record['wall_s']:.0f} s (CPU {record['cpu_s']:.0f} s, {a.threads} threads), "
                  f"{record['steps']} steps, epsilon {record['epsilon']:.3f} ({record['budget_accounting']}), "
                  f"LogReg on 2,000 samples {record['logreg_2000']:.3f}", flush=True)
        append_jsonl(RESULTS / "quickstart.jsonl", record)
    print(write_table())


if __name__ == "__main__":
    main()
