"""The pictures a user looks at: the ``sample`` command's PNG and the MLflow sample grids.

Images: one labelled class per row, small images enlarged to at least 48 pixels; real images beside
the synthetic ones only for a non-private model (its real test split) or from a public reference the
user gives, never a private model's data. Tables: a picture of a few columns' marginals beside the CSV.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

from conftest import query_run
from lightning_gpate.cli import main
from lightning_gpate.sampling import MIN_TILE_PX, image_grid

ROOT = Path(__file__).resolve().parents[1]
NO_EVALUATION = ["--utility.enabled", "false", "--image_quality.enabled", "false"]  # the pictures only
WHITE = 255


def _pixels(path_or_image) -> np.ndarray:
    image = path_or_image if isinstance(path_or_image, Image.Image) else Image.open(path_or_image)
    return np.asarray(image.convert("RGB"))


def _tile(unit: np.ndarray, scale: int) -> np.ndarray:
    """One image in [0, 1], ``[C, H, W]`` → how a grid draws it: ``[H·s, W·s, 3]`` uint8."""
    rgb = np.repeat(unit, 3, axis=0) if unit.shape[0] == 1 else unit
    arr = (rgb.transpose(1, 2, 0).astype(np.float32) * np.float32(255.0)).round().astype(np.uint8)
    return arr.repeat(scale, axis=0).repeat(scale, axis=1)


def _find(pixels: np.ndarray, tile: np.ndarray) -> list[tuple[int, int]]:
    """Every (top, left) where ``tile`` appears in ``pixels``, pixel for pixel."""
    h, w = tile.shape[:2]
    probe = int(np.argmax([len(np.unique(tile[r].reshape(-1, 3), axis=0)) for r in range(h)]))  # the most varied row
    rows = sliding_window_view(pixels, w, axis=1)  # [H, W - w + 1, 3, w]
    ys, xs = np.nonzero((rows == tile[probe].T[None, None]).all(axis=(2, 3)))
    hits = []
    for y, x in zip(ys - probe, xs):
        if 0 <= y <= pixels.shape[0] - h and np.array_equal(pixels[y:y + h, x:x + w], tile):
            hits.append((int(y), int(x)))
    return hits


def _class_rows(pixels: np.ndarray, images: np.ndarray, labels: np.ndarray, scale: int, *, per_class: int = 3):
    """The top of the row holding each class's first images (which all sit on one row, left to right)."""
    tops = {}
    for c in np.unique(labels):
        found = [_find(pixels, _tile(img, scale)) for img in images[labels == c][:per_class]]
        assert all(found), f"class {c}: an image of the class is not in the picture"
        top = found[0][0][0]
        lefts = [next(left for (t, left) in hits if t == top) for hits in found]  # the same row, left to right
        assert lefts == sorted(lefts) and len(set(lefts)) == len(lefts), (c, found)
        tops[int(c)] = top
    return tops


def _assert_labelled_rows_in_label_order(pixels: np.ndarray, tops: dict[int, int], tile_px: int, first_left: int):
    order = [tops[c] for c in sorted(tops)]
    assert order == sorted(order) and all(b - a >= tile_px for a, b in zip(order, order[1:])), order  # one class per row, in label order
    for c, top in tops.items():  # the class name is written at the row's start
        assert (pixels[top:top + tile_px, :first_left] < 128).any(), f"no label at the start of row {c}"


def test_grid_has_one_labelled_row_per_class_in_label_order_and_enlarges_small_images():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, 8, 8, generator=gen) * 2 - 1
    y = torch.randperm(60, generator=gen) % 6  # classes interleaved: the grid sorts them into rows
    grid = image_grid(x, y, ["zero", "one", "two", "three", "four", "five"], per_class=10)
    pixels = _pixels(grid)
    assert grid.width >= 10 * MIN_TILE_PX and grid.height >= 6 * MIN_TILE_PX
    images = ((x + 1) / 2).numpy()
    tops = _class_rows(pixels, images, y.numpy(), scale=MIN_TILE_PX // 8, per_class=10)
    first_left = min(left for c in range(6) for (_, left) in _find(pixels, _tile(images[y.numpy() == c][0], 6)))
    _assert_labelled_rows_in_label_order(pixels, tops, MIN_TILE_PX, first_left)


def test_large_images_are_not_enlarged_and_missing_images_leave_blanks():
    x = torch.zeros(3, 3, 64, 64)
    grid = image_grid(x, torch.tensor([0, 0, 1]), ["a", "b"], per_class=4)
    pixels = _pixels(grid)
    assert len(_find(pixels, _tile(np.full((3, 64, 64), 0.5, np.float32), 1))) == 3  # native size: grey tiles, no more
    assert grid.height < 2 * 64 + 60


def test_quickstart_sample_picture_is_readable_and_shows_no_real_data(tmp_path):
    """The README's first run: ``sample`` of the quickstart writes a ≥ 480×480 picture with one labelled
    class per row in label order, and, G-PATE being private, not one real digit in it (nor in MLflow's grid)."""
    from datamodules import ImageDataModule

    main(["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_steps", "1",
          "--data.num_teachers", "50", "--trainer.enable_progress_bar", "false",
          "--trainer.logger.init_args.experiment_name", "quick", *NO_EVALUATION])
    run, client = query_run("quick")
    assert main(["sample", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "1000", "--output", "samples.npz"]) == 0
    png = Image.open("samples.png")
    assert png.width >= 480 and png.height >= 480
    data = np.load("samples.npz")
    images, labels = data["images"] / 16.0, data["labels"]  # the digits' range is [0, 16]
    pixels = _pixels(png)
    tops = _class_rows(pixels, images, labels, scale=6)
    assert sorted(tops) == list(range(10))
    first_left = min(left for (_, left) in _find(pixels, _tile(images[labels == 0][0], 6)))
    _assert_labelled_rows_in_label_order(pixels, tops, 48, first_left)

    real = ImageDataModule("digits", test_fraction=0.2, val_fraction=0.0)
    mlflow_grid = _pixels(client.download_artifacts(run.info.run_id, "samples/samples_final.png"))
    assert mlflow_grid.shape[0] >= 480 and mlflow_grid.shape[1] >= 480
    for split in ("train", "test"):
        x, y = real.model_space(split)
        for c in range(10):
            digit = ((x[y == c][0] + 1) / 2).numpy()
            assert not _find(pixels, _tile(digit, 6)) and not _find(mlflow_grid, _tile(digit, 6)), (split, c)


def test_non_private_picture_shows_real_test_digits_beside_and_a_public_reference_when_given(tmp_path, capsys):
    from datamodules import ImageDataModule

    main(["fit", "--config", str(ROOT / "configs" / "gan_digits.yaml"), "--model.generator.z_dim", "8", "--model.generator.gf_dim", "8",
          "--model.discriminator.df_dim", "8", "--model.generator.fc_dim", "16", "--model.discriminator.fc_dim", "16", "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false", *NO_EVALUATION])
    run, client = query_run("digits")
    release = run.data.tags["release_artifact"]
    assert main(["sample", "--ckpt_path", release, "--num_samples", "200", "--output", "s.npz"]) == 0
    pixels = _pixels("s.png")
    config = __import__("yaml").safe_load((ROOT / "configs" / "gan_digits.yaml").read_text())["data"]["init_args"]
    x, y = ImageDataModule(**config).model_space("test")
    test_digit = ((x[y == 3][0] + 1) / 2).numpy()
    assert _find(pixels, _tile(test_digit, 6)), "the real test split is not beside a non-private model's samples"
    assert _find(_pixels(client.download_artifacts(run.info.run_id, "samples/samples_final.png")), _tile(test_digit, 6))

    marked = np.zeros((4, 1, 8, 8), np.float32)
    marked[:, :, ::2, ::2] = 16.0  # a checkerboard no digit looks like
    np.savez("public.npz", images=marked, labels=np.array([0, 1, 2, 3]))
    assert main(["sample", "--ckpt_path", release, "--num_samples", "200", "--output", "r.npz", "--reference", "public.npz"]) == 0
    assert len(_find(_pixels("r.png"), _tile(marked[0] / 16.0, 6))) == 4
    assert not _find(_pixels("r.png"), _tile(test_digit, 6))  # the reference replaces the test split


def test_table_sample_writes_a_marginal_picture_beside_the_csv(tmp_path):
    main(["fit", "--config", str(ROOT / "configs" / "gan_breast_cancer.yaml"), "--model.generator.hidden", "[16]", "--model.discriminator.hidden", "[16]",
          "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.experiment_name", "table", *NO_EVALUATION])
    run, _ = query_run("table")
    assert main(["sample", "--ckpt_path", run.data.tags["release_artifact"], "--num_samples", "50", "--output", "t.csv"]) == 0
    picture = Image.open("t.png")
    assert picture.width >= 480 and picture.height >= 150
    colours = {tuple(p) for p in _pixels(picture).reshape(-1, 3)[::7]}
    assert len(colours) > 10  # drawn, not blank


@pytest.mark.parametrize("private", [True, False])
def test_real_test_split_is_for_non_private_models_only(private):
    from datamodules import ImageDataModule
    from lightning_gpate.models import GAN, GPATE
    from lightning_gpate.release import build_release
    from lightning_gpate.evaluation.store import real_test_split

    dm = ImageDataModule("digits", num_teachers=20 if private else 0)
    model = GPATE(dm.spec, epsilon=1.0, delta=1e-5) if private else GAN(dm.spec, z_dim=8, gf_dim=8, df_dim=8, fc_dim=16)
    real = real_test_split(model, build_release(model, datamodule=dm))
    if private:
        assert real is None
    else:
        assert torch.equal(real[1], dm.model_space("test")[1])
