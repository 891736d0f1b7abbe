"""The private-pgm peer (benchmarks/peers_pgm.py) computes AIM's candidate marginals and model sizes itself
(mbi's took ~30 min a cervical fit): they must be the numbers of mbi's own ``model.project`` and
``hypothetical_model_size``. It runs in private-pgm's virtualenv (mbi needs JAX,
the project does not): ``PGM_PYTHON`` or ``.venv-pgm/bin/python``; skipped where neither exists."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PGM_PYTHON = Path(os.environ.get("PGM_PYTHON", ROOT / ".venv-pgm" / "bin" / "python"))


@pytest.mark.skipif(not PGM_PYTHON.exists(), reason="no private-pgm interpreter (PGM_PYTHON or .venv-pgm)")
def test_aim_candidate_marginals_and_model_sizes_match_mbi():
    proc = subprocess.run([str(PGM_PYTHON), str(ROOT / "benchmarks" / "peers_pgm.py"), "--self-check"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = json.loads(proc.stdout.strip().splitlines()[-1])
    # a model over cycles (3-attribute junction-tree cliques) and a separate tree: every 1-way and 40 2-way marginals
    assert check["max_relative_difference"] < 1e-9
    # 300 random graphs of 3-12 attributes (trees, forests, cycles): the same cells, exactly
    assert check["max_model_size_difference_mb"] == 0.0
