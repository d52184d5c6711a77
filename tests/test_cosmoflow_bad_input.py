"""Bad input to the CosmoFlow commands: one line naming the file or key, exit code 2,
no traceback, no hang, and whatever MLPerf log was already written is kept."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from conftest import NO_ALLOCATOR_RESTART, run_hpckit
from hpckit.common import tfrecord
from hpckit.cosmoflow import synthetic

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: a training per bad input, TensorFlow's among them

TINY = ["--set", "data.sample_size=16", "--set", "data.n_train=8", "--set", "data.n_valid=4",
        "--set", "data.batch_size=4", "--set", "model.n_conv_layers=4", "--set", "train.n_epochs=1"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny") / "data"
    synthetic.write_dataset(root, 8, 4, size=16, seed=1, workers=1)
    return root


@pytest.fixture
def data_copy(tiny_data, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(tiny_data, root)
    return root


def train(data, out, *extra, framework="pytorch"):
    return run_hpckit("train", "cosmoflow", "--data", data, "--output-dir", out, "--framework", framework,
                      "--seed", "1", *NO_ALLOCATOR_RESTART, *TINY, *extra, timeout=300)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert str(needle) in err[0], (needle, err[0])
    return err[0]


def assert_log_kept_and_aborted(out):
    log = (out / "mlperf.log").read_text()
    assert '"key": "run_start"' in log
    assert '"status": "aborted"' in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["converged"] is False and summary["error"]


def first_train_file(root):
    return sorted((root / "train").iterdir())[0]


def test_missing_data_dir(tmp_path):
    assert_one_line_error(train(tmp_path / "nope", tmp_path / "out"), tmp_path / "nope", "does not exist")


def test_empty_split_folder(data_copy, tmp_path):
    for f in (data_copy / "validation").iterdir():
        f.unlink()
    assert_one_line_error(train(data_copy, tmp_path / "out"), data_copy / "validation", "empty")


def test_too_few_samples_names_the_config_key(data_copy, tmp_path):
    proc = train(data_copy, tmp_path / "out", "--set", "data.n_train=12")
    assert_one_line_error(proc, data_copy / "train", "data.n_train")


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_truncated_tfrecord(data_copy, tmp_path, framework):
    bad = first_train_file(data_copy)
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    out = tmp_path / "out"
    assert_one_line_error(train(data_copy, out, framework=framework), bad)
    assert_log_kept_and_aborted(out)


def test_corrupt_gzip(data_copy, tmp_path):
    bad = first_train_file(data_copy)
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    out = tmp_path / "out"
    assert_one_line_error(train(data_copy, out), bad)
    assert_log_kept_and_aborted(out)


def test_wrong_x_size(data_copy, tmp_path):
    bad = first_train_file(data_copy)
    bad.unlink()     # the kit's writer never replaces a file it did not write
    tfrecord.write_example_file(bad, {"x": np.zeros((8, 8, 8, 4), "<i2").tobytes(),
                                      "y": np.zeros(4, np.float32)})
    out = tmp_path / "out"
    assert_one_line_error(train(data_copy, out, framework="tensorflow"), bad, "bytes")
    assert_log_kept_and_aborted(out)


def test_non_finite_y(data_copy, tmp_path):
    bad = first_train_file(data_copy)
    example = tfrecord.read_example_file(bad)
    bad.unlink()
    tfrecord.write_example_file(bad, {"x": example["x"], "y": np.array([np.nan, 0, 0, 0], np.float32)})
    assert_one_line_error(train(data_copy, tmp_path / "out"), bad, "not finite")


def test_not_gzip_at_all(data_copy, tmp_path):
    bad = first_train_file(data_copy)
    bad.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    assert gzip.GzipFile  # the file claims gzip by its magic and is not
    assert_one_line_error(train(data_copy, tmp_path / "out"), bad)


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
@pytest.mark.parametrize("content", [b"", b"plain garbage, no gzip magic" * 4])
def test_bad_first_file_is_the_file_named(data_copy, tmp_path, framework, content):
    """Compression is decided per file: a zero-byte or garbage FIRST file is the one
    named, not a healthy GZIP file read as if uncompressed."""
    bad = first_train_file(data_copy)
    bad.write_bytes(content)
    out = tmp_path / "out"
    line = assert_one_line_error(train(data_copy, out, framework=framework), bad)
    others = [p for p in (data_copy / "train").iterdir() if p != bad]
    assert not any(str(p) in line for p in others), line


def test_negative_particle_count_names_the_file(data_copy, tmp_path):
    bad = sorted((data_copy / "train").iterdir())[3]
    example = tfrecord.read_example_file(bad)
    x = np.frombuffer(example["x"], "<i2").copy()
    x[123] = -5
    bad.unlink()
    tfrecord.write_example_file(bad, {"x": x.tobytes(), "y": np.asarray(example["y"], np.float32)})
    assert_one_line_error(train(data_copy, tmp_path / "out"), bad, "negative particle count (-5)")


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_diverging_training_stops_at_the_step(data_copy, tmp_path, framework):
    """A learning rate of 1e12 blows the weights up: the run stops at the first non-finite
    step, run_stop aborted naming the step, exit 3 (trained, target missed), no traceback."""
    out = tmp_path / "out"
    proc = train(data_copy, out, "--set", "lr_schedule.base_lr=1e12", "--set", "train.n_epochs=3",
                 framework=framework)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "training diverged" in proc.stdout and "at training step" in proc.stdout
    stop = json.loads((out / "mlperf.log").read_text().splitlines()[-1].split(":::MLLOG ", 1)[1])
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted"
    assert "is nan at training step" in stop["metadata"]["reason"] or "is inf at training step" in \
        stop["metadata"]["reason"], stop
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["stop_reason"] == stop["metadata"]["reason"]


def test_unknown_config_key(data_copy, tmp_path):
    proc = train(data_copy, tmp_path / "out", "--set", "model.conv_sise=8")
    assert_one_line_error(proc, "model.conv_sise")


def test_bad_config_value(data_copy, tmp_path):
    assert_one_line_error(train(data_copy, tmp_path / "out", "--set", "model.dropout=1.5"), "model.dropout")
    assert_one_line_error(train(data_copy, tmp_path / "out", "--set", "data.batch_size=four"), "data.batch_size")


def test_config_file_with_unknown_key(data_copy, tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text("base: mini\ntrain:\n  target_mea: 0.3\n")
    proc = run_hpckit("train", "cosmoflow", "--data", data_copy, "--output-dir", tmp_path / "o", "--config", cfg)
    assert_one_line_error(proc, cfg, "train.target_mea")


def test_unwritable_output_dir(data_copy, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # checked before anything is made (fileio.check_path): the file in the way is named as such
    assert_one_line_error(train(data_copy, blocker / "out"), blocker / "out", "a part of the path is not a directory")


def test_stage_dir_inside_data_is_refused(data_copy, tmp_path):
    proc = train(data_copy, tmp_path / "out", "--stage-dir", data_copy / "train")
    assert_one_line_error(proc, "--stage-dir")


TWO_RANKS = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize("benchmark, framework, who", [
    ("cosmoflow", "pytorch", "torch.distributed"),
    ("cosmoflow", "tensorflow", "tf.distribute"),   # its own start-up waits for ever: the kit's rendezvous bounds it
    ("deepcam", "pytorch", "torch.distributed"),
])
def test_missing_peer_fails_the_rendezvous_in_one_line(data_copy, tmp_path, benchmark, framework, who):
    """Rank 0 of 2 whose rank 1 never starts: no hang, one line after the timeout."""
    env = {**TWO_RANKS, "MASTER_PORT": "29731"}
    proc = run_hpckit("train", benchmark, "--framework", framework, "--data", data_copy,
                      "--output-dir", tmp_path / "out", "--collective-timeout", "5", env=env, timeout=120)
    # the roll call, on MASTER_PORT + 1, is where every rank meets first (common/dist.py)
    assert_one_line_error(proc, f"{who} rendezvous at 127.0.0.1:29732 (rank 0 of 2) failed")


@pytest.mark.parametrize("args, message", [
    (["--dist", "none"], "--dist none with 2 ranks (openmpi)"),
    (["--framework", "pytorch", "--dist", "tf"], "--dist tf needs --framework tensorflow"),
    (["--framework", "tensorflow", "--dist", "horovod"], "--dist horovod: horovod.tensorflow is not importable"),
    (["--collective-timeout", "0"], "--collective-timeout 0: must be a number of seconds > 0"),
])
def test_bad_dist_choice_is_one_line(data_copy, tmp_path, args, message):
    proc = run_hpckit("train", "cosmoflow", "--data", data_copy, "--output-dir", tmp_path / "out", *args,
                      env=TWO_RANKS)
    assert_one_line_error(proc, message)
