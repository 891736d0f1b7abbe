"""Non-private conditional GAN: the baseline every private model is compared with."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from lightning_gpate.models.base import GenerativeModel
from lightning_gpate.models.options import DiscriminatorNet, GeneratorNet, flat_options
from lightning_gpate.nets.discriminators import ConditionalDCGANDiscriminator, ConditionalMLPDiscriminator

#: The networks (``generator``'s and ``discriminator``'s docs).
DEFAULT_GENERATOR = GeneratorNet(z_dim=100, latent_prior="normal", gf_dim=64, fc_dim=1024, upsample="transposed", hidden=(256, 256),
                                 ema_decay=0.0)
DEFAULT_DISCRIMINATOR = DiscriminatorNet(df_dim=64, fc_dim=1024, hidden=(256, 256))


class GAN(GenerativeModel):
    """Conditional GAN (non-saturating BCE losses), DCGAN nets for images, MLP nets for tables.

    No privacy: use it as the utility ceiling of a private run on the same data.

    Args:
        data_spec: the DataModule's spec.
        generator: the generator network (a mapping of its options overrides some). z 100 from N(0, I); images a
            DCGAN of gf_dim 64 and fc_dim 1,024; tables an MLP of (256, 256); ema_decay 0: no weight average.
        discriminator: the discriminator network (a mapping of its options overrides some). Images a DCGAN
            discriminator of df_dim 64 and fc_dim 1,024; tables an MLP of (256, 256).
        lr: Adam's learning rate of both networks.
        betas: Adam's betas.
        d_steps: discriminator steps per generator step.
    """

    ddp_needs_find_unused_parameters = True  # the discriminator step does not use the generator
    FLAT_OPTIONS = flat_options("discriminator", generator_hidden="hidden", against_hidden="hidden")  # one hidden: both MLPs

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        generator: GeneratorNet = DEFAULT_GENERATOR,
        discriminator: DiscriminatorNet = DEFAULT_DISCRIMINATOR,
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        d_steps: int = 1,
    ) -> None:
        net_options = GeneratorNet.of(generator, DEFAULT_GENERATOR, name="generator")
        discriminator_options = DiscriminatorNet.of(discriminator, DEFAULT_DISCRIMINATOR, name="discriminator")
        super().__init__(data_spec, z_dim=net_options.z_dim, latent_prior=net_options.latent_prior)
        self.save_hyperparameters()
        self.store_option_groups(generator=net_options, discriminator=discriminator_options)
        self.automatic_optimization = False
        self.generator_options = net_options
        self.generator = self.build_generator(net_options)
        if self.is_image:
            self.discriminator = ConditionalDCGANDiscriminator(in_shape=data_spec["shape"], num_classes=self.num_classes,
                                                               df_dim=discriminator_options.df_dim, fc_dim=discriminator_options.fc_dim)
        else:
            self.discriminator = ConditionalMLPDiscriminator(in_features=data_spec["shape"][0], num_classes=self.num_classes,
                                                             hidden=discriminator_options.hidden)
        if net_options.averaged:  # what samples (generator_module)
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False)

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
        if self.generator_options.averaged:
            self.update_generator_average(self.generator_options.ema_decay)
        self.log_dict({"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}, prog_bar=True)
