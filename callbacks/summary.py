"""FitSummary: what a finished fit did, in a few lines for the person who ran it.

``lightning-gpate fit`` prints :meth:`FitSummary.text` at the very end (global rank 0, after the
progress bar and the evaluations). A fit that fails
is tagged ``error`` in its run (the exception's type) and gets no summary: the run's status is ``FAILED``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytorch_lightning as pl

from lightning_gpate.privacy.disclosure import privacy_lines, release_allowed, stop_reason
from lightning_gpate.progress import duration
from lightning_gpate.tracking import mlflow_logger_of, run_page_url

#: Figures worth a line of the summary, in this order: (metric key, label). The evaluation callbacks
#: log many more (see MLflow); these are the papers' headline measures.
#: A private model's figures computed from its real training split without noise are logged (on request
#: only) under ``private/``, and labelled so here.
HEADLINE_METRICS = (
    ("utility/A/auroc_mean", "AUROC real→real (A)"),
    ("private/utility/A/auroc_mean", "AUROC real→real (A; private diagnostic, unnoised)"),
    ("utility/B/auroc_mean", "AUROC synthetic→real (B)"),
    ("utility/C/auroc_mean", "AUROC synthetic→synthetic (C)"),
    ("utility/ranking_agreement_AC", "ranking agreement A/C"),
    ("utility/fidelity/tvd_1way", "fidelity: 1-way TVD synthetic vs real (0 = same marginals, lower is better)"),
    ("utility/fidelity/tvd_2way", "fidelity: 2-way TVD synthetic vs real"),
    ("utility/fidelity/corr_mae", "fidelity: mean |Pearson correlation gap|"),
    ("utility/fidelity/quantile_tvd_1way", "values: 1-way TVD on the real deciles of each numeric column"),
    ("utility/fidelity/quantile_tvd_2way", "values: 2-way TVD on the real deciles of pairs of numeric columns"),
    ("utility/fidelity/w1_scaled", "values: Wasserstein-1 ÷ real (q95 − q05), mean over numeric columns"),
    ("utility/A/fidelity/tvd_1way", "fidelity floor: 1-way TVD of the real splits"),
    ("utility/A/fidelity/tvd_2way", "fidelity floor: 2-way TVD of the real splits"),
    ("utility/A/fidelity/quantile_tvd_1way", "values floor: 1-way decile TVD of the real splits"),
    ("utility/A/fidelity/w1_scaled", "values floor: W1 ÷ (q95 − q05) of the real splits"),
    ("private/utility/A/fidelity/tvd_1way", "fidelity floor: 1-way TVD of the real splits (private diagnostic, unnoised)"),
    ("private/utility/A/fidelity/tvd_2way", "fidelity floor: 2-way TVD of the real splits (private diagnostic, unnoised)"),
    ("private/utility/A/fidelity/quantile_tvd_1way", "values floor: 1-way decile TVD of the real splits (private diagnostic, unnoised)"),
    ("private/utility/A/fidelity/w1_scaled", "values floor: W1 ÷ (q95 − q05) of the real splits (private diagnostic, unnoised)"),
    ("private/utility/ranking_agreement_AC", "ranking agreement A/C (private diagnostic, unnoised)"),
    ("utility/cnn_accuracy_final", "CNN accuracy on real test (final epoch)"),
    ("utility/cnn_accuracy_val_selected", "CNN accuracy on real test (selected on synthetic val)"),
    ("quality/inception_score", "Inception Score"),
    ("quality/inception_score_real", "Inception Score of real data"),
    ("quality/fid", "FID"),
    ("quality/fid_real_train_vs_reference", "FID of real data (the training split)"),
    ("quality/fid_real_val_vs_reference", "FID of real data (the validation split)"),
    ("quality/fid_real_reference_halves", "FID of real data (estimated from halves of the held-out split)"),
    ("private/quality/inception_score", "Inception Score (features trained on the training split; private diagnostic)"),
    ("private/quality/fid", "FID (features trained on the training split; private diagnostic)"),
    ("private/quality/fid_real_train_vs_reference", "FID of real data (the training split; private diagnostic)"),
)


def one_line(text: Any) -> str:
    """``text`` with its whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def _data_line(datamodule, spec: dict[str, Any]) -> str:
    """The data a run used, from public facts only (no row counts: the summary may be shared like a log)."""
    source = None
    if datamodule is not None:
        if getattr(datamodule, "dataset", None) and datamodule.dataset != "csv":
            source = datamodule.dataset
        elif getattr(datamodule, "path", None):
            source = str(datamodule.path)
        elif getattr(datamodule, "builtin", None):
            source = f"builtin {datamodule.builtin}"
        elif getattr(datamodule, "frame", None) is not None:
            source = "a DataFrame"
    kind = spec.get("kind", "?")
    if kind == "image":
        shape = "×".join(str(s) for s in spec.get("shape", []))
        what = f"images {shape}, {spec.get('num_classes')} classes"
    else:
        what = f"table of {len(spec.get('columns', []))} columns + label {spec.get('label', {}).get('name')!r}, {spec.get('num_classes')} classes"
    teachers = getattr(datamodule, "num_teachers", 0) if datamodule is not None else 0
    parts = [p for p in (source, what, f"{teachers} teachers" if teachers else None) if p]
    return ", ".join(parts)


def _metric_lines(metrics: dict[str, float]) -> list[str]:
    from lightning_gpate.evaluation.fidelity import worst_column

    lines = []
    for key, label in HEADLINE_METRICS:
        value = metrics.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            lines.append(f"{label} {value:.4g}")
    worst = worst_column(metrics, "utility/fidelity/")
    if worst is not None:  # the column a user should look at first, in its own units
        name, figures = worst
        lines.append(f"values: worst column {name!r}: decile TVD {figures['quantile_tvd']:.3g}, W1 ÷ (q95 − q05) "
                     f"{figures.get('w1_scaled', math.nan):.3g}, median real {figures.get('median_real', math.nan):.4g} → "
                     f"synthetic {figures.get('median_synthetic', math.nan):.4g}")
    return lines


#: Where the summary's ``sample`` command writes: a folder the repository ignores (``/outputs/`` in
#: .gitignore), one per run, so that samples neither land among the project's files nor overwrite
#: another run's.
SAMPLES_DIR = "outputs"


def samples_output(spec: dict[str, Any], run_name: str | None) -> str:
    """The ``--output`` of the summary's ``sample`` command: ``outputs/<run name>/samples.npz`` (``.csv`` for tables;
    for a folder of images, a folder ``samples`` of PNGs in class folders: what the user gave)."""
    name = "samples" if spec.get("dataset") == "folder" else f"samples.{'csv' if spec['kind'] == 'tabular' else 'npz'}"
    return "/".join([SAMPLES_DIR, *([run_name] if run_name else []), name])


def _sqlite_ui_command(tracking_uri: str | None) -> str:
    if tracking_uri and tracking_uri.startswith(("http://", "https://", "databricks")):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


#: The private GANs that MarginalTree beat on the tables measured (benchmarks/results/tabular_utility.md: cervical and
#: cardio at ε = 1 and 10 with tuned settings; issue 59's five development tables at ε = 1 with the defaults).
TABLE_GANS = ("PATEGAN", "GPATE", "DPGAN", "GSWGAN")
#: Issue 59, the GANs on tables with their defaults (what ``Synthesizer("<gan>", epsilon=1.0, ...)`` gives, 100 teachers):
#: (this model's, MarginalTree's, private-pgm MST's mean AUROC, which tables, where this model's mean AUROC was the higher
#: one or None) — Setting B, 12 classifiers, ε = 1, means over the development tables (cervical, cardio, breast cancer,
#: fair, randhie) of each table's mean over the split seeds the GAN was measured on, MarginalTree and MST on the same
#: seeds (benchmarks/results/tabular_utility_notes.md; ``python benchmarks/tabular_utility.py --defaults-table``).
TABLE_AUROC = {"PATEGAN": (0.723, 0.743, 0.684, "five development tables", None),  # its warm start from the marginal model
               "GPATE": (0.724, 0.743, 0.684, "five development tables",
                         "cervical and breast cancer (G-PATE 0.776 and 0.906, MarginalTree 0.765 and 0.902), with randhie "
                         "level (0.5823 both)"),
               "DPGAN": (0.557, 0.683, 0.668, "the three development tables where it took a step (none on cervical and breast cancer)", None),
               "GSWGAN": (0.514, 0.743, 0.684, "five development tables", None)}


def table_advice(pl_module) -> str | None:
    """What a user who fitted a private GAN on a table should know: the marginal model is the better choice for tables,
    and by how much (measured)."""
    name = type(pl_module).__name__
    if pl_module.data_spec.get("kind") != "tabular" or name not in TABLE_GANS:
        return None
    gan, tree, mst, tables, exception = TABLE_AUROC[name]
    higher = "on every one" if exception is None else f"on every one but {exception}"
    return (f"for tables, MarginalTree is the better choice (Synthesizer(\"marginaltree\", ...), or --model "
            f"lightning_gpate.models.MarginalTree): on {tables} at epsilon 1 this model with its defaults had a mean AUROC of "
            f"{gan:.2f}, MarginalTree {tree:.2f} (about a second a fit) and private-pgm MST {mst:.2f}; MarginalTree gave a lower "
            f"2-way TVD than this model on every table and ε measured and a higher mean AUROC {higher} "
            f"(docs/results.md)")


class FitSummary(pl.Callback):
    """Times the fit, tags a failed run with its error, and writes the end-of-fit summary.

    Attributes:
        wall_time: seconds from the start of fitting to the end of training (``None`` before).
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._train_end: float | None = None
        self._first_step: int = 0
        self.wall_time: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._start = time.monotonic()

    def on_train_start(self, trainer, pl_module) -> None:
        self._first_step = trainer.global_step  # after a checkpoint was restored

    def on_train_end(self, trainer, pl_module) -> None:
        self._train_end = time.monotonic()
        if self._start is not None:
            self.wall_time = self._train_end - self._start

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        logger = mlflow_logger_of(trainer)
        # Only a run that exists: asking for logger.run_id would create one just to record the failure.
        if logger is None or not trainer.is_global_zero or getattr(logger, "_run_id", None) is None:
            return
        # The type only: a message may describe the private data (row counts, values), and runs are logs.
        logger.experiment.set_tag(logger.run_id, "error", f"{type(exception).__name__} (the message was printed, not logged)")

    # ----------------------------------------------------------------- the summary
    def text(self, trainer: pl.Trainer, pl_module, *, command: str = "lightning-gpate") -> str:
        """The summary of a finished fit (call it on global rank 0, after ``trainer.fit``)."""
        from callbacks.artifacts import ReleaseArtifact
        from callbacks.periodic import PeriodicEvaluation
        from lightning_gpate.evaluation.fidelity import value_advice

        rows: list[tuple[str, str]] = []
        rows.append(("model", type(pl_module).__name__))
        rows.append(("data", _data_line(trainer.datamodule, pl_module.data_spec)))
        took = f" in {duration(self.wall_time)}" if self.wall_time is not None else ""
        after = f" (then {duration(time.monotonic() - self._train_end)} of evaluation and logging)" if self._train_end else ""
        work = pl_module.work_done() if trainer.global_step == self._first_step and hasattr(pl_module, "work_done") else None
        steps = work or f"{trainer.global_step} steps"  # a model that fits without steps says what it did
        if self._first_step:
            steps += f" ({trainer.global_step - self._first_step} in this run, resumed at step {self._first_step})"
        rows.append(("training", f"{steps}{took}{after}"))
        rows.append(("stopped", stop_reason(trainer, pl_module)))
        rows += [("privacy", line) for line in privacy_lines(pl_module)]
        metrics: dict[str, float] = {}
        for cb in trainer.callbacks:
            if isinstance(cb, PeriodicEvaluation):
                metrics.update(cb.logged_metrics())
        figures = _metric_lines(metrics)
        rows += [("utility", line) for line in figures] or [("utility", "not computed (evaluation disabled, or see the run's *_error tags)")]
        advice = table_advice(pl_module)
        if advice:
            rows.append(("advice", advice))
        rows += [("advice", line) for line in value_advice(metrics, pl_module.data_spec, "utility/fidelity/")]
        artifacts = next((cb for cb in trainer.callbacks if isinstance(cb, ReleaseArtifact)), None)
        release = artifacts.release_path if artifacts is not None else None
        training_ckpt = artifacts.training_checkpoint_path if artifacts is not None else None
        if release is not None:
            rows.append(("release", str(release)))
        elif getattr(pl_module, "has_release", False) and not release_allowed(pl_module):
            rows.append(("release", "NOT written: the released epsilon exceeds the target (see 'stopped')"))
        if training_ckpt is not None:
            if not pl_module.has_release:
                use = "its only output: pass it as --model.pretrained_checkpoint"
            elif getattr(pl_module, "budget_exhausted", False):
                use = "the budget is spent: it cannot train further"
            else:
                use = "resume with --ckpt_path"
            rows.append(("private", f"training checkpoint {training_ckpt} (never logged, keep it private; {use})"))
        logger = mlflow_logger_of(trainer)
        run_name = None
        if logger is not None and getattr(logger, "_run_id", None) is not None:
            exp = logger.experiment.get_experiment(logger.experiment_id)
            run_name = logger.experiment.get_run(logger.run_id).info.run_name
            rows.append(("MLflow", f"run {logger.run_id} in experiment {exp.name!r}"))
        if release is not None:
            rows.append(("sample", f"{command} sample --ckpt_path {release} --num_samples 1000 --output "
                                   f"{samples_output(pl_module.data_spec, run_name)}"))
        if logger is not None:
            rows.append(("browse", _sqlite_ui_command(getattr(logger, "_tracking_uri", None))))
            if getattr(logger, "_run_id", None) is not None:
                url = run_page_url(getattr(logger, "_tracking_uri", None), logger.experiment_id, logger.run_id)
                if url:
                    rows.append(("browse", f"then {url}  (MLflow's model-training view)"))
        width = max(len(k) for k, _ in rows)
        lines = [f"{command} fit: done"]
        previous = None
        for key, value in rows:
            lines.append(f"  {'' if key == previous else key:<{width}}  {value}")
            previous = key
        return "\n".join(lines)
