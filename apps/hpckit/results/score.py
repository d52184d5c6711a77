"""Scores of MLPerf HPC result sets.

Strong scaling: time to train of each run (run_stop - run_start, minutes); drop the
fastest and the slowest and take the arithmetic mean of the rest. One non-converged run
counts as the slowest (it is the one dropped); two or more make the set invalid.
Weak scaling (logs with metadata.instance): time_to_train_all = max(run_stop) -
min(run_start) over the instances.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.results.logs import MARKER, RunLog, parse_log

MIN_RUNS = 3


def strong_score(runs: list[RunLog]) -> dict:
    n = len(runs)
    out = {"kind": "strong", "valid": False, "score_min": None, "reason": None,
           "runs_total": n, "runs_used": 0, "dropped": [], "non_converged": []}
    bad = [r for r in runs if not r.converged]
    out["non_converged"] = [r.path for r in bad]
    if n < MIN_RUNS:
        out["reason"] = f"{n} run(s), at least {MIN_RUNS} needed"
        return out
    if len(bad) >= 2:
        out["reason"] = f"{len(bad)} runs did not converge (at most 1 allowed)"
        return out
    good = sorted((r for r in runs if r.converged), key=lambda r: r.time_to_train_min)
    if bad:
        fastest, slowest, kept = good[0], bad[0], good[1:]
    else:
        fastest, slowest, kept = good[0], good[-1], good[1:-1]
    out.update(valid=True, runs_used=len(kept), dropped=[fastest.path, slowest.path],
               score_min=sum(r.time_to_train_min for r in kept) / len(kept))
    return out


def weak_score(runs: list[RunLog]) -> dict:
    out = {"kind": "weak", "valid": False, "reason": None, "time_to_train_all_min": None,
           "number_of_models": len(runs), "instances": sorted({str(r.instance) for r in runs}),
           "instance_scale_nodes": None, "non_converged": [r.path for r in runs if not r.converged]}
    if not runs:
        out["reason"] = "no runs"
        return out
    nodes = {r.number_of_nodes for r in runs}
    if len(nodes) == 1 and None not in nodes:
        out["instance_scale_nodes"] = nodes.pop()
    start = min(r.run_start_ms for r in runs)
    stop = max(r.run_stop_ms for r in runs)
    out["time_to_train_all_min"] = (stop - start) / 60000.0
    if out["non_converged"]:
        out["reason"] = f"{len(out['non_converged'])} instance(s) did not converge"
        return out
    out["valid"] = True
    return out


def score_set(runs: list[RunLog]) -> dict:
    if any(r.instance is not None for r in runs):
        return weak_score(runs)
    return strong_score(runs)


# ---- collecting sets from paths ----

def _natural(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def _is_mllog(p: Path) -> bool:
    """A *.log that holds MLPerf log lines (not, say, a run's tensorflow-native.log)."""
    try:
        with open(p, "rb") as f:
            return MARKER.encode() in f.read(1 << 16)
    except OSError:
        return False


def _dir_logs(d: Path) -> list[Path]:
    found = {p for p in d.rglob("result_*.txt") if p.is_file()}
    found |= {p for p in d.rglob("*.log") if p.is_file() and _is_mllog(p)}
    return sorted(found, key=_natural)


def collect_sets(paths: list[str | Path]) -> list[dict]:
    """Each directory's logs form one set per (benchmark, platform); loose files are
    grouped together by (benchmark, org, platform)."""
    sets: list[dict] = []
    loose: dict[tuple, list] = {}
    for arg in map(Path, paths):
        if arg.is_dir():
            logs = _dir_logs(arg)
            if not logs:
                raise KitError(f"directory {arg}: no result logs (result_*.txt, *.log)")
            groups: dict[tuple, list] = {}
            for p in logs:
                run = parse_log(p)
                groups.setdefault((run.benchmark, run.platform), []).append(
                    (str(p.relative_to(arg)), run))
            sets += [{"source": str(arg), "runs": v} for v in groups.values()]
        elif arg.is_file():
            run = parse_log(arg)
            loose.setdefault((run.benchmark, run.org, run.platform), []).append((arg.name, run))
        else:
            raise KitError(f"{arg}: no such file or directory")
    sets += [{"source": None, "runs": v} for v in loose.values()]
    for s in sets:
        runs = [r for _, r in s["runs"]]
        head = runs[0]
        nodes = sorted({r.number_of_nodes for r in runs if r.number_of_nodes is not None})
        s.update(benchmark=head.benchmark, org=head.org, platform=head.platform,
                 nodes=nodes[0] if len(nodes) == 1 else (nodes or None),
                 score=score_set(runs))
    return sets


def _fmt_score(sc: dict, names: dict) -> str:
    if not sc["valid"] and sc["kind"] == "strong":
        return f"score: invalid ({sc['reason']})"
    if sc["kind"] == "strong":
        text = (f"score: {sc['score_min']:.2f} min (olympic mean of {sc['runs_used']} "
                f"of {sc['runs_total']} runs")
        if sc["non_converged"]:
            text += f"; non-converged {names[sc['non_converged'][0]]} counted as slowest"
        return text + ")"
    scale = (f", instance scale {sc['instance_scale_nodes']} nodes"
             if sc["instance_scale_nodes"] is not None else "")
    body = (f"time_to_train_all {sc['time_to_train_all_min']:.2f} min for "
            f"{sc['number_of_models']} models{scale}")
    return f"score: {body}" if sc["valid"] else f"score: invalid ({sc['reason']}; {body})"


def format_sets(sets: list[dict]) -> list[str]:
    lines = []
    for s in sets:
        nodes = s["nodes"] if s["nodes"] is not None else "?"
        kind = s["score"]["kind"]
        lines.append(f"{s['benchmark']} | org {s['org']} | platform {s['platform']} | "
                     f"nodes {nodes} | {len(s['runs'])} runs ({kind} scaling)")
        names = {r.path: name for name, r in s["runs"]}
        for name, r in s["runs"]:
            ep = r.epochs if r.epochs is not None else "?"
            inst = f"  instance {r.instance}" if r.instance is not None else ""
            lines.append(f"  {name}  {r.time_to_train_min:.2f} min  converged "
                         f"{'yes' if r.converged else 'no'}  epochs {ep}{inst}")
        lines.append(_fmt_score(s["score"], names))
    return lines


def to_json(sets: list[dict]) -> dict:
    return {"valid": all(s["score"]["valid"] for s in sets),
            "sets": [{"benchmark": s["benchmark"], "org": s["org"], "platform": s["platform"],
                      "nodes": s["nodes"], "source": s["source"], "score": s["score"],
                      "runs": [{"name": n, **r.to_dict()} for n, r in s["runs"]]}
                     for s in sets]}


def main_score(args) -> int:
    sets = collect_sets(args.paths)
    print("\n".join(format_sets(sets)))
    if args.json:
        from hpckit.common.fileio import atomic_write_json
        try:
            atomic_write_json(args.json, to_json(sets))
        except OSError as e:
            raise KitError(f"--json {args.json}: cannot write ({e.strerror or e})") from None
    sys.stdout.flush()
    return 0 if all(s["score"]["valid"] for s in sets) else 1
