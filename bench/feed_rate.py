#!/usr/bin/env python3
"""Does `hpckit train`'s data path keep up with its step? The whole path measured, per number
of readers, beside the loader alone: no per-core extrapolation.

    .venv/bin/python bench/feed_rate.py                          # this machine: readers 1,2
    python3 bench/feed_rate.py --readers 1,2,4,8,14 --seconds 3  # a GPU node
    .venv/bin/python bench/feed_rate.py --rate 0                 # a consumer that never waits

For each on-disk format the kit reads, on full-size samples written by hpckit's datagen (a
few distinct ones hard-linked to many names; page cache warm, as a node-local stage dir):

  hdf5           DeepCAM's HDF5 files, read by the kit's GPU path (common/rawread.py)
  gzip-tfrecord  CosmoFlow's GZIP TFRecords, inflated every epoch (the reference's staging)
  tfrecord       the same records uncompressed
  stage-decode   CosmoFlow decoded once at staging into npy (data.stage_decode)
  lmdb           OpenCatalyst's LMDB records (DataLoader worker processes, as on every device)
  openfold       OpenFold's processed PDB / OpenProteinSet layout (chains.csv, the mmCIF dicts, the
                 alignment shards), each sample made by train.py's Samples (make_example) in
                 DataLoader worker processes, batch 1 (the reference's local batch)

two figures per reader count W, in alternating rounds (the best of each):

  loader   the loader `hpckit train` builds for an accelerator (DeepCAM and CosmoFlow: W reader
           threads into a ring of pinned batch buffers, common/feed.py; OpenCatalyst: W
           DataLoader workers; OpenFold: W DataLoader workers over train.py's Samples, its
           batches()), iterated with nothing else going on;
  path     the training loop's own code around it: MLPerfRun's LoopClock.timed (the input
           wait), step.prefetched (the copy to the device on a side stream), the benchmark's
           to_device (the transform on the device) and a step that consumes `--rate`
           samples/s: on CUDA a GPU kernel of batch / rate seconds on the training stream
           (the host queues it and goes on, as it does a CUDA graph's replay); without CUDA
           the device is PyTorch's `meta` device (the copies and the transform are queued to
           nothing, as a GPU would take them off the host) and the step is a clock that runs
           one step ahead of the host (bench/README.md). --rate 0: a step that takes no time.
           OpenFold's path is its own loop's (train.py: OpenFoldParts.cycle, Trainer.step):
           LoopClock.timed over the batches with the recycling schedule (TR.RecyclingSchedule)
           applied, then train.py's to_device, the step; its default rate is 0, since no GPU
           rate of its step has been measured yet (STEP_RATE has none). OpenCatalyst's path
           is its own loop's too (Trainer.train_epoch moves each batch itself: no
           step.prefetched, whose record_stream a batch dict would not take on CUDA).

Per row: samples/s of each, their ratio, the path's input wait share (LoopClock) and the
step's busy share, the CPU the path costs per sample (all threads and worker processes, user
+ system), and where the CPU went: the loop's own thread and the readers (share of each one's
time on a CPU). Per format: where the path stops scaling with more readers, and why, read off
those figures: the step's rate reached; the CPUs (readers + the loop outnumber them); the
loop's thread saturated; the readers busy on a CPU each (their per-sample work, memory
bandwidth); or the readers waiting (the GIL, I/O, the device holding the ring).

The header gives the machine, its CPU flags, the load at start and the device. Bad arguments:
one line, exit 2; a figure that fails: its row says so, exit 1.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, cpu_flags, machine_line, output_path, write_output  # noqa: E402
from benchlib import bad as _bad  # noqa: E402

sys.path.insert(0, str(REPO / "apps"))

FORMATS = {   # name: (benchmark, what it is)
    "hdf5": ("deepcam", "HDF5 staged as copies (the reference's layout)"),
    "gzip-tfrecord": ("cosmoflow", "GZIP TFRecords staged as copies, inflated every epoch (the reference's)"),
    "tfrecord": ("cosmoflow", "the same records, uncompressed"),
    "stage-decode": ("cosmoflow", "decoded once at staging into npy (data.stage_decode)"),
    "lmdb": ("oc20", "OpenCatalyst's LMDB records, staged as the node's share"),
    "openfold": ("openfold", "OpenFold's processed PDB/OpenProteinSet layout, staged whole (train.py's Samples)"),
}
DEFAULT_BATCH = {"deepcam": 8, "cosmoflow": 1, "oc20": 8, "openfold": 1}
# the step's samples/s on one H100 (bench/gpu_check.py, 2026-11-27: fp16; OC20 fp32 from files).
# OpenFold: no measured figure yet, so none is given: its default is a step of no time (rate 0)
STEP_RATE = {"deepcam": 82.7, "cosmoflow": 289.2, "oc20": 81.1}


def bad(message: str) -> None:
    _bad("feed_rate", message)


def int_list(text: str, what: str, low: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < low:
        bad(f"{what} {text!r}: a comma-separated list of integers >= {low}")
    return values


# ---------------------------------------------------------------- CPU time

def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process, by thread id (schedstat)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            pass
    return out


def process_cpu() -> float:
    """CPU seconds of this process and its live children (DataLoader workers), from /proc."""
    from hpckit.common import usage
    total = 0.0
    for pid in ["self", *usage.descendants()]:
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return total


# ---------------------------------------------------------------- the step stand-ins

class HostStep:
    """Without CUDA: the device is a clock that runs one step ahead of the host, as a GPU
    does: step i starts when it is queued and step i - 1 has ended, and takes batch / rate
    seconds; queuing step i + 1 waits (sleeps) until step i has started. `busy` is the
    device's time in steps."""

    def __init__(self, rate: float):
        self.rate, self.free, self.busy = rate, None, 0.0

    def __call__(self, samples: int) -> None:
        now = time.perf_counter()
        start = now if self.free is None else max(now, self.free)
        length = samples / self.rate if self.rate else 0.0
        self.free, self.busy = start + length, self.busy + length
        time.sleep(max(0.0, start - time.perf_counter()))

    def drain(self) -> None:
        if self.free is not None:
            time.sleep(max(0.0, self.free - time.perf_counter()))


class CudaStep:
    """On CUDA: a kernel that keeps the GPU busy batch / rate seconds, queued on the training
    stream (torch.cuda._sleep, its cycles per second measured first)."""

    def __init__(self, rate: float):
        import torch
        self.rate, self.torch = rate, torch
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        self.cycles_per_s = 10_000_000 / (a.elapsed_time(b) / 1e3)

    def __call__(self, samples: int) -> None:
        if self.rate:
            self.torch.cuda._sleep(int(self.cycles_per_s * samples / self.rate))

    def drain(self) -> None:
        self.torch.cuda.synchronize()


# ---------------------------------------------------------------- the sampler

class Epochs:
    """The loader's sampler: epochs of `length` samples drawn from the n files, a fresh
    permutation for every pass over them (an epoch longer than the files keeps the readers
    streaming for the whole timed interval: a real epoch is 121,266 or 524,288 samples)."""

    def __init__(self, n: int):
        import numpy as np
        self.n, self.length, self.rng = n, n, np.random.default_rng(0)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        import numpy as np
        passes = -(-self.length // self.n)
        return iter(np.concatenate([self.rng.permutation(self.n) for _ in range(passes)])[:self.length].tolist())


# ---------------------------------------------------------------- one format

class Path_:
    """One format at one batch and reader count: its loader, the device, the measurements."""

    def __init__(self, bench: str, make_loader, n_files: int, batch: int, readers: int, rate: float, cuda: bool):
        import torch
        from hpckit.common import step
        self.bench, self.batch, self.readers, self.rate, self.cuda = bench, batch, readers, rate, cuda
        self.sampler = Epochs(n_files)
        made = make_loader(self.sampler)   # OpenFold: (the loader, the run's recycling schedule)
        self.loader, self.schedule = made if bench == "openfold" else (made, None)
        self.device = torch.device("cuda" if cuda else "meta")
        self.prefetched = step.prefetched
        if bench == "openfold":
            from hpckit.openfold import train as OT
            # the loader's batches as train.py iterates them (batches(): a sample that failed
            # raises its KitError); the recycling schedule lives as long as the loader, as a run's
            loader = self.loader   # not self: no reference cycle (see close())
            self.batches = lambda: OT.batches(loader)
            self.to_device = OT.to_device
            return
        self.batches = lambda loader=self.loader: loader
        if bench == "deepcam":
            from hpckit.deepcam import data
            self.to_device = lambda x, y, device: data.to_device(x, y, device, torch.channels_last)
        elif bench == "cosmoflow":
            from hpckit.cosmoflow import data
            self.to_device = data.to_device
        else:   # OpenCatalyst's Trainer.train_epoch moves each batch itself (no step.prefetched)
            from hpckit.oc20 import data
            self.to_device = data.to_device

    def close(self) -> None:
        """DataLoader workers (OpenCatalyst, OpenFold) stopped now. Left to the garbage
        collector, they were never told to stop (strace: the index queue's feeder thread had
        ended before the stop was queued) and each waited out DataLoader's 5 s join timeout
        before it was terminated: 15 s of a --tiny run of one format."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    def _items(self, path: bool):
        """(samples of each batch) as the loop or the loader alone sees them."""
        from hpckit.common.usage import LoopClock
        if not path:
            for b in self.batches():
                yield _samples(self.bench, b)
            return
        clock = self.clock = LoopClock(self.device)
        self.step = CudaStep(self.rate) if self.cuda else HostStep(self.rate)
        if self.bench in ("oc20", "openfold"):
            # their train.py loops have no step.prefetched, so neither has this path: the batch is
            # asked for inside the run's LoopClock.timed (OpenFold: OpenFoldParts.cycle applies the
            # recycling schedule to it), then moved by the Trainer's own to_device (a dict, which
            # prefetched's record_stream would not take on CUDA)
            source = (self.schedule(b) for b in self.batches()) if self.bench == "openfold" else self.batches()
            for batch in clock.timed(source):
                batch = self.to_device(batch, self.device)
                n = _samples(self.bench, batch)
                self.step(n)
                yield n
            self.step.drain()
            return
        batches = clock.timed(self.loader)
        for x, y in self.prefetched(batches, self.to_device, self.device):
            n = _samples(self.bench, (x, y))
            self.step(n)
            yield n
        self.step.drain()

    def measure(self, path: bool, seconds: float) -> dict:
        """An epoch of about `seconds` (its length from the warm-up's pace): samples/s from the
        first batch to the last (the pipeline's fill not counted), the CPU it cost per sample,
        and the loop thread's and the readers' shares of their time on a CPU."""
        self.sampler.length = self.sampler.n
        t0, warm = time.perf_counter(), 0
        for n in self._items(path):   # warm-up: buffers made, workers started, layouts looked up
            warm += n
        pace = warm / max(time.perf_counter() - t0, 1e-6)
        self.sampler.length = max(self.sampler.n, 4 * self.batch, int(pace * seconds)) // self.batch * self.batch
        gc.collect()
        me = threading.get_native_id()
        readers = {t.native_id for t in getattr(getattr(self.loader, "_pool", None), "_threads", ())}
        n, first, th0, cpu0 = 0, None, None, None
        for got in self._items(path):
            if first is None:   # the clock starts at the first batch: its step is timed, its reading not
                first, th0, cpu0 = time.perf_counter(), thread_cpu(), process_cpu()
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                self.waited0 = self.clock.waited_s if path else 0.0
                if not path:
                    continue
            n += got
        last = time.perf_counter()
        th1, cpu1, r1 = thread_cpu(), process_cpu(), resource.getrusage(resource.RUSAGE_SELF)
        wall = last - first
        out = {"samples_per_s": n / wall, "samples": n, "seconds": wall,
               "cpu_ms": (cpu1 - cpu0) / max(n, 1) * 1e3,
               "sys_share": (r1.ru_stime - r0.ru_stime) / max((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                                                               1e-9),
               "loop_share": (th1.get(me, 0.0) - th0.get(me, 0.0)) / wall,
               "reader_share": (sum(th1.get(t, 0.0) - th0.get(t, 0.0) for t in readers) / (len(readers) * wall)
                                if readers else None)}
        if path:
            waited, busy = self.clock.take()
            out["input_wait"] = (waited - self.waited0) / wall if wall > 0 else None
            out["step_busy"] = (busy / wall if busy is not None else self.step.busy / wall) if self.rate else None
        return out


def _samples(bench: str, batch) -> int:
    """Samples of a batch as the loader gives it (OpenCatalyst, OpenFold: a dict) or the loop (x, y)."""
    if bench == "openfold":   # train.py's Trainer.step counts batch["aatype"].shape[0]
        return int(batch["aatype"].shape[0])
    if isinstance(batch, dict):
        return int(batch["natoms"].numel())
    x, y = batch
    return int(x["natoms"].numel()) if isinstance(x, dict) else len(y)


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


def staged_cosmoflow(work: Path, n: int, distinct: int, size: int, formats: list[str], log) -> dict:
    from hpckit.common import staging, tfrecord
    from hpckit.cosmoflow import data as cdata
    from hpckit.cosmoflow.synthetic import write_dataset
    t = time.perf_counter()
    write_dataset(work / "cosmo-gen", distinct, 1, size=size, seed=1, fmt="tfrecord")
    unique = sorted((work / "cosmo-gen" / "train").glob("*.tfrecord"))
    link_to(unique, work / "cosmo" / "train", n, lambda i: f"univ_bench_{i:07d}.tfrecord")
    split = cdata.find_split(work / "cosmo", "train", n, "data.n_train")
    (work / "stage").mkdir(exist_ok=True)
    copies = split.relocated(work / "stage" / "cosmo-copies")
    staging.copy_files(split.files, work / "stage" / "cosmo-copies", inside=work / "cosmo")
    out = {"gzip-tfrecord": copies}
    if "tfrecord" in formats:
        (work / "cosmo-plain-gen").mkdir()
        for f in unique:
            tfrecord.write_records(work / "cosmo-plain-gen" / f.name, list(tfrecord.read_records(f, "GZIP")),
                                   compression=None)
        link_to(sorted((work / "cosmo-plain-gen").iterdir()), work / "cosmo-plain" / "train", n,
                lambda i: f"univ_bench_{i:07d}.tfrecord")
        out["tfrecord"] = cdata.find_split(work / "cosmo-plain", "train", n, "data.n_train")
    if "stage-decode" in formats:
        t1 = time.perf_counter()
        cdata.decode_into(copies, work / "stage" / "cosmo-decoded", size)
        log(f"# cosmoflow data.stage_decode: {n / (time.perf_counter() - t1):.1f} samples/s with "
            f"{len(os.sched_getaffinity(0))} thread(s) (once per run, inside the clock)")
        out["stage-decode"] = cdata.decoded(copies, work / "stage" / "cosmo-decoded")
    log(f"# cosmoflow: {distinct} distinct {size}^3 x 4 samples by hpckit datagen, {n} names, "
        f"{time.perf_counter() - t:.1f} s")
    return out


def staged_deepcam(work: Path, n: int, distinct: int, height: int, width: int, log):
    from hpckit.common import staging
    from hpckit.deepcam import data as ddata
    from hpckit.deepcam.synthetic import write_dataset
    t = time.perf_counter()
    write_dataset(work / "cam-gen", distinct, 1, height=height, width=width, seed=1)
    unique = sorted((work / "cam-gen" / "train").glob("data-*.h5"))
    files = link_to(unique, work / "cam" / "train", n, lambda i: f"data-bench-{i:07d}.h5")
    shutil.copyfile(work / "cam-gen" / "stats.h5", work / "cam" / "stats.h5")
    (work / "stage").mkdir(exist_ok=True)
    staging.copy_files(files, work / "stage" / "cam-copies", inside=work / "cam")
    log(f"# deepcam: {distinct} distinct {height} x {width} x 16 samples by hpckit datagen, {n} names, "
        f"{time.perf_counter() - t:.1f} s")
    return ddata.DeepCamFiles("train", sorted((work / "stage" / "cam-copies").iterdir())), \
        ddata.load_stats(work / "cam")


def staged_oc20(work: Path, n: int, cfg: dict, log):
    from hpckit.oc20 import data as odata
    from hpckit.oc20.synthetic import write_dataset
    t = time.perf_counter()
    write_dataset(work / "oc20-gen", cfg, n, 1, seed=1)
    split = odata.find_dataset(work / "oc20-gen", n, 1)["train"]
    odata.stage_share(split, work / "stage" / "oc20")
    log(f"# oc20: {n} structures by hpckit datagen, staged as one LMDB, {time.perf_counter() - t:.1f} s")
    return odata.staged(split, work / "stage" / "oc20")


class OpenFoldData:
    """OpenFold's training data as OpenFoldParts.prepare reads it: `hpckit datagen openfold`'s
    layout staged whole (train.py's stage_tree), the training chains selected (read_chains,
    AlignmentIndex, training_chains), and n (index, seed) pairs of the reference's sampler
    (training_index_seed_pairs over the chains' sampling weights), one per sample name: the
    bench's Epochs sampler indexes them."""

    def __init__(self, work: Path, n: int, config: str, log):
        import argparse
        import contextlib
        import io
        from hpckit.common.config import load_config
        from hpckit.openfold import records, synthetic
        from hpckit.openfold import train as OT
        from hpckit.openfold import transforms as TR
        t = time.perf_counter()
        gen = work / "openfold-gen"
        with contextlib.redirect_stdout(io.StringIO()):   # its one line would fall inside the table
            synthetic.datagen_command(argparse.Namespace(out=str(gen), train=n, valid=1, seed=1, config=config,
                                                         shuffle_labels=False))
        _, files = OT.find_layout(str(gen))
        dest = work / "stage" / "openfold"
        dest.parent.mkdir(exist_ok=True)
        OT.stage_tree(files, gen, dest)
        self.layout = records.Layout.under(dest)
        self.cfg = load_config("openfold", config)
        d, tr = self.cfg["data"], self.cfg["train"]
        self.dc = TR.data_config(self.cfg)
        chains = records.read_chains(self.layout.chains)
        self.index = records.AlignmentIndex(self.layout.alignments)
        self.chains = records.training_chains(chains, self.index, tr["train_max_pdb_release_date"],
                                              tr["filter_by_alignments"])
        self.source = TR.template_source(chains, self.layout, self.dc, "train")
        self.pairs = records.training_index_seed_pairs(records.sampler_weights(self.chains), n, 1, 1,
                                                       records.training_sampler_seed(1))
        self.accumulation = tr["gradient_accumulation_iters"]
        lengths = [len(c.sequence) for c in self.chains]
        log(f"# openfold: {len(self.chains)} training chains of {min(lengths)}-{max(lengths)} residues by hpckit "
            f"datagen --config {config} (crop {d['crop_size']}, {d['max_msa_clusters']} MSA clusters, "
            f"{d['max_extra_msa']} extra sequences, {d['max_templates']} templates, up to "
            f"{d['num_recycling_iters']} recycling iterations), staged whole, {n} sampler pairs, "
            f"{time.perf_counter() - t:.1f} s")

    def __len__(self) -> int:
        return len(self.pairs)

    def loader(self, batch: int, workers: int, sampler):
        """train.py's loader() over train.py's Samples in the bench's sampler's order, and the
        run's recycling schedule beside it."""
        from hpckit.openfold import train as OT
        from hpckit.openfold import transforms as TR
        dataset = OT.Samples(self.chains, self.pairs, self.layout, self.index, self.source, self.dc, "train")
        made = OT.loader(dataset, batch, workers, sampler)
        schedule = TR.RecyclingSchedule(TR.training_dataloader_seed(1), self.dc.num_recycling_iters,
                                        self.accumulation)
        return made, schedule


# ---------------------------------------------------------------- where it stops scaling

def why_it_stops(rows: list[dict], cpus: int) -> str:
    """Where the path stops gaining (< 10 % from one reader count to the next) and why,
    read off the measured figures at that point."""
    rows = sorted(rows, key=lambda r: r["readers"])
    stop = next((b for a, b in zip(rows, rows[1:]) if b["path"] < 1.1 * a["path"]), None)
    if stop is None:
        return f"still scaling at {rows[-1]['readers']} reader(s) ({rows[-1]['path']:.1f} samples/s)"
    w, p = stop["readers"], stop["path_fig"]
    at = f"stops scaling at {w} reader(s), {stop['path']:.1f} samples/s: "
    if stop["rate"] and stop["path"] >= 0.95 * stop["rate"]:
        return at + f"the step's rate ({stop['rate']:g} samples/s) is reached"
    if w + 1 > cpus:
        return at + f"the CPUs: {w} readers and the loop on {cpus} CPU(s)"
    if p["loop_share"] >= 0.85:
        return at + f"the loop's thread is on a CPU {100 * p['loop_share']:.0f} % of the time (one core)"
    share = p.get("reader_share")
    if share is not None and share >= 0.8:
        return at + (f"the readers are each on a CPU {100 * share:.0f} % of the time: their per-sample work "
                     f"({p['cpu_ms']:.1f} CPU ms a sample, {100 * p['sys_share']:.0f} % in the kernel) or the "
                     "memory bandwidth")
    if share is not None:
        return at + (f"the readers wait ({100 * share:.0f} % of their time on a CPU): the GIL, I/O or the device "
                     "holding the ring")
    return at + "the loader's worker processes (their CPU is in the per-sample figure)"


# ---------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readers", default="1,2", help="reader counts (loader threads or workers; default 1,2)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"of {', '.join(FORMATS)} (default all)")
    p.add_argument("--batch", action="append", default=[], help="BENCH=B: local batch (default deepcam=8, "
                   "cosmoflow=1, oc20=8, openfold=1)")
    p.add_argument("--rate", type=float, help="the step's samples/s (default: the kit's H100 step, "
                   f"{', '.join(f'{k} {v:g}' for k, v in STEP_RATE.items())}; openfold 0: no GPU rate of its "
                   "step has been measured yet); 0: a step that takes no time")
    p.add_argument("--files", type=int, default=64, help="sample names per format (default 64)")
    p.add_argument("--seconds", type=float, default=3.0, help="about this many seconds per figure (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of loader and path, best of each")
    p.add_argument("--tiny", action="store_true", help="tiny samples (the tests' dry run): no figure of the "
                   "reference sizes")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--json", help="write every figure to this new file")
    args = p.parse_args()
    readers = int_list(args.readers, "--readers", 1)
    formats = [f for f in args.formats.split(",") if f]
    if not formats or set(formats) - set(FORMATS):
        bad(f"--formats {args.formats!r}: a comma-separated list of {', '.join(FORMATS)}")
    batches = dict(DEFAULT_BATCH)
    for item in args.batch:
        key, _, value = item.partition("=")
        if key not in batches:
            bad(f"--batch {item!r}: expected deepcam=B, cosmoflow=B, oc20=B or openfold=B")
        batches[key] = int_list(value, "--batch", 1)[0]
    if args.rate is not None and not (args.rate >= 0 and args.rate < 1e9):
        bad(f"--rate {args.rate}: samples/s >= 0")
    if not 0 < args.seconds < 3600:
        bad(f"--seconds {args.seconds}: between 0 and 3600")
    if not 1 <= args.rounds <= 100:
        bad(f"--rounds {args.rounds}: between 1 and 100")
    if args.files < 2 * max(batches.values()):
        bad(f"--files {args.files}: at least two batches")
    out_json = output_path("feed_rate", "--json", args.json)   # new, in a writable folder: before any work

    import torch
    from hpckit.common.config import load_config
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        bad("--device cuda: no CUDA device is visible to torch")
    torch.set_num_threads(1)
    cpus = len(os.sched_getaffinity(0))

    def log(line: str) -> None:
        print(line, flush=True)

    log(machine_line())
    log(f"# flags {cpu_flags()}; torch {torch.__version__}; {cpus} usable CPU(s); device "
        f"{torch.cuda.get_device_name() if cuda else 'none: the meta device, the step a host clock'}")
    work = Path(tempfile.mkdtemp(prefix="hpckit-feed-rate-"))
    size, height, width = (16, 32, 48) if args.tiny else (128, 768, 1152)
    rows, failed = [], False
    try:
        cfgs = {"cosmoflow": load_config("cosmoflow", "reference", [f"data.sample_size={size}"]),
                "deepcam": load_config("deepcam", "reference", [f"data.height={height}", f"data.width={width}"]),
                "oc20": load_config("oc20", "mini" if args.tiny else "reference")}
        splits, stats = {}, None
        if {"gzip-tfrecord", "tfrecord", "stage-decode"} & set(formats):
            splits.update(staged_cosmoflow(work, args.files, min(args.files, 8), size, formats, log))
        if "hdf5" in formats:
            splits["hdf5"], stats = staged_deepcam(work, args.files, min(args.files, 4), height, width, log)
        if "lmdb" in formats:
            splits["lmdb"] = staged_oc20(work, args.files, cfgs["oc20"], log)
        if "openfold" in formats:
            splits["openfold"] = OpenFoldData(work, args.files, "mini" if args.tiny else "reference", log)
        log(f"# per figure about {args.seconds:g} s after a warm-up epoch; {args.rounds} alternating round(s), the "
            "best of each; CPU ms per sample: all threads and worker processes; loop, readers: share of their time "
            "on a CPU")
        log(f"{'format':<14} {'batch':>5} {'readers':>7} {'step':>6} {'loader':>8} {'path':>8} {'ratio':>5} "
            f"{'wait':>5} {'busy':>5} {'CPU ms':>7} {'sys':>4} {'loop':>5} {'readers':>7}")
        for fmt in formats:
            bench = FORMATS[fmt][0]
            b = batches[bench]
            rate = STEP_RATE.get(bench, 0.0) if args.rate is None else args.rate   # OpenFold: none measured
            mine = []
            for w in readers:
                cfg = copy.deepcopy(cfgs.get(bench, {"data": {}}))
                cfg["data"].update(batch_size=b, loader_workers=w)
                split = splits[fmt]

                def make(sampler, cfg=cfg, split=split, bench=bench, b=b, w=w):
                    if bench == "openfold":
                        return split.loader(b, w, sampler)
                    if bench == "deepcam":
                        from hpckit.deepcam import data
                        return data.torch_loader(split, stats, cfg, True, 0, sampler,
                                                 device=torch.device("cuda") if cuda else None, device_transform=True)
                    if bench == "cosmoflow":
                        from hpckit.cosmoflow import data
                        return data.torch_loader(split, cfg, True, 0, sampler,
                                                 device=torch.device("cuda") if cuda else None, device_transform=True)
                    from hpckit.oc20 import data
                    return data.torch_loader(split, cfg, True, 0, sampler)
                try:
                    path = Path_(bench, make, len(split), b, w, rate, cuda)
                    best = {}
                    for _ in range(args.rounds):
                        for kind in ("loader", "path"):
                            r = path.measure(kind == "path", args.seconds)
                            if kind not in best or r["samples_per_s"] > best[kind]["samples_per_s"]:
                                best[kind] = r
                    path.close()
                    del path
                    gc.collect()
                except Exception as e:   # one figure missing: said, the others still measured
                    failed = True
                    log(f"{fmt:<14} {b:>5} {w:>7} ERROR {type(e).__name__}: "
                        + (str(e).strip().splitlines() or [""])[0][:300])
                    continue
                lo, pa = best["loader"], best["path"]
                row = {"format": fmt, "bench": bench, "batch": b, "readers": w, "rate": rate,
                       "loader": lo["samples_per_s"], "path": pa["samples_per_s"],
                       "ratio": pa["samples_per_s"] / lo["samples_per_s"], "loader_fig": lo, "path_fig": pa}
                rows.append(row)
                mine.append(row)
                fmt_share = lambda v: "  n/a" if v is None else f"{v:5.2f}"   # noqa: E731
                log(f"{fmt:<14} {b:>5} {w:>7} {rate:>6.0f} {lo['samples_per_s']:>8.1f} {pa['samples_per_s']:>8.1f} "
                    f"{row['ratio']:>5.2f} {fmt_share(pa['input_wait'])} {fmt_share(pa['step_busy'])} "
                    f"{pa['cpu_ms']:>7.1f} {100 * pa['sys_share']:>3.0f}% {100 * pa['loop_share']:>4.0f}% "
                    + ("    n/a" if pa["reader_share"] is None else f"{100 * pa['reader_share']:>6.0f}%"))
            if mine:
                why = why_it_stops(mine, cpus)
                for r in mine:
                    r["scaling"] = why
                log(f"# {fmt}: {why}")
    except Exception as e:   # the data could not be made: one line
        failed = True
        print(f"feed_rate: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if out_json is not None:
        write_output("feed_rate", "--json", out_json, json.dumps({"machine": machine_line(), "flags": cpu_flags(),
                                                                  "device": "cuda" if cuda else "meta", "rows": rows},
                                                                 indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
