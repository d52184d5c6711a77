"""OC20 records as the reference stores them, written and read without PyG.

On disk (mlcommons/hpc@2c627d4 open_catalyst/scripts/preprocess_ef.py:23-76,101-104): a
directory per split of `data.%04d.lmdb` files, each an LMDB environment opened with
subdir=False; keys the ASCII decimal indices "0".."N-1" and "length" (a pickled int N);
each value `pickle.dumps(data_object, protocol=-1)` of a torch_geometric.data.Data. The
reader opens them as the reference's TrajectoryLmdbDataset does
(ocpmodels/datasets/trajectory_lmdb.py:37-56,84-94: sorted *.lmdb, readonly, lock=False,
the "length" entry).

The Data's fields and dtypes (ocpmodels/preprocessing/atoms_to_graphs.py:136-176 with
r_edges, r_energy, r_forces, r_fixed; preprocess_ef.py:48-56): pos float32 (N, 3),
atomic_numbers float32 (N,), cell float32 (1, 3, 3), natoms int, edge_index int64 (2, E)
rows [neighbour, centre], cell_offsets int64 (E, 3), y float (energy, reference energy
subtracted), force float32 (N, 3), fixed float32 (N,) 1 for fixed atoms, tags int64 (N,),
sid int, fid int.

PyG is not installed here (it needs compiled extensions), so the pickles are made and read
by name:
  * written: the class is emitted as the global torch_geometric.data.data.Data, its state
    the attribute dict PyG 1.7's Data.__init__ leaves (x, edge_index, edge_attr, y, pos,
    normal, face first, None where unset, then the fields in the order the preprocessing
    sets them): the bytes pickle.dumps makes of the reference's objects, which PyG 1.x
    unpickles, and PyG 2.x too once converted as fairchem converts them;
  * read: an Unpickler maps torch_geometric's classes to stand-ins and takes the fields as
    fairchem's loader does for the published PyG 1.x pickles (FAIR-Chem/fairchem@fe75b27
    src/fairchem/core/common/utils.py:76-84 `pyg2_data_transform`, called on every record
    by src/fairchem/core/datasets/lmdb_dataset.py `LmdbDataset.__getitem__`): a Data
    without a `_store` (PyG 1.x) is its attribute dict, not-None values only; a PyG 2.x
    Data's fields are its `_store` mapping. Only torch's tensor-rebuilding functions and
    these classes may be named by a record: anything else is refused (a corrupt or foreign
    record is one line, and no code is run by reading data). The "length" entry is read by
    an unpickler that allows no name at all: an int, and nothing else.

An LMDB file is mapped into memory, and a page read past the end of a shorter file is
SIGBUS, not an error LMDB could return. Before a file is opened its size is checked against
what its meta pages say it holds (`check_lmdb_size`: the last page in use, the page size),
so a file cut short (an interrupted copy) is one line naming it; before a key is read, the
pages LMDB will pass to find it and the value's extent are checked with pread
(`value_extent`), so a damaged node (a flipped byte in a size) is one line naming the file
and key, not a copy from past the end of the file.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpckit.common import rawread
from hpckit.common.errors import KitError, disk_error

PYG_MODULE = "torch_geometric.data.data"
PYG_CLASS = "Data"
LENGTH_KEY = b"length"
FILE_PATTERN = "data.%04d.lmdb"
MAP_SIZE = 1 << 40    # the reference's map_size is 2 TiB (sparse: the file grows with its content)

# field -> (kind, dtype name, shape spec) as the reference writes them; N atoms, E edges
FIELDS = {
    "pos": ("tensor", "float32", ("N", 3)),
    "atomic_numbers": ("tensor", "float32", ("N",)),
    "cell": ("tensor", "float32", (1, 3, 3)),
    "natoms": ("int", None, None),
    "edge_index": ("tensor", "int64", (2, "E")),
    "cell_offsets": ("tensor", "int64", ("E", 3)),
    "y": ("float", None, None),
    "force": ("tensor", "float32", ("N", 3)),
    "fixed": ("tensor", "float32", ("N",)),
    "tags": ("tensor", "int64", ("N",)),
    "sid": ("int", None, None),
    "fid": ("int", None, None),
}
GRAPH_FIELDS = ("edge_index", "cell_offsets")   # absent from LMDBs made without --get-edges
# PyG 1.7's Data.__init__ attributes, in order, before the keyword fields
PYG1_SLOTS = ("x", "edge_index", "edge_attr", "y", "pos", "normal", "face")


# ----------------------------------------------------------------- writing

class _Data:
    """What the writer pickles as torch_geometric.data.data.Data: its __dict__ is the state."""

    def __init__(self, state: dict):
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol):
        import copyreg
        return copyreg.__newobj__, (type(self),), dict(self.__dict__)


class _RecordPickler(pickle._Pickler):
    """The standard pickler, but the stand-in class is written as the global
    torch_geometric.data.data.Data (what pickle writes for PyG's own class: STACK_GLOBAL of
    the module and the name), without PyG installed to look it up."""

    def save_global(self, obj, name=None):
        if obj is _Data:
            self.save(PYG_MODULE)
            self.save(PYG_CLASS)
            self.write(pickle.STACK_GLOBAL)
            self.memoize(obj)
            return
        super().save_global(obj, name)


def data_state(fields: dict) -> dict:
    """The attribute dict of the reference's Data for these fields (see module doc)."""
    state = {k: None for k in PYG1_SLOTS}
    for key in ("cell", "pos", "atomic_numbers", "natoms", "edge_index", "cell_offsets", "y", "force", "fixed",
                "tags", "sid", "fid"):
        if key in fields:
            state[key] = fields[key]
    for key, value in fields.items():   # anything else the caller adds, after
        state.setdefault(key, value)
    return state


def dumps_record(fields: dict) -> bytes:
    """pickle.dumps(Data(**fields), protocol=-1) as the reference's preprocessing makes it."""
    buf = io.BytesIO()
    _RecordPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(_Data(data_state(fields)))
    return buf.getvalue()


def write_lmdb(path: Path, records, mode: int = 0o755) -> int:
    """One data.NNNN.lmdb: keys "0".."N-1" and "length" (preprocess_ef.py:58-70). The file
    must not exist (the caller writes into a directory it created); `records` an iterable
    of pickled records, written as they come; the file is created with permission bits
    `mode` less the umask (py-lmdb's default 0o755 unless given). Returns the file's size."""
    import lmdb
    if path.exists():
        raise KitError(f"{path}: exists; datagen writes only into a new directory")
    try:
        env = lmdb.open(str(path), map_size=MAP_SIZE, subdir=False, meminit=False, map_async=True, mode=mode)
        try:
            with env.begin(write=True) as txn:
                n = 0
                for rec in records:
                    txn.put(f"{n}".encode("ascii"), rec)
                    n += 1
                txn.put(LENGTH_KEY, pickle.dumps(n, protocol=-1))
            env.sync()
        finally:
            env.close()
    except BaseException as e:   # complete or absent: what this call wrote goes
        for made in (path, Path(str(path) + "-lock")):
            try:
                made.unlink()
            except OSError:
                pass
        if isinstance(e, lmdb.Error):
            raise _write_error(e, path) from None
        raise
    lock = Path(str(path) + "-lock")
    if lock.exists():   # subdir=False with locking leaves data.NNNN.lmdb-lock beside it
        lock.unlink()
    return path.stat().st_size


def _write_error(e: Exception, path: Path) -> KitError:
    """LMDB's failure to write `path` as one line; a full disk as one (disk_error): LMDB
    reports ENOSPC where a write failed outright (lmdb.DiskError) but EIO where it was cut
    short, so the file system's free space decides (none left: it was full)."""
    import errno

    import lmdb
    try:
        st = os.statvfs(path.parent)
        full = st.f_bavail * st.f_frsize < (1 << 16)
    except OSError:
        full = False
    if isinstance(e, lmdb.DiskError) or full:
        return disk_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path)
    return KitError(f"{path}: writing the LMDB failed ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


# ----------------------------------------------------------------- reading

class _Stored:
    """Stand-in for a torch_geometric class while unpickling: keeps the state it is given."""

    pyg_name = ""

    def __init__(self, *args, **kwargs):
        self.__dict__["_args"] = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and state[1] is None:   # (dict, slots) form
            state = state[0]
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


def _stand_in(name: str) -> type:
    return type(f"PyG_{name}", (_Stored,), {"pyg_name": name})


_STAND_INS: dict[tuple[str, str], type] = {}


def _load_from_bytes(b: bytes):
    import warnings

    import torch
    with warnings.catch_warnings():   # a reader prints nothing: torch warns of a damaged header it reads anyway
        warnings.simplefilter("ignore")
        return torch.load(io.BytesIO(b), weights_only=True)


class RecordUnpickler(pickle.Unpickler):
    """Unpickles a record allowing only torch's tensor rebuilding and torch_geometric's
    classes (as stand-ins)."""

    def find_class(self, module, name):
        if module.split(".")[0] == "torch_geometric":
            return _STAND_INS.setdefault((module, name), _stand_in(name))
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _load_from_bytes
        if (module, name) in (("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"),
                              ("collections", "OrderedDict"), ("torch", "Size")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which an OC20 record does not hold")


def record_fields(obj) -> dict:
    """The fields of an unpickled Data (1.x: the attribute dict, not-None values; 2.x: the
    `_store` mapping), as fairchem's pyg2_data_transform takes them."""
    if not isinstance(obj, _Stored) or obj.pyg_name != PYG_CLASS:
        raise ValueError(f"the value is a {type(obj).__name__}, not a torch_geometric Data")
    source = obj.__dict__
    if "_store" in source:
        store = source["_store"]
        source = getattr(store, "__dict__", {}).get("_mapping", store if isinstance(store, dict) else {})
    return {k: v for k, v in source.items() if v is not None and not k.startswith("_")}


def loads_record(raw: bytes) -> dict:
    return record_fields(RecordUnpickler(io.BytesIO(raw)).load())


def _shape_ok(shape, spec, sizes: dict) -> bool:
    if len(shape) != len(spec):
        return False
    for got, want in zip(shape, spec):
        if isinstance(want, str):
            if sizes.setdefault(want, got) != got:
                return False
        elif got != want:
            return False
    return True


def check_fields(fields: dict, where: str, need_graph: bool = True) -> dict:
    """The record's fields, checked against the reference's (FIELDS): present, dtype,
    shape, finite, consistent sizes; KitError naming `where` (file and key) and the field."""
    import torch
    sizes: dict = {}
    for key, (kind, dtype, spec) in FIELDS.items():
        if key not in fields:
            if key in GRAPH_FIELDS and not need_graph:
                continue
            extra = (" (LMDBs made without --get-edges hold no graph: set model.otf_graph=true)"
                     if key in GRAPH_FIELDS else "")
            raise KitError(f"{where}: the record has no field '{key}'{extra}")
        v = fields[key]
        if kind == "tensor":
            if not isinstance(v, torch.Tensor):
                raise KitError(f"{where}: field '{key}' is a {type(v).__name__}, expected a {dtype} tensor")
            if str(v.dtype).replace("torch.", "") != dtype:
                raise KitError(f"{where}: field '{key}' is {str(v.dtype).replace('torch.', '')}, expected {dtype}")
            if not _shape_ok(tuple(v.shape), spec, sizes):
                raise KitError(f"{where}: field '{key}' has shape {tuple(v.shape)}, expected "
                               f"{tuple(spec)} (N atoms, E edges: {sizes or 'not yet known'})")
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise KitError(f"{where}: field '{key}' holds a non-finite value")
        elif kind == "int":
            if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise KitError(f"{where}: field '{key}' is a {type(v).__name__}, expected an integer")
        else:
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = float(v)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not np.isfinite(v):
                raise KitError(f"{where}: field '{key}' is {v!r}, expected a finite number")
    if int(fields["natoms"]) != sizes.get("N"):
        raise KitError(f"{where}: field 'natoms' is {fields['natoms']}, but 'pos' holds {sizes.get('N')} atoms")
    n = sizes["N"]
    z = fields["atomic_numbers"]
    if bool(((z < 1) | (z > 94) | (z != z.round())).any()):
        raise KitError(f"{where}: field 'atomic_numbers' holds a value that is not an element 1..94")
    if "edge_index" in fields:
        e = fields["edge_index"]
        if e.numel() and (int(e.min()) < 0 or int(e.max()) >= n):
            raise KitError(f"{where}: field 'edge_index' refers to an atom outside 0..{n - 1}")
    return fields


class LengthUnpickler(pickle.Unpickler):
    """Unpickles the "length" entry: it holds an int (pickle.dumps(n, protocol=-1)), which
    names no class or function; a pickle that names one is refused before anything runs."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a record count does not hold")


def loads_length(raw: bytes, where: str) -> int:
    """The record count pickled in a file's "length" entry; KitError naming `where` (file
    and key) for anything but an int >= 0."""
    try:
        n = LengthUnpickler(io.BytesIO(raw)).load()
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise KitError(f"{where}: not a pickled record count ({first})") from None
    if type(n) is not int or n < 0:
        shown = repr(n) if isinstance(n, (int, float, str, bytes)) and len(repr(n)) <= 40 else f"a {type(n).__name__}"
        raise KitError(f"{where}: does not hold a record count (it holds {shown})")
    return n


# LMDB 0.9's on-disk layout (liblmdb mdb.c: MDB_page, MDB_meta, MDB_db, MDB_node), in the
# native byte order and 64-bit sizes the library writes. A page: pgno, pad, flags, lower,
# upper, then `lower` bytes of node offsets. A meta page (pages 0 and 1): magic, version,
# address, mapsize, the free DB's record (its md_pad is the page size), the main DB's (pad,
# flags, depth, page counts, entries, root), last_pg, txnid. A node: lo, hi, flags, ksize,
# the key, then the data (a branch node's child is lo | hi << 16 | flags << 32; a leaf's
# data size is lo | hi << 16, F_BIGDATA: the data is on overflow pages from the pgno that
# follows the key, after their 16-byte header).
_META = struct.Struct("=Q2xH4xII8xQI44x4xHH32xQQQ")
_PAGE = struct.Struct("=Q2xHHH")
_NODE = struct.Struct("=HHHH")
_PAGE_HEAD = 16
_P_BRANCH, _P_LEAF, _P_META = 0x01, 0x02, 0x08
_PAGE_KINDS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40   # branch, leaf, overflow, meta, leaf2, sub-page
_F_BIGDATA, _F_DUPDATA = 0x01, 0x04
_MDB_MAGIC = 0xBEEFC0DE
_MDB_VERSION = 1
_P_INVALID = (1 << 64) - 1
_MAX_DEPTH = 64


@dataclass(frozen=True)
class _Meta:
    psize: int
    db_flags: int       # the main DB's flags (the reference's files: none)
    root: int
    last_pg: int
    txnid: int


def _meta(head: bytes) -> _Meta | None:
    """One meta page's fields, or None where it is not one."""
    if len(head) < _META.size:
        return None
    _pgno, flags, magic, version, _mapsize, psize, db_flags, _depth, root, last_pg, txnid = _META.unpack_from(head)
    if not flags & _P_META or magic != _MDB_MAGIC or version != _MDB_VERSION:
        return None
    return _Meta(psize, db_flags, root, last_pg, txnid)


def check_lmdb_size(path: Path, fd: int, size: int) -> _Meta | None:
    """The newest meta page of the LMDB file open as `fd` (as mdb_env_open picks it), once
    the file is known to hold the pages it says it uses (0..last_pg); KitError naming the
    file when it is shorter: LMDB maps the file and would read the missing pages from
    unmapped memory (SIGBUS). The meta pages are read with pread, before any mapping; None
    where they are not LMDB's (lmdb.open then refuses the file in one line)."""
    try:
        first = _meta(os.pread(fd, _META.size, 0))
        if first is None:
            return None
        psize = first.psize
        if psize < _META.size or psize > 1 << 16 or psize & (psize - 1):
            raise KitError(f"{path}: not a readable LMDB file (page size {psize} in its header)")
        second = _meta(os.pread(fd, _META.size, psize))
    except OSError as e:
        raise KitError(f"{path}: cannot read ({e.strerror or e})") from None
    if second is None:
        return None
    meta = second if second.txnid > first.txnid else first
    if meta.psize != psize:
        raise KitError(f"{path}: damaged: its two LMDB meta pages give page sizes {psize} and {second.psize}")
    need = (meta.last_pg + 1) * psize
    if size < need:
        raise KitError(f"{path}: truncated: its LMDB header says it holds {meta.last_pg + 1} pages of "
                       f"{meta.psize} bytes ({need} bytes), the file has {size} (an interrupted copy?)")
    if meta.db_flags:
        raise KitError(f"{path}: not an OC20 LMDB file (its main database has flags {meta.db_flags:#x}; "
                       "the reference's hold plain keys and values)")
    return meta


def value_extent(path: Path, fd: int, size: int, meta: _Meta, key: bytes) -> tuple[int, int] | None:
    """(offset, length) in the file of the value under `key`, found as mdb_get finds it but
    with pread: from the main DB's root down, each page searched with mdb_node_search's
    binary search (keys ordered as bytes, LMDB's default), so the nodes looked at are the
    ones LMDB will look at, each checked first: its header and key within its page, the
    page it leads to within the file, the value within its page or the file. None: no such
    key. KitError naming the file and key: a damaged file, which LMDB would read past the
    end of a page or of the file. Then lmdb's own reading of the key touches nothing
    outside the file."""
    where = f"{path} key '{key.decode('ascii', 'replace')}'"
    psize, pgno = meta.psize, meta.root
    if pgno == _P_INVALID:   # an empty database
        return None
    for _ in range(_MAX_DEPTH):
        if pgno > meta.last_pg:
            raise KitError(f"{where}: damaged: a page refers to page {pgno}, past the last ({meta.last_pg})")
        try:
            page = os.pread(fd, psize, pgno * psize)
        except OSError as e:
            raise KitError(f"{where}: cannot read ({e.strerror or e})") from None
        if len(page) < psize:
            raise KitError(f"{where}: truncated: page {pgno} ends past the end of the file")
        _pgno, flags, lower, _upper = _PAGE.unpack_from(page)
        n = (lower - _PAGE_HEAD) >> 1
        leaf = flags & _PAGE_KINDS == _P_LEAF
        if not (leaf or flags & _PAGE_KINDS == _P_BRANCH) or lower > psize or n < 1:
            raise KitError(f"{where}: damaged: page {pgno} is not a branch or leaf page of the B-tree")

        def node(i: int) -> tuple[int, int, int, int, int]:
            """(offset in the page, lo, hi, flags, key size) of node i, checked to lie in the page."""
            ptr, = struct.unpack_from("=H", page, _PAGE_HEAD + 2 * i)
            if ptr + _NODE.size > psize or ptr + _NODE.size + _NODE.unpack_from(page, ptr)[3] > psize:
                raise KitError(f"{where}: damaged: page {pgno} has a node past its end")
            return (ptr, *_NODE.unpack_from(page, ptr))

        # mdb_node_search: a branch page's first key is not compared
        low, high, i, rc = (0 if leaf else 1), n - 1, 0, 0
        while low <= high:
            i = (low + high) >> 1
            ptr, _, _, _, ksize = node(i)
            found = page[ptr + _NODE.size:ptr + _NODE.size + ksize]
            rc = (key > found) - (key < found)
            if rc == 0:
                break
            low, high = (i + 1, high) if rc > 0 else (low, i - 1)
        if rc > 0:
            i += 1   # the first key larger, or none (i == n)
        if not leaf:   # mdb_page_search_root: the last key <= `key`
            _, lo, hi, nflags, _ = node(n - 1 if i == n else i if rc == 0 else i - 1)
            pgno = lo | hi << 16 | nflags << 32
            continue
        if rc != 0 or i == n:
            return None
        ptr, lo, hi, nflags, ksize = node(i)
        length, data = lo | hi << 16, ptr + _NODE.size + ksize
        if nflags & _F_DUPDATA:
            raise KitError(f"{where}: not an OC20 LMDB file (the key holds several values)")
        if not nflags & _F_BIGDATA:
            if data + length > psize:
                raise KitError(f"{where}: damaged: its value of {length} bytes reaches past the end of page {pgno}")
            return pgno * psize + data, length
        if data + 8 > psize:
            raise KitError(f"{where}: damaged: page {pgno} has a node past its end")
        overflow, = struct.unpack_from("=Q", page, data)
        offset = overflow * psize + _PAGE_HEAD
        if overflow > meta.last_pg or offset + length > size:
            raise KitError(f"{where}: damaged: its value of {length} bytes at byte {offset} reaches past the end "
                           f"of the file ({size} bytes)")
        return offset, length
    raise KitError(f"{where}: damaged: the B-tree is deeper than {_MAX_DEPTH} pages")


@dataclass
class _Opened:
    """A file open in this process: its environment, and what the checks need."""
    env: object
    fd: int
    size: int
    meta: _Meta


_OPEN: dict[tuple[int, str], _Opened] = {}   # (pid, path) -> open file: py-lmdb opens a file once per process


class LmdbFile:
    """One data.NNNN.lmdb, opened read-only as the reference opens it, once per process
    (an LMDB environment must not cross a fork, nor be opened twice in one process). Opened
    after check_lmdb_size, every key read after value_extent: a truncated or damaged file
    is one line naming it, never a read past its end."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _open(self) -> _Opened:
        import lmdb
        key = (os.getpid(), str(self.path.resolve()))
        if key not in _OPEN:
            fd, st = rawread.open_regular(self.path)   # a FIFO or a directory is refused here
            try:
                meta = check_lmdb_size(self.path, fd, st.st_size)
                try:
                    env = lmdb.open(str(self.path), subdir=False, readonly=True, lock=False, readahead=False,
                                    meminit=False, max_readers=1)
                except lmdb.Error as e:
                    raise KitError(f"{self.path}: not a readable LMDB file ({str(e).splitlines()[0]})") from None
                if meta is None:   # LMDB took meta pages the check did not: no file LMDB 0.9 writes
                    env.close()
                    raise KitError(f"{self.path}: not a readable LMDB file (its meta pages are not LMDB 0.9's)")
            except BaseException:
                os.close(fd)
                raise
            _OPEN[key] = _Opened(env, fd, st.st_size, meta)
        return _OPEN[key]

    def env(self):
        return self._open().env

    def _value(self, key: bytes, where: str) -> bytes | None:
        """The value under `key` (value_extent first, against the file's size now: a file cut
        while it is read, as a copy over it does, is refused at its next key; then lmdb's get)."""
        import lmdb
        opened = self._open()
        try:
            size = min(opened.size, os.fstat(opened.fd).st_size)
        except OSError as e:
            raise KitError(f"{where}: cannot read ({e.strerror or e})") from None
        if value_extent(self.path, opened.fd, size, opened.meta, key) is None:
            return None
        try:
            with opened.env.begin() as txn:
                return txn.get(key)
        except lmdb.Error as e:
            raise KitError(f"{where}: cannot read ({str(e).splitlines()[0]})") from None

    def length(self) -> int:
        raw = self._value(LENGTH_KEY, f"{self.path} key 'length'")
        if raw is None:
            raise KitError(f"{self.path}: no 'length' key (the reference's LMDBs store the record count under it)")
        return loads_length(raw, f"{self.path} key 'length'")

    def raw(self, index: int) -> bytes:
        raw = self._value(f"{index}".encode("ascii"), f"{self.path} key '{index}'")
        if raw is None:
            raise KitError(f"{self.path} key '{index}': missing (the file's 'length' promises it)")
        return raw

    def read(self, index: int, need_graph: bool = True) -> dict:
        where = f"{self.path} key '{index}'"
        try:
            fields = loads_record(self.raw(index))
        except KitError:
            raise
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise KitError(f"{where}: not a pickled torch_geometric Data record ({first})") from None
        return check_fields(fields, where, need_graph)

    def close(self):
        opened = _OPEN.pop((os.getpid(), str(self.path.resolve())), None)
        if opened is not None:
            opened.env.close()
            os.close(opened.fd)
