"""Refuse work that cannot fit in this machine's memory before allocating it: an absurd
sample size is one line naming the option, not a MemoryError traceback or the OOM killer."""

from __future__ import annotations

import os
import sys

from hpckit.common.errors import KitError


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux), else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require(nbytes: float, what: str) -> None:
    """KitError naming `what` when `nbytes` exceeds the memory available now."""
    have = available_bytes()
    if nbytes > have:
        raise KitError(f"{what}: needs about {nbytes / 2 ** 30:,.1f} GiB of memory, this machine has "
                       f"{have / 2 ** 30:,.1f} GiB available")


# ---------------------------------------------------------------- the training's allocator
#
# A training step allocates and frees its activations every step: 2-16 MiB at mini sizes,
# hundreds of MiB at the reference sizes (a 128^3 x 16 x 4-sample CosmoFlow activation is
# 512 MiB). glibc serves every block over its mmap threshold (32 MiB at most) with a
# fresh mmap and unmaps it on free, so each step page-faults and zeroes those blocks
# again: on the 2-core development VM the full-size steps spent about as long in the
# kernel as in the convolutions. tcmalloc keeps freed memory for reuse. Measured with
# bench/side_by_side.py --reference-tcmalloc (bench/README "side_by_side.py", last run:
# 2-core AMD EPYC, avx512f avx512_bf16, two warm-up steps, median step), seconds per step,
# fp32: DeepCAM 768x1152 batch 1, the reference's own code 13.7 -> 6.5 (the kit 6.6 with
# tcmalloc); CosmoFlow 128^3 batch 4, the kit's PyTorch 5.7 -> 1.96; TensorFlow, which has
# its own allocator, 1.96 -> 1.93.

PRELOADED = "HPCKIT_PRELOADED_ALLOCATOR"   # set in the restarted process: never restart twice
TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")


def system_lib_dirs(machine: str | None = None) -> list:
    """The system's library folders for this machine: Debian's multiarch folder
    (/usr/lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu), then /usr/lib64, /usr/lib."""
    import platform
    import sysconfig
    from pathlib import Path
    machine = machine or platform.machine()
    multiarch = (sysconfig.get_config_var("MULTIARCH") if machine == platform.machine() else None) \
        or f"{machine}-linux-gnu"
    return [Path("/usr/lib") / multiarch, Path("/lib") / multiarch, Path("/usr/lib64"), Path("/usr/lib")]


def find_tcmalloc() -> str | None:
    """An installed tcmalloc (gperftools): a library of this Python's prefix or of
    LD_LIBRARY_PATH (a Spack view or module), else the system's (Debian
    libtcmalloc-minimal4: /usr/lib/<multiarch>/, on aarch64 /usr/lib/aarch64-linux-gnu/),
    else whatever the dynamic linker's cache names (ctypes.util)."""
    import ctypes.util
    from pathlib import Path
    dirs = [Path(sys.prefix) / "lib", *(Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d),
            *system_lib_dirs()]
    for name in TCMALLOC_NAMES:
        for d in dirs:
            found = sorted(d.glob(f"lib{name}.so*")) if d.is_dir() else []
            if found:
                return str(found[0])
        lib = ctypes.util.find_library(name)
        if lib:
            return lib
    return None


def reexec_with_tcmalloc(argv: list[str], choice: str) -> None:
    """Restart this `hpckit` command with tcmalloc preloaded (`--allocator auto` when one is
    installed, or `tcmalloc`); returns when there is nothing to do. The allocator must be
    in place before the first malloc, so this runs before any other work of the command."""
    if choice == "glibc" or PRELOADED in os.environ or not sys.executable:
        return
    lib = find_tcmalloc()
    if lib is None:
        if choice == "tcmalloc":
            raise KitError("--allocator tcmalloc: no tcmalloc library found (Debian: libtcmalloc-minimal4, "
                           "Spack: gperftools)")
        return
    env = preload_env(lib, os.environ)
    # the same interpreter and import path as this process, and a command line that still
    # reads `python -m hpckit ...`: run as `python -m hpckit` (sys.path[0] is the working
    # directory) it restarts the same way; run as the console script (sys.path[0] is its
    # bin directory, nothing to import there) with -P, so the working directory (a stage
    # or data directory) is not put on the import path
    from_cwd = os.path.realpath(sys.path[0] or ".") == os.path.realpath(os.getcwd())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *([] if from_cwd else ["-P"]), "-m", "hpckit", *argv], env)


def preload_env(lib: str, env) -> dict:
    """A copy of `env` for a process that starts with the tcmalloc library `lib` preloaded
    (the restarted training here; the benches' cases as `hpckit train` runs them)."""
    out = dict(env)
    out["LD_PRELOAD"] = " ".join(v for v in (lib, out.get("LD_PRELOAD", "")) if v)
    out[PRELOADED] = lib
    out.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 62))   # no stderr line per big block
    return out


def tcmalloc_loaded() -> bool:
    """tcmalloc is mapped into this process (preloaded)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libtcmalloc" in line for line in f)
    except OSError:
        return False


# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20    # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


def tune_allocator() -> str:
    """Say which allocator this training runs with (for the log); with glibc's, keep freed
    blocks of up to 32 MiB in the process instead of giving them back after every step.

    glibc serves a large malloc with a fresh mmap and unmaps it on free, raising that
    threshold on the fly as big blocks come and go; whether a run's activations (2-16 MiB
    at mini sizes) land above or below it is chance, and when above every step page-faults
    and zeroes them again. Measured with bench/pass_stability.py (bench/README): 16 eval
    batches of the mini CosmoFlow PyTorch model took 253-311 ms as glibc left it, 97-170 ms
    tuned; DeepCAM's mini model 156-326 ms (whole processes in the slow mode), 156-196 ms.
    Blocks above 32 MiB (glibc's limit for the threshold) are still mapped per use."""
    if tcmalloc_loaded():
        return f"tcmalloc ({os.environ.get(PRELOADED) or 'preloaded'})"
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "unchanged (no glibc mallopt)"
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "unchanged (mallopt refused)"
    return f"glibc mmap_threshold={MMAP_THRESHOLD >> 20}MiB trim_threshold={TRIM_THRESHOLD >> 20}MiB"
