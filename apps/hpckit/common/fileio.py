"""Small file helpers: atomic writes (results are never half-written) and early checks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hpckit.common.errors import KitError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


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
