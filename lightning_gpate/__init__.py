"""Differentially private data generators on PyTorch Lightning."""

from lightning_gpate.api import Synthesizer

__all__ = ["Synthesizer"]
