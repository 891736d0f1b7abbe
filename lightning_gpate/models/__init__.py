"""One LightningModule per generator; importing this package registers them all with the CLI."""

from lightning_gpate.models.base import CheckpointError, GenerativeModel, load_generator
from lightning_gpate.models.gan import GAN

__all__ = ["CheckpointError", "GAN", "GenerativeModel", "load_generator"]
