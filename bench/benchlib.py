"""What the bench scripts share: the machine line every figure is printed under, one-line
bad-argument exits, Open MPI as root, MLPerf log records, a free port range, and the kit's
rule for what a script writes (issue 41): its work goes into a new directory it makes (inside
--workdir when given: whatever else is there is not its own and stays), and an output file
(--json) is a new file written through the kit's writer, never one that was there."""

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


def check_workdir(prog: str, option: str, given: str | None) -> Path | None:
    """`given` as a --workdir, checked without making anything: a directory or a path that
    can be made; a file, a name too long or a file on the way is one line naming the
    option, exit 2."""
    if given is None:
        return None
    from hpckit.common.errors import KitError
    from hpckit.common.fileio import RUN_DIR_HEADROOM, check_path
    try:
        base = check_path(given, f"{option} {given}", RUN_DIR_HEADROOM)
    except KitError as e:
        bad(prog, str(e))
    if base.exists() and not base.is_dir():
        bad(prog, f"{option} {base}: not a directory")
    return base


def own_workdir(prog: str, option: str, given: str | None, prefix: str) -> Path:
    """This run's work directory, new: made inside `given` (created with its parents when
    missing; what else it holds is not this run's and is never touched) or, without one, a
    new temporary directory. A `given` that is a file, or a path that cannot be made (a name
    too long, a file on the way), is one line naming the option, exit 2, before any work."""
    import tempfile
    base = check_workdir(prog, option, given)
    if base is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    except OSError as e:
        bad(prog, f"{option} {base}: cannot create a directory there ({e.strerror or e})")


def check_writable(prog: str, option: str, shown, directory: Path) -> None:
    """Prove that a file can be made in `directory` (or, where it is still to be made, in
    the nearest directory above it that exists), before any work: a file is created there and
    removed again. A read-only file system, a folder without write permission, a full one:
    one line naming the option, exit 2 (it was a traceback after the whole measurement)."""
    import tempfile
    where = Path(directory)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".hpckit-probe-", dir=where)
    except OSError as e:
        bad(prog, f"{option} {shown}: cannot write into {where} ({e.strerror or e})")
    os.close(fd)
    os.unlink(name)


def output_path(prog: str, option: str, given: str | None) -> Path | None:
    """An output file option checked before any work, as the kit's writer checks it when the
    file is written (hpckit.common.fileio.check_output): a new file in an existing
    directory that this process can write (check_writable). A file that is there (the
    user's, or an earlier run's), a directory, a missing or read-only directory or a name too
    long is one line naming the option and path, exit 2."""
    if given is None:
        return None
    from hpckit.common.errors import KitError
    from hpckit.common.fileio import check_output
    try:
        path = check_output(given, option)
    except KitError as e:
        bad(prog, str(e))
    check_writable(prog, option, path, path.parent)
    return path


def write_output(prog: str, option: str, path: Path, text: str) -> None:
    """`text` into the output file `path` through the kit's writer: atomically, a new file or
    one this run wrote; one that appeared meanwhile is never replaced (one line, exit 2)."""
    from hpckit.common.errors import KitError
    from hpckit.common.fileio import atomic_write_text
    try:
        atomic_write_text(path, text, option)
    except KitError as e:
        bad(prog, str(e))


def finish(work: Path, keep: bool, failed: bool) -> int:
    """Keep the work directory when asked or when something failed (its logs say what),
    else remove it (the bench made it); the exit code."""
    if keep or failed:
        print(f"# work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0
