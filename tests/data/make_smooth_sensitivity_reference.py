"""Regenerates ``smooth_sensitivity_reference.json`` by RUNNING the published reference code.

The reference is ``research/pate_2018`` of https://github.com/tensorflow/privacy (Papernot et al.,
"Scalable Private Learning with PATE", ICLR 2018): ``core.py`` and ``smooth_sensitivity.py``. It is
not part of this repository; put a checkout of that folder on ``sys.path`` and run:

    PYTHONPATH=/path/to/privacy/research/pate_2018 python tests/data/make_smooth_sensitivity_reference.py

Only the reference's functions produce the numbers below; nothing of lightning_gpate is imported.
The values written were produced at tensorflow/privacy commit 03035d5 with numpy 2.4 / scipy 1.17.
"""

import json
import math
from pathlib import Path

import numpy as np

import core as pate  # noqa: E402  (reference)
import smooth_sensitivity as pate_ss  # noqa: E402  (reference)

OUT = Path(__file__).with_name("smooth_sensitivity_reference.json")


def arr(x):
    """12 significant digits, run-length encoded as [[value, repeats], ...] (the bounds are long runs
    of zeros and plateaus)."""
    out = []
    for v in np.asarray(x, dtype=float):
        v = float(f"{v:.12g}")
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def main():
    out = {"source": "tensorflow/privacy research/pate_2018 @ 03035d5 (core.py, smooth_sensitivity.py)"}

    # GNMax local-sensitivity bounds at distances 0..n-1 (compute_local_sensitivity_bounds_gnmax).
    gnmax = [dict(votes=[10, 0, 0], n=10, sigma=0.5, order=1.5)]  # the reference test's "going right"
    hists = [[95, 5] + [0] * 8, [70, 20, 10] + [0] * 7, [40, 30, 20, 10] + [0] * 6,
             [25, 25, 20, 15, 15] + [0] * 5, [100] + [0] * 9, [12, 11, 11, 11, 11, 11, 11, 11, 11, 0]]
    for h in hists:
        for sigma in (3.0, 10.0, 30.0):
            for order in (2.0, 8.0, 25.0):
                gnmax.append(dict(votes=h, n=100, sigma=sigma, order=order))
    rows = []
    for case in gnmax:
        try:
            ls = pate_ss.compute_local_sensitivity_bounds_gnmax(np.array(case["votes"]), case["n"], case["sigma"], case["order"])
        except (AssertionError, ValueError) as err:
            print("skip", case, err)
            continue
        rows.append({**case, "logq0": pate_ss._compute_logq0(case["sigma"], case["order"]),
                     "logq1": pate_ss._compute_logq1(case["sigma"], case["order"], len(case["votes"])), "ls": arr(ls)})
    out["gnmax_local_sensitivity"] = rows
    # The reference test's "going left" case, n = 2000: only the non-constant part is stored.
    ls = pate_ss.compute_local_sensitivity_bounds_gnmax(np.array([1000, 500, 300, 200, 0]), 2000, 250.0, 10.0)
    out["gnmax_going_left"] = {"votes": [1000, 500, 300, 200, 0], "n": 2000, "sigma": 250.0, "order": 10.0,
                               "ls_290_310": arr(ls[290:310]), "plateau": float(ls[-1]),
                               "zeros_before": int(np.argmax(ls > 0))}

    # Threshold local-sensitivity bounds (compute_local_sensitivity_bounds_threshold), exact distance d.
    rows = []
    for t in (16, 2, 50):  # the reference test's cases
        case = dict(n=30, threshold=t, sigma=2.0, order=10.0)
        rows.append({**case, "votes": [[20, 10, 0]], "ls": [arr(pate_ss.compute_local_sensitivity_bounds_threshold(np.array([20, 10, 0]), 30, t, 2.0, 10.0))],
                     "rdp_table": arr(pate_ss._compute_rdp_list_threshold(30, t, 2.0, 10.0))})
    for t in (30.0, 50.0, 80.0):
        for sigma in (5.0, 15.0, 40.0):
            for order in (2.0, 8.0, 25.0):
                votes = ([10] * 10, [50, 50], [90, 10])  # max(h) = 10, 50, 90
                ls = [arr(pate_ss.compute_local_sensitivity_bounds_threshold(np.array(v), 100, t, sigma, order)) for v in votes]
                rows.append(dict(n=100, threshold=t, sigma=sigma, order=order, votes=[list(v) for v in votes], ls=ls,
                                 rdp_table=arr(pate_ss._compute_rdp_list_threshold(100, t, sigma, order))))
    out["threshold_local_sensitivity"] = rows

    # GNSS (compute_rdp_of_smooth_sensitivity_gaussian, Theorem 23).
    rows = []
    for beta in (0.001, 0.01, 0.05):
        for sigma in (1.0, 10.0, 100.0):
            for order in (1.5, 2.0, 5.0, 9.9, 40.0):
                if order < 1 / (2 * beta):
                    rows.append(dict(beta=beta, sigma=sigma, order=order,
                                     rdp=pate_ss.compute_rdp_of_smooth_sensitivity_gaussian(beta, sigma, order)))
    out["gnss_rdp"] = rows

    # A batch of Confident-GNMax queries: data-dependent RDP at one order, per-query bounds summed
    # (each query's running maximum over distances, i.e. the ball of radius d), smooth sensitivity
    # (compute_discounted_max) and the GNSS cost. n = 100 teachers, B = 10.
    rng = np.random.default_rng(7)
    n, threshold, s1, s2, order = 100, 50.0, 15.0, 10.0, 8.0
    votes = np.concatenate([
        rng.multinomial(n, rng.dirichlet(np.full(10, a)), size=6) for a in (0.05, 0.3, 3.0)
    ] + [np.array([[n] + [0] * 9, [60, 40] + [0] * 8])])
    answered = (np.arange(len(votes)) % 3 != 2)
    rdp, ls_sum = 0.0, np.zeros(n)
    for v, a in zip(votes, answered):
        logp = pate.compute_logpr_answered(threshold, s1, v)
        rdp += pate.compute_rdp_threshold(logp, s1, order)
        ls_t = pate_ss.compute_local_sensitivity_bounds_threshold(v, n, threshold, s1, order)
        ls_sum += np.maximum.accumulate(ls_t)
        if a:
            rdp += pate_ss._compute_rdp_gnmax(s2, pate.compute_logq_gaussian(v, s2), order)
            ls_sum += np.maximum.accumulate(pate_ss.compute_local_sensitivity_bounds_gnmax(v, n, s2, order))
    edge = int(min(max(round(v.max()), n - round(v.max())) for v in votes))  # the reference stops one short there
    betas = (0.01, 0.03, 0.06)
    out["confident_gnmax_batch"] = {
        "n": n, "threshold": threshold, "sigma_threshold": s1, "sigma_gnmax": s2, "order": order,
        "votes": votes.tolist(), "answered": answered.tolist(), "data_dependent_rdp": rdp,
        "ls_sum": arr(ls_sum[:edge]), "compare_up_to": edge,
        "smooth_sensitivity": {str(b): pate_ss.compute_discounted_max(b, ls_sum[:edge]) for b in betas},
        "gnss_rdp": {str(b): pate_ss.compute_rdp_of_smooth_sensitivity_gaussian(b, 5.0, order) for b in betas},
        "eps_classic_delta_1e-5": {str(b): rdp + pate_ss.compute_discounted_max(b, ls_sum[:edge]) * 5.0 * 0.7
                                   + pate_ss.compute_rdp_of_smooth_sensitivity_gaussian(b, 5.0, order) - math.log(1e-5) / (order - 1)
                                   for b in betas},
        "z": 0.7, "sigma_ss": 5.0,
    }

    # PATE-GAN's two-class Laplace vote: the data-dependent RDP per gap from core.rdp_pure_eps
    # (Papernot et al. 2017, Theorem 3, with pure eps = 2*lam) and core.compute_logq_laplace.
    rows = []
    for n_t, lam, order in ((20, 0.1, 2.0), (20, 0.5, 5.0), (21, 0.3, 10.0), (50, 1.0, 3.0), (50, 0.05, 30.0)):
        table = []
        for gap in range(n_t % 2, n_t + 1, 2):
            n1 = (n_t + gap) // 2
            logq = pate.compute_logq_laplace(np.array([n1, n_t - n1], dtype=float), 1.0 / lam)
            table.append(pate.rdp_pure_eps(logq, 2.0 * lam, order))
        rows.append(dict(n=n_t, lam=lam, order=order, rdp_table=arr(table)))
    out["laplace_rdp_table"] = rows

    # Conditions C5-C6 (check_conditions; the reference test's two cases first).
    rows = []
    for sigma, m, order in [(20.0, 10, 25.0), (30.0, 10, 25.0)] + [
            (s, m, o) for m in (2, 10) for s in (1.0, 3.0, 10.0, 30.0, 100.0) for o in (2.0, 5.0, 10.0, 25.0)]:
        try:
            c5, c6 = pate_ss.check_conditions(sigma, m, order)
        except AssertionError:  # "Minimizer failed to converge"
            continue
        rows.append(dict(sigma=sigma, num_classes=m, order=order, c5=bool(c5), c6=bool(c6)))
    out["conditions"] = rows

    # Where core.py's ln(1 - p) underflows: threshold 20, sigma 1, teachers 200: for max votes
    # v >= 59, p = 1 - Phi(20 - v) rounds to 1 and the reference's threshold cost is exactly 0.
    out["threshold_underflow"] = []
    for order in (10.0, 25.0):
        table = pate_ss._compute_rdp_list_threshold(200, 20.0, 1.0, order)
        out["threshold_underflow"].append(dict(n=200, threshold=20.0, sigma=1.0, order=order,
                                               rdp_at=[[v, float(table[v])] for v in (50, 58, 59, 60, 80)]))

    OUT.write_text(json.dumps(out, separators=(",", ":")))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
