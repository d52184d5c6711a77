"""Residue tables the OpenFold loss and its ground-truth features need beyond the model's.

The model module (hpckit.openfold.model) holds the AlphaFold residue geometry: the 20 residue
types, the 37 atom types, each residue's atom14 layout, rigid groups and chi-angle atoms
(model.TABLES, model._CHIS). This module adds only what the loss needs and the model does not
have, and derives the rest from the model's tables (nothing is written twice):

* CHI_PI_PERIODIC: which chi angles are pi-periodic (residue_constants.py:101-125);
* RENAMING_SWAPS: the atom pairs whose names are ambiguous, the ground truth being compared
  under both namings (RESIDUE_ATOM_RENAMING_SWAPS, residue_constants.py:383-388);
* derived from the model's tables, in the layout the reference's transforms build them
  (data/transforms.py): atom14 -> atom37 indices, the chi angles' atom37 indices and mask, the
  atom14 renaming permutation and ambiguity mask, the rigid groups' base atoms, existence and
  ambiguity.

Citations are `file:line` in mlcommons/hpc@2c627d4 openfold/openfold/.
Every table has 21 rows: the 20 residue types in the reference's order and the unknown type
(all zeros / identity), as the reference's transforms pad them.
"""

from __future__ import annotations

import numpy as np

from hpckit.openfold import model as M

NUM_TYPES = 21   # the 20 amino acids and UNK (residue_constants.py:622-625)

# residue_constants.py:101-125: chi angles unchanged by a rotation of pi (the two ring or
# carboxyl halves are alike): ASP chi2, GLU chi3, PHE chi2, TYR chi2.
_PI_PERIODIC = {"ASP": 1, "GLU": 2, "PHE": 1, "TYR": 1}
CHI_PI_PERIODIC = np.zeros((NUM_TYPES, 4))
for _name, _chi in _PI_PERIODIC.items():
    CHI_PI_PERIODIC[M.RESNAMES.index(_name), _chi] = 1.0

# residue_constants.py:383-388
RENAMING_SWAPS = {"ASP": (("OD1", "OD2"),), "GLU": (("OE1", "OE2"),),
                  "PHE": (("CD1", "CD2"), ("CE1", "CE2")), "TYR": (("CD1", "CD2"), ("CE1", "CE2"))}


def _tables() -> dict[str, np.ndarray]:
    t = M.TABLES
    atom14_to_atom37 = np.zeros((NUM_TYPES, 14), np.int64)     # 0 for empty slots (transforms.py:603-606)
    names14 = [[""] * 14 for _ in range(NUM_TYPES)]
    for r in range(NUM_TYPES - 1):
        for a in np.flatnonzero(t["atom37_mask"][r]):
            atom14_to_atom37[r, t["atom37_to_atom14"][r, a]] = a
            names14[r][t["atom37_to_atom14"][r, a]] = M.ATOM37[a]

    # chi angles: the four atoms of each (0 where undefined) and which exist (transforms.py:891-914,
    # residue_constants.py:30-99)
    chis = M._parse_table(M._CHIS)
    chi_atoms = np.zeros((NUM_TYPES, 4, 4), np.int64)
    chi_mask = np.zeros((NUM_TYPES, 4))
    for r, name in enumerate(M.RESNAMES):
        for k, atoms in enumerate(chis.get(name, [])):
            chi_atoms[r, k] = [M.ATOM37.index(a) for a in atoms]
            chi_mask[r, k] = 1.0

    # ambiguous atom names: the permutation swapping each pair and the atoms in a pair
    # (transforms.py:699-755)
    perm = np.tile(np.arange(14), (NUM_TYPES, 1))
    ambiguous = np.zeros((NUM_TYPES, 14))
    for name, pairs in RENAMING_SWAPS.items():
        r = M.RESNAMES.index(name)
        for a, b in pairs:
            i, j = names14[r].index(a), names14[r].index(b)
            perm[r, i], perm[r, j] = j, i
            ambiguous[r, i] = ambiguous[r, j] = 1.0

    # rigid groups: the three atoms each group's frame is built from (x axis from the second
    # towards the first reversed, origin at the second, the third in the xy plane), which groups
    # a residue type has, and which are ambiguous (the last chi of the swappable residues)
    # (transforms.py:767-786, 855-860)
    base = np.zeros((NUM_TYPES, 8, 3), np.int64)
    base[:, 0] = [M.ATOM37.index(a) for a in ("C", "CA", "N")]
    base[:, 3] = [M.ATOM37.index(a) for a in ("CA", "C", "O")]
    group_exists = np.zeros((NUM_TYPES, 8))
    group_exists[:, 0] = group_exists[:, 3] = 1.0
    group_exists[:, 4:] = chi_mask
    for r in range(NUM_TYPES - 1):
        for k in range(4):
            if chi_mask[r, k]:
                base[r, 4 + k] = chi_atoms[r, k, 1:]
    group_ambiguous = np.zeros((NUM_TYPES, 8))
    for name in RENAMING_SWAPS:
        r = M.RESNAMES.index(name)
        group_ambiguous[r, 4 + int(chi_mask[r].sum()) - 1] = 1.0

    return {"atom14_to_atom37": atom14_to_atom37, "atom37_to_atom14": t["atom37_to_atom14"],
            "atom14_mask": t["atom14_mask"].astype(np.float64), "atom37_mask": t["atom37_mask"].astype(np.float64),
            "chi_atoms": chi_atoms, "chi_mask": chi_mask, "chi_pi_periodic": CHI_PI_PERIODIC,
            "rename_perm": perm, "atom14_ambiguous": ambiguous, "group_base_atoms": base,
            "group_exists": group_exists, "group_ambiguous": group_ambiguous}


TABLES = _tables()
ATOM14_NAMES = tuple(tuple(M.ATOM37[a] if TABLES["atom14_mask"][r, i] else "" for i, a in enumerate(row))
                     for r, row in enumerate(TABLES["atom14_to_atom37"]))
