"""Shared test fixtures: the kit's CLI as a subprocess, and one mini dataset per session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def rank_pid(out: Path, rank_var: str, rank: int) -> int | None:
    """PID of the hpckit process writing into `out` whose launcher set `rank_var`=`rank`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"hpckit" not in cmdline or str(out).encode() not in cmdline:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{rank_var}={rank}".encode() in env:
            return int(proc.name)
    return None


def kill_rank_mid_training(proc: subprocess.Popen, out: Path, rank_var: str, rank: int = 1) -> tuple[float, str]:
    """Wait until the launched training logs its first epoch_start, SIGKILL the process of
    `rank`, and return (seconds from the kill until the launcher exited, its output)."""
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            log = out / "mlperf.log"
            if log.exists() and '"epoch_start"' in log.read_text():
                break
            if proc.poll() is not None:
                pytest.fail(f"training ended before it could be killed: {proc.stdout.read()[-3000:]}")
            time.sleep(0.5)
        time.sleep(2)
        victim = rank_pid(out, rank_var, rank)
        assert victim is not None, f"rank {rank} not found"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        return time.monotonic() - killed_at, output
    finally:
        if proc.poll() is None:
            proc.kill()
