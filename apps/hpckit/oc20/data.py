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

import bisect
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpckit.common.errors import KitError
from hpckit.oc20.records import LmdbFile

SPLITS = ("train", "validation")


@dataclass
class LmdbSplit:
    """The LMDB files of one split and how many records of each are used (a prefix of the
    split), sharded by file (a node stages whole files)."""
    split: str
    files: list[Path]
    counts: list[int]
    need_graph: bool = True
    _handles: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return sum(self.counts)

    def all_paths(self) -> list[Path]:
        return list(self.files)

    def shard(self, rank: int, size: int) -> "LmdbSplit":
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad shard {rank} of {size}")
        idx = range(rank, len(self.files), size)
        return LmdbSplit(self.split, [self.files[i] for i in idx], [self.counts[i] for i in idx], self.need_graph)

    def relocated(self, new_dir: Path) -> "LmdbSplit":
        return LmdbSplit(self.split, [Path(new_dir) / f.name for f in self.files], list(self.counts),
                         self.need_graph)

    def locate(self, index: int) -> tuple[int, int]:
        """(file number, key) of record `index` of the split (bisect over the cumulative
        counts, trajectory_lmdb.py:61-68)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        cumulative = self._cumulative()
        f = bisect.bisect(cumulative, index)
        return f, index - (cumulative[f - 1] if f else 0)

    def _cumulative(self) -> list[int]:
        if "cum" not in self._handles:
            total, cum = 0, []
            for c in self.counts:
                total += c
                cum.append(total)
            self._handles["cum"] = cum
        return self._handles["cum"]

    def handle(self, f: int) -> LmdbFile:
        key = ("file", f)
        if key not in self._handles:
            self._handles[key] = LmdbFile(self.files[f])
        return self._handles[key]

    def read(self, index: int) -> dict:
        f, key = self.locate(index)
        return self.handle(f).read(key, self.need_graph)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


def find_split(root: Path, split: str, n_samples: int, config_key: str, need_graph: bool) -> LmdbSplit:
    d = root / split
    if not d.is_dir():
        raise KitError(f"{d}: missing split folder (a dataset root holds train/ and validation/, each a folder of "
                       "data.NNNN.lmdb files)")
    files = sorted(p for p in d.iterdir() if p.name.endswith(".lmdb"))
    if not files:
        raise KitError(f"{d}: empty split folder (no *.lmdb files)")
    counts, total = [], 0
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
        counts.append(take)
        total += take
    if total < n_samples:
        raise KitError(f"{d}: holds {total} records but config key '{config_key}' asks for {n_samples}")
    return LmdbSplit(split, files[:len(counts)], counts, need_graph)


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
