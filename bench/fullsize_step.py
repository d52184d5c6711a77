#!/usr/bin/env python3
"""Peak resident memory per rank and seconds per training step at the reference sizes,
through the whole `hpckit train` path (datagen at its default sizes, staging, loader,
model, optimizer, logging), bounded by train.max_steps. One process per path, run one
after the other (never side by side: they would share the cores).

    .venv/bin/python bench/fullsize_step.py [--steps 3] [--paths cosmoflow-pytorch,cosmoflow-tensorflow,deepcam]
        [--workdir DIR] [--precision fp32|bf16]

Seconds per step: the training phase of the epoch (epoch_start to eval_start in the MLPerf
log) over the steps taken, first step included, and again without it when --steps > 1
(the first step carries graph tracing and allocator warm-up). Peak memory: the process's
maximum resident set size (getrusage of the child), one rank."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))
from hpckit.common.cores import cpu_flags, cpu_model  # noqa: E402

PATHS = {"cosmoflow-pytorch": ("cosmoflow", "pytorch"), "cosmoflow-tensorflow": ("cosmoflow", "tensorflow"),
         "deepcam": ("deepcam", "pytorch")}
BATCH = {"cosmoflow": 4, "deepcam": 2}   # the reference configs' local batch


def hpckit(*args) -> list[str]:
    return [sys.executable, "-m", "hpckit", *map(str, args)]


def events(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG " in line]


def run_path(name: str, steps: int, work: Path, precision: str) -> dict:
    bench, framework = PATHS[name]
    data = work / f"{bench}-data"
    n_train, n_valid = steps * BATCH[bench], 1 if bench == "deepcam" else 4
    if not data.exists():
        subprocess.run(hpckit("datagen", bench, "--out", data, "--train", n_train, "--valid", n_valid, "--seed", 3),
                       check=True, capture_output=True)
    out = work / f"{name}-out"
    cmd = hpckit("train", bench, "--data", data, "--config", "reference", "--output-dir", out, "--seed", 1,
                 "--stage-dir", work / f"{name}-stage", "--set", f"train.max_steps={steps}",
                 "--set", f"data.n_train={n_train}", "--set", f"data.n_valid={n_valid}",
                 "--set", f"train.precision={precision}",
                 *(["--framework", framework] if bench == "cosmoflow" else []))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, _, rusage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    ev = events(out / "mlperf.log")
    t = {e["key"]: e["time_ms"] for e in ev if e["key"] in ("epoch_start", "eval_start", "run_start", "run_stop")}
    train_s = (t["eval_start"] - t["epoch_start"]) / 1000.0
    return {"path": name, "steps": steps, "local_batch": BATCH[bench], "peak_rss_gib": rusage.ru_maxrss / 2 ** 20,
            "s_per_step": train_s / steps, "wall_s": wall, "run_stop": ev[-1]["metadata"].get("reason"),
            "error": err.strip().splitlines()[-1] if err.strip() and ev[-1]["key"] != "run_stop" else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--workdir", default=None)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    a = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import own_workdir
    # a new directory inside --workdir (what else it holds is not this run's), removed at the end
    tmp = own_workdir("fullsize_step", "--workdir", a.workdir, "hpckit-fullsize-")
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma") if f in cpu_flags()]
    print(f"cpu: {cpu_model()}  flags: {' '.join(flags)}  cpus: {len(os.sched_getaffinity(0))}  precision: {a.precision}")
    try:
        for name in a.paths.split(","):
            r = run_path(name, a.steps, tmp, a.precision)
            print(f"{r['path']:22s} peak RSS {r['peak_rss_gib']:6.2f} GiB/rank   {r['s_per_step']:7.2f} s/step "
                  f"(local batch {r['local_batch']}, {r['steps']} steps, first included)   wall {r['wall_s']:.0f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
