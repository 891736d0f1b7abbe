"""Callbacks reporting through the MLflow logger."""

from callbacks.artifacts import MLflowSaveConfig, ReleaseArtifact
from callbacks.image_quality import ImageQuality
from callbacks.privacy import PrivacyBudget
from callbacks.samples import SampleLogger
from callbacks.utility import DownstreamUtility

__all__ = ["DownstreamUtility", "ImageQuality", "MLflowSaveConfig", "PrivacyBudget", "ReleaseArtifact", "SampleLogger"]
