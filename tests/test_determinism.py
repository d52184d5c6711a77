"""`hpckit train --deterministic`: two runs with the same seed on the same machine give the
same eval values, epoch by epoch, for every benchmark and framework (and a run with
another seed does not, so the comparison can tell runs apart); the choice is logged."""

from __future__ import annotations

import json

import pytest

from conftest import run_hpckit

CF = ["--set", "data.sample_size=16", "--set", "data.n_train=16", "--set", "data.n_valid=8",
      "--set", "data.batch_size=4", "--set", "model.n_conv_layers=4", "--set", "train.n_epochs=2",
      "--set", "model.dropout=0.2"]
DC = ["--set", "data.n_train=8", "--set", "data.n_valid=4", "--set", "data.height=32", "--set", "data.width=48",
      "--set", "data.batch_size=2", "--set", "train.n_epochs=2"]
EVAL_KEYS = ("eval_error", "eval_accuracy", "eval_loss", "train_loss")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("determinism")
    run_hpckit("datagen", "cosmoflow", "--out", root / "cf", "--train", 16, "--valid", 8, "--size", 16,
               "--seed", 3, "--workers", 1, check=True)
    run_hpckit("datagen", "deepcam", "--out", root / "dc", "--train", 8, "--valid", 4, "--height", 32,
               "--width", 48, "--seed", 3, "--workers", 1, check=True)
    return root


def curve(out):
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (out / "mlperf.log").read_text().splitlines()]
    config = next(e["value"] for e in events if e["key"] == "hpckit_config")
    return config, [(e["key"], e["metadata"].get("epoch_num"), e["value"]) for e in events if e["key"] in EVAL_KEYS]


def train(datasets, out, benchmark, framework, seed, *more):
    data, extra = (datasets / "cf", CF) if benchmark == "cosmoflow" else (datasets / "dc", DC)
    proc = run_hpckit("train", benchmark, "--data", data, "--output-dir", out, "--framework", framework,
                      "--seed", seed, "--deterministic", *extra, *more, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    return curve(out)


@pytest.mark.parametrize("benchmark, framework", [("cosmoflow", "pytorch"), ("cosmoflow", "tensorflow"),
                                                  ("deepcam", "pytorch")])
def test_same_seed_same_curve(datasets, tmp_path, benchmark, framework):
    config, first = train(datasets, tmp_path / "a", benchmark, framework, 11)
    assert config["train.deterministic"] is True
    _, second = train(datasets, tmp_path / "b", benchmark, framework, 11)
    assert len(first) >= 2 and first == second   # bit-identical values, epoch by epoch
    if framework == "pytorch" and benchmark == "cosmoflow":
        _, other = train(datasets, tmp_path / "c", benchmark, framework, 12)
        assert other != first, "another seed gave the same curve: the comparison cannot tell runs apart"
        # the kit's own max-pooling backward (what --deterministic runs on CUDA before torch 2.13)
        # trains the same curve as torch's, and the run logs which one ran
        assert config["model.max_pool"] == "native"        # auto on a CPU
        config, pooled = train(datasets, tmp_path / "d", benchmark, framework, 11, "--set", "model.max_pool=deterministic")
        assert config["model.max_pool"] == "deterministic" and pooled == first


def test_off_by_default_and_logged(datasets, tmp_path):
    proc = run_hpckit("train", "cosmoflow", "--data", datasets / "cf", "--output-dir", tmp_path / "o",
                      "--framework", "pytorch", "--seed", 1, *CF, "--set", "train.n_epochs=1")
    assert proc.returncode in (0, 3), proc.stderr
    assert curve(tmp_path / "o")[0]["train.deterministic"] is False
