#!/usr/bin/env python3
"""One mini training on 1, 2, 3 ... nodes of tests/slurm/multinode.sh's cluster (strong
scaling: the same global batch, one rank per node), through srun, staging each node's
share into its own scratch. For every node count it prints, from the run's summary.json
and MLPerf log:

    nodes  ranks  global_batch  train samples/s  eval samples/s  staging s  epochs  time to train s
    allreduce %  MB/batch  staging copy s per node

allreduce % is the share of the training time with a gradient all-reduce in flight (mean
over ranks; DDP overlaps it with the backward pass, so it bounds the wait from above; "-"
for one rank or TensorFlow) and MB/batch what each rank all-reduces per batch (summary.json
usage, hpckit.common.usage and dist.GradSync). The per-node copy time is each node's own
staging copy, before it waits for the slowest.

The nodes of that cluster are namespaces of ONE machine: they share its cores, memory
bandwidth and page cache, and their network is a Linux bridge. So the figures show what
the kit adds per node (roll call, the all-reduces over TCP, staging per node), not what a
real system of that many nodes does; the header says the machine, its CPU flags and the
load at start: figures taken on a busy machine are not figures. The epochs are fixed
(the quality target set out of reach) so every run does the same work.

    sudo .venv/bin/python bench/multinode_scaling.py                 # DeepCAM mini, 1..3 nodes, 2 epochs
    sudo .venv/bin/python bench/multinode_scaling.py --nodes 1,3 --benchmark cosmoflow --framework tensorflow

Needs root, slurm-wlm, munge, iproute2 (as the cluster). Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, machine_line, finish  # noqa: E402
from benchlib import bad as _bad  # noqa: E402

MULTINODE = REPO / "tests" / "slurm" / "multinode.sh"
UNREACHABLE = {"deepcam": "train.target_iou=1.0", "cosmoflow": "train.target_mae=0.0001"}
GLOBAL_BATCH = 12   # divisible by 1, 2, 3, 4, 6 ranks


def bad(message: str) -> None:
    _bad("multinode_scaling", message)


def node_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        bad(f"--nodes {text!r}: a comma-separated list of node counts, e.g. 1,2,3")
    if not counts or any(n < 1 or n > 8 or GLOBAL_BATCH % n for n in counts):
        bad(f"--nodes {text!r}: each count from 1 to 8 and dividing the global batch {GLOBAL_BATCH}")
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1,2,3", help="node counts, comma-separated (default 1,2,3)")
    p.add_argument("--benchmark", default="deepcam", choices=sorted(UNREACHABLE))
    p.add_argument("--framework", default="pytorch", choices=["pytorch", "tensorflow"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every run)")
    args = p.parse_args()
    counts = node_counts(args.nodes)
    if args.benchmark == "deepcam" and args.framework != "pytorch":
        bad("--framework tensorflow: DeepCAM runs with PyTorch")
    if args.epochs < 1:
        bad(f"--epochs {args.epochs}: at least 1")
    if os.geteuid() != 0:
        bad("needs root (the cluster's namespaces and slurmd)")
    for tool in ("slurmd", "slurmctld", "munged", "srun", "ip"):
        if shutil.which(tool) is None:
            bad(f"{tool} not found (apt-get install slurm-wlm munge iproute2)")

    print(machine_line())
    print(f"# {args.benchmark}/{args.framework} mini, global batch {GLOBAL_BATCH}, {args.epochs} epochs, one rank "
          "per node, 1 thread per rank; the nodes share this machine's cores (not a system's scaling)")
    work = Path(tempfile.mkdtemp(prefix="hpckit-multinode-bench-"))
    state = work / "cluster"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = subprocess.run(["bash", str(MULTINODE), "start", str(state), str(max(counts))], env=env,
                             capture_output=True, text=True)
    if started.returncode != 0:
        print(f"multinode_scaling: the cluster did not start: {started.stderr.strip()}", file=sys.stderr)
        return 1
    failed = False
    try:
        data = work / "data"
        subprocess.run([sys.executable, "-m", "hpckit", "datagen", args.benchmark, "--config", "mini", "--out", data,
                        "--seed", "7"], cwd=REPO, check=True, capture_output=True)
        print(f"{'nodes':>5} {'ranks':>5} {'global_batch':>12} {'train samples/s':>15} {'eval samples/s':>14} "
              f"{'staging s':>9} {'epochs':>6} {'time to train s':>15} {'allreduce %':>11} {'MB/batch':>8}  "
              "staging copy s per node")
        for n in counts:
            out = work / f"run-{n}"
            cmd = ["bash", str(MULTINODE), "exec", str(state), "srun", "--kill-on-bad-exit=1", "-N", str(n),
                   "-n", str(n), sys.executable, "-m", "hpckit", "train", args.benchmark, "--framework",
                   args.framework, "--data", str(data), "--config", "mini", "--output-dir", str(out), "--seed", "1",
                   "--threads", "1", "--stage-dir", str(state / "scratch"), "--set",
                   f"data.batch_size={GLOBAL_BATCH // n}", "--set", UNREACHABLE[args.benchmark], "--set",
                   f"train.n_epochs={args.epochs}"]
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            (work / f"run-{n}.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode not in (0, 3) or not (out / "summary.json").exists():
                print(f"{n:>5} failed ({proc.returncode}): see {work / f'run-{n}.log'}")
                failed = True
                continue
            s = json.loads((out / "summary.json").read_text())
            u = s["usage"]
            share = f"{100 * u['grad_allreduce_share']:.1f}" if u["grad_allreduce_share"] is not None else "-"
            per_batch = (f"{u['grad_allreduce_bytes_per_batch'] / 1e6:.2f}"
                         if u["grad_allreduce_bytes_per_batch"] is not None else "-")
            copies = " ".join(f"{h}={t:.2f}" for h, t in sorted((u["staging_copy_s_per_node"] or {}).items()))
            print(f"{n:>5} {s['ranks']:>5} {s['global_batch_size']:>12} {s['train_samples_per_s']:>15.1f} "
                  f"{s['eval_samples_per_s']:>14.1f} {s['staging_s']:>9.2f} {s['epochs']:>6} "
                  f"{s['time_to_train_s']:>15.1f} {share:>11} {per_batch:>8}  {copies}")
    finally:
        subprocess.run(["bash", str(MULTINODE), "stop", str(state)], capture_output=True)
        code = finish(work, args.keep, failed)
    return code


if __name__ == "__main__":
    sys.exit(main())
