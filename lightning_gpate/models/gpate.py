"""G-PATE (Long et al., NeurIPS 2021): a student generator trained by an ensemble of teacher
discriminators through private gradient aggregation (DPGradAgg with Confident-GNMax)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

from lightning_gpate.models.anchor import class_mean_gap, noisy_class_feature_means, noisy_class_means
from lightning_gpate.models.aggregators import Aggregator, GaussAgg, aggregator_from, flat_aggregator_place, migrate_flat_aggregator
from lightning_gpate.models.options import GeneratorNet, OptionGroup, Teachers, flat_options, positive_int
from lightning_gpate.models.private import DEFAULT_DELTA, PrivateGenerativeModel
from lightning_gpate.models.sharding import owned_members, shared_seed
from lightning_gpate.models.warm_start import WarmStart, WarmStartMixin
from lightning_gpate.nets.ensemble import ConvTeacherEnsemble, MLPTeacherEnsemble, TeacherEnsemble
from lightning_gpate.privacy import ConfidentGNMaxEvent, GaussianSumEvent, SubsampledGaussianEvent, TopAggEvent
from lightning_gpate.privacy.dpgradagg import aggregate, project, random_projection, vote_histograms
from lightning_gpate.privacy.distributed import is_distributed
from lightning_gpate.privacy.gaussagg import gaussian_sum_release, normalized_votes
from lightning_gpate.privacy.merf import fourier_features, fourier_frequencies, kernel_curvature_scale, median_distance_of_uniform
from lightning_gpate.privacy.randomness import mechanism_generator
from lightning_gpate.privacy.topagg import sign_uniforms, topagg_release, topagg_votes, topk_stochastic_signs

TEACHERS_KEY = "gpate_teachers"
#: ``anchor.fraction``'s default under a guarantee (images and, since issue 59, tables): half of ε buys the random-feature
#: class embeddings
DEFAULT_ANCHOR_FRACTION = 0.5
#: ``anchor.features``' default where there is an anchor: 10,000 random Fourier features on images (``gpate_mnist_cpu.md``
#: rows 42-50)
DEFAULT_ANCHOR_FEATURES = 10000
#: ... and on tables (issue 59, with ``generator_steps`` below): 1,000, as useful on the validation split as 10,000 with
#: ten generator steps and a fit 4-8x faster (the anchor's term is most of a generator step)
DEFAULT_TABLE_ANCHOR_FEATURES = 1000
#: ``generator_steps``' default on tables (issue 59): ten generator steps towards each aggregation's target and the
#: anchor, where a table's budget buys few aggregations (17 at ε = 1). Chosen with the 1,000 features above on a
#: validation split of the five development tables (unaccounted tuning; ``benchmarks/results/tabular_utility_notes.md``:
#: AUROC higher on four tables, 0.016 lower on breast cancer, no run below chance); images keep the paper's one step.
DEFAULT_TABLE_GENERATOR_STEPS = 10
#: The generator (``generator``'s doc).
DEFAULT_GENERATOR = GeneratorNet(z_dim=100, latent_prior="uniform", gf_dim=64, fc_dim=1024, upsample="nearest", hidden=(256, 256),
                                 ema_decay=0.99)
#: The G-PATE paper's settings where the defaults differ (Long et al. 2021 and its official code): ``GPATE(spec,
#: **PAPER_SETTINGS, ...)`` or ``configs/mnist/gpate_paper_*.yaml``. Under a guarantee they generate noise on MNIST
#: (``gpate_paper_eps10_guarantee``: 0.081, ``benchmarks/results/mnist_table.md``).
PAPER_SETTINGS = {"aggregator": "dpgradagg", "num_bins": 10, "own_label_votes": False, "group_fakes_by_label": False,
                  "ema_decay": 0.0, "anchor_fraction": 0.0, "generator_upsample": "transposed", "generator_steps": 1}


@dataclass(frozen=True, kw_only=True)
class ClassAnchor(OptionGroup):
    """G-PATE's class anchor (:mod:`~lightning_gpate.models.anchor`, as PATE-GAN's class-mean ``marginals``): a share of
    ε buys each class's mean image, or its mean embedding under random features, once before the first step; every
    generator step then pulls the generated classes towards it (post-processing). Images and tables (a row is a flat
    vector, as the teachers see it) under ``budget_accounting: guarantee`` only.

    Args:
        fraction: the share of ε the anchor spends (null: 0.5 under the guarantee, else 0). The aggregations get the
            rest. The anchor is what makes a guaranteed G-PATE useful on MNIST and the 8×8 digits (docs/results.md), and
            what lifts it above chance on tables at ε = 1 with the other defaults; 0 is the paper.
        weight: weight of the generator's term towards the anchor. The term is ½·Σ_pixels (class mean − anchor)²
            averaged over classes: 1 pulls a class's mean image as hard as the aggregation pulls one fake.
        batch_size: generated images per generator step for the pull, every class equally. 1,000 was the peak of the
            MNIST sweep.
        unbiased: subtract the term's bias, the spread of a class's generated images. That bias otherwise pulls a
            class's images together (class_mean_gap; post-processing; needs batch_size of at least 2 a class). false:
            the plain gap.
        features: random features of the anchor (null: images 10,000, tables 1,000; 0: none). null gives those where
            there is an anchor (the MNIST ladders' and the tables' choices), else 0. 0: the anchor is each class's mean
            image. An even number 2M: each class's mean embedding under 2M random Fourier features of a Gaussian kernel
            instead (DP-MERF's release, Harder et al., AISTATS 2021, Eq. 6; L2 sensitivity 1, the same z), whose higher
            orders carry the spread within a class; the term is then ½·ℓ²·‖mean embedding − anchor‖², the mean-image
            term to first order.
        length_scale: ℓ of that kernel, public (null: √(2d/3); a list: the mean of kernels). √(2d/3) is the distance of
            two uniform points of [-1, 1]^d; a list [ℓ_1, …, ℓ_k] is the mean of k kernels, the features shared equally
            (fourier_frequencies).
        feature_seed: public seed of the features' frequencies (null: from the seeded RNG). The value used, like the
            length scale used, is stored in the hyperparameters, checkpoints and release.
    """

    fraction: float | None = None
    weight: float = 1.0
    batch_size: int = 1000
    unbiased: bool = False
    features: int | None = None
    length_scale: float | list[float] | None = None
    feature_seed: int | None = None

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 <= self.fraction < 1:
            raise ValueError(f"anchor.fraction must be in [0, 1), got {self.fraction}")
        if not 0 <= self.weight < math.inf:
            raise ValueError(f"anchor.weight must be a finite number >= 0, got {self.weight}")
        positive_int("anchor.batch_size", self.batch_size)
        if self.length_scale is not None and not isinstance(self.length_scale, (int, float)):
            object.__setattr__(self, "length_scale", [float(v) for v in self.length_scale])


def own_label_voting(real_y: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
    """``[T, m]`` bool: teacher ``t`` (real labels ``real_y[t]``, ``[T, b]``) has fake ``j``'s label ``fake_y[j]``."""
    return (real_y.long().unsqueeze(-1) == fake_y.long().to(real_y.device).view(1, 1, -1)).any(dim=1)


class _VoteUnits:
    """What one aggregation query set is about: every fake (the paper), or every label of the fake
    batch (``group_fakes_by_label``: a teacher's directions averaged over the fakes of the label)."""

    def __init__(self, y: torch.Tensor, *, by_label: bool) -> None:
        self.by_label = by_label
        if by_label:
            self.labels, self.inverse = torch.unique(y, sorted=True, return_inverse=True)
            onehot = torch.nn.functional.one_hot(self.inverse, len(self.labels)).to(torch.float32)  # [m, G]
            self.mean = (onehot / onehot.sum(0, keepdim=True)).t()  # [G, m]: the mean over each label's fakes
        else:
            self.labels = y

    @property
    def count(self) -> int:
        return int(self.labels.numel())

    def reduce(self, grads: torch.Tensor) -> torch.Tensor:
        """``[T, m, d]`` per-fake directions → ``[T, units, d]``."""
        return torch.einsum("gm,tmd->tgd", self.mean.to(grads.dtype), grads) if self.by_label else grads

    def expand(self, delta: torch.Tensor) -> torch.Tensor:
        """``[units, d]`` released directions → ``[m, d]`` (every fake gets its unit's)."""
        return delta[self.inverse] if self.by_label else delta


def _forget_anchor_frequencies(module: "GPATE", _incompatible_keys) -> None:
    """Load-state-dict post hook: a loaded state may bring another ``anchor_seed``, so the cached frequencies go."""
    module._anchor_frequencies = None


class GPATE(WarmStartMixin, PrivateGenerativeModel):
    """G-PATE: Algorithm 1 (training) with Algorithm 2 (DPGradAgg) of Long et al. (2021), DataLens'
    TopAgg (Wang, Wu, Long et al. 2021) or the Gaussian sum of normalised directions as the aggregator.

    Per iteration: every teacher takes ``teachers.steps`` Adam steps on its BCE loss (its own real
    batch from its own partition vs fakes) with **its own** Adam moments; the fakes of teacher ``t``
    carry the labels of its own real batch, ``G(z, y_t)`` (``teachers.fake_labels="teacher"``, the
    official code), or labels drawn from the class ratio and shared by all teachers
    (``"class_ratio"``). Then fakes ``x = G(z, y)`` with ``z ~ U(-1, 1)`` are voted on:

    * ``aggregator="dpgradagg"`` (G-PATE): each teacher's descent direction on every fake is
      projected with a fresh Gaussian matrix per sample, clipped to ``[−c, c]``, discretised into
      ``B`` bins and voted; each (sample, dimension) is one Confident-GNMax query; the answered bin
      centres are back-projected into ``Δx``. ``num_bins=2`` makes every vote a sign.
    * ``aggregator="topagg"`` (DataLens): each teacher keeps the ``topk`` largest coordinates of its
      direction as stochastic signs; the summed votes get N(0, σ²) noise once; coordinates above the
      threshold are released as signs: ``Δx`` ∈ {−1, 0, 1}^d.
    * ``aggregator="gaussian"`` (not in either paper; :mod:`~lightning_gpate.privacy.gaussagg`): each
      teacher's directions on all units of the aggregation form one vote of L2 norm 1; the summed votes get
      N(0, ``sigma_gaussian``²) once; ``Δx`` is the noisy mean vote. No compression, no projection:
      without noise ``Δx`` is the teachers' mean unit direction.

    The generator takes ``generator_steps`` MSE steps towards ``x̂ = x + target_scale · Δx``
    (``x̂`` a constant). ``ema_decay > 0`` keeps an exponential moving average of the generator's
    weights and samples from it (post-processing of released generators: free).

    Teachers are never released, so training them costs no privacy: ``teachers.warmup_steps`` teacher
    steps run before the first aggregation, against fakes of the untrained generator (its weights do
    not depend on the data), and record no privacy event.

    Privacy: DPGradAgg's budget check uses the worst case (every query answered) *before* the
    aggregation runs, so a step is only run when it fits whatever the noisy threshold decides; the
    recorded event is the actual one. The guarantee is the data-independent Confident-GNMax bound:
    the budget when the stop rule ended the run, else the worst case of the steps taken (every query
    answered, and under ``group_fakes_by_label`` every class present: the labels are drawn at random);
    see :meth:`~lightning_gpate.models.private.PrivateGenerativeModel.guarantee_epsilon`. The paper's
    data-dependent ε is a function of the private votes: it is computed and logged (as
    ``epsilon_data_dependent``, not a guarantee) only under ``budget_accounting: paper``. TopAgg's cost is
    data-independent (:class:`~lightning_gpate.privacy.TopAggEvent`) and charged before the noise is drawn, as is
    GaussAgg's (:class:`~lightning_gpate.privacy.GaussianSumEvent`, one Gaussian mechanism per aggregation).

    Teachers are held outside the module tree (they are never averaged by DDP); under DDP rank r owns
    teachers r, r+W, …, votes are summed with an all-reduce, and the projection and noise come from a
    generator seeded identically on every rank, so every rank applies the same generator update, and W
    processes release the generator of one (every tensor, BatchNorm buffers included) when each runs
    the same arithmetic. On CPU that means the same number of threads per process: Lightning gives each
    of W processes 1/W of the cores unless ``OMP_NUM_THREADS`` is set, CPU kernels (BatchNorm,
    transposed convolutions) round differently with the thread count, and sign votes and Adam turn
    last-bit differences into visibly different generators (1e-2 in running means after one step).

    Args:
        data_spec: the DataModule's spec (num_teachers > 0: set data.num_teachers).
        epsilon: the privacy budget ε.
        delta: δ of the (ε, δ) guarantee, well below 1/n (1e-5: up to 100,000 records).
        budget_accounting: "guarantee" (default), "paper" or "smooth_sensitivity". "guarantee" is the data-independent
            bound; "paper" the data-dependent one, not a guarantee; "smooth_sensitivity" releases the data-dependent ε
            with smooth sensitivity at the end of a run of trainer.max_steps (see the private base).
        epsilon_hard_cap, smooth_sensitivity: for budget_accounting: smooth_sensitivity (private base).
        conversion: RDP to (ε, δ) conversion.
        aggregator: the private aggregator by class: GaussAgg, DPGradAgg or TopAgg. GaussAgg (σ 40, the MNIST ladders'
            choice under a guarantee), DPGradAgg (G-PATE's paper: projection, clipping, bins, Confident-GNMax) and
            TopAgg (DataLens) each take their own parameters (--model.aggregator.help DPGradAgg); a name (dpgradagg,
            topagg, gaussian) is that class with its defaults.
        fake_batch_size: fakes per aggregation m (DPGradAgg: m × projection_dim queries).
        teachers: the teacher ensemble (a mapping of its options overrides some). How its fakes are labelled, its
            steps (and warm-up steps, free), precision, Adam settings, widths, chunking, kernels and seed
            (lightning_gpate.models.options.Teachers).
        own_label_votes: teachers vote only on fakes of labels in their real batch (the paper: false). With few images
            per teacher most teachers have never seen a fake's class; the abstention depends on the teacher's own data
            only, so the sensitivity is unchanged. The threshold (threshold_fraction × all teachers) then counts only
            voters.
        group_fakes_by_label: one aggregated direction per label, not per fake (the paper: false). Each teacher averages
            its directions over the fakes of a label, the aggregation runs on these averages (one query set per label,
            so fewer queries per step), and every fake of the label moves by its label's released direction. Under heavy
            noise the generator then learns class templates instead of fitting each fake's noise. A teacher's average
            depends on its own data only: the sensitivity holds.
        generator_lr: the generator's Adam learning rate.
        generator_betas: the generator's Adam betas.
        target_scale: the step towards the votes, x̂ = x + target_scale · Δx (the paper: 1). TopAgg's α; any value is
            post-processing.
        generator_steps: generator steps per aggregation (null: 10 on tables, 1 on images). Each steps towards the same
            x̂ (post-processing); tables get more because their budget buys few aggregations
            (DEFAULT_TABLE_GENERATOR_STEPS).
        generator: the generator network (a mapping of its options overrides some). z 100 from U(-1, 1) as in the
            paper; images a DCGAN of gf_dim 64 and fc_dim 1,024 with upsample: nearest (nearest ×2 then a
            convolution, no checkerboard lattice; the paper's transposed draws lattices at 28×28); tables an MLP of
            (256, 256); ema_decay 0.99, the weight average that samples (the MNIST ladders' choice; 0: none, the
            paper).
        anchor: the class anchor, bought once with a share of ε. By default, under the guarantee (images and tables),
            half of ε buys each class's mean embedding under random features (10,000 on images, 1,000 on tables) once
            and every generator step pulls towards it. With a warm_start its default is none (the warm start's release
            takes its place).
        warm_start: a private warm start, a mapping of its options (null: none). Its share of ε buys DP-MERF's release
            once before the first aggregation, the generator takes its steps on it (post-processing), and every
            generator step may keep its pull (anchor_weight); the one every private GAN takes. Not together with an
            anchor of its own: one release of the classes.
        noise_seed: seed of the mechanisms' noise, for tests only (null: secret, from the OS). A fixed seed makes the
            noise reproducible by anyone who knows it.
        log_private_diagnostics: also log the teachers' loss, unnoised (debugging only).
    """

    SUPPORTS_SMOOTH_SENSITIVITY = True  # Confident-GNMax: threshold and GNMax steps
    FLAT_OPTIONS = {**flat_options(generator_hidden="hidden"),
                    **{f"teacher_{name}": (f"teachers.{name}",) for name in ("fake_labels", "steps", "warmup_steps", "precision", "lr",
                                                                              "betas", "hidden", "channels", "fc", "chunk_size",
                                                                              "conv_impl", "seed")},
                    **{f"anchor_{name}": (f"anchor.{name}",) for name in ("fraction", "weight", "batch_size", "unbiased", "features",
                                                                            "length_scale", "feature_seed")}}
    #: Options removed (issue 47: no shipped config used them, no ladder found them useful), with the value that
    #: meant "off": a release saved before keeps loading when it holds that value (:func:`~lightning_gpate.release.model_from_release`).
    REMOVED_OPTIONS = {"normalize_directions": False, "gaussian_basis_dim": None, "teacher_augment_shift": 0}
    #: Options whose ``None`` the constructor resolves (from the data's shape, the accounting mode, the seeded RNG)
    #: and stores resolved (:meth:`store_resolved_hparams`): a resume that leaves them ``None`` asks for nothing.
    RESOLVED_HPARAMS = ("generator_steps", "anchor.fraction", "anchor.features", "anchor.length_scale", "anchor.feature_seed")

    @classmethod
    def migrate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The generator's and teachers' flat names, then the aggregator's: a name and its flat parameters of before
        the groups become the aggregator object (:func:`~lightning_gpate.models.aggregators.migrate_flat_aggregator`)."""
        return migrate_flat_aggregator(super().migrate_options(options))

    @classmethod
    def flat_option_place(cls, name: str) -> tuple[str, str] | None:
        """A group's flat name, else an aggregator's parameter (:func:`~lightning_gpate.models.aggregators.flat_aggregator_place`)."""
        return super().flat_option_place(name) or flat_aggregator_place(name)

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
        aggregator: Aggregator | str = GaussAgg(),
        generator: GeneratorNet = DEFAULT_GENERATOR,
        fake_batch_size: int = 32,
        teachers: Teachers = Teachers(),
        own_label_votes: bool = True,
        group_fakes_by_label: bool = True,
        generator_lr: float = 1e-3,
        generator_betas: tuple[float, float] = (0.5, 0.999),
        target_scale: float = 1.0,
        generator_steps: int | None = None,
        anchor: ClassAnchor = ClassAnchor(),
        warm_start: WarmStart | None = None,
        noise_seed: int | None = None,
        log_private_diagnostics: bool = False,
    ) -> None:
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        super().__init__(
            data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting, conversion=conversion,
            z_dim=net_options.z_dim, latent_prior=net_options.latent_prior, log_private_diagnostics=log_private_diagnostics,
            epsilon_hard_cap=epsilon_hard_cap, smooth_sensitivity=smooth_sensitivity,
        )
        self.num_teachers = int(data_spec.get("num_teachers", 0))
        if self.num_teachers < 1:
            raise ValueError("G-PATE needs teachers: set data.num_teachers (e.g. 2000) in the data config")
        agg = aggregator_from(aggregator)
        teacher_options = Teachers.of(teachers, Teachers(), name="teachers")
        requested_generator_steps = generator_steps
        if generator_steps is None:
            generator_steps = 1 if self.is_image else DEFAULT_TABLE_GENERATOR_STEPS
        for name, value in (("fake_batch_size", fake_batch_size), ("generator_steps", generator_steps)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        anchor_options = ClassAnchor.of(anchor, ClassAnchor(), name="anchor")
        requested = {f"anchor.{k}": getattr(anchor_options, k) for k in ("fraction", "features", "length_scale", "feature_seed")}
        anchor_fraction, anchor_features = anchor_options.fraction, anchor_options.features
        anchor_length_scale, anchor_feature_seed = anchor_options.length_scale, anchor_options.feature_seed
        if anchor_fraction is None:  # the default: the anchor wherever it can be measured, unless a warm start takes its place
            anchor_fraction = DEFAULT_ANCHOR_FRACTION if budget_accounting == "guarantee" and warm_start is None else 0.0
        elif anchor_fraction > 0 and warm_start is not None:
            raise ValueError("warm_start and anchor.fraction > 0 would release the classes twice: the warm start's release "
                             "(with warm_start.anchor_weight for its pull) replaces the anchor; set anchor.fraction: 0 or drop warm_start")
        if anchor_fraction > 0 and budget_accounting != "guarantee":
            raise ValueError("anchor.fraction measures each class's mean image (or row): budget_accounting: guarantee only")
        if anchor_options.unbiased and anchor_options.batch_size < 2 * self.num_classes:
            raise ValueError(f"anchor.unbiased needs at least 2 generated images a class: anchor.batch_size >= "
                             f"{2 * self.num_classes}, got {anchor_options.batch_size}")
        dim = int(np.prod(self.data_spec["shape"]))
        if anchor_features is None:  # the default: random features wherever there is an anchor
            anchor_features = (DEFAULT_ANCHOR_FEATURES if self.is_image else DEFAULT_TABLE_ANCHOR_FEATURES) if anchor_fraction > 0 else 0
        if anchor_features:
            if not anchor_fraction > 0:
                raise ValueError(f"anchor.features={anchor_features} chooses what the anchor measures: it needs anchor.fraction > 0")
            if anchor_length_scale is None:
                anchor_length_scale = median_distance_of_uniform(dim)
            fourier_frequencies(anchor_features, 1, anchor_length_scale, 0)  # validates both
            if anchor_feature_seed is None:  # public: the random state seed_everything governs
                anchor_feature_seed = int(torch.randint(2**31 - 1, (1,)))
        anchor_options = replace(anchor_options, fraction=anchor_fraction, features=anchor_features, length_scale=anchor_length_scale,
                                 feature_seed=anchor_feature_seed)
        if agg.name == "topagg" and agg.topk > dim:
            raise ValueError(f"TopAgg's topk must be at most the data dimension {dim}, got {agg.topk}")
        if agg.name != "dpgradagg" and budget_accounting == "smooth_sensitivity":
            raise ValueError("budget_accounting: smooth_sensitivity releases Confident-GNMax's data-dependent cost; "
                             f"{type(agg).__name__}'s cost is data-independent already: use budget_accounting: guarantee")
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options, aggregator=agg, teachers=teacher_options, anchor=anchor_options)
        self.aggregator, self.teacher_options, self.anchor_options = agg, teacher_options, anchor_options
        self.store_resolved_hparams({**requested, "generator_steps": requested_generator_steps}, generator_steps=generator_steps,
                                    **{f"anchor.{k}": getattr(anchor_options, k) for k in ("fraction", "features", "length_scale", "feature_seed")})
        self.automatic_optimization = False
        self.generator_options = net_options
        self.generator = self.build_generator(net_options)
        if net_options.averaged:
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False)
        self.threshold = agg.threshold(self.num_teachers)
        # Teachers are deliberately NOT registered submodules (object.__setattr__ below): DDP must never
        # average them across ranks, and a released generator checkpoint must not depend on them.
        object.__setattr__(self, "_teachers", None)
        self._teacher_opt: torch.optim.Optimizer | None = None
        self._pending_teacher_state: dict | None = None
        self._shared_gen: torch.Generator | None = None
        self.teacher_warmup_done = 0
        self.init_warm_start(warm_start)
        self.anchor_noise = self.plan_gaussian_noise(anchor_fraction) if anchor_fraction > 0 else None
        if self.anchor_noise is not None:  # each class's noisy mean image in [-1, 1] or mean embedding: a DP release, public once measured
            shape = (anchor_features,) if anchor_features else tuple(self.data_spec["shape"])
            self.register_buffer("anchor_targets", torch.zeros(self.num_classes, *shape))
            if anchor_features:  # the features' public seed, in checkpoints: a resume redraws the frequencies it was measured with
                self.register_buffer("anchor_seed", torch.tensor(int(anchor_feature_seed), dtype=torch.int64))
            self.register_buffer("anchor_measured", torch.zeros((), dtype=torch.bool))
        # the frequencies drawn from anchor_seed, kept between steps; a loaded state (a resume) may bring another seed
        self._anchor_frequencies: torch.Tensor | None = None
        self.register_load_state_dict_post_hook(_forget_anchor_frequencies)  # a module-level function: ddp_spawn pickles the module

    # ----------------------------------------------------------------- teachers
    def _build_teachers(self, teacher_ids: Sequence[int]) -> TeacherEnsemble:
        net = self.teacher_options
        if self.is_image:
            return ConvTeacherEnsemble(
                teacher_ids=teacher_ids, in_shape=self.data_spec["shape"], num_classes=self.num_classes,
                channels=net.channels, fc=net.fc, seed=net.seed, conv_impl=net.conv_impl,
            )
        return MLPTeacherEnsemble(
            teacher_ids=teacher_ids, in_features=self.data_spec["shape"][0], num_classes=self.num_classes,
            hidden=net.hidden, seed=net.seed,
        )

    @property
    def teachers(self) -> TeacherEnsemble:
        """This process's teachers (built on first use, on the module's current device)."""
        if self._teachers is None:
            self._build_owned_teachers()
        return self._teachers

    def on_fit_start(self) -> None:
        self._build_owned_teachers()  # after the strategy placed the model and restored a checkpoint

    def _build_owned_teachers(self) -> None:
        if self._teachers is not None:
            return
        object.__setattr__(self, "_teachers", self._build_teachers(owned_members(self.num_teachers, self)).to(self.device))
        # One Adam over the stacked tensors: elementwise, so every teacher keeps its own moments. Fused:
        # one kernel over the stacked tensors (the unfused loop took a third of a CPU iteration).
        self._teacher_opt = torch.optim.Adam(self._teachers.parameters(), lr=self.teacher_options.lr, betas=self.teacher_options.betas,
                                             fused=self.device.type in ("cpu", "cuda"))
        if self._pending_teacher_state is not None:
            self._load_teacher_state(self._pending_teacher_state)
            self._pending_teacher_state = None

    def configure_optimizers(self):
        hp = self.hparams
        return torch.optim.Adam(self.generator.parameters(), lr=hp.generator_lr, betas=tuple(hp.generator_betas))

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self._shared_gen = mechanism_generator(self.device, shared_seed(self, self.hparams.noise_seed))

    # ----------------------------------------------------------------- the iteration
    def _teacher_autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.teacher_options.precision == "bf16")

    def _teacher_fakes(self, real_y: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Fakes of one teacher step: ``([T, b, ...], [T, b])`` with every teacher's own real labels
        (one generator pass over b latents × all classes, gathered per teacher), or ``([m, ...], [m])``
        with labels from the class ratio, shared by all teachers."""
        hp = self.hparams
        with torch.no_grad():
            if self.teacher_options.fake_labels == "class_ratio":
                m = hp.fake_batch_size
                z = self.latent(m, generator=gen)
                y = torch.multinomial(self.class_ratio, m, replacement=True, generator=gen).to(self.device)
                return self.generator(z, y), y
            b, Y = real_y.shape[1], self.num_classes
            z = self.latent(b, generator=gen)
            table = self.generator(z.repeat_interleave(Y, dim=0), torch.arange(Y, device=self.device).repeat(b))
            idx = torch.arange(b, device=self.device).unsqueeze(0) * Y + real_y.to(self.device).long()  # [T, b]
            return table[idx], real_y

    def _teacher_step(self, real_x: torch.Tensor, real_y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """One Adam step of every teacher (own moments) on its own real batch vs new fakes."""
        fakes, fake_y = self._teacher_fakes(real_y, gen)
        # None, not zeros: the chunks write every teacher's gradient once (a copy into fresh memory, no
        # memset of the whole stacked gradient and no add: 4.4 GB each at 2000 MNIST teachers)
        self._teacher_opt.zero_grad(set_to_none=True)
        with self._teacher_autocast():
            loss = self.teachers.accumulate_teacher_grads(real_x, real_y, fakes, fake_y,
                                                          chunk_size=self.teacher_options.chunk_size)
        self._teacher_opt.step()
        return loss

    def training_step(self, batch, batch_idx):
        hp = self.hparams
        real_x, real_y = batch  # [T_local, b, ...]: each teacher's batch from its own partition
        self.teachers  # noqa: B018 - built on first use
        if self._shared_gen is None or self._shared_gen.device != self.device:
            self.setup("fit")
        gen = self._shared_gen

        # the class-mean anchor, paid for and measured once before anything else (resumed runs have it)
        if self.anchor_noise is not None and not bool(self.anchor_measured) and not self.measure_anchor():
            return None
        # the warm start: its release paid for and measured once, then its generator steps (a resume has them);
        # the latents from the shared generator, as the fakes': every DDP rank takes the same steps
        if not self.ensure_warm_started(generator=gen):
            return None

        # 0. warm-up: teacher steps only, before the generator ever changes (no aggregation, no privacy event)
        if self.teacher_warmup_done < self.teacher_options.warmup_steps:
            with record_function("gpate/teacher_step"):
                self._teacher_step(real_x, real_y, gen)
            self.teacher_warmup_done += 1
            return None

        # 1. the teachers' step(s)  (record_function: the phases benchmarks/results/gpate_step_profile_cpu.md reports)
        with record_function("gpate/teacher_step"):
            for _ in range(self.teacher_options.steps):
                teacher_loss = self._teacher_step(real_x, real_y, gen)

        # 2. fakes to vote on, identical on every rank (latent and labels from the shared generator)
        with record_function("gpate/fakes"):
            m = hp.fake_batch_size
            z = self.latent(m, generator=gen)
            y = torch.multinomial(self.class_ratio, m, replacement=True, generator=gen).to(self.device)
            x = self.generator(z, y)
            fakes = x.detach()

        # 3. private aggregation of the teachers' directions on the fakes (None: over budget)
        units = _VoteUnits(y, by_label=hp.group_fakes_by_label)
        voting = None
        if hp.own_label_votes:  # [T_local, units]: teacher t has the unit's label in its own real batch
            voting = own_label_voting(real_y.to(self.device), units.labels)
        aggregate_ = {"dpgradagg": self._aggregate_dpgradagg, "topagg": self._aggregate_topagg,
                      "gaussian": self._aggregate_gaussian}[self.aggregator.name]
        delta, released = aggregate_(fakes, y, units, gen, voting)
        if delta is None:
            return None
        delta = units.expand(delta)

        # 4. generator step(s) towards x̂ = x + Δx (x̂ a constant)
        with record_function("gpate/generator_step"):
            target = (fakes.flatten(1) + hp.target_scale * delta).view_as(fakes)
            opt_g = self.optimizers()
            for step in range(hp.generator_steps):
                out = x if step == 0 else self.generator(z, y)
                g_loss = 0.5 * (out - target).flatten(1).pow(2).sum(dim=1).mean()
                if self.anchor_noise is not None and self.anchor_options.weight > 0:
                    g_loss = g_loss + self.anchor_options.weight * self.anchor_loss()
                g_loss = g_loss + self.warm_start_pull(gen)  # the release keeps its pull (0 without one); the shared latents, as the anchor
                opt_g.zero_grad()
                self.manual_backward(g_loss)
                opt_g.step() if step == hp.generator_steps - 1 else self.step_uncounted(opt_g)
            if self.generator_options.averaged:
                self.update_generator_average(self.generator_options.ema_decay)
        # released: the answered mask (noisy threshold), TopAgg's released coordinates or the norm of
        # GaussAgg's noisy mean vote, and the loss towards the noisy target x̂; the teachers' loss is a
        # statistic of the private data
        released_key = {"dpgradagg": "answered_fraction", "topagg": "released_fraction", "gaussian": "released_norm"}
        self.log_dict({"g_loss": g_loss.detach(), released_key[self.aggregator.name]: released}, prog_bar=True)
        self.log_private({"teacher_loss": teacher_loss / self.num_teachers})

    # ----------------------------------------------------------------- the class-mean anchor
    def anchor_event(self) -> SubsampledGaussianEvent:
        """The anchor's measurement: one Gaussian of noise multiplier ``anchor_noise`` (sampling rate 1)."""
        return SubsampledGaussianEvent(noise_multiplier=self.anchor_noise, sampling_rate=1.0)

    def events_before_first_step(self) -> list:
        """The anchor's measurement or the warm start's release while it is still to be paid (see the private base)."""
        anchor = [self.anchor_event()] if self.anchor_noise is not None and not bool(self.anchor_measured) else []
        return anchor + self.warm_start_events()

    def budget_shares(self) -> list[str]:
        """With the anchor: its share bought one release of each class's mean (embedding), the rest the
        aggregations of the teachers' votes the run made (public facts: the shares, the noise, the steps)."""
        warm = self.warm_start_share()
        if self.anchor_noise is None and not warm:
            return []
        hp = self.hparams
        steps = int(self.trainer.global_step) if self._trainer is not None else 0
        mechanism = self.aggregator.describe()
        votes = (f"the rest bought {steps:,} aggregation{'' if steps == 1 else 's'} of {self.num_teachers:,} teachers' "
                 f"votes ({mechanism})")
        if hp.target_scale == 0:
            votes += "; target_scale 0: the generator ignored them"
        if warm:
            return [*warm, votes]
        share = self.anchor_options.fraction
        what = (f"each class's mean embedding under {self.anchor_options.features:,} random features" if self.anchor_options.features
                else "each class's mean image")
        made = "released once" if bool(self.anchor_measured) else "not released yet"
        return [f"{share:.0%} of the budget (ε {share * self.budget_limit():g} alone) bought the anchor: {what}, {made} "
                f"(noise multiplier {self.anchor_noise:.3g}); every generator step pulls towards it for free", votes]

    def measure_anchor(self) -> bool:
        """Pay for and measure each class's mean image on the whole training split (the DataModule's).
        Returns ``False`` (nothing measured) when the budget refuses it."""
        datamodule = self.whole_split_datamodule("anchor.fraction")
        if not self.charge(self.anchor_event()):
            return False
        return self._measure_mean_images(*datamodule.model_space("train"))

    def anchor_frequencies(self) -> torch.Tensor:
        """The random Fourier features' frequencies ``[anchor_features/2, d]``, redrawn from the stored public seed."""
        if self._anchor_frequencies is None or self._anchor_frequencies.device != self.device:
            frequencies = fourier_frequencies(self.anchor_options.features, int(np.prod(self.data_spec["shape"])), self.anchor_options.length_scale,
                                              int(self.anchor_seed))
            self._anchor_frequencies = frequencies.to(self.device)
        return self._anchor_frequencies

    def _measure_mean_images(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """:func:`~lightning_gpate.models.anchor.noisy_class_means` with the mechanisms' secret generator
        (the same on every rank under DDP, so every replica holds the same release)."""
        if self._shared_gen is None or self._shared_gen.device != self.device:
            self.setup("fit")
        if self.anchor_options.features:
            means = noisy_class_feature_means(x, y, self.anchor_frequencies().to(x.device), num_classes=self.num_classes,
                                              noise_multiplier=self.anchor_noise, generator=self._shared_gen)
        else:
            means = noisy_class_means(x, y, num_classes=self.num_classes, noise_multiplier=self.anchor_noise, generator=self._shared_gen)
        with torch.no_grad():
            self.anchor_targets.copy_(means.to(self.anchor_targets.device))
            self.anchor_measured.fill_(True)
        return True

    def anchor_loss(self) -> torch.Tensor:
        """``½·Σ_pixels (class mean − anchor)²`` averaged over classes, on ``anchor.batch_size`` fresh images
        (the same units as the step's loss towards ``x̂``, which is per fake). The latents come from the shared
        generator, as the fakes' do: every DDP rank computes the same term on its replica. With ``anchor.features``:
        ``½·ℓ²·‖mean embedding − anchor‖²`` averaged over classes (the same to first order; several ℓ: the ℓ² of
        :func:`~lightning_gpate.privacy.merf.kernel_curvature_scale`)."""
        d = self.anchor_targets[0].numel()
        gen = self._shared_gen
        features, scale = None, 1.0
        if self.anchor_options.features:
            frequencies = self.anchor_frequencies()
            features = lambda x: fourier_features(x, frequencies)  # noqa: E731
            scale = kernel_curvature_scale(self.anchor_options.length_scale)
        gap = class_mean_gap(lambda y: self.generator(self.latent(y.shape[0], generator=gen), y), self.anchor_targets,
                             int(self.anchor_options.batch_size), features, unbiased=self.anchor_options.unbiased)
        return 0.5 * scale * d * gap.mean()

    def _directions(self, fakes: torch.Tensor, y: torch.Tensor, units: "_VoteUnits"):
        """``(t0, t1, directions [t1 − t0, units, d])`` per chunk of this process's teachers: the teachers
        run under the teacher precision, what follows (projections, votes) in fp32."""
        chunks = self.teachers.iter_input_grads(fakes, y, chunk_size=self.teacher_options.chunk_size)
        while True:
            with self._teacher_autocast():
                chunk = next(chunks, None)
            if chunk is None:
                return
            t0, t1, grads = chunk
            yield t0, t1, units.reduce(grads.float())

    def _aggregate_dpgradagg(self, fakes: torch.Tensor, y: torch.Tensor, units: "_VoteUnits", gen: torch.Generator,
                             voting=None):
        """DPGradAgg (G-PATE Alg. 2): ``(Δx [units, d], answered fraction)``, or ``(None, None)`` when
        the worst case of this step does not fit the budget (nothing is recorded then)."""
        m, d = units.count, fakes[0].numel()
        P = random_projection(m, d, self.aggregator.projection_dim, generator=gen, device=self.device, dtype=fakes.dtype)
        votes = torch.zeros(m, self.aggregator.projection_dim, self.aggregator.num_bins, dtype=torch.long, device=self.device)
        with record_function("gpate/votes"):
            for t0, t1, grads in self._directions(fakes, y, units):
                votes += vote_histograms(project(grads, P), clip=self.aggregator.clip, num_bins=self.aggregator.num_bins,
                                         voting=None if voting is None else voting[t0:t1])
            if is_distributed():
                dist.all_reduce(votes)

        # budget check on the worst case (all answered) before the mechanism runs
        with record_function("gpate/budget"):
            flat_votes = votes.reshape(-1, self.aggregator.num_bins).cpu().numpy()
            if not self.reserve(self._event(flat_votes, np.ones(len(flat_votes), dtype=bool))):
                return None, None
        with record_function("gpate/aggregate"):
            delta, answered = aggregate(
                votes, P, clip=self.aggregator.clip, num_bins=self.aggregator.num_bins, threshold=self.threshold,
                sigma_threshold=self.aggregator.sigma_threshold, sigma_gnmax=self.aggregator.sigma_gnmax, generator=gen,
            )
        with record_function("gpate/budget"):
            worst = self._event(np.zeros((self._max_units() * self.aggregator.projection_dim, self.aggregator.num_bins)),
                                np.ones(self._max_units() * self.aggregator.projection_dim, dtype=bool))
            self.record(self._event(flat_votes, answered.reshape(-1).cpu().numpy()), worst_case=worst)  # <= the reserved cost
        return delta, answered.float().mean()

    def _aggregate_topagg(self, fakes: torch.Tensor, y: torch.Tensor, units: "_VoteUnits", gen: torch.Generator,
                          voting=None):
        """TopAgg (DataLens Alg. 2): ``(Δx [units, d] in {−1, 0, 1}, released fraction)``, or
        ``(None, None)`` when its (data-independent) cost does not fit the budget."""
        m, d = units.count, fakes[0].numel()
        # uniforms of the stochastic signs for ALL teachers (same draws on every rank), rows by global id
        uniforms = sign_uniforms(self.num_teachers, m, self.aggregator.topk, generator=gen, device=self.device) if self.aggregator.stochastic else None
        votes = torch.zeros(m, d, dtype=torch.long, device=self.device)
        ids = self.teachers.teacher_ids
        with record_function("gpate/votes"):
            for t0, t1, grads in self._directions(fakes, y, units):
                u = None if uniforms is None else uniforms[ids[t0:t1]]
                index, sign = topk_stochastic_signs(grads, self.aggregator.topk, u, max_grad=self.aggregator.max_grad)
                votes += topagg_votes(index, sign, d, None if voting is None else voting[t0:t1])
            if is_distributed():
                dist.all_reduce(votes)
        with record_function("gpate/budget"):
            if not self.charge(TopAggEvent(num_samples=m, topk=self.aggregator.topk, sigma=self.aggregator.sigma),
                               worst_case=TopAggEvent(num_samples=self._max_units(), topk=self.aggregator.topk, sigma=self.aggregator.sigma)):
                return None, None
        with record_function("gpate/aggregate"):
            delta = topagg_release(votes, threshold=self.threshold, sigma=self.aggregator.sigma, generator=gen).to(fakes.dtype)
        return delta, delta.abs().mean()

    def _aggregate_gaussian(self, fakes: torch.Tensor, y: torch.Tensor, units: "_VoteUnits", gen: torch.Generator,
                            voting=None):
        """GaussAgg (:mod:`~lightning_gpate.privacy.gaussagg`): ``(Δx [units, d], norm of the release)``, or
        ``(None, None)`` when its (data-independent) cost does not fit the budget."""
        total = None
        with record_function("gpate/votes"):
            for t0, t1, grads in self._directions(fakes, y, units):
                # summed in float64: the sum then rounds to the same float32 however the teachers are split into
                # chunks and DDP ranks (a last-bit difference in the release becomes an Adam step of a bias whose
                # true gradient is 0, e.g. before a BatchNorm)
                votes = normalized_votes(grads, None if voting is None else voting[t0:t1]).sum(0, dtype=torch.float64)
                total = votes if total is None else total.add_(votes)
            if is_distributed():
                dist.all_reduce(total)
            total = total.float()
        with record_function("gpate/budget"):
            if not self.charge(GaussianSumEvent(num_sums=1, sensitivity=2.0, sigma=self.aggregator.sigma)):
                return None, None
        with record_function("gpate/aggregate"):
            release = gaussian_sum_release(total, sigma=self.aggregator.sigma, num_teachers=self.num_teachers, generator=gen)
        return release.to(fakes.dtype), release.norm()

    @torch.no_grad()
    def _max_units(self) -> int:
        """The most vote units a step can have: the fake batch, or (``group_fakes_by_label``) the classes
        it can hold. How many it has is drawn with the labels: the worst case counts the most."""
        m = self.hparams.fake_batch_size
        return min(m, self.num_classes) if self.hparams.group_fakes_by_label else m

    def _event(self, votes: np.ndarray, answered: np.ndarray) -> ConfidentGNMaxEvent:
        return ConfidentGNMaxEvent(votes, answered, self.threshold, self.aggregator.sigma_threshold, self.aggregator.sigma_gnmax)

    # ----------------------------------------------------------------- checkpoints
    def _local_teacher_state(self) -> dict:
        t = self.teachers
        opt_state = self._teacher_opt.state_dict()["state"]
        names = t.param_names
        return {
            "ids": t.teacher_ids.cpu(),
            "warmup_done": self.teacher_warmup_done,
            "params": {n: getattr(t, n).detach().cpu() for n in names},
            "adam": {n: {k: v.cpu() for k, v in opt_state.get(i, {}).items()} for i, n in enumerate(names)},
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self._teachers is None:
            if self._pending_teacher_state is not None:
                checkpoint[TEACHERS_KEY] = self._pending_teacher_state
            return
        # Only Lightning (training) checkpoints come here: they are private, local, and written only
        # when checkpoints were asked for; the release artifact never holds teachers.
        local = self._local_teacher_state()
        if not is_distributed():  # one process owns every teacher, in id order: no copy, no merge
            checkpoint[TEACHERS_KEY] = local
            return
        parts = [None] * dist.get_world_size()  # every rank calls this hook; gather all teachers
        dist.all_gather_object(parts, local)
        ids = torch.cat([p["ids"] for p in parts])
        order = ids.argsort()
        merged = {"ids": ids[order], "warmup_done": local["warmup_done"], "params": {}, "adam": {}}
        for n in local["params"]:
            merged["params"][n] = torch.cat([p["params"][n] for p in parts])[order]
            states = [p["adam"][n] for p in parts]
            merged["adam"][n] = {
                k: (states[0][k] if states[0][k].ndim == 0 else torch.cat([s[k] for s in states])[order])
                for k in states[0]
            }
        checkpoint[TEACHERS_KEY] = merged

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get(TEACHERS_KEY)
        if state is None:
            return
        if self._teachers is None:
            self._pending_teacher_state = state
        else:
            self._load_teacher_state(state)

    def _load_teacher_state(self, state: dict) -> None:
        t = self.teachers
        saved = {int(g): i for i, g in enumerate(state["ids"].tolist())}
        wanted = t.teacher_ids.tolist()
        missing = [g for g in wanted if g not in saved]
        if missing:
            raise ValueError(f"checkpoint lacks teachers {missing[:5]}...: resume with the same data.num_teachers")
        idx = torch.tensor([saved[g] for g in wanted])
        self.teacher_warmup_done = int(state.get("warmup_done", self.teacher_options.warmup_steps))
        names = t.param_names
        with torch.no_grad():
            for n in names:
                getattr(t, n).copy_(state["params"][n][idx].to(self.device))
        opt_state = {"state": {}, "param_groups": self._teacher_opt.state_dict()["param_groups"]}
        for i, n in enumerate(names):
            adam = state["adam"].get(n, {})
            if adam:
                opt_state["state"][i] = {k: (v if v.ndim == 0 else v[idx]).to(self.device) for k, v in adam.items()}
        self._teacher_opt.load_state_dict(opt_state)
