"""How steady a mini run's passes are, with and without the two settings the kit makes for it.

A regression check compares one run's throughput with the runs it was calibrated on, so a
pass that takes 1x or 2x at random is a false FAIL waiting to happen. Two causes were
found and are switched off in the kit; this bench shows each side by side, every variant
in fresh processes (the bad mode is often chosen once per process), interleaved:

* `malloc`: glibc's adaptive mmap threshold (memory.tune_allocator fixes it): eval-mode
  forward passes of the mini models over in-memory batches (CosmoFlow 16 x 8 x 32^3,
  DeepCAM 8 x 8 x 96 x 144), allocator as glibc leaves it vs tuned;
* `tf.data`: autotuning (cosmoflow/data.tf_dataset turns it off): passes of the kit's
  TFRecord pipeline over the mini training set, autotune on vs off.

Prints per variant every pass time in ms, then median, min, max and max/min.

    .venv/bin/python bench/pass_stability.py --procs 3 --passes 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

APPS = Path(__file__).resolve().parent.parent / "apps"

CHILD = r"""
import os, sys, time
kind, variant, passes, data_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if kind == "malloc":
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if variant == "tuned":
        from hpckit.common import memory
        memory.tune_allocator()
    from hpckit.common.config import load_config
    torch.manual_seed(1)
    if data_dir == "cosmoflow":
        from hpckit.cosmoflow.model_torch import CosmoFlow
        model, xs = CosmoFlow(load_config("cosmoflow", "mini")).eval(), [torch.randn(8, 32, 32, 32, 4) for _ in range(16)]
    else:
        from hpckit.deepcam.model import build_model
        model, xs = build_model(load_config("deepcam", "mini")).eval(), [torch.randn(8, 16, 96, 144) for _ in range(8)]
    def one_pass():
        with torch.no_grad():
            for x in xs:
                model(x)
else:
    import tensorflow as tf
    from hpckit.common.config import load_config
    from hpckit.cosmoflow import data
    tf.config.threading.set_intra_op_parallelism_threads(len(os.sched_getaffinity(0)))
    cfg = load_config("cosmoflow", "mini")
    split = data.find_dataset(data_dir, cfg["data"]["n_train"], cfg["data"]["n_valid"])["train"]
    epochs = data.tf_dataset(split, cfg, True, 1)
    options = tf.data.Options()
    options.autotune.enabled = variant == "autotune on"
    pipeline = epochs.pipeline
    epochs.pipeline = lambda order: pipeline(order).with_options(options)
    def one_pass():
        for _ in epochs:
            pass
one_pass()   # warm-up
for _ in range(passes):
    t = time.perf_counter()
    one_pass()
    print(f"{(time.perf_counter() - t) * 1000:.1f}", flush=True)
"""


def run(kind: str, variant: str, passes: int, arg: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(APPS), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, variant, str(passes), arg],
                          capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"pass_stability: {kind}/{variant} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [float(v) for v in proc.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=3, help="fresh processes per variant (default 3)")
    ap.add_argument("--passes", type=int, default=6, help="timed passes per process (default 6)")
    ap.add_argument("--only", choices=["malloc", "tf.data"], help="one of the two comparisons")
    args = ap.parse_args()
    flags = sorted({w for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for w in line.split() if w.startswith(("avx", "amx", "fma"))}) if os.path.exists("/proc/cpuinfo") else []
    print(f"# cpus={len(os.sched_getaffinity(0))} load1={os.getloadavg()[0]:.2f} flags={','.join(flags)}")
    cases = []
    if args.only in (None, "malloc"):
        cases += [("malloc", v, m) for m in ("cosmoflow", "deepcam") for v in ("glibc default", "tuned")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "tf.data"):
            data_dir = Path(tmp) / "cf-mini"
            subprocess.run([sys.executable, "-m", "hpckit", "datagen", "cosmoflow", "--config", "mini", "--out",
                            str(data_dir)], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(APPS)})
            cases += [("tf.data", v, str(data_dir)) for v in ("autotune on", "autotune off")]
        times: dict[tuple, list[float]] = {(k, v, a): [] for k, v, a in cases}
        for _ in range(args.procs):               # interleaved: variant after variant, round after round
            for case in cases:
                times[case] += run(*case[:2], args.passes, case[2])
    for (kind, variant, arg), ts in times.items():
        what = f"{kind} {arg if kind == 'malloc' else 'cosmoflow-tfrecord'} {variant}"
        print(f"case={what.replace(' ', '_')} ms_median={statistics.median(ts):.0f} ms_min={min(ts):.0f} "
              f"ms_max={max(ts):.0f} max/min={max(ts) / min(ts):.2f}  passes: {' '.join(f'{t:.0f}' for t in ts)}")


if __name__ == "__main__":
    main()
