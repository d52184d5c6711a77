"""Two real ranks under real launchers: mpirun (Open MPI), torchrun, Horovod under mpirun.

Each training is the mini config with local batch 4 on 2 ranks, so the global batch is the
1-rank runs' 8; it must reach the same quality target as the 1-rank runs (test_*_train),
with both model replicas identical at the end (the run checks a weight fingerprint across
ranks and records `replicas_in_sync`). A rank killed mid-training must end the job within
60 s, non-zero, with rank 0's log closed by run_stop aborted.

SLOW: about a minute per training on a 2-core machine. mpirun and torchrun must be
installed (CI installs Open MPI; torchrun comes with torch); Horovod is built by
requirements/build-horovod.sh. Outside CI a missing launcher skips its tests; in CI
(CI=true) it fails them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, kill_rank_mid_training, run_hpckit

pytestmark = pytest.mark.slow

ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
TRAIN_TIMEOUT_S = 900


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed: .ci/run must install it")
        pytest.skip(f"{tool} is not installed")


def free_port(span: int = 4) -> int:
    """A port p with p..p+span-1 free (torch uses p, the roll call p+1, tf.distribute p+2 and p+3)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span >= 65536:
            continue
        try:
            socks = []
            for p in range(port, port + span):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def command(launcher: str, port: int, args: list[str]) -> list[str]:
    hpckit = [sys.executable, "-m", "hpckit", *map(str, args)]
    if launcher == "mpirun":
        need("mpirun")
        return ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
                "-x", f"MASTER_PORT={port}", "-x", "TF_CPP_MIN_LOG_LEVEL=3", *hpckit]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
                "--max-restarts", "0", *hpckit[1:]]
    raise ValueError(launcher)


def launch(launcher: str, args: list[str], **popen) -> subprocess.Popen:
    env = {**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(command(launcher, free_port(), args), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def mllog(path: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
            if ":::MLLOG " in line]


def first(events, key):
    return next(e for e in events if e["key"] == key)


@pytest.fixture(scope="module")
def deepcam_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("deepcam") / "data"
    run_hpckit("datagen", "deepcam", "--config", "mini", "--out", out, "--seed", "7", check=True)
    return out


def train_args(benchmark, framework, data, out, stage, *extra):
    return ["train", benchmark, "--data", data, "--config", "mini", "--framework", framework,
            "--output-dir", out, "--stage-dir", stage, "--seed", "1",
            "--set", "data.batch_size=4", *extra]


# Each benchmark and framework once, the launchers shared out between them (each launcher's
# detection is tested on its own in test_dist_detect.py and both kill DeepCAM ranks below):
# every training here is a full convergence run, the slowest kind of test in the suite.
CASES = [("deepcam", "pytorch", "mpirun"), ("cosmoflow", "pytorch", "torchrun"),
         ("cosmoflow", "tensorflow", "mpirun")]


@pytest.mark.parametrize("benchmark, framework, launcher", CASES)
def test_two_ranks_converge_like_one(launcher, benchmark, framework, mini_data, deepcam_data, tmp_path):
    data = deepcam_data if benchmark == "deepcam" else mini_data
    out = tmp_path / "out"
    proc = launch(launcher, train_args(benchmark, framework, data, out, tmp_path / "stage", "--keep-staged"))
    output, _ = proc.communicate(timeout=TRAIN_TIMEOUT_S)
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["converged"] is True and summary["status"] == "success", summary
    expected_launcher = {"mpirun": "openmpi", "torchrun": "torchrun"}[launcher]
    expected_dist = "tf" if framework == "tensorflow" else "torch"
    assert (summary["ranks"], summary["nodes"], summary["ranks_per_node"]) == (2, 1, 2)
    assert (summary["launcher"], summary["dist"]) == (expected_launcher, expected_dist)
    assert summary["replicas_in_sync"] is True
    assert summary["global_batch_size"] == 8          # = the 1-rank mini run's (batch 8 x 1 rank)
    events = mllog(out / "mlperf.log")
    assert first(events, "global_batch_size")["value"] == 8
    assert first(events, "number_of_nodes")["value"] == 1
    assert first(events, "accelerators_per_node")["value"] == 0
    assert first(events, "hpckit_config")["value"]["ranks"] == 2
    # no binding from the launcher (--bind-to none, torchrun): rank 0 pinned itself to one
    # of the two cores, with one intra-op thread, not both ranks on all cores
    assert first(events, "hpckit_config")["value"]["cores"] == {
        "threads": 1, "cpus": "0", "binding": "node share", "loader_workers": 0, "ranks_per_node": 2}
    # every training sample once per epoch, counted over both ranks
    epochs = summary["epochs"]
    throughput = [e for e in events if e["key"] == "throughput"]
    assert len(throughput) == epochs
    # per-node staging: one node, so its local rank 0 staged the whole dataset
    stop = first(events, "staging_stop")["metadata"]
    assert stop["staged"] is True and Path(stop["stage_dir"]).parent == tmp_path / "stage"
    staged = sorted(p.name for p in (Path(stop["stage_dir"]) / "train").iterdir())   # kept: --keep-staged
    assert len(staged) == (256 if benchmark == "deepcam" else 1024)
    share = first(events, "hpckit_train_share")["value"]
    assert share["shuffle"] == "per-epoch permutation of the staged node share"
    # what the run used, per rank (common/usage.py): both ranks' peaks; under DDP every
    # training batch all-reduces every fp32 gradient once (the model's parameters x 4 bytes),
    # timed in flight for part of the training time; TensorFlow's all-reduce is not counted
    usage = summary["usage"]
    assert len(usage["peak_rss_bytes_per_rank"]) == 2 and min(usage["peak_rss_bytes_per_rank"]) > 100e6
    if framework == "pytorch":
        described = run_hpckit("describe", benchmark, "--config", "mini", "--framework", "pytorch", check=True)
        params = int(re.search(r"^parameters: (\d+)$", described.stdout, re.M)[1])
        assert usage["grad_allreduce_bytes_per_batch"] == params * 4
        assert 0 < usage["grad_allreduce_share"] < 1
    else:
        assert usage["grad_allreduce_bytes_per_batch"] is None and usage["grad_allreduce_share"] is None
    # one log, written by rank 0 only, and it passes the compliance check
    assert sum(1 for e in events if e["key"] == "run_stop") == 1
    check = run_hpckit("check", out / "mlperf.log", "--ruleset", "mini", "--config", "mini")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("launcher, rank_var", [("mpirun", "OMPI_COMM_WORLD_RANK"), ("torchrun", "RANK")])
def test_killed_rank_ends_the_job_within_60s(launcher, rank_var, deepcam_data, tmp_path):
    out = tmp_path / "out"
    proc = launch(launcher, train_args("deepcam", "pytorch", deepcam_data, out, tmp_path / "stage"))
    took, output = kill_rank_mid_training(proc, out, rank_var)
    assert proc.returncode != 0
    assert took < 60, f"the job took {took:.0f} s to end after rank 1 died"
    events = mllog(out / "mlperf.log")             # rank 0's log is kept, and closed
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted", events[-1]
    summary = json.loads((out / "summary.json").read_text())
    # rank 0 saw the dead peer in a collective, or the launcher stopped it first
    assert summary["status"] == "aborted", summary
    assert re.search(r"a collective failed|terminated by SIGTERM", summary["error"]), summary["error"]
    assert re.search(r"hpckit train: error: (rank 0 of 2: a collective failed|terminated by SIGTERM)", output), \
        output[-3000:]


def test_horovod_two_ranks_under_mpirun(mini_data, tmp_path):
    need("mpirun")
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("horovod.torch is not importable: .ci/run builds it (requirements/build-horovod.sh)")
        pytest.skip("Horovod is not built here (requirements/build-horovod.sh .venv)")
    out = tmp_path / "out"
    proc = launch("mpirun", train_args("cosmoflow", "pytorch", mini_data, out, tmp_path / "stage", "--dist", "horovod"))
    output, _ = proc.communicate(timeout=TRAIN_TIMEOUT_S)
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["converged"] is True and summary["dist"] == "horovod", summary
    assert summary["replicas_in_sync"] is True and summary["global_batch_size"] == 8
    assert summary["usage"]["grad_allreduce_bytes_per_batch"] > 0 and 0 < summary["usage"]["grad_allreduce_share"] < 1


def test_three_ranks_on_a_training_set_not_divisible_by_three(deepcam_data, tmp_path):
    """238 training samples over 3 ranks with local batch 8: a plain rank::size shard gives
    80, 79, 79 samples, so rank 0 would take 10 steps and the others 9, and wait in an
    all-reduce that no other rank joins. Shared equally: 72 samples (9 steps) on every
    rank, 22 dropped, and the epoch ends on every rank together."""
    need("mpirun")
    out = tmp_path / "out"
    hpckit = [sys.executable, "-m", "hpckit", "train", "deepcam", "--data", str(deepcam_data), "--config", "mini",
              "--output-dir", str(out), "--seed", "1", "--set", "train.n_epochs=1", "--set", "data.n_train=238"]
    env = {**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x",
                           "PYTHONPATH", "-x", f"MASTER_PORT={free_port()}", *hpckit],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=TRAIN_TIMEOUT_S)
    events = mllog(out / "mlperf.log")
    assert first(events, "hpckit_train_share")["value"] == {
        "samples_per_rank": 72, "dropped_samples": 22, "shuffle": "per-epoch global permutation"}, \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode in (0, 3), proc.stderr[-3000:]    # one epoch: converged or trained to the end
    assert first(events, "hpckit_config")["value"]["ranks"] == 3
    assert sum(e["value"] for e in events if e["key"] == "throughput") > 0
    assert [e["key"] for e in events].count("epoch_stop") == 1 and events[-1]["key"] == "run_stop"
    assert json.loads((out / "summary.json").read_text())["replicas_in_sync"] is True
