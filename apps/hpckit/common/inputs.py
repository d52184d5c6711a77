"""The kit's one way to read what it did not just write, and to check what it read.

Published MLPerf logs (hpckit.results.logs), the convergence record, summary.json,
perflogs, system.yaml, a repository's git metadata and numbers from the command line all
come in through here:

* `read_bytes` / `read_text` / `read_json` / `read_yaml` open only a regular file (a FIFO,
  a socket or a device named as an input would block or never end: refused), non-blocking,
  bounded in size, and turn every failure into one KitError naming the file.
* `conform(value, spec, what, key)` checks a parsed document against the types the kit
  writes (`Opt`, `ListOf`, `MapOf`, dicts of specs, `NUMBER` = a finite int or float,
  `COUNT` = an int >= 0, ...): a wrong type or a non-finite number is one line naming the
  file and the key (`summary.json /x/summary.json: provenance.kit: expected an object, got
  str 'x'`).
* `number(...)`: one value checked for finiteness and range, the same message form.
* `cli_int` / `cli_float`: argparse types with bounds; nan, inf and values beyond what the
  code does with them are argparse's one-line usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat

from hpckit.common.errors import KitError

LARGEST = 1e300              # beyond, an integer read from a file overflows the floats it is used in
MAX_INPUT_BYTES = 1 << 30      # no input the kit reads is near this; a larger one is refused, not read


def _strerror(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def read_bytes(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The content of a regular file, or one KitError naming `what` (the file, with the
    option or role that named it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:
        raise KitError(f"{what}: cannot read ({_strerror(e)})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise KitError(f"{what}: is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise KitError(f"{what}: not a regular file (a FIFO, socket or device is never read)")
        if st.st_size > limit:
            raise KitError(f"{what}: {st.st_size} bytes, more than the {limit} this input can be")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise KitError(f"{what}: more than the {limit} bytes this input can be")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise KitError(f"{what}: cannot read ({_strerror(e)})") from None
    finally:
        os.close(fd)


def absent(path: str | os.PathLike) -> str:
    """Why a path that is neither a file nor a directory cannot be read, in words."""
    return ("not a regular file (a FIFO, socket or device is never read)" if os.path.lexists(path)
            and not os.path.islink(path) else "no such file or directory")


def read_head(path: str | os.PathLike, n: int) -> bytes | None:
    """The first `n` bytes of a regular file, None for anything else or an error (a probe:
    'is this an MLPerf log?')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, n)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES, errors: str = "strict") -> str:
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise KitError(f"{what}: not UTF-8 text (byte {e.start})") from None


def read_json(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES):
    """A JSON document (NaN and Infinity tokens are read as Python reads them; `conform`
    decides where they may stand)."""
    data = read_bytes(path, what, limit)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise KitError(f"{what}: not valid JSON ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") \
            from None


def read_yaml(path: str | os.PathLike, what: str, limit: int = 1 << 24):
    import yaml
    text = read_text(path, what, limit)
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise KitError(f"{what}: not valid YAML ({first[:200]})") from None


# ---- checking what was read -----------------------------------------------------------------

def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(value, what: str, key: str, *, minimum: float | None = None, positive: bool = False,
           integer: bool = False, maximum: float | None = None, none_ok: bool = False):
    """`value` if it is a finite number in range (an integer where `integer`), else one
    KitError naming the file (`what`) and `key`."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KitError(f"{what}: {key}: expected a number, got {_type_name(value)} {_show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise KitError(f"{what}: {key}: {_show(value)} is not a finite number")
    if abs(value) > LARGEST:    # an integer a float cannot hold: every reader computes in floats
        raise KitError(f"{what}: {key}: {_show(value)} is too large a number")
    if integer and not (isinstance(value, int) or float(value).is_integer()):
        raise KitError(f"{what}: {key}: {_show(value)} is not a whole number")
    if positive and not value > 0:
        raise KitError(f"{what}: {key}: {_show(value)} must be > 0")
    if minimum is not None and value < minimum:
        raise KitError(f"{what}: {key}: {_show(value)} must be >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise KitError(f"{what}: {key}: {_show(value)} must be <= {maximum:g}")
    return int(value) if integer else value


class Opt:
    """`spec`, or null."""

    def __init__(self, spec):
        self.spec = spec


class ListOf:
    def __init__(self, spec):
        self.spec = spec


class MapOf:
    """An object whose every value matches `spec` (keys are text)."""

    def __init__(self, spec):
        self.spec = spec


class Num:
    """A finite number within bounds (`integer`: a whole one)."""

    def __init__(self, minimum=None, positive=False, integer=False, maximum=None):
        self.kw = dict(minimum=minimum, positive=positive, integer=integer, maximum=maximum)


NUMBER = Num()
COUNT = Num(minimum=0, integer=True)
POSITIVE = Num(positive=True)
POSITIVE_INT = Num(positive=True, integer=True)
ANY = object()


def conform(value, spec, what: str, key: str = "") -> None:
    """`value` has the shape `spec` says (module doc), else one KitError naming the file
    (`what`) and the key path. A dict spec checks the keys it names that are present; other
    keys are free (a later kit may write more)."""
    label = key or "the document"
    if spec is ANY:
        return
    if isinstance(spec, Opt):
        if value is None:
            return
        spec = spec.spec
    if isinstance(spec, Num):
        number(value, what, label, **spec.kw)
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise KitError(f"{what}: {label}: expected an object, got {_type_name(value)} {_show(value)}")
        for k, sub in spec.items():
            if k in value:
                conform(value[k], sub, what, f"{key}.{k}" if key else k)
        return
    if isinstance(spec, (ListOf, MapOf)):
        want = list if isinstance(spec, ListOf) else dict
        if not isinstance(value, want):
            raise KitError(f"{what}: {label}: expected {_type_name(want())}, got {_type_name(value)} {_show(value)}")
        items = enumerate(value) if want is list else value.items()
        for k, v in items:
            conform(v, spec.spec, what, f"{key}[{k}]" if want is list else (f"{key}.{k}" if key else str(k)))
        return
    types = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if ok and isinstance(value, float) and not math.isfinite(value):
        raise KitError(f"{what}: {label}: {_show(value)} is not a finite number")
    if not ok:
        names = " or ".join(_type_name(t()) if t is not type(None) else "null" for t in types)
        raise KitError(f"{what}: {label}: expected {names}, got {_type_name(value)} {_show(value)}")


# ---- numbers from the command line ------------------------------------------------------------

def cli_int(low: int, high: int):
    """An argparse type: an integer low <= n <= high (high: what the code can do with it),
    else argparse's one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value if len(str(value)) < 30 else text[:20] + '...'} is outside "
                                             f"{low} .. {high}")
        return value
    parse.__name__ = "integer"
    return parse


def cli_float(low: float, high: float, low_open: bool = False):
    """An argparse type: a finite number in [low, high] ((low, high] with low_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < low or (low_open and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if low_open else '['}{low:g}, {high:g}]")
        return value
    parse.__name__ = "number"
    return parse
