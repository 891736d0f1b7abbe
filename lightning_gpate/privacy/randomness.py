"""The randomness of privacy mechanisms: secret, OS-seeded, never the public seed.

``seed_everything`` governs initialisation, data splits and evaluation; it is logged and therefore
public. A mechanism whose noise (or Poisson sampling, subsampling choice, projection) followed it would
let anyone who reads the run replay the noise and subtract it. Every mechanism therefore draws from a
generator made here: seeded from the operating system's entropy at each start, never logged and never
checkpointed. A fixed ``seed`` exists for tests only.
"""

from __future__ import annotations

import hashlib
import secrets

import torch

__all__ = ["secret_seed", "mechanism_generator", "derived_seed"]


def secret_seed() -> int:
    """A fresh 63-bit seed from the OS's cryptographic entropy source (``secrets``)."""
    return secrets.randbits(63)


def mechanism_generator(device: torch.device | str = "cpu", seed: int | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` for a privacy mechanism's randomness.

    Args:
        device: where the mechanism draws its noise.
        seed: ``None`` (default) seeds from the OS (:func:`secret_seed`); an integer makes the noise
            reproducible by anyone who knows it: for tests only. Under DDP, draw the seed with
            :func:`secret_seed` on rank 0, broadcast it, and pass it here on every rank.
    """
    return torch.Generator(device=device).manual_seed(secret_seed() if seed is None else int(seed))


def derived_seed(seed: int | None, purpose: str) -> int | None:
    """A fixed test seed turned into an independent one per ``purpose`` (e.g. the noise and the
    sampling of one mechanism); ``None`` stays ``None`` (each generator then seeds from the OS)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{int(seed)}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
