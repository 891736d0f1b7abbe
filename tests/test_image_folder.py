"""A user's own images (issue 61): a folder of class folders (or an .npz, or arrays) in, a private generator and PNG
folders out. The folder is the embedded 8×8 digits written as PNGs, as a user's scans would be."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clitools import ROOT, assert_one_line_error, run_cli, run_cli_many, store_snapshot
from datamodules import DataError, ImageDataModule
from datamodules.folder import read_image_folder

DIGITS = [str(d) for d in range(10)]
CLASSES = "[" + ",".join(DIGITS) + "]"
pytestmark = pytest.mark.xdist_group("image_folder")


def digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.round(digits.images * (255.0 / 16.0)).astype(np.uint8), digits.target.astype(np.int64)


def write_digit_folder(root: Path, limit: int | None = None, *, mode: str = "L") -> Path:
    """The digits as PNGs, ``root/<digit>/<index>.png`` (grey, or the same grey as RGB)."""
    images, labels = digits_uint8()
    for i, (image, label) in enumerate(zip(images[:limit], labels[:limit])):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).convert(mode).save(folder / f"{i:04d}.png")
    return root


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory) -> Path:
    return write_digit_folder(tmp_path_factory.mktemp("folder") / "digits")


# ----------------------------------------------------------------------------- reading
def test_a_folder_reads_as_the_digits_it_holds(digit_folder):
    x, y, names, private = read_image_folder(digit_folder, classes=list(range(10)))
    images, labels = digits_uint8()
    assert names == DIGITS and private == []
    assert x.shape == (len(images), 1, 8, 8) and x.dtype == torch.uint8
    # files in name order within each class folder: the same images with the same labels
    order = np.argsort(labels, kind="stable")
    assert torch.equal(x[:, 0], torch.from_numpy(images[order])) and torch.equal(y, torch.from_numpy(labels[order]))
    # through the DataModule: the keyed split, the spec, 8-bit range
    dm = ImageDataModule("folder", root=str(digit_folder), classes=list(range(10)), val_fraction=0.1, test_fraction=0.2)
    assert dm.spec["shape"] == [1, 8, 8] and dm.spec["class_names"] == DIGITS and dm.spec["value_max"] == 255.0
    assert sum(len(dm.splits[s][1]) for s in ("train", "val", "test")) == len(images)


def test_undeclared_classes_are_private_metadata_and_private_models_refuse_them(digit_folder):
    from lightning_gpate.models import DPMERF
    from lightning_gpate.models.private import PrivateMetadataError

    dm = ImageDataModule("folder", root=str(digit_folder))
    assert dm.spec["class_names"] == DIGITS and dm.spec["private_metadata"] == ["label"]
    with pytest.raises(PrivateMetadataError, match="data.classes"):
        DPMERF(dm.spec, epsilon=1.0, delta=1e-5)


def test_colour_and_sizes_are_declared_or_the_same_for_every_file(tmp_path):
    root = write_digit_folder(tmp_path / "rgb", 60, mode="RGB")
    x, _, _, _ = read_image_folder(root, classes=list(range(10)))
    assert x.shape[1:] == (3, 8, 8) and torch.equal(x[:, 0], x[:, 2])  # grey saved as RGB stays RGB (it was given so)
    grey, _, _, _ = read_image_folder(root, classes=list(range(10)), channels=1)
    assert grey.shape[1:] == (1, 8, 8) and torch.equal(grey[:, 0], x[:, 0])  # r = g = b: its luma is itself
    # one colour file among grey ones, one 12×12 among 8×8: each an error naming the file, unless declared
    mixed = write_digit_folder(tmp_path / "mixed", 60)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(mixed / "5" / "zz_colour.png")
    with pytest.raises(DataError, match=r"zz_colour\.png: a 8×8 colour image, but .* is a 8×8 grey image: declare data\.channels"):
        read_image_folder(mixed, classes=list(range(10)))
    assert read_image_folder(mixed, classes=list(range(10)), channels=3)[0].shape[1:] == (3, 8, 8)
    (mixed / "5" / "zz_colour.png").unlink()
    Image.fromarray(np.zeros((12, 12), np.uint8)).save(mixed / "5" / "zz_big.png")
    with pytest.raises(DataError, match=r"zz_big\.png: a 12×12 grey image, .* declare data\.image_size"):
        read_image_folder(mixed, classes=list(range(10)))
    resized, _, _, _ = read_image_folder(mixed, classes=list(range(10)), image_size=16)
    assert resized.shape[1:] == (1, 16, 16)
    # hidden files (a file browser's) are skipped; a JPEG is read
    (mixed / ".DS_Store").write_bytes(b"\0\1")
    (mixed / "5" / "zz_big.png").unlink()
    Image.fromarray(np.full((8, 8), 200, np.uint8)).save(mixed / "5" / "photo.JPG", format="JPEG", quality=95)
    x, y, _, _ = read_image_folder(mixed, classes=list(range(10)))
    assert len(x) == 61 and abs(int(x[y == 5][-1].float().mean()) - 200) <= 2


def test_an_npz_and_arrays_read_as_the_folder_does(tmp_path, digit_folder):
    images, labels = digits_uint8()
    np.savez(tmp_path / "d.npz", images=images, labels=labels)
    from_npz = ImageDataModule("npz", path=str(tmp_path / "d.npz"), classes=list(range(10)))
    from_folder = ImageDataModule("folder", root=str(digit_folder), classes=list(range(10)))
    from_arrays = ImageDataModule("arrays", images=images[..., None], labels=labels, classes=list(range(10)))
    for dm in (from_npz, from_arrays):  # the keyed split depends on each record's content only: the same splits
        for split in ("train", "test"):
            ours, theirs = dm.model_space(split), from_folder.model_space(split)
            assert sorted(map(tuple, ours[0].flatten(1).tolist())) == sorted(map(tuple, theirs[0].flatten(1).tolist()))
    assert from_npz.spec["layout"]["axes"] == "NHW" and from_arrays.spec["layout"]["axes"] == "NHWC"
    assert "images" not in from_arrays.hparams and "labels" not in from_arrays.hparams  # never in a checkpoint
    with pytest.raises(DataError, match="float images must lie in \\[0, 1\\]"):
        ImageDataModule("arrays", images=images * 1.0, labels=labels, classes=list(range(10))).spec
    with pytest.raises(DataError, match="labels must be one per image"):
        ImageDataModule("arrays", images=images, labels=labels[:-1], classes=list(range(10))).spec
    with pytest.raises(DataError, match=r"images: some labels are not among the declared data.classes \['0', .*'8'\]: declare every class"):
        ImageDataModule("arrays", images=images, labels=labels, classes=list(range(9))).spec


# ----------------------------------------------------------------------------- bad input on the command line
def _bad_folders(base: Path) -> dict[str, tuple[list[str], list[str]]]:
    """A broken copy of a small digit folder per case: (extra command-line options, the error's fragments)."""
    source = write_digit_folder(base / "good", 40)
    cases = {}

    def case(name: str, fragments: list[str], extra: list[str] | None = None) -> Path:
        root = base / name
        shutil.copytree(source, root)
        cases[name] = (["--data.init_args.root", str(root), *(extra if extra is not None else ["--data.init_args.classes", CLASSES])],
                       fragments)
        return root

    root = case("truncated", ["truncated.png", "not a readable PNG or JPEG image, or truncated"])
    data = next((root / "3").iterdir()).read_bytes()
    (root / "3" / "truncated.png").write_bytes(data[: len(data) // 2])
    root = case("other_size", ["odd.png: a 9×9 grey image", "declare data.image_size"])
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(root / "4" / "odd.png")
    root = case("empty_class_folder", [f"{base / 'empty_class_folder' / '7'}: an empty class folder"])
    shutil.rmtree(root / "7")
    (root / "7").mkdir()
    root = case("file_outside_a_class_folder", ["stray.png: a file outside any class folder"])
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "stray.png")
    root = case("undeclared_class_folder", ["'cat' is not among the declared data.classes"])
    shutil.copytree(root / "1", root / "cat")
    case("declared_class_without_folder", ["the declared class '10' has no folder"],
         ["--data.init_args.classes", CLASSES[:-1] + ",10]"])
    root = case("not_an_image", ["notes.txt: not a PNG or JPEG file"])
    (root / "2" / "notes.txt").write_text("scanned on Tuesday\n")
    case("classes_not_declared", ["classes were read from the private labels", "declare them in data.classes"], [])
    case("missing_root", ["image folder not found"], ["--data.init_args.root", str(base / "nowhere")])
    return cases


def test_bad_folders_end_in_one_line_naming_the_file_before_anything_is_spent_or_written(tmp_path):
    cases = _bad_folders(tmp_path)
    config = str(ROOT / "configs" / "dpmerf_folder.yaml")
    commands = {name: ["fit", "--config", config, "--trainer.max_steps", "2", *extra] for name, (extra, _) in cases.items()}
    results = run_cli_many(commands, cwd=tmp_path)
    for name, (_, fragments) in cases.items():
        line = assert_one_line_error(results[name], "fit", *fragments)
        assert "\\x" not in line and len(line) < 400, line  # a name and what to do: no pixels
    store = tmp_path / "mlruns"
    assert not store.exists() or store_snapshot(store)["runs"] == {}  # no run: no ε charged, nothing logged
    assert not (tmp_path / "outputs").exists()


# ----------------------------------------------------------------------------- a user's run, end to end
def test_three_models_train_on_a_folder_and_sample_png_folders_that_classify_real_images(tmp_path, digit_folder):
    """DP-MERF at ε = 1 (its folder config, shortened): a classifier trained on its PNGs beats chance by a wide margin
    on the folder's held-out real images; G-PATE and DP-GAN run on the same folder at a guaranteed ε and sample
    PNG folders (a few steps: their utility is not this test's)."""
    from lightning_gpate.release import load_release, model_from_release

    folder = ["--data.init_args.dataset", "folder", "--data.init_args.root", str(digit_folder), "--data.init_args.classes", CLASSES]
    fast = ["--trainer.enable_progress_bar", "false", "--utility.enabled", "false", "--image_quality.enabled", "false"]
    runs = {
        "dpmerf": ["fit", "--config", str(ROOT / "configs/dpmerf_folder.yaml"), "--trainer.max_steps", "300",
                   "--model.init_args.num_features", "4000", *folder[2:], *fast],
        "gpate": ["fit", "--config", str(ROOT / "configs/gpate_digits_minimal.yaml"), "--trainer.max_steps", "3", *folder, *fast],
        "dpgan": ["fit", "--config", str(ROOT / "configs/dpgan_digits_minimal.yaml"), "--trainer.max_steps", "3", *folder, *fast],
    }
    results = run_cli_many(runs, cwd=tmp_path, timeout=900)
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr[-3000:])
        assert "folder, images 1×8×8, 10 classes" in result.stdout
        assert "an (ε, δ)-DP guarantee" in result.stdout
        release_path = next(line.split()[1] for line in result.stdout.splitlines() if line.strip().startswith("release"))
        release = load_release(release_path)
        model = model_from_release(release, source=release_path)
        assert 0 < model.guarantee_epsilon() <= model.epsilon_budget
        sampled = run_cli("sample", "--ckpt_path", release_path, "--num_samples", "600", "--output", f"{name}_samples", "--seed", "0",
                          cwd=tmp_path)
        assert sampled.returncode == 0, sampled.stderr[-3000:]
        out = tmp_path / f"{name}_samples"
        assert sorted(p.name for p in out.iterdir()) == DIGITS and (tmp_path / f"{name}_samples.png").is_file()
        assert sum(1 for _ in out.rglob("*.png")) == 600
        assert Image.open(next(out.rglob("*.png"))).mode == "L"
    # the samples read back as a folder, a classifier trained on them, tested on the folder's held-out real images
    from sklearn.linear_model import LogisticRegression

    synthetic = ImageDataModule("folder", root=str(tmp_path / "dpmerf_samples"), classes=list(range(10)),
                                val_fraction=0.0, test_fraction=0.0)
    real = ImageDataModule("folder", root=str(digit_folder), classes=list(range(10)))
    assert synthetic.spec["num_train"] == 600 and real.spec["shape"] == [1, 8, 8]
    x, y = synthetic.splits["train"]
    test_x, test_y = real.splits["test"]  # the keyed test split: never trained on (DP-MERF's test_fraction is the same)
    classifier = LogisticRegression(max_iter=2000).fit(x.flatten(1).numpy() / 255.0, y.numpy())
    accuracy = classifier.score(test_x.flatten(1).numpy() / 255.0, test_y.numpy())
    assert accuracy > 0.6, accuracy  # chance: 0.1
    # nothing is overwritten
    again = run_cli("sample", "--ckpt_path", release_path, "--num_samples", "5", "--output", "dpmerf_samples", cwd=tmp_path)
    assert_one_line_error(again, "sample", "exists and is not an empty folder")


# ----------------------------------------------------------------------------- the Python API
def test_the_python_api_takes_arrays_and_gives_arrays_back_with_its_mlflow_run(tmp_path, digit_folder):
    from conftest import query_run
    from lightning_gpate import Synthesizer
    from lightning_gpate.models.private import PrivateMetadataError

    images, labels = digits_uint8()
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    colour = np.repeat(images[..., None], 3, axis=-1) / 255.0  # [n, H, W, 3] floats in [0, 1]
    synth = Synthesizer("dpmerf", epsilon=1.0, delta=1e-5, max_steps=150, experiment="api-images", run_name="dpmerf-arrays",
                        progress_bar=False, utility_options={"cnn_epochs": 2}, num_features=2000)
    assert synth.fit(colour, names[labels], classes=list(names)) is synth
    out, out_labels = synth.sample(50, seed=1)
    assert out.shape == (50, 8, 8, 3) and out.dtype == np.float32 and 0.0 <= out.min() and out.max() <= 1.0
    assert set(out_labels) <= set(names) and out_labels.dtype.kind == "U"
    assert np.array_equal(out, synth.sample(50, seed=1)[0])  # seeded
    assert 0 < synth.epsilon <= 1.0 + 1e-9
    assert "arrays, images 3×8×8, 10 classes" in synth.summary and "an (ε, δ)-DP guarantee" in synth.summary
    run, client = query_run("api-images")
    assert run.info.run_id == synth.run_id and run.data.tags["release_artifact"] == synth.release_path
    assert run.data.metrics["utility/cnn_accuracy_val_selected"] == pytest.approx(synth.report["cnn_accuracy_val_selected"])
    call = (Path(client.download_artifacts(run.info.run_id, "synthesizer.json"))).read_text()
    assert "arrays [8, 8, 3]" in call and "zero" in call and str(images[0, 3].tolist()) not in call  # the source named, no pixels
    loaded = Synthesizer.load(synth.release_path)
    again, again_labels = loaded.sample(50, seed=1)
    assert np.array_equal(again, out) and np.array_equal(again_labels, out_labels)  # the release gives the same arrays back
    # uint8 grey in → uint8 grey out, with the declared class values; a folder path works the same
    grey = Synthesizer("dpmerf", epsilon=1.0, delta=1e-5, max_steps=5, evaluate=False, log_samples=False, progress_bar=False,
                       experiment="api-images", num_features=500).fit(images, labels, classes=list(range(10)))
    x, y = grey.sample(20)
    assert x.shape == (20, 8, 8) and x.dtype == np.uint8 and y.dtype.kind == "i" and set(y.tolist()) <= set(range(10))
    from_folder = Synthesizer("dpmerf", epsilon=1.0, delta=1e-5, max_steps=5, evaluate=False, log_samples=False,
                              progress_bar=False, experiment="api-images", num_features=500).fit(str(digit_folder), classes=DIGITS)
    x, y = from_folder.sample(20)
    assert x.shape == (20, 8, 8) and x.dtype == np.uint8 and set(y.tolist()) <= set(DIGITS)
    # undeclared classes: refused by a private model before anything runs; a table's arguments are refused for images
    with pytest.raises(PrivateMetadataError, match="data.classes"):
        Synthesizer("dpmerf", epsilon=1.0, delta=1e-5, max_steps=5).fit(images, labels)
    with pytest.raises(TypeError, match="images need their labels"):
        Synthesizer("dpmerf", epsilon=1.0, delta=1e-5).fit(images)
    with pytest.raises(TypeError, match="label, schema and class_ratio are for tables: a table must be a pandas DataFrame"):
        Synthesizer("dpmerf", epsilon=1.0, delta=1e-5).fit(images, labels, label="y")
