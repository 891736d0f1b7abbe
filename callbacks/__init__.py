"""Callbacks reporting through the MLflow logger."""

from callbacks.artifacts import FinalCheckpoint, MLflowSaveConfig
from callbacks.image_quality import ImageQuality
from callbacks.privacy import PrivacyBudget
from callbacks.samples import SampleLogger
from callbacks.summary import FitSummary
from callbacks.utility import DownstreamUtility

__all__ = ["DownstreamUtility", "FinalCheckpoint", "FitSummary", "ImageQuality", "MLflowSaveConfig", "PrivacyBudget", "SampleLogger"]
