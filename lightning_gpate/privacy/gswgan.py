"""Privacy accounting of GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020).

Each generator step picks one of N_D discriminators uniformly (a subsample of
size 1 out of N_D, without replacement) and sanitises the gradient flowing into
each of the B generated samples (clip C, noise N(0, (2Cσ)²) per sample,
summed/averaged).

Neighbouring relation. The ε refers to adding or removing one *record*. The
DataModule assigns each record to a discriminator by a keyed hash of its
content, so adding or removing one changes the data of exactly one
discriminator and leaves N_D unchanged: at the level of discriminators that is
replace-one, which is the relation the subsampled-without-replacement bound
below is computed under (Wang, Balle & Kasiviswanathan 2019, Theorem 27).

Two analyses (see ``REFERENCE.md``):

* ``"sound"`` – all B samples of a step share one discriminator draw, so one
  step is ONE subsampled Gaussian. Stacking the B sanitised gradients, the
  L2 sensitivity is 2C·√B (each clipped gradient may change by 2C) against
  independent noise of std 2Cσ per coordinate: a noise multiplier of σ/√B,
  hence T events
  ``SampledWithoutReplacementDpEvent(N_D, 1, GaussianDpEvent(σ/√B))``.
  This is a guarantee.
* ``"paper"`` – the official code's composition: T·B events
  ``SampledWithoutReplacementDpEvent(N_D, 1, GaussianDpEvent(σ))``, as if
  each sample drew its own discriminator. This is NOT a guarantee for the
  official training loop (ε ≈ 9.2 vs ≈ 3·10⁵ sound for the MNIST defaults).

Both use dp-accounting's ``RdpAccountant(neighboring_relation=REPLACE_ONE)``
(Wang, Balle & Kasiviswanathan 2019, Theorem 27) and its improved conversion.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from .rdp import _cached_single_step_rdp, validate_orders

__all__ = ["gswgan_epsilon", "gswgan_rdp", "GSWGAN_ACCOUNTINGS"]

Accounting = Literal["sound", "paper"]
GSWGAN_ACCOUNTINGS = ("sound", "paper")


def _validate(noise_multiplier, num_discriminators, batch_size, steps, accounting):
    sigma = float(noise_multiplier)
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
    if int(num_discriminators) != num_discriminators or num_discriminators < 1:
        raise ValueError(f"num_discriminators must be a positive integer, got {num_discriminators}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps}")
    if accounting not in GSWGAN_ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {GSWGAN_ACCOUNTINGS}, got {accounting!r}")
    return sigma, int(num_discriminators), int(batch_size), int(steps)


def _event_sigma_and_count(sigma: float, batch_size: int, steps: int, accounting: str):
    if accounting == "sound":
        return sigma / math.sqrt(batch_size), steps
    return sigma, steps * batch_size


def gswgan_rdp(
    *,
    noise_multiplier: float,
    num_discriminators: int,
    batch_size: int,
    steps: int,
    orders,
    accounting: Accounting = "sound",
) -> np.ndarray:
    """RDP curve on ``orders`` of ``steps`` GS-WGAN generator steps.

    The one-event curve comes from a dp-accounting ``RdpAccountant`` built on
    ``orders`` (``REPLACE_ONE``) composed with
    ``SampledWithoutReplacementDpEvent(N_D, 1, GaussianDpEvent(·))``, cached,
    and multiplied by the number of events (T for ``"sound"``, T·B for
    ``"paper"``), which is what dp-accounting does for a self-composed event.

    Args:
        noise_multiplier: σ of the gradient sanitiser (noise std / (2C)).
        num_discriminators: N_D (sampling rate 1/N_D).
        batch_size: B, generated samples per step.
        steps: Number of generator steps T.
        orders: Rényi orders (> 1).
        accounting: ``"sound"`` (guarantee) or ``"paper"`` (per-sample
            composition of the official code, not a guarantee).

    Returns:
        RDP per order, shape of ``orders``.
    """
    sigma, n_d, b, t = _validate(noise_multiplier, num_discriminators, batch_size, steps, accounting)
    orders = validate_orders(orders)
    if t == 0:
        return np.zeros_like(orders)
    event_sigma, count = _event_sigma_and_count(sigma, b, t, accounting)
    one = _cached_single_step_rdp(
        event_sigma, 1.0 / n_d, "without_replacement", tuple(orders.tolist()), n_d, 1
    )
    return count * one


def gswgan_epsilon(
    *,
    noise_multiplier: float,
    num_discriminators: int,
    batch_size: int,
    steps: int,
    delta: float,
    accounting: Accounting = "sound",
) -> float:
    """ε of GS-WGAN after ``steps`` generator steps, via dp-accounting.

    Chen et al. (2020), Section 4 / Theorem 1 (subsampled Gaussian over the
    choice of discriminator), accounted with dp-accounting's
    ``RdpAccountant(neighboring_relation=REPLACE_ONE)`` on its default order
    grid (``dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS``:
    1.1, 1.2, …, 10.9, 11, …, 63, 128, 256, 512, 1024) and the accountant's
    own ``get_epsilon`` (improved conversion). On the reference grid
    1.1, 2, …, 199 the same values are obtained for the REFERENCE.md settings,
    but the default grid is ~10× cheaper to evaluate (dp-accounting's
    without-replacement bound is O(λ²) per integer order).

    ``accounting="sound"`` composes T events with noise multiplier σ/√B (all B
    samples share one discriminator draw) — a guarantee. ``"paper"`` composes
    T·B events with noise σ, as the official GS-WGAN code does — NOT a
    guarantee for the official training loop.

    Args:
        noise_multiplier: σ.
        num_discriminators: N_D.
        batch_size: B.
        steps: T.
        delta: δ in (0, 1).
        accounting: ``"sound"`` or ``"paper"``.

    Returns:
        ε (float).
    """
    import dp_accounting

    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta}")
    sigma, n_d, b, t = _validate(noise_multiplier, num_discriminators, batch_size, steps, accounting)
    event_sigma, count = _event_sigma_and_count(sigma, b, t, accounting)
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    if count:
        acc.compose(
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.SampledWithoutReplacementDpEvent(
                    n_d, 1, dp_accounting.GaussianDpEvent(event_sigma)
                ),
                count,
            )
        )
    return float(acc.get_epsilon(delta))
