"""The project's one reader of MLPerf result logs (`:::MLLOG {...}` lines): score,
package, report and check read logs through it (check hands the file to the official
checker as well).

Real logs carry quirks that a parser must survive: text before `:::MLLOG` (MPI rank
prefixes), events after `run_stop`, staging before or after `run_start`, `eval_stop`
logged as INTERVAL_START, 0-based epoch numbers, missing node counts. Convergence is
judged only on events up to the first `run_stop` (in file order).

`parse_log(path)` raises KitError on a log it cannot score (no run_start, no run_stop);
`parse_log(path, strict=False)` returns it as a run that did not converge, with the reason
in `problem`, as the official result summarizer drops such a run (a `pruned` or killed run
in a published set is one). A damaged log (a NaN, text or negative where every log has a
number: `_check`) is bad input either way: DamagedLog, one line naming file, line and key.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass
from pathlib import Path

from hpckit.common.benchmark import descriptors
from hpckit.common.errors import KitError

MARKER = ":::MLLOG "

# benchmark -> (metric key, comparison, official target), from each benchmark's descriptor
# (hpckit/<benchmark>/__init__.py).
TARGETS = {name: (d.metric, d.comparison, d.official_target) for name, d in descriptors().items()}
# where the kit's logs (hpckit_config, the flattened training config) keep the target
KIT_TARGET_KEYS = {name: d.target_key for name, d in descriptors().items()}
_OPS = {"<=": operator.le, ">=": operator.ge}
_RECORDED_METRICS = ("eval_accuracy", "eval_error")
# Benchmarks whose logs count no epochs: their epoch_num is something else, and a reader
# must not call it epochs (the descriptor's no_epochs says why: OpenFold's).
NO_EPOCHS = {name: d.no_epochs for name, d in descriptors().items() if d.no_epochs}
_METRIC_KEYS = {d[0] for d in TARGETS.values()}


@dataclass
class RunLog:
    path: str
    benchmark: str | None
    org: str | None
    platform: str | None
    division: str | None
    status: str | None
    number_of_nodes: int | None
    accelerators_per_node: int | None
    run_start_ms: int | None
    run_stop_ms: int | None
    run_stop_status: str | None
    converged: bool
    time_to_train_min: float
    epochs: int | None
    metric: str | None
    metric_value: float | None
    target: str | None
    target_reached: bool | None
    staging_start_ms: int | None
    staging_stop_ms: int | None
    instance: object | None
    problem: str | None = None    # why this log cannot count (strict=False only)

    def to_dict(self) -> dict:
        return asdict(self)


def mllog_lines(data: bytes):
    """(1-based line number, record or None) for every line holding the marker; None for a
    line whose JSON is cut or mangled. Latin-1 and universal newlines, as the official
    checker's parser reads (so line numbers agree with its messages)."""
    text = data.decode("latin-1").replace("\r\n", "\n").replace("\r", "\n")
    for number, line in enumerate(text.split("\n"), start=1):
        i = line.rfind(MARKER)
        if i < 0:
            continue
        try:
            rec = json.loads(line[i + len(MARKER):])
        except (ValueError, RecursionError):   # RecursionError: nesting deeper than json's recursion (tests/fuzz.py)
            yield number, None
            continue
        yield number, (rec if isinstance(rec, dict) and isinstance(rec.get("key"), str) else None)


# The numbers every reader relies on, checked once here with the types and ranges the
# published logs of v0.7-v3.0 (3,657 logs, 1.38 M lines: all integers, epoch_num >= 0) and
# the kit's own logs have: a log that breaks them is one line naming the file, the line and
# the key (a NaN, a text or a negative where a count belongs), never a traceback later.
MAX_TIME_MS = 10 ** 14     # year 5138: a time_ms beyond is not a time
SIZES = {"global_batch_size": 1, "train_samples": 1, "eval_samples": 1, "number_of_nodes": 1,
         "number_of_ranks": 1, "accelerators_per_node": 0}     # key -> smallest value


class DamagedLog(KitError):
    """A log whose numbers break the types and ranges every log has (_check): bad input,
    whichever command reads it (never a run that merely did not converge)."""


def _check(rec: dict, path: Path, n: int) -> None:
    try:
        _check_numbers(rec, path, n)
    except KitError as e:
        raise DamagedLog(str(e)) from None


def _check_numbers(rec: dict, path: Path, n: int) -> None:
    from hpckit.common.inputs import number
    key = rec["key"]
    where = f"log {path}"
    if "time_ms" in rec:
        number(rec["time_ms"], where, f"line {n}: {key} time_ms", minimum=-MAX_TIME_MS, maximum=MAX_TIME_MS)
    meta = rec.get("metadata")
    if isinstance(meta, dict) and meta.get("epoch_num") is not None:
        number(meta["epoch_num"], where, f"line {n}: {key} metadata.epoch_num", minimum=0, integer=True,
               maximum=2 ** 53)
    if key in SIZES and rec.get("value") is not None:
        number(rec["value"], where, f"line {n}: {key}", minimum=SIZES[key], integer=True, maximum=2 ** 53)
    if key in _RECORDED_METRICS or key in _METRIC_KEYS:
        value = rec.get("value")
        # a diverged run logs NaN (the kit's runs do): a number that never reaches a target
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KitError(f"{where}: line {n}: {key}: expected a number, got {value!r:.60}")
        if isinstance(value, int):
            number(value, where, f"line {n}: {key}")      # an integer beyond what a float holds


def _records(path: Path) -> list[dict]:
    from hpckit.common.inputs import read_bytes
    data = read_bytes(path, f"log {path}")
    out = []
    for n, rec in mllog_lines(data):
        if rec is not None:
            _check(rec, path, n)
            out.append(rec)
    if not out:
        raise KitError(f"log {path}: no :::MLLOG lines, not an MLPerf result log")
    return out


records = _records


def _time(rec: dict, path: Path, key: str) -> int:
    t = rec.get("time_ms")
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        raise KitError(f"log {path}: {key} has no numeric time_ms")
    return int(t)     # finite and in range: _check


def _int_or_none(v):
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def parse_log(path: str | Path, strict: bool = True) -> RunLog:
    if strict:
        return _parse(Path(path))
    try:
        return _parse(Path(path))
    except DamagedLog:
        raise
    except KitError as e:
        fields = dict(path=str(path), benchmark=None, org=None, platform=None, division=None, status=None,
                      number_of_nodes=None, accelerators_per_node=None, run_start_ms=None, run_stop_ms=None,
                      run_stop_status=None, converged=False, time_to_train_min=float("nan"), epochs=None,
                      metric=None, metric_value=None, target=None, target_reached=None, staging_start_ms=None,
                      staging_stop_ms=None, instance=None, problem=str(e).split(": ", 1)[-1])
        fields.update(_header(Path(path)))
        return RunLog(**fields)


def _header(path: Path) -> dict:
    """What a log that cannot be scored still says about itself (benchmark, org, platform)."""
    try:
        recs = _records(path)
    except KitError:
        return {}
    first = {}
    for r in recs:
        first.setdefault(r["key"], r.get("value"))
    keys = {"benchmark": "submission_benchmark", "org": "submission_org", "platform": "submission_platform",
            "division": "submission_division", "status": "submission_status"}
    out = {k: str(first[v]) for k, v in keys.items() if first.get(v) is not None}
    for k in ("number_of_nodes", "accelerators_per_node"):
        if _int_or_none(first.get(k)) is not None:
            out[k] = _int_or_none(first.get(k))
    return out


def _parse(path: Path) -> RunLog:
    recs = _records(path)
    start_i = next((i for i, r in enumerate(recs) if r["key"] == "run_start"), None)
    stop_i = next((i for i, r in enumerate(recs) if r["key"] == "run_stop"), None)
    if start_i is None:
        raise KitError(f"log {path}: no run_start line")
    if stop_i is None:
        raise KitError(f"log {path}: no run_stop line (run unfinished?)")
    start_ms = _time(recs[start_i], path, "run_start")
    stop_ms = _time(recs[stop_i], path, "run_stop")
    if stop_ms < start_ms:
        raise KitError(f"log {path}: run_stop ({stop_ms}) before run_start ({start_ms})")
    stop_meta = recs[stop_i].get("metadata") or {}
    stop_status = stop_meta.get("status") if isinstance(stop_meta, dict) else None

    first: dict[str, object] = {}   # first value of each key anywhere in the log
    first_time: dict[str, int] = {}
    instance = None
    for r in recs:
        first.setdefault(r["key"], r.get("value"))
        if isinstance(r.get("time_ms"), (int, float)):
            first_time.setdefault(r["key"], int(r["time_ms"]))
        meta = r.get("metadata")
        if instance is None and isinstance(meta, dict) and meta.get("instance") is not None:
            instance = meta["instance"]

    def s(key):
        v = first.get(key)
        return str(v) if v is not None else None

    benchmark = s("submission_benchmark")
    bench_key = benchmark.lower() if benchmark else None

    # Up to run_stop only: epochs and the quality metric.
    upto = recs[:stop_i + 1]
    epoch_nums = []
    for r in upto:
        meta = r.get("metadata")
        if isinstance(meta, dict):
            n = _int_or_none(meta.get("epoch_num"))
            if n is not None:
                epoch_nums.append(n)
    epochs = None
    if epoch_nums and bench_key not in NO_EPOCHS:
        epochs = max(epoch_nums) + (1 if min(epoch_nums) == 0 else 0)

    target_spec = TARGETS.get(bench_key or "")
    kit_config = first.get("hpckit_config")
    if target_spec and isinstance(kit_config, dict):
        # the kit's own runs are judged against the target of the config they trained
        # (mini configs have their own; the reference config's equals the official one)
        own = kit_config.get(KIT_TARGET_KEYS[bench_key])
        if isinstance(own, (int, float)) and not isinstance(own, bool):
            target_spec = (target_spec[0], target_spec[1], float(own))
    if target_spec:
        metric = target_spec[0]
    else:
        seen = [r["key"] for r in upto if r["key"] in _RECORDED_METRICS]
        metric = seen[-1] if seen else None
    values = [float(r["value"]) for r in upto
              if r["key"] == metric and isinstance(r.get("value"), (int, float))
              and not isinstance(r.get("value"), bool)]
    # a non-finite value (a diverged run) reaches no target and is shown as none
    metric_value = values[-1] if values and math.isfinite(values[-1]) else None
    values = [v for v in values if math.isfinite(v)]

    target = reached = None
    if target_spec:
        _, op, thr = target_spec
        target = f"{metric} {op} {thr}"
        reached = any(_OPS[op](v, thr) for v in values)
    success = stop_status == "success"
    converged = success and (reached if target_spec else True)

    return RunLog(
        path=str(path), benchmark=benchmark, org=s("submission_org"),
        platform=s("submission_platform"), division=s("submission_division"),
        status=s("submission_status"),
        number_of_nodes=_int_or_none(first.get("number_of_nodes")),
        accelerators_per_node=_int_or_none(first.get("accelerators_per_node")),
        run_start_ms=start_ms, run_stop_ms=stop_ms,
        run_stop_status=str(stop_status) if stop_status is not None else None,
        converged=bool(converged), time_to_train_min=(stop_ms - start_ms) / 60000.0,
        epochs=epochs, metric=metric, metric_value=metric_value, target=target,
        target_reached=reached, staging_start_ms=first_time.get("staging_start"),
        staging_stop_ms=first_time.get("staging_stop"), instance=instance,
    )
