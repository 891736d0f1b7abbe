"""A Python API: fit a (private) generator on a DataFrame or on images, sample DataFrames or arrays back.

>>> from lightning_gpate import Synthesizer
>>> synth = Synthesizer("pategan", epsilon=1.0, delta=1e-5, max_steps=2000)      # doctest: +SKIP
>>> synth.fit(frame, label="Biopsy", schema={...}, num_teachers=10)             # doctest: +SKIP
>>> synthetic = synth.sample(1000)                                              # doctest: +SKIP

Images (numpy arrays, a folder of class folders, or an ``.npz``; the classes declared public):

>>> synth = Synthesizer("dpmerf", epsilon=1.0, delta=1e-5, max_steps=800)        # doctest: +SKIP
>>> synth.fit(images, labels, classes=[0, 1, 2])                                # doctest: +SKIP
>>> images, labels = synth.sample(1000)                                         # doctest: +SKIP

It wraps the same pieces as ``lightning-gpate fit``: a :class:`~datamodules.TabularDataModule` (or
:class:`~datamodules.ImageDataModule`), the model, a Lightning ``Trainer`` with the MLflow logger and the evaluation callbacks, so a run started
from Python appears in MLflow with the same parameters, ε, utility report, samples and release artifact.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def model_classes() -> dict[str, type]:
    """The trainable generators of :mod:`lightning_gpate.models`, by normalised name (``"pategan"``, ``"gan"``, …)."""
    import inspect

    import lightning_gpate.models as models
    from lightning_gpate.models.base import GenerativeModel
    from lightning_gpate.models.private import PrivateGenerativeModel

    found = {}
    for attr in getattr(models, "__all__", dir(models)):
        obj = getattr(models, attr, None)
        if inspect.isclass(obj) and issubclass(obj, GenerativeModel) and obj not in (GenerativeModel, PrivateGenerativeModel):
            found[_normalise(obj.__name__)] = obj
    return found


def model_class(model: str | type) -> type:
    """A model class from a name (``"pategan"``, ``"PATE-GAN"``, ``"gan"``), a dotted class path, or the class.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if isinstance(model, type):
        return model
    if "." in model:
        from lightning_gpate.evaluation.store import _import

        return _import(model)
    known = model_classes()
    key = _normalise(model)
    if key not in known:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(known)} (or give a class or a dotted class path)")
    return known[key]


class Synthesizer:
    """Fit a generator on a DataFrame (or images) and sample synthetic DataFrames in the same schema (or arrays).

    Args:
        model: model name (``"gan"``, ``"pategan"``, ``"gpate"``, ``"dpgan"``, ``"gswgan"``, ``"dpmerf"``,
            ``"marginaltree"``), class or class path.
        epsilon: privacy budget ε of a private model (required for one; refused for ``"gan"``).
        delta: δ of a private model's (ε, δ) guarantee (default 1e-5, as for every model; keep it well below 1/n for n
            training records).
        max_steps: generator steps (a private model stops earlier when its budget is spent).
        experiment: MLflow experiment; run_name: MLflow run name (followed by the start time and a short id,
            :func:`~lightning_gpate.tracking.unique_run_name`; as given in the tag ``config_run_name``). Without one the
            run is named for its model, data and ε, the start time and a short random id (``pategan-table-eps1-...``).
        tracking_uri: MLflow store (default: ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlruns/mlflow.db``).
        evaluate: run :class:`callbacks.DownstreamUtility` at the end of fitting (the report is
            :attr:`report` and in MLflow).
        utility_options: keyword arguments of :class:`callbacks.DownstreamUtility` (e.g.
            ``{"classifiers": ["LogisticRegression"], "every_n_steps": 500}``).
        log_samples: log samples and marginal plots (:class:`callbacks.SampleLogger`).
        seed: seed of everything (``pl.seed_everything``).
        progress_bar: show the fit's progress in steps, ε of a private model on it (a bar on a terminal, a status
            line every tenth of the fit elsewhere; :class:`callbacks.StepProgress`).
        trainer_options: more ``pl.Trainer`` keyword arguments (e.g. ``{"accelerator": "gpu"}``).
        **model_options: keyword arguments of the model (see its class, e.g. ``lam``, ``lr``).
    """

    def __init__(
        self,
        model: str | type = "pategan",
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        max_steps: int = 1000,
        experiment: str = "lightning-gpate",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        evaluate: bool = True,
        utility_options: dict[str, Any] | None = None,
        log_samples: bool = True,
        seed: int = 0,
        progress_bar: bool = True,
        trainer_options: dict[str, Any] | None = None,
        **model_options: Any,
    ) -> None:
        from lightning_gpate.models.private import DEFAULT_DELTA, PrivateGenerativeModel

        self.model_cls = model_class(model)
        self.private = issubclass(self.model_cls, PrivateGenerativeModel)
        if self.private and epsilon is None:
            raise ValueError(f"{self.model_cls.__name__} is private: give epsilon=... (its privacy budget)")
        if self.private and delta is None:
            delta = DEFAULT_DELTA
        if not self.private and (epsilon is not None or delta is not None):
            raise ValueError(f"{self.model_cls.__name__} is not private: it takes no epsilon/delta (choose a private model)")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.epsilon_budget, self.delta = epsilon, delta
        self.max_steps, self.experiment, self.run_name, self.tracking_uri = max_steps, experiment, run_name, tracking_uri
        self.evaluate, self.utility_options, self.log_samples = evaluate, dict(utility_options or {}), log_samples
        self.seed, self.progress_bar, self.trainer_options = seed, progress_bar, dict(trainer_options or {})
        self.model_options = model_options
        self.model = None
        self.datamodule = None
        self.trainer = None
        self.report: dict[str, float] = {}
        #: what ``lightning-gpate fit`` prints at its end (model, data, steps, ε, utility, release, MLflow run)
        self.summary: str | None = None
        self.run_id: str | None = None

    # ----------------------------------------------------------------- training
    def fit(
        self,
        data: "pd.DataFrame | Any",
        labels: Any = None,
        *,
        label: str | None = None,
        schema: dict[str, dict[str, Any]] | None = None,
        class_ratio: list[float] | None = None,
        classes: list[Any] | None = None,
        image_size: int | None = None,
        channels: int | None = None,
        **data_options: Any,
    ) -> "Synthesizer":
        """Train on ``data``: a table (the ``label`` column conditions the generator) or images (their ``labels``).

        Args:
            data: the private table, one row per record; or images: a numpy array (``[n, H, W]`` grey,
                ``[n, H, W, C]`` or ``[n, C, H, W]``; uint8, or floats in [0, 1]) with ``labels``, or the path of a
                folder of class folders (``root/<class>/<image>.png``) or of an ``.npz`` with ``images`` and ``labels``.
            labels: the images' labels, one per image (arrays only).
            label: the class column (tables only).
            schema: per-column declarations (types, public ``min``/``max``/``categories``); a private
                model refuses metadata read from the data unless declared here or paid for
                (``metadata_epsilon``, ``label_ratio_epsilon`` where the DataModule offers them).
            class_ratio: the label's class ratio, declared public (tables).
            classes: the images' classes, declared public (the label codes follow this order); a private model
                refuses classes read from the data.
            image_size: resize every image to this square size (a public transform); ``None``: they must have one.
            channels: a folder's images converted to 1 (grey) or 3 (colour); ``None``: they must all have the same.
            **data_options: more :class:`~datamodules.TabularDataModule` (or :class:`~datamodules.ImageDataModule`)
                arguments (``batch_size``, ``num_teachers``, ``test_fraction``, ``missing``, …).

        Returns:
            ``self``, trained; :attr:`report` holds the utility report, :attr:`run_id` the MLflow run.
        """
        import pytorch_lightning as pl

        from pytorch_lightning.callbacks import ProgressBar

        from callbacks import DownstreamUtility, FitSummary, ReleaseArtifact, SampleLogger, StepProgress
        from lightning_gpate.progress import quiet_known_noise
        from lightning_gpate.tracking import GPATEMLFlowLogger, run_title

        quiet_known_noise()
        pl.seed_everything(self.seed, verbose=False)
        model_batch = self._model_batch_size()
        if model_batch is not None:  # Lightning refuses a run whose model and data log different `batch_size`s
            if data_options.setdefault("batch_size", model_batch) != model_batch:
                raise ValueError(
                    f"{self.model_cls.__name__} has its own batch_size={model_batch}; the data's batch_size="
                    f"{data_options['batch_size']} must be the same (set it once, as a model option)")
        if isinstance(data, pd.DataFrame):
            from datamodules import TabularDataModule

            if label is None or labels is not None or classes is not None or image_size is not None or channels is not None:
                raise TypeError("a table is fitted with label='<its class column>' (labels, classes, image_size and channels are "
                                "for images)")
            if self.private and data_options.get("quantile_epsilon") is None:  # private quantile bins: a share of the budget
                from lightning_gpate.privacy.quantiles import default_quantile_epsilon

                data_options["quantile_epsilon"] = default_quantile_epsilon(self.epsilon_budget, self.delta)
            self.datamodule = TabularDataModule(frame=data, label=label, schema=schema, class_ratio=class_ratio, **data_options)
            data_arguments = {"label": label, "schema": schema, "class_ratio": class_ratio}
        else:
            if label is not None or schema is not None or class_ratio is not None:
                raise TypeError(f"label, schema and class_ratio are for tables: a table must be a pandas DataFrame, got "
                                f"{type(data).__name__} (images are fitted with their labels and classes=[...])")
            self.datamodule, source = self._image_datamodule(data, labels, classes=classes, image_size=image_size,
                                                             channels=channels, **data_options)
            data_arguments = {"images": source, "classes": classes, "image_size": image_size, "channels": channels}
        privacy = {"epsilon": self.epsilon_budget, "delta": self.delta} if self.private else {}
        self.model = self.model_cls(self.datamodule.spec, **privacy, **self.model_options)
        utility = DownstreamUtility(enabled=self.evaluate, **self.utility_options)
        logger = GPATEMLFlowLogger(experiment_name=self.experiment, run_name=self.run_name, tracking_uri=self.tracking_uri)
        logger.name_run(run_title(self.model, self.datamodule))
        options = {
            "max_steps": self.max_steps, "logger": logger, "enable_checkpointing": False,
            "enable_progress_bar": self.progress_bar,
            "enable_model_summary": False, "log_every_n_steps": 10, "devices": 1,
            **self.trainer_options,
        }
        self._release, summary = ReleaseArtifact(), FitSummary()
        given = list(options.get("callbacks", []))
        if self.progress_bar and not any(isinstance(c, ProgressBar) for c in given):
            given.append(StepProgress())  # the fit's steps, not Lightning's epochs of one batch
        options["callbacks"] = [utility, SampleLogger(enabled=self.log_samples), self._release, summary, *given]
        self.trainer = pl.Trainer(**options)
        self.run_id = logger.run_id
        self._log_arguments(logger, **data_arguments, data_options=data_options)
        self.trainer.fit(self.model, datamodule=self.datamodule)
        self.model.eval()
        self.report = dict(utility.last_metrics)
        self.summary = summary.text(self.trainer, self.model)
        return self

    @staticmethod
    def _image_datamodule(data: Any, labels: Any, **options: Any):
        """An :class:`~datamodules.ImageDataModule` of arrays, a folder or an ``.npz``, and how to name that source
        in the run's ``synthesizer.json`` (never the pixels)."""
        from datamodules import ImageDataModule

        if isinstance(data, (str, Path)):
            if labels is not None:
                raise TypeError("a folder or an .npz holds its labels: give no labels with a path")
            path = Path(data)
            if path.suffix.lower() == ".npz":
                return ImageDataModule("npz", path=str(path), **options), str(path)
            return ImageDataModule("folder", root=str(path), **options), str(path)
        try:
            import torch

            if isinstance(data, torch.Tensor):
                data = data.detach().cpu().numpy()
            if isinstance(labels, torch.Tensor):
                labels = labels.detach().cpu().numpy()
        except ImportError:  # pragma: no cover
            pass
        if not hasattr(data, "shape"):
            raise TypeError(f"data must be a pandas DataFrame, an image array (with labels), or the path of an image folder "
                            f"or .npz; got {type(data).__name__}")
        if labels is None:
            raise TypeError("images need their labels: fit(images, labels, classes=[...])")
        return ImageDataModule("arrays", images=data, labels=labels, **options), f"arrays {list(data.shape[1:])}"

    def _model_batch_size(self) -> int | None:
        import inspect

        parameter = inspect.signature(self.model_cls.__init__).parameters.get("batch_size")
        if parameter is None:
            return None
        return int(self.model_options.get("batch_size", parameter.default))

    def _log_arguments(self, logger, **data_arguments: Any) -> None:
        """The call that made the run (``synthesizer.json``): the Python counterpart of ``config.yaml``."""
        arguments = {
            "model": f"{self.model_cls.__module__}.{self.model_cls.__qualname__}", "epsilon": self.epsilon_budget,
            "delta": self.delta, "max_steps": self.max_steps, "seed": self.seed, "model_options": self.model_options,
            "utility_options": self.utility_options, "trainer_options": {k: repr(v) for k, v in self.trainer_options.items()},
            **data_arguments,
        }
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "synthesizer.json"
            path.write_text(json.dumps(arguments, indent=2, default=str))
            logger.experiment.log_artifact(logger.run_id, str(path))

    # ----------------------------------------------------------------- using the result
    def _require_model(self):
        if self.model is None:
            raise RuntimeError("fit the Synthesizer first (or load one with Synthesizer.load(ckpt_path))")
        return self.model

    def sample(self, num_rows: int, *, seed: int | None = None):
        """``num_rows`` synthetic rows with the original column names, order, dtypes, ranges and
        categories (labels drawn from the model's public/uniform class ratio).

        For an image model: ``(images, labels)`` numpy arrays, in the form the images came in (arrays: their axes,
        uint8 or floats in [0, 1], the class values as declared; a folder: uint8 ``[n, H, W]`` grey or
        ``[n, H, W, 3]``, the class folders' names); :func:`~lightning_gpate.sampling.write_image_folder` writes PNGs.
        """
        from lightning_gpate.evaluation.report import synthetic_table

        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        model = self._require_model()
        if model.data_spec["kind"] == "image":
            from lightning_gpate.sampling import image_arrays

            return image_arrays(model, num_rows, seed=seed)
        return synthetic_table(model, num_rows, seed=seed)

    @property
    def epsilon(self) -> float | None:
        """ε spent (the guarantee in force); ``None`` for a non-private model."""
        model = self._require_model()
        return model.guarantee_epsilon() if hasattr(model, "accountant") else None

    @property
    def privacy(self) -> dict[str, Any]:
        """The accountant's summary as it may be released (ε the guarantee, δ, analysis, best order …;
        :func:`~lightning_gpate.privacy.disclosure.released_summary`); empty for a non-private model."""
        from lightning_gpate.privacy.disclosure import released_summary

        model = self._require_model()
        return released_summary(model) if hasattr(model, "accountant") else {}

    @property
    def release_path(self) -> str | None:
        """The run's release artifact (generator and public state) in the MLflow store: its
        ``release_artifact`` tag. :meth:`load` and ``lightning-gpate sample`` read it."""
        release = getattr(self, "_release", None)
        return None if release is None or release.release_path is None else str(release.release_path)

    def evaluate_against(self, train: pd.DataFrame, test: pd.DataFrame, *, num_rows: int | None = None, seed: int = 0, **options: Any) -> dict[str, float]:
        """:func:`~lightning_gpate.evaluation.evaluate_tabular` of freshly sampled rows (as many as
        ``train`` by default) against real ``train``/``test`` frames of your choice."""
        from lightning_gpate.evaluation.tabular import evaluate_tabular

        spec = self._require_model().data_spec
        if spec["kind"] != "tabular":
            raise TypeError("evaluate_against compares tables; an image model's utility is its report (evaluate=True) or "
                            "`lightning-gpate evaluate`")
        label = spec["label"]["name"]
        return evaluate_tabular(train, test, self.sample(num_rows or len(train), seed=seed), label=label, seed=seed, **options)

    @classmethod
    def load(cls, ckpt_path: str) -> "Synthesizer":
        """A Synthesizer for sampling from a run's release artifact (:attr:`release_path`, or the
        MLflow tag ``release_artifact``); a private training checkpoint works too (its release is
        extracted in memory)."""
        from lightning_gpate.models.base import load_generator
        from lightning_gpate.models.private import PrivateGenerativeModel

        model = load_generator(ckpt_path)
        private = isinstance(model, PrivateGenerativeModel)
        synth = cls(type(model), epsilon=model.epsilon_budget if private else None, delta=model.delta if private else None)
        synth.model = model
        return synth
