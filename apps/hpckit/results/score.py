"""Scores of MLPerf HPC result sets, computed as the official result summarizer computes
them (mlperf_logging 4.1.68, mlperf_logging/result_summarizer/result_summarizer.py; read
for the rules below, nothing of it is reused but the compliance checker it calls).

Which sets, and strong or weak scaling: by the submission layout, as the summarizer decides
(`_compute_strong_scaling_scores` reads `<system>/strong/<benchmark>/`,
`_compute_weak_scaling_scores` `<system>/weak/<benchmark>/`); the v0.7/v1.0 layout
`results/<system>/<benchmark>/` is strong scaling. A set is the `result_*.txt` directly in
that folder (the summarizer's glob): folders beside them (`pruned_results/`, `power/`) are
not runs of the set. A bare folder of logs outside that layout needs `--scaling`, except
the kit's own runs (logs with `hpckit_config`), which are strong scaling, or weak scaling
where they are the instances of one campaign (`hpckit train --instances M`: hpckit_config
logs `instances`; one set per campaign folder); without either
the kit says that it cannot tell. `--scaling` never overrides the layout. Logs are never asked (`instance` metadata is in strong
scaling logs of v2.0 and later too).

Which runs count: a run counts when it has run_start and run_stop, run_stop status
success and the quality target reached, and, with `--ruleset hpc-X.Y.Z`, when the official
compliance checker passes it (the summarizer's only test). A run that does not count is
a non-converged run: an unfinished, killed, garbled or non-compliant log never stops the
scoring of the others. Byte-identical copies of one log make the set invalid.

Strong scaling (`_compute_strong_score_standalone`): the times to train (run_stop -
run_start, minutes) of the runs that count, sorted; with d runs not counting (at most 1,
else the set is invalid) drop the fastest and 1 - d of the slowest, mean of the rest,
times the RCP scaling factor. That factor is what the official pipeline computes: its
package checker (package_checker.py, closed division, rulesets >= 1.0.0) runs the RCP
checker with set_scaling, which removes the folder's scaling.json and, when the set's mean
epochs to converge (fastest and slowest dropped) are below the reference convergence point's
mean yet within its maximum speed-up, writes RCP mean / that mean into it; the summarizer
multiplies the olympic mean by it (result_summarizer.py `_get_scaling_factor`). The kit
runs the same RCP checker on a private copy of the set's logs (never writing into the tree
it scores), with `--ruleset`'s version, else the newest hpc ruleset (the 2.0.0 and 3.0.0
RCPs of CosmoFlow and DeepCAM are the same; score a v1.0 tree with --ruleset hpc-1.0.0),
and prints the factor beside the unscaled time. Where the package checker would not run the
RCP checker (open division, the kit's own runs on synthetic data), a scaling.json in the
folder is applied as the summarizer reads it.
A published round (`--as-published`): the summarizer run on the tree as published multiplies
by the scaling.json each folder holds when it starts (result_summarizer.py:337-348 read at
:410, before its own RCP check with set_scaling=True at :527-539 rewrites the file for the
next run), and that is the round's published figure: hpc_results_v3.0's NVIDIA
eos_n260 OpenFold folder holds no scaling.json and was published at 7.51 min, the unscaled
olympic mean, although the RCP checker (4.1.68, and the hpc-3.0.0 tag's alike) writes 1.0722
for it; Clemson's folder holds the 1.0231 the RCP checker writes. With --as-published the kit
applies the scaling.json found and recomputes nothing.
The rules are the same for every benchmark but one: at most 1 non-converged run and one
dropped from each end (`max_dropped_scores = 4 if benchmark == "unet3d" else 1`,
result_summarizer.py:386; olympic mean :181-201), minutes = (run_stop - run_start) ms / 60000
(:158-162). OpenFold (hpc 3.0.0) has nothing of its own in scoring: 10 results a set
(benchmark_meta.py:36), its time in the same run_start/run_stop; its RCPs count samples, not
epochs (the eval_accuracy's epoch_num, rcp_checker.py:120-123), which only the factor sees.
Line numbers: mlperf_logging 4.1.68 as installed.
Weak scaling (`_compute_weak_score_standalone`): number of models = the runs that count
(at least the benchmark's result count, :461, else invalid); instance scale = number_of_nodes x
max(accelerators_per_node, 1) (`_query_instance_scale`: accelerators, or processors where
a system has none), equal for every run; time_to_train_all = latest run_stop - earliest
run_start over the runs that count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.results.logs import MARKER, RunLog, parse_log

BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")
# runs a set needs (mlperf_logging benchmark_meta.py, _ALL_RESULT_FILE_COUNTS['hpc'])
RESULT_COUNTS = {"cosmoflow": 10, "deepcam": 5, "oc20": 5, "openfold": 10}   # 4.1.68 benchmark_meta.py:32-37
PRUNED = "pruned_results"


# ---- which runs count -------------------------------------------------------------------

def judge(run: RunLog, verdict: tuple[bool, str] | None = None) -> tuple[bool, str]:
    """(counts, why) for one run."""
    if run.problem:
        return False, run.problem
    if run.run_stop_status != "success":
        return False, f"run_stop status {run.run_stop_status or 'missing'}"
    if run.target_reached is False:
        return False, f"target not reached ({run.target})"
    if verdict is not None and not verdict[0]:
        return False, f"not compliant: {verdict[1] or 'the official checker failed it'}"
    return True, "counts"


def strong_score(runs: list[RunLog], counts: list[bool] | None = None, scaling_factor: float = 1.0) -> dict:
    counts = [r.converged for r in runs] if counts is None else counts
    good = sorted((r for r, c in zip(runs, counts) if c), key=lambda r: r.time_to_train_min)
    dropped = len(runs) - len(good)
    out = {"kind": "strong", "valid": False, "score_min": None, "reason": None,
           "runs_total": len(runs), "runs_used": 0, "dropped": [],
           "non_converged": [r.path for r, c in zip(runs, counts) if not c], "scaling_factor": scaling_factor}
    if dropped > 1:
        out["reason"] = f"{dropped} runs did not converge (at most 1 allowed)"
        return out
    kept = good[1:len(good) - (1 - dropped)]
    if not kept:
        out["reason"] = f"{len(runs)} run(s): nothing left after dropping the fastest and the slowest"
        return out
    dropped_runs = [good[0].path] + ([good[-1].path] if dropped == 0 else out["non_converged"])
    unscaled = sum(r.time_to_train_min for r in kept) / len(kept)
    out.update(valid=True, runs_used=len(kept), dropped=dropped_runs, unscaled_min=unscaled,
               score_min=unscaled * scaling_factor)
    return out


def weak_score(runs: list[RunLog], counts: list[bool] | None = None, benchmark: str | None = None) -> dict:
    counts = [r.converged for r in runs] if counts is None else counts
    good = [r for r, c in zip(runs, counts) if c]
    need = RESULT_COUNTS.get((benchmark or "").lower(), 1)
    out = {"kind": "weak", "valid": False, "reason": None, "time_to_train_all_min": None,
           "number_of_models": len(good), "runs_total": len(runs), "instance_scale": None,
           "models_required": need, "non_converged": [r.path for r, c in zip(runs, counts) if not c]}
    scales = {r.number_of_nodes * max(r.accelerators_per_node, 1) for r in good}
    if len(scales) > 1:
        out["reason"] = f"instances of different scales ({', '.join(map(str, sorted(scales)))})"
        return out
    if scales:
        out["instance_scale"] = scales.pop()
        out["time_to_train_all_min"] = (max(r.run_stop_ms for r in good) - min(r.run_start_ms for r in good)) / 60000.0
    if len(good) < need:
        out["reason"] = f"{len(good)} converged instance(s), at least {need} needed"
        return out
    out["valid"] = True
    return out


def _judge_weak(run: RunLog, verdict) -> tuple[bool, str]:
    ok, why = judge(run, verdict)
    if ok and (run.number_of_nodes is None or run.accelerators_per_node is None):
        # the summarizer drops such a run (_query_instance_scale raises ValueError)
        return False, "no number_of_nodes or accelerators_per_node: instance scale unknown"
    return ok, why


# ---- finding sets -----------------------------------------------------------------------

def _natural(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def _is_mllog(p: Path) -> bool:
    """A *.log that holds MLPerf log lines (not, say, a run's tensorflow-native.log)."""
    from hpckit.common.inputs import read_head
    return MARKER.encode() in (read_head(p, 1 << 16) or b"")


def _layout(d: Path) -> tuple[str, str] | None:
    """(scaling, system) when d is a benchmark folder of the submission layout."""
    if d.name.lower() not in BENCHMARKS:
        return None
    if d.parent.name in ("strong", "weak"):
        return d.parent.name, d.parent.parent.name
    if d.parent.parent.name == "results":
        return "strong", d.parent.name
    return None


def _walk(root: Path):
    """Directories under root (root included), sorted, skipping hidden ones."""
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
        yield Path(dirpath), dirnames


def _org_of(bench_dir: Path) -> Path | None:
    """<org> of <org>/results/<system>/[strong|weak/]<benchmark>, when the layout is whole."""
    system = bench_dir.parent.parent if bench_dir.parent.name in ("strong", "weak") else bench_dir.parent
    return system.parent.parent if system.parent.name == "results" else None


def find_sets(paths: list[str | Path], scaling: str | None = None,
              fallback: str | None = None) -> tuple[list[dict], list[str]]:
    """The result sets under the paths, and notes on what was left out. `scaling` (the
    user's --scaling) decides for every log outside the layout; `fallback` only for those
    nothing else tells (not the kit's own runs or campaigns)."""
    sets: list[dict] = []
    notes: list[str] = []
    loose: list[Path] = []
    for arg in map(Path, paths):
        if arg.is_file():
            loose.append(arg)
            continue
        if not arg.is_dir():
            from hpckit.common.inputs import absent
            raise KitError(f"{arg}: {absent(arg)}")
        laid_out, found = [], []
        for d, sub in _walk(arg):
            where = _layout(d)
            logs = sorted((p for p in d.glob("result_*.txt") if p.is_file()), key=_natural)
            if PRUNED in sub:
                sub.remove(PRUNED)
                notes.append(f"{d / PRUNED}: " + ("not runs of the set (the summarizer reads the result_*.txt "
                                                  "beside it only)" if where and logs else
                                                  "left out (runs a submission pruned)"))
            if where and logs:
                scale_kind, system = where
                laid_out.append({"source": str(d), "scaling": scale_kind, "scaling_from": "layout",
                                 "system": system, "layout_benchmark": d.name.lower(),
                                 "org_dir": _org_of(d), "logs": logs})
                sub[:] = []   # a set's subfolders (power/, ...) are not runs of it
                continue
            # outside the layout: also logs named as in ../real_logs (<round>__..__result_N.txt) and
            # the kit's own mlperf.log (any *.log holding MLPerf lines)
            found += [p for p in sorted(d.iterdir(), key=_natural) if p.is_file() and (
                (p.suffix == ".txt" and "result_" in p.name and not p.name.endswith(".compliance.txt"))
                or (p.suffix == ".log" and _is_mllog(p)))]
        if not laid_out and not found:
            raise KitError(f"directory {arg}: no result logs (no mlperf.log or other *.log with MLPerf lines, no result_*.txt)")
        sets += laid_out
        loose += found
    # a log reached twice through overlapping arguments (a folder and its parent) is one log
    seen_dirs, unique_sets = set(), []
    for s in sets:
        key = Path(s["source"]).resolve()
        if key not in seen_dirs:
            seen_dirs.add(key)
            unique_sets.append(s)
    in_sets = {p.resolve() for s in unique_sets for p in s["logs"]}
    seen_files, unique_loose = set(), []
    for p in loose:
        key = p.resolve()
        if key not in seen_files and key not in in_sets:
            seen_files.add(key)
            unique_loose.append(p)
    sets = unique_sets
    if unique_loose:
        sets += _bare_sets(unique_loose, scaling, fallback)
    return sets, notes


def _bare_sets(files: list[Path], scaling: str | None, fallback: str | None = None) -> list[dict]:
    runs = {p: parse_log(p, strict=False) for p in files}
    for p, r in runs.items():
        if r.problem and r.problem.startswith("no :::MLLOG") and len(files) == 1:
            raise KitError(f"log {p}: {r.problem}")
    if scaling is None and fallback is None and not all(_is_kit_log(p) for p in files):
        where = os.path.commonpath([str(p.parent) for p in files])
        raise KitError(f"{where}: cannot tell strong from weak scaling: put the logs in the submission "
                       "layout (<system>/strong/<benchmark>/ or <system>/weak/<benchmark>/) or pass "
                       "--scaling strong|weak")
    groups: dict[tuple, list[Path]] = {}
    for p in files:
        r = runs[p]
        if scaling is not None:
            key = (scaling, "--scaling", r.benchmark, r.platform, None)
        elif _kit_campaign(p):   # one campaign's instances: OUT/instance_<i>/mlperf.log
            key = ("weak", "the kit's own campaign", r.benchmark, r.platform, p.parent.parent)
        elif _is_kit_log(p):   # runs of another config or data size are another set
            key = ("strong", "the kit's own runs", r.benchmark, r.platform, _kit_data(p))
        elif fallback is None:
            key = ("strong", "the kit's own runs", r.benchmark, r.platform, None)
        else:
            key = (fallback, "outside the layout, taken as " + fallback, r.benchmark, r.platform, None)
        groups.setdefault(key, []).append(p)
    return [{"source": os.path.commonpath([str(p.parent) for p in g]) if len(g) > 1 else str(g[0].parent),
             "scaling": kind, "scaling_from": source, "system": None, "layout_benchmark": None, "org_dir": None,
             "logs": g, "parsed": runs} for (kind, source, *_), g in groups.items()]


def _kit_campaign(p: Path) -> bool:
    """A kit log written by an instance of a throughput campaign (`hpckit train --instances
    M`, M > 1: its hpckit_config says `instances`)."""
    from hpckit.common.inputs import read_head
    head = read_head(p, 1 << 16) or b""
    m = re.search(rb'"key": "hpckit_config".*?"instances": (\d+)', head)
    return bool(m) and int(m.group(1)) > 1


def _kit_data(p: Path) -> tuple:
    """(config, train samples) a kit log trained on: a site's mini and reference runs of one
    platform are sets of their own, never one score over two data sets."""
    from hpckit.common.inputs import read_head
    head = read_head(p, 1 << 16) or b""
    name = re.search(rb'"key": "hpckit_config", "value": \{"name": "([^"\\]*)"', head)
    n = re.search(rb'"key": "train_samples", "value": (\d+)', head)
    return (name.group(1).decode(errors="replace") if name else None, int(n.group(1)) if n else None)


def _is_kit_log(p: Path) -> bool:
    from hpckit.common.inputs import read_head
    return b'"key": "hpckit_config"' in (read_head(p, 1 << 16) or b"")


def _system_desc(org_dir: Path | None, system: str | None) -> dict:
    if org_dir is None or system is None:
        return {}
    from hpckit.common.inputs import read_json
    f = org_dir / "systems" / f"{system}.json"
    try:
        desc = read_json(f, str(f), limit=1 << 24)
    except KitError:
        return {}
    return desc if isinstance(desc, dict) else {}


def _scaling_json(folder: Path) -> float:
    f = folder / "scaling.json"
    if not f.is_file():
        return 1.0
    from hpckit.common.inputs import read_json
    try:
        value = float(read_json(f, str(f), limit=1 << 20)["scaling_factor"])
    except (ValueError, KeyError, TypeError, OverflowError):
        raise KitError(f"{f}: no numeric scaling_factor") from None
    if not math.isfinite(value) or value <= 0:
        raise KitError(f"{f}: scaling_factor {value} is not a positive number")
    return value


NEWEST_RULESET = "hpc-3.0.0"


def _rcp_factor(logs: list[Path], version: str) -> tuple[float, str]:
    """The factor the official RCP checker writes into scaling.json for these logs (1.0 when it
    writes none), computed on a private copy of them; and what it said."""
    import logging
    import shutil
    import tempfile
    from hpckit.common.compliance import overlong_reason
    from mlperf_logging.rcp_checker import rcp_checker
    for p in logs:
        reason = overlong_reason(p)
        if reason:
            return 1.0, f"RCP check not run: {p.name}: {reason}"
    root = logging.getLogger()
    level = root.level
    with tempfile.TemporaryDirectory(prefix="hpckit-rcp-") as tmp:
        for p in logs:
            shutil.copyfile(p, Path(tmp) / p.name)
        root.setLevel(logging.CRITICAL)   # the checker logs its findings at INFO
        try:
            passed, message, _ = rcp_checker.check_directory(
                tmp, "hpc", version, verbose=False, bert_train_samples=False, rcp_pass="pruned_rcps",
                rcp_bypass=False, set_scaling=True)
        except Exception as e:   # e.g. a benchmark without RCPs in that ruleset
            return 1.0, f"RCP check failed to run ({type(e).__name__}: {str(e).strip()[:120]})"
        finally:
            root.setLevel(level)
        f = Path(tmp) / "scaling.json"
        factor = float(json.loads(f.read_text())["scaling_factor"]) if f.exists() else 1.0
    return factor, f"RCP check {'passed' if passed else 'failed'}: {message}"


def scaling_factor(s: dict, runs: list[RunLog], ruleset: str | None,
                   as_published: bool = False) -> tuple[float, str | None]:
    """(factor, where it comes from) for a strong-scaling set, as the official package checker
    and summarizer apply it, or, as_published, as the summarizer applies a published tree's
    scaling.json (module doc)."""
    from hpckit.common.compliance import OFFICIAL_RULESETS
    if not s["system"]:
        return 1.0, None
    folder = Path(s["source"])
    desc = _system_desc(s["org_dir"], s["system"])
    kit = any(_is_kit_log(p) for p in s["logs"])
    if as_published or desc.get("division") != "closed" or kit:
        factor = _scaling_json(folder)
        return factor, ("scaling.json" if factor != 1.0 else None)
    ruleset = ruleset or NEWEST_RULESET
    factor, said = _rcp_factor(s["logs"], OFFICIAL_RULESETS[ruleset])
    return factor, f"{ruleset} RCP ({said})"


def score_sets(paths: list[str | Path], scaling: str | None = None, ruleset: str | None = None,
               fallback: str | None = None, as_published: bool = False) -> tuple[list[dict], list[str]]:
    if scaling not in (None, "strong", "weak"):
        raise KitError(f"--scaling {scaling}: choose strong or weak")
    verdict = None
    if ruleset is not None:
        from hpckit.common.compliance import OFFICIAL_RULESETS, official_verdict
        if ruleset not in OFFICIAL_RULESETS:
            raise KitError(f"--ruleset {ruleset}: choose one of {', '.join(OFFICIAL_RULESETS)}")
        verdict = lambda p: official_verdict(p, ruleset)   # noqa: E731
    sets, notes = find_sets(paths, scaling, fallback)
    for s in sets:
        parsed = s.pop("parsed", {})
        runs = [parsed.get(p) or parse_log(p, strict=False) for p in s["logs"]]
        rel = Path(s["source"]) if s["source"] else None
        names = [str(p.relative_to(rel)) if rel and p.is_relative_to(rel) else str(p) for p in s["logs"]]
        judged = []
        for p, r in zip(s["logs"], runs):
            v = verdict(p) if verdict is not None and not r.problem else None
            judged.append((_judge_weak if s["scaling"] == "weak" else judge)(r, v))
        counts = [ok for ok, _ in judged]
        head = next((r for r in runs if r.benchmark), runs[0])
        benchmark = s["layout_benchmark"] or (head.benchmark.lower() if head.benchmark else None)
        desc = _system_desc(s["org_dir"], s["system"])
        nodes = sorted({r.number_of_nodes for r in runs if r.number_of_nodes is not None})
        s.update(runs=list(zip(names, runs)), why=[w for _, w in judged], counts=counts,
                 benchmark=benchmark, org=desc.get("submitter") or (s["org_dir"].name if s["org_dir"] else head.org),
                 platform=s["system"] or head.platform, nodes=nodes[0] if len(nodes) == 1 else (nodes or None))
        if s["scaling"] == "weak":
            s["score"] = weak_score(runs, counts, benchmark)
        else:
            factor, source = scaling_factor(s, runs, ruleset, as_published)
            s["score"] = strong_score(runs, counts, factor)
            s["score"]["scaling_from"] = source
        digests: dict[str, str] = {}
        for name, p in zip(names, s["logs"]):
            d = hashlib.sha256(p.read_bytes()).hexdigest()
            if d in digests:
                s["score"].update(valid=False, reason=f"{name} is a byte-identical copy of {digests[d]}")
                break
            digests[d] = name
    return sets, notes


def collect_sets(paths: list[str | Path], scaling: str | None = None, ruleset: str | None = None) -> list[dict]:
    return score_sets(paths, scaling, ruleset)[0]


# ---- output -----------------------------------------------------------------------------

def figure(sc: dict) -> str:
    if sc["kind"] == "strong":
        return f"{sc['score_min']:.2f} min" if sc["score_min"] is not None else "-"
    if sc["time_to_train_all_min"] is None:
        return f"{sc['number_of_models']} models"
    return (f"{sc['number_of_models']} models, instance scale {sc['instance_scale']}, "
            f"time_to_train_all {sc['time_to_train_all_min']:.2f} min")


def _fmt_score(s: dict) -> str:
    sc = s["score"]
    if sc["kind"] == "strong":
        if not sc["valid"]:
            return f"score: invalid ({sc['reason']})"
        text = f"score: {sc['score_min']:.2f} min (olympic mean of {sc['runs_used']} of {sc['runs_total']} runs"
        if sc["non_converged"]:
            names = {r.path: n for n, r in s["runs"]}
            text += f"; non-converged {names[sc['non_converged'][0]]} counted as slowest"
        if sc["scaling_factor"] != 1.0:
            text += (f"; unscaled {sc['unscaled_min']:.4f} min x scaling factor {sc['scaling_factor']:.5f} "
                     f"from {sc.get('scaling_from') or 'scaling.json'}")
        return text + ")"
    body = figure(sc)
    return f"score: {body}" if sc["valid"] else f"score: invalid ({sc['reason']}; {body})"


def format_sets(sets: list[dict], notes: list[str] = ()) -> list[str]:
    lines = []
    for s in sets:
        nodes = s["nodes"] if s["nodes"] is not None else "?"
        lines.append(f"{s['benchmark']} | org {s['org']} | platform {s['platform']} | nodes {nodes} | "
                     f"{len(s['runs'])} runs ({s['score']['kind']} scaling, from {s['scaling_from']})")
        for (name, r), ok, why in zip(s["runs"], s["counts"], s["why"]):
            ep = r.epochs if r.epochs is not None else "?"
            ttt = f"{r.time_to_train_min:.2f} min" if r.problem is None else "- min"
            inst = f"  instance {r.instance}" if r.instance is not None and s["scaling"] == "weak" else ""
            lines.append(f"  {name}  {ttt}  converged {'yes' if ok else 'no'}  epochs {ep}{inst}"
                         + ("" if ok else f"  ({why})"))
        lines.append(_fmt_score(s))
    lines += [f"note: {n}" for n in notes]
    if len(sets) > 1:
        lines += [""] + table(sets)
    return lines


def table(sets: list[dict]) -> list[str]:
    rows = [("submitter", "system", "benchmark", "scaling", "runs", "score")]
    for s in sorted(sets, key=lambda s: (str(s["org"]), str(s["platform"]), str(s["benchmark"]), s["scaling"])):
        sc = s["score"]
        rows.append((str(s["org"]), str(s["platform"]), str(s["benchmark"]), sc["kind"], str(len(s["runs"])),
                     figure(sc) if sc["valid"] else f"invalid ({sc['reason']})"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def to_json(sets: list[dict]) -> dict:
    return {"valid": all(s["score"]["valid"] for s in sets),
            "sets": [{"benchmark": s["benchmark"], "org": s["org"], "platform": s["platform"],
                      "system": s["system"], "scaling": s["scaling"], "scaling_from": s["scaling_from"],
                      "nodes": s["nodes"], "source": s["source"], "score": s["score"],
                      "runs": [{"name": n, "counts": ok, "why": why, **r.to_dict()}
                               for (n, r), ok, why in zip(s["runs"], s["counts"], s["why"])]}
                     for s in sets]}


def main_score(args) -> int:
    sets, notes = score_sets(args.paths, getattr(args, "scaling", None), getattr(args, "ruleset", None),
                             as_published=getattr(args, "as_published", False))
    print("\n".join(format_sets(sets, notes)))
    if args.json:
        from hpckit.common.fileio import atomic_write_json
        atomic_write_json(args.json, to_json(sets), option="--json")   # the parser refused an existing one
    sys.stdout.flush()
    return 0 if all(s["score"]["valid"] for s in sets) else 1
