"""GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020), for images and — as in the cardio thesis — tables.

N_D discriminators, each trained only on its own disjoint subset of the data (the DataModule's fixed
teacher partition, ``num_teachers = N_D``); one generator that learns only through a *sanitised*
gradient. Two stages, each its own resumable, logged ``lightning-gpate fit``:

1. ``stage: pretrain`` — every discriminator is pretrained without privacy on its subset against
   its own throwaway generator (2000 iterations in the paper). A throwaway generator shared between
   discriminators would carry one subset's information into another's discriminator, breaking the
   disjointness the analysis relies on, so each has its own. All of them train at once: the
   discriminators as one stacked-parameter ensemble run by G-PATE's teacher kernels
   (:mod:`lightning_gpate.nets.ensemble`: grouped convolutions, the label maps folded into one
   lookup; 1.45× faster than ``torch.func.vmap`` over the same networks on a CPU), the throwaway
   generators as stacked modules under ``vmap``; one Adam over the stacked tensors gives every member
   its own moments. This stage has no release: its output is its private training
   checkpoint (``private/<experiment>/<run>/last.ckpt``, never logged to MLflow), which holds
   non-private models (only the generator of stage 2 is a DP release).
2. ``stage: train`` (``pretrained_checkpoint`` from stage 1) — each generator step draws one
   discriminator uniformly (the DataModule's one-teacher sampling, with its real batches), runs
   ``training.critic_steps`` WGAN-GP steps on it (λ_GP = 10 plus 0.001·mean D(real)², Adam lr 1e-4,
   β = (0.5, 0.9), each discriminator with its own Adam state), then updates the generator through
   it with the gradient from the discriminator into each generated sample clipped to C and noised
   with N(0, (2Cσ)²) (:class:`~lightning_gpate.privacy.sanitizer.GradientSanitizer`); nothing else
   is perturbed. Every generator step is charged as a
   :class:`~lightning_gpate.privacy.GSWGANStepEvent` before it is applied. Under
   ``discriminator_state: reset`` its checkpoint holds the generator and its state only (the
   discriminators are the pretrained checkpoint's, reloaded from it on a resume): a few MB, so a long
   run can be split over calls.

Accounting (see :mod:`lightning_gpate.privacy.gswgan`): ``budget_accounting: guarantee`` (default)
is the sound analysis — one subsampled Gaussian of noise multiplier σ/√B and rate 1/N_D per step;
``budget_accounting: paper`` is the official per-sample composition (T·B subsampled Gaussians of
noise σ), which reproduces published numbers but is NOT a guarantee (the run is tagged so).

Why a drawn discriminator starts afresh (``discriminator_state: reset``, the default). The analysis
composes, step after step, a mechanism that draws one of N_D discriminators with fresh secret
randomness and releases a noisy function of *its data* (and of the public generator). In the official
code a discriminator instead continues from where its last draw left it: its state then records when
it was drawn before — and since one is drawn per step, also when the others were. That history is the
secret the amplification by subsampling rests on, and a released gradient may carry it: a
discriminator that (in the extreme) announced how often it had been trained would tell which steps
used another one, and those steps would be charged as if there were no subsampling. No composition
theorem covers such hidden state, so under the guarantee every draw starts the discriminator from its
state at the start of training (its pretrained weights: a function of its own subset) with a fresh
Adam state, and takes its ``training.critic_steps`` against the current generator: each step is then exactly
the subsampled mechanism the analysis composes. ``discriminator_state: kept`` (the official code) is
available under ``budget_accounting: paper`` only.

Several processes (Lightning DDP). Pretraining is embarrassingly parallel: rank r of W holds and
pretrains discriminators r, r+W, … (and their throwaway generators) on their own subsets; the random
draws are made for all N_D members on every rank and each rank keeps its members' rows, so a member
trains exactly as on one process, and the checkpoint gathers every member in order. In the private
stage every rank draws the same discriminator k (the choice comes from one secret seed drawn on rank 0
and broadcast; it is never logged), the rank holding k (k mod W) trains it and computes the sanitised
gradient into the generated samples, with noise from its own OS-seeded generator, and broadcasts it:
neither the raw gradient nor the noise leaves that rank. Every rank draws the same latents and applies
the same sanitised gradient to its replica of the generator. Every rank holds the pretrained stack
(read, never changed, under ``discriminator_state: reset``; ``kept`` is one process only) and the whole
training split, so the ranks are one trusted curator (docs/multi-gpu.md). Only pretraining is faster: a
private step uses one discriminator, on one process.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from lightning_gpate.models.dpgan import buffers_restored, build_mlp_generator, frozen
from lightning_gpate.models.options import DiscriminatorNet, GeneratorNet, OptionGroup, positive_widths, flat_options, positive_int
from lightning_gpate.models.private import DEFAULT_DELTA, PrivateGenerativeModel, smallest_noise_that_fits
from lightning_gpate.models.warm_start import WarmStart, WarmStartMixin
from lightning_gpate.models.sharding import (gather_members, local_backward, owned_members, rank_and_world,
                                              replicated_backward, select_members, shared_seed)
from lightning_gpate.privacy.distributed import is_distributed
from lightning_gpate.nets.ensemble import ConvTeacherEnsemble, MLPTeacherEnsemble, TeacherEnsemble
from lightning_gpate.privacy import GSWGANStepEvent
from lightning_gpate.privacy.randomness import derived_seed, mechanism_generator
from lightning_gpate.privacy.sanitizer import GradientSanitizer
from lightning_gpate.release import RELEASE_KEY

STAGES = ("pretrain", "train")
DISCRIMINATOR_STATES = ("reset", "kept")


@dataclass(frozen=True, kw_only=True)
class WGANTraining(OptionGroup):
    """How GS-WGAN's networks are trained (Chen et al. 2020: WGAN-GP, Gulrajani et al. 2017).

    Args:
        lr: Adam's learning rate of every network (the paper's 1e-4).
        betas: Adam's betas (the paper's (0.5, 0.9)).
        generator_lr: the generator's own Adam learning rate (null: lr, the paper). Under the sound analysis every
            step carries a noise of std 2Cσ per sample coordinate: a larger rate and momentum (e.g. 1e-3,
            (0.9, 0.999)) average it over steps.
        generator_betas: the generator's own Adam betas (null: betas, the paper).
        critic_steps: critic steps per generator step (the paper's 5).
        gp_weight: λ of the gradient penalty (the paper's 10).
        drift_weight: weight of mean D(real)² (the paper's 0.001).
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.5, 0.9)
    generator_lr: float | None = None
    generator_betas: tuple[float, float] | None = None
    critic_steps: int = 5
    gp_weight: float = 10.0
    drift_weight: float = 1e-3

    def __post_init__(self) -> None:
        positive_int("training.critic_steps", self.critic_steps)
        for name, value in (("lr", self.lr), ("generator_lr", self.generator_lr)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"training.{name} must be a finite number > 0, got {value}")
        for name, value in (("betas", self.betas), ("generator_betas", self.generator_betas)):
            if value is not None and (len(value) != 2 or not all(0 <= b < 1 for b in value)):
                raise ValueError(f"training.{name} must be two numbers in [0, 1), got {value}")
        if not (self.gp_weight >= 0 and self.drift_weight >= 0):
            raise ValueError(f"training.gp_weight and drift_weight must be >= 0, got {self.gp_weight}, {self.drift_weight}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.generator_betas is not None:
            object.__setattr__(self, "generator_betas", tuple(float(b) for b in self.generator_betas))


@dataclass(frozen=True, kw_only=True)
class Pretraining(OptionGroup):
    """Stage ``pretrain`` (non-private: its discriminators are only ever used through the sanitiser of stage
    ``train``, which loads them from ``pretrained_checkpoint``).

    Args:
        iterations: iterations of stage pretrain (the paper's 2,000); trainer.max_steps may stop it earlier. Each is
            training.critic_steps steps of every discriminator and one step of every throwaway generator; resume with
            ckpt_path.
        generator_hidden: hidden widths of small MLP throwaway generators (null: the main generator's network). N_D
            copies of it are held at once.
    """

    iterations: int = 2000
    generator_hidden: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        positive_int("pretraining.iterations", self.iterations)
        object.__setattr__(self, "generator_hidden", positive_widths("pretraining.generator_hidden", self.generator_hidden))

GSWGAN_CHECKPOINT_KEY = "gswgan"
#: The GS-WGAN paper's settings where the defaults differ (Chen et al. 2020 and its official code): ``GSWGAN(spec,
#: **PAPER_SETTINGS, ...)`` or ``configs/mnist/gswgan_eps10_paper.yaml``. Its σ = 1.07 is ε ≈ 9.24 after 20,000 steps
#: only under the per-sample composition (``budget_accounting: paper``, not a guarantee); under the guarantee at
#: N_D = 1,000 the first 100 steps already cost ε ≈ 1,500.
PAPER_SETTINGS = {"noise_multiplier": 1.07, "ema_decay": None}
#: The generator and the discriminators (``generator``'s and ``discriminator``'s docs).
DEFAULT_GENERATOR = GeneratorNet(z_dim=100, latent_prior="normal", gf_dim=64, fc_dim=256, upsample="transposed", hidden=(256, 256),
                                 ema_decay=0.99)
DEFAULT_DISCRIMINATOR = DiscriminatorNet(df_dim=32, fc_dim=256, hidden=(128,))


# ============================================================================ stacked members
def _key(name: str) -> str:
    return name.replace(".", "__")


class StackedModules(nn.Module):
    """``N`` networks of one architecture with stacked parameters and buffers (leading member axis),
    run together with ``torch.func.vmap`` over ``functional_call``.

    Stacking keeps thousands of small networks as a few large tensors (one optimizer over them keeps
    separate Adam moments per member, Adam being elementwise); :meth:`load_member` and
    :meth:`store_member` move one member into and out of a plain module.

    Args:
        modules: the members (their current values are copied; all must share one architecture).
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        if not modules:
            raise ValueError("StackedModules needs at least one module")
        params, buffers = stack_module_state(list(modules))
        self.param_names, self.buffer_names = list(params), list(buffers)
        for name, value in params.items():
            self.register_parameter(_key(name), nn.Parameter(value.detach().clone()))
        for name, value in buffers.items():
            self.register_buffer(_key(name), value.clone())
        self._template = [copy.deepcopy(modules[0]).to("meta")]  # in a list: not a submodule
        self.num_members = len(modules)

    def __len__(self) -> int:
        return self.num_members

    def _stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return ({n: getattr(self, _key(n)) for n in self.param_names},
                {n: getattr(self, _key(n)) for n in self.buffer_names})

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Member i runs on ``inputs[...][i]``: every input has the member axis first."""
        template = self._template[0]
        params, buffers = self._stacked()

        def one(p, b, *args):
            return functional_call(template, (p, b), args)

        return vmap(one)(params, buffers, *inputs)

    @torch.no_grad()
    def load_member(self, k: int, module: nn.Module) -> None:
        """Copy member ``k`` into ``module`` (same architecture)."""
        state = module.state_dict(keep_vars=True)
        for name in self.param_names + self.buffer_names:
            state[name].copy_(getattr(self, _key(name))[k])

    @torch.no_grad()
    def store_member(self, k: int, module: nn.Module) -> None:
        """Copy ``module`` into member ``k``."""
        state = module.state_dict(keep_vars=True)
        for name in self.param_names + self.buffer_names:
            getattr(self, _key(name))[k].copy_(state[name])

    def select(self, members: Sequence[int]) -> "StackedModules":
        """A new stack holding copies of ``members`` (positions in this one), in that order."""
        index = torch.as_tensor(list(members), dtype=torch.long)
        new = copy.copy(self)  # shares the template; its parameter and buffer dicts are replaced below
        new._parameters, new._buffers, new._modules = {}, {}, {}
        for name in self.param_names:
            new.register_parameter(_key(name), nn.Parameter(getattr(self, _key(name)).detach()[index].clone()))
        for name in self.buffer_names:
            new.register_buffer(_key(name), getattr(self, _key(name))[index].clone())
        new.num_members = len(index)
        return new


class StackedAdamState(nn.Module):
    """Per-member Adam state (moments and step count) of ``num_members`` networks shaped like
    ``template``, so that the one member trained at a time continues from its own optimizer state
    (official GS-WGAN: one Adam per discriminator). The tensors are buffers: they live in checkpoints."""

    def __init__(self, template: nn.Module, num_members: int) -> None:
        super().__init__()
        self.param_names = [name for name, _ in template.named_parameters()]
        for name, p in template.named_parameters():
            self.register_buffer("exp_avg__" + _key(name), p.new_zeros(num_members, *p.shape))
            self.register_buffer("exp_avg_sq__" + _key(name), p.new_zeros(num_members, *p.shape))
        self.register_buffer("steps", torch.zeros(num_members, dtype=torch.long))

    def _pairs(self, module: nn.Module):
        params = dict(module.named_parameters())
        return [(params[n], getattr(self, "exp_avg__" + _key(n)), getattr(self, "exp_avg_sq__" + _key(n))) for n in self.param_names]

    @torch.no_grad()
    def load_member(self, k: int, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Give ``optimizer`` (an Adam over ``module``) member ``k``'s state."""
        step = int(self.steps[k])
        for p, m, v in self._pairs(module):
            optimizer.state[p] = {} if step == 0 else {
                "step": torch.tensor(float(step)), "exp_avg": m[k].clone(), "exp_avg_sq": v[k].clone(),
            }

    @torch.no_grad()
    def store_member(self, k: int, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Save ``optimizer``'s state as member ``k``'s."""
        step = 0
        for p, m, v in self._pairs(module):
            state = optimizer.state.get(p)
            if state:
                m[k].copy_(state["exp_avg"])
                v[k].copy_(state["exp_avg_sq"])
                step = int(state["step"])
        self.steps[k] = step


# ============================================================================ WGAN-GP
def wgan_gp_critic_loss(
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    real_x: torch.Tensor,
    real_y: torch.Tensor,
    fake_x: torch.Tensor,
    *,
    gp_weight: float = 10.0,
    drift_weight: float = 1e-3,
    eps: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """WGAN-GP critic loss (Gulrajani et al. 2017, Alg. 1) with GS-WGAN's drift term:
    ``mean D(fake) − mean D(real) + λ·mean(‖∇D(x̂)‖ − 1)² + drift·mean D(real)²``, where x̂ lies on
    the segment between a real and a fake sample (both labelled ``real_y``).

    ``real_y`` may have leading member axes (``[N, b]`` for :class:`StackedModules`, ``[b]`` for one
    critic); the loss is the *sum* over members of each member's own loss, so every member gets
    exactly the gradient it would get alone. ``eps`` (shaped ``[*real_y.shape, 1, …]``): the
    interpolation weights, else drawn uniformly (from ``generator``, default torch's global one).
    """
    lead = real_y.dim()
    trailing = (1,) * (real_x.dim() - lead)
    if eps is None:
        eps = torch.rand(*real_y.shape, *trailing, device=real_x.device, dtype=real_x.dtype, generator=generator)
    mixed = (eps * real_x + (1 - eps) * fake_x).detach().requires_grad_(True)
    d_real, d_fake, d_mixed = critic(real_x, real_y), critic(fake_x, real_y), critic(mixed, real_y)
    (grad,) = torch.autograd.grad(d_mixed.sum(), mixed, create_graph=True)
    penalty = (grad.flatten(lead).norm(dim=-1) - 1).pow(2)
    loss = d_fake.mean(-1) - d_real.mean(-1) + gp_weight * penalty.mean(-1) + drift_weight * d_real.pow(2).mean(-1)
    return loss.sum()


# ============================================================================ model
class GSWGAN(WarmStartMixin, PrivateGenerativeModel):
    """GS-WGAN: a generator trained through N_D disjointly trained discriminators with a sanitised gradient (Chen et
    al. 2020, Algorithm 1); conditional, images (DCGAN nets) or tables (MLP nets).

    The defaults plan σ from the budget (the paper's σ is no guarantee) and sample a weight average; the
    paper's settings are :data:`PAPER_SETTINGS`.

    N_D is the DataModule's ``num_teachers`` (its fixed disjoint partition gives each discriminator
    its subset). Run ``stage: pretrain`` first, then ``stage: train`` with its checkpoint.

    Args:
        data_spec: the DataModule's spec.
        epsilon: the privacy budget ε; training stops before a generator step would exceed it.
        delta: δ of the (ε, δ) guarantee.
        noise_multiplier: σ of the sanitiser, noise std 2Cσ per sample (null: planned for planned_steps). null: the
            smallest σ for which planned_steps generator steps fit the budget under budget_accounting (a public
            function of ε, δ, N_D and B; stored resolved). The paper's 1.07 (PAPER_SETTINGS) is no guarantee.
        planned_steps: generator steps σ is planned for when noise_multiplier is null. The budget then stops training
            after them; 1,000 on the 8×8 digits with 20 discriminators is σ ≈ 10 at ε = 10.
        clip_bound: C, the per-sample L2 bound of the gradient from the discriminator into a sample.
        generator_batch_size: B, generated samples per generator step (enters ε: σ/√B in the sound analysis).
        stage: "pretrain" (non-private discriminator pretraining) or "train".
        pretrained_checkpoint: stage train: the private training checkpoint of a pretrain run on the same data. Its
            partition must be the same; without one the discriminators start untrained, with a warning.
        budget_accounting: "guarantee" (the sound GS-WGAN analysis) or "paper" (not a guarantee). "paper" is the
            per-sample composition of the official code.
        conversion: RDP to (ε, δ) conversion.
        training: how the networks are trained (the paper's WGAN-GP settings). Adam 1e-4, (0.5, 0.9) for every
            network, 5 critic steps a generator step, the gradient penalty 10 and drift 0.001.
        generator: the generator network (a mapping of its options overrides some). z 100 from N(0, I); tables an MLP
            of (256, 256) (ReLU, BatchNorm, tanh/softmax outputs); images a DCGAN of gf_dim 64 and fc_dim 256 with
            upsample: transposed (nearest: ×2 then a convolution, as the official code's ResNet generator upsamples
            and as G-PATE's and PATE-GAN's MNIST rows chose; not the default: on the 8×8 digits, ε = 10, both at
            chance, FID 341 against transposed's 204, one run each); ema_decay 0.99 (the CPU configs'): an
            exponential moving average of the generator (after the official code's warm-up: min(1 − 1/t, ema_decay)
            at generator step t) samples (post-processing: free); null or 0: the generator itself, the paper.
        discriminator: the discriminators' network (a mapping of its options overrides some). Tables an MLP of (128,)
            (LeakyReLU 0.2, no normalisation: the gradient penalty is per sample); images a DCGAN discriminator of
            df_dim 32 and fc_dim 256 (no normalisation).
        pretraining: stage pretrain's length and throwaway generators. The paper's 2,000 iterations, the main
            generator's network.
        discriminator_state: "reset" (default) or "kept" (the official code; budget_accounting: paper only). "reset":
            every draw starts the discriminator from its state at the start of training, with a fresh Adam state
            (see the module docstring); "kept": it continues from its last draw.
        log_private_diagnostics: also log unnoised values of the private data under private/*; debugging only. The
            discriminator drawn (the secret GS-WGAN's subsampling rests on), the critic and generator losses through
            non-private discriminators, pretraining losses.
        warm_start: a private warm start of the private stage (a mapping of its options; default: none). A share of
            ε buys DP-MERF's one release before the first sanitised step, the generator trains on it
            (post-processing) and may keep its pull; σ is planned for what the budget leaves. Ignored by stage:
            pretrain (nothing private is released there). Its options: --model.warm_start.help.
        secure_mode: draw the sanitiser's noise as opacus' secure_mode does (robust to floating-point attacks, 4×
            the draws).
        noise_seed: seed of the sanitiser's noise and of the discriminators drawn, for tests only (null: secret, from
            the OS). The seed also draws each discriminator's real batches; it never comes from seed_everything, and a
            fixed seed lets anyone who knows it replay them.
    """

    #: Options whose ``None`` the constructor resolves (σ, planned from the budget) and stores resolved
    #: (:meth:`store_resolved_hparams`).
    RESOLVED_HPARAMS = ("noise_multiplier",)
    FLAT_OPTIONS = {**flat_options("discriminator"),
                    **{name: (f"training.{name}",) for name in ("lr", "betas", "generator_lr", "generator_betas", "critic_steps",
                                                               "gp_weight", "drift_weight")},
                    "pretrain_iterations": ("pretraining.iterations",), "pretrain_generator_hidden": ("pretraining.generator_hidden",)}

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float = DEFAULT_DELTA,
        noise_multiplier: float | None = None,
        planned_steps: int = 1000,
        clip_bound: float = 1.0,
        generator_batch_size: int = 32,
        stage: str = "train",
        pretrained_checkpoint: str | None = None,
        pretraining: Pretraining = Pretraining(),
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        training: WGANTraining = WGANTraining(),
        generator: GeneratorNet = DEFAULT_GENERATOR,
        discriminator: DiscriminatorNet = DEFAULT_DISCRIMINATOR,
        warm_start: WarmStart | None = None,
        discriminator_state: str = "reset",
        log_private_diagnostics: bool = False,
        secure_mode: bool = False,
        noise_seed: int | None = None,
    ) -> None:
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        discriminator_options = DiscriminatorNet.of(discriminator, DEFAULT_DISCRIMINATOR, name="discriminator")
        training_options = WGANTraining.of(training, WGANTraining(), name="training")
        pretraining_options = Pretraining.of(pretraining, Pretraining(), name="pretraining")
        super().__init__(data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
                         conversion=conversion, z_dim=net_options.z_dim, latent_prior=net_options.latent_prior,
                         log_private_diagnostics=log_private_diagnostics)
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        num_discriminators = int(data_spec.get("num_teachers", 0))
        if num_discriminators < 1:
            raise ValueError("GS-WGAN needs data.num_teachers = N_D >= 1: each discriminator trains on its own teacher partition")
        if int(planned_steps) != planned_steps or planned_steps < 1:
            raise ValueError(f"planned_steps must be an integer >= 1, got {planned_steps}")
        if generator_batch_size < 2:
            raise ValueError(f"generator_batch_size must be >= 2 (BatchNorm in the generator), got {generator_batch_size}")
        requested = {"noise_multiplier": noise_multiplier}
        if noise_multiplier is not None and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
        if not (clip_bound > 0 and math.isfinite(clip_bound)):
            raise ValueError(f"clip_bound must be a finite number > 0, got {clip_bound}")
        if discriminator_state not in DISCRIMINATOR_STATES:
            raise ValueError(f"discriminator_state must be one of {DISCRIMINATOR_STATES}, got {discriminator_state!r}")
        if discriminator_state == "kept" and budget_accounting != "paper":
            raise ValueError("discriminator_state: kept lets a discriminator's state depend on the secret history of "
                             "draws, which no analysis here covers: use it with budget_accounting: paper (not a guarantee), "
                             "or discriminator_state: reset")
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options, discriminator=discriminator_options, training=training_options,
                                 pretraining=pretraining_options)
        self.generator_options, self.discriminator_options = net_options, discriminator_options
        self.training_options, self.pretraining_options = training_options, pretraining_options
        self.init_warm_start(warm_start if stage == "train" else None)  # its share of ε, planned before σ takes the rest
        if noise_multiplier is None:  # the default: the least noise for which the planned steps fit the budget
            noise_multiplier = self.plan_noise_multiplier(num_discriminators, generator_batch_size, int(planned_steps))
        self.store_resolved_hparams(requested, noise_multiplier=noise_multiplier)
        self.automatic_optimization = False
        self.num_discriminators = num_discriminators
        self.stage = stage
        self.sanitizer = GradientSanitizer(clip_bound=clip_bound, noise_multiplier=noise_multiplier, secure_mode=secure_mode)
        self._noise_generator: torch.Generator | None = None  # OS-seeded at each start, never checkpointed
        self._noise_seed: int | None = noise_seed  # None: each process seeds its own from the OS (never shared)

        self.generator = self.build_generator(net_options)
        self.discriminators = self._new_discriminators(num_discriminators)
        if stage == "pretrain":
            self.pretrain_generators = StackedModules([self._new_pretrain_generator() for _ in range(num_discriminators)])
            self.train_sampling = None  # every discriminator's own batch each step (TeacherBatches)
        else:
            self.discriminator = self.discriminators.teacher_module()  # the member being trained, one at a time
            if discriminator_state == "kept":  # reset: every draw starts with a fresh Adam state, nothing to keep
                self.discriminator_adam = StackedAdamState(self.discriminator, num_discriminators)
            # the discriminator drawn per step (the subsampling GS-WGAN's amplification rests on) comes
            # from an OS-seeded generator in the DataModule, as does the sanitiser's noise here
            self.train_sampling = {"kind": "one_teacher", "batches": training_options.critic_steps,
                                   "mechanism_seed": derived_seed(noise_seed, "discriminator choice")}
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False) if net_options.averaged else None
            self.register_buffer("pretrained_loaded", torch.zeros((), dtype=torch.bool))
        self.register_buffer("critic_steps_taken", torch.zeros((), dtype=torch.long))

    @classmethod
    def data_checkpoint(cls, options: Mapping[str, Any]) -> str | None:
        """The private stage continues its pretraining: the same partition, so the same released DP metadata (drawn and
        charged once for both stages; a second draw would move the records between discriminators)."""
        return options.get("pretrained_checkpoint") if options.get("stage", "train") == "train" else None

    def plan_noise_multiplier(self, num_discriminators: int, batch_size: int, planned_steps: int) -> float:
        """The smallest σ (to 1% relative, rounded up: the plan always fits) for which ``planned_steps`` generator
        steps keep ε within the budget under the model's accounting: a public function of ε, δ, N_D, B and the steps
        (:func:`~lightning_gpate.models.private.smallest_noise_that_fits`: each ε of a new σ costs seconds here,
        dp-accounting's per-order loop for sampling without replacement)."""
        def spent(sigma: float) -> float:
            event = GSWGANStepEvent(noise_multiplier=sigma, num_discriminators=num_discriminators, batch_size=batch_size,
                                    steps=planned_steps)
            before = self.events_before_first_step()  # the warm start's release, paid first
            return self.accountant.epsilon_if(*before, event) if before else self.epsilon_if(event)

        return smallest_noise_that_fits(spent, self.budget_limit(), what=f"{planned_steps} generator steps",
                                        fix="plan fewer steps (planned_steps) or set noise_multiplier")

    @property
    def single_process_only(self) -> str | None:
        """Why this run must stay on one process (the command line refuses more before any starts)."""
        if self.stage == "train" and self.hparams.get("discriminator_state", "reset") == "kept":
            return "discriminator_state: kept keeps each discriminator's history of draws on the process that holds it"
        return None

    # ----------------------------------------------------------------- networks
    def _new_discriminators(self, count: int) -> TeacherEnsemble:
        """The N_D discriminators as one stacked-parameter ensemble (G-PATE's teachers' kernels): the
        conditional DCGAN discriminator without normalisation for images (conv 5×5/2 with C+Y and
        ``df_dim``+Y channels, dense ``fc_dim``, the labels concatenated to every layer), the MLP one for
        tables. Each member is initialised from its own seed, drawn here from ``seed_everything``'s stream."""
        net = self.discriminator_options
        seed = int(torch.randint(2**62, (1,)))
        if self.is_image:
            channels = self.data_spec["shape"][0] + self.num_classes, net.df_dim + self.num_classes
            return ConvTeacherEnsemble(count, in_shape=self.data_spec["shape"], num_classes=self.num_classes, channels=channels,
                                       fc=net.fc_dim, seed=seed)
        return MLPTeacherEnsemble(count, in_features=self.data_spec["shape"][0], num_classes=self.num_classes,
                                  hidden=net.hidden, seed=seed)

    def _new_pretrain_generator(self) -> nn.Module:
        hidden = self.pretraining_options.generator_hidden
        if hidden is None:  # the main generator's network
            return self.build_generator(self.generator_options)
        return build_mlp_generator(self, hidden=hidden)

    @property
    def has_release(self) -> bool:
        return self.stage != "pretrain"  # stage 1's throwaway generators are not a release

    def configure_optimizers(self):
        hp = self.training_options
        adam = lambda params: torch.optim.Adam(params, lr=hp.lr, betas=tuple(hp.betas))  # noqa: E731
        if self.stage == "pretrain":
            # Adam is elementwise: one optimizer over the stacked tensors = one Adam per member.
            return adam(self.pretrain_generators.parameters()), adam(self.discriminators.parameters())
        generator_opt = torch.optim.Adam(self.generator.parameters(), lr=hp.generator_lr if hp.generator_lr is not None else hp.lr,
                                         betas=tuple(hp.generator_betas if hp.generator_betas is not None else hp.betas))
        return generator_opt, adam(self.discriminator.parameters())

    # ----------------------------------------------------------------- fit start: checks, pretrained
    def _partition_fingerprint(self) -> str | None:
        dm = getattr(self.trainer, "datamodule", None)
        partition = getattr(dm, "partition", None)
        return partition.fingerprint() if partition is not None else None

    STACKED_PREFIXES = ("discriminators.", "pretrain_generators.")  # pretraining: the member-sharded state

    def setup(self, stage: str) -> None:
        super().setup(stage)
        _, world = rank_and_world(self)
        if self.stage == "pretrain":
            owned = owned_members(self.num_discriminators, self)
            if world > 1 and self.discriminators.num_teachers == self.num_discriminators:  # this rank's share only
                self.discriminators = self.discriminators.subset(owned)
                self.pretrain_generators = self.pretrain_generators.select(owned)
            if world > 1:  # rank-local members: DDP must neither broadcast rank 0's over them nor average them
                self._ddp_params_and_buffers_to_ignore = [
                    prefix + name for prefix in self.STACKED_PREFIXES
                    for name, _ in [*getattr(self, prefix[:-1]).named_parameters(), *getattr(self, prefix[:-1]).named_buffers()]]
            return
        if world > 1 and self.single_process_only:  # for a Trainer built without the command line
            raise ValueError(f"GSWGAN trains on one process only ({self.single_process_only}): use one device")
        # every rank draws the same discriminator: one secret seed, broadcast by rank 0. The sanitiser's
        # noise is not shared: the owner of the drawn discriminator draws it from its own OS-seeded
        # generator and the other ranks receive only the sanitised gradient (no seed to replay it from).
        self._noise_generator = None
        choice_seed = shared_seed(self, self.hparams.noise_seed)
        self.train_sampling = {**self.train_sampling, "mechanism_seed": derived_seed(choice_seed, "discriminator choice")}

    def on_fit_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if getattr(dm, "partition", None) is None or dm.partition.num_teachers != self.num_discriminators:
            raise ValueError(
                f"GS-WGAN needs a GenerativeDataModule with num_teachers = {self.num_discriminators} "
                f"(its fixed disjoint partition gives each discriminator its own subset)"
            )
        if self.stage == "train" and not bool(self.pretrained_loaded):  # not when resuming a train run
            if self.hparams.pretrained_checkpoint:
                self.load_pretrained(self.hparams.pretrained_checkpoint)
            else:
                warnings.warn("GS-WGAN trains without pretrained discriminators (set pretrained_checkpoint "
                              "to a stage: pretrain checkpoint)", stacklevel=2)

    def load_pretrained(self, path: str) -> None:
        """Load the discriminators of a ``stage: pretrain`` checkpoint made on this partition."""
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"pretrained_checkpoint not found: {path}") from err
        meta = checkpoint.get(GSWGAN_CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
        if isinstance(checkpoint, dict) and RELEASE_KEY in checkpoint:
            raise ValueError(
                f"{path} is a release artifact: it holds a generator, not the pretrained discriminators. Pass the "
                f"private training checkpoint of the stage: pretrain run (printed at its end; MLflow tag training_checkpoint)"
            )
        if not meta or meta.get("stage") != "pretrain":
            raise ValueError(f"{path} is not a GS-WGAN stage: pretrain checkpoint")
        if meta["num_discriminators"] != self.num_discriminators:
            raise ValueError(f"{path} holds {meta['num_discriminators']} discriminators, this model {self.num_discriminators}")
        released = (checkpoint.get("hyper_parameters") or {}).get("data_spec") or {}
        if released.get("metadata_cost") and any(released.get(k) != self.data_spec.get(k) for k in ("metadata_cost", "columns", "class_ratio")):
            raise ValueError(
                f"{path} was pretrained with DP metadata (bounds, quantile bins, class ratio) that this fit's DataModule drew "
                f"again: both stages must use the one release. lightning-gpate fit builds the DataModule with the "
                f"pretraining's; in Python, call datamodule.adopt_released_spec(the checkpoint's hyper_parameters['data_spec']) "
                f"before building the model from datamodule.spec"
            )
        if meta["partition_fingerprint"] != self._partition_fingerprint():
            raise ValueError(
                f"{path} was pretrained on a different data partition: each discriminator must keep the "
                f"subset it was pretrained on (same data, num_teachers and partition_seed)"
            )
        prefix = "discriminators."
        state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
        try:
            self.discriminators.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(f"the discriminators of {path} do not match this model's architecture: {err}") from err
        self.pretrained_loaded.fill_(True)

    # ----------------------------------------------------------------- steps
    def privacy_event(self) -> GSWGANStepEvent:
        hp = self.hparams
        return GSWGANStepEvent(noise_multiplier=hp.noise_multiplier, num_discriminators=self.num_discriminators, batch_size=hp.generator_batch_size, steps=1)

    def _critic_loss(self, critic, real_x, real_y, fake_x, **random) -> torch.Tensor:
        hp = self.training_options
        return wgan_gp_critic_loss(critic, real_x, real_y, fake_x, gp_weight=hp.gp_weight, drift_weight=hp.drift_weight, **random)

    def training_step(self, batch, batch_idx):
        if self.stage == "pretrain":
            return self._pretrain_step(*batch)
        return self._train_step(*batch)

    def _pretrain_step(self, real_x: torch.Tensor, real_y: torch.Tensor) -> None:
        """One critic step of every discriminator on its own batch; every ``training.critic_steps``-th call
        also one step of every throwaway generator (the step Lightning counts)."""
        if self.trainer.global_step >= self.pretraining_options.iterations:  # resumed after the end
            self.trainer.should_stop = True
            return
        n_d, b = real_y.shape[:2]
        if n_d != self.discriminators.num_teachers:
            raise ValueError(f"expected batches for {self.discriminators.num_teachers} discriminators, got {n_d}")
        # Random draws for all N_D members on every rank, each rank keeping its members' rows (all of
        # them on one process): a member trains exactly as it would on one process.
        owned = torch.as_tensor(owned_members(self.num_discriminators, self), device=self.device)
        n_all = self.num_discriminators
        opt_g, opt_d = self.optimizers()
        with torch.no_grad():
            fake = self.pretrain_generators(self.latent(n_all * b).view(n_all, b, -1)[owned], real_y)
        trailing = (1,) * (real_x.dim() - 2)
        eps = torch.rand(n_all, b, *trailing, device=real_x.device, dtype=real_x.dtype)[owned]
        d_loss = self._critic_loss(self.discriminators, real_x, real_y, fake, eps=eps)
        opt_d.zero_grad()
        local_backward(self, d_loss)
        self.step_uncounted(opt_d)
        self.critic_steps_taken += 1
        logs = {"pretrain/d_loss": d_loss.detach() / n_d}  # non-private networks on private data: opt-in only
        if int(self.critic_steps_taken) % self.training_options.critic_steps == 0:
            labels = self.sample_labels(n_all * b).view(n_all, b)[owned]
            fake = self.pretrain_generators(self.latent(n_all * b).view(n_all, b, -1)[owned], labels)
            with frozen(self.discriminators):
                g_loss = -self.discriminators(fake, labels).mean(-1).sum()
            opt_g.zero_grad()
            local_backward(self, g_loss)
            opt_g.step()
            logs["pretrain/g_loss"] = g_loss.detach() / n_d
            if self.trainer.global_step >= self.pretraining_options.iterations:
                self.stop_reason = f"pretraining done ({self.pretraining_options.iterations} iterations)"
                self.trainer.should_stop = True
        self.log_private(logs)

    def budget_shares(self) -> list[str]:
        """With a warm start: what its share bought, and that the sanitised steps got the rest."""
        shares = self.warm_start_share()
        if shares:
            shares.append(f"the rest: sanitised generator steps (noise multiplier {self.hparams.noise_multiplier:.4g}) through "
                          f"{self.num_discriminators:,} discriminators")
        return shares

    def _train_step(self, teacher: torch.Tensor, real_x: torch.Tensor, real_y: torch.Tensor) -> None:
        if not self.ensure_warm_started():
            return None  # the budget refused the warm start's release
        if not self.charge(self.privacy_event()):
            return None  # budget reached: nothing of this step is applied
        k = int(teacher)  # the same on every rank (one secret seed); never logged unless opted in
        rank, world = rank_and_world(self)
        owner = k % world  # the rank that holds discriminator k (as in pretraining)
        # the critic's own randomness (latents, interpolation weights), drawn on every rank so that
        # the ranks' global random streams stay equal whichever of them trains the critic
        critic_gen = torch.Generator(device=self.device).manual_seed(int(torch.randint(2**62, (1,))))
        d_loss = self.train_critic(k, real_x, real_y, generator=critic_gen) if rank == owner else None
        g_loss = self.generator_step(self.discriminator, owner=owner)
        if rank != owner:  # the job's count on every rank (the owner counted its steps in train_critic)
            self.critic_steps_taken += self.training_options.critic_steps
        if rank == owner:  # the sanitised gradient is the step's only release: these are not (opt-in diagnostics)
            self.log_private({"d_loss": d_loss, "g_loss": g_loss, "discriminator": float(k)})

    def train_critic(self, k: int, real_x: torch.Tensor, real_y: torch.Tensor, *,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """Plain (non-private) WGAN-GP steps of discriminator ``k`` on its own batches
        ``real_x`` ``[critic_steps, b, ...]``, from its state at the start of training and a fresh Adam
        state (``discriminator_state: reset``) or from its last draw with its own Adam state
        (``kept``); it is left loaded in ``self.discriminator``. The latents of its fakes and the
        interpolation weights come from ``generator`` (default: torch's global one). Returns the last
        critic loss."""
        opt_d = self.optimizers()[1]
        critic = self.discriminator
        kept = self.hparams.get("discriminator_state", "reset") == "kept"
        self.discriminators.copy_teacher_to(k, critic)
        if kept:
            self.discriminator_adam.load_member(k, critic, opt_d.optimizer)
        else:
            opt_d.optimizer.state.clear()
        for real_xc, real_yc in zip(real_x, real_y):
            # Fakes with the real batch's labels (as the official code); the generator's BatchNorm
            # statistics must not record those private labels: they are restored afterwards.
            with torch.no_grad(), buffers_restored(self.generator):
                fake = self.generator(self.latent(len(real_yc), generator=generator), real_yc)
            d_loss = self._critic_loss(critic, real_xc, real_yc, fake, generator=generator)
            opt_d.zero_grad()
            local_backward(self, d_loss)
            self.step_uncounted(opt_d)
            self.critic_steps_taken += 1
        if kept:  # reset: the stacked state never changes, so no draw leaves a trace in it
            self.discriminators.load_teacher(k, critic)
            self.discriminator_adam.store_member(k, critic, opt_d.optimizer)
        return d_loss.detach()

    def generator_step(self, critic: nn.Module, *, owner: int = 0) -> torch.Tensor | None:
        """Update G through ``critic`` (held by rank ``owner``) with the sanitised gradient (the step's
        only release)."""
        g_loss = self.sanitized_generator_gradient(critic, owner=owner)
        self.optimizers()[0].step()
        if self.generator_ema is not None:
            self.update_generator_average(self.generator_options.ema_decay)
        return g_loss

    def sanitized_generator_gradient(self, critic: nn.Module, *, owner: int = 0) -> torch.Tensor | None:
        """Set the generator's ``.grad`` to ``Σ_j J_j^T ĝ_j`` for B fresh samples, where ĝ_j is the
        sanitised gradient of the WGAN loss ``−mean_j D(x_j)`` w.r.t. sample x_j. The critic gets no
        gradient: only the detached samples are differentiated. Under DDP the samples are the same on
        every rank; rank ``owner`` (the critic's) sanitises with noise from its own generator and
        broadcasts ĝ. Returns the (detached) loss on the owner, ``None`` elsewhere."""
        opt_g = self.optimizers()[0]
        b = self.hparams.generator_batch_size
        labels = self.sample_labels(b)
        fake = self.generator(self.latent(b), labels)
        loss = None
        if rank_and_world(self)[0] == owner:
            with frozen(critic):
                grad, loss = self.sanitizer.sample_gradient(lambda x: -critic(x, labels).mean(), fake, generator=self.noise_generator())
        else:  # advances this rank's own generator: with a fixed test seed, its stream stays the owner's
            grad = torch.empty_like(fake)
            self.sanitizer.skip_noise(grad, generator=self.noise_generator())
        if is_distributed():
            torch.distributed.broadcast(grad, src=owner)
        opt_g.zero_grad()
        replicated_backward(self, fake, grad, params=self.generator.parameters())
        pull = self.warm_start_pull()  # the warm start's release keeps its pull (post-processing; 0 without one)
        if torch.is_tensor(pull):
            replicated_backward(self, pull, params=self.generator.parameters())  # added to the sanitised gradient
        return loss

    def noise_generator(self) -> torch.Generator:
        """The sanitiser's noise generator: seeded from the OS (unless ``noise_seed``) when first
        used in a process, on the module's device, by each process on its own (under DDP no other rank
        can replay the noise of the owner's sanitised gradient); never saved, so a resumed run draws
        fresh noise. A fixed ``noise_seed`` (tests) seeds every rank alike: 2 processes then train as 1."""
        if self._noise_generator is None or self._noise_generator.device != self.device:
            self._noise_generator = mechanism_generator(self.device, self._noise_seed)
        return self._noise_generator

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.stage == "pretrain":  # every rank comes here: the checkpoint holds every member, in order
            gather_members(checkpoint, owned=owned_members(self.num_discriminators, self), prefixes=self.STACKED_PREFIXES,
                           optimizer_indices=[0, 1])
        meta = checkpoint[GSWGAN_CHECKPOINT_KEY] = {
            "stage": self.stage,
            "num_discriminators": self.num_discriminators,
            "partition_fingerprint": self._partition_fingerprint() if self._trainer is not None else None,
        }
        if self._discriminators_reloadable():
            # Under reset the stack is the pretrained checkpoint's, never changed: a resume reloads it from
            # there, so the private stage's checkpoint holds the generator and its state only (MBs, not GBs).
            for key in [k for k in checkpoint["state_dict"] if k.startswith("discriminators.")]:
                del checkpoint["state_dict"][key]
            meta["discriminators_from"] = os.path.abspath(self.hparams.pretrained_checkpoint)

    def _discriminators_reloadable(self) -> bool:
        return (self.stage == "train" and self.hparams.get("discriminator_state", "reset") == "reset"
                and bool(self.pretrained_loaded) and bool(self.hparams.pretrained_checkpoint))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.stage == "pretrain":  # resumed on several processes: this rank's members only
            select_members(checkpoint, owned=owned_members(self.num_discriminators, self), prefixes=self.STACKED_PREFIXES,
                           optimizer_indices=[0, 1])
            return
        source = (checkpoint.get(GSWGAN_CHECKPOINT_KEY) or {}).get("discriminators_from")
        if source is not None and not any(k.startswith("discriminators.") for k in checkpoint["state_dict"]):
            self.load_pretrained(source)  # checks that it still is the pretraining of this partition
            checkpoint["state_dict"].update({f"discriminators.{k}": v for k, v in self.discriminators.state_dict().items()})

    def load_state_dict(self, state_dict, strict: bool = True, **kwargs):
        """A private-stage checkpoint under ``discriminator_state: reset`` holds no discriminators (see
        :meth:`on_save_checkpoint`): a resume reloads them (:meth:`on_load_checkpoint`), and extracting
        the release from it keeps this model's own, which sampling never uses."""
        if self.stage == "train" and not any(k.startswith("discriminators.") for k in state_dict):
            state_dict = {**{f"discriminators.{k}": v for k, v in self.discriminators.state_dict().items()}, **state_dict}
        return super().load_state_dict(state_dict, strict=strict, **kwargs)
