"""Option groups: the networks a model trains, as typed objects that LightningCLI builds and validates.

A model's constructor keeps what a user decides for a run (ε, δ, the accounting, the mechanism's parameters) and
takes each network as one option: ``generator`` (:class:`GeneratorNet`, one definition shared by every image and
table model), where the model trains one against it ``critic`` / ``discriminator`` / ``student``
(:class:`DiscriminatorNet`), and G-PATE's ``teachers`` (:class:`Teachers`; its aggregator, a mechanism chosen by
class, is :mod:`lightning_gpate.models.aggregators`'). On the command line and in a config they are groups::

    model:
      class_path: lightning_gpate.models.DPMERF
      init_args:
        epsilon: 1.0
        generator: {z_dim: 5, gf_dim: 8, fc_dim: 200}   # --model.generator.z_dim 5

A group given as a mapping overrides only the options it names: the rest keep the model's defaults (what
``fit --help`` shows under the group), in Python as on the command line.

**The flat names of before** (``z_dim``, ``gf_dim``, ``generator_hidden``, ``ema_decay``, …; issue 60) still build
a model in Python and still load every release artifact and checkpoint written with them: each model's
``FLAT_OPTIONS`` maps a flat name to its place in the groups, and :func:`migrate_flat_options` moves it there
(:class:`~lightning_gpate.models.base.GenerativeModel` does so for every subclass's constructor); the models'
``PAPER_SETTINGS`` keep them, so that ``DPGAN(spec, **PAPER_SETTINGS, z_dim=32)`` merges as it did (a flat name
beside a mapping of its own group that names the same option with another value is refused: which one was meant
is not known). A config read by the command line is parsed against the groups; a flat name there fails in one line
that names its new place (:mod:`lightning_gpate.option_errors`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Sequence

from lightning_gpate.nets.ensemble import CONV_IMPLS
from lightning_gpate.nets.generators import ConditionalDCGANGenerator

#: The generator's priors over its latent space.
LATENT_PRIORS = ("normal", "uniform")
#: The DCGAN generator's upsampling.
UPSAMPLES = ConditionalDCGANGenerator.UPSAMPLE


def positive_widths(name: str, value: Sequence[int] | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not all(int(w) == w and w >= 1 for w in value):
        raise ValueError(f"{name} must be a list of integer widths >= 1, got {value!r}")
    return tuple(int(w) for w in value)


def positive_int(name: str, value: Any) -> None:
    if value is not None and not (int(value) == value and value >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class OptionGroup:
    """What every option group shares: built from itself or a mapping over a model's default, plain in hparams.
    (A dataclass without fields: jsonargparse makes a group of a class only if every class of its MRO is one.)"""

    def as_hparams(self) -> dict[str, Any]:
        """Plain values for the hyperparameters (checkpoints, release artifacts, MLflow params)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def of(cls, value: Any, default: "OptionGroup", *, name: str):
        """The group a model was given: itself, a mapping of some of its options over the model's ``default``, or
        ``None`` (the default). An unknown key is refused in one line that lists the group's options."""
        if value is None:
            return default
        return group_from(cls, value, name=name, default=default)


def group_from(cls, value: Any, *, name: str, default: Any = None):
    """An option group ``cls`` (a frozen dataclass) from itself or a mapping of its options (over ``default``'s where
    given, else its own defaults); an unknown key is refused in one line that lists the group's options."""
    if isinstance(value, cls):
        return value
    if hasattr(value, "__dict__") and type(value).__name__ == "Namespace":  # jsonargparse's, given unbuilt
        value = vars(value)
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a {cls.__name__}, a mapping of its options or null, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name} has no option {', '.join(map(repr, unknown))}: its options are {sorted(known)}")
    return replace(default, **value) if default is not None else cls(**value)


def flat_options(against: str | None = None, *, generator_hidden: str = "generator_hidden",
                 against_hidden: str = "discriminator_hidden") -> dict[str, tuple[str, ...]]:
    """A model's ``FLAT_OPTIONS`` (the flat names of before the groups → their places): the generator's, and with
    ``against`` (``"critic"``, ``"discriminator"``, ``"student"``) the network trained against it, which shared
    ``fc_dim`` with the generator. ``generator_hidden`` / ``against_hidden``: the flat names of their MLP widths."""
    out = {"z_dim": ("generator.z_dim",), "latent_prior": ("generator.latent_prior",), "gf_dim": ("generator.gf_dim",),
           "fc_dim": ("generator.fc_dim",), "generator_upsample": ("generator.upsample",),
           generator_hidden: ("generator.hidden",), "ema_decay": ("generator.ema_decay",)}
    if against is not None:
        out.update({"fc_dim": ("generator.fc_dim", f"{against}.fc_dim"), "df_dim": (f"{against}.df_dim",)})
        out[against_hidden] = (*out.get(against_hidden, ()), f"{against}.hidden")
    return out


@dataclass(frozen=True, kw_only=True)
class GeneratorNet(OptionGroup):
    """The generator network: a conditional DCGAN for images, a conditional MLP for tables (Radford et al. 2016;
    :mod:`lightning_gpate.nets.generators`). One definition for every image and table model; each model's default is
    the one its docs state (``fit --help`` shows it).

    Args:
        z_dim: latent size (null: the model's rule, e.g. the data's dimension).
        latent_prior: "normal", N(0, I), or "uniform", U(-1, 1), in training and sampling.
        gf_dim: images: channels of the last upsampling stage (twice that before it).
        fc_dim: images: width of the first dense layer.
        upsample: images: "transposed" (strided) or "nearest" (×2, then a convolution). Nearest upsampling draws no
            checkerboard artefacts.
        hidden: tables: hidden widths of the MLP (null: the model's rule).
        ema_decay: decay of a weight average that then samples (0 or null: none). The average is what samples and is
            released (post-processing: free).
    """

    z_dim: int | None = 100
    latent_prior: str = "normal"
    gf_dim: int = 64
    fc_dim: int = 1024
    upsample: str = "transposed"
    hidden: tuple[int, ...] | None = (256, 256)
    ema_decay: float | None = 0.0

    def __post_init__(self) -> None:
        positive_int("generator.z_dim", self.z_dim)
        positive_int("generator.gf_dim", self.gf_dim)
        positive_int("generator.fc_dim", self.fc_dim)
        if self.latent_prior not in LATENT_PRIORS:
            raise ValueError(f"generator.latent_prior must be one of {LATENT_PRIORS}, got {self.latent_prior!r}")
        if self.upsample not in UPSAMPLES:
            raise ValueError(f"generator.upsample must be one of {UPSAMPLES}, got {self.upsample!r}")
        if self.ema_decay is not None and not (0 <= self.ema_decay < 1 and math.isfinite(self.ema_decay)):
            raise ValueError(f"generator.ema_decay must be in [0, 1) or null, got {self.ema_decay}")
        object.__setattr__(self, "hidden", positive_widths("generator.hidden", self.hidden))

    @property
    def averaged(self) -> bool:
        """Whether a weight average is kept (and sampled)."""
        return bool(self.ema_decay)


@dataclass(frozen=True, kw_only=True)
class DiscriminatorNet(OptionGroup):
    """A network trained against the generator on the private data or its votes (DP-GAN's critic, GS-WGAN's and the
    non-private GAN's discriminator, PATE-GAN's student): a conditional DCGAN discriminator for images, an MLP for
    tables (:mod:`lightning_gpate.nets.discriminators`).

    Args:
        df_dim: images: channels of the first convolution (doubled in the next).
        fc_dim: images: width of the dense layer.
        hidden: tables: hidden widths of the MLP (null: the model's rule).
    """

    df_dim: int = 64
    fc_dim: int = 1024
    hidden: tuple[int, ...] | None = (256, 256)

    def __post_init__(self) -> None:
        positive_int("df_dim", self.df_dim)
        positive_int("fc_dim", self.fc_dim)
        object.__setattr__(self, "hidden", positive_widths("hidden", self.hidden))


#: How G-PATE's teachers label their fakes (:class:`Teachers`).
TEACHER_FAKE_LABELS = ("teacher", "class_ratio")
#: The teachers' precision (autocast of their forward and backward).
TEACHER_PRECISIONS = ("32", "bf16")


@dataclass(frozen=True, kw_only=True)
class TeacherEnsemble(OptionGroup):
    """A PATE teacher ensemble: one discriminator per disjoint partition, trained on it and never released (so its
    training costs no privacy; what the teachers vote is the mechanism's to pay). Images: the G-PATE paper's
    conditional conv nets (:class:`~lightning_gpate.nets.ensemble.ConvTeacherEnsemble`), tables an MLP each
    (:class:`~lightning_gpate.nets.ensemble.MLPTeacherEnsemble`). G-PATE's :class:`Teachers` and PATE-GAN's
    teachers add how they are trained or vote.

    Args:
        steps: Adam steps per iteration.
        lr: Adam's learning rate (null: the model's rule).
        hidden: tables: hidden widths of the MLP teachers (null: the model's rule).
        channels: images: conv widths [c0, c1] (null: the paper's).
        fc: images: dense width.
        chunk_size: teachers a backward pass takes at once, to bound memory (null: all).
        seed: seed of the teachers' initialisation (per global teacher id).
    """

    steps: int = 1
    lr: float | None = 1e-3
    hidden: tuple[int, ...] | None = (64,)
    channels: tuple[int, ...] | None = None
    fc: int = 256
    chunk_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        positive_int("teachers.steps", self.steps)
        positive_int("teachers.fc", self.fc)
        positive_int("teachers.chunk_size", self.chunk_size)
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"teachers.lr must be a finite number > 0, got {self.lr}")
        object.__setattr__(self, "hidden", positive_widths("teachers.hidden", self.hidden))
        object.__setattr__(self, "channels", positive_widths("teachers.channels", self.channels))


@dataclass(frozen=True, kw_only=True)
class Teachers(TeacherEnsemble):
    """G-PATE's teacher ensemble (:class:`TeacherEnsemble`: ``steps`` Adam steps per iteration, each on new fakes and
    the same real batch), and how it is trained.

    Args:
        fake_labels: the labels of a teacher's fakes: "teacher" or "class_ratio". "teacher": each teacher's fakes
            carry its real batch's labels, as the official code; "class_ratio": one fake batch, labels from the class
            ratio, shared by all teachers.
        warmup_steps: teacher steps before the first aggregation (no privacy cost). They train against the untrained
            generator's fakes, whose weights do not depend on the data.
        precision: "32" or "bf16" (autocast of the forward and backward). bf16's votes were compared with fp32's in
            the teacher throughput benchmark.
        betas: Adam's betas.
        conv_impl: images: the convolution kernels, "auto", "cpu", "gpu" or "bmm" (same maths). "cpu": im2col + batched
            matmuls and channels-last grouped convolutions; "gpu": grouped convolutions; "bmm": im2col + batched matmuls
            for every convolution.
    """

    fake_labels: str = "teacher"
    warmup_steps: int = 0
    precision: str = "32"
    betas: tuple[float, float] = (0.5, 0.999)
    conv_impl: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        for option, value, choices in (("fake_labels", self.fake_labels, TEACHER_FAKE_LABELS),
                                       ("precision", str(self.precision), TEACHER_PRECISIONS), ("conv_impl", self.conv_impl, CONV_IMPLS)):
            if value not in choices:
                raise ValueError(f"teachers.{option} must be one of {choices}, got {value!r}")
        object.__setattr__(self, "precision", str(self.precision))
        if int(self.warmup_steps) != self.warmup_steps or self.warmup_steps < 0:
            raise ValueError(f"teachers.warmup_steps must be an integer >= 0, got {self.warmup_steps}")
        if self.lr is None or self.hidden is None or len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"teachers.lr must be > 0, teachers.hidden widths and teachers.betas two numbers in [0, 1), got "
                             f"{self.lr}, {self.hidden}, {self.betas}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))


def migrate_flat_options(flat_options: dict[str, tuple[str, ...]], options: dict[str, Any], *, model: str) -> dict[str, Any]:
    """``options`` with every flat name of ``flat_options`` (``name → ("group.option", …)``) moved into its groups.

    A flat name given beside a mapping of its group that names the same option with another value is refused (which
    one was meant is not known). Beside a group given built (LightningCLI's, when a checkpoint's hyperparameters of
    before the groups come as ``dict_kwargs``: a resume, ``load_from_checkpoint``) the flat name wins."""
    found = [name for name in options if name in flat_options]
    if not found:
        return options
    out = {k: v for k, v in options.items() if k not in flat_options}
    for name in found:
        for target in flat_options[name]:
            group, _, option = target.partition(".")
            given = out.get(group)
            built = options.get(group) is not None and not isinstance(options.get(group), dict)
            if not isinstance(given, (dict, type(None))):  # jsonargparse's, beside an old checkpoint's flat hyperparameters (its dict_kwargs): those win, as
                # every hyperparameter of a checkpoint does on a resume (which then refuses what the config changed)
                given = given.as_hparams() if hasattr(given, "as_hparams") else vars(given)
            given = dict(given or {})
            if not built and option in given and not _same(given[option], options[name]):
                raise ValueError(f"{model}: {name}={options[name]!r} and {target}={given[option]!r} both given: {name} is the "
                                 f"former name of {target}, give one")
            out[group] = {**given, option: options[name]}
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as option values (a list and a tuple of the same widths are)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def accepting_flat_options(init):
    """Wraps a model's ``__init__`` so that the flat names of its class's ``FLAT_OPTIONS`` still build it
    (:func:`migrate_flat_options`); the signature that LightningCLI and ``help`` read is the groups'."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **type(self).migrate_options(kwargs))

    __init__.accepts_flat_options = True
    return __init__
