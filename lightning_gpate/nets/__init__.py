"""Plain ``nn.Module`` networks: conditional generators, discriminators, teacher ensembles."""

from lightning_gpate.nets.discriminators import (
    ConditionalConvDiscriminator, ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator,
)
from lightning_gpate.nets.generators import (
    ConditionalConvGenerator, ConditionalDCGANGenerator, ConditionalMLPGenerator, TabularActivation,
)

__all__ = [
    "ConditionalConvDiscriminator", "ConditionalConvGenerator", "ConditionalDCGANDiscriminator", "ConditionalDCGANGenerator", "ConditionalMLPDiscriminator",
    "ConditionalMLPGenerator", "TabularActivation",
]
