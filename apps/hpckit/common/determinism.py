"""Deterministic training (`hpckit train --deterministic`, config key `train.deterministic`).

A regression check compares a run with the runs it was calibrated on. If the same seed can
give another loss curve (floating-point sums in another order: parallel reductions,
autotuned kernels, tf.data's interleaving), time to train carries the training's
randomness on top of the system's speed, and a change in epochs hides or fakes a
slowdown. With `train.deterministic: true` the same seed on the same machine and software
stack gives the same weights, the same eval values and the same number of epochs:

* every random draw is seeded from the run's seed, as always (model init, dropout, the
  per-epoch data order of common/run.EpochSampler; the loaders draw nothing else);
* PyTorch: `torch.use_deterministic_algorithms(True)` (an op without a deterministic
  kernel fails instead of running), cuDNN deterministic and not autotuned, cuBLAS with a
  fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8, set before CUDA starts);
* TensorFlow: `tf.config.experimental.enable_op_determinism()` (deterministic kernels and
  tf.data in order), after `keras.utils.set_random_seed`.

The thread count is part of "the same machine": the core plan (common/cores.py) fixes it
per rank. The MLPerf campaign runs (`reframe --repeat N`: seed + i) leave it off, as
submissions are free to run the fastest kernels; the regression checks turn it on.
"""

from __future__ import annotations

import os

from hpckit.common.errors import KitError


def apply(framework: str, enabled: bool, device_type: str = "cpu") -> dict:
    """Make this process's training deterministic (before any model or data op), or do
    nothing; returns what was set, for the log."""
    if not enabled:
        return {"deterministic": False}
    if framework == "pytorch":
        if device_type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        return {"deterministic": True, "how": "torch.use_deterministic_algorithms, cudnn.deterministic"}
    if framework == "tensorflow":
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        return {"deterministic": True, "how": "tf.config.experimental.enable_op_determinism"}
    raise KitError(f"--deterministic: no deterministic mode known for framework {framework!r}")

