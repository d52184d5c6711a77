"""CosmoFlow training end to end on the mini config: converges, logs by the rules, stages,
clears caches, and a sabotaged run is reported as not converged."""

from __future__ import annotations

import json
import os
from pathlib import Path
import re
import threading

import pytest

import background
from conftest import (PUBLISHED_V2, assert_published_event_order, background_fixture, remove_scratch,
                      run_hpckit, scratch_build)

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: mini trainings (`make test`'s ReFrame run trains CosmoFlow
# to its target with both frameworks)


def mllog(path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
            if ":::MLLOG " in line]


def check(log, ruleset="mini"):
    return run_hpckit("check", log, "--ruleset", ruleset)


@pytest.fixture(scope="module")
def converged_run(mini_data, tmp_path_factory):
    base = tmp_path_factory.mktemp("run-pytorch")
    out, stage = base / "out", base / "node-local"
    # the node-local directory already holds another dataset's files: staging must not touch them
    (stage / "train").mkdir(parents=True)
    (stage / "train" / "other-dataset.tfrecord").write_bytes(b"not the kit's")
    (stage / "notes.txt").write_text("a user's file\n")
    proc = run_hpckit("train", "cosmoflow", "--data", mini_data, "--config", "mini", "--output-dir", out,
                      "--framework", "pytorch", "--stage-dir", stage, "--seed", "1", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, stage, proc


def test_mini_converges_and_summary_says_so(converged_run):
    out, _, proc = converged_run
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "success" and s["converged"] is True
    assert s["final_eval_error"] <= s["target"] == 0.23
    assert 1 <= s["epochs"] <= 40
    assert 0 < s["staging_s"] < s["time_to_train_s"]
    assert s["train_samples_per_s"] > 0 and s["eval_samples_per_s"] > 0
    # --allocator auto: tcmalloc preloaded where installed (CI installs it), else glibc tuned
    from hpckit.common import memory
    assert s["allocator"].startswith("tcmalloc (" if memory.find_tcmalloc() else "glibc mmap_threshold=")
    assert s["global_batch_size"] == 8 and s["ranks"] == 1
    assert {"python", "numpy", "mlperf_logging", "torch"} <= set(s["software"])
    assert "converged" in proc.stdout


def test_log_has_the_reference_order_and_passes_compliance(converged_run):
    out, _, _ = converged_run
    events = mllog(out / "mlperf.log")
    keys = [e["key"] for e in events]
    # the reference's order (cosmoflow/train.py:242-248, utils/callbacks.py:53-69 at 2c627d4)
    order = ["cache_clear", "init_start", "seed", "number_of_ranks", "number_of_nodes", "init_stop", "run_start",
             "staging_start", "staging_stop", "epoch_start", "eval_start", "eval_stop", "epoch_stop", "eval_error",
             "run_stop"]
    assert [keys.index(k) for k in order] == sorted(keys.index(k) for k in order)
    assert keys[-1] == "run_stop" and events[-1]["metadata"]["status"] == "success"
    for key in ("submission_benchmark", "number_of_nodes", "accelerators_per_node", "global_batch_size",
                "opt_name", "opt_base_learning_rate", "opt_learning_rate_warmup_epochs",
                "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_epochs",
                "opt_learning_rate_decay_factor", "dropout", "opt_weight_decay", "seed", "hpckit_config",
                "number_of_ranks"):
        assert keys.count(key) == 1, key
    # NVIDIA's v2.0 DGX-A100 x64 run: the same event order; it logs nothing the kit lacks
    # but its own statistics
    assert_published_event_order(out / "mlperf.log", PUBLISHED_V2 / "NVIDIA/results/dgxa100_n64_pytorch/strong/"
                                 "cosmoflow/result_0.txt", {"tracked_stats": "NVIDIA's own per-epoch statistics"})
    epochs = [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_error"]
    assert epochs == list(range(1, len(epochs) + 1))
    proc = check(out / "mlperf.log", "mini")
    assert proc.returncode == 0 and proc.stdout.startswith("COMPLIANT"), proc.stdout + proc.stderr


def test_staging_copies_the_share_inside_the_clock(converged_run, mini_data):
    out, stage, _ = converged_run
    events = mllog(out / "mlperf.log")
    t = {e["key"]: e["time_ms"] for e in events if e["key"] in ("run_start", "staging_start", "staging_stop")}
    assert t["run_start"] <= t["staging_start"] <= t["staging_stop"]
    stop = next(e for e in events if e["key"] == "staging_stop")
    size = sum(p.stat().st_size for split in ("train", "validation") for p in (mini_data / split).iterdir())
    assert stop["metadata"]["staged"] is True and stop["metadata"]["bytes"] == size   # the whole (1-node) dataset
    # into a directory of its own, removed at the end; what was there before is untouched
    own = Path(stop["metadata"]["stage_dir"])
    assert own.parent == stage and own.name.startswith("hpckit-stage-") and not own.exists()
    assert sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*")) == [
        "notes.txt", "train", "train/other-dataset.tfrecord"]
    assert (stage / "train" / "other-dataset.tfrecord").read_bytes() == b"not the kit's"


def test_what_the_run_used_is_measured(converged_run, mini_data):
    """summary.json's usage block and the log's hpckit_usage line (common/usage.py): the
    staging copy read the dataset once, every epoch read the train split from the staged
    copy (GZIP TFRecords are read whole, so at least their size on disk), the one rank's
    peak memory is a real process's (torch alone is well over 100 MB)."""
    out, _, _ = converged_run
    events = mllog(out / "mlperf.log")
    s = json.loads((out / "summary.json").read_text())
    u = s["usage"]
    size = {split: sum(p.stat().st_size for p in (mini_data / split).iterdir()) for split in ("train", "validation")}
    stop = next(e for e in events if e["key"] == "staging_stop")
    assert stop["metadata"]["read_bytes_all_ranks"] == u["staging_read_bytes"] >= sum(size.values())
    assert u["staging_read_MBps"] == pytest.approx(u["staging_read_bytes"] / s["staging_s"] / 1e6)
    assert size["train"] <= u["train_read_bytes_per_epoch"] < 3 * sum(size.values())
    assert size["validation"] <= u["eval_read_bytes_per_epoch"] < 3 * sum(size.values())
    assert len(u["peak_rss_bytes_per_rank"]) == 1 and u["peak_rss_bytes_max"] > 100e6
    per_epoch = [e for e in events if e["key"] == "hpckit_epoch_usage"]
    assert [e["metadata"]["epoch_num"] for e in per_epoch] == list(range(1, s["epochs"] + 1))
    assert sum(e["value"]["train_read_bytes"] for e in per_epoch) == pytest.approx(
        u["train_read_bytes_per_epoch"] * s["epochs"])
    assert all(0 <= e["value"]["cpu_wait_share"] < 1 for e in per_epoch) and 0 <= u["cpu_wait_share"] < 1
    logged = [e for e in events if e["key"] == "hpckit_usage"]
    assert len(logged) == 1 and logged[0]["value"] == u and events[-2] is logged[0]   # just before run_stop


def test_cache_clear_really_evicts(converged_run):
    out, _, _ = converged_run
    clear = next(e for e in mllog(out / "mlperf.log") if e["key"] == "cache_clear")
    md = clear["metadata"]
    assert md["method"] == "posix_fadvise_dontneed" and md["files"] == 1024 + 128
    assert md["resident_bytes_after"] == 0, md


def test_tensorflow_backend_trains_and_logs(mini_data, tmp_path):
    """...and writes no AutoGraph files: they are removed only at a normal exit, so a
    killed run left them in /tmp (cosmoflow/data.py, TensorFlow); watched while it runs."""
    out, tmp = tmp_path / "tf", tmp_path / "tmp"
    tmp.mkdir()
    seen, done = set(), threading.Event()

    def watch():
        while not done.wait(0.2):
            seen.update(p.name for p in tmp.glob("__autograph_generated_file*"))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = run_hpckit("train", "cosmoflow", "--data", mini_data, "--config", "mini", "--output-dir", out,
                          "--framework", "tensorflow", "--seed", "2", "--set", "train.n_epochs=2", timeout=900,
                          env={"TMPDIR": str(tmp)})
    finally:
        done.set()
        watcher.join()
    assert not seen, sorted(seen)
    s = json.loads((out / "summary.json").read_text())
    assert proc.returncode == (0 if s["converged"] else 3), proc.stderr[-3000:]
    assert s["framework"] == "tensorflow" and s["epochs"] == 2 and "tensorflow" in s["software"]
    # oneDNN's kernels on every x86 CPU, not only where TensorFlow's default turns them on
    # (AVX-512 VNNI/BF16, AMX), unless the environment chose; the run says which
    assert s["software"]["tensorflow_onednn_opts"] == os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"), s["software"]
    assert s["usage"]["train_read_bytes_per_epoch"] > 0 and s["usage"]["peak_rss_bytes_max"] > 100e6   # tf.data threads
    # two epochs learn something: well below the trivial predictor's ~0.5
    assert s["final_eval_error"] < 0.45
    assert (out / "tensorflow-native.log").exists()
    assert "Traceback" not in proc.stderr


def _lr0(tmp):
    """A background build (tests/background.py: only the verdict is asserted, so it runs at nice
    19, one thread, on the cores the other tests leave idle): learning rate 0 on the session's
    mini data set (conftest's mini_data: the same generator and seed)."""
    run_hpckit("datagen", "cosmoflow", "--config", "mini", "--out", tmp / "data", "--seed", "7", check=True)
    with background.training():
        return tmp / "lr0", run_hpckit("train", "cosmoflow", "--data", tmp / "data", "--config", "mini",
                                       "--output-dir", tmp / "lr0", "--seed", "3", "--threads", "1",
                                       "--set", "lr_schedule.base_lr=0", "--set", "train.n_epochs=3")


BACKGROUND = {"cosmoflow_lr0_run": (scratch_build("cosmoflow-lr0", _lr0), remove_scratch)}
cosmoflow_lr0_run = background_fixture(BACKGROUND, "cosmoflow_lr0_run")


def test_learning_rate_zero_is_not_converged(cosmoflow_lr0_run):
    out, proc = cosmoflow_lr0_run[1]
    assert proc.returncode == 3, proc.stderr[-2000:]   # trained to the end, target missed
    assert "NOT converged" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["converged"] is False and s["status"] == "aborted" and s["epochs"] == 3
    assert s["final_eval_error"] > 0.4
    stop = mllog(out / "mlperf.log")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted"
    verdict = check(out / "mlperf.log", "mini")
    assert verdict.returncode == 1 and verdict.stdout.startswith("NOT COMPLIANT")
    assert re.search(r"eval_error", verdict.stdout)
