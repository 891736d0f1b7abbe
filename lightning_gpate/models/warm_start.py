"""One private warm start for any GAN: DP-MERF's one-shot release, the generator trained on it, its pull kept.

A share ``fraction`` of the model's ε buys, once before the first private step, DP-MERF's release (Harder,
Adamczewski & Park, AISTATS 2021; :mod:`lightning_gpate.privacy.merf`): the sum over the whole training split of
every record's ``e_y ⊗ [a·φ(x), b]`` (``features`` random Fourier features of a Gaussian kernel of length
``length_scale``, the class count beside them; L2 sensitivity exactly 1 under add/remove) plus Gaussian noise,
one :class:`~lightning_gpate.privacy.SubsampledGaussianEvent` of sampling rate 1 in the model's accountant,
composed with the model's own steps. From then on the release is public, and everything the warm start does
with it is post-processing:

* **warm start** (``steps`` > 0): before the first private step, the model's own generator takes ``steps`` Adam
  steps on DP-MERF's loss ``Σ_c p̂_c ‖mean_j φ(G(z_j, c)) − μ̂_c‖²`` (:func:`embedding_loss`, the loss
  :class:`~lightning_gpate.models.DPMERF` trains on), reading nothing but the release: FETA-Pro's
  recipe (Gong et al., USENIX Security 2026: noisy statistics first, then DP-SGD under the same accountant);
* **anchor** (``anchor_weight`` > 0): every later generator step adds ``anchor_weight`` times the same loss to the
  model's own, so that the private fine-tuning keeps the release's pull (without it a DP critic roughens the
  strokes: 0.930 → 0.880 in the probe of issue 56).

**From the marginal model** (``source: marginals``, tables only): the share ``fraction`` buys
:class:`~lightning_gpate.models.MarginalTree`'s fit instead (its defaults: noisy one-way marginals, the label's and the
other edges' noisy selections and two- or three-way measurements, every event of its plan charged in the model's
accountant), and the release the steps and the pull read is the random-feature embedding sum of ``sample_rows`` rows
sampled from the fitted tree, without noise (post-processing of the tree's measurements). On tables the marginal model
spends a budget better than any one noisy embedding (issue 59: MarginalTree's mean AUROC over the five development
tables 0.743 at ε = 1 against DP-MERF's 0.702 on cervical), and the generator learns it in a few thousand free steps.

``WarmStart`` holds the options (what a config or ``--model.warm_start.*`` gives, validated where defined);
:class:`WarmStartRelease` holds the release (buffers kept in training checkpoints: a resume never measures
twice) and computes the loss; :class:`WarmStartMixin` is what a model adds to use them.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from lightning_gpate.models.anchor import class_mean_gap
from lightning_gpate.models.options import group_from
from lightning_gpate.models.sharding import rank_zero_value
from lightning_gpate.privacy import SubsampledGaussianEvent
from lightning_gpate.privacy.merf import (
    embedding_sum, fourier_features, fourier_frequencies, mean_embeddings, median_distance_of_uniform, release_embedding_sum,
)

#: ``warm_start: auto``: a model's warm start by data kind (PATE-GAN: its ``TABLE_WARM_START`` on tables), stored resolved.
AUTO_WARM_START = "auto"
#: What a release was measured with: a resume keeps the checkpoint's (what it measured from ``source``, its σ from
#: ``fraction``, its shape from ``features``, its frequencies from ``length_scale`` and ``feature_seed``); the other
#: options only read it.
RELEASE_OPTIONS = ("source", "fraction", "features", "length_scale", "feature_seed", "count_weight")
#: The marginal model's budget split under ``source: marginals``: the one PATE-GAN's table default was chosen with (a
#: release keeps its planned events; MarginalTree's own defaults moved after, chosen for its own samples).
TREE_FRACTIONS = {"label_edge_fraction": 0.4, "one_way_fraction": 0.25}
#: The options a warm start takes where it is given none (``None`` in :class:`WarmStart`): DP-MERF's release of 10,000
#: features on half of ε, 800 generator steps on it, no pull (``length_scale`` ``None``: by data kind). A model's own
#: default warm start (PATE-GAN's on tables) takes their place (:meth:`WarmStart.over`): a mapping given over it
#: changes the options it names and keeps the rest.
DEFAULT_OPTIONS = {"source": "features", "fraction": 0.5, "features": 10_000, "length_scale": None, "steps": 800, "anchor_weight": 0.0}
#: What a warm start's release measures (``WarmStart.source``): DP-MERF's random-feature embedding of every record
#: (any data), or MarginalTree's noisy marginals (tables; the module doc).
SOURCES = ("features", "marginals")
#: Images: the default length scale is this times √d (10 for MNIST's 784 pixels: DP-MERF's default, first found on
#: test-digit sweeps of G-PATE's anchor and re-checked on a validation split, ``dpmerf_mnist_tuning.md``; other sizes
#: scale it with √d, as distances between images grow).
IMAGE_LENGTH_SCALE_PER_SQRT_DIM = 10.0 / 28.0


def default_length_scale(data_spec: dict[str, Any]) -> float:
    """``length_scale: None`` resolved by data kind (public: shapes only). Images: ``IMAGE_LENGTH_SCALE_PER_SQRT_DIM · √d``
    (10 for 28×28). Tables: ``√(2d/3)``, the root-mean-square distance of two uniform points of ``[-1, 1]^d``
    (:func:`~lightning_gpate.privacy.merf.median_distance_of_uniform`: the paper's median heuristic would read the data)."""
    dim = math.prod(int(s) for s in data_spec["shape"])
    return IMAGE_LENGTH_SCALE_PER_SQRT_DIM * math.sqrt(dim) if data_spec["kind"] == "image" else median_distance_of_uniform(dim)


@dataclass(frozen=True, kw_only=True)
class WarmStart:
    """A private warm start: a share of ε buys one release before the first private step (DP-MERF's random-feature
    embedding, or on tables MarginalTree's marginals); the generator trains on it and may keep its pull.

    Privacy parameters are keyword-only and checked here; the module doc has the details.

    An option left ``None`` takes the model's default warm start's value (:data:`DEFAULT_OPTIONS`, or PATE-GAN's table
    warm start under ``warm_start: auto``; :meth:`over`): a group given in part changes the options it names only.

    Args:
        source: what the release measures: ``"features"`` (default), DP-MERF's noisy random-feature embedding of the
            records; ``"marginals"`` (tables), MarginalTree's noisy marginals, then the embedding of ``sample_rows``
            rows sampled from them without noise (the module doc).
        fraction: the share of the model's ε that buys the release (the ε of the release alone is
            ``fraction·ε``; the model's own steps get what the composition leaves). Default 0.5.
        features: random Fourier features ``2M`` of the release (default DP-MERF's 10,000).
        length_scale: ℓ of the Gaussian kernel in the generator's space (``None``: 10 for 28×28 images, scaled with
            √d; tables ``√(2d/3)``), or a list (the mean of their kernels).
        feature_seed: public seed of the features' frequencies (``None``: drawn from the public random state of
            ``seed_everything``, then stored).
        count_weight: b, the share of a record's unit norm its class count takes (DP-MERF: 0.3).
        steps: generator steps on the release before the first private step (default 800; 0: no warm start, only the
            pull).
        batch_size: fakes a warm-start step and an anchor term, in equal numbers per class.
        lr: Adam's learning rate of the warm-start steps (DP-MERF's 0.01), decayed by ``lr_decay`` every
            ``lr_decay_steps`` steps; betas ``betas``.
        anchor_weight: weight of the release's loss added to every later generator step (default 0: none).
        sample_rows: ``source: marginals``: rows sampled from the fitted marginal model for the embedding (more: its
            estimate of the model's embedding is closer; the noise of the measurement is in the tables already).
    """

    source: str | None = None
    fraction: float | None = None
    features: int | None = None
    length_scale: float | list[float] | None = None
    feature_seed: int | None = None
    count_weight: float = 0.3
    steps: int | None = None
    batch_size: int = 1000
    lr: float = 0.01
    lr_decay: float = 0.9
    lr_decay_steps: int = 120
    betas: tuple[float, float] = (0.9, 0.999)
    anchor_weight: float | None = None
    sample_rows: int = 20_000

    def __post_init__(self) -> None:
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"warm_start.source must be one of {SOURCES} (what the release measures), got {self.source!r}")
        if int(self.sample_rows) != self.sample_rows or self.sample_rows < 100:
            raise ValueError(f"warm_start.sample_rows must be an integer >= 100, got {self.sample_rows}")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ValueError(f"warm_start.fraction must lie in (0, 1) (the share of epsilon the release buys), got {self.fraction}")
        if self.steps is not None and (int(self.steps) != self.steps or self.steps < 0):
            raise ValueError(f"warm_start.steps must be an integer >= 0, got {self.steps}")
        if int(self.batch_size) != self.batch_size or self.batch_size < 2:
            raise ValueError(f"warm_start.batch_size must be an integer >= 2, got {self.batch_size}")
        if not (self.lr > 0 and 0 < self.lr_decay <= 1 and int(self.lr_decay_steps) == self.lr_decay_steps and self.lr_decay_steps >= 1):
            raise ValueError("warm_start needs lr > 0, lr_decay in (0, 1] and an integer lr_decay_steps >= 1, got "
                             f"{self.lr}, {self.lr_decay}, {self.lr_decay_steps}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"warm_start.betas must be two numbers in [0, 1), got {self.betas}")
        if self.anchor_weight is not None and not (0 <= self.anchor_weight < math.inf):
            raise ValueError(f"warm_start.anchor_weight must be a finite number >= 0, got {self.anchor_weight}")
        if self.steps == 0 and self.anchor_weight == 0:
            raise ValueError("a warm start with steps: 0 and anchor_weight: 0 would spend its share of epsilon on a release "
                             "nothing reads: give steps (train the generator on it first), anchor_weight (pull towards it), or both")
        if not 0 < self.count_weight < 1:
            raise ValueError(f"warm_start.count_weight must lie in (0, 1), got {self.count_weight}")
        if self.length_scale is not None and not isinstance(self.length_scale, (int, float)):
            object.__setattr__(self, "length_scale", [float(s) for s in self.length_scale])
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        # validates both (a features count left None: the default's, valid)
        fourier_frequencies(2 if self.features is None else self.features, 1, 1.0 if self.length_scale is None else self.length_scale, 0)

    @classmethod
    def of(cls, value: "WarmStart | dict[str, Any] | None", base: Mapping[str, Any] | None = None) -> "WarmStart | None":
        """The :class:`WarmStart` a model was given (itself, a mapping of its options, or ``None``: none), its options
        left ``None`` taken from ``base`` (a model's default warm start), then :data:`DEFAULT_OPTIONS` (:meth:`over`).
        An unknown key is refused in one line that lists the known ones."""
        return None if value is None else group_from(cls, value, name="warm_start").over(base or {})

    def over(self, base: Mapping[str, Any]) -> "WarmStart":
        """This warm start with each option left ``None`` taken from ``base`` (options of :data:`DEFAULT_OPTIONS`),
        else from :data:`DEFAULT_OPTIONS` (``length_scale`` and ``feature_seed`` may stay ``None``: :meth:`resolved`)."""
        unknown = set(base) - set(DEFAULT_OPTIONS)
        if unknown:
            raise TypeError(f"a default warm start sets {sorted(DEFAULT_OPTIONS)} only, not {sorted(unknown)}")
        return replace(self, **{k: v for k, v in {**DEFAULT_OPTIONS, **base}.items() if getattr(self, k) is None})

    def given_over(self, base: Mapping[str, Any]) -> dict[str, Any] | None:
        """For the fit summary: what this warm start, given over a model's default ``base``, changes of it (the options
        it names with another value than ``base``'s, or than the class's default); ``None`` when it names every option
        of ``base`` (a warm start of its own, not that default)."""
        if not base or all(getattr(self, k) is not None for k in base):
            return None
        reference = {**{f.name: f.default for f in fields(self)}, **DEFAULT_OPTIONS, **base}
        return {k: v for k, v in self.as_hparams().items() if v is not None and v != _plain(reference[k])}

    def resolved(self, data_spec: dict[str, Any]) -> "WarmStart":
        """This warm start with ``length_scale`` and ``feature_seed`` resolved (public: the data's shape and the public
        random state), as the model stores it: a checkpoint or a release rebuilds the same features."""
        options = self.over({})  # a model has filled them from its own default; in Python they may be left to these
        if options.source == "marginals" and data_spec.get("kind") != "tabular":
            raise ValueError("warm_start.source 'marginals' measures a table's marginals (MarginalTree): for images use "
                             "source 'features' (DP-MERF's release)")
        length = options.length_scale if options.length_scale is not None else default_length_scale(data_spec)
        seed = options.feature_seed if options.feature_seed is not None else int(torch.randint(2**31 - 1, (1,)))
        return replace(options, length_scale=length, feature_seed=seed)

    def as_hparams(self) -> dict[str, Any]:
        """Plain values for the hyperparameters (checkpoints, MLflow params)."""
        return {k: _plain(v) for k, v in asdict(self).items()}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def release_event(noise_multiplier: float) -> SubsampledGaussianEvent:
    """The cost of the one release: the Gaussian mechanism with noise multiplier σ relative to its L2
    sensitivity 1 (sampling rate 1: no subsampling)."""
    return SubsampledGaussianEvent(noise_multiplier=float(noise_multiplier), sampling_rate=1.0, steps=1)


def embedding_loss(generate: Callable[[torch.Tensor], torch.Tensor], released: torch.Tensor, frequencies: torch.Tensor,
                   class_shares: torch.Tensor, *, count_weight: float, noise_multiplier: float, batch_size: int,
                   unbiased: bool = False) -> torch.Tensor:
    """DP-MERF's loss ``Σ_c p̂_c ‖mean_j φ(G(z_j, c)) − μ̂_c‖²`` on ``batch_size`` fakes in equal numbers per class
    (the paper's Eq. 7 with its embedding split by class; ``μ̂_c`` the release's class-c sum over its noisy count).

    Args:
        generate: labels ``[m]`` → fakes ``[m, ...]`` (fresh latents; differentiable).
        released: the release ``[K, 2M + 1]``.
        frequencies: the features' frequencies ``[M, d]``.
        class_shares: ``p̂`` ``[K]``, the weight of each class.
        count_weight: the release's b.
        noise_multiplier: the release's noise std z (0: a noise-free sum), for its counts' floor
            (:func:`~lightning_gpate.privacy.merf.mean_embeddings`).
        batch_size: fakes a call.
        unbiased: subtract each class's sampling bias (:func:`~lightning_gpate.models.anchor.class_mean_gap`).
    """
    means, _ = mean_embeddings(released, count_weight=count_weight, noise_multiplier=noise_multiplier)
    gap = class_mean_gap(generate, means, int(batch_size), lambda x: fourier_features(x, frequencies), unbiased=unbiased)
    return means.shape[1] * (class_shares.to(gap) * gap).sum()


class WarmStartRelease(nn.Module):
    """The release of a warm start and what reads it: buffers ``released`` ``[K, 2M + 1]`` (the noisy sum; zeros until
    measured), ``measured`` and ``steps_done`` (warm-start steps taken), kept in training checkpoints, never in a
    release artifact (the generator carries what it learnt). The frequencies are redrawn from the public seed."""

    def __init__(self, options: WarmStart, data_spec: dict[str, Any], *, noise_multiplier: float) -> None:
        super().__init__()
        if options.length_scale is None or options.feature_seed is None:
            raise ValueError("WarmStartRelease takes a resolved WarmStart (WarmStart.resolved)")
        self.options = options
        self.noise_multiplier = float(noise_multiplier)
        self.num_classes = int(data_spec["num_classes"])
        self.dim = math.prod(int(s) for s in data_spec["shape"])
        self.register_buffer("frequencies", fourier_frequencies(options.features, self.dim, options.length_scale, options.feature_seed),
                             persistent=False)
        self.register_buffer("released", torch.zeros(self.num_classes, int(options.features) + 1))
        self.register_buffer("measured", torch.zeros((), dtype=torch.bool))
        self.register_buffer("steps_done", torch.zeros((), dtype=torch.long))

    @property
    def embedding_noise(self) -> float:
        """The noise std on every entry of ``released`` (what its counts' floor reads)."""
        return self.noise_multiplier

    def events(self) -> list:
        """What the release costs: one Gaussian mechanism (:func:`release_event`)."""
        return [release_event(self.noise_multiplier)]

    @torch.no_grad()
    def measure(self, x: torch.Tensor, y: torch.Tensor, *, generator: torch.Generator, chunk_size: int = 2048) -> None:
        """Release ``Σ_i e_{y_i} ⊗ [a·φ(x_i), b] + N(0, σ²)`` of the whole training split ``(x, y)`` with the
        mechanism's secret ``generator``. The caller has charged :meth:`events` first."""
        if bool(self.measured):
            raise RuntimeError("the warm start's release was already measured: a run releases it once")
        released = release_embedding_sum(x.flatten(1).to(self.frequencies.device), y.to(self.frequencies.device), self.frequencies,
                                         self.num_classes, count_weight=self.options.count_weight, noise_multiplier=self.noise_multiplier,
                                         generator=generator, chunk_size=chunk_size)
        self.released.copy_(released.float())
        self.measured.fill_(True)

    def class_shares(self) -> torch.Tensor:
        """The released class shares (uniform where the noisy counts leave none): post-processing."""
        counts = mean_embeddings(self.released, count_weight=self.options.count_weight,
                                 noise_multiplier=self.embedding_noise)[1].clamp_min(0)
        return counts / counts.sum() if counts.sum() > 0 else torch.full_like(counts, 1.0 / self.num_classes)

    def loss(self, generate: Callable[[torch.Tensor], torch.Tensor], class_shares: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`embedding_loss` of ``generate`` against the release (``class_shares``: default the released ones)."""
        shares = self.class_shares() if class_shares is None else class_shares
        return embedding_loss(generate, self.released, self.frequencies, shares, count_weight=self.options.count_weight,
                              noise_multiplier=self.embedding_noise, batch_size=self.options.batch_size)


class MarginalWarmStartRelease(WarmStartRelease):
    """``source: marginals`` (tables): the release is :class:`~lightning_gpate.models.MarginalTree`'s fit, with its
    defaults, planned for ``fraction·ε`` alone at the model's δ (:meth:`events`: its planned Gaussian and exponential-
    mechanism events, charged in the model's accountant before the fit; DP metadata is the model's to pay, once, so
    the tree plans without it and its events alone cost the share the summary states); the buffer ``released`` then holds the
    random-feature embedding sum of ``sample_rows`` rows sampled from the fitted tree, without noise: a function of the
    tree's noisy measurements and fresh randomness only (post-processing). The tree itself is not kept: what the steps
    and the pull read is its embedding."""

    def __init__(self, options: WarmStart, data_spec: dict[str, Any], *, epsilon: float, delta: float, conversion: str) -> None:
        super().__init__(options, data_spec, noise_multiplier=math.nan)
        # the model's accountant has paid the DP metadata (bounds, the class ratio) already: were the tree to record it
        # too, its plan would fill only what its share leaves after paying it a second time
        self.data_spec = {**data_spec, "metadata_cost": []}
        self.tree_options = {"epsilon": float(epsilon), "delta": float(delta), "conversion": conversion, **TREE_FRACTIONS}
        self.planned = self.marginal_model().planned_event_list()  # a public function of the schema and the budget: no data read

    def marginal_model(self, noise_seed: int | None = None):
        from lightning_gpate.models.marginal import MarginalTree

        # in a fresh context: under the Lightning CLI, save_hyperparameters reads the hyperparameters the CLI gave the
        # model being built (a context variable), which would become the inner MarginalTree's own
        return contextvars.Context().run(MarginalTree, self.data_spec, **self.tree_options, noise_seed=noise_seed)

    @property
    def embedding_noise(self) -> float:
        """0: ``released`` is the noise-free embedding of rows sampled from the tree (the noise is in its tables)."""
        return 0.0

    def events(self) -> list:
        """The marginal model's planned events: its one-way Gaussians, its selections and its measurements."""
        return list(self.planned)

    @torch.no_grad()
    def measure(self, x: torch.Tensor, y: torch.Tensor, *, generator: torch.Generator, chunk_size: int = 2048) -> None:
        """Fit the marginal model on the training split ``(x, y)`` (its noise from a seed drawn from the mechanism's
        secret ``generator``), then embed ``sample_rows`` rows sampled from it. The caller has charged :meth:`events`."""
        if bool(self.measured):
            raise RuntimeError("the warm start's release was already measured: a run releases it once")
        noise_seed, sample_seed = (int(s) for s in torch.randint(2**62, (2,), generator=generator, device=generator.device).cpu())
        tree = self.marginal_model(noise_seed)
        tree.fit_marginals(tree.encode(x.cpu()), y.cpu().numpy().astype(np.int64))
        recorded = tree.accountant.counts  # its data spec carries no metadata cost (the model's accountant paid it)
        if recorded["subsampled_gaussian_events"] + recorded["exponential_mechanism_events"] != len(self.planned):
            raise RuntimeError("the marginal model's fit did not record the events the warm start charged")
        self.label_ratio = tree.generator.label_ratio.detach().clone()  # the tree's noisy class ratio: paid for with it
        rows, labels = tree.generate(int(self.options.sample_rows), seed=sample_seed)
        total = embedding_sum(rows.flatten(1).to(self.frequencies.device), labels.to(self.frequencies.device), self.frequencies,
                              self.num_classes, count_weight=self.options.count_weight, chunk_size=chunk_size)
        self.released.copy_(total.float())
        self.measured.fill_(True)


class WarmStartMixin:
    """What a private GAN adds to take a ``warm_start`` option (:class:`WarmStart`): call
    :meth:`init_warm_start` in the constructor after ``save_hyperparameters`` (``events_before_first_step`` then
    includes the release until it is paid; a model that overrides it adds :meth:`warm_start_events`), call :meth:`ensure_warm_started` first in ``training_step`` (it returns ``False``
    when the budget refused the release: skip the step), and add :meth:`warm_start_pull` to the generator's loss.
    The model provides ``generator``, ``latent``, ``plan_gaussian_noise``, ``charge``, ``whole_split_datamodule``, and
    ``noise_seed`` in its hyperparameters; a ``generator_ema`` (a weight average) restarts from the warm-started
    generator."""

    def events_before_first_step(self) -> list:
        """The base's events, then the warm start's release while it is still to be paid (none without one)."""
        return [*super().events_before_first_step(), *self.warm_start_events()]

    @classmethod
    def warm_start_base(cls, data_spec: Mapping[str, Any], budget_accounting: str) -> dict[str, Any]:
        """This model's default warm start for the data, the options a ``warm_start`` mapping is given over (``{}``:
        :data:`DEFAULT_OPTIONS`; PATE-GAN: its table warm start). Public: the data's kind and the accounting only."""
        return {}

    @classmethod
    def warm_start_of(cls, warm_start: Any, data_spec: Mapping[str, Any], budget_accounting: str) -> WarmStart | None:
        """What ``warm_start`` (as given: ``None``, a mapping or a :class:`WarmStart`) means for this model and data:
        none, or the warm start with the options it leaves ``None`` taken from :meth:`warm_start_base`."""
        return WarmStart.of(warm_start, cls.warm_start_base(data_spec, budget_accounting))

    @classmethod
    def answer_on_resume(cls, asked: dict[str, Any], pinned: Mapping[str, Any], data_spec: Mapping[str, Any]) -> dict[str, Any]:
        """The base's answers, and the warm start a resume asks for as the constructor builds it (``auto`` or a group
        given in part over :meth:`warm_start_base`), its ``length_scale`` and ``feature_seed`` left ``None`` answered
        by the checkpoint's (the model adopts them: :meth:`on_load_checkpoint`)."""
        asked = super().answer_on_resume(asked, pinned, data_spec)
        if "warm_start" not in asked:
            return asked
        options = cls.warm_start_of(asked["warm_start"], data_spec, asked.get("budget_accounting", "guarantee"))
        saved = pinned.get("warm_start")
        if options is not None and isinstance(saved, Mapping):
            options = replace(options, **{k: saved[k] for k in ("length_scale", "feature_seed")
                                          if getattr(options, k) is None and saved.get(k) is not None})
        return {**asked, "warm_start": None if options is None else options.as_hparams()}

    def init_warm_start(self, warm_start: "WarmStart | dict[str, Any] | str | None") -> None:
        """Build the warm start ``warm_start`` asks for (:meth:`warm_start_of`), resolved, in the hyperparameters."""
        # a submodule (its buffers in the state dict) or None; no class attribute: nn.Module finds submodules
        # through __getattr__, which a class attribute would shadow
        options = self.warm_start_of(warm_start, self.data_spec, self.budget_accounting)
        self._warm_start_given = options  # before resolving: what a resume may adopt from its checkpoint
        self._warm_start_auto = self._hparams.get("warm_start") == AUTO_WARM_START  # the model's default chose it
        # for the fit summary: what this warm start changes of the model's default one (None: it is not that default)
        base = self.warm_start_base(self.data_spec, self.budget_accounting)
        if options is None or not base:
            self._warm_start_changed = None
        elif isinstance(warm_start, str):  # "auto": the default itself
            self._warm_start_changed = {}
        else:
            self._warm_start_changed = group_from(WarmStart, warm_start, name="warm_start").given_over(base)
        if options is None:
            self.warm_release = None
            self._update_hparams({"warm_start": None})  # stored resolved: "auto" means none here
            return
        if self.budget_accounting != "guarantee":
            raise ValueError("warm_start is a Gaussian release under the guarantee's accounting: use budget_accounting: guarantee")
        options = options.resolved(self.data_spec)
        self._update_hparams({"warm_start": options.as_hparams()})  # resolved, as plain values
        if options.source == "marginals":  # MarginalTree's plan for the share alone
            self.warm_release = MarginalWarmStartRelease(options, self.data_spec, epsilon=options.fraction * self.budget_limit(),
                                                         delta=self.delta, conversion=self.accountant.conversion)
        else:
            self.warm_release = WarmStartRelease(options, self.data_spec, noise_multiplier=self.plan_gaussian_noise(options.fraction))

    def setup(self, stage: str) -> None:
        """Under DDP, every rank takes rank 0's ``feature_seed`` (each drew its own from its public random state without
        ``seed_everything``): the ranks measure one release with one noise (a secret seed shared by all), so their
        embeddings must be the same ones, whatever DDP does with buffers."""
        super().setup(stage)
        release = getattr(self, "warm_release", None)
        if release is not None:
            seed = rank_zero_value(self, release.options.feature_seed)
            if seed != release.options.feature_seed:
                self.adopt_release_options(replace(release.options, feature_seed=seed))

    def adopt_release_options(self, options: WarmStart) -> None:
        """Take ``options`` (the release's, resolved) in place of the release's: its frequencies redrawn, the
        hyperparameters updated."""
        release = self.warm_release
        release.options = options
        release.frequencies = fourier_frequencies(options.features, release.dim, options.length_scale,
                                                  options.feature_seed).to(release.frequencies.device)
        self._update_hparams({"warm_start": options.as_hparams()})

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resume continues the release in the checkpoint: the length scale and feature seed this model resolved
        itself are replaced by the checkpoint's (the frequencies redrawn); a release option given otherwise
        (:data:`RELEASE_OPTIONS`) is refused in one line. The other options (steps, the pull) may change."""
        super().on_load_checkpoint(checkpoint)
        release = getattr(self, "warm_release", None)
        saved = (checkpoint.get("hyper_parameters") or {}).get("warm_start")
        if saved is not None:
            saved = {"source": "features", **saved}  # a warm start saved before ``source`` existed measured the features
        if release is None or saved is None:
            if (release is None) != (saved is None):
                from lightning_gpate.release import CheckpointError

                hint = (" (warm_start: auto, this model's default for this data, chose one: resume with warm_start: null)"
                        if saved is None and self._warm_start_auto else "")
                raise CheckpointError(f"the checkpoint was trained {'with' if saved else 'without'} a warm_start and this run "
                                      f"asks for {'none' if saved else 'one'}{hint}: a resumed fit keeps the checkpoint's release")
            return
        from lightning_gpate.models.base import refuse_changed_on_resume

        given = self._warm_start_given
        asked = {k: getattr(given, k) for k in RELEASE_OPTIONS if getattr(given, k) is not None}
        refuse_changed_on_resume("the checkpoint", {k: saved.get(k) for k in RELEASE_OPTIONS}, asked)
        options = replace(release.options, **{k: saved[k] for k in RELEASE_OPTIONS})
        if options != release.options:
            self.adopt_release_options(options)

    def warm_start_events(self) -> list:
        """The release while it is still to be paid (for budget plans and the first step)."""
        release = self.warm_release
        return release.events() if release is not None and not bool(release.measured) else []

    def warm_start_share(self) -> list[str]:
        """The fit summary's line for the warm start's share of the budget (public facts only)."""
        release = self.warm_release
        if release is None:
            return []
        o = release.options
        made = "released once" if bool(release.measured) else "not released yet"
        what = [f"{int(release.steps_done)} of {o.steps} warm-start generator steps on it"] if o.steps else []
        if o.anchor_weight:
            what.append(f"every later generator step pulls towards it (weight {o.anchor_weight:g})")
        if o.source == "marginals":
            bought = (f"MarginalTree's noisy marginals ({len(release.planned)} planned measurements and selections), {made}, then "
                      f"each class's mean embedding of {o.sample_rows:,} rows sampled from them under {o.features:,} random features")
        else:
            bought = (f"each class's mean embedding under {o.features:,} random features, {made} (noise multiplier "
                      f"{release.noise_multiplier:.3g})")
        changed = getattr(self, "_warm_start_changed", None)
        origin = "" if changed is None else " (warm_start: auto, this model's default for the data" + (
            f", with {', '.join(f'{k} {v}' for k, v in changed.items())})" if changed else ")")
        return [f"{o.fraction:.0%} of the budget (ε {o.fraction * self.budget_limit():g} alone) bought the warm start{origin}: "
                f"{bought}; " + "; ".join(what)]

    def warm_start_generate(self, generator: torch.Generator | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda y: self.generator(self.latent(len(y), generator=generator), y)

    def ensure_warm_started(self, *, generator: torch.Generator | None = None) -> bool:
        """Before the first private step: pay for and measure the release (once: a resume has it), then take the
        warm-start steps still to take (post-processing). ``False`` when the budget refused the release."""
        release = self.warm_release
        if release is None:
            return True
        if not bool(release.measured):
            datamodule = self.whole_split_datamodule("warm_start")
            # every planned event fits with the rest of the plan (events_before_first_step); were one refused, those
            # charged before it stay charged (over-counted, never under) and nothing is measured
            if not all(self.charge(event) for event in release.events()):
                return False
            from lightning_gpate.models.sharding import shared_seed
            from lightning_gpate.privacy.randomness import derived_seed, mechanism_generator

            # the mechanism's secret noise, the same on every DDP rank (so that every replica holds the same release)
            seed = shared_seed(self, derived_seed(self.hparams.get("noise_seed"), "warm_start"))
            x, y = datamodule.model_space("train")
            release.measure(x, y, generator=mechanism_generator(self.device, seed))
            ratio = getattr(release, "label_ratio", None)
            if ratio is not None and self.data_spec.get("class_ratio_source") not in ("public", "dp") and float(ratio.sum()) > 0:
                # labels from the class ratio the marginal model measured (paid for), not uniform: kept in the release
                with torch.no_grad():
                    self.class_ratio.copy_((ratio / ratio.sum()).to(self.class_ratio))
        if int(release.steps_done) < release.options.steps:
            self.take_warm_start_steps(generator=generator)
        return True

    def take_warm_start_steps(self, *, generator: torch.Generator | None = None) -> None:
        """The generator's steps on the release (DP-MERF's optimiser: Adam with a step decay), with a progress bar;
        then the weight average, if any, restarts from the warm-started generator. A resume in the middle continues
        the count and the learning-rate schedule (Adam's moments start afresh: they are not checkpointed)."""
        from lightning_gpate.models.sharding import replicated_backward
        from lightning_gpate.progress import progress

        release, o = self.warm_release, self.warm_release.options
        opt = torch.optim.Adam(self.generator.parameters(), lr=o.lr, betas=o.betas)
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=o.lr_decay_steps, gamma=o.lr_decay)
        for _ in range(int(release.steps_done)):  # a resume continues the schedule where it stopped
            schedule.step()
        generate = self.warm_start_generate(generator)
        self.generator.train()
        loss = None
        for _ in progress(range(int(release.steps_done), o.steps), desc="warm start", total=o.steps - int(release.steps_done), unit="step"):
            loss = release.loss(generate)
            opt.zero_grad()
            # under DDP every rank takes the mean step of the ranks: the replicas stay identical whatever latents each drew
            replicated_backward(self, loss, params=self.generator.parameters())
            opt.step()
            schedule.step()
            release.steps_done += 1
        opt.zero_grad(set_to_none=True)
        if getattr(self, "generator_ema", None) is not None:
            self.generator_ema.load_state_dict(self.generator.state_dict())
        if loss is not None:
            self.log("warm_start_loss", loss.detach(), batch_size=1)  # towards the release: post-processing

    def warm_start_pull(self, generator: torch.Generator | None = None) -> torch.Tensor | float:
        """``anchor_weight`` × the release's loss on fresh fakes, to add to a generator step's loss (0 without)."""
        release = self.warm_release
        if release is None or not release.options.anchor_weight:
            return 0.0
        return release.options.anchor_weight * release.loss(self.warm_start_generate(generator))
