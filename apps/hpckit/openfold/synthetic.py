"""Synthetic OpenFold data in the MLPerf reference's processed layout (hpckit.openfold.records).

    DIR/pdb_mmcif/processed/chains.csv
    DIR/pdb_mmcif/processed/obsolete.dat
    DIR/pdb_mmcif/processed/dicts/<xy>                   pickled {pdb_id: mmcif_dict}
    DIR/open_protein_set/processed/pdb_alignments/super.index, 0.db, 1.db, ...
    DIR/manifest.json                                    what was generated (the kit's; not the reference's)

Proteins whose structure follows from their sequence, so that a small model can learn it:

* Residue classes: helix formers (AELMQKR), strand formers (VIYFWTC), the rest (GPNDSH) coil.
  A residue's secondary structure is the majority class of the five residues around it (a tie
  goes to its own class, else to the first of C, E, H), helices shorter than 4 and strands
  shorter than 3 made coil (`secondary_structure`).
* The backbone is built from ideal geometry (N-CA 1.458, CA-C 1.525, C-N 1.329 A; angles 111.2,
  116.2, 121.7 degrees; omega 180) and the torsions of that structure: helix (-57, -47), strand
  (-120, 130), coil by residue (G (75, 20), P (-65, 145), N and D (-90, 0), others (-75, 150));
  O on the peptide plane, CB from the ideal tetrahedron (none for glycine); then a random
  rotation and translation and 0.02 A of noise (`backbone`). Only N, CA, C, O and CB are
  present (all_atom_mask); a quarter of the chains have 1 to 3 unobserved residues at a
  terminus (mask all False, as for residues missing from a crystal structure).
* Families (one PDB cluster each): a root sequence drawn segment by segment (SEGMENTS: helices
  of 7 to 14, strands of 4 to 8, loops of 2 to 5 residues, drawn 45 : 30 : 25; `segments`, a
  config's data.synthetic.segments, sets other weights and lengths; 85 % of the residues from
  the segment's class), its members conservative mutants (12 % of the residues replaced within their
  class): the same fold. A member entry is a monomer, or (15 %) a homodimer whose two author
  chains share one alignment entry (as OpenProteinSet's duplicate chains do); some chains'
  author chain maps to two mmCIF chains (a ligand's).
* MSAs (uniref90_hits.a3m, bfd_uniclust_hits.a3m, mgnify_hits.a3m): the query first, then
  copies of it mutated at 5 to 50 % of the residues (75 % within the class), 4 % deletions
  ('-'), 2 % insertions (lower case), a third of them covering only part of the query.
* Templates (pdb70_hits.hhr): the other members of the chain's family, hhsearch's format,
  aligned residue for residue; a few named by an obsolete id that obsolete.dat maps to the
  member's entry.

The splits, as the reference selects them (records.training_chains, records.validation_chains
with train.py's default dates): `n_train` training chains released 1995-01-01 to 2021-06-30,
plus four the training filter drops (resolution 9.5 A, no cluster, a residue type above 80 %,
released after 2021-09-16); `n_valid` validation chains that are the first CAMEO targets of
2021-09-17 to 2021-12-11, each entry named by the target's PDB id, its mmCIF chain the target's
(a third with a different author chain id), released on the submission date, each its own
family.

Sabotage (`shuffle_labels`, for checks that must FAIL): each training chain's structure is
built from another, random sequence of its length, so it no longer follows its own (the
validation chains keep theirs).

Deterministic for a seed. The output is a new directory, written whole or not at all
(fileio.staged_dir: built beside it and renamed into place), each file atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hpckit.common.errors import KitError
from hpckit.common.fileio import atomic_write_bytes, check_new_dir, check_path, ensure_writable_dir, staged_dir
from hpckit.openfold import records

GENERATOR_VERSION = 1
BENCHMARK = "openfold"

HELIX, STRAND, COIL = "AELMQKR", "VIYFWTC", "GPNDSH"
CLASS_LETTERS = {"H": HELIX, "E": STRAND, "C": COIL}
CLASS_OF = {**{a: "H" for a in HELIX}, **{a: "E" for a in STRAND}, **{a: "C" for a in COIL}}
ALL20 = "ARNDCQEGHILKMFPSTWYV"
SS_TORSIONS = {"H": (-57.0, -47.0), "E": (-120.0, 130.0)}
COIL_TORSIONS = {"G": (75.0, 20.0), "P": (-65.0, 145.0), "N": (-90.0, 0.0), "D": (-90.0, 0.0)}
COIL_DEFAULT = (-75.0, 150.0)
N_CA, CA_C, C_N, C_O = 1.458, 1.525, 1.329, 1.231
ANGLE_N_CA_C, ANGLE_CA_C_N, ANGLE_C_N_CA, ANGLE_CA_C_O = 111.2, 116.2, 121.7, 120.5
ATOM_N, ATOM_CA, ATOM_C, ATOM_CB, ATOM_O = 0, 1, 2, 3, 4   # atom37 order (residue_constants.py:521-526)
NOISE_A = 0.02

TRAIN_DATES = ("1995-01-01", "2021-06-30")
FILTERED_OUT = ("resolution 9.5 A", "in no cluster", "a residue type above 80 %", "released after 2021-09-16")
# OpenProteinSet's files of a chain, in the order the preprocessing's sorted glob("*/*") concatenates
# them (preprocess_open_protein_set.py:499-508: a3m/..., then hhr/...)
ALIGNMENT_FILES = ("bfd_uniclust_hits.a3m", "mgnify_hits.a3m", "uniref90_hits.a3m", "pdb70_hits.hhr")
SALT = {"family": 1, "member": 2, "valid": 3, "extra": 4, "msa": 5, "ids": 6, "shuffle": 7}


# ----------------------------------------------------------------- structure from sequence

def secondary_structure(sequence: str) -> str:
    """H, E or C per residue: the majority class of the window of five around it (see the module doc)."""
    cls = [CLASS_OF.get(a, "C") for a in sequence]
    ss = []
    for i in range(len(cls)):
        counts = Counter(cls[max(0, i - 2):i + 3])
        best = max(counts.values())
        tops = sorted(k for k, v in counts.items() if v == best)
        ss.append(cls[i] if cls[i] in tops else tops[0])
    out = list(ss)
    i = 0
    while i < len(ss):
        j = i
        while j < len(ss) and ss[j] == ss[i]:
            j += 1
        if (ss[i] == "H" and j - i < 4) or (ss[i] == "E" and j - i < 3):
            out[i:j] = ["C"] * (j - i)
        i = j
    return "".join(out)


def torsions(sequence: str, ss: str) -> list[tuple[float, float]]:
    return [SS_TORSIONS[s] if s in SS_TORSIONS else COIL_TORSIONS.get(a, COIL_DEFAULT) for a, s in zip(sequence, ss)]


def _sub(a, b):
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _unit(a):
    n = math.sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2])
    return (a[0] / n, a[1] / n, a[2] / n)


def place(a, b, c, bond: float, angle: float, torsion: float):
    """The atom d bonded to c with |cd| = bond, angle b-c-d and dihedral a-b-c-d in degrees (NeRF)."""
    bc = _unit(_sub(c, b))
    n = _unit(_cross(_sub(b, a), bc))
    m = _cross(n, bc)
    th, tau = math.radians(angle), math.radians(torsion)
    d0, d1, d2 = -bond * math.cos(th), bond * math.sin(th) * math.cos(tau), bond * math.sin(th) * math.sin(tau)
    return tuple(c[k] + d0 * bc[k] + d1 * m[k] + d2 * n[k] for k in range(3))


def backbone(sequence: str, geometry_from: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions float64 (L, 37, 3), mask bool (L, 37)) of the chain's ideal backbone, before
    rotation, noise and unobserved residues; its torsions those of `geometry_from` (sabotage),
    else of the sequence itself."""
    angles = torsions(geometry_from or sequence, secondary_structure(geometry_from or sequence))
    L = len(sequence)
    n_at, ca_at, c_at = [(0.0, 0.0, 0.0)], [(N_CA, 0.0, 0.0)], []
    th = math.radians(ANGLE_N_CA_C)
    c_at.append((N_CA - CA_C * math.cos(th), CA_C * math.sin(th), 0.0))
    for i in range(L - 1):
        psi, phi_next = angles[i][1], angles[i + 1][0]
        n_at.append(place(n_at[i], ca_at[i], c_at[i], C_N, ANGLE_CA_C_N, psi))
        ca_at.append(place(ca_at[i], c_at[i], n_at[i + 1], N_CA, ANGLE_C_N_CA, 180.0))
        c_at.append(place(c_at[i], n_at[i + 1], ca_at[i + 1], CA_C, ANGLE_N_CA_C, phi_next))
    pos = np.zeros((L, records.ATOM_TYPE_NUM, 3))
    mask = np.zeros((L, records.ATOM_TYPE_NUM), dtype=bool)
    pos[:, ATOM_N], pos[:, ATOM_CA], pos[:, ATOM_C] = n_at, ca_at, c_at
    for i in range(L):
        pos[i, ATOM_O] = place(n_at[i], ca_at[i], c_at[i], C_O, ANGLE_CA_C_O, angles[i][1] + 180.0)
    b = pos[:, ATOM_CA] - pos[:, ATOM_N]
    c = pos[:, ATOM_C] - pos[:, ATOM_CA]
    pos[:, ATOM_CB] = -0.58273431 * np.cross(b, c) + 0.56802827 * b - 0.54067466 * c + pos[:, ATOM_CA]
    mask[:, [ATOM_N, ATOM_CA, ATOM_C, ATOM_O, ATOM_CB]] = True
    glycine = np.array([a == "G" for a in sequence], dtype=bool)
    pos[glycine, ATOM_CB] = 0.0
    mask[glycine, ATOM_CB] = False
    return pos, mask


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def observed_structure(sequence: str, rng: np.random.Generator, built_from: str | None = None,
                       copies: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """The chain as deposited: `copies` placements of its backbone (a homodimer's second copy
    turned and set 30 A away), rotated, translated, with noise and unobserved termini;
    float32 positions (zero where unobserved) and the mask. `built_from`: the sequence the
    geometry is built from (sabotage), else the chain's own."""
    pos, mask = backbone(sequence, built_from)
    rot, shift = _rotation(rng), rng.normal(scale=10.0, size=3)
    center = pos[:, ATOM_CA].mean(axis=0)
    out = []
    for copy in range(copies):
        p = pos - center
        if copy:
            p = p @ np.diag([-1.0, 1.0, -1.0]) + np.array([30.0, 0.0, 0.0])
        p = p @ rot.T + shift + rng.normal(scale=NOISE_A, size=p.shape)
        m = mask.copy()
        if rng.random() < 0.25:
            m[:int(rng.integers(1, 4))] = False
        if rng.random() < 0.25:
            m[len(sequence) - int(rng.integers(1, 4)):] = False
        p[~m] = 0.0
        out.append((p.astype(np.float32), m))
    return out


# ----------------------------------------------------------------- sequences, MSAs, templates

# the root sequences' segments: class -> (weight, shortest, longest)
SEGMENTS = {"H": (0.45, 7, 14), "E": (0.3, 4, 8), "C": (0.25, 2, 5)}
SEGMENT_NAMES = {"helix": "H", "strand": "E", "coil": "C"}


def root_sequence(rng: np.random.Generator, length: int, segments: dict | None = None) -> str:
    segments = segments or SEGMENTS
    seq: list[str] = []
    while len(seq) < length:
        kind = "HEC"[int(rng.choice(3, p=[segments[k][0] for k in "HEC"]))]
        n = int({k: rng.integers(segments[k][1], segments[k][2] + 1) for k in "HEC"}[kind])
        for _ in range(n):
            pool = CLASS_LETTERS[kind] if rng.random() < 0.85 else ALL20
            seq.append(pool[int(rng.integers(len(pool)))])
    return "".join(seq[:length])


def conservative_mutant(rng: np.random.Generator, sequence: str, rate: float) -> str:
    out = list(sequence)
    for i in np.flatnonzero(rng.random(len(sequence)) < rate):
        pool = CLASS_LETTERS[CLASS_OF[sequence[i]]]
        out[i] = pool[int(rng.integers(len(pool)))]
    return "".join(out)


def a3m_text(rng: np.random.Generator, query_name: str, query: str, depth: int, database: str) -> str:
    """An a3m file: the query, then depth - 1 mutated homologs (see the module doc)."""
    L = len(query)
    lines = [f">{query_name}", query]
    for r in range(depth - 1):
        rate = rng.uniform(0.05, 0.5)
        chars = list(query)
        same = rng.random(L) < 0.75
        for i in np.flatnonzero(rng.random(L) < rate):
            pool = CLASS_LETTERS[CLASS_OF.get(query[i], "C")] if same[i] else ALL20
            chars[i] = pool[int(rng.integers(len(pool)))]
        for i in np.flatnonzero(rng.random(L) < 0.04):
            chars[i] = "-"
        first, last = 0, L
        if rng.random() < 0.3:
            first = int(rng.integers(0, L // 3 + 1))
            last = int(rng.integers(max(first + 1, 2 * L // 3), L + 1))
            chars[:first] = "-" * first
            chars[last:] = "-" * (L - last)
        inserts = rng.random(L) < 0.02
        row = []
        for i, c in enumerate(chars):
            row.append(c)
            if inserts[i] and first <= i < last - 1:
                row.append("".join(ALL20[int(k)] for k in rng.integers(0, 20, int(rng.integers(1, 4)))).lower())
        token = int(rng.integers(0, 16 ** 8))
        header = {"uniref90": f"UniRef90_A{token:08X}/{first + 1}-{last}",
                  "bfd": f"SRR{token % 10 ** 7:07d}_{r}", "mgnify": f"MGYP{token:012d}"}[database]
        lines += [f">{header}", "".join(row)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Hit:
    name: str           # "pdbid_chain" as pdb70 names it (an author chain id)
    sequence: str
    identity: float


def hhr_text(query_name: str, query: str, hits: list[Hit]) -> str:
    """An hhsearch result in its text format (what parsers.py:254-373 reads): the header, the
    hit table, then each hit's section (No, >name, the summary line, Q and T lines of 80
    columns with consensus lines), every hit aligned residue for residue to the whole query."""
    L = len(query)
    lines = [f"Query         {query_name}", f"Match_columns {L}", "No_of_seqs    1 out of 1", "Neff          1.0",
             f"Searched_HMMs {len(hits)}", "Date          Thu Sep 16 00:00:00 2021",
             "Command       hhsearch -i query.a3m -d pdb70 (hpckit synthetic)", "",
             " No Hit                             Prob E-value P-value  Score    SS Cols Query HMM  Template HMM"]
    summary = []
    for k, hit in enumerate(hits, 1):
        prob = 50.0 + 49.9 * hit.identity
        score = 2.0 * L * hit.identity
        evalue = 10.0 ** (-score / 10.0)
        lines.append(f"{k:3d} {hit.name + ' synthetic homolog':<30.30} {prob:5.1f} {evalue:7.2g} {evalue / 1e4:7.2g} "
                     f"{score:6.1f} {0.0:5.1f} {L:4d} {1:4d}-{L:<4d} {1:4d}-{L:<4d}({L})")
        summary.append((prob, evalue, score))
    lines.append("")
    for k, (hit, (prob, evalue, score)) in enumerate(zip(hits, summary), 1):
        ident = round(100 * hit.identity)
        lines += [f"No {k}", f">{hit.name} synthetic homolog",
                  f"Probab={prob:.2f}  E-value={evalue:.2g}  Score={score:.2f}  Aligned_cols={L}  "
                  f"Identities={ident}%  Similarity={hit.identity * 2:.3f}  Sum_probs={prob / 100 * L:.1f}  "
                  f"Template_Neff={1.0:.3f}", ""]
        for b in range(0, L, 80):
            q, t = query[b:b + 80], hit.sequence[b:b + 80]
            match = "".join("|" if x == y else "+" if CLASS_OF.get(x) == CLASS_OF.get(y) else " "
                            for x, y in zip(q, t))
            lines += [f"Q {query_name[:14]:<15}{b + 1:4d} {q} {b + len(q):4d} ({L})",
                      f"Q Consensus     {b + 1:4d} {q.lower()} {b + len(q):4d} ({L})",
                      f"{'':22}{match}",
                      f"T Consensus     {b + 1:4d} {t.lower()} {b + len(t):4d} ({L})",
                      f"T {hit.name[:14]:<15}{b + 1:4d} {t} {b + len(t):4d} ({L})", ""]
    lines.append("Done!")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- the data set's plan

@dataclass
class SynthChain:
    author: str
    mmcif_ids: list[str]
    sequence: str
    positions: np.ndarray
    mask: np.ndarray
    cluster: int
    family: int
    split: str           # "train", "valid" or "filtered"


@dataclass
class Entry:
    pdb_id: str
    release_date: str
    resolution: float
    exptl_method: str
    chains: list[SynthChain] = field(default_factory=list)
    ligands: dict[str, str] = field(default_factory=dict)   # mmCIF chain -> author chain

    def mmcif_dict(self) -> dict:
        """The entry as mmcif.py:196-206 makes it, atoms compressed as compress_mmcif_dict_atoms
        does (mmcif.py:210-230)."""
        entities: dict[str, list[str]] = {}
        by_sequence: dict[str, str] = {}
        for c in self.chains:
            eid = by_sequence.setdefault(c.sequence, str(len(by_sequence) + 1))
            entities.setdefault(eid, []).extend(c.mmcif_ids[:1])
        for mmcif_id in self.ligands:
            entities[str(len(entities) + 1)] = [mmcif_id]
        mapping = {c.mmcif_ids[0]: c.author for c in self.chains}
        mapping.update(self.ligands)
        return {
            "pdb_id": self.pdb_id,
            "exptl_method": self.exptl_method,
            "release_date": self.release_date,
            "resolution": self.resolution,
            "author_chain_ids": [c.author for c in self.chains],
            "entity_id_to_mmcif_chain_ids": entities,
            "mmcif_chain_id_to_author_chain_id": mapping,
            "sequences": {c.author: c.sequence for c in self.chains},
            "atoms": {c.author: {"all_atom_positions": (zlib.compress(c.positions.tobytes()), c.positions.shape),
                                 "all_atom_mask": (zlib.compress(c.mask.tobytes()), c.mask.shape)}
                      for c in self.chains},
        }

    def rows(self) -> list[records.Chain]:
        return [records.Chain(f"{self.pdb_id}_{c.author}", self.pdb_id, c.author, ";".join(c.mmcif_ids),
                              self.release_date, self.resolution, c.cluster, len(c.sequence), c.sequence)
                for c in self.chains]


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def _date(rng: np.random.Generator, first: str, last: str) -> str:
    a, b = np.datetime64(first), np.datetime64(last)
    return str(a + np.timedelta64(int(rng.integers(0, int((b - a).astype(int)) + 1)), "D"))


class _Ids:
    """Fresh PDB ids: a digit 1-6 then three letters or digits, never a CAMEO target's."""

    def __init__(self, seed: int, taken: set[str]):
        self.rng, self.taken = _rng(seed, SALT["ids"]), set(taken)

    def new(self) -> str:
        chars = "0123456789abcdefghijklmnopqrstuvwxyz"
        while True:
            pid = "123456"[int(self.rng.integers(6))] + "".join(chars[int(k)] for k in self.rng.integers(0, 36, 3))
            if pid not in self.taken:
                self.taken.add(pid)
                return pid


def cameo_targets_in_window() -> list[tuple[str, str]]:
    """(submission date, target) of the CAMEO targets train.py's default window selects, in order."""
    return [(date, t) for date, ids in records.CAMEO_TARGETS.items()
            if records.VAL_MIN_CAMEO_SUBMISSION_DATE <= date <= records.VAL_MAX_CAMEO_SUBMISSION_DATE for t in ids]


def _chain(rng: np.random.Generator, sequence: str, author: str, mmcif_id: str, cluster: int, family: int,
           split: str, copies: int = 1, built_from: str | None = None) -> list[SynthChain]:
    """The chain (a homodimer: its two copies, author and mmCIF ids the next letters)."""
    return [SynthChain(chr(ord(author) + k), [chr(ord(mmcif_id) + k)], sequence, p, m, cluster, family, split)
            for k, (p, m) in enumerate(observed_structure(sequence, rng, built_from, copies))]


def plan(n_train: int, n_valid: int, seed: int, min_length: int, max_length: int,
         shuffle_labels: bool = False, segments: dict | None = None) -> tuple[list[Entry], dict[str, str]]:
    """The entries of the data set and obsolete.dat's {old id: new id}."""
    cameo = cameo_targets_in_window()
    ids = _Ids(seed, {records.parse_cameo_target(t).split("_")[0] for _, t in cameo})
    entries: list[Entry] = []
    family = 0
    count = 0
    while count < n_train:    # training families
        frng = _rng(seed, SALT["family"], family)
        root = root_sequence(frng, int(frng.integers(min_length, max_length + 1)), segments)
        for member in range(int(frng.integers(1, 4))):
            if count >= n_train:
                break
            mrng = _rng(seed, SALT["member"], family, member)
            seq = root if member == 0 else conservative_mutant(mrng, root, 0.12)
            copies = 2 if n_train - count >= 2 and mrng.random() < 0.15 else 1
            built_from = None
            if shuffle_labels:
                built_from = root_sequence(_rng(seed, SALT["shuffle"], family, member), len(seq), segments)
            nmr = mrng.random() < 0.1
            entry = Entry(ids.new(), _date(mrng, *TRAIN_DATES),
                          float("nan") if nmr else round(float(mrng.uniform(1.2, 3.5)), 2),
                          "SOLUTION NMR" if nmr else "X-RAY DIFFRACTION")
            entry.chains = _chain(mrng, seq, "A", "A", family, family, "train", copies, built_from)
            if mrng.random() < 0.3:     # a ligand's mmCIF chain under the protein's author chain
                ligand = chr(ord("A") + copies)
                entry.chains[0].mmcif_ids.append(ligand)
                entry.ligands[ligand] = "A"
            entries.append(entry)
            count += copies
        family += 1
    for k, why in enumerate(FILTERED_OUT):   # what the training filter drops
        erng = _rng(seed, SALT["extra"], k)
        length = int(erng.integers(min_length, max_length + 1))
        seq = root_sequence(erng, length, segments)
        cluster = family
        date = _date(erng, *TRAIN_DATES)
        resolution = round(float(erng.uniform(1.2, 3.5)), 2)
        if why.startswith("resolution"):
            resolution = 9.5
        elif why == "in no cluster":
            cluster = -1
        elif why.startswith("a residue type"):
            seq = "".join("Q" if erng.random() < 0.9 else a for a in seq)
        else:
            date = "2021-10-05"
        entry = Entry(ids.new(), date, resolution, "X-RAY DIFFRACTION")
        entry.chains = _chain(erng, seq, "A", "A", cluster, family, "filtered")
        entries.append(entry)
        family += 1
    if n_valid > len(cameo):
        raise KitError(f"datagen openfold: --valid {n_valid}: the reference validates on the CAMEO targets of "
                       f"{records.VAL_MIN_CAMEO_SUBMISSION_DATE} to {records.VAL_MAX_CAMEO_SUBMISSION_DATE}, "
                       f"{len(cameo)} of them")
    by_id: dict[str, Entry] = {}
    for k, (date, target) in enumerate(cameo[:n_valid]):
        vrng = _rng(seed, SALT["valid"], k)
        pdb_id, mmcif_id = records.parse_cameo_target(target).split("_")
        entry = by_id.get(pdb_id)
        if entry is None:
            entry = by_id[pdb_id] = Entry(pdb_id, date, round(float(vrng.uniform(1.2, 3.5)), 2), "X-RAY DIFFRACTION")
            entries.append(entry)
        taken = {c.author for c in entry.chains} | {m for c in entry.chains for m in c.mmcif_ids}
        author = mmcif_id
        if k % 3 == 1 and mmcif_id < "Z" and chr(ord(mmcif_id) + 1) not in taken:   # author != mmCIF id
            author = chr(ord(mmcif_id) + 1)
        seq = root_sequence(vrng, int(vrng.integers(min_length, max_length + 1)), segments)
        [chain] = _chain(vrng, seq, author, mmcif_id, family, family, "valid")
        entry.chains.append(chain)
        family += 1
    # obsolete.dat: an old id for every fourth training entry; hhr names some templates by it
    obsolete = {ids.new(): e.pdb_id for e in entries[::4] if e.chains[0].split == "train"}
    return entries, obsolete


# ----------------------------------------------------------------- files

def chains_csv(entries: list[Entry]) -> bytes:
    """chains.csv as preprocess_pdb_mmcif.py writes it (:189-247, 371-375): dicts files in name
    order, entries in id order within one, chains in author_chain_ids order."""
    import csv
    import io
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(records.CHAINS_COLUMNS)
    for entry in sorted(entries, key=lambda e: (e.pdb_id[1:3], e.pdb_id)):
        for row in entry.rows():
            writer.writerow(row.csv_row())
    return buf.getvalue().encode()


def obsolete_dat(obsolete: dict[str, str]) -> bytes:
    """PDB's obsolete.dat: a title line, then 'OBSLTE    DD-MON-YY OLD      NEW' (the columns
    templates.py:197-201 reads), and one withdrawn entry without a successor."""
    lines = [" LIST OF OBSOLETE COORDINATE ENTRIES AND SUCCESSORS"]
    for k, (old, new) in enumerate(sorted(obsolete.items())):
        lines.append(f"OBSLTE    {1 + k % 28:02d}-JAN-{90 + k % 10:02d} {old.upper()}     {new.upper()}")
    lines.append("OBSLTE    31-JUL-94 116L")
    return ("\n".join(lines) + "\n").encode()


def shard_of(name: str, num_shards: int) -> int:
    """hash_string_into_number(name) % num_shards (helpers.py:58-63; preprocess_open_protein_set.py:584)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") % num_shards


def alignments(entries: list[Entry], obsolete: dict[str, str], seed: int, msa_depth: int,
               num_shards: int) -> dict[str, bytes]:
    """The shards and super.index (preprocess_open_protein_set.py:479-512, 549-631): one
    alignment directory per distinct sequence (its first chain id names it, the others are its
    duplicates), sharded by the hash of that name, each shard the directory's files
    concatenated, every duplicate keyed to the same entry."""
    chains = [(f"{e.pdb_id}_{c.author}", e, c) for e in entries for c in e.chains]
    groups: dict[str, list] = {}
    for key, e, c in sorted(chains, key=lambda t: t[0]):
        groups.setdefault(c.sequence, []).append((key, e, c))
    old_of = {new: old for old, new in sorted(obsolete.items())}
    family_members: dict[int, list] = {}
    for key, e, c in sorted(chains, key=lambda t: t[0]):
        if c.split == "train" and c.author == e.chains[0].author:
            family_members.setdefault(c.family, []).append((key, e, c))
    shards: dict[int, list] = {s: [] for s in range(num_shards)}
    for group in groups.values():
        shards[shard_of(group[0][0], num_shards)].append(group)
    files: dict[str, bytes] = {}
    index: dict[str, dict] = {}
    for shard_id, shard_groups in shards.items():
        name = records.SHARD_NAME.format(shard_id)
        blob = bytearray()
        for group in sorted(shard_groups, key=lambda g: g[0][0]):
            key, entry, chain = group[0]
            rng = _rng(seed, SALT["msa"], int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little"))
            depth = int(rng.integers(max(2, msa_depth // 2), msa_depth + 1))
            hits = []
            for hkey, hentry, hchain in family_members.get(chain.family, []):
                if hentry is entry or hchain.sequence == chain.sequence:
                    continue
                hid = hentry.pdb_id
                if hid in old_of and rng.random() < 0.5:
                    hid = old_of[hid]
                same = sum(a == b for a, b in zip(chain.sequence, hchain.sequence)) / len(chain.sequence)
                hits.append(Hit(f"{hid}_{hchain.author}", hchain.sequence, same))
            hits.sort(key=lambda h: -h.identity)
            texts = {"bfd_uniclust_hits.a3m": a3m_text(rng, key, chain.sequence, depth, "bfd"),
                     "mgnify_hits.a3m": a3m_text(rng, key, chain.sequence, max(1, depth // 2), "mgnify"),
                     "uniref90_hits.a3m": a3m_text(rng, key, chain.sequence, depth, "uniref90"),
                     "pdb70_hits.hhr": hhr_text(key, chain.sequence, hits[:20])}
            item = {"db": name, "files": []}
            for fname in ALIGNMENT_FILES:
                data = texts[fname].encode()
                item["files"].append([fname, len(blob), len(data)])
                blob += data
            for member_key, _, _ in group:
                index[member_key] = item
        files[f"{records.ALIGNMENTS_DIR}/{name}"] = bytes(blob)
    files[f"{records.ALIGNMENTS_DIR}/{records.SUPER_INDEX}"] = json.dumps(index).encode()
    return files


def dataset_files(entries: list[Entry], obsolete: dict[str, str], seed: int, msa_depth: int,
                  num_shards: int) -> dict[str, bytes]:
    """Every file of the layout, by its path under the data set's root."""
    base = records.PDB_MMCIF_DIR
    files = {f"{base}/{records.CHAINS_CSV}": chains_csv(entries),
             f"{base}/{records.OBSOLETE_DAT}": obsolete_dat(obsolete)}
    by_file: dict[str, dict] = {}
    for entry in sorted(entries, key=lambda e: e.pdb_id):
        by_file.setdefault(entry.pdb_id[1:3], {})[entry.pdb_id] = entry.mmcif_dict()
    for name, dicts in sorted(by_file.items()):
        # pickle.dump's default protocol of the reference's Python 3.8 (preprocess_pdb_mmcif.py:171-172)
        files[f"{base}/{records.DICTS_DIR}/{name}"] = pickle.dumps(dicts, protocol=4)
    files.update(alignments(entries, obsolete, seed, msa_depth, num_shards))
    return files


def parse_segments(segments: dict | None) -> dict:
    """{"H"|"E"|"C": (weight, shortest, longest)} from a config's data.synthetic.segments,
    {helix|strand|coil: [weight, shortest, longest]} (the classes it names replace SEGMENTS')."""
    out = dict(SEGMENTS)
    if segments is None:
        return out
    if not isinstance(segments, dict) or set(segments) - set(SEGMENT_NAMES):
        raise KitError(f"datagen openfold: segments must map some of {', '.join(SEGMENT_NAMES)} to "
                       f"[weight, shortest, longest] (got {segments!r:.100})")
    for name, value in segments.items():
        ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if not ok or not (0 <= value[0] <= 1e6 and isinstance(value[1], int) and isinstance(value[2], int)
                          and 1 <= value[1] <= value[2] <= records.VAL_MAX_SEQUENCE_LENGTH):
            raise KitError(f"datagen openfold: segments.{name} must be [weight 0..1e6, shortest >= 1, longest >= "
                           f"shortest, at most {records.VAL_MAX_SEQUENCE_LENGTH} (a chain's length)] "
                           f"(got {value!r:.60})")
        out[SEGMENT_NAMES[name]] = (float(value[0]), int(value[1]), int(value[2]))
    total = sum(out[k][0] for k in "HEC")
    if not total > 0:
        raise KitError("datagen openfold: segments: the weights sum to 0")
    if segments:
        out = {k: (out[k][0] / total, out[k][1], out[k][2]) for k in "HEC"}
    return out


def write_dataset(out: str | os.PathLike, n_train: int, n_valid: int, seed: int = 0, crop: int = 32, *,
                  min_length: int | None = None, max_length: int | None = None, msa_depth: int = 16,
                  num_shards: int = 2, shuffle_labels: bool = False, segments: dict | None = None) -> dict:
    """Write the data set into `out` (a new or empty directory; its parents are created) and
    return its manifest. Chain lengths are drawn from min_length..max_length (default
    max(12, crop // 2) .. 2 * crop: some shorter than the crop, most longer)."""
    # upper bounds (docs/security.md "Bounds"): the reference's 594,595 chains, MSAs of up to
    # 10,000 sequences, 10 shards, crop 256 (transforms.DATA_BOUNDS)
    for name, value, low, high in (("n_train", n_train, 1, 1 << 20), ("n_valid", n_valid, 1, 1 << 20),
                                   ("crop", crop, 4, 4096), ("msa_depth", msa_depth, 1, 1 << 14),
                                   ("num_shards", num_shards, 1, 4096)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise KitError(f"datagen openfold: {name} must be an integer in {low}..{high} (got {value!r:.40})")
    root = check_path(out, f"datagen --out {out}")
    if not root.parent.exists():
        ensure_writable_dir(root.parent, "datagen --out")
    check_new_dir(root, "datagen --out", "hpckit datagen writes")   # before the work, not after it
    min_length = max(12, crop // 2) if min_length is None else min_length
    max_length = max(min_length, 2 * crop) if max_length is None else max_length
    if not 10 <= min_length <= max_length <= records.VAL_MAX_SEQUENCE_LENGTH:
        raise KitError(f"datagen openfold: chain lengths {min_length}..{max_length}: need 10 <= min <= max <= "
                       f"{records.VAL_MAX_SEQUENCE_LENGTH} (the reference's templates need 10 residues, its "
                       "validation takes at most 700)")
    segs = parse_segments(segments)
    entries, obsolete = plan(n_train, n_valid, seed, min_length, max_length, shuffle_labels, segs)
    files = dataset_files(entries, obsolete, seed, msa_depth, num_shards)
    lengths = {s: [len(c.sequence) for e in entries for c in e.chains if c.split == s]
               for s in ("train", "valid", "filtered")}
    manifest = {
        "benchmark": BENCHMARK,
        "generator": "hpckit.openfold.synthetic",
        "generator_version": GENERATOR_VERSION,
        "format": "the MLPerf reference's processed layout (hpc@2c627d4 openfold/README.md:79-91)",
        "seed": seed,
        "shuffled_labels": shuffle_labels,
        "counts": {"train": n_train, "validation": n_valid, "filtered_out": len(FILTERED_OUT)},
        "filtered_out": list(FILTERED_OUT),
        "lengths": {s: {"min": min(v), "max": max(v), "mean": float(np.mean(v))} for s, v in lengths.items() if v},
        "crop": crop,
        "msa_depth": msa_depth,
        "num_shards": num_shards,
        "selection": {"train_max_pdb_release_date": records.TRAIN_MAX_PDB_RELEASE_DATE,
                      "val_min_cameo_submission_date": records.VAL_MIN_CAMEO_SUBMISSION_DATE,
                      "val_max_cameo_submission_date": records.VAL_MAX_CAMEO_SUBMISSION_DATE,
                      "val_max_sequence_length": records.VAL_MAX_SEQUENCE_LENGTH},
        "paths": {"pdb_mmcif_chains_filepath": f"{records.PDB_MMCIF_DIR}/{records.CHAINS_CSV}",
                  "pdb_mmcif_dicts_dirpath": f"{records.PDB_MMCIF_DIR}/{records.DICTS_DIR}",
                  "pdb_obsolete_filepath": f"{records.PDB_MMCIF_DIR}/{records.OBSOLETE_DAT}",
                  "pdb_alignments_dirpath": records.ALIGNMENTS_DIR},
        "structure": {"atoms": ["N", "CA", "C", "O", "CB"], "noise_A": NOISE_A,
                      "segments": {name: list(segs[k]) for name, k in SEGMENT_NAMES.items()},
                      "classes": {"helix": HELIX, "strand": STRAND, "coil": COIL}},
    }
    files["manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    with staged_dir(root, "datagen --out", "hpckit datagen writes") as tmp:
        for rel, data in sorted(files.items()):
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data, "datagen --out")
    return manifest


def datagen_command(args) -> int:
    """`hpckit datagen openfold` (the shape of hpckit.oc20.commands.datagen): --out, --train,
    --valid, --seed, --config (counts and sizes from the config's data block: n_train, n_valid,
    crop_size, and an optional data.synthetic mapping of min_length, max_length, msa_depth,
    num_shards, segments), --shuffle-labels."""
    if (getattr(args, "format", "tfrecord") != "tfrecord" or getattr(args, "size", None) is not None
            or getattr(args, "height", None) is not None or getattr(args, "width", None) is not None):
        raise KitError("datagen openfold: --format, --size, --height and --width are CosmoFlow and DeepCAM options; "
                       "OpenFold's chains are sized by the config's data block")
    data: dict = {}
    if args.config is not None:
        from hpckit.common.config import load_config
        data = load_config(BENCHMARK, args.config).get("data") or {}
    elif args.train is None or args.valid is None:
        raise KitError("datagen: give --train and --valid, or --config to take the counts from")
    n_train = args.train if args.train is not None else data.get("n_train")
    n_valid = args.valid if args.valid is not None else data.get("n_valid")
    if n_train is None or n_valid is None:
        raise KitError(f"datagen openfold: config {args.config}: no data.n_train / data.n_valid; give --train and "
                       "--valid")
    synth = data.get("synthetic") or {}
    if not isinstance(synth, dict):
        raise KitError(f"datagen openfold: config {args.config}: data.synthetic is not a mapping")
    unknown = set(synth) - {"min_length", "max_length", "msa_depth", "num_shards", "segments"}
    if unknown:
        raise KitError(f"datagen openfold: config {args.config}: unknown key data.synthetic.{sorted(unknown)[0]}")
    manifest = write_dataset(args.out, n_train, n_valid, seed=args.seed, crop=data.get("crop_size", 32),
                             shuffle_labels=bool(getattr(args, "shuffle_labels", False)), **synth)
    t = manifest["lengths"]["train"]
    print(f"hpckit datagen openfold: wrote {n_train} training + {n_valid} validation chains "
          f"({t['min']}-{t['max']} residues; the reference's processed layout, seed {args.seed}"
          f"{', structures shuffled' if manifest['shuffled_labels'] else ''}) to {args.out}")
    return 0
