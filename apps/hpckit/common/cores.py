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

Loader worker processes run on the rank's CPUs too, so they must fit in the rank's share.
How many may run, and who gets the cores, depends on where the step runs:
- on the CPU the training step's compute is the work, and a worker is busy only a small
  fraction of the time (a 16 MB CosmoFlow sample gunzips in tens of milliseconds, a CPU
  step takes seconds per sample): at most half of the rank's CPUs (at least one) run
  workers, and the intra-op threads take every CPU of the rank;
- with an accelerator the CPU's work is feeding it: the workers (the loader's reader
  threads, common/feed.py) may take every CPU but the MAIN_PROCESS_CPUS the training loop
  keeps (bench/feed_rate.py measures the path's CPU per sample), and the intra-op threads
  take the CPUs the workers leave.
The config's `data.loader_workers` is cut down to that cap, logged. `auto` (the reference
configs' value) is the cap itself with an accelerator: the readers get every core the
training process does not keep (on an H100 node bench/feed_diag.py measured the DeepCAM
loader alone at 44 samples/s with 1 reader and 354 with 14: the GPU's step takes 82); on the
CPU it is min(CPU_AUTO_WORKERS, cap).
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


# ---------------------------------------------------------------- what the CPU is
#
# Every decision that depends on the CPU (`--framework auto`, bf16 acceptance, the machine
# key, oneDNN's expected ISA) reads it through `cpuinfo()`, from one file: /proc/cpuinfo, or
# the file HPCKIT_CPUINFO names (the tests point it at recorded dumps of real nodes in
# tests/data/cpuinfo/). x86 lists `flags`, aarch64 `Features` (the kernel's hwcap names:
# asimd, sve, bf16, ...). Under user-mode emulation (qemu-aarch64 on an x86 host) the
# kernel shows the HOST's /proc/cpuinfo to the emulated process; there the CPU the process
# runs on is described by its auxiliary vector (AT_HWCAP/AT_HWCAP2, which QEMU fills for
# the emulated CPU), and that is what is read.

CPUINFO_ENV = "HPCKIT_CPUINFO"

# arch/arm64/include/uapi/asm/hwcap.h: bit -> the name /proc/cpuinfo prints
_HWCAP = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt "
          "fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
          "sb paca pacg").split()
_HWCAP2 = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm "
           "svef64mm svebf16 i8mm bf16 dgh rng bti").split()
AT_HWCAP, AT_HWCAP2 = 16, 26
# (CPU implementer, CPU part) -> name, for the parts the kit's targets name
_ARM_PARTS = {(0x46, 0x001): "Fujitsu A64FX", (0x41, 0xd0c): "Arm Neoverse N1",
              (0x41, 0xd40): "Arm Neoverse V1", (0x41, 0xd49): "Arm Neoverse N2",
              (0x41, 0xd4f): "Arm Neoverse V2"}


@dataclass(frozen=True)
class CpuInfo:
    arch: str                  # "x86_64" | "aarch64" | "unknown"
    model: str                 # x86 `model name`; aarch64 the part's name or implementer/part
    flags: frozenset           # x86 `flags`, aarch64 `Features`
    source: str                # the file read, or the auxiliary vector


def parse_cpuinfo(text: str, source: str = "text") -> CpuInfo:
    """The first processor block of a /proc/cpuinfo text (lines starting with '#' are
    comments: the recorded dumps carry their provenance)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields.get("flags") or fields.get("Features"):
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if "Features" in fields or "CPU implementer" in fields:
        arch = "aarch64"
        flags = frozenset(fields.get("Features", "").split())
        try:
            impl, part = int(fields["CPU implementer"], 16), int(fields["CPU part"], 16)
            model = _ARM_PARTS.get((impl, part), f"Arm implementer {impl:#x} part {part:#05x}")
        except (KeyError, ValueError):
            model = "unknown"
    elif "flags" in fields or "vendor_id" in fields:
        arch = "x86_64"
        flags = frozenset(fields.get("flags", "").split())
        model = fields.get("model name", "unknown")
    else:
        arch, flags, model = "unknown", frozenset(), "unknown"
    return CpuInfo(arch=arch, model=model, flags=flags, source=source)


def _auxv_cpuinfo() -> CpuInfo | None:
    """aarch64: the features of the CPU this process runs on, from getauxval (what the
    kernel, or QEMU for an emulated CPU, tells the process)."""
    try:
        import ctypes
        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype = ctypes.c_ulong
        getauxval.argtypes = [ctypes.c_ulong]
        hw, hw2 = getauxval(AT_HWCAP), getauxval(AT_HWCAP2)
    except (OSError, AttributeError):
        return None
    flags = {n for i, n in enumerate(_HWCAP) if hw >> i & 1} | {n for i, n in enumerate(_HWCAP2) if hw2 >> i & 1}
    return CpuInfo(arch="aarch64", model="unknown (emulated or no /proc/cpuinfo)", flags=frozenset(flags),
                   source="auxv AT_HWCAP/AT_HWCAP2")


def cpuinfo(path: str | os.PathLike | None = None) -> CpuInfo:
    """What the CPU is: from `path`, else $HPCKIT_CPUINFO, else /proc/cpuinfo. Reading the
    real /proc/cpuinfo on an aarch64 process that finds another architecture's text there
    (user-mode emulation) or none, the auxiliary vector describes the CPU instead."""
    import platform
    path = path or os.environ.get(CPUINFO_ENV) or None
    real = path is None
    path = Path(path or "/proc/cpuinfo")
    try:
        info = parse_cpuinfo(path.read_text(errors="replace"), str(path))
    except OSError:
        info = CpuInfo(arch="unknown", model="unknown", flags=frozenset(), source=f"{path} (unreadable)")
    if real and platform.machine() in ("aarch64", "arm64") and info.arch != "aarch64":
        info = _auxv_cpuinfo() or info
    return info


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`), as `cpuinfo()` reads them."""
    return set(cpuinfo().flags)


def cpu_model() -> str:
    return cpuinfo().model


# AVX-512 as the x86 servers from Skylake-SP on have it (oneDNN's avx512_core): F, CD, BW,
# DQ, VL. Knights Landing has F and CD with ER and PF, not BW/DQ/VL: `avx512f` alone does not
# make a modern AVX-512 server.
AVX512_CORE = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def cpu_class(info: CpuInfo | None = None) -> str:
    """The kind of CPU the kit's decisions tell apart:
    x86-avx512-bf16 (AVX-512 server with avx512_bf16 or AMX-BF16), x86-avx512 (AVX-512
    server), x86-knl (Xeon Phi: avx512f with er/pf, no BW/VL/DQ), x86-avx2, x86,
    aarch64-sve, aarch64, unknown."""
    info = info or cpuinfo()
    f = info.flags
    if info.arch == "x86_64":
        if AVX512_CORE <= f:
            return "x86-avx512-bf16" if f & {"avx512_bf16", "amx_bf16"} else "x86-avx512"
        if "avx512f" in f and f & {"avx512er", "avx512pf"}:
            return "x86-knl"
        return "x86-avx2" if "avx2" in f else "x86"
    if info.arch == "aarch64":
        return "aarch64-sve" if "sve" in f else "aarch64"
    return "unknown"


def has_bf16(info: CpuInfo | None = None) -> bool:
    """The CPU computes bfloat16 natively: x86 avx512_bf16 or amx_bf16, Arm bf16 (FEAT_BF16;
    A64FX has none, Neoverse V1 and later do)."""
    info = info or cpuinfo()
    if info.arch == "aarch64":
        return "bf16" in info.flags
    return bool(info.flags & {"avx512_bf16", "amx_bf16"})


def onednn_isa(info: CpuInfo | None = None) -> str:
    """The instruction set oneDNN 3.x (PyTorch's and TensorFlow's CPU convolutions on x86)
    dispatches to, named as its ONEDNN_MAX_CPU_ISA values. oneDNN 3.0 dropped the Xeon Phi
    ISAs (avx512_mic, avx512_mic_4ops): on KNL it runs its AVX2 kernels, which is why KNL is
    planned as an AVX2 machine. On aarch64 oneDNN runs through Arm Compute Library (SVE or
    NEON kernels): 'sve' or 'asimd'."""
    info = info or cpuinfo()
    f = info.flags
    if info.arch == "aarch64":
        return "sve" if "sve" in f else ("asimd" if "asimd" in f else "none")
    if info.arch != "x86_64":
        return "none"
    if AVX512_CORE <= f:
        if "amx_bf16" in f and "amx_tile" in f:
            return "avx512_core_amx"
        if "avx512_bf16" in f:
            return "avx512_core_bf16"
        return "avx512_core_vnni" if "avx512_vnni" in f else "avx512_core"
    if "avx2" in f:
        return "avx2_vnni" if "avx_vnni" in f else "avx2"
    return "avx" if "avx" in f else "sse41"


def machine_key() -> str:
    """A name for this machine's performance: host name and a digest of the CPU model,
    flags and CPU count, so references calibrated on one machine are never applied to
    another (a new CPU under the same host name gets a new key)."""
    import hashlib
    import socket
    info = cpuinfo()
    what = f"{info.model}|{' '.join(sorted(info.flags))}|{len(allocation_cpus())}"
    if info.arch not in ("x86_64", "unknown"):   # x86 keys stay as they were (calibrations on disk)
        what = f"{info.arch}|{what}"
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


# With an accelerator, the CPUs the training loop keeps beside the loader: one for the thread
# that launches the step's kernels (Python, busy while the GPU computes unless the step is a
# CUDA graph), one for what shares its interpreter with it: the reader threads' Python glue
# under the GIL, the CUDA runtime's threads, evaluation and logging. With DataLoader worker
# processes instead (feed="processes") the second one is its pin-memory thread, which
# bench/feed_rate.py measured at 7 ms per 16 MB CosmoFlow sample (bench/README.md "feed_rate.py").
MAIN_PROCESS_CPUS = 2

# data.loader_workers `auto` on the CPU: the shipped reference configs' count before `auto`
# (DeepCAM's and CosmoFlow's); a CPU step takes seconds per sample, a worker milliseconds
# (bench/README.md "loader_rates.py"), so more workers only hold more memory
CPU_AUTO_WORKERS = 4


def plan(local_rank: int, local_size: int, requested_threads: int | None, loader_workers: int | str,
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
    cap = max(1, len(cpus) - MAIN_PROCESS_CPUS) if accelerator else max(1, len(cpus) // 2)
    if loader_workers == "auto":
        loader_workers = cap if accelerator else min(CPU_AUTO_WORKERS, cap)
    workers = min(loader_workers, cap)
    threads = requested_threads or (max(1, len(cpus) - workers) if accelerator else len(cpus))
    return CorePlan(threads=threads, cpus=tuple(cpus), binding=binding, loader_workers=workers,
                    ranks_per_node=local_size)


def replaced_omp_threads(p: CorePlan, environ=os.environ) -> str | None:
    """The line that says an OMP_NUM_THREADS of the environment is not what this rank uses
    (the plan above sets it; a job script's or a profile's value would otherwise be replaced
    silently), or None where they agree or none was set. The plan is kept rather than the
    variable: launchers set it for their own reasons (torchrun sets 1 for every rank when
    it starts several; a profile sets one value for all its partitions), and R ranks each
    taking a node-wide value oversubscribe the node R times. `--threads N` imposes N."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if not given or given == str(p.threads):
        return None
    return (f"OMP_NUM_THREADS={given} from the environment is replaced by {p.threads} intra-op thread(s) on CPUs "
            f"{cpu_list(p.cpus)} ({p.binding}, {p.ranks_per_node} rank(s) on this node); "
            f"--threads {given} imposes it")


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
