"""`hpckit references calibrate`: a system's performance references from its own runs.

    hpckit references calibrate --perflog DIR_OR_FILE... --out references.yaml
                                [--min-runs 3] [--floor 0.10] [--ceiling 0.50] [--factor 2]
                                [--replace]

Reads the ReFrame performance logs of N repeated runs of the checks on one system (the
site profile's filelog perflogs, e.g. `perflogs/local/`), and writes the references.yaml
that ReFrame reads through the checks' `reference = {'$ref': 'references.yaml'}`:
per check class, partition, config and framework, per performance variable
`[median, lower, upper, unit]`. The bound is on the side where the variable gets worse
(time_to_train, staging_time and epochs above; throughputs below) and its size is the
measured spread: `factor * max |x - median| / median`, clamped to [floor, ceiling] (a site
sets both: a tight floor catches small regressions, the ceiling keeps a noisy variable
from accepting anything), and never tighter than the unit's resolution (`--resolution`,
default s=1.0 and min=0.05): the jitter of timing a short step, which a relative bound on
a 0.2 s figure cannot absorb (measured on the mini checks, bench/acceptance_power.py: three
calibration runs spread staging by 0.07 s, unchanged reruns then moved it by up to 0.67 s
and a 16 s training by 2 s; the spread alone gave 12-34 % bounds and false FAILs in 4 of 5
reruns; with s=1.0 the remaining false FAILs came from the machine's drift, which the
floor covers: bench/README.md). A variable with fewer than --min-runs figures is an error, not a
guess. The file starts with a comment saying when, on which host (CPU model, flags,
machine key) it was measured, from how many runs, and the software stack the runs recorded
(each perflog line's `stack`: hpckit.common.provenance; runs of two stacks are an error),
as `#   stack.<key>: value` comment lines that ReFrame's YAML reader skips and the checks
read back to name what changed when one FAILs (reframe_checks/mlperf_base.py).

The file is written atomically (hpckit.common.fileio); its directory must exist. An existing
file is replaced only with --replace, and only a references file this command wrote (its
first line, HEADER): a site's own references.yaml is never replaced.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.common.fileio import output_file
from hpckit.common.inputs import cli_float, cli_int
from hpckit.results.perflog import read_perflogs

# The smallest allowed deviation per unit, whatever the median: timing a sub-second copy
# jitters by a few tenths of a second, a short training (process start, imports, staging,
# the loader's first batches) by a few seconds. Measured on the mini checks (2-core VM,
# 2026-11-24, 16 unchanged runs): staging deviated from its median by up to 0.67 s (0.21 to
# 1.07 s: the VM's disk, write-back of earlier runs' data), time to train by up to 0.034
# min; the defaults sit above that, as the factor 2 on the spread does. A site with
# minutes of staging keeps its relative bounds.
RESOLUTION = {"s": 1.0, "min": 0.05}

# The first line of every file this command writes: what --replace may replace.
HEADER = "# Performance references calibrated by `hpckit references calibrate` on this machine:"
REPLACE_HINT = " (--replace replaces only a references file this command wrote)"

# Which way a variable gets worse: the side its bound is on.
WORSE_WHEN = {"time_to_train": "higher", "staging_time": "higher", "epochs": "higher",
              "train_throughput": "lower", "eval_throughput": "lower",
              "peak_memory": "higher", "epoch_read": "higher"}
# staging_read_bandwidth is recorded, not bounded: staging_time already is, and a run that
# stages nothing reads 0 MB/s. cpu_wait too: near 0 on a node of its own, and another job
# on the node shows in the throughput's bound as well.


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("calibrate", help="write references.yaml from the perflogs of repeated runs")
    c.add_argument("--perflog", nargs="+", required=True, metavar="FILE_OR_DIR",
                   help="ReFrame perflogs (files, or directories searched for *.log)")
    c.add_argument("--out", required=True, type=output_file("--out", HEADER.encode(), REPLACE_HINT),
                   help="the references.yaml to write (a new file; --replace: one this command wrote)")
    # the bounds: what a count and a relative tolerance can be; --min-runs < 1 and the
    # floor/ceiling/factor relations are checked in main with messages that name them
    c.add_argument("--min-runs", type=cli_int(-10 ** 9, 10 ** 9), default=3,
                   help="figures needed per variable (default 3)")
    c.add_argument("--floor", type=cli_float(-1e9, 1e9), default=0.10,
                   help="smallest tolerance, a fraction (default 0.10)")
    c.add_argument("--ceiling", type=cli_float(-1e9, 1e9), default=0.50,
                   help="largest tolerance, a fraction (default 0.50)")
    c.add_argument("--factor", type=cli_float(-1e9, 1e9), default=2.0,
                   help="tolerance = factor x the largest relative deviation from the median (default 2)")
    c.add_argument("--resolution", action="append", default=[], metavar="UNIT=VALUE",
                   help="a bound is never tighter than VALUE (in UNIT) above or below the median: "
                        f"the timer's jitter (default {', '.join(f'{u}={v}' for u, v in RESOLUTION.items())})")
    c.add_argument("--replace", action="store_true",
                   help="replace an existing --out file this command wrote (never a site's own)")


def tolerance(values: list[float], median: float, factor: float, floor: float, ceiling: float,
              resolution: float = 0.0) -> float:
    spread = max(abs(v - median) for v in values) / abs(median) if median else ceiling
    relative = min(ceiling, max(floor, factor * spread))
    return max(relative, resolution / abs(median)) if median else relative


def parse_resolution(items: list[str]) -> dict[str, float]:
    import math
    out = dict(RESOLUTION)
    for item in items:
        unit, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not unit or not math.isfinite(number) or not 0 <= number <= 1e9:
            raise KitError(f"--resolution {item!r}: expected UNIT=VALUE with VALUE >= 0 (e.g. s=0.25)")
        out[unit] = number
    return out


def calibrate(rows: list[dict], min_runs: int, factor: float, floor: float, ceiling: float,
              resolution: dict[str, float] | None = None) -> dict:
    """{check_class: {partition: {config: {framework: {var: [median, lower, upper, unit, n, lo, hi]}}}}}"""
    groups: dict[tuple, list[float]] = {}
    units: dict[tuple, str] = {}
    for r in rows:
        if r["var"] not in WORSE_WHEN:
            continue
        key = (r["check_class"], r["system"].replace("/", ":"), r["config"],
               r["params"].get("framework", "pytorch"), r["var"])
        groups.setdefault(key, []).append(r["value"])
        units[key] = r["unit"]
    if not groups:
        raise KitError("--perflog: no performance figures of the MLPerf checks in the given perflogs")
    out: dict = {}
    for key, values in sorted(groups.items()):
        check, partition, config, framework, var = key
        if len(values) < min_runs:
            raise KitError(f"--perflog: {check} {partition} {config} {framework} {var}: {len(values)} "
                           f"figure(s), --min-runs {min_runs} needed (run the checks more often)")
        med = statistics.median(values)
        tol = round(tolerance(values, med, factor, floor, ceiling, (resolution or {}).get(units[key], 0.0)), 3)
        lower, upper = (None, tol) if WORSE_WHEN[var] == "higher" else (-tol, None)
        entry = [round(med, 4), lower, upper, units[key], len(values), min(values), max(values)]
        out.setdefault(check, {}).setdefault(partition, {}).setdefault(config, {}).setdefault(framework, {})[var] = entry
    return out


def calibration_stack(rows: list[dict]) -> dict | None:
    """The one software stack the calibration runs recorded (each perflog line's `stack`,
    hpckit.common.provenance.stack), or None when the perflogs predate it. References
    measured with two stacks would be tied to neither: an error naming the difference."""
    from hpckit.common.provenance import differences, stack_digest
    stacks: dict[str, tuple[dict, dict]] = {}
    for r in rows:
        if r.get("stack") and r["var"] in WORSE_WHEN:
            stacks.setdefault(stack_digest(r["stack"]), (r["stack"], r))
    if len(stacks) > 1:
        (a, ra), (b, rb) = list(stacks.values())[:2]
        diff = "; ".join(differences(a, b)[:6]) or "their digests differ"
        raise KitError(f"--perflog: the runs were made with {len(stacks)} different software stacks "
                       f"({ra['file']} at {ra['time']:%Y-%m-%d %H:%M} against {rb['file']} at "
                       f"{rb['time']:%Y-%m-%d %H:%M}: {diff}); calibrate from runs of one stack")
    return next(iter(stacks.values()))[0] if stacks else None


def render(refs: dict, n_files: int, args, stack: dict | None = None) -> str:
    from hpckit.common import cores
    from hpckit.common.provenance import header_lines
    lines = [
        HEADER,
        f"#   when:     {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        f"#   host:     {platform.node()} (machine key {cores.machine_key()})",
        f"#   CPU:      {cores.cpu_model()}, {len(cores.allocation_cpus())} CPUs, flags "
        + " ".join(sorted(f for f in cores.cpu_flags() if f.startswith(("avx", "amx", "sve", "fma")))),
        f"#   from {n_files} perflog file(s); tolerance = {args.factor} x largest relative deviation "
        f"from the median, clamped to [{args.floor}, {args.ceiling}], at least the resolution "
        f"{', '.join(f'{u}={v}' for u, v in parse_resolution(args.resolution).items())}",
        "# Entries: [median, lower, upper, unit]; lower/upper are fractions of the median, null = no bound.",
        "# The comment after each entry: runs, smallest and largest figure measured.",
        *header_lines(stack),
    ]
    for check, partitions in refs.items():
        lines += [f"{check}:", "  $index: [$partition, config, framework]"]
        for partition, configs in partitions.items():
            lines.append(f"  '{partition}':")
            for config, frameworks in configs.items():
                lines.append(f"    {config}:")
                for framework, variables in frameworks.items():
                    lines.append(f"      {framework}:")
                    for var, (med, lo, up, unit, n, vmin, vmax) in variables.items():
                        fmt = lambda v: "null" if v is None else repr(v)  # noqa: E731
                        lines.append(f"        {var}: [{med!r}, {fmt(lo)}, {fmt(up)}, {unit}]"
                                     f"   # {n} runs, {vmin:g} .. {vmax:g}")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    from hpckit.common.fileio import atomic_write_text, check_output
    from hpckit.results.perflog import perflog_files
    if args.min_runs < 1:
        raise KitError(f"--min-runs {args.min_runs}: must be >= 1 (one run: no spread, the floor applies)")
    import math
    for name in ("floor", "ceiling", "factor"):
        if not math.isfinite(getattr(args, name)):
            raise KitError(f"--{name} {getattr(args, name)}: must be a finite number")
    if not 0 <= args.floor <= args.ceiling:
        raise KitError(f"--floor {args.floor} / --ceiling {args.ceiling}: need 0 <= floor <= ceiling")
    if not args.factor > 0:
        raise KitError(f"--factor {args.factor}: must be > 0")
    out = Path(args.out)
    if os.path.lexists(out) and not args.replace:
        raise KitError(f"--out {out}: exists; pass --replace to replace references this command wrote")
    check_output(out, "--out", HEADER.encode(), REPLACE_HINT)
    resolution = parse_resolution(args.resolution)
    rows = read_perflogs(args.perflog)
    refs = calibrate(rows, args.min_runs, args.factor, args.floor, args.ceiling, resolution)
    text = render(refs, len(perflog_files(args.perflog)), args, calibration_stack(rows))
    atomic_write_text(out, text, "--out", replaces=HEADER.encode())
    n = sum(len(v) for p in refs.values() for c in p.values() for f in c.values() for v in f.values())
    print(f"hpckit references calibrate: {n} references from {len(rows)} figures written to {out}")
    return 0


