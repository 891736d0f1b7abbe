"""The distinguisher: a random forest on the features of half the synthetic tables, tested on the
other half, and the ε_emp its test errors prove.

The decision threshold on the forest's score P(world 1) is chosen on the *training* half only (from
out-of-bag scores), then applied once to the test half: choosing it on the test models would overstate
ε_emp. A leak that shows in some models only (say, the target's row appears in some world-1 tables
and never in world-0 ones) is caught by a high threshold — few false positives — which the default
0.5 would miss. The candidates are a fixed grid (thresholds fitted to the training scores themselves,
e.g. just above the largest world-0 score, look best exactly where they generalise worst); they are
compared by ε_emp on the training half at a stricter confidence (99.9%: an operating point resting on
a handful of models is discounted), and a threshold away from 0.5 is taken only when it gains more
than ``margin`` there. These choices were checked on randomized response with a useless extra feature
(where the best-on-training threshold among all scores lost up to the whole ε_emp on the test half)
and on the worst-case GAN audit's fits (where they keep its ε_emp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_gpate.audit.stats import EpsilonBound, empirical_epsilon

__all__ = ["AttackOutcome", "distinguish", "choose_threshold", "errors_at"]


@dataclass
class AttackOutcome:
    """The attack's test result: ``bound`` (ε_emp and its counts), the threshold used, and the test
    scores for the ROC."""

    bound: EpsilonBound
    threshold: float
    test_scores: np.ndarray
    test_worlds: np.ndarray
    train_size: int
    auc: float


def errors_at(scores: np.ndarray, worlds: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    """``(fp, negatives, fn, positives)`` of "world 1 iff score ≥ threshold"."""
    guess = scores >= threshold
    negatives, positives = int((worlds == 0).sum()), int((worlds == 1).sum())
    return int((guess & (worlds == 0)).sum()), negatives, int((~guess & (worlds == 1)).sum()), positives


THRESHOLDS = (0.0, 0.02, *np.round(np.linspace(0.05, 0.95, 19), 2).tolist(), 0.98, 1.0)


def choose_threshold(scores: np.ndarray, worlds: np.ndarray, *, delta: float, confidence: float = 0.999,
                     candidates=THRESHOLDS, margin: float = 0.1) -> float:
    """Among ``candidates``, the threshold nearest 0.5 whose ε_emp on (training) ``scores``, at
    ``confidence``, is within ``margin`` of the best one's."""
    values = [(empirical_epsilon(*errors_at(scores, worlds, t), delta=delta, confidence=confidence).epsilon, float(t))
              for t in candidates]
    best = max(eps for eps, _ in values)
    return min((t for eps, t in values if eps >= best - margin), key=lambda t: abs(t - 0.5))


def distinguish(features: np.ndarray, worlds: np.ndarray, train: np.ndarray, *, delta: float, confidence: float = 0.95,
                seed: int = 0, n_estimators: int = 300) -> AttackOutcome:
    """Train the forest on the rows where ``train`` is true, test on the others.

    Args:
        features: ``[models, features]``, one row per synthetic table.
        worlds: ``[models]``, 0 (trained without the target) or 1 (with it).
        train: ``[models]`` booleans, the training half.
        delta: δ of the claimed guarantee (enters ε_emp).
        confidence: 1 − α of the Clopper–Pearson bounds (α/2 each).
        seed: the forest's seed.
    """
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import roc_auc_score

    features, worlds, train = np.asarray(features, dtype=np.float64), np.asarray(worlds, dtype=np.int64), np.asarray(train, dtype=bool)
    test = ~train
    for name, part in (("training", train), ("test", test)):
        if len(set(worlds[part].tolist())) < 2:
            raise ValueError(f"the {name} half needs models of both worlds")
    # leaves of >= 1% of the training models: smoother scores, less fitting of noise features
    leaf = max(5, int(train.sum()) // 100)
    forest = RandomForestClassifier(n_estimators=n_estimators, min_samples_leaf=leaf, oob_score=True, random_state=seed, n_jobs=1)
    forest.fit(features[train], worlds[train])
    oob = np.nan_to_num(forest.oob_decision_function_[:, 1], nan=0.5)
    threshold = choose_threshold(oob, worlds[train], delta=delta)
    scores = forest.predict_proba(features[test])[:, 1]
    bound = empirical_epsilon(*errors_at(scores, worlds[test], threshold), delta=delta, confidence=confidence)
    auc = float(roc_auc_score(worlds[test], scores)) if len(np.unique(scores)) > 1 else 0.5
    return AttackOutcome(bound, threshold, scores, worlds[test], int(train.sum()), auc)
