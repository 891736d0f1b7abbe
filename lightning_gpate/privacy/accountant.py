"""Event-based privacy accountant (RDP curves on a fixed grid of orders).

Following dp-accounting, *what happened* (an event: "these 640 Confident-GNMax
queries with these histograms", "one GS-WGAN step") is separated from *how it
is accounted*: :class:`PrivacyAccountant` turns each event into two RDP curves
on its grid of orders and adds them (Mironov 2017, Proposition 1):

* ``rdp`` – the guarantee: data-independent bounds for PATE mechanisms, the
  sound analysis for GS-WGAN, dp-accounting's bounds for subsampled Gaussians,
  the Gaussian mechanism's ``λΔ²/(2σ²)`` for DataLens' TopAgg,
  ``min(ε, λε²/2)`` for pure-DP releases.
* ``rdp_paper`` – the analysis the papers report, which is NOT a guarantee:
  data-dependent PATE bounds without smooth sensitivity (Papernot et al. 2018;
  Yoon et al. 2019) or GS-WGAN's per-sample composition (Chen et al. 2020).
  Events without a separate paper analysis add their guarantee curve.

ε(δ) comes from :func:`~lightning_gpate.privacy.rdp.rdp_to_epsilon`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .gswgan import gswgan_rdp
from .pate import _to_numpy, _validate_votes, confident_gnmax_rdp, laplace_vote_rdp
from .rdp import (
    DEFAULT_ORDERS,
    gaussian_rdp,
    pure_dp_rdp,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
    validate_orders,
)

__all__ = [
    "ConfidentGNMaxEvent",
    "LaplaceVoteEvent",
    "SubsampledGaussianEvent",
    "GSWGANStepEvent",
    "TopAggEvent",
    "PureDPEvent",
    "PrivacyEvent",
    "PrivacyAccountant",
    "DATA_DEPENDENT",
    "PER_SAMPLE_COMPOSITION",
    "GUARANTEE",
]

DATA_DEPENDENT = "data_dependent"
PER_SAMPLE_COMPOSITION = "per_sample_composition"
GUARANTEE = "guarantee"
_PAPER_ANALYSES = (DATA_DEPENDENT, PER_SAMPLE_COMPOSITION, GUARANTEE)


def _positive(name: str, value) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _count(name: str, value, minimum: int = 0) -> int:
    if int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


# --------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ConfidentGNMaxEvent:
    """A batch of Confident-GNMax queries (Papernot et al. 2018, Algorithm 1).

    Attributes:
        votes: ``[n_queries, n_bins]`` vote histograms (copied, read-only).
        answered: Boolean per query: the noisy threshold check passed.
        threshold: T, an absolute vote count.
        sigma_threshold: σ1 of the threshold check.
        sigma_gnmax: σ2 of the noisy argmax.
    """

    votes: np.ndarray
    answered: np.ndarray
    threshold: float
    sigma_threshold: float
    sigma_gnmax: float

    def __post_init__(self):
        votes = _validate_votes(self.votes)
        answered = _to_numpy(self.answered)
        if answered.shape != (votes.shape[0],):
            raise ValueError(
                f"answered must have shape ({votes.shape[0]},) to match votes, got {answered.shape}"
            )
        object.__setattr__(self, "votes", _readonly(votes))
        object.__setattr__(self, "answered", _readonly(answered.astype(bool)))
        if not math.isfinite(float(self.threshold)):
            raise ValueError(f"threshold must be finite, got {self.threshold}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "sigma_threshold", _positive("sigma_threshold", self.sigma_threshold))
        object.__setattr__(self, "sigma_gnmax", _positive("sigma_gnmax", self.sigma_gnmax))


@dataclass(frozen=True, eq=False)
class LaplaceVoteEvent:
    """PATE-GAN Laplace votes n_j + Lap(1/λ) (Yoon et al. 2019), one per labelled sample.

    Attributes:
        vote_gaps: |n0 − n1| per query (copied, read-only).
        lam: λ, the inverse Laplace scale.
    """

    vote_gaps: np.ndarray
    lam: float

    def __post_init__(self):
        gaps = np.abs(_to_numpy(self.vote_gaps).astype(np.float64)).ravel()
        if not np.isfinite(gaps).all():
            raise ValueError("vote_gaps contain NaN or infinite values")
        object.__setattr__(self, "vote_gaps", _readonly(gaps))
        object.__setattr__(self, "lam", _positive("lam", self.lam))


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """``steps`` subsampled Gaussian mechanisms (DP-SGD; dp-accounting's analysis).

    Attributes:
        noise_multiplier: σ relative to the L2 sensitivity.
        sampling_rate: q.
        steps: Number of steps.
        sampling: ``"poisson"`` (with ``"add_remove"``) or ``"without_replacement"``
            (with ``"replace_one"``).
        neighboring: ``"add_remove"`` or ``"replace_one"``.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int = 1
    sampling: str = "poisson"
    neighboring: str = "add_remove"

    def __post_init__(self):
        _positive("noise_multiplier", self.noise_multiplier)
        if not 0.0 <= float(self.sampling_rate) <= 1.0:
            raise ValueError(f"sampling_rate must lie in [0, 1], got {self.sampling_rate}")
        _count("steps", self.steps)
        pairs = {("poisson", "add_remove"), ("without_replacement", "replace_one")}
        if (self.sampling, self.neighboring) not in pairs:
            raise ValueError(
                f"unsupported sampling/neighboring pair ({self.sampling!r}, {self.neighboring!r}); "
                f"dp-accounting supports {sorted(pairs)}"
            )


@dataclass(frozen=True)
class GSWGANStepEvent:
    """``steps`` GS-WGAN generator steps (Chen et al. 2020).

    Attributes:
        noise_multiplier: σ of the gradient sanitiser.
        num_discriminators: N_D (one drawn per step).
        batch_size: B generated samples per step.
        steps: Number of generator steps.
    """

    noise_multiplier: float
    num_discriminators: int
    batch_size: int
    steps: int = 1

    def __post_init__(self):
        _positive("noise_multiplier", self.noise_multiplier)
        _count("num_discriminators", self.num_discriminators, 1)
        _count("batch_size", self.batch_size, 1)
        _count("steps", self.steps)


@dataclass(frozen=True)
class TopAggEvent:
    """DataLens' TopAgg (Wang, Wu, Long et al., CCS 2021, Algorithm 2) on ``num_samples`` samples.

    Per generated sample every teacher votes a vector with exactly ``topk`` non-zero entries, each
    ±1 (the stochastic signs of its top-k coordinates); the votes are summed and N(0, σ²) is added
    to every coordinate once; the released signs of the coordinates above the threshold are
    post-processing. Replacing one teacher's data changes its vote vector ``v`` to some ``v'``, so
    the sum moves by ``‖v − v'‖₂ ≤ 2√k`` (equality: same support, every sign flipped). Each sample is
    therefore one Gaussian mechanism with L2 sensitivity ``2√k``:
    ``RDP(λ) = λ(2√k)²/(2σ²) = 2kλ/σ²`` (Mironov 2017, Corollary 3), data-independent.

    Attributes:
        num_samples: generated samples aggregated (one Gaussian mechanism each).
        topk: k, the non-zero coordinates of every teacher's vote.
        sigma: σ of the noise added to the summed votes.
    """

    num_samples: int
    topk: int
    sigma: float

    def __post_init__(self):
        _count("num_samples", self.num_samples)
        _count("topk", self.topk, 1)
        _positive("sigma", self.sigma)

    @property
    def noise_multiplier(self) -> float:
        """σ over the L2 sensitivity 2√k."""
        return float(self.sigma) / (2.0 * math.sqrt(self.topk))


@dataclass(frozen=True)
class PureDPEvent:
    """A pure ε-DP release (e.g. a Laplace label ratio, DP bounds).

    Attributes:
        epsilon: Its ε.
        description: Free text for logs.
    """

    epsilon: float
    description: str = ""

    def __post_init__(self):
        eps = float(self.epsilon)
        if not (0.0 <= eps < math.inf):
            raise ValueError(f"epsilon must be finite and >= 0, got {self.epsilon}")


PrivacyEvent = (
    ConfidentGNMaxEvent | LaplaceVoteEvent | SubsampledGaussianEvent | GSWGANStepEvent | TopAggEvent | PureDPEvent
)

_COUNT_KEYS = (
    "confident_gnmax_events",
    "confident_gnmax_queries",
    "confident_gnmax_answered",
    "laplace_vote_events",
    "laplace_vote_queries",
    "subsampled_gaussian_events",
    "subsampled_gaussian_steps",
    "gswgan_events",
    "gswgan_steps",
    "topagg_events",
    "topagg_samples",
    "pure_dp_events",
    "pure_dp_epsilon",
)


@dataclass
class _Cost:
    guarantee: np.ndarray
    paper: Optional[np.ndarray]  # None: no separate paper analysis
    label: Optional[str]
    counts: dict = field(default_factory=dict)


def _event_cost(event, orders: np.ndarray, *, paper: bool = True) -> _Cost:
    """RDP curves (guarantee, paper-style) and counters of one event.

    With ``paper=False`` a data-dependent paper-style curve is not computed (``cost.paper`` is then
    ``None`` for every event): the guarantee alone is what a budget check needs, and for PATE
    events it is data-independent and cheap while the data-dependent bound costs a pass over every
    query's histogram.
    """
    if isinstance(event, ConfidentGNMaxEvent):
        kw = dict(
            threshold=event.threshold,
            sigma_threshold=event.sigma_threshold,
            sigma_gnmax=event.sigma_gnmax,
            orders=orders,
        )
        n = int(event.votes.shape[0])
        g = _confident_gnmax_independent(n, int(event.answered.sum()), event.sigma_threshold, event.sigma_gnmax, orders)
        p = confident_gnmax_rdp(event.votes, event.answered, data_independent=False, **kw) if paper else None
        return _Cost(g, p, DATA_DEPENDENT, {
            "confident_gnmax_events": 1,
            "confident_gnmax_queries": n,
            "confident_gnmax_answered": int(event.answered.sum()),
        })
    if isinstance(event, LaplaceVoteEvent):
        g = laplace_vote_rdp(event.vote_gaps, lam=event.lam, orders=orders, data_independent=True)
        p = laplace_vote_rdp(event.vote_gaps, lam=event.lam, orders=orders, data_independent=False) if paper else None
        return _Cost(g, p, DATA_DEPENDENT, {
            "laplace_vote_events": 1,
            "laplace_vote_queries": int(event.vote_gaps.size),
        })
    if isinstance(event, SubsampledGaussianEvent):
        g = subsampled_gaussian_rdp(
            noise_multiplier=event.noise_multiplier,
            sampling_rate=event.sampling_rate,
            steps=event.steps,
            orders=orders,
            sampling=event.sampling,
            neighboring=event.neighboring,
        )
        return _Cost(g, None, None, {
            "subsampled_gaussian_events": 1,
            "subsampled_gaussian_steps": int(event.steps),
        })
    if isinstance(event, GSWGANStepEvent):
        kw = dict(
            noise_multiplier=event.noise_multiplier,
            num_discriminators=event.num_discriminators,
            batch_size=event.batch_size,
            steps=event.steps,
            orders=orders,
        )
        return _Cost(
            gswgan_rdp(accounting="sound", **kw),
            gswgan_rdp(accounting="paper", **kw) if paper else None,
            PER_SAMPLE_COMPOSITION,
            {"gswgan_events": 1, "gswgan_steps": int(event.steps)},
        )
    if isinstance(event, TopAggEvent):
        per_sample = gaussian_rdp(event.noise_multiplier, orders)
        return _Cost(event.num_samples * per_sample, None, None, {
            "topagg_events": 1,
            "topagg_samples": int(event.num_samples),
        })
    if isinstance(event, PureDPEvent):
        return _Cost(pure_dp_rdp(event.epsilon, orders), None, None, {
            "pure_dp_events": 1,
            "pure_dp_epsilon": float(event.epsilon),
        })
    raise ValueError(f"unsupported privacy event type {type(event).__name__}")


_INDEPENDENT_CURVES: dict = {}


def _confident_gnmax_independent(n_queries: int, n_answered: int, sigma_threshold: float, sigma_gnmax: float,
                                 orders: np.ndarray) -> np.ndarray:
    """Data-independent RDP of Confident-GNMax queries: ``n·λ/(2σ1²) + n_answered·λ/σ2²``
    (:func:`~lightning_gpate.privacy.pate.confident_gnmax_rdp` with ``data_independent=True``).

    A query's data-independent cost does not depend on its votes, so the two per-query curves are
    computed once per (σ1, σ2, orders) and cached; the result equals the uncached one exactly.
    """
    key = (float(sigma_threshold), float(sigma_gnmax), orders.tobytes())
    curves = _INDEPENDENT_CURVES.get(key)
    if curves is None:
        if len(_INDEPENDENT_CURVES) > 64:
            _INDEPENDENT_CURVES.clear()
        curves = (orders / (2.0 * float(sigma_threshold) ** 2), orders / float(sigma_gnmax) ** 2)
        _INDEPENDENT_CURVES[key] = curves
    return n_queries * curves[0] + n_answered * curves[1]


# --------------------------------------------------------------------------------------
# Accountant
# --------------------------------------------------------------------------------------


class PrivacyAccountant:
    """Accumulates RDP curves of privacy events and converts them to ε(δ).

    Args:
        delta: Target δ in (0, 1).
        orders: Rényi orders (> 1); default the reference grid 1.1, 2, …, 199.
        conversion: ``"improved"`` (dp-accounting's RDP→DP conversion) or
            ``"classic"`` (Mironov 2017, Proposition 3), see
            :func:`~lightning_gpate.privacy.rdp.rdp_to_epsilon`.
        paper_analysis: Which paper-style (non-guarantee) analysis feeds
            ``rdp_paper``. ``None``: each event's own (data-dependent for PATE
            events, per-sample composition for GS-WGAN). ``"data_dependent"`` or
            ``"per_sample_composition"``: only events with that analysis use it,
            the others add their guarantee. ``"guarantee"``: ``rdp_paper``
            equals ``rdp``.

    Example::

        acc = PrivacyAccountant(delta=1e-5)
        acc.record(PureDPEvent(0.01, "label ratio"))
        event = ConfidentGNMaxEvent(votes, answered, threshold, sigma1, sigma2)
        if acc.epsilon_if(event) > budget:
            stop_training()          # before applying the update
        else:
            acc.record(event)
    """

    def __init__(
        self,
        *,
        delta: float,
        orders=DEFAULT_ORDERS,
        conversion: str = "improved",
        paper_analysis: Optional[str] = None,
    ):
        delta = float(delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta must lie in the open interval (0, 1), got {delta}")
        if conversion not in ("improved", "classic"):
            raise ValueError(f"conversion must be 'improved' or 'classic', got {conversion!r}")
        if paper_analysis is not None and paper_analysis not in _PAPER_ANALYSES:
            raise ValueError(
                f"paper_analysis must be None or one of {_PAPER_ANALYSES}, got {paper_analysis!r}"
            )
        self.delta = delta
        self.conversion = conversion
        self.paper_analysis = paper_analysis
        self._orders = _readonly(validate_orders(orders))
        self._rdp = np.zeros_like(self._orders)
        self._rdp_paper = np.zeros_like(self._orders)
        self._labels: set[str] = set()
        self._counts: dict[str, float] = {k: 0 for k in _COUNT_KEYS}

    # -- curves ---------------------------------------------------------------------

    @property
    def orders(self) -> np.ndarray:
        """The Rényi orders (read-only)."""
        return self._orders

    @property
    def rdp(self) -> np.ndarray:
        """The guarantee RDP curve (a copy)."""
        return self._rdp.copy()

    @property
    def rdp_paper(self) -> np.ndarray:
        """The paper-style RDP curve, not a guarantee (a copy)."""
        return self._rdp_paper.copy()

    @property
    def counts(self) -> dict:
        """Events and queries recorded, per kind (a copy)."""
        return dict(self._counts)

    @property
    def paper_label(self) -> str:
        """Name of the paper-style analysis, e.g. ``"data_dependent"``.

        ``"guarantee"`` when ``rdp_paper`` equals ``rdp``; several analyses are
        joined with ``"+"``.
        """
        if self.paper_analysis is not None:
            return self.paper_analysis
        return "+".join(sorted(self._labels)) if self._labels else GUARANTEE

    def _paper_curve(self, cost: _Cost) -> np.ndarray:
        if cost.paper is None or self.paper_analysis == GUARANTEE:
            return cost.guarantee
        if self.paper_analysis is not None and cost.label != self.paper_analysis:
            return cost.guarantee
        return cost.paper

    def rdp_of(self, event) -> tuple[np.ndarray, np.ndarray]:
        """(guarantee, paper-style) RDP curves of one event, without recording it."""
        cost = _event_cost(event, self._orders)
        return cost.guarantee, self._paper_curve(cost)

    # -- recording ------------------------------------------------------------------

    def record(self, event) -> "PrivacyAccountant":
        """Adds the event's curves to ``rdp`` and ``rdp_paper``; returns ``self``."""
        cost = _event_cost(event, self._orders)
        self._rdp = self._rdp + cost.guarantee
        self._rdp_paper = self._rdp_paper + self._paper_curve(cost)
        if cost.paper is not None and self.paper_analysis in (None, cost.label):
            self._labels.add(cost.label)
        for k, v in cost.counts.items():
            self._counts[k] += v
        return self

    # -- epsilon --------------------------------------------------------------------

    def epsilon_and_order(self) -> tuple[float, float]:
        """(ε, best order) of the guarantee."""
        return rdp_to_epsilon(self._rdp, self._orders, self.delta, conversion=self.conversion)

    def epsilon(self) -> float:
        """ε of the guarantee at ``delta``."""
        return self.epsilon_and_order()[0]

    def epsilon_paper(self) -> float:
        """ε of the paper-style analysis (see ``paper_label``); NOT a guarantee."""
        return rdp_to_epsilon(
            self._rdp_paper, self._orders, self.delta, conversion=self.conversion
        )[0]

    def epsilon_if(self, event) -> float:
        """ε of the guarantee if ``event`` were recorded; nothing is recorded.

        Use it to stop BEFORE an update whose privacy cost would exceed the budget. Only the
        guarantee's curve is computed (no data-dependent analysis).
        """
        g = _event_cost(event, self._orders, paper=False).guarantee
        return rdp_to_epsilon(self._rdp + g, self._orders, self.delta, conversion=self.conversion)[0]

    # -- persistence ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (floats, lists, strings) for torch checkpoints and JSON.

        Infinite RDP values (never produced by the mechanisms here for valid
        parameters) would be written as ``float('inf')``.
        """
        return {
            "version": 1,
            "delta": self.delta,
            "conversion": self.conversion,
            "paper_analysis": self.paper_analysis,
            "orders": [float(x) for x in self._orders],
            "rdp": [float(x) for x in self._rdp],
            "rdp_paper": [float(x) for x in self._rdp_paper],
            "labels": sorted(self._labels),
            "counts": {k: (float(v) if k == "pure_dp_epsilon" else int(v)) for k, v in self._counts.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` (δ, conversion, orders and curves included)."""
        missing = {"delta", "conversion", "orders", "rdp", "rdp_paper", "counts"} - set(state)
        if missing:
            raise ValueError(f"accountant state is missing keys {sorted(missing)}")
        orders = validate_orders(state["orders"])
        rdp = np.asarray(state["rdp"], dtype=np.float64)
        rdp_paper = np.asarray(state["rdp_paper"], dtype=np.float64)
        if rdp.shape != orders.shape or rdp_paper.shape != orders.shape:
            raise ValueError(
                f"accountant state curves have shapes {rdp.shape}/{rdp_paper.shape}, "
                f"orders {orders.shape}"
            )
        paper_analysis = state.get("paper_analysis")
        if paper_analysis is not None and paper_analysis not in _PAPER_ANALYSES:
            raise ValueError(f"unknown paper_analysis {paper_analysis!r} in accountant state")
        new = PrivacyAccountant(
            delta=state["delta"], orders=orders, conversion=state["conversion"],
            paper_analysis=paper_analysis,
        )
        self.__dict__.update(new.__dict__)
        self._rdp = rdp.copy()
        self._rdp_paper = rdp_paper.copy()
        self._labels = set(state.get("labels", []))
        self._counts = {k: 0 for k in _COUNT_KEYS}
        self._counts.update(state["counts"])

    def summary(self) -> dict[str, Any]:
        """Flat dict of scalars/strings for MLflow (params or metrics)."""
        eps, order = self.epsilon_and_order()
        eps_p, order_p = rdp_to_epsilon(
            self._rdp_paper, self._orders, self.delta, conversion=self.conversion
        )
        out: dict[str, Any] = {
            "epsilon": eps,
            "delta": self.delta,
            "best_order": order,
            "epsilon_paper": eps_p,
            "best_order_paper": order_p,
            "analysis": self.paper_label,
            "conversion": self.conversion,
            "num_orders": int(self._orders.size),
            "orders": ",".join(f"{x:g}" for x in self._orders),
        }
        out.update(self.counts)
        return out

    def __repr__(self) -> str:
        return (
            f"PrivacyAccountant(epsilon={self.epsilon():.6g}, delta={self.delta:g}, "
            f"epsilon_{self.paper_label}={self.epsilon_paper():.6g}, conversion={self.conversion!r})"
        )
