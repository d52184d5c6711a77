#!/usr/bin/env python3
"""What holds `hpckit train` from files below its step's rate: the readers of the GPU path
measured alone and inside the real training loop, each in two versions side by side.

    python3 bench/feed_diag.py [--quick] [--threads 1,14] [--out DIR]

  legacy  a sample read into a fresh array (h5py's dset[...], np.load), checked there, then
          copied into its place in the pinned batch buffer (the kit before issue 40)
  raw     its bytes read with preadv straight into the buffer at the offset the file's
          layout gives, checked in place (common/rawread.py; the kit now)

For DeepCAM (HDF5, local batch 8) and CosmoFlow (npy as data.stage_decode stages it, local
batch 1), on full-size samples written by hpckit's datagen (16 distinct, hard-linked to 128
names; page cache warm):

  loader  the torch_loader `hpckit train` builds for the device (reader threads into a ring of
          pinned buffers), iterated with nothing else running: samples/s, and per sample the
          process's CPU ms in user and system mode and its minor page faults
  train   `hpckit train --config reference` itself (fp16 on CUDA, step-limited), the reader
          swapped for the version named: samples/s (summary.json), the share of the
          training loop's time spent waiting for its next batch, the GPU's busy share (CUDA
          events around each step), CPU ms per sample in user / system mode, minor faults,
          and how late a 1 ms sleep of a probe thread woke (the GIL's contention)

Without CUDA (a check that the script works) it runs on the CPU at --quick sizes.
Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, bad as _bad, check_writable, machine_line  # noqa: E402

sys.path.insert(0, str(REPO / "apps"))

RESULT = "FEED_DIAG "


def bad(message: str) -> None:
    _bad("feed_diag", message)


def env() -> dict:
    path = str(REPO / "apps")
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{path}:{old}" if old else path, "PYTHONUNBUFFERED": "1"}


def use_reader(kind: str) -> None:
    """Swap the GPU path's per-sample readers for the legacy ones (read, check, copy)."""
    if kind == "raw":
        return
    import numpy as np
    from hpckit.cosmoflow import data as cdata
    from hpckit.deepcam import data as ddata

    def deepcam_legacy(path, data_out, labels_out, height, width, n_channels):
        x, y = ddata.read_raw(path, height, width, n_channels, labels_dtype=np.uint8)
        np.copyto(data_out, x)
        np.copyto(labels_out, y)

    def cosmoflow_legacy(split, index, size, x_out, y_out):
        x, y = cdata.read_sample(split, index, size)
        np.copyto(x_out, x)
        np.copyto(y_out, y)

    ddata.read_raw_into = deepcam_legacy
    cdata.read_sample_into = cosmoflow_legacy


class Usage:
    """The process's CPU (user, system) and minor faults over an interval."""

    def __init__(self):
        self.r0, self.t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()

    def per_sample(self, n: int) -> dict:
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        n = max(n, 1)
        return {"wall_s": time.perf_counter() - self.t0,
                "user_ms": (r1.ru_utime - self.r0.ru_utime) / n * 1e3,
                "sys_ms": (r1.ru_stime - self.r0.ru_stime) / n * 1e3,
                "minflt": (r1.ru_minflt - self.r0.ru_minflt) / n}


class GilProbe(threading.Thread):
    """Sleeps 1 ms again and again; how late it wakes is the time it waited for the GIL (and
    a CPU)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.late, self.n, self.stop = 0.0, 0, False

    def run(self):
        while not self.stop:
            t = time.perf_counter()
            time.sleep(0.001)
            self.late += max(time.perf_counter() - t - 0.001, 0.0)
            self.n += 1

    def mean_ms(self) -> float:
        return self.late / max(self.n, 1) * 1e3


# ---------------------------------------------------------------- data

def datagen(bench: str, out: Path, log: Path, train: int, valid: int) -> None:
    cmd = [sys.executable, "-m", "hpckit", "datagen", bench, "--out", str(out), "--config", "reference",
           "--train", str(train), "--valid", str(valid)]
    with open(log, "a") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env()).returncode:
            raise SystemExit(f"feed_diag: hpckit datagen {bench} failed: see {log}")


def linked(distinct: Path, root: Path, counts: dict, prefix: str) -> Path:
    for split, n in counts.items():
        files = sorted(p for p in (distinct / split).iterdir() if p.is_file() and p.name != "manifest.json")
        (root / split).mkdir(parents=True)
        for i in range(n):
            os.link(files[i % len(files)], root / split / f"{prefix}{i:05d}-{files[i % len(files)].name}")
    if (distinct / "stats.h5").exists():
        os.link(distinct / "stats.h5", root / "stats.h5")
    return root


# ---------------------------------------------------------------- loader alone (child)

def child_loader(bench: str, root: str, kind: str, threads: int, seconds: float, quick: bool) -> None:
    sys.path.insert(0, str(REPO / "apps"))
    import torch
    use_reader(kind)
    from hpckit.common.config import load_config
    from hpckit.common.run import EpochSampler
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_config(bench, "reference", [])
    cfg["data"]["loader_workers"] = threads
    if bench == "deepcam":
        from hpckit.deepcam import data
        cfg["data"]["batch_size"] = 8
        files = data.find_dataset(root, *((16, 4) if quick else (128, 8)))["train"]
        stats = data.load_stats(root)

        def make(sampler):
            return data.torch_loader(files, stats, cfg, True, 1, sampler, device=device, device_transform=True)
        n_files = len(files)
    else:
        from hpckit.cosmoflow import data
        cfg["data"]["batch_size"] = 1
        split = data.decoded(data.find_dataset(root, *((16, 4) if quick else (128, 8)))["train"], Path(root) / "npy")

        def make(sampler):
            return data.torch_loader(split, cfg, True, 1, sampler, device=device, device_transform=True)
        n_files = len(split.files)
    batch = cfg["data"]["batch_size"]
    loader = make(EpochSampler(n_files, 0, 1, None, 1, True))
    warm = time.perf_counter()
    for _ in loader:   # warm-up: buffers made, files' layouts looked up
        if time.perf_counter() - warm > seconds / 2:
            break
    n, usage = 0, Usage()
    while usage.per_sample(1)["wall_s"] < seconds:
        for _ in loader:
            n += batch
    out = usage.per_sample(n)
    print(RESULT + json.dumps({"part": "loader", "bench": bench, "reader": kind, "threads": threads,
                               "samples_per_s": n / out["wall_s"], **out}), flush=True)


# ---------------------------------------------------------------- hpckit train (child)

def child_train(kind: str, argv: list[str]) -> int:
    sys.path.insert(0, str(REPO / "apps"))
    import torch
    use_reader(kind)
    from hpckit import cli
    from hpckit.common import step
    # the training epochs' loops (grad enabled; evaluation runs under no_grad): time from the
    # first batch asked for to the last, time spent waiting in next(), CPU and faults
    got = {"s": 0.0, "wait": 0.0, "samples": 0, "user": 0.0, "sys": 0.0, "minflt": 0}
    events: list = []
    original_prefetched, original_step = step.prefetched, step.TrainStep.step

    def prefetched(batches, to_device, device):
        it = original_prefetched(batches, to_device, device)
        train = torch.is_grad_enabled()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            while True:
                t = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    return
                if train:
                    got["wait"] += time.perf_counter() - t
                    got["samples"] += b[0].shape[0]
                yield b
        finally:
            if train:
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                got["s"] += time.perf_counter() - t0
                got["user"] += r1.ru_utime - r0.ru_utime
                got["sys"] += r1.ru_stime - r0.ru_stime
                got["minflt"] += r1.ru_minflt - r0.ru_minflt

    def timed_step(self, x, y):
        if self.device.type != "cuda":
            return original_step(self, x, y)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = original_step(self, x, y)
        b.record()
        events.append((a, b))
        return out

    step.prefetched, step.TrainStep.step = prefetched, timed_step
    probe = GilProbe()
    probe.start()
    try:
        rc = cli.main(["train", *argv])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    probe.stop = True
    out_dir = Path(argv[argv.index("--output-dir") + 1])
    try:
        s = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    busy = None
    if events:
        torch.cuda.synchronize()
        busy = sum(a.elapsed_time(b) for a, b in events) / 1e3
    n, wall = max(got["samples"], 1), got["s"]
    print(RESULT + json.dumps({"part": "train", "reader": kind, "rc": rc, "samples_per_s": s.get("train_samples_per_s"),
                               "loop_samples_per_s": got["samples"] / wall if wall else None,
                               "input_wait_share": got["wait"] / wall if wall else None,
                               "gpu_busy_share": busy / wall if busy is not None and wall else None,
                               "steps_timed": len(events), "gil_late_ms": probe.mean_ms(),
                               "loader_workers": (s.get("cores") or {}).get("loader_workers"),
                               "user_ms": got["user"] / n * 1e3, "sys_ms": got["sys"] / n * 1e3,
                               "minflt": got["minflt"] / n}), flush=True)
    return 0


# ---------------------------------------------------------------- parent

def run_child(args: list[str], log: Path, timeout: float) -> dict | None:
    cmd = [sys.executable, __file__, *args]
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout} s\n")
            return None
        f.write(proc.stdout)
    found = [json.loads(l[len(RESULT):]) for l in proc.stdout.splitlines() if l.startswith(RESULT)]
    return found[-1] if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny counts (a check that the script works)")
    p.add_argument("--threads", default="1,14", help="reader threads of the loader-alone rows")
    p.add_argument("--train-workers", type=int, default=14, help="reader threads of the train rows")
    p.add_argument("--seconds", type=float, default=4.0, help="length of a loader-alone figure")
    p.add_argument("--parts", default="loader,train")
    p.add_argument("--out", help="a new directory for feed_diag.json and the logs")
    p.add_argument("--child-loader", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--child-train", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.child_loader:
        bench, root, kind, threads = args.child_loader
        child_loader(bench, root, kind, int(threads), args.seconds, args.quick)
        return 0
    if args.child_train:
        return child_train(args.child_train, rest[1:] if rest[:1] == ["--"] else rest)
    if rest:
        bad(f"unknown arguments {' '.join(rest)}")
    try:
        threads = [int(x) for x in args.threads.split(",") if x]
        assert threads and all(t >= 1 for t in threads)
    except (ValueError, AssertionError):
        bad(f"--threads {args.threads}: a comma-separated list of counts >= 1")
    parts = [x for x in args.parts.split(",") if x]
    if any(x not in ("loader", "train") for x in parts):
        bad(f"--parts {args.parts}: choose from loader, train")
    if args.out and Path(args.out).exists():
        bad(f"--out {args.out}: exists; name a new directory")
    if args.out:   # it is made at the end, with its parents: the folder it goes into must take it
        check_writable("feed_diag", "--out", args.out, Path(args.out))
    import torch
    cuda = torch.cuda.is_available()
    quick = args.quick or not cuda
    work = Path(tempfile.mkdtemp(prefix="hpckit-feed-diag-"))
    log = work / "feed_diag.log"
    print(f"{machine_line()}, torch {torch.__version__}, "
          f"GPU {torch.cuda.get_device_name(0) if cuda else 'none (CPU, quick sizes)'}", flush=True)
    rows = []
    t_start = time.perf_counter()
    n_train, n_valid = (16, 4) if quick else (128, 8)
    roots = {}
    for bench, prefix in (("deepcam", "data-"), ("cosmoflow", "")):
        t = time.perf_counter()
        distinct = work / f"{bench}-distinct"
        datagen(bench, distinct, log, 4 if quick else 16, 4)
        roots[bench] = linked(distinct, work / bench, {"train": n_train, "validation": n_valid}, prefix)
        print(f"# {bench}: {n_train} train files from {4 if quick else 16} distinct, {time.perf_counter() - t:.0f} s",
              flush=True)
    # the loader alone reads CosmoFlow as data.stage_decode stages it
    sys.path.insert(0, str(REPO / "apps"))
    from hpckit.cosmoflow import data as cdata
    cdata.decode_into(cdata.find_dataset(roots["cosmoflow"], n_train, n_valid)["train"],
                      roots["cosmoflow"] / "npy", 128)

    def show(r):
        rows.append(r)
        if r["part"] == "loader":
            print(f"loader {r['bench']:9s} {r['reader']:6s} threads {r['threads']:2d}: {r['samples_per_s']:7.1f} "
                  f"samples/s; per sample user {r['user_ms']:6.1f} ms, sys {r['sys_ms']:6.1f} ms, "
                  f"minor faults {r['minflt']:7.0f}", flush=True)
        else:
            f = lambda v, fmt: "n/a" if v is None else format(v, fmt)   # noqa: E731
            print(f"train  {r['bench']:9s} {r['reader']:6s} b{r['batch']} {r['precision']}: "
                  f"{f(r['samples_per_s'], '7.1f')} samples/s (loop {f(r['loop_samples_per_s'], '.1f')}), input wait {f(r['input_wait_share'], '.2f')}, "
                  f"GPU busy {f(r['gpu_busy_share'], '.2f')}, user {f(r['user_ms'], '.1f')} ms, sys "
                  f"{f(r['sys_ms'], '.1f')} ms, minor faults {f(r['minflt'], '.0f')} per sample, GIL probe "
                  f"{f(r['gil_late_ms'], '.2f')} ms late, {r['loader_workers']} workers, rc {r['rc']}", flush=True)

    if "loader" in parts:
        for bench in ("deepcam", "cosmoflow"):
            for t in threads if bench == "deepcam" else threads[-1:]:
                for kind in ("legacy", "raw"):
                    r = run_child(["--child-loader", bench, str(roots[bench]), kind, str(t), "--seconds",
                                   str(args.seconds), *(["--quick"] if quick else [])], log, 120)
                    show(r) if r else print(f"loader {bench} {kind} threads {t}: ERROR (see {log})", flush=True)
    if "train" in parts:
        precision = "fp16" if cuda else "fp32"
        cases = [("deepcam", 8, 32, "legacy"), ("deepcam", 8, 96, "raw"),
                 ("cosmoflow", 1, 256, "legacy"), ("cosmoflow", 1, 512, "raw")]
        for bench, batch, steps, kind in cases:
            data_root, config = roots[bench], "reference"
            if quick:   # the CPU: the mini sizes (a check that the path works, no figures)
                steps, config, data_root = 4, "mini", work / f"{bench}-mini"
                if not data_root.exists():
                    subprocess.run([sys.executable, "-m", "hpckit", "datagen", bench, "--out", str(data_root),
                                    "--config", "mini"], stdout=subprocess.DEVNULL, env=env(), check=True)
            out = work / f"train-{bench}-b{batch}-{kind}"
            argv = ["--", bench, "--data", str(data_root), "--config", config, "--output-dir", str(out),
                    "--seed", "1", "--device", "cuda" if cuda else "cpu",
                    *(["--framework", "pytorch", "--stage-dir", str(work / f"stage-{bench}-{batch}-{kind}")]
                      if bench == "cosmoflow" else [])]
            sets = [f"data.batch_size={batch}", *([] if quick else [f"data.n_train={n_train}", f"data.n_valid={n_valid}"]),
                    f"train.max_steps={steps}", "train.n_epochs=1000", f"train.precision={precision}",
                    f"data.loader_workers={args.train_workers}"]
            if bench == "cosmoflow":
                sets.append("data.stage_decode=true")
            argv += [x for s in sets for x in ("--set", s)]
            r = run_child(["--child-train", kind, *argv], log, 300)
            if r:
                show({**r, "bench": bench, "batch": batch, "precision": precision})
            else:
                print(f"train {bench} b{batch} {kind}: ERROR (see {log})", flush=True)
    print(f"# {time.perf_counter() - t_start:.0f} s", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True)
        (out / "feed_diag.json").write_text(json.dumps(rows, indent=1))
        shutil.copy(log, out / "feed_diag.log")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
