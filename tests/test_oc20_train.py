"""OC20 end to end through the CLI: the mini run converges and its log is COMPLIANT with the
mini ruleset, two ranks and a two-instance campaign converge, the sabotaged runs (forces
shuffled, learning rate 0) do not, a real-size sample goes through staging, loader, model
and optimizer for one step, and the ReFrame check FAILs a sabotaged run.

SLOW: every test here trains (one shared mini run, the others step-limited or a few epochs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import background
from conftest import REPO, background_fixture, reframe_build, remove_scratch, run_hpckit, scratch_build
from hpckit.common.config import load_config

pytestmark = pytest.mark.slow

ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
MINI = load_config("oc20", "mini")
TARGET = MINI["train"]["target_mae"]
SABOTAGE_EPOCHS = 6      # the mini run converges in 3-4 epochs (asserted below: at most this)
# the closed rules' keys (hpc 3.0.0 closed_oc20.yaml) and the common ones
CLOSED_OC20 = ("global_batch_size", "opt_name", "opt_base_learning_rate", "opt_learning_rate_warmup_steps",
               "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_steps",
               "opt_learning_rate_decay_factor", "number_of_nodes", "accelerators_per_node", "train_samples",
               "eval_samples", "seed", "submission_benchmark", "init_stop", "run_start", "run_stop")


def mllog(path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
            if ":::MLLOG " in line]


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed: .ci/run must install it")
        pytest.skip(f"{tool} is not installed")


@pytest.fixture(scope="module")
def oc20_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("oc20") / "data"
    run_hpckit("datagen", "oc20", "--config", "mini", "--out", out, "--seed", "3", check=True)
    return out


@pytest.fixture(scope="module")
def mini_run(oc20_data, tmp_path_factory):
    """The mini config, one rank, staged, deterministic: shared by the tests below."""
    tmp = tmp_path_factory.mktemp("oc20-run")
    out = tmp / "out"
    t0 = time.monotonic()
    proc = run_hpckit("train", "oc20", "--data", oc20_data, "--config", "mini", "--output-dir", out,
                      "--stage-dir", tmp / "stage", "--seed", "1", "--deterministic")
    print(f"oc20 mini run: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_mini_run_converges_and_is_compliant(mini_run):
    out, proc = mini_run
    s = json.loads((out / "summary.json").read_text())
    assert s["converged"] is True and s["status"] == "success" and s["metric"] == "eval_error"
    assert s["final_eval_error"] <= TARGET and s["epochs"] <= SABOTAGE_EPOCHS
    assert "hpckit train oc20: converged: eval_error" in proc.stdout
    events = mllog(out / "mlperf.log")
    keys = [e["key"] for e in events]
    for key in CLOSED_OC20:
        assert keys.count(key) == 1, key
    first = {e["key"]: e for e in reversed(events)}
    assert first["opt_name"]["value"] == "AdamW" and first["submission_benchmark"]["value"] == "oc20"
    assert first["opt_learning_rate_decay_boundary_steps"]["value"] == MINI["optimizer"]["lr_milestones"]
    # the reference's order: cache_clear before init_start; per epoch eval_error between
    # eval_stop and epoch_stop (mlperf_forces_trainer.py:532-537; LogStyle.metric_at "after_eval")
    assert keys.index("cache_clear") < keys.index("init_start") < keys.index("init_stop") < keys.index("run_start")
    errors = [e for e in events if e["key"] == "eval_error"]
    assert len(errors) == s["epochs"] == keys.count("epoch_start")
    assert [e["metadata"]["epoch_num"] for e in errors] == list(range(1, s["epochs"] + 1))
    assert errors[0]["value"] > errors[-1]["value"]
    assert keys.index("eval_stop") < keys.index("eval_error") < keys.index("epoch_stop")
    # staged as the node's records, one LMDB; the run's figures
    stop = first["staging_stop"]["metadata"]
    assert stop["staged"] is True and "one LMDB" in stop["written_as"] and stop["bytes"] > 0
    assert first["hpckit_config"]["value"]["train.deterministic"] is True
    assert s["usage"]["train_flops_per_sample"] > 1e7 and s["usage"]["peak_rss_bytes_max"] > 0
    assert s["provenance"]["packages"]["count"] > 0
    verdict = run_hpckit("check", out / "mlperf.log", "--ruleset", "mini")
    assert verdict.returncode == 0 and verdict.stdout.startswith("COMPLIANT"), verdict.stdout
    if s["final_eval_error"] > 0.036:    # the official target is 0.036: the official ruleset says so
        official = run_hpckit("check", out / "mlperf.log", "--ruleset", "hpc-3.0.0")
        assert official.returncode == 1 and "eval_error" in official.stdout, official.stdout


def train_args(data, out, *extra):
    return ["train", "oc20", "--data", str(data), "--config", "mini", "--output-dir", str(out), "--seed", "1", *extra]


def test_two_ranks_converge_like_one(oc20_data, tmp_path):
    """torchrun, 2 ranks of local batch 4: the 1-rank run's global batch of 8."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "--max-restarts", "0", "-m", "hpckit",
           *train_args(oc20_data, out, "--set", "data.batch_size=4", "--stage-dir", str(tmp_path / "stage"))]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["converged"] is True and (s["ranks"], s["dist"], s["launcher"]) == (2, "torch", "torchrun")
    assert s["replicas_in_sync"] is True and s["global_batch_size"] == 8
    assert run_hpckit("check", out / "mlperf.log", "--ruleset", "mini").returncode == 0


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_two_instance_campaign_converges(oc20_data, tmp_path):
    need("mpirun")
    out = tmp_path / "campaign"
    hpckit = [sys.executable, "-m", "hpckit", *train_args(oc20_data, out, "--instances", "2")]
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
           "-x", f"MASTER_PORT={_free_port()}", *hpckit]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for i in range(2):
        s = json.loads((out / f"instance_{i}" / "summary.json").read_text())
        assert s["converged"] is True and (s["instance"], s["instances"], s["ranks"]) == (i, 2, 1)
        assert s["seed"] == 1 + i
        assert run_hpckit("check", out / f"instance_{i}" / "mlperf.log", "--ruleset", "mini").returncode == 0


def _lr0(tmp):
    run_hpckit("datagen", "oc20", "--config", "mini", "--out", tmp / "data", "--seed", "3", check=True)
    with background.training():
        return tmp / "out", run_hpckit(*train_args(tmp / "data", tmp / "out", "--threads", "1", "--set",
                                                   "optimizer.lr=0", "--set", f"train.n_epochs={SABOTAGE_EPOCHS}"))


def _reframe_sabotaged(sabotage: str):
    overrides = f"train.n_epochs={SABOTAGE_EPOCHS}" + (",optimizer.lr=0" if sabotage == "lr-zero" else "")
    return reframe_build(f"rfm-oc20-{sabotage}", "site_profiles/local/settings.py", "-n", "OC20Check", "-r",
                         "-S", f"OC20Check.overrides={overrides}",
                         *(["-S", "OC20Data.shuffle_labels=true"] if sabotage == "shuffled-forces" else []), timeout=900)


# The sabotaged runs are background builds (tests/background.py): only their verdicts are
# asserted, never their times, so they run at nice 19, one thread each, on the cores the other
# tests leave idle; this file's tests run at the end of the session.
BACKGROUND = {"oc20_lr0_run": (scratch_build("oc20-lr0", _lr0), remove_scratch),
              "oc20_rfm_shuffled_forces": (_reframe_sabotaged("shuffled-forces"), remove_scratch),
              "oc20_rfm_lr_zero": (_reframe_sabotaged("lr-zero"), remove_scratch)}
oc20_lr0_run = background_fixture(BACKGROUND, "oc20_lr0_run")
oc20_rfm_shuffled_forces = background_fixture(BACKGROUND, "oc20_rfm_shuffled_forces")
oc20_rfm_lr_zero = background_fixture(BACKGROUND, "oc20_rfm_lr_zero")


def test_learning_rate_zero_does_not_converge(oc20_lr0_run):
    out, proc = oc20_lr0_run[1]
    assert proc.returncode == 3, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["converged"] is False and s["epochs"] == SABOTAGE_EPOCHS and s["final_eval_error"] > 3 * TARGET


def test_reference_size_sample_takes_one_step(tmp_path):
    """A reference-size structure (about 73 atoms, 50 neighbours each, the reference's
    DimeNet++) through datagen, staging, the loader, the model and AdamW: one step, then an
    evaluation of one structure; step-limited, so aborted and NOT COMPLIANT as it must be."""
    data, out = tmp_path / "data", tmp_path / "out"
    run_hpckit("datagen", "oc20", "--config", "reference", "--out", data, "--train", 2, "--valid", 1, "--seed", 5,
               check=True)
    proc = run_hpckit("train", "oc20", "--data", data, "--config", "reference", "--output-dir", out, "--seed", "1",
                      "--stage-dir", tmp_path / "stage", "--set", "data.n_train=2", "--set", "data.n_valid=1",
                      "--set", "data.batch_size=1", "--set", "data.eval_batch_size=1", "--set", "train.max_steps=1",
                      "--set", "data.loader_workers=0")
    assert proc.returncode == 3, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    events = mllog(out / "mlperf.log")
    assert s["status"] == "aborted" and s["epochs"] == 1
    assert "step-limited" in events[-1]["metadata"]["reason"] and events[-1]["key"] == "run_stop"
    assert [e["value"] for e in events if e["key"] == "opt_base_learning_rate"] == [0.0004]
    assert 2e10 < s["usage"]["train_flops_per_sample"] < 2e11          # tens of GFLOP per structure
    verdict = run_hpckit("check", out / "mlperf.log", "--ruleset", "hpc-3.0.0")
    assert verdict.returncode == 1 and verdict.stdout.startswith("NOT COMPLIANT"), verdict.stdout


def _reframe_fails(made) -> None:
    rc, out = made[1]
    assert rc != 0, out[-3000:]
    assert "not converged: final eval_error" in out and f"after {SABOTAGE_EPOCHS} epochs" in out, out[-3000:]
    assert "[  FAILED  ]" in out


def test_the_reframe_check_fails_a_run_with_shuffled_forces(oc20_rfm_shuffled_forces):
    _reframe_fails(oc20_rfm_shuffled_forces)


def test_the_reframe_check_fails_a_run_at_learning_rate_zero(oc20_rfm_lr_zero):
    _reframe_fails(oc20_rfm_lr_zero)


TINY = """base: mini
data: {n_train: 64, n_valid: 16}
optimizer: {warmup_steps: 4}
train: {n_epochs: 10, target_mae: 0.3}
"""


def test_a_package_with_an_oc20_set_passes_the_official_checker(oc20_data, tmp_path):
    """Five instances of a tiny config in one launch: a weak OC20 set, scored, reported and
    packaged; the official package checker and result summarizer pass the package."""
    need("mpirun")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out, pkg = tmp_path / "campaign", tmp_path / "pkg"
    hpckit = [sys.executable, "-m", "hpckit", "train", "oc20", "--data", str(oc20_data), "--config", str(config),
              "--output-dir", str(out), "--seed", "11", "--instances", "5", "--threads", "1"]
    cmd = ["mpirun", "-np", "5", "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
           "-x", f"MASTER_PORT={_free_port()}", *hpckit]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    runs = [out / f"instance_{i}" for i in range(5)]
    packed = run_hpckit("package", "--site", "local", "--org", "hpckit", *runs, "--out", pkg,
                        "--check", "mini", "--config", config)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    weak = pkg / "hpckit" / "results" / "local_cpu" / "weak" / "oc20"
    assert sorted(p.name for p in weak.iterdir()) == [f"result_{i}.txt" for i in range(5)]
    assert "PACKAGE OK" in packed.stdout and "SUMMARY OK" in packed.stdout
    report = run_hpckit("report", out, "--out", tmp_path / "report")
    assert report.returncode == 0, report.stdout + report.stderr
    (shown,) = json.loads((tmp_path / "report" / "scores.json").read_text())["site"]["sets"]
    assert shown["benchmark"] == "oc20" and shown["scaling"] == "weak"


def test_bf16_trains(oc20_data, tmp_path):
    """train.precision bf16 (autocast: the linear layers in bf16, weights, loss and forces
    MAE in fp32), step-limited; refused in one line where the CPU has no bf16."""
    from hpckit.common.precision import cpu_has_bf16
    out = tmp_path / "out"
    proc = run_hpckit(*train_args(oc20_data, out, "--set", "train.precision=bf16", "--set", "train.max_steps=8"))
    if not cpu_has_bf16():
        assert proc.returncode == 2 and "train.precision" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 3, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "aborted" and 0 < s["final_eval_error"] < 10
    assert "step-limited" in mllog(out / "mlperf.log")[-1]["metadata"]["reason"]
    (config,) = [e["value"] for e in mllog(out / "mlperf.log") if e["key"] == "hpckit_config"]
    assert config["train.precision"] == "bf16"


def test_fp16_overflow_is_skipped_not_fatal(oc20_data, tmp_path):
    """train.precision fp16: GradScaler's first scale (2^16) overflows the gradients; the step
    is skipped and the scale halved, as the reference's --amp does, not a diverged run (it
    stopped at step 1 before); refused in one line where the CPU's fp16 would be emulated."""
    out = tmp_path / "out"
    proc = run_hpckit(*train_args(oc20_data, out, "--set", "train.precision=fp16", "--set", "train.max_steps=8"))
    if proc.returncode == 2:
        assert "train.precision" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
        return
    assert proc.returncode == 3, proc.stderr[-3000:]
    reason = mllog(out / "mlperf.log")[-1]["metadata"]["reason"]
    assert "step-limited" in reason, reason
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "aborted" and 0 < s["final_eval_error"] < 10


def test_analyze_and_project_take_an_oc20_run(mini_run, tmp_path):
    """The convergence record holds the 13 published OC20 sets (v1.0-v3.0); a kit run is
    taken apart and projected to the official dataset from it."""
    out, _ = mini_run
    proc = run_hpckit("project", "--benchmark", "oc20", "--units", 512, "--local-batch", 4, "--from", out, check=True)
    assert "oc20 official/2000000" in proc.stdout and "13 sets of 7 submitters" in proc.stdout, proc.stdout
    analyzed = run_hpckit("analyze", out, "--json", tmp_path / "a.json", check=True)
    (run,) = json.loads((tmp_path / "a.json").read_text())["runs"]
    assert run["benchmark"] == "oc20" and run["converged"] is True, analyzed.stdout
