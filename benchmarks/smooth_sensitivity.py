"""Smooth-sensitivity release vs the data-independent and raw data-dependent ε on the votes of a real
G-PATE run (Papernot et al. 2018, Section 4; issue 15).

Stages:

``train``: G-PATE on real MNIST digits (``mnist_15k.csv.gz``; ``--data digits``: sklearn's 8x8
digits, CPU quick), accounting with the paper's analysis and an unlimited budget so the run has the
requested length; every step's vote histograms and answered flags are recorded to a PRIVATE local
file (``--votes``, default under the system's temp folder, outside the repository; never logged: the
run has no logger). The votes are a function of the private data: keep the file private and delete
it when done. ``--warmup`` (free teacher steps before the first vote) and ``--own-label-votes``
make the teachers agree more.

``analyze``: from that file, per step count and per target ε: the ε of

* the data-independent bound, worst case (every query answered: what the stop rule reserves) and
  with the recorded answered flags (both real guarantees),
* the raw data-dependent ε of the paper (NOT releasable: shown for comparison only),
* the smooth-sensitivity release (what a run of T steps would publish): its noise scale, its ε at
  the median of the noise, mean ± sd over the noise, and three actual draws (OS-seeded mechanism
  generator), with (λ, β, σ_ss) from the data-independent default rule and from the plan's choice
  (``lightning_gpate.planning``; on these private votes that choice is for the benchmark only: a
  real run fixes it before training, from public data);

and the steps each allows at the target (smooth sensitivity at +0, +1, +2 noise standard
deviations: a release allowed with ~50/84/98% chance), with the ratio to the data-independent stop
rule. Steps beyond the recorded run are extrapolated from its mean step (marked ``*``). The table
goes to ``benchmarks/results/smooth_sensitivity_<tag>.md``, the raw values to ``.json`` beside it.

``rescale``: an ESTIMATE for another teacher count: the recorded vote shares scaled to ``--teachers``
with other noise scales (answered flags redrawn). Not a run: teachers with less data agree less.

CPU (the committed tables; ~50 min of recording on 2 shared cores, 1 torch thread)::

    python benchmarks/smooth_sensitivity.py train --teachers 300 --steps 180 --warmup 100 --threads 1 \
        --votes /tmp/private/mnist15k_300.npz
    python benchmarks/smooth_sensitivity.py analyze --votes /tmp/private/mnist15k_300.npz --tag mnist15k_cpu
    python benchmarks/smooth_sensitivity.py train --data digits --teachers 140 --teacher-batch 10 --fake-batch 10 \
        --steps 300 --warmup 200 --chunk 140 --threads 1 --votes /tmp/private/digits_140.npz
    python benchmarks/smooth_sensitivity.py analyze --votes /tmp/private/digits_140.npz --tag digits_cpu \
        --dataset-label "sklearn's 8x8 digits (1,797 images, CPU quick)"

GPU, the paper's ε = 10 MNIST setting (2000 teachers, σ1 = 600, σ2 = 100, batch 30 per teacher on
the full 60k MNIST; ``mnist_15k`` gives 7 per teacher)::

    python benchmarks/smooth_sensitivity.py train --device cuda --teachers 2000 --sigma-scale 1 --steps 2000 \
        --teacher-batch 7 --fake-batch 32 --warmup 200 --chunk 500
    python benchmarks/smooth_sensitivity.py analyze --tag gpu_2000teachers
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_gpate.planning import Probe, plan  # noqa: E402
from lightning_gpate.privacy import ConfidentGNMaxEvent, PrivacyAccountant  # noqa: E402
from lightning_gpate.privacy.rdp import rdp_to_epsilon  # noqa: E402
from lightning_gpate.privacy.smooth_release import (  # noqa: E402
    GNSSParameters,
    SmoothSensitivityAccountant,
    default_gnss_parameters,
)

DATA = ROOT.parent / "shared" / "data" / "mnist_15k.csv.gz"
DEFAULT_VOTES = Path(tempfile.gettempdir()) / "lightning_gpate_private" / "gpate_mnist15k_votes.npz"
#: The paper's MNIST ε = 10 setting: 2000 teachers, σ1 = 600, σ2 = 100, T = 0.5 n.
PAPER_TEACHERS, PAPER_SIGMA1, PAPER_SIGMA2 = 2000, 600.0, 100.0


def train(args) -> None:
    import pytorch_lightning as pl
    import torch

    from datamodules import ImageDataModule
    from lightning_gpate.models import GPATE
    from lightning_gpate.models.gpate import PAPER_SETTINGS

    torch.set_num_threads(args.threads)
    scale = args.sigma_scale if args.sigma_scale is not None else args.teachers / PAPER_TEACHERS
    s1, s2 = PAPER_SIGMA1 * scale, PAPER_SIGMA2 * scale
    if args.data == "digits":  # sklearn's 8x8 digits (CPU quick); the generator of configs/quickstart.yaml
        dm = ImageDataModule("digits", num_teachers=args.teachers, teacher_batch_size=args.teacher_batch,
                             val_fraction=0.0, test_fraction=0.0)
        generator = dict(z_dim=32, gf_dim=16, fc_dim=128, generator_lr=0.002, target_scale=3000.0, generator_steps=20)
    else:
        if not DATA.is_file():
            raise SystemExit(f"{DATA} not found (the shared MNIST CSV)")
        dm = ImageDataModule("csv", path=str(DATA), classes=list(range(10)), num_teachers=args.teachers, teacher_batch_size=args.teacher_batch,
                             val_fraction=0.0, test_fraction=0.0)
        generator = dict(z_dim=50)
    settings = {**PAPER_SETTINGS, "num_bins": args.num_bins, "own_label_votes": args.own_label_votes}  # Confident-GNMax's votes
    model = GPATE(dm.spec, **settings, epsilon=1e12, delta=1e-5, budget_accounting="paper", fake_batch_size=args.fake_batch,
                  projection_dim=10, clip=1e-4, threshold_fraction=args.threshold_fraction,
                  sigma_threshold=s1, sigma_gnmax=s2, teacher_chunk_size=args.chunk, **generator,
                  teacher_channels=args.teacher_channels, teacher_fc=args.teacher_fc,
                  teacher_warmup_steps=args.warmup)
    votes, answered, started = [], [], time.time()
    record = model.record

    def recording(event):
        if isinstance(event, ConfidentGNMaxEvent):
            votes.append(event.votes.astype(np.int16))
            answered.append(event.answered.copy())
            if len(votes) % 10 == 0:
                print(f"step {len(votes)}: {time.time() - started:.0f}s, answered {np.mean(answered[-1]):.2f}", flush=True)
        record(event)

    model.record = recording
    # warm-up steps step no Lightning optimizer, so max_steps counts aggregation steps only
    trainer = pl.Trainer(max_steps=args.steps, accelerator=args.device, devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, dm)
    args.votes.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.votes, votes=np.stack(votes), answered=np.stack(answered), num_teachers=args.teachers,
                        threshold=model.threshold, sigma_threshold=s1, sigma_gnmax=s2,
                        seconds=time.time() - started, device=args.device, data=args.data,
                        setting=f"teacher batch {args.teacher_batch}, fake batch {args.fake_batch}, {args.num_bins} bins, "
                                f"teacher channels {args.teacher_channels or 'paper'}, fc {args.teacher_fc}, "
                                f"teacher warm-up {args.warmup} steps (free), own_label_votes {args.own_label_votes}, "
                                f"{args.threads} torch thread(s)")
    print(f"recorded {len(votes)} steps of {votes[0].shape[0]} queries to {args.votes} (PRIVATE: do not share or commit)")


def rescale(args) -> None:
    """An ESTIMATE for a larger teacher count: the recorded vote shares at ``--teachers`` teachers with
    other noise scales. Every histogram is scaled by n'/n (rounded; the top bin absorbs the rounding
    so that each still sums to at most n'), and the answered flags are redrawn with the threshold
    check's probability under the new sigma1 (a seeded generator: these are synthetic votes). What
    it does not capture: teachers with less data each agree less, and a generator trained with other
    noise sees other fakes."""
    from scipy.stats import norm

    data = np.load(args.votes)
    n = int(data["num_teachers"])
    votes = data["votes"].astype(np.float64) * (args.teachers / n)
    scaled = np.floor(votes)
    top = votes.argmax(-1)
    np.put_along_axis(scaled, top[..., None], np.take_along_axis(scaled, top[..., None], -1)
                      + np.round(votes.sum(-1) - scaled.sum(-1))[..., None], -1)
    threshold = float(data["threshold"]) / n * args.teachers
    p_answer = norm.sf((threshold - scaled.max(-1)) / args.sigma1)
    answered = np.random.default_rng(args.seed).random(p_answer.shape) < p_answer
    fields = {k: data[k] for k in data.files}
    fields.update(votes=scaled.astype(np.int32), answered=answered, num_teachers=args.teachers, threshold=threshold,
                  sigma_threshold=args.sigma1, sigma_gnmax=args.sigma2,
                  setting=f"ESTIMATE: the recorded vote shares of {n} teachers ({data['setting']}) rescaled to "
                          f"{args.teachers} teachers, answered flags redrawn with sigma1 = {args.sigma1:g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **fields)
    print(f"wrote {args.out}: {answered.mean():.1%} answered (recorded: {float(np.mean(data['answered'])):.1%})")


def _events(data) -> list[ConfidentGNMaxEvent]:
    t, s1, s2 = float(data["threshold"]), float(data["sigma_threshold"]), float(data["sigma_gnmax"])
    return [ConfidentGNMaxEvent(v.astype(np.int64), a, t, s1, s2) for v, a in zip(data["votes"], data["answered"])]


class _Model:
    """What the plan reads of a G-PATE model, rebuilt from the recorded run's public settings."""

    def __init__(self, data):
        self.accountant = PrivacyAccountant(delta=1e-5)
        self.num_teachers = int(data["num_teachers"])
        self.data_spec = {}


def _steps(fits, recorded: int, limit: int = 10**7) -> tuple[int, bool]:
    """Largest T with fits(T); whether it lies beyond the recorded steps (extrapolated)."""
    if not fits(1):
        return 0, False
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, lo > recorded


def _release_epsilon(dd: float, ss: float, params: GNSSParameters, z, delta: float):
    """ε of the release ``max(0, β(D) + SS·σ_ss·z) + GNSS`` at λ (vectorised over ``z``)."""
    total = np.maximum(0.0, dd + ss * params.sigma * np.asarray(z, dtype=np.float64)) + params.cost
    return np.array([rdp_to_epsilon([t], [params.order], delta)[0] for t in np.atleast_1d(total)])


def analyze(args) -> None:
    import json

    import torch

    from lightning_gpate.privacy.randomness import mechanism_generator

    data = np.load(args.votes)
    events = _events(data)[: args.steps_limit]  # the first steps only (large teacher counts: the walks cost)
    n_steps, n_queries = len(events), events[0].votes.shape[0]
    num_teachers = int(data["num_teachers"])
    model = _Model(data)
    acc = model.accountant
    orders, delta = acc.orders, acc.delta
    step_worst = acc.rdp_of(ConfidentGNMaxEvent(events[0].votes, np.ones(n_queries, bool), events[0].threshold,
                                                events[0].sigma_threshold, events[0].sigma_gnmax))[0]
    prefix_ind, prefix_dd = np.zeros((n_steps + 1, orders.size)), np.zeros((n_steps + 1, orders.size))
    for i, e in enumerate(events):
        g, p = acc.rdp_of(e)
        prefix_ind[i + 1], prefix_dd[i + 1] = prefix_ind[i] + g, prefix_dd[i] + p

    def curve_at(prefix, t):  # recorded prefix, or the mean step beyond it
        return prefix[t] if t <= n_steps else prefix[n_steps] * t / n_steps

    def eps(curve):
        return rdp_to_epsilon(curve, orders, delta)[0]

    def ledger_path(params):
        """(β(D_t), SS_β(D_t)) after every recorded step t = 1 … n (index 0: nothing recorded)."""
        ss = SmoothSensitivityAccountant(params=params, num_teachers=num_teachers, delta=delta)
        path = [(0.0, 0.0)]
        for e in events:
            ss.record(e)
            path.append((ss.ledger.data_dependent_rdp(), ss.ledger.smooth_sensitivity(params.beta)))
        return np.array(path)

    def at(path, t):  # beyond the recorded run: both sums grow with the mean step (an estimate)
        return tuple(path[t]) if t <= n_steps else tuple(path[n_steps] * t / n_steps)

    mech = mechanism_generator()  # OS-seeded: the actual releases below
    stats_rng = np.random.default_rng(0)  # only to describe the release's distribution (mean, sd)
    z_stats = stats_rng.standard_normal(4000)
    marks = sorted({t for t in (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500) if t <= n_steps} | {n_steps})
    setting = str(data["setting"]) if "setting" in data else ""
    answered = float(np.mean(data["answered"][:n_steps]))
    report = {"dataset": args.dataset_label, "num_teachers": num_teachers, "threshold": float(data["threshold"]),
              "sigma_threshold": float(data["sigma_threshold"]), "sigma_gnmax": float(data["sigma_gnmax"]),
              "queries_per_step": int(n_queries), "recorded_steps": n_steps, "answered_fraction": answered,
              "setting": setting, "device": str(data["device"]), "recording_seconds": float(data["seconds"]),
              "delta": delta, "targets": {}}
    lines = [f"# Smooth-sensitivity release on recorded G-PATE votes ({args.tag})", "",
             f"Written by `benchmarks/smooth_sensitivity.py analyze` (raw values: `smooth_sensitivity_{args.tag}.json`). "
             f"Votes of a G-PATE run on {args.dataset_label}: {num_teachers} teachers, threshold "
             f"{float(data['threshold']):g} ({float(data['threshold']) / num_teachers:g} n), sigma1 = "
             f"{float(data['sigma_threshold']):g}, sigma2 = {float(data['sigma_gnmax']):g}, {n_queries} Confident-GNMax "
             f"queries per step, {n_steps} steps recorded ({answered:.1%} of the queries answered), {setting}; "
             f"device {data['device']}, recording {float(data['seconds']) / 60:.0f} min. delta = 1e-5, improved RDP "
             "conversion.", "",
             "Three analyses of the same votes:", "",
             "* **data-independent** (`budget_accounting: guarantee`): every query charged as if the teachers "
             "disagreed; a real guarantee. *Worst case* charges every query as answered (what the stop rule "
             "reserves before a step); *recorded* uses the answered flags the run actually drew.",
             "* **data-dependent, raw** (`paper`): the papers' analysis, computed from the vote histograms "
             "without noise. It is a function of the private votes and is NOT releasable; it is shown here only "
             "as a benchmark of the analysis on a public benchmark dataset.",
             "* **smooth sensitivity** (`smooth_sensitivity`): what a run of that length would publish: "
             "`max(0, dd_RDP + SS * sigma_ss * Z) + GNSS` at the order lambda, converted to (epsilon, delta). "
             "*Noise sd* is SS * sigma_ss, the standard deviation of the released RDP at lambda; *mean ± sd* is "
             "the released epsilon's distribution over Z (4000 draws); *draws* are three actual releases with Z "
             "from the OS-seeded mechanism generator. (lambda, beta, sigma_ss) come from the data-independent "
             "default rule (set from the target epsilon before training) or from the plan's choice (computed on "
             "these private votes: for the benchmark only; a real run fixes it from public data with "
             "`lightning-gpate plan`).", "",
             "Steps allowed: the largest run length whose epsilon fits the target (`*`: beyond the recorded run, "
             "extrapolated from its mean step). A smooth-sensitivity run releases its data-dependent epsilon as an "
             "upper bound that holds with probability 1 - delta' (delta' = delta/2); its guarantee is the "
             "data-independent bound of everything it released (the GNSS release included); its "
             "release is refused when the released value exceeds the target, so the "
             "smooth-sensitivity lengths at Z = 0, +1, +2 are those at which a release would be allowed with "
             "about 50%, 84% and 98% chance.", ""]
    for target in args.targets:
        choices = [("default rule", default_gnss_parameters(epsilon=target, delta=delta))]
        probe_plan = plan(Probe(model=model, events=events, steps=n_steps, source="recorded votes"), epsilon=target)
        if probe_plan.recommended:
            p = probe_plan.recommended["model.smooth_sensitivity"]
            choices.append(("plan's choice", GNSSParameters(order=p["order"], beta=p["beta"], sigma=p["sigma"],
                                                            delta_prime=p["delta_prime"])))
        paths = {name: ledger_path(params) for name, params in choices}
        entry = {"gnss": {name: params.to_dict() | {"gnss_rdp": params.cost} for name, params in choices},
                 "per_step": [], "steps_allowed": {}}
        # -- per step count
        lines += [f"## Target epsilon = {target:g}", ""]
        for name, params in choices:
            lines.append(f"* smooth sensitivity, {name}: order {params.order:.4g}, beta {params.beta:.4g}, "
                         f"sigma_ss {params.sigma:.4g} (GNSS cost {params.cost:.4g} RDP at the order)")
        head = ("| steps | data-independent, worst case | data-independent, recorded | data-dependent, raw (NOT releasable) |"
                + "".join(f" SS {name}: noise sd (RDP) | SS {name}: epsilon at Z=0 | SS {name}: mean ± sd | SS {name}: draws |"
                          for name, _ in choices))
        lines += ["", "### Epsilon per step count", "", head, "|" + "---:|" * (4 + 4 * len(choices))]
        for t in marks:
            row = {"steps": t, "epsilon_data_independent_worst": eps(step_worst * t),
                   "epsilon_data_independent_recorded": eps(prefix_ind[t]), "epsilon_data_dependent_raw": eps(prefix_dd[t])}
            cells = [str(t), f"{row['epsilon_data_independent_worst']:.3f}", f"{row['epsilon_data_independent_recorded']:.3f}",
                     f"{row['epsilon_data_dependent_raw']:.3f}"]
            for name, params in choices:
                dd, ss = at(paths[name], t)
                dist = _release_epsilon(dd, ss, params, z_stats, delta)
                draws = _release_epsilon(dd, ss, params, torch.randn(3, generator=mech).double().numpy(), delta)
                row[f"smooth_sensitivity_{name.replace(' ', '_').replace(chr(39), '')}"] = {
                    "noise_sd_rdp": ss * params.sigma, "epsilon_z0": float(_release_epsilon(dd, ss, params, 0.0, delta)[0]),
                    "epsilon_mean": float(dist.mean()), "epsilon_sd": float(dist.std()), "draws": draws.tolist()}
                r = row[f"smooth_sensitivity_{name.replace(' ', '_').replace(chr(39), '')}"]
                cells += [f"{r['noise_sd_rdp']:.3g}", f"{r['epsilon_z0']:.3f}", f"{r['epsilon_mean']:.3f} ± {r['epsilon_sd']:.3f}",
                          ", ".join(f"{d:.3f}" for d in draws)]
            entry["per_step"].append(row)
            lines.append("| " + " | ".join(cells) + " |")
        # -- steps allowed at the target
        rows = []
        t_worst, x = _steps(lambda t: eps(step_worst * t) <= target, n_steps)
        rows.append(("data-independent, worst case (the stop rule)", t_worst, x, "guarantee"))
        t, x = _steps(lambda t: eps(curve_at(prefix_ind, t)) <= target, n_steps)
        rows.append(("data-independent, recorded answered flags", t, x, "guarantee"))
        t, x = _steps(lambda t: eps(curve_at(prefix_dd, t)) <= target, n_steps)
        rows.append(("data-dependent, raw (paper)", t, x, "NOT releasable"))
        for name, params in choices:
            gnss = params.rdp_curve(orders)

            def in_force(t, z):  # what the run reports: the release or, if smaller, the data-independent bound
                return min(_release_epsilon(*at(paths[name], t), params, z, delta)[0], eps(curve_at(prefix_ind, t) + gnss))

            for z, q in ((0.0, "50%"), (1.0, "84%"), (2.0, "98%")):
                t, x = _steps(lambda t: in_force(t, z) <= target, n_steps)
                rows.append((f"smooth sensitivity, {name}, allowed ~{q} (Z = {z:+g})", t, x, "released: a guarantee"))
        lines += ["", f"### Steps allowed at epsilon <= {target:g}", "",
                  "| analysis | steps | x data-independent worst case | note |", "|---|---:|---:|---|"]
        for name, t, x, note in rows:
            ratio = f"{t / t_worst:.1f}x" if t_worst else ("inf" if t else "-")
            lines.append(f"| {name} | {t}{'*' if x else ''} | {ratio} | {note} |")
            entry["steps_allowed"][name] = {"steps": t, "extrapolated": x, "ratio_to_data_independent_worst": t / t_worst if t_worst else None}
        best = max((t for name, t, _, _ in rows if "98%" in name), default=0)
        ratio = f"{best / t_worst:.1f}x as many" if t_worst else ("any number more than" if best else "no more than")
        lines += ["", f"At epsilon = {target:g}, the smooth-sensitivity release (allowed with ~98% chance) allows {best} "
                      f"steps against {t_worst} under the data-independent stop rule: {ratio}.", ""]
        report["targets"][str(target)] = entry
    lines += [args.note, ""] if args.note else []
    out = ROOT / "benchmarks" / "results" / f"smooth_sensitivity_{args.tag}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out} and {out.with_suffix('.json').name}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    t = sub.add_parser("train", help="train G-PATE and record its votes (PRIVATE file)")
    t.add_argument("--data", choices=("mnist15k", "digits"), default="mnist15k",
                   help="../shared/data/mnist_15k.csv.gz (28x28) or sklearn's 8x8 digits (CPU quick)")
    t.add_argument("--teachers", type=int, default=300)
    t.add_argument("--teacher-batch", type=int, default=30)
    t.add_argument("--fake-batch", type=int, default=32)
    t.add_argument("--sigma-scale", type=float, default=None,
                   help="sigma1 = 600*scale, sigma2 = 100*scale (default: teachers/2000, the paper's vote-gap to noise ratio)")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--teacher-channels", type=int, nargs=2, default=None, help="conv widths (default: the paper's)")
    t.add_argument("--teacher-fc", type=int, default=256)
    t.add_argument("--chunk", type=int, default=100, help="teachers per chunk")
    t.add_argument("--warmup", type=int, default=0,
                   help="teacher steps before the first aggregation (teacher_warmup_steps; free: no vote is released)")
    t.add_argument("--own-label-votes", action="store_true", help="teachers vote only on fakes of labels in their batch")
    t.add_argument("--num-bins", type=int, default=10, help="B, bins of DPGradAgg (the paper: 10)")
    t.add_argument("--threshold-fraction", type=float, default=0.5, help="T / n (the paper: 0.5)")
    t.add_argument("--device", default="cpu")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--votes", type=Path, default=DEFAULT_VOTES, help="PRIVATE output file, outside the repository")
    a = sub.add_parser("analyze", help="the table from recorded votes")
    a.add_argument("--votes", type=Path, default=DEFAULT_VOTES)
    a.add_argument("--targets", type=float, nargs="+", default=[1.0, 10.0])
    a.add_argument("--tag", default="cpu")
    a.add_argument("--dataset-label", default="`mnist_15k.csv.gz` (28x28 MNIST)", help="how the table names the data")
    a.add_argument("--steps-limit", type=int, default=None, help="analyse the first N recorded steps only")
    a.add_argument("--note", default="", help="a closing paragraph for the table")
    r = sub.add_parser("rescale", help="ESTIMATE: the recorded vote shares at another teacher count and noise")
    r.add_argument("--votes", type=Path, default=DEFAULT_VOTES)
    r.add_argument("--out", type=Path, required=True, help="output file (outside the repository)")
    r.add_argument("--teachers", type=int, default=PAPER_TEACHERS)
    r.add_argument("--sigma1", type=float, default=PAPER_SIGMA1)
    r.add_argument("--sigma2", type=float, default=PAPER_SIGMA2)
    r.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.stage == "train":
        if ROOT in args.votes.resolve().parents:
            raise SystemExit("--votes must lie outside the repository: the votes are private")
        train(args)
    elif args.stage == "rescale":
        if ROOT in args.out.resolve().parents:
            raise SystemExit("--out must lie outside the repository: the votes are private")
        rescale(args)
    else:
        analyze(args)


if __name__ == "__main__":
    main()
