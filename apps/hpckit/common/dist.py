"""Who am I among the ranks: launcher detection from the environment.

Single-process runs are rank 0 of 1. The framework wire-up for several ranks
(torch.distributed, tf.distribute, Horovod) builds on this detection.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: str = "none"

    @property
    def nodes(self) -> int:
        return max(1, self.size // max(1, self.local_size))


def _int(env, key, default=None):
    v = env.get(key)
    return int(v) if v not in (None, "") else default


def detect(env=os.environ) -> Ranks:
    probes = (
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
        ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    )
    for name, rk, sz, lrk, lsz in probes:
        if env.get(rk) is not None and env.get(sz) is not None:
            size = _int(env, sz, 1)
            local_size = _int(env, lsz, None) if lsz else None
            if name == "slurm" and local_size is None:
                per_node = env.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
                local_size = int(per_node) if per_node.isdigit() else size
            return Ranks(_int(env, rk, 0), size, _int(env, lrk, 0), local_size or size, name)
    return Ranks()


def hostname() -> str:
    return socket.gethostname()
