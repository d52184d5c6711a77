#!/usr/bin/env python3
"""The kit's training step against the MLCommons reference's, side by side, in one run.

    bench/side_by_side.py --reference ~/src/mlcommons-hpc [--size full|small]
                          [--benchmarks cosmoflow,deepcam] [--rounds 3] [--steps 3] [--warmup 2]
                          [--kit-set cosmoflow:key=value ...] [--json FILE]

--reference names the user's own clone of mlcommons/hpc (nothing of it is in this
project); without it only the kit's cases run and no ratio is printed. One training step
is forward, loss, backward and optimizer update on random in-memory data at the
benchmark's local batch (no data loading: bench/cosmoflow_throughput.py and the mini-run
breakdown measure that), after --warmup untimed steps (tracing, allocator warm-up: at
full size the first two steps are slow, e.g. 6.5, 2.5, then 1.9 s for the kit's PyTorch
CosmoFlow, so a one-step warm-up inflated every figure before 2026-11-24's last run).

Cases, each in a fresh process so that no framework's thread pool or allocator state
carries over, run interleaved: round 1 of every case, then round 2, ... so a change of the
machine's speed during the run hits every case alike. Every step is timed alone; a case's
figure is the median over rounds of its median step (a shared VM's odd slow step, 3.4 s
among 1.9 s ones, moves neither).

The kit's cases run with the allocator `hpckit train` uses (tcmalloc preloaded when it is
installed, common/memory.py); the reference cases with the stack's default (glibc), and
the speed-up is against that, the reference as published. `--reference-tcmalloc` adds
each reference case again with tcmalloc preloaded, its code unchanged, to show how much of
the speed-up is the allocator.

    cosmoflow  reference/tensorflow  upstream cosmoflow/models/cosmoflow.py build_model with
                                     the model section of upstream configs/cosmo.yaml,
                                     compiled with loss mse and Keras SGD momentum 0.9 as
                                     upstream train.py and utils/optimizers.py do;
                                     step = model.train_on_batch (what model.fit runs)
               kit/tensorflow        the kit's TensorFlowBackend.train_epoch over the batches
               kit/pytorch           the kit's TorchBackend.train_epoch over the batches
    deepcam    reference/pytorch     upstream architecture/deeplab_xception.py DeepLabv3_plus
                                     (os 16, 16 channels, 3 classes), utils/losses.py CELoss
                                     with upstream's class weights, torch.optim.AdamW (upstream's
                                     LAMB needs NVIDIA apex, which has no CPU build; the update
                                     is <1% of the step)
               kit/pytorch           the kit's deepcam Trainer.train_epoch (LAMB)

--bf16 adds each kit case again as kit/<framework>+bf16, with train.precision=bf16
(common/precision.py: mixed precision, offered by the reference as --amp).

The kit's cases use its `reference` config (batch, model, optimizer), with --kit-set
overrides (e.g. `cosmoflow:data.batch_size=2`; --bf16 adds the bf16 cases), and run through
hpckit.common.run.launch, so they get the kit's own thread and core plan.

Printed: a header (host, CPU model and flags, usable CPUs, threads, load average,
versions); the measured GEMM peak of this machine (gemm_peaks: GFLOP/s, fp32, and bf16
where the CPU has bf16 instructions); FLOPs per sample of forward + backward counted with
torch's FlopCounterMode on the kit's PyTorch models (the same math as the reference's;
grouped convolutions' backward counted right, hpckit/common/flops.py); then one line per case:
seconds per step, samples/s, GFLOP/s sustained, fraction of the peak of the case's
precision, and the ratio to the reference case of the same benchmark.
bench/conv_efficiency.py breaks a step down by convolution.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_flags, cpu_model  # noqa: E402,F401   (cpu_flags: conv_efficiency imports it here)

CASES = {
    "cosmoflow": ("reference/tensorflow", "kit/tensorflow", "kit/pytorch"),
    "deepcam": ("reference/pytorch", "kit/pytorch"),
}
# (sample size, local batch) per --size; full = the reference configs'
SHAPES = {
    "full": {"cosmoflow": (128, 4), "deepcam": ((768, 1152), 1)},
    "small": {"cosmoflow": (32, 4), "deepcam": ((96, 144), 1)},
}
N_CHANNELS_COSMO, N_CHANNELS_CAM, N_CLASSES_CAM = 4, 16, 3


# ---------------------------------------------------------------- shared helpers

def kit_config(benchmark: str, size: str, sets: list[str]) -> dict:
    from hpckit.common.config import load_config
    cfg = load_config(benchmark, "reference", sets)
    shape, batch = SHAPES[size][benchmark]
    cfg["data"]["batch_size"] = batch
    if benchmark == "cosmoflow":
        cfg["data"]["sample_size"] = shape
    else:
        cfg["data"]["height"], cfg["data"]["width"] = shape
    return cfg


def kit_launch(framework: str, cfg: dict):
    from hpckit.common.run import launch
    args = argparse.Namespace(seed=1, stage_dir=None, data=".", dist="none", device="cpu",
                              threads=None, collective_timeout=60.0)
    return launch(args, framework, cfg)


# ---------------------------------------------------------------- one case (child process)

def run_case(benchmark: str, case: str, size: str, steps: int, warmup: int, reference: str | None,
             sets: list[str]) -> dict:
    import numpy as np
    rng = np.random.default_rng(0)
    shape, batch = SHAPES[size][benchmark]
    timings: list[float] = []

    def timed(step_fn):
        # every step timed alone (the kit's cases: one train_epoch call of one batch, which
        # for DeepCAM adds the last batch's IoU, ~1 % of its step); warm-up steps printed
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            step_fn(1)
            timings.append(time.perf_counter() - t0)

    if benchmark == "cosmoflow":
        x = np.log1p(rng.poisson(3.0, (batch, shape, shape, shape, N_CHANNELS_COSMO))).astype(np.float32)
        y = rng.uniform(-1, 1, (batch, 4)).astype(np.float32)
        if case == "reference/tensorflow":
            model = reference_cosmoflow(reference, shape)
            timed(lambda n: [model.train_on_batch(x, y) for _ in range(n)])
            threads = None
        else:
            framework = case.split("/")[1].split("+")[0]
            cfg = kit_config("cosmoflow", size, sets + case_sets(case))
            launched = kit_launch(framework, cfg)
            from hpckit.cosmoflow.train import BACKENDS
            backend = BACKENDS[framework](cfg, launched, Path("."))
            if framework == "pytorch":
                import torch
                xb, yb = torch.from_numpy(x), torch.from_numpy(y)
            else:
                import tensorflow as tf
                xb, yb = tf.constant(x), tf.constant(y)
            in_memory = argparse.Namespace(files=[Path("in-memory")])   # named only if reading fails
            timed(lambda n: backend.train_epoch([(xb, yb)] * n, in_memory, 1e-3))
            threads = launched.cores.threads
    else:
        import torch
        h, w = shape
        xb = torch.from_numpy(rng.standard_normal((batch, N_CHANNELS_CAM, h, w), dtype=np.float32))
        yb = torch.from_numpy(rng.integers(0, N_CLASSES_CAM, (batch, h, w)))
        if case == "reference/pytorch":
            net, criterion, opt = reference_deepcam(reference)

            def step(n):
                for _ in range(n):
                    loss = criterion(net(xb), yb)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            timed(step)
            threads = torch.get_num_threads()
        else:
            cfg = kit_config("deepcam", size, sets + case_sets(case))
            launched = kit_launch("pytorch", cfg)
            from hpckit.deepcam.train import Trainer
            trainer = Trainer(cfg, launched)
            timed(lambda n: trainer.train_epoch([(xb, yb)] * n))
            threads = launched.cores.threads
    return {"seconds_per_step": statistics.median(timings[warmup:]), "warmup_s": timings[:warmup],
            "steps_s": timings[warmup:], "batch": batch, "threads": threads}


def case_sets(case: str) -> list[str]:
    """kit/<framework>+bf16: the kit's case with train.precision=bf16."""
    return ["train.precision=bf16"] if case.endswith("+bf16") else []


def reference_cosmoflow(reference: str, size: int):
    """Upstream's Keras model and compile call, unmodified; upstream imports
    `tensorflow.keras.layers` as modules, which under Keras 3 are attributes: alias them."""
    import keras
    import tensorflow as tf
    import yaml
    for name in ("layers", "regularizers", "models", "optimizers"):
        sys.modules.setdefault(f"tensorflow.keras.{name}", getattr(keras, name))
    sys.modules.setdefault("tensorflow.keras", keras)
    sys.path.insert(0, str(Path(reference) / "cosmoflow"))
    from models.cosmoflow import build_model
    model_cfg = yaml.safe_load((Path(reference) / "cosmoflow" / "configs" / "cosmo.yaml").read_text())["model"]
    model_cfg.pop("name")
    model_cfg["input_shape"] = [size, size, size, N_CHANNELS_COSMO]
    model = build_model(**model_cfg)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9), loss="mse",
                  metrics=["mean_absolute_error"])
    return model


def reference_deepcam(reference: str):
    import torch
    sys.path.insert(0, str(Path(reference) / "deepcam" / "src" / "deepCam"))
    from architecture.deeplab_xception import DeepLabv3_plus
    from utils.losses import CELoss
    net = DeepLabv3_plus(n_input=N_CHANNELS_CAM, n_classes=N_CLASSES_CAM, os=16, pretrained=False, _print=False)
    loss_pow = -0.125
    weights = [0.986267818390377 ** loss_pow, 0.0004578708870701058 ** loss_pow, 0.01327431072255291 ** loss_pow]
    criterion = torch.jit.script(CELoss(weights))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    net.train()
    return net, criterion, opt


# ---------------------------------------------------------------- the parent

def matmul_peak(dtype_name: str, seconds: float = 1.0) -> float:
    """GFLOP/s of a 2048^3 matmul on this machine (torch, all usable CPUs)."""
    import torch
    dtype = getattr(torch, dtype_name)
    n = 2048
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9


def conv_gemm_peak(dtype_name: str, seconds: float = 1.0) -> float:
    """GFLOP/s of a 2048 x 2048 x 2048 GEMM run as a 1x1 channels-last convolution (oneDNN)."""
    import torch
    dtype = getattr(torch, dtype_name)
    x = torch.randn(1, 2048, 32, 64, dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(2048, 2048, 1, 1, dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.nn.functional.conv2d(x, w)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.nn.functional.conv2d(x, w)
            reps += 1
    return 2 * 2048 ** 3 * reps / (time.perf_counter() - t0) / 1e9


def gemm_peaks(precisions) -> dict[str, float]:
    """The best GEMM rate measured here per precision ('fp32', 'bf16'): torch.matmul (the
    BLAS torch links: MKL in the x86 wheels) or the same 2048^3 GEMM as a 1x1 channels-last
    convolution (oneDNN's JIT kernels, which the models' convolutions run on), whichever is
    faster; both printed. On the AMD EPYC development VM MKL's fp32 matmul reached about
    half of oneDNN's, so a fraction of the matmul rate alone read as > 1."""
    peaks = {}
    for q in precisions:
        name = {"fp32": "float32", "bf16": "bfloat16"}[q]
        mm, conv = matmul_peak(name), conv_gemm_peak(name)
        peaks[q] = max(mm, conv)
        print(f"gemm_peak {q} torch.matmul={mm:.1f} GFLOP/s 1x1_conv(oneDNN)={conv:.1f} GFLOP/s "
              f"-> peak {peaks[q]:.1f}", flush=True)
    return peaks


def flops_per_sample(benchmark: str, size: str, sets: list[str]) -> float:
    """Forward + backward FLOPs of one sample on the kit's PyTorch model, as every kit run
    counts them (hpckit/common/flops.py: meta tensors, grouped convolutions' backward right)."""
    from hpckit.common.flops import train_flops_per_sample
    return train_flops_per_sample(benchmark, kit_config(benchmark, size, sets))


def parse_sets(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {b: [] for b in CASES}
    for item in items:
        bench, sep, kv = item.partition(":")
        if not sep or bench not in out:
            raise SystemExit(f"side_by_side: --kit-set {item!r}: expected BENCHMARK:key=value "
                             f"with BENCHMARK one of {', '.join(CASES)}")
        out[bench].append(kv)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", help="your clone of mlcommons/hpc (without it: the kit's cases only)")
    p.add_argument("--benchmarks", default="cosmoflow,deepcam")
    p.add_argument("--size", choices=tuple(SHAPES), default="full")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per case and round")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps first (the full-size PyTorch CosmoFlow step took 6.5, 2.5, then 1.9 s: "
                        "two are needed)")
    p.add_argument("--kit-set", action="append", default=[], metavar="BENCH:KEY=VALUE")
    p.add_argument("--bf16", action="store_true", help="also every kit case with train.precision=bf16 "
                   "(mixed precision; CPUs with bf16 instructions)")
    p.add_argument("--reference-tcmalloc", action="store_true",
                   help="also each reference case with tcmalloc preloaded (its code unchanged), as the kit's "
                        "cases run whenever tcmalloc is installed (hpckit train --allocator auto)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sets = parse_sets(args.kit_set)
    benchmarks = [b for b in args.benchmarks.split(",") if b]
    unknown = [b for b in benchmarks if b not in CASES]
    if unknown or args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        print(f"side_by_side: bad arguments (benchmarks {unknown or 'ok'}, rounds/steps >= 1)", file=sys.stderr)
        return 2
    if args.reference and not (Path(args.reference) / "cosmoflow" / "models" / "cosmoflow.py").is_file():
        print(f"side_by_side: --reference {args.reference}: not a clone of mlcommons/hpc "
              "(no cosmoflow/models/cosmoflow.py)", file=sys.stderr)
        return 2
    from benchlib import output_path, write_output
    out_json = output_path("side_by_side", "--json", args.json)   # before any work

    if args.child:
        bench, case = args.child.split(":", 1)
        result = run_case(bench, case.removesuffix("+tcmalloc"), args.size, args.steps, args.warmup,
                          args.reference, sets[bench])
        from hpckit.common.memory import tcmalloc_loaded
        result["allocator"] = "tcmalloc" if tcmalloc_loaded() else "glibc"
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    import torch
    cases = [(b, c) for b in benchmarks for c in CASES[b] if args.reference or not c.startswith("reference/")]
    if args.bf16:
        from hpckit.common.precision import cpu_has_bf16
        if not cpu_has_bf16():
            print("side_by_side: --bf16: this CPU has no bf16 instructions", file=sys.stderr)
            return 2
        cases = [x for b, c in cases for x in ([(b, c), (b, c + "+bf16")] if c.startswith("kit/") else [(b, c)])]
    from hpckit.common import memory
    tcmalloc = memory.find_tcmalloc()
    if args.reference_tcmalloc:
        if not tcmalloc:
            print("side_by_side: --reference-tcmalloc: no tcmalloc library found", file=sys.stderr)
            return 2
        cases = [x for b, c in cases for x in ([(b, c), (b, c + "+tcmalloc")] if c.startswith("reference/") else [(b, c)])]
    if args.size != "full" and ("deepcam", "reference/pytorch") in cases:
        # upstream's decoder is fixed to 768 x 1152 inputs: mlcommons/hpc 2c627d45
        # deepcam/src/deepCam/architecture/deeplab_xception.py:445 tiles (1, 1, 48, 72)
        print("side_by_side: deepcam reference/pytorch runs at --size full only (upstream's decoder "
              "is fixed to 768x1152)", file=sys.stderr)
        cases = [(b, c) for b, c in cases if not (b == "deepcam" and c.startswith("reference/"))]
    load1 = os.getloadavg()[0]
    versions = {"torch": torch.__version__}
    try:
        from importlib.metadata import version
        versions["tensorflow"] = version("tensorflow-cpu")
    except Exception:
        try:
            versions["tensorflow"] = version("tensorflow")
        except Exception:
            versions["tensorflow"] = "none"
    header = {"host": platform.node(), "cpu": cpu_model(), "flags": cpu_flags(),
              "cpus": len(os.sched_getaffinity(0)), "load1": round(load1, 2), "size": args.size,
              "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, **versions}
    print("side_by_side " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in header.items()), flush=True)
    from hpckit.common.precision import cpu_has_bf16
    peaks = gemm_peaks(["fp32", "bf16"] if cpu_has_bf16() else ["fp32"])
    flops = {b: flops_per_sample(b, args.size, sets[b]) for b in benchmarks}
    for b, f in flops.items():
        print(f"flops {b} GFLOP/sample={f / 1e9:.2f} (forward+backward, torch FlopCounterMode)", flush=True)

    seconds: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    meta: dict[tuple[str, str], dict] = {}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}

    def case_env(c: str) -> dict:
        """The kit's cases run with the allocator `hpckit train` picks (tcmalloc when installed)."""
        if tcmalloc and (c.startswith("kit/") or c.endswith("+tcmalloc")):
            return memory.preload_env(tcmalloc, env)
        return env
    for r in range(args.rounds):
        for b, c in cases:
            cmd = [sys.executable, __file__, "--child", f"{b}:{c}", "--size", args.size, "--steps",
                   str(args.steps), "--warmup", str(args.warmup),
                   *(["--reference", args.reference] if args.reference else []),
                   *(x for kv in sets[b] for x in ("--kit-set", f"{b}:{kv}"))]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=case_env(c))
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"side_by_side: case {b} {c} failed: {tail}", file=sys.stderr)
                return 1
            res = json.loads(lines[-1][7:])
            seconds[(b, c)].append(res["seconds_per_step"])
            meta[(b, c)] = res
            print(f"  round {r + 1} {b} {c}: {res['seconds_per_step']:.3f} s/step, median of "
                  f"{' '.join('%.2f' % w for w in res['steps_s'])} (warm-up "
                  f"{' '.join('%.2f' % w for w in res['warmup_s']) or 'none'})", file=sys.stderr, flush=True)

    figures = []
    for b, c in cases:
        s = statistics.median(seconds[(b, c)])
        batch = meta[(b, c)]["batch"]
        gflops = flops[b] * batch / s / 1e9
        # against the reference as published: its code and the stack's default allocator
        ref = [statistics.median(seconds[(b, rc)]) for rc in CASES[b] if rc.startswith("reference/") and (b, rc) in seconds]
        ratio = ref[0] / s if ref else None
        precision = "bf16" if "+bf16" in c else "fp32"
        fig = {"benchmark": b, "case": c, "seconds_per_step": s, "samples_per_s": batch / s,
               "gflop_per_s": gflops, "precision": precision, "fraction_of_peak": gflops / peaks[precision],
               "speedup_vs_reference": ratio, "threads": meta[(b, c)]["threads"],
               "allocator": meta[(b, c)]["allocator"],
               "spread": (max(seconds[(b, c)]) - min(seconds[(b, c)])) / s}
        figures.append(fig)
        print(f"{b} {c} s/step={s:.3f} samples/s={batch / s:.3f} GFLOP/s={gflops:.1f} "
              f"peak_fraction={gflops / peaks[precision]:.2f} "
              f"vs_reference={'%.2fx' % ratio if ratio else 'n/a'} "
              f"(threads {fig['threads']}, {fig['allocator']}, rounds spread {fig['spread'] * 100:.0f}%)", flush=True)
    if out_json:
        write_output("side_by_side", "--json", out_json,
                     json.dumps({"header": header, "peaks": peaks, "flops": flops, "figures": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
