"""TFRecord / tf.train.Example I/O without TensorFlow, checked against TensorFlow itself."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # before any TensorFlow import

import gzip
import struct

import numpy as np
import pytest

from hpckit.common import tfrecord
from hpckit.common.errors import KitError
from hpckit.common.tfrecord import (
    decode_example,
    encode_example,
    read_example_file,
    read_records,
    write_example_file,
    write_records,
)

SHAPE = (8, 8, 8, 4)


@pytest.fixture
def sample():
    rng = np.random.default_rng(1234)
    x = rng.integers(-(2**15), 2**15, size=SHAPE, dtype=np.int16)
    y = rng.standard_normal(4).astype(np.float32)
    return x, y


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _x_bytes(x):
    return x.astype("<i2").tobytes()


def _raises_kit_error(path, fn, *args, **kwargs):
    """fn(...) must raise KitError with a one-line message naming the file."""
    with pytest.raises(KitError) as info:
        result = fn(path, *args, **kwargs)
        if not isinstance(result, dict):
            list(result)  # read_records is lazy about framing errors
    message = str(info.value)
    assert os.path.basename(str(path)) in message, message
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- own round trip


def test_crc32c_check_value():
    assert tfrecord.crc32c(b"123456789") == 0xE3069283  # CRC-32C standard check value
    crc = 0xE3069283
    expected = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.masked_crc32c(b"123456789") == expected


@pytest.mark.parametrize("compression", ["GZIP", None, "ZLIB"])
def test_example_file_round_trip(tmp_path, sample, compression):
    x, y = sample
    path = tmp_path / "sample.tfrecord"
    write_example_file(path, {"x": _x_bytes(x), "y": y}, compression=compression)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (compression == "GZIP")

    got = read_example_file(path, compression=compression)
    assert set(got) == {"x", "y"}
    assert isinstance(got["x"], bytes)
    np.testing.assert_array_equal(np.frombuffer(got["x"], dtype="<i2").reshape(SHAPE), x)
    assert got["y"].dtype == np.float32
    np.testing.assert_array_equal(got["y"], y)
    assert [p.name for p in tmp_path.iterdir()] == ["sample.tfrecord"]  # no temp file left


@pytest.mark.parametrize("compression", ["GZIP", None])
def test_records_round_trip_several(tmp_path, compression):
    records = [b"", b"a", bytes(range(256)) * 40, memoryview(b"from a view")]
    path = tmp_path / "many.tfrecord"
    assert write_records(path, iter(records), compression=compression) == 4
    assert list(read_records(path, compression=compression)) == [bytes(r) for r in records]
    with pytest.raises(KitError, match="expected exactly one"):
        read_example_file(path, compression=compression)


def test_writes_are_deterministic(tmp_path, sample):
    x, y = sample
    a, b = tmp_path / "a", tmp_path / "b"
    write_example_file(a, {"y": y, "x": _x_bytes(x)})
    write_example_file(b, {"x": _x_bytes(x), "y": list(map(float, y))})
    assert a.read_bytes() == b.read_bytes()


def test_encode_decode_value_kinds():
    features = {
        "b": b"raw",
        "bl": [b"one", b"", b"three"],
        "f": [1.5, -2.0, np.inf],
        "fa": np.arange(6, dtype=np.float64).reshape(2, 3),
        "i": [0, -1, 2**63 - 1, -(2**63), 300],
        "ia": np.array([[True, False]]),
        "s": "text",
        "scalar": 7,
        "empty_f": np.zeros(0, dtype=np.float32),
    }
    got = decode_example(encode_example(features))
    assert got["b"] == b"raw"
    assert got["bl"] == [b"one", b"", b"three"]
    assert got["f"].dtype == np.float32
    np.testing.assert_array_equal(got["f"], np.array([1.5, -2.0, np.inf], dtype=np.float32))
    np.testing.assert_array_equal(got["fa"], np.arange(6, dtype=np.float32))
    assert got["i"].dtype == np.int64
    assert got["i"].tolist() == [0, -1, 2**63 - 1, -(2**63), 300]
    assert got["ia"].tolist() == [1, 0]
    assert got["s"] == b"text"
    assert got["scalar"].tolist() == [7]
    assert got["empty_f"].dtype == np.float32 and got["empty_f"].size == 0
    got["f"][0] = 0  # decoded arrays are writable copies

    with pytest.raises(ValueError):
        encode_example({"i": [2**63]})
    with pytest.raises(ValueError):
        encode_example({"e": []})
    with pytest.raises(TypeError):
        encode_example({"m": [b"a", 1]})
    with pytest.raises(TypeError):
        encode_example({"c": np.ones(2, dtype=np.complex64)})


def _varint(n):
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(field, payload):
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _example(entries):
    return _ld(1, b"".join(_ld(1, _ld(1, k) + _ld(2, v)) for k, v in entries))


def test_decode_accepts_unpacked_repeated_fields():
    floats = b"".join(b"\x0d" + struct.pack("<f", v) for v in (1.0, -0.5))  # field 1, fixed32
    ints = b"".join(b"\x08" + _varint(v % 2**64) for v in (5, -3, 2**40))  # field 1, varint
    mixed = _ld(1, struct.pack("<2f", 3.0, 4.0)) + b"\x0d" + struct.pack("<f", 5.0)
    data = _example(
        [
            (b"f", _ld(2, floats)),
            (b"i", _ld(3, ints)),
            (b"m", _ld(2, mixed)),
            (b"unknown", _ld(9, b"ignored") + _ld(1, _ld(1, b"kept"))),
        ]
    )
    got = decode_example(data)
    assert got["f"].tolist() == [1.0, -0.5]
    assert got["i"].tolist() == [5, -3, 2**40]
    assert got["m"].tolist() == [3.0, 4.0, 5.0]
    assert got["unknown"] == b"kept"


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a",  # truncated length
        b"\x0a\x05\x0a\x03",  # length past the end
        _example([(b"f", _ld(2, _ld(1, b"\x00\x00\x80")))]),  # packed floats, 3 bytes
        _example([(b"i", _ld(3, _ld(1, b"\x80\x80")))]),  # unterminated packed varint
        _example([(b"\xff", _ld(1, _ld(1, b"v")))]),  # key not UTF-8
        b"\x0b",  # group wire type
        b"\x08" + b"\xff" * 11,  # overlong varint
    ],
)
def test_decode_malformed_raises_value_error(data):
    with pytest.raises(ValueError):
        decode_example(data)


# --------------------------------------------------------------------------- TensorFlow


def test_tensorflow_reads_our_file(tmp_path, sample, tf):
    x, y = sample
    path = tmp_path / "ours.tfrecord"
    write_example_file(path, {"x": _x_bytes(x), "y": y})
    spec = {
        "x": tf.io.FixedLenFeature([], tf.string),
        "y": tf.io.FixedLenFeature([4], tf.float32),
    }
    records = list(tf.data.TFRecordDataset(str(path), compression_type="GZIP"))
    assert len(records) == 1
    parsed = tf.io.parse_single_example(records[0], spec)
    got_x = tf.io.decode_raw(parsed["x"], tf.int16).numpy().reshape(SHAPE)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(parsed["y"].numpy(), y)


def test_we_read_tensorflow_file(tmp_path, sample, tf):
    x, y = sample
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_x_bytes(x)])),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=y.tolist())),
                "n": tf.train.Feature(int64_list=tf.train.Int64List(value=[-7, 0, 2**62])),
            }
        )
    )
    path = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        writer.write(example.SerializeToString())
    got = read_example_file(path)
    np.testing.assert_array_equal(np.frombuffer(got["x"], dtype="<i2").reshape(SHAPE), x)
    np.testing.assert_array_equal(got["y"], y)
    assert got["n"].tolist() == [-7, 0, 2**62]

    plain = tmp_path / "plain.tfrecord"
    with tf.io.TFRecordWriter(str(plain)) as writer:
        for i in range(3):
            writer.write(b"record %d" % i)
    assert list(read_records(plain, compression=None)) == [b"record 0", b"record 1", b"record 2"]


def test_encode_matches_tensorflow_bytes(sample, tf):
    x, y = sample
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_x_bytes(x)])),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=y.tolist())),
            }
        )
    )
    assert encode_example({"x": _x_bytes(x), "y": y}) == example.SerializeToString(
        deterministic=True
    )

    ints = [0, 1, 127, 128, -1, 2**63 - 1, -(2**63), 300]
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "i": tf.train.Feature(int64_list=tf.train.Int64List(value=ints)),
                "b": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"p", b"", b"q"])),
                "f": tf.train.Feature(float_list=tf.train.FloatList(value=[])),
            }
        )
    )
    ours = encode_example({"i": ints, "b": [b"p", b"", b"q"], "f": np.zeros(0, np.float32)})
    assert ours == example.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------- corruption


def _plain_file(tmp_path, sample, name="plain.tfrecord"):
    x, y = sample
    path = tmp_path / name
    write_example_file(path, {"x": _x_bytes(x), "y": y}, compression=None)
    return path


def test_truncated_gzip_file_every_length(tmp_path, sample):
    x, y = sample
    good = tmp_path / "good.tfrecord"
    write_example_file(good, {"x": _x_bytes(x), "y": y})
    raw = good.read_bytes()
    bad = tmp_path / "cut.tfrecord"
    messages = set()
    for n in range(len(raw)):  # every proper prefix, the empty file included
        bad.write_bytes(raw[:n])
        messages.add(_raises_kit_error(bad, read_example_file).split(": ", 1)[1])
        _raises_kit_error(bad, read_records)
    assert any("truncated gzip" in m for m in messages)
    assert any("empty file" in m for m in messages)


def test_truncated_tfrecord_inside_complete_gzip(tmp_path, sample):
    raw = _plain_file(tmp_path, sample).read_bytes()
    bad = tmp_path / "cut.tfrecord"
    bad.write_bytes(gzip.compress(raw[:1000]))  # valid gzip holding a cut record
    message = _raises_kit_error(bad, read_example_file)
    assert f"expected {len(raw) - 16} data bytes, got {1000 - 12}" in message


def test_truncated_plain_file_every_length(tmp_path, sample):
    raw = _plain_file(tmp_path, sample).read_bytes()
    bad = tmp_path / "cut.tfrecord"
    for n in range(1, len(raw)):
        bad.write_bytes(raw[:n])
        message = _raises_kit_error(bad, read_records, compression=None)
        assert "truncated TFRecord" in message


def test_flipped_data_byte_fails_data_crc(tmp_path, sample):
    path = _plain_file(tmp_path, sample)
    raw = bytearray(path.read_bytes())
    raw[12 + 100] ^= 0x01
    path.write_bytes(raw)
    message = _raises_kit_error(path, read_example_file, compression=None)
    assert "data CRC mismatch" in message


def test_flipped_length_byte_fails_length_crc(tmp_path, sample):
    path = _plain_file(tmp_path, sample)
    raw = bytearray(path.read_bytes())
    raw[1] ^= 0x01
    path.write_bytes(raw)
    message = _raises_kit_error(path, read_example_file, compression=None)
    assert "length CRC mismatch" in message


def test_every_flipped_byte_is_detected_uncompressed(tmp_path, sample):
    path = _plain_file(tmp_path, sample)
    raw = path.read_bytes()
    bad = tmp_path / "flip.tfrecord"
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        bad.write_bytes(flipped)
        _raises_kit_error(bad, read_example_file, compression=None)


def test_flipped_gzip_bytes_never_leak_other_errors(tmp_path, sample):
    x, y = sample
    good = tmp_path / "good.tfrecord"
    write_example_file(good, {"x": _x_bytes(x), "y": y})
    raw = good.read_bytes()
    expected = read_example_file(good)
    bad = tmp_path / "flip.tfrecord"
    detected = 0
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        bad.write_bytes(flipped)
        try:
            got = read_example_file(bad)
        except KitError as exc:
            assert "flip.tfrecord" in str(exc)
            detected += 1
        else:  # only harmless header bytes (mtime, flags, OS) may go unnoticed
            assert got["x"] == expected["x"] and np.array_equal(got["y"], expected["y"])
    assert detected >= len(raw) - 10


def test_not_gzip_and_empty_files(tmp_path, sample):
    plain = _plain_file(tmp_path, sample)
    assert "not a valid gzip stream" in _raises_kit_error(plain, read_example_file)
    assert "not a valid gzip stream" in _raises_kit_error(plain, read_records)

    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    _raises_kit_error(empty, read_records)  # GZIP: an empty file is no gzip stream
    assert "found none" in _raises_kit_error(empty, read_example_file, compression=None)
    assert list(read_records(empty, compression=None)) == []  # valid, zero records

    no_record = tmp_path / "zero.tfrecord"
    write_records(no_record, [])
    assert "found none" in _raises_kit_error(no_record, read_example_file)

    garbage = tmp_path / "garbage.tfrecord"
    garbage.write_bytes(gzip.compress(b"\x01\x02\x03"))  # shorter than a record header
    assert "shorter than a 12-byte header" in _raises_kit_error(garbage, read_example_file)

    trailing = tmp_path / "trailing.tfrecord"
    good = tmp_path / "good.tfrecord"
    write_example_file(good, {"y": [1.0]})
    trailing.write_bytes(good.read_bytes() + b"junk")
    assert "trailing garbage" in _raises_kit_error(trailing, read_example_file)


def test_malformed_example_and_missing_file(tmp_path):
    path = tmp_path / "notexample.tfrecord"
    write_records(path, [b"\x0a\x05\x0a"])
    assert "malformed tf.train.Example" in _raises_kit_error(path, read_example_file)
    assert "cannot read" in _raises_kit_error(tmp_path / "missing.tfrecord", read_records)


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.tfrecord"
    write_records(path, [b"old"])

    def records():
        yield b"new"
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError):
        write_records(path, records())
    assert list(read_records(path)) == [b"old"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.tfrecord"]
    missing_dir = tmp_path / "no_dir" / "f.tfrecord"
    assert "cannot write" in _raises_kit_error(missing_dir, write_records, [b"x"])
