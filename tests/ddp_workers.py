"""Functions run in processes that tests start themselves (``torch.multiprocessing.spawn``): kept in a
module that imports little, since every process imports it again."""

from __future__ import annotations

import os

import torch


def noise_of_one_dpgan_step(rank: int, world: int, port: int, out: str, sigma: float, clip: float, batch: float) -> None:
    """A DP-GAN critic step on an empty shard (noise only) on ``world`` gloo processes, each with its own
    OS-seeded mechanism generator (as without noise_seed); writes the gradient x the expected batch."""
    from opacus import GradSampleModule

    from lightning_gpate.nets.discriminators import ConditionalMLPDiscriminator
    from lightning_gpate.privacy.distributed import DPSumOptimizer
    from lightning_gpate.privacy.randomness import mechanism_generator

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    critic = GradSampleModule(ConditionalMLPDiscriminator(in_features=64, num_classes=10, hidden=(64, 64), norm="none"),
                              batch_first=True, loss_reduction="sum")
    opt = DPSumOptimizer(torch.optim.RMSprop(critic.parameters(), lr=1e-3), noise_multiplier=sigma, max_grad_norm=clip,
                         expected_batch_size=batch, loss_reduction="mean", generator=mechanism_generator("cpu"))
    opt.zero_grad()
    for p in critic.parameters():
        p.grad_sample = p.new_zeros(0, *p.shape)  # this process's shard of the Poisson batch is empty
    assert opt.pre_step()
    torch.save(torch.cat([p.grad.reshape(-1) for p in critic.parameters()]) * batch, f"{out}/{rank}.pt")
    torch.distributed.destroy_process_group()
