"""MarginalTree: a differentially private synthesizer of noisy low-order marginals on a label-rooted tree.

The strongest DP synthesizers of tables do not train a GAN: they spend the budget on a few noisy
low-order marginals and sample from a graphical model consistent with them (PrivBayes, Zhang et al.
2017; MST, McKenna et al. 2021; AIM, McKenna et al. 2022). This model is that recipe, rooted at the
label because the user of a conditional table wants ``P(features | label)`` first:

1. **one-way marginals** of the label and of every feature column, measured together with the
   Gaussian mechanism (add/remove neighbours: a record changes one cell of each of the ``d + 1``
   histograms, L2 sensitivity ``√(d+1)``);
2. **structure**: ``label_edges`` times, the exponential mechanism picks a feature to attach to the
   label, then ``feature_edges`` times a (node in the tree, feature outside it) pair. The quality of a
   candidate edge (p, c) is AIM's: ``‖M_pc(D) − N̂·P̂_p⊗P̂_c‖₁ − √(2/π)·σ₂·cells(p, c)``, the L1 distance of
   its true two-way marginal from what the noisy one-way marginals predict, less the expected error of
   measuring it (a pair is worth measuring only when it is further off than the noise). Adding or
   removing one record moves the first term by at most 2 (one cell of ``M_pc`` by 1, and ``N̂·P̂_p⊗P̂_c``
   by ``P̂_p`` over the child's category, whose entries sum to 1): sensitivity 2; the rest is public or
   already noisy;
3. **two-way marginals** of the chosen edges, each measured with the Gaussian mechanism (sensitivity 1);
4. **the model**: each tree edge's conditional table ``P(child | parent)`` from its noisy marginal
   (negative counts clipped, shrunk towards the child's one-way estimate by a pseudo-count equal to the
   noise scale); features outside the tree follow their noisy one-way marginal. Sampling is ancestral,
   from the label down (post-processing: free).

The whole budget is planned before any data is read: with the fractions ``one_way_fraction`` and
``selection_fraction`` of a zCDP-style split (a Gaussian of noise multiplier z is ``1/(2z²)``-zCDP, a
pure ε-DP selection ``ε²/2``-zCDP), the largest total ρ whose events keep the accountant's (ε, δ)
guarantee within the budget is found by bisection on the project's accountant; the fit then records
exactly the planned events (:class:`~lightning_gpate.privacy.SubsampledGaussianEvent` with sampling rate
1 is the plain Gaussian mechanism, :class:`~lightning_gpate.privacy.PureDPEvent` each selection).

Numeric columns are cut into ``num_bins`` equal-width bins of their declared (public) range in the
generator's space [-1, 1]; a sampled bin is filled uniformly. Binary and categorical columns keep their
categories. The generator is a :class:`TreeSampler`: a deterministic function of a uniform latent vector
and the label, so ``generate``/``sample``/checkpoints work as for every other model.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_gpate.models.private import PrivateGenerativeModel
from lightning_gpate.privacy import ExponentialMechanismEvent, SubsampledGaussianEvent
from lightning_gpate.privacy.randomness import mechanism_generator

NUMERIC, BINARY, CATEGORICAL = 0, 1, 2
LABEL_PARENT, NO_PARENT = -1, -2


# ============================================================================ the generator
class TreeSampler(nn.Module):
    """Ancestral sampler of a label-rooted tree of conditional tables, in the generator's space.

    ``forward(z, y)`` maps a uniform latent ``z ∈ [-1, 1]^{2n}`` (two numbers per feature node: one picks
    its category by inverse CDF, one places a numeric value inside its bin) and labels ``y`` to rows in
    the generator's space (numeric in [-1, 1], binary ±1, categorical one-hot), deterministically.

    Args:
        kinds: per feature node, ``NUMERIC``, ``BINARY`` or ``CATEGORICAL``.
        cards: per node, its number of categories (bins for numeric columns).
        starts: per node, its first column in the generator's space.
        num_classes: classes of the label (the root).
    """

    def __init__(self, kinds: list[int], cards: list[int], starts: list[int], num_classes: int) -> None:
        super().__init__()
        n = len(kinds)
        width = max(max(cards, default=1), num_classes, 1)
        self.num_nodes, self.num_classes = n, num_classes
        self.output_dim = int(max((s + (c if k == CATEGORICAL else 1) for k, c, s in zip(kinds, cards, starts)), default=0))
        self.register_buffer("kinds", torch.tensor(kinds, dtype=torch.long))
        self.register_buffer("cards", torch.tensor(cards, dtype=torch.long))
        self.register_buffer("starts", torch.tensor(starts, dtype=torch.long))
        self.register_buffer("parents", torch.full((n,), NO_PARENT, dtype=torch.long))
        self.register_buffer("order", torch.arange(n, dtype=torch.long))
        # cpt[i, v, :cards[i]] = P(node i | parent = v); row 0 for a node without a parent.
        self.register_buffer("cpt", torch.zeros(n, width, width, dtype=torch.float64))
        # The measured (noisy) class ratio: part of the generator, so that it travels in the release.
        self.register_buffer("label_ratio", torch.zeros(num_classes, dtype=torch.float32))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b = z.shape[0]
        u = ((z.double() + 1.0) / 2.0).clamp(0.0, 1.0 - 1e-12)
        codes = torch.zeros(b, self.num_nodes, dtype=torch.long, device=z.device)
        out = torch.zeros(b, self.output_dim, dtype=z.dtype, device=z.device)
        for node in self.order.tolist():
            card, parent = int(self.cards[node]), int(self.parents[node])
            if parent == LABEL_PARENT:
                rows = self.cpt[node][y.long(), :card]
            elif parent == NO_PARENT:
                rows = self.cpt[node][0, :card].expand(b, card)
            else:
                rows = self.cpt[node][codes[:, parent], :card]
            cdf = rows.cumsum(1) / rows.sum(1, keepdim=True).clamp_min(1e-300)
            code = (u[:, 2 * node:2 * node + 1] > cdf).sum(1).clamp(max=card - 1)
            codes[:, node] = code
            start, kind = int(self.starts[node]), int(self.kinds[node])
            if kind == NUMERIC:
                out[:, start] = (-1.0 + (code.double() + u[:, 2 * node + 1]) * 2.0 / card).to(out.dtype)
            elif kind == BINARY:
                out[:, start] = (2.0 * code - 1.0).to(out.dtype)
            else:
                out[torch.arange(b, device=z.device), start + code] = 1.0
        return out


# ============================================================================ the model
class MarginalTree(PrivateGenerativeModel):
    """DP synthesizer of noisy one- and two-way marginals on a label-rooted tree (see the module doc).

    Tables only. The DataModule serves the whole training split as one batch (``num_teachers: 0``); the
    fit reads it once, records its planned events, and stops: the budget is then spent (a second fit
    refuses, as for every private model).

    Args:
        data_spec: the DataModule's spec (tabular).
        epsilon: privacy budget ε.
        delta: δ.
        budget_accounting: ``"guarantee"`` (the only analysis: Gaussian and exponential mechanisms).
        conversion: RDP → (ε, δ) conversion.
        num_bins: equal-width bins of a numeric column's declared range.
        label_edges: features attached to the label by the exponential mechanism (the label's
            conditional tables: what a classifier trained on the synthetic rows learns from).
        feature_edges: further tree edges between features (realism of feature correlations).
        label_fraction: share of the planned ρ for the label's one-way marginal (the class ratio).
        one_way_fraction: share of the planned ρ for the features' one-way marginals (``0``: features
            outside the tree are sampled uniformly and nothing is spent on them).
        selection_fraction: share of the planned ρ for the edge selections (split equally); the rest
            measures the chosen two-way marginals (split equally).
        noise_seed: seed of the mechanisms' randomness (``None``: OS entropy; tests only otherwise).
    """

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        num_bins: int = 8,
        label_edges: int = 2,
        feature_edges: int = 0,
        label_fraction: float = 0.1,
        one_way_fraction: float = 0.0,
        selection_fraction: float = 0.5,
        noise_seed: int | None = None,
    ) -> None:
        if data_spec.get("kind") != "tabular":
            raise ValueError("MarginalTree models tables; use a GAN-based model for images")
        if int(num_bins) != num_bins or num_bins < 2:
            raise ValueError(f"num_bins must be an integer >= 2, got {num_bins}")
        for name, value in (("label_edges", label_edges), ("feature_edges", feature_edges)):
            if int(value) != value or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value}")
        fractions = {"label_fraction": label_fraction, "one_way_fraction": one_way_fraction, "selection_fraction": selection_fraction}
        if not (0 < label_fraction < 1 and all(0 <= f < 1 for f in fractions.values()) and sum(fractions.values()) < 1):
            raise ValueError(f"label_fraction in (0, 1), the other fractions in [0, 1) and a sum < 1 are required, got {fractions}")
        columns = data_spec["columns"]
        kinds = [NUMERIC if c["type"] == "numeric" else BINARY if c["type"] == "binary" else CATEGORICAL for c in columns]
        cards = [int(num_bins) if k == NUMERIC else (2 if k == BINARY else len(c["categories"])) for k, c in zip(kinds, columns)]
        num_edges = min(int(label_edges) + int(feature_edges), len(columns))
        if num_edges > 0 and selection_fraction == 0:
            raise ValueError("selection_fraction must be > 0 when edges are selected")
        with warnings.catch_warnings():  # the class ratio is measured with DP here: no need to warn about it
            warnings.filterwarnings("ignore", message="the class ratio was read from the private data")
            super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
                             conversion=conversion, z_dim=2 * len(columns), latent_prior="uniform")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.train_sampling = {"kind": "full"}
        starts = [int(s[0]) for s in data_spec["spans"]]
        self.generator = TreeSampler(kinds, cards, starts, self.num_classes)
        self.num_edges = num_edges
        self.plan = self.plan_budget()
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    # ----------------------------------------------------------------- budget planning
    def planned_events(self, rho: float) -> dict[str, Any]:
        """The events of a fit with total zCDP budget ``rho``: ``label`` (Gaussian, sensitivity 1),
        ``one_way`` (Gaussian on the d feature histograms, noise multiplier relative to √d; absent
        when ``one_way_fraction`` is 0), and per edge ``select`` (exponential mechanism) and
        ``measure`` (Gaussian, sensitivity 1)."""
        hp = self.hparams
        k = self.num_edges

        def gaussian(share: float) -> SubsampledGaussianEvent:  # 1/(2z²)-zCDP; rate 1: the plain Gaussian
            return SubsampledGaussianEvent(noise_multiplier=math.sqrt(1.0 / (2.0 * share * rho)), sampling_rate=1.0)

        events: dict[str, Any] = {"label": gaussian(hp.label_fraction)}
        if hp.one_way_fraction > 0:
            events["one_way"] = gaussian(hp.one_way_fraction)
        if k:
            rest = 1.0 - hp.label_fraction - hp.one_way_fraction - hp.selection_fraction
            # ε-bounded range is ε²/8-zCDP: ε = √(8ρ).
            events["select"] = ExponentialMechanismEvent(math.sqrt(8.0 * hp.selection_fraction * rho / k), "edge selection")
            events["measure"] = gaussian(rest / k)
        return events

    def _event_list(self, events: dict[str, Any]) -> list:
        out = [events["label"]] + ([events["one_way"]] if "one_way" in events else [])
        return out + [events[key] for _ in range(self.num_edges) for key in ("select", "measure")]

    def _fits(self, rho: float) -> bool:
        from lightning_gpate.privacy import PrivacyAccountant

        trial = PrivacyAccountant(delta=self.delta, orders=self.accountant.orders, conversion=self.accountant.conversion)
        trial.load_state_dict(self.accountant.state_dict())
        for event in self._event_list(self.planned_events(rho)):
            trial.record(event)
        return trial.epsilon() <= self.epsilon_budget

    def plan_budget(self) -> dict[str, float]:
        """Largest total ρ (to 1e-9 relative) whose planned events keep ε within the budget, and the
        noise it gives: ``sigma_label``, ``sigma_one_way`` (per cell, the √d sensitivity included),
        ``epsilon_select`` per selection and ``sigma_two_way`` per cell."""
        lo, hi = 1e-12, 1.0
        if not self._fits(lo):
            raise ValueError(f"the budget ε={self.epsilon_budget:g} leaves nothing for the marginals")
        while self._fits(hi):
            lo, hi = hi, hi * 2.0
        while hi / lo > 1.0 + 1e-9:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if self._fits(mid) else (lo, mid)
        events = self.planned_events(lo)
        d = len(self.data_spec["columns"])
        plan = {"rho": lo, "sigma_label": events["label"].noise_multiplier}
        if "one_way" in events:
            plan["sigma_one_way"] = events["one_way"].noise_multiplier * math.sqrt(d)
        if self.num_edges:
            plan["epsilon_select"] = events["select"].epsilon
            plan["sigma_two_way"] = events["measure"].noise_multiplier
        return plan

    # ----------------------------------------------------------------- data in codes
    def encode(self, x: torch.Tensor) -> np.ndarray:
        """Rows in the generator's space → ``[n, d]`` category codes (bins for numeric columns)."""
        g = self.generator
        x = x.detach().double().cpu().numpy()
        codes = np.zeros((x.shape[0], g.num_nodes), dtype=np.int64)
        for i in range(g.num_nodes):
            start, kind, card = int(g.starts[i]), int(g.kinds[i]), int(g.cards[i])
            if kind == NUMERIC:
                codes[:, i] = np.clip(np.floor((x[:, start] + 1.0) / 2.0 * card), 0, card - 1)
            elif kind == BINARY:
                codes[:, i] = (x[:, start] >= 0).astype(np.int64)
            else:
                codes[:, i] = x[:, start:start + card].argmax(1)
        return codes

    # ----------------------------------------------------------------- training
    def configure_optimizers(self):
        return None

    def on_train_start(self) -> None:
        super().on_train_start()
        self.print("MarginalTree plan: " + ", ".join(f"{k}={v:.4g}" for k, v in self.plan.items()))
        if self.logger is not None:
            self.logger.log_hyperparams({f"privacy_split/{k}": v for k, v in self.plan.items()})

    def training_step(self, batch, batch_idx):
        if self.budget_exhausted:
            return None
        x, y = batch
        self.fit_marginals(self.encode(x), y.detach().cpu().numpy().astype(np.int64))
        self.budget_exhausted = True
        self.stop_reason = f"all planned marginals measured: the budget is spent (epsilon={self.spent_epsilon():.4f})"
        if self._trainer is not None:
            self.trainer.should_stop = True
        return None

    def _pay(self, event) -> None:
        if not self.charge(event):  # the plan fits the budget by construction
            raise RuntimeError(f"MarginalTree's planned event does not fit the budget: {self.stop_reason}")

    def fit_marginals(self, codes: np.ndarray, labels: np.ndarray) -> None:
        """Measure, select and build the tree from the private ``codes`` ``[n, d]`` and ``labels``."""
        g, plan, k = self.generator, self.plan, self.num_classes
        gen = mechanism_generator("cpu", self.hparams.noise_seed)
        cards = g.cards.tolist()
        d = len(cards)
        events = self.planned_events(plan["rho"])

        def noise(shape, sigma: float) -> np.ndarray:
            return (torch.randn(shape, generator=gen, dtype=torch.float64) * sigma).numpy()

        # 1. one-way marginals: the label (sensitivity 1), then every feature (one query, sensitivity √d).
        self._pay(events["label"])
        label_noisy = np.bincount(labels, minlength=k) + noise(k, plan["sigma_label"])
        p_label = _normalise(label_noisy)
        if "one_way" in events:
            self._pay(events["one_way"])
            p_one = [_normalise(np.bincount(codes[:, i], minlength=cards[i]) + noise(cards[i], plan["sigma_one_way"])) for i in range(d)]
        else:
            p_one = [np.full(c, 1.0 / c) for c in cards]

        # 2-3. edges: exponential mechanism on Σ|n(p,c) − P̂(p)·n(c)| (sensitivity 2: one record moves
        # n(v,c) by 1 and P̂(·)·n(c) by P̂ summing to 1) less AIM's expected measurement error; then a
        # Gaussian two-way measurement of the chosen pair.
        parent = [NO_PARENT] * d
        in_tree: list[int] = []
        p_node: dict[int, np.ndarray] = {}  # a tree node's distribution from its noisy two-way table
        two_way: dict[int, np.ndarray] = {}
        sigma2 = plan.get("sigma_two_way", 0.0)
        for e in range(self.num_edges):
            label_only = e < self.hparams.label_edges
            candidates, qualities = [], []
            for c in range(d):
                if parent[c] != NO_PARENT:
                    continue
                for p in [LABEL_PARENT] + ([] if label_only else in_tree):
                    p_codes, p_card, p_prob = (labels, k, p_label) if p == LABEL_PARENT else (codes[:, p], cards[p], p_node[p])
                    true = _joint(p_codes, codes[:, c], p_card, cards[c])
                    independent = np.outer(p_prob, true.sum(0))
                    quality = np.abs(true - independent).sum() - math.sqrt(2 / math.pi) * sigma2 * p_card * cards[c]
                    candidates.append((p, c))
                    qualities.append(quality)
            if not candidates:
                break
            self._pay(events["select"])
            p, c = candidates[_exponential_mechanism(np.array(qualities), events["select"].epsilon, gen, sensitivity=2.0)]
            self._pay(events["measure"])
            p_codes, p_card = (labels, k) if p == LABEL_PARENT else (codes[:, p], cards[p])
            two_way[c] = _joint(p_codes, codes[:, c], p_card, cards[c]) + noise((p_card, cards[c]), sigma2)
            p_node[c] = _normalise(two_way[c].sum(0))
            parent[c] = p
            in_tree.append(c)

        # 4. conditional tables (post-processing of the noisy marginals). The class counts are measured
        # by the label's histogram and again by the row sums of every label edge's table: their
        # inverse-variance average is the class ratio.
        estimates = [(label_noisy, plan["sigma_label"] ** 2)]
        estimates += [(two_way[c].sum(1), cards[c] * sigma2 ** 2) for c in range(d) if parent[c] == LABEL_PARENT]
        weights = np.array([1.0 / var for _, var in estimates])
        p_label = _normalise(sum(w * est for w, (est, _) in zip(weights, estimates)) / weights.sum())
        with torch.no_grad():
            g.cpt.zero_()
            for c in range(d):
                if parent[c] == NO_PARENT:
                    g.cpt[c, 0, :cards[c]] = torch.from_numpy(p_one[c])
                else:
                    prior = p_one[c] if "one_way" in events else p_node[c]
                    counts = np.clip(two_way[c], 0.0, None) + sigma2 * prior[None, :]
                    g.cpt[c, :counts.shape[0], :cards[c]] = torch.from_numpy(counts / counts.sum(1, keepdims=True))
            g.parents.copy_(torch.tensor(parent, dtype=torch.long))
            g.order.copy_(torch.tensor(_topological(parent), dtype=torch.long))
            g.label_ratio.copy_(torch.from_numpy(p_label).float())
            self.fitted.fill_(True)

    def sample_labels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Labels from the declared class ratio if it is public or paid for, else from the ratio the
        fit measured (the generator's ``label_ratio``), else uniform (before a fit)."""
        ratio = self.class_ratio
        if self.data_spec.get("class_ratio_source") not in ("public", "dp") and float(self.generator.label_ratio.sum()) > 0:
            ratio = self.generator.label_ratio
        return torch.multinomial(ratio, n, replacement=True, generator=generator).to(self.device)

    # ----------------------------------------------------------------- reporting
    def tree_edges(self) -> list[tuple[str, str]]:
        """The tree's edges as (parent, child) column names (the label's name for the root)."""
        names = [c["name"] for c in self.data_spec["columns"]]
        label = self.data_spec["label"]["name"]
        return [(label if p == LABEL_PARENT else names[p], names[c])
                for c, p in enumerate(self.generator.parents.tolist()) if p != NO_PARENT]


def _normalise(noisy: np.ndarray) -> np.ndarray:
    """A probability vector from noisy counts: negatives clipped; uniform when nothing is left."""
    clipped = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    total = clipped.sum()
    return clipped / total if total > 0 else np.full(clipped.shape, 1.0 / clipped.size)


def _joint(a: np.ndarray, b: np.ndarray, card_a: int, card_b: int) -> np.ndarray:
    """The two-way histogram ``[card_a, card_b]`` of code arrays ``a`` and ``b``."""
    return np.bincount(a * card_b + b, minlength=card_a * card_b).reshape(card_a, card_b).astype(np.float64)


def _exponential_mechanism(qualities: np.ndarray, epsilon: float, gen: torch.Generator, sensitivity: float = 1.0) -> int:
    """Index drawn with probability ∝ exp(ε·q / (2Δ)) (McSherry & Talwar 2007): ε-DP for qualities of
    sensitivity Δ. Drawn as the argmax of the scaled qualities plus Gumbel noise (the same law)."""
    scores = torch.as_tensor(qualities, dtype=torch.float64) * (epsilon / (2.0 * sensitivity))
    u = torch.rand(scores.shape, generator=gen, dtype=torch.float64).clamp_min(1e-300)
    return int(torch.argmax(scores - torch.log(-torch.log(u))))


def _topological(parent: list[int]) -> list[int]:
    """Nodes ordered so that every parent comes before its children (roots first)."""
    order, placed = [], set()
    while len(order) < len(parent):
        for node, p in enumerate(parent):
            if node not in placed and (p < 0 or p in placed):
                order.append(node)
                placed.add(node)
    return order
