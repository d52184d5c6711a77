#!/usr/bin/env python3
"""`hpckit project` on this machine: project the mini time to train at 1 and 2 ranks from
step-capped runs, then run them, and print the error.

    .venv/bin/python bench/projection_onmachine.py                 # CosmoFlow mini, 3 runs each
    .venv/bin/python bench/projection_onmachine.py --runs 5 --record-runs 5

1. the convergence record: --record-runs converged mini runs at 1 rank (seeds 101...);
2. the system record: two step-capped runs (the target out of reach, --capped-epochs
   epochs each), 1 rank x local batch 8 and 2 ranks x local batch 4 (global batch 8 both,
   as the local profile's `mpi` partition; 2 ranks of 1 thread on a 2-core machine);
3. `hpckit project --units 1 --local-batch 8` and `--units 2 --local-batch 4` from them
   (--epochs-from the record runs, --dataset runs);
4. --runs converged runs at 1 rank and at 2 ranks (seeds 201...), none of them seen by the
   projection; measured: their median time to train.

Prints per rank count: projected p50 (p10-p90) and epochs, measured median (min-max) and
epochs, the error (projected / measured - 1), whether the measured median lies in p10-p90,
and the error of the time model alone (each measured run predicted with the epochs it took:
the median of predicted / measured - 1).
The header says the machine, its CPU flags and the load at start: figures taken on a busy
machine are not figures. Needs Open MPI's mpirun. Bad arguments: one line, exit 2.
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
from benchlib import REPO, ROOT_ENV, machine_line, finish  # noqa: E402
from benchlib import bad as _bad  # noqa: E402

# (ranks, local batch): the global batch stays the mini's 8
SCALES = ((1, 8), (2, 4))


def bad(message: str) -> None:
    _bad("projection_onmachine", message)


def train(work: Path, data: Path, out: Path, ranks: int, local_batch: int, seed: int, extra=()) -> dict:
    base = [sys.executable, "-m", "hpckit", "train", "cosmoflow", "--data", str(data), "--config", "mini",
            "--framework", "pytorch", "--output-dir", str(out), "--seed", str(seed),
            "--set", f"data.batch_size={local_batch}", *extra]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", "-x", "PATH", "-x", "PYTHONPATH",
               *base, "--threads", str(max(1, (os.cpu_count() or 2) // ranks))]
    else:
        cmd = base
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **ROOT_ENV, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True)
    (work / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    summary = out / "summary.json"
    if not summary.is_file():
        raise RuntimeError(f"{out.name} failed ({proc.returncode}): see {work / (out.name + '.log')}")
    return json.loads(summary.read_text())


def time_to_train(out: Path) -> float:
    from hpckit.results.logs import parse_log
    return parse_log(out / "mlperf.log").time_to_train_min * 60.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="converged runs per rank count (measured)")
    p.add_argument("--record-runs", type=int, default=3, help="converged runs making the convergence record")
    p.add_argument("--capped-epochs", type=int, default=3, help="epochs of each step-capped run")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    for name in ("runs", "record_runs", "capped_epochs"):
        if getattr(args, name) < 1:
            bad(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    if shutil.which("mpirun") is None:
        bad("mpirun not found (apt-get install openmpi-bin)")

    print(machine_line())
    print(f"# cosmoflow/pytorch mini, global batch 8; record: {args.record_runs} converged runs at 1 rank; system: "
          f"step-capped runs of {args.capped_epochs} epochs at 1x8 and 2x4; measured: {args.runs} runs per scale")
    work = Path(tempfile.mkdtemp(prefix="hpckit-projection-bench-"))
    failed = False
    try:
        data = work / "data"
        subprocess.run([sys.executable, "-m", "hpckit", "datagen", "cosmoflow", "--config", "mini", "--out", data,
                        "--seed", "7"], cwd=REPO, check=True, capture_output=True)
        record = [work / f"record-{i}" for i in range(args.record_runs)]
        for i, out in enumerate(record):
            train(work, data, out, 1, 8, 101 + i)
        capped = []
        for ranks, lb in SCALES:
            out = work / f"capped-{ranks}"
            train(work, data, out, ranks, lb, 11, ("--set", "train.target_mae=0.0001",
                                                   "--set", f"train.n_epochs={args.capped_epochs}"))
            capped.append(out)
        projected = {}
        for ranks, lb in SCALES:
            js = work / f"projection-{ranks}.json"
            proc = subprocess.run([sys.executable, "-m", "hpckit", "project", "--benchmark", "cosmoflow",
                                   "--units", str(ranks), "--local-batch", str(lb), "--from", *map(str, capped),
                                   "--epochs-from", *map(str, record), "--dataset", "runs", "--json", str(js)],
                                  cwd=REPO, capture_output=True, text=True)
            print("\n".join("  " + line for line in proc.stdout.splitlines()))
            if proc.returncode != 0:
                raise RuntimeError(f"hpckit project failed: {proc.stderr.strip()}")
            projected[ranks] = json.loads(js.read_text())
        print(f"{'ranks':>5} {'projected s p50 (p10-p90)':>27} {'epochs':>6} {'measured s median (min-max)':>29} "
              f"{'epochs':>9} {'error':>7} {'in p10-p90':>10} {'error, epochs known':>19}")
        for ranks, lb in SCALES:
            outs = [work / f"run-{ranks}-{i}" for i in range(args.runs)]
            summaries = [train(work, data, out, ranks, lb, 201 + i) for i, out in enumerate(outs)]
            times = [time_to_train(o) for o, s in zip(outs, summaries) if s.get("converged")]
            epochs = [s["epochs"] for s in summaries if s.get("converged")]
            t = {k: v * 60 for k, v in projected[ranks]["time_to_train_min"].items()}
            if not times:
                print(f"{ranks:>5} no run converged")
                failed = True
                continue
            med = statistics.median(times)
            # the time model alone: each run predicted with the epochs it really took
            parts = projected[ranks]["parts_s"]
            known = statistics.median(
                (parts["first_epoch_start"] + parts["warmup"] + e * (parts["epoch"] + parts["eval_per_epoch"]
                                                                    + parts["other_per_epoch"])) / t - 1
                for e, t in zip(epochs, times))
            print(f"{ranks:>5} {t['p50']:>8.1f} ({t['p10']:.1f}-{t['p90']:.1f}){'':>6} "
                  f"{projected[ranks]['epochs']['p50']:>6.1f} {med:>10.1f} ({min(times):.1f}-{max(times):.1f}){'':>8} "
                  f"{statistics.median(epochs):>9g} {t['p50'] / med - 1:>+7.1%} "
                  f"{'yes' if t['p10'] <= med <= t['p90'] else 'no':>10} {known:>+19.1%}")
    except RuntimeError as e:
        print(f"# {e}")
        failed = True
    finally:
        code = finish(work, args.keep, failed)
    return code


if __name__ == "__main__":
    sys.exit(main())
