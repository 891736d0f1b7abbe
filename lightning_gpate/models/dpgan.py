"""DP-GAN: a conditional GAN whose discriminator (critic) is trained with DP-SGD; the generator only
sees the critic, so it is post-processing of a DP critic. Two recipes on one mechanism:

* **the 2018 recipe** (Xie et al. 2018, Alg. 1; G-PATE's DP-GAN baseline; the defaults before issue 47,
  :data:`PAPER_SETTINGS`, which the tabular configs use): WGAN critic with weight clipping to [−c, c], RMSprop,
  5 critic steps per generator step, MLP nets;
* **Private GANs, Revisited** (the defaults; Bie, Kamath & Zhang, TMLR 2023, code ``alexbie98/dpgan-revisit``): the
  non-saturating GAN loss (a logistic discriminator), Adam 2e-4 β (0.5, 0.999), the all-convolutional
  conditional DCGAN without normalisation (``architecture: conv``), and many discriminator steps per
  generator step (n_D = ``d_steps``: 50 at ε = 10 on MNIST, 200 at ε = 1), or their adaptive n_D
  (``adaptive_d_steps``: n_D moves up a ladder 1, 2, 5, 10, 20, 50, … whenever the discriminator's
  accuracy on fresh fakes, averaged over generator steps, falls to a threshold: a function of the DP
  discriminator and public fakes, post-processing); the generator's weight average (``ema_decay``) is
  what is sampled (post-processing: free).

What makes the accounting a guarantee:

* **the noisy sum holds the real records only** (Abadi et al. 2016, Alg. 1, applied to the critic
  loss): with ℓ_real(s) = −s (WGAN) or −log σ(s) (non-saturating) and ℓ_fake(s) = s or −log(1 − σ(s)),
  the critic's gradient is
  ``(Σ_{i∈batch} clip_C(∇_w ℓ_real(D(x_i, y_i))) + N(0, σ²C²I)) / B + (1/M) Σ_{j≤M} clip_C(∇_w ℓ_fake(D(G(z_j, y_j), y_j)))``.
  Only the real term reads private data: each record contributes one per-sample gradient, clipped to
  C, so adding or removing one record moves the noisy sum by at most C, whatever the other records
  are (the subsampled Gaussian's sensitivity). The fake term reads no private data: M fakes, M a
  public constant (the expected batch size B), latents and labels drawn from a public generator, the
  generator's BatchNorm running statistics restored afterwards; it is a function of the critic's
  current (already private) weights, i.e. post-processing. Its per-fake gradients are clipped to C
  too (no noise), so that both halves keep one scale (as in Bie et al., whose fakes share the clipped
  sum). (Clipping pairs of fake i and real row i instead would let one record move every later
  pairing, the number of fakes drawn and, through the generator's BatchNorm, every other fake: a
  sensitivity far above C.) Real rows and fakes go through the critic in one vectorised per-sample
  gradient computation, split by row: by default (``dp_sgd_impl: functorch``) ``torch.func``'s ``vmap`` of
  ``grad`` over a Poisson batch cut into fixed-shape physical batches, the last padded with masked rows
  that add exactly 0 (every drawn record used: the sampling is still Poisson at rate q), the step one
  function ``torch.compile`` compiles once on a GPU (:mod:`lightning_gpate.privacy.dpsgd`); or opacus'
  grad sampler (``dp_sgd_impl: opacus``, the reference: every layer's per-sample gradients from its
  activations and output gradients, by hooks).
* **Poisson sampling** (opacus' ``UniformWithReplacementSampler``, served by the DataModule when the
  model declares ``train_sampling = {"kind": "poisson", ...}``): the subsampled Gaussian analysis
  assumes it. Its rate q is a **declared public** hyperparameter (``sampling_rate``), never
  ``batch_size / N`` with N read from the private data: the number of steps the budget affords
  depends on q, so a q computed from the private row count would leak that count through the
  generator (and neighbouring tables would run different mechanisms). An empty Poisson batch is a
  legal outcome and is a noise-only step (opacus: zero clipped sum, N(0, σ²C²) noise, counted).
* **no private step, no release**: a run whose budget cannot pay for one generator step
  (``d_steps`` critic steps) fails at the start with the cost of a step and what to change, instead
  of ending with an untrained generator and ε spent 0.
* **noise and accounting**: opacus' ``DPOptimizer`` adds N(0, σ²C²) to the summed clipped gradients
  and divides by the expected batch size qN (under DDP, :class:`~lightning_gpate.privacy.distributed.DPSumOptimizer`:
  each process clips its shard of the Poisson batch, the noise is drawn once, on rank 0, and the sum
  is all-reduced: the same mechanism, the same accounting); the noise and the Poisson draws come from OS-seeded
  mechanism generators (:mod:`lightning_gpate.privacy.randomness`), never from ``seed_everything``. The
  ``d_steps`` critic steps of a generator step are charged as ``SubsampledGaussianEvent(σ, q, d_steps)``
  (``d_steps`` compositions) *before* the first of them is applied (budget stop; one charge per
  generator step keeps the accountant off the critic's hot loop), and opacus' own ``RDPAccountant``
  follows every critic step (the DP optimizer's own count); opacus' RDP analysis of the worst case below is
  logged as ``epsilon_opacus_worst_case``, a cross-check of the guarantee (a warm start's release included).
* **an adaptive n_D is charged its worst case** (``adaptive_d_steps``): how many critic steps a
  generator step takes is chosen from released outputs (the DP critic's scores of public fakes), so
  a run's cost is itself random. Every generator step is also recorded with the most critic steps the
  public schedule lets that step take (:meth:`DPGAN.most_critic_steps`), as G-PATE records its
  queries all answered: a run ended by ``max_steps``, time or a signal is guaranteed the cost of that
  worst case (capped by the budget the stop kept), never the cost of the steps it happened to take.
  σ, q and the schedule are pinned by a training checkpoint (:data:`MECHANISM_HPARAMS`).
* **no BatchNorm in the critic** (per-sample gradients need per-sample normalisation): the FC
  critic [784, 64, 64, 1] of the G-PATE baseline, the DCGAN critic with GroupNorm/LayerNorm, or the
  all-convolutional critic without normalisation.

One training step receives n_D Poisson batches (``d_steps``, or the adaptive schedule's current n_D: the
DataModule serves what the model asks for), takes one critic step on each, then one generator step,
which is what Lightning counts (``max_steps`` = generator steps).
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lightning_gpate.models.base import refuse_changed_on_resume
from lightning_gpate.models.options import DiscriminatorNet, GeneratorNet, OptionGroup, flat_options, positive_int
from lightning_gpate.models.private import DEFAULT_DELTA, NoPrivateStepError, PrivateGenerativeModel
from lightning_gpate.models.warm_start import WarmStart, WarmStartMixin
from lightning_gpate.nets.discriminators import (
    ConditionalConvDiscriminator, ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator,
)
from lightning_gpate.nets.generators import ConditionalConvGenerator, ConditionalMLPGenerator
from lightning_gpate.privacy import SubsampledGaussianEvent
from lightning_gpate.privacy.disclosure import private_diagnostics_allowed
from lightning_gpate.privacy.dpsgd import (
    HooklessModule, bookkeeping_clipped_sums, bookkeeping_supports, clip_factors, padded_batches, per_sample_gradients,
    physical_batch_size_for, use_patch_grad_convs,
)
from lightning_gpate.privacy.randomness import derived_seed, mechanism_generator

ARCHITECTURES = ("mlp", "dcgan", "conv")
#: ``generator_upsample`` of the DCGAN generator (``generator_architecture: dcgan``): G-PATE's and DP-MERF's choice.
LOSSES = ("wasserstein", "nonsaturating")
OPTIMIZERS = ("rmsprop", "adam")
#: The values the adaptive n_D moves through (Bie et al.'s ``D_STEPS_RATE_OPTIONS``).
D_STEPS_LADDER = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
ACCOUNTANTS = ("rdp", "pld")
#: How the critic's DP-SGD step computes per-sample gradients (``critic_step.impl``).
DP_SGD_IMPLS = ("functorch", "opacus")
#: ``critic_step.per_sample_method`` values: how the functorch step gets each sample's clipped gradient.
PER_SAMPLE_METHODS = ("auto", "vmap", "bookkeeping")
#: ``critic_step.compile`` values: torch.compile modes, "auto" and "none".
COMPILE_MODES = ("auto", "none", "default", "reduce-overhead", "max-autotune")
@dataclass(frozen=True, kw_only=True)
class AdversarialTraining(OptionGroup):
    """How DP-GAN's critic and generator are trained (Bie et al. 2023 by default; Xie et al. 2018: ``{loss:
    wasserstein, optimizer: rmsprop, lr: 5e-5, weight_clip: 0.1}``).

    Args:
        loss: "nonsaturating" (Bie et al. 2023) or "wasserstein" (WGAN). "wasserstein": a WGAN critic, ℓ_real = −D,
            ℓ_fake = D, generator −D; "nonsaturating": a logistic discriminator, ℓ_real = −log σ(D), ℓ_fake =
            −log(1 − σ(D)), generator −log σ(D) (Goodfellow et al. 2014).
        optimizer: "adam" (with betas) or "rmsprop" (WGAN), for both networks. The critic's is wrapped by the DP
            optimizer.
        lr: learning rate of both networks (Bie et al. with Adam: 2e-4; WGAN with RMSprop: 5e-5).
        generator_lr: the generator's own learning rate (null: lr). A warm-started generator fine-tunes with a
            smaller one than its critic's.
        betas: Adam's β1, β2.
        weight_clip: clip the critic's weights to [−weight_clip, weight_clip] after each step (null: none; WGAN: 0.1).
            The non-saturating loss needs no weight clipping.
    """

    loss: str = "nonsaturating"
    optimizer: str = "adam"
    lr: float = 2e-4
    generator_lr: float | None = None
    betas: tuple[float, float] = (0.5, 0.999)
    weight_clip: float | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"training.loss must be one of {LOSSES}, got {self.loss!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"training.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"training.lr must be a finite number > 0, got {self.lr}")
        if self.generator_lr is not None and not (self.generator_lr >= 0 and math.isfinite(self.generator_lr)):
            raise ValueError(f"training.generator_lr must be a finite number >= 0 or null (lr), got {self.generator_lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"training.betas must be two numbers in [0, 1), got {self.betas}")
        if self.weight_clip is not None and not self.weight_clip > 0:
            raise ValueError(f"training.weight_clip must be > 0 or null (none), got {self.weight_clip}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))


@dataclass(frozen=True, kw_only=True)
class CriticStep(OptionGroup):
    """How a DP-SGD critic step gets its clipped per-sample gradients: the same mechanism and accounting whichever is
    chosen (a speed choice; checkpoints move between them).

    Args:
        impl: "functorch" (no hooks, faster) or "opacus" (opacus' hooks and DPOptimizer: the reference). "functorch":
            the clipped sums by torch.func's vmap of grad over one fixed-shape padded physical batch, the step one
            function that torch.compile can compile once, or by book-keeping eagerly (per_sample_method;
            DPGAN.functorch_discriminator_step). On a CPU, eagerly with book-keeping, it measured 3.6-3.7x faster
            than opacus per critic step at width 8, 2.7x at the MNIST configs' width 48.
        physical_batch_size: functorch: rows of one physical batch, the last padded with masked rows (null: by
            device). A Poisson batch is cut into physical batches of this size; every drawn record is used. null:
            where the step is compiled, B + 3√B of this process's expected batch B, rounded up to a multiple of 8
            (one physical batch but about once in 700 steps; one shape, one graph); where it runs eagerly, the
            Poisson batch itself (no padding: on a CPU padding rows cost arithmetic and a new shape costs nothing).
        compile: functorch: the torch.compile mode of the step, "auto", "none" or a mode. "auto": "reduce-overhead"
            (CUDA graphs) on a GPU, eager on a CPU, where the compiled step measured slower; a mode: "default",
            "reduce-overhead" or "max-autotune"; "none": eager. Where compilation fails the step runs eagerly, with a
            one-line warning.
        per_sample_method: functorch: how the clipped sums are computed, "auto", "vmap" or "bookkeeping" (the same
            sums). "vmap": every sample's whole gradient, then clipped and summed (what torch.compile compiles);
            "bookkeeping": one forward and one backward to the layers' outputs, each sample's norm and the clipped
            sums from them layer by layer (bookkeeping_clipped_sums; eager only; critics of linear and convolutional
            layers); "auto": book-keeping where the step runs eagerly and the critic allows it, else vmap.
    """

    impl: str = "functorch"
    physical_batch_size: int | None = None
    compile: str = "auto"
    per_sample_method: str = "auto"

    def __post_init__(self) -> None:
        for option, value, choices in (("impl", self.impl, DP_SGD_IMPLS), ("compile", self.compile, COMPILE_MODES),
                                       ("per_sample_method", self.per_sample_method, PER_SAMPLE_METHODS)):
            if value not in choices:
                raise ValueError(f"critic_step.{option} must be one of {choices}, got {value!r}")
        positive_int("critic_step.physical_batch_size", self.physical_batch_size)


#: PLD ε is reported for step counts rounded up to a multiple of this (an upper bound: ε grows with steps).
PLD_STEP_GRID = 10
OPACUS_ACCOUNTANT_KEY = "opacus_rdp_accountant"
#: What each critic step's cost and the worst case of a generator step are computed from: a training checkpoint
#: pins them (a resume from Python that asks for others is refused, as the CLI refuses any change), so that every
#: critic step of a run is the same Poisson-subsampled Gaussian and the schedule's worst case is fixed in advance.
MECHANISM_HPARAMS = ("noise_multiplier", "sampling_rate", "accountant", "d_steps", "adaptive_d_steps")
#: ``adaptive_d_steps``' default: Bie et al.'s MNIST ε = 10 schedule (``configs/mnist/dpgan_eps10_guarantee.yaml``).
DEFAULT_ADAPTIVE_D_STEPS = {"threshold": 0.6, "grace": 200, "decay": 0.99}
#: The generator and the critic (``generator``'s and ``critic``'s docs).
DEFAULT_GENERATOR = GeneratorNet(z_dim=128, latent_prior="normal", gf_dim=64, fc_dim=1024, upsample="transposed", hidden=(256, 512),
                                 ema_decay=0.995)
DEFAULT_CRITIC = DiscriminatorNet(df_dim=64, fc_dim=1024, hidden=(64, 64))
#: The 2018 recipe's settings where the defaults differ (Xie et al. 2018, Alg. 1; G-PATE's DP-GAN baseline; the
#: defaults before issue 47): ``DPGAN(spec, **PAPER_SETTINGS, ...)``. Under a guarantee on MNIST it generated noise
#: (CNN 0.085 after 6,060 generator steps on an H200: ``benchmarks/results/dpgan_mnist_cpu.md``).
PAPER_SETTINGS = {"architecture": "mlp", "loss": "wasserstein", "optimizer": "rmsprop", "lr": 5e-5, "d_steps": 5,
                  "weight_clip": 0.1, "adaptive_d_steps": None, "ema_decay": 0.0}


def opacus_history(events: Sequence) -> list[tuple[float, float, int]]:
    """``events`` (a warm start's release) as entries ``(noise multiplier, sampling rate, steps)`` of opacus'
    ``RDPAccountant.history``: a Gaussian as it is; an ε-exponential mechanism (ε-bounded range, ε²/8-zCDP: Cesar &
    Rogers 2021) as the Gaussian of the same zCDP, noise multiplier 2/ε, whose RDP αε²/8 bounds the mechanism's."""
    from lightning_gpate.privacy import ExponentialMechanismEvent

    history = []
    for event in events:
        if isinstance(event, SubsampledGaussianEvent):
            history.append((float(event.noise_multiplier), float(event.sampling_rate), int(event.steps)))
        elif isinstance(event, ExponentialMechanismEvent):
            if event.epsilon > 0:  # an ε of 0 costs nothing
                history.append((2.0 / float(event.epsilon), 1.0, 1))
        else:
            raise TypeError(f"opacus has no analysis of a {type(event).__name__}")
    return history


class FlatImageGenerator(nn.Module):
    """Conditional MLP generator whose flat tanh output is reshaped to an image ``(C, H, W)``
    (the fully connected generator of the DP-GAN baseline, G FC [z, 256, 512, 784])."""

    def __init__(self, *, z_dim: int, num_classes: int, out_shape: Sequence[int], hidden: Sequence[int] = (256, 512), norm: str = "batch") -> None:
        super().__init__()
        self.out_shape = tuple(int(s) for s in out_shape)
        dim = math.prod(self.out_shape)
        self.mlp = ConditionalMLPGenerator(z_dim=z_dim, num_classes=num_classes, spans=[(0, dim, "tanh")], hidden=hidden, norm=norm)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.mlp(z, y).view(-1, *self.out_shape)


def build_mlp_generator(model, *, hidden: Sequence[int], norm: str = "batch") -> nn.Module:
    """A conditional MLP generator for the model's data: tables as usual, images reshaped."""
    if model.is_image:
        return FlatImageGenerator(z_dim=model.z_dim, num_classes=model.num_classes, out_shape=model.data_spec["shape"], hidden=hidden, norm=norm)
    return ConditionalMLPGenerator(z_dim=model.z_dim, num_classes=model.num_classes, spans=model.data_spec["spans"], hidden=hidden, norm=norm)


@contextmanager
def frozen(module: nn.Module):
    """Parameters of ``module`` get no gradient inside the block (gradients still flow through it)."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield module
    finally:
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)


@contextmanager
def buffers_restored(module: nn.Module):
    """The buffers of ``module`` (e.g. BatchNorm running statistics) are restored on exit."""
    saved = [b.detach().clone() for b in module.buffers()]
    try:
        yield module
    finally:
        with torch.no_grad():
            for b, value in zip(module.buffers(), saved):
                b.copy_(value)


def critic_losses(loss: str, real_scores: torch.Tensor, fake_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample critic losses ``(ℓ_real(s), ℓ_fake(s))``: ``(−s, s)`` (``"wasserstein"``) or
    ``(−log σ(s), −log(1 − σ(s)))`` (``"nonsaturating"``, computed stably)."""
    if loss == "nonsaturating":
        return F.softplus(-real_scores), F.softplus(fake_scores)
    return -real_scores, fake_scores


def critic_sample_loss(loss: str):
    """``f(score, is_fake)``: each sample's critic loss, ``ℓ_fake`` where ``is_fake`` else ``ℓ_real`` (:func:`critic_losses`)."""
    def sample_loss(score: torch.Tensor, is_fake: torch.Tensor) -> torch.Tensor:
        real, fake = critic_losses(loss, score, score)
        return torch.where(is_fake, fake, real)

    return sample_loss


def critic_gradient_function(critic: nn.Module, *, loss: str, max_grad_norm: float, fake_count: int):
    """The critic's DP-SGD gradient on one physical batch, as one function of fixed-shape tensors (what
    :meth:`DPGAN.functorch_discriminator_step` compiles):
    ``f(params, buffers, x, y, mask, fakes, fake_labels) -> (real_sum, fake_term, real_scores, fake_scores)``.

    The real rows ``x`` and the fakes go through one ``vmap`` of ``grad`` (:func:`per_sample_gradients`):
    ``real_sum = Σ_i mask_i · clip_C(∇_w ℓ_real(D(x_i, y_i)))`` (masked padding rows add exactly 0) and
    ``fake_term = (1/M) Σ_j clip_C(∇_w ℓ_fake(D(fake_j, label_j)))`` with ``M = fake_count`` (the fake
    term of :meth:`DPGAN.critic_per_sample_gradients`: each fake's gradient clipped to C, no noise),
    both flat in the order of ``params``; the scores are the critic's outputs (no gradient). With no
    fakes (a second physical batch of the same step) ``fake_term`` is 0."""
    sample_loss = critic_sample_loss(loss)

    def gradient(params, buffers, x, y, mask, fakes, fake_labels):
        n, m = x.shape[0], fakes.shape[0]
        is_fake = torch.arange(n + m, device=x.device) >= n  # the real rows, then the fakes
        grads, scores = per_sample_gradients(critic, sample_loss, params, buffers, torch.cat([x, fakes]),
                                             torch.cat([y, fake_labels]), is_fake)
        per_sample = list(grads.values())
        factor = clip_factors(per_sample, max_grad_norm)
        weights = torch.stack([torch.cat([factor[:n] * mask, factor.new_zeros(m)]),
                               torch.cat([factor.new_zeros(n), factor[n:] / fake_count])])  # [2, n + m]
        sums = torch.cat([torch.einsum("ki,i...->k...", weights, g).reshape(2, -1) for g in per_sample], dim=1)
        return sums[0], sums[1], scores[:n], scores[n:]

    return gradient


def critic_bookkeeping_function(critic: nn.Module, *, loss: str, max_grad_norm: float, fake_count: int):
    """:func:`critic_gradient_function` (the same signature and results: clipped real sum over the unmasked
    rows, the clipped fake term over ``fake_count``, the scores) by book-keeping
    (:func:`~lightning_gpate.privacy.dpsgd.bookkeeping_clipped_sums`: one forward, one backward to the
    layers' outputs, per-sample norms and weighted sums layer by layer; no per-sample gradient of the whole
    critic). Eager only (an autograd backward inside). ``params`` must be the critic's own parameters
    (detached or not), in its order; ``buffers`` are the critic's own (unused)."""
    named = dict(critic.named_parameters())

    sample_loss = critic_sample_loss(loss)

    def gradient(params, buffers, x, y, mask, fakes, fake_labels):
        n, m = x.shape[0], fakes.shape[0]
        is_fake = torch.arange(n + m, device=x.device) >= n  # the real rows, then the fakes
        own = [named[k] for k in params]
        weights = torch.cat([torch.stack([mask, mask.new_zeros(n)]), mask.new_tensor([[0.0], [1.0 / fake_count]]).expand(2, m)], 1)
        sums, scores = bookkeeping_clipped_sums(critic, sample_loss, torch.cat([x, fakes]), torch.cat([y, fake_labels]), is_fake,
                                                max_grad_norm, weights, own, rows=[slice(0, n), slice(n, n + m)])
        return sums[0], sums[1], scores[:n], scores[n:]

    return gradient


def compiled_or_eager(function, mode: str):
    """``torch.compile(function, mode=mode, dynamic=False)`` (one graph per input shape: the shapes of a
    fixed-shape step never change), running ``function`` eagerly instead, with a one-line warning, where
    compilation fails (no compiler, an unsupported platform). ``function`` must be pure (it may run twice)."""
    import warnings

    state = {"call": None}

    def call(*args):
        if state["call"] is None:
            try:
                state["call"] = torch.compile(function, mode=mode, dynamic=False, fullgraph=True)
            except Exception as error:  # noqa: BLE001 - any failure to compile means: run eagerly
                return fallback(error, *args)
        if state["call"] is function:
            return function(*args)
        try:
            return state["call"](*args)
        except Exception as error:  # noqa: BLE001
            return fallback(error, *args)

    def fallback(error: Exception, *args):
        detail = str(error).splitlines()[0][:160] if str(error) else ""
        warnings.warn(f"torch.compile is unavailable here ({type(error).__name__}: {detail}); "
                      f"the DP-SGD step runs eagerly", stacklevel=3)
        state["call"] = function
        return function(*args)

    return call


def check_adaptive_d_steps(options: dict[str, float], d_steps: int) -> dict[str, float]:
    """``adaptive_d_steps`` with its keys checked (``threshold`` in [0, 1], ``grace`` >= 1 generator steps,
    ``decay`` in [0, 1)); ``d_steps`` must be on :data:`D_STEPS_LADDER`."""
    options = dict(options)
    if set(options) != {"threshold", "grace", "decay"}:
        raise ValueError(f"adaptive_d_steps takes threshold, grace and decay (e.g. {{threshold: 0.6, grace: 200, decay: 0.99}}), "
                         f"got {sorted(options)}")
    if not (0 <= options["threshold"] <= 1 and options["grace"] >= 1 and 0 <= options["decay"] < 1):
        raise ValueError(f"adaptive_d_steps needs threshold in [0, 1], grace >= 1 and decay in [0, 1), got {options}")
    if d_steps not in D_STEPS_LADDER:
        raise ValueError(f"with adaptive_d_steps (on by default), d_steps (the first n_D) must be one of {D_STEPS_LADDER}, got "
                         f"{d_steps}; set adaptive_d_steps: null for a fixed n_D")
    return options


class DPGAN(WarmStartMixin, PrivateGenerativeModel):
    """Conditional GAN with a DP-SGD critic: by default the recipe of Private GANs, Revisited (Bie et al. 2023), the
    2018 recipe of Xie et al. (G-PATE's DP-GAN baseline) with PAPER_SETTINGS.

    Bie et al.'s recipe: the non-saturating loss, Adam 2e-4, no weight clipping, the all-convolutional nets for
    images, the adaptive n_D, a weight average (the MNIST rows' recipe, ``configs/mnist/dpgan_eps*_guarantee.yaml``);
    Xie et al. 2018, Algorithm 1, is :data:`PAPER_SETTINGS`. On a table the 2018 recipe at lr 5e-4 scored better
    (cervical, three seeds: mean AUROC 0.677 against the defaults' 0.585): the tabular configs state it.

    Args:
        data_spec: the DataModule's spec (the DataModule must serve Poisson batches: any GenerativeDataModule with
            num_teachers: 0 does).
        epsilon: the privacy budget ε; training stops before a generator step's critic steps would exceed it.
        delta: δ of the (ε, δ) guarantee.
        sampling_rate: q, the Poisson rate of each critic batch, declared public (required). For example the paper's
            64 / 60000 for MNIST: an expected batch of 64 from a dataset whose size is public. It is not derived from
            the private row count. The DataModule's batch_size is the expected batch size q·N the noisy gradient sum
            is divided by (a public constant).
        noise_multiplier: σ of DP-SGD, the noise std σ·C on the summed clipped gradients.
        max_grad_norm: C, the L2 bound of each real record's critic gradient (of ℓ_real(D(x_i, y_i))).
        budget_accounting: "guarantee", the only analysis of DP-SGD ("paper" is refused).
        conversion: RDP to (ε, δ) conversion, "improved" or "classic".
        training: how both networks are trained: loss, optimizer, learning rates, betas, weight clipping. The default
            is Bie et al.'s non-saturating loss with Adam 2e-4, (0.5, 0.999).
        critic_warmup_steps: training steps of critic steps only, before the first generator update. Each pays its
            n_D critic steps like any other; Lightning counts none of them, so max_steps still counts generator
            updates. A warm-started generator then first moves through a trained critic.
        d_steps: n_D, critic steps per generator step; with adaptive_d_steps the first n_D. 1 is the first rung of
            the adaptive n_D (Xie et al.: 5; Bie et al.: 50 at ε = 10, 200 at ε = 1 on MNIST); with adaptive_d_steps
            it is one of D_STEPS_LADDER.
        adaptive_d_steps: Bie et al.'s adaptive n_D (null: n_D stays d_steps). The default {threshold: 0.6, grace:
            200, decay: 0.99} is their MNIST ε = 10 setting (ε = 1: threshold 0.7). After every generator step, an
            average (decay "decay") of the fraction of that step's fresh fakes the critic scores as fake (D < 0);
            once "grace" generator steps have passed at the current n_D and the average is at most "threshold", n_D
            moves to the next value of D_STEPS_LADDER. The reported ε is that of the schedule's worst case
            (most_critic_steps), capped by the budget.
        architecture: "conv", "dcgan" or "mlp" (null: "conv" for images, "mlp" for tables). "mlp": the baseline's
            fully connected nets, also for tables; "dcgan": conditional DCGAN nets, critic with GroupNorm/LayerNorm
            (images only); "conv": the all-convolutional conditional DCGAN of Bie et al., no normalisation (images
            only). Stored resolved.
        generator_architecture: the generator's net if not architecture's (null: architecture's). The critic stays
            architecture's. "dcgan" with generator: {upsample: nearest} is DP-MERF's generator family (gf_dim 8,
            fc_dim 200, z_dim 5: DP-MERF's MNIST generator), what a warm start trains best.
        generator: the generator network (a mapping of its options overrides some). z 128 from N(0, I) (the
            baseline's G FC [128, 256, 512, 784]); the MLP's hidden (256, 512); the DCGAN's and the conv net's gf_dim
            64, the DCGAN's fc_dim 1,024 and upsample transposed (nearest: ×2 nearest-neighbour, then a 5×5
            convolution, no lattice); ema_decay 0.995, the weight average that is sampled and released (the MNIST
            rows'; 0: none). Post-processing.
        critic: the critic network (a mapping of its options overrides some). The MLP's hidden (64, 64), no
            normalisation; the DCGAN's and the conv net's df_dim 64 (Bie et al.: 128), the DCGAN's fc_dim 1,024.
        warm_start: a private warm start (a mapping of its options; default: none). For example {fraction: 0.5,
            steps: 2400, anchor_weight: 0.1}: a share of ε buys DP-MERF's one release before the first critic step,
            the generator trains on it (post-processing), and its pull may stay in every generator step. Under
            accountant: pld its release's PLD is composed with the critic steps'. Its options:
            --model.warm_start.help.
        secure_mode: opacus' noise, robust to floating-point attacks (slower).
        accountant: "rdp" (the moments accountant) or "pld" (privacy loss distributions, about 30% smaller ε). Both
            are guarantees of the same steps: "pld" (dp-accounting) buys more steps for a budget
            (lightning_gpate.privacy.pld). The RDP accountant records the steps either way (logged as
            epsilon_final_rdp).
        log_private_diagnostics: also log the critic's gap and the batch size (unnoised); debugging only. That is mean
            D(real) − mean D(fake) (WGAN: the critic's Wasserstein estimate; non-saturating: the logit gap) on the real
            batch and the Poisson batch size, functions of the private data without noise, under private/* (under
            DDP: the estimate on rank 0's shard, the size of the whole batch).
        critic_step: how a critic step computes its clipped per-sample gradients (a speed choice). The same mechanism
            and accounting whichever is chosen.
        noise_seed: seed of the DP-SGD noise and the Poisson sampling, for tests only (null: secret, from the OS). A
            fixed seed lets anyone who knows it replay the noise and the batches.
    """

    HAS_PAPER_ANALYSIS = False  # DP-SGD's RDP / PLD bounds are guarantees: there is no paper-style analysis
    #: Options whose ``None`` the constructor resolves from the data's kind and stores resolved (:meth:`store_resolved_hparams`).
    RESOLVED_HPARAMS = ("architecture",)
    FLAT_OPTIONS = {**flat_options("critic"),
                    **{name: (f"training.{name}",) for name in ("loss", "optimizer", "lr", "generator_lr", "betas", "weight_clip")},
                    "dp_sgd_impl": ("critic_step.impl",), "physical_batch_size": ("critic_step.physical_batch_size",),
                    "compile_critic_step": ("critic_step.compile",), "per_sample_method": ("critic_step.per_sample_method",)}

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float = DEFAULT_DELTA,
        sampling_rate: float | None = None,
        noise_multiplier: float = 1.1,
        max_grad_norm: float = 1.0,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        training: AdversarialTraining = AdversarialTraining(),
        critic_warmup_steps: int = 0,
        d_steps: int = 1,
        adaptive_d_steps: dict[str, float] | None = DEFAULT_ADAPTIVE_D_STEPS,
        architecture: str | None = None,
        generator_architecture: str | None = None,
        generator: GeneratorNet = DEFAULT_GENERATOR,
        critic: DiscriminatorNet = DEFAULT_CRITIC,
        warm_start: WarmStart | None = None,
        secure_mode: bool = False,
        accountant: str = "rdp",
        log_private_diagnostics: bool = False,
        critic_step: CriticStep = CriticStep(),
        noise_seed: int | None = None,
    ) -> None:
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        critic_options = DiscriminatorNet.of(critic, DEFAULT_CRITIC, name="critic")
        training_options = AdversarialTraining.of(training, AdversarialTraining(), name="training")
        step_options = CriticStep.of(critic_step, CriticStep(), name="critic_step")
        super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
                         conversion=conversion, z_dim=net_options.z_dim, latent_prior=net_options.latent_prior,
                         log_private_diagnostics=log_private_diagnostics)
        from opacus import GradSampleModule
        from opacus.accountants import RDPAccountant

        if sampling_rate is not None and not 0 < sampling_rate <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
        if int(critic_warmup_steps) != critic_warmup_steps or critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps must be an integer >= 0, got {critic_warmup_steps}")
        if not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm must be a finite number > 0, got {max_grad_norm}")
        if d_steps < 1:
            raise ValueError(f"d_steps must be >= 1, got {d_steps}")
        if adaptive_d_steps is not None:
            if training_options.loss != "nonsaturating":
                raise ValueError("adaptive_d_steps (on by default) reads the discriminator's accuracy on fakes (D < 0): it needs "
                                 "training.loss: nonsaturating; set adaptive_d_steps: null for a fixed n_D (d_steps)")
            adaptive_d_steps = check_adaptive_d_steps(adaptive_d_steps, d_steps)
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
        requested = {"architecture": architecture}
        if architecture is None:  # the default: Bie et al.'s all-convolutional nets for images, the MLP for tables
            architecture = "conv" if self.is_image else "mlp"
        for option, value in (("architecture", architecture), ("generator_architecture", generator_architecture)):
            if value is not None and value not in ARCHITECTURES:
                raise ValueError(f"{option} must be one of {ARCHITECTURES}, got {value!r}")
            if value not in (None, "mlp") and not self.is_image:
                raise ValueError(f"{option} {value!r} is for images; use 'mlp' for tables")
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options, critic=critic_options, training=training_options, critic_step=step_options)
        self.store_resolved_hparams(requested, architecture=architecture)
        self.automatic_optimization = False
        self.generator_options, self.training_options, self.critic_step_options = net_options, training_options, step_options
        in_features = math.prod(data_spec["shape"])
        generator_net = generator_architecture or architecture
        if generator_net == "conv":
            self.generator = ConditionalConvGenerator(z_dim=self.z_dim, num_classes=self.num_classes, out_shape=data_spec["shape"],
                                                      gf_dim=net_options.gf_dim)
        elif generator_net == "dcgan":
            self.generator = self.build_generator(net_options)
        else:
            self.generator = build_mlp_generator(self, hidden=net_options.hidden)
        shape = data_spec["shape"]
        if architecture == "conv":
            critic_net = ConditionalConvDiscriminator(in_shape=shape, num_classes=self.num_classes, df_dim=critic_options.df_dim)
        elif architecture == "dcgan":
            critic_net = ConditionalDCGANDiscriminator(in_shape=shape, num_classes=self.num_classes, df_dim=critic_options.df_dim,
                                                       fc_dim=critic_options.fc_dim, norm="group")
        else:
            critic_net = ConditionalMLPDiscriminator(in_features=in_features, num_classes=self.num_classes, hidden=critic_options.hidden,
                                                     norm="none")
        if net_options.averaged:  # the sampled generator (generator_module): an average of the generator's iterates
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False)
        self.init_warm_start(warm_start)  # its share of ε planned alone; the critic's steps get the rest
        if accountant == "pld" and self.warm_release is not None and self.warm_release.options.source != "features":
            raise ValueError("accountant: pld composes the critic's steps with one Gaussian release (warm_start.source "
                             "'features'); a warm start from the marginal model (selections too) needs accountant: rdp")
        # Per-sample gradients of a summed loss; opacus refuses BatchNorm here (it mixes samples).
        # (functorch: the same holder without hooks, so that checkpoints move between the implementations)
        if step_options.impl == "opacus":
            self.discriminator = GradSampleModule(critic_net, batch_first=True, loss_reduction="sum")
        else:
            if hasattr(critic_net, "label_taps"):  # the same function; its per-sample gradients without label maps
                critic_net.label_taps = True
            self.discriminator = HooklessModule(critic_net)
        self._critic_step_fn = None  # the functorch step (compiled on first use)
        self.per_sample_method_used: str | None = None  # "vmap" or "bookkeeping", once the step is built
        self._critic_step_compiled = False
        # Under DDP the critic's gradient is the noisy all-reduced sum (DPSumOptimizer), never DDP's
        # average of raw gradients: DDP ignores the critic (its weights are broadcast once at the start).
        self._ddp_params_and_buffers_to_ignore = [n for n, _ in self.named_parameters() if n.startswith("discriminator.")] + [
            n for n, _ in self.named_buffers() if n.startswith("discriminator.")]
        self._public_seed: int | None = None
        self._public_gen: torch.Generator | None = None
        self.opacus_accountant = RDPAccountant()
        self.register_buffer("critic_steps_taken", torch.zeros((), dtype=torch.long))
        # the adaptive n_D's state (public: computed from the DP critic and public fakes), kept in checkpoints
        self.register_buffer("d_steps_now", torch.tensor(d_steps, dtype=torch.long))
        self.register_buffer("fake_accuracy_average", torch.tensor(float("nan")))
        self.register_buffer("generator_steps_at_d_steps", torch.zeros((), dtype=torch.long))
        # generator steps paid for over the whole run (resumes included): what the worst case of the next one is
        self.register_buffer("generator_steps_paid", torch.zeros((), dtype=torch.long))

    # ----------------------------------------------------------------- sampling rate
    @property
    def sampling_rate(self) -> float:
        """Poisson rate q of every critic batch (declared public: ``sampling_rate``; required to train,
        not to load a checkpoint and sample)."""
        if self.hparams.sampling_rate is None:
            raise ValueError(
                "DP-GAN needs its Poisson sampling rate declared public: set sampling_rate (model.init_args."
                "sampling_rate), e.g. the expected batch size divided by a public number of rows (64 / 60000 "
                "for MNIST). It is not computed from the data: the row count is private"
            )
        return float(self.hparams.sampling_rate)

    @property
    def train_sampling(self) -> dict[str, Any]:
        """What the DataModule serves: one Poisson batch at the declared rate per critic step, drawn from
        its own OS-seeded generator."""
        return {"kind": "poisson", "batches": int(self.d_steps_now), "sample_rate": self.sampling_rate,
                "mechanism_seed": derived_seed(self.hparams.noise_seed, "poisson")}

    @property
    def expected_batch_size(self) -> float:
        """The public expected batch size q·N that the noisy gradient sum is divided by: the attached
        DataModule's ``batch_size`` (a declared constant; the private N is never read)."""
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        batch_size = getattr(dm, "batch_size", None)
        if batch_size is None:
            raise ValueError("DP-GAN needs a GenerativeDataModule (it serves the Poisson batches and declares the expected batch size)")
        return float(batch_size)

    @property
    def fake_batch_size(self) -> int:
        """M, the fakes of every critic step's fake term and of every generator step: the expected
        batch size (public), at least 2 (BatchNorm in G needs more than one sample)."""
        return max(2, round(self.expected_batch_size))

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # Latents and labels of the fakes: public randomness (it follows seed_everything), the same
        # stream on every process (rank 0's seed), so that every process computes the same fake term
        # and generator step. Never the mechanism generator: that one is secret.
        seed = int(torch.randint(2**62, (1,)))
        if self._trainer is not None and self.trainer.world_size > 1:
            seed = int(self.trainer.strategy.broadcast(seed, src=0))
        self._public_seed, self._public_gen = seed, None

    @property
    def public_generator(self) -> torch.Generator:
        """The generator of the fakes' latents and labels (see :meth:`setup`), on the model's device."""
        if self._public_gen is None or self._public_gen.device != self.device:
            if self._public_seed is None:  # used outside a fit
                self._public_seed = int(torch.randint(2**62, (1,)))
            self._public_gen = torch.Generator(device=self.device).manual_seed(self._public_seed)
        return self._public_gen

    def configure_optimizers(self):
        from lightning_gpate.privacy.distributed import DPSumOptimizer

        hp = self.training_options
        if hp.optimizer == "adam":
            make = lambda params, lr: torch.optim.Adam(params, lr=lr, betas=tuple(hp.betas))  # noqa: E731
        else:
            make = lambda params, lr: torch.optim.RMSprop(params, lr=lr)  # noqa: E731
        opt_g = make(self.generator.parameters(), hp.lr if hp.generator_lr is None else hp.generator_lr)
        if hp.optimizer == "adam" and self.critic_step_options.impl == "functorch":
            # the critic's Adam as one fused kernel (the same update): the for-loop one is ~10 operator calls per
            # tensor, ~100 a critic step, a fifth of the functorch step's host work at width 8 (dpgan_mnist_cpu.md)
            critic_opt = torch.optim.Adam(self.discriminator.parameters(), lr=hp.lr, betas=tuple(hp.betas), fused=True)
        else:
            critic_opt = make(self.discriminator.parameters(), hp.lr)
        opt_d = DPSumOptimizer(
            critic_opt,
            noise_multiplier=self.hparams.noise_multiplier, max_grad_norm=self.hparams.max_grad_norm,
            expected_batch_size=self.expected_batch_size, loss_reduction="mean",
            generator=mechanism_generator(self.device, self.hparams.noise_seed), secure_mode=self.hparams.secure_mode,
        )
        opt_d.attach_step_hook(self.opacus_accountant.get_optimizer_hook_fn(sample_rate=self.sampling_rate))
        return opt_g, opt_d

    def generator_step_event(self, steps: int | None = None, *, noise_multiplier: float | None = None) -> SubsampledGaussianEvent:
        """The cost of one generator step: its ``steps`` critic steps (default n_D: ``d_steps``, or the adaptive
        schedule's now), each a Poisson-subsampled Gaussian (add/remove neighbours), at ``noise_multiplier``
        (default the model's σ)."""
        sigma = self.hparams.noise_multiplier if noise_multiplier is None else noise_multiplier
        return SubsampledGaussianEvent(noise_multiplier=sigma, sampling_rate=self.sampling_rate,
                                       steps=int(self.d_steps_now) if steps is None else steps)

    def most_critic_steps(self, generator_step: int) -> int:
        """The most critic steps that generator step ``generator_step`` (0-based, counted over the whole run,
        resumes included) can take under the public schedule: the highest rung of :data:`D_STEPS_LADDER` it
        can reach, or ``d_steps`` without ``adaptive_d_steps``.

        Why this is the highest reachable rung: n_D starts at ``d_steps`` (rung i₀) and changes only in
        :meth:`adapt_d_steps`, after a paid generator step, by one rung up, and only once the count of
        generator steps at the current rung has reached ``grace`` (the count then restarts at 0); the
        averaged fake accuracy (the only input read from the critic, i.e. from the private data) can at
        most always allow the move. So each move needs g = ⌈grace⌉ steps at the rung before it, the k-th
        move comes after step k·g − 1 at the earliest, and step t runs at a rung ≤ i₀ + ⌊t / g⌋, capped at
        the ladder's top. The batches a step is served never exceed the current n_D (after a move the
        DataModule may serve the old count once more, never a higher one). The bound is a function of
        ``d_steps``, ``grace`` and t alone: public and fixed before the run (:data:`MECHANISM_HPARAMS` are
        pinned on resume; t is the buffer ``generator_steps_paid``, kept in checkpoints).
        """
        d_steps, options = int(self.hparams.d_steps), self.hparams.adaptive_d_steps
        if options is None:
            return d_steps
        rung = D_STEPS_LADDER.index(d_steps) + int(generator_step) // math.ceil(options["grace"])
        return D_STEPS_LADDER[min(rung, len(D_STEPS_LADDER) - 1)]

    def most_critic_steps_in(self, generator_steps: int) -> int:
        """The most critic steps the first ``generator_steps`` generator steps can take: the sum of
        :meth:`most_critic_steps` over them (``dpgan_eps10_guarantee``, n_D from 1 with a grace of 200:
        7,600 in 1,000 generator steps, 200 at each of n_D 1, 2, 5, 10 and 20)."""
        total, t, steps = 0, 0, int(generator_steps)
        options = self.hparams.adaptive_d_steps
        grace = math.ceil(options["grace"]) if options is not None else steps
        while t < steps:  # one rung at a time: t stays a multiple of the grace below the top
            n_d = self.most_critic_steps(t)
            n = steps - t if options is None or n_d == D_STEPS_LADDER[-1] else min(grace, steps - t)
            total, t = total + n * n_d, t + n
        return total

    def critic_steps_worst_case(self) -> int:
        """The most critic steps the generator steps paid so far could have taken (at least those taken):
        what the run's guarantee counts (:meth:`guarantee_epsilon`)."""
        return max(int(self.critic_steps_taken), self.most_critic_steps_in(int(self.generator_steps_paid)))

    def pay_for_generator_step(self, critic_steps: int) -> bool:
        """Charge the next generator step's ``critic_steps`` critic steps (the batches it was served) before any
        is applied, recorded with the step's worst case (:meth:`most_critic_steps`) in the accountant's
        worst-case curve. The budget stop compares what was taken (a privacy filter; with ``accountant: pld``
        a deterministic cap on the critic steps); the guarantee is that of the worst case, capped by the
        budget. Returns ``False`` (nothing recorded, the trainer asked to stop) when the budget cannot pay."""
        worst = self.generator_step_event(self.most_critic_steps(int(self.generator_steps_paid)))
        if not self.charge(self.generator_step_event(critic_steps), worst_case=worst):
            return False
        self.generator_steps_paid += 1
        return True

    def budget_shares(self) -> list[str]:
        """With a warm start: what its share bought, and that the critic's DP-SGD steps got the rest."""
        shares = self.warm_start_share()
        if shares:
            shares.append(f"the rest: {int(self.critic_steps_taken):,} DP-SGD critic steps (noise multiplier "
                          f"{self.hparams.noise_multiplier:g}, sampling rate {self.sampling_rate:.4g}) fine-tuned the generator")
        return shares

    def check_affords_a_step(self) -> None:
        """Refuse a run whose budget cannot pay for a single generator step (it would end with an
        untrained generator and ε spent 0), saying what one costs and what would fit."""
        cost = self.accountant.epsilon_if(*self.events_before_first_step(), self.generator_step_event())
        if cost <= self.epsilon_budget:
            return
        hp = self.hparams
        sigma = self.noise_multiplier_for_one_step()
        after = ", after the warm start's release" if self.events_before_first_step() else ""
        raise NoPrivateStepError(
            f"DP-GAN can take no private step within epsilon={self.epsilon_budget:g} (delta={self.delta:g}): one generator "
            f"step ({int(self.d_steps_now)} critic steps with noise_multiplier={hp.noise_multiplier:g} at sampling_rate={self.sampling_rate:.4g}{after}) "
            f"already costs epsilon={cost:.3g}. Lower sampling_rate, raise noise_multiplier (>= {sigma:.3g} affords one "
            f"step; more noise affords more), lower d_steps, or raise the budget"
        )

    def noise_multiplier_for_one_step(self) -> float:
        """Smallest σ (to 1%) at which one generator step fits the budget left (for error messages)."""
        def fits(sigma: float) -> bool:
            event = self.generator_step_event(noise_multiplier=sigma)
            return self.accountant.epsilon_if(*self.events_before_first_step(), event) <= self.epsilon_budget

        lo, hi = float(self.hparams.noise_multiplier), float(self.hparams.noise_multiplier) * 2
        while not fits(hi) and hi < 1e6:
            lo, hi = hi, hi * 2
        while hi / lo > 1.01:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        return hi

    def on_train_start(self) -> None:
        super().on_train_start()
        self.check_affords_a_step()
        from lightning_gpate.privacy.distributed import broadcast_from_rank_zero

        # DDP ignores the critic (see __init__): every process starts from rank 0's critic
        broadcast_from_rank_zero([*self.discriminator.parameters(), *self.discriminator.buffers()])
        self._serve_d_steps()  # a resumed adaptive run continues at its n_D
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        rate = getattr(dataset, "sample_rate", None)
        if rate is None or not math.isclose(rate, self.sampling_rate, rel_tol=1e-12):
            raise ValueError(
                f"DP-GAN's accounting assumes Poisson sampling with rate q={self.sampling_rate:.6g}, but the "
                f"training data is {type(dataset).__name__} (sample_rate={rate}); train it with a "
                f"GenerativeDataModule, which serves Poisson batches to models that ask for them"
            )

    # ----------------------------------------------------------------- PLD accounting
    def _pld_epsilon(self, steps: int) -> float:
        from lightning_gpate.privacy.pld import dpsgd_pld_epsilon

        key = (int(steps), self.sampling_rate)
        cache = self.__dict__.setdefault("_pld_cache", {})
        if key not in cache:
            cache[key] = dpsgd_pld_epsilon(
                noise_multiplier=self.hparams.noise_multiplier, sampling_rate=self.sampling_rate, steps=int(steps),
                delta=self.delta, pure_epsilon=float(self.accountant.counts["pure_dp_epsilon"]),
                gaussian_releases=self._pld_gaussian_releases())
        return cache[key]

    def _pld_gaussian_releases(self) -> tuple[float, ...]:
        """The warm start's release (its noise multiplier), composed with the critic steps whether it is made yet or
        not: it is planned before the first step and paid for once."""
        return (self.warm_release.noise_multiplier,) if self.warm_release is not None else ()

    def _pld_max_steps(self) -> int:
        """Most critic steps the budget allows under PLD accounting (computed once per sampling rate)."""
        from lightning_gpate.privacy.pld import dpsgd_pld_max_steps

        key = ("max", self.sampling_rate)
        cache = self.__dict__.setdefault("_pld_cache", {})
        if key not in cache:
            cache[key] = dpsgd_pld_max_steps(
                noise_multiplier=self.hparams.noise_multiplier, sampling_rate=self.sampling_rate, epsilon=self.epsilon_budget,
                delta=self.delta, pure_epsilon=float(self.accountant.counts["pure_dp_epsilon"]),
                gaussian_releases=self._pld_gaussian_releases())
        return cache[key]

    def _pld_bound(self, steps: int) -> float:
        """PLD ε of ``steps`` critic steps and the metadata's pure ε, for speed at the step count rounded up
        to a multiple of ``PLD_STEP_GRID`` (an upper bound) unless that passes the budget's maximum."""
        rounded = -(-int(steps) // PLD_STEP_GRID) * PLD_STEP_GRID
        return self._pld_epsilon(steps if rounded > self._pld_max_steps() else rounded)

    def guarantee_epsilon(self) -> float:
        """RDP: the base's min(budget, ε of the worst-case curve). ``accountant: pld``: the PLD ε of
        min(N_worst, N_max) critic steps, N_worst the most the paid generator steps could have taken
        (:meth:`critic_steps_worst_case`) and N_max the most the budget stop lets a run take (it stops
        before the critic steps taken would pass it): every critic step is the same Poisson-subsampled
        Gaussian (σ, q pinned), so a run whose number of steps is chosen adaptively but never exceeds a
        count fixed in advance is post-processing of that many steps, whatever stopped it."""
        if not self._pld_in_force():
            return super().guarantee_epsilon()
        return self._pld_bound(min(self.critic_steps_worst_case(), self._pld_max_steps()))

    def _pld_in_force(self) -> bool:
        """Whether :meth:`guarantee_epsilon` is the PLD bound (``accountant: pld``, during a fit)."""
        return self.hparams.get("accountant", "rdp") != "rdp" and self._trainer is not None

    def guarantee_order(self) -> float | None:
        """``None`` while the PLD bound is the guarantee (no Rényi order gives it)."""
        return None if self._pld_in_force() else super().guarantee_order()

    def stop_rule_filters_rdp(self) -> bool:
        """With ``accountant: pld`` the budget stop compares the PLD ε: the RDP bound beside it is the RDP ε
        of the worst-case curve (:meth:`most_critic_steps` per generator step), not capped by the budget."""
        return self.hparams.get("accountant", "rdp") == "rdp" and super().stop_rule_filters_rdp()

    def _charged_epsilon(self) -> float:
        """What the budget stop says it compares: with ``accountant: pld`` the PLD ε of the critic steps
        taken (the stop message said the RDP ε, e.g. "from 11.84 to 10.0004")."""
        return self._pld_bound(int(self.critic_steps_taken)) if self._pld_in_force() else super()._charged_epsilon()

    def epsilon_if(self, event) -> float:
        """ε after ``event`` under the budget's accountant. With PLD, a step count within the budget's
        maximum reports the ε of that maximum (an upper bound, computed once), so that each step does
        not recompose the PLD."""
        if self.hparams.get("accountant", "rdp") == "rdp":
            return super().epsilon_if(event)
        after = int(self.critic_steps_taken) + int(event.steps)
        cap = self._pld_max_steps()
        return self._pld_epsilon(cap if after <= cap else after)

    # ----------------------------------------------------------------- steps
    def critic_losses(self, real_scores: torch.Tensor, fake_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample critic losses ``(ℓ_real(D(x_i)), ℓ_fake(D(G(z_j))))`` of the configured ``training.loss``."""
        return critic_losses(self.training_options.loss, real_scores, fake_scores)

    def generator_loss(self, fake_scores: torch.Tensor) -> torch.Tensor:
        """The generator's loss on the critic's scores of its fakes: ``mean −log σ(s)`` (non-saturating)
        or ``mean −s`` (WGAN)."""
        if self.training_options.loss == "nonsaturating":
            return F.softplus(-fake_scores).mean()
        return -fake_scores.mean()

    def public_fakes(self, m: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` (default :attr:`fake_batch_size`) fakes and their labels from the public generator (no
        gradient; the generator's BatchNorm buffers restored): no private data, the same on every process."""
        m, gen = m or self.fake_batch_size, self.public_generator
        labels = self.sample_labels(m, generator=gen)
        with torch.no_grad(), buffers_restored(self.generator):
            fakes = self.generator(self.latent(m, generator=gen), labels)
        return fakes, labels

    def critic_per_sample_gradients(self, real_x: torch.Tensor, real_y: torch.Tensor,
                                    fakes: tuple[torch.Tensor, torch.Tensor] | None = None
                                    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """One forward and backward pass of the critic over this process's rows of the Poisson batch and
        the :meth:`public_fakes`, its per-sample gradients split by row:

        * every critic parameter's ``p.grad_sample`` is left holding the per-record gradients of
          ``ℓ_real(D(x_i, y_i))`` (``[n, *p.shape]``), for the DP optimizer to clip, sum and noise;
        * the fake term ``(1/M) Σ_j clip_C(∇_w ℓ_fake(D(G(z_j, y_j), y_j)))`` is returned, one tensor per
          parameter: each fake's gradient is clipped to C as each real record's is (no noise: nothing
          private), so that the two halves of the loss keep one scale; unclipped, the fake half dominated
          and DP-GAN's tables went from 0.08 to 0.19–0.36 mean 1-way TVD on cervical.

        ``fakes``: ``(images, labels)`` from :meth:`public_fakes` (default: drawn here). Returns
        ``(fake_term, real_scores, fake_scores)``, the scores detached (the real ones are a function of
        the private data without noise: private diagnostics only)."""
        fakes, labels = fakes if fakes is not None else self.public_fakes()
        n = len(real_y)
        params = [p for p in self.discriminator.parameters() if p.requires_grad]
        scores = self.discriminator(torch.cat([real_x.to(fakes.dtype), fakes]), torch.cat([real_y.to(labels.dtype), labels]))
        real_loss, fake_loss = self.critic_losses(scores[:n], scores[n:])
        # autograd directly, not manual_backward: DDP ignores the critic (no reducer for this backward)
        torch.autograd.backward(real_loss.sum() + fake_loss.sum())  # per-sample gradients into p.grad_sample (opacus hooks)
        fake_rows = [p.grad_sample[n:] for p in params]
        m = len(labels)
        norms = torch.stack([g.reshape(m, -1).norm(dim=1) for g in fake_rows], dim=1).norm(dim=1)
        factor = (self.hparams.max_grad_norm / (norms + 1e-6)).clamp(max=1.0) / m
        fake_term = [torch.einsum("i,i...->...", factor, g) for g in fake_rows]
        for p in params:  # only the real rows enter the noisy sum (an empty batch: none, a noise-only step)
            p.grad_sample = p.grad_sample[:n]
        scores = scores.detach()
        return fake_term, scores[:n], scores[n:]

    def discriminator_step(self, real_x: torch.Tensor, real_y: torch.Tensor,
                           fakes: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One DP-SGD critic step on a Poisson batch (already paid for) and ``fakes`` (default: drawn
        here), then weight clipping where configured. Returns ``mean D(real) − mean D(fake)`` on this process's rows (WGAN: the critic's
        Wasserstein estimate; non-saturating: the logit gap; private: a diagnostic only)."""
        if self.critic_step_options.impl == "functorch":
            return self.functorch_discriminator_step(real_x, real_y, fakes)
        dp_opt = self.optimizers()[1].optimizer
        dp_opt.zero_grad()  # clears the last step's per-sample gradients
        fake_term, real_scores, fake_scores = self.critic_per_sample_gradients(real_x, real_y, fakes)
        # clip per record, sum (over processes), add N(0, σ²C²) once, divide by B; the opacus accountant's hook
        if dp_opt.pre_step():
            with torch.no_grad():
                for p, g in zip((p for p in self.discriminator.parameters() if p.requires_grad), fake_term):
                    p.grad.add_(g)
            dp_opt.original_optimizer.step()  # uncounted: Lightning counts generator steps
        c = self.training_options.weight_clip
        if c is not None:
            with torch.no_grad():
                for p in self.discriminator.parameters():
                    p.clamp_(-c, c)
        return real_scores.sum() / max(len(real_y), 1) - fake_scores.mean()

    @property
    def physical_batch_size(self) -> int:
        """Rows of one physical batch of the functorch step (``critic_step.physical_batch_size``, or ``B + 3√B`` of
        this process's expected share B of the Poisson batch, rounded up to a multiple of 8)."""
        if self.critic_step_options.physical_batch_size is not None:
            return int(self.critic_step_options.physical_batch_size)
        world = self.trainer.world_size if self._trainer is not None else 1
        return physical_batch_size_for(self.expected_batch_size / world)

    def critic_gradient_step(self):
        """:func:`critic_gradient_function` for this critic, compiled as ``critic_step.compile`` says
        (built on first use; falls back to eager, with a one-line warning, where compilation fails)."""
        if self._critic_step_fn is None:
            hp = self.hparams
            critic = self.discriminator._module
            mode, method = self.critic_step_options.compile, self.critic_step_options.per_sample_method
            if mode == "auto":
                mode = "none" if self.device.type != "cuda" or method == "bookkeeping" else "reduce-overhead"
            if method == "bookkeeping" and mode != "none":
                raise ValueError("critic_step.per_sample_method 'bookkeeping' runs eagerly: set critic_step.compile to 'none' (or 'auto' on a CPU)")
            if method == "bookkeeping" and not bookkeeping_supports(critic):
                raise ValueError(f"critic_step.per_sample_method 'bookkeeping' handles critics of Linear and Conv2d layers only, "
                                 f"not this {type(critic).__name__}: use 'vmap' or 'auto'")
            if method == "auto":
                method = "bookkeeping" if mode == "none" and bookkeeping_supports(critic) else "vmap"
            build = critic_bookkeeping_function if method == "bookkeeping" else critic_gradient_function
            eager = build(critic, loss=self.training_options.loss, max_grad_norm=float(hp.max_grad_norm), fake_count=self.fake_batch_size)
            if mode == "none" and method == "vmap":  # eager: wide convolutions' per-sample gradients as matmuls (dynamo cannot trace them)
                use_patch_grad_convs(critic)
            self.per_sample_method_used = method
            self._critic_step_compiled = mode != "none"
            self._critic_step_fn = eager if mode == "none" else compiled_or_eager(eager, mode)
        return self._critic_step_fn

    def functorch_discriminator_step(self, real_x: torch.Tensor, real_y: torch.Tensor,
                                     fakes: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """:meth:`discriminator_step` with ``dp_sgd_impl: functorch``: the same mechanism as the opacus path
        (Abadi et al. 2016, Alg. 1 on the real rows; the clipped fake term added without noise):

        the Poisson batch (every drawn record) is cut into :attr:`physical_batch_size` rows, the last
        padded with masked rows (:func:`~lightning_gpate.privacy.dpsgd.padded_batches`); the first
        physical batch and the fakes go through :meth:`critic_gradient_step` (one fixed shape: compiled
        once), any further one (a Poisson batch above B + 3√B) through the same function without
        fakes; then N(0, σ²C²I) from the DP optimizer's secret generator is added once to the clipped
        sum (under DDP on rank 0, then the sum is all-reduced:
        :func:`~lightning_gpate.privacy.distributed.sum_with_noise_once`), the sum divided by the
        expected batch B, the fake term added, and the wrapped optimizer steps. Opacus' RDP accountant
        is told of the step, as its optimizer hook is on the opacus path (the cross-check)."""
        from opacus.optimizers.optimizer import _generate_noise

        from lightning_gpate.privacy.distributed import sum_with_noise_once

        dp_opt = self.optimizers()[1].optimizer
        fakes, labels = fakes if fakes is not None else self.public_fakes()
        critic = self.discriminator._module
        params = [(k, p) for k, p in critic.named_parameters() if p.requires_grad]
        named = {k: p.detach() for k, p in params}
        buffers = {k: b.detach() for k, b in critic.named_buffers()}
        step = self.critic_gradient_step()
        n = len(real_y)
        fixed = self.critic_step_options.physical_batch_size is not None or self._critic_step_compiled
        chunks = padded_batches(real_x.to(fakes.dtype), real_y.to(labels.dtype), self.physical_batch_size if fixed else max(n, 1))
        real_sum, fake_term, real_scores, fake_scores = step(named, buffers, *chunks[0], fakes, labels)
        # a CUDA graph's outputs are overwritten by its next replay and are not written in place: own them
        estimate = (real_scores * chunks[0][2]).sum(), fake_scores.mean()
        real_sum, fake_term = real_sum.clone(), (fake_term.clone() if len(chunks) > 1 else fake_term)
        for x, y, mask in chunks[1:]:
            more, _, scores, _ = step(named, buffers, x, y, mask, fakes[:0], labels[:0])
            real_sum += more
            estimate = estimate[0] + (scores * mask).sum(), estimate[1]

        def add_noise() -> None:  # one draw from the secret generator, the std of opacus' DPOptimizer
            real_sum.add_(_generate_noise(std=dp_opt.noise_multiplier * dp_opt.max_grad_norm, reference=real_sum,
                                          generator=dp_opt.generator, secure_mode=dp_opt.secure_mode))

        sum_with_noise_once([real_sum], add_noise)
        grad = torch.add(fake_term, real_sum, alpha=1.0 / dp_opt.expected_batch_size)
        offset = 0
        for _, p in params:
            p.grad = grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        dp_opt.original_optimizer.step()  # uncounted: Lightning counts generator steps
        self.opacus_accountant.step(noise_multiplier=dp_opt.noise_multiplier, sample_rate=self.sampling_rate)
        c = self.training_options.weight_clip
        if c is not None:
            with torch.no_grad():
                for p in self.discriminator.parameters():
                    p.clamp_(-c, c)
        return estimate[0] / max(n, 1) - estimate[1]

    def generator_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One generator step through the (DP) critic, then the weight average. Returns the generator's
        loss and the fraction of its fakes the critic scores as fake (``D < 0``; Bie et al.'s signal
        for n_D): both functions of the critic and public fakes only, post-processing."""
        opt_g = self.optimizers()[0]
        m, gen = self.fake_batch_size, self.public_generator
        labels = self.sample_labels(m, generator=gen)
        fake = self.generator(self.latent(m, generator=gen), labels)
        self.discriminator.disable_hooks()  # no per-sample gradients (nor their memory) here
        try:
            with frozen(self.discriminator):
                scores = self.discriminator(fake, labels)
                g_loss = self.generator_loss(scores)
                # the warm start's release keeps its pull (post-processing; 0 without one)
                pulled = g_loss + self.warm_start_pull(self.public_generator)
                opt_g.zero_grad()
                self.manual_backward(pulled)
        finally:
            self.discriminator.enable_hooks()
        opt_g.step()
        if self.generator_options.averaged:
            self.update_generator_average(self.generator_options.ema_decay)
        return g_loss.detach(), (scores.detach() < 0).float().mean()

    def training_step(self, batch, batch_idx):
        """``batch``: n_D Poisson batches ``(x, y)``, one per critic step, all paid for before the first is
        applied; then one generator step. (n_D is the number of batches the DataModule served, a public
        count: after an adaptive change, the count of the next item it serves, or of the one after where
        the loader fetched ahead.)"""
        if not self.ensure_warm_started(generator=self.public_generator):
            return None  # the budget refused the warm start's release (NoPrivateStepError on the first step)
        if not self.pay_for_generator_step(len(batch)):
            return None  # budget reached: none of these critic steps, nor the generator step, is applied
        # the fakes of every critic step at once (the generator does not change in between): one forward
        m = self.fake_batch_size
        fakes, labels = self.public_fakes(m * len(batch))
        estimates = [self.discriminator_step(real_x, real_y, (fakes[k * m:(k + 1) * m], labels[k * m:(k + 1) * m]))
                     for k, (real_x, real_y) in enumerate(batch)]
        self.critic_steps_taken += len(batch)
        if int(self.generator_steps_paid) <= self.hparams.get("critic_warmup_steps", 0):
            # the critic's warm-up: its steps (paid like any other) before the first generator update, so that the
            # generator's first steps follow a critic that already tells fakes from records (Lightning counts no step)
            self.log("critic_warmup", float(self.generator_steps_paid))
            return None
        g_loss, fake_detected = self.generator_step()
        metrics = {"g_loss": g_loss}  # through the DP critic: post-processing
        if self.training_options.loss == "nonsaturating":
            metrics["critic_fake_accuracy"] = fake_detected
        if self.hparams.adaptive_d_steps is not None:
            self.adapt_d_steps(float(fake_detected))
            # the critic steps this step paid for, and the n_D the next step will serve (its sum over a run
            # is the steps charged; the next is the schedule)
            metrics.update(d_steps=float(len(batch)), d_steps_next=float(self.d_steps_now))
        self.log_dict(metrics)
        if private_diagnostics_allowed(self):  # under DDP: the estimate on rank 0's rows, the size of the whole batch
            size = torch.tensor(float(sum(len(y) for _, y in batch)) / len(batch), device=self.device)
            if self.trainer.world_size > 1:
                size = self.all_gather(size).sum()
            self.log_private({"wasserstein_estimate": torch.stack(estimates).mean(), "real_batch_size": size})

    def adapt_d_steps(self, fake_accuracy: float) -> None:
        """Bie et al.'s adaptive n_D after a generator step whose fresh fakes the critic scored as fake with
        ``fake_accuracy``: average it; once ``grace`` generator steps have passed at this n_D and the
        average is at most ``threshold``, move n_D up the ladder and ask the DataModule for that many
        batches per step. Reads only the DP critic's scores of public fakes (the same on every process)."""
        options = self.hparams.adaptive_d_steps
        average = float(self.fake_accuracy_average)
        decay = float(options["decay"])
        self.fake_accuracy_average.fill_(fake_accuracy if math.isnan(average) else decay * average + (1 - decay) * fake_accuracy)
        self.generator_steps_at_d_steps += 1
        now = int(self.d_steps_now)
        if (int(self.generator_steps_at_d_steps) >= options["grace"] and float(self.fake_accuracy_average) <= options["threshold"]
                and now < D_STEPS_LADDER[-1]):
            self.d_steps_now.fill_(D_STEPS_LADDER[D_STEPS_LADDER.index(now) + 1])
            self.generator_steps_at_d_steps.zero_()
            self._serve_d_steps()

    def _serve_d_steps(self) -> None:
        """Have the training data serve the current n_D Poisson batches per step (from its next item)."""
        dataset = getattr(self.trainer.train_dataloader, "dataset", None) if self._trainer is not None else None
        if dataset is not None and hasattr(dataset, "batches"):
            dataset.batches = int(self.d_steps_now)

    def on_train_epoch_end(self) -> None:
        self.log("epsilon_opacus_worst_case", self.opacus_epsilon(), rank_zero_only=True)

    def opacus_epsilon(self) -> float:
        """ε by opacus' RDP analysis, on this model's order grid, of the most critic steps the generator steps
        paid could have taken (:meth:`critic_steps_worst_case`; with a fixed n_D, those taken) and of the warm start's
        release once made (:func:`opacus_history`): a cross-check, outside this project's accountant, of the
        guarantee's worst-case curve — a bound itself, not capped by the budget, the DP metadata aside. The ε of the
        critic steps *taken* is no bound under an adaptive n_D; opacus' own hook still counts those
        (``opacus_accountant.history``: that the DP optimizer stepped as charged)."""
        from opacus.accountants import RDPAccountant

        steps = self.critic_steps_worst_case()
        release = self.warm_release
        made = release.events() if release is not None and bool(release.measured) else []
        if steps == 0 and not made:
            return 0.0
        worst = RDPAccountant()
        critic = [(float(self.hparams.noise_multiplier), float(self.sampling_rate), int(steps))] if steps else []
        worst.history = critic + opacus_history(made)
        return float(worst.get_epsilon(self.delta, alphas=[float(a) for a in self.accountant.orders]))

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[OPACUS_ACCOUNTANT_KEY] = self.opacus_accountant.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also refuse a resume that asks for another σ, q, accountant or n_D schedule
        (:data:`MECHANISM_HPARAMS`): the PLD bound and the worst case count the run's critic steps as one
        mechanism under one schedule."""
        refuse_changed_on_resume("the checkpoint", checkpoint.get("hyper_parameters") or {}, self.hparams, MECHANISM_HPARAMS)
        super().on_load_checkpoint(checkpoint)
        if checkpoint.get(OPACUS_ACCOUNTANT_KEY, {}).get("history"):
            self.opacus_accountant.load_state_dict(checkpoint[OPACUS_ACCOUNTANT_KEY])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """A checkpoint written before ``generator_steps_paid`` existed: count its generator steps as its
        critic steps over ``d_steps`` (fixed n_D: exact), or as its critic steps (adaptive n_D: each generator
        step took at least one, so the later steps' worst case is not understated).

        With an adaptive n_D such a checkpoint's worst-case RDP curve holds only the critic steps taken (each
        step was recorded as its own worst case): it is topped up to the most critic steps the schedule
        allowed that many generator steps (:meth:`most_critic_steps_in`), so that the guarantee of a resume
        counts the past steps' worst case as a fresh run's does (the fourth privacy review's S1: 9 generator
        steps resumed to 11 reported ε 3.080 where the 126 critic steps the schedule allowed cost 3.572)."""
        key, taken = prefix + "generator_steps_paid", state_dict.get(prefix + "critic_steps_taken")
        before_worst_case = key not in state_dict and taken is not None
        if before_worst_case:
            per_step = 1 if self.hparams.adaptive_d_steps is not None else int(self.hparams.d_steps)
            state_dict[key] = torch.div(taken, per_step, rounding_mode="floor")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # restores the accountant (extra state)
        if before_worst_case and self.hparams.adaptive_d_steps is not None:
            missing = self.most_critic_steps_in(int(state_dict[key])) - int(taken)
            if missing > 0:
                self.accountant.record_worst_case_only(self.generator_step_event(missing))
