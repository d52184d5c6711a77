"""The one reader (hpckit.common.inputs and the readers on it, issue 34): what the kit did
not just write is checked for the types and ranges the kit writes, and a file that breaks
them is one line naming the file and the key, exit 2, never a traceback or a hang. Each
breakage issue 34 found has its case here: NaN, text and negative epoch numbers in a
published log and in the convergence record; summary.json, perflog and log provenance
blocks of another shape (package, report, references calibrate, analyze); numbers on the
command line that are not finite or overflow; a FIFO where a file is read; a `.git` in an
odd state read without git, and a HEAD that is a FIFO."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_score import write_log

sys.path.insert(0, str(REPO / "bench"))
from mutation import ForkServer, perflog_text, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    yield s
    s.close()


def one_line(res: dict, *needles) -> str:
    assert not res["hang"] and "Traceback" not in res["stderr"] + res["stdout"], res
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    assert res["rc"] == 2 and len(lines) == 1, res
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def _set(d: Path, n=3, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_log(d / f"result_{i}.txt", minutes=10.0 + i, start=10_000_000 * (i + 1), nodes=1, **kw)
    return d


def _edit_record(path: Path, key: str, value, nth: int = 1) -> int:
    """Set `key` (or `metadata.<name>`) of the nth record with that key, or of the nth
    record holding metadata.<name>; returns its line number."""
    lines = path.read_text().splitlines()
    seen = 0
    for i, line in enumerate(lines):
        rec = json.loads(line.split(":::MLLOG ", 1)[1])
        if key.startswith("metadata."):
            hit = key.split(".", 1)[1] in rec.get("metadata", {})
        else:
            hit = rec["key"] == key.split(":")[0]
        if hit:
            seen += 1
            if seen == nth:
                if key.startswith("metadata."):
                    rec["metadata"][key.split(".", 1)[1]] = value
                elif ":" in key:
                    rec[key.split(":")[1]] = value
                else:
                    rec["value"] = value
                lines[i] = ":::MLLOG " + json.dumps(rec)
                path.write_text("\n".join(lines) + "\n")
                return i + 1
    raise AssertionError(f"no {key} in {path}")


# ---- published logs ---------------------------------------------------------------------------

DAMAGE = [("run_start:time_ms", float("nan"), "run_start time_ms"),
          ("epoch_start:time_ms", "soon", "epoch_start time_ms"),
          ("run_stop:time_ms", float("inf"), "run_stop time_ms"),
          ("metadata.epoch_num", -3, "epoch_num"),
          ("metadata.epoch_num", float("nan"), "epoch_num"),
          ("metadata.epoch_num", 2.5, "epoch_num"),
          ("number_of_nodes", float("nan"), "number_of_nodes"),
          ("number_of_nodes", "many", "number_of_nodes"),
          ("eval_error", "low", "eval_error"), ("eval_error", 10 ** 400, "eval_error"),
          ("number_of_nodes", 10 ** 400, "number_of_nodes")]


@pytest.mark.parametrize("key,value,needle", DAMAGE, ids=[f"{k}={str(v)[:12]}" for k, v, _ in DAMAGE])
def test_a_damaged_published_log_is_one_line_in_every_command(key, value, needle, server, tmp_path):
    """NaN, text, an infinity, a negative or fractional epoch number where every published
    log (3,657 of v0.7-v3.0) has an integer: score, analyze, project --validate, package
    and report each answer one line naming the log, its line and the key."""
    pub = _set(tmp_path / "pub")
    bad = pub / "result_1.txt"
    line = _edit_record(bad, key, value)
    run = _set(tmp_path / "site", n=1)
    before = snapshot(tmp_path, tmp_path / "out")
    (tmp_path / "out").mkdir()
    for argv in (["score", pub, "--scaling", "strong"],
                 ["analyze", "--published", pub, "--json", tmp_path / "out" / "a.json"],
                 ["project", "--validate", "--published", pub],
                 ["package", pub, "--site", "local", "--org", "Org", "--out", tmp_path / "out" / "pkg"],
                 ["report", run, "--published", pub, "--out", tmp_path / "out" / "rep"]):
        one_line(server.run(argv, cwd=tmp_path), bad, f"line {line}", needle)
    assert snapshot(tmp_path, tmp_path / "out") == before
    assert not list((tmp_path / "out").iterdir())     # no output of a failed command


# ---- the convergence record -------------------------------------------------------------------

RECORD = REPO / "apps" / "hpckit" / "results" / "convergence_record.json"
RECORD_DAMAGE = [("epochs", [float("nan")], "points[0].epochs[0]"), ("epochs", ["twenty"], "points[0].epochs[0]"),
                 ("epochs", [-3, 20], "points[0].epochs[0]"), ("epochs", [], "points[0].epochs"),
                 ("epochs", [20, 10 ** 400], "points[0].epochs[1]"),
                 ("global_batch_size", float("inf"), "points[0].global_batch_size"),
                 ("global_batch_size", "big", "points[0].global_batch_size"),
                 ("benchmark", None, "points[0].benchmark"), ("org", ["x"], "points[0].org")]


@pytest.mark.parametrize("key,value,needle", RECORD_DAMAGE, ids=[f"{k}={str(v)[:12]}" for k, v, _ in RECORD_DAMAGE])
def test_a_damaged_convergence_record_is_one_line(key, value, needle, server, tmp_path):
    doc = json.loads(RECORD.read_text())
    doc["points"][0][key] = value
    record = tmp_path / "record.json"
    record.write_text(json.dumps(doc))
    run = _set(tmp_path / "run", n=1)
    one_line(server.run(["project", "--benchmark", "cosmoflow", "--units", "8", "--local-batch", "2", "--from",
                         run, "--record", record], cwd=tmp_path), record, needle)
    del doc["points"][0]["dataset"]
    record.write_text(json.dumps({**doc, "sources": 5}))
    one_line(server.run(["project", "--benchmark", "cosmoflow", "--units", "8", "--local-batch", "2", "--from",
                         run, "--record", record], cwd=tmp_path), record)


# ---- summary.json, the provenance blocks, perflogs --------------------------------------------

PROVENANCE_DAMAGE = [({"kit": "not an object"}, "provenance.kit"),
                     ({"packages": {"list": 5}}, "provenance.packages.list"),
                     ({"gpu": {"models": [1, 2]}}, "provenance.gpu.models[0]"),
                     ({"frameworks": {"torch": ["2"]}}, "provenance.frameworks.torch"),
                     ([1, 2], "provenance")]


@pytest.mark.parametrize("prov,needle", PROVENANCE_DAMAGE, ids=[n for _, n in PROVENANCE_DAMAGE])
def test_a_summary_whose_provenance_has_another_shape_is_one_line(prov, needle, server, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_log(run / "mlperf.log", nodes=1)
    (run / "summary.json").write_text(json.dumps({"status": "success", "provenance": prov}))
    (tmp_path / "out").mkdir()
    for argv in (["package", run, "--site", "local", "--org", "Org", "--out", tmp_path / "out" / "pkg"],
                 ["report", run, "--out", tmp_path / "out" / "rep"],
                 ["analyze", run]):
        one_line(server.run(argv, cwd=tmp_path), run / "summary.json", needle)
    assert not list((tmp_path / "out").iterdir())
    # the same block in a log's hpckit_provenance line (a result log with no summary beside it)
    log = tmp_path / "result_0.txt"
    write_log(log, nodes=1)
    with open(log, "a") as f:
        f.write(":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                          "key": "hpckit_provenance", "value": prov, "metadata": {}}) + "\n")
    one_line(server.run(["package", log, "--site", "local", "--org", "Org", "--out", tmp_path / "out" / "p2"],
                        cwd=tmp_path), log, "hpckit_provenance")


@pytest.mark.parametrize("field,value,needle", [
    ("stack", '{"packages": 5}', "stack.packages"), ("stack", '{"commit": 7}', "stack.commit"),
    ("stack", '{"dirty": "maybe"}', "stack.dirty"), ("perf_value", "nan", "perf_value"),
    ("perf_value", "inf", "perf_value"), ("job_completion_time", "2026-13-45T99:99:99", "bad value or time")])
def test_a_perflog_whose_stack_or_figure_is_bad_is_one_line(field, value, needle, server, tmp_path):
    perf = tmp_path / "perflogs" / "local" / "default"
    perf.mkdir(parents=True)
    lines = perflog_text().splitlines()
    header = lines[0].split("|")
    row = lines[2].split("|")
    row[header.index(field)] = value
    lines[2] = "|".join(row)
    (perf / "MLPerf.log").write_text("\n".join(lines) + "\n")
    run = _set(tmp_path / "run", n=1)
    for argv in (["references", "calibrate", "--perflog", tmp_path / "perflogs", "--out", tmp_path / "r.yaml"],
                 ["report", run, "--perflog", tmp_path / "perflogs", "--out", tmp_path / "rep"]):
        one_line(server.run(argv, cwd=tmp_path), perf / "MLPerf.log", "line 3", needle)
    assert not (tmp_path / "r.yaml").exists() and not (tmp_path / "rep").exists()


# ---- numbers from the command line --------------------------------------------------------------

HUGE = str(10 ** 400)
CLI = [(["project", "--benchmark", "deepcam", "--units", HUGE, "--local-batch", "2", "--from", "{t}"], "--units"),
       (["project", "--benchmark", "deepcam", "--units", "1e308", "--local-batch", "2", "--from", "{t}"], "--units"),
       (["project", "--benchmark", "deepcam", "--units", "8", "--local-batch", HUGE, "--from", "{t}"],
        "--local-batch"),
       (["report", "{t}", "--out", "{t}/r", "--project", f"{HUGE}:2"], "--project"),
       (["train", "deepcam", "--data", "{t}", "--output-dir", "{t}/o", "--collective-timeout", "nan"],
        "--collective-timeout"),
       (["train", "deepcam", "--data", "{t}", "--output-dir", "{t}/o", "--collective-timeout", "inf"],
        "--collective-timeout"),
       (["train", "deepcam", "--data", "{t}", "--output-dir", "{t}/o", "--collective-timeout", "1e308"],
        "--collective-timeout"),
       (["references", "calibrate", "--perflog", "{t}", "--out", "{t}/r.yaml", "--floor", "nan"], "--floor"),
       (["references", "calibrate", "--perflog", "{t}", "--out", "{t}/r.yaml", "--min-runs", HUGE], "--min-runs"),
       (["references", "calibrate", "--perflog", "{t}", "--out", "{t}/r.yaml", "--resolution", "s=1e308"],
        "--resolution"),
       (["datagen", "cosmoflow", "--out", "{t}/d", "--train", HUGE, "--valid", "2"], "--train"),
       (["train", "deepcam", "--data", "{t}", "--output-dir", "{t}/o", "--threads", HUGE], "--threads")]


@pytest.mark.parametrize("argv,option", CLI, ids=[f"{a[0]} {o} {a[a.index(o) + 1][:12] if o in a else ''}"
                                                  for a, o in CLI])
def test_a_number_that_is_not_finite_or_overflows_is_one_line(argv, option, server, tmp_path):
    res = server.run([a.replace("{t}", str(tmp_path)) for a in argv], cwd=tmp_path)
    one_line(res, option)
    assert not any(p.name in ("r", "o", "d", "r.yaml") for p in tmp_path.iterdir())


# ---- files that are not files ------------------------------------------------------------------

def test_a_fifo_where_a_file_is_read_is_one_line_never_a_hang(server, tmp_path):
    fifo = tmp_path / "result_0.txt"
    os.mkfifo(fifo)
    run = _set(tmp_path / "run", n=1)
    site = tmp_path / "site"
    site.mkdir()
    os.mkfifo(site / "system.yaml")
    perf = tmp_path / "perf"
    perf.mkdir()
    os.mkfifo(perf / "x.log")
    for argv in (["score", fifo, "--scaling", "strong"], ["check", fifo, "--ruleset", "hpc-3.0.0"],
                 ["analyze", fifo], ["project", "--benchmark", "cosmoflow", "--units", "8", "--local-batch", "2",
                                     "--from", run, "--record", fifo],
                 ["package", run, "--org", "O", "--system-json", fifo, "--out", tmp_path / "p"],
                 ["package", run, "--org", "O", "--site", site, "--out", tmp_path / "p"],
                 ["references", "calibrate", "--perflog", perf, "--out", tmp_path / "r.yaml"],
                 ["train", "deepcam", "--data", tmp_path, "--config", fifo, "--output-dir", tmp_path / "o"],
                 ["describe", "cosmoflow", "--config", fifo]):
        res = server.run(argv, cwd=tmp_path, timeout=60)
        one_line(res, "not a regular file")


GIT_CASES = {
    "HEAD a FIFO": lambda g: (g / "HEAD").unlink() or os.mkfifo(g / "HEAD"),
    "HEAD a directory": lambda g: (g / "HEAD").unlink() or (g / "HEAD").mkdir(),
    "HEAD missing": lambda g: (g / "HEAD").unlink(),
    "ref outside refs/": lambda g: (g / "HEAD").write_text("ref: ../../../../etc/passwd\n"),
    "ref a FIFO": lambda g: (g / "refs" / "heads" / "main").unlink() or os.mkfifo(g / "refs" / "heads" / "main"),
    "packed-refs a FIFO": lambda g: (g / "refs" / "heads" / "main").unlink() or os.mkfifo(g / "packed-refs"),
    "commondir a FIFO": lambda g: os.mkfifo(g / "commondir"),
}


@pytest.mark.parametrize("case", sorted(GIT_CASES))
@pytest.mark.parametrize("git", ["no git on PATH", "git on PATH"])
def test_an_odd_git_checkout_gives_no_commit_and_no_hang(case, git, tmp_path):
    """How provenance (a run's `kit.commit`, package's README) reads the checkout's commit
    when .git is odd: no commit and the reason, in bounded time, with git and without."""
    repo = tmp_path / "repo"
    g = repo / ".git"
    (g / "refs" / "heads").mkdir(parents=True)
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    (g / "refs" / "heads" / "main").write_text("0123456789abcdef0123456789abcdef01234567\n")
    GIT_CASES[case](g)
    env = {**os.environ, "PYTHONPATH": str(REPO / "apps")}
    if git == "no git on PATH":
        env["PATH"] = str(tmp_path / "empty")
    code = ("import sys; from pathlib import Path; from hpckit.common.provenance import head_commit; "
            "print(head_commit(Path(sys.argv[1])))")
    proc = subprocess.run([sys.executable, "-c", code, str(repo)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    commit, why = eval(proc.stdout)
    assert why, proc.stdout      # git never answered for this fake checkout: the reason is said
    # an unreadable commondir is not followed: the loose ref beside HEAD still names the commit
    assert commit == ("0123456789abcdef0123456789abcdef01234567" if case == "commondir a FIFO" else None), proc.stdout


def test_odd_git_files_without_git(tmp_path):
    """A worktree's `.git` file pointing nowhere, at a name with a NUL byte, or a `.git`
    link that loops: no commit, no exception."""
    from hpckit.common.provenance import _head_from_files, head_commit
    for text in ("gitdir: /nonexistent/x\n", "gitdir: a\0b\n", "gitdir:\n", "garbage"):
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / ".git").write_text(text)
        assert _head_from_files(d / ".git") is None
        assert head_commit(d)[0] is None
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / ".git").symlink_to(loop / ".git")
    assert _head_from_files(loop / ".git") is None and head_commit(loop)[0] is None


# ---- what the outputs say ------------------------------------------------------------------------

def _openfold_log(path: Path, start: int, cycles: int = 4, per_cycle: int = 5760) -> Path:
    """A log laid out as the v3.0 OpenFold logs are (hpc_results_v3.0 Clemson/results/
    18xR750-2xA100-PCIe-80GB/strong/openfold): epoch_num is the training samples seen at
    each train/eval cycle (mlcommons/hpc@2c627d4 openfold/train.py:730-734), not an epoch."""
    def rec(t, key, value=None, **meta):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key,
                                         "value": value, "metadata": {"file": "train.py", "lineno": 1, **meta}})
    lines = [rec(start - 50, k, v) for k, v in (("submission_benchmark", "openfold"), ("submission_org", "Site"),
                                               ("submission_division", "closed"), ("submission_status", "onprem"),
                                               ("submission_platform", "sys"), ("number_of_nodes", 18),
                                               ("accelerators_per_node", 2), ("global_batch_size", 144),
                                               ("train_samples", 594595), ("eval_samples", 180))]
    lines += [rec(start, "run_start"), rec(start + 1, "staging_start"), rec(start + 1, "staging_stop")]
    t = start + 10
    for c in range(1, cycles + 1):
        n = c * per_cycle
        lines += [rec(t, "epoch_start", epoch_num=n), rec(t + 60_000, "epoch_stop", epoch_num=n),
                  rec(t + 60_001, "eval_start", epoch_num=n),
                  rec(t + 70_000, "eval_accuracy", 0.7 + 0.04 * c, epoch_num=n),
                  rec(t + 70_001, "eval_stop", epoch_num=n)]
        t += 70_010
    lines.append(rec(t, "run_stop", status="success"))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_openfold_counts_no_epochs_and_the_outputs_say_so(server, tmp_path):
    """OpenFold's epoch_num counts training samples: the report's tables and analyze say
    n/a for its epochs, epoch time and staging/epoch ratio (they said 23,040 epochs and a
    ratio of 0.000), never a number made up from it; its training throughput is each cycle's
    samples (epoch_num's growth, 5,760) over the cycle's training time (60 s here)."""
    from hpckit.results.analysis import run_facts
    from hpckit.results.logs import parse_log
    pub = tmp_path / "openfold"
    pub.mkdir()
    for i in range(3):
        _openfold_log(pub / f"result_{i}.txt", 10_000_000 * (i + 1))
    assert parse_log(pub / "result_0.txt").epochs is None
    f = run_facts(pub / "result_0.txt", "published")
    assert f.no_epochs and f.staging_epoch_ratio is None and f.epoch_s is None
    assert f.epoch_throughput == pytest.approx(5760 / 60.0, rel=1e-3) and f.steady_per_unit == pytest.approx(
        5760 / 60.0 / 36, rel=1e-3)
    assert f.eval_each_s == pytest.approx(10.0, abs=0.01)       # what it has is still measured
    assert f.epoch_times == [] and f.cycle_times == pytest.approx([60.0] * len(f.cycles_s))   # each cycle's training
    run = _set(tmp_path / "site", n=1)
    res = server.run(["analyze", "--published", pub], cwd=tmp_path)
    line = next(ln for ln in res["stdout"].splitlines() if "openfold" in ln)
    assert "epochs n/a" in line and "staging/epoch n/a" in line and "epoch n/a s" in line, line
    res = server.run(["report", run, "--published", pub, "--out", tmp_path / "rep"], cwd=tmp_path)
    assert res["rc"] == 0, res
    import re
    page = (tmp_path / "rep" / "index.html").read_text()
    sets = re.search(r'<table id="sets".*?</table>', page, re.S).group(0)
    row = re.search(r'<tr class="set published" data-benchmark="openfold">.*?</tr>', sets, re.S).group(0)
    cells = dict(re.findall(r'<td class="(epochs|ratio|throughput) na" title="[^"]*">(n/a)</td>', row))
    assert cells == {"epochs": "n/a", "ratio": "n/a"}, row
    throughput = re.search(r'<td class="throughput" data-value="([^"]+)"', row).group(1)
    assert float(throughput) == pytest.approx(96.0, rel=1e-3)      # 5,760 samples in 60 s
    assert "23040" not in row and "0.000" not in row
    cosmoflow = re.search(r'<tr class="set site" data-benchmark="cosmoflow">.*?</tr>', sets, re.S).group(0)
    assert 'class="epochs na"' not in cosmoflow        # a benchmark that counts epochs shows them
