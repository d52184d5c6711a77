"""ReFrame's performance logs, as the site profiles write them (the `filelog` handler of
site_profiles/site_common.py: one `|`-separated line per performance variable, the format
as the file's first line). Read by `hpckit report` (the site's history) and `hpckit
references calibrate` (references from repeated runs)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.common.inputs import read_text

NEEDED = ("job_completion_time", "display_name", "perf_var", "perf_value")


def perflog_files(args_paths: list[str], option: str = "--perflog") -> list[Path]:
    files = []
    for arg in map(Path, args_paths):
        if arg.is_file():
            files.append(arg)
        elif arg.is_dir():
            found = sorted(arg.rglob("*.log"))
            if not found:
                raise KitError(f"{option} {arg}: no *.log files")
            files += found
        else:
            from hpckit.common.inputs import absent
            raise KitError(f"{option} {arg}: {absent(arg)}")
    return files


def read_perflogs(args_paths: list[str], option: str = "--perflog") -> list[dict]:
    """Every performance figure in the files (or directories searched for *.log), oldest
    first: file, system (system/partition from the path), time, check (display name),
    check_class, params (the display name's %name=value parts), environ, config, var,
    value, unit, ref, result, the reference as numbers: ref_value, lower, upper
    (ReFrame's relative thresholds; None where the check had no reference or that side is
    open), and the software stack the run recorded (`stack`, None in older perflogs). Lines of runs whose sanity failed (value `null`) and of tests without
    performance variables are skipped: they carry no figure."""
    rows = []
    for path in perflog_files(args_paths, option):
        lines = read_text(path, f"{option} {path}", errors="replace").splitlines()
        lines = [ln for ln in lines if ln.strip()]
        if not lines:
            continue
        header = lines[0].split("|")
        missing = [h for h in NEEDED if h not in header]
        if missing:
            raise KitError(f"{option} {path}: header has no '{missing[0]}' field "
                           "(expected the site profile's filelog format)")
        system_partition = "/".join(path.parent.parts[-2:])
        for n, line in enumerate(lines[1:], start=2):
            if line == lines[0]:
                continue  # a header repeated after a format change
            parts = line.split("|")
            if len(parts) != len(header):
                raise KitError(f"{option} {path}: line {n} has {len(parts)} fields, the header {len(header)}")
            rec = dict(zip(header, parts))
            if rec["perf_var"] in ("null", "") or rec["perf_value"] in ("null", ""):
                continue
            try:
                value = float(rec["perf_value"])
                when = datetime.fromisoformat(rec["job_completion_time"])
                if not math.isfinite(value):
                    raise ValueError
                if when.tzinfo is not None:   # one time line: naive local times, as ReFrame writes them
                    when = when.astimezone().replace(tzinfo=None)
            except (ValueError, OverflowError):
                raise KitError(f"{option} {path}: line {n}: bad value or time "
                               f"({rec['perf_value']!r:.60}, {rec['job_completion_time']!r:.60}); perf_value must be "
                               "a finite number") from None
            name, *params = rec["display_name"].split(" %")
            rows.append({"file": str(path), "system": system_partition, "time": when,
                         "check": rec["display_name"], "check_class": name,
                         "params": dict(p.split("=", 1) for p in params if "=" in p),
                         "environ": rec.get("environ", ""), "config": rec.get("config", ""),
                         "var": rec["perf_var"], "value": value,
                         "unit": rec.get("perf_unit", ""), "ref": rec.get("perf_ref", ""),
                         "ref_value": _number(rec.get("perf_ref")),
                         "lower": _number(rec.get("perf_lower_thres")),
                         "upper": _number(rec.get("perf_upper_thres")),
                         "result": rec.get("perf_result", rec.get("result", "")),
                         "stack": _stack(rec.get("stack"), f"{option} {path}", n)})
    rows.sort(key=lambda r: (r["time"], r["check"], r["var"]))
    return rows


def _stack(text: str | None, where: str, n: int) -> dict | None:
    """The software stack the run recorded (the checks' `stack` variable: JSON of
    hpckit.common.provenance.stack), None where the perflog has none."""
    if not text or text in ("null", "<undefined>", "None"):
        return None
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        raise KitError(f"{where}: line {n}: the stack field is not JSON") from None
    if not isinstance(found, dict):
        return None
    from hpckit.common.inputs import conform
    from hpckit.common.provenance import stack_spec
    conform(found, stack_spec(), f"{where}: line {n}", "stack")   # the types the checks write
    return found


def _number(text: str | None) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value else None


def allowed_range(row: dict) -> tuple[float | None, float | None] | None:
    """The absolute range ReFrame judged a figure against: (low, high), either side None
    where it is open; None where the check had no reference (ReFrame writes 0 and null
    thresholds for a variable it does not judge). ReFrame's thresholds are fractions of
    the reference, signed: lower -0.25 means 25 % below it."""
    ref, lower, upper = row.get("ref_value"), row.get("lower"), row.get("upper")
    if not ref or (lower is None and upper is None):
        return None
    return (None if lower is None else ref * (1 + lower), None if upper is None else ref * (1 + upper))
