"""The GPU path's readers (common/rawread.py): a sample's bytes read straight into its place in
the batch buffer give exactly what the strict readers (deepcam read_raw, cosmoflow read_sample)
give, refuse what they refuse with the same one line naming the file, fall back to h5py for a
dataset that is not stored in one piece, and never read past the end of a truncated file."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest

from hpckit.common import rawread
from hpckit.common.errors import KitError
from hpckit.cosmoflow import data as cdata
from hpckit.deepcam import data as ddata

H, W, C = 12, 20, 16


def write_sample(path, data=None, labels=None, **kw):
    rng = np.random.default_rng(3)
    data = rng.normal(size=(H, W, C)).astype(np.float32) if data is None else data
    labels = rng.integers(0, 3, (H, W)).astype(np.float32) if labels is None else labels
    with h5py.File(path, "w") as f:
        f.create_dataset(ddata.DATA_KEY, data=data, **kw)
        f.create_dataset(ddata.LABEL_KEY, data=labels)
    return data, labels


def read_both(path):
    x, y = np.empty((H, W, C), np.float32), np.empty((H, W), np.uint8)
    ddata.read_raw_into(path, x, y, H, W, C)
    want = ddata.read_raw(path, H, W, C, labels_dtype=np.uint8)
    return (x, y), want


@pytest.mark.parametrize("kw", [{}, {"chunks": (4, 4, 16)}, {"compression": "gzip"}], ids=["contiguous", "chunked", "gzip"])
def test_deepcam_raw_read_equals_read_raw(tmp_path, kw):
    p = tmp_path / "data-0.h5"
    data, labels = write_sample(p, **kw)
    (x, y), (wx, wy) = read_both(p)
    assert np.array_equal(x, wx) and np.array_equal(y, wy)
    assert np.array_equal(x, data) and np.array_equal(y, labels.astype(np.uint8))
    fd, st = rawread.open_regular(p)
    try:
        assert (ddata._h5_layout(p, fd, st.st_size) is not None) == (kw == {})   # raw only where in one piece
    finally:
        os.close(fd)
    (x2, y2), _ = read_both(p)   # the layout from the cache
    assert np.array_equal(x2, wx)


def test_deepcam_uint8_and_int_labels(tmp_path):
    for dtype in (np.uint8, np.int64):
        p = tmp_path / f"data-{np.dtype(dtype).name}.h5"
        _, labels = write_sample(p, labels=np.random.default_rng(1).integers(0, 3, (H, W)).astype(dtype))
        (x, y), (wx, wy) = read_both(p)
        assert np.array_equal(y, wy) and np.array_equal(y, labels)


@pytest.mark.parametrize("bad,where", [(np.nan, "data"), (np.inf, "data"), (-np.inf, "data"),
                                       (3.0, "labels"), (-1.0, "labels"), (1.5, "labels"), (np.nan, "labels"),
                                       (256.0, "labels")])
def test_deepcam_bad_values_same_message_as_read_raw(tmp_path, bad, where):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(H, W, C)).astype(np.float32)
    labels = rng.integers(0, 3, (H, W)).astype(np.float32)
    (data if where == "data" else labels)[5, 7, ...] = bad
    p = tmp_path / "data-bad.h5"
    write_sample(p, data, labels)
    with pytest.raises(KitError) as strict:
        ddata.read_raw(p, H, W, C, labels_dtype=np.uint8)
    with pytest.raises(KitError) as raw:
        ddata.read_raw_into(p, np.empty((H, W, C), np.float32), np.empty((H, W), np.uint8), H, W, C)
    assert str(raw.value) == str(strict.value) and str(p) in str(raw.value) and "(5, 7)" in str(raw.value)


def test_deepcam_finite_check_survives_a_sum_that_overflows(tmp_path):
    data = np.full((H, W, C), 3e38, np.float32)   # every value finite, their sum is not
    p = tmp_path / "data-big.h5"
    write_sample(p, data)
    (x, _), (wx, _) = read_both(p)
    assert np.array_equal(x, wx)


def test_deepcam_truncated_file_is_one_line_naming_it(tmp_path):
    p = tmp_path / "data-cut.h5"
    write_sample(p)
    fd, st = rawread.open_regular(p)
    layout = ddata._h5_layout(p, fd, st.st_size)
    os.close(fd)
    ddata.read_raw_into(p, np.empty((H, W, C), np.float32), np.empty((H, W), np.uint8), H, W, C)   # cached
    with open(p, "r+b") as f:   # cut inside the data: the cached layout is stale (size changed)
        f.truncate(layout[0].offset + 100)
    with pytest.raises(KitError, match=str(p)):
        ddata.read_raw_into(p, np.empty((H, W, C), np.float32), np.empty((H, W), np.uint8), H, W, C)


def test_read_into_short_read_names_the_file(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"\0" * 64)
    fd, _ = rawread.open_regular(p)
    try:
        with pytest.raises(KitError, match="truncated"):
            rawread.read_into(fd, p, rawread.Extent(32, np.dtype("<f4"), (16,)), np.empty(16, np.float32), "x")
    finally:
        os.close(fd)


def test_open_regular_refuses_what_is_not_a_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for p in (tmp_path / "fifo", tmp_path, tmp_path / "absent"):
        with pytest.raises(KitError, match=str(p)):
            rawread.open_regular(p)


# ---------------------------------------------------------------- CosmoFlow npy

S = 8


def npy_split(tmp_path, x, y=None):
    d = tmp_path / "npy"
    d.mkdir(exist_ok=True)
    xs, ys = d / "s.x.npy", d / "s.y.npy"
    np.save(xs, x)
    np.save(ys, np.array([0.1, -0.2, 0.3, 0.4], np.float32) if y is None else y)
    return cdata.SplitFiles("train", "npy", [xs], [ys])


def read_into(split):
    x, y = np.empty((S, S, S, 4), np.int16), np.empty(4, np.float32)
    cdata.read_sample_into(split, 0, S, x, y)
    return x, y


def test_cosmoflow_npy_raw_read_equals_read_sample(tmp_path):
    x = np.random.default_rng(0).integers(0, 30000, (S, S, S, 4)).astype(np.int16)
    split = npy_split(tmp_path, x)
    got, want = read_into(split), cdata.read_sample(split, 0, S)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and np.array_equal(got[0], x)


@pytest.mark.parametrize("case", ["negative", "float", "shape", "bigendian", "fortran", "object", "truncated",
                                  "header", "empty"])
def test_cosmoflow_npy_bad_files_one_line_naming_them(tmp_path, case):
    x = np.ones((S, S, S, 4), np.int16)
    if case == "negative":
        x[1, 2, 3, 0] = -5
    arr = {"float": x.astype(np.float32), "shape": x[:4], "bigendian": x.astype(">i2"),
           "fortran": np.asfortranarray(x), "object": np.array([{"a": 1}], dtype=object)}.get(case, x)
    d = tmp_path / "npy"
    d.mkdir()
    xs = d / "s.x.npy"
    if case == "object":
        np.save(xs, arr, allow_pickle=True)
    else:
        np.save(xs, arr)
    np.save(d / "s.y.npy", np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    if case == "truncated":
        with open(xs, "r+b") as f:
            f.truncate(os.path.getsize(xs) - 10)
    if case == "header":
        xs.write_bytes(b"\x93NUMPY\x01\x00" + b"\xff" * 60)
    if case == "empty":
        xs.write_bytes(b"")
    split = cdata.SplitFiles("train", "npy", [xs], [d / "s.y.npy"])
    with pytest.raises(KitError) as e:
        read_into(split)
    assert str(xs) in str(e.value) and "\n" not in str(e.value)


def test_cosmoflow_rewritten_file_is_looked_up_again(tmp_path):
    x = np.random.default_rng(0).integers(0, 100, (S, S, S, 4)).astype(np.int16)
    split = npy_split(tmp_path, x)
    read_into(split)
    shutil.copy(split.files[0], tmp_path / "keep.npy")
    np.save(split.files[0], x[:4])   # same name, another shape: a new inode or size
    with pytest.raises(KitError, match="expected int16"):
        read_into(split)
