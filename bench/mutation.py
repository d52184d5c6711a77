"""Mutation bench: the kit's results commands run on thousands of damaged copies of real
inputs, and every answer is judged as a user would judge it (issue 34).

    .venv/bin/python bench/mutation.py [--cases 3000] [--seed 1] [--runs RUN ...] [--work DIR]
                                       [--commands analyze,project,...] [--keep]

Inputs, real ones: kit runs (`--runs`: output directories of `hpckit train` with
mlperf.log and summary.json; default: two tiny DeepCAM runs trained here first), the
published v1.0 NVIDIA CosmoFlow set and its system description from ../shared/real_logs
(when present), the convergence record the kit ships, a ReFrame perflog in the site
profiles' format whose `stack` field is this machine's recorded stack, and the local
profile's system.yaml. Each case copies what it uses into its own directory, damages ONE
file with a seeded mutation (a value, a time, an epoch number, a key or a nested block of
one MLPerf log record replaced by NaN, an infinity, a negative, a huge integer, text, null,
a list or an object; a JSON document's node replaced, removed or retyped; a perflog field
or a system.yaml field replaced; a line dropped, doubled or cut; bytes garbled; the file
cut short, emptied, made UTF-16, or replaced by a FIFO or a directory), then runs one
command on it: analyze, project, report, score, package, check or references calibrate,
through tests/forkserver.py (hpckit.cli.main in a forked child, as `python -m hpckit`
runs it, without an interpreter start per case).

A case violates the kit's promise when the command
* exits with another code than 0 or 2 (1 where its verdict allows: check, score),
* prints more than two lines on stderr, or a traceback,
* hangs (killed after its timeout),
* changes any file that was there before (inputs hashed before and after; new files only
  under the case's out/ and check's side report `<log>.compliance.txt`),
* leaves a partial output: a temporary file, or a report or package directory although it
  failed.
It prints one line per command and kind (cases, exit codes seen, violations), the totals,
and every violation with its seed, so `--seed S --cases 1 --first S` reproduces it.
tests/test_mutation.py runs a few hundred cases of the same engine in CI.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL_LOGS = REPO.parent / "shared" / "real_logs"
NV_SET = REAL_LOGS / "sets" / "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet__cosmoflow"
NV_JSON = REAL_LOGS / "systems" / "v1.0__NVIDIA__dgxa100_n16_ngc21.09_mxnet.json"
RECORD = REPO / "apps" / "hpckit" / "results" / "convergence_record.json"
SYSTEM_YAML = REPO / "site_profiles" / "local" / "system.yaml"
MARKER = b":::MLLOG "

# the exit codes each command may answer with (1: a verdict that does not pass)
ALLOWED_RC = {"check": {0, 1, 2}, "score": {0, 1, 2}}
DEFAULT_RC = {0, 2}


# ---- the fork server ---------------------------------------------------------------------

class ForkServer:
    """tests/forkserver.py: one warm interpreter, a forked child per command."""

    def __init__(self):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "apps"), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "forkserver.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        self.lock = threading.Lock()

    def run(self, argv: list, cwd: Path, timeout: float = 60, env: dict | None = None) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd), "timeout": timeout,
                                              "env": env or {}}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


# ---- mutations ---------------------------------------------------------------------------

def hostile_values(rng: random.Random):
    return rng.choice([float("nan"), float("inf"), float("-inf"), -1, -7, 0, 10 ** 30, 10 ** 400, 1e308, -1e308,
                       2 ** 63, 0.5, -0.5, "text", "", "NaN", "1e999", None, True, False, [], {}, [1, "a"],
                       {"a": {"b": None}}, "x" * 300])


def _paths(node, path=()):
    """Every (path, value) inside a JSON document, containers included."""
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def mutate_doc(doc, rng: random.Random):
    """One node of a parsed JSON document replaced by a hostile value, removed, or turned
    into another container; returns (document, what was done)."""
    paths = [p for p, _ in _paths(doc)]
    path = rng.choice(paths)
    if not path:
        return hostile_values(rng), "document replaced"
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    op = rng.random()
    if op < 0.7:
        parent[key] = hostile_values(rng)
        return doc, f"{'.'.join(map(str, path))} = hostile"
    if op < 0.85:
        del parent[key]
        return doc, f"{'.'.join(map(str, path))} removed"
    value = parent[key]
    parent[key] = [value] if not isinstance(value, list) else {"x": value}
    return doc, f"{'.'.join(map(str, path))} retyped"


def _dumps(obj) -> str:
    return json.dumps(obj, allow_nan=True)


def mutate_mllog(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    lines = data.split(b"\n")
    marked = [i for i, ln in enumerate(lines) if MARKER in ln]
    if not marked:
        return data + b"\n:::MLLOG {\"key\": 5}\n", "appended a bad record"
    i = rng.choice(marked)
    line = lines[i]
    cut = line.rindex(MARKER) + len(MARKER)
    op = rng.random()
    if op < 0.65:
        try:
            rec = json.loads(line[cut:])
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            # mostly the fields every reader uses; sometimes anywhere in the record
            field_ = rng.choice(["value", "value", "time_ms", "time_ms", "metadata.epoch_num", "metadata.status",
                                 "metadata", "key", "event_type", "metadata.instance", "deep"])
            if field_ == "deep":
                rec, what = mutate_doc(rec, rng)
            elif field_.startswith("metadata."):
                meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
                meta[field_.split(".", 1)[1]] = hostile_values(rng)
                rec["metadata"], what = meta, field_
            elif field_ == "key":
                rec["key"] = rng.choice(["run_start", "run_stop", "epoch_start", "epoch_stop", "eval_start",
                                         "eval_stop", "staging_start", "staging_stop", "eval_error",
                                         "eval_accuracy", "global_batch_size", "number_of_nodes",
                                         "hpckit_config", "hpckit_provenance", 7, None])
                what = f"key -> {rec['key']}"
            else:
                rec[field_] = hostile_values(rng)
                what = field_
            lines[i] = line[:cut] + _dumps(rec).encode()
            return b"\n".join(lines), f"line {i + 1} ({rec.get('key') if isinstance(rec, dict) else '?'}): {what}"
    if op < 0.75:
        del lines[i]
        return b"\n".join(lines), f"line {i + 1} dropped"
    if op < 0.82:
        lines.insert(i, line)
        return b"\n".join(lines), f"line {i + 1} doubled"
    if op < 0.9:
        lines[i] = line[:rng.randrange(len(line) + 1)]
        return b"\n".join(lines), f"line {i + 1} cut"
    j = rng.choice(marked)
    lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines), f"lines {i + 1} and {j + 1} swapped"


def mutate_json(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    try:
        doc = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rng)
    doc, what = mutate_doc(doc, rng)
    return (json.dumps(doc, indent=1, allow_nan=True) + "\n").encode(), what


PERFLOG_HOSTILE = ["nan", "inf", "-inf", "", "null", "abc", "1e400", "-5", "0", "2026-13-45T99:99:99",
                   "2026-11-22T10:00:00+05:00", "{", "[]", '{"packages": 5}', '{"commit": 7}', '"text"', "%",
                   "x" * 200, "1e308"]


def mutate_perflog(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    lines = data.decode(errors="replace").split("\n")
    body = [i for i, ln in enumerate(lines) if ln.strip() and i > 0]
    if not body or rng.random() < 0.1:
        i = 0
    else:
        i = rng.choice(body)
    fields = lines[i].split("|")
    op = rng.random()
    if op < 0.7:
        k = rng.randrange(len(fields))
        if i > 0 and fields[k].startswith("{") and rng.random() < 0.6:
            try:
                stack, what = mutate_doc(json.loads(fields[k]), rng)
                fields[k] = json.dumps(stack, allow_nan=True).replace("|", "/")
            except ValueError:
                fields[k], what = rng.choice(PERFLOG_HOSTILE), "field"
        else:
            fields[k], what = rng.choice(PERFLOG_HOSTILE), "field"
        lines[i] = "|".join(fields)
        return "\n".join(lines).encode(), f"line {i + 1} field {k + 1}: {what}"
    if op < 0.8:
        del fields[rng.randrange(len(fields))]
        lines[i] = "|".join(fields)
        return "\n".join(lines).encode(), f"line {i + 1}: a field dropped"
    if op < 0.9:
        lines.insert(i, lines[i])
        return "\n".join(lines).encode(), f"line {i + 1} doubled"
    del lines[i]
    return "\n".join(lines).encode(), f"line {i + 1} dropped"


def mutate_yaml(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    import yaml
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError:
        return mutate_bytes(data, rng)
    if not isinstance(doc, dict) or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    key = rng.choice(sorted(doc))
    op = rng.random()
    if op < 0.75:
        value = rng.choice([float("nan"), float("inf"), -1, 10 ** 400, None, True, [], {"a": [1]}, "x" * 500,
                            "", 3.5, {"python": {"x": 1}}])
        doc[key] = value
        what = f"{key} = hostile"
    else:
        del doc[key]
        what = f"{key} removed"
    return yaml.safe_dump(doc, allow_unicode=True).encode(), what


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    op = rng.random()
    n = len(data)
    if op < 0.3:
        k = rng.randrange(n + 1)
        return data[:k], f"cut at byte {k}"
    if op < 0.5:
        k = rng.randrange(n + 1)
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        return data[:k] + junk + data[k + len(junk):], f"{len(junk)} bytes garbled at {k}"
    if op < 0.6:
        return b"", "emptied"
    if op < 0.7:
        return data.decode("latin-1").encode("utf-16"), "re-encoded as UTF-16"
    if op < 0.8:
        return b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n"), "BOM and CRLF"
    if op < 0.9:
        return data + b"\xff\xfe\x00" * 10, "non-UTF-8 bytes appended"
    return data[: n // 2] + b"\x00" * 64 + data[n // 2:], "NUL bytes inserted"


MUTATORS = {"mllog": mutate_mllog, "json": mutate_json, "perflog": mutate_perflog, "yaml": mutate_yaml}


def damage(path: Path, kind: str, rng: random.Random) -> str:
    """Damage `path` in place (a private copy); returns what was done."""
    r = rng.random()
    if r < 0.02:
        path.unlink()
        os.mkfifo(path)
        return "replaced by a FIFO"
    if r < 0.03:
        path.unlink()
        path.mkdir()
        return "replaced by a directory"
    data = path.read_bytes()
    if r < 0.15:
        new, what = mutate_bytes(data, rng)
    else:
        new, what = MUTATORS[kind](data, rng)
    path.write_bytes(new)
    return what


# ---- inputs ------------------------------------------------------------------------------

@dataclass
class Inputs:
    runs: list[Path]
    pub_set: Path | None
    nv_json: Path | None
    record: Path
    perflogs: Path
    site: Path


def make_runs(work: Path) -> list[Path]:
    """Two tiny real DeepCAM runs (datagen + train), when none are given."""
    hpckit = [sys.executable, "-m", "hpckit"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    data = work / "dc-data"
    subprocess.run([*hpckit, "datagen", "deepcam", "--out", data, "--train", "8", "--valid", "4", "--height", "32",
                    "--width", "48", "--seed", "1", "--workers", "1"], check=True, capture_output=True, env=env)
    runs = []
    for seed in (1, 2):
        out = work / f"run{seed}"
        proc = subprocess.run([*hpckit, "train", "deepcam", "--data", data, "--output-dir", out, "--seed", str(seed),
                               "--allocator", "glibc", "--threads", "1", "--set", "data.n_train=8", "--set",
                               "data.n_valid=4", "--set", "data.height=32", "--set", "data.width=48", "--set",
                               "train.n_epochs=2"], capture_output=True, text=True, env=env)
        if proc.returncode not in (0, 3):
            sys.exit(f"mutation: could not make a tiny run: {proc.stderr[-2000:]}")
        runs.append(out)
    return runs


def perflog_text() -> str:
    """A ReFrame perflog in the site profiles' format, three runs of two checks, with the
    stack this machine records (hpckit.common.provenance.stack)."""
    sys.path.insert(0, str(REPO / "site_profiles"))
    from site_common import PERFLOG_FORMAT
    from hpckit.common.provenance import collect, stack
    header = "|".join(f.split("(check_")[1].split(")")[0] for f in PERFLOG_FORMAT.split("|"))
    stack_json = json.dumps(stack(collect("pytorch")), separators=(",", ":")).replace("|", "/")
    lines = [header]
    for i in range(3):
        for check, var, value, unit in (("CosmoFlowCheck %framework=pytorch", "time_to_train", 1 + i / 10, "min"),
                                        ("CosmoFlowCheck %framework=pytorch", "train_throughput", 100 + i, "samples/s"),
                                        ("DeepCAMCheck %framework=pytorch", "staging_time", 0.2 + i / 50, "s")):
            lines.append(f"2026-11-22T10:0{i}:00|pass|{check}|hpckit-venv|mini|0|{var}|{value}|{unit}|0|null|null|"
                         f"pass|vm|{stack_json}")
    header_fields = header.split("|")
    assert all(len(ln.split("|")) == len(header_fields) for ln in lines)
    return "\n".join(lines) + "\n"


def prepare(work: Path, runs: list[Path]) -> Inputs:
    pristine = work / "pristine"
    pristine.mkdir(parents=True)
    copied = []
    for i, r in enumerate(runs):
        d = pristine / f"run{i}"
        d.mkdir()
        for name in ("mlperf.log", "summary.json"):
            shutil.copy(Path(r) / name, d / name)
        copied.append(d)
    pub = nvj = None
    if NV_SET.is_dir() and NV_JSON.is_file():
        pub = pristine / "nvidia"
        shutil.copytree(NV_SET, pub)
        for p in pub.rglob("*"):
            p.chmod(0o644 if p.is_file() else 0o755)
        pub.chmod(0o755)
        nvj = pristine / "nvidia.json"
        shutil.copy(NV_JSON, nvj)
        nvj.chmod(0o644)
    record = pristine / "record.json"
    shutil.copy(RECORD, record)
    perf = pristine / "perflogs" / "local" / "default"
    perf.mkdir(parents=True)
    (perf / "MLPerf.log").write_text(perflog_text())
    site = pristine / "site"
    site.mkdir()
    shutil.copy(SYSTEM_YAML, site / "system.yaml")
    return Inputs(copied, pub, nvj, record, pristine / "perflogs", site)


# ---- cases -------------------------------------------------------------------------------

@dataclass
class Case:
    seed: int
    command: str
    kind: str            # which input was damaged
    argv: list
    target: Path         # the damaged file
    what: str = ""
    timeout: float = 60
    outputs: list = field(default_factory=list)   # paths a failed command must not leave behind


# (command, damaged input) -> weight: mostly the cheap commands; report and check (seconds
# each: matplotlib, the official checker in a subprocess) less often
PLAN = {("analyze", "run-log"): 8, ("analyze", "summary"): 5, ("analyze", "published"): 8,
        ("project", "run-log"): 5, ("project", "summary"): 3, ("project", "record"): 8, ("project", "published"): 3,
        ("score", "run-log"): 6, ("score", "published"): 8,
        ("package", "run-log"): 5, ("package", "summary"): 5, ("package", "published"): 4, ("package", "system"): 4,
        ("references", "perflog"): 8,
        ("report", "run-log"): 1, ("report", "summary"): 1, ("report", "published"): 1, ("report", "perflog"): 1,
        ("report", "system"): 1,
        ("check", "run-log"): 1, ("check", "published"): 1}


def _link_tree(src: Path, dst: Path) -> None:
    """`src` into `dst`, every file a hard link (the damaged file is copied by make_case)."""
    if src.is_file():
        os.link(src, dst)
        return
    dst.mkdir()
    for p in sorted(src.iterdir()):
        _link_tree(p, dst / p.name)


def make_case(seed: int, inputs: Inputs, root: Path, command: str | None = None, kind: str | None = None,
              damaged: bool = True) -> Case:
    rng = random.Random(seed)
    plan = [(c, k) for c, k in PLAN if (command is None or c == command) and (kind is None or k == kind)
            and (inputs.pub_set is not None or k != "published")]
    command, kind = rng.choices(plan, weights=[PLAN[p] for p in plan])[0]
    d = root / f"case{seed}"
    d.mkdir()
    out = d / "out"
    out.mkdir()
    run_paths = []
    for r in inputs.runs:
        _link_tree(r, d / r.name)
        run_paths.append(d / r.name)
    run = run_paths[0]
    pub = None
    if inputs.pub_set is not None:
        _link_tree(inputs.pub_set, d / "nvidia")
        pub = d / "nvidia"
    record = d / "record.json"
    os.link(inputs.record, record)
    _link_tree(inputs.perflogs, d / "perflogs")
    perflogs = d / "perflogs"
    _link_tree(inputs.site, d / "site")
    site = d / "site"

    target, mkind = {
        "run-log": (run / "mlperf.log", "mllog"), "summary": (run / "summary.json", "json"),
        "published": (pub / rng.choice(sorted(p.name for p in pub.iterdir())) if pub else None, "mllog"),
        "record": (record, "json"), "perflog": (perflogs / "local" / "default" / "MLPerf.log", "perflog"),
        "system": (site / "system.yaml", "yaml")}[kind]
    data = target.read_bytes()
    target.unlink()                       # break the hard link: the damage stays in this case
    target.write_bytes(data)
    what = damage(target, mkind, rng) if damaged else "undamaged"

    runs = [str(p) for p in run_paths]
    timeout = 60
    outputs = []
    if command == "analyze":
        argv = ["analyze", *(runs if kind != "published" else runs[:1]),
                *(["--published", str(pub)] if pub is not None and kind == "published" else []),
                "--json", out / "a.json", *(["--record", out / "r.json"] if kind == "published" else [])]
    elif command == "project":
        if kind == "record":
            argv = ["project", "--benchmark", "deepcam", "--units", "8", "--local-batch", "2", "--from", *runs,
                    "--record", record, "--json", out / "p.json"]
        elif kind == "published":
            argv = ["project", "--validate", "--published", pub, "--json", out / "p.json"]
        else:
            argv = ["project", "--benchmark", "deepcam", "--units", rng.choice(["1", "8", "1024"]), "--local-batch",
                    "2", "--from", *runs, "--json", out / "p.json"]
    elif command == "score":
        argv = ["score", *(runs if kind != "published" else [pub]), "--scaling", "strong", "--json", out / "s.json"]
    elif command == "package":
        if kind == "published":
            argv = ["package", pub, "--org", "NVIDIA", "--system-json", d / "nvidia.json", "--out", out / "pkg"]
            os.link(inputs.nv_json, d / "nvidia.json")
        else:
            # one run: runs made at different times in a changing tree record different stacks
            argv = ["package", runs[0], "--site", site if kind == "system" else "local", "--org", "Org",
                    "--out", out / "pkg"]
        outputs.append(out / "pkg")
    elif command == "references":
        argv = ["references", "calibrate", "--perflog", perflogs, "--out", out / "refs.yaml"]
    elif command == "report":
        argv = ["report", *runs, "--out", out / "rep"]
        if kind == "published":
            argv += ["--published", pub]
        elif kind == "perflog":
            argv += ["--perflog", perflogs]
        elif kind == "system":
            argv += ["--site", site]
        outputs.append(out / "rep")
        timeout = 180
    elif command == "check":
        log = target if kind == "published" else run / "mlperf.log"
        argv = ["check", log, "--ruleset", "hpc-1.0.0" if kind == "published" else "mini"]
        timeout = 180
    return Case(seed, command, kind, argv, target, what, timeout, outputs)


def snapshot(root: Path, skip: Path) -> dict[str, str]:
    """sha256 of every regular file under root (not under `skip`), a marker for anything
    else; never opens a FIFO."""
    import stat
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    snap[p] = hashlib.sha256(f.read()).hexdigest()
            elif not stat.S_ISDIR(st.st_mode):
                snap[p] = f"special {stat.S_IFMT(st.st_mode)}"
    return snap


def judge(case: Case, res: dict, before: dict, after: dict, case_dir: Path) -> list[str]:
    problems = []
    allowed = ALLOWED_RC.get(case.command, DEFAULT_RC)
    if res["hang"]:
        problems.append(f"hang (killed after {case.timeout} s)")
    if "Traceback" in res["stderr"] + res["stdout"]:
        problems.append("traceback")
    if not res["hang"] and res["rc"] not in allowed:
        problems.append(f"exit code {res['rc']} (allowed {sorted(allowed)})")
    err = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    if len(err) > 2:
        problems.append(f"{len(err)} stderr lines")
    changed = sorted(p for p, h in before.items() if after.get(p) != h)
    added = sorted(p for p in after if p not in before and not p.endswith(".compliance.txt"))
    if changed:
        problems.append(f"inputs changed or removed: {[os.path.relpath(p, case_dir) for p in changed][:4]}")
    if added:
        problems.append(f"files written outside out/: {[os.path.relpath(p, case_dir) for p in added][:4]}")
    leftovers = [str(p.relative_to(case_dir)) for p in case_dir.rglob("*")
                 if p.name.endswith(".tmp") or ".hpckit-" in p.name]
    if leftovers:
        problems.append(f"temporary files left: {leftovers[:4]}")
    if res["rc"] != 0:
        partial = [str(o.relative_to(case_dir)) for o in case.outputs if os.path.lexists(o)]
        if partial:
            problems.append(f"partial output of a failed command: {partial}")
    return problems


def run_cases(server: ForkServer, inputs: Inputs, root: Path, seeds, keep: bool = False,
              command: str | None = None, kind: str | None = None, report=None):
    """Run the cases of `seeds`; returns (stats, violations). `report(i, case, problems)`
    is called after each."""
    stats = defaultdict(Counter)
    violations = []
    for i, seed in enumerate(seeds):
        case = make_case(seed, inputs, root, command, kind)
        case_dir = root / f"case{seed}"
        out = case_dir / "out"
        before = snapshot(case_dir, out)
        res = server.run(case.argv, cwd=case_dir, timeout=case.timeout)
        stats[f"{case.command} <- {case.kind}"]["ms"] += int(res["seconds"] * 1000)
        after = snapshot(case_dir, out)
        problems = judge(case, res, before, after, case_dir)
        key = f"{case.command} <- {case.kind}"
        stats[key]["cases"] += 1
        stats[key][f"rc {res['rc']}"] += 1
        if problems:
            stats[key]["violations"] += 1
            violations.append((case, problems, res))
        if report:
            report(i, case, problems)
        if not keep and not problems:
            shutil.rmtree(case_dir, ignore_errors=True)
    return stats, violations


def baseline(server: ForkServer, inputs: Inputs, root: Path, pairs=None) -> list[str]:
    """Every (command, input) of the plan (or `pairs`) on undamaged inputs: it must succeed
    (0, or 1 for a verdict), else the mutations of that pair test nothing."""
    bad = []
    for n, (command, kind) in enumerate(sorted(pairs or PLAN)):
        if kind == "published" and inputs.pub_set is None:
            continue
        case = make_case(10 ** 9 + n, inputs, root, command, kind, damaged=False)
        res = server.run(case.argv, cwd=root / f"case{case.seed}", timeout=case.timeout)
        if res["rc"] not in (0, 1) or "Traceback" in res["stderr"]:
            bad.append(f"{command} <- {kind}: rc {res['rc']}: {res['stderr'].strip()[-300:]}")
        shutil.rmtree(root / f"case{case.seed}", ignore_errors=True)
    return bad


def describe(case: Case, problems: list[str], res: dict, root: Path) -> str:
    err = res["stderr"].strip().splitlines()
    return (f"seed {case.seed}: {case.command} <- {case.kind} ({os.path.relpath(case.target, root)}: {case.what}): "
            f"{'; '.join(problems)}\n    argv: {' '.join(os.path.relpath(str(a), root) if str(a).startswith(str(root)) else str(a) for a in case.argv)}\n"
            f"    rc {res['rc']}; stderr: {' | '.join(err[-6:])[:1500]}")


def main() -> int:
    sys.path.insert(0, str(REPO / "apps"))
    from hpckit.cli import OneLineParser   # a bad argument is one line (make mutate CASES=abc)
    from hpckit.common.inputs import cli_int
    ap = OneLineParser(prog="bench/mutation.py", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=cli_int(1, 10 ** 9), default=3000)
    ap.add_argument("--seed", type=cli_int(-(2 ** 62), 2 ** 62), default=1,
                    help="first case's seed (case i has seed + i)")
    ap.add_argument("--runs", nargs="+", default=[], help="kit run directories (default: two tiny runs made here)")
    ap.add_argument("--work", default=None, help="where the work goes: a new directory inside it, kept (default: a "
                                                  "new temporary one, removed)")
    ap.add_argument("--command", default=None, help="only this command")
    ap.add_argument("--kind", default=None, help="only this damaged input")
    ap.add_argument("--keep", action="store_true", help="keep every case's directory")
    args = ap.parse_args()
    from benchlib import cpu_flags, cpu_model, own_workdir
    work = own_workdir("mutation", "--work", args.work, "hpckit-mutation-")   # new: what else --work holds stays
    print(f"# mutation bench: host {os.uname().nodename}, cpu {cpu_model()}, flags {cpu_flags()}, "
          f"load1 {os.getloadavg()[0]:.1f}, cases {args.cases}, seeds {args.seed}..{args.seed + args.cases - 1}")
    runs = [Path(r) for r in args.runs] or make_runs(work)
    inputs = prepare(work, runs)
    if inputs.pub_set is None:
        print(f"# no published set at {NV_SET}: published inputs left out")
    root = work / "cases"
    root.mkdir(exist_ok=True)
    server = ForkServer()
    failed = baseline(server, inputs, root)
    for line in failed:
        print(f"# baseline (undamaged) does not succeed: {line}")
    start = time.monotonic()

    def progress(i, case, problems):
        if problems or (i + 1) % 250 == 0:
            print(f"  {i + 1}/{args.cases} cases, {time.monotonic() - start:.0f} s"
                  + (f"; violation at seed {case.seed}" if problems else ""), flush=True)
    try:
        stats, violations = run_cases(server, inputs, root, range(args.seed, args.seed + args.cases), args.keep,
                                      args.command, args.kind, progress)
    finally:
        server.close()
    seconds = time.monotonic() - start
    for key in sorted(stats):
        c = stats[key]
        codes = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k.startswith("rc "))
        print(f"{key}: cases={c['cases']} violations={c['violations']} ({codes}) "
              f"mean_s={c['ms'] / 1000 / c['cases']:.2f}")
    total = sum(c["cases"] for c in stats.values())
    print(f"mutations={total} violations={len(violations)} seconds={seconds:.0f} "
          f"cases_per_s={total / seconds:.2f}")
    for case, problems, res in violations:
        print(describe(case, problems, res, root))
    if not args.work and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not violations else 1


if __name__ == "__main__":
    sys.exit(main())
