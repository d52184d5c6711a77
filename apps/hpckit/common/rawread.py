"""Arrays read straight from a file into the caller's buffer: the GPU path's readers.

A reader thread of the GPU path (common/feed.py) fills its place in a pinned batch buffer.
Through h5py or np.load each sample first lands in a freshly allocated array (57 MB for
DeepCAM, 16 MB for CosmoFlow), served by glibc with a fresh mmap, page-faulted and zeroed,
copied into the pinned buffer and unmapped again; and h5py serialises every call of every
thread on one lock while holding the GIL. Here the sample's bytes go from the page cache
into the buffer with one preadv (which releases the GIL), at the offset the file's own
layout gives:

* an .npy file: its header (magic, version, a Python literal parsed by numpy's
  read_array_header, never by eval or pickle) names dtype, order and shape; the data follows
  the header;
* an HDF5 dataset: where it is stored contiguously, unfiltered, in the file itself (no
  external storage), its data lies at one offset (h5py's DatasetID.get_offset); a chunked,
  compressed or external dataset, or one whose HDF5 type is not exactly a type numpy reads
  byte for byte (`h5_raw_dtype`: IEEE floats, whole-byte integers), is read through h5py as
  before (`h5_extent` says None).

Before a byte is read the extent is checked against the file's size, so a truncated file
is one KitError naming it, never a read past its end; a file that shrinks between the
check and the read is a short read, reported the same way. The layouts are looked up once
per file (`Layouts`, keyed by device, inode, size and mtime: a file replaced or rewritten is
looked up again).

bench/feed_rate.py measures the difference on the whole path (bench/README.md).
"""

from __future__ import annotations

import math
import os
import stat
import threading
import tokenize
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpckit.common.errors import KitError

NPY_MAX_HEADER = 1 << 16   # numpy's own limit on a header it parses without allow_pickle is 10000 bytes
# what numpy's .npy header parsing raises on a damaged header: besides ValueError, a header cut
# short by its length field is tokenize's TokenError (numpy retries it as a Python 2 header),
# deep nesting RecursionError, a size beyond memory MemoryError (tests/fuzz.py found them)
NPY_ERRORS = (ValueError, EOFError, SyntaxError, TypeError, OverflowError, RecursionError, MemoryError,
              tokenize.TokenError)


@dataclass(frozen=True)
class Extent:
    """An array stored in one piece: `offset` bytes into the file, `dtype` (byte order
    included) and `shape` as stored, C order."""
    offset: int
    dtype: np.dtype
    shape: tuple

    @property
    def nbytes(self) -> int:
        # exact in Python's integers: a damaged header's shape (2**64,) overflowed int64
        return math.prod(self.shape) * self.dtype.itemsize


def open_regular(path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a regular file opened for reading; KitError names the file otherwise
    (a FIFO is opened non-blocking and refused: it would never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise KitError(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise KitError(f"{path}: cannot stat ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise KitError(f"{path}: not a regular file")
    return fd, st


def check_within(path, extent: Extent, size: int, what: str) -> None:
    """KitError naming the file when `extent` does not lie within its `size` bytes."""
    if extent.offset < 0 or extent.nbytes < 0 or extent.offset + extent.nbytes > size:
        raise KitError(f"{path}: truncated or damaged: {what} needs bytes {extent.offset} to "
                       f"{extent.offset + extent.nbytes} of a file of {size} bytes")


def read_into(fd: int, path, extent: Extent, out: np.ndarray, what: str) -> None:
    """Fill `out` (C-contiguous, writable, extent.nbytes bytes) from the file at
    extent.offset; a short read (the file shrank) is a KitError naming the file."""
    view = memoryview(out).cast("B")
    if view.nbytes != extent.nbytes:
        raise ValueError(f"buffer of {view.nbytes} bytes for an extent of {extent.nbytes}")
    done = 0
    while done < extent.nbytes:
        try:
            got = os.preadv(fd, [view[done:]], extent.offset + done)
        except OSError as e:
            raise KitError(f"{path}: cannot read {what} ({e.strerror or e})") from None
        if got == 0:
            raise KitError(f"{path}: truncated: {what} ends at byte {extent.offset + done} of "
                           f"{extent.offset + extent.nbytes}")
        done += got


def npy_error(e: BaseException) -> str:
    """numpy's complaint in a few words: its first line, at most 200 characters (numpy quotes
    the whole header it could not parse, thousands of characters of a damaged one)."""
    first = (str(e).splitlines() or [type(e).__name__])[0]
    return first if len(first) <= 200 else first[:197] + "..."


def npy_extent(fd: int, path, size: int) -> Extent:
    """The data extent of the .npy file open as `fd` (read with pread, no pickle: an object
    dtype, a Fortran-order array or a header numpy does not parse is one KitError naming the
    file), checked against its `size`."""
    import io
    head = os.pread(fd, NPY_MAX_HEADER, 0)
    f = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy format version {version}")
    except NPY_ERRORS as e:
        raise KitError(f"{path}: not a readable .npy array ({npy_error(e)})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise KitError(f"{path}: .npy array of dtype {dtype}: only plain numbers are read")
    if fortran and len(shape) > 1:
        raise KitError(f"{path}: .npy array in Fortran order: the kit reads C-order arrays")
    extent = Extent(f.tell(), dtype, tuple(int(s) for s in shape))
    check_within(path, extent, size, "the array")
    return extent


# IEEE 754 binary16/32/64 as HDF5 describes them (H5T_IEEE_F*): size -> (sign position,
# exponent position, exponent size, mantissa position, mantissa size), exponent bias
IEEE_FLOAT = {2: ((15, 10, 5, 0, 10), 15), 4: ((31, 23, 8, 0, 23), 127), 8: ((63, 52, 11, 0, 52), 1023)}


def h5_raw_dtype(dset) -> np.dtype | None:
    """The numpy dtype whose bytes are exactly what the h5py Dataset `dset` stores on disk,
    or None: then only HDF5's own conversion (h5py's read) gives its values.

    h5py's `dset.dtype` is the type HDF5 converts to when it reads, not the stored one: a
    4-byte float without the implied mantissa bit, with 24 bits of precision or at a bit
    offset is reported as float32 too, and its bytes taken as binary32 are other numbers
    (up to 8.8e20 away, issue 48). So the HDF5 type itself is checked: an IEEE 754 float
    (size 2, 4 or 8; precision all of its bits, offset 0, the IEEE sign, exponent and
    mantissa fields and bias, implied normalisation) or an integer of whole bytes (precision
    all of its bits, offset 0, two's complement or unsigned; not an enum), little- or
    big-endian; anything else is None. And it must be the type h5py reports."""
    import h5py
    try:
        t = dset.id.get_type()
        cls = type(t)
        size, order = t.get_size(), t.get_order()
        if cls not in (h5py.h5t.TypeFloatID, h5py.h5t.TypeIntegerID) or t.get_offset() != 0 \
                or t.get_precision() != 8 * size:
            return None
        if order == h5py.h5t.ORDER_LE or (order == h5py.h5t.ORDER_NONE and size == 1):
            bo = "<"
        elif order == h5py.h5t.ORDER_BE:
            bo = ">"
        else:
            return None
        if cls is h5py.h5t.TypeFloatID:
            if size not in IEEE_FLOAT or (t.get_fields(), t.get_ebias()) != IEEE_FLOAT[size] \
                    or t.get_norm() != h5py.h5t.NORM_IMPLIED:
                return None
            kind = "f"
        else:
            sign = t.get_sign()
            if size not in (1, 2, 4, 8) or sign not in (h5py.h5t.SGN_NONE, h5py.h5t.SGN_2):
                return None
            kind = "u" if sign == h5py.h5t.SGN_NONE else "i"
        raw = np.dtype(f"{bo}{kind}{size}")
        return raw if raw == np.dtype(dset.dtype) else None
    except (RuntimeError, ValueError, TypeError, OSError, KeyError, AttributeError):
        return None


def h5_extent(dset, size: int) -> Extent | None:
    """The extent of an h5py Dataset stored in one piece in its file (contiguous layout, no
    filter, no external storage, allocated, within the file's `size` bytes) in a type whose
    bytes numpy reads as they are (h5_raw_dtype), or None: then it is read through h5py."""
    import h5py
    try:
        plist = dset.id.get_create_plist()
        if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() or plist.get_external_count():
            return None
        offset = dset.id.get_offset()
    except (RuntimeError, ValueError, OSError, KeyError):
        return None
    dtype = h5_raw_dtype(dset)
    if offset is None or dtype is None:
        return None
    extent = Extent(int(offset), dtype, tuple(int(s) for s in dset.shape))
    if extent.nbytes != dset.id.get_storage_size() or extent.offset + extent.nbytes > size:
        return None   # h5py then reads it and names what is wrong
    return extent


class Layouts:
    """Per file, what `look_up(path, fd, size)` found (an extents record, or None where the
    file is read the slow way), kept while the file's device, inode, size and mtime stay
    the same. Thread-safe: two readers of one new file may both look it up."""

    def __init__(self, look_up: Callable):
        self._look_up = look_up
        self._known: dict = {}
        self._lock = threading.Lock()

    def get(self, path, fd: int, st: os.stat_result):
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._known.get(str(path))
        if hit is not None and hit[0] == key:
            return hit[1]
        found = self._look_up(path, fd, st.st_size)
        with self._lock:
            self._known[str(path)] = (key, found)
        return found


class Scratch(threading.local):
    """Per reader thread, buffers reused from sample to sample (no allocation per read)."""

    def get(self, name: str, shape: tuple, dtype) -> np.ndarray:
        have = self.__dict__.get(name)
        if have is None or have.shape != tuple(shape) or have.dtype != np.dtype(dtype):
            have = self.__dict__[name] = np.empty(shape, dtype)
        return have


def all_finite(x: np.ndarray) -> bool:
    """Every value of the float array `x` finite, without an array-sized temporary: its
    sum is finite (NaN and inf propagate into a sum); only a sum that is not (NaN, inf, or
    an overflow of finite values) is checked element by element."""
    with np.errstate(all="ignore"):
        if np.isfinite(np.add.reduce(x, axis=None)):
            return True
    return bool(np.isfinite(x).all())
