"""Shared fixtures: every test runs in its own folder with its own MLflow store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# One CPU thread per pytest-xdist worker, its fixtures of every scope and every process a test starts
# (set before torch is imported): N workers on N cores, not N workers × N threads each fighting for
# them (and for a neighbour's job: each parallel region waits for its slowest thread).
_THREADS = os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", _THREADS)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if _THREADS.isdigit():
    torch.set_num_threads(int(_THREADS))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config):
    """``--dist loadgroup`` keeps a module's tests that share one expensive fixture (``xdist_group``) on one worker
    by suffixing their node ids; pytest 9 keeps the id where pytest-xdist 3.8 cannot change it, so every group's
    fixture silently ran on every worker (minutes of CI). Refuse that pair rather than be slow."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    import xdist

    pytest_major, xdist_version = int(pytest.__version__.split(".")[0]), tuple(int(p) for p in xdist.__version__.split(".")[:2])
    if pytest_major >= 9 and xdist_version <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} loses xdist_group under "
                                "--dist loadgroup; install the pinned set: pip install -c constraints.txt -e '.[test]'")


REPOSITORY_STORE = Path(__file__).resolve().parents[1] / "mlruns"


def _store_listing() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in REPOSITORY_STORE.iterdir()} if REPOSITORY_STORE.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def _repository_store_untouched():
    """No test writes into the repository's own MLflow store: a user's runs live there, and pytest workers
    that share it race to create its tables (a module fixture that built a logger before ``_isolated`` did)."""
    before = _store_listing()
    yield
    after = _store_listing()
    changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
    assert after == before, f"{REPOSITORY_STORE} changed while the tests ran (a test, or a fit of yours beside them): {changed}"


@pytest.fixture(scope="session")
def _empty_store_database(tmp_path_factory) -> Path | None:
    """An MLflow store's database with MLflow's tables and nothing in them, made once per pytest process. A new
    store runs MLflow's schema migrations (~1 s of CPU and ~4 s of a busy disk's fsyncs here), which every test
    that logs would pay again for a store that starts as this one. It holds no experiment: MLflow adds its
    Default experiment, with this store's artifact root, when it opens the copy. (The module fixtures' stores
    and the repository's are created by MLflow as a user's are.)"""
    try:
        import sqlalchemy
        from mlflow.store.db.utils import _initialize_tables
    except ImportError:  # MLflow moved it: every test creates its store
        return None
    path = tmp_path_factory.mktemp("empty_store") / "mlflow.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    return path


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch, _empty_store_database):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (tmp_path / "mlruns").mkdir()
    if _empty_store_database is not None:
        shutil.copyfile(_empty_store_database, tmp_path / "mlruns" / "mlflow.db")
    torch.set_num_threads(1)
    yield


@pytest.fixture
def mixed_frame() -> pd.DataFrame:
    """A small table with every column kind, an integer and a float column, and a label."""
    rng = np.random.default_rng(0)
    n = 120
    return pd.DataFrame({
        "age": rng.integers(18, 90, n),
        "income": rng.normal(50_000, 12_000, n).round(2),
        "smoker": rng.choice(["yes", "no"], n),
        "region": rng.choice(["north", "south", "east", "west"], n),
        "visits": rng.integers(0, 3, n),
        "flag": rng.choice([True, False], n),
        "outcome": rng.choice([0, 1], n, p=[0.7, 0.3]),
    })


def query_run(experiment: str):
    """The newest MLflow run of an experiment in the test's store, and a client."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    assert runs, f"no runs in {experiment!r}"
    return runs[0], client
