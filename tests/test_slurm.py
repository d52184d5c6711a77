"""A real Slurm: a one-node cluster on localhost (tests/slurm/cluster.sh: munged, slurmctld,
slurmd from Debian's slurm-wlm and munge, all state under pytest's tmp dir, stopped by PID
at the end), the `slurm-local` ReFrame profile submitting through sbatch and launching
2 ranks with srun, and a rank killed under srun.

SLOW: the ReFrame run trains three mini models on 2 ranks each (several minutes on 2 cores).
Outside CI, a machine without slurm-wlm/munge (or not root) skips; in CI it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, kill_rank_mid_training, run_hpckit

pytestmark = pytest.mark.slow
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
REFRAME = Path(sys.executable).parent / "reframe"


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


def test_reframe_slurm_local_profile_passes(slurm, tmp_path):
    """`reframe -C site_profiles/slurm-local/settings.py -c reframe_checks/ -r`: both
    benchmarks through sbatch + srun on 2 tasks, all PASS."""
    env = {k: v for k, v in slurm.items() if not k.startswith("RFM_")}
    env.update(HOME=str(tmp_path / "home"), RFM_PREFIX=str(tmp_path / "rfm"), RFM_COLORIZE="n",
               RFM_REPORT_FILE=str(tmp_path / "report.json"), HPCKIT_STAGE_DIR=str(tmp_path / "scratch"))
    (tmp_path / "home").mkdir()
    proc = subprocess.run([str(REFRAME), "-C", "site_profiles/slurm-local/settings.py", "-c", "reframe_checks/", "-r"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"PASSED\s*\] Ran 5/5 test case", out), out[-3000:]
    output = tmp_path / "rfm" / "output" / "slurm-local" / "debug" / "hpckit-venv"
    scripts = {p.parent.name: p.read_text() for p in output.glob("*Check_*/rfm_job.sh")}
    assert len(scripts) == 3
    for script in scripts.values():
        assert "#SBATCH --ntasks=2" in script and "#SBATCH --partition=debug" in script
        assert re.search(r"^srun hpckit train \w+ .*--set data.batch_size=4", script, re.M)
    summaries = [json.loads(p.read_text()) for p in output.glob("*Check_*/summary.json")]
    assert len(summaries) == 3
    for s in summaries:
        assert (s["ranks"], s["launcher"], s["global_batch_size"], s["replicas_in_sync"]) == (2, "slurm", 8, True), s
        assert s["converged"] is True
    assert sorted(s["dist"] for s in summaries) == ["tf", "torch", "torch"]
    perflogs = tmp_path / "rfm" / "perflogs" / "slurm-local" / "debug"
    for check in ("CosmoFlowCheck", "DeepCAMCheck"):
        assert "|time_to_train|" in (perflogs / f"{check}.log").read_text()


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

