"""Synthetic CosmoFlow universes written in the public dataset's on-disk formats.

Each sample is a periodic box of 128/0.7 Mpc (128 Mpc/h at h = 0.7, as the public 128^3
crops; in Mpc/h it scales with h) on an S^3 grid (a smaller S is the same volume on a
coarser grid), four channels = the matter field at four redshifts, as int16 particle counts.
Physics (linear theory + lognormal, enough to give every parameter a signature):

- linear power spectrum P(k) = A k^n_s T(k)^2, T = BBKS transfer function with shape
  parameter Gamma = Omega_m h, A normalised so the top-hat variance at 8 Mpc/h is sigma_8^2;
- a Gaussian random field with that spectrum (k = 0 mode removed, smoothed with a Gaussian of
  2 Mpc/h where linear theory stops holding), scaled to each channel's redshift by the linear growth factor D(z; Omega_m) (Carroll, Press & Turner 1992);
- a lognormal density 1 + delta = exp(g - var/2) (mean one), Poisson-sampled into counts
  with a mean proportional to Omega_m (a fixed particle mass in M_sun/h), clipped to int16.

Targets are the four parameters (sigma_8, n_s, Omega_m, h) mapped linearly from their
sampling ranges to [-1, 1]. The ranges are wider than the public sweep so that small mini
cubes still carry a learnable signal; they are recorded in the manifest.

Everything is deterministic in (seed, split, index).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpckit.common import memory
from hpckit.common.errors import KitError
from hpckit.common.pool import worker_pool
from hpckit.common.fileio import atomic_write_bytes, atomic_write_text, ensure_new_dir, sha256_file

GENERATOR_VERSION = 1
PARAM_NAMES = ("sigma_8", "n_s", "Omega_m", "h")
PARAM_RANGES = {"sigma_8": (0.6, 1.0), "n_s": (0.6, 1.4), "Omega_m": (0.15, 0.45), "h": (0.4, 1.0)}
REDSHIFTS = (0.0, 0.5, 1.5, 3.0)
BOX_MPC = 128.0                  # comoving side of one sample, Mpc/h at h = H_REF
H_REF = 0.7
PARTICLES_PER_VOXEL = 4.0        # mean count per voxel at Omega_m = 0.3 (the
                                 # simulation's resolution follows the grid's, as in the public
                                 # data where particles and voxels are 512^3 each)
SMOOTHING_MPC = 2.0              # Gaussian smoothing of the linear field: linear theory's limit
SPLITS = ("train", "validation")
SPLIT_SALT = {"train": 0, "validation": 1}


def bbks_transfer(k: np.ndarray, gamma: float) -> np.ndarray:
    q = np.maximum(k, 1e-12) / gamma
    return (np.log1p(2.34 * q) / (2.34 * q)
            * (1 + 3.89 * q + (16.1 * q) ** 2 + (5.46 * q) ** 3 + (6.71 * q) ** 4) ** -0.25)


def growth_factor(z: float, omega_m: float) -> float:
    """Linear growth D(z)/D(0) for flat LCDM, Carroll, Press & Turner (1992) fit."""
    def g(zz: float) -> float:
        a3 = (1 + zz) ** 3
        e2 = omega_m * a3 + (1 - omega_m)
        om, ol = omega_m * a3 / e2, (1 - omega_m) / e2
        return 2.5 * om / (om ** (4 / 7) - ol + (1 + om / 2) * (1 + ol / 70))
    return g(z) / (1 + z) / g(0.0)


def power_amplitude(sigma_8: float, n_s: float, gamma: float) -> float:
    """A such that the top-hat variance of A k^n T^2 at R = 8 Mpc/h is sigma_8^2."""
    k = np.logspace(-4, 2, 4000)
    x = 8.0 * k
    w = 3 * (np.sin(x) - x * np.cos(x)) / x ** 3
    integrand = k ** 2 * k ** n_s * bbks_transfer(k, gamma) ** 2 * w ** 2 / (2 * np.pi ** 2)
    return sigma_8 ** 2 / np.trapezoid(integrand, k)


def universe(params: dict, size: int, rng: np.random.Generator, box: float = BOX_MPC) -> np.ndarray:
    """One sample: int16 counts of shape (size, size, size, 4), channels last."""
    s8, ns, om, h = (params[p] for p in PARAM_NAMES)
    gamma = om * h
    box = box * h / H_REF          # the box is fixed in Mpc: in Mpc/h it grows with h
    cell = box / size
    kf = 2 * np.pi / box
    kx = np.fft.fftfreq(size, d=1.0 / size) * kf
    kz = np.fft.rfftfreq(size, d=1.0 / size) * kf
    kmag = np.sqrt(kx[:, None, None] ** 2 + kx[None, :, None] ** 2 + kz[None, None, :] ** 2)
    pk = power_amplitude(s8, ns, gamma) * np.maximum(kmag, 1e-12) ** ns * bbks_transfer(kmag, gamma) ** 2
    pk *= np.exp(-(kmag * SMOOTHING_MPC) ** 2)
    pk[0, 0, 0] = 0.0
    noise = np.fft.rfftn(rng.standard_normal((size,) * 3))
    delta0 = np.fft.irfftn(noise * np.sqrt(pk / cell ** 3), s=(size,) * 3, axes=(0, 1, 2))
    var0 = float(delta0.var())
    # fixed particle mass in M_sun/h (the N-body convention): mean count goes as Omega_m
    mean_count = PARTICLES_PER_VOXEL * om / 0.3
    out = np.empty((size, size, size, len(REDSHIFTS)), dtype=np.int16)
    for c, z in enumerate(REDSHIFTS):
        d = growth_factor(z, om)
        rho = np.exp(d * delta0 - 0.5 * d * d * var0)
        counts = rng.poisson(mean_count * rho)
        out[..., c] = np.minimum(counts, np.iinfo(np.int16).max)
    return out


def normalise(params: dict) -> np.ndarray:
    lo = np.array([PARAM_RANGES[p][0] for p in PARAM_NAMES])
    hi = np.array([PARAM_RANGES[p][1] for p in PARAM_NAMES])
    raw = np.array([params[p] for p in PARAM_NAMES])
    return (2 * (raw - lo) / (hi - lo) - 1).astype(np.float32)


def sample_params(rng: np.random.Generator) -> dict:
    return {p: float(rng.uniform(*PARAM_RANGES[p])) for p in PARAM_NAMES}


@dataclass(frozen=True)
class SampleJob:
    split: str
    index: int
    size: int
    seed: int
    fmt: str
    directory: str


def sample_name(split: str, index: int) -> str:
    # Public names look like univ_ics_2019-03_a<ID>_<crop>.tfrecord (64 crops per universe);
    # here every sample is its own universe, crop 000.
    return f"univ_synth_{split[:1]}{index:07d}_000"


def _make_sample(job: SampleJob) -> tuple[str, dict]:
    rng = np.random.default_rng([job.seed, SPLIT_SALT[job.split], job.index])
    params = sample_params(rng)
    return sample_name(job.split, job.index), {"params": params, "x": universe(params, job.size, rng)}


def _write_sample(job: SampleJob, name: str, x: np.ndarray, y: np.ndarray) -> list[tuple[str, str]]:
    """Write one sample; returns [(relative file name, sha256)]."""
    from hpckit.common import tfrecord

    d = Path(job.directory)
    if job.fmt == "tfrecord":
        payload = tfrecord.encode_example({"x": x.astype("<i2").tobytes(), "y": y})
        path = d / f"{name}.tfrecord"
        tfrecord.write_records(path, [payload], compression="GZIP", level=1)
        files = [path]
    else:
        files = []
        for suffix, arr in (("_data.npy", x.astype("<i2")), ("_label.npy", y.astype("<f4"))):
            path = d / f"{name}{suffix}"
            _save_npy_atomic(path, arr)
            files.append(path)
    return [(f.name, sha256_file(f)) for f in files]


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    import io
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


def _generate_split(split, count, size, seed, fmt, root, shuffle_labels, pool):
    directory = root / split
    directory.mkdir(parents=True, exist_ok=True)
    jobs = [SampleJob(split, i, size, seed, fmt, str(directory)) for i in range(count)]
    samples = list(pool.map(_make_sample, jobs, chunksize=max(1, count // 64))) if pool else \
        [_make_sample(j) for j in jobs]
    labels = np.stack([normalise(s["params"]) for _, s in samples]) if samples else np.zeros((0, 4))
    if shuffle_labels:
        perm = np.random.default_rng([seed, SPLIT_SALT[split], 99]).permutation(count)
        labels = labels[perm]
    records = []
    written = (pool.map(_write_sample, jobs, [n for n, _ in samples], [s["x"] for _, s in samples], labels)
               if pool else map(_write_sample, jobs, [n for n, _ in samples], [s["x"] for _, s in samples], labels))
    for (name, s), y, files in zip(samples, labels, written):
        records.append({"name": name, "params": s["params"], "y": [float(v) for v in y],
                        "files": {f: digest for f, digest in files}})
    if fmt == "npy":
        atomic_write_text(directory / "files_data.lst", "".join(f"{r['name']}_data.npy\n" for r in records))
        atomic_write_text(directory / "files_label.lst", "".join(f"{r['name']}_label.npy\n" for r in records))
    return records


BYTES_PER_VOXEL = 64   # the generator's working set per grid cell, rounded up


def write_dataset(out: str | os.PathLike, n_train: int, n_valid: int, size: int = 128, seed: int = 0,
                  fmt: str = "tfrecord", shuffle_labels: bool = False, workers: int | None = None) -> dict:
    """Write DIR/train, DIR/validation and DIR/manifest.json; returns the manifest."""
    if n_train < 1 or n_valid < 1:
        raise KitError(f"datagen: --train and --valid must be >= 1 (got {n_train}, {n_valid})")
    if size < 4:
        raise KitError(f"datagen: --size must be >= 4 (got {size})")
    if shuffle_labels and min(n_train, n_valid) < 2:   # a permutation of one is no sabotage
        raise KitError("datagen: --shuffle-labels needs at least 2 samples per split")
    if fmt not in ("tfrecord", "npy"):
        raise KitError(f"datagen: unknown format {fmt!r}")
    workers = workers or os.cpu_count() or 1
    # each worker holds a few float64/complex fields of the S^3 grid while it draws a sample
    memory.require(workers * size ** 3 * BYTES_PER_VOXEL, f"datagen: --size {size} with {workers} workers")
    root = Path(out)
    ensure_new_dir(root, "datagen --out", "hpckit datagen writes")
    counts = {"train": n_train, "validation": n_valid}
    with worker_pool(workers) as pool:
        splits = {split: _generate_split(split, counts[split], size, seed, fmt, root, shuffle_labels, pool)
                  for split in SPLITS}
    manifest = {
        "benchmark": "cosmoflow",
        "generator": "hpckit.cosmoflow.synthetic",
        "generator_version": GENERATOR_VERSION,
        "format": fmt,
        "compression": "GZIP" if fmt == "tfrecord" else None,
        "sample_shape": [size, size, size, len(REDSHIFTS)],
        "sample_dtype": "int16",
        "target_dtype": "float32",
        "seed": seed,
        "shuffled_labels": shuffle_labels,
        "counts": counts,
        "parameters": {"names": list(PARAM_NAMES), "ranges": PARAM_RANGES,
                       "normalisation": "linear from range to [-1, 1]"},
        "physics": {"box_mpc_over_h": BOX_MPC, "voxel_mpc_over_h": BOX_MPC / size, "redshifts": list(REDSHIFTS),
                    "transfer": "BBKS, Gamma = Omega_m h", "growth": "Carroll-Press-Turner 1992",
                    "density": "lognormal, Poisson counts, mean proportional to Omega_m",
                    "particles_per_voxel_at_omega_m_0.3": PARTICLES_PER_VOXEL},
        "samples": splits,
    }
    atomic_write_text(root / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest
