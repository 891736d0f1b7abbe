"""PATE-GAN (Yoon, Jordon & van der Schaar, ICLR 2019) without the known privacy violations.

Per generator step (Yoon et al. 2019, Algorithm 1):

1. ``teachers.steps`` (n_T) steps of the k teachers, each a conditional real-vs-fake classifier
   trained on its own partition of the training data. The partition is the DataModule's fixed,
   disjoint :class:`~datamodules.partition.TeacherPartition` (a record reaches one teacher, for the
   whole run); the teachers are one stacked-parameter ensemble
   (:mod:`lightning_gpate.nets.ensemble`) under one Adam, so every teacher has its own moments.
2. ``student.steps`` (n_S) steps of the student on **generated samples only**, each labelled by the
   noisy teacher vote ``argmax_j(n_j + Lap(1/λ))`` (n_j: teachers voting class j ∈ {fake, real}).
   Every query batch is charged to the accountant as a
   :class:`~lightning_gpate.privacy.LaplaceVoteEvent` *before* the student sees its labels; when the
   budget refuses it, training stops without that update.
3. One generator step against the student.

Options beyond the paper, all free post-processing of the paid-for votes: ``query_labels: uniform``
(a rare class gets its share of the queries) and ``student.replay_capacity`` (the student re-fits every
labelled sample kept so far rather than only the newest batch).

One option that is not post-processing and pays for itself: ``marginals.fraction`` (tables). Neither
vote keeps the generator near the data (``benchmarks/results/tabular_ladder.md``): with the paper's
vote the teachers call every generated row fake; a relative vote only ranks generated rows against each
other, so the generator follows its direction past the data to the bounds of the declared domain, even
without noise. With ``marginals.fraction > 0`` a share of ε buys every column's one-way marginal per
class, once, before training (the Gaussian mechanism on the ``d`` tables class × value, numeric
columns in their own bins (declared, ``scale: log`` or private quantile edges), else ``marginals.bins`` equal-width
bins of their declared range: a record adds one to one cell of
each, L2 sensitivity √d), and the generator's loss adds ``marginals.weight`` times the KL divergence of
each measured conditional marginal from the generator's (soft) marginal on a batch of its rows: the
marginals anchor the generator, the teachers' votes shape the rest. The measured tables are noisy
releases (kept in the checkpoint as public state); the votes get the budget that is left. For images
the same share buys the image analogue, the **per-class mean image** (the first moment of every
pixel's marginal per class): per class the sum of its images (pixels in [0, 1]) and its count, one
Gaussian on the vector (sums, counts) of L2 sensitivity √(d + 1) (a record adds its image and one to
its class's), and the generator's loss adds ``marginals.weight`` times the squared distance of each
class's mean generated image (a batch of ``marginals.batch_size``) from the measured one.

What the public implementations got wrong, and what this one does instead (see REFERENCE.md and the
replication study): teacher partitions are fixed and disjoint; the student never sees real rows;
the vote noise really is Lap(1/λ) per class count; ε comes from the project's accountant with the
user's δ, as a data-independent guarantee by default (``budget_accounting: paper`` gives the paper's
data-dependent moments accountant, tagged as not a guarantee); bounds, categories and the class ratio
are declared public or paid for (``data.metadata_epsilon`` / ``data.label_ratio_epsilon``); the same
latent prior is used in training and sampling (:meth:`GenerativeModel.latent`); the number of rows
sampled is whatever the user asks for, never the training size; and only privatised quantities are
logged (teacher losses and vote margins are functions of the private data: opt-in only).

Note on budgets. Under the guarantee every labelled sample is a 2λ-DP release (one record moves one
teacher's vote, i.e. two counts by one), so the number of affordable queries scales as (ε/λ)²;
``lam: null`` picks the largest λ for which ``planned_queries`` labelled samples fit the budget.

Several processes (Lightning DDP): the teachers are sharded as G-PATE's are (rank r of W holds and
trains teachers r, r+W, … on their own partitions), each rank's vote counts are all-reduced into the
histogram *before* the noise, and the Laplace noise comes from a generator seeded identically on every
rank (a secret seed drawn on rank 0 and broadcast), so every rank labels the same samples the same way
and the replicated student and generator take the same steps: one noisy vote per query, as on one
process, and the same accounting.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lightning_gpate.models.options import (DiscriminatorNet, GeneratorNet, OptionGroup, TeacherEnsemble, flat_options,
                                            positive_int)
from lightning_gpate.models.private import DEFAULT_DELTA, PrivateGenerativeModel, largest_that_fits
from lightning_gpate.nets.discriminators import ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator
from lightning_gpate.nets.ensemble import ConvTeacherEnsemble, MLPTeacherEnsemble
from lightning_gpate.models.sharding import (gather_members, owned_members, replicated_backward,
                                              select_members, shared_seed)
from lightning_gpate.privacy.distributed import is_distributed
from lightning_gpate.models.anchor import class_mean_gap, noisy_class_means
from lightning_gpate.models.marginal import column_cards, column_codes, noisy_shares, numeric_bins
from lightning_gpate.models.warm_start import AUTO_WARM_START, WarmStart, WarmStartMixin
from lightning_gpate.privacy import LaplaceVoteEvent, SubsampledGaussianEvent
from lightning_gpate.privacy.randomness import mechanism_generator

QUERY_LABELS = ("ratio", "uniform")
TEACHER_VOTES = ("logit", "relative")
STUDENT_LABELS = ("argmax", "share")
NOISE_STATE_KEY = "pategan_vote_noise"
FAKE, REAL = 0, 1  # vote classes
@dataclass(frozen=True, kw_only=True)
class VotingTeachers(TeacherEnsemble):
    """PATE-GAN's teachers (:class:`~lightning_gpate.models.options.TeacherEnsemble`: ``steps`` is n_T, teacher steps
    per generator step; ``lr`` ``None``: 1e-4 for images, 1e-3 for tables, :func:`resolved_defaults`; ``hidden``
    ``None``: ``[d]``) and how they vote.

    Args:
        vote: "relative" or "logit" (the paper): when a teacher votes "real". "logit": when its logit is positive;
            "relative": when its logit exceeds its own median logit on a fresh batch of generated samples of the same
            class ("more real than the generator's typical output for this label"). Teachers trained on a few rows
            each call every generated sample fake, so paper votes are unanimous and teach the student nothing;
            relative votes keep a signal. Each vote still depends on one teacher's partition only: the analysis is
            unchanged.
        relative_reference: generated samples per class for a teacher's median (vote: relative). At least the queries
            voted on; its forward through every teacher is most of a vote's cost on images.
        vote_chunk_size: generated samples per teacher forward when voting, to bound memory.
    """

    vote: str = "relative"
    relative_reference: int = 64
    vote_chunk_size: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vote not in TEACHER_VOTES:
            raise ValueError(f"teachers.vote must be one of {TEACHER_VOTES}, got {self.vote!r}")
        positive_int("teachers.relative_reference", self.relative_reference)
        positive_int("teachers.vote_chunk_size", self.vote_chunk_size)


@dataclass(frozen=True, kw_only=True)
class Student(DiscriminatorNet):
    """PATE-GAN's student: its network (:class:`~lightning_gpate.models.options.DiscriminatorNet`; tables an MLP of
    ``[d, d/2]`` with ``hidden: null``, images a DCGAN discriminator) and how it learns from the noisy votes, all of
    it post-processing of the paid-for labels.

    Args:
        steps: n_S, student steps per generator step.
        batch_size: samples per student step when replaying (null: query_batch_size).
        replay_capacity: labelled samples kept to replay (null: all on images, 0 on tables). 0: each student step trains
            on the samples just labelled (replay did not help on tables). > 0: keep the last replay_capacity labelled
            samples and train each student step on a draw of batch_size of them (the student fits the few labels a small
            budget can buy better, and queries can be fewer per generator step).
        labels: the student's target, "argmax" or "share" (null: by data kind). "argmax" (the paper): the noisy
            majority, 1 = real. "share": the noisy share of "real" votes, clip(½ + (ñ_real − ñ_fake)/(2T), 0, 1) with ñ
            the noisy counts, as a soft target. The guarantee already covers the whole noisy histogram (the Laplace
            mechanism on a vector of L1 sensitivity 2), so the share costs nothing more than its argmax; a graded label
            tells the student how far a sample is from the teachers' verdict, not a coin flip near the middle. Under the
            data-dependent analyses (paper, smooth_sensitivity), which bound the argmax only, it is refused.
    """

    steps: int = 1
    batch_size: int | None = 64
    replay_capacity: int | None = None
    labels: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("student.steps", self.steps)
        positive_int("student.batch_size", self.batch_size)
        if self.replay_capacity is not None and (int(self.replay_capacity) != self.replay_capacity or self.replay_capacity < 0):
            raise ValueError(f"student.replay_capacity must be an integer >= 0 (or null), got {self.replay_capacity}")
        if self.labels is not None and self.labels not in STUDENT_LABELS:
            raise ValueError(f"student.labels must be one of {STUDENT_LABELS}, got {self.labels!r}")


@dataclass(frozen=True, kw_only=True)
class ClassMarginals(OptionGroup):
    """The marginals PATE-GAN measures once before training and pulls its generator towards (module doc): a share of
    ε buys every column's one-way marginal per class (tables) or each class's mean image (images).

    Args:
        fraction: the share of ε the measurement spends (null: 0.5 under the guarantee). Images with a warm_start get 0
            (its release replaces the class means). The measured marginals are what make a guaranteed PATE-GAN useful.
            Needs budget_accounting: guarantee and a DataModule (the whole training split is read once).
        weight: weight of the pull towards the marginals (null: images 10, tables 30). Tables: KL divergence; images:
            mean over classes of the mean squared pixel difference, in [-1, 1].
        bins: equal-width bins of the declared range of a numeric column without bins of its own (declared, log or
            private quantile edges: those are used as they are).
        batch_size: generated samples per generator step for the pull. Every class equally often.
        threshold: tables: noise stds a class's deviation must exceed to be kept (0: all). Soft thresholding of the
            deviation of a share. On cervical (35 positive rows) 1 gave the better tables and AUROC at ε = 10; at ε = 1,
            where that threshold erases the positive class's deviations entirely, 0 scored better (its noisy marginals
            make its rows unlike the negatives').
    """

    fraction: float | None = None
    weight: float | None = None
    bins: int = 10
    batch_size: int = 256
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"marginals.fraction must be in [0, 1), got {self.fraction}")
        if self.weight is not None and not 0 <= self.weight < math.inf:
            raise ValueError(f"marginals.weight must be a finite number >= 0, got {self.weight}")
        for name, value in {"bins": self.bins, "batch_size": self.batch_size}.items():
            if int(value) != value or value < 2:
                raise ValueError(f"marginals.{name} must be an integer >= 2, got {value}")
        if not 0 <= self.threshold < math.inf:
            raise ValueError(f"marginals.threshold must be a finite number >= 0, got {self.threshold}")


#: The generator and the student (``generator``'s and ``student``'s docs): ``None``: by data kind.
DEFAULT_GENERATOR = GeneratorNet(z_dim=None, latent_prior="normal", gf_dim=64, fc_dim=1024, upsample="nearest", hidden=None, ema_decay=None)
DEFAULT_STUDENT = Student(df_dim=64, fc_dim=1024, hidden=None)
#: The teachers (``teachers``' docs): ``None``: by data kind.
DEFAULT_TEACHERS = VotingTeachers(lr=None, hidden=None)
#: The PATE-GAN paper's settings where the defaults differ (Yoon et al. 2019 and its code): ``PATEGAN(spec,
#: **PAPER_SETTINGS, ...)``. Under the data-independent guarantee its votes are unanimous "fake" and teach the
#: student nothing (``benchmarks/results/pategan_vote_signal.md``, ``tabular_ladder.md``); the defaults are the MNIST
#: rows' (``configs/mnist/pategan_eps*_guarantee.yaml``) and, for tables, the cervical row's settings.
PAPER_SETTINGS = {"teacher_steps": 5, "student_steps": 5, "query_batch_size": 64, "planned_queries": 10_000, "lr": 1e-4,
                  "teacher_lr": 1e-4, "betas": (0.9, 0.999), "replay_capacity": 0, "query_labels": "ratio",
                  "teacher_vote": "logit", "student_labels": "argmax", "discrete_samples": False, "marginal_fraction": 0.0,
                  "marginal_weight": 1.0, "student_batch_size": None, "generator_upsample": "transposed", "warm_start": None}

#: PATE-GAN's warm start on tables (issue 59; ``warm_start: auto`` resolves to it under the guarantee): 80% of ε buys
#: :class:`~lightning_gpate.models.MarginalTree`'s fit (``source: marginals``), the generator takes 2,000 free steps on
#: the embedding of 20,000 rows sampled from it (2,000 random features of three length scales, as DP-MERF's table rows)
#: and keeps its pull (weight 10) while the votes get the rest; the class marginals then default to off (the tree
#: measured them). The default since it held on every development table of the validation split (split seeds 0-4,
#: ε = 1, unaccounted tuning; ``benchmarks/results/tabular_validation_warm.md``): mean AUROC cervical 0.601 against
#: 0.526 without it, cardio 0.734 / 0.732, breast cancer 0.846 / 0.606, fair and randhie in the notes; the pull weight
#: was picked on breast cancer's validation seeds.
TABLE_WARM_START = {"source": "marginals", "fraction": 0.8, "features": 2000, "length_scale": [0.25, 1.0, 4.0], "steps": 2000,
                    "anchor_weight": 10.0}


def resolved_defaults(kind: str, budget_accounting: str, planned_queries: int, requested: dict[str, Any], *,
                      warm_start: str | None = None) -> dict[str, Any]:
    """The values of :attr:`PATEGAN.RESOLVED_HPARAMS` (``"teachers.lr"``: the option ``lr`` of the group ``teachers``)
    that ``requested`` leaves ``None``, from the data's kind (``"image"`` or ``"tabular"``) and the accounting mode:
    public numbers only.

    Images: the MNIST rows' settings (``configs/mnist/pategan_eps*_guarantee.yaml``, ``pategan_mnist_cpu.md``: 0.725-0.745
    at ε = 10, 0.734 at ε = 1 on the CPU proxy): Adam 2e-4 (teachers 1e-4), β (0.5, 0.999), every paid-for label replayed,
    the noisy vote share as the student's label, the anchor weighted 10. Tables: the cervical row's
    (``configs/pategan_cervical.yaml``, ``tabular_ladder.md`` rows 20-23): Adam 1e-3 for all nets, discrete samples, the
    marginals weighted 30, no replay (rung 13: it did not help), argmax labels. Both: half of ε measures the anchor
    (the per-class mean image or one-way marginals) under ``budget_accounting: guarantee`` (the only mode that covers it),
    except with a ``warm_start`` (``warm_start``: its source, or ``None`` without one) for images, whose release replaces
    the class-mean images, or from the marginal model (``"marginals"``, the tables' default), which measured the marginals.
    """
    image = kind == "image"
    guarantee = budget_accounting == "guarantee"
    defaults = {"lr": 2e-4 if image else 1e-3, "teachers.lr": 1e-4 if image else 1e-3,
                "betas": (0.5, 0.999) if image else (0.9, 0.999),
                "marginals.fraction": 0.5 if guarantee and not (warm_start and (image or warm_start == "marginals")) else 0.0,
                "marginals.weight": 10.0 if image else 30.0, "student.replay_capacity": int(planned_queries) if image else 0,
                "student.labels": "share" if image and guarantee else "argmax", "discrete_samples": not image}
    return {k: defaults[k] if requested.get(k) is None else requested[k] for k in defaults}


def laplace_noise(shape: Sequence[int], *, scale: float, generator: torch.Generator, device, dtype=torch.float64) -> torch.Tensor:
    """Lap(scale) noise drawn from ``generator``: the difference of two Exp(1) draws times ``scale``
    (exact, and without the log(0) edge case of the inverse-CDF method)."""
    e = torch.empty((2, *shape), device=device, dtype=dtype).exponential_(generator=generator)
    return (e[0] - e[1]) * scale


class PATEGAN(WarmStartMixin, PrivateGenerativeModel):
    """PATE-GAN: k teachers on disjoint partitions, a student on noisily labelled generated samples,
    a generator trained against the student (Yoon et al. 2019, Algorithm 1).

    The defaults are the best configuration found under the data-independent guarantee (issue 47): few queries a
    step, relative votes, half of ε on the anchor, for images the MNIST rows' settings and for tables the cervical
    row's (:func:`resolved_defaults`), where since issue 59 a warm start from the marginal model takes the anchor's
    place (:data:`TABLE_WARM_START`); the paper's settings are :data:`PAPER_SETTINGS`.

    Tables use MLP networks with the paper's shapes (generator and student of depth 3 with widths
    d, d/2, d, teachers with one hidden layer of width d; d = the data's dimension, at least 8);
    images use the conditional DCGAN generator/student and :class:`ConvTeacherEnsemble` teachers.
    The number of teachers and the per-teacher batch come from the DataModule
    (``data.num_teachers``, ``data.teacher_batch_size``).

    Args:
        data_spec: the DataModule's spec (needs num_teachers > 0).
        epsilon: the privacy budget ε, metadata costs included. Pure-DP metadata costs in
            data_spec["metadata_cost"] count towards it.
        delta: δ of the (ε, δ) guarantee, used in every ε reported.
        budget_accounting: "guarantee" (default), "paper" or "smooth_sensitivity". "guarantee": data-independent, each
            query 2λ-DP. "paper": the data-dependent moments accountant of Papernot et al. 2017, Theorem 3, as PATE-GAN
            uses it: NOT a guarantee, the run is tagged so. "smooth_sensitivity": those data-dependent moments released
            with smooth sensitivity at the end of a run of trainer.max_steps (the bound depends on a query's vote gap
            alone, so its local sensitivity is a maximum over a table; see the private base).
        epsilon_hard_cap, smooth_sensitivity: for budget_accounting: smooth_sensitivity.
        conversion: RDP to (ε, δ) conversion, "improved" or "classic". "classic" on the integer orders is exactly the
            moments accountant's ε̂ = min_l (α(l) + ln(1/δ))/l.
        lam: λ, the inverse scale of the vote noise (null: the largest that fits). null picks the largest λ for which
            planned_queries labelled samples fit the budget under the guarantee.
        planned_queries: labelled samples the budget plans for if lam is null (paper: 10,000). 16,000 are the MNIST and
            cervical rows' choice.
        query_batch_size: vote queries per student and generator step (the paper: 64). 16, few queries a step, lets the
            budget pay for many generator steps.
        lr: Adam's learning rate (null: images 2e-4, tables 1e-3; paper: 1e-4).
        betas: Adam's betas (null: images (0.5, 0.999), tables (0.9, 0.999)).
        generator: the generator network (a mapping of its options overrides some). z from N(0, I), its size null: the
            data dimension d for tables, 100 for images; tables an MLP of [d, d/2] (hidden: null); images a DCGAN of
            gf_dim 64, fc_dim 1,024 with upsample: nearest (no checkerboard lattice; the paper's: transposed);
            ema_decay null (the paper): no weight average; if set, the average (after a warm-up,
            update_generator_average) samples and is released.
        student: the student: its network and how it learns from the noisy votes (a mapping overrides some). Tables an
            MLP of [d, d/2] (hidden: null), images a DCGAN discriminator of df_dim 64 and fc_dim 1,024; one step a
            generator step (the paper: 5), replay and soft labels by data kind.
        teachers: the teachers and how they vote (a mapping overrides some). One step a generator step (the MNIST and
            cervical rows'; the paper: 5), Adam at lr null: 1e-4 for images, 1e-3 for tables (the paper: 1e-4;
            teachers that separate real from fake perfectly vote "fake" unanimously and teach the student nothing),
            tables an MLP of [d] (hidden: null), relative votes (the paper: logit).
        marginals: the class marginals, measured once with a share of ε.
        query_labels: labels of the voted samples, "uniform" or "ratio" (the paper). The generator trains on the same
            labels. "uniform" gives a rare class its share of the queries; "ratio" is the sampling class ratio. Sampling
            uses the class ratio either way.
        discrete_samples: tables: the teachers see generated rows as released (null: true). Binary columns at ±1 (the
            sign), categorical ones one-hot (the argmax), with straight-through gradients to the generator. Real rows
            are exactly ±1 and one-hot, so soft generated values are a giveaway that lets every teacher call every
            generated row fake without learning anything about the data.
        warm_start: a warm start: "auto" (tables: from MarginalTree), a mapping or null. A share of ε buys a release
            before the first vote (DP-MERF's, or on tables MarginalTree's fit), the generator trains on it
            (post-processing) and may keep its pull; λ is planned for what the budget leaves. For images, and from the
            marginal model, it replaces the class marginals (marginals.fraction then defaults to 0). "auto" (default):
            TABLE_WARM_START for tables under the guarantee, none for images (and under the data-dependent accountings);
            null: none. On a table under the guarantee a mapping changes the options it names of TABLE_WARM_START and
            keeps the rest (--model.warm_start.steps 100: the table warm start with 100 steps; the fit summary says
            so); elsewhere the rest are DP-MERF's release's. Its options: --model.warm_start.help.
        noise_seed: seed of the vote noise, for tests only (null: secret, from the OS). Anyone who knows the seed can
            subtract the noise.
        log_private_diagnostics: also log teacher losses and vote margins, unnoised (debugging only). These are computed
            from the private data WITHOUT noise: never for a released run.
    """

    SUPPORTS_SMOOTH_SENSITIVITY = True  # Laplace votes: the moments bound is a function of the gap
    FLAT_OPTIONS = {**flat_options("student", against_hidden="student_hidden"),
                    **{f"teacher_{name}": (f"teachers.{name}",) for name in ("steps", "lr", "hidden", "channels", "fc", "seed", "chunk_size")},
                    "teacher_vote": ("teachers.vote",), "relative_reference": ("teachers.relative_reference",),
                    "vote_chunk_size": ("teachers.vote_chunk_size",), "student_steps": ("student.steps",),
                    "student_batch_size": ("student.batch_size",), "replay_capacity": ("student.replay_capacity",),
                    "student_labels": ("student.labels",),
                    **{f"marginal_{name}": (f"marginals.{name}",) for name in ("fraction", "weight", "bins", "batch_size", "threshold")}}
    #: Options whose ``None`` the constructor resolves from the data's kind and the accounting mode
    #: (:func:`resolved_defaults`) or its shape (the networks' sizes) and stores resolved (:meth:`store_resolved_hparams`).
    RESOLVED_HPARAMS = ("lr", "teachers.lr", "betas", "marginals.fraction", "marginals.weight", "student.replay_capacity",
                        "student.labels", "discrete_samples", "generator.z_dim", "generator.hidden", "student.hidden")
    #: A release saved before ``warm_start`` existed had none (``"auto"``, the default since, would plan one for a table).
    DEFAULTS_BEFORE = {"warm_start": None}
    #: Options removed (issue 47: no shipped config used them, no ladder measured them), with the value that meant
    #: "off": a release saved before keeps loading when it holds that value (:func:`~lightning_gpate.release.model_from_release`).
    REMOVED_OPTIONS = {"teacher_fake_batch_size": None}

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float = 1.0,
        delta: float = DEFAULT_DELTA,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        epsilon_hard_cap: float | None = None,
        smooth_sensitivity: dict[str, Any] | None = None,
        lam: float | None = None,
        planned_queries: int = 16_000,
        warm_start: WarmStart | dict[str, Any] | str | None = AUTO_WARM_START,
        query_batch_size: int = 16,
        query_labels: str = "uniform",
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        generator: GeneratorNet = DEFAULT_GENERATOR,
        student: Student = DEFAULT_STUDENT,
        teachers: VotingTeachers = DEFAULT_TEACHERS,
        marginals: ClassMarginals = ClassMarginals(),
        discrete_samples: bool | None = None,
        noise_seed: int | None = None,
        log_private_diagnostics: bool = False,
    ) -> None:
        teacher_options = VotingTeachers.of(teachers, DEFAULT_TEACHERS, name="teachers")
        student_options = Student.of(student, DEFAULT_STUDENT, name="student")
        marginal_options = ClassMarginals.of(marginals, ClassMarginals(), name="marginals")
        requested = {"lr": lr, "teachers.lr": teacher_options.lr, "betas": betas, "marginals.fraction": marginal_options.fraction,
                     "marginals.weight": marginal_options.weight, "student.replay_capacity": student_options.replay_capacity,
                     "student.labels": student_options.labels, "discrete_samples": discrete_samples}
        warm_options = self.warm_start_of(warm_start, data_spec or {}, budget_accounting)
        resolved = resolved_defaults((data_spec or {}).get("kind"), budget_accounting, planned_queries, requested,
                                     warm_start=None if warm_options is None else warm_options.source)
        lr, betas, discrete_samples = resolved["lr"], resolved["betas"], resolved["discrete_samples"]
        teacher_options = replace(teacher_options, lr=resolved["teachers.lr"])
        student_options = replace(student_options, replay_capacity=resolved["student.replay_capacity"], labels=resolved["student.labels"])
        marginal_options = replace(marginal_options, fraction=resolved["marginals.fraction"], weight=resolved["marginals.weight"])
        num_teachers = int(data_spec.get("num_teachers", 0))
        if num_teachers < 1:
            raise ValueError("PATE-GAN needs teachers: set data.num_teachers (e.g. about N/1000 ... N/10 of the training rows)")
        if student_options.labels == "share" and budget_accounting != "guarantee":
            raise ValueError("student.labels: share releases the noisy vote counts, which only budget_accounting: guarantee "
                             "covers (the data-dependent analyses bound their argmax)")
        if query_labels not in QUERY_LABELS:
            raise ValueError(f"query_labels must be one of {QUERY_LABELS}, got {query_labels!r}")
        for name, value in {"query_batch_size": query_batch_size, "planned_queries": planned_queries}.items():
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value}")
        if marginal_options.fraction > 0 and budget_accounting != "guarantee":
            raise ValueError("marginals.fraction measures the marginals (tables) or mean images (images) under budget_accounting: "
                             f"guarantee; got budget_accounting: {budget_accounting}")
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        if lam is not None and not (0 < lam < math.inf):
            raise ValueError(f"lam must be a finite number > 0 (or null to plan it from the budget), got {lam}")
        image = data_spec["kind"] == "image"
        d = int(np.prod(data_spec["shape"]))
        width = max(d, 8)
        half = max(width // 2, 4)
        requested.update({"generator.z_dim": net_options.z_dim, "generator.hidden": net_options.hidden,
                          "student.hidden": student_options.hidden})
        if net_options.z_dim is None:
            net_options = replace(net_options, z_dim=100 if image else width)
        if not image and net_options.hidden is None:
            net_options = replace(net_options, hidden=(width, half))
        if not image and student_options.hidden is None:
            student_options = replace(student_options, hidden=(width, half))
        sizes = {"generator.z_dim": net_options.z_dim, "generator.hidden": net_options.as_hparams()["hidden"],
                 "student.hidden": student_options.as_hparams()["hidden"]}
        super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
                         conversion=conversion, z_dim=net_options.z_dim, latent_prior=net_options.latent_prior,
                         log_private_diagnostics=log_private_diagnostics,
                         epsilon_hard_cap=epsilon_hard_cap, smooth_sensitivity=smooth_sensitivity)
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options, student=student_options, teachers=teacher_options, marginals=marginal_options)
        self.store_resolved_hparams(requested, **resolved, **sizes)
        self.automatic_optimization = False
        self.num_teachers = num_teachers
        self.generator_options, self.student_options = net_options, student_options
        self.teacher_options, self.marginal_options = teacher_options, marginal_options
        self.marginal_noise = self.plan_gaussian_noise(marginal_options.fraction) if marginal_options.fraction > 0 else None
        if self.marginal_noise is not None and image:  # the mean image of each class in [-1, 1], measured once
            self.register_buffer("marginal_targets", torch.zeros(self.num_classes, *data_spec["shape"]))
            self.register_buffer("marginals_measured", torch.zeros((), dtype=torch.bool))
        elif self.marginal_noise is not None:
            cards = column_cards(data_spec, int(marginal_options.bins))
            # P̂(column j = v | class c), measured once (a DP release: public state from then on)
            self.register_buffer("marginal_targets", torch.zeros(len(cards), self.num_classes, max(cards)))
            self.register_buffer("marginals_measured", torch.zeros((), dtype=torch.bool))
        self.init_warm_start(warm_start)  # its share of ε planned alone, before λ takes what is left
        self.lam = float(lam) if lam is not None else self.plan_lambda(planned_queries)
        if image:
            self.generator = self.build_generator(net_options)
            self.student = ConditionalDCGANDiscriminator(
                in_shape=data_spec["shape"], num_classes=self.num_classes, df_dim=student_options.df_dim, fc_dim=student_options.fc_dim)
            self.teachers = ConvTeacherEnsemble(
                num_teachers, in_shape=data_spec["shape"], num_classes=self.num_classes,
                channels=teacher_options.channels, fc=teacher_options.fc, seed=teacher_options.seed)
        else:
            self.generator = self.build_generator(net_options)
            self.student = ConditionalMLPDiscriminator(in_features=d, num_classes=self.num_classes, hidden=student_options.hidden)
            self.teachers = MLPTeacherEnsemble(
                num_teachers, in_features=d, num_classes=self.num_classes, seed=teacher_options.seed,
                hidden=(width,) if teacher_options.hidden is None else teacher_options.hidden)
        self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False) if net_options.averaged else None
        self._noise_generator: torch.Generator | None = None
        self._noise_seed: int | None = noise_seed  # under DDP: one secret seed for every rank (setup)
        self._replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (x, y, noisy label)

    @classmethod
    def warm_start_base(cls, data_spec: Any, budget_accounting: str) -> dict[str, Any]:
        """:data:`TABLE_WARM_START` for a table under ``budget_accounting: guarantee`` (the only accounting that covers
        its release), else DP-MERF's defaults (:data:`~lightning_gpate.models.warm_start.DEFAULT_OPTIONS`)."""
        return dict(TABLE_WARM_START) if data_spec.get("kind") == "tabular" and budget_accounting == "guarantee" else {}

    @classmethod
    def warm_start_of(cls, warm_start: Any, data_spec: Any, budget_accounting: str) -> WarmStart | None:
        """``warm_start`` as the model takes it: ``"auto"`` (the default) is :meth:`warm_start_base`'s table warm start
        for a table under the guarantee and none otherwise; ``None`` is none; a mapping or a
        :class:`~lightning_gpate.models.warm_start.WarmStart` is that warm start, the options it leaves out the table
        warm start's on a table (``--model.warm_start.steps 100`` changes its steps only)."""
        base = cls.warm_start_base(data_spec, budget_accounting)
        if isinstance(warm_start, str):
            if warm_start != AUTO_WARM_START:
                raise ValueError(f"warm_start must be a mapping of its options, {AUTO_WARM_START!r} (by data kind) or null (none), "
                                 f"got {warm_start!r}")
            return WarmStart.of(base) if base else None
        return WarmStart.of(warm_start, base)

    # ----------------------------------------------------------------- budget planning
    def plan_lambda(self, planned_queries: int) -> float:
        """Largest λ (to 1e-9 relative) such that ``planned_queries`` Laplace votes, on top of what is
        already recorded (the metadata), keep the data-independent guarantee within the budget.

        The guarantee of a query does not depend on its vote gap, so the plan reveals nothing; under
        ``budget_accounting: paper`` the same plan is conservative (the data-dependent ε is smaller);
        under ``smooth_sensitivity`` the plan fills ``epsilon_hard_cap`` (with the release reserved).
        """
        gaps = np.zeros(int(planned_queries))

        before = self.events_before_first_step()

        def fits(lam: float) -> bool:
            if before:  # the measured marginals (guarantee accounting only)
                return self.accountant.epsilon_if(*before, LaplaceVoteEvent(gaps, lam)) <= self.budget_limit()
            return self.epsilon_if(LaplaceVoteEvent(gaps, lam)) <= self.budget_limit()

        return largest_that_fits(fits, f"{planned_queries} queries within ε={self.budget_limit():g}")

    # ----------------------------------------------------------------- the measured marginals
    def marginal_event(self) -> SubsampledGaussianEvent:
        """The marginals' measurement: one Gaussian of noise multiplier ``marginal_noise`` relative to
        its L2 sensitivity √d (sampling rate 1: the plain Gaussian mechanism)."""
        return SubsampledGaussianEvent(noise_multiplier=self.marginal_noise, sampling_rate=1.0)

    def measured(self) -> bool:
        return self.marginal_noise is not None and bool(self.marginals_measured)

    def events_before_first_step(self) -> list:
        """The marginals' measurement and the warm start's release while they are still to be paid (see the private base)."""
        marginals = [self.marginal_event()] if self.marginal_noise is not None and not self.measured() else []
        return marginals + self.warm_start_events()

    def measure_marginals(self) -> bool:
        """Pay for and measure every column's one-way marginal per class on the whole training split
        (the DataModule's): noisy counts ``n(c, v) + N(0, (z√d)²)``; each class's shares (its row
        projected on the simplex of its noisy total, :func:`~lightning_gpate.models.marginal.noisy_shares`)
        keep their deviation from the pooled shares only beyond ``marginals.threshold`` noise stds of a
        share, ``σ / n̂_c`` (soft thresholding). Returns ``False`` (nothing measured) when the budget
        refuses it."""
        datamodule = self.whole_split_datamodule("marginals.fraction")
        if not self.charge(self.marginal_event()):
            return False
        x, y = datamodule.model_space("train")
        if self.is_image:
            return self._measure_mean_images(x, y)
        bins = int(self.marginal_options.bins)
        codes, labels = column_codes(x, self.data_spec, bins), y.long().cpu().numpy()
        cards = column_cards(self.data_spec, bins)
        sigma = self.marginal_noise * math.sqrt(len(cards))
        gen = self.noise_generator()  # secret, and the same on every rank under DDP
        targets = torch.zeros_like(self.marginal_targets, device="cpu")
        for j, card in enumerate(cards):
            counts = np.zeros((self.num_classes, card))
            np.add.at(counts, (labels, codes[:, j]), 1.0)
            noisy = counts + sigma * torch.randn(counts.shape, generator=gen, device=gen.device, dtype=torch.float64).cpu().numpy()
            pooled = noisy_shares(noisy.sum(0))
            for c in range(self.num_classes):
                # Soft thresholding (post-processing): a class keeps its deviation from the pooled shares only
                # beyond the threshold; on a small class the noise alone would otherwise give most columns a
                # spurious association with the label.
                deviation = noisy_shares(noisy[c]) - pooled
                tau = self.marginal_options.threshold * sigma / max(noisy[c].sum(), sigma)
                share = np.clip(pooled + np.sign(deviation) * np.maximum(np.abs(deviation) - tau, 0.0), 0.0, None)
                targets[j, c, :card] = torch.from_numpy(share / share.sum())
        with torch.no_grad():
            self.marginal_targets.copy_(targets)
            self.marginals_measured.fill_(True)
        return True

    def _measure_mean_images(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """The noisy mean image per class (:func:`~lightning_gpate.models.anchor.noisy_class_means`)."""
        gen = self.noise_generator()  # secret, and the same on every rank under DDP
        means = noisy_class_means(x, y, num_classes=self.num_classes, noise_multiplier=self.marginal_noise, generator=gen)
        with torch.no_grad():
            self.marginal_targets.copy_(means.to(self.marginal_targets.device).view_as(self.marginal_targets))
            self.marginals_measured.fill_(True)
        return True

    def marginal_loss(self) -> torch.Tensor:
        """For one batch of generated rows or images (every class equally often): tables, the mean over
        columns and classes of KL(measured ‖ generated), where a numeric value's soft bin is a Gaussian
        kernel of its distance to the bins' centres (σ half a bin), a binary value's probability of 1 is
        (x + 1)/2, a categorical column's is its softmax; images, the mean over classes and pixels of the
        squared difference between the class's mean generated image and the measured one."""
        options = self.marginal_options
        bins, k = int(options.bins), self.num_classes
        if self.is_image:
            return class_mean_gap(lambda y: self.generator(self.latent(y.shape[0]), y), self.marginal_targets,
                                  int(options.batch_size)).mean()
        y = torch.arange(k, device=self.device).repeat_interleave(-(-int(options.batch_size) // k))
        x = self.generator(self.latent(y.shape[0]), y)
        onehot = F.one_hot(y, k).to(x.dtype)
        per_class = onehot / onehot.sum(0).clamp_min(1.0)  # rows → their class's mean
        total = x.new_zeros(())
        for j, (column, (start, end, _)) in enumerate(zip(self.data_spec["columns"], self.data_spec["spans"])):
            if column["type"] == "numeric":  # the column's bins: its edges' (the DataModule's), else `bins` equal parts
                card = numeric_bins(column, bins)
                centres = -1.0 + (2.0 * torch.arange(card, device=self.device, dtype=x.dtype) + 1.0) / card
                soft = torch.softmax(-0.5 * ((x[:, start, None] - centres) * card) ** 2, dim=1)
            elif column["type"] == "binary":
                p = ((x[:, start] + 1.0) / 2.0).clamp(0.0, 1.0)
                soft = torch.stack([1.0 - p, p], dim=1)
            else:
                soft = x[:, start:end]
            generated = per_class.t() @ soft  # [classes, card]
            target = self.marginal_targets[j, :, :soft.shape[1]].to(x.dtype)
            total = total + (target * (torch.log(target + 1e-6) - torch.log(generated + 1e-6))).sum(1).mean()
        return total / len(self.data_spec["columns"])

    # ----------------------------------------------------------------- networks
    def configure_optimizers(self):
        hp = self.hparams
        betas = tuple(hp.betas)
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=hp.lr, betas=betas)
        opt_s = torch.optim.Adam(self.student.parameters(), lr=hp.lr, betas=betas)
        # One Adam over stacked [T, ...] tensors: elementwise, so every teacher has its own moments.
        opt_t = torch.optim.Adam(self.teachers.parameters(), lr=self.teacher_options.lr, betas=betas)
        return opt_g, opt_s, opt_t

    def setup(self, stage: str) -> None:
        super().setup(stage)
        owned = owned_members(self.num_teachers, self)
        if len(owned) != self.teachers.num_teachers:  # DDP: this rank keeps (and trains) its share only
            self.teachers = self.teachers.subset(owned)
        if owned != list(range(self.num_teachers)):
            # rank-local teachers: DDP must neither broadcast rank 0's over them nor average them
            self._ddp_params_and_buffers_to_ignore = self.teachers.ddp_ignore_names("teachers.")
        self._noise_seed = shared_seed(self, self.hparams.noise_seed)
        self._noise_generator = None

    # ----------------------------------------------------------------- the vote
    def noise_generator(self) -> torch.Generator:
        """The torch.Generator of the vote noise: seeded from OS entropy (unless ``noise_seed`` is set)
        when first used in a process, never saved: its state would let anyone holding a checkpoint
        recover past noise, and a resumed run seeded afresh never replays it."""
        if self._noise_generator is None or self._noise_generator.device != self.device:
            self._noise_generator = mechanism_generator(self.device, self._noise_seed)
        return self._noise_generator

    def vote_noise(self, shape: Sequence[int]) -> torch.Tensor:
        """Lap(1/λ) noise for vote counts, float64 where the device supports it."""
        dtype = torch.float32 if self.device.type == "mps" else torch.float64
        return laplace_noise(shape, scale=1.0 / self.lam, generator=self.noise_generator(), device=self.device, dtype=dtype)

    @torch.no_grad()
    def teacher_votes(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Vote histograms ``[m, 2]`` (counts of teachers voting fake, real) for generated samples.

        Each teacher votes real when its logit is positive; the histogram is built with
        ``scatter_add`` over the ``[T, m]`` vote matrix (no loop over teachers). Under DDP each rank
        counts its own teachers' votes and the counts are summed over the ranks (before any noise).
        """
        counts = torch.zeros(x.shape[0], 2, device=x.device, dtype=torch.float64 if x.device.type != "mps" else torch.float32)
        chunk = int(self.teacher_options.vote_chunk_size)
        threshold = None
        if self.teacher_options.vote == "relative":
            # Each teacher's median logit on fresh fakes OF EACH CLASS: the teachers are conditional, and on a
            # table with a rare class every teacher's logit is far lower for it (its partition holds few or no
            # such rows), so one median over all classes makes the vote a function of the label, which the
            # generator cannot change, instead of the features, which it can.
            per_class = max(x.shape[0], int(self.teacher_options.relative_reference))
            ref_y = torch.arange(self.num_classes, device=x.device).repeat_interleave(per_class)
            ref = self.teachers.forward_shared(self._fakes(ref_y), ref_y).view(-1, self.num_classes, per_class)
            threshold = ref.median(dim=2).values  # [T, classes]
        for s in range(0, x.shape[0], chunk):
            logits = self.teachers.forward_shared(x[s:s + chunk], y[s:s + chunk])  # [T, c]
            votes = (logits > (0.0 if threshold is None else threshold[:, y[s:s + chunk].long()])).long()
            counts[s:s + chunk].scatter_add_(1, votes.t(), torch.ones_like(votes.t(), dtype=counts.dtype))
        if is_distributed():
            torch.distributed.all_reduce(counts)
        return counts

    def noisy_labels(self, counts: torch.Tensor) -> torch.Tensor:
        """``argmax_j(n_j + Lap(1/λ))`` per sample: 1 = real, 0 = fake (Yoon et al. 2019, Algorithm 1);
        with ``student.labels: share``, the noisy share of real votes (see the class doc)."""
        noisy = counts + self.vote_noise(counts.shape)
        if self.student_options.labels == "share":
            return (0.5 + (noisy[:, REAL] - noisy[:, FAKE]) / (2.0 * self.num_teachers)).clamp(0.0, 1.0).float()
        return noisy.argmax(dim=1)

    # ----------------------------------------------------------------- training
    def query_labels(self, n: int) -> torch.Tensor:
        """Labels of the generated samples that are voted on and that train the generator."""
        if self.hparams.query_labels == "uniform":
            return torch.randint(self.num_classes, (n,), device=self.device)
        return self.sample_labels(n)

    def _fakes(self, labels: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            x = self.generator(self.latent(labels.shape[0]), labels)
            return self._discrete(x) if self.hparams.get("discrete_samples", False) and self.data_spec["kind"] == "tabular" else x

    def _discrete(self, x: torch.Tensor) -> torch.Tensor:
        """Binary columns at their sign, categorical ones one-hot at their argmax (what a released row
        holds), with the soft values' gradients (straight-through)."""
        hard = x.detach().clone()
        for column, (start, end, activation) in zip(self.data_spec["columns"], self.data_spec["spans"]):
            if activation == "softmax":
                block = x[:, start:end].detach()
                hard[:, start:end] = F.one_hot(block.argmax(1), end - start).to(x.dtype)
            elif column["type"] == "binary":
                hard[:, start] = torch.where(x[:, start].detach() >= 0, 1.0, -1.0).to(x.dtype)
        return x + (hard - x).detach()

    def _student_batch(self, x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor):
        """The student's training batch: the newly labelled samples, or (``student.replay_capacity > 0``) a
        uniform draw from every labelled sample kept so far, the new ones included. Replaying paid-for
        labels is post-processing of the noisy votes: it costs no privacy."""
        cap = self.student_options.replay_capacity
        if cap == 0:
            return x, y, labels
        new = (x.detach(), y, labels)
        if self._replay is None:
            self._replay = new
        else:
            self._replay = tuple(torch.cat([old, n])[-cap:] for old, n in zip(self._replay, new))
        size = self.student_options.batch_size or x.shape[0]
        idx = torch.randint(len(self._replay[2]), (size,), device=x.device)
        return tuple(t[idx] for t in self._replay)

    def _teacher_step(self, real_x: torch.Tensor, real_y: torch.Tensor, opt_t) -> torch.Tensor:
        """One Adam step of every teacher on BCE(its real batch → 1) + BCE(shared fakes → 0)."""
        fake_y = self.sample_labels(real_y.shape[1])
        fake_x = self._fakes(fake_y)
        opt_t.zero_grad()
        loss = self.teachers.accumulate_teacher_grads(
            real_x, real_y, fake_x, fake_y, chunk_size=self.teacher_options.chunk_size)
        self.step_uncounted(opt_t)
        return loss / real_y.shape[0]

    def training_step(self, batch, batch_idx):
        if self.budget_exhausted:
            return None
        real_x, real_y = batch  # [T, b, ...], [T, b]: teacher t's rows come only from its own partition (this rank's T)
        if real_y.shape[0] != self.teachers.num_teachers:
            raise RuntimeError(f"expected batches for {self.teachers.num_teachers} teachers, got {real_y.shape[0]}")
        opt_g, opt_s, opt_t = self.optimizers()
        hp = self.hparams
        m = hp.query_batch_size
        if self.marginal_noise is not None and not self.measured() and not self.measure_marginals():
            return None  # the budget refused the measurement: nothing trains
        if not self.ensure_warm_started():
            return None  # the budget refused the warm start's release

        for _ in range(self.teacher_options.steps):
            t_loss = self._teacher_step(real_x, real_y, opt_t)

        real_fraction, margins = [], []
        for _ in range(self.student_options.steps):
            y = self.query_labels(m)
            x = self._fakes(y)  # generator outputs only: the student never sees a real row
            counts = self.teacher_votes(x, y)
            gaps = (counts[:, REAL] - counts[:, FAKE]).abs()
            if not self.charge(LaplaceVoteEvent(gaps, self.lam)):  # before the labels are used
                return None
            labels = self.noisy_labels(counts)
            xs, ys, ls = self._student_batch(x, y, labels)
            s_loss = F.binary_cross_entropy_with_logits(self.student(xs, ys), ls.float())
            opt_s.zero_grad()
            replicated_backward(self, s_loss, params=self.student.parameters())
            self.step_uncounted(opt_s)
            real_fraction.append(labels.float().mean())
            margins.append(gaps.mean() / self.num_teachers)

        y = self.query_labels(m)
        g_loss = F.binary_cross_entropy_with_logits(self.student(self._fakes(y, grad=True), y), torch.ones(m, device=self.device))
        if self.measured():
            m_loss = self.marginal_loss()
            self.log("mean_image_mse" if self.is_image else "marginal_kl", m_loss.detach())  # generator vs the noisy release: public
            g_loss = g_loss + self.marginal_options.weight * m_loss
        g_loss = g_loss + self.warm_start_pull()  # the warm start's release keeps its pull (0 without one)
        opt_g.zero_grad()
        replicated_backward(self, g_loss, params=self.generator.parameters())
        opt_g.step()
        if self.generator_ema is not None:
            self.update_generator_average(self.generator_options.ema_decay)

        # Post-processing of the noisy labels only; teacher quantities are private (opt-in below).
        self.log_dict({"s_loss": s_loss.detach(), "g_loss": g_loss.detach(),
                       "noisy_real_fraction": torch.stack(real_fraction).mean()}, prog_bar=True)
        self.log_private({"t_loss": t_loss, "vote_margin": torch.stack(margins).mean().float()})
        return None

    # ----------------------------------------------------------------- checkpoints
    TEACHER_OPTIMIZER = 2  # configure_optimizers: generator, student, teachers

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # every rank comes here: the checkpoint (written by rank 0) holds every teacher, in id order
        gather_members(checkpoint, owned=self.teachers.teacher_ids.tolist(), prefixes=["teachers."],
                       optimizer_indices=[self.TEACHER_OPTIMIZER])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        select_members(checkpoint, owned=self.teachers.teacher_ids.tolist(), prefixes=["teachers."],
                       optimizer_indices=[self.TEACHER_OPTIMIZER])

    # ----------------------------------------------------------------- reporting
    def on_train_start(self) -> None:
        super().on_train_start()
        split = self.budget_split()
        self.print("PATE-GAN privacy budget split: " + ", ".join(f"{k}={v:.4g}" for k, v in split.items()))
        if self.logger is not None:
            self.logger.log_hyperparams({f"privacy_split/{k}": v for k, v in split.items()})

    def budget_split(self) -> dict[str, float]:
        """How the budget ε is shared: each paid metadata item, what is left for training, and λ."""
        split = {}
        metadata = self.metadata_epsilons()
        for what, epsilon in metadata.items():
            key = re.sub(r"[^\w.\- ]", "", what).strip()  # MLflow-safe parameter name
            split[f"metadata/{key}"] = epsilon
        split["metadata_total"] = float(sum(metadata.values()))
        split["epsilon_budget"] = self.epsilon_budget
        split["epsilon_spent_before_training"] = self.spent_epsilon()
        split["lam"] = self.lam
        if self.marginal_noise is not None:
            split["marginal_noise_multiplier"] = self.marginal_noise
            split["marginal_epsilon_alone"] = self.marginal_options.fraction * self.budget_limit()
        if self.warm_release is not None:
            if self.warm_release.options.source == "features":  # one Gaussian (the marginal model's plan has many events)
                split["warm_start_noise_multiplier"] = self.warm_release.noise_multiplier
            split["warm_start_epsilon_alone"] = self.warm_release.options.fraction * self.budget_limit()
        return split

    def budget_shares(self) -> list[str]:
        """With a warm start: what its share bought, and that the teachers' votes got the rest."""
        shares = self.warm_start_share()
        if shares:
            shares.append(f"the rest: the teachers' Laplace votes (λ = {self.lam:.4g}) trained the student the generator follows")
        return shares

