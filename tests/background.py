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

A command a build runs has a hang guard, but not in wall-clock seconds: at nice 19 a build
gets about 1.5 % of a core while the tests keep both cores busy, so a guard of 900 s of
wall time fails a healthy debootstrap whenever the machine is busy long enough (it did,
under `make stress`). `run()` counts only the seconds in which the command's processes were
not waiting for a CPU (from each task's state and CPU time in /proc/<pid>/task/<tid>): a
command that is hung (waiting on the network, deadlocked) is caught after `guard_s`; one
that is only starved of CPU is not. `run_hpckit`, `run_reframe` and the container tests'
`_run` use it when called from a build's thread.

Nice ranks a process only against the others of its autogroup (kernel.sched_autogroup_enabled,
on by default), and a process that starts a new session starts a new autogroup at nice 0:
ReFrame's local scheduler does (its jobs run with start_new_session), so a ReFrame run in a
build would take half the CPU from the tests, its job's autogroup against the session's.
`run()` gives every new autogroup among the command's processes the build's nice, within a
poll interval of its start (/proc/<pid>/autogroup; a process may raise its own autogroup's
nice). A session none of whose ancestors started a session (CI's runner, under PID 1) is in the
root autogroup, whose /proc file is empty: it has no nice to set, and none is. Containers are
the exception nice cannot reach (a cgroup of their own): their builds run containers only
briefly, and their trainings run in the foreground.

A build is niced while nothing waits for it. Once a test waits for it (`result()`), the test's
core would idle, and the build and whatever build it waits for in turn get nice 0 at the next
poll: what the test would have got running the command itself, which matters under a competing
load (`make stress`), where nice 19 would get almost nothing and trip wall-clock limits inside
the command (ReFrame's time limit). Lowering a nice needs root; elsewhere it stays 19.

Trainings in builds take a slot of `training()` (TRAINING_SLOTS at once): together they
have only the cores the tests leave idle, and ten at once would hold ten models in memory
to go no faster than two.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

NICE = 19
TRAINING_SLOTS = 2
# a thread per build (made when a build starts): a build may wait for another's result
_pool = ThreadPoolExecutor(max_workers=24, thread_name_prefix="background")
_jobs: dict[str, tuple[Future, Callable[[Any], None] | None]] = {}   # not released yet
_lock = threading.Lock()   # a build may start another (its prerequisite) from its thread


_current = threading.local()   # .name: the build this thread runs
_wanted: set[str] = set()       # builds a test waits for, and what they wait for in turn
_waits_on: dict[str, str] = {}  # build -> the build it waits for now


def _niced(name: str, build: Callable[[], Any]) -> Any:
    _current.name = name
    _renice([threading.get_native_id()], nice_now())
    return build()


def nice_now() -> int:
    """The nice a build's commands should have: NICE, or 0 once a test waits for the build.
    A test that waits leaves its core idle; the build then gets what the test would have got
    as a foreground command, against a competing load too (`make stress`), where at nice 19
    it would get almost nothing. Lowering a nice needs root (CAP_SYS_NICE); elsewhere it stays."""
    return 0 if getattr(_current, "name", None) in _wanted else NICE


def _want(name: str) -> None:
    with _lock:
        while name is not None and name not in _wanted:
            _wanted.add(name)
            name = _waits_on.get(name)


def start(name: str, build: Callable[[], Any], release: Callable[[Any], None] | None = None) -> None:
    """Start `build` in the background, once per name."""
    with _lock:
        if name in _jobs:
            return
        _jobs[name] = (_pool.submit(_niced, name, build), release)


def result(name: str, build: Callable[[], Any] | None = None,
           release: Callable[[Any], None] | None = None) -> Any:
    """The build's value (waiting for it), or its exception raised here. With `build`, a
    build not started yet (one that another build needs first) starts now. A test that
    waits, or a build a test waits for, raises the build's priority (nice_now)."""
    if build is not None:
        start(name, build, release)
    elif name not in _jobs:
        raise KeyError(f"no background build {name!r}")
    future = _jobs[name][0]
    if not future.done():
        waiter = getattr(_current, "name", None)
        if waiter is None or waiter in _wanted:
            _want(name)
        else:
            with _lock:
                _waits_on[waiter] = name
                if waiter in _wanted:   # wanted meanwhile
                    _wanted.add(name)
    try:
        return future.result()
    finally:
        _waits_on.pop(getattr(_current, "name", None), None)


def done(name: str) -> bool:
    """Whether the build has ended (without waiting for it, so without raising its priority)."""
    return _jobs[name][0].done()


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


class Slots:
    """At most `n` holders at once, except a build a test waits for: it does not queue."""

    def __init__(self, n: int):
        self._sem = threading.BoundedSemaphore(n)

    @contextlib.contextmanager
    def hold(self):
        held = False
        while not held and nice_now() != 0:
            held = self._sem.acquire(timeout=0.5)
        try:
            yield
        finally:
            if held:
                self._sem.release()


_training = Slots(TRAINING_SLOTS)


def training():
    """`with background.training(): ...` around a build's training (see the module doc). A
    build a test waits for does not queue: it goes ahead without a slot."""
    return _training.hold()


def in_build() -> bool:
    """True in a build's thread (its commands go through `run`)."""
    return threading.current_thread().name.startswith("background")


def guarded(cmd, timeout: float, **kw) -> subprocess.CompletedProcess:
    """A test helper's command with the hang guard that fits where it runs: `run` in a
    build's thread (niced, it may be starved), else subprocess.run's wall-clock timeout."""
    if in_build():
        return run(cmd, timeout, **kw)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc/<pid>/stat (or task stat) after the command name: [state, ppid,
    ...]; [] when the process is gone."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rindex(b")") + 2:].decode().split()


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc/*/stat's parent pids."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = stat_fields(f"/proc/{entry.name}/stat")
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def _autogroup(pid: int | str) -> tuple[str, int] | None:
    """(the autogroup's name, its nice) of a process, None where unreadable or absent."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def set_autogroups(pids: list[int], nice: int = NICE) -> None:
    """Give every autogroup of `pids` other than this process's own the nice `nice`. Our own is
    left alone: it holds the tests."""
    own = _autogroup("self")
    for pid in pids:
        group = _autogroup(pid)
        if group is None or group[1] == nice or (own is not None and group[0] == own[0]):
            continue
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:   # gone, not ours, or a lower nice without CAP_SYS_NICE
            pass


def _renice(tids, nice: int) -> None:
    """setpriority per thread (nice is a thread's attribute on Linux)."""
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:   # gone, or a lower nice without CAP_SYS_NICE
            pass


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _sample(pids: list[int]) -> dict[tuple[int, int], tuple[bool, int]]:
    """(pid, tid) -> (runnable: in state R, nanoseconds on a CPU so far)."""
    tasks = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            fields = stat_fields(f"/proc/{pid}/task/{tid}/stat")
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    cpu_ns = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if fields:
                tasks[(pid, int(tid))] = (fields[0] == "R", cpu_ns)
    return tasks


def counted_step(tree: list[int], cpu_seen: dict, step: float, schedstat: bool = True) -> float:
    """Of a poll interval of `step` seconds, what a hang guard counts for the processes `tree`:
    all of it when none of their tasks is runnable (they wait on the network, the disk, a
    lock: a hang looks like this), else only the CPU time their tasks got in it (a starved
    command gets little; a spinning one counts its full time). `cpu_seen` carries each task's
    CPU time from one interval to the next. Without schedstat every second counts."""
    if not schedstat:
        return step
    tasks = _sample(tree)
    cpu = sum(ns - cpu_seen.get(task, 0) for task, (_, ns) in tasks.items()) / 1e9
    cpu_seen.update({task: ns for task, (_, ns) in tasks.items()})
    return min(step, cpu) if any(runnable for runnable, _ in tasks.values()) else step


def run(cmd, guard_s: float, poll_s: float = 1.0, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, **kw), whose hang guard does not
    count the time the command waited for a CPU (counted_step, each poll interval). Past
    `guard_s` such seconds its
    process group is killed and subprocess.TimeoutExpired raised, saying how long it ran.
    (The run-queue delay in schedstat would not do: the kernel adds it only when a waiting
    task gets the CPU, seconds late.) Without schedstat (a kernel without CONFIG_SCHED_INFO)
    every second counts. In a build, each poll also gives the command's processes and their
    autogroups the build's nice (nice_now); outside one, run() changes no priority."""
    cmd = [str(c) for c in cmd]
    schedstat = os.path.exists("/proc/self/schedstat")
    building = in_build()   # outside a build, run() changes no priority
    if building:   # the command starts at the build's nice as it is now
        _renice([threading.get_native_id()], nice_now())
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # its own process group (to kill it whole), not its own session: with autogroup
        # scheduling a new session is a new group that nice no longer ranks below the tests
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, process_group=0, **kw)
        start = last = time.monotonic()
        counted = 0.0
        applied = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if building else None
        cpu_seen: dict[tuple[int, int], int] = {}
        while True:
            try:
                proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            step = now - last
            tree = _tree(proc.pid)
            if building:
                nice = nice_now()
                if nice != applied:   # a test now waits for this build
                    _renice([threading.get_native_id(),
                             *(int(t) for pid in tree for t in _listdir(f"/proc/{pid}/task"))], nice)
                    applied = nice
                set_autogroups(tree, nice)
            counted += counted_step(tree, cpu_seen, step, schedstat)
            last = now
            if counted > guard_s:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                out.seek(0)
                err.seek(0)
                raise subprocess.TimeoutExpired(
                    cmd, guard_s, output=out.read().decode(errors="replace"),
                    stderr=(err.read().decode(errors="replace") +
                            f"\nbackground.run: killed after {counted:.0f} s not waiting for a CPU "
                            f"({now - start:.0f} s of wall time)"))
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))
