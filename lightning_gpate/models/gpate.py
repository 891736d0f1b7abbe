"""G-PATE (Long et al., NeurIPS 2021): a student generator trained by an ensemble of teacher
discriminators through private gradient aggregation (DPGradAgg with Confident-GNMax)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from lightning_gpate.models.private import PrivateGenerativeModel
from lightning_gpate.nets.ensemble import ConvTeacherEnsemble, MLPTeacherEnsemble, TeacherEnsemble
from lightning_gpate.privacy import ConfidentGNMaxEvent
from lightning_gpate.privacy.dpgradagg import aggregate, project, random_projection, vote_histograms
from lightning_gpate.privacy.randomness import mechanism_generator, secret_seed

TEACHERS_KEY = "gpate_teachers"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class GPATE(PrivateGenerativeModel):
    """G-PATE: Algorithm 1 (training) with Algorithm 2 (DPGradAgg) of Long et al. (2021).

    Per iteration: fakes ``x = G(z, y)`` with ``z ~ U(-1, 1)`` shared by all teachers; every teacher
    takes one Adam step on its BCE loss (its own real batch from its own partition vs the fakes) with
    **its own** Adam moments; each teacher's descent direction on every fake is projected with a fresh
    Gaussian matrix per sample, clipped, discretised into bins and voted; each (sample, dimension) is
    one Confident-GNMax query; the answered bin centres are back-projected into ``Δx``; the generator
    takes an MSE step towards ``x̂ = x + Δx``.

    Privacy: the budget check uses the worst case (every query answered) *before* the aggregation
    runs, so a step is only run when it fits whatever the noisy threshold decides; the recorded event
    is the actual one. The guarantee is the data-independent Confident-GNMax bound; the data-dependent
    ε of the paper is logged as ``epsilon_data_dependent`` (not itself private).

    Teachers are held outside the module tree (they are never averaged by DDP); under DDP rank r owns
    teachers r, r+W, …, votes are summed with an all-reduce, and the projection and noise come from a
    generator seeded identically on every rank, so every rank applies the same generator update.

    Args:
        data_spec: the DataModule's spec (``num_teachers`` > 0: set ``data.num_teachers``).
        epsilon: privacy budget ε.
        delta: δ.
        budget_accounting: ``"guarantee"`` (data-independent, default) or ``"paper"`` (data-dependent,
            not a guarantee).
        conversion: RDP → (ε, δ) conversion.
        z_dim: latent size; the prior is U(-1, 1) as in the paper.
        fake_batch_size: fakes per iteration ``m`` (``m · projection_dim`` queries per iteration).
        projection_dim: ``k``, the random projection's dimension.
        clip: ``c``, the clipping bound of projected gradients.
        num_bins: ``B``, bins over ``[-c, c]``.
        threshold_fraction: ``T`` as a fraction of the number of teachers.
        sigma_threshold: σ1 of the threshold check.
        sigma_gnmax: σ2 of the noisy argmax.
        teacher_lr: teachers' Adam learning rate; teacher_betas: their betas.
        teacher_hidden: hidden widths of tabular (MLP) teachers.
        teacher_channels: conv widths ``(c0, c1)`` of image teachers (default: as the paper).
        teacher_fc: dense width of image teachers.
        teacher_chunk_size: teachers processed at once (bounds memory; ``None``: all).
        teacher_seed: seed of the teachers' initialisation (per global teacher id).
        generator_lr: generator's Adam learning rate; generator_betas: its betas.
        target_scale: ``x̂ = x + target_scale · Δx`` (1 in the paper; any value is post-processing).
        generator_steps: generator steps per aggregation towards the same ``x̂`` (post-processing).
        gf_dim, fc_dim: DCGAN generator widths; hidden: MLP generator widths.
        noise_seed: seed of the projection and aggregation noise. ``None`` (default) draws a secret
            seed from the OS at every start; a fixed seed makes the noise reproducible by anyone who
            knows it — for tests only.
        log_private_diagnostics: also log the teachers' loss (a function of the private data without
            noise) as ``private/teacher_loss``; debugging only.
    """

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float = 1.0,
        delta: float = 1e-5,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        z_dim: int = 100,
        fake_batch_size: int = 32,
        projection_dim: int = 10,
        clip: float = 1e-4,
        num_bins: int = 10,
        threshold_fraction: float = 0.5,
        sigma_threshold: float = 3000.0,
        sigma_gnmax: float = 1000.0,
        teacher_lr: float = 1e-3,
        teacher_betas: tuple[float, float] = (0.5, 0.999),
        teacher_hidden: Sequence[int] = (64,),
        teacher_channels: Sequence[int] | None = None,
        teacher_fc: int = 256,
        teacher_chunk_size: int | None = None,
        teacher_seed: int = 0,
        generator_lr: float = 1e-3,
        generator_betas: tuple[float, float] = (0.5, 0.999),
        target_scale: float = 1.0,
        generator_steps: int = 1,
        gf_dim: int = 64,
        fc_dim: int = 1024,
        hidden: Sequence[int] = (256, 256),
        noise_seed: int | None = None,
        log_private_diagnostics: bool = False,
    ) -> None:
        super().__init__(
            data_spec, epsilon=epsilon, delta=delta, budget_accounting=budget_accounting,
            conversion=conversion, z_dim=z_dim, latent_prior="uniform", log_private_diagnostics=log_private_diagnostics,
        )
        self.num_teachers = int(data_spec.get("num_teachers", 0))
        if self.num_teachers < 1:
            raise ValueError("G-PATE needs teachers: set data.num_teachers (e.g. 2000) in the data config")
        for name, value in (("fake_batch_size", fake_batch_size), ("projection_dim", projection_dim), ("num_bins", num_bins),
                            ("generator_steps", generator_steps)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if clip <= 0 or sigma_threshold < 0 or sigma_gnmax < 0:
            raise ValueError("clip must be > 0 and the noise scales >= 0")
        if not 0 <= threshold_fraction <= 1:
            raise ValueError(f"threshold_fraction must be in [0, 1], got {threshold_fraction}")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = self.build_generator(hidden=tuple(hidden), gf_dim=gf_dim, fc_dim=fc_dim)
        self.threshold = threshold_fraction * self.num_teachers
        # Teachers are deliberately NOT registered submodules (object.__setattr__ below): DDP must never
        # average them across ranks, and a released generator checkpoint must not depend on them.
        object.__setattr__(self, "_teachers", None)
        self._teacher_opt: torch.optim.Optimizer | None = None
        self._pending_teacher_state: dict | None = None
        self._shared_gen: torch.Generator | None = None

    # ----------------------------------------------------------------- teachers
    def owned_teacher_ids(self) -> list[int]:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
        return list(range(rank, self.num_teachers, world))

    def _build_teachers(self, teacher_ids: Sequence[int]) -> TeacherEnsemble:
        hp = self.hparams
        if self.is_image:
            return ConvTeacherEnsemble(
                teacher_ids=teacher_ids, in_shape=self.data_spec["shape"], num_classes=self.num_classes,
                channels=hp.teacher_channels, fc=hp.teacher_fc, seed=hp.teacher_seed,
            )
        return MLPTeacherEnsemble(
            teacher_ids=teacher_ids, in_features=self.data_spec["shape"][0], num_classes=self.num_classes,
            hidden=tuple(hp.teacher_hidden), seed=hp.teacher_seed,
        )

    @property
    def teachers(self) -> TeacherEnsemble:
        """This process's teachers (built on first use, on the module's current device)."""
        if self._teachers is None:
            self._build_owned_teachers()
        return self._teachers

    def on_fit_start(self) -> None:
        self._build_owned_teachers()  # after the strategy placed the model and restored a checkpoint

    def _build_owned_teachers(self) -> None:
        if self._teachers is not None:
            return
        hp = self.hparams
        object.__setattr__(self, "_teachers", self._build_teachers(self.owned_teacher_ids()).to(self.device))
        # One Adam over the stacked tensors: elementwise, so every teacher keeps its own moments.
        self._teacher_opt = torch.optim.Adam(self._teachers.parameters(), lr=hp.teacher_lr, betas=tuple(hp.teacher_betas))
        if self._pending_teacher_state is not None:
            self._load_teacher_state(self._pending_teacher_state)
            self._pending_teacher_state = None

    def configure_optimizers(self):
        hp = self.hparams
        return torch.optim.Adam(self.generator.parameters(), lr=hp.generator_lr, betas=tuple(hp.generator_betas))

    def setup(self, stage: str) -> None:
        seed = self.hparams.noise_seed
        if seed is None:
            seed = secret_seed()
            if _distributed():
                seed = self.trainer.strategy.broadcast(seed, src=0)
        self._shared_gen = mechanism_generator(self.device, seed)

    # ----------------------------------------------------------------- the iteration
    def training_step(self, batch, batch_idx):
        hp = self.hparams
        real_x, real_y = batch  # [T_local, b, ...]: each teacher's batch from its own partition
        teachers = self.teachers
        if self._shared_gen is None or self._shared_gen.device != self.device:
            self.setup("fit")
        gen = self._shared_gen
        m = hp.fake_batch_size

        # 1. fakes, identical on every rank (latent and labels from the shared generator)
        z = self.latent(m, generator=gen)
        y = torch.multinomial(self.class_ratio, m, replacement=True, generator=gen).to(self.device)
        x = self.generator(z, y)
        fakes = x.detach()

        # 2. one Adam step per teacher (own moments), on its own real batch vs the fakes
        self._teacher_opt.zero_grad(set_to_none=False)
        teacher_loss = teachers.accumulate_teacher_grads(real_x, real_y, fakes, y, chunk_size=hp.teacher_chunk_size)
        self._teacher_opt.step()

        # 3. votes: per-teacher descent directions, projected per sample, clipped, binned
        d = fakes[0].numel()
        P = random_projection(m, d, hp.projection_dim, generator=gen, device=self.device, dtype=fakes.dtype)
        votes = torch.zeros(m, hp.projection_dim, hp.num_bins, dtype=torch.long, device=self.device)
        for _, _, grads in teachers.iter_input_grads(fakes, y, chunk_size=hp.teacher_chunk_size):
            votes += vote_histograms(project(grads, P), clip=hp.clip, num_bins=hp.num_bins)
        if _distributed():
            dist.all_reduce(votes)

        # 4. budget check on the worst case (all answered) before the mechanism runs
        flat_votes = votes.reshape(-1, hp.num_bins).cpu().numpy()
        if not self.reserve(self._event(flat_votes, np.ones(len(flat_votes), dtype=bool))):
            return None
        delta, answered = aggregate(
            votes, P, clip=hp.clip, num_bins=hp.num_bins, threshold=self.threshold,
            sigma_threshold=hp.sigma_threshold, sigma_gnmax=hp.sigma_gnmax, generator=gen,
        )
        self.accountant.record(self._event(flat_votes, answered.reshape(-1).cpu().numpy()))  # <= the reserved cost

        # 5. generator step(s) towards x̂ = x + Δx (x̂ a constant)
        target = (fakes.flatten(1) + hp.target_scale * delta).view_as(fakes)
        opt_g = self.optimizers()
        for step in range(hp.generator_steps):
            out = x if step == 0 else self.generator(z, y)
            g_loss = 0.5 * (out - target).flatten(1).pow(2).sum(dim=1).mean()
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step() if step == hp.generator_steps - 1 else self.step_uncounted(opt_g)
        # released: the answered mask (noisy threshold) and the loss towards the noisy target x̂
        self.log_dict({"g_loss": g_loss.detach(), "answered_fraction": answered.float().mean()}, prog_bar=True)
        self.log_private({"teacher_loss": teacher_loss / self.num_teachers})

    def _event(self, votes: np.ndarray, answered: np.ndarray) -> ConfidentGNMaxEvent:
        hp = self.hparams
        return ConfidentGNMaxEvent(votes, answered, self.threshold, hp.sigma_threshold, hp.sigma_gnmax)

    # ----------------------------------------------------------------- checkpoints
    def _local_teacher_state(self) -> dict:
        t = self.teachers
        opt_state = self._teacher_opt.state_dict()["state"]
        names = t.param_names
        return {
            "ids": t.teacher_ids.cpu(),
            "params": {n: getattr(t, n).detach().cpu() for n in names},
            "adam": {n: {k: v.cpu() for k, v in opt_state.get(i, {}).items()} for i, n in enumerate(names)},
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self._teachers is None:
            if self._pending_teacher_state is not None:
                checkpoint[TEACHERS_KEY] = self._pending_teacher_state
            return
        local = self._local_teacher_state()
        parts = [local]
        if _distributed():  # every rank calls this hook; gather all teachers into one checkpoint
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, local)
        ids = torch.cat([p["ids"] for p in parts])
        order = ids.argsort()
        merged = {"ids": ids[order], "params": {}, "adam": {}}
        for n in local["params"]:
            merged["params"][n] = torch.cat([p["params"][n] for p in parts])[order]
            states = [p["adam"][n] for p in parts]
            merged["adam"][n] = {
                k: (states[0][k] if states[0][k].ndim == 0 else torch.cat([s[k] for s in states])[order])
                for k in states[0]
            }
        checkpoint[TEACHERS_KEY] = merged

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get(TEACHERS_KEY)
        if state is None:
            return
        if self._teachers is None:
            self._pending_teacher_state = state
        else:
            self._load_teacher_state(state)

    def _load_teacher_state(self, state: dict) -> None:
        t = self.teachers
        saved = {int(g): i for i, g in enumerate(state["ids"].tolist())}
        wanted = t.teacher_ids.tolist()
        missing = [g for g in wanted if g not in saved]
        if missing:
            raise ValueError(f"checkpoint lacks teachers {missing[:5]}...: resume with the same data.num_teachers")
        idx = torch.tensor([saved[g] for g in wanted])
        names = t.param_names
        with torch.no_grad():
            for n in names:
                getattr(t, n).copy_(state["params"][n][idx].to(self.device))
        opt_state = {"state": {}, "param_groups": self._teacher_opt.state_dict()["param_groups"]}
        for i, n in enumerate(names):
            adam = state["adam"].get(n, {})
            if adam:
                opt_state["state"][i] = {k: (v if v.ndim == 0 else v[idx]).to(self.device) for k, v in adam.items()}
        self._teacher_opt.load_state_dict(opt_state)
