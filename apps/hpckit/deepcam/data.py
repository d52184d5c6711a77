"""DeepCAM data: find the files of a split, load stats.h5, read and validate one sample, loaders.

Reads any directory laid out like the public dataset: `<root>/stats.h5`,
`<root>/train/data-*.h5`, `<root>/validation/data-*.h5`, every sample an HDF5 file with
`climate/data` (H, W, C) channels last and `climate/labels_0` (H, W) with classes
0 background, 1 tropical cyclone, 2 atmospheric river.

As the reference (mlcommons/hpc deepcam/src/deepCam/data/cam_hdf5_dataset.py): files sorted
by name; x = (data - minval) * (1 / (maxval - minval)) per channel with minval / maxval from
stats.h5, in float32, then transposed HWC -> CHW; labels cast to int64. The reference has no
other normalisation. Here the first n files of a split are used and a shard is rank::size
of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hpckit.common import rawread
from hpckit.common.errors import KitError

SPLITS = ("train", "validation")
STATS_FILE = "stats.h5"
STATS_KEYS = ("count", "mean", "sqmean", "minval", "maxval")
DATA_KEY = "climate/data"
LABEL_KEY = "climate/labels_0"
N_CLASSES = 3
NORMALIZATIONS = ("minmax",)


@dataclass
class DeepCamFiles:
    """The sample files of one split, sorted by name."""
    split: str
    files: list[Path]

    def __len__(self) -> int:
        return len(self.files)

    def all_paths(self) -> list[Path]:
        return list(self.files)

    def subset(self, indices) -> "DeepCamFiles":
        return DeepCamFiles(self.split, [self.files[i] for i in indices])

    def shard(self, rank: int, size: int) -> "DeepCamFiles":
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad shard {rank} of {size}")
        return self.subset(range(rank, len(self.files), size))

    def relocated(self, new_dir: Path) -> "DeepCamFiles":
        return DeepCamFiles(self.split, [Path(new_dir) / f.name for f in self.files])


# what h5py raises on a damaged file besides OSError: a damaged object header or an external
# link to a file that is not there is a KeyError, a damaged local heap or a soft link loop a
# RuntimeError (tests/fuzz.py found each as a traceback)
H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def _in_file(f, key: str, where: str) -> None:
    """KitError unless `key` of the open h5py File `f` is a dataset stored in the file itself:
    reached through hard links only, not virtual, no external raw storage. A link to another
    file, a virtual dataset or external storage makes HDF5 open another path, which may be a
    FIFO that blocks the reader forever (tests/fuzz.py) or a file the data set does not hold.
    A key that is not there is left to the caller to name."""
    import h5py
    group = f
    for part in key.split("/"):
        link = group.get(part, getlink=True)
        if link is None:
            return
        if not isinstance(link, h5py.HardLink):
            kind = "a link to another file" if isinstance(link, h5py.ExternalLink) else "a soft link"
            raise KitError(f"{where} '{key}' is {kind}: the kit reads data stored in the file itself")
        group = group[part]
    if isinstance(group, h5py.Dataset):
        plist = group.id.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count():
            raise KitError(f"{where} '{key}' is stored in other files (a virtual dataset or external storage): "
                           "the kit reads data stored in the file itself")


def _h5_error(e: BaseException) -> str:
    text = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
    text = text.splitlines()[0] if text else type(e).__name__
    return text.strip()


def find_split(root: Path, split: str, n_samples: int, config_key: str) -> DeepCamFiles:
    d = root / split
    if not d.is_dir():
        raise KitError(f"{d}: missing split folder (a dataset root holds stats.h5, train/ and validation/)")
    files = sorted(p for p in d.iterdir() if p.name.startswith("data-") and p.name.endswith(".h5"))
    if not files:
        raise KitError(f"{d}: empty split folder (no data-*.h5 files)")
    if len(files) < n_samples:
        raise KitError(f"{d}: holds {len(files)} samples but config key '{config_key}' asks for {n_samples}")
    found = DeepCamFiles(split, files[:n_samples])
    for p in found.files:
        if not p.is_file():
            raise KitError(f"{p}: sample is not a regular file")
    return found


def find_dataset(root: str | os.PathLike, n_train: int, n_valid: int) -> dict[str, DeepCamFiles]:
    root = Path(root)
    if not root.is_dir():
        raise KitError(f"{root}: data directory does not exist")
    if not (root / STATS_FILE).is_file():
        raise KitError(f"{root / STATS_FILE}: missing stats.h5 (per-channel statistics for the normalisation)")
    return {"train": find_split(root, "train", n_train, "data.n_train"),
            "validation": find_split(root, "validation", n_valid, "data.n_valid")}


def load_stats(root: str | os.PathLike, n_channels: int = 16) -> dict[str, np.ndarray]:
    """climate/{count, mean, sqmean, minval, maxval} of <root>/stats.h5 as numpy arrays,
    checked: every key present, vectors of n_channels finite values, maxval > minval."""
    import h5py

    path = Path(root) / STATS_FILE
    if Path(root).is_dir() and not path.is_file():
        raise KitError(f"{path}: missing stats.h5 (per-channel statistics for the normalisation)")
    out = {}
    try:
        with h5py.File(path, "r") as f:
            for key in STATS_KEYS:
                name = f"climate/{key}"
                _in_file(f, name, f"{path}: stats.h5")
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    raise KitError(f"{path}: stats.h5 lacks dataset '{name}'")
                out[key] = np.asarray(f[name][()])
    except H5_ERRORS as e:
        raise KitError(f"{path}: stats.h5 is not a readable HDF5 file ({_h5_error(e)})") from None
    count = out["count"]
    if not (count.ndim == 0 or count.shape == (n_channels,)) or not np.all(np.isfinite(count)) \
            or np.any(count <= 0):
        raise KitError(f"{path}: stats.h5 'climate/count' must be a positive number "
                       f"(or {n_channels} of them), got shape {count.shape}")
    for key in STATS_KEYS[1:]:
        v = out[key]
        if v.shape != (n_channels,):
            raise KitError(f"{path}: stats.h5 'climate/{key}' has shape {v.shape}, expected ({n_channels},) "
                           f"(config key 'data.n_channels')")
        if v.dtype.kind not in "fiu" or not np.all(np.isfinite(v)):
            raise KitError(f"{path}: stats.h5 'climate/{key}' holds non-finite or non-numeric values")
    bad = np.nonzero(out["maxval"] <= out["minval"])[0]
    if bad.size:
        raise KitError(f"{path}: stats.h5 'climate/maxval' <= 'climate/minval' for channel {int(bad[0])} "
                       f"(min-max normalisation would divide by zero)")
    bad = _minmax(out["minval"], out["maxval"])[2]
    if bad.size:
        c = int(bad[0])
        raise KitError(f"{path}: stats.h5 range of channel {c} ({float(out['minval'][c]):g} .. "
                       f"{float(out['maxval'][c]):g}) cannot be normalised in float32: the min-max scale "
                       "1 / (maxval - minval) is not finite or not representable")
    return out


def _minmax(minval, maxval) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shift, scale, channels where the float32 map fails): scale computed in float64, and
    the float32 map must send [minval, maxval] onto [0, 1]; a range beyond float32 (3e38
    wide) or too narrow for its reciprocal (1e-42) would otherwise train on inf or 0."""
    lo, hi = np.asarray(minval, np.float64), np.asarray(maxval, np.float64)
    with np.errstate(all="ignore"):
        shift = lo.astype(np.float32)
        scale = (1.0 / (hi - lo)).astype(np.float32)
        top = (hi.astype(np.float32) - shift) * scale
    ok = np.isfinite(shift) & np.isfinite(scale) & (scale > 0) & (np.abs(top - 1) < 1e-3)
    return shift, scale, np.nonzero(~ok)[0]


def normalisation(stats: dict, cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale), float32 (C,), so that x = scale * (data - shift); as the reference:
    shift = minval, scale = 1 / (maxval - minval)."""
    kind = cfg["data"].get("normalization", "minmax")
    if kind not in NORMALIZATIONS:
        raise KitError(f"config key 'data.normalization': unknown value {kind!r} "
                       f"(the reference normalises with {' | '.join(NORMALIZATIONS)})")
    shift, scale, _ = _minmax(stats["minval"], stats["maxval"])
    return shift, scale


def read_raw(path: Path, height: int, width: int, n_channels: int,
             labels_dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """(data float32 (H, W, C), labels (H, W) as `labels_dtype`, int64 as the reference's) of
    one file, validated; KitError names the file."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            for key in (DATA_KEY, LABEL_KEY):
                _in_file(f, key, f"{path}:")
                if key not in f or not isinstance(f[key], h5py.Dataset):
                    raise KitError(f"{path}: HDF5 file lacks dataset '{key}'")
            dset, lset = f[DATA_KEY], f[LABEL_KEY]
            if dset.ndim != 3:
                raise KitError(f"{path}: '{DATA_KEY}' has shape {dset.shape}, expected (H, W, C) = "
                               f"({height}, {width}, {n_channels})")
            if dset.shape[2] != n_channels:
                raise KitError(f"{path}: '{DATA_KEY}' has {dset.shape[2]} channels, expected {n_channels} "
                               f"(config key 'data.n_channels')")
            if dset.shape[:2] != (height, width):
                raise KitError(f"{path}: '{DATA_KEY}' is {dset.shape[0]} x {dset.shape[1]} pixels, expected "
                               f"{height} x {width} (config keys 'data.height', 'data.width')")
            if lset.shape != (height, width):
                raise KitError(f"{path}: '{LABEL_KEY}' has shape {lset.shape}, expected ({height}, {width})")
            if dset.dtype.kind not in "fiu" or lset.dtype.kind not in "fiu":
                raise KitError(f"{path}: data / labels are {dset.dtype} / {lset.dtype}, expected numbers")
            data = dset[...]
            labels = lset[...]
    except H5_ERRORS as e:
        raise KitError(f"{path}: not a readable HDF5 file ({_h5_error(e)})") from None
    with np.errstate(over="ignore", invalid="ignore"):   # beyond float32: inf, reported below
        data = data.astype(np.float32, copy=False)
    if not np.isfinite(data).all():
        bad = np.argwhere(~np.isfinite(data))[0]
        raise KitError(f"{path}: '{DATA_KEY}' holds a non-finite value (NaN, inf, or beyond float32) at pixel "
                       f"({bad[0]}, {bad[1]}) channel {bad[2]}")
    valid = (labels == 0) | (labels == 1) | (labels == 2)
    if not valid.all():
        bad = np.argwhere(~valid)[0]
        raise KitError(f"{path}: '{LABEL_KEY}' holds {labels[tuple(bad)].item()!r} at pixel ({bad[0]}, {bad[1]}), "
                       f"expected classes 0, 1, 2")
    return data, labels.astype(labels_dtype)


def _h5_layout(path, fd: int, size: int):
    """(data extent, labels extent) of a sample file whose two datasets lie in one piece
    each at their expected shapes, stored as IEEE binary32 in this machine's byte order
    (labels: that, or 8-bit unsigned bytes), the HDF5 type itself checked
    (rawread.h5_raw_dtype: a 4-byte float HDF5 converts is not read raw), or None: such a
    file is read through h5py (read_raw, which converts as h5py does and names what is
    wrong with it)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            for key in (DATA_KEY, LABEL_KEY):
                _in_file(f, key, f"{path}:")   # before f.get follows a link
            dset, lset = (f.get(key) for key in (DATA_KEY, LABEL_KEY))
            if not (isinstance(dset, h5py.Dataset) and isinstance(lset, h5py.Dataset)):
                return None
            found = rawread.h5_extent(dset, size), rawread.h5_extent(lset, size)
    except (OSError, RuntimeError, ValueError, KeyError):
        return None
    if None in found or found[0].dtype != np.dtype("=f4") or found[1].dtype not in (np.dtype("=f4"), np.dtype("u1")):
        return None
    return found


_LAYOUTS = rawread.Layouts(_h5_layout)
_SCRATCH = rawread.Scratch()


def read_raw_into(path: Path, data_out: np.ndarray, labels_out: np.ndarray, height: int, width: int,
                  n_channels: int) -> None:
    """What read_raw(..., labels_dtype=uint8) returns, checked as it checks it, written into
    `data_out` (float32 (H, W, C), C-contiguous: a reader's place in a pinned batch buffer)
    and `labels_out` (uint8 (H, W)). Where both datasets lie in one piece in the file (as
    datagen and the public dataset store them) their bytes are read straight into the
    buffers, the labels through a per-thread scratch buffer: no array allocated per sample,
    h5py (one lock for all threads, held with the GIL) only for the file's first read
    (common/rawread.py). Otherwise through read_raw."""
    fd, st = rawread.open_regular(path)
    try:
        layout = _LAYOUTS.get(path, fd, st)
        if layout is None or layout[0].shape != (height, width, n_channels) or layout[1].shape != (height, width):
            os.close(fd)
            fd = -1
            data, labels = read_raw(path, height, width, n_channels, labels_dtype=np.uint8)
            np.copyto(data_out, data)
            np.copyto(labels_out, labels)
            return
        dext, lext = layout
        rawread.read_into(fd, path, dext, data_out, f"'{DATA_KEY}'")
        lab = labels_out if lext.dtype == np.uint8 else _SCRATCH.get("labels", lext.shape, lext.dtype)
        rawread.read_into(fd, path, lext, lab, f"'{LABEL_KEY}'")
    finally:
        if fd >= 0:
            os.close(fd)
    if not rawread.all_finite(data_out):
        bad = np.argwhere(~np.isfinite(data_out))[0]
        raise KitError(f"{path}: '{DATA_KEY}' holds a non-finite value (NaN, inf, or beyond float32) at pixel "
                       f"({bad[0]}, {bad[1]}) channel {bad[2]}")
    ok = True
    if lab is not labels_out:   # float32 classes: exact small integers, else refused below
        with np.errstate(invalid="ignore"):
            np.copyto(labels_out, lab, casting="unsafe")
        same = _SCRATCH.get("same", lab.shape, np.bool_)
        np.equal(lab, labels_out, out=same)
        ok = bool(same.all())
    if not (ok and int(labels_out.max()) < N_CLASSES):
        valid = (lab == 0) | (lab == 1) | (lab == 2)
        bad = np.argwhere(~valid)[0]
        raise KitError(f"{path}: '{LABEL_KEY}' holds {lab[tuple(bad)].item()!r} at pixel ({bad[0]}, {bad[1]}), "
                       f"expected classes 0, 1, 2")


def read_sample(files: DeepCamFiles, index: int, stats: dict, cfg: dict,
                norm: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (C, H, W) normalised, y int64 (H, W)) of sample `index`; KitError names the file."""
    d = cfg["data"]
    data, labels = read_raw(files.files[index], d["height"], d["width"], d["n_channels"])
    shift, scale = norm if norm is not None else normalisation(stats, cfg)
    x = scale * (data - shift)
    return np.ascontiguousarray(x.transpose(2, 0, 1)), labels


def find_bad_file(files: DeepCamFiles, stats: dict, cfg: dict) -> KitError | None:
    """Re-read every file with the strict reader; the first problem found, or None.

    Used after a loader failed with a message that names no file.
    """
    norm = normalisation(stats, cfg)
    for i in range(len(files.files)):
        try:
            read_sample(files, i, stats, cfg, norm)
        except KitError as e:
            return e
    return None


# ---------------------------------------------------------------- PyTorch

class Fields(NamedTuple):
    """A batch's x as the GPU path ships it: the fields as read, float32 (N, H, W, C), and the
    normalisation (shift, scale, float32 (C,)) that `to_device` applies on the device."""
    data: "torch.Tensor"
    shift: "torch.Tensor"
    scale: "torch.Tensor"


def _pinned(device) -> bool:
    return getattr(device, "type", None) == "cuda"


def torch_loader(files: DeepCamFiles, stats: dict, cfg: dict, train: bool, seed: int, sampler=None, device=None,
                 device_transform: bool | None = None, feed: str = "threads"):
    """Batches (x, y) for `to_device`, in the order of `sampler` (hpckit.common.run.EpochSampler:
    the rank's per-epoch shard of `files`); without one, all of `files`, reshuffled every
    epoch when training.

    For a CUDA `device` (`device_transform`, default: on CUDA; the tests and
    bench/feed_rate.py ask for it on the CPU) x is the fields as read (`Fields`) and y the
    labels as uint8: `to_device` normalises, transposes and widens the labels on the device.
    The batches are in pinned host memory: read by `data.loader_workers` threads straight
    into a ring of pinned batch buffers (`feed="threads"`, common/feed.py: why), or by
    DataLoader worker processes and pinned by its pin-memory thread (`feed="processes"`, for
    bench/feed_rate.py's comparison). A batch's host memory is reused once the next batch is
    asked for. Otherwise DataLoader worker processes give x float32 (N, C, H, W) normalised
    and y int64 (N, H, W), as on every CPU run."""
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data import default_collate
    from hpckit.common.run import EpochSampler

    norm = normalisation(stats, cfg)
    raw = _pinned(device) if device_transform is None else device_transform
    d = cfg["data"]
    h, w, c = d["height"], d["width"], d["n_channels"]
    shift, scale = (torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for v in norm)
    workers = d["loader_workers"]
    if sampler is None:
        sampler = EpochSampler(len(files), 0, 1, None, seed, train and d["shuffle"])
    if raw and feed == "threads":
        from hpckit.common.feed import PinnedBatches
        pinned = {}

        def read_into(i, views):
            read_raw_into(files.files[i], views[0], views[1], h, w, c)

        def make(t):
            if not pinned:
                pinned["norm"] = [v.pin_memory() if _pinned(device) else v for v in (shift, scale)]
            return Fields(t[0], *pinned["norm"]), t[1]

        return PinnedBatches(sampler, d["batch_size"], train, [((h, w, c), torch.float32), ((h, w), torch.uint8)],
                             read_into, make, threads=workers, depth=d["prefetch"] + 1, pin=_pinned(device))

    class CamDataset(Dataset):
        def __len__(self):
            return len(files.files)

        def __getitem__(self, i):
            if raw:
                x, y = read_raw(files.files[i], h, w, c, labels_dtype=np.uint8)
            else:
                x, y = read_sample(files, i, stats, cfg, norm)
            return torch.from_numpy(x), torch.from_numpy(y)

    def collate(batch):
        x, y = default_collate(batch)   # in a worker: stacked into shared memory
        return Fields(x, shift, scale), y

    return DataLoader(CamDataset(), batch_size=d["batch_size"], sampler=sampler,
                      drop_last=train, num_workers=workers,
                      persistent_workers=workers > 0, collate_fn=collate if raw else None,
                      pin_memory=_pinned(device),
                      prefetch_factor=d["prefetch"] if workers > 0 else None)


def to_device(x, y, device, memory_format=None):
    """The batch (x, y) of a `torch_loader` on `device`, as the model takes it: x float32
    (N, C, H, W) normalised, y int64 (N, H, W). Non-blocking copies (asynchronous from the
    pinned memory the loader gives on CUDA). A `Fields` batch is normalised on the device,
    (data - shift) * scale as read_sample computes it (the same two float32 roundings:
    bit-identical), then transposed: the (N, H, W, C) fields are already the channels_last
    layout, so `memory_format=torch.channels_last` costs no copy (default: contiguous)."""
    import torch
    y = y.to(device, non_blocking=True)
    if not isinstance(x, Fields):
        return x.to(device, non_blocking=True), y
    data = x.data.to(device, non_blocking=True)
    if data.data_ptr() == x.data.data_ptr():   # same device: never normalise the loader's own batch in place
        data = data.clone()
    data.sub_(x.shift.to(device, non_blocking=True)).mul_(x.scale.to(device, non_blocking=True))
    out = data.permute(0, 3, 1, 2).contiguous(memory_format=memory_format or torch.contiguous_format)
    return out, y.long()
