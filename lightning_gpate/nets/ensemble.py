"""Vectorized teacher ensembles for G-PATE: thousands of discriminators as one module.

Every parameter is one stacked tensor with a leading teacher axis ``T``; forward and backward run
all teachers (or a chunk of them) in a handful of batched kernels (``baddbmm`` / grouped
convolutions), never a Python loop over teachers. Because Adam is elementwise, one
``torch.optim.Adam(ensemble.parameters())`` keeps separate first/second moments for every teacher
(the official G-PATE TensorFlow code shares moments between teachers; we do not). The training loss
is the **sum** over teachers of each teacher's mean BCE, so each teacher's gradient is exactly the one
it would get if trained alone.

Do not put anything that couples teachers into the optimizer: global-norm gradient clipping or
weight-decay schemes that look at the whole tensor would leak between teachers. Under DDP, ranks own
different teachers: DDP must neither broadcast the ensemble's parameters/buffers from rank 0 nor
all-reduce their gradients — see :meth:`TeacherEnsemble.ddp_ignore_names`.

Typical G-PATE iteration (``x = G(z, y_fake)``)::

    opt_t.zero_grad(set_to_none=True)
    ens.accumulate_teacher_grads(real_x, real_y, x.detach(), y_fake, chunk_size=50)    # or
    # ens.teacher_step_loss(real_x, real_y, x, y_fake).backward()
    opt_t.step()                                                  # Adam over stacked tensors
    votes = sum(vote_histograms(project(g, P), clip=c, num_bins=B)      # stream teacher chunks
                for _, _, g in ens.iter_input_grads(x, y_fake, chunk_size=50))
    # (DDP: all_reduce(votes)), then dpgradagg.aggregate(votes, P, ...)

Memory: parameters + gradient + 2 Adam moments = 16 bytes per parameter and teacher (fp32), plus
activations of one chunk of teachers (``chunk_size`` bounds them).

Reference (loop) implementations :class:`MLPTeacher`, :class:`ConvTeacher` and
:class:`LoopTeacherEnsemble` are included for tests and benchmarks; the single-teacher modules are
also where GS-WGAN trains its one drawn discriminator at a time (:meth:`TeacherEnsemble.copy_teacher_to`).
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: Kernel choices of :class:`ConvTeacherEnsemble` (``conv_impl``; the same maths).
CONV_IMPLS = ("auto", "cpu", "gpu", "bmm")

__all__ = [
    "TeacherEnsemble",
    "MLPTeacherEnsemble",
    "ConvTeacherEnsemble",
    "MLPTeacher",
    "ConvTeacher",
    "LoopTeacherEnsemble",
    "teacher_seed",
]

_MASK64 = (1 << 64) - 1


def teacher_seed(seed: int, teacher_id: int) -> int:
    """Deterministic 63-bit seed of one teacher from a run seed and its *global* id (splitmix64).

    The same (seed, id) always gives the same teacher, whichever rank or ensemble builds it.
    """
    z = (int(seed) * 0x9E3779B97F4A7C15 + (int(teacher_id) + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z & ((1 << 63) - 1)


def _one_hot(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    return F.one_hot(y.long(), num_classes).to(dtype)


def _bce_sum_of_means(logits: torch.Tensor, target: float) -> torch.Tensor:
    """Σ_teachers mean_j BCE(logits[t, j], target); logits ``[T, n]``."""
    tgt = torch.full_like(logits, float(target))
    return F.binary_cross_entropy_with_logits(logits, tgt, reduction="none").mean(dim=1).sum()


def held_teachers(num_teachers: int | None, teacher_ids: Sequence[int] | None) -> Sequence[int]:
    """The global ids an ensemble holds: ``teacher_ids`` (e.g. a DDP rank's share), else all of ``num_teachers``."""
    if teacher_ids is not None:
        return teacher_ids
    if num_teachers is None:
        raise ValueError("give num_teachers or teacher_ids")
    return range(int(num_teachers))


class TeacherEnsemble(nn.Module):
    """Base class: ``T`` conditional binary discriminators with stacked parameters.

    Subclasses define the parameter shapes, a per-teacher initialiser and the network split into a
    first layer (which can run on inputs shared by all teachers without copying them ``T`` times)
    and the rest (which runs per teacher).

    Args:
        teacher_ids: *Global* ids of the teachers this ensemble holds (e.g. ``range(r, n, W)`` for
            rank ``r`` of ``W``). Teacher ``i`` is initialised from ``teacher_seed(seed, id)`` only, so
            an ensemble of ids ``[0, 2, 4]`` equals the corresponding teachers of ids ``[0..5]``.
        num_classes: Number of label classes (labels enter the nets as one-hot vectors).
        in_shape: Shape of one input sample (without batch axes).
        seed: Run seed for the deterministic per-teacher initialisation.

    Attributes:
        teacher_ids: ``[T]`` long buffer of global ids (saved with the state dict).
    """

    #: axis of the batch in the hidden layout returned by :meth:`_first` (concatenation axis)
    _hidden_batch_dim: int = 1

    def __init__(self, teacher_ids: Sequence[int], *, num_classes: int, in_shape: Sequence[int], seed: int = 0) -> None:
        super().__init__()
        ids = torch.as_tensor(list(teacher_ids), dtype=torch.long)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError("teacher_ids must be a non-empty 1-D sequence")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("teacher_ids must be unique")
        self.register_buffer("teacher_ids", ids)
        self.num_classes = int(num_classes)
        self.in_shape = tuple(int(s) for s in in_shape)
        self.in_features = int(math.prod(self.in_shape))
        self.seed = int(seed)

    # ------------------------------------------------------------------ to be defined by subclasses
    def _teacher_param_shapes(self) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    def _init_teacher(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """Parameters of one teacher (no teacher axis), drawn from ``gen`` in a fixed order."""
        raise NotImplementedError

    def _first(self, p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, shared: bool) -> torch.Tensor:
        """First layer (pre-activation). ``x`` is ``[Tc, n, *in_shape]`` or, if ``shared``, ``[n, *in_shape]``;
        ``y`` is ``[Tc, n]`` long labels (possibly an expanded view)."""
        raise NotImplementedError

    def _rest(self, p: dict[str, torch.Tensor], h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Remaining layers: hidden from :meth:`_first` and labels ``[Tc, n]`` → logits ``[Tc, n]``."""
        raise NotImplementedError

    def _first_vjp(self, p: dict[str, torch.Tensor], g: torch.Tensor, x_shape: torch.Size) -> torch.Tensor:
        """Per-teacher input gradient ``[Tc, m, d]`` from the gradient ``g`` w.r.t. the output of
        :meth:`_first` (shared mode; ``x_shape`` = ``[m, *in_shape]``)."""
        raise NotImplementedError

    def _config(self) -> dict:
        raise NotImplementedError

    def _teacher_module(self) -> nn.Module:
        """A fresh per-teacher reference ``nn.Module`` of the same architecture."""
        raise NotImplementedError

    def _to_module_state(self, p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _from_module_state(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    # ------------------------------------------------------------------ construction helpers
    def _create_parameters(self) -> None:
        T = self.num_teachers
        for name, shape in self._teacher_param_shapes().items():
            self.register_parameter(name, nn.Parameter(torch.empty(T, *shape)))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re)initialise every teacher from ``teacher_seed(self.seed, global_id)``.

        This is the only per-teacher Python loop (once, at construction); it draws on the CPU so that
        the values do not depend on the device.
        """
        names = list(self._teacher_param_shapes())
        for i, gid in enumerate(self.teacher_ids.tolist()):
            gen = torch.Generator().manual_seed(teacher_seed(self.seed, gid))
            vals = self._init_teacher(gen)
            for n in names:
                getattr(self, n)[i].copy_(vals[n])

    def ddp_ignore_names(self, prefix: str = "") -> list[str]:
        """Fully-qualified names DDP must ignore (rank-local teachers): set them as
        ``root_module._ddp_params_and_buffers_to_ignore`` before the module is wrapped (Lightning: in
        ``setup``), with ``prefix`` the ensemble's attribute path, e.g. ``"teachers."``."""
        return [prefix + n for n, _ in self.named_parameters()] + [prefix + n for n, _ in self.named_buffers()]

    @property
    def num_teachers(self) -> int:
        return int(self.teacher_ids.numel())

    @property
    def param_names(self) -> list[str]:
        return list(self._teacher_param_shapes())

    def params_per_teacher(self) -> int:
        """Number of trainable parameters of one teacher."""
        return sum(math.prod(s) for s in self._teacher_param_shapes().values())

    def _params(self, t0: int = 0, t1: int | None = None) -> dict[str, torch.Tensor]:
        t1 = self.num_teachers if t1 is None else t1
        if t0 == 0 and t1 == self.num_teachers:
            return {n: getattr(self, n) for n in self.param_names}
        return {n: getattr(self, n)[t0:t1] for n in self.param_names}

    def _chunks(self, chunk_size: int | None) -> Iterator[tuple[int, int]]:
        T = self.num_teachers
        cs = T if chunk_size is None or chunk_size <= 0 else int(chunk_size)
        for t0 in range(0, T, cs):
            yield t0, min(T, t0 + cs)

    def subset(self, teacher_ids: Sequence[int]) -> "TeacherEnsemble":
        """A new ensemble holding copies of the given *global* teachers of this one (same config)."""
        ids = [int(i) for i in teacher_ids]
        pos = {g: i for i, g in enumerate(self.teacher_ids.tolist())}
        missing = [g for g in ids if g not in pos]
        if missing:
            raise KeyError(f"teacher ids not in this ensemble: {missing}")
        ref = getattr(self, self.param_names[0])
        new = type(self)(teacher_ids=ids, **self._config()).to(device=ref.device, dtype=ref.dtype)
        idx = torch.tensor([pos[g] for g in ids], device=ref.device)
        with torch.no_grad():
            for n in self.param_names:
                getattr(new, n).copy_(getattr(self, n).index_select(0, idx))
        return new

    def export_teacher(self, i: int) -> nn.Module:
        """Teacher at local index ``i`` as a plain reference ``nn.Module`` (a copy)."""
        m = self.teacher_module()
        self.copy_teacher_to(i, m)
        return m

    def teacher_module(self) -> nn.Module:
        """A fresh plain ``nn.Module`` of one teacher's architecture (on the ensemble's device), to load
        teachers into with :meth:`copy_teacher_to` (e.g. GS-WGAN's one discriminator trained at a time)."""
        ref = getattr(self, self.param_names[0])
        return self._teacher_module().to(device=ref.device, dtype=ref.dtype)

    @torch.no_grad()
    def copy_teacher_to(self, i: int, module: nn.Module) -> None:
        """Copy local teacher ``i`` into ``module`` (a :meth:`teacher_module`) in place: its parameter
        objects stay, so an optimizer over them stays valid."""
        module.load_state_dict(self._to_module_state({n: getattr(self, n)[i].detach() for n in self.param_names}))

    @torch.no_grad()
    def load_teacher(self, i: int, module: nn.Module) -> None:
        """Copy the parameters of a reference module into local teacher ``i``."""
        p = self._from_module_state(module.state_dict())
        for n in self.param_names:
            getattr(self, n)[i].copy_(p[n])

    # ------------------------------------------------------------------ input / label plumbing
    def _as_input(self, x: torch.Tensor, lead: int) -> torch.Tensor:
        """Reshape ``x`` whose first ``lead`` axes are batch-like to ``[*lead, *in_shape]``."""
        return x.reshape(*x.shape[:lead], *self.in_shape)

    def _logits(self, p, x, y, shared: bool) -> torch.Tensor:
        Tc = next(iter(p.values())).shape[0]
        if shared:
            x = self._as_input(x, 1)
            y = y.reshape(1, -1).expand(Tc, -1)
        else:
            x = self._as_input(x, 2)
        return self._rest(p, self._first(p, x, y, shared), y)

    def _mixed_logits(self, p, real_x, real_y, fake_x, fake_y) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of per-teacher real batches ``[Tc, b]`` and of fakes ``[Tc, m]``, with layers after
        the first run once on the concatenation. Fakes are shared by all teachers (``fake_y`` ``[m]``)
        or per teacher (``fake_x`` ``[Tc, m, ...]``, ``fake_y`` ``[Tc, m]``)."""
        Tc = next(iter(p.values())).shape[0]
        real_x = self._as_input(real_x, 2)
        b = real_x.shape[1]
        if fake_y.ndim == 2:  # per-teacher fakes: one per-teacher pass over reals and fakes together
            x = torch.cat([real_x, self._as_input(fake_x, 2)], dim=1)
            logits = self._logits(p, x, torch.cat([real_y.long(), fake_y.long()], dim=1), shared=False)
            return logits[:, :b], logits[:, b:]
        fake_x = self._as_input(fake_x, 1)
        hr = self._first(p, real_x, real_y, shared=False)
        fy = fake_y.reshape(1, -1).expand(Tc, -1)
        hf = self._first(p, fake_x, fy, shared=True)
        h = torch.cat([hr, hf], dim=self._hidden_batch_dim)
        logits = self._rest(p, h, torch.cat([real_y.long(), fy.long()], dim=1))
        return logits[:, :b], logits[:, b:]

    # ------------------------------------------------------------------ public API
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-teacher batches: ``x`` ``[T, b, *in_shape]`` (or ``[T, b, d]``), ``y`` ``[T, b]`` → logits ``[T, b]``."""
        return self._logits(self._params(), x, y, shared=False)

    def forward_shared(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batch seen by every teacher: ``x`` ``[m, *in_shape]``, ``y`` ``[m]`` → logits ``[T, m]``.

        The first layer runs as one dense op over all teachers' weights; ``x`` is never copied ``T`` times.
        """
        return self._logits(self._params(), x, y, shared=True)

    def teacher_step_loss(self, real_x: torch.Tensor, real_y: torch.Tensor, fake_x: torch.Tensor, fake_y: torch.Tensor) -> torch.Tensor:
        """Σ_teachers [mean_j BCE(D_t(real_tj), 1) + mean_j BCE(D_t(fake_j), 0)] (a scalar).

        ``real_x`` ``[T, b, ...]`` (each teacher its own batch from its own partition), ``fake_x``
        ``[m, ...]`` shared by all teachers with labels ``fake_y`` ``[m]``, or ``[T, m, ...]`` per
        teacher with labels ``[T, m]`` (detached here: the teacher step must not reach the
        generator). Its gradient w.r.t. teacher ``t``'s parameters is exactly teacher ``t``'s own
        gradient. For bounded memory use :meth:`accumulate_teacher_grads`.
        """
        lr, lf = self._mixed_logits(self._params(), real_x, real_y, fake_x.detach(), fake_y)
        return _bce_sum_of_means(lr, 1.0) + _bce_sum_of_means(lf, 0.0)

    def accumulate_teacher_grads(
        self,
        real_x: torch.Tensor,
        real_y: torch.Tensor,
        fake_x: torch.Tensor,
        fake_y: torch.Tensor,
        *,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        """Backward of :meth:`teacher_step_loss`, ``chunk_size`` teachers at a time, *adding* into ``.grad``.

        Peak activation memory scales with ``chunk_size`` instead of ``T``. Gradients are taken w.r.t.
        the chunk's parameter slices (no full-size zero gradient per chunk) and added to
        ``param.grad[t0:t1]``. Call ``optimizer.zero_grad()`` before and ``optimizer.step()`` after.

        Returns:
            The detached loss value (Σ over all teachers).
        """
        fake_x = fake_x.detach()
        names = self.param_names
        full = [getattr(self, n) for n in names]
        fresh = [prm.grad is None for prm in full]  # chunks cover every teacher once: copy, no zero fill
        chunks = list(self._chunks(chunk_size))
        if len(chunks) > 1:
            for prm, f in zip(full, fresh):
                if f:
                    prm.grad = torch.empty_like(prm)
        total = None
        for t0, t1 in chunks:
            p = self._params(t0, t1)
            if fake_y.ndim == 2:  # per-teacher fakes
                lr, lf = self._mixed_logits(p, real_x[t0:t1], real_y[t0:t1], fake_x[t0:t1], fake_y[t0:t1])
            else:
                lr, lf = self._mixed_logits(p, real_x[t0:t1], real_y[t0:t1], fake_x, fake_y)
            loss = _bce_sum_of_means(lr, 1.0) + _bce_sum_of_means(lf, 0.0)
            grads = torch.autograd.grad(loss, [p[n] for n in names])
            for prm, g, f in zip(full, grads, fresh):
                if f and len(chunks) == 1:
                    # keep autograd's layout contract (grad strides = param strides): e.g. fused Adam
                    # reads grads as dense memory
                    prm.grad = g.contiguous()
                elif f:
                    prm.grad[t0:t1].copy_(g)
                else:
                    prm.grad[t0:t1].add_(g)
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def iter_input_grads(
        self, x: torch.Tensor, y: torch.Tensor, *, chunk_size: int | None = None
    ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """Yield ``(t0, t1, delta)`` with ``delta`` ``[t1 - t0, m, d]`` for chunks of teachers.

        ``delta[t, j] = −∂L_G,t/∂x_j`` with ``L_G,t = mean_j BCE(D_t(x_j, y_j), 1)`` (the descent
        direction Δx_t of G-PATE, as in the official ``img_grads = −tf.gradients(g_loss, G)``; note the
        1/m from the mean). One backward per chunk: teachers are independent, so backpropagating
        Σ_t L_G,t to the output of the (shared, linear) first layer gives every teacher's own gradient
        there; the first layer's per-teacher VJP maps it to ``x``. ``x`` is never copied ``T`` times
        and teacher parameters receive no gradient. Stream the chunks into DPGradAgg's vote
        histograms (which add) to bound memory.
        """
        xs = self._as_input(x.detach(), 1)
        for t0, t1 in self._chunks(chunk_size):
            p = {n: v.detach() for n, v in self._params(t0, t1).items()}
            Tc = t1 - t0
            yy = y.reshape(1, -1).expand(Tc, -1)
            with torch.enable_grad():
                # The first layer is linear in x and runs once, shared; backprop stops at its output
                # (distinct per teacher) and the first layer's VJP maps it back to every teacher's input.
                h0 = self._first(p, xs, yy, shared=True).detach().requires_grad_(True)
                loss = _bce_sum_of_means(self._rest(p, h0, yy), 1.0)
                (g,) = torch.autograd.grad(loss, h0)
            yield t0, t1, self._first_vjp(p, g, xs.shape).neg_()

    def per_teacher_input_grads(self, x: torch.Tensor, y: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        """Descent directions ``Δx_t = −∂L_G,t/∂x`` for every teacher: ``[T, m, d]`` (``d`` = flattened input).

        See :meth:`iter_input_grads` (same values, concatenated). The returned sign is the *descent*
        direction: ``x + Δx_t`` lowers teacher t's generator loss.
        """
        out = None
        for t0, t1, g in self.iter_input_grads(x, y, chunk_size=chunk_size):
            if out is None:
                out = g.new_empty(self.num_teachers, *g.shape[1:])
            out[t0:t1] = g
        return out


# ====================================================================================== MLP


class MLPTeacherEnsemble(TeacherEnsemble):
    """T conditional MLP discriminators for tables: ``[x, onehot(y)] → (Linear, LeakyReLU 0.2)* → Linear → logit``.

    Batched matmuls (``baddbmm``; ``einsum`` for inputs shared by all teachers). Initialisation is
    ``nn.Linear``'s default (U(±1/√fan_in) for weights and biases), per teacher from its seed.
    With ``in_features=30, num_classes=2, hidden=(64,)`` a teacher has 2,113 parameters.

    Args:
        num_teachers: Build teachers with global ids ``0..num_teachers-1`` (if ``teacher_ids`` is None).
        in_features: Number of (already transformed) feature columns.
        num_classes: Label classes.
        hidden: Hidden widths.
        negative_slope: LeakyReLU slope.
        teacher_ids: Global ids of the teachers to hold (e.g. a DDP rank's share).
        seed: Run seed for the per-teacher initialisation.
    """

    def __init__(
        self,
        num_teachers: int | None = None,
        in_features: int = 30,
        num_classes: int = 2,
        hidden: Sequence[int] = (64,),
        *,
        negative_slope: float = 0.2,
        teacher_ids: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(held_teachers(num_teachers, teacher_ids), num_classes=num_classes, in_shape=(int(in_features),), seed=seed)
        self.hidden = tuple(int(h) for h in hidden)
        self.negative_slope = float(negative_slope)
        widths = [self.in_features + self.num_classes, *self.hidden, 1]
        self._layer_shapes = list(zip(widths[:-1], widths[1:]))
        self._create_parameters()

    def _config(self) -> dict:
        return dict(in_features=self.in_features, num_classes=self.num_classes, hidden=self.hidden,
                    negative_slope=self.negative_slope, seed=self.seed)

    def _teacher_param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for i, (fi, fo) in enumerate(self._layer_shapes):
            shapes[f"w{i}"] = (fi, fo)  # [in, out] (transposed vs nn.Linear) for bmm
            shapes[f"b{i}"] = (fo,)
        return shapes

    def _init_teacher(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        out = {}
        for i, (fi, fo) in enumerate(self._layer_shapes):
            bound = 1.0 / math.sqrt(fi)
            out[f"w{i}"] = (torch.rand(fo, fi, generator=gen) * 2 - 1).mul_(bound).t()
            out[f"b{i}"] = (torch.rand(fo, generator=gen) * 2 - 1).mul_(bound)
        return out

    def _first(self, p, x, y, shared):
        if shared:  # x [n, d], y [Tc, n] (expanded: identical rows)
            xc = torch.cat([x, _one_hot(y[0], self.num_classes, x.dtype)], dim=1)
            return torch.einsum("ni,tio->tno", xc, p["w0"]) + p["b0"].unsqueeze(1)
        xc = torch.cat([x, _one_hot(y, self.num_classes, x.dtype)], dim=2)  # [Tc, n, d+Y]
        return torch.baddbmm(p["b0"].unsqueeze(1), xc, p["w0"])

    def _first_vjp(self, p, g, x_shape):
        # g [Tc, m, H];  dL/dx_t = g_t @ W0x_t^T
        return torch.bmm(g, p["w0"][:, : self.in_features].transpose(1, 2))

    def _rest(self, p, h, y):
        for i in range(1, len(self._layer_shapes)):
            h = F.leaky_relu(h, self.negative_slope)
            h = torch.baddbmm(p[f"b{i}"].unsqueeze(1), h, p[f"w{i}"])
        return h.squeeze(-1)

    def _teacher_module(self) -> nn.Module:
        return MLPTeacher(self.in_features, self.num_classes, self.hidden, negative_slope=self.negative_slope)

    def _to_module_state(self, p):
        sd = {}
        for i in range(len(self._layer_shapes)):
            sd[f"layers.{i}.weight"] = p[f"w{i}"].t().contiguous()
            sd[f"layers.{i}.bias"] = p[f"b{i}"].clone()
        return sd

    def _from_module_state(self, sd):
        p = {}
        for i in range(len(self._layer_shapes)):
            p[f"w{i}"] = sd[f"layers.{i}.weight"].t()
            p[f"b{i}"] = sd[f"layers.{i}.bias"]
        return p


# ====================================================================================== Conv


def _conv_out(size: int) -> int:  # 5x5, stride 2, padding 2 ("SAME" size in TF)
    return (size + 2 * 2 - 5) // 2 + 1


def _im2col(x: torch.Tensor) -> torch.Tensor:
    """``F.unfold(x, 5, padding=2, stride=2)`` (``[n, C, H, W]`` → ``[n, C·25, L]``) as one copy of a
    strided view: torch 2.14's CPU ``im2col`` took 1-6 s for the 3,100 MNIST images of a 50-teacher
    chunk, this copy ~0.1 s (2 threads)."""
    n, C = x.shape[:2]
    patches = F.pad(x, (2, 2, 2, 2)).unfold(2, 5, 2).unfold(3, 5, 2)  # [n, C, Ho, Wo, 5, 5] (a view)
    return patches.permute(0, 1, 4, 5, 2, 3).reshape(n, C * 25, patches.shape[2] * patches.shape[3])


def _grouped_conv_bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups: int) -> torch.Tensor:
    """``F.conv2d(x, w, b, stride=2, padding=2, groups=groups)`` for 5×5 kernels as im2col + one ``baddbmm``.

    ``x`` ``[n, G·Ci, H, W]``, ``w`` ``[G·Co, Ci, 5, 5]``, ``b`` ``[G·Co]`` → ``[n, G·Co, Ho, Wo]``. Each group's
    patches form one matrix ``[Ci·25, n·Ho·Wo]``, so all groups are one batched product (cuDNN runs a grouped
    conv with few channels per group as one kernel per group). ``F.unfold`` rather than ``Tensor.unfold``
    views: its backward is one col2im (``F.fold``), 2.3× faster on the CPU than the views' scatter."""
    n, gc, H, W = x.shape
    ci = gc // groups
    co = w.shape[0] // groups
    ho, wo = _conv_out(H), _conv_out(W)
    cols = F.unfold(x.reshape(n * groups, ci, H, W), 5, padding=2, stride=2)  # [n·G, Ci·25, Ho·Wo]
    cols = cols.view(n, groups, ci * 25, ho * wo).permute(1, 2, 0, 3).reshape(groups, ci * 25, n * ho * wo)
    out = torch.baddbmm(b.view(groups, co, 1), w.reshape(groups, co, ci * 25), cols)  # [G, Co, n·Ho·Wo]
    return out.view(groups, co, n, ho, wo).permute(2, 0, 1, 3, 4).contiguous().view(n, groups * co, ho, wo)


class ConvTeacherEnsemble(TeacherEnsemble):
    """T conditional DCGAN discriminators: G-PATE's MNIST teacher, labels concatenated to every layer.

    Architecture of one teacher (official G-PATE ``model.py`` ``discriminator``, ``df_dim=32``,
    ``dfc_dim=256``, y one-hot with ``Y`` classes, ``ymap`` = y as constant feature maps)::

        [x, ymap] → conv5x5/2 (C+Y → c0) → LReLU(0.2)
        [h, ymap] → conv5x5/2 (c0+Y → c1) → LReLU
        [flatten(h), y] → linear(fc) → LReLU
        [h, y] → linear(1) → logit

    with defaults ``c0 = C + Y``, ``c1 = 32 + Y``, ``fc = 256``. For MNIST (1×28×28, Y=10) that is
    conv 11→11, conv 21→42, fc 2068→256, fc 266→1: **555,059 parameters per teacher** (≈0.56M as in
    the paper; 2.22 MB fp32, ≈8.9 MB with gradient and two Adam moments, so 2000 teachers ≈ 17.8 GB).
    The official code's BatchNorm is omitted (no norm layers; nothing is shared across teachers).
    Weights are initialised N(0, 0.02²) (DCGAN), biases 0, per teacher from its seed.

    Implementation: the image part of every conv runs as one grouped convolution over
    ``[n, T·C, H, W]`` (``groups=T``; for the shared fakes, the first conv is a plain dense conv with
    ``T·c0`` output channels). The label-map part is exact but computed cheaply: a one-hot constant
    map convolved with the zero-padded kernel gives a per-(teacher, class) map (one tiny conv over a
    ones image), gathered by label. This is mathematically identical to concatenating the label
    maps (border effects of the zero padding included) and cuts the conv FLOPs roughly in half
    (first conv: 1 instead of 11 input channels). Per-teacher input gradients run the first conv
    once (dense, shared fakes) and map the gradient at its output back with the first conv's
    per-teacher transpose. On CPU (``conv_impl='auto'``/``'cpu'``) the first conv of per-teacher
    batches and that transpose are im2col + ``bmm`` (oneDNN's grouped conv with one input channel per
    group ran at <1 GMAC/s) and the second conv is a grouped conv in channels-last (NHWC) layout,
    1.3-1.6x faster than NCHW for these shapes; on GPU (``'gpu'``) all are NCHW grouped convs, which
    cuDNN runs as one kernel per teacher with layout transforms around each (~48,000 launches per
    G-PATE step at 2,000 teachers on an H200, 98% of the step: ``benchmarks/results/
    gpate_step_profile_gaussagg_h200.md``); ``'bmm'`` runs every per-teacher conv as im2col + one
    batched matrix product per chunk (a few large kernels, on either device). On
    CPU, ``chunk_size`` 25-50 was ~1.5x faster than 250 (a chunk's activations stay in cache).
    ``torch.func.vmap`` over the per-teacher functional model was benchmarked too: it lowers to the
    same grouped convolutions (with the label maps concatenated) and was never faster (2 CPU
    cores), so it is not used.

    Args:
        num_teachers: Build teachers with global ids ``0..num_teachers-1`` (if ``teacher_ids`` is None).
        in_shape: ``(C, H, W)``.
        num_classes: Label classes.
        channels: ``(c0, c1)``; default ``(C + Y, 32 + Y)`` as in the official code.
        fc: Width of the dense layer (official ``dfc_dim`` 256).
        negative_slope: LeakyReLU slope.
        init_std: Std of the N(0, σ²) weight initialisation.
        conv_impl: ``'auto'`` (by device: ``'cpu'`` or ``'gpu'``), ``'cpu'``, ``'gpu'`` or ``'bmm'`` kernel
            choice; identical maths.
        teacher_ids: Global ids of the teachers to hold.
        seed: Run seed for the per-teacher initialisation.
    """

    _hidden_batch_dim = 0  # hidden layout [n, Tc, c*h*w] (batch-major, as grouped convs want it)

    def __init__(
        self,
        num_teachers: int | None = None,
        in_shape: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        channels: Sequence[int] | None = None,
        fc: int = 256,
        *,
        negative_slope: float = 0.2,
        init_std: float = 0.02,
        conv_impl: str = "auto",
        teacher_ids: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(held_teachers(num_teachers, teacher_ids), num_classes=num_classes, in_shape=in_shape, seed=seed)
        if len(self.in_shape) != 3:
            raise ValueError("in_shape must be (C, H, W)")
        C, H, W = self.in_shape
        Y = self.num_classes
        if channels is None:
            channels = (C + Y, 32 + Y)
        self.channels = tuple(int(c) for c in channels)
        if len(self.channels) != 2:
            raise ValueError("channels must be (c0, c1)")
        self.fc = int(fc)
        self.negative_slope = float(negative_slope)
        self.init_std = float(init_std)
        if conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {', '.join(map(repr, CONV_IMPLS))}")
        self.conv_impl = conv_impl
        self._h1, self._w1 = _conv_out(H), _conv_out(W)
        self._h2, self._w2 = _conv_out(self._h1), _conv_out(self._w1)
        self._flat = self.channels[1] * self._h2 * self._w2
        self._create_parameters()

    def _config(self) -> dict:
        return dict(in_shape=self.in_shape, num_classes=self.num_classes, channels=self.channels, fc=self.fc,
                    negative_slope=self.negative_slope, init_std=self.init_std, conv_impl=self.conv_impl,
                    seed=self.seed)

    def _teacher_param_shapes(self) -> dict[str, tuple[int, ...]]:
        C = self.in_shape[0]
        Y = self.num_classes
        c0, c1 = self.channels
        return {
            "conv0_w": (c0, C + Y, 5, 5), "conv0_b": (c0,),
            "conv1_w": (c1, c0 + Y, 5, 5), "conv1_b": (c1,),
            "fc0_w": (self._flat + Y, self.fc), "fc0_b": (self.fc,),   # [in, out]
            "fc1_w": (self.fc + Y, 1), "fc1_b": (1,),
        }

    def _init_teacher(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        out = {}
        for name, shape in self._teacher_param_shapes().items():
            if name.endswith("_w"):
                out[name] = torch.randn(*shape, generator=gen) * self.init_std
            else:
                out[name] = torch.zeros(*shape)
        return out

    # -- label-map contribution of a conv layer: exact, via a conv of a ones image
    def _label_term(self, w_lab: torch.Tensor, hw: tuple[int, int], y: torch.Tensor) -> torch.Tensor:
        """``w_lab`` ``[Tc, co, Y, 5, 5]``, labels ``y`` ``[Tc, n]`` → ``[n, Tc, co·L]`` (L = output h·w)."""
        Tc, co, Y = w_lab.shape[:3]
        ones = w_lab.new_ones(1, 1, *hw)
        m = F.conv2d(ones, w_lab.reshape(Tc * co * Y, 1, 5, 5), stride=2, padding=2)  # [1, Tc*co*Y, ho, wo]
        table = m.reshape(Tc, co, Y, -1).transpose(1, 2).reshape(Tc * Y, -1)  # row t*Y + c: [co*L]
        idx = (torch.arange(Tc, device=y.device).unsqueeze(1) * Y + y.long()).t()  # [n, Tc]
        return F.embedding(idx, table)  # [n, Tc, co*L]

    def _kernels(self, t: torch.Tensor) -> str:
        """Kernel choice (same maths): 'cpu' = first conv of per-teacher inputs as unfold + bmm and
        channels-last grouped convs (oneDNN is slow for grouped convs with 1-11 channels per group in
        NCHW); 'gpu' = NCHW grouped convs throughout; 'bmm' = unfold + bmm for every per-teacher conv.
        'auto' picks 'cpu' or 'gpu' by the tensor's device."""
        if self.conv_impl == "auto":
            return "cpu" if t.device.type == "cpu" else "gpu"
        return self.conv_impl

    def _cpu_kernels(self, t: torch.Tensor) -> bool:
        """The first conv of per-teacher inputs and its transpose as unfold + bmm ('cpu' and 'bmm')."""
        return self._kernels(t) in ("cpu", "bmm")

    def _conv(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups: int) -> torch.Tensor:
        """5x5/2 conv, returned NCHW-contiguous."""
        kernels = self._kernels(x)
        if kernels == "bmm" and groups > 1:
            return _grouped_conv_bmm(x, w, b, groups)
        if kernels == "cpu" and groups > 1:
            x = x.contiguous(memory_format=torch.channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
            return F.conv2d(x, w, b, stride=2, padding=2, groups=groups).contiguous()
        return F.conv2d(x, w, b, stride=2, padding=2, groups=groups)

    def _first(self, p, x, y, shared):
        C, H, W = self.in_shape
        c0 = self.channels[0]
        L1 = self._h1 * self._w1
        w = p["conv0_w"]
        Tc = w.shape[0]
        wx = w[:, :, :C].reshape(Tc * c0, C, 5, 5)
        if shared:  # x [n, C, H, W]: one dense conv with Tc*c0 output channels
            n = x.shape[0]
            h = self._conv(x, wx, p["conv0_b"].reshape(-1), groups=1).view(n, Tc, c0 * L1)
        elif self._cpu_kernels(x):  # x [Tc, n, C, H, W]: im2col + one bmm per chunk
            n = x.shape[1]
            cols = _im2col(x.reshape(Tc * n, C, H, W))  # [Tc*n, C*25, L1]
            cols = cols.view(Tc, n, C * 25, L1).transpose(1, 2).reshape(Tc, C * 25, n * L1)
            h = torch.baddbmm(p["conv0_b"].unsqueeze(-1), wx.view(Tc, c0, C * 25), cols)  # [Tc, c0, n*L1]
            h = h.view(Tc, c0, n, L1).permute(2, 0, 1, 3).reshape(n, Tc, c0 * L1)
        else:  # x [Tc, n, C, H, W] → [n, Tc*C, H, W], grouped
            n = x.shape[1]
            xb = x.transpose(0, 1).reshape(n, Tc * C, H, W)
            h = self._conv(xb, wx, p["conv0_b"].reshape(-1), groups=Tc).view(n, Tc, c0 * L1)
        return h + self._label_term(w[:, :, C:], (H, W), y)  # [n, Tc, c0*L1]

    def _first_vjp(self, p, g, x_shape):
        C, H, W = self.in_shape
        c0 = self.channels[0]
        L1 = self._h1 * self._w1
        w = p["conv0_w"]
        Tc = w.shape[0]
        m = x_shape[0]
        wx = w[:, :, :C].reshape(Tc * c0, C, 5, 5)
        if self._cpu_kernels(g):  # bmm with the transposed kernels, then col2im
            g2 = g.view(m, Tc, c0, L1).permute(1, 2, 0, 3).reshape(Tc, c0, m * L1)
            cols = torch.bmm(wx.view(Tc, c0, C * 25).transpose(1, 2), g2)  # [Tc, C*25, m*L1]
            cols = cols.view(Tc, C * 25, m, L1).transpose(1, 2).reshape(Tc * m, C * 25, L1)
            gx = F.fold(cols, (H, W), 5, padding=2, stride=2)  # [Tc*m, C, H, W]
            return gx.view(Tc, m, C * H * W)
        # conv2d_input calls convolution_backward, which autocast does not cover: under a bf16 teacher
        # precision g is bf16 and the weights fp32, and CUDA refuses mixed dtypes.
        gx = torch.nn.grad.conv2d_input((m, Tc * C, H, W), wx.to(g.dtype), g.reshape(m, Tc * c0, self._h1, self._w1),
                                        stride=2, padding=2, groups=Tc)  # [m, Tc*C, H, W]
        return gx.reshape(m, Tc, C * H * W).transpose(0, 1).contiguous()

    def _rest(self, p, h, y):
        n, Tc, _ = h.shape
        c0, c1 = self.channels
        Y = self.num_classes
        a = F.leaky_relu(h, self.negative_slope).reshape(n, Tc * c0, self._h1, self._w1)
        w1 = p["conv1_w"]
        h = self._conv(a, w1[:, :, :c0].reshape(Tc * c1, c0, 5, 5), p["conv1_b"].reshape(-1), groups=Tc)
        h = h.view(n, Tc, self._flat) + self._label_term(w1[:, :, c0:], (self._h1, self._w1), y)
        h = F.leaky_relu(h, self.negative_slope).transpose(0, 1)  # [Tc, n, F]
        yo = _one_hot(y, Y, h.dtype)  # [Tc, n, Y]
        h = torch.baddbmm(p["fc0_b"].unsqueeze(1), torch.cat([h, yo], dim=2), p["fc0_w"])
        h = F.leaky_relu(h, self.negative_slope)
        h = torch.baddbmm(p["fc1_b"].unsqueeze(1), torch.cat([h, yo], dim=2), p["fc1_w"])
        return h.squeeze(-1)

    def _teacher_module(self) -> nn.Module:
        return ConvTeacher(self.in_shape, self.num_classes, self.channels, self.fc, negative_slope=self.negative_slope)

    def _to_module_state(self, p):
        return {
            "conv0.weight": p["conv0_w"].clone(), "conv0.bias": p["conv0_b"].clone(),
            "conv1.weight": p["conv1_w"].clone(), "conv1.bias": p["conv1_b"].clone(),
            "fc0.weight": p["fc0_w"].t().contiguous(), "fc0.bias": p["fc0_b"].clone(),
            "fc1.weight": p["fc1_w"].t().contiguous(), "fc1.bias": p["fc1_b"].clone(),
        }

    def _from_module_state(self, sd):
        return {
            "conv0_w": sd["conv0.weight"], "conv0_b": sd["conv0.bias"],
            "conv1_w": sd["conv1.weight"], "conv1_b": sd["conv1.bias"],
            "fc0_w": sd["fc0.weight"].t(), "fc0_b": sd["fc0.bias"],
            "fc1_w": sd["fc1.weight"].t(), "fc1_b": sd["fc1.bias"],
        }


# ====================================================================================== reference (loop) implementation
# Plain per-teacher modules and a Python loop with one Adam per teacher: the *reference* the vectorized
# ensembles are tested against and benchmarked against. Not for training at scale.


class MLPTeacher(nn.Module):
    """Reference single MLP teacher: ``[x, onehot(y)] → (Linear, LReLU)* → Linear``; logits ``[b]``."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (64,), *, negative_slope: float = 0.2) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.negative_slope = negative_slope
        widths = [in_features + num_classes, *hidden, 1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x.flatten(1), _one_hot(y, self.num_classes, x.dtype)], dim=1)
        for i, layer in enumerate(self.layers):
            if i:
                h = F.leaky_relu(h, self.negative_slope)
            h = layer(h)
        return h.squeeze(1)


class ConvTeacher(nn.Module):
    """Reference single conditional DCGAN teacher (label maps concatenated to every conv input)."""

    def __init__(self, in_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10, channels: Sequence[int] | None = None,
                 fc: int = 256, *, negative_slope: float = 0.2) -> None:
        super().__init__()
        C, H, W = in_shape
        Y = num_classes
        c0, c1 = channels if channels is not None else (C + Y, 32 + Y)
        self.in_shape = tuple(in_shape)
        self.num_classes = Y
        self.negative_slope = negative_slope
        self.conv0 = nn.Conv2d(C + Y, c0, 5, stride=2, padding=2)
        self.conv1 = nn.Conv2d(c0 + Y, c1, 5, stride=2, padding=2)
        flat = c1 * _conv_out(_conv_out(H)) * _conv_out(_conv_out(W))
        self.fc0 = nn.Linear(flat + Y, fc)
        self.fc1 = nn.Linear(fc + Y, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.in_shape)
        yo = _one_hot(y, self.num_classes, x.dtype)
        ymap = yo[:, :, None, None]
        a = self.negative_slope
        h = F.leaky_relu(self.conv0(torch.cat([x, ymap.expand(-1, -1, *x.shape[2:])], 1)), a)
        h = F.leaky_relu(self.conv1(torch.cat([h, ymap.expand(-1, -1, *h.shape[2:])], 1)), a)
        h = F.leaky_relu(self.fc0(torch.cat([h.flatten(1), yo], 1)), a)
        return self.fc1(torch.cat([h, yo], 1)).squeeze(1)


class LoopTeacherEnsemble:
    """Reference implementation: a Python list of teacher modules, one Adam optimizer each.

    What the official code does (minus its shared Adam moments). Used by the tests (equivalence)
    and the throughput measure of ``benchmarks/results/teacher_throughput_cpu.md`` (baseline); far too slow for thousands of teachers.
    """

    def __init__(self, teachers: Sequence[nn.Module], *, lr: float = 1e-3, betas: tuple[float, float] = (0.5, 0.999)) -> None:
        self.teachers = list(teachers)
        self.optimizers = [torch.optim.Adam(t.parameters(), lr=lr, betas=betas) for t in self.teachers]

    @classmethod
    def from_ensemble(cls, ensemble: TeacherEnsemble, **kw) -> "LoopTeacherEnsemble":
        return cls([ensemble.export_teacher(i) for i in range(ensemble.num_teachers)], **kw)

    def __len__(self) -> int:
        return len(self.teachers)

    def teacher_step(self, real_x, real_y, fake_x, fake_y) -> float:
        """One Adam step per teacher on its BCE(real→1) + BCE(fake→0); returns the summed loss."""
        fake_x = fake_x.detach()
        total = 0.0
        for i, (t, opt) in enumerate(zip(self.teachers, self.optimizers)):
            opt.zero_grad(set_to_none=True)
            lr_, lf_ = t(real_x[i], real_y[i]), t(fake_x, fake_y)
            loss = (F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_))
                    + F.binary_cross_entropy_with_logits(lf_, torch.zeros_like(lf_)))
            loss.backward()
            opt.step()
            total += float(loss.detach())
        return total

    def per_teacher_input_grads(self, x, y) -> torch.Tensor:
        """``[T, m, d]`` descent directions −∂L_G,t/∂x, one backward per teacher."""
        out = []
        for t in self.teachers:
            xx = x.detach().clone().requires_grad_(True)
            lo = t(xx, y)
            loss = F.binary_cross_entropy_with_logits(lo, torch.ones_like(lo))
            (g,) = torch.autograd.grad(loss, xx)
            out.append(-g.reshape(x.shape[0], -1))
        return torch.stack(out)
