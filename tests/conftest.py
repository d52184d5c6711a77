"""Shared test fixtures: the kit's CLI as a subprocess, and one mini dataset per session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import background

REPO = Path(__file__).resolve().parents[1]

# For the many tiny trainings of the bad-input tests: glibc's allocator. With tcmalloc
# installed, `--allocator auto` restarts the command with it preloaded, a second interpreter
# importing torch per case (in the battery it undid the fork server: 493 s -> 192 s without).
# The restart's own bad input is tested in test_cores.py.
NO_ALLOCATOR_RESTART = ("--allocator", "glibc")


@pytest.hookimpl(trylast=True)   # after -k/-m deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    """Start the slow preparations of the selected tests in the background (tests/background.py)
    and run their modules last, so that the builds overlap the rest of the suite."""
    if config.option.collectonly:
        return
    late = []
    for item in items:
        jobs = {**BACKGROUND, **getattr(item.module, "BACKGROUND", {})}
        for name in item.fixturenames:
            if name in jobs:
                background.start(name, *jobs[name])
                if item.module not in late:
                    late.append(item.module)
    items.sort(key=lambda item: late.index(item.module) + 1 if item.module in late else 0)


def pytest_sessionfinish(session, exitstatus):
    background.release_all()


def run_hpckit(*args, timeout=600, env=None, check=False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = background.guarded([sys.executable, "-m", "hpckit", *args], timeout, env=full_env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpckit {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def one_line(proc, *needles) -> str:
    """A command's bad-input outcome: exit 2 and one stderr line, no traceback, holding each needle."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        (proc.returncode, proc.stderr[-3000:])
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def _make_deepcam_runs() -> tuple[Path, list[Path]]:
    from mini_runs import deepcam_mini_runs
    cache = os.environ.get("HPCKIT_TEST_RUNS_CACHE")
    root = Path(cache) if cache else Path(tempfile.mkdtemp(prefix="hpckit-mini-runs-"))
    return root, deepcam_mini_runs(root)


def _remove_deepcam_runs(made: tuple[Path, list[Path]]) -> None:
    if not os.environ.get("HPCKIT_TEST_RUNS_CACHE"):
        shutil.rmtree(made[0], ignore_errors=True)


def scratch_build(prefix: str, body: Callable[[Path], Any]) -> Callable[[], tuple[Path, Any]]:
    """A background build that runs body(dir) in a directory of its own (a build has no
    tmp_path) and returns (dir, what body returned); `remove_scratch` is its release."""
    def build() -> tuple[Path, Any]:
        tmp = Path(tempfile.mkdtemp(prefix=f"hpckit-{prefix}-"))
        return tmp, body(tmp)
    return build


def remove_scratch(made: tuple[Path, Any]) -> None:
    shutil.rmtree(made[0], ignore_errors=True)


def reframe_build(prefix: str, settings: str, *args, timeout: float) -> Callable[[], tuple[Path, Any]]:
    """A background build of a ReFrame run whose test asserts its verdict, never its times
    (the sabotaged runs): in a training slot, one thread per training (the profiles pass
    HPCKIT_OMP_NUM_THREADS on), as a niced training uses an idle core and must not wait at every
    barrier for a second one. Its value: (its directory, (exit code, output))."""
    def body(tmp: Path) -> tuple[int, str]:
        with background.training():
            return run_reframe(tmp, settings, *args, timeout=timeout, env={"HPCKIT_OMP_NUM_THREADS": "1"})
    return scratch_build(prefix, body)


def background_fixture(jobs: dict, name: str, scope: str = "module"):
    """The fixture `name` of a module's background build jobs[name] (tests/background.py):
    its result, released after the last test that uses it. Assign it to a module attribute."""
    @pytest.fixture(scope=scope, name=name)
    def fixture():
        yield background.result(name, *jobs[name])
        background.release(name)
    return fixture




@pytest.fixture(scope="session")
def deepcam_runs() -> list[Path]:
    """The five DeepCAM mini runs of tests/mini_runs.py (seeds 1-5), made in the background."""
    return background.result("deepcam_runs", *BACKGROUND["deepcam_runs"])[1]


@pytest.fixture(scope="session")
def mini_data(tmp_path_factory) -> Path:
    """The mini config's dataset in the public TFRecord format (generated once)."""
    out = tmp_path_factory.mktemp("cosmoflow") / "data"
    run_hpckit("datagen", "cosmoflow", "--config", "mini", "--out", out, "--seed", "7", check=True)
    return out


def rank_pid(out: Path, rank_var: str, rank: int) -> int | None:
    """PID of the hpckit process writing into `out` whose launcher set `rank_var`=`rank`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"hpckit" not in cmdline or str(out).encode() not in cmdline:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{rank_var}={rank}".encode() in env:
            return int(proc.name)
    return None


def kill_rank_mid_training(proc: subprocess.Popen, out: Path, rank_var: str, rank: int = 1) -> tuple[float, str]:
    """Wait until the launched training logs its first epoch_start, SIGKILL the process of
    `rank`, and return (seconds from the kill until the launcher exited, its output)."""
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            log = out / "mlperf.log"
            if log.exists() and '"epoch_start"' in log.read_text():
                break
            if proc.poll() is not None:
                pytest.fail(f"training ended before it could be killed: {proc.stdout.read()[-3000:]}")
            time.sleep(0.5)
        time.sleep(2)
        victim = rank_pid(out, rank_var, rank)
        assert victim is not None, f"rank {rank} not found"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = proc.communicate(timeout=120)
        return time.monotonic() - killed_at, output
    finally:
        if proc.poll() is None:
            proc.kill()


# the published MLPerf HPC result logs (../shared/real_logs beside the repository, as the
# workspace and CI lay it out); a clone elsewhere has none, and the tests that read them skip
REAL_LOGS = REPO.parent / "shared" / "real_logs"
PUBLISHED_V2 = REAL_LOGS / "v2.0"
NVIDIA_V10_COSMOFLOW = "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet__cosmoflow__result_1.txt"


def real_log(name: str) -> Path:
    """REAL_LOGS/name; the calling test is skipped, saying so, where it is not there."""
    path = REAL_LOGS / name
    if not path.exists():
        pytest.skip(f"published log {path} not present (../shared/real_logs beside the repository)")
    return path
# the events whose order the MLPerf HPC rules and both references fix; compared in the
# order of their first occurrence, on the keys the kit's log and the published one share
ORDERED_KEYS = ("cache_clear", "init_start", "seed", "number_of_ranks", "number_of_nodes", "accelerators_per_node",
                "init_stop", "run_start", "staging_start", "staging_stop", "epoch_start", "learning_rate",
                "train_accuracy", "train_loss", "throughput", "eval_start", "eval_error", "eval_accuracy",
                "eval_loss", "eval_stop", "epoch_stop", "target_accuracy_reached", "run_stop")


def first_keys(text: str) -> list[str]:
    import json
    keys = []
    for line in text.splitlines():
        if ":::MLLOG " in line:
            key = json.loads(line.split(":::MLLOG ", 1)[1])["key"]
            if key not in keys:
                keys.append(key)
    return keys


def assert_published_event_order(kit_log: Path, published: Path, known_missing: dict[str, str]) -> None:
    """The kit's log has the published log's event order (ORDERED_KEYS they share), and
    every key the published log has is in the kit's or in known_missing (key -> why)."""
    if not published.is_file():
        pytest.skip(f"published log {published} not present")
    kit, pub = first_keys(kit_log.read_text()), first_keys(published.read_text())
    shared = [k for k in ORDERED_KEYS if k in kit and k in pub]
    assert [k for k in kit if k in shared] == [k for k in pub if k in shared]
    missing = [k for k in pub if k not in kit and k not in known_missing]
    assert not missing, f"keys of {published.name} the kit does not log: {missing}"


def run_reframe(tmp_path: Path, settings: str, *args, timeout=120, env=None, wrapper=()) -> tuple[int, str]:
    """ReFrame from the repository root, everything it writes under tmp_path (in a background
    build: niced, its jobs' autogroups too, and its hang guard not counting starved time)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RFM_")}
    full_env.update(HOME=str(tmp_path / "home"), RFM_PREFIX=str(tmp_path / "rfm"),
                    RFM_REPORT_FILE=str(tmp_path / "report.json"), RFM_COLORIZE="n", TMPDIR=str(tmp_path))
    full_env.update(env or {})
    (tmp_path / "home").mkdir(parents=True, exist_ok=True)
    reframe = Path(sys.executable).parent / "reframe"
    proc = background.guarded([*wrapper, reframe, "-C", settings, "-c", "reframe_checks/", *args], timeout,
                              cwd=REPO, env=full_env)
    return proc.returncode, proc.stdout + proc.stderr


# this file's background builds (tests/background.py); a test module may add its own.
# full_run: `make run`, every check of the local profile once, on a machine with no references
# of its own, shared by the ReFrame and report tests (one session, one run). Its tests assert
# verdicts, logs and that each figure is the run's own, never a time, so it runs in the
# background as the sabotaged runs do (one thread per training, in a training slot): in
# `make test` it takes the core the unit tests leave idle (it had run alone for 7 minutes of the
# 19 on a 2-core AVX2 machine). The timing verdict that calibrates on this machine
# (test_reframe_checks' half-the-cores test) makes its own foreground run.
BACKGROUND = {"deepcam_runs": (_make_deepcam_runs, _remove_deepcam_runs),
              "full_run": (reframe_build("full-run", "site_profiles/local/settings.py", "-r", timeout=3600),
                           remove_scratch)}


@pytest.fixture(scope="session")
def full_run():
    """(its directory, ReFrame's exit code, its output) of the session's `make run`."""
    tmp_path, (rc, out) = background.result("full_run", *BACKGROUND["full_run"])
    yield tmp_path, rc, out
    background.release("full_run")
