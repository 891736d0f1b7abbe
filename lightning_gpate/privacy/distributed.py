"""Mechanisms whose input is summed over processes (DDP): noise added exactly once.

Under data parallelism each process holds a share of the private input (its shard of a Poisson
batch, its teachers' votes); the mechanism's sensitivity is that of the *global* sum, so the noise
must be added once to that sum with the full scale, never once per process (W draws would be √W
times the noise the analysis counts; a per-process share σ/√W would need every process honest and
its draw secret from the others). The pattern (opacus' ``DistributedDPOptimizer``): the process of
rank 0 draws the noise from its secret mechanism generator
(:mod:`lightning_gpate.privacy.randomness`) and adds it to its own share, then a ``SUM`` all-reduce
gives every process the same noisy sum. On one process this is exactly the single-process mechanism:
the same draws in the same order from the same generator.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _generate_noise

__all__ = ["is_distributed", "rank", "all_reduce_sum", "sum_with_noise_once", "broadcast_from_rank_zero", "DPSumOptimizer"]


def is_distributed() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def all_reduce_sum(tensors: Sequence[torch.Tensor]) -> None:
    """Sum ``tensors`` over processes in place, as one flat collective."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def sum_with_noise_once(tensors: Sequence[torch.Tensor], add_noise: Callable[[], None]) -> None:
    """Turn every process's share ``tensors`` into the noisy global sum, in place, on every process.

    Args:
        tensors: this process's share of the sum (e.g. its clipped per-sample gradients, summed).
        add_noise: adds the mechanism's noise (full scale) to ``tensors`` in place; called on rank 0
            only (on one process: called, and nothing else happens).
    """
    if rank() == 0:
        add_noise()
    if is_distributed():
        all_reduce_sum(tensors)


@torch.no_grad()
def broadcast_from_rank_zero(tensors: Sequence[torch.Tensor]) -> None:
    """Give every process rank 0's values of ``tensors`` (e.g. the weights of a network DDP ignores)."""
    if is_distributed():
        for t in tensors:
            dist.broadcast(t, src=0)


class DPSumOptimizer(DPOptimizer):
    """Opacus' ``DPOptimizer`` (DP-SGD, Abadi et al. 2016, Alg. 1: clip each per-sample gradient to C,
    sum, add N(0, σ²C²I), divide by the expected batch size) over a Poisson batch sharded across
    processes: each process clips and sums its own rows, rank 0 adds the noise once, and the sum is
    all-reduced before the division, so every process applies ``(Σ_i clip_C(g_i) + N(0, σ²C²I)) / B``
    over the whole batch. ``expected_batch_size`` B is the global one. On one process it is
    ``DPOptimizer`` itself (the same noise draws from the same generator)."""

    def add_noise(self) -> None:
        if not is_distributed():
            return super().add_noise()
        for p in self.params:
            p.grad = p.summed_grad.view_as(p).clone()
        sum_with_noise_once([p.grad for p in self.params], self._add_noise_to_grads)

    def _add_noise_to_grads(self) -> None:
        """What ``DPOptimizer.add_noise`` draws (per parameter, in order, from the same generator)."""
        for p in self.params:
            noise = _generate_noise(std=self.noise_multiplier * self.max_grad_norm, reference=p.summed_grad,
                                    generator=self.generator, secure_mode=self.secure_mode)
            p.grad += noise.view_as(p)
