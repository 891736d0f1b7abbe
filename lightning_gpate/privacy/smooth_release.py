"""What a run keeps and releases when its data-dependent PATE cost is released with smooth
sensitivity (Papernot et al., ICLR 2018, Section 4; arXiv 1802.08908).

* :class:`GNSSParameters` — λ, β, σ_ss, fixed before training from public values
  (:func:`default_gnss_parameters`);
* the ledgers (:class:`ConfidentGNMaxLedger`, :class:`LaplaceVoteLedger`) — the running
  data-dependent RDP at λ of a run's queries and the per-distance sums of their local-sensitivity
  bounds, computed with the analysis of :mod:`~lightning_gpate.privacy.smooth_sensitivity`; a count
  per ``round(max h)`` (or vote gap) and per-distance sums, never the votes. A ledger is private state
  (training checkpoint only);
* :func:`release` / :class:`GNSSRelease` — the one thing that leaves a run: the noised value;
* :class:`SmoothSensitivityAccountant` — the run's ledger and the data-independent rest at λ.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from .accountant import ConfidentGNMaxEvent, LaplaceVoteEvent, PrivacyAccountant
from .pate import _to_numpy, _validate_votes, gnmax_logq
from .rdp import rdp_to_epsilon
from .smooth_sensitivity import (
    _ball_sum,
    _gap_index,
    _gnmax_walk_values,
    _neighbour_differences,
    _order,
    _positive,
    _sorted_votes,
    _teachers,
    gnmax_conditions,
    gnmax_local_sensitivity,
    gnmax_logq1,
    gnmax_rdp_at_order,
    gnss_rdp,
    gnss_rdp_curve,
    laplace_rdp_table,
    smooth_sensitivity,
    threshold_local_sensitivity_table,
    threshold_rdp_table,
    walk_horizon,
)

__all__ = [
    "BETA_FRACTION",
    "GNSSParameters",
    "default_gnss_parameters",
    "ConfidentGNMaxLedger",
    "LaplaceVoteLedger",
    "ledger_from_state",
    "GNSSRelease",
    "release",
    "SmoothSensitivityAccountant",
]


# --------------------------------------------------------------------------------------
# GNSS parameters, fixed before training
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GNSSParameters:
    """The parameters of a smooth-sensitivity release, fixed before training (public).

    Attributes:
        order: λ, the Rényi order at which the data-dependent cost is released.
        beta: β, the smoothness (``0 < β < 1/(2λ)``).
        sigma: σ_ss, the GNSS noise multiplier: the release adds ``SS_β·σ_ss·N(0, 1)``.
        rule: how they were chosen (``"config"`` or ``"default"``).
    """

    order: float
    beta: float
    sigma: float
    rule: str = "config"

    def __post_init__(self):
        _order(self.order)
        _positive("beta", self.beta)
        _positive("sigma", self.sigma)
        gnss_rdp(beta=self.beta, sigma=self.sigma, order=self.order)  # validates 1 < λ < 1/(2β)

    @property
    def cost(self) -> float:
        """The GNSS RDP at ``order`` (Theorem 23)."""
        return gnss_rdp(beta=self.beta, sigma=self.sigma, order=self.order)

    def rdp_curve(self, orders) -> np.ndarray:
        """GNSS RDP on ``orders`` (``inf`` at orders ≥ 1/(2β)): what the release costs at every order,
        for the data-independent bound of everything a run releases."""
        return gnss_rdp_curve(beta=self.beta, sigma=self.sigma, orders=orders)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: β = BETA_FRACTION / λ in the default rule (the reference's search range is 0.3/λ … 0.495/λ).
BETA_FRACTION = 0.4
#: Default rule: the conversion term and GNSS's β-term take this fraction of the target ε ...
DEFAULT_FIXED_SHARE = 0.5
#: ... and GNSS's noise term λe^{2β}/σ_ss² this fraction.
DEFAULT_NOISE_SHARE = 0.1


def _conversion_epsilon(rdp: float, order: float, delta: float, conversion: str) -> float:
    return rdp_to_epsilon(np.array([rdp]), np.array([order]), delta, conversion=conversion)[0]


def default_gnss_parameters(*, epsilon: float, delta: float, conversion: str = "improved",
                            order: float | None = None, beta: float | None = None,
                            sigma: float | None = None) -> GNSSParameters:
    """The data-independent rule that fixes (λ, β, σ_ss) from the target (ε, δ) before training.

    Unset values follow the rule (given ones are kept; all are public):

    * β = 0.4/λ (inside the reference's search range 0.3/λ … 0.495/λ; GNSS needs β < 1/(2λ));
    * λ solves ``ε_conv(λ) + (−½ln(1 − 0.8) + 0.4)/(λ − 1) = ε/2``: converting RDP at λ to (ε, δ)
      plus GNSS's β-term take half of the target (``ε_conv`` is the RDP → (ε, δ) conversion of
      RDP 0 at λ, e.g. ``ln(1/δ)/(λ − 1)`` for the classic one);
    * σ_ss makes GNSS's noise term ``λe^{2β}/σ_ss²`` a tenth of the target.

    The rest, 0.4ε, is left for the data-dependent cost and the noise. ``lightning-gpate plan``
    estimates better values from public data (they are public too).

    Args:
        epsilon: the target ε the released ε must meet.
        delta: δ.
        conversion: the RDP → (ε, δ) conversion of the accountant.
        order, beta, sigma: values fixed by the user (``None``: by the rule).
    """
    epsilon, delta = _positive("epsilon", epsilon), float(delta)
    rule = "config" if None not in (order, beta, sigma) else "default"
    if order is None:
        frac = BETA_FRACTION if beta is None else None

        def excess(lam: float) -> float:
            b = frac / lam if frac is not None else beta
            if b >= 1.0 / (2.0 * lam):
                return math.inf
            fixed = _conversion_epsilon(0.0, lam, delta, conversion) if lam > 1.01 else math.inf
            if fixed == 0.0:  # the improved conversion gives 0 where the KL bound already gives δ
                fixed = math.log(1.0 / delta) / (lam - 1.0)
            return fixed + (-0.5 * math.log1p(-2.0 * lam * b) + b * lam) / (lam - 1.0) - DEFAULT_FIXED_SHARE * epsilon

        lo, hi = 1.02, 2.0
        while excess(hi) > 0:
            lo, hi = hi, hi * 2.0
            if hi > 1e6:
                raise ValueError(f"no Renyi order fits the target epsilon={epsilon:g} (delta={delta:g})")
        if excess(lo) <= 0:
            order = lo
        else:
            order = brentq(lambda x: excess(x) if math.isfinite(excess(x)) else 1e300, lo, hi, xtol=1e-9)
    order = _order(order)
    if beta is None:
        beta = BETA_FRACTION / order
    if sigma is None:
        sigma = math.sqrt(order * math.exp(2.0 * beta) / (DEFAULT_NOISE_SHARE * epsilon))
    return GNSSParameters(order=float(order), beta=float(beta), sigma=float(sigma), rule=rule)


# --------------------------------------------------------------------------------------
# Ledgers: what a run keeps (privately) to release its data-dependent cost at one order
# --------------------------------------------------------------------------------------


class ConfidentGNMaxLedger:
    """Running data-dependent RDP of Confident-GNMax queries at one order, with the per-distance
    sums of their local-sensitivity bounds (Papernot et al. 2018, Section 4 and Appendix B).

    Every query pays the threshold step; answered queries also pay GNMax (the answered flags are
    the mechanism's output). The threshold step's cost and bounds depend only on ``round(max h)``,
    so the ledger counts queries per value; GNMax's bounds are added to a per-distance sum
    (``d = 0 … n``) batch by batch. Votes are never stored. Private: keep it in the training
    checkpoint only.

    Args:
        num_teachers: n (every histogram sums to at most n).
        threshold: T, an absolute count.
        sigma_threshold: σ1.
        sigma_gnmax: σ2.
        num_bins: B.
        order: λ.
        max_distance: K: GNMax walks stop there and every larger distance gets the walk's constant
            tail (the plateau, an upper bound for every distance). ``None``: n (exact).
            :func:`walk_horizon` gives the K past which the discount e^{−βd} makes the difference
            negligible.
    """

    kind = "confident_gnmax"

    def __init__(self, *, num_teachers: int, threshold: float, sigma_threshold: float, sigma_gnmax: float,
                 num_bins: int, order: float, max_distance: int | None = None):
        self.num_teachers = _teachers(num_teachers)
        self.threshold = float(threshold)
        self.sigma_threshold = _positive("sigma_threshold", sigma_threshold)
        self.sigma_gnmax = _positive("sigma_gnmax", sigma_gnmax)
        if int(num_bins) != num_bins or num_bins < 2:
            raise ValueError(f"num_bins must be an integer >= 2, got {num_bins}")
        self.num_bins = int(num_bins)
        self.order = _order(order)
        n = self.num_teachers
        self.max_distance = n if max_distance is None else int(min(max(int(max_distance), 0), n))
        self.max_counts = np.zeros(n + 1, dtype=np.int64)  # threshold step: queries per round(max h)
        self.gnmax_rdp = 0.0  # Σ β(q) over answered queries
        self.gnmax_ls = np.zeros(n + 1)  # Σ walk values (running maxima) at distance d
        self.gnmax_tail = np.zeros(n + 2)  # Σ of constant tails starting at d (prefix-summed on read)
        self.num_queries = 0
        self.num_answered = 0
        c5, c6 = gnmax_conditions(self.sigma_gnmax, self.num_bins, self.order)
        #: GNMax's data-dependent bound is used only where Algorithm 3 is proven (C5 and C6 hold);
        #: elsewhere GNMax is charged its data-independent λ/σ2² (local sensitivity 0).
        self.gnmax_data_dependent = bool(c5 and c6)
        if not self.gnmax_data_dependent:
            warnings.warn(
                f"conditions C5-C6 of the GNMax smooth-sensitivity analysis (Papernot et al. 2018, B.4.2) fail at "
                f"sigma_gnmax={self.sigma_gnmax:g}, {self.num_bins} bins, order={self.order:g}: GNMax queries are "
                f"charged their data-independent cost in the release (a smaller order or a larger sigma_gnmax avoids this)",
                stacklevel=2,
            )

    def matches(self, event) -> bool:
        """Whether ``event`` (a ConfidentGNMaxEvent) has this ledger's mechanism parameters."""
        return (event.votes.shape[1] == self.num_bins and float(event.threshold) == self.threshold
                and float(event.sigma_threshold) == self.sigma_threshold and float(event.sigma_gnmax) == self.sigma_gnmax)

    def add(self, votes, answered) -> None:
        """Adds a batch of queries: ``votes`` ``[n_queries, B]``, ``answered`` ``[n_queries]``."""
        votes = _validate_votes(votes)
        answered = np.asarray(_to_numpy(answered)).astype(bool).reshape(-1)
        if votes.shape[1] != self.num_bins or answered.shape != (votes.shape[0],):
            raise ValueError(f"expected votes [n, {self.num_bins}] and answered [n], got {votes.shape} and {answered.shape}")
        n = self.num_teachers
        sv = _sorted_votes(votes, n)
        top = np.clip(np.round(sv[:, 0]).astype(np.int64), 0, n)
        self.max_counts += np.bincount(top, minlength=n + 1)
        self.num_queries += int(votes.shape[0])
        if not answered.any():
            return
        uniq, counts = np.unique(sv[answered], axis=0, return_counts=True)
        counts = counts.astype(np.float64)
        self.num_answered += int(answered.sum())
        s2, lam = self.sigma_gnmax, self.order
        if not self.gnmax_data_dependent:
            self.gnmax_rdp += float(counts.sum()) * lam / s2**2
            return
        self.gnmax_rdp += float(counts @ gnmax_rdp_at_order(gnmax_logq(uniq, s2), s2, lam))
        plateau = self._plateau()
        values, length = _gnmax_walk_values(uniq, s2, lam, self.max_distance)
        # the ball of radius d: running maxima along each walk (d < length), then a constant tail
        runmax = np.where(np.isnan(values), 0.0, np.fmax.accumulate(values, axis=1))
        self.gnmax_ls[: values.shape[1]] += counts @ runmax
        last = runmax[np.arange(len(uniq)), np.maximum(length - 1, 0)] if values.shape[1] else np.zeros(len(uniq))
        tail = np.maximum(np.where(length > 0, last, plateau), plateau)
        np.add.at(self.gnmax_tail, length, counts * tail)

    def add_event(self, event) -> None:
        """Adds a :class:`~.accountant.ConfidentGNMaxEvent` (its parameters must match)."""
        if not self.matches(event):
            raise ValueError("a Confident-GNMax event with other parameters than this ledger's (threshold, sigmas, bins)")
        self.add(event.votes, event.answered)

    def _plateau(self) -> float:
        s2, lam, m = self.sigma_gnmax, self.order, self.num_bins
        return float(gnmax_local_sensitivity(np.array([gnmax_logq1(s2, lam, m)]), s2, m, lam)[0])

    def data_dependent_rdp(self) -> float:
        """Σ over the queries of their data-dependent RDP at ``order``: β(D). Private."""
        r = threshold_rdp_table(self.num_teachers, self.threshold, self.sigma_threshold, self.order)
        return float(self.max_counts @ r) + self.gnmax_rdp

    def local_sensitivity(self) -> np.ndarray:
        """Upper bounds on the local sensitivity of β(·) over the ball of radius d, ``d = 0 … n``. Private."""
        n = self.num_teachers
        table = threshold_local_sensitivity_table(n, self.threshold, self.sigma_threshold, self.order)
        return _ball_sum(table, self.max_counts, n + 1) + self.gnmax_ls + np.cumsum(self.gnmax_tail)[: n + 1]

    def smooth_sensitivity(self, beta: float) -> float:
        """SS_β of β(·). Private."""
        return smooth_sensitivity(self.local_sensitivity(), beta)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "num_teachers": self.num_teachers, "threshold": self.threshold,
            "sigma_threshold": self.sigma_threshold, "sigma_gnmax": self.sigma_gnmax, "num_bins": self.num_bins,
            "order": self.order, "max_distance": self.max_distance, "max_counts": self.max_counts.tolist(), "gnmax_rdp": self.gnmax_rdp,
            "gnmax_ls": self.gnmax_ls.tolist(), "gnmax_tail": self.gnmax_tail.tolist(),
            "num_queries": self.num_queries, "num_answered": self.num_answered,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "ConfidentGNMaxLedger":
        with warnings.catch_warnings():  # warned when the run started
            warnings.simplefilter("ignore")
            led = cls(num_teachers=state["num_teachers"], threshold=state["threshold"],
                      sigma_threshold=state["sigma_threshold"], sigma_gnmax=state["sigma_gnmax"],
                      num_bins=state["num_bins"], order=state["order"], max_distance=state.get("max_distance"))
        led.max_counts = np.asarray(state["max_counts"], dtype=np.int64)
        led.gnmax_rdp = float(state["gnmax_rdp"])
        led.gnmax_ls = np.asarray(state["gnmax_ls"], dtype=np.float64)
        led.gnmax_tail = np.asarray(state["gnmax_tail"], dtype=np.float64)
        led.num_queries, led.num_answered = int(state["num_queries"]), int(state["num_answered"])
        return led


class LaplaceVoteLedger:
    """Running data-dependent RDP at one order of PATE-GAN's two-class Laplace votes and the counts
    per vote gap its local-sensitivity bounds are computed from.

    The bound of Theorem 3 (Papernot et al. 2017) is a function of the gap ``|n0 − n1|`` alone and one
    changed teacher moves the gap by 2, so — like the threshold step — the local sensitivity at
    distance d is a maximum over a table (:func:`laplace_rdp_table`), exact for that bound, and a
    count per gap is all the ledger keeps. Private.

    Args:
        num_teachers: n.
        lam: λ of the vote noise Lap(1/λ).
        order: the Rényi order of the release.
    """

    kind = "laplace_vote"

    def __init__(self, *, num_teachers: int, lam: float, order: float):
        self.num_teachers = _teachers(num_teachers)
        self.lam = _positive("lam", lam)
        self.order = _order(order)
        self.gap_counts = np.zeros(self.num_teachers // 2 + 1, dtype=np.int64)
        self.num_queries = 0

    def matches(self, event) -> bool:
        return float(event.lam) == self.lam

    def add(self, vote_gaps) -> None:
        idx = _gap_index(vote_gaps, self.num_teachers)
        self.gap_counts += np.bincount(idx, minlength=self.gap_counts.size)
        self.num_queries += int(idx.size)

    def add_event(self, event) -> None:
        if not self.matches(event):
            raise ValueError(f"a Laplace vote event with lam={event.lam:g}, this ledger has lam={self.lam:g}")
        self.add(event.vote_gaps)

    def data_dependent_rdp(self) -> float:
        return float(self.gap_counts @ laplace_rdp_table(self.num_teachers, self.lam, self.order))

    def local_sensitivity(self) -> np.ndarray:
        n = self.num_teachers
        table = _neighbour_differences(laplace_rdp_table(n, self.lam, self.order))
        return _ball_sum(table, self.gap_counts, n + 1)

    def smooth_sensitivity(self, beta: float) -> float:
        return smooth_sensitivity(self.local_sensitivity(), beta)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_teachers": self.num_teachers, "lam": self.lam, "order": self.order,
                "gap_counts": self.gap_counts.tolist(), "num_queries": self.num_queries}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LaplaceVoteLedger":
        led = cls(num_teachers=state["num_teachers"], lam=state["lam"], order=state["order"])
        led.gap_counts = np.asarray(state["gap_counts"], dtype=np.int64)
        led.num_queries = int(state["num_queries"])
        return led


def ledger_from_state(state: dict[str, Any]):
    """A ledger from its ``state_dict``."""
    kinds = {ConfidentGNMaxLedger.kind: ConfidentGNMaxLedger, LaplaceVoteLedger.kind: LaplaceVoteLedger}
    if state.get("kind") not in kinds:
        raise ValueError(f"unknown smooth-sensitivity ledger kind {state.get('kind')!r}")
    return kinds[state["kind"]].from_state(state)


# --------------------------------------------------------------------------------------
# The release
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GNSSRelease:
    """What a smooth-sensitivity release publishes (all of it noised or public).

    Attributes:
        order, beta, sigma: the GNSS parameters (public, fixed before training).
        noisy_rdp: ``max(0, β(D) + SS_β(D)·σ_ss·Z)``, the released data-dependent RDP at ``order``.
        gnss_rdp: GNSS's own cost at ``order`` (Theorem 23).
        other_rdp: data-independent RDP at ``order`` of everything else recorded (e.g. DP metadata).
        total_rdp: their sum, the released RDP at ``order``.
        delta: δ.
        epsilon: ``total_rdp`` converted to (ε, δ) at ``order``.
        conversion: the conversion used.
        num_queries: queries covered (public: fixed by the run length and settings).
    """

    order: float
    beta: float
    sigma: float
    noisy_rdp: float
    gnss_rdp: float
    other_rdp: float
    total_rdp: float
    delta: float
    epsilon: float
    conversion: str
    num_queries: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def release(ledgers, params: GNSSParameters, *, z: float, delta: float, other_rdp: float = 0.0,
            conversion: str = "improved") -> GNSSRelease:
    """Release the data-dependent RDP of ``ledgers`` at ``params.order`` through GNSS.

    ``β(D) = Σ`` of the ledgers' data-dependent RDP, its local sensitivity the per-distance sum of
    theirs; the released value is ``max(0, β(D) + SS_β·σ_ss·z)`` (clipping at 0 is post-processing:
    a true RDP is never negative).

    Args:
        ledgers: one ledger or a list of them (their orders must equal ``params.order``).
        params: λ, β, σ_ss.
        z: a standard normal draw from the mechanism's secret generator
            (:func:`~.randomness.mechanism_generator`).
        delta: δ of the conversion.
        other_rdp: data-independent RDP at λ of the run's other releases.
        conversion: ``"improved"`` or ``"classic"``.
    """
    ledgers = list(ledgers) if isinstance(ledgers, (list, tuple)) else [ledgers]
    for led in ledgers:
        if led.order != params.order:
            raise ValueError(f"a ledger at order {led.order:g} cannot be released at order {params.order:g}")
    dd = sum(led.data_dependent_rdp() for led in ledgers)
    if ledgers:
        ls = np.sum([led.local_sensitivity() for led in _same_length(ledgers)], axis=0)
        ss = smooth_sensitivity(ls, params.beta)
    else:
        ss = 0.0
    noisy = max(0.0, dd + ss * params.sigma * float(z))
    cost = params.cost
    total = noisy + cost + float(other_rdp)
    eps = _conversion_epsilon(total, params.order, delta, conversion)
    return GNSSRelease(order=params.order, beta=params.beta, sigma=params.sigma, noisy_rdp=noisy, gnss_rdp=cost,
                       other_rdp=float(other_rdp), total_rdp=total, delta=float(delta), epsilon=eps,
                       conversion=conversion, num_queries=int(sum(led.num_queries for led in ledgers)))


def _same_length(ledgers):
    sizes = {led.num_teachers for led in ledgers}
    if len(sizes) != 1:
        raise ValueError(f"ledgers over different numbers of teachers {sorted(sizes)}")
    return ledgers


# --------------------------------------------------------------------------------------
# The accountant of a smooth-sensitivity run
# --------------------------------------------------------------------------------------


class SmoothSensitivityAccountant:
    """Accounts a run whose data-dependent PATE cost is released with smooth sensitivity.

    It receives the same events as the run's :class:`~.accountant.PrivacyAccountant` (which keeps
    the data-independent guarantee): Confident-GNMax and Laplace-vote events go to a ledger at the
    order λ of ``params``; every other event (e.g. DP metadata) is data-independent and is
    accumulated at λ. :meth:`release` publishes the ledger's data-dependent RDP through GNSS.

    Everything but :attr:`released` and :attr:`params` is private (the ledger's sums are functions
    of the votes): :meth:`state_dict` belongs in the training checkpoint only;
    :meth:`public_state` is what may be logged or put in a release artifact.

    Args:
        params: λ, β, σ_ss, fixed before training.
        num_teachers: n, the teachers voting on every query.
        delta: δ of the conversion.
        conversion: the RDP → (ε, δ) conversion.
        neighbouring: the neighbouring relation of the run's ε (PATE's local sensitivity is over
            teachers, one record changes one teacher's data under either relation).
        exact: walk GNMax's bounds over every distance (``True``) or up to :func:`walk_horizon`
            (``False``, default: an upper bound, within e^{−30} of the exact one).
    """

    def __init__(self, *, params: GNSSParameters, num_teachers: int, delta: float, conversion: str = "improved",
                 neighbouring: str = "add_remove", exact: bool = False):
        self.params = params
        self.num_teachers = _teachers(num_teachers)
        self.delta = float(delta)
        self.conversion = conversion
        self.neighbouring = neighbouring
        self.exact = bool(exact)
        self.ledger: ConfidentGNMaxLedger | LaplaceVoteLedger | None = None
        self._other = PrivacyAccountant(delta=delta, orders=[params.order], conversion=conversion, neighbouring=neighbouring)
        self.released: GNSSRelease | None = None

    def _new_ledger(self, event):
        lam = self.params.order
        if isinstance(event, ConfidentGNMaxEvent):
            horizon = None if self.exact else walk_horizon(self.params.beta, self.num_teachers)
            return ConfidentGNMaxLedger(num_teachers=self.num_teachers, threshold=event.threshold,
                                        sigma_threshold=event.sigma_threshold, sigma_gnmax=event.sigma_gnmax,
                                        num_bins=event.votes.shape[1], order=lam, max_distance=horizon)
        if isinstance(event, LaplaceVoteEvent):
            return LaplaceVoteLedger(num_teachers=self.num_teachers, lam=event.lam, order=lam)
        return None

    def record(self, event) -> None:
        """Adds ``event``: to the ledger if it is a PATE vote event, else to the data-independent part."""
        if self.released is not None:
            raise RuntimeError("the data-dependent cost was already released: record nothing after the release")
        ledger = self.ledger or self._new_ledger(event)
        if ledger is None:
            self._other.record(event)
            return
        if self.ledger is None:
            self.ledger = ledger
        self.ledger.add_event(event)

    def accepts(self, event) -> bool:
        """Whether ``event`` can be recorded (a PATE event must match the ledger's mechanism)."""
        if not isinstance(event, (ConfidentGNMaxEvent, LaplaceVoteEvent)):
            return True
        if self.ledger is None:
            return True
        return type(event) is {"confident_gnmax": ConfidentGNMaxEvent, "laplace_vote": LaplaceVoteEvent}[self.ledger.kind] \
            and self.ledger.matches(event)

    def release(self, z: float) -> GNSSRelease:
        """Releases the data-dependent RDP at λ with the standard normal draw ``z`` (from the
        mechanism's secret generator). Once only."""
        if self.released is not None:
            raise RuntimeError("the data-dependent cost was already released")
        self.released = release([] if self.ledger is None else self.ledger, self.params, z=z, delta=self.delta,
                                other_rdp=float(self._other.rdp[0]), conversion=self.conversion)
        return self.released

    def public_state(self) -> dict[str, Any]:
        """The parameters and, once made, the release: nothing unnoised."""
        return {"params": self.params.to_dict(), "released": None if self.released is None else self.released.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        """PRIVATE state (ledger sums from the votes): for the training checkpoint only."""
        return {**self.public_state(), "num_teachers": self.num_teachers, "delta": self.delta,
                "conversion": self.conversion, "neighbouring": self.neighbouring, "exact": self.exact,
                "ledger": None if self.ledger is None else self.ledger.state_dict(),
                "other": self._other.state_dict()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "SmoothSensitivityAccountant":
        acc = cls(params=GNSSParameters(**state["params"]), num_teachers=state["num_teachers"], delta=state["delta"],
                  conversion=state["conversion"], neighbouring=state.get("neighbouring", "add_remove"),
                  exact=state.get("exact", False))
        if state.get("ledger") is not None:
            acc.ledger = ledger_from_state(state["ledger"])
        acc._other.load_state_dict(state["other"])
        if state.get("released") is not None:
            acc.released = GNSSRelease(**state["released"])
        return acc
