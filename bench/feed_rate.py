#!/usr/bin/env python3
"""Does the kit's data path keep a GPU busy? Sustained samples/s of the whole path from files
against a consumer at a GPU's rate, per number of loader workers, the CPU it costs per sample
(measured), and from it the cores one H100 needs for each benchmark and on-disk format.

    .venv/bin/python bench/feed_rate.py                      # this machine: workers 1,2
    .venv/bin/python bench/feed_rate.py --quick              # the lent GPU machine, < 2 minutes
    .venv/bin/python bench/feed_rate.py --step-rate cosmoflow=144 --step-rate deepcam=15.7

The path is the one `hpckit train` runs on a GPU, built from the kit's own code: full-size
synthetic samples written by hpckit's datagen (CosmoFlow 128^3 x 4 int16 as GZIP TFRecords,
DeepCAM 768 x 1152 x 16 HDF5; a few distinct samples, hard-linked to N names), staged into a
stage directory as `hpckit train --stage-dir` stages them (staging.copy_files: copies;
cosmoflow data.decode_into: data.stage_decode), read by the kit's torch_loader for a CUDA
device (raw int16 counts / fields as read), in one of two feeds:
  threads    the kit's GPU path (common/feed.py): `data.loader_workers` reader threads of the
             training process write each sample straight into a ring of pinned batch buffers
  processes  DataLoader worker processes collating into shared memory, and its pin-memory
             thread copying each batch into pinned memory
  today      (--today) as before issue 32: processes shipping float32 transformed on the CPU
and copied to the device by data.to_device. With CUDA all of it is real (pinned memory, a
non_blocking .to('cuda'), the device-side transform). Without, pinned memory is stood in for
by page-locked (mlock) buffers: the threads' batch buffers themselves, and for the processes
a copy of each batch into a page-locked buffer of its size, in a thread of the main process
as DataLoader's pin-memory thread; the copy to the device is a DMA that costs the host no CPU.
The consumer stands in for the GPU step (GpuClock): a step of batch / rate seconds starts
once its batch is there and the last step ended, so the sustained rate is min(rate, what the
path delivers). Page cache warm (the staged copies were just written), as a node-local
stage dir on NVMe reads. One long epoch per figure (after a warm-up epoch over the files),
drawn from the files again and again, so the pipeline does not drain every few dozen samples.

Per format, feed and worker count W the table gives: sustained samples/s; the share of the
time the GPU waited for data; CPU ms per sample of the loader worker processes and of the
main process (all its threads: readers, pin thread, receiving batches; not the training
loop's kernel launches, which `make gpu-check` measures on the GPU), and of its busiest
thread, from /proc; per core = samples per CPU second of the whole path. The summary: cores
one GPU needs at a rate R = R x CPU seconds per sample (the largest measured over the worker
counts), and the rate allowed by the busiest thread through which every batch passes (one
thread runs on one core at most: DataLoader's pin thread, or the loop; not a reader), at
NVIDIA's v3.0 eos H100 rates (206 CosmoFlow samples/s at local batch 1, 30 DeepCAM at 1, 82
at 8: hpc_results_v3.0, ../shared facts) and the rates of the kit's step given with
--step-rate; a format fits if both hold within the 14 cores an eos node gives each H100 (2 x
56-core Xeon 8480C per 8 H100).

The header says the machine, CPU model and flags, load at start, torch, the device, and
/dev/shm. Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import queue
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_flags, cpu_model, machine_line  # noqa: E402
from benchlib import bad as _bad  # noqa: E402

# per-H100 training samples/s of NVIDIA's v3.0 eos runs, by (benchmark, local batch)
NVIDIA_H100 = {("cosmoflow", 1): 206.0, ("deepcam", 1): 30.0, ("deepcam", 8): 82.0}
CORES_PER_H100 = 14
FORMATS = {   # name: (benchmark, what it is)
    "gzip-tfrecord": ("cosmoflow", "GZIP TFRecords staged as copies, inflated every epoch (the reference's staging)"),
    "stage-decode": ("cosmoflow", "GZIP TFRecords decoded once at staging into npy (data.stage_decode)"),
    "hdf5": ("deepcam", "HDF5 staged as copies (the reference's)"),
}


def bad(message: str) -> None:
    _bad("feed_rate", message)


def parse_pairs(items: list[str], what: str) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or key not in ("cosmoflow", "deepcam") or float(value) <= 0:
                raise ValueError
            out[key] = float(value)
        except ValueError:
            bad(f"{what} {item!r}: expected cosmoflow=RATE or deepcam=RATE with RATE > 0 samples/s")
    return out


def int_list(text: str, what: str, low: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < low:
        bad(f"{what} {text!r}: a comma-separated list of integers >= {low}")
    return values


# ---------------------------------------------------------------- CPU time from /proc

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process, all its threads: the scheduler's nanoseconds on CPU
    (/proc/PID/task/*/schedstat), else utime + stime in clock ticks; 0 once it is gone."""
    try:
        return sum(int((t / "schedstat").read_text().split()[0]) for t in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def children() -> list[int]:
    me = os.getpid()
    out = []
    for task in Path(f"/proc/{me}/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def thread_cpu() -> dict:
    """CPU seconds of each thread of this process, by thread id."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[task.name] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            pass
    return out


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the pinned-copy stand-in

def lock(t) -> bool:
    """mlock a tensor's memory (page-locked, as pinned memory is); whether it worked."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mlock(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(t.nbytes)) == 0


def locked_buffer(nbytes: int):
    """A page-locked host buffer (mlock), as pinned memory is; (torch uint8 tensor, locked?)."""
    import numpy as np
    import torch
    arr = np.empty(nbytes, dtype=np.uint8)
    arr[::4096] = 0   # touched: no first-use page faults inside the timed copies
    libc = ctypes.CDLL(None, use_errno=True)
    ok = libc.mlock(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(nbytes)) == 0
    return torch.from_numpy(arr), ok


def tensors_of(batch):
    x, y = batch
    parts = list(x) if isinstance(x, tuple) else [x]
    return [t for t in parts + [y] if hasattr(t, "nbytes")]


class PinStandIn:
    """DataLoader's pin-memory thread without an accelerator: a thread of the main process that
    takes each batch from the loader and copies its tensors into a page-locked buffer of the
    batch's size (one of a ring of prefetch + 1), standing in for pinning + the host-to-device
    copy. Iterating gives the batches in order."""

    def __init__(self, loader, slots: int):
        self.loader, self.slots, self.bufs, self.locked = loader, slots, [], True
        self.cpu = 0.0   # CPU seconds of the pin threads so far (a thread per epoch: counted before it ends)

    def __iter__(self):
        import torch
        ready, free = queue.Queue(), queue.Queue()
        for i in range(self.slots):
            free.put(i)
        done = object()

        def pin():
            start = time.thread_time()
            try:
                for batch in self.loader:
                    slot = free.get()
                    parts = tensors_of(batch)
                    need = sum(t.nbytes for t in parts)
                    if slot >= len(self.bufs):
                        buf, ok = locked_buffer(need)
                        self.bufs.append(buf)
                        self.locked &= ok
                    buf, pos = self.bufs[slot], 0
                    for t in parts:
                        buf[pos:pos + t.nbytes].copy_(t.reshape(-1).view(torch.uint8))
                        pos += t.nbytes
                    ready.put((slot, len(parts[0])))
            except BaseException as e:   # handed to the consumer
                ready.put(e)
            self.cpu += time.thread_time() - start
            ready.put(done)

        thread = threading.Thread(target=pin, daemon=True)
        thread.start()
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            slot, n = item
            yield n
            free.put(slot)
        thread.join()


# ---------------------------------------------------------------- one measurement

class GpuClock:
    """The GPU the consumer stands in for: step i starts when its batch is there and step
    i - 1 has ended, and takes batch / rate seconds. The host loop runs one step ahead, as
    an asynchronous training loop does: it takes batch i + 1 while step i runs (it sleeps
    until step i starts). The time the GPU waits for data is what starves it."""

    def __init__(self, rate: float):
        self.rate, self.free, self.waited, self.started = rate, 0.0, 0.0, None

    def step(self, samples: int) -> None:
        now = time.perf_counter()
        if self.started is None:   # the clock starts with the first batch: the pipeline's fill is not counted
            self.started = self.free = now
        if now > self.free:
            self.waited += now - self.free
        start = max(now, self.free)
        self.free = start + (samples / self.rate if self.rate else 0.0)
        time.sleep(max(0.0, start - time.perf_counter()))


class Epochs:
    """The loader's sampler: epochs of `length` samples drawn from the n files, a fresh
    permutation for every pass over them. An epoch longer than the files keeps the workers
    streaming for the whole timed interval (the pipeline drains at every epoch's end, and a
    real epoch is 121,266 or 524,288 samples, not the bench's few dozen)."""

    def __init__(self, n: int):
        import numpy as np
        self.n, self.length, self.rng = n, n, np.random.default_rng(0)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        import numpy as np
        passes = -(-self.length // self.n)
        return iter(np.concatenate([self.rng.permutation(self.n) for _ in range(passes)])[:self.length].tolist())


def measure(make_loader, n_files: int, batch: int, rate: float, device, cuda: bool, seconds: float,
            prefetch: int) -> dict:
    """A warm-up epoch over the files, then one epoch long enough for about `seconds` at the
    warm-up's pace, against a GpuClock at `rate` (0: no wait). Returns sustained samples/s
    (samples from the first batch's step to the end of the last), the share of it the GPU
    waited for data, and CPU per sample: between the two epochs nothing is in flight (the
    loaders prefetch within an epoch), so the timed epoch's CPU is exactly its samples'."""
    import torch
    from hpckit.common.feed import PinnedBatches
    sampler = Epochs(n_files)
    loader = make_loader(sampler)
    threads = isinstance(loader, PinnedBatches)
    if cuda:
        from hpckit.cosmoflow import data as cdata
        from hpckit.deepcam import data as ddata
        done = torch.cuda.Event(blocking=True)   # waiting on it sleeps instead of spinning a core

        def epoch(clock):
            n = 0
            for x, y in loader:
                to_device = cdata.to_device if isinstance(x, cdata.Counts) else ddata.to_device
                xd, _ = to_device(x, y, device)   # non-blocking copy and transform, queued
                done.record()
                clock.step(len(xd))
                done.synchronize()   # the previous step's inputs were on the device before it ended
                n += len(xd)
            return n
    elif threads:   # the readers write into the batch buffers the host-to-device copy reads: page-locked here
        pinned = loader
        pinned.locked = None   # not tried yet: once, when the buffers exist

        def epoch(clock):
            n = 0
            for x, y in loader:
                if pinned.locked is None:
                    pinned.locked = all(lock(t) for slot in loader._slots for t in slot)
                got = len(y)
                clock.step(got)
                n += got
            return n
    else:
        pinned = PinStandIn(loader, prefetch + 1)

        def epoch(clock):
            n = 0
            for got in pinned:
                clock.step(got)
                n += got
            return n

    t0 = time.perf_counter()
    warm = epoch(GpuClock(0))   # workers started, pinned buffers allocated
    pace = min(warm / (time.perf_counter() - t0), rate or float("inf"))
    sampler.length = max(n_files, int(pace * seconds), 4 * batch) // batch * batch
    pids = children()
    w0, m0, th0 = sum(map(proc_cpu, pids)), self_cpu(), thread_cpu()
    pin0 = 0.0 if cuda or threads else pinned.cpu
    clock = GpuClock(rate)
    n = epoch(clock)
    time.sleep(max(0.0, clock.free - time.perf_counter()))
    wall = clock.free - clock.started
    w1, m1, th1 = sum(map(proc_cpu, pids)), self_cpu(), thread_cpu()
    # the busiest thread that handles every batch (a reader thread handles 1 / W of them)
    readers = {str(t.native_id) for t in loader._pool._threads} if threads else set()
    busiest = max([th1[t] - th0.get(t, 0.0) for t in th1 if t not in readers]
                  + [0.0 if cuda or threads else pinned.cpu - pin0])
    locked = bool(getattr(pinned, "locked", True)) if not cuda else True
    del loader
    gc.collect()
    return {"samples": n, "seconds": wall, "sustained": n / wall, "gpu_waited": clock.waited / wall,
            "worker_ms": 1000 * (w1 - w0) / n, "main_ms": 1000 * (m1 - m0) / n, "thread_ms": 1000 * busiest / n,
            "locked": locked}


# ---------------------------------------------------------------- datasets and staging

def link_to(unique: list[Path], dest: Path, n: int, name) -> list[Path]:
    """n file names in `dest`, hard links to the distinct samples in turn (no extra space)."""
    dest.mkdir(parents=True)
    out = []
    for i in range(n):
        p = dest / name(i)
        os.link(unique[i % len(unique)], p)
        out.append(p)
    return out


def staged_cosmoflow(work: Path, n: int, distinct: int, size: int, log) -> dict:
    from hpckit.common import staging
    from hpckit.cosmoflow import data as cdata
    from hpckit.cosmoflow.synthetic import write_dataset
    t = time.perf_counter()
    write_dataset(work / "cosmo-gen", distinct, 1, size=size, seed=1, fmt="tfrecord")
    unique = sorted((work / "cosmo-gen" / "train").glob("*.tfrecord"))
    link_to(unique, work / "cosmo" / "train", n, lambda i: f"univ_bench_{i:07d}.tfrecord")
    log(f"# cosmoflow: {distinct} distinct {size}^3 x 4 samples by hpckit datagen (GZIP level 1), "
        f"{n} names, {time.perf_counter() - t:.1f} s")
    split = cdata.find_split(work / "cosmo", "train", n, "data.n_train")
    assert split.compression == "GZIP", split.compression
    t = time.perf_counter()
    (work / "stage").mkdir(exist_ok=True)
    nbytes = staging.copy_files(split.files, work / "stage" / "cosmo-copies")
    copy_s = time.perf_counter() - t
    copies = split.relocated(work / "stage" / "cosmo-copies")
    t = time.perf_counter()
    cdata.decode_into(copies, work / "stage" / "cosmo-decoded", size)
    decode_s = time.perf_counter() - t
    threads = len(os.sched_getaffinity(0))
    log(f"# staging: copies {n / copy_s:.0f} samples/s ({nbytes / copy_s / 2 ** 20:.0f} MiB/s); data.stage_decode "
        f"{n / decode_s:.1f} samples/s with {threads} thread(s), {n / decode_s / threads:.1f} per core (once per run)")
    return {"gzip-tfrecord": copies, "stage-decode": cdata.decoded(copies, work / "stage" / "cosmo-decoded"),
            "decode_per_core": n / decode_s / threads}


def staged_deepcam(work: Path, n: int, distinct: int, height: int, width: int, log):
    from hpckit.common import staging
    from hpckit.deepcam import data as ddata
    from hpckit.deepcam.synthetic import write_dataset
    t = time.perf_counter()
    write_dataset(work / "cam-gen", distinct, 1, height=height, width=width, seed=1)
    unique = sorted((work / "cam-gen" / "train").glob("data-*.h5"))
    files = link_to(unique, work / "cam" / "train", n, lambda i: f"data-bench-{i:07d}.h5")
    shutil.copyfile(work / "cam-gen" / "stats.h5", work / "cam" / "stats.h5")
    log(f"# deepcam: {distinct} distinct {height} x {width} x 16 samples by hpckit datagen, {n} names, "
        f"{time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    (work / "stage").mkdir(exist_ok=True)
    nbytes = staging.copy_files(files, work / "stage" / "cam-copies")
    copy_s = time.perf_counter() - t
    log(f"# staging: copies {n / copy_s:.0f} samples/s ({nbytes / copy_s / 2 ** 20:.0f} MiB/s)")
    staged = ddata.DeepCamFiles("train", sorted((work / "stage" / "cam-copies").iterdir()))
    return {"hdf5": staged}, ddata.load_stats(work / "cam")


# ---------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="the lent GPU machine's short run: threads 2,6,12, processes 12, 2 s per figure")
    p.add_argument("--workers", help="loader worker counts (default 1,2; --quick 2,6,12)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"of {', '.join(FORMATS)} (default all)")
    p.add_argument("--cosmoflow", type=int, help="CosmoFlow sample files (default 64)")
    p.add_argument("--deepcam", type=int, help="DeepCAM sample files (default 64)")
    p.add_argument("--batch", action="append", default=[],
                   help="BENCH=B,B..: local batches (default cosmoflow=1, deepcam=1,8: NVIDIA's)")
    p.add_argument("--rate", action="append", default=[],
                   help="BENCH=R: the consumer's samples/s (default NVIDIA's H100 rate at the batch)")
    p.add_argument("--step-rate", action="append", default=[],
                   help="BENCH=R: samples/s the kit's training step consumes on the GPU (measured there)")
    p.add_argument("--seconds", type=float,
                   help="about this many seconds timed per figure, one epoch (default 4; --quick 2)")
    p.add_argument("--tiny", action="store_true", help="tiny samples (CosmoFlow 16^3, DeepCAM 32 x 48): the tests' "
                   "dry run, no figure of the reference sizes")
    p.add_argument("--feeds", default="threads,processes",
                   help="threads (the GPU path: reader threads into pinned batch buffers), processes (DataLoader "
                        "workers and its pin thread); default both")
    p.add_argument("--today", action="store_true", help="also the path before issue 32 (float32 from DataLoader "
                   "workers, one worker count)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--workdir", help="where the datasets go (default a new temporary directory, removed)")
    p.add_argument("--json", help="write every figure to this file")
    args = p.parse_args()
    workers = int_list(args.workers or ("2,6,12" if args.quick else "1,2"), "--workers", 1)
    process_workers = [12] if args.quick and not args.workers else workers
    feeds = [f for f in args.feeds.split(",") if f]
    if not feeds or set(feeds) - {"threads", "processes"}:
        bad(f"--feeds {args.feeds!r}: a comma-separated list of threads, processes")
    formats = [f for f in args.formats.split(",") if f]
    if not formats or set(formats) - set(FORMATS):
        bad(f"--formats {args.formats!r}: a comma-separated list of {', '.join(FORMATS)}")
    batches = {"cosmoflow": [1], "deepcam": [1, 8]}
    for item in args.batch:
        key, _, value = item.partition("=")
        if key not in batches:
            bad(f"--batch {item!r}: expected cosmoflow=B,.. or deepcam=B,..")
        batches[key] = int_list(value, "--batch", 1)
    rates, step_rates = parse_pairs(args.rate, "--rate"), parse_pairs(args.step_rate, "--step-rate")
    n_cosmo = args.cosmoflow or 64
    n_cam = args.deepcam or 64
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    for name, n, b in (("--cosmoflow", n_cosmo, max(batches["cosmoflow"])),
                       ("--deepcam", n_cam, max(batches["deepcam"]))):
        if n < 2 * b:
            bad(f"{name} {n}: at least two batches of {b} samples")
    if seconds <= 0:
        bad(f"--seconds {args.seconds}: must be > 0")

    import torch
    from hpckit.common.config import load_config
    from hpckit.cosmoflow import data as cdata
    from hpckit.deepcam import data as ddata
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        bad("--device cuda: no CUDA device is visible to torch")
    device = torch.device("cuda" if cuda else "cpu")
    torch.set_num_threads(1)   # the main process's copies on one thread, as DataLoader's pin thread

    def log(line: str) -> None:
        print(line, flush=True)

    shm = f"{shutil.disk_usage('/dev/shm').free / 2 ** 30:.1f} GiB free" if os.path.isdir("/dev/shm") else "none"
    log(machine_line())
    log(f"# cpu model {cpu_model()}; flags {cpu_flags()}; torch {torch.__version__}; "
        f"device {torch.cuda.get_device_name() if cuda else 'none (pinning + host-to-device copy stood in for)'}; "
        f"/dev/shm {shm}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hpckit-feed-rate-"))
    if args.workdir:
        try:
            work.mkdir(parents=True)
        except OSError as e:
            bad(f"--workdir {work}: cannot create a new directory ({e.strerror})")
    size, height, width = (16, 32, 48) if args.tiny else (128, 768, 1152)
    rows, failed = [], False
    try:
        splits, stats = {}, None
        if {"gzip-tfrecord", "stage-decode"} & set(formats):
            splits.update(staged_cosmoflow(work, n_cosmo, min(n_cosmo, 8), size, log))
        if "hdf5" in formats:
            cam, stats = staged_deepcam(work, n_cam, min(n_cam, 4), height, width, log)
            splits.update(cam)
        log(f"# consumer: a GPU step of batch / rate seconds starts once its batch is there and the last step ended; "
            f"one epoch of about {seconds:g} s timed per figure, after a warm-up epoch over the files; CPU ms per "
            "sample from /proc: loader worker processes, the main process (all its threads, reader threads "
            "included) and its busiest thread that handles every batch (not a reader)")
        log(f"{'benchmark':<10} {'format':<14} {'feed':<9} {'batch':>5} {'workers':>7} {'consumer':>8} "
            f"{'sustained':>9} {'GPU idle':>8} {'worker ms':>9} {'main ms':>7} {'thread ms':>9} {'per core':>8}  "
            "samples/s, % of the time, CPU ms per sample")
        cfgs = {"cosmoflow": load_config("cosmoflow", "reference", [f"data.sample_size={size}"]),
                "deepcam": load_config("deepcam", "reference", [f"data.height={height}", f"data.width={width}"])}
        variants = [(feed, True, feed, process_workers if feed == "processes" else workers) for feed in feeds]
        if args.today:
            variants.append(("today", False, "processes", workers[:1]))
        for fmt in formats:
            bench = FORMATS[fmt][0]
            for b in batches[bench]:
                rate = rates.get(bench) or NVIDIA_H100.get((bench, b)) or NVIDIA_H100[(bench, 1)]
                for label, raw, feed, counts in variants:
                    for w in counts:
                        cfg = copy.deepcopy(cfgs[bench])
                        cfg["data"].update(batch_size=b, loader_workers=w)
                        if bench == "cosmoflow":
                            def make(sampler, cfg=cfg, split=splits[fmt], raw=raw, feed=feed):
                                return cdata.torch_loader(split, cfg, True, 0, sampler, device=device,
                                                          device_transform=raw, feed=feed)
                        else:
                            def make(sampler, cfg=cfg, split=splits[fmt], raw=raw, feed=feed):
                                return ddata.torch_loader(split, stats, cfg, True, 0, sampler, device=device,
                                                          device_transform=raw, feed=feed)
                        try:
                            r = measure(make, len(splits[fmt]), b, rate, device, cuda, seconds,
                                        cfg["data"]["prefetch"])
                        except Exception as e:   # one figure missing: said, the others still measured
                            failed = True
                            log(f"{bench:<10} {fmt:<14} {label:<9} {b:>5} {w:>7} ERROR {type(e).__name__}: "
                                + (str(e).strip().splitlines() or [""])[0][:300])
                            continue
                        r.update(bench=bench, fmt=fmt, feed=label, batch=b, workers=w, consumer=rate, raw=raw)
                        rows.append(r)
                        per_core = 1000 / max(r["worker_ms"] + r["main_ms"], 1e-6)
                        log(f"{bench:<10} {fmt:<14} {label:<9} {b:>5} {w:>7} {rate:>8.0f} {r['sustained']:>9.1f} "
                            f"{100 * r['gpu_waited']:>7.0f}% {r['worker_ms']:>9.1f} {r['main_ms']:>7.1f} "
                            f"{r['thread_ms']:>9.1f} {per_core:>8.1f}"
                            + ("" if r["locked"] else "  (buffer not page-locked: mlock refused)"))
        summary = summarise(rows, step_rates, log)
    except Exception as e:   # a figure missing is a failed bench, said in one line
        failed = True
        print(f"feed_rate: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        summary = []
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_line(), "flags": cpu_flags(), "model": cpu_model(),
                                               "device": str(device), "rows": rows, "summary": summary}, indent=1))
    return 1 if failed else 0


def summarise(rows: list[dict], step_rates: dict, log) -> list[dict]:
    """Cores per GPU at each rate, from the largest CPU time per sample measured for the format
    and feed, and the ceiling of the busiest thread of the main process (one thread runs on
    one core at most)."""
    out = []
    log("# cores one GPU needs = rate x CPU seconds per sample (workers + main process, the largest measured over "
        f"the worker counts); an eos node gives each H100 {CORES_PER_H100}; the main process's busiest thread "
        "that handles every batch (DataLoader's pin thread, or the loop) caps the rate at 1 / its CPU seconds per "
        "sample")
    for key in dict.fromkeys((r["bench"], r["fmt"], r["feed"], r["batch"]) for r in rows):
        mine = [r for r in rows if (r["bench"], r["fmt"], r["feed"], r["batch"]) == key]
        bench, fmt, feed, batch = key
        cpu_ms = max(max(r["worker_ms"] + r["main_ms"] for r in mine), 1e-6)
        ceiling = 1000 / max(max(r["thread_ms"] for r in mine), 1e-6)
        targets = [(f"NVIDIA H100 {NVIDIA_H100[(bench, batch)]:g}", NVIDIA_H100[(bench, batch)])] \
            if (bench, batch) in NVIDIA_H100 else []
        if bench in step_rates:
            targets.append((f"kit step {step_rates[bench]:g}", step_rates[bench]))
        best = max(mine, key=lambda r: r["sustained"])
        for label, rate in targets:
            cores = rate * cpu_ms / 1000
            fits = cores <= CORES_PER_H100 and ceiling >= rate
            log(f"{bench:<10} {fmt:<14} {feed:<9} batch {batch}: {label} samples/s needs {cores:.1f} cores "
                f"({1000 / cpu_ms:.1f} samples/s per core, the busiest thread up to {ceiling:.0f} samples/s): "
                f"{'fits' if fits else 'does NOT fit'} in {CORES_PER_H100}; sustained here {best['sustained']:.1f} "
                f"with {best['workers']} workers")
            out.append({"bench": bench, "fmt": fmt, "feed": feed, "batch": batch, "target": label, "rate": rate,
                        "cores": cores, "per_core": 1000 / cpu_ms, "thread_ceiling": ceiling, "fits": fits,
                        "best_sustained": best["sustained"]})
    return out


if __name__ == "__main__":
    sys.exit(main())
