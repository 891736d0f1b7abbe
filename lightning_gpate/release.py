"""The release artifact: what leaves a training run, and the only thing that does.

A run produces two kinds of files (DESIGN.md, "Public and private state"):

* the **release artifact** (this module): the generator's weights, the released data spec, the
  accountant's released state and summary, the model class, its hyperparameters and the data config.
  Nothing in it is computed from the private data without noise. It is what ``fit`` prints, what
  MLflow logs as the run's model (``release/release.pt``), and what ``lightning-gpate sample``,
  ``lightning-gpate evaluate``, :class:`~lightning_gpate.Synthesizer` and
  :func:`~lightning_gpate.models.load_generator` read. It is a plain ``torch.save`` of tensors, lists,
  dicts, strings and numbers: ``torch.load(path, weights_only=True)`` opens it.
* the **training checkpoint** (a Lightning checkpoint): teachers or discriminators and their
  optimizer states, the critic, the partition fingerprint, the accountant's full state. It stays on
  local disk under ``private/``, is never logged to MLflow, and is what ``--ckpt_path`` resumes from.
  :func:`load_release` accepts one too and extracts the release from it in memory.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import torch

from lightning_gpate.errors import UserError
from lightning_gpate.files import write_atomically
from lightning_gpate.privacy.disclosure import released_privacy

RELEASE_KEY = "lightning_gpate_release"
RELEASE_FORMAT = 1
#: Top-level entries of a release artifact: nothing else is allowed in one.
RELEASE_ENTRIES = (RELEASE_KEY, "hyper_parameters", "generator", "privacy", "datamodule", "mlflow_run", "global_step")
#: Entry of a Lightning training checkpoint that marks it as a lightning-gpate model's (models.base).
CHECKPOINT_KEY = "lightning_gpate"


class CheckpointError(UserError, ValueError):
    """A file that is missing, unreadable, or neither a release artifact nor a training checkpoint."""


# ----------------------------------------------------------------------------- building
def plain(value: Any) -> Any:
    """``value`` as plain Python (dict, list, str, int, float, bool, None) and CPU tensors: what
    ``torch.load(weights_only=True)`` accepts. Other objects become their ``repr``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return value.item()
    return repr(value)


def model_class_path(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def build_release(model, *, datamodule=None, mlflow_run: dict | None = None, global_step: int | None = None) -> dict[str, Any]:
    """The release artifact of ``model`` (a :class:`~lightning_gpate.models.base.GenerativeModel`).

    Args:
        model: the trained model; only its ``generator_module``, hyperparameters and released privacy
            state are read.
        datamodule: the DataModule it was trained on (its class and init arguments are stored so that
            ``evaluate`` can rebuild it); ``None`` stores none.
        mlflow_run: ``{"run_id", "experiment_id", "tracking_uri"}`` of the run, if any.
        global_step: generator steps taken.
    """
    hparams = {k: v for k, v in dict(model.hparams).items() if not str(k).startswith("_")}
    hparams["data_spec"] = model.data_spec  # private models keep only the released spec
    data = None
    if datamodule is not None:
        args = dict(getattr(datamodule, "hparams", {}) or {})
        class_path = args.pop("_class_path", None) or model_class_path(datamodule)
        data = {"class_path": class_path, "init_args": plain({k: v for k, v in args.items() if not str(k).startswith("_")})}
    privacy = None
    if hasattr(model, "accountant"):
        privacy = released_privacy(model)
    return {
        RELEASE_KEY: {"format": RELEASE_FORMAT, "model_class": model_class_path(model)},
        "hyper_parameters": plain(hparams),
        "generator": {k: v.detach().cpu().clone() for k, v in model.generator_module.state_dict().items()},
        "privacy": plain(privacy),
        "datamodule": data,
        "mlflow_run": plain(mlflow_run),
        "global_step": int(global_step if global_step is not None else getattr(model, "global_step", 0)),
    }


def save_release(release: dict[str, Any], path: str | Path) -> Path:
    """Write a release artifact atomically (a temporary name, then a rename), with the user's permissions: a release is
    public (:mod:`lightning_gpate.files`)."""
    return write_atomically(path, lambda tmp: torch.save(release, tmp))


def count_numbers(value: Any) -> int:
    """How many numbers a (nested) release holds: tensor elements plus numeric scalars."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return sum(count_numbers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(count_numbers(v) for v in value)
    return 1 if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


# ----------------------------------------------------------------------------- reading
def _import(class_path: str):
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def read_file(path: str | Path) -> dict[str, Any]:
    """Load a release artifact or a training checkpoint as a dict (memory-mapped, so a large
    training checkpoint is not read in full)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    errors = []
    for weights_only in (True, False):  # a release opens with weights_only=True; a Lightning checkpoint may not
        for mmap in (True, False):  # mmap needs the zip format of torch.save
            try:
                data = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
                break
            except Exception as err:  # noqa: BLE001 - every unreadable file is the same user error
                errors.append(err)
        else:
            continue
        break
    else:
        raise CheckpointError(f"{path} is not a readable PyTorch file: {errors[-1]}") from errors[-1]
    if not isinstance(data, dict) or (RELEASE_KEY not in data and CHECKPOINT_KEY not in data):
        raise CheckpointError(
            f"{path} is not a lightning-gpate generator checkpoint: neither a release artifact "
            f"(release/release.pt of a run) nor a training checkpoint"
        )
    return data


def is_release(data: dict[str, Any]) -> bool:
    return RELEASE_KEY in data


def release_from_checkpoint(checkpoint: dict[str, Any], *, source: str = "checkpoint") -> dict[str, Any]:
    """Extract the release from a private training checkpoint, in memory: the full model is rebuilt
    from it and reduced to :func:`build_release`'s content. Nothing is written or logged."""
    meta = checkpoint[CHECKPOINT_KEY]
    cls = _model_class(meta.get("model_class", ""), source)
    hparams = {k: v for k, v in dict(checkpoint.get("hyper_parameters") or {}).items() if not str(k).startswith("_")}
    model = cls(**hparams)
    model.load_state_dict(checkpoint["state_dict"])
    if not getattr(model, "release_allowed", lambda: True)():
        raise CheckpointError(
            f"{source} is a budget_accounting: smooth_sensitivity run whose generator has no release: its released "
            f"epsilon exceeds the target, or the run has not ended and released its epsilon yet"
        )
    stored = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    release = build_release(model, mlflow_run=checkpoint.get("mlflow_run"), global_step=int(checkpoint.get("global_step", 0)))
    if stored:
        class_path = stored.pop("_class_path", None)
        stored.pop("_instantiator", None)
        release["datamodule"] = {"class_path": class_path, "init_args": plain(stored)} if class_path else {"class_path": None, "init_args": plain(stored)}
    return release


def load_release(path: str | Path) -> dict[str, Any]:
    """The release of ``path``: a release artifact as stored, or extracted from a training checkpoint."""
    data = read_file(path)
    if is_release(data):
        unknown = sorted(set(data) - set(RELEASE_ENTRIES))
        if unknown:
            raise CheckpointError(f"{path} is a release artifact with unexpected entries {unknown}")
        return data
    return release_from_checkpoint(data, source=str(path))


def _model_class(class_path: str, source: str):
    try:
        return _import(class_path)
    except (ImportError, AttributeError, ValueError) as err:
        raise CheckpointError(f"{source} holds a {class_path or 'model of unknown class'} that this version cannot load") from err


def model_from_release(release: dict[str, Any], *, source: str = "release", map_location: str | torch.device = "cpu"):
    """The model of a release, ready to :meth:`~lightning_gpate.models.base.GenerativeModel.generate`.

    The model is built from its hyperparameters; only its generator is loaded (teachers,
    discriminators or critics, if the class has any, keep their initial values and are never used).
    It refuses to train (:attr:`~lightning_gpate.models.base.GenerativeModel.is_release`).
    """
    meta = release[RELEASE_KEY]
    if int(meta.get("format", 0)) > RELEASE_FORMAT:
        raise CheckpointError(f"{source} has release format {meta.get('format')}; this version reads up to {RELEASE_FORMAT}")
    cls = _model_class(meta["model_class"], source)
    hparams = dict(release["hyper_parameters"])
    for name, off in getattr(cls, "REMOVED_OPTIONS", {}).items():  # a release saved before an option was removed
        if name in hparams:
            if hparams[name] != off:
                raise CheckpointError(f"{source} was trained with {name}={hparams[name]!r}, an option this version removed")
            del hparams[name]
    for name, before in getattr(cls, "DEFAULTS_BEFORE", {}).items():  # saved before an option existed: its value then
        hparams.setdefault(name, before)
    model = cls(**hparams)
    try:
        model.generator_module.load_state_dict(release["generator"])
    except RuntimeError as err:
        raise CheckpointError(f"the generator in {source} does not match {meta['model_class']}: {err}") from err
    if release.get("privacy") is not None and hasattr(model, "load_released_privacy"):
        model.load_released_privacy(release["privacy"])
    model.is_release = True
    model.release_source = str(source)
    model.eval()
    return model.to(map_location)


def generator_parameter_count(release: dict[str, Any]) -> int:
    """Parameters of the released generator (its state's floating tensors without BatchNorm counters)."""
    return sum(v.numel() for k, v in release["generator"].items() if v.is_floating_point() and not k.endswith(("running_mean", "running_var")))


def size_ratio(release: dict[str, Any]) -> float:
    """Numbers in the release over the generator's parameter count (≤ 1.2 by design)."""
    params = generator_parameter_count(release)
    return count_numbers(release) / params if params else math.inf
