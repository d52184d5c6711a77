"""Nothing is lost (issue 11, class 1): the kit never rewrites what it did not create in
this run. Real files, a real lock held by another process; every pre-existing file is
compared byte for byte afterwards. (Staging into a directory that holds another dataset:
tests/test_cosmoflow_train.py::test_staging_copies_the_share_inside_the_clock.)"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NVIDIA_V10_COSMOFLOW, REPO, real_log, run_hpckit

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: trainings killed and resumed



def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def one_line_error(proc, *needles) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    for needle in needles:
        assert str(needle) in err[0], (needle, err[0])
    return err[0]


@pytest.mark.parametrize("benchmark", ["cosmoflow", "deepcam"])
def test_datagen_never_rewrites_an_existing_dataset(benchmark, tmp_path):
    out = tmp_path / "data"
    run_hpckit("datagen", benchmark, "--config", "mini", "--out", out, "--train", "2", "--valid", "2", "--seed", "1",
               check=True)
    before = snapshot(out)
    again = run_hpckit("datagen", benchmark, "--config", "mini", "--out", out, "--seed", "2")
    one_line_error(again, f"datagen --out {out}", "not empty")
    assert snapshot(out) == before
    # a directory holding anything else is refused too; an existing empty one is filled
    other = tmp_path / "other"
    other.mkdir()
    (other / "README").write_text("mine\n")
    one_line_error(run_hpckit("datagen", benchmark, "--config", "mini", "--out", other, "--seed", "2"), "README")
    assert snapshot(other) == {"README": hashlib.sha256(b"mine\n").hexdigest()}


def train_cmd(data: Path, out: Path) -> list:
    return ["train", "cosmoflow", "--data", data, "--config", "mini", "--output-dir", out,
            "--framework", "pytorch", "--seed", "1", "--set", "train.max_steps=1"]


def test_a_used_output_dir_is_refused(mini_data, tmp_path):
    """An earlier run's log and summary are never replaced: the rerun stops before writing
    anything there, its lock file included."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mlperf.log").write_bytes(real_log(NVIDIA_V10_COSMOFLOW).read_bytes())
    (out / "summary.json").write_text('{"status": "success"}\n')
    before = snapshot(out)
    one_line_error(run_hpckit(*train_cmd(mini_data, out)), f"--output-dir {out}", "earlier run's mlperf.log")
    assert snapshot(out) == before


def test_a_second_run_into_a_directory_in_use_stops(mini_data, tmp_path):
    """Another process holds the directory's run lock (as a running `hpckit train` does):
    a run started into it exits 2 at once and writes nothing there."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
         str(out / ".hpckit.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run_hpckit(*train_cmd(mini_data, out), timeout=120)
        one_line_error(proc, f"--output-dir {out}", "another hpckit run is writing into it")
        assert sorted(p.name for p in out.iterdir()) == [".hpckit.lock"]
    finally:
        holder.kill()
        holder.wait()
    # the lock is free again: the run goes ahead (one step) and takes the lock itself
    proc = run_hpckit(*train_cmd(mini_data, out), timeout=600)
    assert proc.returncode == 3 and "NOT converged" in proc.stdout, proc.stderr[-2000:]   # step-limited
    fd = os.open(out / ".hpckit.lock", os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # released when that run ended
    finally:
        os.close(fd)


def _children(pid: int) -> set[int]:
    kids = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_datagen_workers_do_not_outlive_it(tmp_path, signame):
    """A real signal to `hpckit datagen` while its two workers write samples: SIGTERM ends it
    with one line and exit 143, and no worker is left running after either signal."""
    import signal
    import time
    out = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "hpckit", "datagen", "cosmoflow", "--out", str(out),
                             "--train", "400", "--valid", "8", "--size", "64", "--workers", "2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120   # a hang guard: the wait ends when 3 samples are there
    while not (out / "train").is_dir() or len(list((out / "train").iterdir())) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers
    try:
        proc.send_signal(getattr(signal, signame))
        proc.wait(timeout=60)
        deadline = time.monotonic() + 5    # they die with it, not after their current work
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "datagen workers still running"
    finally:
        for w in workers:           # never leave them behind, whatever the outcome
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    err = proc.stderr.read()
    if signame == "SIGTERM":
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert proc.returncode == 143 and len(lines) == 1 and "SIGTERM" in lines[0], err
    else:
        assert proc.returncode == -9
