"""Functions run in processes that tests start themselves (``torch.multiprocessing.start_processes``, forked): kept
in a module that imports little, should a start method import it again."""

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


class _RecordingSanitizer:
    """A GS-WGAN sanitiser that also keeps the noise it adds: the sanitised gradient less the clipped one."""

    def __init__(self, inner) -> None:
        self.inner, self.noise = inner, []

    def sample_gradient(self, loss_fn, samples, *, reduction="mean", generator=None):
        leaf = samples.detach().requires_grad_(True)
        (raw,) = torch.autograd.grad(loss_fn(leaf), leaf)
        out, loss = self.inner.sample_gradient(loss_fn, samples, reduction=reduction, generator=generator)
        b = raw.shape[0]  # a mean loss: row j is g_j / B, and the result (clip(g_j) + noise) / B
        self.noise.append((out * b - self.inner.clip(raw * b)).detach())
        return out, loss

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _next_draws(generator: torch.Generator) -> torch.Tensor:
    """What ``generator`` draws next, from a copy (the generator itself does not move)."""
    return torch.randn(16, generator=torch.Generator(generator.device).set_state(generator.get_state()))


def mechanism_noise_of_ranks(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """Private models on ``world`` gloo processes (Lightning's DDP, launched here as a cluster would),
    without ``noise_seed``; writes to ``out/<rank>.pt``:

    * ``gswgan``: ``steps`` private GS-WGAN steps. Before each one every rank draws, from a copy of its
      own noise generator, the noise it would add (its best replay of the owner's): ``"drawn"``, a list of
      ``(k, noise)``; the owner also keeps the noise it added (``"added"``).
    * ``gpate``, ``pategan``: after one step, the next draws of the vote noise's generator.
    * ``warm_start``: a PATE-GAN with a warm start built from each rank's own public random state (as in fresh
      interpreters without ``seed_everything``), after one step: its ``feature_seed``, frequencies and release.
    """
    import warnings

    import pytorch_lightning as pl

    import small_models

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)

    def fit(model, dm, steps, callbacks=()):
        trainer = pl.Trainer(accelerator="cpu", devices=world, num_nodes=1, strategy="ddp", max_steps=steps, logger=False,
                             callbacks=list(callbacks), enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="GS-WGAN trains without pretrained discriminators")
            trainer.fit(model, dm)

    model, dm = small_models.build("gswgan", stage="train")
    model.sanitizer = recording = _RecordingSanitizer(model.sanitizer)
    drawn = []

    class Replay(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            like = torch.zeros(pl_module.hparams.generator_batch_size, *pl_module.data_spec["shape"])  # the fakes' shape
            copy = torch.Generator().set_state(pl_module.noise_generator().get_state())
            drawn.append((int(batch[0]), recording.inner(like, reduction="sum", generator=copy)))  # clip(0) + noise

    fit(model, dm, steps, [Replay()])
    result = {"gswgan": {"drawn": drawn, "added": recording.noise}}
    gpate, dm = small_models.build("gpate")
    fit(gpate, dm, 1)
    pategan, dm = small_models.build("pategan")
    fit(pategan, dm, 1)
    result.update(gpate=_next_draws(gpate._shared_gen), pategan=_next_draws(pategan.noise_generator()))
    torch.seed()  # this rank's own public random state (forked ranks share the parent's)
    warm, dm = small_models.build("pategan", warm_start={"source": "features", "fraction": 0.3, "features": 200, "steps": 2,
                                                         "batch_size": 20})
    fit(warm, dm, 1)
    release = warm.warm_release
    result["warm_start"] = {"feature_seed": warm.hparams["warm_start"]["feature_seed"], "length_scale": release.options.length_scale,
                            "frequencies": release.frequencies, "released": release.released}
    torch.save(result, f"{out}/{rank}.pt")


def data_spec_of_ranks(rank: int, world: int, port: int, out: str, options: dict) -> None:
    """On ``world`` gloo processes, each builds ``TabularDataModule(frame=small_models.public_frame(), **options)`` and
    sets it up for a fit; writes its numeric columns' bins and its metadata cost, or the one-line error, to
    ``out/<rank>.pt``."""
    import small_models
    from datamodules import DataError, TabularDataModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    dm = TabularDataModule(frame=small_models.public_frame(), **options)
    try:
        dm.setup("fit")
        result = {"edges": {c["name"]: c["edges"] for c in dm.spec["columns"]}, "metadata_cost": dm.spec["metadata_cost"]}
    except DataError as err:
        result = {"error": str(err)}
    torch.save(result, f"{out}/{rank}.pt")
    torch.distributed.destroy_process_group()
