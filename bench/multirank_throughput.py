#!/usr/bin/env python3
"""1-rank versus N-rank training throughput of the mini configs, through the real launcher.

For each case (deepcam/pytorch, cosmoflow/pytorch, cosmoflow/tensorflow) it generates the
mini dataset once, then runs `hpckit train` for --epochs epochs (the quality target set
out of reach, so every run does the same work): one process with all --threads, and N
ranks under mpirun (or torchrun) with threads/N each and local batch = batch/N, so the
global batch, the samples per epoch and the total threads are the same. It prints one
line per run from the run's own summary.json:

    case  ranks  launcher  global_batch  train samples/s  eval samples/s  epoch s

and the N-rank/1-rank ratio of train samples/s. The header gives host, CPUs and the
1-minute load average at start: figures taken on a busy machine are not figures.

    .venv/bin/python bench/multirank_throughput.py                  # 2 ranks, mpirun, 2 epochs
    .venv/bin/python bench/multirank_throughput.py --ranks 4 --launcher torchrun --cases deepcam/pytorch
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("deepcam/pytorch", "cosmoflow/pytorch", "cosmoflow/tensorflow")
UNREACHABLE = {"deepcam": "train.target_iou=1.0", "cosmoflow": "train.target_mae=0.0001"}
MINI_BATCH = 8


def hpckit(*args) -> list[str]:
    return [sys.executable, "-m", "hpckit", *map(str, args)]


class RunFailed(Exception):
    pass


def run(cmd, env, log: Path) -> None:
    """Run one command, its whole stdout and stderr kept in `log`."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    log.write_text(f"$ {' '.join(map(str, cmd))}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    if proc.returncode not in (0, 3):   # 3: trained to the end; the target is set out of reach here
        raise RunFailed(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout[-2000:]}\n"
                        f"{proc.stderr[-2000:]}")


def bad_argument(message: str) -> None:
    print(f"multirank_throughput: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--launcher", choices=("mpirun", "torchrun"), default="mpirun")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None,
                    help="total intra-op threads, split over the ranks and passed as --threads (default: none "
                         "passed: each rank takes the kit's core plan, pinned to its share of the CPUs)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--cosmoflow-size", type=int, default=None,
                    help="cube side instead of the mini 32 (more compute per communication)")
    ap.add_argument("--deepcam-size", default=None, help="HxW instead of the mini 96x144")
    ap.add_argument("--samples", default=None, help="TRAIN,VALID samples instead of the mini config's")
    args = ap.parse_args()
    if MINI_BATCH % args.ranks:
        bad_argument(f"--ranks {args.ranks} must divide the mini batch {MINI_BATCH}")
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        bad_argument(f"--cases {','.join(unknown)}: not one of {', '.join(CASES)}")
    if args.deepcam_size and not re.fullmatch(r"\d+[xX]\d+", args.deepcam_size):
        bad_argument(f"--deepcam-size {args.deepcam_size}: expected HxW, e.g. 192x288")
    if args.samples and not re.fullmatch(r"\d+,\d+", args.samples):
        bad_argument(f"--samples {args.samples}: expected TRAIN,VALID, e.g. 256,64")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import check_workdir, own_workdir
    check_workdir("multirank_throughput", "--workdir", args.workdir)   # before any work
    if args.launcher == "mpirun" and shutil.which("mpirun") is None:
        sys.exit("mpirun not found")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    per_rank_threads = args.threads and max(1, args.threads // args.ranks)
    print(f"# host={platform.node()} cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f} "
          f"launcher={args.launcher} ranks={args.ranks} epochs={args.epochs} "
          f"threads_total={args.threads or 'core plan'}")
    print(f"{'case':<22} {'ranks':>5} {'launcher':<9} {'gbs':>4} {'train/s':>9} {'eval/s':>9} {'epoch_s':>8}")
    gen_args = {"cosmoflow": [], "deepcam": []}
    sets = {"cosmoflow": [], "deepcam": []}
    if args.cosmoflow_size:
        gen_args["cosmoflow"] += ["--size", args.cosmoflow_size]
        sets["cosmoflow"] += ["--set", f"data.sample_size={args.cosmoflow_size}"]
    if args.deepcam_size:
        h, w = args.deepcam_size.lower().split("x")
        gen_args["deepcam"] += ["--height", h, "--width", w]
        sets["deepcam"] += ["--set", f"data.height={h}", "--set", f"data.width={w}"]
    if args.samples:
        n_train, n_valid = args.samples.split(",")
        for bench in gen_args:
            gen_args[bench] += ["--train", n_train, "--valid", n_valid]
            sets[bench] += ["--set", f"data.n_train={n_train}", "--set", f"data.n_valid={n_valid}"]
    # a failed run keeps everything (datasets, the runs' outputs and logs) for a post-mortem;
    # a successful bench removes its directory
    tmp = own_workdir("multirank_throughput", "--workdir", args.workdir, "multirank-")   # new, inside --workdir
    try:
        run_cases(args, tmp, env, gen_args, sets, per_rank_threads)
    except RunFailed as e:
        print(f"{e}\nmultirank_throughput: kept {tmp} (every run's output directory and log)", file=sys.stderr)
        return 1
    shutil.rmtree(tmp)
    return 0


def run_cases(args, tmp: Path, env, gen_args, sets, per_rank_threads) -> None:
    data = {}
    for case in args.cases.split(","):
        bench, framework = case.split("/")
        if bench not in data:
            data[bench] = tmp / bench
            run(hpckit("datagen", bench, "--config", "mini", "--out", data[bench], "--seed", "7", *gen_args[bench]),
                env, tmp / f"datagen-{bench}.log")
        rates = {}
        for ranks in (1, args.ranks):
            out = tmp / f"{bench}-{framework}-{ranks}"
            train = ["train", bench, "--data", data[bench], "--config", "mini", "--framework", framework,
                     "--output-dir", out, "--seed", "1", "--set", f"train.n_epochs={args.epochs}",
                     "--set", UNREACHABLE[bench], "--set", f"data.batch_size={MINI_BATCH // ranks}", *sets[bench]]
            if args.threads:
                train += ["--threads", args.threads if ranks == 1 else per_rank_threads]
            if ranks == 1:
                cmd = hpckit(*train)
            elif args.launcher == "mpirun":
                cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", "-x", "PATH",
                       "-x", "TF_CPP_MIN_LOG_LEVEL", *hpckit(*train)]
            else:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                       "--max-restarts", "0", *hpckit(*train)[1:]]
            run(cmd, env, tmp / f"{bench}-{framework}-{ranks}.log")
            s = json.loads((out / "summary.json").read_text())
            epoch_s = s["epochs"] and (s["time_to_train_s"] - s["staging_s"]) / s["epochs"]
            rates[ranks] = s["train_samples_per_s"]
            print(f"{case:<22} {s['ranks']:>5} {s['launcher']:<9} {s['global_batch_size']:>4} "
                  f"{s['train_samples_per_s']:>9.1f} {s['eval_samples_per_s']:>9.1f} {epoch_s:>8.1f}")
        print(f"{case:<22} ratio {args.ranks}-rank/1-rank train samples/s = {rates[args.ranks] / rates[1]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
