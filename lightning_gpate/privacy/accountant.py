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
  Events without a separate paper analysis add their guarantee curve. A data-dependent analysis is a
  function of the private votes: an accountant made with ``data_dependent=False`` never computes one.

A third curve, ``rdp_worst_case``, is the guarantee of the *worst case* of every event recorded:
Confident-GNMax's guarantee depends on how many queries the noisy threshold answered (an output of
the mechanism), and the worst case answers them all. It is what the guarantee of a run stopped
before its budget is made of (:meth:`PrivacyAccountant.epsilon_worst_case`): the budget stop keeps
the realised curve within the budget, a privacy filter (Feldman & Zrnic 2021: every adaptively
chosen cost here is proportional to the order λ, so stopping on ε is stopping on one RDP budget at
every order), and that guarantees the budget, not the realised value; a run that ends earlier
(``max_steps``) is guaranteed the smaller of the budget and ``ε(rdp_worst_case)``.

ε(δ) comes from :func:`~lightning_gpate.privacy.rdp.rdp_to_epsilon`.

Every accountant declares the **neighbouring relation** its ε refers to (``neighbouring``; the models
use ``"add_remove"``: D and D' differ by one record). An event analysed under another relation is
converted where that is sound (a pure ε-DP release under add/remove is 2ε-DP under replace-one: a
replacement is a removal and an addition) and refused otherwise. PATE events (Confident-GNMax,
Laplace votes) hold under add/remove because the DataModule assigns a record to its teacher by a
keyed hash of its content (one record more or less changes one teacher's data, hence one vote);
a GS-WGAN step is a subsampled Gaussian over N_D discriminators under *discriminator-level*
replace-one, which is what *record-level* add/remove induces with that partition (see
:class:`GSWGANStepEvent`).
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
    exponential_mechanism_rdp,
    gaussian_rdp,
    pure_dp_rdp,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
    validate_orders,
)
from .smooth_sensitivity import gnss_rdp_curve

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "NEIGHBOURING_RELATIONS",
    "ConfidentGNMaxEvent",
    "LaplaceVoteEvent",
    "SubsampledGaussianEvent",
    "GSWGANStepEvent",
    "TopAggEvent",
    "GaussianSumEvent",
    "PureDPEvent",
    "GNSSEvent",
    "ExponentialMechanismEvent",
    "PrivacyEvent",
    "PrivacyAccountant",
    "worst_case_of",
    "DATA_DEPENDENT",
    "PER_SAMPLE_COMPOSITION",
    "GUARANTEE",
]

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
NEIGHBOURING_RELATIONS = (ADD_REMOVE, REPLACE_ONE)
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

    Neighbouring relation: record-level add/remove. The DataModule assigns each record to one of the
    N_D discriminators by a keyed hash of its content, so adding or removing a record changes the
    data (and so the whole trajectory) of exactly one discriminator while N_D stays fixed: at the
    level of discriminators that is a *replacement* of one of N_D elements. A step picks one of them
    uniformly, i.e. samples 1 of N_D without replacement, and releases the B sanitised gradients,
    whose stacked L2 sensitivity to swapping the chosen discriminator is 2C·√B against N(0, (2Cσ)²)
    noise per coordinate. Hence one step is ``SampledWithoutReplacementDpEvent(N_D, 1,
    GaussianDpEvent(σ/√B))`` under REPLACE_ONE (Wang, Balle & Kasiviswanathan 2019, Theorem 27),
    and that ε holds for adding or removing one record.

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
class GaussianSumEvent:
    """``num_sums`` Gaussian mechanisms on sums of per-teacher votes of bounded L2 norm (G-PATE's
    ``aggregator: gaussian``, :mod:`~lightning_gpate.privacy.gaussagg`).

    Every teacher's vote (its directions on the whole fake batch, one vector) is scaled to L2 norm 1,
    the votes are summed and N(0, σ²) is added to every coordinate. Changing one record changes one
    teacher's data and so its vote from ``v`` to ``v'`` with ``‖v‖, ‖v'‖ ≤ 1`` (an abstaining teacher
    votes 0): the sum moves by at most ``sensitivity = 2`` in L2, and one sum is a Gaussian mechanism
    with ``RDP(λ) = λΔ²/(2σ²)`` (Mironov 2017, Corollary 3), data-independent.

    Attributes:
        num_sums: Gaussian sums released (one per aggregation).
        sensitivity: Δ, the L2 sensitivity of one sum (2 for votes of norm at most 1).
        sigma: σ of the noise on every coordinate.
    """

    num_sums: int
    sensitivity: float
    sigma: float

    def __post_init__(self):
        _count("num_sums", self.num_sums)
        _positive("sensitivity", self.sensitivity)
        _positive("sigma", self.sigma)

    @property
    def noise_multiplier(self) -> float:
        """σ over the L2 sensitivity Δ."""
        return float(self.sigma) / float(self.sensitivity)


@dataclass(frozen=True)
class PureDPEvent:
    """A pure ε-DP release (e.g. a Laplace label ratio, DP bounds).

    Attributes:
        epsilon: Its ε, under ``neighbouring``.
        description: Free text for logs.
        neighbouring: The relation its ε was computed for (``"add_remove"``: the Laplace histogram and
            the exponential-mechanism bounds of :mod:`~lightning_gpate.privacy.dp_stats`).
    """

    epsilon: float
    description: str = ""
    neighbouring: str = ADD_REMOVE

    def __post_init__(self):
        eps = float(self.epsilon)
        if not (0.0 <= eps < math.inf):
            raise ValueError(f"epsilon must be finite and >= 0, got {self.epsilon}")
        if self.neighbouring not in NEIGHBOURING_RELATIONS:
            raise ValueError(f"neighbouring must be one of {NEIGHBOURING_RELATIONS}, got {self.neighbouring!r}")


@dataclass(frozen=True)
class GNSSEvent:
    """A smooth-sensitivity release: a data-dependent RDP published as ``f(D) + SS_β(D)·σ·N(0, 1)``
    (Papernot et al. 2018, Section 4). Its own cost is data-independent (Theorem 23,
    :func:`~lightning_gpate.privacy.smooth_sensitivity.gnss_rdp`), finite only at orders
    ``1 < λ < 1/(2β)`` (``inf`` elsewhere).

    Attributes:
        beta: β, the smoothness of the sensitivity bound.
        sigma: σ_ss, the noise multiplier.
    """

    beta: float
    sigma: float

    def __post_init__(self):
        _positive("beta", self.beta)
        _positive("sigma", self.sigma)


@dataclass(frozen=True)
class ExponentialMechanismEvent:
    """One ε-DP exponential mechanism (selection ∝ exp(ε·q/(2Δ))), accounted as ε-bounded range:
    RDP ``min(ε, λε²/8)`` (see :func:`~lightning_gpate.privacy.rdp.exponential_mechanism_rdp`).

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
    ConfidentGNMaxEvent | LaplaceVoteEvent | SubsampledGaussianEvent | GSWGANStepEvent | TopAggEvent | GaussianSumEvent
    | PureDPEvent
    | GNSSEvent | ExponentialMechanismEvent
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
    "gaussian_sum_events",
    "gaussian_sums",
    "pure_dp_events",
    "pure_dp_epsilon",
    "gnss_events",
    "exponential_mechanism_events",
)


@dataclass
class _Cost:
    guarantee: np.ndarray
    paper: Optional[np.ndarray]  # None: no separate paper analysis
    label: Optional[str]
    counts: dict = field(default_factory=dict)


def pure_epsilon_under(epsilon: float, *, computed_under: str, relation: str) -> float:
    """ε of a pure ε-DP release (computed under ``computed_under``) under ``relation``.

    Add/remove → replace-one: 2ε (a replacement is one removal and one addition: group privacy of
    two; e.g. a Laplace histogram moves two counts when a record changes class). Replace-one →
    add/remove does not follow in general and is refused.
    """
    if computed_under == relation:
        return float(epsilon)
    if computed_under == ADD_REMOVE and relation == REPLACE_ONE:
        return 2.0 * float(epsilon)
    raise ValueError(f"a pure-DP release analysed under {computed_under} has no bound under {relation}: "
                     f"analyse it under {relation}")


def _check_relation(event, relation: str) -> None:
    if isinstance(event, SubsampledGaussianEvent) and event.neighboring != relation:
        raise ValueError(
            f"this accountant's ε refers to {relation} neighbours, but the event is analysed under "
            f"{event.neighboring} ({event.sampling} sampling)"
        )


def _event_cost(event, orders: np.ndarray, relation: str = ADD_REMOVE, *, paper: bool = True,
                data_dependent: bool = True) -> _Cost:
    """RDP curves (guarantee, paper-style) and counters of one event, under ``relation``.

    With ``paper=False`` no paper-style curve is computed (``cost.paper`` is then ``None`` for every
    event): the guarantee alone is what a budget check needs, and for PATE events it is
    data-independent and cheap while the data-dependent bound costs a pass over every query's
    histogram. With ``data_dependent=False`` only the data-dependent ones are skipped (a PATE event's
    ``cost.paper`` is ``None``; its label stays, so the skipped analysis can be named).
    """
    dd = paper and data_dependent
    _check_relation(event, relation)
    if isinstance(event, ConfidentGNMaxEvent):
        kw = dict(
            threshold=event.threshold,
            sigma_threshold=event.sigma_threshold,
            sigma_gnmax=event.sigma_gnmax,
            orders=orders,
        )
        n = int(event.votes.shape[0])
        g = _confident_gnmax_independent(n, int(event.answered.sum()), event.sigma_threshold, event.sigma_gnmax, orders)
        p = confident_gnmax_rdp(event.votes, event.answered, data_independent=False, **kw) if dd else None
        return _Cost(g, p, DATA_DEPENDENT, {
            "confident_gnmax_events": 1,
            "confident_gnmax_queries": n,
            "confident_gnmax_answered": int(event.answered.sum()),
        })
    if isinstance(event, LaplaceVoteEvent):
        g = laplace_vote_rdp(event.vote_gaps, lam=event.lam, orders=orders, data_independent=True)
        p = laplace_vote_rdp(event.vote_gaps, lam=event.lam, orders=orders, data_independent=False) if dd else None
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
    if isinstance(event, GaussianSumEvent):
        return _Cost(event.num_sums * gaussian_rdp(event.noise_multiplier, orders), None, None, {
            "gaussian_sum_events": 1,
            "gaussian_sums": int(event.num_sums),
        })
    if isinstance(event, PureDPEvent):
        eps = pure_epsilon_under(event.epsilon, computed_under=event.neighbouring, relation=relation)
        return _Cost(pure_dp_rdp(eps, orders), None, None, {
            "pure_dp_events": 1,
            "pure_dp_epsilon": eps,
        })
    if isinstance(event, GNSSEvent):
        return _Cost(gnss_rdp_curve(beta=event.beta, sigma=event.sigma, orders=orders), None, None, {"gnss_events": 1})
    if isinstance(event, ExponentialMechanismEvent):
        return _Cost(exponential_mechanism_rdp(event.epsilon, orders), None, None, {"exponential_mechanism_events": 1})
    raise ValueError(f"unsupported privacy event type {type(event).__name__}")


def worst_case_of(event):
    """The worst case of ``event`` for its guarantee: a Confident-GNMax batch with every query answered
    (how many the noisy threshold answers is an output of the mechanism); any other event's guarantee
    depends on public settings only, and it is its own worst case."""
    if isinstance(event, ConfidentGNMaxEvent):
        return ConfidentGNMaxEvent(np.zeros((event.votes.shape[0], event.votes.shape[1])),
                                   np.ones(event.votes.shape[0], dtype=bool),
                                   event.threshold, event.sigma_threshold, event.sigma_gnmax)
    return event


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
        neighbouring: The neighbouring relation every ε of this accountant refers to
            (``"add_remove"``, the models' choice, or ``"replace_one"``).
        paper_analysis: Which paper-style (non-guarantee) analysis feeds
            ``rdp_paper``. ``None``: each event's own (data-dependent for PATE
            events, per-sample composition for GS-WGAN). ``"data_dependent"`` or
            ``"per_sample_composition"``: only events with that analysis use it,
            the others add their guarantee. ``"guarantee"``: ``rdp_paper``
            equals ``rdp`` (nothing else is computed).
        data_dependent: Whether data-dependent analyses (functions of the private
            votes) are computed at all. ``False``: they are not, and their events
            add their guarantee to ``rdp_paper`` (a private model asks for them
            only under ``budget_accounting: paper``).

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
        neighbouring: str = ADD_REMOVE,
        data_dependent: bool = True,
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
        if neighbouring not in NEIGHBOURING_RELATIONS:
            raise ValueError(f"neighbouring must be one of {NEIGHBOURING_RELATIONS}, got {neighbouring!r}")
        self.delta = delta
        self.conversion = conversion
        self.neighbouring = neighbouring
        self.paper_analysis = paper_analysis
        self.data_dependent = bool(data_dependent)
        self._orders = _readonly(validate_orders(orders))
        self._rdp = np.zeros_like(self._orders)
        self._rdp_paper = np.zeros_like(self._orders)
        self._rdp_worst = np.zeros_like(self._orders)
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
    def rdp_worst_case(self) -> np.ndarray:
        """The guarantee's RDP curve of the worst case of every event recorded (:func:`worst_case_of`,
        or the ``worst_case`` given to :meth:`record`); a copy."""
        return self._rdp_worst.copy()

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

    def _cost(self, event) -> _Cost:
        return _event_cost(event, self._orders, self.neighbouring, paper=self.paper_analysis != GUARANTEE,
                           data_dependent=self.data_dependent)

    def rdp_of(self, event) -> tuple[np.ndarray, np.ndarray]:
        """(guarantee, paper-style) RDP curves of one event, without recording it."""
        cost = self._cost(event)
        return cost.guarantee, self._paper_curve(cost)

    # -- recording ------------------------------------------------------------------

    def record(self, event, *, worst_case=None) -> "PrivacyAccountant":
        """Adds the event's curves to ``rdp`` and ``rdp_paper``, and the guarantee of its worst case to
        ``rdp_worst_case``; returns ``self``.

        Args:
            event: what happened.
            worst_case: the worst event this step could have been, when its size is itself random
                (e.g. G-PATE's queries per step under ``group_fakes_by_label``: the labels drawn);
                default :func:`worst_case_of` ``(event)``.
        """
        cost = self._cost(event)
        worst = _event_cost(worst_case_of(event if worst_case is None else worst_case), self._orders,
                            self.neighbouring, paper=False).guarantee
        with np.errstate(invalid="ignore"):  # inf − inf where GNSS has no bound: not smaller
            smaller = np.any(worst < cost.guarantee - 1e-12 * np.abs(cost.guarantee))
        if smaller:
            raise ValueError("worst_case costs less than the event it is the worst case of")
        self._rdp = self._rdp + cost.guarantee
        self._rdp_paper = self._rdp_paper + self._paper_curve(cost)
        self._rdp_worst = self._rdp_worst + worst
        if cost.paper is not None and self.paper_analysis in (None, cost.label):
            self._labels.add(cost.label)
        for k, v in cost.counts.items():
            self._counts[k] += v
        return self

    def record_worst_case_only(self, event) -> "PrivacyAccountant":
        """Adds the guarantee of ``event``'s worst case to ``rdp_worst_case`` alone (``rdp`` and ``rdp_paper``
        unchanged); returns ``self``. For a cost the guarantee must count that no mechanism realised: the
        steps an adaptive schedule allowed beyond those it took, in a state written before they were
        recorded (DP-GAN's checkpoints before its worst case was kept)."""
        self._rdp_worst = self._rdp_worst + _event_cost(worst_case_of(event), self._orders, self.neighbouring,
                                                        paper=False).guarantee
        return self

    # -- epsilon --------------------------------------------------------------------

    def epsilon_and_order(self) -> tuple[float, float]:
        """(ε, best order) of the guarantee."""
        return rdp_to_epsilon(self._rdp, self._orders, self.delta, conversion=self.conversion)

    def epsilon(self) -> float:
        """ε of the guarantee at ``delta``."""
        return self.epsilon_and_order()[0]

    def epsilon_worst_case(self, *events) -> float:
        """ε of ``rdp_worst_case`` (with the worst cases of ``events`` added, nothing recorded): what
        the steps recorded could have cost whatever their mechanisms output."""
        return self.epsilon_worst_case_and_order(*events)[0]

    def epsilon_worst_case_and_order(self, *events) -> tuple[float, float]:
        """(ε, best order) of :meth:`epsilon_worst_case`."""
        g = sum((_event_cost(worst_case_of(event), self._orders, self.neighbouring, paper=False).guarantee
                 for event in events), np.zeros_like(self._rdp))
        return rdp_to_epsilon(self._rdp_worst + g, self._orders, self.delta, conversion=self.conversion)

    def epsilon_paper(self) -> float:
        """ε of the paper-style analysis (see ``paper_label``); NOT a guarantee."""
        return rdp_to_epsilon(
            self._rdp_paper, self._orders, self.delta, conversion=self.conversion
        )[0]

    def epsilon_if(self, *events) -> float:
        """ε of the guarantee if ``events`` were recorded; nothing is recorded.

        Use it to stop BEFORE an update whose privacy cost would exceed the budget. Only the
        guarantee's curve is computed (no data-dependent analysis).
        """
        g = sum((_event_cost(event, self._orders, self.neighbouring, paper=False).guarantee for event in events),
                np.zeros_like(self._rdp))
        return rdp_to_epsilon(self._rdp + g, self._orders, self.delta, conversion=self.conversion)[0]

    # -- persistence ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (floats, lists, strings) for torch checkpoints and JSON.

        Infinite RDP values (never produced by the mechanisms here for valid
        parameters) would be written as ``float('inf')``.
        """
        return {
            "version": 2,
            "delta": self.delta,
            "conversion": self.conversion,
            "paper_analysis": self.paper_analysis,
            "data_dependent": self.data_dependent,
            "neighbouring": self.neighbouring,
            "orders": [float(x) for x in self._orders],
            "rdp": [float(x) for x in self._rdp],
            "rdp_paper": [float(x) for x in self._rdp_paper],
            "rdp_worst_case": [float(x) for x in self._rdp_worst],
            "labels": sorted(self._labels),
            "counts": {k: (float(v) if k == "pure_dp_epsilon" else int(v)) for k, v in self._counts.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` (δ, conversion, orders and curves included).

        A version-1 state has no worst-case curve: where it recorded Confident-GNMax queries that were
        not answered, the worst case is unknown and becomes ``inf`` (a run's guarantee is then its
        budget); otherwise it equals the realised guarantee."""
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
            paper_analysis=paper_analysis, neighbouring=state.get("neighbouring", ADD_REMOVE),
            data_dependent=state.get("data_dependent", True),
        )
        self.__dict__.update(new.__dict__)
        self._rdp = rdp.copy()
        self._rdp_paper = rdp_paper.copy()
        counts = state["counts"]
        if "rdp_worst_case" in state:
            self._rdp_worst = np.asarray(state["rdp_worst_case"], dtype=np.float64).copy()
            if self._rdp_worst.shape != orders.shape:
                raise ValueError(f"accountant state's worst-case curve has shape {self._rdp_worst.shape}, orders {orders.shape}")
        elif counts.get("confident_gnmax_answered", 0) < counts.get("confident_gnmax_queries", 0):
            self._rdp_worst = np.full_like(rdp, np.inf)
        else:
            self._rdp_worst = rdp.copy()
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
            "epsilon_worst_case": self.epsilon_worst_case(),
            "analysis": self.paper_label,
            "neighbouring_relation": self.neighbouring,
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
