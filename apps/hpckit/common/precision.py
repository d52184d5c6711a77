"""Numerical precision of the training step: `train.precision` fp32 (default) or bf16.

bf16 is mixed precision as the frameworks define it: weights, optimizer state, the loss and
the metric stay float32; the forward (and so the backward) convolutions and matmuls run in
bfloat16 (torch.autocast; Keras' `mixed_bfloat16` policy with a float32 output layer). The
reference itself offers mixed precision (mlcommons/hpc 2c627d45 cosmoflow/train.py:112
`--amp`, :268-270 `mixed_float16`), and the MLPerf rules let a closed-division submission
choose its numerical format; the kit logs the choice (`hpckit_config` train.precision) and
never changes it silently.

bf16 is refused where it would be emulated: on a CPU without bf16 instructions
(x86 avx512_bf16 or amx_bf16, Arm bf16) and on a GPU without bf16 support (V100). fp16
is not offered: it needs loss scaling, and the GPUs that lack bf16 are not the targets
where it would pay.
"""

from __future__ import annotations

import contextlib

from hpckit.common import cores
from hpckit.common.errors import KitError

PRECISIONS = ("fp32", "bf16")


def cpu_has_bf16() -> bool:
    """From the CPU `cores.cpuinfo()` describes (x86 avx512_bf16/amx_bf16, Arm bf16): KNL
    and A64FX have none."""
    return cores.has_bf16()


def check(precision: str, device_type: str = "cpu") -> None:
    """One-line error where `precision` is not a choice or would not run natively."""
    if precision not in PRECISIONS:
        raise KitError(f"config key 'train.precision': {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        if device_type == "cuda":
            import torch
            if not torch.cuda.is_bf16_supported():
                raise KitError("config key 'train.precision': bf16: this GPU has no bf16 support; use fp32")
        elif not cpu_has_bf16():
            raise KitError("config key 'train.precision': bf16: this CPU has no bf16 instructions "
                           "(avx512_bf16, amx_bf16 or Arm bf16), it would be emulated; use fp32")


def torch_autocast(precision: str, device):
    """The context the forward pass runs in."""
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch
    return torch.autocast(getattr(device, "type", "cpu"), dtype=torch.bfloat16)


def keras_policy(precision: str) -> None:
    """Set Keras' global dtype policy before the model is built."""
    import keras
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
