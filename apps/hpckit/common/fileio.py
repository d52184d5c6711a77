"""Small file helpers: atomic writes (results are never half-written) and early checks."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
from contextlib import contextmanager
from pathlib import Path

from hpckit.common.errors import KitError, disk_error, is_disk_error


@contextmanager
def atomic_path(path: str | os.PathLike, fsync: bool = True):
    """Yield a temporary path beside `path`; when the block succeeds, fsync it (optional)
    and rename it over `path`, so readers never see a partial file; on failure remove it.
    Files are created with mode 0666 less the umask (result files must stay readable to a
    site's other users, unlike mkstemp's 0600)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_error(e):
            raise disk_error(e, path) from None
        raise


def create_exclusive(path: str | os.PathLike):
    """Open a new file for binary writing with mode 0666 less the umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp, create_exclusive(tmp) as f:
        f.write(data)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike, what: str):
    """A JSON file's content; a file that cannot be read or parsed is one KitError naming
    `what` (e.g. "--system-json x.json")."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise KitError(f"{what}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise KitError(f"{what}: not valid JSON ({e})") from None


def ensure_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create `path` if needed and prove it is writable, or fail with one line."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".hpckit-probe-")
        probe.close()
    except OSError as e:
        raise KitError(f"{what} {path}: not a writable directory ({e.strerror or e})")
    return path


def ensure_new_dir(path: str | os.PathLike, what: str, purpose: str) -> Path:
    """A directory this command may fill: new, or existing and empty; anything already in
    it belongs to someone else and is never rewritten (one line naming the first entry)."""
    path = Path(path)
    if path.is_dir():
        try:
            first = next(iter(sorted(path.iterdir())), None)
        except OSError as e:
            raise KitError(f"{what} {path}: cannot list ({e.strerror or e})")
        if first is not None:
            raise KitError(f"{what} {path}: not empty (holds {first.name}); {purpose} only into a new or "
                           "empty directory and never rewrites what is there")
    return ensure_writable_dir(path, what)
