"""`hpckit train --deterministic`: two runs with the same seed on the same machine give the
same eval values, epoch by epoch, for every benchmark and framework (and a run with
another seed does not, so the comparison can tell runs apart); the choice is logged."""

from __future__ import annotations

import json

import pytest

import background
from conftest import background_fixture, remove_scratch, run_hpckit, scratch_build

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: eight trainings compared value by value

CF = ["--set", "data.sample_size=16", "--set", "data.n_train=16", "--set", "data.n_valid=8",
      "--set", "data.batch_size=4", "--set", "model.n_conv_layers=4", "--set", "train.n_epochs=2",
      "--set", "model.dropout=0.2"]
DC = ["--set", "data.n_train=8", "--set", "data.n_valid=4", "--set", "data.height=32", "--set", "data.width=48",
      "--set", "data.batch_size=2", "--set", "train.n_epochs=2"]
EVAL_KEYS = ("eval_error", "eval_accuracy", "eval_loss", "train_loss")


def _datasets(root):
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
                      "--seed", seed, "--deterministic", "--threads", 1, *extra, *more, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    return curve(out)


def _curves(benchmark, framework):
    """A background build (tests/background.py): the comparisons below assert values, never
    times, so the runs go at nice 19, one thread, on the cores the other tests leave idle.
    {run: (its logged config, its curve)}: a and b the same seed, c another (CosmoFlow/PyTorch
    also d: the kit's own max-pooling backward)."""
    def body(tmp):
        datasets = background.result("determinism_data", *BACKGROUND["determinism_data"])[1]
        runs = {}
        with background.training():
            for run, seed, *more in (("a", 11), ("b", 11), *((("c", 12), ("d", 11, "--set", "model.max_pool=deterministic"))
                                                             if (benchmark, framework) == ("cosmoflow", "pytorch") else ())):
                runs[run] = train(datasets, tmp / run, benchmark, framework, seed, *more)
        return runs
    return body


CASES = (("cosmoflow", "pytorch"), ("cosmoflow", "tensorflow"), ("deepcam", "pytorch"))
BACKGROUND = {"determinism_data": (scratch_build("determinism", _datasets), remove_scratch),
              **{f"curves_{b}_{f}": (scratch_build(f"determinism-{b}-{f}", _curves(b, f)), remove_scratch)
                 for b, f in CASES}}
determinism_data = background_fixture(BACKGROUND, "determinism_data")
curves_cosmoflow_pytorch = background_fixture(BACKGROUND, "curves_cosmoflow_pytorch")
curves_cosmoflow_tensorflow = background_fixture(BACKGROUND, "curves_cosmoflow_tensorflow")
curves_deepcam_pytorch = background_fixture(BACKGROUND, "curves_deepcam_pytorch")


def _same_seed_same_curve(made):
    runs = made[1]
    (config, first), (_, second) = runs["a"], runs["b"]
    assert config["train.deterministic"] is True
    assert len(first) >= 2 and first == second   # bit-identical values, epoch by epoch
    return config, first


def test_same_seed_same_curve_cosmoflow_pytorch(curves_cosmoflow_pytorch):
    config, first = _same_seed_same_curve(curves_cosmoflow_pytorch)
    _, other = curves_cosmoflow_pytorch[1]["c"]
    assert other != first, "another seed gave the same curve: the comparison cannot tell runs apart"
    # the kit's own max-pooling backward (what --deterministic runs on CUDA before torch 2.13)
    # trains the same curve as torch's, and the run logs which one ran
    assert config["model.max_pool"] == "native"        # auto on a CPU
    config, pooled = curves_cosmoflow_pytorch[1]["d"]
    assert config["model.max_pool"] == "deterministic" and pooled == first


def test_same_seed_same_curve_cosmoflow_tensorflow(curves_cosmoflow_tensorflow):
    _same_seed_same_curve(curves_cosmoflow_tensorflow)


def test_same_seed_same_curve_deepcam_pytorch(curves_deepcam_pytorch):
    _same_seed_same_curve(curves_deepcam_pytorch)


@pytest.fixture(scope="module")
def datasets(determinism_data):
    return determinism_data[1]


def test_off_by_default_and_logged(datasets, tmp_path):
    proc = run_hpckit("train", "cosmoflow", "--data", datasets / "cf", "--output-dir", tmp_path / "o",
                      "--framework", "pytorch", "--seed", 1, *CF, "--set", "train.n_epochs=1")
    assert proc.returncode in (0, 3), proc.stderr
    assert curve(tmp_path / "o")[0]["train.deterministic"] is False
