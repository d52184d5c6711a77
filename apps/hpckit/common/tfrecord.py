"""TFRecord files and `tf.train.Example` messages, without TensorFlow.

CosmoFlow's public dataset stores one sample per GZIP-compressed TFRecord file holding
one serialized `tf.train.Example` (feature `x`: raw little-endian int16 bytes, feature
`y`: four float32). This module writes and reads that format byte-compatibly with
TensorFlow, so the PyTorch path never has to import TF.

Formats (facts from the public TFRecord and protobuf specifications):

* TFRecord framing, per record::

      uint64 length          little endian
      uint32 masked_crc32c(the 8 length bytes)
      byte   data[length]
      uint32 masked_crc32c(data)

  with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8  (mod 2**32)`` and
  CRC-32C (Castagnoli). With GZIP compression the whole framed stream is one gzip stream.

* ``Example { Features features = 1; }``,
  ``Features { map<string, Feature> feature = 1; }``,
  ``Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
  Int64List int64_list = 3; } }``, each list being ``repeated <type> value = 1``
  (floats and int64s packed when written).

Errors: the file-level functions raise `KitError` with one line naming the file;
`decode_example` raises `ValueError` (it does not know the file name);
`encode_example` raises `TypeError`/`ValueError` for values it cannot represent.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Union

import numpy as np

from hpckit.common.errors import KitError
from hpckit.common.fileio import atomic_path, create_exclusive

try:  # C / hardware-accelerated CRC-32C; pure Python would be far too slow for 33 MB samples
    from crc32c import crc32c as _crc32c_impl
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import google_crc32c as _google_crc32c

        def _crc32c_impl(data) -> int:
            return _google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)

    except ImportError:
        _crc32c_impl = None

__all__ = [
    "crc32c",
    "masked_crc32c",
    "encode_example",
    "decode_example",
    "write_records",
    "read_records",
    "write_example_file",
    "read_example_file",
]

FeatureValue = Union[bytes, np.ndarray, list]

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_HEADER = struct.Struct("<QI")  # length, masked crc of length
_FOOTER = struct.Struct("<I")  # masked crc of data
_HEADER_SIZE = _HEADER.size  # 12
_FOOTER_SIZE = _FOOTER.size  # 4
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


# --------------------------------------------------------------------------- CRC-32C


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object."""
    if _crc32c_impl is None:  # pragma: no cover - depends on what is installed
        raise ImportError(
            "hpckit.common.tfrecord needs a CRC-32C implementation: pip install crc32c"
        )
    return _crc32c_impl(data)


def masked_crc32c(data) -> int:
    """The masked CRC-32C that TFRecord stores next to lengths and payloads."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


# --------------------------------------------------------------------------- protobuf encoding


def _varint(value: int) -> bytes:
    """Unsigned varint (value must already be in [0, 2**64))."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _packed_varints(values: np.ndarray) -> bytes:
    """Varint-encode int64 values (two's complement, as protobuf does) in one vectorised pass."""
    u = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    if u.size == 0:
        return b""
    nbytes = np.ones(u.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += u >= np.uint64(1 << (7 * k))
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = ((u[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    ks = np.arange(10)[None, :]
    groups[ks < nbytes[:, None] - 1] |= 0x80
    return groups[ks < nbytes[:, None]].tobytes()


def _len_field(tag: int, payload_len: int) -> bytes:
    """Tag byte plus varint length of a length-delimited field (field numbers 1..3 here)."""
    return bytes((tag,)) + _varint(payload_len)


def _as_bytes_like(value) -> bytes | memoryview | None:
    """`value` as a flat byte buffer if it is a single bytes-like / str value, else None."""
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        return value if (value.format == "B" and value.ndim == 1) else value.cast("B")
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_):
        return bytes(value)
    return None


def _classify(name: str, value) -> tuple[str, object]:
    """Decide the Feature kind of one value: ('bytes', [buffers]) / ('float'|'int64', array)."""
    single = _as_bytes_like(value)
    if single is not None:
        return "bytes", [single]
    if isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, np.bytes_):
        value = [value]
    if isinstance(value, np.ndarray):
        arr = value
        if arr.dtype.kind in "SO":
            value = arr.ravel().tolist()
        else:
            return _numeric(name, arr)
    if isinstance(value, (list, tuple)):
        if len(value) == 0:
            raise ValueError(
                f"feature {name!r}: cannot infer the type of an empty list "
                "(pass an empty numpy array with a dtype)"
            )
        buffers = [_as_bytes_like(v) for v in value]
        if all(b is not None for b in buffers):
            return "bytes", buffers
        if any(b is not None for b in buffers):
            raise TypeError(f"feature {name!r}: list mixes bytes and numbers")
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"feature {name!r}: unsupported list value ({exc})") from None
        return _numeric(name, arr)
    raise TypeError(f"feature {name!r}: unsupported value type {type(value).__name__}")


def _numeric(name: str, arr: np.ndarray) -> tuple[str, np.ndarray]:
    kind = arr.dtype.kind
    if kind == "f":
        return "float", np.ascontiguousarray(arr, dtype="<f4").ravel()
    if kind in "iub":
        if kind == "u" and arr.size and arr.max() > _INT64_MAX:
            raise ValueError(f"feature {name!r}: value exceeds the int64 range")
        return "int64", np.ascontiguousarray(arr, dtype=np.int64).ravel()
    if kind == "O":  # e.g. Python ints too large for any numpy integer type
        ints = arr.ravel().tolist()
        if all(isinstance(v, int) for v in ints):
            if any(v < _INT64_MIN or v > _INT64_MAX for v in ints):
                raise ValueError(f"feature {name!r}: value exceeds the int64 range")
            return "int64", np.asarray(ints, dtype=np.int64)
    raise TypeError(f"feature {name!r}: unsupported dtype {arr.dtype}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a `tf.train.Example` holding `features`, keys in sorted order.

    * bytes / bytearray / memoryview / str -> bytes_list with one value;
      a list of bytes -> bytes_list with those values;
    * float arrays, lists or scalars -> float_list (float32, packed);
    * integer / bool arrays, lists or scalars -> int64_list (packed varints).

    Arrays are flattened in C order. To store an array's raw bytes (as CosmoFlow's `x`),
    pass ``arr.astype('<i2').tobytes()``. The result equals TensorFlow's
    ``Example.SerializeToString(deterministic=True)`` for the same features.
    """
    pieces: list = []
    entries = []  # (header pieces, payload pieces, entry length) per key
    for name in sorted(features):
        if not isinstance(name, str):
            raise TypeError(f"feature names must be str, got {type(name).__name__}")
        kind, data = _classify(name, features[name])
        if kind == "bytes":
            inner: list = []
            for buf in data:
                n = buf.nbytes if isinstance(buf, memoryview) else len(buf)
                inner += [_len_field(0x0A, n), buf]
            list_tag = 0x0A
        else:
            payload = data.tobytes() if kind == "float" else _packed_varints(data)
            inner = [_len_field(0x0A, len(payload)), payload] if payload else []
            list_tag = 0x12 if kind == "float" else 0x1A
        list_len = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in inner)
        feature_head = _len_field(list_tag, list_len)  # Feature = one oneof field
        feature_len = len(feature_head) + list_len
        key = name.encode("utf-8")
        entry_head = _len_field(0x0A, len(key)) + key + _len_field(0x12, feature_len)
        entry_len = len(entry_head) + feature_len
        entries.append(([_len_field(0x0A, entry_len), entry_head, feature_head], inner, entry_len))

    features_len = sum(len(e[0][0]) + e[2] for e in entries)
    pieces.append(_len_field(0x0A, features_len))  # Example.features
    for heads, inner, _ in entries:
        pieces += heads
        pieces += inner
    return b"".join(pieces)


# --------------------------------------------------------------------------- protobuf decoding


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, object]]:
    """Yield (field number, wire type, value) over buf[pos:end].

    value is an int for varint/fixed fields and a (start, stop) pair for length-delimited ones.
    """
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, pos = _read_varint(buf, pos, end)
        elif wire == 2:
            n, pos = _read_varint(buf, pos, end)
            if n > end - pos:
                raise ValueError(f"field {field}: length {n} runs past the end of its message")
            value = (pos, pos + n)
            pos += n
        elif wire == 5:
            if end - pos < 4:
                raise ValueError("truncated fixed32 field")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        elif wire == 1:
            if end - pos < 8:
                raise ValueError("truncated fixed64 field")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        else:
            raise ValueError(f"field {field}: unsupported wire type {wire}")
        yield field, wire, value


def _decode_varints(payload: memoryview) -> np.ndarray:
    """Vectorised decode of packed varints into int64 (two's complement)."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    if raw.size == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(raw < 0x80)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        raise ValueError("truncated packed varint")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise ValueError("varint longer than 10 bytes")
    values = np.zeros(ends.size, dtype=np.uint64)
    for k in range(int(lengths.max())):
        sel = lengths > k
        group = (raw[starts[sel] + k] & 0x7F).astype(np.uint64)
        values[sel] |= group << np.uint64(7 * k)
    return values.view(np.int64)


def _signed64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def _decode_feature(buf: memoryview, pos: int, end: int):
    kind = None
    parts: list = []
    for field, wire, value in _fields(buf, pos, end):
        if wire != 2 or field not in (1, 2, 3):
            continue  # unknown field: skipped, as protobuf does
        if field != kind:  # a different oneof member replaces the previous one
            kind, parts = field, []
        lo, hi = value
        for f, w, v in _fields(buf, lo, hi):
            if f != 1:
                continue
            if kind == 1:  # BytesList
                if w != 2:
                    raise ValueError(f"bytes_list value with wire type {w}")
                parts.append(bytes(buf[v[0] : v[1]]))
            elif kind == 2:  # FloatList: packed (wire 2) or one fixed32 per value (wire 5)
                if w == 2:
                    if (v[1] - v[0]) % 4:
                        raise ValueError("packed float_list length is not a multiple of 4")
                    parts.append(np.frombuffer(buf[v[0] : v[1]], dtype="<f4"))
                elif w == 5:
                    parts.append(np.array([v], dtype=np.uint32).view(np.float32))
                else:
                    raise ValueError(f"float_list value with wire type {w}")
            else:  # Int64List: packed (wire 2) or one varint per value (wire 0)
                if w == 2:
                    parts.append(_decode_varints(buf[v[0] : v[1]]))
                elif w == 0:
                    parts.append(np.array([_signed64(v)], dtype=np.int64))
                else:
                    raise ValueError(f"int64_list value with wire type {w}")
    if kind is None:
        return []  # Feature with no kind set: an empty list
    if kind == 1:
        return parts[0] if len(parts) == 1 else parts
    dtype = np.float32 if kind == 2 else np.int64
    if not parts:
        return np.empty(0, dtype=dtype)
    if len(parts) == 1:
        return parts[0].astype(dtype)  # a writable, native-order copy
    return np.concatenate(parts).astype(dtype, copy=False)


def decode_example(data) -> dict[str, FeatureValue]:
    """Parse a serialized `tf.train.Example` (any bytes-like object).

    bytes_list -> the bytes when it holds one value, else a list of bytes;
    float_list -> np.float32 array; int64_list -> np.int64 array (both fresh, writable);
    a Feature with no kind set -> []. Packed and unpacked repeated encodings are both accepted,
    unknown fields are skipped. Raises ValueError on malformed input.
    """
    buf = memoryview(data)
    if buf.format != "B" or buf.ndim != 1:
        buf = buf.cast("B")
    out: dict[str, FeatureValue] = {}
    for field, wire, value in _fields(buf, 0, len(buf)):
        if field != 1 or wire != 2:
            continue
        for f, w, v in _fields(buf, *value):  # Features
            if f != 1 or w != 2:
                continue
            key = ""
            feature = None
            for ef, ew, ev in _fields(buf, *v):  # map entry: key = 1, value = 2
                if ef == 1 and ew == 2:
                    try:
                        key = bytes(buf[ev[0] : ev[1]]).decode("utf-8")
                    except UnicodeDecodeError:
                        raise ValueError("feature name is not valid UTF-8") from None
                elif ef == 2 and ew == 2:
                    feature = ev
            out[key] = [] if feature is None else _decode_feature(buf, *feature)
    return out


# --------------------------------------------------------------------------- TFRecord framing


def _normalize_compression(compression: str | None) -> str:
    c = (compression or "").upper()
    if c in ("", "NONE"):
        return ""
    if c in ("GZIP", "ZLIB"):
        return c
    raise ValueError(f"unknown TFRecord compression {compression!r} (use 'GZIP', 'ZLIB' or None)")


def _frame(record) -> tuple[bytes, object, bytes]:
    n = record.nbytes if isinstance(record, memoryview) else len(record)
    length = struct.pack("<Q", n)
    header = length + struct.pack("<I", masked_crc32c(length))
    return header, record, _FOOTER.pack(masked_crc32c(record))


def write_records(
    path,
    records: Iterable[bytes],
    compression: str | None = "GZIP",
    *,
    level: int = 6,
) -> int:
    """Write `records` as a TFRecord file; returns the number of records written.

    compression: "GZIP" (default, as CosmoFlow's files), "ZLIB", or None / "" / "NONE".
    `level` is the zlib compression level (TF's default is 6). The gzip header carries no
    name and mtime 0, so equal inputs give equal files. The file is written to a temporary
    name in the same directory and moved into place with os.replace, so readers never see
    a partial file. An OSError (missing directory, no space...) is raised as KitError.
    """
    comp = _normalize_compression(compression)
    compressor = None
    if comp:
        wbits = 31 if comp == "GZIP" else 15
        compressor = zlib.compressobj(level, zlib.DEFLATED, wbits)
    count = 0
    try:
        with atomic_path(path, fsync=False) as tmp, create_exclusive(tmp) as f:
            for record in records:
                if isinstance(record, memoryview) and (record.format != "B" or record.ndim != 1):
                    record = record.cast("B")
                elif not isinstance(record, (bytes, bytearray, memoryview)):
                    raise TypeError(f"TFRecord records must be bytes, got {type(record).__name__}")
                for part in _frame(record):
                    f.write(compressor.compress(part) if compressor else part)
                count += 1
            if compressor:
                f.write(compressor.flush())
    except OSError as exc:
        raise KitError(f"{os.fspath(path)}: cannot write ({exc.strerror or exc})") from None
    return count



def _decompress(path: str, raw: bytes, comp: str) -> bytes:
    """Whole-stream decompression; concatenated gzip members are accepted (as gzip(1) does)."""
    wbits = 31 if comp == "GZIP" else 15
    what = "gzip" if comp == "GZIP" else "zlib"
    if not raw:
        raise KitError(f"{path}: empty file, not a {what} stream")
    chunks = []
    data = raw
    while True:
        d = zlib.decompressobj(wbits)
        try:
            chunks.append(d.decompress(data))
        except zlib.error as exc:
            if chunks:  # a later "member" that is not gzip: garbage after the stream
                raise KitError(
                    f"{path}: {len(data)} bytes of trailing garbage after the {what} stream"
                ) from None
            raise KitError(f"{path}: not a valid {what} stream ({exc})") from None
        if not d.eof:
            raise KitError(f"{path}: truncated {what} stream")
        data = d.unused_data
        if not data or not data.strip(b"\0"):
            break  # zero padding after the last member is ignored, as gzip does
        if comp != "GZIP":
            raise KitError(
                f"{path}: {len(data)} bytes of trailing garbage after the {what} stream"
            )
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _load(path, compression: str | None) -> tuple[str, bytes]:
    """The file's bytes, decompressed. compression "AUTO": GZIP when the file starts with
    the gzip magic, else none, decided per file (a bad file never makes a good one look bad)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise KitError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if (compression or "").upper() == "AUTO":
        comp = "GZIP" if raw[:2] == b"\x1f\x8b" else ""
    else:
        comp = _normalize_compression(compression)
    return path, (_decompress(path, raw, comp) if comp else raw)


def _record_views(path: str, buf: bytes) -> Iterator[memoryview]:
    """Yield each record's data as a memoryview into buf, checking the framing and both CRCs."""
    view = memoryview(buf)
    total = len(view)
    pos = 0
    index = 0
    while pos < total:
        left = total - pos
        if left < _HEADER_SIZE:
            raise KitError(
                f"{path}: truncated TFRecord (record {index}: {left} trailing bytes, "
                f"shorter than a {_HEADER_SIZE}-byte header)"
            )
        length, length_crc = _HEADER.unpack_from(view, pos)
        if masked_crc32c(view[pos : pos + 8]) != length_crc:
            raise KitError(
                f"{path}: corrupt TFRecord (record {index} at byte {pos}: length CRC mismatch)"
            )
        start = pos + _HEADER_SIZE
        have = total - start
        if have < length:
            raise KitError(
                f"{path}: truncated TFRecord (record {index}: expected {length} data bytes, "
                f"got {have})"
            )
        stop = start + length
        if total - stop < _FOOTER_SIZE:
            raise KitError(f"{path}: truncated TFRecord (record {index}: data CRC missing)")
        data = view[start:stop]
        (data_crc,) = _FOOTER.unpack_from(view, stop)
        if masked_crc32c(data) != data_crc:
            raise KitError(
                f"{path}: corrupt TFRecord (record {index} at byte {pos}: data CRC mismatch)"
            )
        yield data
        pos = stop + _FOOTER_SIZE
        index += 1


def read_records(path, compression: str | None = "GZIP") -> Iterator[bytes]:
    """Iterate over the records of a TFRecord file, verifying both CRCs of each.

    The file is read (and decompressed) when this is called, so a missing or non-gzip file
    fails here; framing problems surface while iterating, before the bad record is yielded.
    Every problem is a one-line KitError naming the file. An uncompressed empty file is a
    valid TFRecord file with no records.
    """
    path, buf = _load(path, compression)
    return (bytes(v) for v in _record_views(path, buf))


def write_example_file(
    path,
    features: Mapping[str, FeatureValue],
    compression: str | None = "GZIP",
    *,
    level: int = 6,
) -> None:
    """Write one `tf.train.Example` as the only record of a TFRecord file (atomically)."""
    write_records(path, [encode_example(features)], compression, level=level)


def read_example_file(path, compression: str | None = "GZIP") -> dict[str, FeatureValue]:
    """Read the single `tf.train.Example` of a one-sample TFRecord file (CosmoFlow's layout).

    Raises KitError if the file holds no record, more than one, or a malformed Example.
    """
    path, buf = _load(path, compression)
    views = list(_record_views(path, buf))
    if len(views) != 1:
        raise KitError(
            f"{path}: expected exactly one TFRecord record, found "
            f"{'none' if not views else len(views)}"
        )
    try:
        return decode_example(views[0])
    except ValueError as exc:
        raise KitError(f"{path}: malformed tf.train.Example ({exc})") from None
