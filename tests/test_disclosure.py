"""What leaves a private run (lightning_gpate.privacy.disclosure), end to end: nothing differs between two
vote histories with the same released outputs, on any output path; the fit summary shows no unnoised
data-dependent ε; a run with a fixed mechanism seed is no guarantee and says so; every run says what its
ε covers; a smooth-sensitivity run's guarantee is its data-independent bound."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import small_models
from callbacks import FitSummary, ReleaseArtifact, SampleLogger
from conftest import query_run
from lightning_gpate.models.gpate import PAPER_SETTINGS
from lightning_gpate.privacy.rdp import rdp_to_epsilon
from lightning_gpate.tracking import GPATEMLFlowLogger
from small_models import former  # the former defaults (the paper's) where a test is silent


# ----------------------------------------------------------------------------- two vote histories, one release
def _fixed_gpate_outputs(monkeypatch, votes: str, answer: bool = True) -> None:
    """G-PATE's teachers vote ``votes`` ("consensus": every teacher in bin 0; "split": half in bin 0, half
    in bin 1) on every query, and the aggregation releases the same outputs whatever the votes (every
    other query answered, or none without ``answer``; Δx = 0). The mechanisms' secret seeds are fixed so that two runs can be
    compared (the runs stay tagged as guarantees: no noise_seed is configured)."""
    import lightning_gpate.models.gpate as gpate
    import lightning_gpate.models.sharding as sharding
    import lightning_gpate.privacy.randomness as randomness

    monkeypatch.setattr(randomness, "secret_seed", lambda: 1234)  # mechanism_generator's OS seed
    monkeypatch.setattr(sharding, "secret_seed", lambda: 1234)  # shared_seed's, under DDP

    def histograms(U, *, clip, num_bins, voting=None):
        t, m, k = U.shape
        out = torch.zeros(m, k, num_bins, dtype=torch.long)
        if votes == "consensus":
            out[..., 0] = t
        else:
            out[..., 0], out[..., 1] = t - t // 2, t // 2
        return out

    def released(votes_, P, **kw):
        m, d, k = P.shape
        answered = (torch.arange(m * k) % 2 == 0).view(m, k) & answer
        return torch.zeros(m, d, dtype=P.dtype), answered

    monkeypatch.setattr(gpate, "vote_histograms", histograms)
    monkeypatch.setattr(gpate, "aggregate", released)


def _fixed_pategan_outputs(monkeypatch, votes: str) -> None:
    """PATE-GAN's teachers vote ``votes`` (all real, or split evenly) and the noisy labels are the same
    whatever the votes (alternating)."""
    import lightning_gpate.models.pategan as pategan
    import lightning_gpate.privacy.randomness as randomness

    monkeypatch.setattr(randomness, "secret_seed", lambda: 1234)

    def teacher_votes(self, x, y):
        t = self.num_teachers
        counts = torch.zeros(x.shape[0], 2, dtype=torch.float64)
        if votes == "consensus":
            counts[:, 1] = t
        else:
            counts[:, 0], counts[:, 1] = t // 2, t - t // 2
        return counts

    monkeypatch.setattr(pategan.PATEGAN, "teacher_votes", teacher_votes)
    monkeypatch.setattr(pategan.PATEGAN, "noisy_labels", lambda self, counts: torch.arange(counts.shape[0]) % 2)


def _normalised(text: str, run_id: str) -> str:
    text = text.replace(run_id, "<run>")
    text = re.sub(r"\b\d+(\.\d+)? (s|min|h)\b", "<time>", text)  # durations
    return re.sub(r"\d+ min \d+ s|\d+ h \d+ min", "<time>", text)


def _everything_written(kind: str, budget_accounting: str, votes: str, monkeypatch, capfd) -> dict:
    """Every output of one fit: stdout/stderr, the fit summary, the MLflow run (params, tags, metric
    histories, every artifact's bytes) and the release artifact's contents."""
    import pytorch_lightning as pl

    (_fixed_gpate_outputs if kind == "gpate" else _fixed_pategan_outputs)(monkeypatch, votes)
    pl.seed_everything(0, verbose=False)
    # noise small enough for the votes' agreement to show in the paper's data-dependent bound
    options = {"budget_accounting": budget_accounting, "epsilon": 1e4,
               **({"sigma_threshold": 2.0, "sigma_gnmax": 1.0} if kind == "gpate" else {"lam": 1.0})}
    model, dm = small_models.build(kind, **options)
    summary = FitSummary()
    capfd.readouterr()
    trainer = small_models.fit(model, dm, steps=3, callbacks=[ReleaseArtifact(), SampleLogger(per_class_grids=False), summary],
                               logger=GPATEMLFlowLogger(experiment_name=f"two-histories-{kind}"))
    text = summary.text(trainer, model)
    out, err = capfd.readouterr()
    logger = trainer.logger
    client, run_id = logger.experiment, logger.run_id
    run = client.get_run(run_id)
    metrics = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}
    tags = {k: _normalised(v, run_id) for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    root = Path(client.download_artifacts(run_id, ""))
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.suffix != ".pt"}
    release = torch.load(run.data.tags["release_artifact"], weights_only=True)
    release["mlflow_run"] = None  # the run's id and store: differ by construction
    return {"stdout": _normalised(out, run_id), "stderr": _normalised(err, run_id), "summary": _normalised(text, run_id),
            "params": dict(run.data.params), "tags": tags, "metrics": metrics, "artifacts": files,
            "release": {k: v for k, v in release.items() if k != "generator"},
            "generator": release["generator"]}


def _differences(a: dict, b: dict) -> list[str]:
    diff = []
    for key in a:
        if key == "generator":
            if a[key].keys() != b[key].keys() or any(not torch.equal(a[key][k], b[key][k]) for k in a[key]):
                diff.append("generator")
        elif a[key] != b[key]:
            if isinstance(a[key], dict):
                diff += [f"{key}/{k}" for k in sorted(set(a[key]) | set(b[key])) if a[key].get(k) != b[key].get(k)]
            else:
                diff.append(key)
    return diff


@pytest.mark.parametrize("kind", ["gpate", "pategan"])
def test_two_vote_histories_with_the_same_released_outputs_write_the_same_everywhere(kind, monkeypatch, capfd):
    """Teachers in full agreement or evenly split, the same released outputs: the MLflow run (metrics with
    their histories, params, tags, every artifact), the release artifact, the fit summary, stdout and
    stderr are identical. Under ``budget_accounting: paper`` the same two histories do differ (the
    paper's data-dependent ε is a function of the votes, shown on request): the comparison sees it."""
    import os

    import mlflow

    mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).search_experiments()  # the store exists first
    consensus = _everything_written(kind, "guarantee", "consensus", monkeypatch, capfd)
    split = _everything_written(kind, "guarantee", "split", monkeypatch, capfd)
    assert consensus["tags"]["privacy_guarantee"] == "true"
    assert consensus["metrics"] and consensus["artifacts"] and "privacy/accountant.json" in consensus["artifacts"]
    assert not _differences(consensus, split), _differences(consensus, split)

    paper_consensus = _everything_written(kind, "paper", "consensus", monkeypatch, capfd)
    paper_split = _everything_written(kind, "paper", "split", monkeypatch, capfd)
    assert {"summary", "metrics/epsilon_data_dependent"} <= set(_differences(paper_consensus, paper_split))


# ----------------------------------------------------------------------------- finding 1: the summary
def test_the_fit_summary_of_a_guarantee_run_computes_and_shows_no_data_dependent_epsilon(monkeypatch):
    """The paper's data-dependent ε is a function of the private votes without noise: a guarantee run
    never computes it (the accountant's data-dependent bound is not evaluated) and its summary has no
    line about it."""
    import lightning_gpate.privacy.accountant as accountant

    def never(*args, **kwargs):
        raise AssertionError("the data-dependent bound of the votes was computed")

    monkeypatch.setattr(accountant, "confident_gnmax_rdp", never)
    model, dm = small_models.build("gpate")
    summary = FitSummary()
    trainer = small_models.fit(model, dm, steps=3, callbacks=[summary])
    text = summary.text(trainer, model)
    assert "data-dependent" not in text and "data_dependent" not in text
    assert f"ε = {model.guarantee_epsilon():.4f} of the budget ε = 50 (δ = 1e-05): an (ε, δ)-DP guarantee" in text


# ----------------------------------------------------------------------------- finding 9: fixed seeds
@pytest.mark.parametrize("kind", ["gpate", "dpgan"])
def test_a_fixed_noise_seed_is_tagged_as_no_guarantee(kind):
    """A fixed ``noise_seed`` lets anyone who knows it replay the noise: the run's tag, its release
    artifact and its summary say it is not a guarantee."""
    model, dm = small_models.build(kind, noise_seed=7)
    summary = FitSummary()
    artifact = ReleaseArtifact()
    trainer = small_models.fit(model, dm, steps=2, callbacks=[artifact, summary], logger=GPATEMLFlowLogger(experiment_name="seeded"))
    run, _ = query_run("seeded")
    assert run.data.tags["privacy_guarantee"] == "false"
    assert "noise_seed fixed" in run.data.tags["not_a_guarantee_because"]
    release = torch.load(artifact.release_path, weights_only=True)
    assert release["privacy"]["privacy_guarantee"] is False
    assert "NOT a guarantee (noise_seed fixed" in summary.text(trainer, model)


def test_a_fixed_metadata_seed_is_tagged_as_no_guarantee(mixed_frame):
    from datamodules import TabularDataModule
    from lightning_gpate.models import DPGAN

    kw = dict(frame=mixed_frame, label="outcome", class_ratio=[0.7, 0.3], metadata_epsilon=0.5,
              schema={"smoker": {"categories": ["no", "yes"]}, "region": {"categories": ["east", "north", "south", "west"]},
                      "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]},
                      "age": {"guess": [0, 120]}, "income": {"guess": [0, 200_000]}, "visits": {"guess": [0, 50]}})
    for seed, expected in ((3, "false"), (None, "true")):
        dm = TabularDataModule(**kw, metadata_seed=seed)
        dm.setup("fit")
        model = former(DPGAN, dm.spec, epsilon=50.0, delta=1e-5, sampling_rate=0.2, noise_multiplier=1.0, z_dim=4,
                      generator_hidden=(8,), discriminator_hidden=(8,))
        small_models.fit(model, dm, steps=1, logger=GPATEMLFlowLogger(experiment_name=f"metadata-{seed}"))
        run, _ = query_run(f"metadata-{seed}")
        assert run.data.tags["privacy_guarantee"] == expected
        assert ("metadata_seed" in run.data.tags.get("not_a_guarantee_because", "")) == (seed is not None)


# ----------------------------------------------------------------------------- finding 8: the scope
def test_every_private_run_says_what_its_epsilon_covers():
    """ε covers the release artifact and the training logs; evaluations on held-out rows are not private:
    the run's tag, its release artifact and its summary say so."""
    model, dm = small_models.build("pategan")
    summary, artifact = FitSummary(), ReleaseArtifact()
    trainer = small_models.fit(model, dm, steps=2, callbacks=[artifact, summary], logger=GPATEMLFlowLogger(experiment_name="scope"))
    run, _ = query_run("scope")
    scope = run.data.tags.get("privacy_scope", "")
    assert "release artifact and the training logs" in scope and "held-out rows" in scope and "not private" in scope
    assert torch.load(artifact.release_path, weights_only=True)["privacy"]["scope"] == scope
    assert scope in summary.text(trainer, model)


# ----------------------------------------------------------------------------- finding 6: smooth sensitivity
def test_a_smooth_sensitivity_run_reports_its_data_independent_bound_as_the_guarantee(monkeypatch):
    """The guarantee of a smooth-sensitivity run is its data-independent bound (every query answered
    in the worst case, and the GNSS release), within the hard cap; the released smooth-sensitivity
    value is the data-dependent ε, reported as such and never called a guarantee, even where it is the
    smaller (teachers in full agreement, and no query answered, here)."""
    from lightning_gpate.models import GPATE

    _fixed_gpate_outputs(monkeypatch, "consensus", answer=False)

    dm = small_models.public_table(num_teachers=12)
    sigma1, sigma2, order, beta, sigma = 16.0, 8.0, 4.0, 0.1, 2.0
    model = GPATE(dm.spec, **PAPER_SETTINGS, epsilon=1000.0, budget_accounting="smooth_sensitivity", epsilon_hard_cap=400.0,
                  smooth_sensitivity={"order": order, "beta": beta, "sigma": sigma}, fake_batch_size=8, projection_dim=4,
                  sigma_threshold=sigma1, sigma_gnmax=sigma2, threshold_fraction=0.5, hidden=(16,), teacher_hidden=(8,), z_dim=8)
    summary = FitSummary()
    trainer = small_models.fit(model, dm, steps=4, callbacks=[summary], logger=GPATEMLFlowLogger(experiment_name="ss"))
    run, _ = query_run("ss")
    orders = model.accountant.orders
    queries = 4 * 8 * 4
    c = 4.417173413467605  # Φ⁻¹(1 − 5e-6)
    s = sigma / (1 + c * sigma * math.expm1(beta))
    gnss = np.array([o * math.exp(2 * beta) / s**2 + (-0.5 * math.log(1 - 2 * o * beta) + beta * o) / (o - 1)
                     if o < 1 / (2 * beta) else np.inf for o in orders])
    worst = queries * (orders / (2 * sigma1**2) + orders / sigma2**2) + gnss
    guarantee = min(400.0, rdp_to_epsilon(worst, orders, 1e-5)[0])
    released = run.data.metrics["epsilon_smooth_sensitivity"]
    assert released < guarantee  # the data-dependent value is smaller here: it is still not the guarantee
    assert run.data.metrics["epsilon_final"] == pytest.approx(guarantee, rel=1e-9)
    assert run.data.metrics["epsilon"] == pytest.approx(guarantee, rel=1e-6)
    text = summary.text(trainer, model)
    (line,) = [x for x in text.splitlines() if f"{released:.4f}" in x]
    assert "data-dependent ε" in line and "Papernot et al. 2018" in line and "DP guarantee" not in line
    assert f"ε = {guarantee:.4f} (δ = 1e-05), data-independent bound of everything released (hard cap 400): an (ε, δ)-DP guarantee" in text
