"""summary.json: a run's results plus the software stack that produced them."""

from __future__ import annotations

import platform

from importlib import metadata
from pathlib import Path

from hpckit.common.fileio import atomic_write_json


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software_stack(framework: str) -> dict:
    import numpy
    stack = {"python": platform.python_version(), "numpy": numpy.__version__,
             "mlperf_logging": _version("mlperf-logging"), "hpckit": _version("mlperf-hpc-kit"),
             "platform": platform.platform(), "framework": framework}
    if framework == "pytorch":
        import torch
        stack["torch"] = torch.__version__
    elif framework == "tensorflow":
        import tensorflow as tf
        stack["tensorflow"] = tf.__version__
        stack["keras"] = _version("keras")
    return stack


def write_summary(path: Path, summary: dict) -> None:
    atomic_write_json(path, summary)


