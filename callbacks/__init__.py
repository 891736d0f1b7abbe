"""Callbacks reporting through the MLflow logger."""

from callbacks.artifacts import MLflowSaveConfig, ReleaseArtifact
from callbacks.image_quality import ImageQuality
from callbacks.privacy import PrivacyBudget
from callbacks.progress import StepProgress
from callbacks.samples import SampleLogger
from callbacks.summary import FitSummary
from callbacks.utility import DownstreamUtility

__all__ = ["DownstreamUtility", "FitSummary", "ImageQuality", "MLflowSaveConfig", "PrivacyBudget", "ReleaseArtifact", "SampleLogger", "StepProgress"]
