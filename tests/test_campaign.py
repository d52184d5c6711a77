"""A throughput (weak-scaling) campaign for real: `hpckit train --instances 7` under one
mpirun of 7 ranks (M = 7 instances of S = 1 rank), on a tiny DeepCAM dataset where
convergence is not the point (64/16 samples, mean IoU target 0.3).

mpirun's MPMD form gives the last ranks their own arguments: instance 5 is cut after 2
training steps (train.max_steps, run_stop aborted, exit 3) while the others still train;
instance 6 fails before the start barrier (a local batch larger than its share: one line,
exit 2). The five others must be unaffected (each converged, its own log), must have
started together (the start barrier, which waits --collective-timeout for instance 6 and
then lets them go), and the campaign must score and package as a
weak set that the official package checker and result summarizer accept: five models is
DeepCAM's minimum (mlcommons/training_policies@d73e20f hpc_training_rules.adoc:182-186:
M' >= 5) and what the official tools enforce for a weak folder, which is why the
campaign has 5 instances that converge besides the two that must not, not 3.

SLOW: one mpirun of 7 tiny trainings: the file took 68 s on the 2-core development machine
at a load average of 5 (15 s of it the start barrier waiting for instance 6); its 6-instance
version took 43 s at a load of 2 to 5 and 129 s at 12 from other work (2026-11-25).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_hpckit
from test_multirank import ROOT_ENV, free_port, need

pytestmark = pytest.mark.slow

INSTANCES = 7
SABOTAGED = 5          # cut after 2 steps
FAILED = 6             # fails in its initialisation, before the start barrier
TIMEOUT_S = 15         # --collective-timeout: the start barrier's wait for instance 6
TINY = """base: mini
data: {n_train: 64, n_valid: 16}
scheduler: {lr_warmup_steps: 4}
train: {n_epochs: 10, target_iou: 0.3}
"""


def records(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()
            if ":::MLLOG " in line]


def first(recs: list[dict], key: str) -> dict:
    return next(r for r in recs if r["key"] == key)


def test_campaign_scores_and_packages_as_a_weak_set(tmp_path):
    need("mpirun")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    data, out, pkg = tmp_path / "data", tmp_path / "campaign", tmp_path / "pkg"
    run_hpckit("datagen", "deepcam", "--config", config, "--out", data, "--seed", 7, check=True)
    out.mkdir()
    (out / "notes.txt").write_text("the site's own file\n")   # never touched by the campaign

    hpckit = [sys.executable, "-m", "hpckit", "train", "deepcam", "--data", str(data), "--config", str(config),
              "--output-dir", str(out), "--seed", "21", "--instances", str(INSTANCES),
              "--collective-timeout", str(TIMEOUT_S)]
    port = free_port(span=4 + INSTANCES * 3)
    ctx = ["--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH", "-x", f"MASTER_PORT={port}"]
    command = ["mpirun", "-np", str(SABOTAGED), *ctx, *hpckit, ":",
               "-np", "1", *ctx, *hpckit, "--set", "train.max_steps=2", ":",
               "-np", "1", *ctx, *hpckit, "--set", "data.batch_size=100"]
    env = {**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    print(f"campaign of {INSTANCES} instances: {time.monotonic() - t0:.1f} s wall")
    assert proc.returncode != 0, "instances 5 and 6 stopped with exit 3 and 2, mpirun must say so"
    assert "hpckit train: error: config key 'data.batch_size'" in proc.stderr, proc.stderr[-3000:]
    assert not (out / f"instance_{FAILED}" / "mlperf.log").exists()
    assert (out / "notes.txt").read_text() == "the site's own file\n"

    logs, summaries = {}, {}
    for i in range(FAILED):
        d = out / f"instance_{i}"
        assert (d / "summary.json").is_file(), f"instance {i}: no summary.json\n{proc.stderr[-3000:]}"
        logs[i], summaries[i] = records(d / "mlperf.log"), json.loads((d / "summary.json").read_text())
        # every line of instance i's log carries metadata.instance = i, as the published weak logs
        assert {r["metadata"].get("instance") for r in logs[i]} == {i}
        assert (summaries[i]["instance"], summaries[i]["instances"], summaries[i]["ranks"]) == (i, INSTANCES, 1)
    for i in range(SABOTAGED):
        assert summaries[i]["converged"], (i, summaries[i])
        assert f"rank {FAILED}" in summaries[i]["start_barrier"], summaries[i]
        assert first(logs[i], "run_stop")["metadata"]["status"] == "success"
    cut = first(logs[SABOTAGED], "run_stop")["metadata"]
    assert summaries[SABOTAGED]["status"] == "aborted" and "max_steps" in cut["reason"], cut

    seeds = [first(logs[i], "seed")["value"] for i in range(FAILED)]
    assert seeds == [21 + i for i in range(FAILED)]
    starts = [first(logs[i], "run_start")["time_ms"] for i in range(FAILED)]
    stops = [first(logs[i], "run_stop")["time_ms"] for i in range(FAILED)]
    print(f"run_start spread {max(starts) - min(starts)} ms; time to train per instance (s): "
          + ", ".join(f"{(b - a) / 1000:.1f}" for a, b in zip(starts, stops)))
    assert max(starts) - min(starts) < 2000, "the instances did not start together"
    # the cut instance ended first, and the others went on training after it
    assert stops[SABOTAGED] < min(stops[:SABOTAGED])
    for i in range(SABOTAGED):
        assert max(r["time_ms"] for r in logs[i] if r["key"] == "epoch_start") > stops[SABOTAGED]

    # score: one weak set; instance 5 does not count; time_to_train_all over the five that do
    score = run_hpckit("score", out, "--json", tmp_path / "score.json")
    assert score.returncode == 0, score.stdout + score.stderr
    (s,) = json.loads((tmp_path / "score.json").read_text())["sets"]
    assert s["scaling"] == "weak" and s["score"]["valid"]
    assert s["score"]["number_of_models"] == SABOTAGED and s["score"]["instance_scale"] == 1
    expected = (max(stops[:SABOTAGED]) - min(starts[:SABOTAGED])) / 60000
    assert s["score"]["time_to_train_all_min"] == pytest.approx(expected)
    slowest = max(b - a for a, b in zip(starts[:SABOTAGED], stops[:SABOTAGED])) / 60000
    print(f"time_to_train_all {expected:.4f} min, slowest instance {slowest:.4f} min")
    assert expected >= slowest
    assert [r["counts"] for r in s["runs"]] == [True] * SABOTAGED + [False]
    # the report takes the campaign as the same weak set (one bar: time_to_train_all)
    report = run_hpckit("report", out, "--out", tmp_path / "report")
    assert report.returncode == 0, report.stdout + report.stderr
    (shown,) = json.loads((tmp_path / "report" / "scores.json").read_text())["site"]["sets"]
    assert shown["scaling"] == "weak" and shown["score"]["time_to_train_all_min"] == pytest.approx(expected)

    # the package of the five converged instances: <system>/weak/deepcam/, official tools pass it
    runs = [out / f"instance_{i}" for i in range(SABOTAGED)]
    packed = run_hpckit("package", "--site", "local", "--org", "hpckit", *runs, "--out", pkg,
                        "--check", "mini", "--config", config)
    print(packed.stdout)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    weak = pkg / "hpckit" / "results" / "local_cpu" / "weak" / "deepcam"
    assert sorted(p.name for p in weak.iterdir()) == [f"result_{i}.txt" for i in range(SABOTAGED)]
    assert "PACKAGE OK" in packed.stdout and "SUMMARY OK" in packed.stdout
    assert f"{SABOTAGED} models, instance scale 1" in packed.stdout


def test_instances_that_do_not_split_the_ranks_are_one_line(tmp_path):
    """--instances M on a launch whose rank count M does not divide: one line, exit 2,
    nothing written."""
    proc = run_hpckit("train", "deepcam", "--data", tmp_path / "data", "--output-dir", tmp_path / "out",
                      "--instances", 3)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hpckit train: error: --instances 3: the launch's 1 ranks (none) do not split into 3 instances of "
        "equal size; launch instances x ranks-per-instance ranks"]
    assert not (tmp_path / "out").exists()


def test_a_tensorflow_campaign_gives_each_instance_its_own_workers(tmp_path, mini_data):
    """CosmoFlow on TensorFlow, M = 2 instances of S = 2 ranks in one mpirun: each
    instance's tf.distribute worker list is its own two ranks (MultiWorkerMirroredStrategy
    per instance, not one of four), the replicas of each instance agree, and both logs are
    the campaign's."""
    need("mpirun")
    out = tmp_path / "campaign"
    stage = tmp_path / "stage"
    stage.mkdir()
    port = free_port(span=4 + 2 * 3)
    command = ["mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
               "-x", f"MASTER_PORT={port}", "-x", "TF_CPP_MIN_LOG_LEVEL", sys.executable, "-m", "hpckit", "train",
               "cosmoflow", "--framework", "tensorflow", "--data", str(mini_data), "--config", "mini",
               "--output-dir", str(out), "--seed", "1", "--instances", "2", "--threads", "1", "--stage-dir", str(stage),
               "--set", "train.n_epochs=1", "--set", "data.batch_size=4", "--set", "data.n_train=64",
               "--set", "data.n_valid=16"]   # 8 steps an instance: the point is who works with whom
    env = {**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]   # 3: one epoch is short of the target
    for i in range(2):
        s = json.loads((out / f"instance_{i}" / "summary.json").read_text())
        assert (s["instance"], s["instances"], s["ranks"], s["campaign_ranks"], s["dist"]) == (i, 2, 2, 4, "tf"), s
        assert s["epochs"] == 1 and s["replicas_in_sync"] is True and s.get("error") is None, s
        recs = records(out / f"instance_{i}" / "mlperf.log")
        assert first(recs, "global_batch_size")["value"] == 8
        assert first(recs, "run_start")["metadata"]["instance"] == i
