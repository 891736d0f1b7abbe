"""Privacy mechanisms' accounting: RDP curves, PATE analyses, GS-WGAN, DP metadata.

* :mod:`.rdp` – RDP curves (Gaussian, pure DP, exponential mechanism, subsampled Gaussian via
  dp-accounting) and RDP → (ε, δ) conversion.
* :mod:`.pate` – Confident-GNMax (Papernot et al. 2018) and PATE-GAN's Laplace
  vote moments (Papernot et al. 2017; Yoon et al. 2019).
* :mod:`.gswgan` – GS-WGAN's sound and per-sample (paper) accounting.
* :mod:`.dpgradagg`, :mod:`.topagg`, :mod:`.gaussagg` – G-PATE's and DataLens' private gradient
  aggregations, and the Gaussian sum of normalised directions.
* :mod:`.accountant` – privacy events and the :class:`PrivacyAccountant`.
* :mod:`.dp_stats` – DP label ratio and bounds for tabular metadata.
"""

from .accountant import (
    ConfidentGNMaxEvent,
    ExponentialMechanismEvent,
    GaussianSumEvent,
    GSWGANStepEvent,
    LaplaceVoteEvent,
    PrivacyAccountant,
    PureDPEvent,
    SubsampledGaussianEvent,
    TopAggEvent,
)
from .dp_stats import dp_bounds, dp_histogram_ratio, dp_quantile
from .gswgan import gswgan_epsilon, gswgan_rdp
from .pate import (
    confident_gnmax_rdp,
    gnmax_logq,
    laplace_vote_rdp,
    moments_to_epsilon,
    pate_laplace_moments,
    threshold_logq,
)
from .rdp import (
    DEFAULT_ORDERS,
    exponential_mechanism_rdp,
    gaussian_rdp,
    pure_dp_rdp,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)

__all__ = [
    "DEFAULT_ORDERS",
    "rdp_to_epsilon",
    "gaussian_rdp",
    "pure_dp_rdp",
    "exponential_mechanism_rdp",
    "subsampled_gaussian_rdp",
    "confident_gnmax_rdp",
    "gnmax_logq",
    "threshold_logq",
    "pate_laplace_moments",
    "moments_to_epsilon",
    "laplace_vote_rdp",
    "gswgan_epsilon",
    "gswgan_rdp",
    "ConfidentGNMaxEvent",
    "LaplaceVoteEvent",
    "SubsampledGaussianEvent",
    "TopAggEvent",
    "GaussianSumEvent",
    "GSWGANStepEvent",
    "PureDPEvent",
    "ExponentialMechanismEvent",
    "PrivacyAccountant",
    "dp_histogram_ratio",
    "dp_bounds",
    "dp_quantile",
]
