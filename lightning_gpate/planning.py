"""``lightning-gpate plan``: how many training steps fit a target ε under each analysis — an ESTIMATE.

The data-dependent costs of the PATE models depend on how much the teachers agree, which is unknown
before a run on the private data (and reading it there would cost privacy). The plan measures it
instead on votes that are not private:

* ``--data_is_public``: a short probe run of the configured model (G-PATE or PATE-GAN) on the data of
  the config, which the user declares public (e.g. a public dataset like the private one, or synthetic
  data); its vote histograms are recorded in memory only;
* ``--vote_shares 0.9,0.05``: synthetic histograms with those shares of the teachers on the top bins
  (the rest spread evenly), the "expected vote distribution"; answered queries drawn from the
  threshold check's probability.

From the probe's per-step costs it extrapolates linearly (a run of T steps costs T times the mean step):
the data-independent ε (worst case, every query answered: what the training's stop rule uses), the
data-dependent ε of the paper (not a guarantee), and the smooth-sensitivity ε a release would report
at the median of its noise and at one and two standard deviations above it (the release is refused
when it exceeds the target, so those are the steps at which it would be allowed with about 50%, 84%
and 98% chance *if the probe is representative*). For the smooth-sensitivity analysis it also picks the
order λ and β·λ (on grids) and the σ_ss minimising GNSS's cost plus the released bound's noise,
as Papernot et al.'s ``smooth_sensitivity_table.py`` does — here on public votes, so the choice is
public. The result is an estimate: votes change as teachers and the generator train, and a public
dataset is not the private one.
"""

from __future__ import annotations

import argparse
import itertools
import math
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from lightning_gpate.privacy.accountant import ConfidentGNMaxEvent, LaplaceVoteEvent, PrivacyAccountant
from lightning_gpate.privacy.dp_stats import metadata_events
from lightning_gpate.privacy.rdp import rdp_to_epsilon
from lightning_gpate.privacy.smooth_release import (
    BETA_FRACTION,
    DEFAULT_DELTA_PRIME_SHARE,
    GNSSParameters,
    SmoothSensitivityAccountant,
)

#: β·λ tried for the smooth-sensitivity release: a smaller β means a larger smooth sensitivity but a
#: smaller GNSS cost (its β-term, and the floor λe^{2β}c²(e^β − 1)² of the upper bound's noise term).
BETA_FRACTIONS = (0.1, 0.2, 0.3, BETA_FRACTION)
#: Orders tried for the smooth-sensitivity release.
PLAN_ORDERS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
#: Noise quantiles reported: the release is allowed when ε(z) ≤ target.
QUANTILES = ((0.0, "50%"), (1.0, "84%"), (2.0, "98%"))


@dataclass
class Probe:
    """Vote events of ``steps`` training steps of ``model`` (public or synthetic votes)."""

    model: Any
    events: list
    steps: int
    source: str


@dataclass
class PlanRow:
    analysis: str
    steps: int
    epsilon: float
    note: str = ""


@dataclass
class Plan:
    epsilon: float
    delta: float
    source: str
    probe_steps: int
    rows: list[PlanRow] = field(default_factory=list)
    recommended: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        head = f"{'analysis':<58} {'steps':>8} {'epsilon':>9}  note"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r.analysis:<58} {r.steps:>8} {r.epsilon:>9.4f}  {r.note}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- probes


def _worst_case(event):
    """The event with every Confident-GNMax query answered (what the stop rule reserves)."""
    if isinstance(event, ConfidentGNMaxEvent):
        return replace(event, answered=np.ones_like(event.answered, dtype=bool))
    return event


#: Builds the LightningCLI objects of a config without running a subcommand: ``(args, run=False) → cli``
#: (:func:`lightning_gpate.cli.run_lightning_cli`, which passes itself: the command line sits above
#: this module and is not imported by it).
BuildCLI = Callable[..., Any]


def _cli(args: list[str], build_cli: BuildCLI):
    """The LightningCLI objects of ``args`` without running a subcommand."""
    import warnings

    with warnings.catch_warnings():  # plan's own arguments are on sys.argv; LightningCLI gets ``args``
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        return build_cli(args, run=False)


def probe_public_run(argv: Sequence[str], steps: int, *, build_cli: BuildCLI) -> Probe:
    """Train the configured model for ``steps`` steps on the config's (declared public) data and
    record every vote event. Nothing is logged, no artifact is kept, budgets are lifted."""
    with tempfile.TemporaryDirectory() as tmp:
        args = list(argv) + ["--trainer.max_steps", str(steps), "--trainer.logger", "false",
                             "--trainer.enable_checkpointing", "false", "--trainer.default_root_dir", tmp,
                             "--utility.enabled", "false", "--image_quality.enabled", "false"]
        cli = _cli(args, build_cli)
        model, dm = cli.model, cli.datamodule
        _lift_budget(model)
        events: list = []
        record = model.record

        def recording(event, **kw):
            if isinstance(event, (ConfidentGNMaxEvent, LaplaceVoteEvent)):
                events.append(event)
            record(event, **kw)

        model.record = recording
        cli.trainer.fit(model, dm)
    if not events:
        raise ValueError(f"{type(model).__name__} recorded no PATE vote events: plan covers G-PATE and PATE-GAN")
    return Probe(model=model, events=events, steps=int(cli.trainer.global_step), source="public run")


def _lift_budget(model) -> None:
    """The probe measures costs; it does not stop on them (public data)."""
    if not hasattr(model, "accountant"):
        raise ValueError(f"{type(model).__name__} is not a private model: nothing to plan")
    model.smooth_sensitivity = None
    model.epsilon_hard_cap = None
    model.epsilon_budget = math.inf


def synthetic_probe(model, shares: Sequence[float], steps: int, *, seed: int = 0) -> Probe:
    """Vote events of ``steps`` steps whose histograms put ``shares`` of the teachers on the top bins
    (in order) and spread the rest evenly; Confident-GNMax queries are answered with the threshold
    check's probability (drawn with ``seed``: synthetic votes, nothing private)."""
    from scipy.stats import norm

    shares = [float(s) for s in shares]
    if not shares or any(s < 0 for s in shares) or sum(shares) > 1 + 1e-9:
        raise ValueError(f"vote shares must be >= 0 and sum to at most 1, got {shares}")
    n = int(model.num_teachers)
    rng = np.random.default_rng(seed)
    hp = model.hparams
    events = []
    if type(model).__name__ == "PATEGAN":
        top = round(shares[0] * n)
        gap = abs(2 * top - n)
        per_step = int(hp.query_batch_size) * int(model.student_options.steps)
        events = [LaplaceVoteEvent(np.full(per_step, gap), model.lam) for _ in range(steps)]
    elif getattr(getattr(model, "aggregator", None), "name", None) == "dpgradagg":
        bins = int(model.aggregator.num_bins)
        if len(shares) > bins:
            raise ValueError(f"{len(shares)} shares for {bins} bins")
        counts = [int(round(s * n)) for s in shares]
        rest = n - sum(counts)
        others = bins - len(counts)
        if others:
            counts += [rest // others + (1 if i < rest % others else 0) for i in range(others)]
        else:
            counts[0] += rest
        hist = np.array(counts, dtype=float)
        per_step = int(hp.fake_batch_size) * int(model.aggregator.projection_dim)
        p_answer = float(norm.sf((model.threshold - hist.max()) / model.aggregator.sigma_threshold))
        for _ in range(steps):
            answered = rng.random(per_step) < p_answer
            events.append(ConfidentGNMaxEvent(np.repeat(hist[None], per_step, 0), answered, model.threshold,
                                              model.aggregator.sigma_threshold, model.aggregator.sigma_gnmax))
    else:
        raise ValueError(f"plan covers G-PATE and PATE-GAN, not {type(model).__name__}")
    return Probe(model=model, events=events, steps=steps, source=f"synthetic votes, shares {shares}")


# ----------------------------------------------------------------------------- extrapolation


def _largest_steps(fits, limit: int = 10**8) -> int:
    """The largest T ≥ 0 with ``fits(T)`` (``fits`` monotone: true up to some T)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan(probe: Probe, *, epsilon: float, orders: Sequence[float] = PLAN_ORDERS) -> Plan:
    """Steps that fit ``epsilon`` under each analysis, extrapolated from the probe's mean step."""
    model = probe.model
    acc: PrivacyAccountant = model.accountant
    delta, conversion, grid = acc.delta, acc.conversion, acc.orders
    start = PrivacyAccountant(delta=delta, orders=grid, conversion=conversion)
    metadata = metadata_events(model.data_spec.get("metadata_cost", []))
    before = [*metadata, *model.events_before_first_step()]  # what the run pays before its first step
    for event in before:
        start.record(event)
    base = start.rdp
    worst = sum(acc.rdp_of(_worst_case(e))[0] for e in probe.events) / probe.steps
    expected = sum(acc.rdp_of(e)[0] for e in probe.events) / probe.steps
    paper = sum(acc.rdp_of(e)[1] for e in probe.events) / probe.steps

    def eps(curve) -> float:
        return rdp_to_epsilon(curve, grid, delta, conversion=conversion)[0]

    out = Plan(epsilon=epsilon, delta=delta, source=probe.source, probe_steps=probe.steps)
    for name, step, note in (("data-independent, worst case (the stop rule)", worst, "a guarantee"),
                             ("data-independent, answered as in the probe", expected, "a guarantee"),
                             ("data-dependent (paper)", paper, "NOT a guarantee: not releasable")):
        t = _largest_steps(lambda t: eps(base + t * step) <= epsilon)
        out.rows.append(PlanRow(name, t, eps(base + t * step), note))

    best = None
    for z, label in QUANTILES:
        choice = _best_smooth_sensitivity(probe, before, epsilon, z, orders)
        if choice is None:
            out.rows.append(PlanRow(f"smooth sensitivity, allowed w.p. ~{label}", 0, math.nan, "no order fits"))
            continue
        t, params, value = choice
        out.rows.append(PlanRow(f"smooth sensitivity, allowed w.p. ~{label}", t, value,
                                f"order {params.order:g}, beta {params.beta:.4g}, sigma_ss {params.sigma:.4g}"))
        if z == 2.0:
            best = (t, params)
    if best is not None and best[0] > 0:
        t, params = best
        cap = eps(base + t * worst + params.rdp_curve(grid))
        out.recommended = {"trainer.max_steps": t, "model.epsilon_hard_cap": round(cap + 1e-4, 4),
                           "model.smooth_sensitivity": {"order": params.order, "beta": round(params.beta, 6),
                                                        "sigma": round(params.sigma, 6), "delta_prime": params.delta_prime}}
    return out


def _best_smooth_sensitivity(probe: Probe, before: list, epsilon: float, z: float, orders):
    """(steps, parameters, ε) of the order that allows the most steps with the release ≤ ε at
    noise quantile ``z``; σ_ss minimises GNSS's noise term plus the released bound's noise
    ``(2 + c)·SS·σ_ss`` (Papernot et al.'s table, with the upper bound's shift c = Φ⁻¹(1 − δ′), δ′ = δ/2)."""
    model = probe.model
    acc = model.accountant
    n = int(model.num_teachers)
    delta_prime = DEFAULT_DELTA_PRIME_SHARE * acc.delta
    best = None
    for lam, fraction in itertools.product(orders, BETA_FRACTIONS):
        beta = fraction / lam
        ss_acc = SmoothSensitivityAccountant(params=GNSSParameters(order=lam, beta=beta, sigma=1.0, delta_prime=delta_prime),
                                             num_teachers=n, delta=acc.delta, conversion=acc.conversion)
        for e in [*before, *probe.events]:
            ss_acc.record(e)
        dd_step = ss_acc.ledger.data_dependent_rdp() / probe.steps
        ss_step = ss_acc.ledger.smooth_sensitivity(beta) / probe.steps
        other = float(ss_acc.release(0.0).other_rdp)  # the RDP at λ of what is paid before the first step

        def release_eps(t: int):
            noise = t * ss_step

            def spent(sigma: float) -> tuple[float, GNSSParameters]:
                params = GNSSParameters(order=lam, beta=beta, sigma=sigma, delta_prime=delta_prime)
                return max(0.0, t * dd_step + (z + params.shift) * noise * sigma) + params.cost + other, params

            # σ on a log grid: the noise term falls and the bound's noise grows with σ
            total, params = min((spent(float(sigma)) for sigma in np.geomspace(1e-2, 1e6, 161)), key=lambda tp: tp[0])
            return rdp_to_epsilon([total], [lam], params.conversion_delta(acc.delta), conversion=acc.conversion)[0], params

        t = _largest_steps(lambda t: release_eps(t)[0] <= epsilon)
        if t and (best is None or t > best[0]):
            value, params = release_eps(t)
            best = (t, params, value)
    return best


# ----------------------------------------------------------------------------- command


def plan_command(argv: Sequence[str], *, build_cli: BuildCLI) -> int:
    """``lightning-gpate plan``; ``build_cli`` builds the config's LightningCLI objects (see :data:`BuildCLI`)."""
    parser = argparse.ArgumentParser(
        prog="lightning-gpate plan",
        description="ESTIMATE how many training steps of a G-PATE or PATE-GAN config fit a target epsilon under the "
                    "data-independent, data-dependent and smooth-sensitivity analyses, from votes that are not private: "
                    "a short run on the config's data declared public (--data_is_public) or synthetic vote shares "
                    "(--vote_shares). Other arguments are passed to the config (e.g. --data.path public.csv).",
    )
    parser.add_argument("--config", required=True, help="the fit config (its model settings are planned)")
    parser.add_argument("--epsilon", type=float, default=None, help="target epsilon (default: the config's model.epsilon)")
    parser.add_argument("--probe_steps", type=int, default=20, help="training steps of the probe run (default 20)")
    parser.add_argument("--data_is_public", action="store_true",
                        help="declare that the config's data is public: the probe reads its votes without privacy")
    parser.add_argument("--vote_shares", default=None, help="synthetic votes instead: shares of the teachers on the top bins, e.g. 0.9,0.05")
    args, rest = parser.parse_known_args(argv)
    if args.probe_steps < 1:
        parser.error("--probe_steps must be >= 1")
    cli_args = ["--config", args.config, *rest]
    if args.vote_shares is not None:
        with tempfile.TemporaryDirectory() as tmp:
            cli = _cli(cli_args + ["--trainer.logger", "false", "--trainer.default_root_dir", tmp], build_cli)
        _lift_budget(cli.model)
        probe = synthetic_probe(cli.model, [float(s) for s in args.vote_shares.split(",")], args.probe_steps)
    elif args.data_is_public:
        probe = probe_public_run(cli_args, args.probe_steps, build_cli=build_cli)
    else:
        raise ValueError("plan reads votes without privacy: pass --data_is_public (the config's data, or the one you "
                         "pass with --data.*, is public or synthetic) or --vote_shares (synthetic votes)")
    target = args.epsilon if args.epsilon is not None else float(probe.model.hparams.epsilon)
    result = plan(probe, epsilon=target)
    print(f"Plan for epsilon={target:g}, delta={result.delta:g} from {result.source} ({result.probe_steps} probe steps). "
          f"AN ESTIMATE: costs are extrapolated linearly from the probe's mean step.")
    print(result.table())
    if result.recommended:
        rec = result.recommended
        ss = rec["model.smooth_sensitivity"]
        print(f"\nFor budget_accounting: smooth_sensitivity (release allowed w.p. ~98% if the probe is representative):\n"
              f"  trainer.max_steps: {rec['trainer.max_steps']}\n  model.epsilon_hard_cap: {rec['model.epsilon_hard_cap']}\n"
              f"  model.smooth_sensitivity: {{order: {ss['order']:g}, beta: {ss['beta']}, sigma: {ss['sigma']}}}")
    return 0
