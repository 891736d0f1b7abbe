"""One LightningModule per generator; importing this package registers them all with the CLI."""

from lightning_gpate.models.base import CheckpointError, GenerativeModel, load_generator
from lightning_gpate.models.dpgan import DPGAN
from lightning_gpate.models.dpmerf import DPMERF
from lightning_gpate.models.gan import GAN
from lightning_gpate.models.gpate import GPATE
from lightning_gpate.models.gswgan import GSWGAN
from lightning_gpate.models.marginal import MarginalTree
from lightning_gpate.models.pategan import PATEGAN

__all__ = ["CheckpointError", "DPGAN", "DPMERF", "GAN", "GPATE", "GSWGAN", "GenerativeModel", "MarginalTree", "PATEGAN", "load_generator"]
