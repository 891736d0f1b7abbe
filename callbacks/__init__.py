"""Callbacks reporting through the MLflow logger."""

from callbacks.artifacts import FinalCheckpoint, MLflowSaveConfig
from callbacks.privacy import PrivacyBudget
from callbacks.samples import SampleLogger

__all__ = ["FinalCheckpoint", "MLflowSaveConfig", "PrivacyBudget", "SampleLogger"]
