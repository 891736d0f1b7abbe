"""Differentially private data generators on PyTorch Lightning."""
