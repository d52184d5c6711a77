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


def test_a_build_runs_niced_and_so_do_its_processes():
    def build():
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout.strip()
        return own, int(child)

    assert background.result("test-niced", build) == (background.NICE, background.NICE)
    # the tests themselves keep their priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0


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


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup") or
                    Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1",
                    reason="no autogroups on this kernel: nice ranks every process against every other")
def test_a_new_session_in_a_command_gets_the_builds_nice():
    """ReFrame's jobs start a session of their own, hence an autogroup of their own at nice 0,
    which nice 19 inside it would not rank below the tests. run() gives it the build's nice;
    the session's own autogroup (the tests') keeps its own."""
    own = Path("/proc/self/autogroup").read_text()
    code = ("import time\n"
            "for _ in range(200):\n"
            "    nice = int(open('/proc/self/autogroup').read().split()[2])\n"
            "    if nice: break\n"
            "    time.sleep(0.05)\n"
            "print(open('/proc/self/autogroup').read().strip())\n")
    proc = background.run(["setsid", "-w", sys.executable, "-c", code], 60, poll_s=0.2)
    assert proc.returncode == 0, proc.stderr
    name, _, nice = proc.stdout.split()
    assert int(nice) == background.NICE and name != own.split()[0], proc.stdout
    assert Path("/proc/self/autogroup").read_text() == own
