"""tests/background.py, the session's background builds: niced, their failures raised where
their result is asked for, what they made released once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import background


def _wait_done(name: str, timeout: float = 600) -> None:
    """Wait for a build without raising its priority, as the session's other tests do (under
    load a niced build may take long; result() after a timeout would raise it and the test
    would read a priority it did not set: that would be this helper's failure, said so)."""
    deadline = time.monotonic() + timeout
    while not background.done(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert background.done(name), f"background build {name} not done after {timeout} s"


def test_a_build_runs_niced_and_so_do_its_processes():
    """A build nothing waits for runs at NICE, and so does what it starts. Observed before any
    test waits for it (a test that waits raises it: the next test), so that what the build
    reads cannot depend on which thread runs first."""
    def build():
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout.strip()
        return own, int(child)

    background.start("test-niced", build)
    _wait_done("test-niced")
    assert background.result("test-niced") == (background.NICE, background.NICE)
    background.release("test-niced")
    # the tests themselves keep their priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice needs root (CAP_SYS_NICE)")
def test_waiting_for_a_build_raises_its_priority():
    """The build's command starts only once a test waits for it (it polls nice_now, which
    turns 0 then), so it reads 0 whatever the threads' order."""
    def build():
        deadline = time.monotonic() + 120
        while background.nice_now() != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        return int(background.run(["nice"], 60).stdout)

    background.start("test-raised", build)
    try:
        assert background.result("test-raised") == 0
    finally:
        background.release("test-raised")


def test_a_failed_build_raises_where_its_result_is_asked_and_is_not_released():
    released = []

    def build():
        raise AssertionError("debootstrap failed (1)")

    background.start("test-fails", build, released.append)
    with pytest.raises(AssertionError, match=r"debootstrap failed \(1\)"):
        background.result("test-fails")
    background.release("test-fails")
    assert released == []


def test_release_once_and_a_prerequisite_started_by_a_build():
    released = []
    background.start("test-second", lambda: background.result("test-first", lambda: 1) + 1,
                     released.append)
    assert background.result("test-second") == 2
    background.release("test-second")
    background.release("test-second")
    assert released == [2]
    with pytest.raises(KeyError, match="no background build 'test-unknown'"):
        background.result("test-unknown")


# ---- background.run: a hang guard that a starved command does not trip ---------------------

WORK = ("import time\n"
        "while time.process_time() < {cpu}:\n"
        "    pass\n"
        "print('done')\n")


def test_a_starved_command_is_not_taken_for_a_hung_one():
    """The command needs 0.3 s of CPU at nice 10 on a core where a nice-0 process spins
    (it gets about a tenth of that core): it takes several seconds of wall time, past a
    1.5 s guard. subprocess.run's wall-clock guard kills it (so the setup does starve it);
    background.run's, which counts only the time it was not waiting for a CPU, lets it end."""
    core = str(min(os.sched_getaffinity(0)))
    spin = subprocess.Popen(["taskset", "-c", core, sys.executable, "-c", "while True:\n    pass\n"])
    try:
        cmd = ["nice", "-n", "10", "taskset", "-c", core, sys.executable, "-c", WORK.format(cpu=0.3)]
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(cmd, capture_output=True, timeout=1.5)
        t0 = time.monotonic()
        proc = background.run(cmd, 1.5, poll_s=0.2)
        assert proc.returncode == 0 and proc.stdout == "done\n", proc
        assert time.monotonic() - t0 > 1.5            # it did run past the guard in wall time
    finally:
        spin.kill()
        spin.wait()


def _alive(pid: int) -> bool:
    return background.stat_fields(f"/proc/{pid}/stat")[:1] not in ([], ["Z"])


def test_a_hung_command_is_killed_with_its_children(tmp_path):
    """A command that waits (a stalled download, a deadlock) uses no CPU and waits for none:
    every second counts, and past the guard its whole process group is killed."""
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        background.run(["sh", "-c", "echo started; sleep 300 & echo $! > pid; wait"], 2, poll_s=0.2,
                       cwd=tmp_path)
    assert 2 <= time.monotonic() - t0 < 30
    assert err.value.output == "started\n" and "not waiting for a CPU" in err.value.stderr
    child = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the command's child outlived the guard"


def test_run_returns_what_subprocess_run_returns():
    proc = background.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                                                 "sys.exit(3)"], 60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")


AUTOGROUPS = os.path.exists("/proc/self/autogroup") and \
    Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"


@pytest.mark.skipif(not AUTOGROUPS, reason="no autogroups on this kernel: nice ranks every process against every other")
def test_a_new_session_in_a_builds_command_gets_the_builds_nice():
    """ReFrame's jobs start a session of their own, hence an autogroup of their own at nice 0,
    which nice 19 inside it would not rank below the tests. run() gives it the build's nice;
    the session's own autogroup (the tests') keeps its own."""
    # Empty where the session is in the root autogroup (no ancestor started a session: CI's
    # runner), which has no name and no nice of its own.
    own = Path("/proc/self/autogroup").read_text()
    code = ("import time\n"
            "for _ in range(200):\n"
            "    nice = int(open('/proc/self/autogroup').read().split()[2])\n"
            "    if nice: break\n"
            "    time.sleep(0.05)\n"
            "print(open('/proc/self/autogroup').read().strip())\n")
    background.start("test-session", lambda: background.run(["setsid", "-w", sys.executable, "-c", code], 60,
                                                            poll_s=0.2))
    _wait_done("test-session")
    proc = background.result("test-session")
    background.release("test-session")
    assert proc.returncode == 0, proc.stderr
    name, _, nice = proc.stdout.split()
    assert int(nice) == background.NICE and name not in own.split()[:1], (proc.stdout, own)
    assert Path("/proc/self/autogroup").read_text() == own


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice needs root (CAP_SYS_NICE)")
def test_a_build_a_test_waits_for_gets_nice_0_and_so_does_its_prerequisite():
    """A niced build's command, and the build it waits for in turn, run at nice 19 until a test
    waits for the first: then both at 0, as the test itself would have run them."""
    code = ("import os, sys, time\n"
            "seen = [os.getpriority(os.PRIO_PROCESS, 0)]\n"
            "open(sys.argv[1], 'w').close()\n"
            "for _ in range(400):\n"
            "    if os.getpriority(os.PRIO_PROCESS, 0) != seen[-1]: seen.append(os.getpriority(os.PRIO_PROCESS, 0))\n"
            "    if seen[-1] == 0: break\n"
            "    time.sleep(0.05)\n"
            "print(*seen)\n")
    started = [Path(f"/tmp/hpckit-test-wanted-{os.getpid()}-{i}") for i in range(2)]

    def prerequisite():
        return background.run([sys.executable, "-c", code, started[0]], 60, poll_s=0.2)

    def build():
        first = background.result("test-prerequisite", prerequisite)
        return first, background.run([sys.executable, "-c", code, started[1]], 60, poll_s=0.2)

    try:
        background.start("test-wanted", build)
        deadline = time.monotonic() + 300   # niced under a competing load, python starts slowly
        while not started[0].exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started[0].exists(), "the prerequisite's command did not start in 300 s"
        time.sleep(0.5)   # the prerequisite's command has seen nice 19 for a while
        first, second = background.result("test-wanted")
    finally:
        background.release("test-wanted")
        background.release("test-prerequisite")
        for path in started:
            path.unlink(missing_ok=True)
    assert (first.returncode, first.stdout.split()) == (0, [str(background.NICE), "0"]), first
    assert (second.returncode, second.stdout.split()) == (0, ["0"]), second


def test_two_trainings_at_a_time_but_a_build_a_test_waits_for_does_not_queue():
    """background.training()'s Slots, a set of its own (the session's builds hold the shared one)."""
    release = threading.Event()
    inside = []
    slots = background.Slots(background.TRAINING_SLOTS)

    def holder(i):
        def build():
            with slots.hold():
                inside.append(i)
                release.wait(30)
        return build

    for i in range(background.TRAINING_SLOTS + 1):
        background.start(f"test-slot-{i}", holder(i))
    try:
        deadline = time.monotonic() + 10
        while len(inside) < background.TRAINING_SLOTS and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        assert len(inside) == background.TRAINING_SLOTS, inside   # the last one queues
        last = next(i for i in range(background.TRAINING_SLOTS + 1) if i not in inside)
        waiter = threading.Thread(target=background.result, args=(f"test-slot-{last}",))
        waiter.start()   # a test waits for it: it goes ahead while the others still hold their slots
        deadline = time.monotonic() + 10
        while last not in inside and time.monotonic() < deadline:
            time.sleep(0.05)
        assert last in inside
    finally:
        release.set()
        for i in range(background.TRAINING_SLOTS + 1):
            background.result(f"test-slot-{i}")
            background.release(f"test-slot-{i}")
    waiter.join(10)
