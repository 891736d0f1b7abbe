"""The private-pgm peer (benchmarks/peers_pgm.py) computes AIM's candidate marginals itself, in numpy: they
must be the numbers mbi's own ``model.project`` gives. It runs in private-pgm's virtualenv (mbi needs JAX,
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
def test_aim_candidate_marginals_match_mbi_inference():
    proc = subprocess.run([str(PGM_PYTHON), str(ROOT / "benchmarks" / "peers_pgm.py"), "--self-check"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    # a model over cycles (3-attribute junction-tree cliques) and a separate tree: every 1-way and 40 2-way marginals
    assert json.loads(proc.stdout.strip().splitlines()[-1])["max_relative_difference"] < 1e-9
