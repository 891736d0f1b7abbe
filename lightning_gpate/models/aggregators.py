"""G-PATE's private aggregator of the teachers' gradients, chosen by class, each with only its own parameters.

``GPATE(aggregator=...)`` takes one of :class:`GaussAgg` (default), :class:`DPGradAgg` (G-PATE's paper) and
:class:`TopAgg` (DataLens). On the command line and in a config the choice is a class, LightningCLI's dependency
injection::

    aggregator:
      class_path: DPGradAgg          # lightning_gpate.models.aggregators.DPGradAgg
      init_args: {sigma_threshold: 3000, sigma_gnmax: 1000}

(``--model.aggregator DPGradAgg --model.aggregator.sigma_gnmax 1000``; ``--model.aggregator.help DPGradAgg`` lists
its options). Each is a mechanism's parameters: keyword-only, validated here; the events they record and their
accounting live in :mod:`lightning_gpate.privacy` (:class:`~lightning_gpate.privacy.ConfidentGNMaxEvent`,
:class:`~lightning_gpate.privacy.TopAggEvent`, :class:`~lightning_gpate.privacy.GaussianSumEvent`).

Before the groups (issue 60) the choice was a name (``aggregator: dpgradagg``) and every aggregator's parameters were
G-PATE's own flat options (``sigma_gnmax``, ``topk``, ``sigma_topagg``, ``sigma_gaussian``, …):
:func:`migrate_flat_aggregator` builds the aggregator from them, so old Python calls, checkpoints and release
artifacts keep working.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar


class Aggregator:
    """What every aggregator shares: its name, its options as plain values, equality by value."""

    #: The name of before the groups (``aggregator: <name>``) and in logs.
    name: ClassVar[str] = ""
    #: Flat G-PATE option of before the groups → this aggregator's option.
    FLAT: ClassVar[dict[str, str]] = {}

    def options(self) -> dict[str, Any]:
        return dict(self._options)

    def as_hparams(self) -> dict[str, Any]:
        """Plain values (checkpoints, release artifacts, MLflow params ``aggregator/init_args/sigma``)."""
        cls = _concrete(type(self))
        return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": self.options()}

    def describe(self) -> str:
        """One phrase for a run's summary (public: the mechanism and its noise)."""
        raise NotImplementedError

    def threshold(self, num_teachers: int) -> float:
        """The vote count a released answer must reach: ``threshold_fraction`` of the teachers (0 for an aggregator
        without a threshold)."""
        return self.options().get("threshold_fraction", 0.0) * num_teachers

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Aggregator) and _concrete(type(self)) is _concrete(type(other)) and self.options() == other.options()

    def __hash__(self) -> int:
        return hash((_concrete(type(self)).__name__, tuple(sorted(self.options().items()))))

    def __repr__(self) -> str:
        return f"{_concrete(type(self)).__name__}({', '.join(f'{k}={v!r}' for k, v in self.options().items())})"

    def __getattr__(self, item: str) -> Any:
        options = self.__dict__.get("_options", {})
        if item in options:
            return options[item]
        raise AttributeError(item)


class GaussAgg(Aggregator):
    """Each teacher's directions on all units of an aggregation form one vote of L2 norm 1; the summed votes get
    ``N(0, sigma²)`` once (sensitivity 2 under add/remove of a teacher's record: its teacher's vote changes); ``Δx`` is
    the noisy mean vote (:mod:`lightning_gpate.privacy.gaussagg`; not in either paper).

    Args:
        sigma: σ of the noise on the summed votes, per coordinate (default 40: the MNIST ladders' choice).
    """

    name = "gaussian"
    FLAT = {"sigma_gaussian": "sigma"}

    def __init__(self, *, sigma: float = 40.0) -> None:
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError(f"GaussAgg's sigma must be a finite number > 0, got {sigma}")
        self._options = {"sigma": float(sigma)}

    def describe(self) -> str:
        return f"GaussAgg, σ = {self.sigma:g}"


class DPGradAgg(Aggregator):
    """G-PATE's DPGradAgg (Long et al. 2021, Algorithm 2): each teacher's direction on every fake is projected with a
    fresh Gaussian matrix per sample, clipped to ``[−clip, clip]``, discretised into ``num_bins`` bins and voted; each
    (sample, dimension) is one Confident-GNMax query (Papernot et al. 2018); the answered bin centres are
    back-projected into ``Δx``.

    Args:
        projection_dim: ``k``, the random projection's dimension (``m · k`` queries an aggregation).
        clip: ``c``, the clipping bound of projected gradients.
        num_bins: ``B``, bins over ``[-c, c]`` (2: sign votes).
        threshold_fraction: ``T`` of Confident-GNMax as a fraction of the teachers.
        sigma_threshold: σ1 of the threshold check.
        sigma_gnmax: σ2 of the noisy argmax.
    """

    name = "dpgradagg"
    FLAT = {"projection_dim": "projection_dim", "clip": "clip", "num_bins": "num_bins", "threshold_fraction": "threshold_fraction",
            "sigma_threshold": "sigma_threshold", "sigma_gnmax": "sigma_gnmax"}

    def __init__(self, *, projection_dim: int = 10, clip: float = 1e-4, num_bins: int = 10, threshold_fraction: float = 0.5,
                 sigma_threshold: float = 3000.0, sigma_gnmax: float = 1000.0) -> None:
        for option, value in (("projection_dim", projection_dim), ("num_bins", num_bins)):
            if int(value) != value or value < 1:
                raise ValueError(f"DPGradAgg's {option} must be an integer >= 1, got {value}")
        if not clip > 0 or not sigma_threshold >= 0 or not sigma_gnmax >= 0:
            raise ValueError(f"DPGradAgg's clip must be > 0 and its noise scales >= 0, got {clip}, {sigma_threshold}, {sigma_gnmax}")
        if not 0 <= threshold_fraction <= 1:
            raise ValueError(f"DPGradAgg's threshold_fraction must be in [0, 1], got {threshold_fraction}")
        self._options = {"projection_dim": int(projection_dim), "clip": float(clip), "num_bins": int(num_bins),
                         "threshold_fraction": float(threshold_fraction), "sigma_threshold": float(sigma_threshold),
                         "sigma_gnmax": float(sigma_gnmax)}

    def describe(self) -> str:
        return f"Confident-GNMax, σ1 = {self.sigma_threshold:g}, σ2 = {self.sigma_gnmax:g}"


class TopAgg(Aggregator):
    """DataLens' TopAgg (Wang, Wu, Long et al. 2021): each teacher keeps the ``topk`` largest coordinates of its
    direction as (stochastic) signs; the summed votes get ``N(0, sigma²)`` once; coordinates above the threshold
    (β = ``threshold_fraction`` of the teachers) are released as signs: ``Δx ∈ {−1, 0, 1}^d``.

    Args:
        topk: coordinates each teacher votes on per fake (at most the data's dimension).
        sigma: σ of the noise on the summed votes.
        threshold_fraction: β, the threshold as a fraction of the teachers.
        max_grad: cap on the scale ``b`` of the stochastic signs (``None``: each teacher's largest ``|g|`` on the sample).
        stochastic: vote stochastic signs (``True``, DataLens' ``--stochastic``, unbiased) or the plain signs of the
            top-k coordinates (``False``; same sensitivity, far more agreement when ``|g|`` is small against ``b``).
    """

    name = "topagg"
    FLAT = {"topk": "topk", "sigma_topagg": "sigma", "threshold_fraction": "threshold_fraction", "topagg_max_grad": "max_grad",
            "topagg_stochastic": "stochastic"}

    def __init__(self, *, topk: int = 200, sigma: float = 5000.0, threshold_fraction: float = 0.5, max_grad: float | None = None,
                 stochastic: bool = True) -> None:
        if int(topk) != topk or topk < 1:
            raise ValueError(f"TopAgg's topk must be an integer >= 1, got {topk}")
        if not (sigma > 0 and math.isfinite(sigma)) or (max_grad is not None and not max_grad > 0):
            raise ValueError(f"TopAgg's sigma and max_grad must be > 0, got {sigma}, {max_grad}")
        if not 0 <= threshold_fraction <= 1:
            raise ValueError(f"TopAgg's threshold_fraction must be in [0, 1], got {threshold_fraction}")
        self._options = {"topk": int(topk), "sigma": float(sigma), "threshold_fraction": float(threshold_fraction),
                         "max_grad": None if max_grad is None else float(max_grad), "stochastic": bool(stochastic)}

    def describe(self) -> str:
        return f"TopAgg, σ = {self.sigma:g}"


AGGREGATORS: dict[str, type[Aggregator]] = {cls.name: cls for cls in (DPGradAgg, TopAgg, GaussAgg)}


def _concrete(cls: type) -> type[Aggregator]:
    """The aggregator class of ``cls`` (jsonargparse's ``lazy_instance`` makes a subclass of it)."""
    return next(c for c in cls.__mro__ if c in AGGREGATORS.values())


def aggregator_from(value: Any) -> Aggregator:
    """An :class:`Aggregator` from itself, its name of before the groups (``"dpgradagg"``: its defaults), or a mapping
    ``{class_path, init_args}`` (checkpoints, release artifacts); anything else is refused in one line."""
    if isinstance(value, Aggregator):
        cls = _concrete(type(value))
        return value if type(value) is cls else cls(**value.options())
    if isinstance(value, str):
        if value not in AGGREGATORS:
            raise ValueError(f"aggregator must be one of {sorted(AGGREGATORS)} or an aggregator class, got {value!r}")
        return AGGREGATORS[value]()
    if hasattr(value, "__dict__") and type(value).__name__ == "Namespace":
        value = {k: (vars(v) if type(v).__name__ == "Namespace" else v) for k, v in vars(value).items()}
    if isinstance(value, dict) and "class_path" in value:
        name = str(value["class_path"]).rpartition(".")[2]
        classes = {cls.__name__: cls for cls in AGGREGATORS.values()}
        if name not in classes:
            raise ValueError(f"aggregator class_path must name one of {sorted(classes)}, got {value['class_path']!r}")
        return classes[name](**dict(value.get("init_args") or {}))
    raise TypeError(f"aggregator must be GaussAgg, DPGradAgg or TopAgg (or one's name), got {type(value).__name__}")


#: Every flat G-PATE option of before the groups that now belongs to an aggregator.
FLAT_AGGREGATOR_OPTIONS = tuple(dict.fromkeys(name for cls in AGGREGATORS.values() for name in cls.FLAT))


def flat_aggregator_place(name: str) -> tuple[str, str] | None:
    """:meth:`~lightning_gpate.models.base.GenerativeModel.flat_option_place` for an aggregator's flat parameter of
    before the groups: the aggregators it now belongs to, and how a config writes it for the first of them."""
    owners = [cls for cls in AGGREGATORS.values() if name in cls.FLAT]
    if not owners:
        return None
    first = owners[0]
    return (" or ".join(f"aggregator.{cls.FLAT[name]} of {cls.__name__}" for cls in owners),
            f"aggregator: {{class_path: {first.__name__}, init_args: {{{first.FLAT[name]}: ...}}}}")


def migrate_flat_aggregator(options: dict[str, Any]) -> dict[str, Any]:
    """G-PATE's options with ``aggregator`` built from a name and the flat options of before the groups (those of the
    chosen aggregator become its options; the other aggregators' were unused then and are dropped). Beside an
    aggregator given as a class or mapping, that aggregator's flat options override its values (an old checkpoint's
    hyperparameters beside LightningCLI's defaults: the checkpoint's win, as on every resume)."""
    found = [name for name in options if name in FLAT_AGGREGATOR_OPTIONS]
    given = options.get("aggregator")
    if not found and not isinstance(given, str):
        return options
    if given is None:  # flat parameters of the default aggregator of before (GaussAgg)
        given = "gaussian"
    out = {k: v for k, v in options.items() if k not in FLAT_AGGREGATOR_OPTIONS}
    if isinstance(given, str):
        cls = AGGREGATORS.get(given)
        if cls is None:
            raise ValueError(f"aggregator must be one of {sorted(AGGREGATORS)} or an aggregator class, got {given!r}")
        out["aggregator"] = cls(**{cls.FLAT[name]: options[name] for name in found if name in cls.FLAT})
        return out
    built = aggregator_from(given)
    cls = _concrete(type(built))
    merged = built.options()
    for name in found:
        if name in cls.FLAT:
            merged[cls.FLAT[name]] = options[name]  # a checkpoint's flat value beside LightningCLI's defaults: it wins
    out["aggregator"] = cls(**merged)
    return out
