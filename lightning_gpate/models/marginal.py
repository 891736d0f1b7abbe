"""MarginalTree: a differentially private synthesizer of every column's noisy marginals on a spanning tree.

The strongest DP synthesizers of tables do not train a GAN: they spend the budget on a few noisy
low-order marginals and sample from a graphical model consistent with them (PrivBayes, Zhang et al.
2017; MST, McKenna, Miklau & Sheldon 2021; AIM, McKenna et al. 2022). This model is MST's recipe, over
every column with the label as one of them, and with a closed-form estimation for a tree:

1. **one-way marginals** of every column (features and label), measured together with the Gaussian
   mechanism (add/remove neighbours: a record changes one cell of each of the ``d + 1`` histograms, L2
   sensitivity ``√(d+1)``). Values whose noisy count is below 3σ are merged into one value for what
   follows (MST's domain compression: post-processing), so rare bins do not dilute the two-way tables;
2. **structure**: a spanning tree over all ``d + 1`` columns, one edge at a time with the exponential
   mechanism (Kruskal: only pairs that join two components are candidates). The quality of a pair
   (a, b) is AIM's: ``‖M_ab(D) − N̂·P̂_a⊗P̂_b‖₁ − √(2/π)·σ_ab·cells(a, b)``, the L1 distance of its true
   two-way marginal from what the noisy one-way marginals predict, less the expected error of
   measuring it. Changing one record moves the first term by at most 1 (sensitivity 1); the rest is
   public or already noisy. The first ``label_edges`` edges are chosen among the label's pairs (what a
   classifier trained on the synthetic rows learns from), with their own share of the budget and the
   quality ``Σ_{y,v} |n(y, v) − P̂(y)·n(v)|`` against the feature's true counts split by the noisy class
   ratio (robust to the features' one-way noise, which dominates the other quality on small tables;
   sensitivity 2: a record moves its cell by 1 and its value's count by 1, times shares summing to 1);
3. **two-way marginals** of the tree's ``d`` edges, each with the Gaussian mechanism (sensitivity 1);
4. **estimation** (post-processing): every column's counts are the inverse-variance average of its
   one-way measurement and of the margins of its edges' tables; each is projected on the counts
   (non-negative, summing to the estimated total N̂: the Euclidean projection on the simplex, which
   zeroes small noisy cells rather than keeping their positive noise); each edge's table is projected
   likewise and fitted to its two columns' counts by iterative proportional fitting. The tables then
   agree on every column, and the tree model reproduces all of them exactly. Sampling is ancestral,
   from the label down: ``P(child | parent)`` of each edge; a merged value is split by the column's
   one-way shares.

The whole budget is planned before any data is read: with the fractions ``one_way_fraction`` and
``selection_fraction`` of a zCDP-style split (a Gaussian of noise multiplier z is ``1/(2z²)``-zCDP, an
exponential mechanism of parameter ε is ε-bounded range, ``ε²/8``-zCDP), the largest total ρ whose
events keep the accountant's (ε, δ) guarantee within the budget is found by bisection on the project's
accountant; the fit then records exactly the planned events (:class:`~lightning_gpate.privacy.SubsampledGaussianEvent`
with sampling rate 1 is the plain Gaussian mechanism, :class:`~lightning_gpate.privacy.ExponentialMechanismEvent`
each selection). The defaults (two label edges sharing 30% of ρ, the features' one-way marginals 30%,
the other edges' selections 5% and measurements 30%, the class ratio 5%; 10 bins) need no per-dataset
tuning: first chosen on cervical (534 rows, 35 columns) and cardio (56,000 rows, 11 features) at ε ∈ {1, 10}
(label edges 40%, one-way 25%, measurements 25%), then moved to these on a validation split of the training data of
seven development tables (unaccounted tuning): on the private quantile bins, 10 points of ρ from the label edges, 5
to each of the other two, lowered the equal-width 2-way TVD on 12 of 14 (table, ε) cells, within 0.0001 on the other
two (breast cancer at ε = 1 0.478 → 0.449, cervical 0.095 → 0.090), no mean AUROC lower by more than 0.0031. A second
label edge makes the label depend on two features directly (the classifiers trained on the synthetic rows learn from
it): on cardio it raised the mean AUROC from 0.755 to 0.763 at ε = 1 (5 seeds; 2-way TVD 0.015 → 0.019, still below MST's 0.021),
and a third added nothing more. Selections get little: with ``d`` of them they are nearly
random at small ε whatever they get, and every measurement counts.

**Cliques of three columns** (``clique_size: 3``). The same plan (one selection and one measurement per
column) grows a junction tree instead of a tree: from the label, each step attaches a new column ``c`` to a
*separator* ``S`` — one column, or two columns of one clique — and measures the clique ``S ∪ {c}``'s
marginal (a 3-way table where ``S`` has two columns; L2 sensitivity 1 as the tree's edges). The quality is
the tree's with the separator's estimated distribution in place of a column's, less the same expected
measurement error (``√(2/π)·σ·cells``), so a 3-column clique is chosen only where the third column adds
more than its extra cells' noise; the first ``label_edges`` steps attach to separators holding the label
(the label's quality: how much better the new column and ``S`` predict the label than ``S`` alone). The
graph stays chordal with its cliques in running-intersection order, so the estimate stays closed form
(:func:`estimate_cliques`: every clique's table made non-negative and fitted, in order, to its
separator's margin in the earlier clique and to its new column's counts; the joint is the product of the
clique tables over the separator tables, Lauritzen 1996, Prop. 3.19) and sampling is ancestral in the
order of the cliques (:class:`CliqueSampler`). ``clique_size: 2`` is the tree, to the bit.

**The label clique** (``label_clique: "auto"``, the default: from ``AUTO_ROWS_PER_CELL·num_bins³`` noisy rows, 2,000 at
10 bins). With cliques of three, the label steps after the first attach their column to the first label clique's pair
(the label and its first feature), with the label's quality: the label depends on both features jointly, and the
second feature keeps its relation to the first. Two label edges of their own tie the second feature to the label alone;
on a table of correlated counts (baseball's runs batted in, chosen for the home-run label) its relation to the counts
it moves with is then lost (an equal-width two-way TVD of 0.3 on those pairs). Chosen on a validation split of the
training data of seven development tables (unaccounted tuning): on the five of 4,000 rows and more it lowered the
equal-width 2-way TVD on baseball at ε = 1 from 0.064 to 0.049 and on cardio from 0.020 / 0.017 to 0.015 / 0.013 (ε = 1
/ 10), moved the others by at most 0.001, and no mean AUROC by more than 0.007; on the two tables of fewer than 500 rows
it gained nothing (their AUROC moved by as much as two runs of one rule differ there), so the threshold keeps their
structure. The same planned events: the choice costs no privacy.

**The default, ``clique_size: "auto"``**, grows cliques of three columns when the noisy row count ``N̂`` (from the
one-way measurements already paid for: post-processing) reaches ``AUTO_ROWS_PER_CELL`` rows per cell of a
3-way table of three numeric columns (``2·B³`` for the most bins ``B`` of a numeric column: 2,000 rows at 10 bins), and the tree below it. Both
structures record the same planned events, so the choice costs no privacy and the reported ε is the same.
Chosen on a validation split of the training data of issue 59's five development tables (unaccounted tuning;
``benchmarks/results/tabular_utility_notes.md``): cliques of three lowered the 2-way TVD on every (table, ε)
cell of the three tables of 4,000 rows and more (cardio, fair, randhie) and raised it, or the AUROC's spread,
on the two of fewer than 500 (cervical, breast cancer).

Numeric columns are binned on their edges (the DataModule's preprocessing: declared, or private quantiles paid
from the budget, :mod:`lightning_gpate.privacy.quantiles`), each bin an equal part of the generator's space [-1, 1];
a sampled bin is filled evenly there, which the DataModule's decoder turns into its own within-bin scale (log-like
where bins widen: a skewed column's tail). A column without edges is cut into ``num_bins`` equal-width bins of its
declared (public) range. Binary and categorical columns keep their
categories. **Pair groups** (``pair_bins: "auto"``, the default): a numeric column enters the two- and three-way
tables as groups of adjacent bins of about equal mass under its noisy one-way counts (post-processing), as many as
keep a two-way table's mean cell ``PAIR_NOISE_CELLS`` noise deviations (``⌊√(N̂ / (4σ))⌋``); inside a group a
sampled value falls in each bin as the one-way counts say, as in a compressed code. The groups end at the tenths of
the declared range (``pair_tenths``): each tenth takes its share of the groups by its noisy mass, the adjacent
tenths worth less than half a group sharing theirs, so a histogram of the column on its range's tenths keeps each
populated tenth's relation to the other columns. Chosen on a validation split of the training data of seven
development tables (unaccounted tuning): on baseball's 14 correlated counts at ε = 1 the groups took the equal-width
2-way TVD from 0.107 to 0.067, and ending them at the tenths took it on breast cancer at ε = 10 from 0.186 to 0.166
and on cervical at ε = 1 from 0.104 to 0.097; at ε = 10 the groups leave nearly every bin. The generator is a
:class:`TreeSampler`: a deterministic function of a uniform latent vector and the label, so
``generate``/``sample``/checkpoints work as for every other model.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_gpate.models.private import DEFAULT_DELTA, PrivateGenerativeModel, largest_that_fits
from lightning_gpate.privacy import ExponentialMechanismEvent, SubsampledGaussianEvent
from lightning_gpate.privacy.quantiles import RANGE_BINS
from lightning_gpate.privacy.randomness import mechanism_generator

NUMERIC, BINARY, CATEGORICAL = 0, 1, 2
BIN_TOLERANCE = 1e-4  # in bins: the float32 data tensor puts an integer on a bin edge up to ~1e-6 below it
LABEL_PARENT, NO_PARENT = -1, -2
INDEPENDENT_SHARE = 1e-3  # of the independent table mixed into each edge's before IPF (estimate_tree)
MAX_SEPARATOR_CELLS = 1024  # a pair of columns with more values together is no separator: the sampler's tables stay small
AUTO_ROWS_PER_CELL = 2  # clique_size "auto": cliques of 3 from N̂ >= 2·num_bins³ (the module doc)
PAIR_NOISE_CELLS = 4.0  # pair_bins "auto": a two-way table's mean cell at least this many deviations of its noise


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

    def __init__(self, kinds: list[int], cards: list[int], starts: list[int], num_classes: int,
                 integer_bins: list[list[tuple[float, int]]] | None = None) -> None:
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
        # Integer columns: per bin, the generator-space position of its first integer and how many it
        # holds (0: none, the bin is filled uniformly), and one integer's width in generator space: a
        # sampled value is an integer of its own bin, so the decoder's rounding keeps it there.
        first = torch.zeros(n, width, dtype=torch.float64)
        count = torch.zeros(n, width, dtype=torch.long)
        step = torch.zeros(n, dtype=torch.float64)
        for node, grid in enumerate(integer_bins or []):
            if grid is not None:
                step[node] = grid["step"]
                for k, (position, number) in enumerate(grid["bins"]):
                    first[node, k], count[node, k] = position, number
        self.register_buffer("integer_first", first)
        self.register_buffer("integer_count", count)
        self.register_buffer("integer_step", step)

    @staticmethod
    def _value(parent: int, y: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Each row's value of ``parent``: the label, a node's code, or 0 (no parent)."""
        if parent == LABEL_PARENT:
            return y.long()
        if parent == NO_PARENT:
            return torch.zeros(y.shape[0], dtype=torch.long, device=y.device)
        return codes[:, parent]

    def _key(self, node: int, y: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Each row's row of ``node``'s conditional table: its parent's value."""
        return self._value(int(self.parents[node]), y, codes)

    def _rows(self, node: int, y: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Each row's distribution of ``node`` given its parents' values: ``[b, cards[node]]``."""
        return self.cpt[node][self._key(node, y, codes.to(y.device)), :int(self.cards[node])]

    @staticmethod
    def _code(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Inverse CDF: the category of each row whose cumulative probability first exceeds ``u``."""
        cdf = rows.cumsum(1) / rows.sum(1, keepdim=True).clamp_min(1e-300)
        return (u[:, None] > cdf).sum(1).clamp(max=rows.shape[1] - 1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b = z.shape[0]
        u = ((z.double() + 1.0) / 2.0).clamp(0.0, 1.0 - 1e-12)
        codes = torch.zeros(b, self.num_nodes, dtype=torch.long, device=z.device)
        out = torch.zeros(b, self.output_dim, dtype=z.dtype, device=z.device)
        for node in self.order.tolist():
            code = self._code(self._rows(node, y, codes), u[:, 2 * node])
            codes[:, node] = code
            start, kind, card = int(self.starts[node]), int(self.kinds[node]), int(self.cards[node])
            if kind == NUMERIC:
                within = u[:, 2 * node + 1]
                number = self.integer_count[node][code]
                integer = self.integer_first[node][code] + torch.floor(within * number) * self.integer_step[node]
                value = torch.where(number > 0, integer, -1.0 + (code.double() + within) * 2.0 / card)
                out[:, start] = value.to(out.dtype)
            elif kind == BINARY:
                out[:, start] = (2.0 * code - 1.0).to(out.dtype)
            else:
                out[torch.arange(b, device=z.device), start + code] = 1.0
        return out

    @torch.no_grad()
    def stratified_latent(self, y: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Latent vectors (float64) for the labels ``y`` whose ancestral draws are stratified: among the
        rows that share a node's parent value, the node's uniforms are ``(i + U_i)/m`` in random order,
        so every conditional table is met to within a row per group rather than with the binomial
        noise of independent draws (randomized rounding, as private-pgm's ``synthetic_data`` does; a
        function of the released tables and fresh randomness only). Within-bin positions stay iid."""
        y = y.long().cpu()
        b = y.shape[0]
        u = torch.rand(b, 2 * self.num_nodes, generator=generator, dtype=torch.float64)
        codes = torch.zeros(b, self.num_nodes, dtype=torch.long)
        cpu = self if self.cpt.device.type == "cpu" else copy.deepcopy(self).cpu()
        for node in cpu.order.tolist():
            key = cpu._key(node, y, codes)
            column = u[:, 2 * node]
            for value in key.unique().tolist():
                idx = (key == value).nonzero().squeeze(1)
                m = len(idx)
                column[idx] = (torch.randperm(m, generator=generator).double()
                               + torch.rand(m, generator=generator, dtype=torch.float64)) / m
            u[:, 2 * node] = column.clamp(0.0, 1.0 - 1e-12)
            codes[:, node] = cpu._code(cpu._rows(node, y, codes), u[:, 2 * node])
        return u * 2.0 - 1.0


class CliqueSampler(TreeSampler):
    """Ancestral sampler of a junction tree of cliques of up to three columns (``clique_size: 3``).

    Like :class:`TreeSampler`, but a node may have two parents (``parents`` and ``parents2``: the
    separator its clique shares with the junction tree, the label among them possibly): row
    ``value(parents) · card(parents2) + value(parents2)`` of ``cpt[node]`` is ``P(node | separator)`` (a pair
    separator holds at most ``MAX_SEPARATOR_CELLS`` values, so a column of many categories keeps the tables small).
    """

    def __init__(self, kinds: list[int], cards: list[int], starts: list[int], num_classes: int,
                 integer_bins: list[list[tuple[float, int]]] | None = None) -> None:
        super().__init__(kinds, cards, starts, num_classes, integer_bins)
        width = max(max(cards, default=1), num_classes, 1)
        self.register_buffer("parents2", torch.full((len(kinds),), NO_PARENT, dtype=torch.long))
        rows = max(width, min(width * width, MAX_SEPARATOR_CELLS))
        self.register_buffer("cpt", torch.zeros(len(kinds), rows, width, dtype=torch.float64))

    def _key(self, node: int, y: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        first, second = int(self.parents[node]), int(self.parents2[node])
        if second == NO_PARENT:
            return super()._key(node, y, codes)
        card = self.num_classes if second == LABEL_PARENT else int(self.cards[second])
        return self._value(first, y, codes) * card + self._value(second, y, codes)


# ============================================================================ the model
class MarginalTree(PrivateGenerativeModel):
    """DP synthesizer of tables: every column's noisy marginals on a spanning tree, sampled as a graphical model (MST's
    recipe, McKenna, Miklau & Sheldon 2021). Tables only; one fit reads the data once and takes about a second.

    The DataModule serves the whole training split as one batch (``num_teachers: 0``); the
    fit reads it once, records its planned events, and stops: the budget is then spent (a second fit
    refuses, as for every private model). The module doc has the algorithm.

    Args:
        data_spec: the DataModule's spec (tabular).
        epsilon: the privacy budget ε.
        delta: δ of the (ε, δ) guarantee.
        budget_accounting: "guarantee", the only analysis of its Gaussian and exponential mechanisms ("paper" is
            refused).
        conversion: RDP to (ε, δ) conversion.
        num_bins: equal-width bins of the declared range of a numeric column without edges. A column with edges
            (declared, or the DataModule's private quantiles) is binned on them.
        label_edges: the tree's first edges, chosen among the label's pairs. The rest of the tree is chosen among all
            pairs; more than the number of features means every feature.
        label_fraction: share of the planned ρ for the label's one-way marginal (the class ratio).
        label_edge_fraction: share of the planned ρ for the label_edges. Half for their selections and half for their
            measurements, split equally among them.
        one_way_fraction: share of the planned ρ for the features' one-way marginals.
        selection_fraction: share of the planned ρ for the other edges' selections (split equally). The rest measures
            their two-way marginals.
        compress: merge the values of a column whose noisy one-way count is below 3σ (MST).
        pair_bins: at most this many codes of a numeric column in the two- and three-way tables: its adjacent bins
            joined into groups of about equal measured mass, each filled as its bins' one-way counts say; "auto" as
            many (default) as keep a two-way table's mean cell ``PAIR_NOISE_CELLS`` deviations of its noise
            (``√(N̂ / (PAIR_NOISE_CELLS·σ))``: fewer at a small ε or on few rows); null every bin.
        pair_tenths: whether the pair groups (``pair_bins``) end at the tenths of the column's declared range (default):
            each tenth takes its share of the groups by its noisy mass (a dense tenth split by mass, adjacent tenths
            worth less than half a group sharing theirs), so no group joins the bins of two tenths that hold data (an
            equal-width view of the column keeps its cells apart); false: groups of equal mass across the range.
        label_clique: whether the label steps after the first extend the first label clique (cliques of 3 only): the label
            and its features are measured in one table, so a feature the label steps choose keeps its relation to the
            first (two label edges of their own leave it tied to the label alone, its relation to the other columns
            lost); "auto" (default): from ``AUTO_ROWS_PER_CELL·num_bins³`` noisy rows (2,000 at 10 bins), where the
            other pairs' quality is measured well enough to place the label's features too; false below.
        clique_size: 2 (a spanning tree), 3 (a junction tree) or "auto". 2: two-way marginals; 3: cliques of up to
            three columns (three-way marginals where they pay for their noise; _select_cliques); "auto" (default): 3
            when the noisy row count reaches 2·B³ (B: a numeric column's most bins), else 2 (the module doc). The
            width a fit used is the buffer clique_size_chosen.
        noise_seed: seed of the mechanisms' randomness, for tests only (null: secret, from the OS).
    """

    single_process_only = "it reads the whole training split once, in one step: more processes would not speed it up"
    HAS_PAPER_ANALYSIS = False  # Gaussian and exponential mechanisms: their RDP is the only analysis
    # A release saved before an option existed was made with these values (the sampler's shape depends on clique_size)
    DEFAULTS_BEFORE = {"clique_size": 2, "pair_bins": None, "pair_tenths": False, "label_clique": False}

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float = DEFAULT_DELTA,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        num_bins: int = 10,
        label_edges: int = 2,
        label_fraction: float = 0.05,
        label_edge_fraction: float = 0.3,
        one_way_fraction: float = 0.3,
        selection_fraction: float = 0.05,
        compress: bool = True,
        clique_size: int | str = "auto",
        pair_bins: int | str | None = "auto",
        pair_tenths: bool = True,
        label_clique: bool | str = "auto",
        noise_seed: int | None = None,
    ) -> None:
        if data_spec.get("kind") != "tabular":
            raise ValueError("MarginalTree models tables; use a GAN-based model for images")
        if int(num_bins) != num_bins or num_bins < 2:
            raise ValueError(f"num_bins must be an integer >= 2, got {num_bins}")
        columns = data_spec["columns"]
        if int(label_edges) != label_edges or label_edges < 0:
            raise ValueError(f"label_edges must be an integer >= 0, got {label_edges}")
        label_edges = min(int(label_edges), len(columns))  # more than the features: every feature
        fractions = {"label_fraction": label_fraction, "one_way_fraction": one_way_fraction,
                     "label_edge_fraction": label_edge_fraction, "selection_fraction": selection_fraction}
        if not (all(0 <= f < 1 for f in fractions.values()) and label_fraction > 0 and one_way_fraction > 0
                and sum(fractions.values()) < 1 and (label_edge_fraction > 0) == (label_edges > 0)
                and (selection_fraction > 0 or label_edges == len(columns))):
            raise ValueError(f"the fractions must be in [0, 1) with a sum < 1 (the rest measures the tree's other edges), "
                             f"label_fraction > 0, one_way_fraction > 0, label_edge_fraction > 0 exactly when label_edges > 0, "
                             f"and selection_fraction > 0 when edges are left to select; got {fractions} with label_edges={label_edges}")
        if pair_bins is not None and pair_bins != "auto" and (isinstance(pair_bins, bool) or not isinstance(pair_bins, int) or pair_bins < 2):
            raise ValueError(f"pair_bins must be an integer >= 2, 'auto' (from the measurements' noise) or null (every bin), "
                             f"got {pair_bins!r}")
        if label_clique not in (True, False, "auto"):
            raise ValueError(f"label_clique must be true, false or 'auto' (true from {AUTO_ROWS_PER_CELL}·num_bins³ rows, "
                             f"counted with noise), got {label_clique!r}")
        if clique_size not in (2, 3, "auto"):
            raise ValueError(f"clique_size must be 2 (a tree), 3 (cliques of up to three columns) or 'auto' (3 from "
                             f"{AUTO_ROWS_PER_CELL}·num_bins³ rows, counted with noise), got {clique_size!r}")
        if not columns:
            raise ValueError("MarginalTree needs at least one feature column beside the label")
        kinds = [NUMERIC if c["type"] == "numeric" else BINARY if c["type"] == "binary" else CATEGORICAL for c in columns]
        cards = column_cards(data_spec, int(num_bins))
        with warnings.catch_warnings():  # the class ratio is measured with DP here: no need to warn about it
            warnings.filterwarnings("ignore", message="the class ratio was read from the private data")
            super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
                             conversion=conversion, z_dim=2 * len(columns), latent_prior="uniform")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.train_sampling = {"kind": "full"}
        starts = [int(s[0]) for s in data_spec["spans"]]
        sampler = TreeSampler if clique_size == 2 else CliqueSampler  # "auto": a CliqueSampler holds a tree too
        self.generator = sampler(kinds, cards, starts, self.num_classes,
                                     [_integer_grid(c, int(num_bins)) if k == NUMERIC else None for k, c in zip(kinds, columns)])
        self.num_edges = len(columns)  # a spanning tree of the d features and the label
        self.label_edges = label_edges
        self.plan = self.plan_budget()
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self.register_buffer("clique_size_chosen", torch.zeros((), dtype=torch.long))  # 0 until fitted

    # ----------------------------------------------------------------- budget planning
    def planned_events(self, rho: float) -> dict[str, Any]:
        """The events of a fit with total zCDP budget ``rho``: ``label`` (a Gaussian on the label's
        histogram, sensitivity 1), ``one_way`` (one Gaussian on the ``d`` feature histograms, noise
        multiplier relative to their L2 sensitivity √d), then per edge in selection order ``select``
        (the exponential mechanism) and ``measure`` (a Gaussian of sensitivity 1): the first
        ``label_edges`` with ``label_edge_fraction`` of ρ, the others with the rest."""
        hp = self.hparams
        labelled, others = self.label_edges, self.num_edges - self.label_edges

        def gaussian(share: float) -> SubsampledGaussianEvent:  # 1/(2z²)-zCDP; rate 1: the plain Gaussian
            return SubsampledGaussianEvent(noise_multiplier=math.sqrt(1.0 / (2.0 * share * rho)), sampling_rate=1.0)

        def selection(share: float) -> ExponentialMechanismEvent:  # ε-bounded range is ε²/8-zCDP: ε = √(8ρ)
            return ExponentialMechanismEvent(math.sqrt(8.0 * share * rho), "edge selection")

        rest = 1.0 - hp.label_fraction - hp.one_way_fraction - hp.label_edge_fraction - hp.selection_fraction
        select, measure = [], []
        for e in range(self.num_edges):
            if e < labelled:
                select.append(selection(hp.label_edge_fraction / 2 / labelled))
                measure.append(gaussian(hp.label_edge_fraction / 2 / labelled))
            else:
                select.append(selection(hp.selection_fraction / others))
                measure.append(gaussian(rest / others))
        return {"label": gaussian(hp.label_fraction), "one_way": gaussian(hp.one_way_fraction), "select": select, "measure": measure}

    def _event_list(self, events: dict[str, Any]) -> list:
        return [events["label"], events["one_way"]] + list(events["select"]) + list(events["measure"])

    def planned_event_list(self) -> list:
        """Every event a fit records (a public function of the schema and the budget; a warm start from this model
        charges them in its own accountant, :mod:`~lightning_gpate.models.warm_start`)."""
        return self._event_list(self.planned_events(self.plan["rho"]))

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
        ``epsilon_select`` and ``sigma_two_way`` (per cell) of the ordinary edges, and
        ``epsilon_select_label`` and ``sigma_label_edge`` of the first ``label_edges``."""
        rho = largest_that_fits(self._fits, f"the marginals within ε={self.epsilon_budget:g}")
        events = self.planned_events(rho)
        d = len(self.data_spec["columns"])
        plan = {"rho": rho, "sigma_label": events["label"].noise_multiplier, "sigma_one_way": events["one_way"].noise_multiplier * math.sqrt(d)}
        if self.label_edges:
            plan.update(epsilon_select_label=events["select"][0].epsilon, sigma_label_edge=events["measure"][0].noise_multiplier)
        if self.label_edges < self.num_edges:
            plan.update(epsilon_select=events["select"][-1].epsilon, sigma_two_way=events["measure"][-1].noise_multiplier)
        return plan

    # ----------------------------------------------------------------- data in codes
    def encode(self, x: torch.Tensor) -> np.ndarray:
        """Rows in the generator's space → ``[n, d]`` category codes (bins for numeric columns)."""
        return column_codes(x, self.data_spec, int(self.hparams.num_bins))

    # ----------------------------------------------------------------- training
    def configure_optimizers(self):
        return []  # it fits by measuring, not by steps: no optimizer (None would make Lightning warn of a mistake)

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
        width = int(self.clique_size_chosen)
        self.print(f"MarginalTree structure: {'a tree (cliques of 2 columns)' if width == 2 else 'cliques of up to 3 columns'}"
                   + (" (clique_size auto: from the noisy row count)" if self.hparams.clique_size == "auto" else ""))
        if self.logger is not None:  # a function of the noisy row count: post-processing
            self.logger.log_hyperparams({"structure/clique_size_chosen": width})
        self.budget_exhausted = True
        self.stop_reason = f"all planned marginals measured: the budget is spent (epsilon={self.spent_epsilon():.4f})"
        if self._trainer is not None:
            self.trainer.should_stop = True
        return None

    def _pay(self, event) -> None:
        if not self.charge(event):  # the plan fits the budget by construction
            raise RuntimeError(f"MarginalTree's planned event does not fit the budget: {self.stop_reason}")

    def fit_marginals(self, codes: np.ndarray, labels: np.ndarray) -> None:
        """Measure, select and estimate the tree from the private ``codes`` ``[n, d]`` and ``labels``."""
        g, plan, k = self.generator, self.plan, self.num_classes
        gen = mechanism_generator("cpu", self.hparams.noise_seed)
        cards = g.cards.tolist() + [k]
        d = len(cards) - 1
        label = d  # the label is node d of the tree
        data = np.concatenate([codes, labels[:, None]], axis=1)
        events = self.planned_events(plan["rho"])

        def noise(shape, sigma: float) -> np.ndarray:
            return (torch.randn(shape, generator=gen, dtype=torch.float64) * sigma).numpy()

        # 1. one-way marginals: the label (sensitivity 1), the features (one Gaussian of sensitivity √d).
        self._pay(events["label"])
        self._pay(events["one_way"])
        sigma1 = [plan["sigma_one_way"]] * d + [plan["sigma_label"]]
        one_way = [np.bincount(data[:, v], minlength=cards[v]) + noise(cards[v], sigma1[v]) for v in range(d + 1)]
        totals = [(y.sum(), len(y) * s ** 2) for y, s in zip(one_way, sigma1)]
        n_hat = _inverse_variance(totals)
        # Post-processing of the noisy one-way counts: a numeric column's adjacent bins grouped (pair_bins), then
        # domain compression: codes below 3σ of their noise share one code.
        groups = self.pair_groups(one_way, n_hat)
        merges = []
        for y, group, s in zip(one_way, groups, sigma1):
            size = np.bincount(group)
            merges.append((_compression(np.bincount(group, weights=y), 3.0 * s * np.sqrt(size)) if self.hparams.compress
                           else np.arange(len(size)))[group])
        ccards = [int(m.max()) + 1 for m in merges]
        cdata = np.stack([merges[v][data[:, v]] for v in range(d + 1)], axis=1)
        one_way_c = [np.bincount(merges[v], weights=one_way[v], minlength=ccards[v]) for v in range(d + 1)]
        one_way_var = [np.bincount(merges[v], minlength=ccards[v]) * sigma1[v] ** 2 for v in range(d + 1)]
        p_hat = [_simplex(y, 1.0) if n_hat > 0 else np.full(len(y), 1.0 / len(y)) for y in (c / max(n_hat, 1e-12) for c in one_way_c)]

        sigmas = [e.noise_multiplier for e in events["measure"]]
        width = self.clique_width(n_hat)
        if width == 3:
            # 2-3. a junction tree of cliques of up to 3 columns grown from the label, each measured as selected.
            cliques, tables = self._select_cliques(cdata, ccards, p_hat, n_hat, events, gen, noise)
            # 4. estimation (post-processing): a function of the noisy measurements and public noise scales only.
            n_hat, counts, fitted = estimate_cliques(one_way_c, one_way_var, tables, sigmas, cliques, one_way_totals=totals)
        else:
            edges = self._select_tree(cdata, ccards, p_hat, n_hat, events, gen)
            # 3. two-way marginals of the edges.
            two_way = []
            for (a, b), event in zip(edges, events["measure"]):
                self._pay(event)
                two_way.append(_joint(cdata[:, a], cdata[:, b], ccards[a], ccards[b]) + noise((ccards[a], ccards[b]), event.noise_multiplier))
            # 4. estimation (post-processing): a function of the noisy measurements and public noise scales only.
            n_hat, counts, tables = estimate_tree(one_way_c, one_way_var, two_way, sigmas, edges, one_way_totals=totals)
            # The tree rooted at the label: each column's clique is its parent's edge.
            neighbours = {v: [] for v in range(d + 1)}
            for a, b in edges:
                neighbours[a].append(b)
                neighbours[b].append(a)
            cliques, fitted, queue, seen = [], [], [label], {label}
            while queue:
                v = queue.pop(0)
                for c in neighbours[v]:
                    if c not in seen:
                        seen.add(c)
                        queue.append(c)
                        cliques.append(((v,), c))
                        fitted.append(tables[(v, c)])

        # The sampler's conditional tables, back to the original values (a merged value split by its one-way shares).
        within = [_within_shares(one_way[v], merges[v]) for v in range(d + 1)]
        parent = [NO_PARENT] * d
        p_label = (counts[label] / counts[label].sum())[merges[label]] * within[label]
        with torch.no_grad():
            g.cpt.zero_()
            for (separator, c), table in zip(cliques, fitted):
                conditional = _conditional(table, counts[c], [merges[v] for v in separator], merges[c], within[c])
                g.cpt[c, :conditional.shape[0], :cards[c]] = torch.from_numpy(conditional)
                parents = [LABEL_PARENT if v == label else v for v in separator]
                parent[c] = parents[0]
                if len(parents) > 1:
                    g.parents2[c] = parents[1]
            g.parents.copy_(torch.tensor(parent, dtype=torch.long))
            g.order.copy_(torch.tensor([c for _, c in cliques] if width == 3 else _topological(parent), dtype=torch.long))
            g.label_ratio.copy_(torch.from_numpy(p_label / p_label.sum()).float())
            self.fitted.fill_(True)
            self.clique_size_chosen.fill_(width)

    def clique_width(self, n_hat: float) -> int:
        """The cliques' width of a fit: ``clique_size``, or for ``"auto"`` 3 when the noisy row count ``n_hat``
        reaches ``AUTO_ROWS_PER_CELL·B³`` (``B``: a numeric column's most codes in the tables, :meth:`pair_codes`) and 2
        below (a function of a released count: post-processing)."""
        size = self.hparams.clique_size
        if size != "auto":
            return int(size)
        groups = self.pair_codes(n_hat)
        bins = [min(numeric_bins(c, int(self.hparams.num_bins)), groups or math.inf) for c in self.data_spec["columns"]
                if c["type"] == "numeric"]
        return 3 if n_hat >= AUTO_ROWS_PER_CELL * max(bins, default=int(self.hparams.num_bins)) ** 3 else 2

    def joins_label_clique(self, n_hat: float) -> bool:
        """Whether the label steps after the first extend the first label clique (``label_clique``; cliques of 3 only):
        for ``"auto"``, when the noisy row count ``n_hat`` reaches ``AUTO_ROWS_PER_CELL·num_bins³`` (a function of a
        released count: post-processing)."""
        joint = self.hparams.label_clique
        return n_hat >= AUTO_ROWS_PER_CELL * int(self.hparams.num_bins) ** 3 if joint == "auto" else bool(joint)

    def pair_codes(self, n_hat: float) -> int | None:
        """The most codes of a numeric column in the two- and three-way tables (``pair_bins``; ``None``: every bin). For
        ``"auto"``, ``⌊√(N̂ / (PAIR_NOISE_CELLS·σ))⌋`` (at least 2) for the noise ``σ`` of an ordinary edge's cells: a
        two-way table of two such columns then holds ``PAIR_NOISE_CELLS`` noise deviations a cell on average (a function
        of a released count and the public plan: post-processing)."""
        bins = self.hparams.pair_bins
        if bins != "auto":
            return bins
        sigma = self.plan.get("sigma_two_way", self.plan.get("sigma_label_edge", 1.0))
        return max(2, int(math.sqrt(max(n_hat, 0.0) / (PAIR_NOISE_CELLS * sigma))))

    def pair_groups(self, one_way: list[np.ndarray], n_hat: float) -> list[np.ndarray]:
        """Per column (the label last), the map of its values to their groups in the tables: a numeric column of more
        bins than :meth:`pair_codes` has its adjacent bins joined into about that many groups of about equal mass under
        its noisy one-way counts, within the tenths of its declared range (``pair_tenths``: :func:`sparse_runs`,
        :func:`groups_within`; post-processing of the counts and the public edges); other columns keep theirs."""
        most = self.pair_codes(n_hat)
        columns, num_bins = self.data_spec["columns"], int(self.hparams.num_bins)
        out = []
        for v, y in enumerate(one_way):
            numeric = v < len(columns) and columns[v]["type"] == "numeric"
            if not (numeric and most is not None and len(y) > most):
                out.append(np.arange(len(y)))
            elif self.hparams.pair_tenths:
                out.append(groups_within(y, sparse_runs(y, range_tenths(columns[v], num_bins), most), most))
            else:
                out.append(adjacent_groups(y, most))
        return out

    def _select_tree(self, cdata: np.ndarray, ccards: list[int], p_hat: list[np.ndarray], n_hat: float,
                     events: dict[str, Any], gen: torch.Generator) -> list[tuple[int, int]]:
        """The spanning tree's edges (step 2 of the module doc): the exponential mechanism on AIM's quality,
        the label's pairs first, then Kruskal (only pairs joining two components)."""
        d = len(ccards) - 1
        label = d
        sigmas = [e.noise_multiplier for e in events["measure"]]
        component = list(range(d + 1))

        def root(v: int) -> int:
            while component[v] != v:
                component[v] = component[component[v]]
                v = component[v]
            return v

        edges: list[tuple[int, int]] = []
        for e in range(self.num_edges):
            label_only = e < self.label_edges
            pairs = [(a, b) for a in range(d + 1) for b in range(a + 1, d + 1)
                     if root(a) != root(b) and (not label_only or b == label)]
            qualities = []
            for a, b in pairs:
                true = _joint(cdata[:, a], cdata[:, b], ccards[a], ccards[b])
                if label_only:  # vs the true feature counts split by the noisy class ratio: robust to the features' noise
                    error = np.abs(true - np.outer(true.sum(1), p_hat[label])).sum()
                else:
                    error = np.abs(true - n_hat * np.outer(p_hat[a], p_hat[b])).sum()
                qualities.append(error - math.sqrt(2 / math.pi) * sigmas[e] * ccards[a] * ccards[b])
            self._pay(events["select"][e])
            # Sensitivity: 1 against the noisy one-way model; 2 for the label's pairs, where a record moves
            # its cell (1) and its feature value's count, times class shares summing to 1 (1).
            a, b = pairs[_exponential_mechanism(np.array(qualities), events["select"][e].epsilon, gen,
                                                sensitivity=2.0 if label_only else 1.0)]
            edges.append((a, b))
            component[root(a)] = root(b)
        return edges

    def _select_cliques(self, cdata: np.ndarray, ccards: list[int], p_hat: list[np.ndarray], n_hat: float,
                        events: dict[str, Any], gen: torch.Generator, noise) -> tuple[list, list[np.ndarray]]:
        """A junction tree of cliques of up to 3 columns, grown from the label (``clique_size: 3``).

        Each step attaches one new column ``c`` to a *separator* ``S`` of the graph so far (one column, or
        two columns of one clique: the clique ``S ∪ {c}`` keeps the graph chordal and the cliques in
        running-intersection order, which is what makes the estimate closed-form) with the exponential
        mechanism, then measures the clique's marginal with the Gaussian mechanism (sensitivity 1): the
        tree's events, one selection and one measurement per column, so the same plan. Qualities are the
        tree's, with the separator's estimated distribution ``P̂_S`` (from the noisy measurement of the
        clique it came from: post-processing) in place of a column's: AIM's
        ``‖n(S, c) − N̂·P̂_S ⊗ P̂_c‖₁ − √(2/π)·σ·cells(S, c)`` (sensitivity 1; the cells term makes a
        3-column clique win only where the third column adds more than its extra noise), and for the
        first ``label_edges`` steps, among separators holding the label (after the first step, with ``label_clique``,
        the first label clique's pair only),
        ``Σ |n(S', c, y) − n(S', c)·P̂(y | S')|`` (``S' = S ∖ {label}``; sensitivity 2, as the tree's label
        quality, which it is when ``S`` is the label alone).

        Returns:
            ``(cliques, tables)``: ``[(separator, column)]`` in the order chosen (every feature once), and
            each clique's noisy counts, axes ``(*separator, column)`` in compressed codes.
        """
        d = len(ccards) - 1
        label = d
        shares = {(label,): p_hat[label]}  # each separator's estimated distribution, axes in its order
        placed, cliques, tables, cached, first = {label}, [], [], {}, None
        for e in range(self.num_edges):
            label_only, sigma = e < self.label_edges, events["measure"][e].noise_multiplier
            joint = label_only and e > 0 and first in shares and self.joins_label_clique(n_hat)
            candidates = [(sep, c) for sep in shares if (sep == first if joint else not label_only or label in sep)
                          for c in range(d) if c not in placed]
            qualities = []
            for sep, c in candidates:
                cells = math.prod(ccards[v] for v in (*sep, c))
                if label_only:
                    rest = tuple(v for v in sep if v != label)
                    true = _joint_of(cdata, (*rest, c, label), ccards)
                    given = np.moveaxis(shares[sep], sep.index(label), -1)  # P̂(S', y)
                    given = np.where(given.sum(-1, keepdims=True) > 0, given, p_hat[label])
                    given = given / given.sum(-1, keepdims=True)
                    error = np.abs(true - true.sum(-1, keepdims=True) * np.expand_dims(given, -2)).sum()
                else:  # fixed once the separator exists: computed once
                    if (sep, c) not in cached:
                        true = _joint_of(cdata, (*sep, c), ccards)
                        cached[(sep, c)] = np.abs(true - n_hat * np.multiply.outer(shares[sep], p_hat[c])).sum()
                    error = cached[(sep, c)]
                qualities.append(error - math.sqrt(2 / math.pi) * sigma * cells)
            self._pay(events["select"][e])
            sep, c = candidates[_exponential_mechanism(np.array(qualities), events["select"][e].epsilon, gen,
                                                       sensitivity=2.0 if label_only else 1.0)]
            self._pay(events["measure"][e])
            members = (*sep, c)
            table = _joint_of(cdata, members, ccards) + noise(tuple(ccards[v] for v in members), sigma)
            cliques.append((sep, c))
            tables.append(table)
            placed.add(c)
            if e == 0:  # the first label clique's pair: the separator of the later label steps (label_clique)
                first = tuple(sorted((label, c)))
            # New separators: the column alone (its noisy one-way shares) and, in a clique of 3, each
            # pair with it (the clique's noisy table summed to the pair, projected on the simplex).
            shares[(c,)] = p_hat[c]
            cards = self.generator.cards.tolist() + [self.num_classes]
            for v in (v for v in sep if cards[v] * cards[c] <= MAX_SEPARATOR_CELLS):
                pair = tuple(sorted((v, c)))
                drop = tuple(i for i, u in enumerate(members) if u not in pair)
                marginal = table.sum(drop) if drop else table
                marginal = marginal if members.index(pair[0]) < members.index(pair[1]) else marginal.T
                shares[pair] = _simplex(marginal.ravel() / max(n_hat, 1e-12), 1.0).reshape(marginal.shape)
        return cliques, tables

    def sample_labels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Labels from the declared class ratio if it is public or paid for, else from the ratio the
        fit measured (the generator's ``label_ratio``), else uniform (before a fit); stratified (each
        class within one of ``n`` times its share, in random order)."""
        ratio = self.class_ratio
        if self.data_spec.get("class_ratio_source") not in ("public", "dp") and float(self.generator.label_ratio.sum()) > 0:
            ratio = self.generator.label_ratio
        cdf = (ratio.double().cpu().cumsum(0) / ratio.double().sum()).clamp(max=1.0)
        u = (torch.randperm(n, generator=generator).double() + torch.rand(n, generator=generator, dtype=torch.float64)) / max(n, 1)
        return torch.searchsorted(cdf, u, right=True).clamp(max=len(ratio) - 1).to(self.device)

    @torch.no_grad()
    def generate(self, n: int, labels: torch.Tensor | None = None, *, batch_size: int = 100_000, seed: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` rows in the generator's space and their labels, drawn with stratification
        (:meth:`TreeSampler.stratified_latent`; chunks of ``batch_size`` rows stratified separately)."""
        if n < 1:
            raise ValueError(f"number of samples must be >= 1, got {n}")
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        if labels is None:
            labels = self.sample_labels(n, generator=gen)
        out = []
        for y in labels.cpu().split(batch_size):
            z = self.generator.stratified_latent(y, generator=gen)
            out.append(self.generator(z.to(self.device), y.to(self.device)).float().cpu())
        return torch.cat(out), labels.cpu()

    # ----------------------------------------------------------------- reporting
    def work_done(self) -> str | None:
        """What a fit did, for its summary in place of a count of steps (it takes none): public facts only (the
        schema's columns, the structure's width, a function of the noisy row count). ``None`` before the fit."""
        if not self.budget_exhausted:
            return None
        width = int(self.clique_size_chosen)
        structure = "a tree of two-way marginals" if width == 2 else "a junction tree of up to three-way marginals"
        return (f"measured the marginals of {len(self.data_spec['columns']) + 1} columns (the label included) "
                f"on {structure}, reading the data once,")

    def tree_edges(self) -> list[tuple[str, str]]:
        """The tree's edges as (parent, child) column names (the label's name for the root)."""
        names = [c["name"] for c in self.data_spec["columns"]]
        label = self.data_spec["label"]["name"]
        return [(label if p == LABEL_PARENT else names[p], names[c])
                for c, p in enumerate(self.generator.parents.tolist()) if p != NO_PARENT]



def estimate_tree(one_way: list[np.ndarray], one_way_var: list[np.ndarray], two_way: list[np.ndarray],
                  sigmas: list[float], edges: list[tuple[int, int]], *,
                  one_way_totals: list[tuple[float, float]]) -> tuple[float, list[np.ndarray], dict]:
    """The consistent tree model of noisy measurements: :func:`estimate_cliques` with one edge a clique.

    Args:
        one_way: noisy (compressed) one-way counts per column.
        one_way_var: their noise variances per cell.
        two_way: noisy two-way counts per edge, ``[c_a, c_b]`` for edge ``(a, b)``.
        sigmas: the Gaussian noise std of each edge's measurement.
        edges: the tree's edges ``(a, b)``, columns indexed as in ``one_way``.
        one_way_totals: ``(sum, variance)`` of each uncompressed one-way measurement.

    Returns:
        ``(N̂, counts, tables)``: the total, every column's counts, and ``tables[(a, b)]`` (and its transpose
        at ``(b, a)``) for every edge, non-negative, summing to ``N̂``, with margins ``counts[a]``, ``counts[b]``.
    """
    n_hat, counts, fitted = estimate_cliques(one_way, one_way_var, two_way, sigmas, [((a,), b) for a, b in edges],
                                             one_way_totals=one_way_totals)
    tables = {}
    for (a, b), table in zip(edges, fitted):
        tables[(a, b)], tables[(b, a)] = table, table.T
    return n_hat, counts, tables


def estimate_cliques(one_way: list[np.ndarray], one_way_var: list[np.ndarray], measured: list[np.ndarray],
                     sigmas: list[float], cliques: list[tuple[tuple[int, ...], int]], *,
                     one_way_totals: list[tuple[float, float]]) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """The consistent junction-tree model of noisy measurements (post-processing: reads no private data).

    For cliques in running-intersection order (each ``S ∪ {c}`` adds the column ``c`` to a separator ``S``
    inside an earlier clique, or ``S`` a single column), tables that are non-negative, share one total and
    agree on every separator are the marginals of one distribution, ``Π P(clique) / Π P(separator)``
    (Lauritzen 1996, Prop. 3.19), which ancestral sampling of ``P(c | S)`` in clique order reproduces
    exactly: no iterative inference. This finds such tables close to the measurements: the total ``N̂``
    is the inverse-variance mean of every measurement's sum; every column's counts the inverse-variance
    mean of its one-way measurement and of its cliques' margins (a margin of a table of ``m`` cells has
    variance ``m / c_v·σ²`` per cell), projected on ``{x ≥ 0, Σx = N̂}``; every clique's table, in order,
    projected likewise (as a ``[cells(S), c_c]`` matrix) and fitted by IPF to the separator's margin
    (the column's counts, or the earlier clique's table summed to ``S``) and to ``c``'s counts. For a
    tree (every separator one column) this is MST's consistent tree.

    Args:
        one_way: noisy (compressed) one-way counts per column.
        one_way_var: their noise variances per cell.
        measured: noisy counts per clique, axes ``(*separator, column)``.
        sigmas: the Gaussian noise std of each clique's measurement.
        cliques: ``(separator, column)`` per clique, columns indexed as in ``one_way``.
        one_way_totals: ``(sum, variance)`` of each uncompressed one-way measurement.

    Returns:
        ``(N̂, counts, tables)``: the total, every column's counts, and every clique's table (axes as
        measured), non-negative, summing to ``N̂``, agreeing with ``counts`` and with each other.
    """
    totals = list(one_way_totals) + [(t.sum(), t.size * s ** 2) for t, s in zip(measured, sigmas)]
    n_hat = max(_inverse_variance(totals), 1.0)
    members = [(*sep, c) for sep, c in cliques]
    counts = []
    for v in range(len(one_way)):
        estimates = [(one_way[v], one_way_var[v])]
        for clique, table, s in zip(members, measured, sigmas):
            if v in clique:
                axis = clique.index(v)
                other = table.size // table.shape[axis]
                estimates.append((table.sum(tuple(i for i in range(table.ndim) if i != axis)), np.full(len(one_way[v]), other * s ** 2)))
        counts.append(_simplex(_inverse_variance_vector(estimates), n_hat))
    tables: list[np.ndarray] = []
    for (sep, c), table in zip(cliques, measured):
        if len(sep) == 1:
            margin = counts[sep[0]]
        else:  # the earlier clique holding the separator, summed to it (in the separator's order)
            i = next(i for i, m in enumerate(members) if set(sep) <= set(m))
            kept = [a for a, v in enumerate(members[i]) if v in sep]
            margin = tables[i].sum(tuple(a for a in range(tables[i].ndim) if a not in kept))
            order = [members[i][a] for a in kept]
            margin = np.transpose(margin, [order.index(v) for v in sep]).ravel()
        matrix = table.reshape(-1, table.shape[-1])
        fitted = _simplex(matrix.ravel(), n_hat).reshape(matrix.shape)
        # a little of the independent table so that IPF can reach every count the columns have; 0.1%: at 1%
        # the pull towards independence was most of an edge's error on cardio (split seed 0, mean TVD of the
        # edge tables from the true ones 0.0013 at ε = 10, 0.0029 at ε = 1; at 0.1%: 0.0005, 0.0024)
        fitted = (1.0 - INDEPENDENT_SHARE) * fitted + INDEPENDENT_SHARE * np.outer(margin, counts[c]) / n_hat
        tables.append(_ipf(fitted, margin, counts[c]).reshape(table.shape))
    return n_hat, counts, tables


def _joint_of(data: np.ndarray, columns: tuple[int, ...], cards: list[int]) -> np.ndarray:
    """The histogram of ``data``'s code ``columns``, axes in their order (:func:`_joint` for any number)."""
    shape = tuple(cards[v] for v in columns)
    flat = np.ravel_multi_index(tuple(data[:, v] for v in columns), shape)
    return np.bincount(flat, minlength=math.prod(shape)).reshape(shape).astype(np.float64)


def _conditional(table: np.ndarray, counts: np.ndarray, separator_merges: list[np.ndarray], merge: np.ndarray,
                 within: np.ndarray) -> np.ndarray:
    """``P(column | separator)`` of a clique's table (axes ``(*separator, column)``, compressed codes),
    back to the original values: ``[Π cards(separator), card(column)]``, row-major in the separator. A
    separator value of no mass gets the column's counts; a merged value is split by its ``within`` shares."""
    rows = table.sum(-1, keepdims=True)
    conditional = np.where(rows > 0, table / np.where(rows > 0, rows, 1.0), counts / counts.sum())
    expanded = conditional
    for axis, m in enumerate([*separator_merges, merge]):  # axis by axis (the tree's order of operations, to the bit)
        expanded = expanded[(slice(None),) * axis + (m,)]
    expanded = expanded * within
    expanded = expanded / expanded.sum(-1, keepdims=True)
    return expanded.reshape(-1, expanded.shape[-1])


def numeric_bins(column: dict[str, Any], num_bins: int) -> int:
    """A numeric column's bins: those of its edges (the DataModule's preprocessing: bin ``k`` of ``K`` is the ``k``-th
    equal part of [-1, 1]), else ``num_bins`` equal-width bins of its declared range."""
    edges = column.get("edges")
    return len(edges) - 1 if edges else int(num_bins)


def column_cards(data_spec: dict[str, Any], num_bins: int) -> list[int]:
    """Per feature column, its number of codes in :func:`column_codes`."""
    return [numeric_bins(c, num_bins) if c["type"] == "numeric" else 2 if c["type"] == "binary" else len(c["categories"])
            for c in data_spec["columns"]]


def column_codes(x: torch.Tensor, data_spec: dict[str, Any], num_bins: int) -> np.ndarray:
    """Rows in the generator's space → ``[n, d]`` category codes: a numeric column's bin (:func:`numeric_bins`: an
    equal part of [-1, 1]), a binary column 0/1, a categorical column its category."""
    x = x.detach().double().cpu().numpy()
    codes = np.zeros((x.shape[0], len(data_spec["columns"])), dtype=np.int64)
    for i, (column, (start, end, _)) in enumerate(zip(data_spec["columns"], data_spec["spans"])):
        if column["type"] == "numeric":  # + BIN_TOLERANCE: a value on a bin edge, rounded in float32, stays in the upper bin
            bins = numeric_bins(column, num_bins)
            codes[:, i] = np.clip(np.floor((x[:, start] + 1.0) / 2.0 * bins + BIN_TOLERANCE), 0, bins - 1)
        elif column["type"] == "binary":
            codes[:, i] = (x[:, start] >= 0).astype(np.int64)
        else:
            codes[:, i] = x[:, start:end].argmax(1)
    return codes


def noisy_shares(noisy: np.ndarray) -> np.ndarray:
    """Noisy counts → shares: projected on the simplex of their noisy total (:func:`_simplex`: small
    noisy cells become 0), uniform when that total is ≤ 0."""
    total = float(np.sum(noisy))
    return _simplex(noisy, total) / total if total > 0 else np.full(len(noisy), 1.0 / len(noisy))


def _integer_grid(column: dict[str, Any], num_bins: int) -> dict[str, Any] | None:
    """For an integer column, per equal-width bin of its declared range, the generator-space position of
    the bin's first integer and their number (the last bin holds its upper bound), and one integer's
    width in generator space; ``None`` for other columns."""
    lo, hi = float(column["min"]), float(column["max"])
    if not str(column.get("dtype", "")).startswith(("int", "uint", "Int", "UInt")) or hi <= lo or column.get("edges"):
        return None  # an integer column with edges: its bins end on half-integers, the decoder's rounding keeps them
    width = (hi - lo) / num_bins
    bins = []
    for k in range(num_bins):
        first = math.ceil(lo + k * width - 1e-9 * width)
        last = math.floor(hi) if k == num_bins - 1 else math.ceil(lo + (k + 1) * width - 1e-9 * width) - 1
        bins.append((2.0 * (first - lo) / (hi - lo) - 1.0, max(last - first + 1, 0)))
    return {"step": 2.0 / (hi - lo), "bins": bins}


def adjacent_groups(noisy: np.ndarray, groups: int) -> np.ndarray:
    """Adjacent values joined into at most ``groups`` groups of about equal mass under the clipped ``noisy`` counts (a
    value goes to the group of its mass's midpoint; uniform mass where they are all ≤ 0). Returns the map value → group,
    numbered in order."""
    mass = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    mass = mass / mass.sum() if mass.sum() > 0 else np.full(len(mass), 1.0 / len(mass))
    middle = np.cumsum(mass) - mass / 2.0
    group = np.clip(np.floor(middle * groups), 0, groups - 1).astype(np.int64)
    return np.unique(group, return_inverse=True)[1].reshape(-1)


def range_tenths(column: dict[str, Any], num_bins: int) -> np.ndarray:
    """Per bin of a numeric column (:func:`numeric_bins`), the tenth of its declared range its middle falls in (public:
    the edges and the bounds)."""
    bins = numeric_bins(column, num_bins)
    lo, hi = float(column["min"]), float(column["max"])
    edges = np.asarray(column["edges"], dtype=np.float64) if column.get("edges") else np.linspace(lo, hi, bins + 1)
    middle = (edges[:-1] + edges[1:]) / 2.0
    tenths = np.floor((middle - lo) / (hi - lo) * RANGE_BINS) if hi > lo else np.zeros(bins)
    return np.clip(tenths, 0, RANGE_BINS - 1).astype(np.int64)


def groups_within(noisy: np.ndarray, segments: np.ndarray, groups: int) -> np.ndarray:
    """Adjacent values grouped inside each of the ordered ``segments`` (map value → segment): a segment of a share ``m``
    of the clipped ``noisy`` mass splits into ``max(1, round(groups·m))`` groups of about equal mass
    (:func:`adjacent_groups`). Returns the map value → group, numbered in order."""
    mass = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    total = mass.sum()
    out, offset = np.zeros(len(mass), dtype=np.int64), 0
    for s in np.unique(segments):
        inside = segments == s
        share = mass[inside].sum() / total if total > 0 else inside.mean()
        g = adjacent_groups(mass[inside], max(1, int(round(groups * share))))
        out[inside] = g + offset
        offset += int(g.max()) + 1
    return out


def sparse_runs(noisy: np.ndarray, segments: np.ndarray, groups: int) -> np.ndarray:
    """``segments`` with each run of adjacent segments worth less than half of one of ``groups`` equal-mass groups
    joined into one. Returns the map value → segment, numbered in order."""
    mass = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    total = mass.sum()
    share = np.bincount(segments, weights=mass)[segments] / total if total > 0 else np.zeros(len(mass))
    sparse = share * groups < 0.5
    cut = (np.diff(segments) != 0) & ~(sparse[:-1] & sparse[1:])
    return np.concatenate([[0], np.cumsum(cut)]).astype(np.int64)


def _compression(noisy: np.ndarray, threshold: float | np.ndarray) -> np.ndarray:
    """MST's domain compression: the values whose noisy count is at least ``threshold`` (one, or one a value) keep their
    own code (in order), the others share one last code. Returns the map value → code."""
    keep = np.asarray(noisy) >= threshold
    out = np.full(len(noisy), int(keep.sum()), dtype=np.int64)
    out[keep] = np.arange(int(keep.sum()))
    return out


def _within_shares(noisy: np.ndarray, merge: np.ndarray) -> np.ndarray:
    """Each value's share of its code's mass, from the clipped noisy counts (uniform inside a code
    whose values all measured ≤ 0)."""
    clipped = np.clip(np.asarray(noisy, dtype=np.float64), 0.0, None)
    group = np.bincount(merge, weights=clipped)[merge]
    size = np.bincount(merge)[merge]
    return np.where(group > 0, clipped / np.where(group > 0, group, 1.0), 1.0 / size)


def _inverse_variance(estimates) -> float:
    """The inverse-variance weighted mean of ``(value, variance)`` pairs."""
    w = np.array([1.0 / v for _, v in estimates])
    return float(np.dot(w, [x for x, _ in estimates]) / w.sum())


def _inverse_variance_vector(estimates) -> np.ndarray:
    """Per cell, the inverse-variance weighted mean of ``(vector, variances)`` pairs."""
    w = np.stack([1.0 / np.asarray(v, dtype=np.float64) for _, v in estimates])
    x = np.stack([np.asarray(x, dtype=np.float64) for x, _ in estimates])
    return (w * x).sum(0) / w.sum(0)


def _simplex(y: np.ndarray, total: float) -> np.ndarray:
    """The Euclidean projection of ``y`` on ``{x ≥ 0, Σx = total}`` (Duchi et al. 2008): ``max(y − τ, 0)``
    with the τ that makes the sum right."""
    y = np.asarray(y, dtype=np.float64)
    u = np.sort(y)[::-1]
    css = np.cumsum(u) - total
    ind = np.arange(1, len(y) + 1)
    rho = np.nonzero(u - css / ind > 0)[0][-1]
    return np.maximum(y - css[rho] / (rho + 1.0), 0.0)


def _ipf(table: np.ndarray, rows: np.ndarray, cols: np.ndarray, iterations: int = 100) -> np.ndarray:
    """Iterative proportional fitting of a non-negative ``table`` to the margins ``rows`` and ``cols``
    (equal totals): the table of the same odds ratios with those margins."""
    t = np.asarray(table, dtype=np.float64).copy()
    for _ in range(iterations):
        r = t.sum(1)
        t *= np.where(r > 0, rows / np.where(r > 0, r, 1.0), 0.0)[:, None]
        c = t.sum(0)
        t *= np.where(c > 0, cols / np.where(c > 0, c, 1.0), 0.0)[None, :]
        if np.abs(t.sum(1) - rows).max() <= 1e-9 * max(rows.sum(), 1.0):
            break
    return t


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
