"""From a distinguisher's errors to a lower bound on ε: Clopper–Pearson bounds and ε_emp.

An (ε, δ)-DP mechanism limits every test that tells "trained without the target" (world 0) from
"trained with it" (world 1): its false positive and false negative rates satisfy
``FPR + e^ε·FNR ≥ 1 − δ`` and ``e^ε·FPR + FNR ≥ 1 − δ`` (Kairouz, Oh & Viswanath 2015). Measured rates
therefore give the lower bound

    ε_emp = max( ln((1 − δ − FNR_hi) / FPR_hi),  ln((1 − δ − FPR_hi) / FNR_hi) )

with ``FPR_hi``, ``FNR_hi`` one-sided Clopper–Pearson upper bounds (Jagielski et al. 2020; the PATE-GAN
replication study of Ganev, Annamalai & De Cristofaro). Each bound is taken at level α/2, so both hold
at once with probability ≥ 1 − α and ε_emp exceeds the true ε with probability ≤ α.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scipy.optimize import brentq
from scipy.stats import binom

__all__ = ["clopper_pearson_upper", "clopper_pearson_lower", "empirical_epsilon", "max_measurable_epsilon", "EpsilonBound"]


def _check(k: int, n: int, alpha: float) -> None:
    if n < 1 or not 0 <= k <= n or int(k) != k or int(n) != n:
        raise ValueError(f"need integers 0 <= k <= n, n >= 1; got k={k}, n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper (1 − α) Clopper–Pearson bound on a binomial rate after ``k`` of ``n`` events.

    By its definition (Clopper & Pearson 1934): the ``p`` at which seeing ``k`` or fewer events has
    probability exactly α, ``P[Bin(n, p) ≤ k] = α`` (1 when ``k = n``). Solved here by root finding on
    the binomial CDF, not through the beta quantile it equals (the tests compare the two).
    """
    _check(k, n, alpha)
    if k == n:
        return 1.0
    if k == 0:  # closed form: (1 − p)^n = α
        return 1.0 - alpha ** (1.0 / n)
    return float(brentq(lambda p: binom.cdf(k, n, p) - alpha, k / n, 1.0, xtol=1e-15, rtol=1e-13, maxiter=500))


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided lower (1 − α) Clopper–Pearson bound: ``P[Bin(n, p) ≥ k] = α`` (0 when ``k = 0``)."""
    _check(k, n, alpha)
    return 1.0 - clopper_pearson_upper(n - k, n, alpha)


@dataclass(frozen=True)
class EpsilonBound:
    """ε_emp and the counts it comes from (``fp`` of ``negatives`` world-0 models called world 1,
    ``fn`` of ``positives`` world-1 models called world 0)."""

    epsilon: float
    fpr_hi: float
    fnr_hi: float
    fp: int
    negatives: int
    fn: int
    positives: int
    delta: float
    confidence: float

    def as_dict(self) -> dict:
        return asdict(self)


def _log_ratio(numerator: float, denominator: float) -> float:
    return math.log(numerator / denominator) if numerator > 0 and denominator > 0 else 0.0


def empirical_epsilon(fp: int, negatives: int, fn: int, positives: int, *, delta: float = 0.0, confidence: float = 0.95) -> EpsilonBound:
    """ε_emp from a distinguisher's errors on held-out models (0 when the errors show nothing).

    Args:
        fp: world-0 models the attack called world 1; negatives: world-0 test models.
        fn: world-1 models the attack called world 0; positives: world-1 test models.
        delta: δ of the claimed guarantee.
        confidence: 1 − α: ``FPR_hi`` and ``FNR_hi`` are upper bounds at level α/2 each.
    """
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    fpr_hi = clopper_pearson_upper(fp, negatives, alpha / 2)
    fnr_hi = clopper_pearson_upper(fn, positives, alpha / 2)
    eps = max(_log_ratio(1 - delta - fnr_hi, fpr_hi), _log_ratio(1 - delta - fpr_hi, fnr_hi), 0.0)
    return EpsilonBound(eps, fpr_hi, fnr_hi, int(fp), int(negatives), int(fn), int(positives), float(delta), float(confidence))


def max_measurable_epsilon(negatives: int, positives: int, *, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The largest ε_emp that ``negatives`` + ``positives`` test models can show (a perfect attack:
    no error at all). A larger true ε cannot be told apart from this one with as many models."""
    return empirical_epsilon(0, negatives, 0, positives, delta=delta, confidence=confidence).epsilon
