"""A default run of every private model logs to MLflow only released or noised quantities (and what is
computed from them); what is computed from the private data without noise is opt-in
(``log_private_diagnostics: true``) and then logged under ``private/*``."""

import json
from pathlib import Path

import pytest

import small_models
from callbacks import ReleaseArtifact, SampleLogger
from conftest import query_run
from lightning_gpate.tracking import GPATEMLFlowLogger

#: Per model, the metrics a default run may log: ε (the guarantee; data-independent analyses), Lightning's
#: epoch counter, and quantities computed only from released outputs (losses towards noisy targets, of a
#: student on noisy labels, of a generator through a DP critic; the answered mask of the noisy threshold).
RELEASED = {
    "gpate": {"g_loss", "answered_fraction"},
    "pategan": {"g_loss", "s_loss", "noisy_real_fraction"},
    "dpgan": {"g_loss", "epsilon_opacus_worst_case", "critic_fake_accuracy"},  # the last: fakes through the DP critic
    "gswgan": set(),
    "dpmerf": {"mmd_loss"},
    "marginal": set(),
}
#: ε a default run may log: the guarantee, what its privacy filter has spent (the recorded costs of the steps
#: taken, each a function of released outputs only: G-PATE's answered queries are the noisy threshold's outcome),
#: and a paper-style analysis only when it is data-independent.
RELEASED_EPSILONS = {"epsilon", "epsilon_final", "epsilon_budget_spent_by_filter", "epsilon_final_budget_spent_by_filter"}
DATA_INDEPENDENT_PAPER = {"gswgan": {"epsilon_per_sample_composition", "epsilon_final_per_sample_composition"}}
PRIVATE_DIAGNOSTICS = {
    "gpate": {"private/teacher_loss"},
    "pategan": {"private/t_loss", "private/vote_margin"},
    "dpgan": {"private/wasserstein_estimate", "private/real_batch_size"},
    "gswgan": {"private/d_loss", "private/g_loss", "private/discriminator"},
    "dpmerf": set(),  # nothing private to log: one release, then post-processing
}


def _run(kind: str, experiment: str, **options):
    model, dm = small_models.build(kind, **options)
    small_models.fit(model, dm, steps=2, callbacks=[ReleaseArtifact(), SampleLogger(per_class_grids=False)],
                     logger=GPATEMLFlowLogger(experiment_name=experiment))
    run, client = query_run(experiment)
    assert not any("num_train" in p for p in run.data.params)  # no private row count among the params
    return run, client


def _metrics(kind: str, experiment: str, **options) -> set[str]:
    return set(_run(kind, experiment, **options)[0].data.metrics)


@pytest.mark.parametrize("kind", [*small_models.PRIVATE, small_models.MARGINAL])
def test_a_default_run_logs_only_released_or_noised_quantities(kind):
    logged = _metrics(kind, f"default-{kind}")
    assert logged <= RELEASED[kind] | RELEASED_EPSILONS | DATA_INDEPENDENT_PAPER.get(kind, set()) | {"epoch"}, \
        sorted(logged - RELEASED[kind] - RELEASED_EPSILONS)
    assert RELEASED_EPSILONS | DATA_INDEPENDENT_PAPER.get(kind, set()) <= logged


@pytest.mark.parametrize("kind", small_models.PRIVATE)
def test_private_diagnostics_are_opt_in_and_labelled(kind):
    logged = _metrics(kind, f"debug-{kind}", log_private_diagnostics=True)
    assert PRIVATE_DIAGNOSTICS[kind] <= logged


def test_gswgan_pretraining_losses_are_private_diagnostics():
    model, dm = small_models.build("gswgan", stage="pretrain", pretrain_generator_hidden=(8,), pretrain_iterations=2)
    small_models.fit(model, dm, steps=2, callbacks=[ReleaseArtifact()], logger=GPATEMLFlowLogger(experiment_name="pre"))
    run, _ = query_run("pre")
    assert not any("loss" in m for m in run.data.metrics)


@pytest.mark.parametrize("kind", ["gpate", "pategan"])
def test_data_dependent_epsilon_leaves_the_run_only_under_paper_accounting(kind):
    """PATE's data-dependent ε is a function of the private vote histograms without noise: a default
    (guarantee) run does not compute it, so neither logs it nor releases its curve; budget_accounting:
    paper does, labelled."""
    run, client = _run(kind, f"dd-{kind}")
    assert not any("data_dependent" in m for m in run.data.metrics)
    assert run.data.params["privacy/analysis"] == "guarantee" and run.data.tags["privacy_guarantee"] == "true"
    state = json.loads(Path(client.download_artifacts(run.info.run_id, "privacy/accountant.json")).read_text())
    assert state["rdp_paper"] == state["rdp"] and state["data_dependent"] is False and not state["labels"]
    release = __import__("torch").load(run.data.tags["release_artifact"], weights_only=True)
    assert release["privacy"]["accountant"]["rdp_paper"] == state["rdp"]
    assert release["privacy"]["summary"]["epsilon_paper"] == release["privacy"]["summary"]["epsilon"]

    run, client = _run(kind, f"dd-paper-{kind}", budget_accounting="paper")
    assert {"epsilon_data_dependent", "epsilon_final_data_dependent"} <= set(run.data.metrics)
    assert run.data.params["privacy/analysis"] == "data_dependent" and run.data.tags["privacy_guarantee"] == "false"
