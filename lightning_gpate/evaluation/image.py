"""Synthetic images: CNN accuracy (downstream utility), Inception Score and FID.

* **CNN accuracy** (G-PATE Sec. 5): a CNN trained on labelled synthetic images and tested on the real
  test split. Reported: the accuracy after the last epoch, and the accuracy at the epoch chosen on a
  validation set that is NOT the test set (a held-out part of the synthetic data, or the real
  validation split). G-PATE's tables report the best test accuracy over epochs, a selection on the
  test set; it is logged too, named ``..._paper_style``, only to compare with the paper.
* **Inception Score** ``IS = exp(E_x KL(p(y|x) || p(y)))`` (Salimans et al. 2016) and **FID**
  ``‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2(Σ_r Σ_g)^{1/2})`` (Heusel et al. 2017), computed with torchmetrics
  on a feature network: for grey (MNIST-like) images a :class:`ConvClassifier` trained on the real
  training split (IS from its softmax, FID from its penultimate features), as G-PATE and GS-WGAN do;
  for RGB images Inception-v3, only when its weights are available locally.

The feature network reads real data: the training split (the papers' setting, and the default for
non-private models) or, for private models, a held-out split (:func:`~lightning_gpate.evaluation.report.feature_split_of`):
a network trained on the private training split makes every IS/FID a function of it without noise.
Held-out splits are the evaluator's data, not covered by the model's ε.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_gpate.files import write_atomically
from lightning_gpate.nets.classifier import ConvClassifier

TORCHVISION_INCEPTION_FILE = "inception_v3_google-0cc3c7bd.pth"
FIDELITY_INCEPTION_FILE = "pt_inception-2015-12-05-6726825d.pth"
FEATURE_NET_VERSION = 1


class FeatureNetUnavailable(RuntimeError):
    """No feature network for IS/FID can be built here (e.g. Inception weights are not on disk)."""


MIN_TRAIN_STEPS = 300


# ----------------------------------------------------------------------------- CNN training
@contextlib.contextmanager
def small_image_threads(images: torch.Tensor, device: str | torch.device = "cpu"):
    """On CPU, run the small evaluation CNNs of small images (up to 32×32) on one thread: their
    convolutions are too small to split, and extra threads cost many times the work when the CPU
    is shared (measured: 8×8 digits, 12× the CPU time with 2 threads on a busy 2-core machine)."""
    if torch.device(device).type != "cpu" or images.shape[-1] * images.shape[-2] > 32 * 32:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _module_device(net: nn.Module) -> torch.device:
    """The device of ``net``'s parameters (or buffers); CPU for a module without either."""
    for tensor in (*net.parameters(), *net.buffers()):
        return tensor.device
    return torch.device("cpu")


def default_epochs(n: int, batch_size: int) -> int:
    """Epochs giving at least :data:`MIN_TRAIN_STEPS` optimizer steps, between 3 and 50."""
    return int(min(50, max(3, math.ceil(MIN_TRAIN_STEPS / max(1, math.ceil(n / batch_size))))))


@torch.no_grad()
def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024) -> float:
    """Top-1 accuracy of ``net`` on ``(x, y)``."""
    if len(y) == 0:
        return float("nan")
    was_training = net.training
    net.eval()
    device = _module_device(net)
    correct = sum(int((net(xb.to(device)).argmax(1).cpu() == yb).sum()) for xb, yb in zip(x.split(batch_size), y.split(batch_size)))
    net.train(was_training)
    return correct / len(y)


def train_classifier(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_classes: int,
    epochs: int | None = None,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    device: str | torch.device = "cpu",
    evaluate: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    desc: str = "CNN",
) -> tuple[ConvClassifier, list[dict[str, float]]]:
    """Train a :class:`ConvClassifier` with Adam and cross-entropy.

    Seeded and run in a forked RNG: it neither depends on nor changes the caller's random state
    (a callback evaluating mid-training leaves the training run as it was).

    Args:
        x: images ``[n, C, H, W]`` in [-1, 1]; y: labels ``[n]``.
        epochs: passes over the data; ``None``: enough for about :data:`MIN_TRAIN_STEPS` steps
            (between 3 and 50 epochs), so small data sets are not under-trained.
        evaluate: named sets whose accuracy is recorded after every epoch.

    Returns:
        The trained network (eval mode) and one ``{name: accuracy}`` per epoch.
    """
    from lightning_gpate.progress import progress

    if len(y) == 0:
        raise ValueError("no images to train the classifier on")
    epochs = default_epochs(len(y), batch_size) if epochs is None else epochs
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    history = []
    with torch.random.fork_rng(devices=devices), small_image_threads(x, device):
        torch.manual_seed(seed)
        net = ConvClassifier(in_shape=x.shape[1:], num_classes=num_classes).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(seed)
        for _ in progress(range(epochs), desc=desc, unit="epoch"):
            net.train()
            for idx in torch.randperm(len(y), generator=gen).split(batch_size):
                loss = F.cross_entropy(net(x[idx].to(device)), y[idx].to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
            history.append({name: accuracy(net, xe, ye) for name, (xe, ye) in (evaluate or {}).items()})
    net.eval()
    return net, history


def cnn_utility(
    synthetic: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    num_classes: int,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    val_fraction: float = 0.1,
    epochs: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """CNN accuracy of labelled synthetic images on the real test split.

    Args:
        synthetic: ``(images, labels)`` generated by the model.
        test: the real test split.
        val: a validation set for epoch selection (e.g. the real validation split); ``None`` holds
            out ``val_fraction`` of the synthetic images instead. Never the test set.

    Returns:
        ``cnn_accuracy_final`` (last epoch), ``cnn_accuracy_val_selected`` (test accuracy at the epoch
        of best validation accuracy), ``cnn_val_accuracy_best``, ``cnn_selected_epoch`` (1-based),
        ``cnn_accuracy_best_on_test_paper_style`` (max over epochs of the test accuracy: G-PATE's
        figure, a selection on the test set), ``cnn_num_train``.
    """
    x, y = synthetic
    if val is None:
        n_val = max(1, int(round(val_fraction * len(y)))) if len(y) > 1 else 0
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 1))
        val = (x[perm[:n_val]], y[perm[:n_val]])
        x, y = x[perm[n_val:]], y[perm[n_val:]]
    _, history = train_classifier(
        x, y, num_classes=num_classes, epochs=epochs, seed=seed, device=device,
        evaluate={"val": val, "test": test}, desc="CNN on synthetic",
    )
    val_acc = [h["val"] for h in history]
    best = max(range(len(history)), key=lambda i: (val_acc[i] if not math.isnan(val_acc[i]) else -1.0))
    return {
        "cnn_accuracy_final": history[-1]["test"],
        "cnn_accuracy_val_selected": history[best]["test"],
        "cnn_val_accuracy_best": val_acc[best],
        "cnn_selected_epoch": float(best + 1),
        "cnn_accuracy_best_on_test_paper_style": max(h["test"] for h in history),
        "cnn_num_train": float(len(y)),
    }


# ----------------------------------------------------------------------------- feature networks
class _Frozen(nn.Module):
    """Base of the feature extractors handed to torchmetrics: no gradients, always in eval mode."""

    def train(self, mode: bool = True) -> "_Frozen":
        return super().train(False)


class ClassifierFeatures(_Frozen):
    """Penultimate features of a trained :class:`ConvClassifier` (FID)."""

    def __init__(self, net: ConvClassifier) -> None:
        super().__init__()
        self.net = net.eval()
        self.num_features = net.feature_dim

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.features(x.to(_module_device(self.net)).float())


class ClassifierLogits(_Frozen):
    """Logits of a trained :class:`ConvClassifier` (Inception Score takes their softmax), in float64:
    torchmetrics computes ``p·(log p − log p̄)``, which is NaN once a probability underflows to 0
    (a logit gap above ~100 in float32, ~745 in float64)."""

    def __init__(self, net: ConvClassifier) -> None:
        super().__init__()
        self.net = net.eval()

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(_module_device(self.net)).float()).double()


class TorchvisionInception(_Frozen):
    """torchvision's Inception-v3 (ImageNet weights from a local file) on images in [-1, 1]:
    ``features`` = 2048-d pool features (FID), ``logits`` = 1000 classes (IS)."""

    def __init__(self, weights: str | Path, output: str = "features") -> None:
        super().__init__()
        import torchvision

        net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False)
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self.net, self.output = net.eval(), output
        self.num_features = 2048 if output == "features" else 1000
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float().clamp(-1, 1) + 1) / 2
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        n = self.net
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3", "maxpool2",
                     "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e",
                     "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"):
            x = getattr(n, name)(x)
        feats = torch.flatten(x, 1)
        return feats if self.output == "features" else n.fc(feats).double()


def find_inception_weights(path: str | Path | None = None) -> Path:
    """A local torchvision Inception-v3 weights file: ``path`` or ``<torch hub dir>/checkpoints/``.

    Raises:
        FeatureNetUnavailable: with what to do, when there is none.
    """
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    candidates = [Path(path)] if path else [hub / TORCHVISION_INCEPTION_FILE]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FeatureNetUnavailable(
        f"IS/FID of RGB images need Inception-v3 weights, and none were found "
        f"({', '.join(str(c) for c in candidates)}). On a machine with internet run "
        f"`python -c \"import torchvision; torchvision.models.inception_v3(weights='IMAGENET1K_V1')\"` "
        f"(it stores {TORCHVISION_INCEPTION_FILE} under {hub}), copy that file here, or pass its path as "
        f"image_quality.inception_weights. Skipping IS/FID."
    )


def _fingerprint(*tensors: torch.Tensor, **settings: Any) -> str:
    h = hashlib.sha1(repr(sorted(settings.items())).encode())
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


_FEATURE_CLASSIFIERS: dict[str, tuple[ConvClassifier, float]] = {}
#: Real data's figures per reference, feature network and settings (:meth:`ImageQualityEvaluator.real_baseline`).
_REAL_BASELINES: dict[str, dict[str, float]] = {}
#: Bumped when what :meth:`ImageQualityEvaluator.real_baseline` computes changes (a cached one is then recomputed).
REAL_BASELINE_VERSION = 1


def feature_classifier(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    num_classes: int,
    epochs: int | None = None,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
) -> tuple[ConvClassifier, float]:
    """The IS/FID feature classifier trained on the real training split, and its real test accuracy.

    Trained (on ``device``) once per process for the same data and settings (and once per ``cache_dir``
    on disk); returned on the CPU.
    """
    key = _fingerprint(*train, epochs=epochs, seed=seed, num_classes=num_classes, version=FEATURE_NET_VERSION)
    if key in _FEATURE_CLASSIFIERS:
        return _FEATURE_CLASSIFIERS[key]
    path = Path(cache_dir) / f"feature_classifier_{key[:20]}.pt" if cache_dir else None
    if path is not None and path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        net = ConvClassifier(in_shape=train[0].shape[1:], num_classes=num_classes)
        net.load_state_dict(saved["state_dict"])
        result = (net.eval(), float(saved["test_accuracy"]))
    else:
        net, history = train_classifier(*train, num_classes=num_classes, epochs=epochs, seed=seed, device=device,
                                        evaluate={"test": test}, desc="IS/FID feature classifier")
        net = net.cpu()
        result = (net, history[-1]["test"])
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"state_dict": net.state_dict(), "test_accuracy": result[1]}, path)
    _FEATURE_CLASSIFIERS[key] = result
    return result


# ----------------------------------------------------------------------------- IS / FID
def inception_score(
    logits_net: nn.Module, images: torch.Tensor, *, splits: int = 10, min_split_size: int = 250, seed: int = 0, batch_size: int = 500
) -> tuple[float, float]:
    """Mean and standard deviation over splits of the Inception Score (torchmetrics).

    ``p(y)`` is estimated per split, and small splits bias IS low, so fewer than ``splits`` splits
    are used when a split would hold under ``min_split_size`` images (one split: std is NaN).
    """
    import warnings

    from torchmetrics.image.inception import InceptionScore

    from lightning_gpate.progress import progress

    splits = max(1, min(splits, len(images) // min_split_size))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
        # No sync: evaluation runs on one process (rank 0 under DDP); a sync would wait for ranks that never come.
        metric = InceptionScore(feature=logits_net, splits=splits, sync_on_compute=False).to(_module_device(logits_net))
    batches = images.split(batch_size)
    for xb in progress(batches, desc="Inception Score", total=len(batches), unit="batch"):
        metric.update(xb)
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*degrees of freedom.*")
        torch.manual_seed(seed)  # torchmetrics shuffles the images before splitting
        mean, std = metric.compute()
    return float(mean), (float(std) if splits > 1 else float("nan"))


def frechet_distance(features_net: nn.Module, real: torch.Tensor, fake: torch.Tensor, *, batch_size: int = 500) -> float:
    """FID between two image sets in the feature space of ``features_net`` (torchmetrics)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    from lightning_gpate.progress import progress

    # No sync: evaluation runs on one process (rank 0 under DDP); a sync would wait for ranks that never come.
    # The metric's sums live where the feature net puts its features (a GPU net: the GPU).
    metric = FrechetInceptionDistance(feature=features_net, reset_real_features=False, sync_on_compute=False)
    metric = metric.to(_module_device(features_net))
    batches = [(xb, True) for xb in real.split(batch_size)] + [(xb, False) for xb in fake.split(batch_size)]
    for xb, is_real in progress(batches, desc="FID", unit="batch"):
        metric.update(xb, real=is_real)
    return float(metric.compute())


class _Given(_Frozen):
    """Features computed already, handed to torchmetrics' FID as its "images"."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


#: Random halvings the real FID of :func:`fid_of_halves` averages (one alone is noisy).
HALVINGS = 8


def fid_of_halves(features_net: nn.Module, images: torch.Tensor, *, seed: int = 0, halvings: int = HALVINGS) -> float:
    """What real data scores under the generated FID's protocol (``n`` generated images against the ``n`` of
    ``images``), estimated from ``images`` alone: the mean FID of two random halves of them over ``halvings`` draws,
    halved. Between two samples of one distribution the FID estimator's expectation is its bias, linear in
    ``1/n₁ + 1/n₂`` (Chong & Forsyth, CVPR 2020): halves (``4/n``) have twice that of ``n`` against ``n`` (``2/n``).
    On the 8×8 digits (380 test images, the feature classifier trained on them) it gave 4.0-5.3 over four seeds, where
    380 training digits, unseen by the classifier, scored 3.4-4.5 against them; one halving alone ranged 6 to 28.
    """
    with torch.no_grad():
        features = torch.cat([features_net(batch) for batch in images.split(500)]).double().cpu()
    given = _Given(features.shape[1])
    generator = torch.Generator().manual_seed(seed)
    half = len(features) // 2
    total = 0.0
    for _ in range(halvings):
        order = torch.randperm(len(features), generator=generator)
        total += frechet_distance(given, features[order[:half]], features[order[half:2 * half]])
    return total / halvings / 2


class ImageQualityEvaluator:
    """IS and FID of generated images against a real reference split, with the feature network of
    the data: a classifier trained on the real training split (grey images) or Inception-v3 (RGB).

    Args:
        train: the real split ``(images in [-1, 1], labels)`` that trains the feature classifier (the
            training split in the papers; a held-out split for private models).
        reference: the real split generated images are compared with (FID) — normally the test split.
        feature_split: the name of ``train``'s split, for the baseline's name
            (``fid_real_<feature_split>_vs_reference``).
        same_split: ``train`` is the reference split itself: the baseline's real FID is then that of two halves of
            the reference (an FID of a split against itself, and the accuracy of a classifier on its own training
            data, say nothing).
        num_classes: classes of the labels.
        feature_net: ``"auto"`` (classifier for 1 channel, Inception for 3), ``"classifier"`` or ``"inception"``.
        inception_weights: path of torchvision Inception-v3 weights (default: the torch hub cache).
        epochs: epochs of the feature classifier; seed: its seed; cache_dir: where to keep it on disk.
        splits: IS splits.

    Raises:
        FeatureNetUnavailable: Inception was needed and its weights are not on disk.
    """

    def __init__(
        self,
        train: tuple[torch.Tensor, torch.Tensor],
        reference: tuple[torch.Tensor, torch.Tensor],
        *,
        num_classes: int,
        feature_net: str = "auto",
        inception_weights: str | None = None,
        epochs: int | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
        splits: int = 10,
        feature_split: str = "train",
        same_split: bool = False,
    ) -> None:
        if feature_net not in ("auto", "classifier", "inception"):
            raise ValueError(f"feature_net must be 'auto', 'classifier' or 'inception', got {feature_net!r}")
        channels = train[0].shape[1]
        if feature_net == "auto":
            feature_net = "classifier" if channels == 1 else "inception"
        self.kind, self.reference, self.splits, self.seed = feature_net, reference[0], splits, seed
        self.baseline: dict[str, float] = {}
        if feature_net == "classifier":
            net, acc = feature_classifier(train, reference, num_classes=num_classes, epochs=epochs, seed=seed, cache_dir=cache_dir)
            self._net_key = f"classifier-{_fingerprint(*train, epochs=epochs, seed=seed, num_classes=num_classes, version=FEATURE_NET_VERSION)}"
            self.features, self.logits = ClassifierFeatures(net), ClassifierLogits(net)
            if not same_split:
                self.baseline["feature_net_test_accuracy"] = acc
        else:
            weights = find_inception_weights(inception_weights)
            self._net_key = f"inception-{weights}"
            self.features = TorchvisionInception(weights, "features")
            self.logits = TorchvisionInception(weights, "logits")
        self._train_images = None if same_split else train[0]
        self.feature_split = feature_split

    def to(self, device: str | torch.device) -> "ImageQualityEvaluator":
        self.features.to(device)
        self.logits.to(device)
        return self

    def score(self, images: torch.Tensor) -> dict[str, float]:
        """``inception_score``, ``inception_score_std`` and ``fid`` (vs the reference split) of ``images``."""
        with small_image_threads(images):
            mean, std = inception_score(self.logits, images, splits=self.splits, seed=self.seed)
            return {"inception_score": mean, "inception_score_std": std, "fid": frechet_distance(self.features, self.reference, images)}

    def real_baseline(self, cache_dir: str | Path | None = None) -> dict[str, float]:
        """What real data scores, the yardstick of the generated figures: IS of the reference split, the FID of
        two real samples, and the feature classifier's accuracy on the reference (when it trained on another split).

        The real FID is the feature classifier's split against the reference
        (``fid_real_<feature_split>_vs_reference``) where those differ, else estimated from random halves of the
        reference (``fid_real_reference_halves``, :func:`fid_of_halves`): the FID that real data of about that size
        scores, so that a generated FID has a scale. Neither reads a split the figures of a private model may not (a private model's
        feature split is a held-out one unless asked otherwise). Computed once per process for the same data and
        feature network, and kept in ``cache_dir`` (where the feature classifier is) across processes."""
        if "inception_score_real" in self.baseline:
            return dict(self.baseline)
        key = _fingerprint(self.reference, *([] if self._train_images is None else [self._train_images]), net=self._net_key,
                           splits=self.splits, seed=self.seed, version=REAL_BASELINE_VERSION)
        path = Path(cache_dir) / f"real_baseline_{key[:20]}.json" if cache_dir else None
        if key in _REAL_BASELINES:
            self.baseline.update(_REAL_BASELINES[key])
        elif path is not None and path.is_file():
            self.baseline.update(json.loads(path.read_text()))
        else:
            with small_image_threads(self.reference):
                mean, _ = inception_score(self.logits, self.reference, splits=self.splits, seed=self.seed)
                self.baseline["inception_score_real"] = mean
                if self._train_images is not None:
                    self.baseline[f"fid_real_{self.feature_split}_vs_reference"] = frechet_distance(
                        self.features, self.reference, self._train_images)
                elif len(self.reference) >= 4:
                    self.baseline["fid_real_reference_halves"] = fid_of_halves(self.features, self.reference, seed=self.seed)
            if path is not None:
                write_atomically(path, lambda tmp: tmp.write_text(json.dumps(self.baseline)))
        _REAL_BASELINES[key] = dict(self.baseline)
        return dict(self.baseline)
