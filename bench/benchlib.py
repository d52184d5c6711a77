"""What the bench scripts share: the machine line every figure is printed under, one-line
bad-argument exits, Open MPI as root, MLPerf log records, a free port range."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "apps") not in sys.path:
    sys.path.insert(0, str(REPO / "apps"))
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def bad(prog: str, message: str) -> None:
    """A bad argument: one line on stderr, exit 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(2)


def cpu_flags() -> str:
    """The flags that matter here, as the kit reads them (cores.cpuinfo: x86 `flags`, Arm
    `Features`, the auxiliary vector under emulation)."""
    from hpckit.common import cores
    info = cores.cpuinfo()
    if info.arch == "unknown":
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512bw", "avx512er", "avx512_bf16", "amx_bf16", "amx_tile", "fma", "asimd",
              "sve", "bf16")
    return ",".join(f for f in wanted if f in info.flags) or "none"


def cpu_model() -> str:
    from hpckit.common import cores
    model = cores.cpuinfo().model
    return model if model != "unknown" else (platform.processor() or "unknown")


def machine_line() -> str:
    """`# host ..., N CPUs, model, flags ..., load L at start`: figures taken on a busy
    machine are not figures, and a figure without its CPU is not one either."""
    from hpckit.common import cores
    info = cores.cpuinfo()
    flags = " ".join(sorted(f for f in info.flags if f.startswith(("avx", "fma", "sve", "asimd", "amx"))))
    return (f"# host {platform.node()}, {os.cpu_count()} CPUs, {info.model or 'unknown CPU'}, flags {flags}, "
            f"load {os.getloadavg()[0]:.2f} at start")


def records(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()
            if ":::MLLOG " in line]


def free_port(prog: str, span: int) -> int:
    """A port with `span` free-looking ports above it (MASTER_PORT and the instances')."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span < 65535:
            return base
    bad(prog, "no free port range")


def finish(work: Path, keep: bool, failed: bool) -> int:
    """Keep the work directory when asked or when something failed (its logs say what),
    else remove it (the bench made it); the exit code."""
    if keep or failed:
        print(f"# work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0
