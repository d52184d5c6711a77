"""tests/stress/stress.py, the `make stress` harness: its report is what says a test never
failed by chance, so it must name a test that failed once, keep that repetition's output,
and record the load and the environment the repetitions ran under."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FLAKY = '''
from pathlib import Path

def test_steady():
    pass

def test_fails_the_first_time():
    mark = Path(__file__).with_name("ran-once")
    first = not mark.exists()
    mark.touch()
    assert not first, "the first repetition fails"
'''


def test_a_test_that_failed_once_is_reported(tmp_path):
    tests = tmp_path / "cases"
    tests.mkdir()
    (tests / "test_flaky.py").write_text(FLAKY)
    out = tmp_path / "report"
    env = {**os.environ, "HPCKIT_OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "stress" / "stress.py"), "--reps", "2",
                           "--load", "1", "--out", str(out), str(tests / "test_flaky.py")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  ")]   # the report's
    flaky = [line for line in lines if "test_fails_the_first_time" in line]
    steady = [line for line in lines if "test_steady" in line]
    assert len(flaky) == 1 and flaky[0].split()[0] == "FAILED" and "failures   1" in flaky[0] \
        and flaky[0].endswith("in rep-0001"), proc.stdout
    assert len(steady) == 1 and steady[0].split()[0] == "ok" and "runs   2, failures   0" in steady[0], proc.stdout
    assert "repetitions: 2" in proc.stdout and "load: [1] spinning processes" in proc.stdout, proc.stdout
    assert '"HPCKIT_OMP_NUM_THREADS": "1"' in proc.stdout, proc.stdout
    # the failing repetition's output is kept, the passing one's dropped
    assert "the first repetition fails" in (out / "rep-0001" / "output.txt").read_text()
    assert not (out / "rep-0002" / "output.txt").exists()
    meta = json.loads((out / "rep-0002" / "meta.json").read_text())
    assert meta["exit"] == 0 and meta["load"] == 1 and meta["env"]["HPCKIT_OMP_NUM_THREADS"] == "1", meta
    # a later invocation adds repetitions and reports over all of them
    again = subprocess.run([sys.executable, str(REPO / "tests" / "stress" / "stress.py"), "--reps", "1",
                            "--load", "0", "--out", str(out), str(tests / "test_flaky.py")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 1 and "repetitions: 3" in again.stdout and "load: [0, 1]" in again.stdout, again.stdout
    assert (out / "rep-0003" / "meta.json").is_file()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    """A count, a time or a directory that cannot be is refused before any repetition;
    a pytest that refuses its options or collects nothing stops at the first repetition
    (20 of them would report "0 failures" of nothing); a repetition record that is not one
    is named. Nothing starts a real repetition of the suite here."""
    tests = tmp_path / "cases"
    tests.mkdir()
    (tests / "test_one.py").write_text("def test_one():\n    pass\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    bad_record = tmp_path / "bad"
    (bad_record / "rep-0001").mkdir(parents=True)
    (bad_record / "rep-0001" / "meta.json").write_text('{"exit": "zero"}')
    one = str(tests / "test_one.py")
    cases = [(["--reps", "0", one], "argument --reps: 0 is outside 1 .. "),
             (["--reps", "x", one], "argument --reps: 'x' is not an integer"),
             (["--load", "-1", one], "argument --load: -1 is outside 0 .. "),
             (["--load", "1e999", one], "argument --load: '1e999' is not an integer"),
             (["--rep-timeout", "nan", one], "argument --rep-timeout: 'nan' is not a finite number"),
             (["--rep-timeout", "inf", one], "argument --rep-timeout: 'inf' is not a finite number"),
             (["--out", str(a_file), one], f"--out {a_file}: not a directory"),
             (["--out", str(tmp_path / "new")], "name the tests to repeat"),
             (["--report-only", "--out", str(tmp_path / "none")], f"{tmp_path / 'none'}: no such directory"),
             (["--report-only", "--out", str(bad_record)], f"{bad_record / 'rep-0001' / 'meta.json'}: "),
             (["--out", str(bad_record), one], f"{bad_record / 'rep-0001' / 'meta.json'}: "),
             (["--out", str(tmp_path / "opts"), "--no-such-pytest-option", one], "pytest refused its command line"),
             (["--out", str(tmp_path / "none-run"), one, "-k", "nothing_matches"], "pytest collected no test")]
    for args, says in cases:
        defaults = [*(["--reps", "3"] if "--reps" not in args else []),
                    *(["--load", "0"] if "--load" not in args else [])]
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "stress" / "stress.py"), *defaults, *args],
                              capture_output=True, text=True, timeout=120)
        err = proc.stderr
        assert proc.returncode == 2 and err.count("\n") == 1 and err.startswith("stress.py: error: ") \
            and says in err and "Traceback" not in err, (args, proc.stdout, err)
    assert a_file.read_text() == "mine"
    assert len(list((tmp_path / "opts").glob("rep-*"))) == 1       # stopped at the first
    assert len(list((tmp_path / "none-run").glob("rep-*"))) == 1
