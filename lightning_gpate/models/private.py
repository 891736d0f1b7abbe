"""What every private generator shares: the budget, the accountant, and the rules on metadata.

* The budget ``(epsilon, delta)`` belongs to the model, not to an optional callback: a step whose
  privacy event would take ε past the budget is refused *before* its update is applied
  (:meth:`PrivateGenerativeModel.charge`), and a model whose budget is spent refuses to train.
* The accountant's state is saved in and restored from every checkpoint, so resuming never resets ε.
* A fit whose budget paid for no generator step ends with :class:`NoPrivateStepError`, never with an
  untrained generator that looks trained.
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
import math
import warnings
from typing import Any, Callable

from lightning_gpate.errors import BudgetExhaustedError, ConfigError, NoPrivateStepError, UserError  # noqa: F401 (re-exported)
from lightning_gpate.models.base import CheckpointError, GenerativeModel, refuse_changed_on_resume
from lightning_gpate.privacy import PrivacyAccountant
from lightning_gpate.privacy.accountant import ADD_REMOVE, GNSSEvent
from lightning_gpate.privacy.disclosure import PRIVATE_PREFIX, private_diagnostics_allowed
from lightning_gpate.privacy.dp_stats import metadata_events
from lightning_gpate.privacy.rdp import rdp_to_epsilon

BUDGET_ACCOUNTING = ("guarantee", "paper", "smooth_sensitivity")
#: Every private model's default δ: the value the papers use for MNIST-sized data, below 1/n up to ~100,000 records.
DEFAULT_DELTA = 1e-5
SMOOTH_SENSITIVITY = "smooth_sensitivity"
#: The hyperparameters that say what a run promises (its budget, δ, accounting): a training checkpoint
#: pins them, for a resume from Python too (``trainer.fit(model, ckpt_path=...)``, where the model's other
#: hyperparameters are the caller's: each step's cost is recorded at the noise it actually used).
PROMISE_HPARAMS = ("epsilon", "delta", "budget_accounting", "conversion", "epsilon_hard_cap", "smooth_sensitivity")


class PrivateMetadataError(UserError, ValueError):
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
        epsilon: the privacy budget ε (> 0); training stops before it would be exceeded.
        delta: δ of the (ε, δ) guarantee, in (0, 1); default 1e-5. It should be well below 1/n for n training records
            (1e-5 suits up to about 100,000).
        budget_accounting: "guarantee" (default), "paper" or "smooth_sensitivity". "guarantee": the budget holds a
            real (ε, δ)-DP guarantee. "paper": the paper's own analysis (e.g. data-dependent PATE ε without smooth
            sensitivity, or GS-WGAN's per-sample composition): NOT a guarantee, and the run is tagged so.
            "smooth_sensitivity" (PATE models only): the guarantee is the data-independent bound, kept within
            epsilon_hard_cap; at the end of a run of fixed length the data-dependent ε is released with smooth
            sensitivity, and the release artifact is written only if that high-probability upper bound meets epsilon
            (finalize_privacy).
        conversion: RDP to (ε, δ) conversion, "improved" or "classic".
        z_dim: latent size.
        latent_prior: "normal" or "uniform".
        epsilon_hard_cap: smooth_sensitivity only (required): the cap on the data-independent ε. Everything the run
            releases (training and the GNSS release) stays within it; training stops before a step that would not.
        smooth_sensitivity: smooth_sensitivity only: the release's order, beta, sigma, delta_prime. These are λ, β, σ_ss
            and δ′ (the released data-dependent value is an upper bound that fails with probability δ′, default δ/2);
            any of them null or absent takes the data-independent default rule (default_gnss_parameters), and "exact:
            true" walks GNMax's bounds over every distance.
        log_private_diagnostics: also log unnoised diagnostics of the private data (debugging only). These are computed
            from the private data WITHOUT noise (teacher and critic losses, the discriminator drawn, batch sizes, vote
            margins) and logged under private/*: never for a run whose logs are shared. By default only released or
            noised quantities reach the logger (log_private).
    """

    #: Whether ``budget_accounting: smooth_sensitivity`` applies to this model (PATE vote mechanisms).
    SUPPORTS_SMOOTH_SENSITIVITY = False
    #: Whether this model has a paper-style analysis besides its guarantee (PATE's data-dependent ε,
    #: GS-WGAN's per-sample composition). Without one, ``budget_accounting: paper`` is refused: it would
    #: spend the same ε as the guarantee and tag the run "not a guarantee" (DP-GAN, DP-MERF, MarginalTree).
    HAS_PAPER_ANALYSIS = True

    #: The neighbouring relation of every ε a private model reports: D and D' differ by one record.
    neighbouring_relation = ADD_REMOVE

    def __init__(
        self,
        data_spec: dict[str, Any],
        *,
        epsilon: float,
        delta: float = DEFAULT_DELTA,
        budget_accounting: str = "guarantee",
        conversion: str = "improved",
        z_dim: int = 100,
        latent_prior: str = "normal",
        log_private_diagnostics: bool = False,
        epsilon_hard_cap: float | None = None,
        smooth_sensitivity: dict[str, Any] | None = None,
    ) -> None:
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if budget_accounting not in BUDGET_ACCOUNTING:
            raise ValueError(f"budget_accounting must be one of {BUDGET_ACCOUNTING}, got {budget_accounting!r}")
        if budget_accounting == "paper" and not self.HAS_PAPER_ANALYSIS:
            raise ValueError(
                f"{type(self).__name__} has no paper-style analysis besides its guarantee: budget_accounting: paper would "
                f"spend the same epsilon and only label the run not a guarantee. Use budget_accounting: guarantee"
            )
        check_metadata_is_public(data_spec)
        super().__init__(release_spec(data_spec), z_dim=z_dim, latent_prior=latent_prior)
        self.epsilon_budget = float(epsilon)
        self.delta = float(delta)
        self.budget_accounting = budget_accounting
        # A data-dependent analysis is a function of the private votes: computed only when the budget uses it.
        self.accountant = PrivacyAccountant(delta=delta, conversion=conversion, neighbouring=self.neighbouring_relation,
                                            data_dependent=budget_accounting == "paper")
        self.epsilon_hard_cap: float | None = None
        self.smooth_sensitivity = None  # a SmoothSensitivityAccountant in smooth_sensitivity mode
        if budget_accounting == SMOOTH_SENSITIVITY:
            self.smooth_sensitivity = self._smooth_sensitivity_accountant(data_spec, epsilon_hard_cap, smooth_sensitivity or {})
        elif epsilon_hard_cap is not None or smooth_sensitivity:
            raise ValueError("epsilon_hard_cap and smooth_sensitivity apply only with budget_accounting: smooth_sensitivity")
        for event in metadata_events(data_spec.get("metadata_cost", [])):  # converted to the model's relation by the accountant
            self.record(event)
        self.budget_exhausted = False
        self.stop_reason: str | None = None
        self.log_private_diagnostics = bool(log_private_diagnostics)
        spent = self.accountant.epsilon_paper() if budget_accounting == "paper" else self.realised_epsilon()
        if spent > self.budget_limit():
            raise ValueError(
                f"the metadata estimated with DP already costs ε={spent:.4g}, "
                f"more than the budget ε={self.budget_limit():g}"
            )

    def _smooth_sensitivity_accountant(self, data_spec, hard_cap, options: dict[str, Any]):
        from lightning_gpate.privacy.smooth_release import SmoothSensitivityAccountant, default_gnss_parameters

        if not self.SUPPORTS_SMOOTH_SENSITIVITY:
            raise ValueError(
                f"budget_accounting: smooth_sensitivity releases the data-dependent cost of PATE votes (G-PATE's "
                f"Confident-GNMax, PATE-GAN's Laplace votes); {type(self).__name__}'s accounting has no data-dependent "
                f"analysis to release. Use budget_accounting: guarantee."
            )
        if hard_cap is None or not hard_cap > 0:
            raise ValueError(
                "budget_accounting: smooth_sensitivity needs epsilon_hard_cap: the data-independent epsilon (a real "
                "guarantee) that the run may never exceed, whatever the votes; e.g. 4 x epsilon. The run length is "
                "fixed by trainer.max_steps, and the smooth-sensitivity epsilon is released at its end."
            )
        unknown = set(options) - {"order", "beta", "sigma", "delta_prime", "exact"}
        if unknown:
            raise ValueError(f"smooth_sensitivity takes order, beta, sigma, delta_prime and exact; unknown: {sorted(unknown)}")
        self.epsilon_hard_cap = float(hard_cap)
        params = default_gnss_parameters(epsilon=self.epsilon_budget, delta=self.delta, conversion=self.accountant.conversion,
                                         order=options.get("order"), beta=options.get("beta"), sigma=options.get("sigma"),
                                         delta_prime=options.get("delta_prime"))
        return SmoothSensitivityAccountant(params=params, num_teachers=int(data_spec.get("num_teachers", 0)) or 1,
                                           delta=self.delta, conversion=self.accountant.conversion,
                                           neighbouring=self.neighbouring_relation, exact=bool(options.get("exact", False)))

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
        if private_diagnostics_allowed(self):
            self.log_dict({f"{PRIVATE_PREFIX}{k}": v for k, v in metrics.items()}, **kwargs)

    # ----------------------------------------------------------------- budget
    def budget_limit(self) -> float:
        """What :meth:`spent_epsilon` may reach: ``epsilon``, or ``epsilon_hard_cap`` in
        smooth_sensitivity mode (where ``epsilon`` is the target of the release)."""
        return self.epsilon_hard_cap if self.smooth_sensitivity is not None else self.epsilon_budget

    def budget_shares(self) -> list[str]:
        """What each share of the budget bought, one line each, for the fit summary (public facts only: the
        shares are hyperparameters, the counts of steps are public). ``[]``: the whole budget buys one thing."""
        return []

    def whole_split_datamodule(self, option: str):
        """The fit's DataModule, for a measurement ``option`` that reads the whole training split
        (``model_space("train")``): PATE-GAN's marginals, the class-mean anchor. A one-line error without one."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "model_space"):
            raise ValueError(f"{option} reads the whole training split from the DataModule: fit with a datamodule")
        return datamodule

    def plan_gaussian_noise(self, fraction: float) -> float:
        """:func:`plan_gaussian_noise` for ``fraction`` of this model's budget, at its δ, orders, conversion
        and neighbouring relation (PATE-GAN's measured marginals, the class-mean anchor)."""
        return plan_gaussian_noise(fraction * self.budget_limit(), delta=self.delta, orders=self.accountant.orders,
                                   conversion=self.accountant.conversion, neighbouring=self.neighbouring_relation)

    def _gnss_reservation(self) -> tuple:
        """The GNSS release still to come, as events for the data-independent bound (none once made)."""
        ss = self.smooth_sensitivity
        if ss is None or ss.released is not None:
            return ()
        return (GNSSEvent(ss.params.beta, ss.params.sigma_effective),)

    def realised_epsilon(self) -> float:
        """ε of the guarantee's analysis applied to the costs recorded (in smooth_sensitivity mode with
        the GNSS release reserved): what the budget stop keeps within :meth:`budget_limit`. Not itself
        a guarantee when a cost depended on a mechanism's output (how many Confident-GNMax queries were
        answered) and the run ended before its budget: see :meth:`guarantee_epsilon`."""
        return self.accountant.epsilon_if(*self._gnss_reservation())

    def guarantee_epsilon(self) -> float:
        """ε of the (ε, δ)-DP guarantee of everything the run has released (in smooth_sensitivity mode,
        the GNSS release included, reserved before it is made).

        The smaller of two bounds that hold whatever the mechanisms output: the worst case of the steps
        taken (:meth:`~lightning_gpate.privacy.accountant.PrivacyAccountant.epsilon_worst_case`: every
        Confident-GNMax query answered) and — where the budget stop compares the RDP guarantee with
        :meth:`budget_limit` (:meth:`stop_rule_filters_rdp`) — that limit: stopping before the
        realised ε would pass it is a privacy filter (Feldman & Zrnic 2021; every adaptively chosen
        cost here is proportional to the Rényi order), whose guarantee is its limit and not the
        realised value. Under ``budget_accounting: paper`` the stop uses another analysis, and the
        worst case alone holds. A subclass with a tighter valid analysis overrides it (DP-GAN's
        ``accountant: pld``).
        """
        return self.rdp_guarantee_epsilon()

    def rdp_guarantee_epsilon(self) -> float:
        """:meth:`guarantee_epsilon` from the accountant's RDP curves (what it is unless a subclass has
        a tighter analysis)."""
        worst = self.accountant.epsilon_worst_case(*self._gnss_reservation())
        return min(self.budget_limit(), worst) if self.stop_rule_filters_rdp() else worst

    def guarantee_order(self) -> float | None:
        """The Rényi order whose RDP → (ε, δ) conversion gives :meth:`guarantee_epsilon`: the best order of
        the worst case of the steps taken, or ``None`` where the guarantee is the limit the budget stop
        kept (a privacy filter guarantees its limit, which no single order's conversion gives)."""
        worst, order = self.accountant.epsilon_worst_case_and_order(*self._gnss_reservation())
        return None if self.stop_rule_filters_rdp() and self.budget_limit() < worst else order

    def stop_rule_filters_rdp(self) -> bool:
        """Whether the budget stop compares the accountant's RDP guarantee with :meth:`budget_limit` (so
        that the limit is a guarantee, a privacy filter): not under ``budget_accounting: paper``, nor
        where a subclass stops on another analysis (DP-GAN's ``accountant: pld``)."""
        return self.budget_accounting != "paper"

    def spent_epsilon(self) -> float:
        """ε spent so far under the accounting the budget uses: the paper's analysis under
        ``budget_accounting: paper``, else the guarantee (:meth:`guarantee_epsilon`)."""
        if self.budget_accounting == "paper":
            return self.accountant.epsilon_paper()
        return self.guarantee_epsilon()

    def events_before_first_step(self) -> list:
        """Mechanism events a fit still pays before its first training step, beyond the metadata already
        recorded (none here; PATE-GAN's measured marginals): budget plans start from them."""
        return []

    def metadata_epsilons(self) -> dict[str, float]:
        """ε of each paid metadata release alone (``data_spec["metadata_cost"]``, by its ``what``): a pure ε-DP
        release its ε; the quantile edges' exponential mechanisms their composition under the model's accountant at
        its δ (their pure-DP sum, ``epsilon`` in the entry, is a far looser bound). Their sum bounds the metadata's
        (ε, δ) by basic composition."""
        out = {}
        for cost in self.data_spec.get("metadata_cost", []):
            if cost.get("mechanism") == "exponential":
                trial = PrivacyAccountant(delta=self.delta, orders=self.accountant.orders, conversion=self.accountant.conversion,
                                          neighbouring=self.neighbouring_relation)
                for event in metadata_events([cost]):
                    trial.record(event)
                out[str(cost["what"])] = min(trial.epsilon(), float(cost["epsilon"]))
            else:
                out[str(cost["what"])] = float(cost["epsilon"])
        return out

    def epsilon_if(self, event) -> float:
        """ε under the budget's accounting if ``event`` were recorded (nothing is recorded)."""
        if self.budget_accounting == "paper":
            _, paper = self.accountant.rdp_of(event)
            acc = self.accountant
            return rdp_to_epsilon(acc.rdp_paper + paper, acc.orders, acc.delta, conversion=acc.conversion)[0]
        return self.accountant.epsilon_if(event, *self._gnss_reservation())

    def record(self, event, *, worst_case=None) -> None:
        """Record ``event`` (a mechanism's actual cost) in the accountant and, in smooth_sensitivity
        mode, in the ledger of the release. ``worst_case``: the largest event the step could have been
        when its size was drawn at random (see :meth:`PrivacyAccountant.record
        <lightning_gpate.privacy.accountant.PrivacyAccountant.record>`)."""
        if self.smooth_sensitivity is not None:
            if self.smooth_sensitivity.released is not None:
                raise RuntimeError("this run's smooth-sensitivity epsilon was released: it records no more events")
            self.smooth_sensitivity.record(event)
        self.accountant.record(event, worst_case=worst_case)

    def reserve(self, event) -> bool:
        """Whether the budget can pay for ``event``; if not, mark the budget exhausted, record why,
        ask the trainer to stop, and return ``False``. Nothing is recorded either way.

        Call it with a worst-case event *before* a mechanism whose cost depends on its own noisy
        outputs (e.g. Confident-GNMax with every query answered), so the decision to stop never
        depends on an output that was not paid for; then record the actual event.

        Raises:
            NoPrivateStepError: the refusal comes before the fit's first generator step.
        """
        if self.smooth_sensitivity is not None and not self.smooth_sensitivity.accepts(event):
            raise ValueError("a smooth-sensitivity run releases one PATE mechanism: its parameters (threshold, "
                             "sigmas, bins, lam) must not change during the run")
        after = self.epsilon_if(event)
        if after <= self.budget_limit():
            return True
        self.budget_exhausted = True
        limit = "epsilon_hard_cap" if self.smooth_sensitivity is not None else "budget"
        self.stop_reason = (
            f"privacy {limit} reached: the next step could take epsilon from {self._charged_epsilon():.4f} "
            f"to {after:.4f} > {self.budget_limit():g} (delta={self.delta:g}, {self.budget_accounting})"
        )
        if self._trainer is not None:
            self.trainer.should_stop = True
            if self.trainer.global_step == getattr(self, "_generator_steps_at_start", None):
                # Stopping here would end the fit with an untrained generator that looks trained.
                raise NoPrivateStepError(
                    f"{type(self).__name__} took no training step: {self.stop_reason}. Its generator would be "
                    f"untrained (epsilon spent {self.spent_epsilon():.4g}); raise the budget or make a step cheaper "
                    f"(more noise, fewer queries per step)"
                )
        return False

    def _charged_epsilon(self) -> float:
        """What the budget stop compares with :meth:`budget_limit` (the realised costs)."""
        return self.accountant.epsilon_paper() if self.budget_accounting == "paper" else self.realised_epsilon()

    def charge(self, event, *, worst_case=None) -> bool:
        """Record ``event`` if the budget allows it (:meth:`reserve`) and return ``True``; otherwise
        record nothing and return ``False`` — the caller must then not apply (or use) the outputs
        that the event pays for."""
        if not self.reserve(event):
            return False
        self.record(event, worst_case=worst_case)
        return True

    # ----------------------------------------------------------------- smooth-sensitivity release
    def finalize_privacy(self) -> None:
        """End of training. In smooth_sensitivity mode, release the run's data-dependent RDP at the
        fixed order λ through GNSS (Papernot et al. 2018, Section 4) as an upper bound that holds with
        probability 1 − δ′: ``β(D) + SS_β(D)·σ_ss·(Z + Φ⁻¹(1 − δ′))`` with ``Z ~ N(0, 1)`` from the
        mechanism's secret generator (:mod:`~lightning_gpate.privacy.smooth_release`), plus GNSS's cost
        and the data-independent cost at λ of everything else; record the release's own cost in the
        accountant. Then decide from the released value alone (post-processing) whether the release
        artifact may be written (:meth:`release_allowed`). Idempotent; nothing happens in the other modes.
        """
        ss = self.smooth_sensitivity
        if ss is None or ss.released is not None:
            return
        import torch

        from lightning_gpate.privacy.randomness import mechanism_generator

        seed = getattr(self.hparams, "noise_seed", None)  # tests only; None: from the OS
        z = float(torch.randn(1, generator=mechanism_generator("cpu", None if seed is None else int(seed) + 7919)).item())
        if self._trainer is not None and self.trainer.world_size > 1:
            z = float(self.trainer.strategy.broadcast(z, src=0))  # every rank releases the same value
        ss.release(z)
        self.accountant.record(GNSSEvent(ss.params.beta, ss.params.sigma_effective))
        if not self.release_allowed():
            self.stop_reason = (
                f"{self.stop_reason + '; ' if self.stop_reason else ''}the released data-dependent epsilon="
                f"{self.smooth_sensitivity_epsilon():.4f} exceeds the target epsilon={self.epsilon_budget:g}: the "
                f"release artifact is not written"
            )
        if self._trainer is None or self.trainer.is_global_zero:
            from lightning_gpate.privacy.disclosure import smooth_sensitivity_release_lines

            print("\n".join(smooth_sensitivity_release_lines(self)))

    def smooth_sensitivity_epsilon(self) -> float:
        """After a smooth-sensitivity release: the data-dependent ε it released (an upper bound of the
        run's data-dependent ε with probability 1 − δ′; NOT a DP guarantee: that is
        :meth:`guarantee_epsilon`)."""
        ss = self.smooth_sensitivity
        if ss is None or ss.released is None:
            raise RuntimeError("no smooth-sensitivity release was made")
        return float(ss.released.epsilon)

    def release_allowed(self) -> bool:
        """Whether this model's release artifact may be written. Always, except in smooth_sensitivity
        mode, where the released data-dependent ε (:meth:`smooth_sensitivity_epsilon`, an upper bound
        with probability 1 − δ′) must meet the target ``epsilon`` (a decision on a released value only).
        ``False`` before the release is made."""
        ss = self.smooth_sensitivity
        if ss is None:
            return True
        return ss.released is not None and self.smooth_sensitivity_epsilon() <= self.epsilon_budget

    def on_train_end(self) -> None:
        self.finalize_privacy()

    def ensure_budget_left(self) -> None:
        """Raise :class:`BudgetExhaustedError` if this model's budget is spent (or, in smooth_sensitivity
        mode, its ε already released)."""
        ss = self.smooth_sensitivity
        if ss is not None and ss.released is not None:
            raise BudgetExhaustedError(
                "this run's smooth-sensitivity epsilon was already released: training more would need a second "
                "release (and its cost). Start a new run instead."
            )
        if self.budget_exhausted:
            raise BudgetExhaustedError(
                f"this model's privacy budget is spent (epsilon={self.spent_epsilon():.4f} of "
                f"{self.epsilon_budget:g}): {self.stop_reason}. Training more would exceed it; "
                f"start a new run with a new budget instead."
            )

    def on_train_start(self) -> None:
        super().on_train_start()
        for logger in self.trainer.loggers:
            if getattr(logger, "_log_model", False):  # MLFlowLogger(log_model=...) uploads every checkpoint
                raise RuntimeError(
                    f"{type(logger).__name__} has log_model enabled: it would upload training checkpoints (private "
                    f"state) to the tracking server. Use log_model=False: the release artifact is what gets logged."
                )
        ss = self.smooth_sensitivity
        if ss is not None and (self._trainer is None or not (self.trainer.max_steps or -1) > 0):
            raise ConfigError(
                "budget_accounting: smooth_sensitivity needs a run length fixed in advance: set trainer.max_steps "
                "(lightning-gpate plan --config ... estimates how many steps fit the target epsilon)"
            )
        self.ensure_budget_left()
        self._generator_steps_at_start = self.trainer.global_step

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Resume with the data spec the checkpoint's run released: metadata estimated with DP (bounds,
        class ratio) is paid once, and the accountant restored from the checkpoint holds that payment
        only. This model was built from the DataModule's fresh estimate, which is dropped here, and the
        DataModule reloads its data with the released metadata, before any batch is drawn. A model
        built with another budget, δ or accounting (:data:`PROMISE_HPARAMS`) than the checkpoint's is refused."""
        super().on_load_checkpoint(checkpoint)
        refuse_changed_on_resume("the checkpoint", checkpoint.get("hyper_parameters") or {}, self.hparams, PROMISE_HPARAMS)
        saved = (checkpoint.get("hyper_parameters") or {}).get("data_spec")
        if saved is None or not (saved.get("metadata_cost") or self.data_spec.get("metadata_cost")):
            return
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "adopt_released_spec"):
            datamodule.adopt_released_spec(saved)
        self.data_spec = release_spec(saved, warn=False)
        for hparams in (self._hparams, getattr(self, "_hparams_initial", {})):
            if "data_spec" in hparams:
                hparams["data_spec"] = self.data_spec

    def check_resume(self, checkpoint: dict[str, Any], path: str) -> None:
        """Also refuse a checkpoint whose budget is spent, before a run starts (training would refuse
        it anyway at ``on_train_start``). Loads the checkpoint's accountant into this model, as the
        resume itself will."""
        super().check_resume(checkpoint, path)
        extra = checkpoint["state_dict"].get("_extra_state")
        if extra is None:
            raise CheckpointError(f"{path} holds no privacy accountant: it is not a checkpoint of a private model")
        self.set_extra_state(extra)
        self.ensure_budget_left()

    def configure_callbacks(self):
        from callbacks.privacy import PrivacyBudget

        return [PrivacyBudget()]

    # ----------------------------------------------------------------- checkpoints
    # The accountant is part of the module's state_dict (extra state), so it travels wherever the
    # weights travel: checkpoints, load_from_checkpoint, and ddp_spawn's hand-back to the main
    # process. Loading a private model's weights without it fails (strict state_dict loading).
    # The smooth-sensitivity ledger (private: sums over the votes) travels the same way; only its
    # public_state() may be released.
    def get_extra_state(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant.state_dict(),
            "budget_exhausted": self.budget_exhausted,
            "stop_reason": self.stop_reason,
            "smooth_sensitivity": None if self.smooth_sensitivity is None else self.smooth_sensitivity.state_dict(),
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        from lightning_gpate.privacy.smooth_release import SmoothSensitivityAccountant

        self.accountant.load_state_dict(state["accountant"])
        self.budget_exhausted = bool(state["budget_exhausted"])
        self.stop_reason = state["stop_reason"]
        saved = state.get("smooth_sensitivity")
        if (saved is None) != (self.smooth_sensitivity is None):
            raise ValueError("the checkpoint's budget_accounting (smooth_sensitivity or not) differs from this model's")
        if saved is not None:
            if saved["params"].get("delta_prime") is None:
                raise ValueError("this smooth-sensitivity checkpoint comes from a version whose release was the noisy "
                                 "data-dependent value, not an upper bound of it: start a new run")
            self.smooth_sensitivity = SmoothSensitivityAccountant.from_state(saved)

    def load_released_privacy(self, privacy: dict[str, Any]) -> None:
        """Restore the privacy state of a release artifact (:func:`~lightning_gpate.privacy.disclosure.released_privacy`)."""
        self.accountant.load_state_dict(privacy["accountant"])
        self.budget_exhausted = bool(privacy.get("budget_exhausted", False))
        self.stop_reason = privacy.get("stop_reason")
        released = (privacy.get("smooth_sensitivity") or {}).get("released")
        if self.smooth_sensitivity is not None and released is not None:  # the public part only: no ledger
            from lightning_gpate.privacy.smooth_release import GNSSRelease

            self.smooth_sensitivity.released = GNSSRelease(**released)


def smallest_noise_that_fits(spent: Callable[[float], float], limit: float, *, what: str, fix: str) -> float:
    """The smallest noise multiplier σ (to 1% relative, rounded up: the result always fits) with ``spent(σ) <= limit``,
    for a cost ``spent`` that falls as σ grows (a planned number of subsampled Gaussian steps): a public function of
    public numbers. Each ``spent`` of a new σ may cost a fraction of a second or more (dp-accounting's per-order loop),
    so the search brackets σ by doubling and then interpolates log ε linearly in log σ (false position, Illinois
    variant): a handful of evaluations. It stays in [1/16, 2^16], where the subsampled Gaussian's RDP is numerically
    stable; below 1/16 it returns 1/16, above 2^16 it raises ``ValueError`` naming ``what`` does not fit and ``fix``."""

    def log_excess(sigma: float) -> float:  # <= 0: fits
        return math.log(spent(sigma) / limit)

    lo, f_lo = 1.0, log_excess(1.0)
    if f_lo <= 0:
        hi, f_hi = lo, f_lo
        while f_hi <= 0:
            if hi <= 1.0 / 16:
                return hi
            lo, f_lo = hi / 2.0, log_excess(hi / 2.0)
            if f_lo > 0:
                break
            hi, f_hi = lo, f_lo
    else:
        hi, f_hi = 2.0, log_excess(2.0)
        while f_hi > 0:
            if hi >= 2.0**16:
                raise ValueError(f"the budget ε={limit:g} leaves no room for {what} even at σ = {hi:g}: {fix}")
            lo, f_lo = hi, f_hi
            hi, f_hi = 2.0 * hi, log_excess(2.0 * hi)
    side = 0
    while hi / lo > 1.01:
        t = f_lo / (f_lo - f_hi)  # log ε falls with log σ: f_lo > 0 >= f_hi
        mid = math.exp(math.log(lo) + min(max(t, 0.01), 0.99) * (math.log(hi) - math.log(lo)))
        f_mid = log_excess(mid)
        if f_mid <= 0:
            hi, f_hi = mid, f_mid
            f_lo = f_lo / 2 if side == -1 else f_lo
            side = -1
        else:
            lo, f_lo = mid, f_mid
            f_hi = f_hi / 2 if side == 1 else f_hi
            side = 1
    return hi


def largest_that_fits(fits, what: str) -> float:
    """The largest x > 0 (to 1e-9 relative) with ``fits(x)``, for a predicate true below some point and
    false above it (a budget filled by a noise scale, a ρ, a λ): doubling from 1, then bisection on the
    log scale. ``what`` names x in the error when not even 1e-12 fits."""
    lo, hi = 1e-12, 1.0
    if not fits(lo):
        raise ValueError(f"the budget leaves no room for {what}")
    while fits(hi):
        lo, hi = hi, hi * 2.0
    while hi / lo > 1.0 + 1e-9:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan_gaussian_noise(epsilon: float, *, delta: float, orders=None, conversion: str = "improved",
                        neighbouring: str = ADD_REMOVE) -> float:
    """The smallest noise multiplier (to 1e-9 relative) whose Gaussian mechanism alone (one release,
    sampling rate 1) is (``epsilon``, ``delta``)-DP under the project's accountant: a public function of
    public numbers."""
    from lightning_gpate.privacy import SubsampledGaussianEvent

    def fits(inverse_z: float) -> bool:  # a larger 1/z is less noise: true below the largest that fits
        trial = PrivacyAccountant(delta=delta, conversion=conversion, neighbouring=neighbouring,
                                  **({} if orders is None else {"orders": orders}))
        trial.record(SubsampledGaussianEvent(noise_multiplier=1.0 / inverse_z, sampling_rate=1.0))
        return trial.epsilon() <= epsilon

    return 1.0 / largest_that_fits(fits, f"a Gaussian release within {epsilon:g}")


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
    if private and spec.get("kind") == "image":
        raise PrivateMetadataError(
            "the image classes were read from the private labels, which would leak them for free (a record with a "
            "new class changes num_classes and every other record's label code): declare them in data.classes"
        )
    if private:
        raise PrivateMetadataError(
            f"columns {private} have bounds or categories (for the label: its classes) read from the private data, which would leak it "
            f"for free. Declare them public in data.schema (min/max or categories), or set "
            f"data.metadata_epsilon to estimate them with DP from the budget."
        )

