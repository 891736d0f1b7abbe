"""Downstream utility of synthetic tables, measured as in PATE-GAN (Yoon et al., ICLR 2019, Sec. 5).

Twelve off-the-shelf classifiers are trained and tested in three settings:

* **A** real → real: trained on the real training split, tested on the real test split (the ceiling);
* **B** synthetic → real: trained on the synthetic table, tested on the real test split (the utility
  a user of the synthetic data gets);
* **C** synthetic → synthetic: trained on one part of the synthetic table, tested on a held-out part.

Each reports AUROC and AUPRC per classifier and their means. The *synthetic ranking agreement*
(Jordon et al. 2018, used in PATE-GAN Sec. 5.2) is the fraction of classifier pairs (i, j) ordered
the same way in A and C: ``SRA = 1/(k(k-1)) Σ_{i≠j} 1[(A_i − A_j)(C_i − C_j) > 0]``. Feature ranking
agreement compares the order of the features by |Pearson correlation| with the label in the real
and the synthetic data (Spearman correlation of the two scores, and top-k overlap).

Given the data spec, the report also measures **fidelity** (:mod:`~lightning_gpate.evaluation.fidelity`):
the mean total variation distance of the one- and two-way marginals (numeric columns binned on the
spec's public bounds), the value-level figures of the numeric columns (TVD on the real column's deciles,
Wasserstein-1 over the real spread, medians; the worst column's too) and the mean gap of the Pearson correlations, of the synthetic table against the
reference split (``fidelity/*``) and, with Setting A, of the other real split against it
(``A/fidelity/*``: the noise floor a perfect synthesizer would show, read from the training split).

Evaluation reads real data (Setting A trains on the real training split); its figures are for the
data owner and are not covered by a model's privacy guarantee. Comparisons of distributions
(feature ranking, correlation matrices, marginals, fidelity) use the real **test** split by default, so
the artifacts show no training rows.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

SETTINGS = ("A", "B", "C")
MISSING_CATEGORY = "<missing>"


def _classifier_factories(seed: int) -> dict[str, Callable[[], Any]]:
    """The 12 classifiers of PATE-GAN's evaluation, sklearn defaults (single-threaded, seeded)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.ensemble import AdaBoostClassifier, BaggingClassifier, GradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import BernoulliNB, GaussianNB
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import LinearSVC
    from sklearn.tree import DecisionTreeClassifier

    def xgboost():
        from xgboost import XGBClassifier

        return XGBClassifier(n_estimators=100, max_depth=6, learning_rate=0.3, n_jobs=1, random_state=seed, verbosity=0, tree_method="hist")

    return {
        "LogisticRegression": lambda: LogisticRegression(max_iter=1000),
        "RandomForest": lambda: RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1),
        "GaussianNB": GaussianNB,
        "BernoulliNB": BernoulliNB,
        "LinearSVC": lambda: LinearSVC(max_iter=5000, random_state=seed),
        "DecisionTree": lambda: DecisionTreeClassifier(random_state=seed),
        "LDA": LinearDiscriminantAnalysis,
        "AdaBoost": lambda: AdaBoostClassifier(random_state=seed),
        "Bagging": lambda: BaggingClassifier(random_state=seed, n_jobs=1),
        "GradientBoosting": lambda: GradientBoostingClassifier(random_state=seed),
        "MLP": lambda: MLPClassifier(hidden_layer_sizes=(100,), max_iter=300, random_state=seed),
        "XGBoost": xgboost,
    }


CLASSIFIERS = tuple(_classifier_factories(0))


# ----------------------------------------------------------------------------- encoding
class FeatureEncoder:
    """Features for the classifiers, fitted on a training part only.

    Numeric columns: missing values → the training median, then standardised with the training mean
    and standard deviation. Other columns (strings, booleans, categories): one-hot over the categories
    seen in the training part (a missing value is its own category; unseen categories → all zeros).

    Args:
        numeric: names of the numeric columns; every other feature column is categorical.
    """

    def __init__(self, numeric: Sequence[str], categorical: Sequence[str]) -> None:
        self.numeric, self.categorical = list(numeric), list(categorical)

    @staticmethod
    def column_kinds(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
        """Split columns into numeric and categorical by dtype (booleans are categorical)."""
        numeric, categorical = [], []
        for name in frame.columns:
            s = frame[name]
            is_num = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
            (numeric if is_num else categorical).append(name)
        return numeric, categorical

    @staticmethod
    def _as_category(series: pd.Series) -> np.ndarray:
        return series.astype(object).where(series.notna(), MISSING_CATEGORY).map(str).to_numpy()

    def fit(self, frame: pd.DataFrame) -> "FeatureEncoder":
        num = frame[self.numeric].apply(pd.to_numeric, errors="coerce").astype(float)
        median = num.median().fillna(0.0)
        filled = num.fillna(median)
        self.median = median.to_numpy()
        self.mean = filled.mean().to_numpy()
        std = filled.std(ddof=0).to_numpy()
        self.std = np.where(std > 0, std, 1.0)
        self.categories = {c: np.unique(self._as_category(frame[c])) for c in self.categorical}
        return self

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        num = frame[self.numeric].apply(pd.to_numeric, errors="coerce").astype(float).to_numpy()
        num = np.where(np.isnan(num), self.median, num)
        blocks = [(num - self.mean) / self.std]
        for c in self.categorical:
            values = self._as_category(frame[c])
            blocks.append((values[:, None] == self.categories[c][None, :]).astype(float))
        return np.concatenate(blocks, axis=1) if blocks else np.zeros((len(frame), 0))

    def feature_names(self) -> list[str]:
        return self.numeric + [f"{c}={v}" for c in self.categorical for v in self.categories[c]]


class LabelEncoder:
    """Label values → class indices over the label's classes: the schema's, or those of the real labels
    given (synthetic values must be among them)."""

    def __init__(self, real_labels: Sequence[pd.Series], positive: Any = None) -> None:
        values = pd.concat([pd.Series(s).dropna() for s in real_labels], ignore_index=True)
        self.classes = sorted(pd.unique(values), key=lambda v: (str(type(v)), v))
        if len(self.classes) < 2:
            raise ValueError("the label has fewer than two classes: AUROC is undefined")  # no values: real
        self._index = {self._key(v): i for i, v in enumerate(self.classes)}
        if positive is not None and self._key(positive) not in self._index:
            raise ValueError(f"positive class {positive!r} is not among the label's classes")  # read from real rows
        self.positive = self._index[self._key(positive)] if positive is not None else len(self.classes) - 1

    @staticmethod
    def _key(value: Any) -> str:
        if isinstance(value, (bool, np.bool_)):
            return str(bool(value))
        if isinstance(value, (int, float, np.integer, np.floating)) and float(value).is_integer():
            return str(int(value))
        return str(value)

    def encode(self, labels: pd.Series, what: str) -> np.ndarray:
        if labels.isna().any():
            raise ValueError(f"the {what} label column has missing values")  # not how many: a count of (maybe real) rows
        keys = [self._key(v) for v in labels]
        bad = sorted({k for k in keys if k not in self._index})
        if bad:
            # Generated labels may be named; real ones not (issue 20, finding 9).
            which = f"the {what} labels {bad[:5]} are" if what == "synthetic" else f"some {what} labels are"
            raise ValueError(f"{which} not among the label's classes")
        return np.array([self._index[k] for k in keys], dtype=np.int64)


# ----------------------------------------------------------------------------- scoring
def _scores(clf, x: np.ndarray, train_classes: np.ndarray, num_classes: int) -> np.ndarray:
    """Class scores ``[n, K]`` over all K classes (classes absent from training get a constant 0)."""
    out = np.zeros((len(x), num_classes))
    if hasattr(clf, "predict_proba"):
        out[:, train_classes] = clf.predict_proba(x)
    else:
        d = clf.decision_function(x)
        if d.ndim == 1:  # binary: positive-class margin
            out[:, train_classes[0]], out[:, train_classes[1]] = -d, d
        else:
            out[:, train_classes] = d
    return out


def auroc_auprc(y: np.ndarray, scores: np.ndarray, positive: int) -> tuple[float, float]:
    """AUROC and AUPRC (average precision). Binary: of the positive class; more classes: macro
    one-vs-rest over the classes present in ``y``. NaN when ``y`` has a single class."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    present = np.unique(y)
    if len(present) < 2:
        return float("nan"), float("nan")
    if scores.shape[1] == 2:
        target = (y == positive).astype(int)
        return float(roc_auc_score(target, scores[:, positive])), float(average_precision_score(target, scores[:, positive]))
    aucs, aps = [], []
    for c in present:
        target = (y == c).astype(int)
        aucs.append(roc_auc_score(target, scores[:, c]))
        aps.append(average_precision_score(target, scores[:, c]))
    return float(np.mean(aucs)), float(np.mean(aps))


def train_test_classifiers(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    num_classes: int,
    positive: int,
    classifiers: Sequence[str],
    seed: int = 0,
    desc: str = "classifiers",
) -> dict[str, tuple[float, float]]:
    """Train each named classifier on (x_train, y_train) and return ``{name: (AUROC, AUPRC)}`` on the test set.

    A training set with a single class cannot train a classifier: every classifier is then the
    constant scorer (AUROC 0.5, AUPRC the positive rate), with a warning.
    """
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits
    from lightning_gpate.progress import progress

    factories = _classifier_factories(seed)
    train_classes = np.unique(y_train)
    results = {}
    if len(train_classes) < 2:
        warnings.warn(
            f"{desc}: the training data has fewer than two classes: "
            f"no classifier can be trained; reporting the constant scorer (AUROC 0.5)",
            stacklevel=3,
        )
        constant = np.zeros((len(x_test), num_classes))
        auc, ap = auroc_auprc(y_test, constant, positive)
        return {name: (auc, ap) for name in classifiers}
    # Classifiers that need consecutive class ids (XGBoost) see indices into train_classes.
    y_local = np.searchsorted(train_classes, y_train)
    for name in progress(classifiers, desc=desc, unit="classifier"):
        clf = factories[name]()
        # One BLAS thread: these models are small, and oversubscribed BLAS threads make the MLP 20x slower.
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.filterwarnings("ignore", message=".*[Cc]ollinear.*")
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            clf.fit(x_train, y_local)
            scores = _scores(clf, x_test, train_classes, num_classes)
        results[name] = auroc_auprc(y_test, scores, positive)
    return results


def ranking_agreement(first: Sequence[float], second: Sequence[float]) -> float:
    """Synthetic ranking agreement: the fraction of ordered pairs (i ≠ j) with
    ``(first_i − first_j)(second_i − second_j) > 0`` (Jordon et al. 2018; PATE-GAN Sec. 5.2).

    Pairs with a NaN on either side are left out; NaN when no pair is left.
    """
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    agree = total = 0
    for i, j in itertools.permutations(range(len(a)), 2):
        d1, d2 = a[i] - a[j], b[i] - b[j]
        if np.isnan(d1) or np.isnan(d2):
            continue
        total += 1
        agree += int(d1 * d2 > 0)
    return agree / total if total else float("nan")


# ----------------------------------------------------------------------------- distributions
def label_correlations(x: np.ndarray, y: np.ndarray, num_classes: int, positive: int) -> np.ndarray:
    """Per feature, |Pearson correlation| with the label (binary: with the positive class; more
    classes: the largest over one-vs-rest indicators). Constant columns score 0."""
    targets = [positive] if num_classes == 2 else range(num_classes)
    out = np.zeros(x.shape[1])
    xc = x - x.mean(axis=0)
    xs = np.sqrt((xc ** 2).sum(axis=0))
    for c in targets:
        t = (y == c).astype(float)
        tc = t - t.mean()
        ts = np.sqrt((tc ** 2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.abs(xc.T @ tc) / (xs * ts)
        out = np.maximum(out, np.nan_to_num(r, nan=0.0))
    return out


def feature_ranking_agreement(real_scores: np.ndarray, synthetic_scores: np.ndarray, top_k: int = 5) -> dict[str, float]:
    """Agreement of two feature rankings: Spearman correlation of the scores and top-k overlap."""
    from scipy.stats import spearmanr

    k = min(top_k, len(real_scores))
    top_real = set(np.argsort(-real_scores, kind="stable")[:k])
    top_syn = set(np.argsort(-synthetic_scores, kind="stable")[:k])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = spearmanr(real_scores, synthetic_scores).statistic if len(real_scores) > 1 else float("nan")
    return {"feature_ranking_spearman": float(rho), f"feature_ranking_top{top_k}_overlap": len(top_real & top_syn) / k if k else float("nan")}


def ordinal_frame(frame: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Every column as numbers for rank correlations: numeric as is, other columns as the index of
    their value among the reference frame's sorted categories (unseen values → NaN)."""
    numeric, categorical = FeatureEncoder.column_kinds(reference)
    out = pd.DataFrame(index=frame.index)
    for c in frame.columns:
        if c in numeric:
            out[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
        else:
            cats = np.unique(FeatureEncoder._as_category(reference[c]))
            values = FeatureEncoder._as_category(frame[c])
            idx = np.searchsorted(cats, values)
            idx = np.clip(idx, 0, len(cats) - 1)
            out[c] = np.where(cats[idx] == values, idx, np.nan)
    return out


def spearman_matrices(real: pd.DataFrame, synthetic: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Spearman correlation matrices of the real and the synthetic table (all columns, label included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = ordinal_frame(real, real).corr(method="spearman")
        s = ordinal_frame(synthetic[real.columns], real).corr(method="spearman")
    return r, s


def correlation_difference(real_corr: pd.DataFrame, synthetic_corr: pd.DataFrame) -> float:
    """Mean |difference| of two correlation matrices over the pairs (upper triangle); an undefined
    correlation (a constant column) counts as 0."""
    a, b = real_corr.to_numpy(), synthetic_corr.to_numpy()
    iu = np.triu_indices_from(a, k=1)
    return float(np.mean(np.abs(np.nan_to_num(a[iu]) - np.nan_to_num(b[iu])))) if len(iu[0]) else float("nan")


# ----------------------------------------------------------------------------- the report
def _split_synthetic(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the train / held-out parts of the synthetic table for Setting C (stratified when possible)."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    counts = np.bincount(y)
    stratify = y if (counts[counts > 0] >= 2).all() and len(np.unique(y)) > 1 else None
    try:
        return train_test_split(idx, test_size=fraction, random_state=seed, stratify=stratify)
    except ValueError:  # too few rows per class for a stratified split
        return train_test_split(idx, test_size=fraction, random_state=seed)


def evaluate_tabular(
    train: pd.DataFrame,
    test: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    label: str,
    classifiers: Sequence[str] | None = None,
    settings: Sequence[str] = SETTINGS,
    seed: int = 0,
    positive: Any = None,
    synthetic_test_fraction: float = 0.2,
    reference: str = "test",
    top_k: int = 5,
    reuse: Mapping[str, float] | None = None,
    spec: Mapping[str, Any] | None = None,
    fidelity_bins: int = 10,
) -> dict[str, float]:
    """The PATE-GAN utility report of a synthetic table (see the module docstring).

    Args:
        train: the real training split, original schema (label included).
        test: the real test split.
        synthetic: the synthetic table, same columns.
        label: the label column.
        classifiers: names from :data:`CLASSIFIERS` (default: all 12).
        settings: any of ``"A"``, ``"B"``, ``"C"``.
        seed: seed of the classifiers and of the Setting C split.
        positive: the positive class of a binary label (default: the larger of the two values).
        synthetic_test_fraction: share of the synthetic table held out as Setting C's test part.
        reference: real split the synthetic table is compared with for feature rankings and
            correlations (``"test"`` or ``"train"``).
        top_k: size of the top-k feature overlap.
        reuse: the result of an earlier call on the same real splits and seed: Setting A (which does
            not depend on the synthetic data) is taken from it instead of trained again.
        spec: the tabular data spec (public bounds and categories): adds the fidelity measures, and its
            label categories are the classes (without it, the classes of the real labels that the
            settings read: the training split's only with Setting A or ``reference="train"``).
        fidelity_bins: equal-width bins of a numeric column's bounds for the fidelity measures.

    Returns:
        Flat ``{name: value}``: ``"{S}/auroc/{classifier}"``, ``"{S}/auprc/{classifier}"``,
        ``"{S}/auroc_mean"``, ``"{S}/auprc_mean"`` per setting S; ``"ranking_agreement_AC"`` (and
        ``_AB``, ``_AC_auprc``) when both settings ran; ``"feature_ranking_spearman"``,
        ``"feature_ranking_top{k}_overlap"``, ``"spearman_corr_mae"``; ``"{S}/single_class_train"``
        is 1 where a training set had a single class; with ``spec``, ``"fidelity/{m}"`` for m in
        ``tvd_1way``, ``tvd_2way``, ``corr_mae`` (and ``_max``), the value-level ``quantile_tvd_1way``,
        ``quantile_tvd_2way``, ``w1_scaled`` and ``column/<name>/*`` of
        :func:`~lightning_gpate.evaluation.fidelity.value_fidelity` and, with Setting A, the real
        floor ``"A/fidelity/{m}"``. NaN marks an undefined value.

    Raises:
        ValueError: on missing columns, unknown classifiers or settings, or labels outside the classes.
    """
    classifiers = list(CLASSIFIERS if classifiers is None else classifiers)
    unknown = sorted(set(classifiers) - set(CLASSIFIERS))
    if unknown:
        raise ValueError(f"unknown classifiers {unknown}; choose from {list(CLASSIFIERS)}")
    settings = [s.upper() for s in settings]
    bad = sorted(set(settings) - set(SETTINGS))
    if bad:
        raise ValueError(f"unknown settings {bad}; choose from {list(SETTINGS)}")
    if reference not in ("train", "test"):
        raise ValueError(f"reference must be 'train' or 'test', got {reference!r}")
    for what, frame in (("train", train), ("test", test), ("synthetic", synthetic)):
        if label not in frame.columns:
            raise ValueError(f"label column {label!r} is not in the {what} table; columns are {list(frame.columns)[:10]}")
        missing = sorted(set(train.columns) - set(frame.columns))
        if missing:
            raise ValueError(f"the {what} table lacks the columns {missing[:10]}")
        if len(frame) == 0:
            raise ValueError(f"the {what} table has no rows")

    features = [c for c in train.columns if c != label]
    numeric, categorical = FeatureEncoder.column_kinds(train[features])
    # The classes: the schema's (declared or paid for) where there is one. Read from the rows, a class
    # that one training record holds would decide whether the synthetic labels fit (an error or a
    # report): a bit of the training split, read even where no setting may read it.
    declared = (spec or {}).get("label", {}).get("categories")
    reads_train = "A" in settings or reference == "train"
    real_labels = [pd.Series(declared)] if declared else [*([train[label]] if reads_train else []), test[label]]
    labels = LabelEncoder(real_labels, positive=positive)
    k, pos = len(labels.classes), labels.positive
    y_train = labels.encode(train[label], "real train") if reads_train else None
    y_test, y_syn = labels.encode(test[label], "real test"), labels.encode(synthetic[label], "synthetic")

    def fit_encode(fit_on: pd.DataFrame, *others: pd.DataFrame) -> list[np.ndarray]:
        enc = FeatureEncoder(numeric, categorical).fit(fit_on[features])
        return [enc.transform(f[features]) for f in (fit_on, *others)]

    metrics: dict[str, float] = {}
    results: dict[str, dict[str, tuple[float, float]]] = {}
    runs = {
        "A": lambda: (train, y_train, test, y_test),
        "B": lambda: (synthetic, y_syn, test, y_test),
    }
    if "C" in settings:
        c_train, c_test = _split_synthetic(y_syn, synthetic_test_fraction, seed)
        runs["C"] = lambda: (synthetic.iloc[c_train], y_syn[c_train], synthetic.iloc[c_test], y_syn[c_test])
    for s in settings:
        if s == "A" and reuse is not None and all(f"A/auroc/{n}" in reuse and f"A/auprc/{n}" in reuse for n in classifiers):
            results["A"] = {n: (reuse[f"A/auroc/{n}"], reuse[f"A/auprc/{n}"]) for n in classifiers}
        else:
            tr, ytr, te, yte = runs[s]()
            x_tr, x_te = fit_encode(tr, te)
            if len(np.unique(ytr)) < 2:
                metrics[f"{s}/single_class_train"] = 1.0
            if len(np.unique(yte)) < 2:
                warnings.warn(f"Setting {s}: the test part has a single class: AUROC/AUPRC are undefined (NaN)", stacklevel=2)
            results[s] = train_test_classifiers(
                x_tr, ytr, x_te, yte, num_classes=k, positive=pos, classifiers=classifiers, seed=seed, desc=f"Setting {s}"
            )
        for name, (auc, ap) in results[s].items():
            metrics[f"{s}/auroc/{name}"], metrics[f"{s}/auprc/{name}"] = auc, ap
        aucs = np.array([v[0] for v in results[s].values()])
        aps = np.array([v[1] for v in results[s].values()])
        metrics[f"{s}/auroc_mean"] = float(np.nanmean(aucs)) if not np.isnan(aucs).all() else float("nan")
        metrics[f"{s}/auprc_mean"] = float(np.nanmean(aps)) if not np.isnan(aps).all() else float("nan")

    for other in ("C", "B"):
        if "A" in results and other in results:
            metrics[f"ranking_agreement_A{other}"] = ranking_agreement(
                [results["A"][n][0] for n in classifiers], [results[other][n][0] for n in classifiers])
            metrics[f"ranking_agreement_A{other}_auprc"] = ranking_agreement(
                [results["A"][n][1] for n in classifiers], [results[other][n][1] for n in classifiers])

    real_ref, y_ref = (test, y_test) if reference == "test" else (train, y_train)
    x_real, x_syn = fit_encode(real_ref, synthetic)
    metrics.update(feature_ranking_agreement(
        label_correlations(x_real, y_ref, k, pos), label_correlations(x_syn, y_syn, k, pos), top_k=top_k))
    real_corr, syn_corr = spearman_matrices(real_ref, synthetic)
    metrics["spearman_corr_mae"] = correlation_difference(real_corr, syn_corr)
    if spec is not None:
        from lightning_gpate.evaluation.fidelity import fidelity

        metrics.update({f"fidelity/{k}": v for k, v in fidelity(real_ref, synthetic, spec, num_bins=fidelity_bins).items()})
        if "A" in settings:  # the real floor reads the training split: only where Setting A may
            other = train if reference == "test" else test
            metrics.update({f"A/fidelity/{k}": v for k, v in fidelity(real_ref, other, spec, num_bins=fidelity_bins).items()})
    return metrics
