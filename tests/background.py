"""Slow preparations that only wait on one core, started when the session starts and run
at the lowest CPU priority, so that they use the CPU time the tests leave idle.

The suite keeps about 1.1 of the CI machine's 2 cores busy on average (a fresh-clone CI:
44 CPU-minutes in 40 minutes), while building the container images and the arm64 root file
system keeps one core busy for minutes (debootstrap 1.0 core, `podman build` 1.1 cores,
measured on the development VM). Built in the foreground, the tests waited for them.

A test module declares its preparations in a module-level dict

    BACKGROUND = {"fixture_name": (build, release)}

`build()` returns what the fixture needs (or raises); `release(result)` removes what it
made, or is None. conftest's collection hook starts the `build` of every fixture a selected
test uses and moves those modules to the end of the session, so that the builds have the
rest of the suite to run beside. The fixture then calls `result(name)`: it waits for the
build and returns its value or raises its exception. The build runs in a thread whose
Linux nice value is 19, which every process it starts inherits (the nice value is a
per-thread attribute on Linux, and fork copies the calling thread's): the tests, at nice
0, take the cores whenever they want them. Whatever a build made is released by its
fixture, or at the end of the session if no test used it (a session stopped early).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

NICE = 19
# a thread per build (made when a build starts): a build may wait for another's result
_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="background")
_jobs: dict[str, tuple[Future, Callable[[Any], None] | None]] = {}   # not released yet
_lock = threading.Lock()   # a build may start another (its prerequisite) from its thread


def _niced(build: Callable[[], Any]) -> Any:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    return build()


def start(name: str, build: Callable[[], Any], release: Callable[[Any], None] | None = None) -> None:
    """Start `build` in the background, once per name."""
    with _lock:
        if name in _jobs:
            return
        _jobs[name] = (_pool.submit(_niced, build), release)


def result(name: str, build: Callable[[], Any] | None = None,
           release: Callable[[Any], None] | None = None) -> Any:
    """The build's value (waiting for it), or its exception raised here. With `build`, a
    build not started yet (one that another build needs first) starts now."""
    if build is not None:
        start(name, build, release)
    elif name not in _jobs:
        raise KeyError(f"no background build {name!r}")
    return _jobs[name][0].result()


def release(name: str) -> None:
    """Remove what the build `name` made, once. A failed build is not released: it removed
    what it made itself, or left it to be looked at."""
    with _lock:
        if name not in _jobs:
            return
        future, undo = _jobs.pop(name)
    if undo is not None and future.exception() is None:
        undo(future.result())


def release_all() -> None:
    """At the end of the session: wait for every build and release what no test did."""
    for name in list(_jobs):
        release(name)
    _pool.shutdown(wait=True)
