"""The small tools' arguments (issue 48): an output the bench scripts cannot write is refused
before the measurement, and a make target's bad argument is one line.

bench/feed_rate.py checked only that --json's folder existed, measured for minutes and then
failed with a traceback on a read-only one; `make fuzz CASES=abc` printed argparse's usage,
its error and make's own line: five lines for one mistake. Now every bench output (--json
FILE, --out DIR) is proved writable first (benchlib.check_writable: a file made there and
removed), and the make targets' numbers are checked as make reads the Makefile (one line,
exit 2, nothing built or run); the scripts behind them (tests/fuzz.py, bench/mutation.py)
refuse a bad argument in one line of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import REPO

# script -> (option, arguments that would make it run: it must refuse before any of it)
OUTPUT_SCRIPTS = {
    "feed_rate.py": ("--json", ["--tiny", "--formats", "hdf5", "--readers", "1", "--rounds", "1", "--seconds", "0.1"]),
    "conv_efficiency.py": ("--json", ["--size", "small", "--precisions", "fp32", "--reps", "1"]),
    "mini_breakdown.py": ("--json", ["--cases", "deepcam:pytorch", "--epochs", "1"]),
    "side_by_side.py": ("--json", ["--size", "small", "--rounds", "1", "--steps", "1", "--warmup", "0"]),
    "cosmoflow_throughput.py": ("--json", ["--sizes", "mini", "--parts", "raw", "--formats", "tfrecord",
                                           "--samples", "2"]),
    "feed_diag.py": ("--out", ["--quick"]),
    "gpu_check.py": ("--out", ["--dry", "--parts", "step"]),
}


def run(argv, cwd=REPO, timeout=120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO / "apps"))
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def one_line(proc, *needles) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        (proc.returncode, proc.stderr[-2000:])
    assert not proc.stdout.strip(), f"refused after starting its work: {proc.stdout[-1000:]}"
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def read_only(tmp_path):
    """A folder this process cannot write: a read-only tmpfs for root (whom permission bits
    do not stop), a folder of mode 555 for anyone else."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
        return
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", f"hpckit-test-{uuid.uuid4().hex[:6]}",
                           str(where)], capture_output=True, text=True)
    if made.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a read-only tmpfs under CI: {made.stderr}")
        pytest.skip("mounting a read-only tmpfs failed")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("script", sorted(OUTPUT_SCRIPTS))
def test_a_bench_output_in_a_read_only_folder_is_refused_before_the_measurement(read_only, script):
    option, args = OUTPUT_SCRIPTS[script]
    target = read_only / ("figures.json" if option == "--json" else "out")
    line = one_line(run([sys.executable, REPO / "bench" / script, *args, option, target]), option, target)
    assert "Read-only file system" in line or "Permission denied" in line, line
    assert list(read_only.iterdir()) == []


def test_feed_rate_json_in_a_missing_folder_is_refused_before_the_measurement(tmp_path):
    option, args = OUTPUT_SCRIPTS["feed_rate.py"]
    target = tmp_path / "nope" / "f.json"
    one_line(run([sys.executable, REPO / "bench" / "feed_rate.py", *args, option, target]), option,
             tmp_path / "nope", "no such directory")
    assert list(tmp_path.iterdir()) == []


def test_a_bench_output_in_a_writable_folder_leaves_no_probe(tmp_path):
    """The probe file is removed again: the folder holds what the user had, nothing more."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import benchlib
    finally:
        sys.path.remove(str(REPO / "bench"))
    (tmp_path / "keep.txt").write_text("the user's\n")
    assert benchlib.output_path("x", "--json", str(tmp_path / "f.json")) == tmp_path / "f.json"
    benchlib.check_writable("x", "--out", tmp_path / "a" / "b", tmp_path / "a" / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


# ---- make targets' arguments ----------------------------------------------------------------

@pytest.mark.parametrize("argv,named", [
    (["fuzz", "CASES=abc"], "CASES=abc"), (["fuzz", "CASES=0"], "CASES=0"), (["fuzz", "CASES="], "CASES="),
    (["fuzz", "CASES=1 2"], "CASES=1 2"), (["fuzz", "CASES=-5"], "CASES=-5"), (["fuzz", "SEED=x"], "SEED=x"),
    (["fuzz", "CASES=12345678901"], "CASES=12345678901"), (["mutate", "CASES=1.5"], "CASES=1.5"),
    (["stress", "REPS=0"], "REPS=0"), (["stress", "LOAD=many"], "LOAD=many"),
    (["calibrate", "RUNS=x"], "RUNS=x"), (["calibrate", "FLOOR=0.2.1"], "FLOOR=0.2.1"),
    (["calibrate", "FLOOR=abc"], "FLOOR=abc")])
def test_a_make_targets_bad_argument_is_one_line(argv, named):
    """Refused as make reads the Makefile (-n: were it not, nothing would run either)."""
    one_line(run(["make", "-n", *argv]), named, "Stop.")


@pytest.mark.parametrize("argv", [["fuzz", "CASES=20000", "SEED=0"], ["mutate"], ["stress", "REPS=3", "LOAD=2"],
                                  ["calibrate", "FLOOR=0.10", "RUNS=3"], ["calibrate", "FLOOR=.5"]])
def test_a_make_targets_good_arguments_pass_the_check(argv):
    proc = run(["make", "-n", *argv])
    assert proc.returncode == 0 and "***" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,named", [
    (["--cases", "abc"], "--cases: 'abc' is not an integer"), (["--cases", "0"], "--cases: 0 is outside"),
    (["--seed", "1.5"], "--seed: '1.5'"), (["--first", "-1"], "--first: -1"), (["--timeout", "nan"], "--timeout"),
    (["--timeout", "0"], "--timeout"), (["--formats", "hdf5,csv"], "unknown 'csv'"),
    (["--keep", "README.md"], "--keep README.md: not a directory"),
    (["--work", "README.md"], "--work README.md: not a directory")])
def test_fuzz_bad_argument_is_one_line(args, named):
    one_line(run([sys.executable, REPO / "tests" / "fuzz.py", *args]), "tests/fuzz.py: error:", named)


def test_fuzz_keep_in_a_read_only_folder_is_one_line_before_the_corpus(read_only):
    one_line(run([sys.executable, REPO / "tests" / "fuzz.py", "--keep", read_only / "findings"]), "--keep",
             read_only / "findings")


@pytest.mark.parametrize("args,named", [(["--cases", "abc"], "--cases: 'abc'"), (["--cases", "0"], "--cases: 0"),
                                        (["--seed", "x"], "--seed: 'x'")])
def test_mutation_bad_argument_is_one_line(args, named):
    one_line(run([sys.executable, REPO / "bench" / "mutation.py", *args]), "bench/mutation.py: error:", named)
