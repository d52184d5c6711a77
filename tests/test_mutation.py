"""Property-based mutation test (issue 34), a few hundred cases of bench/mutation.py's
engine: real inputs (the five DeepCAM mini runs of the session, the published v1.0 NVIDIA
CosmoFlow set, the shipped convergence record, a perflog with this machine's stack, the
local profile's system.yaml), one file of each case damaged by a seeded mutation, one
command run on it (analyze, project, score, package, references calibrate; a few report
and check cases, seconds each), and every answer judged: exit 0 or 2 (1 where the verdict
allows), at most two stderr lines, no traceback, no hang, no input changed, no partial
output. `make mutate` runs thousands (bench/mutation.py, figures in bench/README.md)."""

from __future__ import annotations

import shutil
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import mutation  # noqa: E402

pytestmark = pytest.mark.slow   # `make test-all` (CI) only: thousands of damaged copies of real inputs through the results commands

CHEAP_CASES = 200           # fixed seeds: the same cases on every run
SLOW_CASES = {"report": 2, "check": 2}
SEED = 20261126


@pytest.fixture(scope="module")
def inputs(deepcam_runs, tmp_path_factory):
    return mutation.prepare(tmp_path_factory.mktemp("mutation"), deepcam_runs)


@pytest.fixture(scope="module")
def server():
    s = mutation.ForkServer()
    yield s
    s.close()


def test_the_undamaged_inputs_succeed(server, inputs, tmp_path):
    """The inputs are good: each command of the plan succeeds on them, so a mutation's
    failure is the mutation's."""
    pairs = [k for k in mutation.PLAN if k[0] not in SLOW_CASES] + [("report", "perflog"), ("check", "run-log")]
    assert mutation.baseline(server, inputs, tmp_path, pairs) == []


def test_mutated_real_inputs_never_break_the_promise(server, inputs, tmp_path):
    cheap = {k: w for k, w in mutation.PLAN.items() if k[0] not in SLOW_CASES}
    seeds = range(SEED, SEED + CHEAP_CASES)
    saved, mutation.PLAN = mutation.PLAN, cheap
    try:
        stats, violations = mutation.run_cases(server, inputs, tmp_path, seeds)
    finally:
        mutation.PLAN = saved
    seed = SEED + CHEAP_CASES
    for command, n in SLOW_CASES.items():
        s, v = mutation.run_cases(server, inputs, tmp_path, range(seed, seed + n), command=command)
        seed += n
        violations += v
        for k, c in s.items():
            stats[k].update(c)
    total = sum(c["cases"] for c in stats.values())
    print(f"mutations={total} violations={len(violations)}")
    assert total == CHEAP_CASES + sum(SLOW_CASES.values())
    # every command met damaged input it refused and damaged input it took in its stride
    codes = {k.split(" <- ")[0]: set() for k in stats}
    for k, c in stats.items():
        codes[k.split(" <- ")[0]] |= {int(x[3:]) for x in c if x.startswith("rc ")}
    assert all(2 in codes[c] for c in ("analyze", "project", "score", "package", "references")), codes
    assert not violations, "\n".join(mutation.describe(c, p, r, tmp_path) for c, p, r in violations)
    shutil.rmtree(tmp_path, ignore_errors=True)
