"""A real Slurm: a one-node cluster on localhost (tests/slurm/cluster.sh: munged, slurmctld,
slurmd from Debian's slurm-wlm and munge, all state under pytest's tmp dir, stopped by PID
at the end): two tasks under srun, and a rank killed under srun.

The ReFrame run through sbatch and srun (every check, several ranks) is
tests/test_multinode.py's, on 3 nodes with the `slurm-multinode` profile: one slow
end-to-end run of the Slurm path instead of two (the `slurm-local` profile differs from it
only in its partition's extras, which tests/test_reframe_dryrun.py checks).
Outside CI, a machine without slurm-wlm/munge (or not root) skips; in CI it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, kill_rank_mid_training, run_hpckit

pytestmark = pytest.mark.slow
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "srun") if shutil.which(t) is None]
    why = f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)" if missing else \
        ("slurmd must run as root" if os.geteuid() != 0 else None)
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        yield env
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=60)


def test_cluster_runs_two_tasks(slurm):
    out = subprocess.run(["srun", "-n", "2", "bash", "-c", "echo $SLURM_PROCID/$SLURM_STEP_NUM_TASKS"],
                         env=slurm, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["0/2", "1/2"]


def test_killed_rank_under_srun(slurm, tmp_path):
    data = tmp_path / "data"
    run_hpckit("datagen", "deepcam", "--config", "mini", "--out", data, "--seed", "7", check=True)
    out = tmp_path / "out"
    env = {**slurm, "SLURM_KILL_BAD_EXIT": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(["srun", "-n", "2", sys.executable, "-m", "hpckit", "train", "deepcam", "--data", str(data),
                             "--config", "mini", "--output-dir", str(out), "--seed", "1", "--threads", "1",
                             "--set", "data.batch_size=4"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    took, output = kill_rank_mid_training(proc, out, "SLURM_PROCID")
    assert proc.returncode != 0
    assert took < 60, f"srun took {took:.0f} s to end after rank 1 died"
    last = json.loads((out / "mlperf.log").read_text().splitlines()[-1].split(":::MLLOG ", 1)[1])
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted", last
    assert json.loads((out / "summary.json").read_text())["status"] == "aborted"

