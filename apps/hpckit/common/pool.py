"""Worker processes that never outlive the command that started them (`hpckit datagen`).

A SIGTERM (scancel, a timeout, a user's kill) to the command becomes `Terminated`: the pool
is shut down with its pending work cancelled and the command exits 143 with one line.
Each worker also asks the kernel for SIGTERM when its parent dies (prctl
PR_SET_PDEATHSIG), so not even a SIGKILL of the command leaves workers running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from hpckit.common.errors import Terminated

PR_SET_PDEATHSIG = 1


def die_with_parent(kill: bool = False, parent: int | None = None) -> None:
    """In a child process: the kernel sends it SIGTERM (SIGKILL with `kill`) when its parent
    dies, however the parent died. Also a subprocess's preexec_fn (the official checkers),
    with `parent` the parent's pid taken before the fork: a parent that died before the
    prctl took effect is caught by the getppid check."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL if kill else signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def worker_pool(workers: int):
    """A ProcessPoolExecutor of `workers` processes (None for one: work in-process)."""
    def on_sigterm(signum, frame):
        signal.signal(signum, signal.SIG_DFL)   # a second SIGTERM kills at once
        raise Terminated("terminated by SIGTERM: the work in progress was stopped, its workers with it")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent) if workers > 1 else None
    try:
        yield pool
    except BaseException:
        if pool:
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        raise
    else:
        if pool:
            pool.shutdown()
    finally:
        signal.signal(signal.SIGTERM, previous)
