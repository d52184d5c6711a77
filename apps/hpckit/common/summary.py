"""summary.json: a run's results plus the software stack that produced them; written by
`hpckit train` (write_summary) and read back by analyze, report and package (read_summary,
which checks the types it holds are the ones written here)."""

from __future__ import annotations

import os
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
        stack["tensorflow_onednn_opts"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (TensorFlow's default)")
    return stack


def write_summary(path: Path, summary: dict) -> None:
    """The run's summary.json: a new file, or the one this run wrote (the end's replaces the
    start's), through the one writer."""
    atomic_write_json(path, summary, "--output-dir")


# the usage block's figures the results commands read (hpckit analyze, the report)
USAGE_FIGURES = ("peak_rss_bytes_max", "staging_read_MBps", "train_read_bytes_per_epoch", "train_read_MBps",
                 "grad_allreduce_bytes_per_batch", "grad_allreduce_share", "train_flops_per_sample",
                 "train_flops_per_s_per_rank", "cpu_wait_share", "input_wait_share", "gpu_busy_share",
                 "gpu_energy_j", "gpu_power_w", "cpu_energy_j", "cpu_power_w")


def _spec() -> dict:
    """The types write_summary's callers write (common/run.py Run._write_summary; the
    usage block: common/usage.py), as hpckit.common.inputs.conform reads them."""
    from hpckit.common import provenance
    from hpckit.common.inputs import COUNT, NUMBER, MapOf, Num, Opt
    seconds = Opt(Num(minimum=0))
    return {"benchmark": Opt(str), "framework": Opt(str), "config": Opt(str), "status": Opt(str),
            "converged": Opt(bool), "time_to_train_s": seconds, "staging_s": seconds, "epochs": Opt(COUNT),
            "metric": Opt(str), "target": Opt(NUMBER), "train_samples_per_s": seconds,
            "eval_samples_per_s": seconds, "global_batch_size": Opt(COUNT), "ranks": Opt(COUNT),
            "nodes": Opt(COUNT), "ranks_per_node": Opt(COUNT), "accelerators_per_node": Opt(COUNT),
            "seed": Opt(COUNT), "usage": Opt({k: Opt(Num(minimum=0)) for k in USAGE_FIGURES}),
            "software": Opt(MapOf(Opt(str))), "provenance": Opt(provenance._spec()), "error": Opt(str)}


def read_summary(path: str | Path) -> dict:
    """A run's summary.json, its values of the types the kit writes; else one KitError
    naming the file and the key."""
    from hpckit.common.inputs import conform, read_json
    what = f"summary.json {path}"
    doc = read_json(path, what, limit=1 << 26)
    conform(doc, _spec(), what)
    return doc


