#!/usr/bin/env python3
"""OC20: where a mini run's wall time goes, and how fast the kit's loader reads the
reference's LMDB records.

    .venv/bin/python bench/oc20_breakdown.py [--epochs 3] [--loader-samples 256] [--workdir DIR] [--keep]

Breakdown: one mini dataset (`hpckit datagen oc20 --config mini`, seed 7), then one
`hpckit train oc20 --config mini --set train.n_epochs=E` as a user runs it (a fresh
process, seed 1, --deterministic, the target set out of reach so every case runs E epochs),
timed from outside and split with the MLPerf log's own timestamps, as bench/mini_breakdown.py
splits the other benchmarks' runs: startup (process start -> first log line), init (-> run_start,
the FLOP count on one structure included), staging, train (epoch_start -> eval_start),
eval (eval_start -> eval_stop), other, exit (run_stop -> process exit).

Loader: the loader `hpckit train` uses (torch DataLoader over the LMDB records, unpickled
and checked field by field, collated into a batch; train=True, shuffled), passed twice over
the split with the page cache warm and the second pass timed, for the mini records and for
records of the reference's size (`--config reference` structures, about 73 atoms and 3,000
edges), with 0 and 1 worker processes: samples/s and per core. The reference trains 2M
structures an epoch; the published v3.0 OC20 runs train about 100-250 structures/s per GPU
(hpc_results_v3.0 NVIDIA eos, HPE+LBNL Perlmutter), so the last column says how many cores
one GPU would need at 250 structures/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from benchlib import finish, machine_line, own_workdir, records  # noqa: E402

GPU_RATE = 250.0     # structures/s per GPU, the order of the published v3.0 OC20 runs


def hpckit(*args) -> list[str]:
    return [sys.executable, "-m", "hpckit", *map(str, args)]


def breakdown(work: Path, epochs: int) -> dict:
    data, out = work / "mini-data", work / "mini-out"
    subprocess.run(hpckit("datagen", "oc20", "--config", "mini", "--out", data, "--seed", 7), check=True,
                   capture_output=True)
    t0 = time.time()
    proc = subprocess.run(hpckit("train", "oc20", "--data", data, "--config", "mini", "--output-dir", out,
                                 "--seed", 1, "--deterministic", "--set", f"train.n_epochs={epochs}",
                                 "--set", "train.target_mae=1e-6"), capture_output=True, text=True)
    t_end = time.time()
    if proc.returncode not in (0, 3):
        raise SystemExit(f"hpckit train failed ({proc.returncode}): {proc.stderr[-2000:]}")
    ev = records(out / "mlperf.log")
    t = lambda key: [e["time_ms"] / 1000 for e in ev if e["key"] == key]  # noqa: E731
    first, run_start, run_stop = ev[0]["time_ms"] / 1000, t("run_start")[0], t("run_stop")[0]
    train = sum(b - a for a, b in zip(t("epoch_start"), t("eval_start")))
    evals = sum(b - a for a, b in zip(t("eval_start"), t("eval_stop")))
    staging = sum(b - a for a, b in zip(t("staging_start"), t("staging_stop")))
    parts = {"startup": first - t0, "init": run_start - first, "staging": staging, "train": train, "eval": evals,
             "other": run_stop - run_start - staging - train - evals, "exit": t_end - run_stop}
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": t_end - t0, "parts_s": parts, "epochs": summary["epochs"],
            "train_samples_per_s": summary["train_samples_per_s"],
            "flops_per_sample": summary["usage"]["train_flops_per_sample"]}


def loader_rate(work: Path, config: str, n: int, workers: int) -> dict:
    from hpckit.common.config import load_config
    from hpckit.oc20 import data as odata
    root = work / f"loader-{config}"
    if not root.exists():
        subprocess.run(hpckit("datagen", "oc20", "--config", config, "--out", root, "--train", n, "--valid", 1,
                              "--seed", 3), check=True, capture_output=True)
    cfg = load_config("oc20", config, [f"data.loader_workers={workers}", f"data.n_train={n}", "data.n_valid=1"])
    split = odata.find_dataset(root, n, 1)["train"]
    loader = odata.torch_loader(split, cfg, True, 1)
    seen = 0
    for _ in loader:       # warm the page cache and the workers
        pass
    t0 = time.perf_counter()
    for batch in loader:
        seen += int(batch["natoms"].numel())
    dt = time.perf_counter() - t0
    cores = max(workers, 1)
    rate = seen / dt
    return {"config": config, "workers": workers, "samples": seen, "samples_per_s": rate,
            "per_core": rate / cores, "cores_per_gpu": GPU_RATE / (rate / cores)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--loader-samples", type=int, default=256)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    work = own_workdir("oc20_breakdown", "--workdir", args.workdir, "oc20-bench-")   # new, inside --workdir
    print(machine_line())
    failed = True
    try:
        b = breakdown(work, args.epochs)
        print(f"mini run ({b['epochs']} epochs, {b['train_samples_per_s']:.1f} train samples/s, "
              f"{b['flops_per_sample'] / 1e6:.1f} MFLOP per sample): {b['wall_s']:.1f} s wall = "
              + ", ".join(f"{k} {v:.1f}" for k, v in b["parts_s"].items()))
        for config in ("mini", "reference"):
            for workers in (0, 1):
                r = loader_rate(work, config, args.loader_samples if config == "mini" else
                                max(16, args.loader_samples // 8), workers)
                print(f"loader {config:<9} workers {workers}: {r['samples_per_s']:8.1f} structures/s "
                      f"({r['per_core']:.1f} per core; {r['cores_per_gpu']:.1f} cores per GPU at {GPU_RATE:.0f}/s)")
        failed = False
    finally:
        rc = finish(work, args.keep or args.workdir is not None, failed)
    return rc


if __name__ == "__main__":
    sys.exit(main())
