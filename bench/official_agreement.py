#!/usr/bin/env python3
"""`hpckit score` against the official MLPerf HPC pipeline on a published results tree.

    bench/official_agreement.py TREE --ruleset hpc-3.0.0 [--orgs ORG ...]

TREE is a results round in the submission layout (<org>/results/<system>/<strong|weak>/<benchmark>/
and <org>/systems/), e.g. a checkout of an MLCommons hpc_results_vX.Y repository. For every
org the official pipeline runs as a submitter's review does, on a private copy of the org
(the package checker writes scaling.json into the tree it checks): mlperf_logging's
package_checker, then its result_summarizer. `hpckit score --ruleset` runs on TREE itself,
which it never writes into. Prints one line per set (kit figure, official figure, RCP
factor, agree or DIFFERS) and the count; exits 1 when any set differs. Nothing here is a
speed figure; it takes minutes per round (the checkers read every log).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hpckit.common.compliance import OFFICIAL_RULESETS
from hpckit.results.score import score_sets

BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")


def official(org: Path, version: str, work: Path) -> dict:
    """{(system, scaling, benchmark): figure} from the package checker + summarizer on a copy."""
    from mlperf_logging.result_summarizer import result_summarizer as rs
    copy = work / org.name
    shutil.copytree(org, copy, ignore=shutil.ignore_patterns("benchmarks", "*.pdf"))
    subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", str(copy), "hpc", version,
                    "--log_output", str(work / f"{org.name}.package_checker.log")],
                   capture_output=True, text=True, cwd=work)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        strong, weak, *_ = rs.summarize_results(str(copy), "hpc", version)
    out = {}
    for df, kind in ((strong, "strong"), (weak, "weak")):
        if len(df) == 0:
            continue
        for _, row in df.iterrows():
            system = row["details_url"].rsplit("/", 1)[-1][:-len(".json")]
            for bench in BENCHMARKS:
                value = row.get(bench if kind == "strong" else f"{bench}:time_to_train_all")
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    out[(system, kind, bench)] = float(value)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--ruleset", required=True, choices=sorted(OFFICIAL_RULESETS))
    ap.add_argument("--orgs", nargs="*", help="only these org folders")
    args = ap.parse_args(argv)
    if not args.tree.is_dir():
        print(f"{args.tree}: no such directory", file=sys.stderr)
        return 2
    orgs = sorted(p for p in args.tree.iterdir() if (p / "results").is_dir() and (p / "systems").is_dir()
                  and (not args.orgs or p.name in args.orgs))
    if not orgs:
        print(f"{args.tree}: no <org>/results and <org>/systems folders", file=sys.stderr)
        return 2
    version = OFFICIAL_RULESETS[args.ruleset]
    agree = differ = 0
    with tempfile.TemporaryDirectory(prefix="hpckit-official-") as tmp:
        for org in orgs:
            ref = official(org, version, Path(tmp))
            sets, _ = score_sets([org], ruleset=args.ruleset)
            for s in sets:
                sc = s["score"]
                key = (s["system"], s["scaling"], s["benchmark"])
                kit = sc.get("score_min") if sc["kind"] == "strong" else sc.get("time_to_train_all_min")
                off = ref.get(key)
                if off is None and (kit is None or not sc["valid"]):
                    continue   # neither scores it (too few converged runs, ...)
                same = off is not None and kit is not None and abs(kit - off) <= 1e-6 * max(1.0, abs(off))
                agree, differ = agree + same, differ + (not same)
                factor = sc.get("scaling_factor", 1.0)
                print(f"{'agree  ' if same else 'DIFFERS'} {org.name}/{'/'.join(key)}: kit "
                      f"{'-' if kit is None else f'{kit:.6f}'} official {'-' if off is None else f'{off:.6f}'}"
                      + (f" (RCP factor {factor:.5f})" if factor != 1.0 else ""))
    print(f"{agree} sets agree, {differ} differ ({args.tree}, {args.ruleset})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
