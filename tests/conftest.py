"""Shared test fixtures: the kit's CLI as a subprocess, and one mini dataset per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_hpckit(*args, timeout=600, env=None, check=False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "hpckit", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpckit {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def mini_data(tmp_path_factory) -> Path:
    """The mini config's dataset in the public TFRecord format (generated once)."""
    out = tmp_path_factory.mktemp("cosmoflow") / "data"
    run_hpckit("datagen", "cosmoflow", "--config", "mini", "--out", out, "--seed", "7", check=True)
    return out
