#!/usr/bin/env python3
"""CosmoFlow throughput baseline: training step, data loaders, raw TFRecord reads.

Speed claims in this project are made by bench scripts that print figures, never by timed
unit tests. This one prints, for each model size in --sizes (a built-in config name or a
config file, as `hpckit train --config` takes), one line per figure:

train_step  (one line per framework)
    samples/s of a full training step on synthetic in-memory batches of the config's
    local batch size: forward, MSE loss, backward, SGD momentum update. PyTorch uses
    torch.optim.SGD; TensorFlow a tf.function step with tf.GradientTape and
    keras.optimizers.SGD. --warmup untimed steps (tracing, allocator warm-up), then
    --steps timed ones; samples/s = steps * batch / seconds, the mean step time follows
    in parentheses. No data loading is involved: this is the compute ceiling.

loader=pytorch|tensorflow  (per on-disk format, cache=cold and cache=warm)
    samples/s of one full pass over a small synthetic dataset written by
    hpckit.cosmoflow.synthetic.write_dataset (TFRecord GZIP or npy) through the kit's own
    loaders (hpckit.cosmoflow.data.torch_loader / tf_dataset, train=True: shuffled, last
    partial batch dropped), read, decoded and log-transformed, batched, nothing else.
    cold: the files were evicted from the page cache just before the pass
    (posix_fadvise DONTNEED, as a real run's cache_clear), so it includes the storage
    reads and the loader's start-up (PyTorch worker processes, the tf.data iterator) as
    a real run's first epoch does. warm: the second pass with the same loader, files in
    the page cache: the decode + transform ceiling. The note says how many bytes were
    still resident after the eviction; non-zero means the file system ignored it and
    "cold" is not cold.

raw_gunzip_read  (TFRecord only, cache=cold and cache=warm)
    the same TFRecord files read whole and gunzipped with zlib, no parsing: the floor
    under any TFRecord reader on this machine. MB/s counts bytes on disk (compressed);
    the decompressed rate follows in the note.

read_example_file  (TFRecord only, cache=cold and cache=warm)
    hpckit.common.tfrecord.read_example_file on the same files: read, gunzip, both
    CRC32C checks and tf.train.Example decoding (the PyTorch loader's per-sample reader,
    without the int16 -> float32 log transform). MB/s again counts bytes on disk.

The first line is a header (host, usable CPUs, threads, the 1-minute load average at
start, library versions, precision, devices). Figures taken on a busy machine are not
baselines: PyTorch's OpenMP threads in particular slow down many-fold when another process
competes for the cores (see bench/README.md). Each figure line is `key=value` tokens, the figure's name, metrics and a
human note in parentheses, so `re.findall(r"(\\S+)=(\\S+)", line.split(" (")[0])`
reads it back. --json FILE writes the header and all figures as JSON as well.

--precision bf16 runs the PyTorch forward under torch.autocast and builds the Keras model
under the mixed_bfloat16 policy; fp16 (autocast float16 + GradScaler, mixed_float16 +
LossScaleOptimizer) is a GPU configuration and is refused on CPU. --device picks the
PyTorch device (default cuda when available); TensorFlow uses the device it picks itself,
named in the header and its lines. MB is 10^6 bytes.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import platform
import shutil
import socket
import sys
import time
import zlib
from importlib import metadata
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

try:
    import hpckit  # noqa: F401
except ImportError:  # run from a checkout without the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from hpckit.common.config import load_config
from hpckit.common.errors import EXIT_USAGE, KitError
from hpckit.common.native_log import divert_native_stderr
from hpckit.common.staging import evict_from_page_cache

FRAMEWORKS = ("pytorch", "tensorflow")
FORMATS = ("tfrecord", "npy")
LOADERS = ("pytorch", "tensorflow")
PARTS = ("train", "loader", "raw")
PRECISIONS = ("fp32", "bf16", "fp16")
MB = 1e6


# ---------------------------------------------------------------- output

def fmt_num(v: float) -> str:
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3g}"


class Report:
    """Prints figure lines as they come and keeps them for --json."""

    def __init__(self, header: dict):
        self.header = header
        self.figures: list[dict] = []
        print("cosmoflow_throughput " + " ".join(f"{k}={v}" for k, v in header.items()), flush=True)

    def figure(self, figure: str, tokens: list[tuple[str, object]], metrics: dict[str, float],
               note: str, extra: dict | None = None) -> None:
        """tokens: (key, value) pairs printed as key=value, or (name, None) printed bare."""
        words = ["cosmoflow"]
        for key, value in tokens:
            words.append(key if value is None else f"{key}={value}")
        words += [f"{k}={fmt_num(v)}" for k, v in metrics.items()]
        print(" ".join(words) + f" ({note})", flush=True)
        record = {"figure": figure, **{k: v for k, v in tokens if v is not None}, **metrics, **(extra or {})}
        self.figures.append(record)


def progress(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def size_label(spec: str) -> str:
    return spec if spec in ("mini", "reference") else Path(spec).stem


# ---------------------------------------------------------------- synthetic batches

def synthetic_batches(cfg: dict, n: int = 2):
    """n in-memory (x, y) numpy batches shaped like the loaders' output, values like log1p(counts)."""
    import numpy as np
    s, b = cfg["data"]["sample_size"], cfg["data"]["batch_size"]
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = np.log1p(rng.poisson(4.0, (b, s, s, s, 4)).astype(np.float32))
        y = rng.uniform(-1.0, 1.0, (b, 4)).astype(np.float32)
        out.append((x, y))
    return out


# ---------------------------------------------------------------- train step

def train_step_torch(cfg: dict, args, device: str) -> tuple[float, float]:
    """(seconds for --steps timed steps, last loss)."""
    import torch
    from hpckit.cosmoflow.model_torch import CosmoFlow

    torch.manual_seed(0)
    dev = torch.device(device)
    model = CosmoFlow(cfg).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr_schedule"]["base_lr"],
                          momentum=cfg["optimizer"]["momentum"])
    batches = [(torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)) for x, y in synthetic_batches(cfg)]
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(dev.type) if args.precision == "fp16" else None

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step(i: int):
        x, y = batches[i % len(batches)]
        with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            pred = model(x)
        loss = torch.mean((pred.float() - y) ** 2)
        if model.l2:
            loss = loss + model.l2_penalty()
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    loss = None
    for i in range(args.steps):
        loss = step(i)
    sync()
    seconds = time.perf_counter() - t0
    last = float(loss.detach()) if loss is not None else float("nan")
    del model, opt, batches
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return seconds, last


def train_step_tf(cfg: dict, args) -> tuple[float, float]:
    import keras
    import tensorflow as tf
    from hpckit.cosmoflow.model_tf import build_model

    keras.utils.set_random_seed(0)
    model = build_model(cfg)
    opt = keras.optimizers.SGD(learning_rate=cfg["lr_schedule"]["base_lr"],
                               momentum=cfg["optimizer"]["momentum"])
    scaled = args.precision == "fp16"
    if scaled:
        opt = keras.optimizers.LossScaleOptimizer(opt)
    batches = [(tf.constant(x), tf.constant(y)) for x, y in synthetic_batches(cfg)]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            pred = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.square(pred - y))
            if model.losses:
                loss += tf.cast(tf.add_n(model.losses), tf.float32)
            to_diff = opt.scale_loss(loss) if scaled else loss
        grads = tape.gradient(to_diff, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for i in range(args.warmup):
        step(*batches[i % len(batches)]).numpy()
    t0 = time.perf_counter()
    loss = None
    for i in range(args.steps):
        loss = step(*batches[i % len(batches)])
    last = float(loss.numpy()) if loss is not None else float("nan")   # waits for the device
    seconds = time.perf_counter() - t0
    del model, opt, batches, step
    keras.backend.clear_session()
    gc.collect()
    return seconds, last


def bench_train(report: Report, label: str, cfg: dict, args, env: dict) -> None:
    batch = cfg["data"]["batch_size"]
    for fw in args.frameworks:
        progress(f"{label}: {fw} train step ({args.warmup} warm-up + {args.steps} timed steps, batch {batch})")
        if fw == "pytorch":
            seconds, loss = train_step_torch(cfg, args, env["device"])
            device = env["device"]
        else:
            seconds, loss = train_step_tf(cfg, args)
            device = env["tf_device"]
        if not math.isfinite(loss):
            progress(f"warning: {label} {fw}: loss is {loss} after the timed steps")
        step_ms = 1000 * seconds / args.steps
        report.figure("train_step",
                      [("size", label), ("framework", fw), ("precision", args.precision), ("device", device),
                       ("train_step", None)],
                      {"samples/s": args.steps * batch / seconds},
                      f"step {step_ms:.1f} ms, batch {batch}, {args.steps} steps",
                      {"step_ms": step_ms, "batch": batch, "steps": args.steps, "warmup": args.warmup,
                       "seconds": seconds, "last_loss": loss})


# ---------------------------------------------------------------- loaders and raw reads

def evict(paths: list[Path]) -> tuple[str, dict]:
    info = evict_from_page_cache(paths)
    left = info["resident_bytes_after"]
    if left:
        note = f"NOT evicted: {left} B of {info['probed_files']} probed files still resident"
        progress(f"warning: page-cache eviction had no effect here ({left} B still resident); 'cold' is warm")
    else:
        note = f"evicted {info['resident_bytes_before'] / MB:.1f} MB"
    return note, info


def bench_loaders(report: Report, label: str, cfg: dict, fmt: str, root: Path, n: int, args) -> None:
    from hpckit.cosmoflow import data

    split = data.find_split(root, "train", n, "data.n_train")
    lcfg = copy.deepcopy(cfg)
    lcfg["data"]["batch_size"] = batch = min(cfg["data"]["batch_size"], n)
    lcfg["data"]["n_train"] = n
    if args.loader_workers is not None:
        lcfg["data"]["loader_workers"] = args.loader_workers
    workers = lcfg["data"]["loader_workers"]
    for name in args.loaders:
        progress(f"{label}: {name} loader over {n} {fmt} samples")
        if name == "pytorch":
            source = data.torch_loader(split, lcfg, train=True, seed=0)
            detail = f"workers {workers}"
        else:
            source = data.tf_dataset(split, lcfg, train=True, seed=0)
            detail = "tf.data AUTOTUNE"
        for cache in ("cold", "warm"):
            evict_note, info = evict(split.all_paths()) if cache == "cold" else ("page cache", None)
            t0 = time.perf_counter()
            count = sum(int(x.shape[0]) for x, _ in source)
            seconds = time.perf_counter() - t0
            if count == 0:
                raise KitError(f"{label} {fmt} {name} loader yielded no batch from {n} samples")
            report.figure("loader",
                          [("size", label), ("format", fmt), ("loader", name), ("precision", args.precision),
                           ("cache", cache)],
                          {"samples/s": count / seconds},
                          f"{count} samples in {seconds:.3f} s, batch {batch}, {detail}, {evict_note}",
                          {"samples": count, "seconds": seconds, "batch": batch,
                           "loader_workers": workers if name == "pytorch" else None,
                           "eviction": info})
        del source
        gc.collect()


def bench_raw(report: Report, label: str, root: Path, n: int, args) -> None:
    from hpckit.common import tfrecord
    from hpckit.cosmoflow import data

    split = data.find_split(root, "train", n, "data.n_train")
    paths = split.files
    gz = split.compression == "GZIP"

    def gunzip_read():
        disk = out = 0
        for p in paths:
            with open(p, "rb") as f:
                raw = f.read()
            disk += len(raw)
            out += len(zlib.decompress(raw, wbits=31)) if gz else len(raw)   # wbits 31: gzip
        return disk, out

    def example_read():
        disk = 0
        for p in paths:
            tfrecord.read_example_file(p, compression=split.compression)
            disk += os.path.getsize(p)
        return disk, None

    progress(f"{label}: raw reads of {len(paths)} TFRecord files")
    for name, fn in (("raw_gunzip_read", gunzip_read), ("read_example_file", example_read)):
        for cache in ("cold", "warm"):
            evict_note, info = evict(paths) if cache == "cold" else ("page cache", None)
            t0 = time.perf_counter()
            disk, out = fn()
            seconds = time.perf_counter() - t0
            extra = {"files": len(paths), "disk_bytes": disk, "seconds": seconds, "eviction": info}
            note = f"{len(paths)} files, {disk / MB:.2f} MB on disk, {seconds:.3f} s"
            if out is not None:
                extra["decompressed_bytes"] = out
                extra["decompressed_MB/s"] = out / MB / seconds
                note += f", decompressed {out / MB / seconds:.1f} MB/s"
            report.figure(name,
                          [("size", label), ("format", "tfrecord"), (name, None), ("precision", args.precision),
                           ("cache", cache)],
                          {"MB/s": disk / MB / seconds, "samples/s": len(paths) / seconds},
                          f"{note}, {evict_note}", extra)


def bench_data(report: Report, label: str, cfg: dict, args, workdir: Path) -> None:
    size = cfg["data"]["sample_size"]
    n = args.samples or (64 if size <= 64 else 8)
    formats = [f for f in args.formats if args.loaders or ("raw" in args.parts and f == "tfrecord")]
    from hpckit.cosmoflow.synthetic import write_dataset
    for fmt in formats:
        root = workdir / f"{label}-{fmt}"
        t0 = time.perf_counter()
        write_dataset(root, n, 1, size=size, seed=0, fmt=fmt, workers=None)
        progress(f"{label}: wrote {n} {size}^3 {fmt} samples in {time.perf_counter() - t0:.1f} s")
        try:
            if args.loaders:
                bench_loaders(report, label, cfg, fmt, root, n, args)
            if "raw" in args.parts and fmt == "tfrecord":
                bench_raw(report, label, root, n, args)
        finally:
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- setup

def csv_list(allowed: tuple[str, ...] | None):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if allowed is not None:
            bad = [t for t in items if t not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
        return list(dict.fromkeys(items))
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Figures are explained in the module docstring and bench/README.md.")
    p.add_argument("--sizes", type=csv_list(None), default=["mini", "reference"],
                   help="comma list of configs: mini, reference or a config file (default mini,reference)")
    p.add_argument("--frameworks", type=csv_list(FRAMEWORKS), default=list(FRAMEWORKS),
                   help="train-step frameworks (default pytorch,tensorflow; empty: none)")
    p.add_argument("--formats", type=csv_list(FORMATS), default=list(FORMATS),
                   help="on-disk formats for the loader figures (default tfrecord,npy)")
    p.add_argument("--loaders", type=csv_list(LOADERS), default=list(LOADERS),
                   help="loaders (default pytorch,tensorflow)")
    p.add_argument("--parts", type=csv_list(PARTS), default=list(PARTS),
                   help="which figures: train, loader, raw (default all)")
    p.add_argument("--steps", type=int, default=10, help="timed train steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed train steps first (default 2)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples in the loader/raw dataset (default 64 for cubes up to 64^3, else 8)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="PyTorch device (default cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads for both frameworks (default: usable CPUs)")
    p.add_argument("--loader-workers", type=int, default=None,
                   help="PyTorch DataLoader workers (default: the config's data.loader_workers)")
    p.add_argument("--workdir", default=None,
                   help="where the temporary datasets are written: a new directory inside it, removed at the "
                        "end (default: one in $TMPDIR); put it on the file system whose reads you want to measure")
    p.add_argument("--json", default=None, metavar="FILE", help="also write all figures to FILE as JSON")
    return p


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def fail(message: str) -> int:
    print(f"cosmoflow_throughput: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.samples is not None and args.samples < 1:
        parser.error("--samples must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.loader_workers is not None and args.loader_workers < 0:
        parser.error("--loader-workers must be >= 0")
    if "train" not in args.parts:
        args.frameworks = []
    if "loader" not in args.parts:
        args.loaders = []
    from benchlib import check_workdir, output_path, own_workdir, write_output
    out_json = output_path("cosmoflow_throughput", "--json", args.json)   # before any work
    check_workdir("cosmoflow_throughput", "--workdir", args.workdir)
    cpus = usable_cpus()
    threads = args.threads or cpus

    try:
        configs = [(spec, load_config("cosmoflow", spec)) for spec in args.sizes]
    except KitError as e:
        return fail(str(e))
    if not configs:
        return fail("--sizes is empty")

    import torch
    torch.set_num_threads(threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda: PyTorch sees no CUDA device")
    if args.precision == "fp16" and device == "cpu" and "pytorch" in args.frameworks:
        return fail("--precision fp16 on CPU is not a real configuration (CPU autocast fp16); "
                    "use fp32 or bf16, or run on a CUDA device")

    tf_device = "none"
    tf_version = version("tensorflow") if version("tensorflow") != "none" else version("tensorflow-cpu")
    if "tensorflow" in args.frameworks or "tensorflow" in args.loaders:
        divert_native_stderr()
        import keras
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)   # leave GPU memory to PyTorch
        tf_version = tf.__version__
        tf_device = "cuda" if tf.config.list_logical_devices("GPU") else "cpu"
        if "tensorflow" in args.frameworks:
            if args.precision == "fp16" and tf_device == "cpu":
                return fail("--precision fp16: TensorFlow runs on the CPU here, where mixed_float16 is "
                            "not a real configuration; use fp32 or bf16, or drop tensorflow from --frameworks")
            policy = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}.get(args.precision, "float32")
            keras.mixed_precision.set_global_policy(policy)

    header = {"host": socket.gethostname(), "cpus": cpus, "threads": threads,
              "load1": f"{os.getloadavg()[0]:.2f}",
              "python": platform.python_version(), "torch": torch.__version__,
              "tensorflow": tf_version,
              "keras": version("keras"), "precision": args.precision, "device": device, "tf_device": tf_device}
    if device == "cuda":
        header["gpu"] = torch.cuda.get_device_name().replace(" ", "_")
    report = Report(header)

    started = time.perf_counter()
    workdir = own_workdir("cosmoflow_throughput", "--workdir", args.workdir, "cosmoflow-bench-")
    try:
        for spec, cfg in configs:
            label = size_label(spec)
            if args.frameworks:
                bench_train(report, label, cfg, args, {"device": device, "tf_device": tf_device})
            if args.loaders or ("raw" in args.parts and "tfrecord" in args.formats):
                bench_data(report, label, cfg, args, workdir)
    except KitError as e:
        return fail(str(e))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    progress(f"done in {time.perf_counter() - started:.1f} s")

    if out_json:
        write_output("cosmoflow_throughput", "--json", out_json, json.dumps(
            {"benchmark": "cosmoflow", "header": header, "args": {k: v for k, v in vars(args).items() if k != "json"},
             "figures": report.figures}, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
