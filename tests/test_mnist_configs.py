"""Every config of the MNIST table (configs/mnist/) parses with the command line's parser and builds its
model and DataModule; its file name says its ε and accounting mode, and the config agrees."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_gpate.cli import run_lightning_cli
from test_idx import write_mnist

# The module fixtures build the MNIST files and the CLI parser once: keep its tests on one worker (pytest-xdist).
pytestmark = pytest.mark.xdist_group("mnist_configs")

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "mnist").glob("*.yaml"))
#: Models that build every teacher/discriminator in their constructor (G-PATE builds its teachers at fit
#: start): built here with a few, so that the test stays small; the config's own count is checked below.
EAGER_ENSEMBLES = ("PATEGAN", "GSWGAN")


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory) -> Path:
    """4,100 training and 100 test digits (random pixels) in MNIST's IDX layout: enough rows for 4,000 teachers."""
    folder = tmp_path_factory.mktemp("mnist")
    write_mnist(folder, train=4100, test=100, compress=False)
    return folder


def test_there_is_a_config_for_every_row_of_the_table():
    names = {p.stem for p in CONFIGS}
    assert {"gan_nonprivate", "gpate_paper_eps10_guarantee", "gpate_paper_eps1_guarantee", "dpgan_eps10_guarantee", "dpgan_eps1_guarantee",
            "gswgan_eps10_guarantee", "gswgan_eps1_guarantee", "gswgan_eps10_paper", "pategan_eps1_guarantee",
            "pategan_eps10_guarantee", "gpate_noisefree",
            "gpate_paper_eps10_smooth_sensitivity", "gpate_topagg_eps1_guarantee", "gpate_topagg_eps10_guarantee"} <= names


def _args(path: Path, data_root: Path) -> list[str]:
    return ["--config", str(path), "--data.root", str(data_root), "--data.download", "false",
            "--data.verify_checksums", "false", "--trainer.accelerator", "cpu"]


@pytest.fixture(scope="module")
def cli(tiny_mnist, tmp_path_factory):
    """The command line (``lightning-gpate fit``'s parser), built once: building its parser takes seconds.

    A module fixture is built before the per-test store of conftest exists: building the CLI builds its
    MLflow logger, which would otherwise open the working folder's store (the repository's ``mlruns/``,
    shared with every other pytest worker, which raced to create its tables in CI)."""
    with pytest.MonkeyPatch.context() as patch:
        store = tmp_path_factory.mktemp("mnist_configs_store")
        patch.chdir(store)
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
        return run_lightning_cli(_args(CONFIGS[0], tiny_mnist), run=False)


def _build(cli, args: list[str]):
    """Parse and instantiate ``args`` with ``cli``'s parser as ``lightning-gpate fit`` does. LightningCLI's
    instantiators read the hyperparameters they save from the CLI's own parsed config (``config`` /
    ``config_dump``), so those are replaced by this parse first."""
    cli.config = cli.parser.parse_args(args)
    cli.__dict__.pop("config_dump", None)
    return cli.parser.instantiate_classes(cli.config)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_parses_and_builds(path, tiny_mnist, cli):
    import yaml

    raw = yaml.safe_load(path.read_text())
    model_class = raw["model"]["class_path"].rsplit(".", 1)[1]
    # benchmarks/mnist_table.py reads the configs with yaml.safe_load: a number must be one there too
    # (YAML 1.1 reads 1.0e12 as a string; 1.0e+12 is a number)
    numbers_as_text = {k: v for k, v in raw["model"]["init_args"].items() if isinstance(v, str) and re.fullmatch(r"[-+.\deE]+", v)}
    assert not numbers_as_text
    args = _args(path, tiny_mnist)
    if model_class in EAGER_ENSEMBLES:
        args += ["--data.num_teachers", "20"]
    built = _build(cli, args)
    model, dm = built.model, built.data
    assert type(model).__name__ == model_class and model.hparams["_class_path"].endswith(model_class)
    assert dm.dataset == "mnist" and dm.val_fraction == 0.0  # the official split: every training digit trains
    assert model.data_spec["shape"] == [1, 28, 28] and model.num_classes == 10
    assert raw["trainer"]["logger"]["init_args"]["run_name"] == path.stem  # runs are named after their file

    name = path.stem
    if name.endswith("nonprivate"):
        assert not hasattr(model, "accountant")
        return
    if name == "gpate_noisefree":
        assert model.epsilon_budget >= 1e9 and model.aggregator.sigma_gnmax < 1e-2
        return
    mode = re.search(r"_(guarantee|paper|smooth_sensitivity)$", name).group(1)
    assert model.budget_accounting == mode
    assert model.epsilon_budget == float(re.search(r"_eps(\d+)", name).group(1)) and model.delta == 1e-5
    teachers = raw["data"]["init_args"].get("num_teachers", 0)
    if model_class == "GPATE":
        assert model.num_teachers == teachers and teachers in (2000, 4000)
    if "topagg" in name:
        assert model.aggregator.name == "topagg" and model.aggregator.topk in (200, 300)
        assert (model.aggregator.sigma, model.aggregator.threshold_fraction) == ((5000.0, 0.7) if "eps1_" in name else (800.0, 0.2))
    elif "hybrid" in name:  # its GaussAgg row plus the random-feature anchor, nothing else; the anchor's share is paid first
        gaussagg = yaml.safe_load((path.parent / path.name.replace("hybrid", "gaussagg")).read_text())
        anchor = raw["model"]["init_args"]["anchor"]
        assert {k: v for k, v in raw["model"]["init_args"].items() if k != "anchor"} == {
            k: v for k, v in gaussagg["model"]["init_args"].items() if k != "anchor"}
        assert gaussagg["model"]["init_args"]["anchor"] == {"fraction": 0.0}  # the votes alone: no anchor (stated)
        assert raw["data"] == gaussagg["data"] and raw["trainer"]["max_steps"] == gaussagg["trainer"]["max_steps"]
        assert anchor["features"] == 10000 and anchor["length_scale"] == 10.0 and model.anchor_noise is not None
        left = _budget_aggregations(raw["model"]["init_args"], teachers)
        assert left == (1068 if "eps10_" in name else 300) and f"buys {left} aggregations" in path.read_text()
    elif "gaussagg" in name:  # as many aggregations as the ladder row it replaces the aggregator of
        assert model.aggregator.name == "gaussian"
        ladder = yaml.safe_load((path.parent / path.name.replace("gaussagg", "ladder")).read_text())
        assert abs(_budget_aggregations(raw["model"]["init_args"], teachers) - _budget_aggregations(ladder["model"]["init_args"], teachers)) <= 2
    elif model_class == "GPATE" and "ladder" not in name:  # the paper's DPGradAgg settings
        agg = model.aggregator
        assert agg.name == "dpgradagg" and (agg.sigma_threshold, agg.sigma_gnmax) == ((600.0, 100.0) if "eps10" in name else (3000.0, 1000.0))
        assert (agg.projection_dim, agg.clip, agg.num_bins) == (10, 1e-4, 10)
        assert teachers == (2000 if "eps10" in name else 4000)


def test_gswgan_rows_pay_for_the_paper_s_steps_and_differ_by_their_noise_only():
    """The paper row (σ 1.07, its own accounting) and the guarantee rows run the paper's 20,000 steps with the
    same 1,000 discriminators and batch 32: the budget pays for them (sound analysis for the guarantees, nearly
    all of it), and nothing but ε, σ and the accounting differs."""
    import yaml

    from lightning_gpate.privacy import gswgan_epsilon

    names = ("gswgan_eps10_paper", "gswgan_eps10_guarantee", "gswgan_eps1_guarantee")
    configs = {n: yaml.safe_load((ROOT / "configs" / "mnist" / f"{n}.yaml").read_text()) for n in names}
    rest = []
    for name, config in configs.items():
        model, data = config["model"]["init_args"], config["data"]["init_args"]
        assert (data["num_teachers"], model["generator_batch_size"], config["trainer"]["max_steps"]) == (1000, 32, 20000)
        accounting = "paper" if name.endswith("paper") else "sound"
        epsilon = gswgan_epsilon(noise_multiplier=model["noise_multiplier"], num_discriminators=1000, batch_size=32, steps=20000,
                                 delta=1e-5, accounting=accounting)
        assert 0.9 * model["epsilon"] <= epsilon <= model["epsilon"], (name, epsilon)
        rest.append({k: v for k, v in model.items() if k not in ("epsilon", "noise_multiplier", "budget_accounting")})
    assert rest[0] == rest[1] == rest[2]
    assert configs["gswgan_eps10_paper"]["model"]["init_args"]["noise_multiplier"] == 1.07


GPATE_CONFIGS = [p for p in CONFIGS if p.stem.startswith("gpate_")]


def _budget_aggregations(init: dict, teachers: int) -> int:
    """The most aggregations the (ε, δ) budget allows when every aggregation is at its worst case (every
    Confident-GNMax query of the most vote units answered), from the papers' closed forms: Confident-GNMax
    ``λ/(2σ1²) + λ/σ2²`` per query (Papernot et al. 2018), TopAgg ``2kλ/σ²`` per sample (DataLens), the
    Gaussian sum ``λΔ²/(2σ²)`` with Δ = 2 (Mironov 2017), converted with the accountant's conversion. With
    ``anchor.fraction``: after the anchor's one Gaussian ``λ/(2z²)``, z the smallest whose ε alone is that share."""
    from lightning_gpate.models.aggregators import aggregator_from
    from lightning_gpate.privacy import DEFAULT_ORDERS, rdp_to_epsilon

    spent = 0.0 * DEFAULT_ORDERS  # the RDP of what is paid before the first aggregation
    if (init.get("anchor") or {}).get("fraction", 0.0) > 0:
        share = init["anchor"]["fraction"] * init["epsilon"]
        lo, hi = 1e-3, 1e3  # bisection on z (ε alone falls as z grows); hi stays within the share
        for _ in range(200):
            z = (lo * hi) ** 0.5
            if rdp_to_epsilon(DEFAULT_ORDERS / (2 * z**2), DEFAULT_ORDERS, init["delta"])[0] > share:
                lo = z
            else:
                hi = z
        spent = DEFAULT_ORDERS / (2 * hi**2)

    m = init.get("fake_batch_size", 32)
    units = min(m, 10) if init.get("group_fakes_by_label") else m
    agg = aggregator_from(init.get("aggregator", "dpgradagg"))  # its class and the config's parameters (else its defaults)
    if agg.name == "gaussian":
        per_step = 4.0 * DEFAULT_ORDERS / (2 * agg.sigma ** 2)
    elif agg.name == "topagg":
        per_step = units * 2 * agg.topk * DEFAULT_ORDERS / agg.sigma ** 2
    else:
        queries = units * agg.projection_dim
        per_step = queries * (DEFAULT_ORDERS / (2 * agg.sigma_threshold ** 2) + DEFAULT_ORDERS / agg.sigma_gnmax ** 2)
    n = 0
    while rdp_to_epsilon(spent + (n + 1) * per_step, DEFAULT_ORDERS, init["delta"])[0] <= init["epsilon"]:
        n += 1
    return n


@pytest.mark.parametrize("path", GPATE_CONFIGS, ids=[p.stem for p in GPATE_CONFIGS])
def test_gpate_config_pins_its_accounting_mode_and_the_budget_ends_its_guarantee_run(path):
    """Every G-PATE config's file name says its accounting (``guarantee``, ``paper``, ``smooth_sensitivity``;
    ``noisefree``: no budget), the config agrees, and a guarantee row is ended by its privacy budget: its
    ``max_steps`` is at least 1.5 times the aggregations the budget allows at the worst case (fakes grouped
    by label may hold fewer than 10 labels, and a step with fewer costs less)."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    init, max_steps = raw["model"]["init_args"], raw["trainer"]["max_steps"]
    mode = init.get("budget_accounting", "guarantee")
    if path.stem == "gpate_noisefree":
        assert init["epsilon"] >= 1e9 and max(init.get("sigma_gnmax", 0), init.get("sigma_gaussian", 0)) < 1e-2
        return
    assert mode == re.search(r"_(guarantee|paper|smooth_sensitivity)$", path.stem).group(1)
    allowed = _budget_aggregations(init, raw["data"]["init_args"]["num_teachers"])
    assert allowed >= 10, f"{path.stem}: the budget buys only {allowed} aggregations"
    if mode == "guarantee":
        assert max_steps >= 1.5 * allowed, f"{path.stem}: max_steps {max_steps} would end the run before its budget ({allowed})"
    elif mode == "smooth_sensitivity":  # a run fixed in advance: its data-independent hard cap lets every step run
        cap = dict(init, epsilon=init["epsilon_hard_cap"])
        assert max_steps <= _budget_aggregations(cap, raw["data"]["init_args"]["num_teachers"])


def test_the_hybrid_anchor_with_its_default_length_scale_trains_under_the_command_line(tiny_mnist, cli):
    """R4 (third privacy review): with ``anchor_length_scale: null`` LightningCLI's ``save_hyperparameters`` stored
    ``None`` and the first step crashed in the features (``TypeError``) after the anchor was charged. The length
    scale and seed used are stored; the anchor is measured and the step runs."""
    import pytorch_lightning as pl

    from lightning_gpate.privacy.merf import median_distance_of_uniform

    path = ROOT / "configs" / "mnist" / "gpate_eps1_hybrid_guarantee.yaml"
    built = _build(cli, _args(path, tiny_mnist) + ["--data.num_teachers", "20", "--model.init_args.anchor.length_scale", "null",
                                                    "--model.init_args.anchor.feature_seed", "null", "--model.init_args.anchor.features",
                                                    "200", "--model.init_args.teachers.warmup_steps", "0",
                                                    "--model.init_args.teachers.precision", "32"])
    model, dm = built.model, built.data
    assert model.hparams.anchor["length_scale"] == pytest.approx(median_distance_of_uniform(784))
    assert isinstance(model.hparams.anchor["feature_seed"], int) and model.hparams.anchor["feature_seed"] == int(model.anchor_seed)
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(model, dm)
    assert bool(model.anchor_measured) and trainer.global_step == 1
    assert model.accountant.counts["subsampled_gaussian_events"] == 1
