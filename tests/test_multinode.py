"""Several nodes: a real 3-node Slurm cluster on this machine (tests/slurm/multinode.sh:
one slurmctld on a login node, one slurmd per compute node, each node in its own network,
UTS and mount namespace with its own tmpfs scratch, all on a bridge), and the kit run
across it:

* where each rank runs, as the launcher and the ranks say: srun -N 3 -n 3, -N 3 -n 6 with
  the block and the cyclic distribution, mpirun inside an allocation (--map-by node),
  torchrun per node; TensorFlow's worker list from where the ranks really are;
* Slurm host lists in the forms Slurm writes (the nodes are named cn01 cn02 gpu1, which
  Slurm writes as the two groups cn[01-02],gpu1), the kit's parser against scontrol;
* staging: each node stages its share into its own scratch and trains from it alone;
* a 2-node TensorFlow run with the cyclic distribution;
* a throughput campaign of 3 instances, one per node, scored as a weak set;
* faults: every rank of one node killed mid-training; one node's scratch full;
* the `slurm-multinode` ReFrame profile: every check and framework across the 3 nodes.

Needs root, slurm-wlm, munge, iproute2. Outside CI a machine without them skips; in CI it
fails. SLOW: about 6 minutes on 2 cores (the trainings; the cluster starts in seconds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, run_hpckit

pytestmark = pytest.mark.slow
MULTINODE = REPO / "tests" / "slurm" / "multinode.sh"
NAMES = ("cn01", "cn02", "gpu1")
NET = "10.77.0"
ADDRESS = {name: f"{NET}.{11 + i}" for i, name in enumerate(NAMES)}
PY = sys.executable
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}


class Cluster:
    def __init__(self, state: Path):
        self.state = state
        self.scratch = state / "scratch"   # the same path on every node, a tmpfs of its own on each

    def login(self, *cmd, timeout=600, env=None, **kw) -> subprocess.CompletedProcess:
        """`cmd` on the login node, as a user of the cluster runs it."""
        return subprocess.run(["bash", str(MULTINODE), "exec", str(self.state), *map(str, cmd)], cwd=REPO,
                              env={**os.environ, **ROOT_ENV, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, **kw)

    def popen(self, *cmd, env=None) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(MULTINODE), "exec", str(self.state), *map(str, cmd)], cwd=REPO,
                                env={**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1", **(env or {})}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def on_node(self, node: str, *cmd, check=True) -> subprocess.CompletedProcess:
        """`cmd` inside compute node `node` (its network, host name and mounts)."""
        proc = subprocess.run(["bash", str(MULTINODE), "node", str(self.state), node, *map(str, cmd)],
                              capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def pids(self, node: str) -> list[int]:
        proc = subprocess.run(["bash", str(MULTINODE), "pids", str(self.state), node], capture_output=True,
                              text=True, timeout=60, check=True)
        return [int(p) for p in proc.stdout.split()]

    def scratch_listing(self, node: str) -> list[str]:
        out = self.on_node(node, "find", self.scratch, "-mindepth", "1").stdout.split()
        return sorted(str(Path(p).relative_to(self.scratch)) for p in out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [t for t in ("munged", "slurmctld", "slurmd", "srun", "ip", "nsenter", "unshare") if shutil.which(t) is None]
    why = f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge iproute2)" if missing else \
        ("the namespaces and slurmd need root" if os.geteuid() != 0 else None)
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    state = tmp_path_factory.mktemp("multinode")
    env = {**os.environ, "HPCKIT_NODE_NAMES": " ".join(NAMES), "HPCKIT_MULTINODE_NET": NET}
    t0 = time.monotonic()
    started = subprocess.run(["bash", str(MULTINODE), "start", str(state), str(len(NAMES))], env=env,
                             capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    print(f"3-node cluster up in {time.monotonic() - t0:.1f} s")
    try:
        yield Cluster(state)
    finally:
        subprocess.run(["bash", str(MULTINODE), "stop", str(state)], timeout=120)
        tag = "hk" + __import__("hashlib").md5(str(state.resolve()).encode()).hexdigest()[:6]
        left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(tag)]
        assert not left, f"namespaces left after stop: {left}"


def test_nodes_are_separate_hosts_with_their_own_scratch(cluster):
    proc = cluster.login("srun", "-N", 3, "-n", 3, "-l", "sh", "-c",
                         f'echo $(hostname) $(df --output=source {cluster.scratch} | tail -n 1) '
                         f'$(ip -4 -o addr show eth0 | awk "{{print \\$4}}")')
    assert proc.returncode == 0, proc.stderr
    seen = sorted(line.split(": ", 1)[1].split() for line in proc.stdout.splitlines())
    assert seen == [[n, f"hpckit-scratch-{n}", f"{ADDRESS[n]}/24"] for n in NAMES], seen
    # the host (the "parallel file system" side) sees none of the nodes' scratch
    assert not any(cluster.scratch.iterdir())


# ---------------------------------------------------------------- host lists

FORMS = ["cn01", "cn[01-02],gpu1", "nid[001-003,007],login1", "n[1-2],m[3,5-6],z", "x[8-11]", "n[09-10]",
         "r[1-2]n[01-02]", "a1-ib,b[2-3]-ib"]


def test_host_lists_as_slurm_writes_them(cluster):
    from hpckit.common import dist
    for spec in FORMS:
        proc = cluster.login("scontrol", "show", "hostnames", spec)
        if proc.returncode != 0 or not proc.stdout.split():
            # a form this Slurm does not write (22.05: no text after a bracket): the kit's own
            # parser still takes it, and expand_hostlist falls back to it
            assert "Invalid hostlist" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
            continue
        assert dist._parse_hostlist(spec) == proc.stdout.split(), spec
    # and the list Slurm gives a job on these nodes: two bracket groups
    proc = cluster.login("salloc", "-N", 3, "sh", "-c", "echo $SLURM_JOB_NODELIST")
    assert proc.stdout.split() == ["cn[01-02],gpu1"], proc.stdout + proc.stderr
    assert dist._parse_hostlist("cn[01-02],gpu1") == list(NAMES)


# ---------------------------------------------------------------- where ranks run

PROBE = """
import json, socket
from hpckit.common import dist
r = dist.roll_call(dist.detect(), 60)
print("PROBE " + json.dumps({"rank": r.rank, "size": r.size, "host": socket.gethostname(), "node": r.node,
    "nodes": r.nodes, "local_rank": r.local_rank, "local_size": r.local_size, "node_hosts": list(r.node_hosts),
    "launcher": r.launcher, "master": r.master_addr, "port": r.master_port, "workers": dist.tf_workers(r)}), flush=True)
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "probe.py"   # on the shared file system
    path.write_text(PROBE)
    return path


def _probe(cluster, *launch) -> list[dict]:
    proc = cluster.login(*launch, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # ranks' lines may arrive glued together on one line: decode each object where it starts
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(proc.stdout, m.end())[0] for m in re.finditer(r"PROBE ", proc.stdout)]
    return sorted(rows, key=lambda r: r["rank"])


def _check_layout(rows: list[dict], size: int, node_of) -> None:
    assert [r["rank"] for r in rows] == list(range(size)), rows
    for r in rows:
        assert r["host"] == NAMES[node_of(r["rank"])], (r, "rank not on the node the distribution puts it")
        assert r["node_hosts"][r["node"]] == r["host"], r
        assert r["nodes"] == 3 and r["master"] == NAMES[0], r
    by_host: dict[str, list[dict]] = {}
    for r in rows:
        by_host.setdefault(r["host"], []).append(r)
    for host, on in by_host.items():
        assert sorted(r["local_rank"] for r in on) == list(range(len(on))), (host, on)
        assert all(r["local_size"] == len(on) for r in on), (host, on)
    # TensorFlow's worker list, identical on every rank: each rank at its own node's address
    workers = rows[0]["workers"]
    assert all(r["workers"] == workers for r in rows)
    for r in rows:
        host, port = workers[r["rank"]].rsplit(":", 1)
        expect = NAMES[0] if r["rank"] == 0 else ADDRESS[r["host"]]   # rank 0: the rendezvous name
        assert host == expect and int(port) == r["port"] + 2 + r["local_rank"], (r, workers)


@pytest.mark.parametrize("layout", ["srun-N3-n3", "srun-N3-n6-block", "srun-N3-n6-cyclic"])
def test_srun_ranks_know_their_node(cluster, probe, layout):
    n = 3 if layout == "srun-N3-n3" else 6
    dist_opt = [] if n == 3 else ["-m", layout.rsplit("-", 1)[1]]
    rows = _probe(cluster, "srun", "-N", 3, "-n", n, *dist_opt, PY, probe)
    node_of = (lambda r: r) if n == 3 else (lambda r: r // 2) if layout.endswith("block") else (lambda r: r % 3)
    _check_layout(rows, n, node_of)
    assert {r["launcher"] for r in rows} == {"slurm"}


def test_mpirun_inside_an_allocation(cluster, probe):
    """Open MPI names no node: the ranks tell each other their hosts (--map-by node puts
    rank r on node r mod 3; the kit used to assume r // 2)."""
    if shutil.which("mpirun") is None:
        pytest.fail("no mpirun (apt-get install openmpi-bin)") if os.environ.get("CI") else pytest.skip("no mpirun")
    rows = _probe(cluster, "salloc", "-N", 3, "-n", 6, "mpirun", "--oversubscribe", "--map-by", "node", "--bind-to",
                  "none", PY, probe)
    _check_layout(rows, 6, lambda r: r % 3)
    assert {r["launcher"] for r in rows} == {"openmpi"}


def test_torchrun_per_node(cluster, probe):
    script = (f"exec {PY} -m torch.distributed.run --nnodes 3 --nproc-per-node 2 --node-rank $SLURM_NODEID "
              f"--master-addr {NAMES[0]} --master-port 29400 --max-restarts 0 {probe}")
    rows = _probe(cluster, "srun", "-N", 3, "--ntasks-per-node", 1, "bash", "-c", script)
    _check_layout(rows, 6, lambda r: r // 2)
    assert {r["launcher"] for r in rows} == {"torchrun"}


# ---------------------------------------------------------------- trainings across nodes

@pytest.fixture(scope="module")
def deepcam_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("mn-deepcam") / "data"
    run_hpckit("datagen", "deepcam", "--config", "mini", "--out", out, "--seed", "7", check=True)
    return out


class Opens:
    """Every open(2) of a file in `dirs`, as inotify reports it (any process, any
    namespace: the files are on the host's file system), with the time it was read."""
    IN_OPEN = 0x20

    def __init__(self, dirs: list[Path]):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        assert self.fd >= 0
        self.watch = {libc.inotify_add_watch(self.fd, str(d).encode(), self.IN_OPEN): d for d in dirs}
        self.events: list[tuple[float, Path]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.stop.is_set():
            if not select.select([self.fd], [], [], 0.1)[0]:
                continue
            buf = os.read(self.fd, 65536)
            now = time.monotonic()
            i = 0
            while i < len(buf):
                wd, _mask, _cookie, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
                if name:
                    self.events.append((now, self.watch[wd] / name))
                i += 16 + n

    def close(self):
        self.stop.set()
        self.thread.join()
        os.close(self.fd)


def _events(log: Path) -> list[dict]:
    return [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in log.read_text().splitlines() if ":::MLLOG " in ln]


def _wait_for(log: Path, key: str, proc: subprocess.Popen, timeout=300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and f'"{key}"' in log.read_text():
            return time.monotonic()
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {key}: {proc.stdout.read()[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"no {key} in {log} within {timeout} s")


def train_cmd(data, out, stage, *extra):
    return ["srun", "--kill-on-bad-exit=1", *extra, PY, "-m", "hpckit", "train", "deepcam", "--data", data,
            "--config", "mini", "--output-dir", out, "--seed", 1, "--threads", 1, "--stage-dir", stage,
            "--set", "data.batch_size=4"]


def test_each_node_trains_from_its_own_scratch(cluster, deepcam_data, tmp_path):
    splits = [deepcam_data / "train", deepcam_data / "validation"]
    files = {p for d in splits for p in d.iterdir()}
    opens = Opens(splits)
    out = tmp_path / "out"
    try:
        proc = cluster.popen(*train_cmd(deepcam_data, out, cluster.scratch, "-N", 3, "-n", 3), "--keep-staged")
        _wait_for(out / "mlperf.log", "epoch_stop", proc)
        first_epoch_done = time.monotonic()
        output, _ = proc.communicate(timeout=600)
    finally:
        opens.close()
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["converged"], summary["ranks"], summary["nodes"], summary["launcher"]) == (True, 3, 3, "slurm")
    assert summary["epochs"] >= 2, summary
    # staging: every node holds its own share in its own scratch, the shares partition the data
    staged = {n: [p for p in cluster.scratch_listing(n) if p.endswith(".h5")] for n in NAMES}
    names = {n: {Path(p).name for p in staged[n]} for n in NAMES}
    assert all(names.values()), staged
    assert sum(len(v) for v in names.values()) == len(files) and set().union(*names.values()) == \
        {p.name for p in files}, "the nodes' shares do not partition the dataset"
    stop = next(e for e in _events(out / "mlperf.log") if e["key"] == "staging_stop")
    assert stop["metadata"]["staged"] is True
    # each node's own copy time (its local rank 0, before the barrier), by the node's name;
    # the three copies together read at least the dataset
    per_node = summary["usage"]["staging_copy_s_per_node"]
    # (each node times its own copy from its own start: rank 0's staging_s began on rank 0's
    # clock, so another node's copy may run a little past it; both lie inside the run)
    assert sorted(per_node) == sorted(NAMES) and all(0 < t < summary["time_to_train_s"] for t in per_node.values())
    assert summary["usage"]["staging_read_bytes"] >= sum(p.stat().st_size for p in files)
    # training read the staged copies only: every shared file was opened (checked, evicted,
    # staged) before training, and none once the first epoch was done; DeepCAM's loader
    # opens a file at every read of a sample (deepcam/data.py read_raw, no cache), so
    # epochs 2.. reading the shared copy would show here
    assert {p for _, p in opens.events} >= files, "inotify saw no staging reads: the watch is blind"
    late = [p for t, p in opens.events if t > first_epoch_done and p in files]
    assert not late, f"read from the shared file system after staging: {sorted(set(late))[:5]}"
    for n in NAMES:   # --keep-staged: the run's copies are there to inspect; remove them (ours)
        cluster.on_node(n, "sh", "-c", f"rm -rf {cluster.scratch}/hpckit-stage-*")


def test_tensorflow_across_nodes_with_the_cyclic_distribution(cluster, mini_data, tmp_path):
    """2 nodes x 2 ranks, cyclic: rank 1 runs on the second node, and tf.distribute's
    worker list must say so or the workers never meet. Two epochs, each ending in an
    evaluation across the four workers, show that they met (convergence across ranks is
    test_multirank's; here it cost the suite minutes for nothing the placement needs)."""
    out = tmp_path / "out"
    # without --kill-on-bad-exit: every rank of a run stopped unconverged exits 3, and srun
    # would kill the others before rank 0 wrote its summary (the collective timeout bounds a hang)
    proc = cluster.login("srun", "-N", 2, "-n", 4, "-m", "cyclic", PY, "-m", "hpckit", "train",
                         "cosmoflow", "--framework", "tensorflow", "--data", mini_data, "--config", "mini",
                         "--output-dir", out, "--seed", 1, "--threads", 1, "--stage-dir", cluster.scratch,
                         "--collective-timeout", 120, "--set", "data.batch_size=2", "--set", "train.n_epochs=2",
                         env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == (0 if summary["converged"] else 3), (proc.stdout + proc.stderr)[-4000:]
    assert (summary["epochs"], summary["ranks"], summary["nodes"], summary["dist"]) == (2, 4, 2, "tf"), summary
    evals = [e for e in _events(out / "mlperf.log") if e["key"] == "eval_error"]
    assert len(evals) == 2, evals


def test_a_campaign_across_the_nodes(cluster, deepcam_data, tmp_path):
    """A throughput campaign of 3 instances x 1 rank in one allocation of 3 nodes: each
    instance on its own node (where srun put its rank, as the roll call found it), staging
    into that node's scratch at the same time as the others, and `hpckit score` takes the
    campaign as one weak set of 3 models of instance scale 1."""
    out = tmp_path / "out"
    proc = cluster.login(*train_cmd(deepcam_data, out, cluster.scratch, "-N", 3, "-n", 3), "--instances", 3,
                         "--set", "train.target_iou=0.5", timeout=900)   # a near target: the point is where they run
    assert proc.returncode in (0, 3), (proc.stdout + proc.stderr)[-4000:]
    hosts, starts, staging = set(), [], []
    for i in range(3):
        summary = json.loads((out / f"instance_{i}" / "summary.json").read_text())
        assert (summary["instance"], summary["instances"], summary["ranks"], summary["nodes"]) == (i, 3, 1, 1)
        assert summary["campaign_ranks"] == 3 and summary["launcher"] == "slurm"
        hosts.add(summary["provenance"]["host"]["name"])
        events = _events(out / f"instance_{i}" / "mlperf.log")
        starts.append(next(e["time_ms"] for e in events if e["key"] == "run_start"))
        stop = next(e for e in events if e["key"] == "staging_stop")
        assert stop["metadata"]["staged"] is True
        staging.append((next(e["time_ms"] for e in events if e["key"] == "staging_start"), stop["time_ms"]))
        assert all(e.get("metadata", {}).get("instance") == i for e in events if e["key"] in ("run_start", "run_stop"))
    assert hosts == set(NAMES), hosts
    assert max(starts) - min(starts) < 2000, starts          # the start barrier
    # the three nodes staged at once, each from the shared copy into its own scratch
    assert max(a for a, _ in staging) < min(b for _, b in staging), staging
    js = tmp_path / "score.json"
    score = run_hpckit("score", out, "--json", js)
    (s,) = json.loads(js.read_text())["sets"]
    assert (s["score"]["kind"], s["score"]["number_of_models"], s["score"]["instance_scale"]) == ("weak", 3, 1), \
        score.stdout


def test_a_node_lost_mid_training(cluster, deepcam_data, tmp_path):
    """Every rank of cn02 killed: the job ends within 60 s, one line names the node, the
    surviving ranks close the run as aborted."""
    out = tmp_path / "out"
    proc = cluster.popen(*train_cmd(deepcam_data, out, cluster.scratch, "-N", 3, "-n", 3))
    try:
        _wait_for(out / "mlperf.log", "epoch_start", proc)
        time.sleep(2)
        victims = [p for p in cluster.pids("cn02")
                   if b"hpckit" in Path(f"/proc/{p}/cmdline").read_bytes() and b"train" in
                   Path(f"/proc/{p}/cmdline").read_bytes()]
        assert victims, "no rank found on cn02"
        for p in victims:
            os.kill(p, signal.SIGKILL)
        killed = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert took < 60, f"the job took {took:.0f} s to end after cn02 died"
    # the node is named: by srun ("srun: error: cn02: task 1: Killed") and by each surviving
    # rank whose collective hit the dead peer before srun's SIGTERM reached it
    named = [ln for ln in output.splitlines() if re.match(r"srun: error: cn02: task \d+: Killed", ln)
             or ("hpckit train: error:" in ln and "lost node cn02 (rank 1 at 10.77.0.12)" in ln)]
    assert named, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    last = _events(out / "mlperf.log")[-1]
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted", last
    assert "lost node cn02" in last["metadata"]["reason"] or "terminated by SIGTERM" in last["metadata"]["reason"], last
    print("lines naming the node:", *named, sep="\n  ")
    # SIGKILLed ranks cannot clean up: what cn02 staged stays, as on a real node until its
    # epilog; this test made it, this test removes it
    cluster.on_node("cn02", "sh", "-c", f"rm -rf {cluster.scratch}/hpckit-stage-*")
    assert json.loads((out / "summary.json").read_text())["status"] == "aborted"
    print(f"job ended {took:.1f} s after cn02's ranks were killed")


def test_one_node_scratch_full_during_staging(cluster, deepcam_data, tmp_path):
    """gpu1's scratch holds 64 KiB: staging fails there in one line naming the node and
    the file, and no node keeps anything of the run in its scratch."""
    before = {n: cluster.scratch_listing(n) for n in NAMES}
    cluster.on_node("gpu1", "mount", "-o", "remount,size=64k", cluster.scratch)
    try:
        out = tmp_path / "out"
        proc = cluster.login(*train_cmd(deepcam_data, out, cluster.scratch, "-N", 3, "-n", 3), timeout=300)
    finally:
        cluster.on_node("gpu1", "mount", "-o", "remount,size=1g", cluster.scratch)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in output, output[-3000:]
    full = [ln for ln in output.splitlines() if "No space left on device" in ln]
    assert full and all("node gpu1" in ln and str(cluster.scratch / "hpckit-stage-") in ln for ln in full), output[-3000:]
    assert re.search(r"hpckit-stage-[0-9a-f]{8}/(train|validation)/\S+\.h5", full[0]), full[0]
    for n in NAMES:
        assert cluster.scratch_listing(n) == before[n], f"{n} kept files of the failed run"


# ---------------------------------------------------------------- ReFrame across nodes

def test_reframe_across_three_nodes(cluster, tmp_path):
    """`reframe -C site_profiles/slurm-multinode/settings.py -c reframe_checks/ -r` on the
    login node: CosmoFlow through sbatch + srun on 3 nodes, PASS."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "RFM_PREFIX": str(tmp_path / "rfm"), "RFM_COLORIZE": "n",
           "RFM_REPORT_FILE": str(tmp_path / "report.json"), "HPCKIT_STAGE_DIR": str(cluster.scratch),
           "HPCKIT_OMP_NUM_THREADS": "1"}   # 3 nodes on this machine's 2 cores
    reframe = Path(PY).parent / "reframe"
    # left out for CI's time: the profile's campaign check (feature `campaign`), as
    # test_a_campaign_across_the_nodes runs a campaign across these nodes and checks more (where
    # each instance ran) in a third of the time; CosmoFlow's TensorFlow variant, as
    # test_tensorflow_across_nodes_with_the_cyclic_distribution trains TensorFlow across nodes
    # (the launch line ReFrame writes is the PyTorch variant's) and test_reframe_checks runs it;
    # DeepCAM, as test_each_node_trains_from_its_own_scratch trains it to its target on these
    # three nodes under srun (the job script ReFrame writes is the same for every check: the
    # profile's, asserted below); OC20 (its multi-rank path: tests/test_oc20_train.py);
    # OpenFold (one rank in test_reframe_checks, minutes of training)
    proc = cluster.login("env", *(f"{k}={v}" for k, v in env.items()), reframe, "-C",
                         "site_profiles/slurm-multinode/settings.py", "-c", "reframe_checks/", "-x", "DeepCAMCampaign",
                         "-x", "DeepCAMCheck", "-x", "OC20Check", "-x", "OpenFoldCheck",
                         "-x", "CosmoFlowCheck%framework=tensorflow", "-r", timeout=3000)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"PASSED\s*\] Ran 2/2 test case", out), out[-3000:]
    output = tmp_path / "rfm" / "output" / "slurm-multinode" / "batch" / "hpckit-venv"
    scripts = [p.read_text() for p in output.glob("*Check_*/rfm_job.sh")]
    assert len(scripts) == 1 and all("#SBATCH --ntasks-per-node=1" in s and "#SBATCH --ntasks=3" in s for s in scripts), scripts
    summaries = [json.loads(p.read_text()) for p in output.glob("*Check_*/summary.json")]
    assert len(summaries) == 1
    for s in summaries:
        assert (s["ranks"], s["nodes"], s["launcher"], s["converged"]) == (3, 3, "slurm", True), s
        assert s["cores"]["threads"] == 1 and s["cores"]["binding"] == "--threads", s["cores"]   # 3 ranks, 2 cores
    assert [(s["benchmark"], s["dist"]) for s in summaries] == [("cosmoflow", "torch")]
