"""Inception Score, FID and CNN accuracy: checked against their formulas, then on real digits."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from datamodules import ImageDataModule
from lightning_gpate.evaluation import FeatureNetUnavailable, ImageQualityEvaluator, cnn_utility, frechet_distance, inception_score
from lightning_gpate.evaluation.image import find_inception_weights

# The module fixtures train the feature network once: keep its tests on one worker (pytest-xdist).
pytestmark = pytest.mark.xdist_group("evaluation_image")


class _PixelLogits(nn.Module):
    """Logits read off the image: class = the first pixel's value (an integer), confidence `scale`."""

    def __init__(self, num_classes, scale):
        super().__init__()
        self.num_classes, self.scale = num_classes, scale

    def forward(self, x):
        return self.scale * nn.functional.one_hot(x[:, 0, 0, 0].long(), self.num_classes).double()


class _Flatten(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.num_features = dim

    def forward(self, x):
        return x.flatten(1).double()


def test_inception_score_matches_its_formula():
    k, n = 10, 1000
    classes = torch.arange(n) % k
    images = classes.view(n, 1, 1, 1).float().expand(n, 1, 2, 2).clone()
    # confident and uniform over k classes: IS = exp(H(p(y))) = k
    assert inception_score(_PixelLogits(k, 50.0), images, splits=1)[0] == pytest.approx(k, rel=1e-4)
    # in 4 random splits of 250 the class counts vary a little: p(y) is estimated per split
    mean, std = inception_score(_PixelLogits(k, 50.0), images, splits=10, min_split_size=250)
    assert k - 0.3 < mean < k and std > 0
    # one class only: IS = 1
    assert inception_score(_PixelLogits(k, 50.0), torch.zeros(n, 1, 2, 2))[0] == pytest.approx(1.0, abs=1e-4)
    # soft predictions, by hand: p(y|x) = softmax(s * onehot), IS = exp(E KL(p(y|x) || p(y))), one split
    s = 2.0
    p = torch.softmax(s * nn.functional.one_hot(classes, k).double(), dim=1)
    expected = math.exp(float((p * (p.log() - p.mean(0, keepdim=True).log())).sum(1).mean()))
    got, std = inception_score(_PixelLogits(k, s), images, splits=1)
    assert got == pytest.approx(expected, rel=1e-5) and math.isnan(std)


def test_inception_score_uses_fewer_splits_for_few_images():
    k = 10
    images = (torch.arange(400) % k).view(-1, 1, 1, 1).float().expand(-1, 1, 2, 2).clone()
    # 400 images -> one split of 400 (not ten of 40, whose p(y) estimates would bias IS low)
    mean, std = inception_score(_PixelLogits(k, 50.0), images, splits=10, min_split_size=250)
    assert mean == pytest.approx(k, rel=1e-3) and math.isnan(std)


def test_frechet_distance_matches_the_closed_form():
    from scipy.linalg import sqrtm

    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, (4000, 3))
    b = rng.normal([1.0, -2.0, 0.5], [1.0, 2.0, 0.5], (4000, 3))
    ta, tb = (torch.from_numpy(v).view(-1, 3, 1, 1) for v in (a, b))
    mu1, mu2 = a.mean(0), b.mean(0)
    c1, c2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    expected = float(((mu1 - mu2) ** 2).sum() + np.trace(c1 + c2 - 2 * sqrtm(c1 @ c2).real))
    assert frechet_distance(_Flatten(3), ta, tb) == pytest.approx(expected, rel=1e-4)
    assert frechet_distance(_Flatten(3), ta, ta) == pytest.approx(0.0, abs=1e-6)


class _OnDevice(nn.Module):
    """``inner`` behind a parameter that pins the module to a device: its outputs come back there."""

    def __init__(self, inner, device):
        super().__init__()
        self.inner, self.anchor = inner, nn.Parameter(torch.zeros((), device=device))

    def forward(self, x):
        return self.inner(x.to(self.anchor.device)) + self.anchor


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_is_and_fid_with_a_gpu_feature_net_and_cpu_images():
    """The first MNIST table run on an H200 failed in every row: the FID metric's sums were on the CPU,
    the GPU feature net's features on the GPU. The metric now lives where the net is."""
    rng = np.random.default_rng(0)
    ta, tb = (torch.from_numpy(rng.normal(m, 1.0, (600, 3))).view(-1, 3, 1, 1) for m in (0.0, 1.0))
    assert frechet_distance(_OnDevice(_Flatten(3), "cuda"), ta, tb) == pytest.approx(frechet_distance(_Flatten(3), ta, tb), rel=1e-6)
    images = (torch.arange(500) % 10).view(-1, 1, 1, 1).float().expand(-1, 1, 2, 2).clone()
    got = inception_score(_OnDevice(_PixelLogits(10, 2.0), "cuda"), images, splits=1)[0]
    assert got == pytest.approx(inception_score(_PixelLogits(10, 2.0), images, splits=1)[0], rel=1e-6)


@pytest.fixture(scope="module")
def digits():
    dm = ImageDataModule("digits")
    return dm.model_space("train"), dm.model_space("test")


@pytest.fixture(scope="module")
def digits_quality(digits):
    torch.set_num_threads(1)
    return ImageQualityEvaluator(*digits, num_classes=10)


def test_is_and_fid_of_real_digits_and_of_noise(digits, digits_quality):
    """Real digits: IS close to the number of classes and FID ≈ 0; noise: both degrade."""
    (train_x, _), (test_x, _) = digits
    base = digits_quality.real_baseline()
    assert base["feature_net_test_accuracy"] > 0.95
    assert 8.5 < base["inception_score_real"] <= 10.0  # the paper's real MNIST: 9.86
    assert base["fid_real_train_vs_reference"] < 10.0
    noise = torch.rand(len(test_x), *test_x.shape[1:], generator=torch.Generator().manual_seed(0)) * 2 - 1
    noisy = digits_quality.score(noise)
    assert noisy["inception_score"] < 4.0
    assert noisy["fid"] > 10 * max(base["fid_real_train_vs_reference"], 1.0)
    blurred = digits_quality.score((0.5 * train_x + 0.5 * noise.repeat(4, 1, 1, 1)[: len(train_x)]).clamp(-1, 1))
    assert base["fid_real_train_vs_reference"] < blurred["fid"] < noisy["fid"]  # worse images, larger FID
    assert digits_quality.score(test_x)["fid"] == pytest.approx(0.0, abs=1e-3)


def test_feature_classifier_is_trained_once_per_process(digits):
    from lightning_gpate.evaluation.image import feature_classifier

    first = feature_classifier(*digits, num_classes=10)
    assert feature_classifier(*digits, num_classes=10)[0] is first[0]


def test_cnn_accuracy_of_real_and_of_useless_images(digits):
    train, test = digits
    real = cnn_utility(train, test, num_classes=10, epochs=6, seed=0)
    assert real["cnn_accuracy_final"] > 0.9 and real["cnn_accuracy_val_selected"] > 0.9
    assert 1 <= real["cnn_selected_epoch"] <= 6
    assert real["cnn_accuracy_best_on_test_paper_style"] >= max(real["cnn_accuracy_final"], real["cnn_accuracy_val_selected"])
    assert real["cnn_num_train"] == len(train[1]) - round(0.1 * len(train[1]))  # 10% held out for selection
    shuffled = (train[0], train[1][torch.randperm(len(train[1]), generator=torch.Generator().manual_seed(0))])
    useless = cnn_utility(shuffled, test, num_classes=10, epochs=3, seed=0)
    assert useless["cnn_accuracy_final"] < 0.3


def test_selection_uses_the_given_validation_set_not_the_test_set(digits):
    train, test = digits
    # a validation set whose labels are all wrong: the epoch it selects is not the best on test
    wrong_val = (test[0], (test[1] + 1) % 10)
    out = cnn_utility(train, test, num_classes=10, val=wrong_val, epochs=4, seed=0)
    assert out["cnn_val_accuracy_best"] < 0.2
    assert out["cnn_num_train"] == len(train[1])  # nothing held out when a validation set is given


def test_rgb_without_local_inception_weights_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(FeatureNetUnavailable, match="inception_v3_google-0cc3c7bd.pth"):
        find_inception_weights()
    rgb = (torch.zeros(8, 3, 8, 8), torch.zeros(8, dtype=torch.long))
    with pytest.raises(FeatureNetUnavailable, match="image_quality.inception_weights"):
        ImageQualityEvaluator(rgb, rgb, num_classes=2)


def test_feature_classifier_cache_on_disk(digits, tmp_path, monkeypatch):
    from lightning_gpate.evaluation import image

    trained = image.feature_classifier(*digits, num_classes=10, epochs=1, seed=5, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("feature_classifier_*.pt"))) == 1
    monkeypatch.setattr(image, "_FEATURE_CLASSIFIERS", {})  # a new process
    monkeypatch.setattr(image, "train_classifier", lambda *a, **k: pytest.fail("retrained despite the cache"))
    loaded = image.feature_classifier(*digits, num_classes=10, epochs=1, seed=5, cache_dir=tmp_path)
    assert loaded[1] == trained[1]
    for a, b in zip(trained[0].state_dict().values(), loaded[0].state_dict().values()):
        assert torch.equal(a, b)


def test_image_utility_can_select_on_the_real_validation_split():
    from lightning_gpate.evaluation.report import image_utility
    from lightning_gpate.models import GAN

    dm = ImageDataModule("digits", val_fraction=0.1)
    model = GAN(dm.spec, z_dim=8, gf_dim=8, df_dim=8, fc_dim=16)
    out = image_utility(model, dm, num_samples=200, epochs=1, val_source="real_val")
    assert out["cnn_num_train"] == 200  # every generated image trains; the real val split selects
    with pytest.raises(ValueError, match="val_source must be"):
        image_utility(model, dm, val_source="test")


def test_the_real_fid_of_a_split_the_features_trained_on_is_estimated_from_its_halves(digits, tmp_path):
    """Features trained on the reference itself (a private model without a validation split): the real FID is what
    real images unseen by the features score against it, estimated from halves of the reference; computed once."""
    from lightning_gpate.evaluation import image as image_module
    from lightning_gpate.evaluation.image import frechet_distance

    (train_x, train_y), test = digits
    first = ImageQualityEvaluator(test, test, num_classes=10, same_split=True, feature_split="test")
    base = first.real_baseline(cache_dir=tmp_path)
    estimate = base["fid_real_reference_halves"]
    unseen = frechet_distance(first.features, test[0], train_x[: len(test[0])])  # what a perfect generator would score
    assert unseen / 2 < estimate < unseen * 2, (estimate, unseen)
    assert "feature_net_test_accuracy" not in base and "fid_real_test_vs_reference" not in base
    image_module._REAL_BASELINES.clear()  # a new process: read back from the cache folder, not computed again
    again = ImageQualityEvaluator(test, test, num_classes=10, same_split=True, feature_split="test")
    again.features = None  # computing anything would fail
    assert again.real_baseline(cache_dir=tmp_path) == base
