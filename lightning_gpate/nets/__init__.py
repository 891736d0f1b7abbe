"""Plain ``nn.Module`` networks: conditional generators, discriminators, teacher ensembles."""

from lightning_gpate.nets.discriminators import ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator
from lightning_gpate.nets.generators import ConditionalDCGANGenerator, ConditionalMLPGenerator, TabularActivation

__all__ = [
    "ConditionalDCGANDiscriminator", "ConditionalDCGANGenerator", "ConditionalMLPDiscriminator",
    "ConditionalMLPGenerator", "TabularActivation",
]
