"""The distinguishing game: many fits on D and on D ∪ {target}, each one's synthetic table kept.

World 0 trains on D, world 1 on D ∪ {target}; every fit uses the same config, a distinct public seed
(``seed_everything``: initialisation, data order, latent draws) and fresh secret mechanism noise (the
models draw it from :mod:`lightning_gpate.privacy.randomness`, OS-seeded), and releases the same number
of synthetic rows in both worlds. Fits run without MLflow, callbacks or evaluation, in worker processes
that import torch once and are reused. Every finished fit's table and facts are written to the output
folder at once, so an interrupted audit continues where it stopped, and a rerun with more ``runs``
only trains the new fits.

The worst case (the PATE-GAN replication study's): D = four records (0, 0, 0), target (1, 1, 1). The
project's generators are conditional, so the third column ``y`` is the label; all three columns are
binary with categories {0, 1} declared public, and the class ratio is declared public as [0.5, 0.5]
(it depends on neither world). A model's config applies with its data source replaced: only its
training options (``batch_size``, ``num_teachers``, ``teacher_batch_size``, ``partition_seed``,
``remainder``) are kept, so a config for the worst case must fit four rows (e.g. at most 4 teachers,
a batch of at most 4 for the GAN); ``configs/audit/`` has one per model.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import io
import json
import logging
import math
import os
import time
import warnings
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import yaml

WORST_CASE = "worst_case"
WORST_CASE_TARGET = "1,1,1"
#: DataModule options a config keeps on any audit dataset (how to train, not what the data is).
TRAINING_DATA_OPTIONS = ("batch_size", "num_teachers", "teacher_batch_size", "partition_seed", "remainder")
#: More options a config keeps on a FILE dataset (what its columns are).
FILE_DATA_OPTIONS = ("label", "schema", "class_ratio", "sep", "na_values", "missing", "drop_columns",
                     "metadata_epsilon", "label_ratio_epsilon", "quantile_epsilon")


class AuditError(ValueError):
    """Bad audit input, or a fit that failed; the message says which and why."""


# ----------------------------------------------------------------------------- the two worlds
@dataclass
class AuditData:
    """The two training sets of the game and what is declared public about them."""

    name: str
    without_target: pd.DataFrame  # D (world 0)
    with_target: pd.DataFrame  # D ∪ {target} (world 1)
    target: dict[str, Any]
    data_options: dict[str, Any]  # TabularDataModule arguments besides the frame (label, schema, ...)
    identity: dict[str, Any] = field(default_factory=dict)  # what makes two audits the same data

    def frame(self, world: int) -> pd.DataFrame:
        return self.with_target if world == 1 else self.without_target


def worst_case_data(target: str | None = None) -> AuditData:
    """D = 4 × (0, 0, 0), target (1, 1, 1); label ``y``; categories and class ratio declared public."""
    if target not in (None, WORST_CASE_TARGET):
        raise AuditError(f"the worst case's target is (1, 1, 1) (--target {WORST_CASE_TARGET}); got {target!r}")
    columns = ("x1", "x2", "y")
    without = pd.DataFrame({c: [0, 0, 0, 0] for c in columns})
    row = {c: 1 for c in columns}
    options = {
        "label": "y",
        "schema": {c: {"type": "binary", "categories": [0, 1], "dtype": "int64"} for c in columns},
        "class_ratio": [0.5, 0.5],
    }
    return AuditData(WORST_CASE, without, pd.concat([without, pd.DataFrame([row])], ignore_index=True), row, options,
                     {"dataset": WORST_CASE, "target": WORST_CASE_TARGET})


def file_data(path: str | Path, target: str, config_data: dict[str, Any]) -> AuditData:
    """D ∪ {target} and D from a CSV file. ``target``: a row index of the file (D is the file without
    that row) or comma-separated values of a row (D is the file, the row is added)."""
    path = Path(path)
    if not path.is_file():
        raise AuditError(f"dataset file not found: {path.resolve()} (or use --dataset {WORST_CASE})")
    if target is None:
        raise AuditError("--target is required with a dataset file: a row index of the file, or the row's values")
    options = {k: config_data[k] for k in FILE_DATA_OPTIONS if k in config_data}
    if "label" not in options:
        raise AuditError("the config's data section names no label column (data.init_args.label)")
    from datamodules.base import read_data_csv  # (imports torch: only for a file dataset)

    read = dict(sep=options.get("sep", ","), na_values=options.get("na_values"))
    frame = read_data_csv(path, **read)  # the DataModules' reader: its errors quote no line of the private file
    target = str(target).strip()
    if target.lstrip("-").isdigit():
        index = int(target)
        if not 0 <= index < len(frame):
            # the file's row count is private (a neighbour's presence changes it): the message states none
            raise AuditError(f"--target {index} is not a row of {path}: give the index of one of its rows (from 0), "
                             f"or the row's values")
        without = frame.drop(index=frame.index[index]).reset_index(drop=True)
        with_target, row = frame, frame.iloc[index].to_dict()
    else:
        header = read["sep"].join(frame.columns)
        row_frame = None
        if len(target.split(",")) == frame.shape[1]:  # counted here: pandas takes a field too many as an index
            try:
                row_frame = pd.read_csv(io.StringIO(f"{header}\n{target.replace(',', read['sep'])}"), **read)
            except pd.errors.ParserError:
                pass
        if row_frame is None or row_frame.shape != (1, frame.shape[1]):
            raise AuditError(f"--target {target!r} must give one value per column of {path}: {list(frame.columns)}")
        row_frame = row_frame.astype(frame.dtypes.to_dict(), errors="ignore")
        without, with_target = frame, pd.concat([frame, row_frame], ignore_index=True)
        row = row_frame.iloc[0].to_dict()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return AuditData(str(path), without, with_target, row, options,
                     {"dataset": str(path.resolve()), "sha256": digest, "target": target})


# ----------------------------------------------------------------------------- the fit
@dataclass
class FitSettings:
    """Everything one fit needs (picklable: sent once to every worker)."""

    model_class: str
    model_args: dict[str, Any]
    data: AuditData
    training_options: dict[str, Any]
    max_steps: int
    num_rows: int
    accelerator: str = "cpu"

    @property
    def is_private(self) -> bool:
        from lightning_gpate.models.private import PrivateGenerativeModel

        return issubclass(import_class(self.model_class), PrivateGenerativeModel)

    def claimed(self) -> tuple[float, float]:
        """The (ε, δ) the config claims (ε = ∞, δ = 0 for a non-private model)."""
        if not self.is_private:
            return math.inf, 0.0
        defaults = {k: p.default for k, p in inspect.signature(import_class(self.model_class).__init__).parameters.items()}
        epsilon, delta = self.model_args.get("epsilon", defaults.get("epsilon")), self.model_args.get("delta", defaults.get("delta"))
        if epsilon is None or delta is None or epsilon is inspect.Parameter.empty or delta is inspect.Parameter.empty:
            raise AuditError("the config's model must give epsilon and delta (model.init_args)")
        return float(epsilon), float(delta)


def import_class(class_path: str):
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise AuditError(f"cannot import the config's model class {class_path!r}: {err}") from err


def load_settings(config_path: str | Path, dataset: str, target: str | None, *, num_rows: int,
                  max_steps: int | None = None, accelerator: str = "cpu") -> FitSettings:
    """Read a ``lightning-gpate fit`` config (model, data, trainer sections) for the audit."""
    config_path = Path(config_path)
    if not config_path.is_file():
        raise AuditError(f"config not found: {config_path.resolve()}")
    config = yaml.safe_load(config_path.read_text()) or {}
    model = config.get("model")
    if isinstance(model, str):
        model = {"class_path": model}
    if not isinstance(model, dict) or "class_path" not in model:
        raise AuditError(f"{config_path} has no model.class_path")
    data_section = config.get("data") or {}
    config_data = dict(data_section.get("init_args") or {}) if isinstance(data_section, dict) else {}
    data = worst_case_data(target) if dataset == WORST_CASE else file_data(dataset, target, config_data)
    training = {k: config_data[k] for k in TRAINING_DATA_OPTIONS if k in config_data}
    steps = max_steps if max_steps is not None else (config.get("trainer") or {}).get("max_steps")
    if steps is None or int(steps) < 1:
        raise AuditError("give the number of training steps: trainer.max_steps in the config or --max_steps")
    if num_rows < 1:
        raise AuditError(f"--num_rows must be >= 1, got {num_rows}")
    settings = FitSettings(str(model["class_path"]), dict(model.get("init_args") or {}), data, training,
                           int(steps), int(num_rows), accelerator)
    import_class(settings.model_class)
    settings.claimed()
    return settings


def fit_seed(seed: int, world: int, index: int) -> int:
    """The public seed of fit ``index`` of ``world``: distinct for every fit of an audit."""
    return (int(seed) * 1_000_003 + 2 * int(index) + int(world)) % (2**31 - 1)


@contextmanager
def quiet() -> Iterator[None]:
    """No Lightning banners, absl accountant chatter, model prints or warnings during the many small fits."""
    names = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning", "absl")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def fit_once(settings: FitSettings, world: int, index: int, seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Train one model of ``world`` and return its synthetic table and facts (ε spent, steps, time).

    Nothing pins the mechanism noise: the models draw it from OS-seeded generators. The public
    ``seed`` differs between fits, so neither initialisation nor data order nor latent draws repeat.
    """
    import pytorch_lightning as pl

    from datamodules import TabularDataModule
    from lightning_gpate.evaluation.report import synthetic_table

    start = time.perf_counter()
    with quiet():
        pl.seed_everything(seed, verbose=False)
        datamodule = TabularDataModule(frame=settings.data.frame(world), test_fraction=0.0, val_fraction=0.0,
                                       **settings.data.data_options, **settings.training_options)
        model = import_class(settings.model_class)(datamodule.spec, **settings.model_args)
        trainer = pl.Trainer(
            max_steps=settings.max_steps, accelerator=settings.accelerator, devices=1, logger=False,
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0,
        )
        trainer.fit(model, datamodule)
        model.eval()
        table = synthetic_table(model, settings.num_rows, seed=seed)
    accountant = getattr(model, "accountant", None)
    info = {
        "world": int(world), "index": int(index), "seed": int(seed),
        "epsilon_spent": float(accountant.epsilon()) if accountant is not None else math.inf,
        "steps": int(trainer.global_step), "stop_reason": getattr(model, "stop_reason", None),
        "fit_seconds": time.perf_counter() - start,
    }
    return table, info


# ----------------------------------------------------------------------------- the output folder
class AuditStore:
    """The resumable output folder: ``audit.json`` (what is audited) and ``fits/w{world}_{index}.csv``
    + ``.json`` per finished fit (its synthetic table in the original schema, and its facts)."""

    def __init__(self, folder: str | Path, identity: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.fits = self.folder / "fits"
        self.fits.mkdir(parents=True, exist_ok=True)
        manifest = self.folder / "audit.json"
        identity = json.loads(json.dumps(identity, default=str))
        if manifest.exists():
            stored = json.loads(manifest.read_text())
            if stored != identity:
                changed = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
                raise AuditError(
                    f"{self.folder} holds the fits of another audit (different {', '.join(changed)}); "
                    f"choose another --output, or delete that folder to start over"
                )
        else:
            _write_atomic(manifest, json.dumps(identity, indent=2, sort_keys=True))

    def _stem(self, world: int, index: int) -> Path:
        return self.fits / f"w{world}_{index:05d}"

    def done(self, world: int, index: int) -> bool:
        return self._stem(world, index).with_suffix(".json").exists()

    def save(self, table: pd.DataFrame, info: dict[str, Any]) -> None:
        stem = self._stem(info["world"], info["index"])
        _write_atomic(stem.with_suffix(".csv"), table.to_csv(index=False))
        _write_atomic(stem.with_suffix(".json"), json.dumps(info))  # last: marks the fit as done

    def load(self, world: int, index: int, dtypes: dict[str, Any] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
        stem = self._stem(world, index)
        return pd.read_csv(stem.with_suffix(".csv"), dtype=dtypes), json.loads(stem.with_suffix(".json").read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- running the fits
_WORKER: dict[str, Any] = {}


def _init_worker(settings: FitSettings, folder: str, identity: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(1)  # tiny models: one thread per worker is fastest, and leaves the cores to the pool
    _WORKER["settings"], _WORKER["store"] = settings, AuditStore(folder, identity)


def _fit_task(task: tuple[int, int, int]) -> dict[str, Any]:
    world, index, seed = task
    try:
        table, info = fit_once(_WORKER["settings"], world, index, seed)
    except Exception as err:  # noqa: BLE001 - reported with the fit it belongs to
        raise AuditError(f"fit {index} of world {world} ({'with' if world else 'without'} the target) failed: "
                         f"{type(err).__name__}: {err}") from None
    _WORKER["store"].save(table, info)
    return info


def pending_fits(store: AuditStore, runs: int, seed: int) -> list[tuple[int, int, int]]:
    """The fits still to train, alternating worlds so that a stopped audit leaves them balanced."""
    return [(w, i, fit_seed(seed, w, i)) for i in range(runs) for w in (0, 1) if not store.done(w, i)]


def run_fits(settings: FitSettings, store: AuditStore, identity: dict[str, Any], *, runs: int, seed: int,
             jobs: int = 1, progress: bool = True) -> None:
    """Train every missing fit of both worlds, ``jobs`` at a time, with a progress bar."""
    from tqdm.auto import tqdm

    tasks = pending_fits(store, runs, seed)
    bar = tqdm(total=2 * runs, initial=2 * runs - len(tasks), desc="audit fits", unit="fit", disable=not progress)
    seconds = []

    def advance(info: dict[str, Any]) -> None:
        seconds.append(info["fit_seconds"])
        bar.set_postfix_str(f"{sum(seconds) / len(seconds):.2f}s/fit", refresh=False)
        bar.update(1)

    try:
        if jobs <= 1 or len(tasks) <= 1:
            import torch

            threads = torch.get_num_threads()
            _init_worker(settings, str(store.folder), identity)
            try:
                for task in tasks:
                    advance(_fit_task(task))
            finally:
                torch.set_num_threads(threads)
        else:
            import multiprocessing as mp

            # spawn: workers import torch once, then train many fits each (no fork of a threaded parent)
            with mp.get_context("spawn").Pool(jobs, initializer=_init_worker, initargs=(settings, str(store.folder), identity)) as pool:
                for info in pool.imap_unordered(_fit_task, tasks):
                    advance(info)
    finally:
        bar.close()
