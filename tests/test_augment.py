"""The teachers' random translation (``teacher_augment_shift``): what a teacher trains on."""

import pytest
import torch
import torch.nn.functional as F

from datamodules import ImageDataModule
from lightning_gpate.models import GPATE
from lightning_gpate.nets.augment import random_translate


def _shifted(x, dy, dx, s):
    """``x`` [C, H, W] moved by (dy, dx) in [-s, s], edges replicated: the reference, one offset at a time."""
    H, W = x.shape[-2:]
    p = F.pad(x[None], (s, s, s, s), mode="replicate")[0]
    return p[:, s - dy:s - dy + H, s - dx:s - dx + W]


def test_every_image_is_itself_moved_by_its_own_offset_and_every_offset_occurs():
    s = 2
    x = torch.randn(3, 40, 2, 7, 9)
    out = random_translate(x, s, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype
    seen = set()
    for img, moved in zip(x.reshape(-1, 2, 7, 9), out.reshape(-1, 2, 7, 9)):
        hits = [(dy, dx) for dy in range(-s, s + 1) for dx in range(-s, s + 1) if torch.equal(moved, _shifted(img, dy, dx, s))]
        assert len(hits) == 1
        seen.add(hits[0])
    assert len(seen) == (2 * s + 1) ** 2  # 120 images: all 25 offsets drawn


def test_shift_zero_is_the_identity():
    x = torch.randn(4, 1, 5, 5)
    assert random_translate(x, 0) is x


def test_gpate_refuses_a_negative_shift_and_a_shift_of_tables():
    spec = ImageDataModule("digits", num_teachers=4).spec
    with pytest.raises(ValueError, match="teacher_augment_shift"):
        GPATE(spec, teacher_augment_shift=-1)
    table_spec = {**spec, "shape": [64]}
    with pytest.raises(ValueError, match="teacher_augment_shift"):
        GPATE(table_spec, teacher_augment_shift=1)


@pytest.mark.parametrize("shift", [0, 1])
def test_the_teachers_train_on_translated_real_digits_and_fakes(shift, monkeypatch):
    dm = ImageDataModule("digits", num_teachers=4, teacher_batch_size=6)
    dm.setup("fit")
    real_x, real_y = next(iter(dm.train_dataloader()))
    torch.manual_seed(0)
    model = GPATE(dm.spec, teacher_augment_shift=shift, fake_batch_size=8, z_dim=8, gf_dim=8, fc_dim=16,
                  teacher_channels=(4, 6), teacher_fc=8, noise_seed=0)
    seen = {}

    def capture(rx, ry, fx, fy, chunk_size=None):
        seen.update(real=rx.clone(), fake=fx.clone())
        return torch.zeros(())

    monkeypatch.setattr(model.teachers, "accumulate_teacher_grads", capture)
    model._teacher_step(real_x, real_y, torch.Generator().manual_seed(1))
    fakes, _ = model._teacher_fakes(real_y, torch.Generator().manual_seed(1))
    assert seen["real"].shape == real_x.shape and seen["fake"].shape == fakes.shape
    assert torch.equal(seen["real"], real_x) == (shift == 0)
    assert torch.allclose(seen["fake"], fakes) == (shift == 0)
    shape = dm.spec["shape"]
    for img, moved in zip(real_x.reshape(-1, *shape), seen["real"].reshape(-1, *shape)):
        assert any(torch.equal(moved, _shifted(img, dy, dx, max(shift, 0)))
                   for dy in range(-shift, shift + 1) for dx in range(-shift, shift + 1))
