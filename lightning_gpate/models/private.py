"""What every private generator shares: the budget, the accountant, and the rules on metadata.

* The budget ``(epsilon, delta)`` belongs to the model, not to an optional callback: a step whose
  privacy event would take ε past the budget is refused *before* its update is applied
  (:meth:`PrivateGenerativeModel.charge`), and a model whose budget is spent refuses to train.
* The accountant's state is saved in and restored from every checkpoint, so resuming never resets ε.
* Metadata read from the private data (bounds, categories, the class ratio) is refused unless it was
  declared public or paid for; what was paid (``data_spec["metadata_cost"]``) is recorded as pure-DP
  events in the same accountant, under the model's neighbouring relation.
* One neighbouring relation for every model: **add/remove one record** (``neighbouring_relation``).
  The DataModules make it hold (splits and teacher partitions decided per record by a keyed hash of
  its content, :mod:`datamodules.partition`); the accountant records it and refuses events analysed
  under another relation unless they convert soundly.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from lightning_gpate.models.base import GenerativeModel
from lightning_gpate.privacy import PrivacyAccountant, PureDPEvent
from lightning_gpate.privacy.accountant import ADD_REMOVE
from lightning_gpate.privacy.rdp import rdp_to_epsilon

BUDGET_ACCOUNTING = ("guarantee", "paper")


class BudgetExhaustedError(RuntimeError):
    """Training was asked of a model whose privacy budget is already spent."""


class NoPrivateStepError(RuntimeError):
    """A fit ended because its budget could not pay for a single private step: nothing was trained."""


class PrivateMetadataError(ValueError):
    """The data spec carries metadata read from the private data that nobody paid for."""


class PrivateGenerativeModel(GenerativeModel):
    """Base of the private generators (G-PATE, PATE-GAN, DP-GAN, GS-WGAN).

    Subclasses call :meth:`charge` with each step's privacy event *before* applying the step's
    update, and skip the update when it returns ``False`` (or :meth:`reserve` a worst case before
    the mechanism runs, then record the actual event).

    Every ε it reports refers to datasets that differ by adding or removing one record
    (:attr:`neighbouring_relation`).

    Args:
        data_spec: the DataModule's spec.
        epsilon: privacy budget ε (> 0); training stops before it would be exceeded.
        delta: δ of the (ε, δ) guarantee, in (0, 1).
        budget_accounting: ``"guarantee"`` (default: the budget holds a real (ε, δ)-DP guarantee) or
            ``"paper"`` (the paper's own analysis, e.g. data-dependent PATE ε without smooth
            sensitivity or GS-WGAN's per-sample composition — NOT a guarantee; the run is tagged so).
        conversion: RDP → (ε, δ) conversion, ``"improved"`` or ``"classic"``.
        z_dim: latent size.
        latent_prior: ``"normal"`` or ``"uniform"``.
        log_private_diagnostics: also log diagnostics computed from the private data WITHOUT noise
            (teacher and critic losses, the discriminator drawn, batch sizes, vote margins) under
            ``private/*``: for debugging only, never for a run whose logs are shared. Default: only
            released or noised quantities reach the logger (:meth:`log_private`).
    """

    #: The neighbouring relation of every ε a private model reports: D and D' differ by one record.
    neighbouring_relation = ADD_REMOVE

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        z_dim: int = 100,
        latent_prior: str = "normal",
        log_private_diagnostics: bool = False,
    ) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if budget_accounting not in BUDGET_ACCOUNTING:
            raise ValueError(f"budget_accounting must be one of {BUDGET_ACCOUNTING}, got {budget_accounting!r}")
        check_metadata_is_public(data_spec)
        super().__init__(release_spec(data_spec), z_dim=z_dim, latent_prior=latent_prior)
        self.epsilon_budget = float(epsilon)
        self.delta = float(delta)
        self.budget_accounting = budget_accounting
        self.accountant = PrivacyAccountant(delta=delta, conversion=conversion, neighbouring=self.neighbouring_relation)
        for cost in data_spec.get("metadata_cost", []):  # converted to the model's relation by the accountant
            self.accountant.record(PureDPEvent(float(cost["epsilon"]), str(cost.get("what", "metadata")),
                                               neighbouring=cost.get("neighbouring", ADD_REMOVE)))
        self.budget_exhausted = False
        self.stop_reason: str | None = None
        self.log_private_diagnostics = bool(log_private_diagnostics)
        if self.spent_epsilon() > self.epsilon_budget:
            raise ValueError(
                f"the metadata estimated with DP already costs ε={self.spent_epsilon():.4g}, "
                f"more than the budget ε={self.epsilon_budget:g}"
            )

    def save_hyperparameters(self, *args, ignore=None, frame=None, logger: bool = True) -> None:
        """Lightning's ``save_hyperparameters`` with the data spec reduced to :func:`release_spec`:
        hyperparameters go into every checkpoint and into MLflow, so no private count or ratio may
        ride along, whatever a subclass passes."""
        super().save_hyperparameters(*args, ignore=ignore, frame=frame or inspect.currentframe().f_back, logger=logger)
        for hparams in (self._hparams, getattr(self, "_hparams_initial", {})):
            if "data_spec" in hparams:
                hparams["data_spec"] = release_spec(hparams["data_spec"], warn=False)

    # ----------------------------------------------------------------- logging
    def log_private(self, metrics: dict[str, Any], **kwargs) -> None:
        """Log ``metrics`` computed from the private data without noise (losses of non-private
        networks, secret sampling choices, batch sizes) as ``private/<name>``, only when
        ``log_private_diagnostics`` is on. Everything else a private model logs must be a released
        (noised, paid-for) quantity or post-processing of one."""
        if self.log_private_diagnostics:
            self.log_dict({f"private/{k}": v for k, v in metrics.items()}, **kwargs)

    # ----------------------------------------------------------------- budget
    def guarantee_epsilon(self) -> float:
        """ε of the guarantee in force: the accountant's RDP bound, unless a subclass has a tighter
        valid one (DP-GAN's ``accountant: pld``)."""
        return self.accountant.epsilon()

    def spent_epsilon(self) -> float:
        """ε spent so far under the accounting the budget uses."""
        if self.budget_accounting == "paper":
            return self.accountant.epsilon_paper()
        return self.guarantee_epsilon()

    def epsilon_if(self, event) -> float:
        """ε under the budget's accounting if ``event`` were recorded (nothing is recorded)."""
        if self.budget_accounting == "paper":
            _, paper = self.accountant.rdp_of(event)
            acc = self.accountant
            return rdp_to_epsilon(acc.rdp_paper + paper, acc.orders, acc.delta, conversion=acc.conversion)[0]
        return self.accountant.epsilon_if(event)

    def reserve(self, event) -> bool:
        """Whether the budget can pay for ``event``; if not, mark the budget exhausted, record why,
        ask the trainer to stop, and return ``False``. Nothing is recorded either way.

        Call it with a worst-case event *before* a mechanism whose cost depends on its own noisy
        outputs (e.g. Confident-GNMax with every query answered), so the decision to stop never
        depends on an output that was not paid for; then record the actual event.
        """
        after = self.epsilon_if(event)
        if after <= self.epsilon_budget:
            return True
        self.budget_exhausted = True
        self.stop_reason = (
            f"privacy budget reached: the next step could take epsilon from {self.spent_epsilon():.4f} "
            f"to {after:.4f} > {self.epsilon_budget:g} (delta={self.delta:g}, {self.budget_accounting})"
        )
        if self._trainer is not None:
            self.trainer.should_stop = True
        return False

    def charge(self, event) -> bool:
        """Record ``event`` if the budget allows it (:meth:`reserve`) and return ``True``; otherwise
        record nothing and return ``False`` — the caller must then not apply (or use) the outputs
        that the event pays for."""
        if not self.reserve(event):
            return False
        self.accountant.record(event)
        return True

    def on_train_start(self) -> None:
        super().on_train_start()
        for logger in self.trainer.loggers:
            if getattr(logger, "_log_model", False):  # MLFlowLogger(log_model=...) uploads every checkpoint
                raise RuntimeError(
                    f"{type(logger).__name__} has log_model enabled: it would upload training checkpoints (private "
                    f"state) to the tracking server. Use log_model=False: the release artifact is what gets logged."
                )
        if self.budget_exhausted:
            raise BudgetExhaustedError(
                f"this model's privacy budget is spent (epsilon={self.spent_epsilon():.4f} of "
                f"{self.epsilon_budget:g}): {self.stop_reason}. Training more would exceed it; "
                f"start a new run with a new budget instead."
            )
        self._events_at_train_start = self._recorded_events()

    def _recorded_events(self) -> int:
        return int(sum(v for k, v in self.accountant.counts.items() if k.endswith("_events")))

    def on_train_end(self) -> None:
        """Refuse to end a fit as if it had trained when the budget paid for no private step (the
        generator would be released untrained, reporting only the metadata's ε or none)."""
        start = getattr(self, "_events_at_train_start", None)
        if self.has_release and self.budget_exhausted and start is not None and self._recorded_events() == start:
            raise NoPrivateStepError(
                f"{type(self).__name__} took no private step, so nothing was trained: {self.stop_reason}. "
                f"Make a step cheaper (a larger noise multiplier, fewer queries or samples per step) or raise epsilon."
            )

    def configure_callbacks(self):
        from callbacks.privacy import PrivacyBudget

        return [PrivacyBudget()]

    # ----------------------------------------------------------------- checkpoints
    # The accountant is part of the module's state_dict (extra state), so it travels wherever the
    # weights travel: checkpoints, load_from_checkpoint, and ddp_spawn's hand-back to the main
    # process. Loading a private model's weights without it fails (strict state_dict loading).
    def get_extra_state(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant.state_dict(),
            "budget_exhausted": self.budget_exhausted,
            "stop_reason": self.stop_reason,
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])
        self.budget_exhausted = bool(state["budget_exhausted"])
        self.stop_reason = state["stop_reason"]

    def load_released_privacy(self, privacy: dict[str, Any]) -> None:
        """Restore the privacy state of a release artifact (``callbacks.privacy.released_privacy``)."""
        self.accountant.load_state_dict(privacy["accountant"])
        self.budget_exhausted = bool(privacy.get("budget_exhausted", False))
        self.stop_reason = privacy.get("stop_reason")


def release_spec(data_spec: dict[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """The data spec as a private model may keep it (it is saved in checkpoints and logged).

    Drops the exact training-set size (``num_train``: a count of private records) and replaces a class
    ratio read from the private data by the uniform ratio, so that neither reaches the checkpoint or
    MLflow. Bounds and categories read from the data are refused later by
    :func:`~lightning_gpate.models.private.check_metadata_is_public`.
    """
    spec = dict(data_spec)
    spec.pop("num_train", None)
    if spec.get("class_ratio_source") == "data":
        if warn:
            warnings.warn(
                "the class ratio was read from the private data: sampling labels uniformly instead. "
                "Declare it public (data.class_ratio) or pay for it with DP (data.label_ratio_epsilon).",
                stacklevel=3,
            )
        k = int(spec["num_classes"])
        spec["class_ratio"] = [1.0 / k] * k
        spec["class_ratio_source"] = "uniform"
    return spec


def check_metadata_is_public(spec: dict[str, Any]) -> None:
    """Refuse bounds/categories read from the private data unless declared public or paid for."""
    private = list(spec.get("private_metadata", []))
    if private:
        raise PrivateMetadataError(
            f"columns {private} have bounds or categories (for the label: its classes) read from the private data, which would leak it "
            f"for free. Declare them public in data.schema (min/max or categories), or set "
            f"data.metadata_epsilon to estimate them with DP from the budget."
        )

