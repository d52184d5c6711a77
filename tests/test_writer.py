"""The one writer (hpckit.common.fileio, issue 34): every output option of every command,
read from the parser itself, refuses a file the kit did not make; a missing directory or a
directory given as a file is one line; reports and packages appear whole or not at all;
and no other open-for-write of a user-named path exists in apps/ (an AST scan).

The commands run through tests/forkserver.py (bench/mutation.py's client): hpckit.cli.main
in a forked child, exactly what `python -m hpckit` runs."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_score import write_log

sys.path.insert(0, str(REPO / "bench"))
from mutation import ForkServer, snapshot  # noqa: E402

from hpckit.cli import build_parser  # noqa: E402
from hpckit.common import fileio  # noqa: E402
from hpckit.common.errors import KitError  # noqa: E402

# names and words that say an option names something the command writes
OUTPUT_DESTS = {"out", "json", "record", "output_dir"}
# options with such a name that name an input, and why
INPUTS = {"project --record": "the convergence record it reads (`analyze --record` writes one)"}


def _subcommands(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subcommands(sub, prefix + (name,))


def output_options() -> dict[str, argparse.Action]:
    """'command --option' -> action, for every option of every (sub)command that names an
    output: marked by its type (fileio.output_file / output_dir), or looking like one
    (its name, or a help text that says it writes a FILE or DIR)."""
    found = {}
    for path, sub in _subcommands(build_parser()):
        for action in sub._actions:
            if not action.option_strings:
                continue
            marked = getattr(action.type, "output", None)
            looks = action.dest in OUTPUT_DESTS or (
                action.metavar in ("FILE", "DIR") and "write" in (action.help or "").lower())
            name = f"{' '.join(path)} {action.option_strings[-1]}"
            if (marked or looks) and name not in INPUTS:
                found[name] = action
    return found


OPTIONS = output_options()


def test_every_output_option_is_marked_and_has_a_refusal_case():
    """A new output option cannot be forgotten: it is marked by its argparse type (so the
    parser refuses before any work) and this module must hold a case proving it refuses."""
    unmarked = [name for name, a in OPTIONS.items() if getattr(a.type, "output", None) is None]
    assert not unmarked, f"output options without fileio.output_file/output_dir as their type: {unmarked}"
    assert set(OPTIONS) == set(REFUSALS), (f"options without a refusal case: {set(OPTIONS) - set(REFUSALS)}; "
                                           f"cases of no option: {set(REFUSALS) - set(OPTIONS)}")
    assert len(OPTIONS) >= 10


# ---- each option refuses what the kit did not make --------------------------------------------

def _logs(d: Path, n=3, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_log(d / f"result_{i}.txt", minutes=10.0 + i, start=10_000_000 * (i + 1), **kw)
    return d


def _run_dir(d: Path) -> Path:
    d.mkdir(parents=True)
    write_log(d / "mlperf.log", nodes=1)
    (d / "summary.json").write_text('{"status": "success", "note": "the run\'s own summary"}\n')
    return d


def _score(t):
    logs = _logs(t / "logs")
    return ["score", logs, "--scaling", "strong", "--json", logs / "result_0.txt"], logs / "result_0.txt"


def _analyze_json(t):
    logs = _logs(t / "logs")
    return ["analyze", logs, "--json", logs / "result_1.txt"], logs / "result_1.txt"


def _analyze_record(t):
    """issue 34: --record over one of the published logs being analysed"""
    pub = _logs(t / "pub")
    return ["analyze", "--published", pub, "--record", pub / "result_0.txt"], pub / "result_0.txt"


def _project(t):
    """issue 34: --json over a run's own summary.json"""
    run = _run_dir(t / "run")
    return (["project", "--benchmark", "cosmoflow", "--units", "4", "--local-batch", "2", "--from", run,
             "--json", run / "summary.json"], run / "summary.json")


def _references(t):
    perf = t / "perflogs"
    perf.mkdir()
    mine = t / "references.yaml"
    mine.write_text("# the site's own references\nCosmoFlowCheck: {}\n")
    return ["references", "calibrate", "--perflog", perf, "--out", mine, "--replace"], mine


def _report(t):
    logs = _logs(t / "logs", nodes=1)
    out = t / "rep"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    return ["report", logs, "--out", out], out / "notes.txt"


def _package(t):
    logs = _logs(t / "logs", nodes=1)
    res = t / "pkg" / "Org" / "results" / "local_cpu" / "strong" / "cosmoflow"
    res.mkdir(parents=True)
    (res / "result_0.txt").write_text("a result the kit did not put here\n")
    return ["package", logs, "--site", "local", "--org", "Org", "--out", t / "pkg"], res / "result_0.txt"


def _containers(t):
    mine = t / "c" / "local" / "Dockerfile"
    mine.parent.mkdir(parents=True)
    mine.write_text("FROM scratch  # the site's own\n")
    return ["containers", "generate", "--target", "local", "--out", t / "c"], mine


def _train(t):
    out = t / "out"
    out.mkdir()
    write_log(out / "mlperf.log")
    return (["train", "cosmoflow", "--data", t, "--output-dir", out, "--framework", "pytorch",
             "--allocator", "glibc"], out / "mlperf.log")


def _datagen(t):
    out = t / "data"
    out.mkdir()
    (out / "README").write_text("a dataset's own file\n")
    return ["datagen", "cosmoflow", "--out", out, "--train", "2", "--valid", "2", "--size", "8"], out / "README"


REFUSALS = {"score --json": _score, "analyze --json": _analyze_json, "analyze --record": _analyze_record,
            "project --json": _project, "references calibrate --out": _references, "report --out": _report,
            "package --out": _package, "containers generate --out": _containers,
            "train --output-dir": _train, "datagen --out": _datagen}


@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    yield s
    s.close()


def _one_line(res: dict) -> str:
    assert "Traceback" not in res["stderr"] + res["stdout"] and not res["hang"], res
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    assert res["rc"] == 2 and len(lines) == 1, res
    return lines[0]


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_an_output_option_never_replaces_a_file_the_kit_did_not_make(name, server, tmp_path):
    argv, protected = REFUSALS[name](tmp_path)
    before = snapshot(tmp_path, tmp_path / "none")
    line = _one_line(server.run(argv, cwd=tmp_path))
    option = name.split()[-1]
    assert option in line or str(protected) in line, line
    assert str(protected.parent) in line, line          # the path it refused is named
    after = snapshot(tmp_path, tmp_path / "none")
    # nothing changed; nothing written but train's empty run lock (test_data_safety.py)
    assert {p: h for p, h in after.items() if not p.endswith("/.hpckit.lock")} == before


FILE_OPTIONS = sorted(n for n, a in OPTIONS.items() if getattr(a.type, "output", None) == "file")


@pytest.mark.parametrize("name", FILE_OPTIONS)
def test_a_missing_directory_or_a_directory_is_one_line(name, server, tmp_path):
    argv, protected = REFUSALS[name](tmp_path)
    i = argv.index(name.split()[-1]) + 1
    for target, needle in ((tmp_path / "nowhere" / "x.json", "no such directory"),
                           (tmp_path, "is a directory")):
        argv[i] = target
        line = _one_line(server.run([a for a in argv if a != "--replace"], cwd=tmp_path))
        assert needle in line and str(target) in line and name.split()[-1] in line, line
    assert not (tmp_path / "nowhere").exists()


def test_two_outputs_of_one_command_never_share_a_file(server, tmp_path):
    """The writer lets a command write again a file it wrote: two of its options naming one
    path would have the second replace the first. Refused in one line, nothing written."""
    pub = _logs(tmp_path / "pub")
    line = _one_line(server.run(["analyze", "--published", pub, "--json", tmp_path / "x.json", "--record",
                                 tmp_path / "x.json"], cwd=tmp_path))
    assert "--json and --record" in line and "x.json" in line, line
    assert not (tmp_path / "x.json").exists()


def test_the_writer_itself(tmp_path):
    """What the option types check at parse time, the writer checks again when it puts the
    file in place: a file this command wrote may be written again, nothing else; a marker
    lets a command replace only its own kind of file; a link is never followed."""
    fileio.begin_command()
    p = tmp_path / "a.json"
    fileio.atomic_write_json(p, {"x": 1}, "--json")
    fileio.atomic_write_json(p, {"x": 2}, "--json")           # this command wrote it
    assert json.loads(p.read_text()) == {"x": 2}
    fileio.begin_command()                                     # the next command did not
    with pytest.raises(KitError, match="--json .*a.json: exists"):
        fileio.atomic_write_json(p, {"x": 3}, "--json")
    assert json.loads(p.read_text()) == {"x": 2}
    kit = tmp_path / "kit.txt"
    kit.write_text("# made by: the kit\nold\n")
    fileio.atomic_write_text(kit, "# made by: the kit\nnew\n", "--out", replaces=b"# made by:")
    other = tmp_path / "other.txt"
    other.write_text("someone's\n")
    with pytest.raises(KitError, match="exists"):
        fileio.atomic_write_text(other, "# made by: the kit\n", "--out", replaces=b"# made by:")
    link = tmp_path / "link.json"
    link.symlink_to(kit)
    with pytest.raises(KitError, match="symbolic link"):
        fileio.atomic_write_text(link, "# made by: the kit\n", "--out", replaces=b"# made by:")
    assert kit.read_text() == "# made by: the kit\nnew\n" and other.read_text() == "someone's\n"
    # a file that appears while the output is written is not replaced (checked again, and link(2) refuses)
    late = tmp_path / "late.json"
    with pytest.raises(KitError, match="late.json: (exists|appeared while)"):
        with fileio.atomic_path(late, option="--json") as tmp:
            Path(tmp).write_text("mine\n")
            late.write_text("theirs\n")
    assert late.read_text() == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "kit.txt", "late.json", "link.json", "other.txt"]


def test_a_report_failing_part_way_leaves_nothing(server, tmp_path):
    """The report draws its figures, then reads each site run's provenance for its table: a
    log whose hpckit_provenance block has another shape than the kit writes fails it there,
    after the PNGs. The report is built beside --out and renamed: nothing is left, neither
    --out nor the staging directory."""
    logs = _logs(tmp_path / "logs", nodes=1)
    with open(logs / "result_0.txt", "a") as f:
        f.write(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": '
                '"hpckit_provenance", "value": {"kit": "not an object"}, "metadata": {}}\n')
    before = snapshot(tmp_path, tmp_path / "none")
    line = _one_line(server.run(["report", logs, "--out", tmp_path / "rep"], cwd=tmp_path))
    assert "result_0.txt" in line and "hpckit_provenance.kit" in line, line
    assert snapshot(tmp_path, tmp_path / "none") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


def test_a_package_never_rewrites_an_earlier_one(server, tmp_path):
    """A second system packaged into the same --out and org with the same kit lands beside
    the first: the implementation's README.md is the same bytes, and what its runs recorded
    goes into README_<system>_<scaling>.md and provenance_<system>_<scaling>.json of its own
    (the first package's files, once replaced and then refused, are left byte for byte). A
    file of the earlier package changed since is never rewritten: one line naming it,
    nothing of the new package written."""
    a = _logs(tmp_path / "a", nodes=1)
    res = server.run(["package", a, "--site", "local", "--org", "Org", "--out", tmp_path / "pkg"], cwd=tmp_path)
    assert res["rc"] == 0, res
    first = snapshot(tmp_path / "pkg", tmp_path / "none")
    b = _logs(tmp_path / "b", nodes=1)
    res = server.run(["package", b, "--site", "local", "--org", "Org", "--system", "second", "--out",
                      tmp_path / "pkg"], cwd=tmp_path)
    assert res["rc"] == 0, res
    both = snapshot(tmp_path / "pkg", tmp_path / "none")
    assert {k: v for k, v in both.items() if k in first} == first          # the first package untouched
    org = tmp_path / "pkg" / "Org"
    impl = next((org / "benchmarks" / "cosmoflow" / "implementations").iterdir())
    assert sorted(p.name for p in impl.iterdir()) == [
        "README.md", "README_local_cpu_strong.md", "README_second_strong.md",
        "provenance_local_cpu_strong.json", "provenance_second_strong.json"]
    assert sorted(json.loads((impl / "provenance_second_strong.json").read_text())) == [
        f"results/second/strong/cosmoflow/result_{i}.txt" for i in range(3)]
    assert (org / "results" / "second" / "strong" / "cosmoflow" / "result_2.txt").read_bytes() == \
        (b / "result_2.txt").read_bytes()
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["Org"]        # no staging left

    # the same system's weak-scaling set: its own folder and files, nothing rewritten
    w = tmp_path / "w"
    w.mkdir()
    for i in range(3):
        write_log(w / f"result_{i}.txt", minutes=10.0 + i, start=10_000_000 * (i + 1), nodes=1, instance=i)
    res = server.run(["package", w, "--site", "local", "--org", "Org", "--system", "second", "--out",
                      tmp_path / "pkg"], cwd=tmp_path)
    assert res["rc"] == 0, res
    assert (impl / "provenance_second_weak.json").is_file() and (impl / "README_second_weak.md").is_file()
    three = snapshot(tmp_path / "pkg", tmp_path / "none")
    assert {k: v for k, v in three.items() if k in both} == both

    # an earlier package's file changed by hand: refused, named, nothing written
    readme = impl / "README.md"
    readme.write_text(readme.read_text() + "edited by hand\n")
    edited = snapshot(tmp_path / "pkg", tmp_path / "none")
    c = _logs(tmp_path / "c", nodes=1)
    line = _one_line(server.run(["package", c, "--site", "local", "--org", "Org", "--system", "third", "--out",
                                 tmp_path / "pkg"], cwd=tmp_path))
    assert str(readme) in line and "never rewrites" in line, line
    assert snapshot(tmp_path / "pkg", tmp_path / "none") == edited
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["Org"]


# ---- no other writer --------------------------------------------------------------------------

# Every call that can create or change a file, found in apps/ by walking the syntax trees.
WRITE_CALLS = {"write_text", "write_bytes", "savefig", "to_csv", "to_hdf", "dump", "copy", "copy2", "copyfile",
               "copytree", "copyfileobj", "move", "replace", "rename", "renames", "link", "symlink", "mkstemp",
               "NamedTemporaryFile", "TFRecordWriter", "save", "savez", "savez_compressed", "tofile", "truncate",
               "fdopen", "File", "touch"}
# (file, function, call) -> why it is not a user-named output. Anything else fails the test.
ALLOWED = {
    ("apps/hpckit/common/fileio.py", "*", "*"): "the writer itself",
    ("apps/hpckit/cli.py", "main", "os.open"): "stdout redirected to /dev/null after a reader left (SIGPIPE)",
    ("apps/hpckit/common/mllog.py", "__init__", "os.open"):
        "the run's mlperf.log, in the directory claim_output_dir claimed (it refuses one holding a log)",
    ("apps/hpckit/common/native_log.py", "divert_native_stderr", "os.open"):
        "TensorFlow's native stderr appended to the run's own tensorflow-native.log",
    ("apps/hpckit/common/native_log.py", "divert_native_stderr", "os.fdopen"): "the same descriptor",
    ("apps/hpckit/common/run.py", "claim_output_dir", "os.open"): "the run directory's lock file (no content)",
    ("apps/hpckit/common/staging.py", "copy_files", "os.open"):
        "staged copies into the new hpckit-stage-* directory the run created, exclusive create (O_EXCL)",
    ("apps/hpckit/cosmoflow/data.py", "_save_npy", "os.open"): "decoded staging into the run's new stage directory, "
                                                                "exclusive create (O_EXCL)",
    ("apps/hpckit/cosmoflow/data.py", "_save_npy", "os.fdopen"): "the same descriptor",
    ("apps/hpckit/cosmoflow/synthetic.py", "_save_npy_atomic", "np.save"): "into an in-memory buffer",
    ("apps/hpckit/deepcam/synthetic.py", "write_h5_atomic", "h5py.File"): "the temporary path of fileio.atomic_path",
    ("apps/hpckit/results/report.py", "_save", "fig.savefig"): "the temporary path of fileio.atomic_path",
    ("apps/hpckit/results/checkers.py", "mini_library", "*"): "a private temporary directory",
    ("apps/hpckit/common/compliance.py", "generate_mini_rules", "*"): "a private temporary directory",
    ("apps/hpckit/results/score.py", "_rcp_factor", "shutil.copyfile"): "a private temporary directory",
}


def _mode(call: ast.Call) -> str | None:
    for a in call.args[1:2]:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            return a.value
    for k in call.keywords:
        if k.arg == "mode" and isinstance(k.value, ast.Constant):
            return str(k.value.value)
    return None


def write_calls(root: Path):
    """(file, enclosing function, call) of every call in `root` that can write a file."""
    for py in sorted(root.rglob("*.py")):
        tree = ast.parse(py.read_text())
        owner = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    owner[id(sub)] = node.name          # the innermost function wins (walked last)
        rel = py.relative_to(REPO).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            base = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            call = f"{base}.{name}" if base else name
            if name == "open" and not base:
                mode = _mode(node)
                if not mode or not any(c in mode for c in "wax+"):
                    continue
            elif name == "open" and base == "os":
                flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
                if not any(x in flags for x in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")):
                    continue
            elif name == "File":
                mode = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "r"
                if mode == "r":
                    continue
            elif name == "replace" and base not in ("os", "tmp", "path") and not base.endswith(("Path", "path")):
                continue          # str.replace
            elif name == "dump" and base not in ("json", "yaml", "pickle", "np", "numpy", "torch"):
                continue
            elif name == "copy" and base != "shutil":
                continue
            elif name == "save" and base not in ("np", "numpy", "torch"):
                continue
            elif name not in WRITE_CALLS:
                continue
            yield rel, owner.get(id(node), "<module>"), call, node.lineno


def test_no_other_writer_in_apps():
    """The CI grep of issue 34: every call in apps/ that can write a file is the writer's or
    one of ALLOWED, each with the reason it is not a user-named output."""
    stray = [f"{rel}:{line} {func}: {call}" for rel, func, call, line in write_calls(REPO / "apps")
             if not any(ALLOWED.get(k) for k in ((rel, func, call), (rel, func, "*"), (rel, "*", "*")))]
    assert not stray, "writes outside hpckit.common.fileio:\n" + "\n".join(stray)
    # the scan itself finds writes (it would pass vacuously if it found none)
    found = {(rel, func) for rel, func, _, _ in write_calls(REPO / "apps")}
    assert ("apps/hpckit/common/fileio.py", "create_exclusive") in found
    assert ("apps/hpckit/results/report.py", "_save") in found
