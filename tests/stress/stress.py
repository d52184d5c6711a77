"""`make stress`: run tests again and again under a competing CPU load and report every test
that failed even once, with its output kept (issue 34: a test that fails by chance fails CI).

    python tests/stress/stress.py --reps 20 --load 2 --out build/stress/NAME -- TESTS...

Each repetition is a fresh `python -m pytest TESTS` (fresh session fixtures: clusters,
datasets, images), its junit XML and its output written to OUT/rep-NNNN/; the output of a
repetition where all passed is dropped, a failing one's is kept. Meanwhile LOAD processes
spin on the CPU at the tests' own priority (default: one per usable core; they die with
this script, however it ends). Repetitions accumulate in OUT across invocations, so a long
campaign runs in chunks (`make stress REPS=3 OUT=...` again and again); every invocation
ends with the report over all of OUT's repetitions: per test, runs, failures, the slowest
run (how close to a hang guard it came), the repetitions that failed, and the CPU flags.
Exit status 1 if any test failed in any repetition of OUT, else 0.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from hpckit.common.inputs import cli_float, cli_int

REPO = Path(__file__).resolve().parents[2]
SPIN = "while True:\n    pass\n"
# the environment that changes what the tests do, recorded with each repetition
RECORDED_ENV = ("CI", "HPCKIT_OMP_NUM_THREADS")


def _die_with_parent() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=_die_with_parent) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*|avx2)\b", text)))
    return " ".join(flags) or "none of avx2/avx512*"


def run_once(rep_dir: Path, tests: list[str], timeout_s: float) -> tuple[int, float]:
    rep_dir.mkdir(parents=True)
    start = time.monotonic()
    with open(rep_dir / "output.txt", "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-rfE", "-p", "no:cacheprovider",
                                   f"--junitxml={rep_dir / 'junit.xml'}"], cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            out.write(f"\nstress.py: the repetition ran past {timeout_s:.0f} s: killed\n")
            code = -1
    return code, time.monotonic() - start


def results(rep_dir: Path) -> dict[str, tuple[str, float]]:
    """test id -> (passed | failed | error | skipped, seconds) of one repetition."""
    try:
        root = ET.parse(rep_dir / "junit.xml").getroot()
    except (OSError, ET.ParseError):
        return {}
    out = {}
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        outcome = ("failed" if "failure" in kinds else "error" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        out[test] = (outcome, float(case.get("time") or 0))
    return out


class Refused(Exception):
    """Bad input: one line on stderr, exit 2."""


def _meta(rep_dir: Path) -> dict:
    path = rep_dir / "meta.json"
    try:
        meta = json.loads(path.read_text())
        if not (isinstance(meta, dict) and isinstance(meta.get("exit"), int)
                and isinstance(meta.get("seconds"), (int, float)) and "load" in meta and "cpus" in meta):
            raise ValueError("not a repetition record of this script")
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: {e}") from None
    return meta


def repetitions(out_dir: Path) -> tuple[list[Path], list[dict]]:
    """OUT's finished repetitions and their records (a repetition without one was cut short)."""
    if not out_dir.is_dir():
        raise Refused(f"{out_dir}: no such directory of repetitions")
    reps = sorted(d for d in out_dir.glob("rep-*") if (d / "meta.json").is_file())
    return reps, [_meta(d) for d in reps]


def report(out_dir: Path) -> int:
    reps, metas = repetitions(out_dir)
    per_test: dict[str, dict] = {}
    bad_reps = []
    wall = 0.0
    for d, meta in zip(reps, metas):
        wall += meta["seconds"]
        found = results(d)
        if meta["exit"] not in (0, 5) and not any(o in ("failed", "error") for o, _ in found.values()):
            found = {**found, "(the pytest session itself)": ("failed", meta["seconds"])}
        if any(o in ("failed", "error") for o, _ in found.values()):
            bad_reps.append(d.name)
        for test, (outcome, seconds) in found.items():
            t = per_test.setdefault(test, {"runs": 0, "failed": [], "skipped": 0, "max_s": 0.0})
            t["runs"] += 1
            t["skipped"] += outcome == "skipped"
            t["max_s"] = max(t["max_s"], seconds)
            if outcome in ("failed", "error"):
                t["failed"].append(d.name)
    print(f"\nstress report: {out_dir}")
    print(f"  repetitions: {len(reps)}, wall time {wall / 60:.1f} min, load: "
          f"{sorted({m['load'] for m in metas})} spinning processes on {sorted({m['cpus'] for m in metas})} usable CPUs")
    print(f"  tests: {' '.join(metas[-1]['tests']) if metas else '-'}")
    envs = sorted({json.dumps(m["env"], sort_keys=True) if "env" in m else "not recorded" for m in metas})
    print(f"  environment ({', '.join(RECORDED_ENV)}): {'; '.join(envs) if envs else '-'}")
    print(f"  CPU flags: {cpu_flags()}")
    width = max((len(t) for t in per_test), default=10)
    for test, t in sorted(per_test.items()):
        mark = "FAILED" if t["failed"] else "ok"
        skipped = f", skipped {t['skipped']}" if t["skipped"] else ""
        where = f"  in {', '.join(t['failed'])}" if t["failed"] else ""
        print(f"  {mark:6} {test:{width}}  runs {t['runs']:3}, failures {len(t['failed']):3}{skipped}, "
              f"slowest {t['max_s']:6.1f} s{where}")
    failed = sum(1 for t in per_test.values() if t["failed"])
    print(f"  {failed} test(s) failed at least once in {len(reps)} repetition(s)"
          + (f"; outputs kept in {', '.join(str(out_dir / r / 'output.txt') for r in bad_reps)}" if bad_reps else ""))
    return 1 if failed else 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(f"{message} (see --help)")


def main(argv=None) -> int:
    try:
        return _main(argv)
    except Refused as e:
        print(f"stress.py: error: {e}", file=sys.stderr)
        return 2


def _main(argv) -> int:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=cli_int(1, 10**6), default=20)
    ap.add_argument("--load", type=cli_int(0, 1024), default=None,
                    help="spinning processes (default: one per usable CPU)")
    ap.add_argument("--out", default=str(REPO / "build" / "stress" / "default"))
    ap.add_argument("--rep-timeout", type=cli_float(0, 1e7, low_open=True), default=3600, help="hang guard per repetition, seconds")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("tests", nargs="*", help="what to give pytest: test files or ids, and its options")
    args, pytest_options = ap.parse_known_args(argv)   # the rest is pytest's (-k, -m, ...)
    args.tests += pytest_options
    out_dir = Path(args.out)
    if args.report_only:
        return report(out_dir)
    if not args.tests:
        ap.error("name the tests to repeat")
    if out_dir.exists() and not out_dir.is_dir():
        raise Refused(f"--out {out_dir}: not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Refused(f"--out {out_dir}: {e.strerror or e}") from None
    repetitions(out_dir)   # what is there already is readable: refused now, not after hours
    cpus = len(os.sched_getaffinity(0))
    load = cpus if args.load is None else args.load
    numbers = [int(d.name.split("-")[1]) for d in out_dir.glob("rep-*")]
    first = max(numbers, default=0) + 1
    spinners = start_load(load)
    try:
        for i in range(first, first + args.reps):
            rep_dir = out_dir / f"rep-{i:04d}"
            code, seconds = run_once(rep_dir, args.tests, args.rep_timeout)
            found = results(rep_dir)
            bad = sorted(t for t, (o, _) in found.items() if o in ("failed", "error"))
            (rep_dir / "meta.json").write_text(json.dumps({"exit": code, "seconds": seconds, "load": load,
                                                           "cpus": cpus, "tests": args.tests,
                                                           "env": {k: os.environ.get(k) for k in RECORDED_ENV}}) + "\n")
            if code == 0 and not bad:
                (rep_dir / "output.txt").unlink()
            print(f"rep {i}: exit {code}, {seconds:.0f} s, {len(found)} tests"
                  + (f", FAILED: {', '.join(bad) or 'the session'}" if bad or code not in (0, 5) else ""), flush=True)
            if code in (4, 5) and not found:
                # pytest refused its command line or found no test: every repetition would
                # be the same, and a report of nothing run must not read as 0 failures
                why = "refused its command line" if code == 4 else "collected no test"
                raise Refused(f"pytest {why}: {' '.join(args.tests)} (its output: {rep_dir / 'output.txt'})")
    finally:
        stop_load(spinners)
    return report(out_dir)


if __name__ == "__main__":
    sys.exit(main())
