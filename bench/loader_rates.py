#!/usr/bin/env python3
"""Can the kit's loaders feed a GPU? Samples/s per CPU core of every on-disk format, and
the cores one GPU would need at the rates published systems train at.

    .venv/bin/python bench/loader_rates.py                     # full-size samples, 1 and 2 workers
    .venv/bin/python bench/loader_rates.py --cosmoflow 16 --deepcam 6 --workers 1

Full-size samples (CosmoFlow 128^3 x 4 int16, DeepCAM 768 x 1152 x 16) written by the kit's
datagen into a temporary directory; each loader is the one `hpckit train` uses (PyTorch
DataLoader, train=True: shuffled, batched, transformed), passed twice over the files with
the page cache warm, the second pass timed: the decode + transform ceiling per core, as a
node-local staged copy on fast storage reads. Formats:

  cosmoflow gzip-tfrecord   the public dataset's layout, inflated every epoch
  cosmoflow npy             the npy layout (files_data.lst / files_label.lst)
  cosmoflow stage-decoded   gzip-tfrecord staged with data.stage_decode: decoded once at
                            staging into npy (the staging line times that decode, per core,
                            once per run), then read as npy every epoch
  deepcam hdf5              the public layout (one HDF5 file per sample)

A figure per format and worker count W: samples/s, per core (/ W: the workers are the cores
doing the reading), and cores per GPU at the median train samples/s per accelerator of
published v3.0 logs (hpc_results_v3.0, epoch_start..epoch_stop): NVIDIA eos H100 190
CosmoFlow, 30 DeepCAM; Perlmutter A100 85 and 20. An eos node has 14 CPU cores per GPU: the
verdict says whether the format fits in them. The last lines compare the formats side by
side (the ratio of per-core rates). The header says the machine, its CPU flags and the load
at start. Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import machine_line  # noqa: E402
from benchlib import bad as _bad  # noqa: E402

RATES = {"cosmoflow": {"H100": 190.0, "A100": 85.0}, "deepcam": {"H100": 30.0, "A100": 20.0}}
CORES_PER_GPU = 14   # NVIDIA eos: 2 x 56-core Xeon 8480C per 8 H100


def bad(message: str) -> None:
    _bad("loader_rates", message)


def timed_pass(loader) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    for batch in loader:
        n += len(batch[0])
    return n, time.perf_counter() - t0


def rate(make_loader, workers: int) -> float:
    loader = make_loader(workers)
    timed_pass(loader)                  # warm: page cache, worker start-up
    n, s = timed_pass(loader)
    del loader
    return n / s


def line(bench: str, fmt: str, workers: int, sps: float) -> dict:
    per_core = sps / workers
    need = {gpu: r / per_core for gpu, r in RATES[bench].items()}
    print(f"{bench:<10} {fmt:<15} {workers:>7} {sps:>9.1f} {per_core:>13.1f} "
          f"{need['H100']:>15.1f} {need['A100']:>15.1f}  "
          f"{'fits' if need['H100'] <= CORES_PER_GPU else 'does NOT fit'} in {CORES_PER_GPU} cores per H100", flush=True)
    return {"bench": bench, "fmt": fmt, "workers": workers, "per_core": per_core, "h100_cores": need["H100"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cosmoflow", type=int, default=24, help="CosmoFlow samples (default 24)")
    p.add_argument("--deepcam", type=int, default=8, help="DeepCAM samples (default 8)")
    p.add_argument("--workers", default="1,2", help="loader worker counts, comma-separated (default 1,2)")
    p.add_argument("--keep", action="store_true", help="keep the datasets")
    args = p.parse_args()
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        workers = []
    if not workers or min(workers) < 1:
        bad(f"--workers {args.workers!r}: a comma-separated list of worker counts >= 1, e.g. 1,2")
    if args.cosmoflow < 4 or args.deepcam < 2:
        bad("--cosmoflow at least 4 and --deepcam at least 2 samples (one batch of 4 and of 2)")

    from hpckit.common.config import load_config
    from hpckit.cosmoflow import data as cdata
    from hpckit.cosmoflow.synthetic import write_dataset as write_cosmo
    from hpckit.deepcam import data as ddata
    from hpckit.deepcam.synthetic import write_dataset as write_cam

    print(machine_line())
    print(f"# full-size samples, page cache warm (second pass timed), PyTorch DataLoader of hpckit train; "
          f"{os.cpu_count()} CPUs here: worker counts above that share cores")
    work = Path(tempfile.mkdtemp(prefix="hpckit-loader-bench-"))
    rows = []
    try:
        ccfg = load_config("cosmoflow", "reference", [])
        ccfg["data"]["batch_size"] = 4
        n = args.cosmoflow - args.cosmoflow % 4
        for fmt in ("tfrecord", "npy"):
            write_cosmo(work / f"cosmo-{fmt}", n, 1, size=128, seed=1, fmt=fmt)
        gz = cdata.find_dataset(work / "cosmo-tfrecord", n, 1)["train"]
        assert gz.compression == "GZIP", gz.compression
        npy = cdata.find_dataset(work / "cosmo-npy", n, 1)["train"]
        (work / "stage").mkdir()
        decode_s = {}
        for threads in sorted({1, os.cpu_count() or 1}):
            dest = work / "stage" / f"decoded-{threads}"
            t0 = time.perf_counter()
            if threads == 1:
                dest.mkdir()
                for i in range(len(gz)):   # one core: the same decode, serially
                    single = gz.subset([i])
                    cdata.decode_into(single, dest / f"s{i}", 128)
            else:
                cdata.decode_into(gz, dest, 128)
            decode_s[threads] = time.perf_counter() - t0
        decoded = cdata.decoded(gz, work / "stage" / f"decoded-{max(decode_s)}")

        print(f"{'benchmark':<10} {'format':<15} {'workers':>7} {'samples/s':>9} {'per core':>13} "
              f"{'cores/H100 (190|30)':>15} {'cores/A100 (85|20)':>15}  verdict")
        for fmt, split in (("gzip-tfrecord", gz), ("npy", npy), ("stage-decoded", decoded)):
            def make(w, split=split):
                cfg = copy.deepcopy(ccfg)
                cfg["data"]["loader_workers"] = w
                return cdata.torch_loader(split, cfg, train=True, seed=0)
            for w in workers:
                rows.append(line("cosmoflow", fmt, w, rate(make, w)))
        for threads, s in sorted(decode_s.items()):
            print(f"cosmoflow  staging decode  {threads:>7} {n / s:>9.1f} {n / s / threads:>13.1f}  "
                  f"(samples/s decoded at staging with {threads} thread(s): once per run, inside the clock; "
                  f"a node stages its share, 524,288 / nodes samples)")

        dcfg = load_config("deepcam", "reference", [])
        dcfg["data"]["batch_size"] = 2
        m = args.deepcam - args.deepcam % 2
        write_cam(work / "cam", m, 1, seed=1)
        files = ddata.find_dataset(work / "cam", m, 1)["train"]
        stats = ddata.load_stats(work / "cam")

        def make_cam(w):
            cfg = copy.deepcopy(dcfg)
            cfg["data"]["loader_workers"] = w
            return ddata.torch_loader(files, stats, cfg, train=True, seed=0)
        for w in workers:
            rows.append(line("deepcam", "hdf5", w, rate(make_cam, w)))

        one = {(r["bench"], r["fmt"]): r for r in rows if r["workers"] == 1}
        if ("cosmoflow", "gzip-tfrecord") in one:
            base = one[("cosmoflow", "gzip-tfrecord")]["per_core"]
            for fmt in ("npy", "stage-decoded"):
                r = one[("cosmoflow", fmt)]
                print(f"# cosmoflow {fmt} against gzip-tfrecord, per core with 1 worker: "
                      f"{r['per_core'] / base:.2f}x ({base:.1f} -> {r['per_core']:.1f} samples/s; cores per H100 "
                      f"{one[('cosmoflow', 'gzip-tfrecord')]['h100_cores']:.1f} -> {r['h100_cores']:.1f})")
        worst = max((r for r in rows if r["workers"] == 1 and r["fmt"] != "gzip-tfrecord"),
                    key=lambda r: r["h100_cores"], default=None)
        if worst is not None:
            print(f"# with GZIP TFRecords decoded at staging (data.stage_decode), the most cores per H100 any format "
                  f"needs: {math.ceil(worst['h100_cores'])} ({worst['bench']} {worst['fmt']}); GZIP TFRecords inflated "
                  f"every epoch: {math.ceil(one[('cosmoflow', 'gzip-tfrecord')]['h100_cores'])}")
    finally:
        if args.keep:
            print(f"# datasets kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
