"""What every generator system shares: its data spec, the latent prior, label sampling, generation,
and a checkpoint that says what it is.

The latent prior lives in one place (:meth:`GenerativeModel.latent`) and is used by training and by
sampling alike: a prior that differs between the two is one of the known PATE-GAN implementation bugs.
"""

from __future__ import annotations

import atexit
from typing import Any, Iterable, Mapping

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn

from lightning_gpate.models.options import LATENT_PRIORS, GeneratorNet, accepting_flat_options, migrate_flat_options
from lightning_gpate.nets.generators import ConditionalDCGANGenerator, ConditionalMLPGenerator
from lightning_gpate.release import CHECKPOINT_KEY, CheckpointError, load_release, model_from_release

CHECKPOINT_FORMAT = 1
__all__ = ["CHECKPOINT_KEY", "CheckpointError", "GenerativeModel", "load_generator", "refuse_changed_on_resume"]


def _gloo_group_alive() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"


def _destroy_gloo_process_group() -> None:
    if _gloo_group_alive():
        dist.destroy_process_group()


def destroy_gloo_process_group_at_exit() -> None:
    """Destroy this process's gloo process group when the interpreter exits, while it is still alive.

    Lightning does this for NCCL only. A process that exits with a live gloo group can abort while
    the interpreter finalises ("terminate called without an active exception", SIGABRT: gloo's
    worker threads still hold work objects whose tensors need the GIL; pytorch/pytorch#190489), which
    fails a finished ``ddp_spawn`` fit on CPU. Registered once per process; a no-op without gloo.
    """
    if _gloo_group_alive():
        atexit.unregister(_destroy_gloo_process_group)  # at most one registration per process
        atexit.register(_destroy_gloo_process_group)


@torch.no_grad()
def average_step(average: nn.Module, net: nn.Module, decay: float, step: int) -> None:
    """One step of the generator's weight average at generator step ``step`` (≥ 1; 0: no warm-up):
    ``average ← d · average + (1 − d) · net`` with ``d = min(decay, 1 − 1/step)`` (the official GS-WGAN
    code's ``exp_mov_avg`` warm-up: the mean of the iterates so far until ``1/(1 − decay)`` steps), the
    buffers (BatchNorm statistics) copied."""
    if step:
        decay = min(decay, 1.0 - 1.0 / step)
    for avg, p in zip(average.parameters(), net.parameters()):
        avg.lerp_(p, 1.0 - decay)
    for avg, b in zip(average.buffers(), net.buffers()):
        avg.copy_(b)


class GenerativeModel(pl.LightningModule):
    """Base LightningModule of every (private or not) conditional generator.

    Subclasses build their networks in ``__init__`` from ``data_spec`` and set
    ``automatic_optimization = False``.

    Args:
        data_spec: the DataModule's ``spec`` (linked by the CLI; stored in the hyperparameters so a
            checkpoint can be sampled without the data).
        z_dim: latent size.
        latent_prior: ``"normal"`` (N(0, I)) or ``"uniform"`` (U(-1, 1), G-PATE's choice).
    """

    #: Why this model trains on one process only (``None``: it trains under DDP, e.g.
    #: ``--trainer.devices 2 --trainer.strategy ddp``). The command line refuses a multi-process fit
    #: of such a model in one line, before anything starts.
    single_process_only: str | None = None
    #: Whether some parameters take no part in a step's loss (e.g. the generator's in a discriminator
    #: step): DDP must then look for unused parameters (``--trainer.strategy ddp_find_unused_parameters_true``).
    ddp_needs_find_unused_parameters: bool = False
    #: Hyperparameters whose ``None`` the constructor resolves to a public value (a seed drawn from the random
    #: state of ``seed_everything``, a length scale from the data's shape). The resolved value is what the
    #: hyperparameters hold (:meth:`store_resolved_hparams`), hence every checkpoint and the release: a model
    #: rebuilt from them, or a resume, uses the same value whatever the seed then. A resume that asks for ``None``
    #: there takes the checkpoint's value; one that asks for another value is refused.
    RESOLVED_HPARAMS: tuple[str, ...] = ()
    #: The flat names of before the option groups (issue 60) → where each now lives (``"generator.z_dim"``, one or
    #: more places): a constructor still takes them, and every old checkpoint and release artifact holds them
    #: (:mod:`lightning_gpate.models.options`).
    FLAT_OPTIONS: dict[str, tuple[str, ...]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and cls.FLAT_OPTIONS and not getattr(init, "accepts_flat_options", False):
            cls.__init__ = accepting_flat_options(init)

    @classmethod
    def migrate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Constructor options with the flat names of before the groups moved into them (:attr:`FLAT_OPTIONS`)."""
        return migrate_flat_options(cls.FLAT_OPTIONS, options, model=cls.__name__) if cls.FLAT_OPTIONS else options

    @classmethod
    def flat_option_place(cls, name: str) -> tuple[str, str] | None:
        """Where the flat option ``name`` of before the groups lives now, for a one-line error: ``(its place, how a
        config writes it)``, e.g. ``("generator.fc_dim and student.fc_dim", "generator: {fc_dim: ...}")``; ``None``
        for a name that never was one."""
        places = cls.FLAT_OPTIONS.get(name)
        if not places:
            return None
        group, _, option = places[0].partition(".")
        return " and ".join(places), f"{group}: {{{option}: ...}}"

    def store_option_groups(self, **groups: Any) -> None:
        """Store each option group as the plain mapping of all its options (resolved: the model's defaults where the
        group was given in part) in the hyperparameters, after ``save_hyperparameters``: a checkpoint or a release
        rebuilds the same networks, and MLflow shows every option (``generator/z_dim``)."""
        for hparams in (self._hparams, getattr(self, "_hparams_initial", {})):
            hparams.update({name: group.as_hparams() for name, group in groups.items()})

    def __init__(self, data_spec: dict[str, Any], *, z_dim: int = 100, latent_prior: str = "normal") -> None:
        super().__init__()
        if latent_prior not in LATENT_PRIORS:
            raise ValueError(f"latent_prior must be one of {LATENT_PRIORS}, got {latent_prior!r}")
        if not data_spec or "kind" not in data_spec:
            raise ValueError("data_spec is required (the DataModule's .spec)")
        self.data_spec = data_spec
        self.z_dim = z_dim
        self.latent_prior = latent_prior
        self.num_classes = int(data_spec["num_classes"])
        self.is_release = False  # True for a model loaded from a release artifact: it cannot train
        self.register_buffer("class_ratio", torch.tensor(self.sampling_class_ratio(), dtype=torch.float32))

    def store_resolved_hparams(self, requested: Mapping[str, Any], **resolved: Any) -> None:
        """Store the values a constructor resolved from ``None`` (names of :attr:`RESOLVED_HPARAMS`) in the
        hyperparameters, after ``save_hyperparameters``. LightningCLI makes ``save_hyperparameters`` store the
        config as given (``None``), not the constructor's locals, so without this a checkpoint or release built
        under the command line would hold ``None`` and a model rebuilt from it would draw another value.

        Args:
            requested: the values the constructor was given (``None`` where it resolved them).
            resolved: name → the value it resolved.
        """
        unknown = set(resolved) - set(self.RESOLVED_HPARAMS)
        if unknown:
            raise TypeError(f"{type(self).__name__} does not resolve {sorted(unknown)} (RESOLVED_HPARAMS)")
        #: names this construction resolved itself (a resume may replace them by its checkpoint's)
        self._resolved_here = {k for k in resolved if requested.get(k) is None}
        self._update_hparams(resolved)

    def adopt_resolved_hparams(self, pinned: Mapping[str, Any], path: str = "the checkpoint") -> dict[str, Any]:
        """On a resume: the values of :attr:`RESOLVED_HPARAMS` that ``pinned`` (the checkpoint's
        hyperparameters) holds and this model resolved otherwise, adopted into the hyperparameters; returns
        them (the subclass redraws what depends on them). A value this model was *given* that differs from the
        checkpoint's is refused (:class:`CheckpointError`), as any other change of a resumed run."""
        here = getattr(self, "_resolved_here", set())
        pinned = {k: hparam(pinned, k) for k in self.RESOLVED_HPARAMS if hparam(pinned, k, _MISSING) is not _MISSING}
        ours = {k: hparam(self.hparams, k) for k in self.RESOLVED_HPARAMS if hparam(self.hparams, k, _MISSING) is not _MISSING}
        refuse_changed_on_resume(path, pinned, {k: v for k, v in ours.items() if k not in here})
        adopted = {k: pinned[k] for k in self.RESOLVED_HPARAMS if k in here and pinned.get(k) is not None and pinned[k] != ours.get(k)}
        self._update_hparams(adopted)
        return adopted

    @classmethod
    def answer_on_resume(cls, asked: dict[str, Any], pinned: Mapping[str, Any], data_spec: Mapping[str, Any]) -> dict[str, Any]:
        """The model arguments a resume asks for (``asked``, plain values), with what the constructor would resolve
        itself answered as the checkpoint's run resolved it (``pinned``: its arguments; ``data_spec``: its data's), so
        that the command line compares like with like: a :attr:`RESOLVED_HPARAMS` left ``None`` takes the checkpoint's
        value. A subclass answers what it resolves beyond them (its ``super()`` first)."""
        asked = dict(asked)
        for name in cls.RESOLVED_HPARAMS:
            group, _, option = name.rpartition(".")
            if not group and asked.get(name, 0) is None:
                del asked[name]
            elif group and isinstance(asked.get(group), dict) and asked[group].get(option, 0) is None:
                asked[group] = {**asked[group], option: hparam(pinned, name)}
        return asked

    @classmethod
    def data_checkpoint(cls, options: Mapping[str, Any]) -> str | None:
        """The checkpoint of an earlier run on the same data that a fit with the constructor ``options`` continues
        (GS-WGAN's private stage: its pretraining), whose released data spec the fit's DataModule takes instead of
        drawing its DP metadata again; ``None`` (the default) for a fit that continues nothing."""
        return None

    def _update_hparams(self, values: Mapping[str, Any]) -> None:
        """Set hyperparameters by name, a group's option as ``"group.option"`` (in the saved and the initial ones)."""
        for hparams in (self._hparams, getattr(self, "_hparams_initial", {})):
            for name, value in values.items():
                group, _, option = name.rpartition(".")
                if group:
                    hparams[group] = {**(hparams.get(group) or {}), option: value}
                else:
                    hparams[name] = value

    def setup(self, stage: str) -> None:
        destroy_gloo_process_group_at_exit()
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and self.single_process_only:  # a Trainer or Synthesizer built without the command line
            # (e.g. DP-MERF: each process would release its own noisy embedding while one release is charged)
            raise ValueError(f"{type(self).__name__} trains on one process only ({self.single_process_only}): use one device")

    # ----------------------------------------------------------------- building blocks
    @property
    def is_image(self) -> bool:
        return self.data_spec["kind"] == "image"

    def build_generator(self, options: GeneratorNet, *, norm: str = "batch") -> nn.Module:
        """The conditional generator ``options`` describe for the data kind (DCGAN for images, MLP for tables; its latent
        size is the model's ``z_dim``)."""
        if self.is_image:
            return ConditionalDCGANGenerator(z_dim=self.z_dim, num_classes=self.num_classes, out_shape=self.data_spec["shape"],
                                             gf_dim=options.gf_dim, fc_dim=options.fc_dim, upsample=options.upsample)
        if options.hidden is None:
            raise ValueError("generator.hidden is required for a table")
        return ConditionalMLPGenerator(z_dim=self.z_dim, num_classes=self.num_classes, spans=self.data_spec["spans"], hidden=options.hidden,
                                       norm=norm)

    def sampling_class_ratio(self) -> list[float]:
        """Class ratio used to draw labels for fake samples and for sampling.

        Non-private models may use the empirical ratio; private models override this to refuse a
        ratio read from the data unless it was declared public or paid for.
        """
        return list(self.data_spec["class_ratio"])

    def latent(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``n`` latent vectors from the model's prior (the same in training and sampling)."""
        if self.latent_prior == "uniform":
            return torch.rand(n, self.z_dim, device=self.device, generator=generator) * 2.0 - 1.0
        return torch.randn(n, self.z_dim, device=self.device, generator=generator)

    def sample_labels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        if n == 0:  # e.g. for an empty Poisson batch (torch.multinomial refuses n = 0)
            return torch.zeros(0, dtype=torch.long, device=self.device)
        return torch.multinomial(self.class_ratio, n, replacement=True, generator=generator).to(self.device)

    @staticmethod
    def step_uncounted(optimizer) -> None:
        """Step an auxiliary optimizer (discriminators, teachers, students) without advancing
        ``trainer.global_step``, so that steps (``max_steps``, logged steps) count generator updates.

        Lightning counts every ``LightningOptimizer.step`` in manual optimization; the raw optimizer's
        step is the same update without the count (fine in fp32/bf16; not for fp16 loss scaling).
        """
        getattr(optimizer, "optimizer", optimizer).step()

    # ----------------------------------------------------------------- generation
    @property
    def has_release(self) -> bool:
        """Whether this run produces a generator worth evaluating (``False`` for a stage that only
        prepares other networks, e.g. GS-WGAN's discriminator pretraining); evaluation callbacks
        skip runs without one."""
        return True

    @property
    def generator_module(self) -> nn.Module:
        """The network that produces samples: the average of the generator's weights where the model keeps
        one (``generator_ema``), else the generator."""
        ema = getattr(self, "generator_ema", None)
        return ema if ema is not None else self.generator

    @torch.no_grad()
    def update_generator_average(self, decay: float) -> None:
        """Move ``generator_ema`` towards the generator's weights (an exponential moving average of decay
        ``decay``, buffers copied) after the official GS-WGAN code's warm-up (``exp_mov_avg``): at generator
        step t the decay is ``min(decay, 1 − 1/t)``, so the average starts at the generator and weighs a short
        run's steps equally instead of keeping most of its random initialisation. Post-processing: free."""
        step = int(self.trainer.global_step) if self._trainer is not None else 0
        average_step(self.generator_ema, self.generator, decay, step)

    @torch.no_grad()
    def generate(
        self, n: int, labels: torch.Tensor | None = None, *, batch_size: int = 1024, seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate ``n`` samples in the generator's space, with labels from the class ratio unless given."""
        if n < 1:
            raise ValueError(f"number of samples must be >= 1, got {n}")
        gen = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        if labels is None:
            labels = self.sample_labels(n, generator=gen)
        elif len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            # the generators' one-hot is a comparison (it runs under vmap): an unknown label would give a zero row
            raise ValueError(f"labels must be classes 0..{self.num_classes - 1}, got {int(labels.min())}..{int(labels.max())}")
        from lightning_gpate.progress import progress

        net = self.generator_module
        was_training = net.training
        net.eval()
        batches = labels.split(batch_size)
        if len(batches) > 1:
            batches = progress(batches, desc="generating", total=len(batches), unit="batch")
        out = [net(self.latent(len(y), generator=gen), y.to(self.device)) for y in batches]
        net.train(was_training)
        return torch.cat(out).cpu(), labels.cpu()

    def on_train_start(self) -> None:
        if self.is_release:
            raise RuntimeError(
                f"this {type(self).__name__} was loaded from a release artifact ({getattr(self, 'release_source', '?')}): "
                f"it holds the generator only, not the state training needs (teachers, discriminators, optimizers). "
                f"Resume from the run's private training checkpoint instead (--ckpt_path private/.../last.ckpt)."
            )

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every Lightning checkpoint of a lightning-gpate model is a (private) training checkpoint;
        # what is released is built separately (lightning_gpate.release).
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "model_class": f"{type(self).__module__}.{type(self).__qualname__}",
        }

    def check_resume(self, checkpoint: dict[str, Any], path: str) -> None:
        """Refuse to resume training from ``checkpoint`` (read from ``path`` by
        :func:`lightning_gpate.release.read_file`) when it cannot continue this model: a release
        artifact, another model class, or no training state. Raises :class:`CheckpointError`."""
        if CHECKPOINT_KEY not in checkpoint:
            raise CheckpointError(
                f"{path} is a release artifact (the generator only): resume from the run's private training "
                f"checkpoint (its MLflow tag training_checkpoint; kept when the config asks for checkpoints)"
            )
        meta = checkpoint.get(CHECKPOINT_KEY) or {}
        mine = f"{type(self).__module__}.{type(self).__qualname__}"
        if meta.get("model_class") != mine:
            raise CheckpointError(f"{path} holds a {meta.get('model_class')}, but the config trains a {mine}: resume with the config it was trained with")
        if "state_dict" not in checkpoint or "optimizer_states" not in checkpoint or "loops" not in checkpoint:
            raise CheckpointError(f"{path} holds no training state (optimizers, loops): it cannot be resumed; give the training checkpoint")


_MISSING = object()


def hparam(hparams: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """The hyperparameter ``name`` of ``hparams``; a group's option is ``"group.option"`` (:attr:`GenerativeModel.RESOLVED_HPARAMS`)."""
    group, _, option = name.rpartition(".")
    holder = hparams.get(group) if group else hparams
    return holder.get(option, default) if isinstance(holder, Mapping) else default


def refuse_changed_on_resume(path: str, pinned: Mapping[str, Any], requested: Mapping[str, Any],
                             names: Iterable[str] | None = None) -> None:
    """Raise :class:`CheckpointError` when a resume from ``path`` asks for other values than the
    checkpoint pins: ``requested[name] != pinned[name]`` for a name in both (of ``names``, default all).

    A resumed run continues the checkpoint's run: its accountant was filled under the checkpoint's
    budget, δ, noise, teachers and accounting mode, and LightningCLI takes the model's hyperparameters
    from the checkpoint whatever the command line says. A value asked for and then not used would be a
    silent change of what the run promises; the one-line error names both values.
    """
    keys = [k for k in (pinned if names is None else names) if k in pinned and k in requested]
    changed = [k for k in keys if requested[k] != pinned[k]]
    if not changed:
        return

    def values(of: Mapping[str, Any]) -> str:
        return ", ".join(f"{k}={of[k]!r}" if isinstance(of[k], str) else f"{k}={of[k]}" for k in changed)

    raise CheckpointError(
        f"{path} pins {values(pinned)}, but this run asks for {values(requested)}: a resumed fit keeps the "
        f"checkpoint's privacy budget, noise, teachers and other settings. Drop the change, or start a new run "
        f"(no ckpt_path) to use it"
    )


def load_generator(ckpt_path: str, map_location: str = "cpu") -> GenerativeModel:
    """Load a trained generator for sampling, with a clear error for anything else.

    Args:
        ckpt_path: a release artifact (``release/release.pt`` of a run, what ``fit`` prints), or a
            run's private training checkpoint, whose release is extracted in memory.
        map_location: device of the returned model.

    Returns:
        The model with its released generator and privacy state, in eval mode; it refuses to train.
    """
    return model_from_release(load_release(ckpt_path), source=str(ckpt_path), map_location=map_location)
