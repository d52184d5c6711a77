#!/usr/bin/env python3
"""Throughput campaigns on this machine: M instances of one rank each, in one mpirun
(`hpckit train --instances M`), for each M of --instances. For every M it prints, from the
instances' MLPerf logs and summary.json:

    M  time_to_train_all s  slowest instance s  fastest s  run_start spread ms
       train samples/s per instance (median)  all instances' samples/s  staging s (max)

time_to_train_all = max(run_stop) - min(run_start) over the instances, as the official
summarizer computes a weak set's score; with the start barrier it is the slowest instance
plus the instances' start spread. The target is out of reach so every instance trains the
same --epochs: the figures compare work, not luck.

The instances share this machine's cores (one thread each): on a 2-core machine M = 3 is
oversubscribed, and the aggregate samples/s shows what that costs; a real campaign gives
each instance its own nodes. The header says the machine, its CPU flags and the load at
start: figures taken on a busy machine are not figures.

    .venv/bin/python bench/campaign_throughput.py                    # DeepCAM mini, M = 1, 2, 3, 2 epochs
    .venv/bin/python bench/campaign_throughput.py --instances 2,4 --epochs 1

Needs Open MPI's mpirun. Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, ROOT_ENV, free_port, machine_line, records, finish  # noqa: E402
from benchlib import bad as _bad  # noqa: E402


def bad(message: str) -> None:
    _bad("campaign_throughput", message)


def counts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(m < 1 or m > 16 for m in out):
        bad(f"--instances {text!r}: a comma-separated list of instance counts from 1 to 16, e.g. 1,2,3")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", default="1,2,3", help="instance counts M, comma-separated (default 1,2,3)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the work directory (every instance's logs)")
    args = p.parse_args()
    ms = counts(args.instances)
    if args.epochs < 1:
        bad(f"--epochs {args.epochs}: at least 1")
    if shutil.which("mpirun") is None:
        bad("mpirun not found (apt-get install openmpi-bin)")

    print(machine_line())
    print(f"# deepcam/pytorch mini, M instances x 1 rank in one mpirun, {args.epochs} epochs each (target out of "
          "reach), 1 thread per instance; the instances share this machine's cores")
    work = Path(tempfile.mkdtemp(prefix="hpckit-campaign-bench-"))
    env = {**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"}
    failed = False
    try:
        data = work / "data"
        subprocess.run([sys.executable, "-m", "hpckit", "datagen", "deepcam", "--config", "mini", "--out", data,
                        "--seed", "7"], cwd=REPO, check=True, capture_output=True)
        print(f"{'M':>3} {'time_to_train_all s':>19} {'slowest s':>9} {'fastest s':>9} {'start spread ms':>15} "
              f"{'samples/s per inst':>18} {'all samples/s':>13} {'staging s max':>13}")
        for m in ms:
            out = work / f"campaign-{m}"
            cmd = ["mpirun", "-np", str(m), "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
                   "-x", f"MASTER_PORT={free_port('campaign_throughput', 4 + 3 * m)}", sys.executable, "-m", "hpckit", "train", "deepcam",
                   "--data", str(data), "--config", "mini", "--output-dir", str(out), "--seed", "1",
                   "--instances", str(m), "--threads", "1", "--stage-dir", str(work / "stage"),
                   "--set", "train.target_iou=1.0", "--set", f"train.n_epochs={args.epochs}"]
            (work / "stage").mkdir(exist_ok=True)
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            (work / f"campaign-{m}.log").write_text(proc.stdout + proc.stderr)
            inst = [out / f"instance_{i}" for i in range(m)] if m > 1 else [out]
            if not all((d / "summary.json").is_file() for d in inst):
                print(f"{m:>3} failed ({proc.returncode}): see {work / f'campaign-{m}.log'}")
                failed = True
                continue
            starts, stops, rates, staging = [], [], [], []
            for d in inst:
                recs = records(d / "mlperf.log")
                starts.append(next(r["time_ms"] for r in recs if r["key"] == "run_start"))
                stops.append(next(r["time_ms"] for r in recs if r["key"] == "run_stop"))
                s = json.loads((d / "summary.json").read_text())
                rates.append(s["train_samples_per_s"])
                staging.append(s["staging_s"])
            own = [(b - a) / 1000 for a, b in zip(starts, stops)]
            print(f"{m:>3} {(max(stops) - min(starts)) / 1000:>19.1f} {max(own):>9.1f} {min(own):>9.1f} "
                  f"{max(starts) - min(starts):>15.0f} {statistics.median(rates):>18.1f} {sum(rates):>13.1f} "
                  f"{max(staging):>13.2f}")
    finally:
        code = finish(work, args.keep, failed)
    return code


if __name__ == "__main__":
    sys.exit(main())
