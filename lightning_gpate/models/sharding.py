"""One model on several processes (Lightning DDP) when part of it is *sharded* and the rest *replicated*.

G-PATE's and PATE-GAN's teachers and GS-WGAN's discriminators are members of one stacked ensemble (leading member
axis), each trained only on its own partition of the data: under DDP, rank ``r`` of ``W`` holds and
trains members ``r, r+W, …`` (the DataModule's ``owned_teachers`` gives it exactly their batches). The
networks that learn from the privatised output (generator, student) are replicated: every rank computes
the same update from the same inputs, so they stay identical without DDP's bucketed reducer (which needs
every parameter to receive a gradient in every backward and would average rank-local members). G-PATE
uses the member rule and the shared seed here; its teachers live outside the module tree and keep
their own checkpoint gather.

What is here:

* :func:`owned_members` — the members of this rank;
* :func:`shared_seed` — a mechanism seed drawn from the OS on rank 0 and broadcast, so every rank draws
  the *same* noise (added once: the ranks apply one update, not W noisy ones);
* :func:`rank_zero_value` — a public value every rank must hold alike (a feature seed each drew from its own
  random state), rank 0's;
* :func:`local_backward` — ``manual_backward`` without DDP's reducer (rank-local networks);
* :func:`replicated_backward` — the same, then an explicit average of the
  replicated gradients (identical on every rank by construction; the average keeps the replicas equal
  where kernels are not bitwise deterministic);
* :func:`gather_members` / :func:`select_members` — a checkpoint holds every member in global order
  (gathered from all ranks when saved), and a rank loads only its own (sliced when restored), so a
  checkpoint is the same whatever the number of processes that wrote or reads it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_gpate.privacy.distributed import all_reduce_sum, is_distributed
from lightning_gpate.privacy.randomness import secret_seed

__all__ = ["rank_and_world", "owned_members", "shared_seed", "rank_zero_value", "local_backward", "replicated_backward",
           "gather_members", "select_members"]


def rank_and_world(module) -> tuple[int, int]:
    """``(global rank, world size)`` of a LightningModule's trainer, ``(0, 1)`` without one."""
    if getattr(module, "_trainer", None) is None:
        return 0, 1
    return module.trainer.global_rank, module.trainer.world_size


def owned_members(count: int, module) -> list[int]:
    """Global ids of the members this rank holds: ``r, r+W, …`` (all of them on one process), the
    same rule as the DataModule's ``owned_teachers``."""
    rank, world = rank_and_world(module)
    return list(range(rank, int(count), world))


def shared_seed(module, seed: int | None) -> int | None:
    """The seed of a mechanism generator that every rank seeds identically: ``seed`` (tests only) as
    it is; ``None`` on one process stays ``None`` (the generator seeds itself from the OS); ``None``
    under DDP is drawn from the OS on rank 0 and broadcast (never logged, never checkpointed)."""
    if seed is not None or not is_distributed():
        return seed
    return int(rank_zero_value(module, secret_seed()))


def rank_zero_value(module, value: Any) -> Any:
    """``value`` as rank 0 holds it (broadcast; on one process ``value`` itself): for a public value each rank resolved
    on its own (a seed drawn from its random state without ``seed_everything``) that every rank must use alike."""
    if not is_distributed():
        return value
    return module.trainer.strategy.broadcast(value, src=0)


def local_backward(module, loss: torch.Tensor, *args: Any) -> None:
    """``module.manual_backward(loss, *args)`` without DDP's reducer (``no_sync``): for rank-local
    networks (a rank's own members), and the first half of :func:`replicated_backward`."""
    wrapper = module.trainer.strategy.model if getattr(module, "_trainer", None) is not None else None
    with wrapper.no_sync() if isinstance(wrapper, DistributedDataParallel) else nullcontext():
        module.manual_backward(loss, *args)


def replicated_backward(module, loss: torch.Tensor, *args: Any, params: Iterable[torch.nn.Parameter]) -> None:
    """``module.manual_backward(loss, *args)`` for networks replicated on every rank, then the mean of
    ``params``' gradients over the ranks.

    DDP's reducer is bypassed (``no_sync``): it needs every registered parameter to receive a gradient
    in every backward (a student step does not touch the generator) and would all-reduce rank-local
    members. The gradients of replicated networks are equal on every rank (same inputs, same noisy
    labels or sanitised gradients), so their mean is the same gradient; taking it keeps the replicas
    identical even where a kernel is not bitwise deterministic.
    """
    local_backward(module, loss, *args)
    if not is_distributed():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    all_reduce_sum(grads)
    for g in grads:
        g /= dist.get_world_size()


def _member_keys(state: dict[str, Any], prefixes: Sequence[str]) -> list[str]:
    return [k for k in state if any(k.startswith(p) for p in prefixes)]


def gather_members(checkpoint: dict[str, Any], *, owned: Sequence[int], prefixes: Sequence[str],
                   optimizer_indices: Sequence[int] = ()) -> None:
    """In ``checkpoint`` (in place, on every rank: a collective), replace the state of the members this
    rank holds (``state_dict`` entries under ``prefixes``, every non-scalar state tensor of the
    optimizers ``optimizer_indices``, all with the member axis first) with that of every member, in
    global order. Nothing happens on one process."""
    if not is_distributed():
        return
    states = checkpoint["state_dict"]
    opts = checkpoint.get("optimizer_states") or []
    local = {
        "ids": torch.as_tensor(list(owned), dtype=torch.long),
        "params": {k: states[k].detach().cpu() for k in _member_keys(states, prefixes)},
        "opt": {i: {p: {n: v.cpu() for n, v in s.items() if torch.is_tensor(v) and v.ndim > 0}
                    for p, s in opts[i]["state"].items()} for i in optimizer_indices if i < len(opts)},
    }
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    order = torch.cat([p["ids"] for p in parts]).argsort()
    for key in local["params"]:
        states[key] = torch.cat([p["params"][key] for p in parts])[order]
    for i, per_param in local["opt"].items():
        for p, tensors in per_param.items():
            # a new dict: optimizer.state_dict()'s per-parameter dicts are the live optimizer's state
            opts[i]["state"][p] = {**opts[i]["state"][p], **{
                name: torch.cat([part["opt"][i][p][name] for part in parts])[order] for name in tensors}}


def select_members(checkpoint: dict[str, Any], *, owned: Sequence[int], prefixes: Sequence[str],
                   optimizer_indices: Sequence[int] = ()) -> None:
    """The inverse of :func:`gather_members`: keep, in ``checkpoint`` (in place), only the rows of the
    members ``owned`` (global ids) of every member tensor. A checkpoint whose member tensors already
    have ``len(owned)`` rows is left alone (one process owns every member)."""
    states = checkpoint["state_dict"]
    keys = _member_keys(states, prefixes)
    if not keys or states[keys[0]].shape[0] == len(owned):
        return
    index = torch.as_tensor(list(owned), dtype=torch.long)
    for key in keys:
        states[key] = states[key][index]
    opts = checkpoint.get("optimizer_states") or []
    for i in optimizer_indices:
        if i < len(opts):
            state = opts[i]["state"]
            for p, s in state.items():
                state[p] = {name: v[index.to(v.device)] if torch.is_tensor(v) and v.ndim > 0 else v for name, v in s.items()}
