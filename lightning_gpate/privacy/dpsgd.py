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
* :func:`bookkeeping_clipped_sums`: the clipped sums without any per-sample gradient of the whole
  model: one forward that keeps each layer's input, one backward for the layers' output gradients
  only, each sample's gradient norm layer by layer from those two (materialised per layer where that
  is cheaper, by the "ghost" Gram products where a layer's positions are few against its weights), then
  each layer's clipped sum as one weighted einsum ("book-keeping", Bu et al. 2023; ghost clipping, Li
  et al. 2022).
* :class:`HooklessModule`: holds the module as ``_module`` like opacus' ``GradSampleModule`` (the same
  state-dict keys, so checkpoints move between the two implementations) without hooks.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["padded_batches", "physical_batch_size_for", "per_sample_gradients", "clip_factors", "HooklessModule",
           "PatchGradConv2d", "use_patch_grad_convs", "bookkeeping_clipped_sums", "bookkeeping_supports"]


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


def _is_tap_conv(layer: nn.Module) -> bool:
    """A convolution applied to constant maps, computed from its taps (the nets' ``LabelTapConv``): known by
    what it holds (``conv`` and the ``tap_mask`` ``V``), so that this privacy module imports no network layer."""
    return isinstance(getattr(layer, "conv", None), nn.Conv2d) and isinstance(getattr(layer, "tap_mask", None), torch.Tensor)


def _bookkeeping_layers(module: nn.Module) -> list[nn.Module]:
    """The layers whose per-sample gradients :func:`bookkeeping_clipped_sums` computes: ``nn.Linear``,
    ``nn.Conv2d`` (groups 1, dilation 1, zero padding) and tap convolutions (:func:`_is_tap_conv`)."""
    layers = []
    for layer in module.modules():
        if _is_tap_conv(layer) or isinstance(layer, nn.Linear) or (
                isinstance(layer, nn.Conv2d) and layer.groups == 1 and layer.dilation == (1, 1)
                and layer.padding_mode == "zeros" and not isinstance(layer.padding, str)):
            layers.append(layer)
    return layers


def _bookkeeping_parameters(layer: nn.Module) -> list[torch.Tensor]:
    conv = layer.conv if _is_tap_conv(layer) else layer
    return [p for p in (conv.weight, conv.bias) if p is not None]


def bookkeeping_supports(module: nn.Module) -> bool:
    """Whether every trainable parameter of ``module`` belongs to a layer :func:`bookkeeping_clipped_sums`
    handles. (A parameter also read outside its layer's call would make the sums wrong: the critics here
    read theirs only through their layers; the tests compare the sums with a per-sample loop.)"""
    owned = {id(p) for layer in _bookkeeping_layers(module) for p in _bookkeeping_parameters(layer)}
    return all(id(p) in owned for p in module.parameters() if p.requires_grad)


#: A convolution's per-sample weight gradients are materialised (one batched matmul, then the sums from them) up to
#: this many entries in all, beyond it (and where the layer's positions L are few: 2L² < its weights) taken by ghost
#: norms and weight gradients: on a CPU the materialised ones cost less arithmetic (the ghost way pays two weight
#: gradients for the sums); above ~64 MB of them (the configs' width-48 critic: 0.3-0.7 GB a layer) memory decides.
GHOST_ABOVE = 1 << 24


def _squared_norms(t: torch.Tensor) -> torch.Tensor:
    """Each sample's squared L2 norm of ``t`` ``[n, ...]`` (one reduction, no squared copy)."""
    return torch.linalg.vector_norm(t.flatten(1), dim=1).square()


def _layer_terms(layer: nn.Module, a: torch.Tensor, g: torch.Tensor):
    """For each parameter of ``layer`` (weight, then bias) given its input ``a`` and output gradient
    ``g`` over n samples: ``(squared per-sample norms [n], summer)``, ``summer(w, rows)`` for weights ``w`` ``[k, n]``
    the k sums ``Σ_i w_ji · (sample i's gradient)``, flat: ``[k, numel]`` (``rows[j]``: a slice outside which
    ``w_j`` is 0, which a weight gradient need not visit)."""
    n = a.shape[0]
    if _is_tap_conv(layer):  # W[o, c, k]: sample i's gradient is v_i[c] · (g_i V^T)[o, k]
        conv = layer.conv
        gl = g.flatten(2)  # [n, O, P]
        gv = torch.matmul(gl, layer.tap_mask.t().to(g.dtype))  # [n, O, kh·kw]
        w_norm2 = _squared_norms(gv) * _squared_norms(a)
        terms = [(w_norm2, lambda w, rows: torch.einsum("jnc,nok->jock", w[:, :, None] * a, gv).flatten(1))]
        if conv.bias is not None:
            gb = gl.sum(2)
            terms.append((gb.pow(2).sum(1), lambda w, rows: w @ gb))
        return terms
    if isinstance(layer, nn.Linear):
        a2, g2 = a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])  # [n, T, K], [n, T, O]
        if a2.shape[1] == 1:  # one position: the gradient is the outer product g ⊗ a, its norm |g|·|a|
            a1, g1 = a2[:, 0], g2[:, 0]
            terms = [(g1.pow(2).sum(1) * a1.pow(2).sum(1), lambda w, rows: torch.einsum("jn,no,ni->joi", w, g1, a1).flatten(1))]
        else:
            per = torch.einsum("nto,ntk->nok", g2, a2)
            terms = [(_squared_norms(per), lambda w, rows: w @ per.flatten(1))]
        if layer.bias is not None:
            gb = g2.sum(1)
            terms.append((gb.pow(2).sum(1), lambda w, rows: w @ gb))
        return terms
    # nn.Conv2d: sample i's weight gradient is Σ_positions g_i[:, l] ⊗ patch_i[:, l] (opacus' formula)
    weight = layer.weight
    gl = g.flatten(2)  # [n, O, L]
    if a.shape[1] < 4:  # an image's few channels: one grouped convolution (cheaper here than copying its patches)
        per = _per_sample_conv_weight_grouped(layer, a, g).flatten(1)
        terms = [(_squared_norms(per), lambda w, rows: w @ per)]
    elif 2 * gl.shape[2] ** 2 < weight.numel() and len(gl) * weight.numel() > GHOST_ABOVE:
        # ghost norm (Li et al.): ‖Σ_l g_l ⊗ p_l‖² = Σ_{l,l'} (g_l·g_l')(p_l·p_l'), then the sums as weight gradients
        # (each an ordinary convolution backward): for layers whose per-sample gradients would be large
        patches, _ = _patches(a, layer)  # [n, L, K]
        gram = torch.matmul(gl.transpose(1, 2), gl) * torch.matmul(patches, patches.transpose(1, 2))
        terms = [(gram.sum((1, 2)), lambda w, rows: torch.stack([torch.ops.aten.convolution_backward(
            g[r] * wk[r, None, None, None], a[r], weight, None, layer.stride, layer.padding, (1, 1), False, (0, 0), 1,
            (False, True, False))[1].flatten() for wk, r in zip(w, rows)]))]
    else:  # each sample's gradient, one batched matmul
        patches, channels_last = _patches(a, layer)  # [n, L, K]
        per = torch.matmul(gl, patches)  # [n, O, K]
        o, c, kh, kw = weight.shape
        order = (lambda t: t.view(-1, o, kh, kw, c).permute(0, 1, 4, 2, 3).flatten(1)) if channels_last else (lambda t: t)
        terms = [(_squared_norms(per), lambda w, rows: order(w @ per.flatten(1)))]
    if layer.bias is not None:
        gb = gl.sum(2)
        terms.append((gb.pow(2).sum(1), lambda w, rows: w @ gb))
    return terms


def _per_sample_conv_weight_grouped(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Each sample's weight gradient ``[n, O, C, kh, kw]`` of a convolution as one grouped convolution (a group per
    sample) of the padded input with the output gradient as its kernel, dilated by the stride."""
    n, c = a.shape[:2]
    (kh, kw), (ph, pw) = layer.kernel_size, layer.padding
    out_ch, oh, ow = g.shape[1:]
    x = nn.functional.pad(a, (pw, pw, ph, ph)).transpose(0, 1)  # [C, n, H+2p, W+2p]: the samples as channels
    out = nn.functional.conv2d(x, g.reshape(n * out_ch, 1, oh, ow), groups=n, dilation=layer.stride)  # [C, n·O, ≥kh, ≥kw]
    return out[:, :, :kh, :kw].reshape(c, n, out_ch, kh, kw).permute(1, 2, 0, 3, 4)


def _patches(a: torch.Tensor, layer: nn.Conv2d) -> tuple[torch.Tensor, bool]:
    """The convolution's input patches ``[n, L, K]`` (``unfold(a)`` transposed) by one copy of a strided view of
    the padded input (CPU ``unfold`` loops over the samples: 2-40x slower here), and whether K is ordered
    (kh, kw, C) (from the channels-last input: contiguous runs of C; for C >= 4) instead of (C, kh, kw)."""
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    n, c = a.shape[:2]
    if c >= 4:
        padded = nn.functional.pad(a.permute(0, 2, 3, 1), (0, 0, pw, pw, ph, ph))  # [n, H+2p, W+2p, C]
        view = padded.unfold(1, kh, sh).unfold(2, kw, sw)  # [n, H', W', C, kh, kw]
        return view.permute(0, 1, 2, 4, 5, 3).reshape(n, view.shape[1] * view.shape[2], kh * kw * c), True
    view = nn.functional.pad(a, (pw, pw, ph, ph)).unfold(2, kh, sh).unfold(3, kw, sw)  # [n, C, H', W', kh, kw]
    return view.permute(0, 2, 3, 1, 4, 5).reshape(n, view.shape[2] * view.shape[3], c * kh * kw), False


def bookkeeping_clipped_sums(module: nn.Module, sample_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                             x: torch.Tensor, y: torch.Tensor, flag: torch.Tensor, max_grad_norm: float,
                             weights: torch.Tensor, params: Sequence[torch.Tensor], rows: Sequence[slice] | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of clipped per-sample gradients without materialising the model's per-sample gradients
    ("book-keeping", Bu, Wang, Zha & Karypis 2023, Alg. 1; ghost norms, Li et al. 2022, §4):

    one forward of ``module(x, y)`` keeping each layer's input ``a`` and output ``z``; one backward of
    ``Σ_i sample_loss(score_i, flag_i)`` to the outputs ``z`` only (no parameter gradient: each sample's
    ``∂ℓ_i/∂z_i``, the samples being independent); sample i's gradient norm over all parameters from
    ``(a_i, ∂ℓ_i/∂z_i)`` layer by layer (each sample's layer gradient as one batched matmul of its patches,
    or its "ghost" norm from the two Gram matrices where the layer has few positions against its weights);
    its clip factor ``min(1, C / (‖g_i‖ + 1e-6))`` (opacus'); then the sums
    ``Σ_i weights[j, i] · factor_i · g_i`` layer by layer (one matmul, or the layer's weight gradient of the
    weighted output gradient).

    Returns the sums ``[k, P]`` (``weights`` ``[k, n]``; ``rows``: for each of the k, a slice of the samples
    outside which its weights are 0, default all), flat in the order of ``params`` (the module's parameters),
    and the module's outputs (no gradient). Every trainable parameter must belong to a handled layer
    (:func:`bookkeeping_supports`), called once."""
    layers = _bookkeeping_layers(module)
    record: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

    def keep(layer, inputs, output):
        record.append((layer, inputs[0].detach(), output))

    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.enable_grad():
            scores = module(x, y).reshape(-1)
            grads = torch.autograd.grad(sample_loss(scores, flag).sum(), [out for _, _, out in record])
    finally:
        for handle in handles:
            handle.remove()
    terms = {}
    for (layer, a, _), g in zip(record, grads):
        if any(id(p) in terms for p in _bookkeeping_parameters(layer)):
            raise ValueError(f"{type(layer).__name__} was called twice in one forward: book-keeping needs each layer once")
        for p, term in zip(_bookkeeping_parameters(layer), _layer_terms(layer, a, g)):
            terms[id(p)] = term
    missing = [tuple(p.shape) for p in params if id(p) not in terms]
    if missing:
        raise ValueError(f"book-keeping found no layer call for parameters of shapes {missing}: use per-sample gradients by vmap")
    ordered = [terms[id(p)] for p in params]
    norms = torch.stack([norm2 for norm2, _ in ordered]).sum(0).sqrt()
    factor = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    clipped = weights * factor
    rows = [slice(None)] * len(weights) if rows is None else rows
    return torch.cat([summer(clipped, rows) for _, summer in ordered], dim=1), scores.detach()
