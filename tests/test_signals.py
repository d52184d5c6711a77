"""A stop signal in any phase of a training (issue 34): SIGTERM (scancel, a launcher tearing
the job down) or SIGINT (Ctrl-C), sent to a real `hpckit train` held at a point inside the
phase (tests/signal_hold.py: held, not raced against a clock), ends the run with the
terminated exit code (143; 130 for SIGINT) and one stderr line, its mlperf.log whole and
closed by run_stop aborted (from run_start on: before it there is no timed region to
close), summary.json saying aborted, and nothing of the run left in the stage directory,
whose own file stays as it was. Every staging path, copies and CosmoFlow's decoded .npy
(data.stage_decode), also meets a real full disk (a tmpfs this test mounts; root, as in
tests/test_full_disk.py) and says so in one line naming the node and the file; so does
OpenCatalyst's node share staged as one LMDB."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys

import pytest

from conftest import NO_ALLOCATOR_RESTART, REPO, run_hpckit
from test_full_disk import assert_one_disk_line, full_fs  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: multi-process runs stopped by signals in every phase

# 8 + 4 samples of 16^3: two training steps per epoch, one evaluation batch
CF_TINY = ["--set", "data.sample_size=16", "--set", "data.n_train=8", "--set", "data.n_valid=4",
           "--set", "data.batch_size=4", "--set", "model.n_conv_layers=4", "--set", "train.n_epochs=2",
           "--set", "lr_schedule.base_lr=0.0"]
DECODE = ["--set", "data.stage_decode=true"]
HANG_GUARD_S = 300
EXIT = {"SIGTERM": 143, "SIGINT": 130}


def _tiny_dataset(root, size: int):
    run_hpckit("datagen", "cosmoflow", "--out", root, "--train", 8, "--valid", 4, "--size", size, "--seed", 1,
               "--workers", 1, check=True)
    return root


@pytest.fixture(scope="module")
def tiny_cf(tmp_path_factory):
    return _tiny_dataset(tmp_path_factory.mktemp("signals") / "cf", 16)


@pytest.fixture(scope="module")
def tiny_oc20(tmp_path_factory):
    out = tmp_path_factory.mktemp("signals") / "oc20"
    run_hpckit("datagen", "oc20", "--config", "mini", "--out", out, "--train", 16, "--valid", 8, "--seed", 1,
               "--workers", 1, check=True)
    return out


def oc20_args(data, out, stage_dir):
    return ["train", "oc20", "--data", data, "--config", "mini", "--output-dir", out, "--seed", 1,
            "--stage-dir", stage_dir, *NO_ALLOCATOR_RESTART, "--set", "data.n_train=16", "--set", "data.n_valid=8",
            "--set", "train.n_epochs=1"]


def train_args(data, out, stage_dir, *extra):
    return ["train", "cosmoflow", "--data", data, "--output-dir", out, "--framework", "pytorch", "--seed", 1,
            "--stage-dir", stage_dir, *NO_ALLOCATOR_RESTART, *CF_TINY, *extra]


def signalled_run(tmp_path, phase: str, signame: str, args: list) -> tuple[subprocess.CompletedProcess, str]:
    """Run hpckit held in `phase`, send `signame` there, release, wait: (the process, where it was held)."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "signal_hold.py"), phase, str(ready_w),
                                 str(release_r), *map(str, args)], cwd=REPO, stdout=out, stderr=err,
                                pass_fds=(ready_w, release_r),
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
        os.close(ready_w)
        os.close(release_r)
        try:
            # hang guard only: the run reaches its point or ends (then the pipe closes)
            readable, _, _ = select.select([ready_r], [], [], HANG_GUARD_S)
            where = os.read(ready_r, 4096).decode().strip() if readable else ""
            if not where:
                proc.kill()
                proc.wait()
                err.seek(0)
                pytest.fail(f"the run never reached {phase} (exit {proc.returncode}): {err.read()[-3000:]}")
            proc.send_signal(getattr(signal, signame))
            os.write(release_w, b"x")
            proc.wait(timeout=HANG_GUARD_S)
        finally:
            os.close(ready_r)
            os.close(release_w)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()), where


def log_events(path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), "the log ends mid-line"
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in raw.decode().splitlines()]


# phase -> (the key logged on entering it, the key that would have ended it)
PHASE_KEYS = {"init": ("init_start", "init_stop"), "before-staging": ("run_start", "staging_start"),
              "staging": ("staging_start", "staging_stop"), "train": ("epoch_start", "eval_start"),
              "eval": ("eval_start", "eval_stop")}

# (phase, signal, staged as): CosmoFlow's copies or decoded .npy, OpenCatalyst's LMDB
CASES = [("init", "SIGTERM", "copies"), ("before-staging", "SIGINT", "copies"), ("staging", "SIGTERM", "copies"),
         ("staging", "SIGTERM", "decoded"), ("staging", "SIGINT", "decoded"), ("staging", "SIGTERM", "lmdb"),
         ("train", "SIGTERM", "copies"), ("train", "SIGINT", "copies"), ("eval", "SIGTERM", "copies"),
         ("eval", "SIGINT", "copies")]


@pytest.mark.parametrize("phase, signame, staged", CASES, ids=[f"{p}-{s}-{how}" for p, s, how in CASES])
def test_a_stop_signal_in_any_phase(request, tmp_path, phase, signame, staged):
    stage = tmp_path / "scratch"
    stage.mkdir()
    (stage / "keep.txt").write_text("a file that was here before\n")
    out = tmp_path / "out"
    args = (oc20_args(request.getfixturevalue("tiny_oc20"), out, stage) if staged == "lmdb" else
            train_args(request.getfixturevalue("tiny_cf"), out, stage, *(DECODE if staged == "decoded" else [])))
    proc, where = signalled_run(tmp_path, phase, signame, args)
    if phase == "staging":
        assert {"copies": "copied", "decoded": "decoded", "lmdb": "lmdb record"}[staged] in where, where
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == EXIT[signame], (where, proc.returncode, proc.stderr[-3000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and (signame in lines[0] if signame == "SIGTERM" else "interrupted" in lines[0]), lines

    events = log_events(out / "mlperf.log")
    keys = [e["key"] for e in events]
    entered, ended = PHASE_KEYS[phase]
    assert entered in keys and ended not in keys[keys.index(entered):], (where, keys)
    if phase == "init":   # no run_start yet: no timed region to close
        assert "run_start" not in keys and "run_stop" not in keys, keys
    else:
        assert keys[-1] == "run_stop" and keys.count("run_stop") == 1, keys
        assert events[-1]["metadata"]["status"] == "aborted"
        assert signame in events[-1]["metadata"]["reason"], events[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "aborted", summary
    assert sorted(p.name for p in stage.iterdir()) == ["keep.txt"], "the run's staged files were left"
    assert (stage / "keep.txt").read_text() == "a file that was here before\n"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("extra, size, free", [([], 16, 16384), (DECODE, 32, 300_000)], ids=["copies", "decoded"])
def test_staging_onto_a_full_disk_names_the_node_and_file(tmp_path, full_fs, extra, size, free):  # noqa: F811
    """Copies and decoded samples alike: 'No space left on device', the node, the file. (A
    decoded 32^3 sample that fits in part once said `...x.npy: None`: np.save's short write.)"""
    data = _tiny_dataset(tmp_path / "cf", size)
    fs = full_fs.fill(free)
    train = train_args(data, tmp_path / "out", fs, *extra)
    train[train.index("data.sample_size=16")] = f"data.sample_size={size}"
    proc = run_hpckit(*train)
    line = assert_one_disk_line(proc, fs / "hpckit-stage-")
    assert f"node {socket.gethostname()}: staging: " in line, line
    named = line.split(": No space")[0]
    assert named.endswith((".x.npy", ".y.npy") if extra else ".tfrecord"), line
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "keep.txt"], "staging left files behind"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "aborted"


@pytest.mark.parametrize("free", [4096, 40_000])
def test_a_node_share_staged_as_lmdb_onto_a_full_disk(tiny_oc20, full_fs, tmp_path, free):  # noqa: F811
    """OpenCatalyst's staged LMDB: a write LMDB cannot start (ENOSPC) or one cut short (which
    LMDB reports as EIO) is a full disk in one line, not lmdb's traceback."""
    fs = full_fs.fill(free)
    proc = run_hpckit(*oc20_args(tiny_oc20, tmp_path / "out", fs))
    line = assert_one_disk_line(proc, fs / "hpckit-stage-")
    assert f"node {socket.gethostname()}: staging: " in line and "data.0000.lmdb: No space" in line, line
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "keep.txt"], "staging left files behind"


def test_decoded_staging_detects_a_short_write_as_a_full_disk(full_fs, tmp_path):  # noqa: F811
    """data._save_npy itself: a sample larger than the free space raises ENOSPC, with errno."""
    import errno

    import numpy as np

    from hpckit.cosmoflow.data import _save_npy
    fs = full_fs.fill(8192)
    with pytest.raises(OSError) as e:
        _save_npy(fs / "big.x.npy", np.zeros((32, 32, 32), dtype=np.int16))
    assert e.value.errno == errno.ENOSPC
    small = np.arange(8, dtype=np.float32)   # and where it fits, what np.save writes, byte for byte
    assert _save_npy(tmp_path / "a.npy", small) == (tmp_path / "a.npy").stat().st_size
    np.save(tmp_path / "b.npy", small)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


def test_a_node_share_staged_onto_a_full_disk_stops_both_ranks(tmp_path, full_fs):  # noqa: F811
    """Two ranks under torchrun on one node: local rank 0 stages the node's share (decoded)
    and meets the full disk, naming node and file; rank 1, waiting for the node's staging,
    ends too (one line: the collective failed), the job ends non-zero, nothing is left."""
    from test_multirank import free_port
    data = _tiny_dataset(tmp_path / "cf", 32)
    fs = full_fs.fill(300_000)
    train = train_args(data, tmp_path / "out", fs, *DECODE, "--set", "data.batch_size=2")
    train[train.index("data.sample_size=16")] = "data.sample_size=32"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "--max-restarts", "0", "-m", "hpckit", *map(str, train)], cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    assert proc.returncode != 0
    kit = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("hpckit train: ")]
    assert len(kit) == 2, proc.stderr[-3000:]
    full = [ln for ln in kit if "No space left on device" in ln]
    assert len(full) == 1 and f"node {socket.gethostname()}: staging: {fs}/hpckit-stage-" in full[0], kit
    assert full[0].split(": No space")[0].endswith((".x.npy", ".y.npy")), full
    assert not re.search(r'File "[^"]*/hpckit/(cli|common|cosmoflow)', proc.stderr), "a traceback from the kit"
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "keep.txt"], "staging left files behind"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "aborted"
