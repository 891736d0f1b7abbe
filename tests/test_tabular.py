import numpy as np
import pandas as pd
import pytest

from datamodules import DataError, TabularDataModule, TabularTransformer, infer_schema


def test_schema_inference_kinds(mixed_frame):
    columns, label = infer_schema(mixed_frame, "outcome")
    kinds = {c.name: c.type for c in columns}
    assert kinds == {"age": "numeric", "income": "numeric", "smoker": "binary", "region": "categorical",
                     "visits": "numeric", "flag": "binary"}
    assert label.categories == [0, 1]
    region = next(c for c in columns if c.name == "region")
    assert region.categories == ["east", "north", "south", "west"] and not region.public


def test_round_trip_is_exact(mixed_frame):
    columns, label = infer_schema(mixed_frame, "outcome")
    tf = TabularTransformer(columns, label, list(mixed_frame.columns))
    x, y = tf.transform(mixed_frame)
    assert x.shape == (len(mixed_frame), 1 + 1 + 1 + 4 + 1 + 1)
    assert x.min() >= -1 and x.max() <= 1
    back = tf.inverse_transform(x, y)
    assert list(back.columns) == list(mixed_frame.columns)
    assert (back.dtypes == mixed_frame.dtypes).all()
    pd.testing.assert_frame_equal(back, mixed_frame, check_exact=False, rtol=1e-12)
    assert (back["age"] == mixed_frame["age"]).all()  # integers exactly


def test_round_trip_through_the_spec(mixed_frame):
    dm = TabularDataModule(frame=mixed_frame, label="outcome", test_fraction=0.0)
    tf = TabularTransformer.from_spec(dm.spec)
    x, y = tf.transform(mixed_frame)
    pd.testing.assert_frame_equal(tf.inverse_transform(x, y), mixed_frame, check_exact=False, rtol=1e-12)


def test_breast_cancer_round_trip():
    dm = TabularDataModule(builtin="breast_cancer")
    frame = dm.read_frame()
    tf = TabularTransformer.from_spec(dm.spec)
    x, y = tf.transform(frame)
    pd.testing.assert_frame_equal(tf.inverse_transform(x, y), frame, check_exact=False, rtol=1e-10)


def test_declared_bounds_are_public_clip_and_generated_values_stay_in_range(mixed_frame):
    schema = {"age": {"min": 30, "max": 60}, "region": {"categories": ["north", "south", "east", "west"]}}
    dm = TabularDataModule(frame=mixed_frame, label="outcome", schema=schema, class_ratio=[0.5, 0.5])
    assert "age" not in dm.spec["private_metadata"] and "region" not in dm.spec["private_metadata"]
    assert "income" in dm.spec["private_metadata"]
    assert dm.spec["class_ratio_source"] == "public"
    tf = TabularTransformer.from_spec(dm.spec)
    x, y = tf.transform(mixed_frame)
    out = tf.inverse_transform(np.random.default_rng(0).uniform(-3, 3, x.shape), y)
    assert out["age"].between(30, 60).all()
    assert set(out["region"]) <= {"north", "south", "east", "west"}


def test_empirical_class_ratio_is_marked_private(mixed_frame):
    dm = TabularDataModule(frame=mixed_frame, label="outcome")
    assert dm.spec["class_ratio_source"] == "data"
    assert "outcome" in dm.spec["private_metadata"]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        TabularDataModule(str(tmp_path / "nope.csv"), label="y")


def test_unknown_label_column(mixed_frame):
    with pytest.raises(DataError, match="label column 'target' is not in the data"):
        TabularDataModule(frame=mixed_frame, label="target")


def test_non_numeric_values_in_a_numeric_column(tmp_path, mixed_frame):
    frame = mixed_frame.astype({"income": object})
    frame.loc[5, "income"] = "?"
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"column 'income' is numeric but row 5 holds '\?', which is not a number"):
        TabularDataModule(str(path), label="outcome")
    dm = TabularDataModule(str(path), label="outcome", na_values=["?"], missing="drop")
    assert dm.spec["num_train"] + len(dm.splits["test"][1]) == len(frame) - 1
    frame.loc[2, "age"] = np.nan  # a row dropped above it: the error still names the row as it was read
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"column 'income' is numeric but row 5 holds '\?'"):
        TabularDataModule(str(path), label="outcome", missing="drop")


def test_nans_are_a_clear_error(mixed_frame):
    frame = mixed_frame.astype({"income": float})
    frame.loc[[1, 2], "income"] = np.nan
    with pytest.raises(DataError, match=r"missing values \(NaN\) in columns \['income'\]"):
        TabularDataModule(frame=frame, label="outcome")


def test_schema_errors(mixed_frame):
    with pytest.raises(DataError, match="schema names columns not in the data"):
        TabularDataModule(frame=mixed_frame, label="outcome", schema={"nope": {"type": "numeric"}})
    with pytest.raises(DataError, match="not among its declared categories"):
        TabularDataModule(frame=mixed_frame, label="outcome", schema={"region": {"categories": ["north"]}})
    with pytest.raises(DataError, match="both min and max"):
        TabularDataModule(frame=mixed_frame, label="outcome", schema={"age": {"min": 0}})


def test_semicolon_file_hint(tmp_path, mixed_frame):
    path = tmp_path / "semi.csv"
    mixed_frame.to_csv(path, sep=";", index=False)
    with pytest.raises(DataError, match="sep: ';'"):
        TabularDataModule(str(path), label="outcome")
    assert TabularDataModule(str(path), label="outcome", sep=";").spec["num_classes"] == 2


def test_too_few_rows_per_teacher(mixed_frame):
    with pytest.raises(ValueError, match="too few rows per teacher: the training rows"):  # when the data is loaded
        TabularDataModule(frame=mixed_frame, label="outcome", num_teachers=500)


def test_split_frames_are_disjoint_rows_of_the_original(mixed_frame):
    dm = TabularDataModule(frame=mixed_frame, label="outcome", val_fraction=0.1, test_fraction=0.2)
    parts = [dm.split_frame(s) for s in ("train", "val", "test")]
    sizes = [len(p) for p in parts]  # decided per record: binomial around 70/10/20%
    assert sum(sizes) == 120 and all(abs(k - 120 * f) <= 3 * (120 * f * (1 - f)) ** 0.5 for k, f in zip(sizes, (0.7, 0.1, 0.2)))
    merged = pd.concat(parts).sort_values(list(mixed_frame.columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(merged, mixed_frame.sort_values(list(mixed_frame.columns)).reset_index(drop=True))


def _released(frame=None, **kw):
    import json

    from lightning_gpate.models.private import release_spec

    return json.dumps(release_spec(TabularDataModule(frame=frame, **kw).spec, warn=False), sort_keys=True)


def test_an_undeclared_dtype_is_not_read_from_the_data(mixed_frame):
    """Issue 20, finding 4: one record with age 25.5 instead of 25 flipped a declared column from int64
    to float64 in the released spec. A column with declared metadata takes its type and dtype from the
    declaration (numeric: float64 unless declared; categories: their own type)."""
    schema = {"age": {"min": 18, "max": 90}, "income": {"min": 0, "max": 120000}, "smoker": {"categories": ["no", "yes"]},
              "region": {"categories": ["east", "north", "south", "west"]}, "visits": {"min": 0, "max": 2},
              "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]}}
    kw = dict(label="outcome", schema=schema, class_ratio=[0.7, 0.3])
    neighbour = mixed_frame.astype({"age": float})
    neighbour.loc[3, "age"] = 25.5
    mixed_frame.loc[3, "age"] = 25
    assert _released(mixed_frame, **kw) == _released(neighbour, **kw)
    spec = TabularDataModule(frame=mixed_frame, **kw).spec
    dtypes = {c["name"]: (c["type"], c["dtype"]) for c in spec["columns"] + [spec["label"]]}
    assert dtypes == {"age": ("numeric", "float64"), "income": ("numeric", "float64"), "smoker": ("binary", "object"),
                      "region": ("categorical", "object"), "visits": ("numeric", "float64"), "flag": ("binary", "bool"),
                      "outcome": ("binary", "int64")}
    # the declaration decides the type too: three declared categories stay categorical whatever the data holds
    three = {**schema, "smoker": {"categories": ["no", "yes", "former"]}}
    assert TabularDataModule(frame=mixed_frame, label="outcome", schema=three).spec["columns"][2]["type"] == "categorical"


def test_the_shipped_cervical_config_releases_the_same_spec_for_neighbouring_ages(tmp_path):
    """The shipped cervical config declares every dtype: a record with age 25.5 releases the same spec."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "configs" / "pategan_cervical.yaml").read_text())["data"]["init_args"]
    source = root / data.pop("path")
    if not source.is_file():
        pytest.skip(f"{source} is not here")
    raw = pd.read_csv(source, dtype=str, keep_default_na=False)  # the file as text ("?" markers kept)
    specs = []
    for age in ("25", "25.5"):
        frame = raw.copy()
        frame.loc[0, "Age"] = age
        path = tmp_path / f"age_{age}.csv"
        frame.to_csv(path, index=False)
        specs.append(_released(path=str(path), **{**data, "metadata_seed": 0}))
    assert specs[0] == specs[1]


def test_the_fit_summary_of_a_gan_on_a_table_recommends_the_marginal_model(mixed_frame):
    """What ``fit`` prints at its end: a private GAN fitted on a table names MarginalTree as the better choice for tables,
    with the measured gap (issue 59); MarginalTree's own summary does not."""
    from lightning_gpate import Synthesizer

    schema = {"age": {"min": 18, "max": 90}, "income": {"min": 0, "max": 120000}, "smoker": {"categories": ["no", "yes"]},
              "region": {"categories": ["east", "north", "south", "west"]}, "visits": {"min": 0, "max": 2},
              "flag": {"categories": [False, True]}, "outcome": {"categories": [0, 1]}}  # declared public
    quiet = dict(epsilon=1.0, delta=1e-5, max_steps=2, evaluate=False, log_samples=False, progress_bar=False, experiment="tables")
    data = dict(label="outcome", schema=schema, class_ratio=[0.7, 0.3])
    gan = Synthesizer("gpate", **quiet, anchor={"batch_size": 16, "features": 64}).fit(mixed_frame, **data, num_teachers=3)
    assert gan.model.anchor_options.fraction == 0.5 and bool(gan.model.anchor_measured)  # G-PATE's anchor: a default on tables too
    advice = [line for line in gan.summary.splitlines() if line.lstrip().startswith("advice")]
    assert len(advice) == 1 and 'Synthesizer("marginaltree"' in advice[0] and "better choice" in advice[0]
    assert "mean AUROC" in advice[0] and "MST" in advice[0]  # the measured gap, not a bare claim
    tree = Synthesizer("marginaltree", **quiet).fit(mixed_frame, **data)
    keys = [line.split()[0] for line in tree.summary.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert keys[0] == "model" and "MarginalTree" in tree.summary.splitlines()[1]
    assert "advice" not in keys and "better choice" not in tree.summary
