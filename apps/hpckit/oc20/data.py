"""OC20 data: the LMDB files of a split, the records of a rank's share, batches.

Reads any directory laid out like the reference's preprocessed data (hpckit.oc20.records):
`<root>/train/*.lmdb` and `<root>/validation/*.lmdb` (the reference's s2ef/2M/train and
s2ef/all/val_id, linked or copied under these names). As the reference's
TrajectoryLmdbDataset (trajectory_lmdb.py:41-82): files sorted by name, each file's
"length" records in key order, one index over all of them; here the first n of them are
used. A batch is the reference's collation (Batch.from_data_list plus `neighbors`,
trajectory_lmdb.py:101-116): nodes and edges concatenated, edge_index shifted by the atoms
before, a `batch` vector, and per graph its number of edges.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpckit.common.errors import KitError
from hpckit.oc20 import records
from hpckit.oc20.records import LmdbFile

SPLITS = ("train", "validation")


@dataclass
class LmdbSplit:
    """Records of one split: the LMDB files and, per record, its file and key (a prefix of
    the split, in the reference's order). Shards are by record (rank::size of them, as the
    reference's DistributedSampler deals them out), so every node's share is the same size
    whatever the number and sizes of the files; a node stages its share as an LMDB of its
    own (stage_share)."""
    split: str
    files: list[Path]
    file_of: np.ndarray          # int32 (records,): index into files
    key_of: np.ndarray           # int64 (records,): the record's key in its file
    need_graph: bool = True
    _handles: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.key_of.shape[0])

    def all_paths(self) -> list[Path]:
        return [self.files[i] for i in np.unique(self.file_of)]

    def subset(self, indices) -> "LmdbSplit":
        idx = np.asarray(indices, dtype=np.int64)
        return LmdbSplit(self.split, self.files, self.file_of[idx], self.key_of[idx], self.need_graph)

    def shard(self, rank: int, size: int) -> "LmdbSplit":
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad shard {rank} of {size}")
        return self.subset(np.arange(rank, len(self), size))

    def relocated(self, new_dir: Path) -> "LmdbSplit":
        return LmdbSplit(self.split, [Path(new_dir) / f.name for f in self.files], self.file_of, self.key_of,
                         self.need_graph)

    def handle(self, f: int) -> LmdbFile:
        key = ("file", f)
        if key not in self._handles:
            self._handles[key] = LmdbFile(self.files[f])
        return self._handles[key]

    def raw(self, index: int) -> bytes:
        return self.handle(int(self.file_of[index])).raw(int(self.key_of[index]))

    def read(self, index: int) -> dict:
        return self.handle(int(self.file_of[index])).read(int(self.key_of[index]), self.need_graph)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


STAGED_FILE = records.FILE_PATTERN % 0


def stage_share(split: LmdbSplit, dest: Path) -> int:
    """Staging (common/run.py StageAs): this node's records copied, bytes unchanged, into
    one new LMDB dest/data.0000.lmdb, keys 0..n-1 and "length" (the reference's layout);
    returns its size. Read once from the shared file system, only what the node trains on.
    The new file's permission bits are those every source file grants (the narrowest of
    them, less the umask), never wider (MLPerfRun.stage has checked that every file lies
    inside the data set)."""
    mode = 0o777
    for f in split.files:
        try:
            mode &= os.stat(f).st_mode
        except OSError as e:
            raise KitError(f"{f}: cannot stat ({e.strerror or e})") from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    return records.write_lmdb(dest / STAGED_FILE, (split.raw(i) for i in range(len(split))), mode=mode & 0o666)


def staged(split: LmdbSplit, dest: Path) -> LmdbSplit:
    """The split every rank of the node reads after stage_share (names only)."""
    n = len(split)
    return LmdbSplit(split.split, [Path(dest) / STAGED_FILE], np.zeros(n, np.int32), np.arange(n, dtype=np.int64),
                     split.need_graph)


def find_split(root: Path, split: str, n_samples: int, config_key: str, need_graph: bool) -> LmdbSplit:
    d = root / split
    if not d.is_dir():
        raise KitError(f"{d}: missing split folder (a dataset root holds train/ and validation/, each a folder of "
                       "data.NNNN.lmdb files)")
    files = sorted(p for p in d.iterdir() if p.name.endswith(".lmdb"))
    if not files:
        raise KitError(f"{d}: empty split folder (no *.lmdb files)")
    file_of, key_of, total = [], [], 0
    for p in files:
        if not p.is_file():
            raise KitError(f"{p}: not a regular file (the reference's LMDBs are single files, subdir=False)")
        handle = LmdbFile(p)
        try:
            n = handle.length()
        finally:
            handle.close()
        take = min(n, n_samples - total)
        if take <= 0:
            break
        file_of.append(np.full(take, len(file_of), np.int32))
        key_of.append(np.arange(take, dtype=np.int64))
        total += take
    if total < n_samples:
        raise KitError(f"{d}: holds {total} records but config key '{config_key}' asks for {n_samples}")
    return LmdbSplit(split, files[:len(file_of)], np.concatenate(file_of), np.concatenate(key_of), need_graph)


def find_dataset(root: str | os.PathLike, n_train: int, n_valid: int, need_graph: bool = True) -> dict[str, LmdbSplit]:
    root = Path(root)
    if not root.is_dir():
        raise KitError(f"{root}: data directory does not exist")
    return {"train": find_split(root, "train", n_train, "data.n_train", need_graph),
            "validation": find_split(root, "validation", n_valid, "data.n_valid", need_graph)}


def collate(records: list[dict]) -> dict:
    """The batch of a list of records (see module doc)."""
    import torch
    natoms = [int(r["natoms"]) for r in records]
    batch = {
        "pos": torch.cat([r["pos"] for r in records]),
        "atomic_numbers": torch.cat([r["atomic_numbers"] for r in records]),
        "cell": torch.cat([r["cell"] for r in records]),
        "natoms": torch.tensor(natoms, dtype=torch.long),
        "y": torch.tensor([float(r["y"]) for r in records], dtype=torch.float32),
        "force": torch.cat([r["force"] for r in records]),
        "fixed": torch.cat([r["fixed"] for r in records]),
        "tags": torch.cat([r["tags"] for r in records]),
        "batch": torch.repeat_interleave(torch.arange(len(records)), torch.tensor(natoms)),
        "sid": torch.tensor([int(r["sid"]) for r in records], dtype=torch.long),
        "fid": torch.tensor([int(r["fid"]) for r in records], dtype=torch.long),
    }
    if all("edge_index" in r for r in records):
        shift = 0
        edges = []
        for r, n in zip(records, natoms):
            edges.append(r["edge_index"] + shift)
            shift += n
        batch["edge_index"] = torch.cat(edges, 1)
        batch["cell_offsets"] = torch.cat([r["cell_offsets"] for r in records])
        batch["neighbors"] = torch.tensor([r["edge_index"].shape[1] for r in records], dtype=torch.long)
    return batch


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def find_bad_record(split: LmdbSplit):
    """Re-read every record of the split with the strict reader; the first problem, or None."""
    for i in range(len(split)):
        try:
            split.read(i)
        except KitError as e:
            return e
    return None


def torch_loader(split: LmdbSplit, cfg: dict, train: bool, seed: int, sampler=None):
    """Batches (collate) of the split's records in the order of `sampler` (the rank's
    per-epoch share, hpckit.common.run.EpochSampler)."""
    from torch.utils.data import DataLoader, Dataset
    from hpckit.common.run import EpochSampler

    class Records(Dataset):
        def __len__(self):
            return len(split)

        def __getitem__(self, i):
            return split.read(i)

    d = cfg["data"]
    workers = d["loader_workers"]
    if sampler is None:
        sampler = EpochSampler(len(split), 0, 1, None, seed, train and d["shuffle"])
    return DataLoader(Records(), batch_size=d["batch_size"] if train else d["eval_batch_size"], sampler=sampler,
                      drop_last=train, num_workers=workers, collate_fn=collate, persistent_workers=workers > 0,
                      prefetch_factor=d["prefetch"] if workers > 0 else None)
