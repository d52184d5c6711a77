"""Data staging into node-local storage and page-cache eviction, shared by all benchmarks.

MLPerf HPC (rulesets 1.0/2.0; still common practice in 3.0) times the copy from the
parallel file system to node-local storage inside the run, and flushes on-node caches
before each run so no run profits from an earlier one's reads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import shutil
import time
from pathlib import Path

from hpckit.common.errors import KitError, disk_error, is_disk_error

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_bytes(path: str | os.PathLike) -> int:
    """Bytes of `path` currently in the page cache (mincore on a private mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        buf = ctypes.c_char.from_buffer(mm)
        try:
            if _libc.mincore(ctypes.addressof(buf), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del buf
        return min(size, sum(v & 1 for v in vec) * PAGE)


def evict_from_page_cache(paths: list[Path], probe: int = 64) -> dict:
    """Drop `paths` from the page cache with posix_fadvise(DONTNEED).

    Returns what was done, for the cache_clear log line: the method, the number of files,
    and the resident bytes of (up to `probe` of) the files before and after, measured with
    mincore, so the log shows the eviction took effect.
    """
    sample = paths[:probe]
    before = sum(resident_bytes(p) for p in sample)
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as e:
            raise KitError(f"{p}: cannot open for cache clearing ({e.strerror})")
        try:
            os.fsync(fd)   # dirty pages (a freshly written dataset) cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    after = sum(resident_bytes(p) for p in sample)
    return {"method": "posix_fadvise_dontneed", "files": len(paths), "probed_files": len(sample),
            "resident_bytes_before": before, "resident_bytes_after": after}


def check_stage_dir(stage_dir: Path, data_dir: Path) -> None:
    from hpckit.common.fileio import RUN_DIR_HEADROOM, check_path
    # the run creates hpckit-stage-*/<split>/<a data file's name> under it: room for a name of 255
    check_path(stage_dir, f"--stage-dir {stage_dir}", RUN_DIR_HEADROOM + 256)
    s, d = stage_dir.resolve(), data_dir.resolve()
    if s == d or d in s.parents or s in d.parents:
        raise KitError(f"--stage-dir {stage_dir}: must not overlap the data directory {data_dir}")


def make_own_dir(root: Path) -> list[Path]:
    """Create the run's staging directory `root` (it must not exist) and any missing parent;
    returns what was created, deepest first, for remove_own_dirs."""
    made = []
    parent = root.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    try:
        root.mkdir(parents=True)
    except FileExistsError:
        raise KitError(f"--stage-dir {root.parent}: {root.name} exists already; the run stages only into a "
                       "directory it creates")
    except OSError as e:
        raise KitError(f"--stage-dir {root.parent}: cannot create {root.name} ({e.strerror})")
    return [root, *made]


def remove_own_dirs(made: list[Path]) -> None:
    """Remove the staging directory the run created (its copies only) and the parents it
    created, if they are empty; never anything else."""
    shutil.rmtree(made[0], ignore_errors=True)
    for d in made[1:]:
        try:
            d.rmdir()
        except OSError:
            break


def copy_files(files: list[Path], dest: Path, root: Path | None = None) -> int:
    """Copy `files` into the new directory `dest` (inside the run's own staging
    directory): flat, or with `root` under their paths relative to it (a data set whose
    layout is folders, OpenFold's); returns bytes copied."""
    try:
        dest.mkdir()
    except OSError as e:
        raise KitError(f"--stage-dir {dest}: cannot create ({e.strerror})")
    total = 0
    for f in files:
        target = dest / (f.relative_to(root) if root is not None else f.name)
        try:
            if root is not None:
                target.parent.mkdir(parents=True, exist_ok=True)   # inside the new dest only
            shutil.copyfile(f, target)
        except OSError as e:
            if is_disk_error(e):   # the node-local copy failed, not the dataset
                raise disk_error(e, target) from None
            raise KitError(f"staging {f} -> {target}: {e.strerror}")
        total += f.stat().st_size
    return total


class Stopwatch:
    def __init__(self):
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
