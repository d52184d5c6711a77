"""tests/background.py, the session's background builds: niced, their failures raised where
their result is asked for, what they made released once."""

from __future__ import annotations

import os
import subprocess
import threading

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
