"""The fast readers take the raw path only for the exact on-disk type they can read (issue 48).

DeepCAM's fast reader (deepcam.data.read_raw_into, the GPU path's) took a dataset's bytes as
IEEE binary32 whenever h5py's dtype said float32; HDF5 has 4-byte float types that are not
binary32 (no implied mantissa bit, 24 bits of precision, a bit offset), which h5py reports as
float32 and converts when it reads: the fast path delivered other numbers, without an error.
Likewise a 1-byte integer label of 4 or 7 bits of precision (h5py: uint8). Now the HDF5 type
itself is checked (rawread.h5_raw_dtype): only IEEE binary32 in this machine's byte order
(labels: that, or an unsigned byte of 8 bits) is read raw, everything else through h5py, so
every type gives exactly h5py's values. CosmoFlow's npy fast path (read_sample_into) reads raw
only the exact dtype of its buffer (int16, this machine's byte order); any other dtype gives
what read_sample (np.load) gives: the same values, or the same one-line refusal.

Each type is a real HDF5 file written with h5py's low-level API (h5py.h5d.create with the
type, written from native float32 / uint8 memory: HDF5 converts into the stored type), or a
real .npy file written by np.save.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import pytest

from hpckit.common import rawread
from hpckit.common.errors import KitError
from hpckit.cosmoflow import data as cdata
from hpckit.deepcam import data as ddata

H, W, C = 6, 10, 16
T = h5py.h5t
NATIVE_LE = sys.byteorder == "little"


def ftype(*, order=None, fields=None, ebias=None, norm=None, precision=None, offset=None, base=T.IEEE_F32LE):
    t = base.copy()
    if fields is not None:   # narrower fields first: HDF5 checks they fit the precision
        t.set_fields(*fields)
    if precision is not None:
        t.set_precision(precision)
    if offset is not None:
        t.set_offset(offset)
    if ebias is not None:
        t.set_ebias(ebias)
    if norm is not None:
        t.set_norm(norm)
    if order is not None:
        t.set_order(order)
    return t


def itype(*, precision=None, offset=None, pad=None, base=T.STD_U8LE):
    t = base.copy()
    if precision is not None:
        t.set_precision(precision)
    if offset is not None:
        t.set_offset(offset)
    if pad is not None:
        t.set_pad(*pad)
    return t


# float types of 4 bytes (name -> HDF5 type); "raw": the one the fast path reads itself
DATA_TYPES = {
    "ieee-le": T.IEEE_F32LE,
    "ieee-be": T.IEEE_F32BE,
    "no-implied-bit": ftype(norm=T.NORM_NONE),                    # h5py: float32
    "precision-24": ftype(precision=24, fields=(23, 15, 8, 0, 15)),   # h5py: float32
    "precision-24-offset-8": ftype(precision=24, offset=8, fields=(23, 15, 8, 0, 15)),   # h5py: float32
    "ebias-126": ftype(ebias=126),                                # h5py: float64
    "fields-9-22": ftype(fields=(31, 22, 9, 0, 22), ebias=255),   # h5py: float64
    "ieee-f64": T.IEEE_F64LE,
}
LABEL_TYPES = {
    "u8": T.STD_U8LE,
    "u8-be": T.STD_U8BE,
    "u8-precision-4-offset-2": itype(precision=4, offset=2),     # h5py: uint8
    "u8-precision-7-pad-one": itype(precision=7, pad=(T.PAD_ONE, T.PAD_ONE)),   # h5py: uint8
    "i8": T.STD_I8LE,
    "f32": T.IEEE_F32LE,
    "f32-no-implied-bit": ftype(norm=T.NORM_NONE),
    "f32-be": T.IEEE_F32BE,
}


def write(path, data_type, label_type, data, labels):
    """A DeepCAM sample file whose two datasets are stored, contiguous, in the given HDF5
    types; the values are written from native memory (HDF5 converts them into the type)."""
    with h5py.File(path, "w") as f:
        for key, tid, arr, mem in ((ddata.DATA_KEY, data_type, data, T.NATIVE_FLOAT),
                                   (ddata.LABEL_KEY, label_type, labels, T.NATIVE_UINT8)):
            group = f.require_group(key.rsplit("/", 1)[0])
            d = h5py.h5d.create(group.id, key.rsplit("/", 1)[1].encode(), tid, h5py.h5s.create_simple(arr.shape))
            d.write(h5py.h5s.ALL, h5py.h5s.ALL, arr, mtype=mem)


def sample(seed=4):
    rng = np.random.default_rng(seed)
    # climate-like magnitudes: pressures (1e5), temperatures (2e2), small fractions
    data = (rng.normal(size=(H, W, C)) * np.logspace(-3, 5, C)).astype(np.float32)
    labels = rng.integers(0, 3, (H, W)).astype(np.uint8)
    return data, labels


def h5py_values(path):
    """What h5py gives for the file, as the kit's strict reader casts it (float32, uint8)."""
    with h5py.File(path, "r") as f:
        return f[ddata.DATA_KEY][...].astype(np.float32), f[ddata.LABEL_KEY][...].astype(np.uint8)


def raw_layout(path):
    fd, st = rawread.open_regular(path)
    try:
        return ddata._h5_layout(path, fd, st.st_size)
    finally:
        os.close(fd)


def fast(path):
    x, y = np.empty((H, W, C), np.float32), np.empty((H, W), np.uint8)
    ddata.read_raw_into(path, x, y, H, W, C)
    return x, y


@pytest.mark.parametrize("name", list(DATA_TYPES))
def test_deepcam_fast_reader_gives_h5pys_values_for_every_float_type(tmp_path, name):
    p = tmp_path / "data-0.h5"
    data, labels = sample()
    write(p, DATA_TYPES[name], T.STD_U8LE, data, labels)
    x, y = fast(p)
    hx, hy = h5py_values(p)
    assert x.tobytes() == hx.tobytes(), (name, float(np.abs(x.astype(np.float64) - hx).max()))
    assert np.array_equal(y, hy) and np.array_equal(y, labels)
    # the raw path only for the type whose bytes are binary32 in this machine's order
    assert (raw_layout(p) is not None) == (name == ("ieee-le" if NATIVE_LE else "ieee-be")), name
    if name.startswith("ieee"):
        assert np.array_equal(x, data)   # IEEE types hold the values exactly


@pytest.mark.parametrize("name", list(LABEL_TYPES))
def test_deepcam_fast_reader_gives_h5pys_labels_for_every_label_type(tmp_path, name):
    p = tmp_path / "data-0.h5"
    data, labels = sample(5)
    write(p, T.IEEE_F32LE, LABEL_TYPES[name], data, labels)
    x, y = fast(p)
    hx, hy = h5py_values(p)
    assert np.array_equal(hy, labels), name   # h5py reads every one of them as the classes written
    assert np.array_equal(y, hy) and x.tobytes() == hx.tobytes(), name
    assert (raw_layout(p) is not None) == (name in ("u8", "u8-be", "f32")), name


def test_h5_raw_dtype_is_the_stored_type_or_none(tmp_path):
    """rawread.h5_raw_dtype names the numpy dtype whose bytes are the stored ones, whatever
    h5py reports."""
    p = tmp_path / "types.h5"
    arr = np.arange(6, dtype=np.float32)
    types = {"f32le": (T.IEEE_F32LE, "<f4"), "f32be": (T.IEEE_F32BE, ">f4"), "f64be": (T.IEEE_F64BE, ">f8"),
             "f16": (T.IEEE_F16LE, "<f2"), "nonorm": (ftype(norm=T.NORM_NONE), None),
             "p24": (ftype(precision=24, fields=(23, 15, 8, 0, 15)), None),
             "i16be": (T.STD_I16BE, ">i2"), "u32": (T.STD_U32LE, "<u4"),
             "u8p4": (itype(precision=4, offset=2), None)}
    with h5py.File(p, "w") as f:
        for key, (tid, _) in types.items():
            d = h5py.h5d.create(f.id, key.encode(), tid, h5py.h5s.create_simple(arr.shape))
            d.write(h5py.h5s.ALL, h5py.h5s.ALL, arr, mtype=T.NATIVE_FLOAT)
        f.create_dataset("enum", data=np.zeros(3, np.uint8),
                         dtype=h5py.enum_dtype({"a": 0, "b": 1}, basetype="u1"))
        f.create_dataset("compound", data=np.zeros(3, [("a", "<f4")]))
    with h5py.File(p, "r") as f:
        for key, (_, want) in types.items():
            got = rawread.h5_raw_dtype(f[key])
            assert got == (np.dtype(want) if want else None) and (got is None or got.str == want), (key, got)
        assert f["nonorm"].dtype == np.float32 and f["u8p4"].dtype == np.uint8   # what h5py reports
        assert rawread.h5_raw_dtype(f["enum"]) is None and rawread.h5_raw_dtype(f["compound"]) is None


# ---------------------------------------------------------------- CosmoFlow npy

S = 8
X_DTYPES = ["<i2", ">i2", "<u2", "<i4", "|i1", "<f4", ">f4", "<f2", "<i8"]
Y_DTYPES = ["<f4", ">f4", "<f2", "<f8", ">f8", "<i2", "|u1", "<c8", "|b1"]


def npy_split(tmp_path, x, y):
    d = tmp_path / "npy"
    d.mkdir(exist_ok=True)
    xs, ys = d / "s.x.npy", d / "s.y.npy"
    np.save(xs, x)
    np.save(ys, y)
    return cdata.SplitFiles("train", "npy", [xs], [ys])


def both(split):
    """(read_sample_into's outcome, read_sample's): arrays, or the error line."""
    out = []
    for how in ("into", "sample"):
        try:
            if how == "into":
                x, y = np.empty((S, S, S, 4), np.int16), np.empty(4, np.float32)
                cdata.read_sample_into(split, 0, S, x, y)
            else:
                x, y = cdata.read_sample(split, 0, S)
            out.append((x.tobytes(), y.tobytes()))
        except KitError as e:
            out.append(str(e))
    return out


@pytest.mark.parametrize("dtype", X_DTYPES)
def test_cosmoflow_fast_reader_reads_raw_only_int16_in_this_machines_order(tmp_path, dtype):
    x = np.random.default_rng(1).integers(0, 100, (S, S, S, 4)).astype(dtype)
    split = npy_split(tmp_path, x, np.array([0.1, -0.2, 0.3, 0.4], np.float32))
    into, strict = both(split)
    assert into == strict, (dtype, into, strict)
    if np.dtype(dtype) == np.dtype(np.int16):   # the raw path's type: values as np.load gives them
        assert into[0] == np.load(split.files[0]).tobytes()
    else:   # refused, one line naming the file and the dtype
        assert isinstance(into, str) and into.startswith(f"{split.files[0]}: array is {np.dtype(dtype)} "), into
        assert "expected int16" in into and "\n" not in into


@pytest.mark.parametrize("dtype", Y_DTYPES)
def test_cosmoflow_targets_of_every_dtype_as_np_load_gives_them(tmp_path, dtype):
    x = np.random.default_rng(2).integers(0, 100, (S, S, S, 4)).astype(np.int16)
    y = np.array([0.5, -0.25, 1, 0], dtype)
    split = npy_split(tmp_path, x, y)
    into, strict = both(split)
    assert into == strict, (dtype, into, strict)
    if np.dtype(dtype).kind in "fiu":
        assert into[1] == np.load(split.labels[0]).astype(np.float32).tobytes()
    else:
        assert isinstance(into, str) and into.startswith(f"{split.labels[0]}: target y is {np.dtype(dtype)}"), into
