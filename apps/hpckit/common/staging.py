"""Data staging into node-local storage and page-cache eviction, shared by all benchmarks.

MLPerf HPC (rulesets 1.0/2.0; still common practice in 3.0) times the copy from the
parallel file system to node-local storage inside the run, and flushes on-node caches
before each run so no run profits from an earlier one's reads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import stat
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


class _Inside:
    """Where the files of a data set lie as the readers reach them (symbolic links
    followed), relative to its resolved root; a KitError naming the file where that is
    outside the root. Each folder is resolved once (a file that is not a link costs one
    lstat)."""

    def __init__(self, root: Path):
        self.root = root
        self.real_root = Path(os.path.realpath(root))
        self._parents: dict = {}

    def __call__(self, f: Path) -> tuple[Path, os.stat_result]:
        """(f's path relative to the resolved root, f's stat, links followed)."""
        try:
            real_parent = self._parents.get(f.parent)
            if real_parent is None:
                real_parent = self._parents[f.parent] = Path(os.path.realpath(f.parent, strict=True))
            st = os.lstat(f)
            real = real_parent / f.name
            if stat.S_ISLNK(st.st_mode):
                real = Path(os.path.realpath(f, strict=True))
                st = os.stat(real)
        except OSError as e:
            raise KitError(f"{f}: cannot resolve for staging ({e.strerror or e})") from None
        try:
            return real.relative_to(self.real_root), st
        except ValueError:
            raise KitError(f"{f}: a symbolic link to {real}, outside the data set {self.root}: refused (staging "
                           "copies only files inside the data set; a file elsewhere, private perhaps, is not the "
                           "data set's to copy)") from None


def check_sources(files: list[Path], root: Path) -> list[int]:
    """The permission bits (st_mode & 0o777) of every file in `files`, each one a regular file
    inside the data set's `root` as the readers see it (links inside the root are followed);
    a KitError naming the first that is not: a symbolic link whose target lies outside
    the root (a private file elsewhere would otherwise be copied into the stage directory),
    or not a regular file. For stagers that write their own form (StageAs) and read the
    sources through the benchmark's readers."""
    inside = _Inside(root)
    modes = []
    for f in files:
        _, st = inside(f)
        if not stat.S_ISREG(st.st_mode):
            raise KitError(f"{f}: not a regular file")
        modes.append(st.st_mode & 0o777)
    return modes


def _open_inside(root_fd: int, rel: Path, dirs: dict, f: Path) -> int:
    """A descriptor of the regular file `rel` below the directory open as `root_fd`, every
    component opened with O_NOFOLLOW (a link swapped in after _inside resolved the path is
    not followed: ELOOP); `dirs` caches the parents' descriptors."""
    parent = rel.parent
    fd = dirs.get(parent)
    if fd is None:
        fd = root_fd
        for i, part in enumerate(parent.parts):
            sub = dirs.get(Path(*parent.parts[:i + 1]))
            if sub is None:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                dirs[Path(*parent.parts[:i + 1])] = sub
            fd = sub
    return os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)


def _copy_fd(src: int, dst: int, size: int) -> int:
    """`size` bytes from `src` to `dst` in the kernel (sendfile), read/write where it is not
    supported; returns the bytes copied (fewer where the file shrank)."""
    done = 0
    try:
        while done < size:
            sent = os.sendfile(dst, src, done, min(size - done, 1 << 30))
            if sent == 0:
                return done
            done += sent
        return done
    except OSError as e:
        if done or e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while done < size:
        chunk = os.pread(src, min(size - done, 1 << 24), done)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
        done += len(chunk)
    return done


def copy_files(files: list[Path], dest: Path, root: Path | None = None, inside: Path | None = None) -> int:
    """Copy `files` into the new directory `dest` (inside the run's own staging
    directory): flat, or with `root` under their paths relative to it (a data set whose
    layout is folders, OpenFold's); returns bytes copied.

    Only regular files inside the data set's root (`inside`, else `root`) are copied, as
    the readers see them: a symbolic link whose target lies outside it is refused, one
    KitError naming the link, before anything of it is read. Each copy is created with its
    source's permission bits (less the umask), never wider: a file of mode 600 stays 600."""
    inside = inside if inside is not None else root
    if inside is None:
        raise ValueError("copy_files: the data set's root (inside= or root=) is needed")
    where = _Inside(inside)
    try:
        root_fd = os.open(where.real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise KitError(f"staging {inside}: cannot open the data set's folder ({e.strerror or e})") from None
    dirs: dict = {}
    try:
        try:
            dest.mkdir()
        except OSError as e:
            raise KitError(f"--stage-dir {dest}: cannot create ({e.strerror})")
        total = 0
        for f in files:
            try:
                rel = f.relative_to(root) if root is not None else Path(f.name)
            except ValueError:
                rel = Path("..")
            if ".." in rel.parts or not rel.parts:
                raise KitError(f"{f}: not a path inside the data set's folder {root or inside}")
            target = dest / rel
            real_rel = where(f)[0]
            if not real_rel.parts:   # the data set's folder itself
                raise KitError(f"{f}: not a regular file")
            try:
                src = _open_inside(root_fd, real_rel, dirs, f)
            except OSError as e:
                why = ("it changed into a symbolic link while staged" if e.errno in (errno.ELOOP, errno.ENOTDIR)
                       else e.strerror or str(e))
                raise KitError(f"{f}: cannot open for staging ({why})") from None
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    raise KitError(f"{f}: not a regular file")
                try:
                    if root is not None:
                        target.parent.mkdir(parents=True, exist_ok=True)   # inside the new dest only
                    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, st.st_mode & 0o777)
                    try:
                        total += _copy_fd(src, dst, st.st_size)
                    finally:
                        os.close(dst)
                except OSError as e:
                    if is_disk_error(e):   # the node-local copy failed, not the dataset
                        raise disk_error(e, target) from None
                    raise KitError(f"staging {f} -> {target}: {e.strerror}")
            finally:
                os.close(src)
        return total
    finally:
        for fd in dirs.values():
            os.close(fd)
        os.close(root_fd)


class Stopwatch:
    def __init__(self):
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
