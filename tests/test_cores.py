"""Ranks that share a node share its cores (hpckit/common/cores.py): the decision for the
layouts a centre meets, and real launches (taskset, torchrun, mpirun with and without
binding) whose ranks report the CPUs and threads they ended up with."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from hpckit.common import cores

ALL = set(range(128))


@pytest.mark.parametrize("local_rank,local_size,affinity,allocation,workers,expect", [
    # one rank, whole node: every CPU for the step
    (0, 1, ALL, ALL, 0, (128, "0-127", "node share", 0)),
    (0, 1, ALL, ALL, 4, (128, "0-127", "node share", 4)),
    # one rank, half the cores taken away (taskset): the binding is honoured
    (0, 1, set(range(64)), ALL, 0, (64, "0-63", "launcher", 0)),
    # 4 ranks, nobody bound them: each takes its quarter and pins itself to it
    (0, 4, ALL, ALL, 0, (32, "0-31", "node share", 0)),
    (3, 4, ALL, ALL, 4, (32, "96-127", "node share", 4)),
    # 4 ranks bound by srun --cpu-bind=cores -c 32 / mpirun --map-by socket:PE=32
    (2, 4, set(range(64, 96)), ALL, 0, (32, "64-95", "launcher", 0)),
    # the job's cgroup holds 64 CPUs, 4 unbound ranks share them
    (1, 4, set(range(64, 128)), set(range(64, 128)), 0, (16, "80-95", "node share", 0)),
    # mpirun's default for 2 ranks on 2 cores: --bind-to core
    (1, 2, {1}, {0, 1}, 0, (1, "1", "launcher", 0)),
    # torchrun on 2 cores: one core each
    (1, 2, {0, 1}, {0, 1}, 0, (1, "1", "node share", 0)),
    # more ranks than CPUs: one thread each, ranks wrap around; one worker at least
    (3, 4, {0, 1}, {0, 1}, 2, (1, "1", "node share", 1)),
    # loader workers cut to half the rank's CPUs
    (0, 2, set(range(8)), set(range(8)), 4, (4, "0-3", "node share", 2)),
])
def test_plan(local_rank, local_size, affinity, allocation, workers, expect):
    p = cores.plan(local_rank, local_size, None, workers, affinity=affinity, allocation=allocation)
    assert (p.threads, cores.cpu_list(p.cpus), p.binding, p.loader_workers) == expect


@pytest.mark.parametrize("cpus,workers,expect", [(32, 4, (28, 4)), (8, 4, (4, 4)), (2, 4, (1, 1)), (4, 0, (4, 0)),
                                                 # the issue-32 node: 16 CPUs, 14 workers asked, 8 granted before
                                                 (16, 14, (2, 14)), (16, 16, (2, 14)), (3, 4, (2, 1))])
def test_with_an_accelerator_the_workers_keep_their_cpus(cpus, workers, expect):
    """On a GPU node the loader may take every CPU but the training process's own
    (cores.MAIN_PROCESS_CPUS, for its loop), not half of them."""
    p = cores.plan(0, 1, None, workers, accelerator=True, affinity=set(range(cpus)), allocation=set(range(cpus)))
    assert (p.threads, p.loader_workers) == expect
    assert p.threads + p.loader_workers == max(cpus, 1 + p.loader_workers)


@pytest.mark.parametrize("local_rank,local_size,cpus,accelerator,workers,expect", [
    # an eos-like node, 8 GPUs and 112 cores, torchrun: 14 CPUs a rank, 12 workers each at most
    (7, 8, 112, True, 16, (2, "98-111", 12)),
    (7, 8, 112, True, 4, (10, "98-111", 4)),
    # the same node without GPUs: half the rank's CPUs at most, every CPU for the step
    (7, 8, 112, False, 16, (14, "98-111", 7)),
])
def test_ranks_sharing_a_gpu_node(local_rank, local_size, cpus, accelerator, workers, expect):
    p = cores.plan(local_rank, local_size, None, workers, accelerator=accelerator, affinity=set(range(cpus)),
                   allocation=set(range(cpus)))
    assert (p.threads, cores.cpu_list(p.cpus), p.loader_workers) == expect
    assert p.as_log()["loader_workers"] == expect[2]


@pytest.mark.parametrize("cpus,accelerator,ranks,expect", [
    (16, True, 1, (2, 14)),     # the lent H100 node: the readers get every core but the loop's two
    (112, True, 8, (2, 12)),    # an eos-like node, 14 CPUs a rank
    (3, True, 1, (2, 1)),
    (16, False, 1, (16, 4)),    # CPUs: CPU_AUTO_WORKERS
    (2, False, 1, (2, 1)),      # ... within half the rank's CPUs
])
def test_auto_loader_workers_take_what_the_training_process_does_not(cpus, accelerator, ranks, expect):
    """data.loader_workers: auto (the reference configs) sizes the loader to the rank's cores:
    with an accelerator every CPU but cores.MAIN_PROCESS_CPUS, on CPUs min(CPU_AUTO_WORKERS,
    half); a count still wins."""
    p = cores.plan(ranks - 1, ranks, None, "auto", accelerator=accelerator, affinity=set(range(cpus)),
                   allocation=set(range(cpus)))
    assert (p.threads, p.loader_workers) == expect
    assert cores.plan(0, 1, None, 3, accelerator=True, affinity=set(range(16)),
                      allocation=set(range(16))).loader_workers == 3


def test_loader_workers_auto_or_a_count_in_configs():
    from hpckit.common.config import load_config
    from hpckit.common.errors import KitError
    for bench in ("cosmoflow", "deepcam", "oc20"):
        assert load_config(bench, "reference")["data"]["loader_workers"] == "auto"
        assert load_config(bench, "reference", ["data.loader_workers=6"])["data"]["loader_workers"] == 6
        assert load_config(bench, "mini", ["data.loader_workers=auto"])["data"]["loader_workers"] == "auto"
        for bad in ("two", "-1", "true", "1.5", "[1]"):
            with pytest.raises(KitError, match="data.loader_workers.*auto or a count"):
                load_config(bench, "mini", [f"data.loader_workers={bad}"])


def test_threads_option_wins():
    p = cores.plan(1, 4, 3, 0, affinity=ALL, allocation=ALL)
    assert (p.threads, p.binding, len(p.cpus)) == (3, "--threads", 128)


def test_an_environment_omp_num_threads_that_is_replaced_is_said():
    """R ranks on a node each keep their share, whatever OMP_NUM_THREADS a job script or
    profile exported; the replacement is one warning line naming both values and --threads."""
    p = cores.plan(1, 4, None, 0, affinity=ALL, allocation=ALL)
    line = cores.replaced_omp_threads(p, {"OMP_NUM_THREADS": "128"})
    assert line.startswith("OMP_NUM_THREADS=128 from the environment is replaced by 32 intra-op thread(s)")
    assert "--threads 128" in line and "node share" in line
    assert cores.replaced_omp_threads(p, {"OMP_NUM_THREADS": "32"}) is None
    assert cores.replaced_omp_threads(p, {}) is None


def test_cpu_list_round_trip():
    for cpus in ({0}, {0, 1, 2, 5}, set(range(64, 128)) | {3}):
        assert cores.parse_cpu_list(cores.cpu_list(cpus)) == cpus
    assert cores.cpu_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_allocation_is_a_superset_of_the_affinity():
    assert set(os.sched_getaffinity(0)) <= cores.allocation_cpus()


# What a launched rank reports: the plan for its launcher's environment, applied.
PROBE = """
import json, os, sys
import torch
from hpckit.common import cores, dist
r = dist.detect()
p = cores.plan(r.local_rank, r.local_size, None, 0)
cores.apply(p, "pytorch")
print("PROBE " + json.dumps({"rank": r.rank, "threads": torch.get_num_threads(),
      "affinity": sorted(os.sched_getaffinity(0)), "binding": p.binding}), flush=True)
"""


def probe(cmd: list[str]) -> list[dict]:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    proc = subprocess.run([*cmd, sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the ranks share one stdout pipe: their lines can arrive glued together
    decoder = json.JSONDecoder()
    lines = [decoder.raw_decode(part)[0] for part in proc.stdout.split("PROBE ")[1:]]
    return sorted(lines, key=lambda d: d["rank"])


def need_two_cpus():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")


def test_taskset_one_cpu():
    need_two_cpus()
    (r,) = probe(["taskset", "-c", "1"])
    assert (r["threads"], r["affinity"], r["binding"]) == (1, [1], "launcher")


def test_torchrun_two_ranks_split_the_cores():
    need_two_cpus()
    ranks = probe([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--no-python",
                   "--master-port", "29631"])
    assert [r["affinity"] for r in ranks] == [[0], [1]]
    assert [r["threads"] for r in ranks] == [1, 1]


@pytest.mark.parametrize("bind,expect", [("core", "launcher"), ("none", "node share")])
def test_mpirun_two_ranks_split_the_cores(bind, expect):
    need_two_cpus()
    if not shutil.which("mpirun"):
        if os.environ.get("CI") == "true":
            pytest.fail("mpirun missing under CI")
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    ranks = probe(["mpirun", "-np", "2", "--bind-to", bind])
    assert sorted(a for r in ranks for a in r["affinity"]) == [0, 1]
    assert [r["threads"] for r in ranks] == [1, 1]
    assert {r["binding"] for r in ranks} == {expect}


ALLOC_PROBE = """
import ctypes, sys
from hpckit.common import memory
if sys.argv[1] == "tuned":
    print(memory.tune_allocator(), file=sys.stderr)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
p = libc.malloc(16 << 20)
for line in open("/proc/self/maps"):
    lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
    if lo <= p < hi:
        print(line.split()[-1] if line.split()[-1] == "[heap]" else "own mapping")
"""


@pytest.mark.parametrize("mode, where", [("tuned", "[heap]"), ("default", "own mapping")])
def test_tuned_allocator_keeps_a_16_mib_block_on_the_heap(mode, where):
    """A step's 16 MiB activation comes from the heap once the allocator is tuned (glibc
    otherwise maps and unmaps it, page-faulting it in again every step); the untuned
    process shows the probe can tell the two apart."""
    if not os.path.exists("/proc/self/maps") or "glibc" not in " ".join(os.confstr("CS_GNU_LIBC_VERSION").split()[:1]):
        pytest.skip("glibc on Linux only")
    proc = subprocess.run([sys.executable, "-c", ALLOC_PROBE, mode], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "apps")}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == where
    if mode == "tuned":
        assert proc.stderr.startswith("glibc mmap_threshold=32MiB")


@pytest.mark.parametrize("choice", ["auto", "tcmalloc", "glibc"])
def test_allocator_restart_keeps_the_command_line_and_one_line_errors(tmp_path, choice):
    """The restarted training (tcmalloc preloaded) sees the same arguments: a missing data
    directory is still one line naming it, exit 2; without tcmalloc `--allocator tcmalloc`
    is one line naming the option."""
    from hpckit.common import memory
    missing = tmp_path / "no-such-data"
    proc = subprocess.run([sys.executable, "-m", "hpckit", "train", "cosmoflow", "--data", str(missing),
                           "--output-dir", str(tmp_path / "out"), "--allocator", choice],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO / "apps")})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    if choice == "tcmalloc" and memory.find_tcmalloc() is None:
        assert "--allocator tcmalloc" in lines[0]
    else:
        assert str(missing) in lines[0]


def test_tcmalloc_of_a_spack_view_or_module_is_found(tmp_path, monkeypatch):
    """A tcmalloc on LD_LIBRARY_PATH (a Spack view, a module) is preferred to the system's."""
    import ctypes.util
    from hpckit.common import memory
    system = ctypes.util.find_library("tcmalloc_minimal")
    if system is None:
        pytest.skip("no system tcmalloc to link (apt-get install libtcmalloc-minimal4)")
    real = next(p for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
                for p in [os.path.join(d, system)] if os.path.exists(p))
    (tmp_path / "libtcmalloc_minimal.so.4").symlink_to(real)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert memory.find_tcmalloc() == str(tmp_path / "libtcmalloc_minimal.so.4")
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    assert memory.find_tcmalloc() == real     # the system's multiarch folder (memory.system_lib_dirs)


# what a busy loop measures of its own CPU wait (common/usage.py), in its own process, pinned
MEASURE = """
import json, os, sys, time
from hpckit.common import usage
os.sched_setaffinity(0, {int(sys.argv[1])})
before, t = usage.cpu_counters(), time.monotonic()
while time.monotonic() - t < 1.5:
    pass
d = usage.cpu_delta(before, usage.cpu_counters())
print(json.dumps({**d, "share": usage.wait_share(d["ran_ns"], d["waited_ns"])}))
"""


def test_cpu_wait_measures_a_core_shared_with_another_job():
    """A process of another session spinning on the same core: the loop waited for it about
    half the time, and the CPU wait says so (summary.json's usage.cpu_wait_share, the
    ReFrame variable cpu_wait). The spinner is not a descendant of the measured process."""
    cpu = min(os.sched_getaffinity(0))
    # the measurement starts once the spinner spins on the core: on a busy machine (the session's
    # background builds) an interpreter's start can take longer than the 1.5 s measured, and a
    # spinner not spinning yet made the share 0.23 in one CI-style run
    spinner = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {%d})\nprint('spinning', "
                                "flush=True)\nwhile True:\n    pass" % cpu],
                               start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline() == "spinning\n"
        proc = subprocess.run([sys.executable, "-c", MEASURE, str(cpu)], capture_output=True, text=True, timeout=120)
    finally:
        spinner.kill()
        spinner.wait()
        spinner.stdout.close()
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    # two runnable tasks of equal weight on one core: each runs about half of the time
    assert d["ran_ns"] > 0.2e9 and d["share"] > 0.3, d
