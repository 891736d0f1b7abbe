"""What every generator system shares: its data spec, the latent prior, label sampling, generation,
and a checkpoint that says what it is.

The latent prior lives in one place (:meth:`GenerativeModel.latent`) and is used by training and by
sampling alike: a prior that differs between the two is one of the known PATE-GAN implementation bugs.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from lightning_gpate.errors import UserError
from lightning_gpate.nets.generators import ConditionalDCGANGenerator, ConditionalMLPGenerator

CHECKPOINT_KEY = "lightning_gpate"
CHECKPOINT_FORMAT = 1
LATENT_PRIORS = ("normal", "uniform")


class CheckpointError(UserError, ValueError):
    """A checkpoint that is missing, unreadable, or not a lightning-gpate generator."""


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
        self.register_buffer("class_ratio", torch.tensor(self.sampling_class_ratio(), dtype=torch.float32))

    # ----------------------------------------------------------------- building blocks
    @property
    def is_image(self) -> bool:
        return self.data_spec["kind"] == "image"

    def build_generator(self, *, hidden: tuple[int, ...] = (256, 256), norm: str = "batch", gf_dim: int = 64, fc_dim: int = 1024) -> nn.Module:
        """The conditional generator matching the data kind (DCGAN for images, MLP for tables)."""
        if self.is_image:
            return ConditionalDCGANGenerator(z_dim=self.z_dim, num_classes=self.num_classes, out_shape=self.data_spec["shape"], gf_dim=gf_dim, fc_dim=fc_dim)
        return ConditionalMLPGenerator(z_dim=self.z_dim, num_classes=self.num_classes, spans=self.data_spec["spans"], hidden=hidden, norm=norm)

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
        """The network that produces samples (subclasses may return an EMA copy)."""
        return self.generator

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

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "model_class": f"{type(self).__module__}.{type(self).__qualname__}",
        }

    def check_resume(self, checkpoint: dict[str, Any], path: str) -> None:
        """Refuse to resume training from ``checkpoint`` (read from ``path``) when it cannot continue
        this model: another model class, or no training state. Raises :class:`CheckpointError`."""
        meta = checkpoint.get(CHECKPOINT_KEY) or {}
        mine = f"{type(self).__module__}.{type(self).__qualname__}"
        if meta.get("model_class") != mine:
            raise CheckpointError(f"{path} holds a {meta.get('model_class')}, but the config trains a {mine}: resume with the config it was trained with")
        if "state_dict" not in checkpoint or "optimizer_states" not in checkpoint or "loops" not in checkpoint:
            raise CheckpointError(f"{path} holds no training state (optimizers, loops): it cannot be resumed; give the training checkpoint")


def read_checkpoint(ckpt_path: str, *, map_location: str = "cpu", mmap: bool = False) -> dict[str, Any]:
    """The dict of a lightning-gpate checkpoint file, with a :class:`CheckpointError` for a missing
    file, a file PyTorch cannot read, or a checkpoint of something else. ``mmap=True`` leaves the
    tensors on disk (cheap to inspect a large training checkpoint)."""
    from pathlib import Path

    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.resolve()}")
    for memory_map in ((True, False) if mmap else (False,)):  # mmap needs torch.save's zip format
        try:
            checkpoint = torch.load(path, map_location=map_location, weights_only=False, mmap=memory_map)
            break
        except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
            error = err
    else:
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint ({type(error).__name__}: {error})") from error
    meta = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not meta or "model_class" not in meta:
        raise CheckpointError(f"{path} is not a lightning-gpate checkpoint (no '{CHECKPOINT_KEY}' entry)")
    return checkpoint


def load_generator(ckpt_path: str, map_location: str = "cpu") -> GenerativeModel:
    """Load any lightning-gpate model from a checkpoint, with a clear error for anything else."""
    from pathlib import Path

    path = Path(ckpt_path)
    meta = read_checkpoint(ckpt_path, map_location=map_location, mmap=True)[CHECKPOINT_KEY]
    module_name, _, class_name = meta["model_class"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise CheckpointError(f"{path} holds a {meta['model_class']} that this version cannot load") from err
    model = cls.load_from_checkpoint(path, map_location=map_location)
    model.eval()
    return model

