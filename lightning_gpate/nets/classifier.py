"""A small CNN image classifier: the evaluation network of synthetic images.

Used twice in evaluation: trained on the real training split it is the *feature network* of the
Inception Score and FID for MNIST-like data (as G-PATE and GS-WGAN do: IS from its softmax, FID from
its penultimate features); trained on labelled synthetic images it measures their downstream utility
(G-PATE Sec. 5, "CNN accuracy").
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class ConvClassifier(nn.Module):
    """conv3x3 → ReLU → maxpool2 blocks (32, 64, 128, 128 channels) until the maps are at most 8 wide
    (at least two blocks), then fc(``feature_dim``) → ReLU → dropout → fc(``num_classes``).

    Args:
        in_shape: ``(C, H, W)`` of the images (in [-1, 1]).
        num_classes: output classes.
        feature_dim: width of the penultimate layer (the FID features).
        dropout: dropout before the last layer.
    """

    CHANNELS = (32, 64, 128, 128)

    def __init__(self, *, in_shape: Sequence[int], num_classes: int, feature_dim: int = 128, dropout: float = 0.25) -> None:
        super().__init__()
        c, h, w = (int(v) for v in in_shape)
        layers: list[nn.Module] = []
        size, blocks = min(h, w), 0
        while blocks < 2 or (size > 8 and blocks < len(self.CHANNELS)):
            layers += [nn.Conv2d(c, self.CHANNELS[blocks], 3, padding=1), nn.ReLU(inplace=True)]
            c = self.CHANNELS[blocks]
            if size >= 2:
                layers.append(nn.MaxPool2d(2))
                h, w, size = h // 2, w // 2, size // 2
            blocks += 1
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(c * h * w, feature_dim), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(feature_dim, num_classes))
        self.feature_dim, self.num_classes = feature_dim, num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate activations ``[n, feature_dim]``."""
        return self.fc(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``[n, num_classes]``."""
        return self.head(self.features(x))
