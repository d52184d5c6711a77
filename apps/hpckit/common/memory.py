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
