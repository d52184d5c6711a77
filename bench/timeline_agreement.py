#!/usr/bin/env python3
"""Every published set's training throughput and evaluation share, as `hpckit analyze` reads
them, beside an independent reading of the same logs.

    bench/timeline_agreement.py PATH... [--tolerance 0.10]

PATH: results rounds (a checkout of mlcommons/hpc_results_vX.Y), result folders or logs.
For every set one line: the kit's training samples/s per compute unit after the first epoch
(hpckit.results.timeline through analysis.run_facts, the medians of the set's runs) and the
independent one, their ratio; the kit's evaluation share of the clock and the most the log
allows; `agree` or `DIFFERS`. Then the count; exit 1 when any set differs.

The independent reading is this file's own, from the raw `:::MLLOG` lines (no kit code):

* throughput: per epoch with a next epoch_start, its samples over the time from its
  epoch_start to the next one less its own evaluations (the eval_start..eval_stop with its
  epoch_num logged before the next epoch_start), the median after the first epoch, over the compute
  units (nodes x accelerators per node; nodes where there are no accelerators). The samples
  of an epoch are train_samples; OpenFold's (its epoch_num counts training samples) the
  growth of epoch_num from one epoch_start to the next. It counts the gap between an
  epoch's end and the next start as training, which analyze does not: the two agree to the
  gaps (a few per cent).
* the evaluation share allowed: 1 less the shares of the clock that staging and the
  training certainly took: for every epoch, from its epoch_start to the first of its
  epoch_stop, the next epoch_start and the start of its own evaluation.

Nothing here is a speed figure of this machine; on the four published rounds it takes a
minute or two (every log is read twice).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402,F401  (puts the kit's apps/ on sys.path)

PROG = "timeline_agreement.py"
NO_EPOCHS = ("openfold",)     # logs whose epoch_num counts training samples


def _raw(path: Path) -> list[dict]:
    out = []
    for line in path.read_bytes().decode("latin-1").splitlines():
        i = line.rfind(":::MLLOG ")
        if i < 0:
            continue
        try:
            r = json.loads(line[i + 9:])
        except ValueError:
            continue
        if isinstance(r, dict) and isinstance(r.get("key"), str):
            out.append(r)
    return out


def _n(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _num(r):
    m = r.get("metadata")
    return _n(m.get("epoch_num")) if isinstance(m, dict) else None


def independent(path: Path) -> dict:
    """{'per_unit': training samples/s per unit or None, 'allowed_eval_share': float or
    None, 'why': why per_unit is None} of one log, read here from its raw lines."""
    recs = _raw(Path(path))
    first = {}
    for r in recs:
        first.setdefault(r["key"], r.get("value"))
    stop_i = next((i for i, r in enumerate(recs) if r["key"] == "run_stop"), None)
    start = next((_n(r.get("time_ms")) for r in recs if r["key"] == "run_start"), None)
    if stop_i is None or start is None:
        return {"per_unit": None, "allowed_eval_share": None, "why": "no run_start or run_stop"}
    recs = recs[:stop_i + 1]
    stop = _n(recs[-1].get("time_ms"))
    total = stop - start
    bench = str(first.get("submission_benchmark") or "").lower()
    nodes, acc = _n(first.get("number_of_nodes")), _n(first.get("accelerators_per_node"))
    units = nodes * acc if nodes and acc else nodes
    # (time, epoch_num, line): an epoch's own evaluation is one of its number logged before
    # the next epoch_start (the log's order; its clock has the evaluation ranks' jitter)
    starts = [(_n(r.get("time_ms")), _num(r), i) for i, r in enumerate(recs) if r["key"] == "epoch_start"]
    stops = [(_n(r.get("time_ms")), _num(r)) for r in recs if r["key"] == "epoch_stop"]
    evals, open_at = [], None
    for i, r in enumerate(recs):
        if r["key"] == "eval_start":
            open_at = (_n(r.get("time_ms")), _num(r), i)
        elif r["key"] == "eval_stop" and open_at:
            evals.append((open_at[0], _n(r.get("time_ms")), open_at[1], open_at[2]))
            open_at = None
    nxt = [starts[k + 1][2] if k + 1 < len(starts) else len(recs) for k in range(len(starts))]

    def own(k):
        a, n, i = starts[k]
        return [(c, d) for c, d, m, j in evals if m == n and i < j < nxt[k]]

    rates, why = [], ""
    samples = _n(first.get("train_samples"))
    for k, ((a, n, _), (b, _, _)) in enumerate(zip(starts, starts[1:])):
        evaluated = sum(d - c for c, d in own(k))
        if bench in NO_EPOCHS:
            prev = starts[k - 1][1] if k else 0
            s = n - prev if n is not None and prev is not None else None
        else:
            s = samples
        if s and s > 0 and b - a - evaluated > 0:
            rates.append(s / ((b - a - evaluated) / 1000.0))
    if not rates:
        why = "no epoch with a next epoch_start, samples and time"
    later = rates[1:] or rates
    per_unit = statistics.median(later) / units if later and units else None

    # the training certainly done: each epoch from its start to its stop, the next start or
    # its own evaluation's start, whichever comes first
    trained = 0.0
    for k, (a, n, _) in enumerate(starts):
        ends = [stop, starts[k + 1][0] if k + 1 < len(starts) else stop]
        ends += [t for t, m in stops if m == n and t >= a][:1]
        ends += [c for c, _ in own(k)][:1]
        trained += max(0.0, min(min(ends), stop) - max(a, start))
    s0, s1 = (next((_n(r.get("time_ms")) for r in recs if r["key"] == k), None)
              for k in ("staging_start", "staging_stop"))
    staged = max(0.0, min(s1, stop) - max(s0, start)) if s0 is not None and s1 is not None else 0.0
    allowed = max(0.0, 1.0 - (trained + staged) / total) if total > 0 else None
    return {"per_unit": per_unit, "allowed_eval_share": allowed, "why": why}


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def compare(paths: list[str], tolerance: float) -> tuple[list[dict], int]:
    """One row per set: the kit's and the independent readings; and how many sets differ."""
    from hpckit.results.analysis import gather
    sets, facts = gather(paths, "published", set())
    rows, differ = [], 0
    for s in sets:
        fs = [facts[r.path] for _, r in s["runs"] if r.path in facts]
        ind = [independent(Path(f.name)) for f in fs]
        kit = _median([f.steady_per_unit for f in fs])
        other = _median([i["per_unit"] for i in ind])
        share = _median([f.eval_share for f in fs])
        # every run's share within what its own log allows (half a per cent for the logs' ms)
        over = [f.name for f, i in zip(fs, ind) if f.eval_share is not None and i["allowed_eval_share"] is not None
                and f.eval_share > i["allowed_eval_share"] + 0.005]
        allowed = _median([i["allowed_eval_share"] for i in ind])
        ratio = kit / other if kit and other else None
        if kit is None and other is None:
            ok, note = not over, "both n/a: " + (next((f.throughput_why for f in fs if f.throughput_why), "")
                                                 or next((i["why"] for i in ind if i["why"]), ""))
        else:
            ok = ratio is not None and abs(ratio - 1.0) <= tolerance and not over
            note = "" if ratio is not None else "one reading n/a"
        if over:
            note += f"; eval share above what {len(over)} run(s) allow"
        differ += not ok
        rows.append({"round": fs[0].round, "org": s["org"], "system": s["platform"], "benchmark": s["benchmark"],
                     "scaling": s["score"]["kind"], "runs": len(fs), "kit_per_unit": kit,
                     "independent_per_unit": other, "ratio": ratio, "eval_share": share,
                     "allowed_eval_share": allowed, "eval_mode": "/".join(sorted({f.eval_mode for f in fs})),
                     "agree": ok, "note": note.strip("; ")})
    return rows, differ


def _g(v, spec=".4g"):
    return "n/a" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="PATH")
    ap.add_argument("--tolerance", type=float, default=0.10, help="largest |kit / independent - 1| that agrees")
    args = ap.parse_args(argv)
    for p in args.paths:
        if not Path(p).exists():
            benchlib.bad(PROG, f"{p}: no such file or directory")
    if not 0 < args.tolerance < 1:
        benchlib.bad(PROG, f"--tolerance {args.tolerance}: give a fraction between 0 and 1")
    from hpckit.common.errors import KitError
    try:
        rows, differ = compare(args.paths, args.tolerance)
    except KitError as e:
        benchlib.bad(PROG, str(e))
    print("| round | submitter | system | benchmark | scaling | runs | evaluation | train samples/s per unit: "
          "kit | independent | kit / independent | eval share: kit | allowed | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round'] or '-'} | {r['org']} | {r['system']} | {r['benchmark']} | {r['scaling']} | {r['runs']} | "
              f"{r['eval_mode']} | {_g(r['kit_per_unit'])} | {_g(r['independent_per_unit'])} | "
              f"{_g(r['ratio'], '.3f')} | {_g(r['eval_share'], '.1%')} | {_g(r['allowed_eval_share'], '.1%')} | "
              f"{'agree' if r['agree'] else 'DIFFERS'}{': ' + r['note'] if r['note'] else ''} |")
    print(f"{len(rows) - differ} sets agree, {differ} differ (tolerance {args.tolerance:.0%})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
