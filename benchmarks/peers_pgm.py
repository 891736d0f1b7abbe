"""Run private-pgm's MST or AIM on a CSV: the field's own peers of ``benchmarks/tabular_utility.py``.

MST (McKenna, Miklau & Sheldon, JPC 2021) and AIM (McKenna et al., VLDB 2022) live in the ``mechanisms/`` folder of the
author's repository (github.com/ryan112358/mbi, formerly private-pgm; Apache License 2.0, Copyright Ryan McKenna), not
in the ``mbi`` package. ``mst``, ``compress_domain``, ``select``, ``aim`` and the zCDP conversion below are thin
adaptations of ``mechanisms/{mst,aim,mechanism,cdp2adp}.py`` to the ``mbi`` 2.0 API on PyPI, with the algorithms
unchanged (budget split, noise, qualities, exponential mechanism, estimation); every draw from one seeded ``numpy``
generator. What changed: AIM's per-round mirror descent and model-size limit are parameters (``max_iters``,
``max_model_size``; the paper's 1000 and 80 MB), and the model's marginals and sizes for the candidates come from
``model_marginals`` and ``model_size_mb`` (mbi's numbers without a JAX compilation per clique: a cervical round went
from ~230 s to ~1 s; ``--self-check`` compares them). It runs in its own virtualenv and imports nothing from the project::

    python -m venv .venv-pgm && .venv-pgm/bin/pip install -c constraints.txt "mbi==2.0.0" pandas

AIM compiles new JAX programs every round, each keeping memory mappings: raise Linux's ``vm.max_map_count`` first
(``sysctl -w vm.max_map_count=1048576``; at 65,530 a cardio fit died with "LLVM compilation error"). The job on stdin::

    {"synth": "mst", "epsilon": 1.0, "delta": 1e-5, "train_csv": "...", "out_csv": "...", "num_rows": 2000, "bins": 10,
     "seed": 0, "columns": {"Age": {"type": "numeric", "min": 10, "max": 90}, "Smokes": {"type": "categorical", "categories": [0, 1]}}}

Numeric columns are cut into ``bins`` equal-width bins of their declared (public) bounds and sampled uniformly inside
their bin; a numeric column with ``edges`` (the project's released bins: ``{"edges", "offset", "scale"}``, the
DataModule's private quantiles) is cut on them and sampled evenly in ``asinh((v − offset)/scale)`` inside its bin,
integers of their own bin for an integer column (``"integer": true``), as the project's decoder does; their cost,
``rho_spent`` (zCDP), comes off the synthesizer's budget. Other columns keep their declared categories. Writes
``num_rows`` rows to ``out_csv``, one JSON line on stdout.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
import warnings


# ============================================================================ zCDP (cdp2adp.py)
def cdp_delta(rho: float, eps: float) -> float:
    """δ of ρ-zCDP at ε (Canonne, Kamath & Steinke 2020, Prop. 7: the bound private-pgm uses)."""
    if rho == 0:
        return 0.0
    amin, amax = 1.01, (eps + 1) / (2 * rho) + 2
    for _ in range(1000):
        alpha = (amin + amax) / 2
        derivative = (2 * alpha - 1) * rho - eps + math.log1p(-1.0 / alpha)
        if derivative < 0:
            amin = alpha
        else:
            amax = alpha
    delta = math.exp((alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha)) / (alpha - 1.0)
    return min(delta, 1.0)


def cdp_rho(eps: float, delta: float) -> float:
    """The largest ρ whose ρ-zCDP implies (ε, δ)-DP."""
    lo, hi = 0.0, eps + 1
    for _ in range(1000):
        rho = (lo + hi) / 2
        if cdp_delta(rho, eps) <= delta:
            lo = rho
        else:
            hi = rho
    return lo


# ============================================================================ shared pieces
def exponential_mechanism(q, eps: float, sensitivity: float, prng):
    import numpy as np
    from scipy.special import logsumexp

    scores = 0.5 * eps / sensitivity * np.asarray(q, dtype=np.float64)
    return prng.choice(len(scores), p=np.exp(scores - logsumexp(scores)))


def measure(data, cliques, sigma: float, prng, weights=None):
    """Gaussian measurements of the cliques' marginals, noise σ/w with w normalised to unit L2 norm."""
    import numpy as np
    from mbi import LinearMeasurement

    weights = np.ones(len(cliques)) if weights is None else np.asarray(weights, dtype=np.float64)
    weights = weights / np.linalg.norm(weights)
    out = []
    for proj, wgt in zip(cliques, weights):
        x = np.asarray(data.project(proj).datavector())
        out.append(LinearMeasurement(x + prng.normal(0, sigma / wgt, size=x.size), tuple(proj), sigma / wgt))
    return out


# ============================================================================ MST (mst.py)
def compress_domain(data, measurements, prng):
    """Merge the values of a column whose noisy count is below 3σ into one value (MST, Sec. 4)."""
    import numpy as np
    from mbi import Dataset, Domain, LinearMeasurement
    from mbi.marginal_loss import WeightedQuery

    supports, new = {}, []
    for m in measurements:
        col = m.clique[0]
        y = np.asarray(m.noisy_measurement)
        sup = y >= 3 * m.stddev
        supports[col] = sup
        if sup.all():
            new.append(m)
        else:  # the merged value's measurement, rescaled so that its noise keeps the same σ
            y2 = np.append(y[sup], y[~sup].sum())
            weights = np.ones(y2.size)
            weights[-1] = 1.0 / np.sqrt(y.size - y2.size + 1.0)
            y2[-1] /= np.sqrt(y.size - y2.size + 1.0)
            new.append(LinearMeasurement(y2, m.clique, m.stddev, query=WeightedQuery(weights)))
    columns, sizes = {}, {}
    for col in data.domain.attributes:
        sup = supports[col]
        size = int(sup.sum())
        mapping = np.full(sup.size, size)
        mapping[sup] = np.arange(size)
        columns[col] = mapping[np.asarray(data.to_dict()[col])]
        sizes[col] = size + int(size < sup.size)

    def undo(synth):
        out = {}
        for col in synth.domain.attributes:
            sup = supports[col]
            values = np.asarray(synth.to_dict()[col]).copy()
            kept, extra = np.where(sup)[0], np.where(~sup)[0]
            merged = values == sup.sum()
            restored = np.zeros_like(values)
            restored[~merged] = kept[values[~merged]]
            if extra.size:
                restored[merged] = prng.choice(extra, merged.sum())
            out[col] = restored
        return Dataset(out, Domain.fromdict({c: int(supports[c].size) for c in synth.domain.attributes}))

    return Dataset(columns, Domain.fromdict(sizes)), new, undo


def select(data, rho: float, measurements, prng, iters: int):
    """A maximum spanning tree of the pairs' L1 errors under the one-way model, chosen with the
    exponential mechanism one edge at a time (Kruskal)."""
    import networkx as nx
    import numpy as np
    from mbi import estimation
    from scipy.cluster.hierarchy import DisjointSet

    est = estimation.MirrorDescent().estimate(data.domain, measurements, iters=iters)
    candidates = list(itertools.combinations(data.domain.attributes, 2))
    weights = {}
    for a, b in candidates:
        xhat = np.asarray(est.project([a, b]).datavector())
        x = np.asarray(data.project([a, b]).datavector())
        weights[a, b] = np.linalg.norm(x - xhat, 1)
    tree = nx.Graph()
    tree.add_nodes_from(data.domain.attributes)
    ds = DisjointSet(data.domain.attributes)
    r = len(list(nx.connected_components(tree)))
    epsilon = np.sqrt(8 * rho / (r - 1))
    for _ in range(r - 1):
        candidates = [e for e in candidates if not ds.connected(*e)]
        e = candidates[exponential_mechanism(np.array([weights[e] for e in candidates]), epsilon, 1.0, prng)]
        tree.add_edge(*e)
        ds.merge(*e)
    return list(tree.edges)


def mst(data, epsilon: float, delta: float, prng, *, rows: int, iters: int = 10000, select_iters: int = 2500, rho_spent: float = 0.0):
    import numpy as np
    from mbi import estimation

    rho = cdp_rho(epsilon, delta) - rho_spent  # what the bins' release (if any) left of the zCDP budget
    sigma = np.sqrt(3 / (2 * rho))
    log1 = measure(data, [(col,) for col in data.domain], sigma, prng)
    data, log1, undo = compress_domain(data, log1, prng)
    cliques = select(data, rho / 3.0, log1, prng, select_iters)
    log2 = measure(data, cliques, sigma, prng)
    est = estimation.MirrorDescent().estimate(data.domain, log1 + log2, iters=iters)
    return undo(est.synthetic_data(rows=rows)), cliques


# ============================================================================ AIM (aim.py)
def _downward_closure(workload):
    out = set()
    for clique in workload:
        for r in range(1, len(clique) + 1):
            out.update(itertools.combinations(clique, r))
    return sorted(out, key=len)


def _reduce_to(attrs: tuple, table, keep: tuple, log: bool = False):
    """Sum ``table`` (log-sum-exp if ``log``) over the axes of ``attrs`` not in ``keep``; axes in ``keep``'s order."""
    import numpy as np
    from scipy.special import logsumexp

    drop = tuple(i for i, a in enumerate(attrs) if a not in keep)
    out = (logsumexp(table, axis=drop) if log else table.sum(axis=drop)) if drop else table
    rest = [a for a in attrs if a in keep]
    return np.transpose(out, [rest.index(a) for a in keep])


def _broadcast(attrs: tuple, table, target: tuple, shape: tuple):
    """``table`` over ``attrs`` (a subset of ``target``) as an array over ``target`` of ``shape``."""
    import numpy as np

    order = [a for a in target if a in attrs]
    table = np.transpose(table, [attrs.index(a) for a in order])
    return np.broadcast_to(table.reshape([shape[i] if a in attrs else 1 for i, a in enumerate(target)]), shape)


def model_marginals(model, cliques) -> dict:
    """The marginals of a fitted mbi model on ``cliques`` of one or two attributes, exactly, in numpy.

    ``model.project`` answers a marginal outside the model's cliques with variable elimination that JAX
    compiles once per clique and model: ~0.4 s a clique here, ~230 s per AIM round over the 630 candidates
    of cervical's 35 columns (its fits timed out). This computes the same numbers on the model's junction
    tree: HUGIN message passing in log space for the maximal cliques (as ``message_passing_hugin``), then,
    for each attribute ``a``, its joint with every maximal clique by walking the tree from a clique that
    holds ``a`` (P(a, D) = P(a, S) P(D | S) over the separator S of each edge, Koller & Friedman 10.3);
    attributes in different trees of the forest are independent. Tables sum to the model's total, as
    ``model.project``'s do.

    Returns:
        ``{clique: flat numpy vector}`` in the clique's attribute order (the layout of ``datavector``).
    """
    import networkx as nx
    import numpy as np
    from mbi import junction_tree

    domain, total = model.domain, float(model.total)
    size = domain.config
    jtree, _ = junction_tree.make_junction_tree(domain, model.potentials.cliques)
    maximal = junction_tree.maximal_cliques(jtree)
    shape = {c: tuple(size[a] for a in c) for c in maximal}
    beliefs = {c: np.zeros(shape[c]) for c in maximal}
    for cl, factor in model.potentials.tables.items():  # each potential joins one maximal clique that holds it
        home = next(c for c in maximal if set(cl) <= set(c))
        beliefs[home] = beliefs[home] + _broadcast(tuple(factor.domain.attributes), np.asarray(factor.values), home, shape[home])
    messages = {}
    for i, j in junction_tree.message_passing_order(jtree):
        sep = tuple(a for a in i if a in j)
        tau = beliefs[i] - _broadcast(sep, messages[j, i], i, shape[i]) if (j, i) in messages else beliefs[i]
        messages[i, j] = _reduce_to(i, tau, sep, log=True)
        beliefs[j] = beliefs[j] + _broadcast(sep, messages[i, j], j, shape[j])
    marginal = {}
    for c in maximal:
        p = np.exp(beliefs[c] - beliefs[c].max())
        marginal[c] = p * (total / p.sum())
    home_of = {a: next(c for c in maximal if a in c) for a in domain.attributes}
    one = {a: _reduce_to(home_of[a], marginal[home_of[a]], (a,)) for a in domain.attributes}
    pairs = {}
    for a in {a for cl in cliques if len(cl) == 2 for a in cl}:
        joint = {home_of[a]: (home_of[a], marginal[home_of[a]])}  # clique D -> (axes, P(a, D)); a is an axis
        for parent, child in nx.bfs_edges(jtree, home_of[a]):
            if a in child:
                joint[child] = (child, marginal[child])
                continue
            sep = tuple(x for x in child if x in parent)  # a is not in it: it is in no clique beyond parent
            p_sep = _broadcast(sep, _reduce_to(child, marginal[child], sep), child, shape[child])
            conditional = np.divide(marginal[child], p_sep, out=np.zeros(shape[child]), where=p_sep != 0)
            axes, out_shape = (a,) + child, (size[a],) + shape[child]
            a_sep = _reduce_to(*joint[parent], (a,) + sep)
            joint[child] = (axes, _broadcast((a,) + sep, a_sep, axes, out_shape) * _broadcast(child, conditional, axes, out_shape))
        for axes, table in joint.values():
            for b in axes:
                if b != a and (a, b) not in pairs:
                    pairs[a, b] = _reduce_to(axes, table, (a, b))
    out = {}
    for cl in cliques:
        if len(cl) == 1:
            out[cl] = one[cl[0]].ravel()
        elif len(cl) == 2:
            table = pairs.get(tuple(cl))
            out[cl] = (table if table is not None else np.outer(one[cl[0]], one[cl[1]]) / total).ravel()
        else:
            raise ValueError(f"model_marginals answers cliques of one or two attributes, not {cl}")
    return out


def model_size_mb(domain, cliques) -> float:
    """``mbi.junction_tree.hypothetical_model_size`` (the cells of the junction tree's maximal cliques, in MB
    of float64), the same number without networkx or ``Domain`` objects: AIM asks it for every candidate
    every round, ~8 ms a call in mbi (80% of a cervical round).

    mbi eliminates the attributes greedily (fewest cells of a neighbourhood first, ties in the domain's
    order), or in depth-first post-order when the graph is a tree (then the cliques are its edges). The
    maximal cliques of the triangulated graph are the maximal sets {a} + neighbours(a) at a's elimination.
    """
    size = domain.config
    attrs = list(domain.attributes)
    edges = {frozenset(e) for cl in cliques for e in itertools.combinations(cl, 2)}

    def cells(group) -> int:
        return math.prod(size[a] for a in group)

    parent = {a: a for a in attrs}

    def root(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in map(tuple, edges):
        parent[root(a)] = root(b)
    if edges and len(edges) == len(attrs) - 1 and len({root(a) for a in attrs}) == 1:  # nx.is_tree
        return sum(cells(e) for e in edges) * 8 / 2 ** 20
    hood = {a: set() for a in attrs}  # the union of the (elimination game's) cliques that hold a
    for cl in cliques:
        for a in cl:
            hood[a] |= set(cl)
    unmarked, eliminated = list(attrs), []
    while unmarked:
        a = min(unmarked, key=lambda x: cells(hood[x]))  # the first of equals, as mbi's min over its OrderedDict
        unmarked.remove(a)
        rest = hood[a] - {a}
        eliminated.append(rest | {a})
        for x in rest:
            hood[x] = (hood[x] | rest) - {a}
    maximal = [c for i, c in enumerate(eliminated)
               if not any(c < d or (c == d and j < i) for j, d in enumerate(eliminated) if j != i)]
    return sum(cells(c) for c in maximal) * 8 / 2 ** 20


def aim(data, epsilon: float, delta: float, prng, *, rows: int, max_model_size: float = 80.0, max_iters: int = 1000,
        degree: int = 2, max_cells: int = 10000, rho_spent: float = 0.0):
    """AIM with the workload of every ``degree``-way marginal of at most ``max_cells`` cells, equal weights."""
    import numpy as np
    from mbi import LinearMeasurement, estimation

    workload = [cl for cl in itertools.combinations(data.domain.attributes, degree) if data.domain.size(cl) <= max_cells]
    closure = _downward_closure(workload)
    candidates = {cl: float(sum(len(set(cl) & set(w)) for w in workload)) for cl in closure}  # compile_workload
    answers = {cl: np.asarray(data.project(cl).datavector()) for cl in candidates}
    rho = cdp_rho(epsilon, delta) - rho_spent  # what the bins' release (if any) left of the zCDP budget
    rounds = 16 * len(data.domain)
    oneway = [cl for cl in candidates if len(cl) == 1]
    sigma = np.sqrt(rounds / (2 * 0.9 * rho))
    eps = np.sqrt(8 * 0.1 * rho / rounds)
    rho_used = len(oneway) * 0.5 / sigma ** 2
    measurements = [LinearMeasurement(answers[cl] + prng.normal(0, sigma, answers[cl].size), cl, stddev=sigma) for cl in oneway]
    model = estimation.MirrorDescent().estimate(data.domain, measurements, iters=max_iters)
    terminate = False
    while not terminate:
        if rho - rho_used < 2 * (0.5 / sigma ** 2 + 1.0 / 8 * eps ** 2):  # the last round takes what is left
            remaining = rho - rho_used
            sigma, eps = np.sqrt(1 / (2 * 0.9 * remaining)), np.sqrt(8 * 0.1 * remaining)
            terminate = True
        rho_used += 1.0 / 8 * eps ** 2 + 0.5 / sigma ** 2
        size_limit = max_model_size * rho_used / rho
        free = set(_downward_closure(model.cliques))
        small = {cl: w for cl, w in candidates.items()
                 if cl in free or model_size_mb(model.domain, list(model.cliques) + [cl]) <= size_limit}
        keys = list(small)
        estimates = model_marginals(model, keys)
        errors = np.array([small[cl] * (np.linalg.norm(answers[cl] - estimates[cl], 1)
                                        - np.sqrt(2 / np.pi) * sigma * model.domain.size(cl)) for cl in keys])
        cl = keys[exponential_mechanism(errors, eps, max(abs(small[k]) for k in keys), prng)]
        n = data.domain.size(cl)
        measurements.append(LinearMeasurement(answers[cl] + prng.normal(0, sigma, n), cl, stddev=sigma))
        z = estimates[cl]
        model = estimation.MirrorDescent().estimate(data.domain, measurements, iters=max_iters, warm_start=model)
        w = model_marginals(model, [cl])[cl]
        if np.linalg.norm(w - z, 1) <= sigma * np.sqrt(2 / np.pi) * n:  # the model barely moved: measure more precisely
            sigma /= 2
            eps *= 2
    return model.synthetic_data(rows=rows), [m.clique for m in measurements if len(m.clique) > 1]


# ============================================================================ the job
def _warp(values, spec: dict):
    """A column's values in the scale its released bins are filled in (the project's ``quantiles.warp``)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    return values if spec.get("scale") is None else np.arcsinh((values - float(spec.get("offset", 0.0))) / float(spec["scale"]))


def _unwarp(values, spec: dict):
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    return values if spec.get("scale") is None else float(spec.get("offset", 0.0)) + float(spec["scale"]) * np.sinh(values)


def _key(value) -> str:
    """A category as a string, 1.0 and 1 alike."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value.item() if hasattr(value, "item") else value)


def main() -> None:
    job = json.loads(sys.stdin.read())
    warnings.filterwarnings("ignore")
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import pandas as pd
    from mbi import Dataset, Domain

    prng = np.random.default_rng(int(job.get("seed", 0)))
    bins = int(job.get("bins", 10))
    columns = job["columns"]
    frame = pd.read_csv(job["train_csv"])[list(columns)]
    codes, sizes = {}, {}
    for name, spec in columns.items():
        if spec["type"] == "numeric" and spec.get("edges"):
            t, te = _warp(np.clip(frame[name].to_numpy(dtype=np.float64), spec["edges"][0], spec["edges"][-1]), spec), _warp(spec["edges"], spec)
            codes[name] = np.clip(np.searchsorted(te, t, side="right") - 1, 0, len(te) - 2).astype(np.int64)
            sizes[name] = len(te) - 1
        elif spec["type"] == "numeric":
            lo, hi = float(spec["min"]), float(spec["max"])
            v = np.clip(frame[name].to_numpy(dtype=np.float64), lo, hi)
            codes[name] = np.zeros(len(v), dtype=np.int64) if hi <= lo else np.clip(np.floor((v - lo) / (hi - lo) * bins), 0, bins - 1).astype(np.int64)
            sizes[name] = bins
        else:
            lookup = {_key(c): i for i, c in enumerate(spec["categories"])}
            codes[name] = frame[name].map(lambda v: lookup[_key(v)]).to_numpy(dtype=np.int64)
            sizes[name] = len(spec["categories"])
    data = Dataset(codes, Domain.fromdict(sizes))
    options = dict(job.get("options", {}))
    start = time.perf_counter()
    budget = {"rho_spent": float(job.get("rho_spent", 0.0))}
    if job["synth"] == "mst":
        synth, cliques = mst(data, float(job["epsilon"]), float(job["delta"]), prng, rows=int(job["num_rows"]), **budget, **options)
    elif job["synth"] == "aim":
        synth, cliques = aim(data, float(job["epsilon"]), float(job["delta"]), prng, rows=int(job["num_rows"]), **budget, **options)
    else:
        raise ValueError(f"unknown synthesizer {job['synth']!r}: mst or aim")
    wall = time.perf_counter() - start
    out = {}
    values = synth.to_dict()
    for name, spec in columns.items():
        c = np.asarray(values[name], dtype=np.int64)
        if spec["type"] == "numeric" and spec.get("edges"):
            edges = np.asarray(spec["edges"], dtype=np.float64)
            te = _warp(edges, spec)
            v = _unwarp(te[c] + prng.random(len(c)) * (te[c + 1] - te[c]), spec)
            if spec.get("integer"):  # the nearest integer of its own bin
                v = np.clip(np.floor(v + 0.5), np.ceil(edges[c]), np.maximum(np.floor(edges[c + 1]), np.ceil(edges[c])))
            out[name] = v
        elif spec["type"] == "numeric":
            lo, hi = float(spec["min"]), float(spec["max"])
            out[name] = lo + (c + prng.random(len(c))) * (hi - lo) / bins  # uniform inside the bin
        else:
            out[name] = np.asarray(spec["categories"], dtype=object)[c]
    pd.DataFrame(out)[list(columns)].to_csv(job["out_csv"], index=False)
    print(json.dumps({"wall_s": wall, "rows": len(c), "cliques": [list(cl) for cl in cliques]}))


def self_check(pairs: int = 40, graphs: int = 300) -> dict:
    """``model_marginals`` and ``model_size_mb`` against mbi's own ``model.project`` and
    ``hypothetical_model_size``: the largest difference of a marginal relative to the total, on a model of
    random data whose measured cliques make cycles (so the junction tree has cliques of three attributes)
    and a separate tree (every 1-way and ``pairs`` random 2-way marginals); and the largest difference of
    the model size over ``graphs`` random sets of 1- and 2-way cliques (trees, forests, cycles, ties)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from mbi import Dataset, Domain, LinearMeasurement, estimation, junction_tree

    rng = np.random.default_rng(0)
    names = [f"c{i}" for i in range(12)]
    sizes = dict(zip(names, rng.integers(2, 7, len(names)).tolist()))
    data = Dataset({n: rng.integers(0, k, 500) for n, k in sizes.items()}, Domain.fromdict(sizes))
    c = names
    measured = [(n,) for n in names[:11]] + [(c[0], c[1]), (c[1], c[2]), (c[0], c[2]), (c[3], c[4]), (c[4], c[5]),
                                             (c[5], c[6]), (c[3], c[6]), (c[7], c[8]), (c[8], c[1]), (c[9], c[10])]
    measurements = [LinearMeasurement(np.asarray(data.project(cl).datavector()) + rng.normal(0, 3, data.domain.size(cl)),
                                      cl, stddev=3.0) for cl in measured]
    model = estimation.MirrorDescent().estimate(data.domain, measurements, iters=200)
    every = list(itertools.combinations(names, 2))
    queries = [(n,) for n in names] + [every[i] for i in rng.choice(len(every), pairs, replace=False)]
    ours = model_marginals(model, queries)
    marginal = max(float(np.abs(np.asarray(model.project(q).datavector()) - ours[q]).max()) / float(model.total) for q in queries)
    size = 0.0
    for g in range(graphs):
        domain = Domain.fromdict({n: int(rng.choice([2, 3, 10])) for n in names[: 3 + g % 10]})
        attrs = list(domain.attributes)
        pool = list(itertools.combinations(attrs, 2))
        chosen = [pool[i] for i in rng.choice(len(pool), min(len(pool), int(rng.integers(0, 2 * len(attrs)))), replace=False)]
        if g % 3 == 0:  # a random tree (the depth-first branch of mbi)
            chosen = [(attrs[i], attrs[int(rng.integers(0, i))]) for i in range(1, len(attrs))]
        cliques = [(a,) for a in attrs if rng.random() < 0.7] + [tuple(domain.canonical(e)) for e in chosen]
        size = max(size, abs(model_size_mb(domain, cliques) - junction_tree.hypothetical_model_size(domain, cliques)))
    return {"max_relative_difference": marginal, "max_model_size_difference_mb": size}


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-check"]:  # tests/test_peers_pgm.py
        print(json.dumps(self_check()))
    else:
        main()
