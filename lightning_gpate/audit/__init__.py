"""Auditing: measure the privacy a trained model really gives (the distinguishing game).

Train many models on D and on D ∪ {target} (:mod:`~lightning_gpate.audit.game`), featurize their
synthetic tables (:mod:`~lightning_gpate.audit.features`), let a random forest tell the worlds apart
(:mod:`~lightning_gpate.audit.attack`), and turn its test errors into ε_emp, a lower bound on the true
ε at a stated confidence (:mod:`~lightning_gpate.audit.stats`), reported beside the claimed ε
(:mod:`~lightning_gpate.audit.report`). Following the PATE-GAN replication study (Ganev, Annamalai &
De Cristofaro), which measured ε_emp between 2.05 and 4.68 for public PATE-GAN implementations
claiming ε = 1. Command line: ``lightning-gpate audit`` (:mod:`~lightning_gpate.audit.runner`).
"""

from lightning_gpate.audit.attack import AttackOutcome, distinguish
from lightning_gpate.audit.features import FEATURIZERS, groundhog_features, querybased_features
from lightning_gpate.audit.game import WORST_CASE, AuditError, worst_case_data
from lightning_gpate.audit.report import AuditResult, format_table
from lightning_gpate.audit.runner import run_audit
from lightning_gpate.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_epsilon,
    max_measurable_epsilon,
)

__all__ = [
    "AttackOutcome", "AuditError", "AuditResult", "FEATURIZERS", "WORST_CASE", "clopper_pearson_lower",
    "clopper_pearson_upper", "distinguish", "empirical_epsilon", "format_table", "groundhog_features",
    "max_measurable_epsilon", "querybased_features", "run_audit", "worst_case_data",
]
