"""Adding a benchmark is a test of the architecture: apart from the one list of benchmark
packages (common/benchmark.py PACKAGES), nothing in common/, results/ or the CLI names a
benchmark package; what a shared piece needs of a benchmark comes from its descriptor.

In results/ a name may stand in a table of MLPerf HPC's own benchmarks (the rounds' list of
all four, CosmoFlow, DeepCAM, OpenCatalyst and OpenFold): that is a fact of the rules, not a
branch on a package. A table with only some of them is a list of packages, and found."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpckit.common.benchmark import PACKAGES, descriptors

APPS = Path(__file__).resolve().parents[1] / "apps" / "hpckit"
SHARED = sorted([*(APPS / "common").glob("*.py"), *(APPS / "results").glob("*.py"), APPS / "cli.py"])
MLPERF_HPC = {"cosmoflow", "deepcam", "oc20", "openfold"}   # MLPerf HPC's benchmarks (rounds v1.0-v3.0)


def named_packages(path: Path) -> list[str]:
    """Where `path` names a benchmark package: imports of hpckit.<package>, and string
    constants equal to a package name outside a table of all MLPerf benchmarks."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    tables: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            consts = [i.value for i in items if isinstance(i, ast.Constant)]
            if MLPERF_HPC <= set(consts) and path.parent.name == "results":
                tables.update(id(i) for i in items)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            names = []
        for name in names:
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "hpckit" and parts[1] in PACKAGES:
                found.append(f"{path.name}:{node.lineno} imports {name}")
        if isinstance(node, ast.Constant) and node.value in PACKAGES and id(node) not in tables:
            if path.name == "benchmark.py" and path.parent.name == "common":
                continue   # PACKAGES itself
            found.append(f"{path.name}:{node.lineno} names {node.value!r}")
    return found


@pytest.mark.parametrize("path", SHARED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shared_code_names_no_benchmark_package(path):
    assert named_packages(path) == []


def test_the_check_can_fail(tmp_path):
    """The scan finds an import, a branch on a name and a list of packages."""
    bad = tmp_path / "results" / "x.py"
    bad.parent.mkdir()
    bad.write_text("from hpckit.oc20.model import build_model\n"
                   "def f(b):\n    return b == 'deepcam'\n"
                   "KIT = ('cosmoflow', 'deepcam')\nMLPERF = ('cosmoflow', 'deepcam', 'oc20', 'openfold')\n"
                   "SOME = ('deepcam', 'oc20', 'openfold')\n")
    assert sorted(named_packages(bad)) == ["x.py:1 imports hpckit.oc20.model", "x.py:3 names 'deepcam'",
                                           "x.py:4 names 'cosmoflow'", "x.py:4 names 'deepcam'",
                                           "x.py:6 names 'deepcam'", "x.py:6 names 'oc20'", "x.py:6 names 'openfold'"]


def test_every_package_has_a_descriptor_with_what_shared_code_needs():
    found = descriptors()
    assert list(found) == list(PACKAGES) and {"oc20", "openfold"} <= set(PACKAGES)
    for name, d in found.items():
        assert d.name == name and d.metric in ("eval_error", "eval_accuracy") and d.official_target > 0
        assert callable(d.flops_sample), f"{name}: no flops_sample for common/flops.py"


def test_every_benchmark_runs_the_one_lifecycle():
    """The run's lifecycle (MLPerfRun's phases in order, the epochs' clocks, the verdict, the
    exit code) lives once, in common/lifecycle.py: a benchmark's train.py hands it a Parts
    subclass and neither makes an MLPerfRun nor drives its epochs itself."""
    for name in PACKAGES:
        path = APPS / name / "train.py"
        tree = ast.parse(path.read_text(), str(path))
        parts = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                 and any(isinstance(b, ast.Name) and b.id == "Parts" for b in n.bases)]
        assert len(parts) == 1, f"{name}: {parts}"
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "MLPerfRun" not in calls and "epochs" not in calls and "check_replicas" not in calls, name
        train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
        assert isinstance(train.body[-1], ast.Return) and "lifecycle.train" in ast.unparse(train.body[-1]), name
