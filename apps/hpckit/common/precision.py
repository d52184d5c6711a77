"""Numerical precision of the training step: `train.precision` fp32 (default), bf16 or fp16.

bf16 and fp16 are mixed precision as the frameworks define it: weights, optimizer state, the
loss and the metric stay float32; the forward (and so the backward) convolutions and matmuls
run in the 16-bit type (torch.autocast; Keras' `mixed_bfloat16` policy with a float32 output
layer). The reference itself offers mixed precision (mlcommons/hpc 2c627d45
cosmoflow/train.py:112 `--amp`, :268-270 `mixed_float16`), and the MLPerf rules let a
closed-division submission choose its numerical format; the kit logs the choice
(`hpckit_config` train.precision) and never changes it silently.

fp16 is the reference's `--amp` and what NVIDIA's submissions train in (autocast + GradScaler,
../shared/reference/nvidia-v3-gpu-facts.md): its narrow exponent needs dynamic loss scaling,
torch.amp.GradScaler here (the loss multiplied by a scale that halves at every step whose
gradients overflow, such a step skipped on the device, and grows after 2000 clean steps).
It is for the GPUs without bf16 (V100, P100), PyTorch only.

A 16-bit type is refused where it would be emulated: bf16 on a CPU without bf16 instructions
(x86 avx512_bf16 or amx_bf16, Arm bf16) and on a GPU without bf16 support (V100); fp16 on a
CPU without fp16 arithmetic (x86 avx512_fp16 or amx_fp16, Arm fphp) and on a GPU older than
compute capability 6.0 (fp16 arithmetic at full rate from Pascal's P100 on).
"""

from __future__ import annotations

import contextlib

from hpckit.common import cores
from hpckit.common.errors import KitError

PRECISIONS = ("fp32", "bf16", "fp16")
KEY = "config key 'train.precision'"


def cpu_has_bf16() -> bool:
    """From the CPU `cores.cpuinfo()` describes (x86 avx512_bf16/amx_bf16, Arm bf16): KNL
    and A64FX have none."""
    return cores.has_bf16()


def cpu_has_fp16() -> bool:
    """x86 avx512_fp16 (Sapphire Rapids and later) or amx_fp16 (Granite Rapids), Arm
    fphp/asimdhp (A64FX has them)."""
    info = cores.cpuinfo()
    if info.arch == "aarch64":
        return bool(info.flags & {"fphp", "asimdhp"})
    return bool(info.flags & {"avx512_fp16", "amx_fp16"})


def check(precision: str, device_type: str = "cpu", framework: str = "pytorch") -> None:
    """One-line error where `precision` is not a choice or would not run natively."""
    if precision not in PRECISIONS:
        raise KitError(f"{KEY}: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        if device_type == "cuda":
            import torch
            if not torch.cuda.is_bf16_supported():
                raise KitError(f"{KEY}: bf16: this GPU has no bf16 support; use fp16 or fp32")
        elif not cpu_has_bf16():
            raise KitError(f"{KEY}: bf16: this CPU has no bf16 instructions "
                           "(avx512_bf16, amx_bf16 or Arm bf16), it would be emulated; use fp32")
    if precision == "fp16":
        if framework != "pytorch":
            raise KitError(f"{KEY}: fp16 (dynamic loss scaling) is implemented for PyTorch; "
                           f"with {framework} use bf16 or fp32")
        if device_type == "cuda":
            import torch
            major, minor = torch.cuda.get_device_capability()
            if major < 6:
                raise KitError(f"{KEY}: fp16: this GPU (compute capability {major}.{minor}) has no full-rate "
                               "fp16 arithmetic, it would be emulated; use fp32")
        elif not cpu_has_fp16():
            raise KitError(f"{KEY}: fp16: this CPU has no fp16 arithmetic (avx512_fp16, amx_fp16 or Arm "
                           "fphp), it would be emulated; use fp32")


def torch_dtype(precision: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def torch_autocast(precision: str, device):
    """The context the forward pass runs in."""
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch
    return torch.autocast(getattr(device, "type", "cpu"), dtype=torch_dtype(precision))


def grad_scaler(precision: str, device):
    """fp16's dynamic loss scaling (torch.amp.GradScaler, its defaults: 2^16 at the start,
    halved per overflow, doubled after 2000 clean steps); None for fp32 and bf16."""
    if precision != "fp16":
        return None
    import torch
    return torch.amp.GradScaler(getattr(device, "type", "cpu"))


def keras_policy(precision: str) -> None:
    """Set Keras' global dtype policy before the model is built."""
    import keras
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
