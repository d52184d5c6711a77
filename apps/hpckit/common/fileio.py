"""The kit's one writer of output files, and small file helpers.

Every file a command writes goes through `atomic_path` (or the `atomic_write_*` helpers on
it), every directory a command fills as a whole through `staged_dir`. The rules
(docs/commands.md "What the kit writes, and what it refuses"):

* An output file is a new path, or a file this command wrote itself earlier in the same
  run (summary.json written again at a run's end). Only where a command says so (`replaces`)
  may it replace a file the kit wrote as the same kind of output in an earlier run,
  recognised by the marker it starts with (`references calibrate --replace`, `check`'s side
  report, `containers generate`'s recipes). Anything else that is there, a symbolic link
  included, is refused before any work: one line naming the option and the path, exit 2.
* The directory it goes into must exist; a directory given where a file is expected, or a
  missing parent, is one line naming the option and the path.
* Written atomically: a temporary file beside it (the same directory, so the rename is
  atomic), fsync'ed, then linked into place (link(2) fails if a file appeared meanwhile, so
  a race never replaces one) or renamed over the file this run wrote. Readers never see a
  partial file; a full disk is one line naming the file (nothing replaced).
* A directory output (a report, a package) is built in a temporary directory beside its
  target and renamed into place: it appears whole or not at all.

tests/test_writer.py reads every output option from the parser and proves each refuses; its
grep test fails on an open-for-write anywhere else in apps/.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from hpckit.common.errors import KitError, disk_error, is_disk_error

# (st_dev, st_ino) of every file this command wrote through the writer: the files it may
# write again. Cleared when a command starts (hpckit.cli.run_command), so commands run one
# after another in one process (the tests' in-process runs) never share it.
_WRITTEN: set[tuple[int, int]] = set()
# errors of link(2) on file systems that have no hard links: there the new file is renamed
# into place after a last look that nothing is there
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def begin_command() -> None:
    """A new command: nothing is 'written by this run' yet."""
    _WRITTEN.clear()


def _where(path: Path, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


# why a path cannot be used, for the errors a lookup of it may raise
_PATH_ERRORS = {errno.ENAMETOOLONG: "the path is longer than the file system allows",
                errno.ENOTDIR: "a part of the path is not a directory",
                errno.ELOOP: "too many symbolic links in the path (a loop?)",
                errno.EACCES: "permission denied (a directory on the way cannot be searched)"}


def _limit(path: Path, name: str, default: int) -> int:
    """pathconf `name` of the nearest existing directory above `path`."""
    for d in [path, *path.parents]:
        if os.path.isdir(d):
            try:
                return os.pathconf(d, name)
            except (OSError, ValueError):
                break
    return default


# a run's or a data set's directory: room for what the kit writes under it (train/, a sample's
# name, a temporary name beside it: .<name>.<pid>.<hex>.tmp), so none of it fails halfway
RUN_DIR_HEADROOM = 128


def check_path(path: str | os.PathLike, where: str, headroom: int = 0) -> Path:
    """`path` as one the kit may look at and create, before anything is made: each name in it
    no longer than the file system takes (NAME_MAX of the nearest existing directory, 255
    bytes on most), the whole, with `headroom` bytes for what will be written under it, no
    longer than PATH_MAX, and every part that exists reachable; else one KitError naming
    `where` (ENAMETOOLONG, ENOTDIR, ELOOP, EACCES were tracebacks or a directory made
    halfway down, issue 41)."""
    path = Path(path)
    name_max = _limit(path, "PC_NAME_MAX", 255)
    for part in path.parts:
        n = len(os.fsencode(part))
        if n > name_max and part != path.anchor:
            shown = part if n <= 60 else part[:40] + "..."
            raise KitError(f"{where}: the name {shown!r} is {n} bytes, longer than the {name_max} a name may have "
                           "on this file system")
    size, path_max = len(os.fsencode(str(path))), _limit(path, "PC_PATH_MAX", 4096)
    if size + headroom >= path_max:
        room = f" (and {headroom} for what is written under it)" if headroom else ""
        raise KitError(f"{where}: the path is {size} bytes{room}, longer than the {path_max - 1} this file system "
                       "takes")
    try:
        os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise KitError(f"{where}: {_PATH_ERRORS.get(e.errno, e.strerror or str(e))}") from None
    except ValueError as e:   # a NUL byte
        raise KitError(f"{where}: not a usable path ({e})") from None
    return path


def _starts_with(path: Path, marker: bytes) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(marker)) == marker
    finally:
        os.close(fd)


def check_output(path: str | os.PathLike, option: str | None = None, replaces: bytes | None = None,
                 hint: str = "") -> Path:
    """`path` as an output file, or one KitError naming `option` and the path: it must be
    new, or written by this command, or (with `replaces`) a regular file that starts with
    that marker; its directory must exist. Called before a command's work (so nothing is
    computed for a file that will be refused) and again when the file is put in place."""
    path = Path(path)
    where = _where(path, option)
    if not str(path) or path.name in ("", ".", ".."):
        raise KitError(f"{where}: not a file name")
    check_path(path, where)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise KitError(f"{where}: a part of the path is not a directory") from None
    except (OSError, ValueError) as e:
        raise KitError(f"{where}: cannot use this path ({getattr(e, 'strerror', None) or e})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise KitError(f"{where}: is a directory; give a file name")
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in _WRITTEN:
            return path
        if replaces is not None and stat.S_ISREG(st.st_mode) and _starts_with(path, replaces):
            return path
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
        raise KitError(f"{where}: exists ({kind} this command did not write); hpckit writes only a new file "
                       f"and never replaces one{hint}")
    parent = path.parent
    if not parent.is_dir():
        if parent.exists() or parent.is_symlink():
            raise KitError(f"{where}: {parent} is not a directory")
        raise KitError(f"{where}: cannot write into {parent}: no such directory (create it first)")
    return path


def _remember(path: Path) -> None:
    st = os.lstat(path)
    _WRITTEN.add((st.st_dev, st.st_ino))


def _place(tmp: Path, path: Path, option: str | None, replaces: bytes | None) -> None:
    """Move the finished temporary file to `path`: a link where nothing is there (refused
    by the kernel if a file appeared meanwhile), a rename over a file it may replace."""
    check_output(path, option, replaces)
    if not os.path.lexists(path):
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise KitError(f"{_where(path, option)}: appeared while it was being written; not replaced") from None
        except OSError as e:
            if e.errno not in _NO_LINKS:
                raise
            if os.path.lexists(path):
                raise KitError(f"{_where(path, option)}: appeared while it was being written; not replaced") from None
            os.replace(tmp, path)
        else:
            os.unlink(tmp)
    else:
        os.replace(tmp, path)
    _remember(path)


@contextmanager
def atomic_path(path: str | os.PathLike, fsync: bool = True, option: str | None = None,
                replaces: bytes | None = None):
    """Yield a temporary path beside `path` to write; when the block succeeds, fsync it
    (optional) and put it in place (`check_output`'s rules), so readers never see a partial
    file; on failure remove it. Files are created with mode 0666 less the umask (result
    files must stay readable to a site's other users, unlike mkstemp's 0600)."""
    path = check_output(path, option, replaces)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _place(tmp, path, option, replaces)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if is_disk_error(e):
            raise disk_error(e, path) from None
        if isinstance(e, OSError) and getattr(e, "filename", None) in (str(tmp), str(path)):
            raise KitError(f"{_where(path, option)}: cannot write ({e.strerror or e})") from None
        raise


def create_exclusive(path: str | os.PathLike):
    """Open a new file for binary writing with mode 0666 less the umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")


def atomic_write_bytes(path: str | os.PathLike, data: bytes, option: str | None = None,
                       replaces: bytes | None = None) -> None:
    with atomic_path(path, option=option, replaces=replaces) as tmp, create_exclusive(tmp) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, option: str | None = None,
                      replaces: bytes | None = None) -> None:
    atomic_write_bytes(path, text.encode(), option, replaces)


def atomic_write_json(path: str | os.PathLike, obj, option: str | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", option)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: str | os.PathLike, what: str):
    """A JSON file's content; a file that cannot be read or parsed is one KitError naming
    `what` (e.g. "--system-json x.json"). (hpckit.common.inputs.read_json is the same with
    the reader's checks: a regular file, bounded.)"""
    from hpckit.common.inputs import read_json as read
    return read(path, what)


def ensure_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create `path` if needed and prove it is writable, or fail with one line."""
    path = check_path(path, f"{what} {path}", RUN_DIR_HEADROOM)   # before a directory is made halfway down
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".hpckit-probe-")
        probe.close()
    except (OSError, ValueError) as e:
        raise KitError(f"{what} {path}: not a writable directory ({getattr(e, 'strerror', None) or e})")
    return path


def ensure_new_dir(path: str | os.PathLike, what: str, purpose: str) -> Path:
    """A directory this command may fill: new, or existing and empty; anything already in
    it belongs to someone else and is never rewritten (one line naming the first entry)."""
    path = Path(path)
    _refuse_filled(path, what, purpose)
    return ensure_writable_dir(path, what)


def _refuse_filled(path: Path, what: str, purpose: str) -> None:
    check_path(path, f"{what} {path}".strip())
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise KitError(f"{what} {path}: exists and is not a directory; {purpose} only into a new or empty directory")
    if path.is_dir():
        try:
            first = next(iter(sorted(path.iterdir())), None)
        except OSError as e:
            raise KitError(f"{what} {path}: cannot list ({e.strerror or e})")
        if first is not None:
            raise KitError(f"{what} {path}: not empty (holds {first.name}); {purpose} only into a new or "
                           "empty directory and never rewrites what is there")


def check_new_dir(path: str | os.PathLike, what: str, purpose: str) -> Path:
    """`path` as a directory output `staged_dir` can fill: new or empty, its parent an
    existing directory; else one KitError naming `what` and the path."""
    path = Path(path)
    if not str(path) or path.name in ("", ".", ".."):
        raise KitError(f"{what} {path}: name a directory to create")
    _refuse_filled(path, what, purpose)
    if path.is_dir() and os.path.ismount(path):   # refused before the work, not at its end
        raise KitError(f"{what} {path}: a mount point: the output is built beside it and moved into place, "
                       "which a mount point refuses; name a new directory inside it")
    parent = path.parent
    if not parent.is_dir():
        if parent.exists():
            raise KitError(f"{what} {path}: {parent} is not a directory")
        raise KitError(f"{what} {path}: no such directory {parent} (create it first)")
    return path


@contextmanager
def staged_dir(path: str | os.PathLike, what: str, purpose: str):
    """Yield a new temporary directory beside `path` to build a directory output in; when
    the block succeeds, rename it to `path` (new, or an empty directory: rename(2) replaces
    an empty one atomically and refuses a filled one), so the output appears whole or not at
    all; on failure remove it with everything in it (all of it written by this command)."""
    path = check_new_dir(path, what, purpose)
    try:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.hpckit-"))
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)     # mkdtemp's 0700 would hide a report from the site's users
    except OSError as e:
        if is_disk_error(e):
            raise disk_error(e, path) from None
        raise KitError(f"{what} {path}: cannot create a directory beside it ({e.strerror or e})") from None
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise KitError(f"{what} {path}: was filled by something else while this command wrote; "
                               "not replaced") from None
            if e.errno in (errno.EBUSY, errno.EXDEV):   # a mount point: never replaced by a rename
                raise KitError(f"{what} {path}: a mount point (or on another file system than its parent): "
                               "the output cannot be moved into place; name a new directory inside it") from None
            raise
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_error(e):
            raise disk_error(e, path) from None
        if isinstance(e, KitError) and str(tmp) in str(e):
            # name the output as the user gave it, not the hidden directory it was built in
            raise type(e)(str(e).replace(str(tmp), str(path))) from None
        raise


def place_tree(root: Path, name: str, files: dict[str, bytes], what: str) -> None:
    """Add `files` (paths relative to root/name, none of them there yet: the caller has
    checked) to the tree root/name: written into a temporary directory beside it, then all
    of root/name moved in with one rename when it is new, else each new subtree with one
    rename (any moved one taken back if a later one fails). `root` is created when missing
    (its parent must exist) and removed again if nothing landed in it. A package appears
    whole or not at all."""
    root = check_path(root, f"{what} {root}")
    check_path(root / name, f"{what} {root / name}")
    made_root = False
    if not root.is_dir():
        try:
            root.mkdir()
            made_root = True
        except OSError as e:
            if is_disk_error(e):
                raise disk_error(e, root) from None
            raise KitError(f"{what} {root}: cannot create ({e.strerror or e})") from None
    dest_top = root / name
    tmp = None
    placed: list[tuple[Path, Path]] = []
    try:
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}.hpckit-"))
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for rel, data in sorted(files.items()):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(tmp / rel, data, what)
        if not os.path.lexists(dest_top):
            os.rename(tmp, dest_top)
            tmp = None
            return
        moves = set()
        for rel in files:
            parts = Path(rel).parts
            for depth in range(1, len(parts) + 1):   # the shallowest part not there yet
                if not os.path.lexists(dest_top.joinpath(*parts[:depth])):
                    moves.add(Path(*parts[:depth]))
                    break
        for rel in sorted(moves, key=lambda p: (len(p.parts), str(p))):
            if any(parent in moves for parent in rel.parents):
                continue
            dest = dest_top / rel
            if os.path.lexists(dest):
                raise KitError(f"{dest}: appeared while this command wrote; nothing was replaced")
            os.rename(tmp / rel, dest)
            placed.append((dest, tmp / rel))
        placed.clear()
    except BaseException as e:
        for dest, src in reversed(placed):
            try:
                os.rename(dest, src)
            except OSError:
                pass
        if is_disk_error(e):
            raise disk_error(e, dest_top) from None
        if isinstance(e, OSError):
            raise KitError(f"{what} {root}: cannot write ({e.strerror or e})") from None
        if isinstance(e, KitError) and tmp is not None and str(tmp) in str(e):
            raise type(e)(str(e).replace(str(tmp), str(dest_top))) from None
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if made_root:
            try:
                root.rmdir()      # only when nothing landed in it
            except OSError:
                pass


# ---- output options: argparse types that mark them (tests/test_writer.py finds them) ----------

def output_file(option: str, replaces: bytes | None = None, hint: str = ""):
    """The argparse type of an option naming an output file: refuses at parse time what the
    writer would refuse at the end (check_output), so no work is done for nothing."""
    def parse(text: str) -> str:
        try:
            check_output(text, None, replaces, hint)
        except KitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    parse.__name__ = "output file"
    parse.output = "file"
    parse.option = option
    parse.replaces = replaces
    return parse


def output_dir(option: str, kind: str):
    """The argparse type of an option naming an output directory. kind: `new` (filled whole
    by this command, staged_dir: new or empty, its parent existing), `root` (a tree this
    command adds to: `hpckit package --out`, a directory or a new name in an existing one),
    `run` (a run's directory: `train --output-dir`, `datagen --out`, whose commands check it
    and create it with its parents)."""
    def parse(text: str) -> str:
        try:
            if kind == "new":
                check_new_dir(text, "", "this command writes")
            else:
                p = check_path(text, text, RUN_DIR_HEADROOM if kind == "run" else 0)
                if p.exists() and not p.is_dir():
                    raise KitError(f"{p}: exists and is not a directory")
                if kind == "root" and not p.exists() and not p.parent.is_dir():
                    raise KitError(f"{p}: no such directory {p.parent} (create it first)")
        except KitError as e:
            raise argparse.ArgumentTypeError(str(e).strip()) from None
        return text
    parse.__name__ = "output directory"
    parse.output = kind
    parse.option = option
    return parse
