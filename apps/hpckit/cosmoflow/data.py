"""CosmoFlow data: find the files of a split, read and validate one sample, build loaders.

Reads any directory laid out like the public dataset: `<root>/train/` and
`<root>/validation/` holding either one-sample GZIP (or plain) TFRecord files with
features `x` (raw int16, S,S,S,4) and `y` (float32[4]), or the converted npy layout
(`*_data.npy`, `*_label.npy`, listed in `files_data.lst` / `files_label.lst`).
As the reference: files sorted by name, the first n of them used, each epoch's shard drawn
by hpckit.common.run.EpochSampler, transform x = log(x + 1) (or x / mean(x) when apply_log
is false).
"""

from __future__ import annotations

import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hpckit.common import rawread
from hpckit.common.errors import KitError

SPLITS = ("train", "validation")
N_TARGETS = 4
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class SplitFiles:
    """The files of one split. For npy, `labels[i]` belongs to `files[i]`."""
    split: str
    fmt: str                                   # "tfrecord" | "npy"
    files: list[Path]
    labels: list[Path] = field(default_factory=list)
    compression: str | None = None             # TFRecord only: "GZIP" | None

    def all_paths(self) -> list[Path]:
        return self.files + self.labels

    def subset(self, indices) -> "SplitFiles":
        return SplitFiles(self.split, self.fmt, [self.files[i] for i in indices],
                          [self.labels[i] for i in indices] if self.labels else [], self.compression)

    def __len__(self) -> int:
        return len(self.files)

    def shard(self, rank: int, size: int) -> "SplitFiles":
        return self.subset(range(rank, len(self.files), size))

    def relocated(self, new_dir: Path) -> "SplitFiles":
        return SplitFiles(self.split, self.fmt, [new_dir / f.name for f in self.files],
                          [new_dir / f.name for f in self.labels], self.compression)


def _read_list(path: Path) -> list[str]:
    # the kit's reader of text: a regular file, bounded (a list linked to /dev/zero was read
    # until memory ran out: tests/fuzz.py), UTF-8, one line naming it
    from hpckit.common.inputs import read_text
    return [line.strip() for line in read_text(path, f"{path}: file list").splitlines() if line.strip()]


def find_split(root: Path, split: str, n_samples: int, config_key: str) -> SplitFiles:
    d = root / split
    if not d.is_dir():
        raise KitError(f"{d}: missing split folder (a dataset root holds train/ and validation/)")
    if (d / "files_data.lst").exists():
        data = _read_list(d / "files_data.lst")
        if not (d / "files_label.lst").exists():
            raise KitError(f"{d}: files_data.lst without files_label.lst")
        labels = _read_list(d / "files_label.lst")
        if len(data) != len(labels):
            raise KitError(f"{d}: files_data.lst lists {len(data)} files, files_label.lst {len(labels)}")
        pairs = sorted(zip(data, labels))
        found = SplitFiles(split, "npy", [d / a for a, _ in pairs], [d / b for _, b in pairs])
    else:
        files = sorted(p for p in d.iterdir() if p.name.endswith(".tfrecord") or p.name.endswith(".tfrecord.gz"))
        found = SplitFiles(split, "tfrecord", files)
    if not found.files:
        raise KitError(f"{d}: empty split folder (no *.tfrecord files and no files_data.lst)")
    if len(found.files) < n_samples:
        raise KitError(f"{d}: holds {len(found.files)} samples but config key '{config_key}' asks for {n_samples}")
    found = found.subset(range(n_samples))
    for p in found.all_paths():   # one stat per file: missing and empty files named before any reading
        try:
            st = p.stat()
        except OSError:
            raise KitError(f"{p}: listed sample file is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise KitError(f"{p}: listed sample file is not a regular file")
        if st.st_size == 0:
            # TensorFlow's TFRecordDataset reads an empty file as zero records, silently
            raise KitError(f"{p}: empty file (0 bytes)")
    if found.fmt == "tfrecord":
        # for TensorFlow's reader, which takes one compression per dataset: the majority of
        # the first files (one bad first file does not decide it); the kit's own reader
        # decides per file (read_sample), so an error always names the file that is bad
        probe = [_starts_with(f, GZIP_MAGIC) for f in found.files[:9]]
        found.compression = "GZIP" if 2 * sum(probe) >= len(probe) else None
    return found


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError as e:
        raise KitError(f"{path}: cannot read ({e.strerror})")


def find_dataset(root: str | os.PathLike, n_train: int, n_valid: int) -> dict[str, SplitFiles]:
    root = Path(root)
    if not root.is_dir():
        raise KitError(f"{root}: data directory does not exist")
    return {"train": find_split(root, "train", n_train, "data.n_train"),
            "validation": find_split(root, "validation", n_valid, "data.n_valid")}


# the network ends in tanh x 1.2 (mlcommons/hpc@2c627d4 cosmoflow/models/cosmoflow.py:84-85): a
# target beyond it is unreachable, i.e. not the dataset's normalised parameters
Y_BOUND = 1.2


def read_sample(split: SplitFiles, index: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(x int16 [S,S,S,4], y float32 [4]) of sample `index`, validated; KitError names the file."""
    shape = (size, size, size, N_TARGETS)
    path = split.files[index]
    if split.fmt == "tfrecord":
        from hpckit.common import tfrecord
        example = tfrecord.read_example_file(path, compression="AUTO")
        if "x" not in example or "y" not in example:
            raise KitError(f"{path}: TFRecord example lacks feature {'x' if 'x' not in example else 'y'}")
        raw, y = example["x"], example["y"]
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise KitError(f"{path}: feature x is not a bytes feature")
        if not isinstance(y, np.ndarray):   # bytes, or a feature of no kind ([])
            raise KitError(f"{path}: feature y is not a float feature (a {'bytes' if y else 'empty'} feature)")
        y = y.astype(np.float32)
        if len(raw) != np.prod(shape) * 2:
            raise KitError(f"{path}: feature x has {len(raw)} bytes, expected {np.prod(shape) * 2} "
                           f"(int16 {'x'.join(map(str, shape))})")
        x = np.frombuffer(raw, dtype="<i2").reshape(shape)
        label_path = path
    else:
        x = _load_npy(path)
        if x.shape != shape or x.dtype != np.int16:
            raise KitError(f"{path}: array is {x.dtype} {x.shape}, expected int16 {shape}")
        label_path = split.labels[index]
        y = _load_npy(label_path)
        if y.dtype.kind not in "fiu":
            raise KitError(f"{label_path}: target y is {y.dtype}, expected float32 numbers")
        y = y.astype(np.float32).reshape(-1)
    _check_sample(path, x, label_path, y)
    return x, y


def _check_sample(path, x: np.ndarray, label_path, y: np.ndarray) -> None:
    low = int(x.min())
    if low < 0:   # particle counts: log(x + 1) of a negative count is not a number
        raise KitError(f"{path}: feature x holds a negative particle count ({low})")
    if y.shape != (N_TARGETS,):
        raise KitError(f"{label_path}: target y has {y.size} values, expected {N_TARGETS}")
    if not np.all(np.isfinite(y)):
        raise KitError(f"{label_path}: target y is not finite ({y.tolist()})")
    if np.any(np.abs(y) > Y_BOUND):
        raise KitError(f"{label_path}: target y {y.tolist()} lies outside the model's output range "
                       f"(-{Y_BOUND}, {Y_BOUND}) (tanh x 1.2): the dataset's targets are normalised, these are not")


def _npy_layout(path, fd: int, size: int):
    return rawread.npy_extent(fd, path, size)


_LAYOUTS = rawread.Layouts(_npy_layout)


def read_sample_into(split: SplitFiles, index: int, size: int, x_out: np.ndarray, y_out: np.ndarray) -> None:
    """What read_sample returns, checked as it checks it, written into `x_out` (int16
    (S, S, S, 4), C-contiguous: a reader's place in a pinned batch buffer) and `y_out`
    (float32 (4,)). An npy sample's counts are read from the file straight into `x_out`
    (common/rawread.py: no array allocated per sample); a TFRecord's are inflated and
    parsed by read_sample, then copied."""
    if split.fmt != "npy":
        x, y = read_sample(split, index, size)
        np.copyto(x_out, x)
        np.copyto(y_out, y)
        return
    shape = (size, size, size, N_TARGETS)
    path = split.files[index]
    fd, st = rawread.open_regular(path)
    try:
        extent = _LAYOUTS.get(path, fd, st)
        # raw only into x_out's exact dtype, byte order included (as read_sample refuses any other)
        if extent.shape != shape or extent.dtype != np.dtype(np.int16):
            raise KitError(f"{path}: array is {extent.dtype} {extent.shape}, expected int16 {shape}")
        rawread.read_into(fd, path, extent, x_out, "the array")
    finally:
        os.close(fd)
    label_path = split.labels[index]
    y = _load_npy(label_path)
    if y.dtype.kind not in "fiu":
        raise KitError(f"{label_path}: target y is {y.dtype}, expected float32 numbers")
    y = y.astype(np.float32).reshape(-1)
    _check_sample(path, x_out, label_path, y)
    np.copyto(y_out, y)


def decoded(split: SplitFiles, new_dir: Path) -> SplitFiles:
    """The npy layout a TFRecord split takes once decoded at staging (data.stage_decode):
    <file>.x.npy (int16 S^3 x 4) and <file>.y.npy (float32 4) per sample, names only."""
    return SplitFiles(split.split, "npy", [new_dir / f"{f.name}.x.npy" for f in split.files],
                      [new_dir / f"{f.name}.y.npy" for f in split.files])


def decode_into(split: SplitFiles, dest: Path, size: int) -> int:
    """Decode every sample of `split` once (read_sample: gunzip, CRC32C, parse, validate)
    into the new directory `dest` as the npy pairs `decoded` names, one thread per usable
    CPU (zlib and the writes release the GIL); returns the bytes written. The loaders then
    read npy every epoch instead of inflating GZIP every epoch (bench/loader_rates.py).
    Each pair is created with its TFRecord's permission bits (less the umask), never wider
    (MLPerfRun.stage has checked that every file lies inside the data set)."""
    from concurrent.futures import ThreadPoolExecutor

    from hpckit.common.errors import disk_error, is_disk_error
    out = decoded(split, dest)
    try:
        dest.mkdir()
    except OSError as e:
        raise KitError(f"--stage-dir {dest}: cannot create ({e.strerror})")

    def one(i: int) -> int:
        try:
            mode = os.stat(split.files[i]).st_mode & 0o777
        except OSError as e:
            raise KitError(f"{split.files[i]}: cannot stat ({e.strerror or e})") from None
        x, y = read_sample(split, i, size)
        n = 0
        for arr, path in ((x, out.files[i]), (y, out.labels[i])):
            try:
                n += _save_npy(path, arr, mode)
            except OSError as e:
                if is_disk_error(e):   # the node-local copy failed, not the dataset
                    raise disk_error(e, path) from None
                raise KitError(f"staging {split.files[i]} -> {path}: {e.strerror}")
        return n

    with ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0)))) as pool:
        return sum(pool.map(one, range(len(split))))


def _save_npy(path: Path, arr: np.ndarray, mode: int = 0o666) -> int:
    """np.save's .npy (format 1.0) into the new file `path`, created with permission bits
    `mode` (less the umask); returns its size. The array goes through Python's write, not
    np.save's fwrite (ndarray.tofile), whose short write on a full disk raises an OSError
    without errno ("...x.npy: None"): here a full disk is ENOSPC, reported as one
    (errors.disk_error)."""
    arr = np.ascontiguousarray(arr)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o777), "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(arr))
        f.write(memoryview(arr).cast("B"))
        return f.tell()


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, *rawread.NPY_ERRORS) as e:
        raise KitError(f"{path}: not a readable .npy array ({rawread.npy_error(e)})") from None


def transform(x: np.ndarray, apply_log: bool) -> np.ndarray:
    x = x.astype(np.float32)
    if apply_log:
        return np.log1p(x)
    return x / x.mean()


def find_bad_file(split: SplitFiles, size: int) -> KitError | None:
    """Re-read every file with the strict reader; the first problem found, or None.

    Used after a framework's own reader failed with a message that names no file.
    """
    for i in range(len(split.files)):
        try:
            read_sample(split, i, size)
        except KitError as e:
            return e
    return None


# ---------------------------------------------------------------- PyTorch

def _sampler(split: SplitFiles, cfg: dict, train: bool, seed: int, sampler):
    """The rank's sampler (hpckit.common.run.EpochSampler), or all of `split`, reshuffled
    every epoch when training."""
    from hpckit.common.run import EpochSampler
    return sampler if sampler is not None else EpochSampler(len(split), 0, 1, None, seed,
                                                            train and cfg["data"]["shuffle"])


class Counts(NamedTuple):
    """A batch's x as the GPU path ships it: the samples' raw int16 counts (N, S, S, S, 4),
    half the bytes of the float32 transform, which `to_device` applies on the device."""
    counts: "torch.Tensor"
    apply_log: bool


def _pinned(device) -> bool:
    return getattr(device, "type", None) == "cuda"


def torch_loader(split: SplitFiles, cfg: dict, train: bool, seed: int, sampler=None, device=None,
                 device_transform: bool | None = None, feed: str = "threads"):
    """Batches (x, y) of `split` in the order of `sampler` (hpckit.common.run.EpochSampler;
    without one all of `split`, reshuffled every epoch when training), for `to_device`.

    For a CUDA `device` (`device_transform`, default: on CUDA; the tests and
    bench/feed_rate.py ask for it on the CPU) x is the raw int16 counts (`Counts`),
    transformed on the device by `to_device`, and the batches are in pinned host memory:
    read by `data.loader_workers` threads straight into a ring of pinned batch buffers
    (`feed="threads"`, common/feed.py: why), or by DataLoader worker processes and pinned by
    its pin-memory thread (`feed="processes"`, for bench/feed_rate.py's comparison). A
    batch's host memory is reused once the next batch is asked for. Otherwise x is
    transform()'s float32, computed in DataLoader worker processes, as on every CPU run."""
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data import default_collate

    size, apply_log = cfg["data"]["sample_size"], cfg["data"]["apply_log"]
    raw = _pinned(device) if device_transform is None else device_transform
    workers = cfg["data"]["loader_workers"]
    order = _sampler(split, cfg, train, seed, sampler)
    if raw and feed == "threads":
        from hpckit.common.feed import PinnedBatches

        def read_into(i, views):
            read_sample_into(split, i, size, views[0], views[1])

        return PinnedBatches(order, cfg["data"]["batch_size"], train,
                             [((size, size, size, N_TARGETS), torch.int16), ((N_TARGETS,), torch.float32)],
                             read_into, lambda t: (Counts(t[0], apply_log), t[1]), threads=workers,
                             depth=cfg["data"]["prefetch"] + 1, pin=_pinned(device))

    class CosmoDataset(Dataset):
        def __len__(self):
            return len(split.files)

        def __getitem__(self, i):
            x, y = read_sample(split, i, size)
            if not raw:
                return torch.from_numpy(transform(x, apply_log)), torch.from_numpy(y)
            if not x.flags.writeable:   # a view of the TFRecord's bytes: collate only copies it
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    return torch.from_numpy(x), torch.from_numpy(y)
            return torch.from_numpy(x), torch.from_numpy(y)

    def collate(batch):
        x, y = default_collate(batch)   # in a worker: stacked into shared memory
        return Counts(x, apply_log), y

    return DataLoader(CosmoDataset(), batch_size=cfg["data"]["batch_size"],
                      sampler=order, drop_last=train, num_workers=workers,
                      persistent_workers=workers > 0, collate_fn=collate if raw else None,
                      pin_memory=_pinned(device),
                      prefetch_factor=cfg["data"]["prefetch"] if workers > 0 else None)


LOG1P_TABLE_SIZE = 1 << 15   # every value an int16 count can take (read_sample refuses negative ones)
_log1p_tables: dict = {}


def _log1p_table(device):
    """transform(v, True) for every count v, once per device: the device's log1p of the counts
    is a lookup in it, so it is bit-identical to the CPU transform (numpy's log1p)."""
    import torch
    key = str(device)
    if key not in _log1p_tables:
        values = transform(np.arange(LOG1P_TABLE_SIZE, dtype=np.int16), True)
        _log1p_tables[key] = torch.from_numpy(values).to(device)
    return _log1p_tables[key]


def to_device(x, y, device):
    """The batch (x, y) of a `torch_loader` on `device`, as the model takes it: float32
    x (N, S, S, S, 4) transformed, y (N, 4). Non-blocking copies (asynchronous from the
    pinned memory the loader gives on CUDA). A `Counts` batch is transformed on the device:
    log(x + 1) as a lookup of the 32,768 values a count can take (bit-identical to
    transform()); x / mean(x) per sample with the mean summed exactly (float64 over the
    integer counts), so within 2 float32 roundings of transform()'s float32 mean."""
    import torch
    y = y.to(device, non_blocking=True)
    if not isinstance(x, Counts):
        return x.to(device, non_blocking=True), y
    counts = x.counts.to(device, non_blocking=True)
    if x.apply_log:
        flat = _log1p_table(device).index_select(0, counts.reshape(-1).to(torch.int32))
        return flat.view(counts.shape), y
    dims = tuple(range(1, counts.dim()))
    mean = counts.sum(dim=dims, dtype=torch.float64) / counts[0].numel()
    return counts.float() / mean.float().view(-1, *(1,) * len(dims)), y


# ---------------------------------------------------------------- TensorFlow
#
# No AutoGraph: the graph functions (these map functions, train.py's train and eval steps)
# neither branch nor loop on a tensor, so they are traced as written. AutoGraph writes each
# function it converts to /tmp/__autograph_generated_file*.py and removes those files only
# at a normal exit (atexit): every run killed by a launcher or a batch system (SIGKILL)
# left about 7 on the node (263 on the development VM after a day of stress runs).

class _Epochs:
    """Iterating it runs the next epoch: the sampler's next draw, as a tensor, through a
    fresh tf.data pipeline. No Python inside the pipeline: with a per-sample
    from_generator index a pass over the mini training set took 0.93-1.49 s, with the
    order as a tensor 0.82-0.93 s."""

    def __init__(self, sampler, pipeline):
        self.sampler, self.pipeline = sampler, pipeline

    def __iter__(self):
        return iter(self.pipeline(np.fromiter(self.sampler, dtype=np.int64)))


def tf_dataset(split: SplitFiles, cfg: dict, train: bool, seed: int, sampler=None):
    import tensorflow as tf

    size, apply_log = cfg["data"]["sample_size"], cfg["data"]["apply_log"]
    shape = (size, size, size, N_TARGETS)
    # tf.data's autotuning is off, the parallelism fixed to the rank's threads (the core
    # plan's): with autotuning about one pass in four over the mini training set took
    # 1.31 s instead of 0.82-0.89 s (every batch stretched to 10 ms), and one mini epoch in
    # three trained at 200 samples/s instead of 290; without it 0.90-1.01 s every pass
    # (bench/pass_stability.py, bench/README "pass_stability.py")
    parallel = tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))
    options = tf.data.Options()
    options.autotune.enabled = False
    names = tf.constant([os.fsencode(f) for f in split.files])   # bytes: any file name the OS allows
    features = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([N_TARGETS], tf.float32)}

    def parse(record):
        ex = tf.io.parse_single_example(record, features)
        x = tf.reshape(tf.io.decode_raw(ex["x"], tf.int16), shape)
        # the values read_sample refuses, measured here (stateless, in parallel)...
        return x, ex["y"], (tf.reduce_min(x) >= 0, tf.reduce_all(tf.abs(ex["y"]) <= Y_BOUND),
                            tf.reduce_all(tf.math.is_finite(ex["y"])))

    def refuse(x, y, ok):
        # ...and refused in a map of its own: an Assert is a stateful op, and a map holding
        # one runs sequentially under op determinism (--deterministic). The iterator's error
        # sends `diagnosed` to the strict reader, which names the file.
        checks = [tf.debugging.Assert(ok[0], ["negative particle count"]),
                  tf.debugging.Assert(ok[1], ["target y out of range"]),
                  tf.debugging.Assert(ok[2], ["target y is not finite"])]
        with tf.control_dependencies(checks):
            return tf.identity(x), tf.identity(y)

    def load(i):
        return read_sample(split, int(i), size)

    def finish(x, y):
        x = tf.cast(x, tf.float32)
        x = tf.math.log(x + 1.0) if apply_log else x / tf.reduce_mean(x)
        return x, y

    def pipeline(order):
        # traced as written: no AutoGraph (above)
        plain = tf.autograph.experimental.do_not_convert
        index = tf.data.Dataset.from_tensor_slices(order)
        if split.fmt == "tfrecord":
            ds = tf.data.TFRecordDataset(index.map(plain(lambda i: tf.gather(names, i))),
                                         compression_type=split.compression or "")
            ds = ds.map(plain(parse), num_parallel_calls=parallel).map(plain(refuse))
        else:
            ds = index.map(plain(lambda i: tf.numpy_function(load, [i], (tf.int16, tf.float32))),
                           num_parallel_calls=parallel)
            ds = ds.map(plain(lambda x, y: (tf.ensure_shape(x, shape), tf.ensure_shape(y, [N_TARGETS]))))
        ds = ds.map(plain(finish), num_parallel_calls=parallel)
        ds = ds.batch(cfg["data"]["batch_size"], drop_remainder=train)
        return ds.prefetch(cfg["data"]["prefetch"]).with_options(options)

    # the same per-epoch shard as the PyTorch path: each pass (an epoch) draws the
    # sampler's next epoch
    return _Epochs(_sampler(split, cfg, train, seed, sampler), pipeline)
