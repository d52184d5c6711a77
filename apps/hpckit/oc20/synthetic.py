"""Synthetic OC20 S2EF data: periodic adsorbate-on-slab structures, their energies and
forces from an analytic interatomic potential, in the reference's LMDB layout.

    DIR/train/data.0000.lmdb ...      records "0".."n-1" and "length" (hpckit.oc20.records)
    DIR/validation/data.0000.lmdb ...
    DIR/manifest.json

A structure is what an OC20 S2EF frame is (a snapshot of a relaxation): an fcc(111) slab
of one metal, `layers` layers of `surface` x `surface` atoms, periodic in x and y with
vacuum above (the cell is periodic in z too, as the reference's neighbour list treats it,
with more vacuum than the cutoff), an adsorbate of 1 to `max_adsorbate` atoms of C, H, O,
N on a random site, and every atom displaced from its ideal place (a frame away from the
minimum). Tags as OC20's: 0 the lower half of the slab (fixed, `fixed` = 1), 1 the upper
half, 2 the adsorbate.

Energy and forces: a Morse pair potential, E = sum over pairs D_ab [(1 - e^(-a (r - r_ab)))^2 - 1]
f_c(r), f_c a cosine cutoff at `potential_cutoff` (below the graph's radius, so what
determines a force is inside the model's graph), D_ab = sqrt(D_a D_b), r_ab = R_a + R_b;
forces -dE/dr analytically, on every atom (the reference stores them with
apply_constraint=False, atoms_to_graphs.py:161-165). y is E minus the sum of per-element
reference energies (preprocess_ef.py:53-56 subtracts a reference energy). The graph stored
with each record is the reference preprocessing's (model.radius_graph_pbc: radius
model.cutoff, at most data.max_neighbors per centre).

Sabotage (`--shuffle-labels`, for checks that must FAIL): each structure's force vectors
are permuted among its free atoms (no free atom keeps its own), so forces no longer follow
the positions, recorded in the manifest.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpckit.common.errors import KitError
from hpckit.common.fileio import atomic_write_text, ensure_new_dir
from hpckit.common.pool import worker_pool
from hpckit.oc20 import records
from hpckit.oc20.model import radius_graph_pbc

GENERATOR_VERSION = 1
SPLITS = ("train", "validation")
SPLIT_SALT = {"train": 11, "validation": 23}
SHUFFLE_SALT = 7

# metal: (Z, nearest-neighbour distance in A, Morse depth D in eV, radius R in A)
METALS = {"Ni": (28, 2.49, 0.42, 1.245), "Cu": (29, 2.56, 0.34, 1.28), "Pd": (46, 2.75, 0.40, 1.375),
          "Ag": (47, 2.89, 0.33, 1.445), "Pt": (78, 2.77, 0.55, 1.385), "Au": (79, 2.88, 0.45, 1.44)}
# adsorbate element: (Z, D, R)
ADSORBATE = {"H": (1, 0.35, 0.55), "C": (6, 0.70, 0.80), "N": (7, 0.60, 0.75), "O": (8, 0.65, 0.72)}
MORSE_A = 1.8                 # 1/A
REFERENCE_ENERGY = {28: -0.9, 29: -0.8, 46: -1.0, 47: -0.7, 78: -1.3, 79: -0.9, 1: -0.5, 6: -1.6, 7: -1.3, 8: -1.1}


@dataclass(frozen=True)
class Shape:
    surface: int            # surface atoms along each lattice vector
    layers: int             # metal layers
    max_adsorbate: int      # adsorbate atoms, 1..max
    rattle: float           # displacement std, A
    vacuum: float           # A above the top layer (> cutoff)
    potential_cutoff: float
    radius: float           # the graph's (model.cutoff)
    max_neighbors: int

    @classmethod
    def of(cls, cfg: dict) -> "Shape":
        s = cfg["data"]["synthetic"]
        return cls(s["surface"], s["layers"], s["max_adsorbate"], s["rattle"], s["vacuum"], s["potential_cutoff"],
                   float(cfg["model"]["cutoff"]), cfg["data"]["max_neighbors"])


def morse_params(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    depth, radius = {}, {}
    for _, (zz, _, d, r) in METALS.items():
        depth[zz], radius[zz] = d, r
    for _, (zz, d, r) in ADSORBATE.items():
        depth[zz], radius[zz] = d, r
    return np.array([depth[int(v)] for v in z]), np.array([radius[int(v)] for v in z])


def energy_forces(pos: np.ndarray, cell: np.ndarray, z: np.ndarray, cutoff: float) -> tuple[float, np.ndarray]:
    """The Morse energy (eV) and forces (eV/A) of one periodic structure, float64."""
    edge_index, offsets, dist = radius_graph_pbc(pos, cell, cutoff, 10 ** 6)
    j, i = edge_index
    vec = pos[j] + offsets @ cell - pos[i]              # from i to j's image
    depth, radius = morse_params(z)
    d_ab = np.sqrt(depth[i] * depth[j])
    r_ab = radius[i] + radius[j]
    ex = np.exp(-MORSE_A * (dist - r_ab))
    morse = d_ab * ((1 - ex) ** 2 - 1)
    dmorse = d_ab * 2 * (1 - ex) * MORSE_A * ex
    fc = 0.5 * (np.cos(np.pi * dist / cutoff) + 1)
    dfc = -0.5 * np.pi / cutoff * np.sin(np.pi * dist / cutoff)
    energy = 0.5 * float(np.sum(morse * fc))           # each pair twice
    de_dr = 0.5 * (dmorse * fc + morse * dfc)
    # dE/dpos_i of one directed pair: -de_dr * unit(vec); its twin (j as centre) adds as much
    unit = vec / dist[:, None]
    forces = np.zeros_like(pos)
    np.add.at(forces, i, 2 * de_dr[:, None] * unit)    # F_i = -dE/dpos_i = +de_dr * unit, both directions
    return energy, forces


def make_structure(shape: Shape, rng: np.random.Generator) -> dict:
    """One slab + adsorbate, its energy, forces and graph, as the record's fields (float64
    numpy before the cast)."""
    metal = list(METALS)[int(rng.integers(len(METALS)))]
    zm, nn, _, _ = METALS[metal]
    s, layers = shape.surface, shape.layers
    a1 = np.array([nn, 0.0, 0.0])
    a2 = np.array([nn / 2, nn * math.sqrt(3) / 2, 0.0])
    dz = nn * math.sqrt(2.0 / 3.0)
    abc = [np.zeros(2), (a1[:2] + a2[:2]) / 3, 2 * (a1[:2] + a2[:2]) / 3]   # fcc stacking A B C
    pos, z, tags = [], [], []
    for layer in range(layers):
        for u in range(s):
            for v in range(s):
                xy = u * a1[:2] + v * a2[:2] + abc[layer % 3]
                pos.append([xy[0], xy[1], layer * dz])
                z.append(zm)
                tags.append(0 if layer < layers // 2 else 1)
    top = (layers - 1) * dz
    n_ads = int(rng.integers(1, shape.max_adsorbate + 1))
    site = rng.random(2) @ np.stack([s * a1[:2], s * a2[:2]])
    names = list(ADSORBATE)
    first = names[int(rng.integers(1, len(names)))]     # C, N or O binds to the surface
    elems = [first] + [names[int(rng.integers(len(names)))] for _ in range(n_ads - 1)]
    anchor = np.array([site[0], site[1], top + 1.9])
    for k, e in enumerate(elems):
        if k == 0:
            p = anchor
        else:
            direction = rng.normal(size=3)
            direction[2] = abs(direction[2]) + 0.5
            p = anchor + 1.1 * direction / np.linalg.norm(direction) * (k ** 0.5)
        pos.append(list(p))
        z.append(ADSORBATE[e][0])
        tags.append(2)
    pos = np.array(pos, np.float64)
    pos += rng.normal(scale=shape.rattle, size=pos.shape)
    cell = np.stack([s * a1, s * a2, np.array([0.0, 0.0, top + 3.0 + shape.vacuum])])
    z = np.array(z, np.float64)
    energy, forces = energy_forces(pos, cell, z, shape.potential_cutoff)
    energy -= sum(REFERENCE_ENERGY[int(v)] for v in z)
    edge_index, offsets, _ = radius_graph_pbc(pos, cell, shape.radius, shape.max_neighbors)
    tags = np.array(tags, np.int64)
    return {"pos": pos, "z": z, "cell": cell, "energy": energy, "forces": forces, "tags": tags,
            "fixed": (tags == 0).astype(np.float64), "edge_index": edge_index, "cell_offsets": offsets}


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    if n < 2:
        return np.arange(n)
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


def to_fields(s: dict, sid: int, fid: int) -> dict:
    import torch
    n = len(s["z"])
    return {"pos": torch.tensor(s["pos"], dtype=torch.float32),
            "atomic_numbers": torch.tensor(s["z"], dtype=torch.float32),
            "cell": torch.tensor(s["cell"], dtype=torch.float32).view(1, 3, 3),
            "natoms": n,
            "edge_index": torch.from_numpy(s["edge_index"]),
            "cell_offsets": torch.from_numpy(s["cell_offsets"]),
            "y": float(s["energy"]),
            "force": torch.tensor(s["forces"], dtype=torch.float32),
            "fixed": torch.tensor(s["fixed"], dtype=torch.float32),
            "tags": torch.from_numpy(s["tags"]),
            "sid": sid, "fid": fid}


@dataclass(frozen=True)
class FileJob:
    split: str
    index: int              # file number
    first: int              # first sample index of the split in this file
    count: int
    seed: int
    shuffle: bool
    shape: Shape
    path: str


def _write_file(job: FileJob) -> dict:
    recs, natoms, edges, fmean = [], [], [], []
    for k in range(job.count):
        i = job.first + k
        rng = np.random.default_rng([job.seed, SPLIT_SALT[job.split], i])
        s = make_structure(job.shape, rng)
        if job.shuffle:
            free = np.nonzero(s["fixed"] == 0)[0]
            perm = derangement(len(free), np.random.default_rng([job.seed, SPLIT_SALT[job.split], i, SHUFFLE_SALT]))
            s["forces"][free] = s["forces"][free[perm]]
        free = s["fixed"] == 0
        fmean.append(float(np.abs(s["forces"][free]).mean()))
        natoms.append(len(s["z"]))
        edges.append(s["edge_index"].shape[1])
        recs.append(records.dumps_record(to_fields(s, sid=i, fid=0)))
    size = records.write_lmdb(Path(job.path), recs)
    return {"file": Path(job.path).name, "records": job.count, "bytes": size, "atoms": natoms, "edges": edges,
            "free_force_abs_mean": fmean}


def split_files(n: int, files: int) -> list[int]:
    """Records per file: n over min(files, n) files, as even as possible (array_split)."""
    files = max(1, min(files, n))
    return [len(c) for c in np.array_split(np.arange(n), files)]


def write_dataset(out: str | os.PathLike, cfg: dict, n_train: int, n_valid: int, seed: int = 0,
                  workers: int | None = None, shuffle_labels: bool = False) -> dict:
    """Write DIR/train, DIR/validation (LMDB files) and DIR/manifest.json; returns the manifest."""
    if n_train < 1 or n_valid < 1:
        raise KitError(f"datagen: --train and --valid must be >= 1 (got {n_train}, {n_valid})")
    shape = Shape.of(cfg)
    if shape.vacuum <= shape.radius:
        raise KitError(f"config key 'data.synthetic.vacuum': {shape.vacuum} A must exceed model.cutoff "
                       f"{shape.radius} A (no neighbours across the vacuum, as in OC20's slabs)")
    root = Path(out)
    ensure_new_dir(root, "datagen --out", "hpckit datagen writes")
    counts = {"train": n_train, "validation": n_valid}
    jobs = []
    for split in SPLITS:
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        first = 0
        for f, count in enumerate(split_files(counts[split], cfg["data"]["synthetic"]["lmdb_files"])):
            jobs.append(FileJob(split, f, first, count, seed, shuffle_labels, shape,
                                str(d / (records.FILE_PATTERN % f))))
            first += count
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    with worker_pool(workers) as pool:
        done = list(pool.map(_write_file, jobs, chunksize=1)) if pool else [_write_file(j) for j in jobs]
    per_split = {split: [r for j, r in zip(jobs, done) if j.split == split] for split in SPLITS}
    summary = {}
    for split, files in per_split.items():
        atoms = [a for f in files for a in f["atoms"]]
        edges = [e for f in files for e in f["edges"]]
        forces = [m for f in files for m in f["free_force_abs_mean"]]
        summary[split] = {"files": [{k: f[k] for k in ("file", "records", "bytes")} for f in files],
                          "atoms_mean": float(np.mean(atoms)), "edges_mean": float(np.mean(edges)),
                          "free_force_abs_mean": float(np.mean(forces))}
    manifest = {
        "benchmark": "oc20",
        "generator": "hpckit.oc20.synthetic",
        "generator_version": GENERATOR_VERSION,
        "format": "lmdb (data.NNNN.lmdb, subdir=False; pickled torch_geometric Data, PyG 1.x layout)",
        "seed": seed,
        "shuffled_labels": shuffle_labels,
        "counts": counts,
        "structure": {"surface": shape.surface, "layers": shape.layers, "max_adsorbate": shape.max_adsorbate,
                      "rattle_A": shape.rattle, "vacuum_A": shape.vacuum, "metals": list(METALS),
                      "adsorbate_elements": list(ADSORBATE)},
        "potential": {"kind": "Morse pair potential with a cosine cutoff", "a_per_A": MORSE_A,
                      "cutoff_A": shape.potential_cutoff},
        "graph": {"radius_A": shape.radius, "max_neighbors": shape.max_neighbors},
        "splits": summary,
    }
    atomic_write_text(root / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest
