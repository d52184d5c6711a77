"""Which cores a rank computes on, and with how many threads: ranks that share a node share
its cores.

Without this, every rank takes its framework's default thread count (all cores of the
node) and R ranks on a node run R times oversubscribed. The rule, applied once per rank
before the framework's runtime starts (`plan`, then `apply`):

1. `--threads N` wins: N intra-op threads, on whatever CPUs the process may use.
2. The launcher bound this rank (srun --cpu-bind, mpirun --bind-to/--map-by, numactl):
   its CPU affinity is narrower than the CPUs of its cgroup (the job's allocation, or the
   machine), and the node's ranks fit side by side in the allocation
   (affinity x ranks-per-node <= allocation). The binding is honoured: the rank computes on
   exactly its affinity set.
3. Otherwise the node's ranks share one set of CPUs (torchrun, an unbound mpirun or srun):
   each rank takes its slice, `len(cpus) // ranks_per_node` CPUs starting at
   `local_rank * slice`, and pins itself to it (sched_setaffinity) so the ranks do not
   migrate onto each other's cores. One rank on the node takes them all.

Loader worker processes run on the rank's CPUs too, so they must fit in the rank's share:
at most half of the rank's CPUs (at least one) run workers; the config's
`data.loader_workers` is cut down to that, logged. Who gets the cores then depends on
where the step runs:
- on the CPU the training step's compute is the work, and a worker is busy only a small
  fraction of the time (a 16 MB CosmoFlow sample gunzips in tens of milliseconds, a CPU
  step takes seconds per sample): the intra-op threads take every CPU of the rank;
- with an accelerator the CPU's work is feeding it: the workers keep their CPUs and the
  intra-op threads take the rest.
What was decided is logged in the MLPerf log (`hpckit_config.cores`) and summary.json.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class CorePlan:
    threads: int               # intra-op threads of this rank
    cpus: tuple[int, ...]      # the CPUs this rank computes on
    binding: str               # "--threads" | "launcher" | "node share"
    loader_workers: int        # loader worker processes (config's value, or cut to fit)
    ranks_per_node: int

    def as_log(self) -> dict:
        d = asdict(self)
        d["cpus"] = cpu_list(self.cpus)
        return d


def cpu_list(cpus) -> str:
    """(0, 1, 2, 5) -> '0-2,5' (the kernel's list format)."""
    cpus = sorted(cpus)
    parts, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(f"{start}-{c}" if c != start else str(c))
            start = None
    return ",".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """'0-2,5\\n' -> {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features` in /proc/cpuinfo)."""
    words: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    words.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    return words


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "CPU part")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_key() -> str:
    """A name for this machine's performance: host name and a digest of the CPU model,
    flags and CPU count, so references calibrated on one machine are never applied to
    another (a new CPU under the same host name gets a new key)."""
    import hashlib
    import socket
    what = f"{cpu_model()}|{' '.join(sorted(cpu_flags()))}|{len(allocation_cpus())}"
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname()) or "host"
    return f"{host}-{hashlib.sha256(what.encode()).hexdigest()[:8]}"


def allocation_cpus() -> set[int]:
    """The CPUs of this process's cgroup cpuset (the job's allocation under Slurm's
    task/cgroup, a container's cpuset), or every online CPU where no cpuset says."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hier, controllers, path = line.split(":", 2)
            if hier == "0":
                candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "cpuset.cpus.effective"]
            elif "cpuset" in controllers.split(","):
                candidates = [Path("/sys/fs/cgroup/cpuset") / path.lstrip("/") / "cpuset.effective_cpus"]
            else:
                continue
            for c in candidates:
                if c.is_file():
                    cpus = parse_cpu_list(c.read_text())
                    if cpus:
                        return cpus
    except (OSError, ValueError):
        pass
    return set(range(os.cpu_count() or 1))


def plan(local_rank: int, local_size: int, requested_threads: int | None, loader_workers: int,
         accelerator: bool = False, affinity: set[int] | None = None,
         allocation: set[int] | None = None) -> CorePlan:
    """Decide this rank's CPUs, threads and loader workers (see the module docstring).
    `affinity` and `allocation` default to the process's own; tests pass them."""
    affinity = set(os.sched_getaffinity(0)) if affinity is None else set(affinity)
    allocation = allocation_cpus() if allocation is None else set(allocation)
    cpus = sorted(affinity)
    if requested_threads:
        binding = "--threads"
    elif local_size > 1 and not (len(affinity) < len(allocation | affinity)
                                 and len(affinity) * local_size <= len(allocation | affinity)):
        share = max(1, len(cpus) // local_size)
        start = (local_rank * share) % len(cpus)
        cpus = cpus[start:start + share]
        binding = "node share"
    else:
        binding = "launcher" if len(affinity) < len(allocation | affinity) else "node share"
    workers = min(loader_workers, max(1, len(cpus) // 2))
    threads = requested_threads or (max(1, len(cpus) - workers) if accelerator else len(cpus))
    return CorePlan(threads=threads, cpus=tuple(cpus), binding=binding, loader_workers=workers,
                    ranks_per_node=local_size)


def apply(p: CorePlan, framework: str) -> None:
    """Pin the process to its CPUs and set the framework's intra-op threads. For
    TensorFlow this must run before its runtime starts (before tf.distribute)."""
    if p.binding == "node share" and set(p.cpus) != set(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, p.cpus)
    os.environ["OMP_NUM_THREADS"] = str(p.threads)   # oneDNN/OpenMP pools started later
    if framework == "tensorflow":
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(p.threads)
    else:
        import torch
        torch.set_num_threads(p.threads)
