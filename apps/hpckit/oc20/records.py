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
    record is one line, and no code is run by reading data).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

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


def write_lmdb(path: Path, records) -> int:
    """One data.NNNN.lmdb: keys "0".."N-1" and "length" (preprocess_ef.py:58-70). The file
    must not exist (the caller writes into a directory it created); `records` an iterable
    of pickled records, written as they come. Returns the file's size."""
    import lmdb
    if path.exists():
        raise KitError(f"{path}: exists; datagen writes only into a new directory")
    try:
        env = lmdb.open(str(path), map_size=MAP_SIZE, subdir=False, meminit=False, map_async=True)
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
    import os

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
    import torch
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


_ENVS: dict[tuple[int, str], object] = {}   # (pid, path) -> open environment: py-lmdb opens a file once per process


class LmdbFile:
    """One data.NNNN.lmdb, opened read-only as the reference opens it, once per process
    (an LMDB environment must not cross a fork, nor be opened twice in one process)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def env(self):
        import os
        import lmdb
        key = (os.getpid(), str(self.path.resolve()))
        if key not in _ENVS:
            try:
                _ENVS[key] = lmdb.open(str(self.path), subdir=False, readonly=True, lock=False, readahead=False,
                                       meminit=False, max_readers=1)
            except lmdb.Error as e:
                raise KitError(f"{self.path}: not a readable LMDB file ({str(e).splitlines()[0]})") from None
        return _ENVS[key]

    def length(self) -> int:
        import lmdb
        try:
            with self.env().begin() as txn:
                raw = txn.get(LENGTH_KEY)
        except lmdb.Error as e:
            raise KitError(f"{self.path}: not a readable LMDB file ({str(e).splitlines()[0]})") from None
        if raw is None:
            raise KitError(f"{self.path}: no 'length' key (the reference's LMDBs store the record count under it)")
        try:
            n = pickle.loads(raw)
        except Exception:
            n = None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise KitError(f"{self.path}: key 'length' does not hold a record count")
        return n

    def raw(self, index: int) -> bytes:
        import lmdb
        try:
            with self.env().begin() as txn:
                raw = txn.get(f"{index}".encode("ascii"))
        except lmdb.Error as e:
            raise KitError(f"{self.path} key '{index}': cannot read ({str(e).splitlines()[0]})") from None
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
        import os
        env = _ENVS.pop((os.getpid(), str(self.path.resolve())), None)
        if env is not None:
            env.close()
