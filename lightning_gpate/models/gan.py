"""Non-private conditional GAN: the baseline every private model is compared with."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from lightning_gpate.models.base import GenerativeModel
from lightning_gpate.nets.discriminators import ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator


class GAN(GenerativeModel):
    """Conditional GAN (non-saturating BCE losses), DCGAN nets for images, MLP nets for tables.

    No privacy: use it as the utility ceiling of a private run on the same data.

    Args:
        data_spec: the DataModule's spec.
        z_dim: latent size.
        latent_prior: ``"normal"`` or ``"uniform"``.
        lr: Adam learning rate of both networks.
        betas: Adam betas.
        d_steps: discriminator steps per generator step.
        hidden: hidden widths of the tabular MLPs.
        gf_dim: DCGAN generator width; df_dim: DCGAN discriminator width; fc_dim: dense width of both.
    """

    ddp_needs_find_unused_parameters = True  # the discriminator step does not use the generator

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        z_dim: int = 100,
        latent_prior: str = "normal",
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        d_steps: int = 1,
        hidden: tuple[int, ...] = (256, 256),
        gf_dim: int = 64,
        df_dim: int = 64,
        fc_dim: int = 1024,
    ) -> None:
        super().__init__(data_spec, z_dim=z_dim, latent_prior=latent_prior)
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = self.build_generator(hidden=hidden, gf_dim=gf_dim, fc_dim=fc_dim)
        if self.is_image:
            self.discriminator = ConditionalDCGANDiscriminator(in_shape=data_spec["shape"], num_classes=self.num_classes, df_dim=df_dim, fc_dim=fc_dim)
        else:
            self.discriminator = ConditionalMLPDiscriminator(in_features=data_spec["shape"][0], num_classes=self.num_classes, hidden=hidden)

    def configure_optimizers(self):
        hp = self.hparams
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=hp.lr, betas=tuple(hp.betas))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=hp.lr, betas=tuple(hp.betas))
        return opt_g, opt_d

    def training_step(self, batch, batch_idx):
        real_x, real_y = batch
        opt_g, opt_d = self.optimizers()
        n = real_x.shape[0]
        ones, zeros = torch.ones(n, device=self.device), torch.zeros(n, device=self.device)

        fake_y = self.sample_labels(n)
        fake_x = self.generator(self.latent(n), fake_y)
        for _ in range(self.hparams.d_steps):
            d_loss = F.binary_cross_entropy_with_logits(self.discriminator(real_x, real_y), ones) + \
                F.binary_cross_entropy_with_logits(self.discriminator(fake_x.detach(), fake_y), zeros)
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            self.step_uncounted(opt_d)

        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake_x, fake_y), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log_dict({"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}, prog_bar=True)
