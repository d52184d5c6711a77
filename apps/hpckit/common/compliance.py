"""Compliance of a result log, judged by the official MLCommons checker.

`hpckit check LOG --ruleset R` runs `python -m mlperf_logging.compliance_checker` (the
`mlperf-logging` package) as a subprocess and condenses its verdict to one line:

    COMPLIANT: <log> passes the <ruleset> ruleset (<benchmark>, <division>)
    NOT COMPLIANT: <log> fails the <ruleset> ruleset: <the checker's first error, one line>

The checker's full output goes next to the log, as `<log>.compliance.txt`.

Rulesets: `hpc-1.0.0`, `hpc-2.0.0`, `hpc-3.0.0` are the official ones, unchanged. `mini` is
the official hpc 3.0.0 ruleset with only the quality target, the dataset-size rules and the
other constants of the full-size benchmark a descriptor names (model size, crop, the starting
checkpoint's sha256) replaced by the values of a kit training config (so a CPU-scale run on
synthetic data can be judged by every structural and timing rule of the real benchmark):
numbers, and sha256 digests (hex digits only). It is generated at
run time from the installed package's own YAML files: each replaced rule is located by key
name, checked to still hold the official expression, and rewritten; see `MINI_RULES`.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import yaml

from hpckit.common.benchmark import RuleSubstitution, descriptors
from hpckit.common.config import load_config
from hpckit.common.errors import KitError

CHECKER_MODULE = "mlperf_logging.compliance_checker"
OFFICIAL_RULESETS = {"hpc-1.0.0": "1.0.0", "hpc-2.0.0": "2.0.0", "hpc-3.0.0": "3.0.0"}
MINI = "mini"
MINI_BASE = "3.0.0"  # the official ruleset the mini one is derived from
RULESETS = (*OFFICIAL_RULESETS, MINI)
TOKEN = ":::MLLOG "  # what the checker's parser looks for (with the space)
REPORT_SUFFIX = ".compliance.txt"
CHECKER_TIMEOUT_S = 600
MAX_MESSAGE = 400  # characters of the checker's message kept in the verdict line
# The official parser (mlperf_logging 4.1.68, compliance_checker/mlp_parser/ruleset_*.py
# `strip_and_dedup`: re.sub(".*" + TOKEN, TOKEN, line)) takes time quadratic in the length of
# a line that holds the token: 100 kB took 3 s, 300 kB 44 s on a 2-core AMD EPYC, one 30 MB
# line did not finish in 10 minutes. The longest line of the 3,657 published logs of v1.0,
# v2.0 and v3.0 is 410 bytes; the kit's own longest (hpckit_config) a few kB. A log with a
# line over this bound is refused unread, by the kit, wherever the checker would read it
# (check, score --ruleset, the RCP factor, package --check): one NOT COMPLIANT line naming
# the line. 64 KiB parses in about a second.
MAX_LINE_BYTES = 1 << 16


# --------------------------------------------------------------------------------------
# The mini ruleset: which official rules are replaced, and by which config value.

# One entry per benchmark, from its descriptor (hpckit/<benchmark>/__init__.py); a benchmark
# without substitutions has no mini ruleset.
MINI_RULES: dict[str, tuple[RuleSubstitution, ...]] = {
    name: d.mini_rules for name, d in descriptors().items() if d.mini_rules}

_ENQUEUE_RE = re.compile(r"""enqueue_config\(\s*(['"])hpc_%s/""" % re.escape(MINI_BASE))


def _squash(text: str) -> str:
    return " ".join(str(text).split())


def official_rules_dir(version: str = MINI_BASE):
    """The installed checker's directory of hpc rules for `version` (a Traversable)."""
    if find_spec("mlperf_logging") is None:
        raise KitError("the mlperf-logging package is not installed (pip install mlperf-logging)")
    rules = resources.files(CHECKER_MODULE) / f"hpc_{version}"
    if not rules.is_dir():
        raise KitError(f"the installed mlperf-logging has no hpc {version} ruleset")
    return rules


def _config_value(config: dict, sub: RuleSubstitution, source: str) -> str:
    node: Any = config
    for part in sub.config_key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KitError(f"config {source}: no key '{sub.config_key}' (needed by the mini ruleset)")
        node = node[part]
    if sub.kind is str:   # a sha256 digest: hex digits only, nothing a rule expression could read as code
        if not isinstance(node, str) or not re.fullmatch(r"[0-9a-f]{64}", node):
            raise KitError(f"config key '{sub.config_key}' in {source}: expected a sha256 digest (64 lower-case "
                           f"hex digits), got {node!r:.80}")
        return node
    if sub.kind is int:
        if isinstance(node, bool) or not isinstance(node, int) or node <= 0:
            raise KitError(f"config key '{sub.config_key}' in {source}: expected a positive integer, got {node!r}")
        return str(node)
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node) or node <= 0:
        raise KitError(f"config key '{sub.config_key}' in {source}: expected a positive number, got {node!r}")
    return repr(float(node))


def _redirect(value: Any, target: str) -> tuple[Any, int]:
    """Point every enqueue_config('hpc_3.0.0/...') inside `value` at `target`/...; count them."""
    if isinstance(value, str):
        new, n = _ENQUEUE_RE.subn(lambda m: f"enqueue_config({m.group(1)}{target}/", value)
        return new, n
    if isinstance(value, list):
        out, total = [], 0
        for item in value:
            new, n = _redirect(item, target)
            out.append(new)
            total += n
        return out, total
    if isinstance(value, dict):
        out, total = {}, 0
        for k, item in value.items():
            new, n = _redirect(item, target)
            out[k] = new
            total += n
        return out, total
    return value, 0


def _mentions_base(value: Any) -> bool:
    if isinstance(value, str):
        return f"hpc_{MINI_BASE}/" in value
    if isinstance(value, list):
        return any(_mentions_base(v) for v in value)
    if isinstance(value, dict):
        return any(_mentions_base(v) for v in value.values())
    return False


def generate_mini_rules(dest: Path, benchmark: str, config: dict, source: str = "config") -> list[str]:
    """Write the mini ruleset for `benchmark` into `dest`; return what was replaced, one line each.

    The official hpc 3.0.0 files are copied record by record: references to sibling files
    are redirected into `dest` (the checker joins them onto its own directory, so an
    absolute path works), and the rules of `MINI_RULES[benchmark]` get the config's values.
    Each replaced record must exist and still hold the official expression, otherwise this
    raises RuntimeError: a changed library must not silently yield a wrong ruleset.
    """
    if benchmark not in MINI_RULES:
        raise KitError(f"no mini ruleset for benchmark {benchmark!r} (known: {', '.join(MINI_RULES)})")
    target = str(Path(dest).resolve())
    if any(c in target for c in "{}'\"\\"):
        raise KitError(f"temporary directory {target}: its path cannot be embedded in the checker's "
                       "rules (set TMPDIR to a plain path)")
    subs = MINI_RULES[benchmark]
    values = [_config_value(config, sub, source) for sub in subs]

    official = official_rules_dir()
    files = sorted((f for f in official.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    records_by_file = {}
    for f in files:
        records = yaml.load(f.read_text(), Loader=yaml.BaseLoader) or []
        if not isinstance(records, list):
            raise RuntimeError(f"official rules file {f.name}: expected a list of records")
        records_by_file[f.name] = records
    if "common.yaml" not in records_by_file:
        raise RuntimeError(f"official hpc {MINI_BASE} rules have no common.yaml")

    changes = []
    for sub, value in zip(subs, values):
        if sub.official.count(sub.constant) != 1:
            raise RuntimeError(f"MINI_RULES: {sub.constant!r} must occur once in {sub.official!r}")
        new_expr = sub.official.replace(sub.constant, value)
        for name in sub.files:
            matches = [r["KEY"] for r in records_by_file.get(name, [])
                       if isinstance(r, dict) and isinstance(r.get("KEY"), dict)
                       and r["KEY"].get("NAME") == sub.key]
            if len(matches) != 1:
                raise RuntimeError(
                    f"official hpc {MINI_BASE} rules: expected one '{sub.key}' record in {name}, "
                    f"found {len(matches)}; the installed mlperf-logging changed, update MINI_RULES")
            record = matches[0]
            found = record.get(sub.field)
            if not isinstance(found, str) or _squash(found) != _squash(sub.official):
                raise RuntimeError(
                    f"official hpc {MINI_BASE} rules: {name} '{sub.key}' {sub.field} is {found!r}, "
                    f"expected {sub.official!r}; the installed mlperf-logging changed, update MINI_RULES")
            record[sub.field] = found.replace(sub.constant, value)  # keeps the file's spacing
            changes.append(f"{name} {sub.key} {sub.field}: {sub.official} -> {new_expr} "
                           f"({sub.config_key} of {source})")

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    redirected = 0
    for name, records in records_by_file.items():
        records, n = _redirect(records, target)
        redirected += n
        if _mentions_base(records):
            raise RuntimeError(f"official rules file {name}: a reference to hpc_{MINI_BASE}/ "
                               "was not redirected; update the mini ruleset generator")
        text = yaml.safe_dump(records, sort_keys=False, default_flow_style=False, width=10_000)
        if yaml.load(text, Loader=yaml.BaseLoader) != records:  # the checker must read the same
            raise RuntimeError(f"rules file {name}: YAML round trip changed its content")
        (dest / name).write_text(text)
    if redirected == 0:
        raise RuntimeError(f"official hpc {MINI_BASE} rules: no enqueue_config reference found to redirect")
    return changes


# --------------------------------------------------------------------------------------
# The log itself: sanity checks and the fields named in the verdict.

@dataclass
class LogInfo:
    benchmark: str = "unknown"
    division: str = "unknown"
    mllog_lines: list[int] | None = None  # file line number (1-based) of each :::MLLOG record


def overlong_line(data: bytes) -> tuple[int, int] | None:
    """(1-based line number, length in bytes) of the first line holding the checker's token
    that is longer than MAX_LINE_BYTES, or None. Lines as the official parser splits them
    (universal newlines)."""
    if len(data) <= MAX_LINE_BYTES:
        return None
    for number, line in enumerate(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"), start=1):
        if len(line) > MAX_LINE_BYTES and TOKEN.strip().encode() in line:
            return number, len(line)
    return None


def overlong_reason(log: Path, data: bytes | None = None) -> str | None:
    """Why the official checker must not be given `log` (its parser would not finish), or None."""
    if data is None:
        from hpckit.common.inputs import read_bytes
        try:
            data = read_bytes(log, f"log {log}")
        except KitError:
            return None   # the reader that follows names what is wrong with the file
    hit = overlong_line(data)
    if hit is None:
        return None
    return (f"line {hit[0]} is {hit[1]} bytes long: not read, an MLPerf log line over {MAX_LINE_BYTES} "
            "bytes is refused (the official checker's parser takes time quadratic in a line's length)")


def checker_subprocess(command: list, *, timeout: float, what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run one of mlperf_logging's tools as a child that dies with this process (a SIGTERM or
    SIGKILL of the kit's command kills it: prctl PR_SET_PDEATHSIG) and within `timeout`
    seconds (then killed, and KitError naming `what`)."""
    from hpckit.common.pool import die_with_parent
    parent = os.getpid()
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                              preexec_fn=lambda: die_with_parent(kill=True, parent=parent), **kwargs)
    except subprocess.TimeoutExpired:
        raise KitError(f"{what}: the official {command[2].rsplit('.', 1)[-1]} did not finish in {timeout:g} s") from None


def read_log(log: Path) -> LogInfo:
    """Refuse what is not a result log (KitError naming the file); return its benchmark/division."""
    if not log.exists():
        raise KitError(f"log {log}: no such file")
    if log.is_dir():
        raise KitError(f"log {log}: is a directory, not a log file")
    from hpckit.common.inputs import read_bytes   # a regular file only: a FIFO would never end
    data = read_bytes(log, f"log {log}")
    if not data.strip():
        raise KitError(f"log {log}: file is empty")
    from hpckit.results.logs import mllog_lines   # the project's one log reader
    info = LogInfo(mllog_lines=[])
    for number, record in mllog_lines(data):
        info.mllog_lines.append(number)
        if record is None:
            continue
        key, value = record.get("key"), record.get("value")
        if key == "submission_benchmark" and info.benchmark == "unknown" and isinstance(value, str) and value:
            info.benchmark = value
        elif key == "submission_division" and info.division == "unknown" and isinstance(value, str) and value:
            info.division = value
    if not info.mllog_lines:
        raise KitError(f"log {log}: no '{TOKEN.strip()}' line; not an MLPerf result log")
    return info


# --------------------------------------------------------------------------------------
# The checker's output: the first error, condensed to one line.

_RECORD_RE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) - ?(.*)$")
_SEPARATOR = "\n" + "-" * 30 + "\n"
_DUPLICATE_WARNING_RE = re.compile(r"^Required EXACTLY_ONE occurrence of '[^']*' but found (\d+)$")
_LINE_RE = re.compile(r"\bin line (\d+)\b")


def _records(output: str) -> list[tuple[str, str]]:
    """Split `LEVEL - message` logging output into (level, multi-line message) records."""
    records: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        m = _RECORD_RE.match(line)
        if m:
            records.append((m.group(1), [m.group(2)]))
        elif records:
            records[-1][1].append(line)
    return [(level, "\n".join(lines).strip()) for level, lines in records]


def _condense(message: str, mllog_lines: list[int] | None) -> str:
    """One line from a checker message: drop the echoed log line and the state dumps."""
    kept = []
    for line in message.splitlines():
        stripped = line.strip()
        if stripped.startswith(("current context", "current line")):
            break  # the rest is a JSON dump of the checker's state
        if TOKEN in stripped:
            if kept and kept[-1].endswith("triggered by line:"):
                try:
                    key = json.loads(stripped[stripped.rindex(TOKEN) + len(TOKEN):]).get("key")
                    kept.append(f"(a '{key}' record)")
                except (ValueError, AttributeError):
                    pass
            continue
        kept.append(stripped)
    text = _squash(" ".join(kept))
    if mllog_lines:
        # The checker numbers the :::MLLOG records from 0; say which line of the file it is.
        def file_line(m: re.Match) -> str:
            index = int(m.group(1))
            if 0 <= index < len(mllog_lines):
                return f"in line {index} (file line {mllog_lines[index]})"
            return m.group(0)
        text = _LINE_RE.sub(file_line, text, count=1)
    return _truncate(text)


def _truncate(text: str) -> str:
    text = _squash(text)
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE - 3].rstrip() + "..."
    return text


def first_error(output: str, mllog_lines: list[int] | None = None) -> str:
    """The checker's first error message (not a mere warning), as one line."""
    records = _records(output)
    warnings = [msg for level, msg in records if level == "WARNING"]
    if "Found parsing errors:" in warnings:
        start = warnings.index("Found parsing errors:")
        bad_line = warnings[start + 1] if start + 1 < len(warnings) else ""
        reason = warnings[start + 2] if start + 2 < len(warnings) else ""
        reason = reason.lstrip("^ ").strip()
        snippet = bad_line if len(bad_line) <= 80 else bad_line[:77] + "..."
        return _truncate(f"log lines had parsing errors, the first: {reason} in {snippet!r}")
    messages = []
    for msg in warnings:
        messages.extend(part.strip() for part in msg.split(_SEPARATOR) if part.strip())
    # EXACTLY_ONE seen several times with one value is only a warning for the checker.
    errors = [m for m in messages
              if not ((d := _DUPLICATE_WARNING_RE.match(m)) and int(d.group(1)) >= 2)]
    chosen = errors or messages
    if chosen:
        return _condense(chosen[0], mllog_lines)
    return "the checker reported no message"


# --------------------------------------------------------------------------------------
# Running the checker.

@dataclass
class CheckerRun:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    log_output: str


def _run_checker(log: Path, version: str, config_file: Path | None, workdir: Path) -> CheckerRun:
    log_output = workdir / "checker.log"
    command = [sys.executable, "-m", CHECKER_MODULE, "--usage", "hpc", "--ruleset", version,
               "--log_output", str(log_output)]
    if config_file is not None:
        command += ["--config", str(config_file)]
    command.append(str(log.resolve()))  # absolute: a name starting with '-' stays a file name
    proc = checker_subprocess(command, timeout=CHECKER_TIMEOUT_S, what=f"log {log}", cwd=workdir)
    try:
        logged = log_output.read_text(errors="replace")
    except OSError:
        logged = ""
    return CheckerRun(command, proc.returncode, proc.stdout, proc.stderr, logged)


REPORT_MARKER = "# hpckit check:"   # the side report's first line: what a later check may replace


def report_path(log: Path) -> Path:
    return Path(f"{log}{REPORT_SUFFIX}")


def _write_report(log: Path, ruleset: str, run: CheckerRun, verdict: str, changes: list[str]) -> None:
    parts = [
        f"{REPORT_MARKER} {log} against the {ruleset} ruleset",
        f"# verdict: {verdict}",
        f"# command: {' '.join(run.command)}",
        f"# exit status: {run.returncode}",
    ]
    if changes:
        parts.append(f"# mini ruleset = official hpc {MINI_BASE} with these rules replaced:")
        parts += [f"#   {c}" for c in changes]
    parts += ["", "--- checker log ---", run.log_output.rstrip()]
    if run.stdout.strip():
        parts += ["", "--- checker stdout ---", run.stdout.rstrip()]
    if run.stderr.strip() and run.stderr.strip() != run.log_output.strip():
        parts += ["", "--- checker stderr ---", run.stderr.rstrip()]
    text = "\n".join(parts) + "\n"

    # the one writer (common/fileio.py): a new file, or the side report an earlier `hpckit
    # check` wrote (its first line); never anything else of that name
    from hpckit.common.fileio import atomic_write_text
    atomic_write_text(report_path(log), text, replaces=REPORT_MARKER.encode())


def _mini_config(benchmark: str, config_spec: str, log: Path) -> dict:
    if benchmark == "unknown":
        raise KitError(f"log {log}: no submission_benchmark line, so no mini target applies")
    if benchmark not in MINI_RULES:
        raise KitError(f"log {log}: benchmark {benchmark!r} has no mini ruleset (known: {', '.join(MINI_RULES)})")
    try:
        return load_config(benchmark, config_spec)
    except ModuleNotFoundError as e:
        if e.name != f"hpckit.{benchmark}":
            raise
        raise KitError(f"log {log}: benchmark {benchmark!r} has no hpckit configs yet "
                       f"(package hpckit.{benchmark} is not installed)")


def check_log(log_path, ruleset: str, config_spec: str = "mini") -> tuple[bool, str]:
    """Judge `log_path` with the official checker; return (passed, verdict line).

    `ruleset` is one of `RULESETS`; `config_spec` (mini | reference | FILE) names the
    training config whose quality target and dataset sizes the `mini` ruleset uses.
    Writes the checker's full output to `<log>.compliance.txt`. Bad input raises KitError.
    """
    log = Path(log_path)
    if ruleset not in RULESETS:
        raise KitError(f"ruleset {ruleset!r}: expected one of {', '.join(RULESETS)}")
    info = read_log(log)
    official_rules_dir(OFFICIAL_RULESETS.get(ruleset, MINI_BASE))
    overlong = overlong_reason(log)
    if overlong:   # the checker is not run: its parser would not finish
        return False, f"NOT COMPLIANT: {log} fails the {ruleset} ruleset: {overlong}"

    with tempfile.TemporaryDirectory(prefix="hpckit-check-") as tmp:
        workdir = Path(tmp)
        changes: list[str] = []
        if ruleset == MINI:
            config = _mini_config(info.benchmark, config_spec, log)
            rules = workdir / "rules"
            changes = generate_mini_rules(rules, info.benchmark, config, source=str(config.get("name", config_spec)))
            run = _run_checker(log, MINI_BASE, rules / "common.yaml", workdir)
        else:
            run = _run_checker(log, OFFICIAL_RULESETS[ruleset], None, workdir)

    combined = run.log_output if run.log_output.strip() else run.stderr
    succeeded = run.returncode == 0 and re.search(r"^INFO - SUCCESS$", combined, re.M) is not None
    failed_cleanly = re.search(r"^ERROR - FAILED$", combined, re.M) is not None
    # The checker reports an EXACTLY_ONE key found twice as a WARNING only and still says
    # SUCCESS. A repeated hyperparameter of one value is harmless; a second run_start or
    # run_stop means the log is not one run: `check` fails it (score keeps the summarizer's
    # leniency)
    twice = re.search(r"^WARNING -\s+(Required EXACTLY_ONE occurrence of '(?:run_start|run_stop|init_start|init_stop)' "
                      r"but found \d+)", combined, re.M)
    if succeeded and twice:
        succeeded = False
        verdict = f"NOT COMPLIANT: {log} fails the {ruleset} ruleset: {twice.group(1)}"
    elif succeeded:
        verdict = f"COMPLIANT: {log} passes the {ruleset} ruleset ({info.benchmark}, {info.division})"
    else:
        if failed_cleanly:
            reason = first_error(combined, info.mllog_lines)
        else:  # the checker itself crashed (it does, e.g., on a metric logged as null)
            tail = [line for line in run.stderr.splitlines() if line.strip()]
            reason = _truncate(f"the checker crashed (exit status {run.returncode}): "
                               f"{tail[-1] if tail else 'no output'}")
        verdict = f"NOT COMPLIANT: {log} fails the {ruleset} ruleset: {reason}"

    try:
        _write_report(log, ruleset, run, verdict, changes)
    except KitError as e:   # the verdict stands; the side report is not written
        print(f"hpckit check: warning: side report not written: {e}", file=sys.stderr)
    return succeeded, verdict


def main_check(args) -> int:
    """`hpckit check`: print one verdict line; 0 when compliant, 1 when not."""
    passed, verdict = check_log(args.log, args.ruleset, getattr(args, "config", "mini") or "mini")
    print(verdict)
    return 0 if passed else 1


def official_verdict(log: Path, ruleset: str) -> tuple[bool, str]:
    """The official checker in this process, called as mlperf_logging's result summarizer
    calls it (4.1.68, result_summarizer.py `_read_result_file`: make_checker(usage, ruleset,
    quiet=True, werror=False), then mlp_compliance.main on `<usage>_<ruleset>/common.yaml`):
    what `hpckit score --ruleset` uses to decide whether a run counts, at ~20 ms a log
    instead of a subprocess each. Returns (passes, first message)."""
    import logging
    from mlperf_logging.compliance_checker import mlp_compliance
    overlong = overlong_reason(log)
    if overlong:
        return False, overlong
    version = OFFICIAL_RULESETS[ruleset]
    checker = mlp_compliance.make_checker("hpc", version, quiet=True, werror=False)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)   # the checker logs its findings; they come back below
    try:
        valid, *_ = mlp_compliance.main(str(log), f"hpc_{version}/common.yaml", checker)
    except Exception as e:   # the checker's CCError or a rule that trips on an odd value
        return False, (str(e).strip().splitlines() or [type(e).__name__])[0]
    finally:
        root.setLevel(level)
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    first = next((m.strip().splitlines()[0] for m in messages if m.strip()), "")
    return bool(valid), first
