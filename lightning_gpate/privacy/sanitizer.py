"""GS-WGAN's gradient sanitiser (Chen, Orekondy & Fritz, NeurIPS 2020, Section 4, Eq. 6–7).

The generator G learns only through the gradient that flows from a discriminator D into each
generated sample x_j = G(z_j). GS-WGAN perturbs exactly that gradient and nothing else:

    ĝ_j = clip_C(∂ℓ_j/∂x_j) + N(0, (2Cσ)² I),     clip_C(g) = g · min(1, C / ‖g‖₂),

where ℓ_j is sample j's generator loss (−D(x_j) for WGAN). Replacing one record changes one
clipped gradient by at most 2C (its L2 sensitivity), hence the factor 2 in the noise; σ is the
noise multiplier the accountant uses (:class:`~lightning_gpate.privacy.GSWGANStepEvent`). The
generator's parameter gradient is then ``Σ_j J_j^T ĝ_j`` (divided by B for a mean loss) — computed
by back-propagating ĝ into G, so the Jacobian of G itself is exact (post-processing).

With a mean loss ``L = (1/B) Σ_j ℓ_j`` the gradient of L w.r.t. x_j is ``g_j / B``; the official code
clips it at ``C/B`` and adds ``N(0, (2σC/B)²)``, which is ``(clip_C(g_j) + N(0, (2Cσ)²)) / B``:
:class:`GradientSanitizer` does exactly this for ``reduction="mean"``.

The gradient is taken with ``torch.autograd.grad`` with respect to a *detached* copy of the
samples, so the discriminator's parameters receive no gradient (and no noise) and the sanitised
gradient is the only thing that reaches G — no module hooks are involved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["GradientSanitizer", "SANITIZER_SENSITIVITY"]

#: L2 sensitivity of one clipped gradient under replace-one neighbours, in units of C.
SANITIZER_SENSITIVITY = 2.0
_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class GradientSanitizer:
    """Clip each sample's gradient to L2 norm ``clip_bound`` and add N(0, (2·C·σ)²) noise.

    Args:
        clip_bound: C, the per-sample L2 clipping bound (> 0; ``math.inf`` disables clipping,
            for tests only — the sensitivity is then unbounded).
        noise_multiplier: σ (≥ 0); the noise standard deviation is ``2·C·σ`` per coordinate
            (``0`` for tests only: no privacy).
        secure_mode: draw each noise value as opacus' ``secure_mode`` does (the sum of four
            Gaussians of the same std, halved, after one discarded draw: robust to floating-point
            attacks on the Gaussian sampler, Holohan et al. 2021, arXiv 2107.10138), at 4× the cost.

    Example::

        sanitizer = GradientSanitizer(clip_bound=1.0, noise_multiplier=1.07)
        fake = generator(z, y)
        grad, loss = sanitizer.sample_gradient(lambda x: -critic(x, y).mean(), fake)
        fake.backward(grad)          # only the sanitised gradient reaches the generator
    """

    clip_bound: float
    noise_multiplier: float
    secure_mode: bool = False

    def __post_init__(self):
        c, s = float(self.clip_bound), float(self.noise_multiplier)
        if not c > 0:  # also rejects NaN
            raise ValueError(f"clip_bound must be > 0, got {self.clip_bound}")
        if not (s >= 0 and math.isfinite(s)):
            raise ValueError(f"noise_multiplier must be a finite number >= 0, got {self.noise_multiplier}")
        if math.isinf(c) and s > 0:
            raise ValueError("noise_multiplier > 0 needs a finite clip_bound (the noise scale is 2·C·σ)")
        object.__setattr__(self, "clip_bound", c)
        object.__setattr__(self, "noise_multiplier", s)

    @property
    def noise_std(self) -> float:
        """Standard deviation 2·C·σ of the noise added to each sample's (summed-loss) gradient."""
        return 0.0 if self.noise_multiplier == 0 else SANITIZER_SENSITIVITY * self.clip_bound * self.noise_multiplier

    def clip(self, per_sample_grad: torch.Tensor) -> torch.Tensor:
        """Rows of ``per_sample_grad`` ``[B, ...]`` scaled to L2 norm at most C (Eq. 6)."""
        if math.isinf(self.clip_bound):
            return per_sample_grad
        norms = per_sample_grad.flatten(1).norm(dim=1)
        factor = (self.clip_bound / (norms + 1e-12)).clamp(max=1.0)
        return per_sample_grad * factor.view(-1, *([1] * (per_sample_grad.dim() - 1)))

    def __call__(
        self, grad: torch.Tensor, *, reduction: str = "mean", generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Sanitise the gradient of a loss w.r.t. a batch of samples ``[B, ...]``.

        Args:
            grad: ∂L/∂x for the whole batch (row j belongs to sample j).
            reduction: how L was reduced over the batch: ``"mean"`` (row j is g_j / B; the result is
                ``(clip_C(g_j) + N(0, (2Cσ)²)) / B``) or ``"sum"`` (row j is g_j; the result is
                ``clip_C(g_j) + N(0, (2Cσ)²)``).
            generator: random generator of the noise: a mechanism generator
                (:func:`~lightning_gpate.privacy.randomness.mechanism_generator`); ``None`` uses
                torch's global one (tests only: ``seed_everything`` would make the noise public).

        Returns:
            The sanitised gradient, same shape as ``grad``.
        """
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        if grad.dim() < 1 or grad.shape[0] == 0:
            raise ValueError(f"expected a gradient of shape [B, ...] with B >= 1, got {tuple(grad.shape)}")
        scale = float(grad.shape[0]) if reduction == "mean" else 1.0
        out = self.clip(grad * scale)
        if self.noise_multiplier > 0:
            out = out + self.noise_std * self._standard_normal(grad, generator)
        return out / scale

    def skip_noise(self, like: torch.Tensor, *, generator: torch.Generator) -> None:
        """Draw, and discard, the noise that sanitising a gradient shaped like ``like`` draws from
        ``generator``. Under DDP with a fixed test seed (every rank's generator seeded alike) the
        processes that do not hold the step's discriminator keep their generator in step with the one
        that does, so that no two steps get the same noise and 2 processes train as 1; OS-seeded, each
        rank's generator is its own and this only advances it."""
        if self.noise_multiplier > 0:
            self._standard_normal(like, generator)

    def _standard_normal(self, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        def draw(shape):
            return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)

        if not self.secure_mode:
            return draw(like.shape)
        draw((1,))  # discarded, as opacus does
        return sum(draw(like.shape) for _ in range(4)) / 2.0

    def sample_gradient(
        self,
        loss_fn: Callable[[torch.Tensor], torch.Tensor],
        samples: torch.Tensor,
        *,
        reduction: str = "mean",
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sanitised gradient of ``loss_fn`` w.r.t. ``samples``, and the loss value.

        ``loss_fn`` (e.g. ``lambda x: -critic(x, y).mean()``) is evaluated on a detached copy of
        ``samples``, and differentiated with ``torch.autograd.grad`` w.r.t. that copy only: nothing
        else (no discriminator parameter) gets a gradient. Back-propagate the result into the
        generator with ``samples.backward(grad)``.

        Returns:
            ``(sanitised gradient [B, ...], detached loss)``.
        """
        leaf = samples.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn(leaf)
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
            (grad,) = torch.autograd.grad(loss, leaf)
        return self(grad, reduction=reduction, generator=generator), loss.detach()
