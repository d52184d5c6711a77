#!/usr/bin/env python3
"""Where a full-size training step's time goes, layer by layer, against this CPU's GEMM rate.

    bench/conv_efficiency.py [--benchmarks cosmoflow,deepcam] [--size full|small]
                             [--precisions fp32,bf16] [--reps 3] [--json FILE]

For the kit's PyTorch model of each benchmark (its `reference` config: the reference's
network, local batch and input size, as bench/side_by_side.py runs it) this prints:

  * the machine's GEMM rate, measured two ways: torch.matmul of 2048^3 (the BLAS torch
    links: MKL in the x86 wheels) and the same
    GEMM as a 1x1 channels-last convolution (oneDNN's JIT kernels, the ones the models'
    convolutions run on). The larger is "peak" below: the best this machine was measured to
    do, not a datasheet figure;
  * every distinct convolution of the model, transposed ones included (input shape,
    kernel, groups and memory format captured from one forward pass; their FLOPs, from the
    shapes, printed beside the whole model's as torch's FlopCounterMode counts them), run
    alone with the same threads: forward and backward seconds per step (backward without
    the input gradient for the first layer, as autograd does), GFLOP/s, fraction of peak;
  * the whole step (forward, loss, backward, SGD update; the kit's DeepCAM uses LAMB, <1 %
    of its step) of the kit's model at the same size, and the share of it the convolutions
    account for: the rest is activations, pooling, normalisation, the loss and the update.

So it says what limits each path: a path whose convolutions already run near the GEMM peak
can only get faster by doing less work per FLOP (lower precision) or fewer FLOPs, and a
path whose step is mostly not convolutions needs fusion, not faster kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "apps"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from side_by_side import SHAPES, cpu_flags, cpu_model, flops_per_sample, gemm_peaks, kit_config  # noqa: E402


def build(benchmark: str, size: str):
    """The kit's PyTorch model and one batch of random input and target at `size`."""
    import numpy as np
    import torch
    cfg = kit_config(benchmark, size, [])
    shape, batch = SHAPES[size][benchmark]
    rng = np.random.default_rng(0)
    if benchmark == "cosmoflow":
        from hpckit.cosmoflow.model_torch import CosmoFlow
        model = CosmoFlow(cfg)
        x = torch.from_numpy(np.log1p(rng.poisson(3.0, (batch, shape, shape, shape, 4))).astype(np.float32))
        y = torch.from_numpy(rng.uniform(-1, 1, (batch, 4)).astype(np.float32))
        loss_fn = torch.nn.functional.mse_loss
    else:
        from hpckit.deepcam.model import build_model
        model = build_model(cfg)
        x = torch.from_numpy(rng.standard_normal((batch, 16, *shape), dtype=np.float32))
        y = torch.from_numpy(rng.integers(0, 3, (batch, *shape)))
        loss_fn = torch.nn.functional.cross_entropy
    return model, x, y, loss_fn, batch


def conv_layers(model, x) -> list[dict]:
    """Every distinct convolution the forward pass runs, with its input as it arrives."""
    import torch
    seen: dict[tuple, dict] = {}
    first = [True]

    def hook(mod, inputs, _out):
        t = inputs[0]
        cl = (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous()) or \
             (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous())
        key = (type(mod).__name__, tuple(t.shape), mod.out_channels, mod.kernel_size, mod.stride,
               mod.padding, mod.dilation, mod.groups, mod.bias is not None, cl, first[0])
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = {"module": mod, "shape": tuple(t.shape), "channels_last": cl,
                         "input_grad": not first[0], "count": 1,
                         "transposed": isinstance(mod, torch.nn.modules.conv._ConvTransposeNd)}
        first[0] = False

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.modules.conv._ConvNd)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return list(seen.values())


def time_conv(layer: dict, dtype_name: str, reps: int) -> dict:
    import copy
    import torch
    dtype = getattr(torch, dtype_name)
    mod = copy.deepcopy(layer["module"]).to(dtype)
    fmt = torch.channels_last_3d if len(layer["shape"]) == 5 else torch.channels_last
    x = torch.randn(layer["shape"], dtype=dtype)
    if layer["channels_last"]:
        x = x.to(memory_format=fmt)
    x.requires_grad_(layer["input_grad"])
    out = mod(x)
    grad = torch.randn_like(out)
    taps = 1
    for s in mod.kernel_size:
        taps *= s
    if layer["transposed"]:    # every input element meets out_channels/groups x taps weights
        fwd_flop = 2.0 * x.numel() * (mod.out_channels // mod.groups) * taps
    else:                      # every output element sums in_channels/groups x taps products
        fwd_flop = 2.0 * out.numel() * (mod.in_channels // mod.groups) * taps
    bwd_flop = fwd_flop * (2 if layer["input_grad"] else 1)

    def fwd():
        with torch.no_grad():
            mod(x)

    def fwd_bwd():
        mod(x).backward(grad)

    fwd(), fwd_bwd()                          # warm-up: kernel selection, allocator
    t0 = time.perf_counter()
    for _ in range(reps):
        fwd()
    t_fwd = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fwd_bwd()
    t_bwd = max((time.perf_counter() - t0) / reps - t_fwd, 1e-9)
    return {"forward_s": t_fwd, "backward_s": t_bwd, "forward_gflop": fwd_flop / 1e9,
            "backward_gflop": bwd_flop / 1e9}


def time_step(model, x, y, loss_fn, precision: str, reps: int) -> float:
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else \
        (lambda: torch.autocast("cpu", enabled=False))

    def step():
        with ctx():
            out = model(x)
        loss_fn(out.float(), y).backward()
        opt.step()
        opt.zero_grad()

    step()
    step()          # two warm-up steps: the full-size CosmoFlow step takes 6.5, 2.5, then 1.9 s
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps


def describe(layer: dict) -> str:
    m = layer["module"]
    shape = "x".join(map(str, layer["shape"]))
    g = f" g{m.groups}" if m.groups > 1 else ""
    d = f" d{m.dilation[0]}" if max(m.dilation) > 1 else ""
    s = f" s{m.stride[0]}" if max(m.stride) > 1 else ""
    fmt = " CL" if layer["channels_last"] else ""
    kind = " transposed" if layer["transposed"] else ""
    return f"{shape}->{m.out_channels} k{m.kernel_size[0]}{s}{d}{g}{fmt}{kind}" + ("" if layer["input_grad"] else " (no dx)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmarks", default="cosmoflow,deepcam")
    p.add_argument("--size", choices=tuple(SHAPES), default="full")
    p.add_argument("--precisions", default="fp32,bf16", help="bf16 is skipped on CPUs without bf16 instructions")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per layer and for the step")
    p.add_argument("--top", type=int, default=12, help="layers printed per benchmark and precision (slowest first)")
    p.add_argument("--glibc", action="store_true", help="glibc's allocator as it is (default: tcmalloc when "
                   "installed, else glibc with the kit's thresholds, as hpckit train runs)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    from benchlib import output_path, write_output
    out_json = output_path("conv_efficiency", "--json", args.json)   # before any work
    benchmarks = [b for b in args.benchmarks.split(",") if b]
    precisions = [q for q in args.precisions.split(",") if q]
    if any(b not in SHAPES[args.size] for b in benchmarks) or any(q not in ("fp32", "bf16") for q in precisions) \
            or args.reps < 1:
        print("conv_efficiency: bad arguments (benchmarks: cosmoflow,deepcam; precisions: fp32,bf16; reps >= 1)",
              file=sys.stderr)
        return 2
    from hpckit.common import memory
    # the allocator `hpckit train` runs with (common/memory.py): the step's figure is the kit's
    lib = None if args.glibc or memory.tcmalloc_loaded() else memory.find_tcmalloc()
    if lib:
        os.execve(sys.executable, [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
                  memory.preload_env(lib, os.environ))
    if not args.glibc:
        memory.tune_allocator()
    import torch
    from hpckit.common.precision import cpu_has_bf16
    if "bf16" in precisions and not cpu_has_bf16():
        print("conv_efficiency: this CPU has no bf16 instructions: bf16 skipped", file=sys.stderr)
        precisions = [q for q in precisions if q != "bf16"]
        if not precisions:
            print("conv_efficiency: --precisions bf16: nothing left to measure on this CPU", file=sys.stderr)
            return 2
    header = {"cpu": cpu_model().replace(" ", "_"), "flags": cpu_flags(), "cpus": len(os.sched_getaffinity(0)),
              "threads": torch.get_num_threads(), "load1": round(os.getloadavg()[0], 2),
              "torch": torch.__version__, "allocator": "tcmalloc" if memory.tcmalloc_loaded() else "glibc",
              "size": args.size, "reps": args.reps}
    print("conv_efficiency " + " ".join(f"{k}={v}" for k, v in header.items()), flush=True)
    peaks = gemm_peaks(precisions)

    results = []
    for b in benchmarks:
        model, x, y, loss_fn, batch = build(b, args.size)
        model.train()
        layers = conv_layers(model, x)
        counted = flops_per_sample(b, args.size, []) * batch / 1e9     # torch's FlopCounterMode, all layers
        for q in precisions:
            timed = []
            for layer in layers:
                t = time_conv(layer, {"fp32": "float32", "bf16": "bfloat16"}[q], args.reps)
                t.update(layer=describe(layer), count=layer["count"])
                timed.append(t)
            step_s = time_step(model, x, y, loss_fn, q, args.reps)
            conv_s = sum((t["forward_s"] + t["backward_s"]) * t["count"] for t in timed)
            conv_gflop = sum((t["forward_gflop"] + t["backward_gflop"]) * t["count"] for t in timed)
            print(f"{b} {q} batch={batch} step_s={step_s:.3f} convolutions_s={conv_s:.3f} "
                  f"({conv_s / step_s * 100:.0f}% of the step) conv_GFLOP={conv_gflop:.1f} "
                  f"counted_GFLOP={counted:.1f} "
                  f"conv_GFLOP/s={conv_gflop / conv_s:.1f} ({conv_gflop / conv_s / peaks[q]:.2f} of peak) "
                  f"step_GFLOP/s={conv_gflop / step_s:.1f} ({conv_gflop / step_s / peaks[q]:.2f} of peak) "
                  f"distinct_convolutions={len(timed)}", flush=True)
            for t in sorted(timed, key=lambda t: -(t["forward_s"] + t["backward_s"]) * t["count"])[:args.top]:
                f_rate, b_rate = t["forward_gflop"] / t["forward_s"], t["backward_gflop"] / t["backward_s"]
                print(f"  {t['layer']} x{t['count']}: forward {t['forward_s'] * 1e3:.1f} ms "
                      f"{f_rate:.0f} GFLOP/s ({f_rate / peaks[q]:.2f}), backward {t['backward_s'] * 1e3:.1f} ms "
                      f"{b_rate:.0f} GFLOP/s ({b_rate / peaks[q]:.2f})", flush=True)
            results.append({"benchmark": b, "precision": q, "batch": batch, "step_s": step_s,
                            "convolutions_s": conv_s, "conv_gflop": conv_gflop, "counted_gflop": counted,
                            "layers": timed})
    if out_json:
        write_output("conv_efficiency", "--json", out_json,
                     json.dumps({"header": header, "peaks": peaks, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
