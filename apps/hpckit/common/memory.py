"""Refuse work that cannot fit in this machine's memory before allocating it: an absurd
sample size is one line naming the option, not a MemoryError traceback or the OOM killer."""

from __future__ import annotations

import os

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


# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20    # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


def tune_allocator() -> str:
    """Keep freed tensor buffers in the process instead of giving them back to the kernel
    after every step, and say what was set (for the log).

    glibc serves a large malloc with a fresh mmap and unmaps it on free, raising that
    threshold on the fly as big blocks come and go; whether a run's activations (2-16 MiB
    at mini sizes) land above or below it is chance, and when above every step page-faults
    and zeroes them again. Measured with bench/pass_stability.py (bench/README): 16 eval
    batches of the mini CosmoFlow PyTorch model took 253-311 ms as glibc left it, 97-170 ms
    tuned; DeepCAM's mini model 156-326 ms (whole processes in the slow mode), 156-196 ms.
    Blocks above 32 MiB (glibc's limit for the threshold) are still mapped per use."""
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
