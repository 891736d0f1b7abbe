"""RDP and moments accounting of PATE-style noisy vote aggregation.

* Confident-GNMax (Papernot et al., "Scalable Private Learning with PATE",
  ICLR 2018), used by G-PATE (Long et al. 2021) for every (sample, projected
  dimension) query: a Gaussian threshold check, then Gaussian noisy-argmax for
  answered queries. Data-independent and data-dependent (Theorem 6 /
  Proposition 10) RDP, vectorised over queries and computed in log space.
* The Laplace noisy vote of PATE-GAN (Yoon et al., ICLR 2019) with the
  moments accountant of Papernot et al., "Semi-supervised Knowledge Transfer
  for Deep Learning from Private Training Data" (ICLR 2017), Theorem 3.

A data-dependent bound depends on the votes and is not itself differentially
private unless released through smooth sensitivity (Papernot et al. 2018,
Section 4); :mod:`lightning_gpate.privacy.accountant` therefore keeps it as the
"paper" analysis and the data-independent bound as the guarantee.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr, logsumexp

from .rdp import pure_dp_rdp, validate_orders

__all__ = [
    "confident_gnmax_rdp",
    "gnmax_logq",
    "threshold_logq",
    "gaussian_rdp_given_logq",
    "pate_laplace_moments",
    "moments_to_epsilon",
    "laplace_vote_rdp",
]

_LOG_SQRT2 = 0.5 * math.log(2.0)


def _to_numpy(x) -> np.ndarray:
    """Array-likes and (possibly CUDA) torch tensors to numpy, without importing torch."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check_positive(name: str, value) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _validate_votes(votes) -> np.ndarray:
    votes = _to_numpy(votes).astype(np.float64, copy=False)
    if votes.ndim != 2 or votes.shape[1] < 1:
        raise ValueError(f"votes must have shape [n_queries, n_bins] with n_bins >= 1, got {votes.shape}")
    if not np.isfinite(votes).all():
        raise ValueError("votes contain NaN or infinite values")
    if (votes < 0).any():
        raise ValueError("votes must be non-negative counts")
    return votes


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """ln(1 − e^x) for x ≤ 0, accurate everywhere (Mächler 2012)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(x < -math.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


# --------------------------------------------------------------------------------------
# Confident-GNMax (Papernot et al. 2018)
# --------------------------------------------------------------------------------------


def gnmax_logq(votes, sigma_gnmax: float) -> np.ndarray:
    """ln q, an upper bound on Pr[GNMax output ≠ argmax], per query.

    Papernot et al. (2018), Proposition 7 (union bound)::

        q = min( Σ_{i≠i*} Φ̄((h_{i*} − h_i) / (√2 σ2)), 1 − 1/B )

    with i* the (first) argmax and Φ̄ the standard normal survival function,
    computed as ``logsumexp(log_ndtr(−gap/(√2σ2)))`` so that q ≈ e^{−84} is exact.

    Args:
        votes: ``[n_queries, n_bins]`` vote counts.
        sigma_gnmax: σ2, the GNMax noise standard deviation.

    Returns:
        ``ln q`` per query, shape ``[n_queries]`` (``-inf`` when B = 1).
    """
    votes = _validate_votes(votes)
    sigma = _check_positive("sigma_gnmax", sigma_gnmax)
    n, b = votes.shape
    if b == 1:  # a single bin: the output is fixed
        return np.full(n, -np.inf)
    top = votes.argmax(axis=1)
    gaps = votes[np.arange(n), top][:, None] - votes  # ≥ 0
    log_sf = log_ndtr(-gaps / (math.sqrt(2.0) * sigma))
    log_sf[np.arange(n), top] = -np.inf  # exclude exactly one argmax (ties keep Φ̄(0))
    logq = logsumexp(log_sf, axis=1)
    return np.minimum(logq, math.log1p(-1.0 / b))


def threshold_logq(votes, threshold: float, sigma_threshold: float) -> np.ndarray:
    """ln q_t of the threshold check, per query.

    Papernot et al. (2018), Section 4.2 / ``compute_logpr_answered``:
    p = Pr[answered] = Φ̄((T − round(max h)) / σ1) and q_t = min(p, 1 − p); both
    tails come from ``log_ndtr`` (no cancellation).

    Args:
        votes: ``[n_queries, n_bins]`` vote counts.
        threshold: T, an absolute vote count.
        sigma_threshold: σ1, the threshold noise standard deviation.

    Returns:
        ``ln q_t`` per query, shape ``[n_queries]``.
    """
    votes = _validate_votes(votes)
    sigma = _check_positive("sigma_threshold", sigma_threshold)
    threshold = float(threshold)
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold}")
    # np.round rounds half to even, like Python's round() in Papernot's code.
    z = (threshold - np.round(votes.max(axis=1))) / sigma
    log_p = log_ndtr(-z)  # ln Pr[max + N(0, σ1²) ≥ T]
    log_1mp = log_ndtr(z)
    return np.minimum(log_p, log_1mp)


def gaussian_rdp_given_logq(logq, sigma: float, orders) -> np.ndarray:
    """Data-dependent RDP of a Gaussian mechanism given ln q (vectorised).

    Papernot et al. (2018), Theorem 6 with the higher orders of Proposition 10::

        μ2 = σ √(−ln q),  μ1 = μ2 + 1,  ε_i = μ_i / σ²,
        A = (1 − q) / (1 − (q e^{ε2})^{(μ2−1)/μ2}),  B = e^{ε1} / q^{1/(μ1−1)},
        RDP(λ) = min(λ/σ², ln((1 − q) A^{λ−1} + q B^{λ−1}) / (λ − 1)),

    valid for λ < μ1 when μ2 > 1, −ln q > ε2 and
    ln q ≤ (μ2 − 1) ε2 − μ2 [ln(1 + 1/(μ1−1)) + ln(1 + 1/(μ2−1))];
    elsewhere the data-independent λ/σ² is returned. ``ln q = −inf`` (a fixed
    output) gives 0.

    Here σ is the GNMax noise (sensitivity-2 analysis, RDP λ/σ²); for the
    threshold check pass σ = √2 σ1.

    Args:
        logq: ``ln q`` per query, shape ``[n]`` (≤ 0).
        sigma: Noise standard deviation.
        orders: Rényi orders (> 1), shape ``[m]``.

    Returns:
        RDP per query and order, shape ``[n, m]``.
    """
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    if np.isnan(logq).any() or (logq > 0).any():
        raise ValueError("logq must be <= 0 and not NaN")
    sigma = _check_positive("sigma", sigma)
    orders = validate_orders(orders)
    var = sigma**2
    lam = orders[None, :]
    data_ind = np.broadcast_to(lam / var, (logq.size, orders.size)).copy()

    finite = np.isfinite(logq)
    out = data_ind
    out[~finite] = 0.0  # q = 0: the output is fixed, 0-RDP
    if not finite.any():
        return out
    lq = logq[finite][:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = np.sqrt(var * -lq)
        mu1 = mu2 + 1.0
        eps1 = mu1 / var
        eps2 = mu2 / var
        log_a2 = (mu2 - 1.0) * eps2
        cond = (
            (mu2 > 1.0)
            & (-lq > eps2)
            & (lq <= log_a2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0))))
        )
        applies = cond & (lam < mu1)  # [k, m]
        log1q = _log1mexp(lq)
        inner = np.minimum((lq + eps2) * (1.0 - 1.0 / mu2), 0.0)  # < 0 where cond holds
        log_a = (lam - 1.0) * (log1q - _log1mexp(inner))
        log_b = (lam - 1.0) * (eps1 - lq / (mu1 - 1.0))
        log_s = np.logaddexp(log1q + log_a, lq + log_b)
        dep = log_s / (lam - 1.0)
    sub = out[finite]
    sub = np.where(applies, np.minimum(sub, dep), sub)
    out[finite] = sub
    return out


def confident_gnmax_rdp(
    votes,
    answered,
    *,
    threshold: float,
    sigma_threshold: float,
    sigma_gnmax: float,
    orders,
    data_independent: bool = False,
) -> np.ndarray:
    """Total RDP of a batch of Confident-GNMax queries.

    Papernot et al. (2018), Algorithm 1 and Section 4: each query pays the
    Gaussian threshold check (data-independent λ/(2σ1²), i.e. a sensitivity-1
    Gaussian), answered queries also pay GNMax (data-independent λ/σ2²,
    Proposition 8). With ``data_independent=False`` the data-dependent bound
    of Theorem 6 / Proposition 10 is used wherever it applies and is smaller
    (per query and order): for GNMax with q from :func:`gnmax_logq`, for the
    threshold with q_t from :func:`threshold_logq` and σ = √2σ1. Identical
    ln q values are grouped so that thousands of queries cost a handful of
    vector operations.

    Args:
        votes: ``[n_queries, n_bins]`` vote histograms (numpy or torch).
        answered: Boolean per query (the threshold check was passed).
        threshold: T, an absolute vote count (e.g. 0.5 × number of teachers).
        sigma_threshold: σ1.
        sigma_gnmax: σ2.
        orders: Rényi orders (> 1).
        data_independent: Return the data-independent bound only.

    Returns:
        Total RDP over the queries, shape of ``orders``.

    Raises:
        ValueError: On shape mismatches, NaN/negative votes, non-positive σ.
    """
    votes = _validate_votes(votes)
    answered = _to_numpy(answered)
    if answered.shape != (votes.shape[0],):
        raise ValueError(
            f"answered must have shape [n_queries]=({votes.shape[0]},), got {answered.shape}"
        )
    if answered.dtype != np.bool_:
        if not np.isin(answered, (0, 1)).all():
            raise ValueError("answered must be boolean")
        answered = answered.astype(bool)
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma_gnmax", sigma_gnmax)
    orders = validate_orders(orders)
    n_queries = votes.shape[0]
    n_answered = int(answered.sum())

    ind_threshold = orders / (2.0 * s1**2)
    ind_gnmax = orders / s2**2
    if data_independent or n_queries == 0:
        return n_queries * ind_threshold + n_answered * ind_gnmax

    total = np.zeros_like(orders)
    # Threshold check, every query.
    lq_t, counts = np.unique(threshold_logq(votes, threshold, s1), return_counts=True)
    rdp_t = gaussian_rdp_given_logq(lq_t, math.sqrt(2.0) * s1, orders)
    total += counts @ np.minimum(rdp_t, ind_threshold[None, :])
    # GNMax, answered queries only.
    if n_answered:
        lq_g, counts = np.unique(gnmax_logq(votes[answered], s2), return_counts=True)
        rdp_g = gaussian_rdp_given_logq(lq_g, s2, orders)
        total += counts @ np.minimum(rdp_g, ind_gnmax[None, :])
    return total


# --------------------------------------------------------------------------------------
# PATE-GAN: Laplace vote + moments accountant (Papernot et al. 2017, Theorem 3)
# --------------------------------------------------------------------------------------


def _validate_gaps(vote_gaps) -> np.ndarray:
    gaps = np.abs(_to_numpy(vote_gaps).astype(np.float64, copy=False)).ravel()
    if not np.isfinite(gaps).all():
        raise ValueError("vote_gaps contain NaN or infinite values")
    return gaps


def _laplace_alpha(gaps: np.ndarray, lam: float, ls: np.ndarray) -> np.ndarray:
    """Per-query moments α(l) at (real, > 0) moments ``ls``; shape ``[n, len(ls)]``.

    q = (2 + λ|gap|) / (4 e^{λ|gap|}) (Papernot et al. 2017, Lemma 4 with the
    vote noise Lap(1/λ)). If q < (e^{2λ} − 1)/(e^{4λ} − 1) (Theorem 3):
    α(l) = min(2λ² l(l+1), ln[(1−q)((1−q)/(1−e^{2λ}q))^l + q e^{2λl}]),
    else α(l) = 2λ² l(l+1) (the data-independent bound, Theorem 2 of the same
    paper via 2λ-DP).
    """
    l = ls[None, :]
    data_ind = 2.0 * lam**2 * l * (l + 1.0)
    g = lam * gaps[:, None]
    log_q = np.log(2.0 + g) - math.log(4.0) - g  # ln q, accurate for large gaps
    # Precondition q < (e^{2λ} − 1)/(e^{4λ} − 1) = 1/(e^{2λ} + 1), in log space.
    ok = log_q < -np.logaddexp(2.0 * lam, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log1q = _log1mexp(np.minimum(log_q, 0.0))
        log_1m_e2q = _log1mexp(np.minimum(2.0 * lam + log_q, 0.0))  # ln(1 − e^{2λ} q)
        dep = np.logaddexp(log1q + l * (log1q - log_1m_e2q), log_q + 2.0 * lam * l)
    return np.where(ok, np.minimum(data_ind, dep), data_ind)


def pate_laplace_moments(vote_gaps, *, lam: float, num_moments: int = 100) -> np.ndarray:
    """Accumulated log-moments α(1..L) of PATE-GAN's Laplace vote.

    Yoon et al. (2019), Algorithm 1 (PATE-GAN), using Papernot et al. (2017),
    Theorem 3: per labelled sample with vote gap |n0 − n1| and noise Lap(1/λ),
    q = (2 + λ|n0−n1|) / (4 exp(λ|n0−n1|)) and

        α(l) += min{2λ² l(l+1), ln[(1−q)((1−q)/(1−e^{2λ}q))^l + q e^{2λl}]}

    only if q < (e^{2λ}−1)/(e^{4λ}−1), else α(l) += 2λ² l(l+1). The bound
    α(l) ≤ 2λ² l(l+1) per query is the data-independent guarantee; the
    data-dependent α is not itself private (no smooth sensitivity).

    Args:
        vote_gaps: |n0 − n1| per query (signs ignored), any shape.
        lam: λ, the inverse Laplace scale (> 0).
        num_moments: L, moments l = 1..L are returned.

    Returns:
        α(1..L), shape ``[L]``.
    """
    lam = _check_positive("lam", lam)
    if int(num_moments) != num_moments or num_moments < 1:
        raise ValueError(f"num_moments must be a positive integer, got {num_moments}")
    gaps = _validate_gaps(vote_gaps)
    ls = np.arange(1, int(num_moments) + 1, dtype=np.float64)
    if gaps.size == 0:
        return np.zeros_like(ls)
    uniq, counts = np.unique(gaps, return_counts=True)
    return counts.astype(np.float64) @ _laplace_alpha(uniq, lam, ls)


def moments_to_epsilon(alpha, delta: float) -> tuple[float, int]:
    """ε̂ = min_l (α(l) + ln(1/δ)) / l over the moments l = 1..L.

    Abadi et al. (2016), Theorem 2 (tail bound), as used by PATE-GAN
    (Yoon et al. 2019, Algorithm 1).

    Args:
        alpha: α(1..L).
        delta: δ in (0, 1).

    Returns:
        ``(epsilon, best_l)``.
    """
    alpha = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
    if alpha.ndim != 1 or alpha.size == 0:
        raise ValueError(f"alpha must be a non-empty 1-D array, got shape {alpha.shape}")
    if np.isnan(alpha).any():
        raise ValueError("alpha contains NaN")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta}")
    ls = np.arange(1, alpha.size + 1, dtype=np.float64)
    eps = (alpha + math.log(1.0 / delta)) / ls
    idx = int(np.argmin(eps))
    return float(eps[idx]), idx + 1


def laplace_vote_rdp(vote_gaps, *, lam: float, orders, data_independent: bool = False) -> np.ndarray:
    """RDP, on ``orders``, of PATE-GAN's Laplace votes.

    The moments accountant's α(l) is (λ_R − 1)·RDP(λ_R) at order λ_R = l + 1
    (Mironov 2017, Section 3), so RDP(λ_R) = α(λ_R − 1)/(λ_R − 1). Theorem 3 of
    Papernot et al. (2017) holds for every real l > 0, so the data-dependent
    bound is defined at every order > 1, including non-integer ones such as
    1.1 (no ``inf`` is needed); at integer orders it is exactly
    ``pate_laplace_moments(...)[λ_R − 2] / (λ_R − 1)``.

    The data-independent bound is that of a 2λ-DP mechanism (changing one
    teacher moves each count by 1, each Lap(1/λ)):
    ``pure_dp_rdp(2λ) = min(2λ, 2λ²·λ_R)`` per query — 2λ²·λ_R is the
    α(l) ≤ 2λ² l(l+1) bound, and RDP ≤ ε holds for any ε-DP mechanism. The
    data-dependent curve is further capped by it.

    Args:
        vote_gaps: |n0 − n1| per query.
        lam: λ (> 0).
        orders: Rényi orders (> 1).
        data_independent: Return the data-independent bound only.

    Returns:
        Total RDP over the queries, shape of ``orders``.
    """
    lam = _check_positive("lam", lam)
    orders = validate_orders(orders)
    gaps = _validate_gaps(vote_gaps)
    per_query_ind = pure_dp_rdp(2.0 * lam, orders)
    if data_independent or gaps.size == 0:
        return gaps.size * per_query_ind
    ls = orders - 1.0
    uniq, counts = np.unique(gaps, return_counts=True)
    rdp = _laplace_alpha(uniq, lam, ls) / ls[None, :]
    return counts.astype(np.float64) @ np.minimum(rdp, per_query_ind[None, :])
