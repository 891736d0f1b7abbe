"""DP-MERF (Harder, Adamczewski & Park, AISTATS 2021): a generator trained to match one noisy release of
the data's random-feature mean embedding.

The fit's first step reads the whole training split once and releases, with the Gaussian mechanism, the
sum of every record's embedding ``e_y ⊗ [a·φ(x), b]`` (random Fourier features of a Gaussian kernel,
the label as a one-hot outer product, and the class count beside it; L2 sensitivity exactly 1 under
add/remove: :mod:`lightning_gpate.privacy.merf`). That is the run's only privacy event
(:class:`~lightning_gpate.privacy.SubsampledGaussianEvent` with sampling rate 1: the plain Gaussian
mechanism), charged before the data is read; its noise multiplier is the smallest that fits the
budget left after any DP metadata, unless given. Every later step is post-processing: the generator
(a small conditional convolutional net for images, an MLP for tables) takes an Adam step on

    Σ_c p̂_c ‖ mean_j φ(G(z_j, c)) − μ̂_c ‖²,

with μ̂_c the released sum of class c's features over its released count (the paper's Eq. 7 with its
mean embedding split by class), p̂_c the class shares (released, or declared public), and a batch of
``generator_batch_size`` fakes in equal numbers per class. The paper weighs class c by p̂_c² (its
joint embedding); p̂_c keeps a small class in view on an imbalanced table.

**Feature maps** (``feature_maps``, images): the release can be several blocks, each the same mechanism on another
data-independent feature map ``ψ`` of the records (:mod:`lightning_gpate.privacy.feature_maps`: the pixels' random
Fourier features, the low DCT frequencies', wavelet scattering coefficients, random Fourier features of those), every
record's vector of norm at most 1, each block released once with its share of the budget (one Gaussian event each,
composed in the accountant: together exactly the ε of one release) and the generator's loss the sum of the blocks'
(each weighted). A Gaussian kernel on pixels gives a fake far from every digit almost no gradient (a white blob stays
one); the scattering coefficients' linear kernel pulls every fake, and compares strokes and edges rather than pixels.

**Few-shot** (``few_shot``, DP-Kernel's recipe: Jiang, Sun & Yu, "Functional Renyi Differential Privacy for Generative
Modeling", NeurIPS 2023, as DPImageBench runs it): instead of one release of the whole split, every step releases the same
blocks' sum over a fresh Poisson-subsampled batch (rate ``q``, declared public) with fresh Gaussian noise, divided by the
expected count of each class in a batch (public), and the generator takes one step towards it. The blocks of one step
share the batch, so together they are one Poisson-subsampled Gaussian of multiplier ``σ`` (each block's sum rescaled by
``σ/σ_i`` is a vector of norm at most 1 per record with noise ``σ`` on every entry); ``σ`` is planned so that the
configured number of steps fits the budget, each step is charged before its batch is read, and training stops when the
budget is spent. The class shares follow from every step's noisy counts summed (post-processing).

What is released: the generator and the released class shares (a buffer of the generator, used to
draw labels unless the class ratio is declared public), and the hyperparameters, among them the
random features' public ``feature_seed``. The noisy embedding itself stays in the private training
checkpoint (it is what a resume trains on, without a second release). Trains on one process.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from lightning_gpate.models.anchor import balanced_labels, class_gap
from lightning_gpate.models.base import refuse_changed_on_resume
from lightning_gpate.models.options import GeneratorNet, OptionGroup, flat_options, group_from
from lightning_gpate.models.private import (ConfigError, DEFAULT_DELTA, PrivateGenerativeModel, largest_that_fits,
                                            smallest_noise_that_fits)
from lightning_gpate.models.warm_start import default_length_scale, release_event
from lightning_gpate.privacy import SubsampledGaussianEvent
from lightning_gpate.privacy.feature_maps import FEATURE_MAPS, FOURIER_MAPS, FeatureMap, build_feature_map
from lightning_gpate.privacy.merf import batch_mean_embeddings, feature_sum, fourier_frequencies, mean_embeddings, noisy_release
from lightning_gpate.privacy.randomness import derived_seed, mechanism_generator

# The default length scale (:func:`~lightning_gpate.models.warm_start.default_length_scale`, one definition for DP-MERF and
# every warm start): images 10 at MNIST's 784 pixels, scaled with √d (10 → 0.899, 14 → 0.876 at 300 steps on a validation
# split, first seen on test-digit sweeps of G-PATE's anchor: ``benchmarks/results/dpmerf_mnist_tuning.md``; the paper's
# 20.5 with its batch 0.851 at 600; not validated beyond MNIST); tables ``√(2d/3)``.
#: The default generated batch a step: 1,000 (the ε = 1 ladder: with length 10 and ``gf_dim`` 8, 0.851 → 0.914 at 600
#: steps against the paper's recipe on the validation split; G-PATE's anchor's batch).
DEFAULT_GENERATOR_BATCH_SIZE = 1000
#: The trainer's step count the defaults were validated at (``configs/mnist/dpmerf_eps1_guarantee.yaml``'s
#: ``trainer.max_steps``: 0.899 / 0.914 / 0.926 on the validation split at 300 / 600 / 800 steps, still rising); the
#: model does not set it: the Trainer's ``max_steps`` does.
VALIDATED_MAX_STEPS = 800
#: The DP-MERF paper's MNIST settings where the defaults differ (Harder, Adamczewski & Park 2021 and its code
#: ``ParkLabML/DP-MERF``: ℓ² = 105 for pixels in [0, 1], i.e. ℓ ≈ 20.5 in this [-1, 1] space; 500 generated digits a
#: step; 600 steps): ``DPMERF(spec, **PAPER_SETTINGS, ...)`` or ``configs/mnist/dpmerf_paper_eps1_guarantee.yaml``.
#: With ``gf_dim`` 4 (half the paper's width) they gave 0.851 on the validation split and 0.860 on the test digits.
PAPER_SETTINGS = {"length_scale": 20.5, "generator_batch_size": 500}
#: The generator (module doc): the paper's small one at its own width.
DEFAULT_GENERATOR = GeneratorNet(z_dim=5, gf_dim=8, fc_dim=200, upsample="nearest", hidden=(256, 256), ema_decay=0.0)


#: The length scale of a block's Gaussian kernel when its ``length_scale`` is null, by map (the pixels': the model's
#: ``length_scale``). ``dct``: the pixels' 10 (its low frequencies keep most of a digit's distance); ``scattering_rff``:
#: its normalised coefficients lie in the unit ball (their distances below 2).
DEFAULT_BLOCK_LENGTH_SCALES = {"dct": 10.0, "scattering_rff": 0.5}


@dataclass(frozen=True, kw_only=True)
class FeatureBlock:
    """One block of DP-MERF's release: a data-independent feature map of the records
    (:mod:`lightning_gpate.privacy.feature_maps`), released once with its own share of the budget.

    Every block is released as DP-MERF's sum ``Σ_i e_{y_i} ⊗ [a·ψ(x_i), b]`` (``ψ`` the block's map, rows of norm at most 1:
    sensitivity 1) plus Gaussian noise of multiplier ``σ/√(share/Σ shares)``, ``σ`` the one multiplier the whole budget
    buys: the blocks' Gaussian mechanisms, composed in the accountant, cost exactly what one release of multiplier ``σ``
    costs (RDP ``λ/(2σ²)``: their ``1/σ_i²`` add up to ``1/σ²``). The generator matches every block, each one's squared
    gap times its ``weight``.

    Args:
        map: ``"pixels"`` (DP-MERF's random Fourier features of the pixels), ``"dct"`` (of the ``dct_size``² lowest DCT
            frequencies), ``"scattering"`` (wavelet scattering coefficients, a linear kernel) or ``"scattering_rff"``
            (random Fourier features of them); images only except ``"pixels"``.
        features: random Fourier features ``2M`` of a Fourier map (null: the model's ``num_features``).
        length_scale: ℓ of a Fourier map's Gaussian kernel, or a list (null: the model's ``length_scale`` for pixels,
            10 for dct, 0.5 for scattering_rff: :data:`DEFAULT_BLOCK_LENGTH_SCALES`).
        share: the block's share of the budget (relative to the other blocks').
        weight: the weight of its gap in the generator's loss.
        dct_size: ``"dct"``: the side ``k`` of the kept ``k × k`` lowest frequencies.
    """

    map: str = "pixels"
    features: int | None = None
    length_scale: float | list[float] | None = None
    share: float = 1.0
    weight: float = 1.0
    dct_size: int = 14

    def __post_init__(self) -> None:
        if self.map not in FEATURE_MAPS:
            raise ValueError(f"feature_maps: map must be one of {FEATURE_MAPS}, got {self.map!r}")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"feature_maps: share must be a finite number > 0, got {self.share}")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"feature_maps: weight must be a finite number >= 0, got {self.weight}")
        if int(self.dct_size) != self.dct_size or self.dct_size < 1:
            raise ValueError(f"feature_maps: dct_size must be an integer >= 1, got {self.dct_size}")
        if self.length_scale is not None and not isinstance(self.length_scale, (int, float)):
            object.__setattr__(self, "length_scale", [float(v) for v in self.length_scale])
        if self.map in FOURIER_MAPS:  # validates the count and the length scale(s)
            fourier_frequencies(self.features or 2, 1, self.length_scale if self.length_scale is not None else 1.0, 0)

    def resolved(self, *, num_features: int, length_scale: float | list[float]) -> "FeatureBlock":
        """This block with its Fourier features and length scale resolved (the model's where null and the map's)."""
        if self.map not in FOURIER_MAPS:
            return self
        scale = self.length_scale if self.length_scale is not None else (
            length_scale if self.map == "pixels" else DEFAULT_BLOCK_LENGTH_SCALES[self.map])
        return replace(self, features=int(self.features or num_features), length_scale=scale)


@dataclass(frozen=True, kw_only=True)
class FewShot(OptionGroup):
    """DP-MERF's release made a few-shot one (DP-Kernel's recipe, Jiang, Sun & Yu, NeurIPS 2023): every step a fresh
    Poisson-subsampled batch's noisy embedding sum, divided by each class's expected count in a batch, which the
    generator's step matches; all blocks of a step are one subsampled Gaussian in the accountant.

    Args:
        sampling_rate: q, the Poisson rate of every batch, declared public (required): an expected batch divided by a
            public number of records (1000 / 60000 for MNIST), never computed from the private row count.
        expected_batch_size: B = q·N, the batch's expected size, declared public (required): class c's noisy sum is
            divided by B·p̂_c (p̂ the class shares) to give its mean embedding.
        steps: the noisy steps the budget is planned for: with ``noise_multiplier`` null, σ is the smallest (to 1%)
            for which that many Poisson-subsampled Gaussian steps fit ε (set ``trainer.max_steps`` to it; training
            stops when the budget is spent).
    """

    sampling_rate: float | None = None
    expected_batch_size: float | None = None
    steps: int = 300

    def __post_init__(self) -> None:
        if self.sampling_rate is None or not 0 < self.sampling_rate <= 1:
            raise ValueError(f"few_shot.sampling_rate must be declared public in (0, 1] (an expected batch over a public "
                             f"number of records, e.g. 1000 / 60000), got {self.sampling_rate}")
        if self.expected_batch_size is None or not (self.expected_batch_size >= 1 and math.isfinite(self.expected_batch_size)):
            raise ValueError(f"few_shot.expected_batch_size must be declared public, a number >= 1 (sampling_rate times "
                             f"a public number of records), got {self.expected_batch_size}")
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"few_shot.steps must be an integer >= 1, got {self.steps}")


class LabelledGenerator(nn.Module):
    """A conditional generator with the class shares it samples labels from (``label_ratio``: the
    released noisy ones; zeros before the release), so that they travel with it in the release."""

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("label_ratio", torch.zeros(num_classes))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(z, y)


#: The cost of DP-MERF's one release (the warm start's: one mechanism, one definition).
gaussian_release_event = release_event


class DPMERF(PrivateGenerativeModel):
    """DP-MERF: a conditional generator trained to match one noisy release of the data's random-feature mean embedding
    (Harder, Adamczewski & Park, AISTATS 2021); images or tables. The release is the run's only privacy cost: every
    generator step after it is post-processing (module doc).

    The defaults are the best configuration found under a guarantee on MNIST (chosen on a validation split of the
    training digits, not accounted: ``benchmarks/results/dpmerf_mnist_tuning.md``): length scale 10, 1,000 generated
    digits a step, the paper's small generator at its own width (``gf_dim`` 8, ``fc_dim`` 200, z 5), its optimiser, and
    10,000 features; with ``trainer.max_steps`` 800 (``VALIDATED_MAX_STEPS``) they gave 0.926 on the validation split and
    0.939 on the test digits at ε = 1 (``configs/mnist/dpmerf_eps1_guarantee.yaml``). The paper's settings where they
    differ: ``PAPER_SETTINGS`` (``configs/mnist/dpmerf_paper_eps1_guarantee.yaml``).

    Args:
        data_spec: the DataModule's spec (images or tables); the DataModule serves the whole training split once per
            step (num_teachers: 0).
        epsilon: the privacy budget ε, which the one release spends (its noise is calibrated to it).
        delta: δ of the (ε, δ) guarantee.
        budget_accounting: "guarantee", the Gaussian mechanism's RDP, its only analysis ("paper" is refused).
        conversion: RDP to (ε, δ) conversion.
        noise_multiplier: σ of the release (null, the default: the smallest σ whose ε fits the budget). The noise std
            on every entry of the summed embedding, whose sensitivity is 1.
        num_features: random Fourier features 2M, M cosines and M sines (the paper: 10,000).
        length_scale: ℓ of the Gaussian kernel, or a list of them (null: by data kind). ℓ lives in the generator's
            space ([-1, 1] per pixel or column); a list's kernel is the mean of their Gaussian kernels, the features
            shared among them (fourier_frequencies). null (default_length_scale): images 10 at MNIST's 784 pixels
            (chosen on a validation split), scaled with √d; tables √(2d/3), the root-mean-square distance of two
            uniform points of [-1, 1]^d (22.9 for d = 784). The paper's MNIST choice, ℓ² = 105 for pixels in [0, 1],
            is ℓ ≈ 20.5 here (PAPER_SETTINGS).
        feature_seed: public seed of the frequencies (null: drawn from the public random state of seed_everything).
            The value used, given or drawn, is stored in the hyperparameters, hence in the training checkpoints and
            the release, as is the length scale used.
        count_weight: b, the share of each record's unit norm given to its class count. The rest, a = √(1 − b²), goes
            to its features: the counts get noise σ/b, the features σ/a.
        generator_batch_size: fakes per step, in equal numbers per class (the paper: 500). 1,000 was G-PATE's anchor's
            and the MNIST validation's choice: more fakes a class measure each class's generated mean embedding with
            less sampling noise, at a cost per step proportional to the batch.
        unbiased: subtract from each class's squared gap its bias (needs 2 fakes a class). The bias is the spread of
            the class's fakes over their count (class_mean_gap: the U-statistic).
        lr: Adam's learning rate of the generator (the paper: 0.01).
        lr_decay: the factor of the learning rate every lr_decay_steps steps (the paper: 0.9 per epoch of 120 steps).
        lr_decay_steps: steps between two decays of the learning rate.
        generator_betas: Adam's betas (G-PATE's generator: (0.5, 0.999)).
        generator: the generator network (a mapping of its options overrides some). Images: the paper's small
            generator at its own width, z 5, its 5×5 convolutions after nearest upsampling with 16 and 8 channels
            (gf_dim: 8), a first dense layer of 200 (fc_dim); G-PATE's is gf_dim: 64, fc_dim: 1024. Tables: an MLP of
            (256, 256). ema_decay 0: no weight average (the paper).
        chunk_size: records embedded at a time in the release (memory only).
        noise_seed: seed of the release's noise, for tests only (null: secret, from the OS at every start).
        log_private_diagnostics: accepted for a uniform interface; DP-MERF logs nothing private.
        feature_maps: the release's blocks, each a fixed feature map with its own share of ε (null, the default: the
            paper's one block of pixel features). Each block (FeatureBlock: pixels, dct, scattering or scattering_rff)
            is released once and matched by the generator; block i draws its frequencies from feature_seed + i; stored
            resolved.
        few_shot: a few-shot release instead of the one-shot one (FewShot: sampling_rate, expected_batch_size, steps;
            null, the default: one release of the whole split). Every step then pays a Poisson-subsampled Gaussian over
            a fresh batch of the training split, all blocks at once, σ planned for ``steps`` of them unless
            noise_multiplier is given; the generator matches each step's release. It costs a pass of the feature maps
            over a batch every step (about 1,000 records: a few tenths of a second on one CPU thread at MNIST's size).
    """

    FLAT_OPTIONS = flat_options()
    single_process_only = "it reads the training split once and then trains its generator on the released embedding alone"
    HAS_PAPER_ANALYSIS = False  # one Gaussian release: its RDP is the only analysis

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float = DEFAULT_DELTA,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        noise_multiplier: float | None = None,
        num_features: int = 10_000,
        length_scale: float | Sequence[float] | None = None,
        feature_seed: int | None = None,
        count_weight: float = 0.3,
        generator: GeneratorNet = DEFAULT_GENERATOR,
        generator_batch_size: int = DEFAULT_GENERATOR_BATCH_SIZE,
        unbiased: bool = False,
        lr: float = 0.01,
        lr_decay: float = 0.9,
        lr_decay_steps: int = 120,
        generator_betas: Sequence[float] = (0.9, 0.999),
        chunk_size: int = 2048,
        noise_seed: int | None = None,
        log_private_diagnostics: bool = False,
        feature_maps: list[FeatureBlock] | None = None,
        few_shot: FewShot | None = None,
    ) -> None:
        if noise_multiplier is not None and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be a finite number > 0 or null (calibrated to the budget), got {noise_multiplier}")
        if not 0 < count_weight < 1:
            raise ValueError(f"count_weight must lie in (0, 1), got {count_weight}")
        if int(generator_batch_size) != generator_batch_size or generator_batch_size < 2:
            raise ValueError(f"generator_batch_size must be an integer >= 2, got {generator_batch_size}")
        if not (lr > 0 and 0 < lr_decay <= 1 and int(lr_decay_steps) == lr_decay_steps and lr_decay_steps >= 1):
            raise ValueError(f"need lr > 0, lr_decay in (0, 1] and an integer lr_decay_steps >= 1; got {lr}, {lr_decay}, {lr_decay_steps}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        if len(generator_betas) != 2 or not all(0 <= b < 1 for b in generator_betas):
            raise ValueError(f"generator_betas must be two numbers in [0, 1), got {generator_betas}")
        num_classes = int(data_spec["num_classes"])
        if unbiased and generator_batch_size < 2 * num_classes:
            raise ValueError(f"unbiased needs at least 2 fakes a class: generator_batch_size >= {2 * num_classes}, got {generator_batch_size}")
        blocks = None if feature_maps is None else [group_from(FeatureBlock, b, name=f"feature_maps[{i}]")
                                                       for i, b in enumerate(feature_maps)]
        if blocks is not None and not blocks:
            raise ValueError("feature_maps must list at least one block, or be null (DP-MERF's random features of the pixels)")
        if blocks and data_spec["kind"] != "image" and any(b.map != "pixels" for b in blocks):
            raise ValueError(f"feature_maps: the maps {[b.map for b in blocks if b.map != 'pixels']} read images; a table "
                             "takes map 'pixels' (random Fourier features of its encoded row)")
        few_shot_options = None if few_shot is None else group_from(FewShot, few_shot, name="few_shot")
        requested = {"length_scale": length_scale, "feature_seed": feature_seed, "feature_maps": feature_maps}
        if length_scale is None:
            length_scale = default_length_scale(data_spec)
        elif not isinstance(length_scale, (int, float)):
            length_scale = [float(s) for s in length_scale]
        if feature_seed is None:  # public: the random state seed_everything governs
            feature_seed = int(torch.randint(2**31 - 1, (1,)))
        fourier_frequencies(num_features, 1, length_scale, 0)  # validates num_features and length_scale
        with warnings.catch_warnings():  # the release measures the class counts with DP: no need to warn about them
            warnings.filterwarnings("ignore", message="the class ratio was read from the private data")
            super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting, conversion=conversion,
                             z_dim=net_options.z_dim, latent_prior=net_options.latent_prior,
                             log_private_diagnostics=log_private_diagnostics)
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options)
        resolved_blocks = None if blocks is None else [
            asdict(b.resolved(num_features=int(num_features), length_scale=length_scale)) for b in blocks]
        self.store_resolved_hparams(requested, length_scale=length_scale, feature_seed=feature_seed, feature_maps=resolved_blocks)
        if few_shot_options is not None:
            self.store_option_groups(few_shot=few_shot_options)
        self.few_shot = few_shot_options
        self.automatic_optimization = False
        self.train_sampling = {"kind": "full"} if few_shot_options is None else {
            "kind": "poisson", "batches": 1, "sample_rate": few_shot_options.sampling_rate,
            "mechanism_seed": derived_seed(noise_seed, "poisson")}
        self.generator_options = net_options
        self.generator = LabelledGenerator(self.build_generator(net_options), self.num_classes)
        if net_options.averaged:  # what samples and is released (generator_module), label shares included
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False)
        # Public (their filters and frequencies redrawn from the stored seed): not saved in checkpoints or the release.
        self.maps = nn.ModuleList(self.draw_feature_maps())
        # The noisy release, every block's [K, dim + 1] side by side (DP; kept in the training checkpoint for a resume,
        # not in the release artifact).
        self.register_buffer("released_embedding", torch.zeros(self.num_classes, sum(m.dim + 1 for m in self.maps)))
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        if few_shot_options is not None:  # every step's noisy class counts summed: the class shares (post-processing)
            self.register_buffer("released_counts_sum", torch.zeros(self.num_classes, dtype=torch.float64))
        self.noise_multiplier = float(noise_multiplier) if noise_multiplier is not None else self.calibrated_noise_multiplier()

    RESOLVED_HPARAMS = ("length_scale", "feature_seed", "feature_maps")

    def feature_blocks(self) -> list[FeatureBlock]:
        """The release's blocks, resolved: ``feature_maps``, or (null) one block of random Fourier features of the pixels
        with the model's ``num_features`` and ``length_scale`` (DP-MERF's release)."""
        hp = self.hparams
        given = hp.get("feature_maps") or [{"map": "pixels"}]
        return [FeatureBlock(**b).resolved(num_features=int(hp.num_features), length_scale=hp.length_scale) for b in given]

    def draw_feature_maps(self) -> list[FeatureMap]:
        """Every block's feature map, its frequencies drawn from the stored public seed (block ``i``: ``feature_seed + i``)."""
        hp, shape = self.hparams, self.data_spec["shape"]
        return [build_feature_map(b.map, shape, num_features=b.features, length_scale=b.length_scale, seed=int(hp.feature_seed) + i,
                                  dct_size=b.dct_size) for i, b in enumerate(self.feature_blocks())]

    @property
    def frequencies(self) -> torch.Tensor:
        """The first block's random features' frequencies (DP-MERF's, of the pixels, by default)."""
        return self.maps[0].frequencies

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resume trains against the features its release was measured with: the checkpoint's seed and
        length scale replace the ones this model drew (a seed given that differs is refused)."""
        super().on_load_checkpoint(checkpoint)
        pinned = checkpoint.get("hyper_parameters") or {}
        # the few-shot steps' mechanism: every step of a run the same subsampled Gaussian (its q, σ and plan)
        names = ("few_shot", "noise_multiplier") if pinned.get("few_shot") or self.few_shot is not None else ()
        refuse_changed_on_resume("the checkpoint", {k: pinned.get(k) for k in names}, {k: self.hparams.get(k) for k in names})
        if self.adopt_resolved_hparams(pinned):
            device = self.released_embedding.device
            self.maps = nn.ModuleList(self.draw_feature_maps()).to(device)

    # ----------------------------------------------------------------- the release
    def block_noise_multipliers(self, noise_multiplier: float | None = None) -> list[float]:
        """Each block's σ_i = σ/√(share_i/Σ shares) for the whole release's σ (default the model's): their Gaussian
        mechanisms compose to exactly one of multiplier σ (their ``1/σ_i²`` add up to ``1/σ²``)."""
        sigma = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        shares = [b.share for b in self.feature_blocks()]
        return [sigma / math.sqrt(share / sum(shares)) if len(shares) > 1 else sigma for share in shares]

    def release_events(self, noise_multiplier: float | None = None, *, steps: int = 1) -> list[SubsampledGaussianEvent]:
        """The release's cost: one Gaussian mechanism a block (:meth:`block_noise_multipliers`). Few-shot: ``steps``
        Poisson-subsampled Gaussians of multiplier σ at rate q, one a step for all blocks at once (they read the same
        batch: rescaled by ``σ/σ_i`` the blocks' sums are one sum of vectors of norm at most 1 with noise σ; separate
        events would compose mechanisms that share their sampling, which the composition theorem does not cover)."""
        if self.few_shot is None:
            return [gaussian_release_event(s) for s in self.block_noise_multipliers(noise_multiplier)]
        sigma = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        return [SubsampledGaussianEvent(noise_multiplier=sigma, sampling_rate=self.few_shot.sampling_rate, steps=int(steps))]

    def release_epsilon(self, noise_multiplier: float | None = None, *, steps: int = 1) -> float:
        """ε of the guarantee once the release's events are recorded (after any DP metadata already recorded; few-shot:
        ``steps`` more steps)."""
        return self.accountant.epsilon_if(*self.release_events(noise_multiplier, steps=steps), *self._gnss_reservation())

    def calibrated_noise_multiplier(self) -> float:
        """The smallest σ (to 1e-9 relative) whose release keeps ε within the budget left (after any DP
        metadata already recorded). Few-shot: the smallest (to 1%, rounded up) for which ``few_shot.steps`` steps
        fit, as GS-WGAN plans its steps (each ε of a subsampled Gaussian costs dp-accounting's per-order loop)."""
        if self.few_shot is not None:
            steps = int(self.few_shot.steps)
            return smallest_noise_that_fits(lambda s: self.release_epsilon(s, steps=steps), self.budget_limit(),
                                            what=f"{steps} few-shot steps", fix="plan fewer (few_shot.steps) or set noise_multiplier")
        inverse = largest_that_fits(lambda s: self.release_epsilon(1.0 / s) <= self.budget_limit(),
                                    f"DP-MERF's release within epsilon={self.epsilon_budget:g}")
        return 1.0 / inverse

    @torch.no_grad()
    def release_embedding(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Charge the release (every block's Gaussian mechanism; few-shot: one step's subsampled Gaussian), then release
        each block's ``Σ_i e_{y_i} ⊗ [a·ψ(x_i), b] + N(0, σ_i²)`` over the records ``x, y`` (the split, or a step's Poisson
        batch) with the mechanism's secret noise; the class shares follow from the released counts (few-shot: every
        step's summed). Returns whether it released (``False``: over budget, nothing read)."""
        if not all(self.charge(event) for event in self.release_events()):
            return False  # over budget: NoPrivateStepError was raised (first step) or training stops
        hp = self.hparams
        generator = self.release_noise_generator()
        parts = [noisy_release(feature_sum(x, y, feature_map, feature_map.dim, self.num_classes, count_weight=hp.count_weight,
                                           device=self.device, chunk_size=hp.chunk_size), noise_multiplier=sigma, generator=generator)
                 for feature_map, sigma in zip(self.maps, self.block_noise_multipliers())]
        self.released_embedding.copy_(torch.cat(parts, 1).float())
        self.released.fill_(True)
        counts = self.released_counts()
        if self.few_shot is not None:
            self.released_counts_sum += counts.double()
            counts = self.released_counts_sum.float()
        counts = counts.clamp_min(0)
        shares = counts / counts.sum() if counts.sum() > 0 else torch.full_like(counts, 1.0 / self.num_classes)
        self.generator.label_ratio.copy_(shares)
        if hasattr(self, "generator_ema"):
            self.generator_ema.label_ratio.copy_(shares)
        return True

    def release_noise_generator(self) -> torch.Generator:
        """The release's secret noise generator (:func:`~lightning_gpate.privacy.randomness.mechanism_generator`: from the
        OS unless ``noise_seed``, for tests). Few-shot: one per process, drawn on the first step and kept (never saved),
        so that every step's noise is fresh; a resume draws a new one."""
        if self.few_shot is None:
            return mechanism_generator(self.device, self.hparams.noise_seed)
        if getattr(self, "_noise_generator", None) is None or self._noise_generator.device != self.device:
            self._noise_generator = mechanism_generator(self.device, self.hparams.noise_seed)
        return self._noise_generator

    def released_blocks(self) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """Post-processing of the release: per block its class means ``[K, dim]``, noisy counts ``[K]`` and noise σ_i
        (:func:`~lightning_gpate.privacy.merf.mean_embeddings`; few-shot: the step's sums over each class's expected
        count in a batch, ``expected_batch_size`` times its share, :func:`~lightning_gpate.privacy.merf.batch_mean_embeddings`)."""
        out, start = [], 0
        count_weight = self.hparams.count_weight
        expected = None if self.few_shot is None else self.few_shot.expected_batch_size * self.class_shares().double()
        for feature_map, sigma in zip(self.maps, self.block_noise_multipliers()):
            part = self.released_embedding[:, start:start + feature_map.dim + 1]
            start += feature_map.dim + 1
            if expected is None:
                out.append((*mean_embeddings(part, count_weight=count_weight, noise_multiplier=sigma), sigma))
            else:
                out.append((*batch_mean_embeddings(part, count_weight=count_weight, expected_counts=expected), sigma))
        return out

    def released_counts(self) -> torch.Tensor:
        """The class counts of the release ``[K]``: every block's noisy counts averaged with weights ``1/σ_i²`` (the
        least-noisy combination; the one block's counts when there is one)."""
        blocks = self.released_blocks()
        if len(blocks) == 1:
            return blocks[0][1]
        weights = [sigma**-2 for _, _, sigma in blocks]
        return sum(w * counts for w, (_, counts, _) in zip(weights, blocks)) / sum(weights)

    # ----------------------------------------------------------------- labels
    def class_shares(self) -> torch.Tensor:
        """The class ratio labels are drawn from and classes are weighted by: the declared one when it is
        public or paid for, else the released shares (uniform before the release)."""
        if self.data_spec.get("class_ratio_source") in ("public", "dp") or not float(self.generator_module.label_ratio.sum()) > 0:
            return self.class_ratio
        return self.generator_module.label_ratio

    def sample_labels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        if n == 0:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        return torch.multinomial(self.class_shares(), n, replacement=True, generator=generator).to(self.device)

    # ----------------------------------------------------------------- training
    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.Adam(self.generator.parameters(), lr=hp.lr, betas=tuple(hp.generator_betas))
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=hp.lr_decay_steps, gamma=hp.lr_decay)]

    def on_train_start(self) -> None:
        super().on_train_start()
        if not bool(self.released):
            cost = self.release_epsilon()
            if cost > self.budget_limit():
                raise ConfigError(
                    f"DP-MERF's release with noise_multiplier={self.noise_multiplier:g} costs epsilon={cost:.4g}, more than the "
                    f"budget {self.budget_limit():g} (delta={self.delta:g}): raise noise_multiplier to at least "
                    f"{self.calibrated_noise_multiplier():.4g}, or leave it null to calibrate it to the budget"
                )
            if self.logger is not None:
                self.logger.log_hyperparams({"privacy_split/noise_multiplier": self.noise_multiplier})
        planned = None if self.few_shot is None else int(self.few_shot.steps)
        if planned is not None and self.hparams.noise_multiplier is None and (self.trainer.max_steps or -1) not in (-1, planned):
            warnings.warn(f"DP-MERF's few-shot noise is planned for few_shot.steps={planned} steps but trainer.max_steps is "
                          f"{self.trainer.max_steps}: training stops where the budget is spent, or leaves budget unspent; "
                          f"set them equal", stacklevel=2)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Lightning warns that this module's transfer_batch_to_device is used rather than the DataModule's:
        # that is the intent (below), and the DataModule defines none.
        warnings.filterwarnings("ignore", message="You have overridden `transfer_batch_to_device` in `LightningModule`")

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        """After the one-shot release the batch (the whole training split) is not read: it stays where it is (few-shot:
        every step's Poisson batch is read)."""
        if bool(self.released) and self.few_shot is None:
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def embedding_loss(self) -> torch.Tensor:
        """``Σ_blocks w_b Σ_c p̂_c ‖mean_j ψ_b(G(z_j, c)) − μ̂_{b,c}‖²`` over one batch with equal numbers of fakes per class:
        the per-class gap of :func:`~lightning_gpate.models.anchor.class_gap` (G-PATE's anchor term; a mean over a block's
        features, hence the factor of its width). It reads the release alone."""
        hp = self.hparams
        y = balanced_labels(self.num_classes, int(hp.generator_batch_size), device=self.device, unbiased=hp.unbiased)
        x = self.generator(self.latent(len(y)), y)
        shares = self.class_shares()
        loss = x.new_zeros(())
        for feature_map, block, (means, _, _) in zip(self.maps, self.feature_blocks(), self.released_blocks()):
            gap = class_gap(x, y, means, feature_map, unbiased=hp.unbiased)
            loss = loss + block.weight * means.shape[1] * (shares.to(gap) * gap).sum()
        return loss

    def training_step(self, batch, batch_idx):
        if self.few_shot is not None:
            ((x, y),) = batch  # one Poisson batch a step
            if not self.release_embedding(x, y):
                return None
        elif not bool(self.released):
            x, y = batch
            if not self.release_embedding(x, y):
                return None
        opt, scheduler = self.optimizers(), self.lr_schedulers()
        loss = self.embedding_loss()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        scheduler.step()
        if self.generator_options.averaged:
            self.update_generator_average(self.generator_options.ema_decay)
        self.log("mmd_loss", loss.detach(), prog_bar=True, batch_size=1)  # towards the released embedding: post-processing
        return None
