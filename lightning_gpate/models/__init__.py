"""One LightningModule per generator; importing this package registers them all with the CLI."""

from lightning_gpate.models.base import CheckpointError, GenerativeModel, load_generator
from lightning_gpate.models.gan import GAN
from lightning_gpate.models.gpate import GPATE

__all__ = ["CheckpointError", "GAN", "GPATE", "GenerativeModel", "load_generator"]
