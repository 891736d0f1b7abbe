"""DP-SGD's per-sample step without hooks: fixed-shape Poisson batches and vectorised per-sample gradients.

Opacus computes per-sample gradients with module hooks (Python on every layer, every step, and a
batch whose size changes every step): the step is bound by the host (issue 48: 18.6 ms per critic step
on an H100, ~350 kernel launches). The pieces here let a step be one function of fixed-shape tensors,
which ``torch.compile`` can compile once:

* :func:`padded_batches`: a Poisson batch (Abadi et al. 2016, Alg. 1; every record kept with
  probability q, so its size varies) cut into physical batches of one fixed size, the last padded with
  masked rows. Every drawn record is used (no truncation), so the sampling the accountant charges is
  the Poisson sampling at rate q, unchanged; a masked row's weight is 0, so its clipped gradient adds
  exactly 0 to the sum ("masked DP-SGD": jax-privacy's ``is_padding_example``; Beltran et al. 2024).
* :func:`per_sample_gradients`: ``torch.func.vmap`` of ``torch.func.grad`` of the module's
  ``functional_call`` (each sample's own gradient, computed as a batch).
* :func:`clip_factors`: opacus' clipping factor ``min(1, C / (‖g_i‖ + 1e-6))`` of each sample's
  gradient over all parameters.
* :class:`PatchGradConv2d`: a convolution whose weight gradient is computed from the input's patches
  (opacus' formula: a sample's gradient is ``Σ_positions g_out ⊗ patch``), which ``vmap`` turns into one
  batched matmul instead of a grouped convolution (slow on CPUs for wide layers).
* :class:`HooklessModule`: holds the module as ``_module`` like opacus' ``GradSampleModule`` (the same
  state-dict keys, so checkpoints move between the two implementations) without hooks.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["padded_batches", "physical_batch_size_for", "per_sample_gradients", "clip_factors", "HooklessModule",
           "PatchGradConv2d", "use_patch_grad_convs"]


def physical_batch_size_for(expected_batch_size: float, *, multiple: int = 8) -> int:
    """The default physical batch of a Poisson batch of expected size B: ``B + 3√B`` rounded up to a
    multiple of ``multiple``, so that one physical batch holds the whole Poisson batch but about once
    in 700 steps (a Poisson batch is ~Binomial(N, q): standard deviation ≤ √B); the rare larger batch
    takes a second physical batch, never truncated."""
    b = max(float(expected_batch_size), 1.0)
    return int(math.ceil((b + 3 * math.sqrt(b)) / multiple) * multiple)


def padded_batches(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A logical (Poisson) batch cut into physical batches of ``size`` rows: ``[(x, y, mask)]``, at least
    one (an empty batch is one all-masked physical batch: a noise-only step), every row of ``x`` in
    exactly one of them, the last padded with zero rows whose ``mask`` is 0 (``mask`` has ``x``'s float
    dtype: 1 for a record, 0 for padding)."""
    if size < 1:
        raise ValueError(f"the physical batch size must be >= 1, got {size}")
    n = len(y)
    chunks = max(1, -(-n // size))
    pad = chunks * size - n
    dtype = x.dtype if x.is_floating_point() else torch.float32
    mask = torch.ones(n, dtype=dtype, device=x.device)
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
        y = torch.cat([y, y.new_zeros((pad, *y.shape[1:]))])  # label 0: a valid label, masked anyway
        mask = torch.cat([mask, mask.new_zeros(pad)])
    return [(x[k * size:(k + 1) * size], y[k * size:(k + 1) * size], mask[k * size:(k + 1) * size]) for k in range(chunks)]


def per_sample_gradients(module: nn.Module, sample_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                         x: torch.Tensor, y: torch.Tensor, flag: torch.Tensor
                         ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each sample's gradient of ``sample_loss(module(x_i, y_i), flag_i)`` with respect to ``params``
    (``{name: [n, *shape]}``) and the module's outputs ``[n]``, by ``torch.func``: ``vmap`` over the
    samples of ``grad`` of the module's ``functional_call`` on one sample. ``flag``: a per-sample
    tensor the loss may read (e.g. whether the sample is a fake). The module must treat samples
    independently (no BatchNorm)."""
    from torch.func import functional_call, grad, vmap

    def one(p, b, xi, yi, fi):
        score = functional_call(module, (p, b), (xi.unsqueeze(0), yi.unsqueeze(0))).reshape(())
        return sample_loss(score, fi), score

    return vmap(grad(one, has_aux=True), in_dims=(None, None, 0, 0, 0))(params, buffers, x, y, flag)


def clip_factors(per_sample: Sequence[torch.Tensor], max_grad_norm: float) -> torch.Tensor:
    """``min(1, C / (‖g_i‖ + 1e-6))`` per sample (opacus' ``DPOptimizer.clip_and_accumulate``), ‖g_i‖ the
    L2 norm of sample i's gradient over all ``per_sample`` tensors ``[n, ...]``."""
    n = per_sample[0].shape[0]
    norms = torch.stack([g.reshape(n, -1).norm(dim=1) for g in per_sample], dim=1).norm(dim=1)
    return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)


class _PatchGradConv2dFunction(torch.autograd.Function):
    """``conv2d(x, W, b)`` (groups 1, zero padding, dilation 1) whose backward computes ``∂W`` as an einsum of
    the output gradient and the input's patches (im2col) and ``∂x`` as the
    transposed convolution; ``vmap`` gets its rule from these torch operations (``generate_vmap_rule``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias, stride, padding):
        return nn.functional.conv2d(x, weight, bias, stride, padding)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, stride, padding = inputs
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(grad_out, x, weight, None, ctx.stride, ctx.padding, (1, 1), False,
                                                         (0, 0), 1, (True, False, False))[0]
        if ctx.needs_input_grad[1]:
            patches = nn.functional.unfold(x, weight.shape[2:], padding=ctx.padding, stride=ctx.stride)  # [n, C·kh·kw, L]
            grad_w = torch.einsum("nol,nkl->ok", grad_out.flatten(2), patches).view_as(weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum((0, 2, 3))
        return grad_x, grad_w, grad_b, None, None


class PatchGradConv2d(nn.Conv2d):
    """``nn.Conv2d`` (the same parameters and function) whose weight gradient comes from the input's patches
    (:class:`_PatchGradConv2dFunction`): under ``torch.func.vmap`` each sample's weight gradient is a batched
    matmul. For groups 1, zero padding and dilation 1 (:func:`use_patch_grad_convs` checks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _PatchGradConv2dFunction.apply(x, self.weight, self.bias, self.stride, self.padding)


def use_patch_grad_convs(module: nn.Module, *, min_patch: int = 640) -> int:
    """Turn every plain ``nn.Conv2d`` of ``module`` whose patch (in channels × kernel area) has at least
    ``min_patch`` entries into a :class:`PatchGradConv2d` in place (parameters and state dict unchanged);
    returns how many. Narrower convolutions keep ``vmap``'s grouped convolution: on a CPU (1 thread) the
    patches made the width-48 critic's per-sample gradients 1.6x faster (patches of 768-3,072 entries) and
    the width-8 critic's slower (128-512 entries); ``benchmarks/results/dpgan_mnist_cpu.md``."""
    changed = 0
    for layer in module.modules():
        if (type(layer) is nn.Conv2d and layer.groups == 1 and layer.padding_mode == "zeros" and layer.dilation == (1, 1)
                and not isinstance(layer.padding, str) and layer.in_channels * math.prod(layer.kernel_size) >= min_patch):
            layer.__class__ = PatchGradConv2d
            changed += 1
    return changed


class HooklessModule(nn.Module):
    """``module`` held as ``_module``, as opacus' ``GradSampleModule`` holds it (the same state-dict keys),
    without its hooks: the module of a DP-SGD step that computes per-sample gradients with
    :func:`per_sample_gradients`. ``disable_hooks`` / ``enable_hooks`` exist and do nothing."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def disable_hooks(self) -> None:
        pass

    def enable_hooks(self) -> None:
        pass
