"""The image generator's upsampling: the paper's transposed convolutions paint a period-2 lattice, the
nearest + convolution layers do not; G-PATE takes either, and its release rebuilds the same generator."""

from __future__ import annotations

import pytest
import torch

from datamodules import ImageDataModule
from lightning_gpate.models import GPATE
from lightning_gpate.nets.generators import ConditionalDCGANGenerator
from lightning_gpate.release import build_release, model_from_release


def _interior_lattice(upsample: str) -> float:
    """How much the last layer's output of a spatially constant input varies inside the image (no
    borders): a period-2 pattern there is the checkerboard every sample carries."""
    torch.manual_seed(0)
    gen = ConditionalDCGANGenerator(z_dim=4, num_classes=3, out_shape=(1, 28, 28), gf_dim=4, fc_dim=8, upsample=upsample)
    with torch.no_grad():
        out = gen.up2(torch.ones(1, 2 * 4 + 3, 14, 14))
    inner = out[0, 0, 4:-4, 4:-4]
    return float(inner.std() / inner.abs().mean())


def test_transposed_layers_paint_a_lattice_and_nearest_layers_do_not():
    assert _interior_lattice("transposed") > 0.05  # 5x5 kernels at stride 2 overlap unevenly
    assert _interior_lattice("nearest") < 1e-6


def test_both_generators_have_the_papers_shapes():
    for upsample in ConditionalDCGANGenerator.UPSAMPLE:
        gen = ConditionalDCGANGenerator(z_dim=5, num_classes=10, out_shape=(1, 28, 28), gf_dim=8, fc_dim=16, upsample=upsample)
        x = gen(torch.randn(6, 5), torch.arange(6))
        assert x.shape == (6, 1, 28, 28) and x.abs().max() <= 1
    with pytest.raises(ValueError, match="upsample must be one of"):
        ConditionalDCGANGenerator(z_dim=5, num_classes=10, out_shape=(1, 28, 28), upsample="bilinear")


def test_gpate_release_rebuilds_the_nearest_generator():
    spec = {**ImageDataModule("digits").spec, "num_teachers": 4}
    model = GPATE(spec, epsilon=10.0, z_dim=8, gf_dim=8, fc_dim=16, fake_batch_size=4, generator_upsample="nearest", noise_seed=0)
    assert any(isinstance(m, torch.nn.Upsample) for m in model.generator.modules())
    with torch.no_grad():  # weights that differ from a fresh model's
        for p in model.generator.parameters():
            p.add_(0.1)
    released = model_from_release(build_release(model))
    assert any(isinstance(m, torch.nn.Upsample) for m in released.generator.modules())
    a, _ = model.generate(5, seed=3)
    b, _ = released.generate(5, seed=3)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="generator.upsample must be one of"):
        GPATE(spec, epsilon=10.0, generator_upsample="bilinear")


def test_generating_an_unknown_class_is_refused_in_one_line():
    """The generators' one-hot is a comparison (it runs under vmap), so a label outside the classes would
    silently condition on no class: ``generate`` refuses it."""
    spec = {**ImageDataModule("digits").spec, "num_teachers": 4}
    model = GPATE(spec, epsilon=10.0, z_dim=8, gf_dim=8, fc_dim=16, fake_batch_size=4, noise_seed=0)
    images, labels = model.generate(3, labels=torch.tensor([0, 9, 4]))
    assert images.shape[0] == 3 and labels.tolist() == [0, 9, 4]
    for bad in ([0, 10], [-1, 2]):
        with pytest.raises(ValueError, match=r"labels must be classes 0\.\.9"):
            model.generate(2, labels=torch.tensor(bad))


@pytest.mark.parametrize("upsample", ConditionalDCGANGenerator.UPSAMPLE)
def test_the_cpu_convolution_layout_changes_no_value_or_gradient(monkeypatch, upsample):
    """The generator runs its convolutions channels-last on the CPU (for speed): its images and every weight's
    gradient equal those of the default layout (in float64, to rounding)."""
    import lightning_gpate.nets.generators as generators

    torch.manual_seed(0)
    gen = ConditionalDCGANGenerator(z_dim=5, num_classes=10, out_shape=(1, 28, 28), gf_dim=8, fc_dim=16, upsample=upsample).double()
    z, y, w = torch.randn(40, 5, dtype=torch.float64), torch.arange(40) % 10, torch.randn(40, 1, 28, 28, dtype=torch.float64)

    def images_and_weight_gradients():
        gen.zero_grad()
        out = gen(z, y)
        (out * w).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in gen.named_parameters()}

    out_fast, grads_fast = images_and_weight_gradients()
    assert out_fast.is_contiguous()
    monkeypatch.setattr(generators, "conv_layout", lambda x: x)
    out_plain, grads_plain = images_and_weight_gradients()
    torch.testing.assert_close(out_fast, out_plain, rtol=1e-12, atol=1e-12)
    for name, grad in grads_plain.items():
        # atol: a bias just before a batch norm has a true gradient of 0, both layouts give rounding noise (~1e-15)
        torch.testing.assert_close(grads_fast[name], grad, rtol=1e-9, atol=1e-9, msg=name)


def test_the_nearest_layers_phase_convolution_equals_upsampling_then_convolving():
    """The nearest generator computes ×2 upsampling then a 5×5 convolution as one 3×3 convolution into four phase maps
    (its label maps without convolving them): its images and every weight's gradient equal those of the plain
    ``Upsample`` then ``Conv2d`` of the same weights on the label maps concatenated (float64, to rounding), and its
    state dict keeps the plain layers' names (old releases load)."""
    import torch.nn.functional as F

    from lightning_gpate.nets.generators import concat_label_maps, one_hot

    torch.manual_seed(0)
    gen = ConditionalDCGANGenerator(z_dim=5, num_classes=10, out_shape=(1, 28, 28), gf_dim=8, fc_dim=16, upsample="nearest").double()
    assert {"up1.0.1.weight", "up1.0.1.bias", "up2.1.weight", "up2.1.bias"} <= set(gen.state_dict())
    z, y, w = torch.randn(40, 5, dtype=torch.float64), torch.arange(40) % 10, torch.randn(40, 1, 28, 28, dtype=torch.float64)

    def plain(layer, h, yo):
        return layer[1](F.interpolate(concat_label_maps(h, yo), scale_factor=2, mode="nearest"))

    def plain_forward(z, y):
        yo = one_hot(y, 10)
        h = gen.fc1(torch.cat([gen.fc0(torch.cat([z, yo], 1)), yo], 1)).view(-1, 16, 7, 7)
        h = gen.up1[2](gen.up1[1](plain(gen.up1[0], h, yo)))
        return torch.tanh(plain(gen.up2, h, yo))

    results = []
    for forward in (gen, plain_forward):
        gen.zero_grad()
        out = forward(z, y)
        (out * w).sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in gen.named_parameters()}))
    (fast, fast_grads), (slow, slow_grads) = results
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    for name, grad in slow_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-9, atol=1e-9, msg=name)
