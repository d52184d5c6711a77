"""AlphaFold2 as the MLPerf HPC v3.0 OpenFold reference trains it, in plain PyTorch.

Followed: mlcommons/hpc@2c627d4 openfold/openfold/model/*.py (the modules), config.py (the
hyperparameters of the initial_training preset train.py:477-480 builds: configs/reference.yaml),
rigid_utils.py (the frames of the structure module) and data/residue_constants.py (the
rigid-group geometry of the 20 amino acids). Citations below are `file:line` in
hpc@2c627d4 openfold/openfold/ (model/ files by name alone).

Parameter names: the same as the reference's AlphaFold.state_dict(), name for name and shape
for shape (every module has the attribute names of its reference counterpart), so a reference
checkpoint loads with load_state_dict(strict=True) and ours into the reference; at the
reference config 93,229,082 parameters, the count the MLPerf checker requires
(mlcommons/logging closed_openfold.yaml:53-56). tests/test_openfold_model.py checks the count and
compares the forward with the reference's on shared weights.

forward(batch) takes the reference's feature dict (AlphaFold.forward, alphafold.py:84-117):
every tensor has a leading batch dimension and a trailing recycling dimension R, the first R-1
iterations run without autograd and feed the next (recycling), the last with autograd. With
B batch, N residues, S clustered MSA rows, E extra rows, T templates it reads
  aatype [B,N,R] int, residue_index [B,N,R], seq_mask [B,N,R], target_feat [B,N,22,R],
  msa_feat [B,S,N,49,R], msa_mask [B,S,N,R], extra_msa [B,E,N,R] int, extra_has_deletion,
  extra_deletion_value, extra_msa_mask [B,E,N,R], residx_atom37_to_atom14 [B,N,37,R] int,
  atom37_atom_exists [B,N,37,R], and with templates template_aatype [B,T,N,R] int,
  template_all_atom_positions [B,T,N,37,3,R], template_all_atom_mask [B,T,N,37,R],
  template_pseudo_beta [B,T,N,3,R], template_pseudo_beta_mask [B,T,N,R], template_mask [B,T,R],
  template_torsion_angles_sin_cos and template_alt_torsion_angles_sin_cos [B,T,N,7,2,R],
  template_torsion_angles_mask [B,T,N,7,R] (other keys are ignored; example_batch makes one),
and returns the reference's output dict (K structure-module blocks):
  msa [B,S,N,c_m], pair [B,N,N,c_z], single [B,N,c_s], sm_frames [B,K,N,7] (quaternion,
  translation in A), sm_sidechain_frames [B,K,N,8,4,4], sm_unnormalized_angles and sm_angles
  [B,K,N,7,2], sm_positions [B,K,N,14,3], sm_states [B,K,N,c_s], sm_single [B,N,c_s],
  final_atom_positions [B,N,37,3], final_atom_mask [B,N,37], final_affine_tensor [B,N,7],
  lddt_logits [B,N,50], plddt [B,N], distogram_logits [B,N,N,64], masked_msa_logits [B,S,N,23],
  experimentally_resolved_logits [B,N,37] (and tm_logits [B,N,N,64] with the TM head enabled).
Outputs are in the input features' dtype (fp32), except that the frames are always fp32: the
reference's Rigid and Rotation force fp32 (rigid_utils.py:336-340, 877-878), kept here.

Done differently, same function (docs/differences-from-reference.md):
  * no chunking (the reference's chunk sizes are None in the initial_training preset),
    no custom kernels; gradient checkpointing per block of the three stacks in the last
    iteration of a training forward, as the reference, switchable (model.gradient_checkpointing),
    with torch.utils.checkpoint's non-reentrant variant (the reference takes the default);
  * no fp32 islands under fp16 autocast (the reference leaves autocast for the outer product
    mean, triangle multiplication, IPA's logits and the distogram head when fp16 autocast is
    on; its train.py refuses fp16, bf16 and amp, so they never run in MLPerf);
  * initialisation: the reference's schemes (linear.py:28-134) drawn with torch's generator
    (trunc_normal_) instead of scipy's truncnorm on numpy's global generator: same
    distributions, other numbers (MLPerf's closed division starts from the reference's
    checkpoint anyway);
  * rigid transformations are plain tensors (rotation matrices, quaternions, translations)
    and functions instead of rigid_utils' Rigid/Rotation classes; the atoms' frames are
    gathered by group index instead of a one-hot masked sum; IPA's value points are summed
    with einsum instead of a broadcast product and sum (different summation order:
    fp32 rounding differences only);
  * the template unit-vector feature (off in the reference's config: use_unit_vector false,
    multiplied by 0) takes the backbone frame by Gram-Schmidt instead of
    Rigid.make_transform_from_reference's rotation sequence (the same frame; eps placed
    differently);
  * with the TM-score head enabled (off in the MLPerf config) only tm_logits is returned, not
    the reference's predicted TM score and aligned error;
  * dropout multiplies out of place (the reference's Dropout multiplies its input in place,
    dropout.py:57-69; the masks are drawn the same way).
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpckit.common.config import load_config, require

BENCHMARK = "openfold"

# ------------------------------------------------------------------ residue geometry (data)
# data/residue_constants.py: the 20 residue types in the reference's order (:597-619), the 37
# atom types (:521-559), and per residue its atom14 names (:568-592) with each atom's rigid
# group (0 backbone, 3 psi, 4-7 chi1-4) and position in that group's frame, in Angstrom
# (RIGID_GROUP_ATOM_POSITIONS :139-350); listed here in atom14 order.
RESTYPES = "ARNDCQEGHILKMFPSTWYV"
RESNAMES = ("ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE", "LEU", "LYS", "MET",
            "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL")
ATOM37 = ("N CA C CB O CG CG1 CG2 OG OG1 SG CD CD1 CD2 ND1 ND2 OD1 OD2 SD CE CE1 CE2 CE3 NE NE1 NE2 "
          "OE1 OE2 CH2 NH1 NH2 OH CZ CZ2 CZ3 NZ OXT").split()
GLY, CA, CB = RESTYPES.index("G"), ATOM37.index("CA"), ATOM37.index("CB")

_ATOMS = """
ALA: N 0 -0.525 1.363 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.627 1.062 0; CB 0 -0.529 -0.774 -1.205
ARG: N 0 -0.524 1.362 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.626 1.062 0; CB 0 -0.524 -0.778 -1.209;
     CG 4 0.616 1.390 0; CD 5 0.564 1.414 0; NE 6 0.539 1.357 0; CZ 7 0.758 1.093 0; NH1 7 0.206 2.301 0;
     NH2 7 2.078 0.978 0
ASN: N 0 -0.536 1.357 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.625 1.062 0; CB 0 -0.531 -0.787 -1.200;
     CG 4 0.584 1.399 0; OD1 5 0.633 1.059 0; ND2 5 0.593 -1.188 0.001
ASP: N 0 -0.525 1.362 0; CA 0 0 0 0; C 0 1.527 0 0; O 3 0.626 1.062 0; CB 0 -0.526 -0.778 -1.208;
     CG 4 0.593 1.398 0; OD1 5 0.610 1.091 0; OD2 5 0.592 -1.101 -0.003
CYS: N 0 -0.522 1.362 0; CA 0 0 0 0; C 0 1.524 0 0; O 3 0.625 1.062 0; CB 0 -0.519 -0.773 -1.212;
     SG 4 0.728 1.653 0
GLN: N 0 -0.526 1.361 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.626 1.062 0; CB 0 -0.525 -0.779 -1.207;
     CG 4 0.615 1.393 0; CD 5 0.587 1.399 0; OE1 6 0.634 1.060 0; NE2 6 0.593 -1.189 -0.001
GLU: N 0 -0.528 1.361 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.626 1.062 0; CB 0 -0.526 -0.781 -1.207;
     CG 4 0.615 1.392 0; CD 5 0.600 1.397 0; OE1 6 0.607 1.095 0; OE2 6 0.589 -1.104 -0.001
GLY: N 0 -0.572 1.337 0; CA 0 0 0 0; C 0 1.517 0 0; O 3 0.626 1.062 0
HIS: N 0 -0.527 1.360 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.625 1.063 0; CB 0 -0.525 -0.778 -1.208;
     CG 4 0.600 1.370 0; ND1 5 0.744 1.160 0; CD2 5 0.889 -1.021 0.003; CE1 5 2.030 0.851 0.002;
     NE2 5 2.145 -0.466 0.004
ILE: N 0 -0.493 1.373 0; CA 0 0 0 0; C 0 1.527 0 0; O 3 0.627 1.062 0; CB 0 -0.536 -0.793 -1.213;
     CG1 4 0.534 1.437 0; CG2 4 0.540 -0.785 -1.199; CD1 5 0.619 1.391 0
LEU: N 0 -0.520 1.363 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.625 1.063 0; CB 0 -0.522 -0.773 -1.214;
     CG 4 0.678 1.371 0; CD1 5 0.530 1.430 0; CD2 5 0.535 -0.774 1.200
LYS: N 0 -0.526 1.362 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.626 1.062 0; CB 0 -0.524 -0.778 -1.208;
     CG 4 0.619 1.390 0; CD 5 0.559 1.417 0; CE 6 0.560 1.416 0; NZ 7 0.554 1.387 0
MET: N 0 -0.521 1.364 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.625 1.062 0; CB 0 -0.523 -0.776 -1.210;
     CG 4 0.613 1.391 0; SD 5 0.703 1.695 0; CE 6 0.320 1.786 0
PHE: N 0 -0.518 1.363 0; CA 0 0 0 0; C 0 1.524 0 0; O 3 0.626 1.062 0; CB 0 -0.525 -0.776 -1.212;
     CG 4 0.607 1.377 0; CD1 5 0.709 1.195 0; CD2 5 0.706 -1.196 0; CE1 5 2.102 1.198 0; CE2 5 2.098 -1.201 0;
     CZ 5 2.794 -0.003 -0.001
PRO: N 0 -0.566 1.351 0; CA 0 0 0 0; C 0 1.527 0 0; O 3 0.621 1.066 0; CB 0 -0.546 -0.611 -1.293;
     CG 4 0.382 1.445 0; CD 5 0.477 1.424 0
SER: N 0 -0.529 1.360 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.626 1.062 0; CB 0 -0.518 -0.777 -1.211;
     OG 4 0.503 1.325 0
THR: N 0 -0.517 1.364 0; CA 0 0 0 0; C 0 1.526 0 0; O 3 0.626 1.062 0; CB 0 -0.516 -0.793 -1.215;
     OG1 4 0.472 1.353 0; CG2 4 0.550 -0.718 -1.228
TRP: N 0 -0.521 1.363 0; CA 0 0 0 0; C 0 1.525 0 0; O 3 0.627 1.062 0; CB 0 -0.523 -0.776 -1.212;
     CG 4 0.609 1.370 0; CD1 5 0.824 1.091 0; CD2 5 0.854 -1.148 -0.005; NE1 5 2.140 0.690 -0.004;
     CE2 5 2.186 -0.678 -0.007; CE3 5 0.622 -2.530 -0.007; CZ2 5 3.283 -1.543 -0.011;
     CZ3 5 1.715 -3.389 -0.011; CH2 5 3.028 -2.890 -0.013
TYR: N 0 -0.522 1.362 0; CA 0 0 0 0; C 0 1.524 0 0; O 3 0.627 1.062 0; CB 0 -0.522 -0.776 -1.213;
     CG 4 0.607 1.382 0; CD1 5 0.716 1.195 0; CD2 5 0.713 -1.194 -0.001; CE1 5 2.107 1.200 -0.002;
     CE2 5 2.104 -1.201 -0.003; CZ 5 2.791 -0.001 -0.003; OH 5 4.168 -0.002 -0.005
VAL: N 0 -0.494 1.373 0; CA 0 0 0 0; C 0 1.527 0 0; O 3 0.627 1.062 0; CB 0 -0.533 -0.795 -1.213;
     CG1 4 0.540 1.429 0; CG2 4 0.533 -0.776 1.203
"""

# The four atoms of each chi angle (CHI_ANGLES_ATOMS, residue_constants.py:30-75).
_CHIS = """
ARG: N CA CB CG; CA CB CG CD; CB CG CD NE; CG CD NE CZ
ASN: N CA CB CG; CA CB CG OD1
ASP: N CA CB CG; CA CB CG OD1
CYS: N CA CB SG
GLN: N CA CB CG; CA CB CG CD; CB CG CD OE1
GLU: N CA CB CG; CA CB CG CD; CB CG CD OE1
HIS: N CA CB CG; CA CB CG ND1
ILE: N CA CB CG1; CA CB CG1 CD1
LEU: N CA CB CG; CA CB CG CD1
LYS: N CA CB CG; CA CB CG CD; CB CG CD CE; CG CD CE NZ
MET: N CA CB CG; CA CB CG SD; CB CG SD CE
PHE: N CA CB CG; CA CB CG CD1
PRO: N CA CB CG; CA CB CG CD
SER: N CA CB OG
THR: N CA CB OG1
TRP: N CA CB CG; CA CB CG CD1
TYR: N CA CB CG; CA CB CG CD1
VAL: N CA CB CG1
"""


def _parse_table(text: str) -> dict[str, list[list[str]]]:
    """'RES: item; item; ...' per residue, indented lines continuing the one above."""
    rows, name = {}, None
    for line in text.strip().splitlines():
        if not line[0].isspace():
            name, line = line.split(":")
            rows[name] = []
        rows[name] += [item.split() for item in line.split(";") if item.strip()]
    return rows


def _frame_4x4(ex: np.ndarray, ey: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """The frame with x along ex, y in the (ex, ey) plane, at origin
    (residue_constants.py:851-864)."""
    ex = ex / np.linalg.norm(ex)
    ey = ey - np.dot(ey, ex) * ex
    ey = ey / np.linalg.norm(ey)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = ex, ey, np.cross(ex, ey), origin
    return m


def residue_tables() -> dict[str, np.ndarray]:
    """The per-residue-type tables of the structure module and the features, 21 rows (the 20
    amino acids and an all-zero unknown type), as residue_constants.py:869-951 fills them:
    group_idx [21,14] (each atom14 slot's rigid group), atom14_mask [21,14],
    lit_positions [21,14,3] (float32), default_frames [21,8,4,4] (float32: each group's
    frame in its parent's: backbone and pre-omega identity, phi, psi, chi1 to backbone,
    chi2-4 to the previous chi), atom37_to_atom14 [21,37] and atom37_mask [21,37]."""
    atoms, chis = _parse_table(_ATOMS), _parse_table(_CHIS)
    t = {"group_idx": np.zeros((21, 14), np.int64), "atom14_mask": np.zeros((21, 14), np.float32),
         "lit_positions": np.zeros((21, 14, 3), np.float32),
         "default_frames": np.zeros((21, 8, 4, 4), np.float32),
         "atom37_to_atom14": np.zeros((21, 37), np.int64), "atom37_mask": np.zeros((21, 37), np.float32)}
    for r, name in enumerate(RESNAMES):
        pos = {}
        for i, (atom, group, *xyz) in enumerate(atoms[name]):
            pos[atom] = np.array([float(v) for v in xyz])
            t["group_idx"][r, i] = int(group)
            t["atom14_mask"][r, i] = 1
            t["lit_positions"][r, i] = pos[atom]
            t["atom37_to_atom14"][r, ATOM37.index(atom)] = i
            t["atom37_mask"][r, ATOM37.index(atom)] = 1
        f = t["default_frames"][r]
        f[0] = f[1] = np.eye(4)
        f[2] = _frame_4x4(pos["N"] - pos["CA"], np.array([1.0, 0.0, 0.0]), pos["N"])     # phi
        f[3] = _frame_4x4(pos["C"] - pos["CA"], pos["CA"] - pos["N"], pos["C"])           # psi
        for k, chi in enumerate(chis.get(name, [])):
            if k == 0:
                a0, a1, a2 = (pos[a] for a in chi[:3])
                f[4] = _frame_4x4(a2 - a1, a0 - a1, a2)
            else:   # the axis of chi k+1 starts at the origin of chi k's frame (:937-949)
                end = pos[chi[2]]
                f[4 + k] = _frame_4x4(end, np.array([-1.0, 0.0, 0.0]), end)
    return t


TABLES = residue_tables()


# ------------------------------------------------------------------ rigid transformations
# rigid_utils.py: rotation matrices [*,3,3], quaternions [*,4] (w, x, y, z), translations
# [*,3]; products written out element by element, as rot_matmul/rot_vec_mul (:26-94) do so that
# autocast keeps them in fp32.

def rot_vec(r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x, y, z = v.unbind(-1)
    return torch.stack([r[..., i, 0] * x + r[..., i, 1] * y + r[..., i, 2] * z for i in range(3)], -1)


def rot_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([
        torch.stack([a[..., i, 0] * b[..., 0, j] + a[..., i, 1] * b[..., 1, j] + a[..., i, 2] * b[..., 2, j]
                     for j in range(3)], -1)
        for i in range(3)], -2)


def quat_to_rot(q: torch.Tensor) -> torch.Tensor:
    """The rotation matrix of a unit quaternion (quat_to_rot, rigid_utils.py:177-199)."""
    w, x, y, z = q.unbind(-1)
    m = [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y),
         2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x),
         2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z]
    return torch.stack(m, -1).unflatten(-1, (3, 3))


def quat_mul_vec(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The Hamilton product q * (0, v) (quat_multiply_by_vec, rigid_utils.py:278-285)."""
    w, x, y, z = q.unbind(-1)
    a, b, c = v.unbind(-1)
    return torch.stack([-x * a - y * b - z * c, w * a + y * c - z * b,
                        w * b - x * c + z * a, w * c + x * b - y * a], -1)


class Frames(NamedTuple):
    """Rigid transformations x -> rot x + trans, both fp32 (the reference's Rigid forces fp32,
    rigid_utils.py:336-340, 877-878)."""
    rot: torch.Tensor     # [*, 3, 3]
    trans: torch.Tensor   # [*, 3]

    @staticmethod
    def make(rot: torch.Tensor, trans: torch.Tensor) -> "Frames":
        return Frames(rot.float(), trans.float())

    def apply(self, p: torch.Tensor) -> torch.Tensor:
        return rot_vec(self.rot, p) + self.trans

    def invert_apply(self, p: torch.Tensor) -> torch.Tensor:
        return rot_vec(self.rot.transpose(-1, -2), p - self.trans)

    def compose(self, other: "Frames") -> "Frames":
        return Frames.make(rot_mul(self.rot, other.rot), rot_vec(self.rot, other.trans) + self.trans)

    def unsqueeze(self, dim: int) -> "Frames":
        """A new axis among the frames' own dimensions (dim < 0 counts from the last of them)."""
        if dim < 0:
            return Frames(self.rot.unsqueeze(dim - 2), self.trans.unsqueeze(dim - 1))
        return Frames(self.rot.unsqueeze(dim), self.trans.unsqueeze(dim))

    def index(self, i) -> "Frames":
        """frames[..., i]: a slice of the last frame dimension."""
        return Frames(self.rot[..., i, :, :], self.trans[..., i, :])

    def to_4x4(self) -> torch.Tensor:
        bottom = self.trans.new_tensor([0.0, 0.0, 0.0, 1.0]).expand(*self.trans.shape[:-1], 1, 4)
        return torch.cat([torch.cat([self.rot, self.trans.unsqueeze(-1)], -1), bottom], -2)


def backbone_frames_from_atoms(n: torch.Tensor, ca: torch.Tensor, c: torch.Tensor, eps: float) -> Frames:
    """The backbone frame at CA with x towards C and N in the xy plane (y > 0), the frame
    Rigid.make_transform_from_reference builds by rotations (rigid_utils.py:1298-1366), here by
    Gram-Schmidt."""
    e1 = c - ca
    e1 = e1 / torch.sqrt(eps + (e1 ** 2).sum(-1, keepdim=True))
    e2 = n - ca
    e2 = e2 - (e2 * e1).sum(-1, keepdim=True) * e1
    e2 = e2 / torch.sqrt(eps + (e2 ** 2).sum(-1, keepdim=True))
    return Frames.make(torch.stack([e1, e2, torch.cross(e1, e2, dim=-1)], -1), ca)


# ------------------------------------------------------------------ building blocks

TRUNC_NORMAL_STD_FACTOR = 0.87962566103423978   # truncnorm(-2, 2).std() (linear.py:24-25)


def _init_weight(w: torch.Tensor, init: str) -> None:
    """The reference's Linear initialisations (linear.py:61-121): default = LeCun truncated
    normal, relu = He truncated normal, glorot = Glorot uniform, gating/final = zeros,
    normal = N(0, 1/fan_in)."""
    if w.is_meta:
        return
    with torch.no_grad():
        fan_in = w.shape[1]
        if init in ("default", "relu"):
            std = math.sqrt((2.0 if init == "relu" else 1.0) / max(1, fan_in)) / TRUNC_NORMAL_STD_FACTOR
            nn.init.trunc_normal_(w, mean=0.0, std=std, a=-2 * std, b=2 * std)
        elif init == "glorot":
            nn.init.xavier_uniform_(w, gain=1.0)
        elif init in ("gating", "final"):
            w.zero_()
        elif init == "normal":
            nn.init.kaiming_normal_(w, nonlinearity="linear")
        else:
            raise ValueError(f"unknown init {init!r}")


def linear(c_in: int, c_out: int, bias: bool = True, init: str = "default") -> nn.Linear:
    """nn.Linear with the reference's initialisation (linear.py:28-80; biases 0, gating 1)."""
    lin = nn.Linear(c_in, c_out, bias=bias)
    _init_weight(lin.weight, init)
    if bias and not lin.bias.is_meta:
        with torch.no_grad():
            lin.bias.fill_(1.0 if init == "gating" else 0.0)
    return lin


def layer_norm(c: int) -> nn.LayerNorm:
    return nn.LayerNorm(c, eps=1e-5)   # layer_norm.py:22-51 (F.layer_norm, eps 1e-5)


class Dropout(nn.Module):
    """Dropout with one mask shared along share_dim (dropout.py:24-83: rowwise shares dim -3,
    columnwise dim -2)."""

    def __init__(self, p: float, share_dim: int | None = None):
        super().__init__()
        self.p, self.share_dim = p, share_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        shape = list(x.shape)
        if self.share_dim is not None:
            shape[self.share_dim] = 1
        return x * F.dropout(x.new_ones(shape), p=self.p, training=True)


def attention(q, k, v, mask, bias, inf: float) -> torch.Tensor:
    """softmax(q k^T + (mask - 1) inf + bias) v over the last two axes (attention.py:276-311)."""
    a = torch.matmul(q, k.transpose(-1, -2))
    a = a + (mask - 1.0) * inf
    if bias is not None:
        a = a + bias
    return torch.matmul(torch.softmax(a, dim=-1), v)


class SelfAttentionWithGate(nn.Module):
    """Gated multi-head self-attention (attention.py:27-150)."""

    def __init__(self, c_qkv: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.c_hidden, self.num_heads, self.inf = c_hidden, num_heads, inf
        hc = c_hidden * num_heads
        self.linear_q = linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_k = linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_v = linear(c_qkv, hc, bias=False, init="glorot")
        self.linear_o = linear(hc, c_qkv, bias=True, init="final")
        self.linear_g = linear(c_qkv, hc, bias=True, init="gating")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:   # [*, Q, H*c] -> [*, H, Q, c]
        return x.unflatten(-1, (self.num_heads, self.c_hidden)).transpose(-2, -3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        q = self._heads(self.linear_q(x)) / math.sqrt(self.c_hidden)
        o = attention(q, self._heads(self.linear_k(x)), self._heads(self.linear_v(x)), mask, bias, self.inf)
        g = torch.sigmoid(self.linear_g(x)).unflatten(-1, (self.num_heads, self.c_hidden))
        return self.linear_o((o.transpose(-2, -3) * g).flatten(-2))


class CrossAttentionNoGate(nn.Module):
    """Multi-head attention of queries to other keys/values, no gate (attention.py:153-273)."""

    def __init__(self, c_q: int, c_kv: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.c_hidden, self.num_heads, self.inf = c_hidden, num_heads, inf
        hc = c_hidden * num_heads
        self.linear_q = linear(c_q, hc, bias=False, init="glorot")
        self.linear_k = linear(c_kv, hc, bias=False, init="glorot")
        self.linear_v = linear(c_kv, hc, bias=False, init="glorot")
        self.linear_o = linear(hc, c_q, bias=True, init="final")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.num_heads, self.c_hidden)).transpose(-2, -3)

    def forward(self, x_q, x_kv, mask, bias=None) -> torch.Tensor:
        q = self._heads(self.linear_q(x_q)) / math.sqrt(self.c_hidden)
        o = attention(q, self._heads(self.linear_k(x_kv)), self._heads(self.linear_v(x_kv)), mask, bias, self.inf)
        return self.linear_o(o.transpose(-2, -3).flatten(-2))


class GlobalAttention(nn.Module):
    """Global attention over the extra-MSA column: one averaged query per head, single-head
    keys and values (global_attention.py:27-139)."""

    def __init__(self, c_e: int, c_hidden: int, num_heads: int, inf: float, eps: float):
        super().__init__()
        self.c_hidden, self.num_heads, self.inf, self.eps = c_hidden, num_heads, inf, eps
        self.linear_q = linear(c_e, c_hidden * num_heads, bias=False, init="glorot")
        self.linear_k = linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_v = linear(c_e, c_hidden, bias=False, init="glorot")
        self.linear_g = linear(c_e, c_hidden * num_heads, bias=True, init="gating")
        self.linear_o = linear(c_hidden * num_heads, c_e, bias=True, init="final")

    def forward(self, m: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # m: [*, N_res, N_seq, c_e], mask: [*, N_res, N_seq]
        q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / torch.sum(mask, dim=-1).add(self.eps).unsqueeze(-1)
        q = self.linear_q(q) * math.sqrt(1 / self.c_hidden)
        q = q.unflatten(-1, (self.num_heads, self.c_hidden))                       # [*, N_res, H, c]
        a = torch.matmul(q, self.linear_k(m).transpose(-1, -2))                   # [*, N_res, H, N_seq]
        a = torch.softmax(a + ((mask - 1.0) * self.inf).unsqueeze(-2), dim=-1)
        o = torch.matmul(a, self.linear_v(m))                                    # [*, N_res, H, c]
        g = torch.sigmoid(self.linear_g(m)).unflatten(-1, (self.num_heads, self.c_hidden))
        return self.linear_o((o.unsqueeze(-3) * g).flatten(-2))


# ------------------------------------------------------------------ MSA and pair modules

class MSARowAttentionWithPairBias(nn.Module):
    """msa_row_attention_with_pair_bias.py:27-99 (Algorithm 7)."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.layer_norm_m = layer_norm(c_m)
        self.layer_norm_z = layer_norm(c_z)
        self.linear_z = linear(c_z, num_heads, bias=False, init="normal")
        self.mha = SelfAttentionWithGate(c_m, c_hidden, num_heads, inf)

    def forward(self, m, z, mask):
        bias = self.linear_z(self.layer_norm_z(z)).movedim(-1, -3).unsqueeze(-4)   # [B, 1, H, N, N]
        return self.mha(self.layer_norm_m(m), mask.unsqueeze(-2).unsqueeze(-3), bias)


class MSAColumnAttention(nn.Module):
    """msa_column_attention.py:26-93 (Algorithm 8)."""

    def __init__(self, c_m: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.layer_norm_m = layer_norm(c_m)
        self.mha = SelfAttentionWithGate(c_m, c_hidden, num_heads, inf)

    def forward(self, m, mask):
        m = self.layer_norm_m(m.transpose(-2, -3))
        mask = mask.transpose(-1, -2).unsqueeze(-2).unsqueeze(-3)
        return self.mha(m, mask, None).transpose(-2, -3)


class MSAColumnGlobalAttention(nn.Module):
    """msa_column_global_attention.py:26-90 (Algorithm 19)."""

    def __init__(self, c_e: int, c_hidden: int, num_heads: int, inf: float, eps: float):
        super().__init__()
        self.layer_norm_m = layer_norm(c_e)
        self.global_attention = GlobalAttention(c_e, c_hidden, num_heads, inf, eps)

    def forward(self, m, mask):
        m = self.layer_norm_m(m.transpose(-2, -3))
        return self.global_attention(m, mask.transpose(-1, -2)).transpose(-2, -3)


class Transition(nn.Module):
    """LayerNorm, Linear n*c (relu), ReLU, Linear back (final): MSATransition and PairTransition
    (msa_transition.py:24-65, pair_transition.py:24-65; the mask is not applied, as there)."""

    def __init__(self, c: int, n: int):
        super().__init__()
        self.layer_norm = layer_norm(c)
        self.linear_1 = linear(c, n * c, init="relu")
        self.linear_2 = linear(n * c, c, init="final")

    def forward(self, x, mask=None):
        return self.linear_2(torch.relu(self.linear_1(self.layer_norm(x))))


class OuterProductMean(nn.Module):
    """outer_product_mean.py:28-132 (Algorithm 10): the masked mean over sequences of the outer
    products, divided by (number of pairs + eps)."""

    def __init__(self, c_m: int, c_z: int, c_hidden: int, eps: float):
        super().__init__()
        self.c_hidden, self.eps = c_hidden, eps
        self.layer_norm = layer_norm(c_m)
        self.linear_1 = linear(c_m, c_hidden)
        self.linear_2 = linear(c_m, c_hidden)
        self.linear_out = linear(c_hidden * c_hidden, c_z, init="final")

    def forward(self, m, mask):
        m = self.layer_norm(m)
        mask = mask.unsqueeze(-1)                                   # [B, S, N, 1]
        a = (self.linear_1(m) * mask).transpose(-2, -3)             # [B, N, S, c]
        b = (self.linear_2(m) * mask).transpose(-2, -3)
        outer = torch.einsum("...bac,...dae->...bdce", a, b).flatten(-2)
        norm = torch.einsum("...abc,...adc->...bdc", mask, mask)    # [B, N, N, 1]
        return self.linear_out(outer) / (norm + self.eps)


class TriangleMultiplicativeUpdate(nn.Module):
    """triangular_multiplicative_update.py:25-122 (Algorithms 11, 12): outgoing
    z_ij += sum_k a_ik b_jk, incoming z_ij += sum_k a_ki b_kj."""

    def __init__(self, c_z: int, c_hidden: int, outgoing: bool):
        super().__init__()
        self.outgoing = outgoing
        self.linear_a_p = linear(c_z, c_hidden)
        self.linear_a_g = linear(c_z, c_hidden, init="gating")
        self.linear_b_p = linear(c_z, c_hidden)
        self.linear_b_g = linear(c_z, c_hidden, init="gating")
        self.linear_g = linear(c_z, c_z, init="gating")
        self.linear_z = linear(c_hidden, c_z, init="final")
        self.layer_norm_in = layer_norm(c_z)
        self.layer_norm_out = layer_norm(c_hidden)

    def forward(self, z, mask):
        z = self.layer_norm_in(z)
        mask = mask.unsqueeze(-1)
        a = torch.sigmoid(self.linear_a_g(z)) * mask * self.linear_a_p(z)
        b = torch.sigmoid(self.linear_b_g(z)) * mask * self.linear_b_p(z)
        if self.outgoing:   # channels first, then [c, i, k] @ [c, k, j]
            x = torch.matmul(a.movedim(-1, -3), b.swapdims(-1, -3))
        else:
            x = torch.matmul(a.swapdims(-1, -3), b.movedim(-1, -3))
        x = self.linear_z(self.layer_norm_out(x.movedim(-3, -1)))
        return x * torch.sigmoid(self.linear_g(z))


class TriangleAttention(nn.Module):
    """triangular_attention.py:27-107 (Algorithms 13, 14): attention along rows around the
    starting node, or along columns (on the transpose) around the ending node."""

    def __init__(self, c_z: int, c_hidden: int, num_heads: int, inf: float, starting: bool):
        super().__init__()
        self.starting = starting
        self.layer_norm = layer_norm(c_z)
        self.linear = linear(c_z, num_heads, bias=False, init="normal")
        self.mha = SelfAttentionWithGate(c_z, c_hidden, num_heads, inf)

    def forward(self, z, mask):
        if not self.starting:
            z, mask = z.transpose(-2, -3), mask.transpose(-1, -2)
        z = self.layer_norm(z)
        bias = self.linear(z).movedim(-1, -3).unsqueeze(-4)          # [B, 1, H, N, N]
        z = self.mha(z, mask.unsqueeze(-2).unsqueeze(-3), bias)
        return z if self.starting else z.transpose(-2, -3)


class EvoformerBlockCore(nn.Module):
    """The MSA transition, outer product mean and pair stack shared by the Evoformer and
    extra-MSA blocks (evoformer_block_core.py:36-157)."""

    def __init__(self, c_m: int, c_z: int, c_hidden_opm: int, c_hidden_tri_mul: int, c_hidden_tri_att: int,
                 num_heads_tri: int, transition_n: int, pair_dropout: float, inf: float, eps_opm: float):
        super().__init__()
        self.msa_transition = Transition(c_m, transition_n)
        self.outer_product_mean = OuterProductMean(c_m, c_z, c_hidden_opm, eps_opm)
        self.tri_mul_out = TriangleMultiplicativeUpdate(c_z, c_hidden_tri_mul, outgoing=True)
        self.tmo_dropout_rowwise = Dropout(pair_dropout, -3)
        self.tri_mul_in = TriangleMultiplicativeUpdate(c_z, c_hidden_tri_mul, outgoing=False)
        self.tmi_dropout_rowwise = Dropout(pair_dropout, -3)
        self.tri_att_start = TriangleAttention(c_z, c_hidden_tri_att, num_heads_tri, inf, starting=True)
        self.tasn_dropout_rowwise = Dropout(pair_dropout, -3)
        self.tri_att_end = TriangleAttention(c_z, c_hidden_tri_att, num_heads_tri, inf, starting=False)
        self.taen_dropout_columnwise = Dropout(pair_dropout, -2)
        self.pair_transition = Transition(c_z, transition_n)

    def forward(self, m, z, msa_mask, pair_mask):
        m = m + self.msa_transition(m)
        z = z + self.outer_product_mean(m, msa_mask)
        z = z + self.tmo_dropout_rowwise(self.tri_mul_out(z, pair_mask))
        z = z + self.tmi_dropout_rowwise(self.tri_mul_in(z, pair_mask))
        z = z + self.tasn_dropout_rowwise(self.tri_att_start(z, pair_mask))
        z = z + self.taen_dropout_columnwise(self.tri_att_end(z, pair_mask))
        z = z + self.pair_transition(z)
        return m, z


def _core(cfg: dict, c_m: int) -> EvoformerBlockCore:
    return EvoformerBlockCore(c_m, cfg["c_z"], cfg["c_hidden_opm"], cfg["c_hidden_tri_mul"],
                              cfg["c_hidden_tri_att"], cfg["num_heads_tri"], cfg["transition_n"],
                              cfg["pair_dropout"], cfg["inf"], cfg["eps_opm"])


class EvoformerBlock(nn.Module):
    """evoformer_block.py:28-137 (Algorithm 6)."""

    def __init__(self, cfg: dict):
        super().__init__()
        c_m = cfg["c_m"]
        self.msa_att_row = MSARowAttentionWithPairBias(c_m, cfg["c_z"], cfg["c_hidden_msa_att"],
                                                       cfg["num_heads_msa"], cfg["inf"])
        self.msa_att_col = MSAColumnAttention(c_m, cfg["c_hidden_msa_att"], cfg["num_heads_msa"], cfg["inf"])
        self.msa_dropout_rowwise = Dropout(cfg["msa_dropout"], -3)
        self.core = _core(cfg, c_m)

    def forward(self, m, z, msa_mask, pair_mask):
        m = m + self.msa_dropout_rowwise(self.msa_att_row(m, z, msa_mask))
        m = m + self.msa_att_col(m, msa_mask)
        return self.core(m, z, msa_mask, pair_mask)


class ExtraMSABlock(nn.Module):
    """extra_msa_block.py:28-140 (Algorithm 18): column attention is global."""

    def __init__(self, cfg: dict):
        super().__init__()
        c_e = cfg["c_e"]
        self.msa_att_row = MSARowAttentionWithPairBias(c_e, cfg["c_z"], cfg["c_hidden_msa_att"],
                                                       cfg["num_heads_msa"], cfg["inf"])
        self.msa_att_col = MSAColumnGlobalAttention(c_e, cfg["c_hidden_msa_att"], cfg["num_heads_msa"],
                                                    cfg["inf"], cfg["eps"])
        self.msa_dropout_rowwise = Dropout(cfg["msa_dropout"], -3)
        self.core = _core(cfg, c_e)

    def forward(self, m, z, msa_mask, pair_mask):
        m = m + self.msa_dropout_rowwise(self.msa_att_row(m, z, msa_mask))
        m = m + self.msa_att_col(m, msa_mask)
        return self.core(m, z, msa_mask, pair_mask)


def _run_blocks(blocks: Iterable[nn.Module], state: tuple, masks: tuple, use_checkpoint: bool) -> tuple:
    for block in blocks:
        if use_checkpoint:
            state = checkpoint(block, *state, *masks, use_reentrant=False)
        else:
            state = block(*state, *masks)
        state = state if isinstance(state, tuple) else (state,)
    return state


class ExtraMSAStack(nn.Module):
    """extra_msa_stack.py:27-170: updates the pair representation only."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.blocks = nn.ModuleList(ExtraMSABlock(cfg) for _ in range(cfg["num_blocks"]))

    def forward(self, m, z, msa_mask, pair_mask, gradient_checkpointing: bool = False):
        return _run_blocks(self.blocks, (m, z), (msa_mask, pair_mask), gradient_checkpointing)[1]


class EvoformerStack(nn.Module):
    """evoformer_stack.py:28-174; the single representation is a projection of the first MSA
    row."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(cfg) for _ in range(cfg["num_blocks"]))
        self.linear = linear(cfg["c_m"], cfg["c_s"])

    def forward(self, m, z, msa_mask, pair_mask, gradient_checkpointing: bool = False):
        m, z = _run_blocks(self.blocks, (m, z), (msa_mask, pair_mask), gradient_checkpointing)
        return m, z, self.linear(m[:, 0])


# ------------------------------------------------------------------ embedders and templates

class InputEmbedder(nn.Module):
    """input_embedder.py:26-125 (Algorithms 3-5)."""

    def __init__(self, tf_dim: int, msa_dim: int, c_z: int, c_m: int, relpos_k: int):
        super().__init__()
        self.relpos_k = relpos_k
        self.linear_tf_z_i = linear(tf_dim, c_z)
        self.linear_tf_z_j = linear(tf_dim, c_z)
        self.linear_tf_m = linear(tf_dim, c_m)
        self.linear_msa_m = linear(msa_dim, c_m)
        self.linear_relpos = linear(2 * relpos_k + 1, c_z)

    def forward(self, target_feat, residue_index, msa_feat):
        tf_i, tf_j = self.linear_tf_z_i(target_feat), self.linear_tf_z_j(target_feat)
        ri = residue_index.to(dtype=tf_j.dtype)
        bins = torch.arange(-self.relpos_k, self.relpos_k + 1, dtype=ri.dtype, device=ri.device)
        d = ri.unsqueeze(-1) - ri.unsqueeze(-2)
        nearest = (d.unsqueeze(-1) - bins).abs().argmin(dim=-1)          # the nearest bin (:115-125)
        z = self.linear_relpos(F.one_hot(nearest, len(bins)).to(dtype=d.dtype))
        z = z + tf_i.unsqueeze(-2)
        z = z + tf_j.unsqueeze(-3)
        m = self.linear_msa_m(msa_feat) + self.linear_tf_m(target_feat).unsqueeze(-3)
        return m, z


class RecyclingEmbedder(nn.Module):
    """recycling_embedder.py:26-107 (Algorithm 32): the previous iteration's first MSA row and
    pair representation (layer-normed) and a one-hot distogram of its pseudo-beta atoms."""

    def __init__(self, c_m: int, c_z: int, min_bin: float, max_bin: float, num_bins: int, inf: float):
        super().__init__()
        self.min_bin, self.max_bin, self.num_bins, self.inf = min_bin, max_bin, num_bins, inf
        self.linear = linear(num_bins, c_z)
        self.layer_norm_m = layer_norm(c_m)
        self.layer_norm_z = layer_norm(c_z)

    def forward(self, m0_prev, z_prev, x_prev):
        bins = torch.linspace(self.min_bin, self.max_bin, self.num_bins, dtype=x_prev.dtype, device=x_prev.device)
        lower = bins ** 2
        upper = torch.cat([lower[1:], lower.new_tensor([self.inf])])
        d = (x_prev.unsqueeze(-2) - x_prev.unsqueeze(-3)).pow(2).sum(dim=-1, keepdim=True)
        d = ((d > lower) & (d < upper)).to(dtype=x_prev.dtype)
        return self.layer_norm_m(m0_prev), self.linear(d) + self.layer_norm_z(z_prev)


class TemplateAngleEmbedder(nn.Module):
    """template_angle_embedder.py:23-58."""

    def __init__(self, ta_dim: int, c_m: int):
        super().__init__()
        self.linear_1 = linear(ta_dim, c_m, init="relu")
        self.linear_2 = linear(c_m, c_m, init="relu")

    def forward(self, x):
        return self.linear_2(torch.relu(self.linear_1(x)))


class TemplatePairEmbedder(nn.Module):
    """template_pair_embedder.py:23-59."""

    def __init__(self, tp_dim: int, c_t: int):
        super().__init__()
        self.linear = linear(tp_dim, c_t, init="relu")

    def forward(self, x):
        return self.linear(x)


class TemplatePairBlock(nn.Module):
    """template_pair_block.py:34-131 (Algorithm 16): triangle attention first, then the
    multiplicative updates, each template on its own."""

    def __init__(self, c_t: int, c_hidden_tri_att: int, c_hidden_tri_mul: int, num_heads_tri: int,
                 pair_transition_n: int, dropout_rate: float, inf: float):
        super().__init__()
        self.tri_att_start = TriangleAttention(c_t, c_hidden_tri_att, num_heads_tri, inf, starting=True)
        self.tasn_dropout_rowwise = Dropout(dropout_rate, -3)
        self.tri_att_end = TriangleAttention(c_t, c_hidden_tri_att, num_heads_tri, inf, starting=False)
        self.taen_dropout_columnwise = Dropout(dropout_rate, -2)
        self.tri_mul_out = TriangleMultiplicativeUpdate(c_t, c_hidden_tri_mul, outgoing=True)
        self.tmo_dropout_rowwise = Dropout(dropout_rate, -3)
        self.tri_mul_in = TriangleMultiplicativeUpdate(c_t, c_hidden_tri_mul, outgoing=False)
        self.tmi_dropout_rowwise = Dropout(dropout_rate, -3)
        self.pair_transition = Transition(c_t, pair_transition_n)

    def forward(self, t, mask):
        out = []
        for ti in t.unbind(dim=-4):   # t: [B, T, N, N, c_t]
            ti = ti + self.tasn_dropout_rowwise(self.tri_att_start(ti, mask))
            ti = ti + self.taen_dropout_columnwise(self.tri_att_end(ti, mask))
            ti = ti + self.tmo_dropout_rowwise(self.tri_mul_out(ti, mask))
            ti = ti + self.tmi_dropout_rowwise(self.tri_mul_in(ti, mask))
            out.append(ti + self.pair_transition(ti))
        return torch.stack(out, dim=-4)


class TemplatePairStack(nn.Module):
    """template_pair_stack.py:28-125."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.blocks = nn.ModuleList(
            TemplatePairBlock(cfg["c_t"], cfg["c_hidden_tri_att"], cfg["c_hidden_tri_mul"], cfg["num_heads_tri"],
                              cfg["pair_transition_n"], cfg["dropout_rate"], cfg["inf"])
            for _ in range(cfg["num_blocks"]))
        self.layer_norm = layer_norm(cfg["c_t"])

    def forward(self, t, mask, gradient_checkpointing: bool = False):
        return self.layer_norm(_run_blocks(self.blocks, (t,), (mask,), gradient_checkpointing)[0])


class TemplatePointwiseAttention(nn.Module):
    """template_pointwise_attention.py:25-99 (Algorithm 17): each pair attends over its
    templates."""

    def __init__(self, c_t: int, c_z: int, c_hidden: int, num_heads: int, inf: float):
        super().__init__()
        self.mha = CrossAttentionNoGate(c_z, c_t, c_hidden, num_heads, inf)

    def forward(self, t, z, template_mask):
        t = t.movedim(-4, -2)                                    # [B, N, N, T, c_t]
        mask = template_mask[:, None, None, None, None, :]       # [B, 1, 1, 1, 1, T]
        return self.mha(z.unsqueeze(-2), t, mask).squeeze(-2)


class ExtraMSAEmbedder(nn.Module):
    """extra_msa_embedder.py:23-57."""

    def __init__(self, emsa_dim: int, c_e: int):
        super().__init__()
        self.linear = linear(emsa_dim, c_e)

    def forward(self, x):
        return self.linear(x)


# ------------------------------------------------------------------ structure module

class InvariantPointAttention(nn.Module):
    """invariant_point_attention.py:28-268 (Algorithm 22; biased LeCun-initialised
    projections as the official source, not the supplement)."""

    def __init__(self, c_s: int, c_z: int, c_hidden: int, num_heads: int, num_qk_points: int,
                 num_v_points: int, inf: float, eps: float):
        super().__init__()
        self.c_hidden, self.num_heads, self.inf, self.eps = c_hidden, num_heads, inf, eps
        self.num_qk_points, self.num_v_points = num_qk_points, num_v_points
        hc = c_hidden * num_heads
        self.linear_q = linear(c_s, hc)
        self.linear_kv = linear(c_s, 2 * hc)
        self.linear_q_points = linear(c_s, num_heads * num_qk_points * 3)
        self.linear_kv_points = linear(c_s, num_heads * (num_qk_points + num_v_points) * 3)
        self.linear_b = linear(c_z, num_heads)
        self.head_weights = nn.Parameter(torch.empty(num_heads))
        if not self.head_weights.is_meta:
            with torch.no_grad():
                self.head_weights.fill_(0.541324854612918)   # softplus^-1(1) (:266-268)
        self.linear_out = linear(num_heads * (c_z + c_hidden + num_v_points * 4), c_s, init="final")

    def _points(self, lin: nn.Linear, s: torch.Tensor, r: Frames, n: int) -> torch.Tensor:
        """[B, N, H, n, 3] points in the global frame: the projection's three blocks are x, y, z."""
        p = lin(s)
        p = torch.stack(torch.split(p, p.shape[-1] // 3, dim=-1), dim=-1)    # [B, N, H*n, 3]
        return r.unsqueeze(-1).apply(p).unflatten(-2, (self.num_heads, n))

    def forward(self, s: torch.Tensor, z: torch.Tensor, r: Frames, mask: torch.Tensor) -> torch.Tensor:
        H, C, P, V = self.num_heads, self.c_hidden, self.num_qk_points, self.num_v_points
        q = self.linear_q(s).unflatten(-1, (H, C))
        k, v = self.linear_kv(s).unflatten(-1, (H, 2 * C)).split(C, dim=-1)
        q_pts = self._points(self.linear_q_points, s, r, P)
        k_pts, v_pts = self._points(self.linear_kv_points, s, r, P + V).split((P, V), dim=-2)

        b = self.linear_b(z)                                                   # [B, N, N, H]
        a = torch.matmul(q.movedim(-3, -2), k.movedim(-3, -1)) * math.sqrt(1.0 / (3 * C))
        a = a + math.sqrt(1.0 / 3) * b.movedim(-1, -3)                         # [B, H, N, N]
        d2 = (q_pts.unsqueeze(-4) - k_pts.unsqueeze(-5)) ** 2                  # [B, N, N, H, P, 3]
        d2 = d2[..., 0] + d2[..., 1] + d2[..., 2]
        w = F.softplus(self.head_weights).view((1,) * (d2.ndim - 2) + (H, 1))
        w = w * math.sqrt(1.0 / (3 * (P * 9.0 / 2)))
        pt = -0.5 * torch.sum(d2 * w, dim=-1)                                  # [B, N, N, H]
        square_mask = (mask.unsqueeze(-1) * mask.unsqueeze(-2) - 1.0) * self.inf
        a = a + pt.movedim(-1, -3)
        a = torch.softmax(a + square_mask.unsqueeze(-3), dim=-1)

        o = torch.matmul(a, v.transpose(-2, -3).to(dtype=a.dtype)).transpose(-2, -3).flatten(-2)
        o_pt = torch.einsum("...hij,...jhvx->...ihvx", a, v_pts.to(dtype=a.dtype))   # [B, N, H, V, 3]
        o_pt = r.unsqueeze(-1).unsqueeze(-1).invert_apply(o_pt)
        o_pt_norm = torch.sqrt(torch.sum(o_pt ** 2, dim=-1) + self.eps).flatten(-2)
        o_pt = o_pt.flatten(-3, -2)                                            # [B, N, H*V, 3]
        o_pair = torch.matmul(a.transpose(-2, -3), z.to(dtype=a.dtype)).flatten(-2)
        o_cat = torch.cat([o, *o_pt.unbind(-1), o_pt_norm, o_pair], dim=-1)
        return self.linear_out(o_cat.to(dtype=z.dtype))


class SingleTransition(nn.Module):
    """single_transition.py:24-50."""

    def __init__(self, c_s: int, dropout_rate: float):
        super().__init__()
        self.linear_1 = linear(c_s, c_s, init="relu")
        self.linear_2 = linear(c_s, c_s, init="relu")
        self.linear_3 = linear(c_s, c_s, init="final")
        self.dropout = nn.Dropout(dropout_rate)
        self.layer_norm = layer_norm(c_s)

    def forward(self, s):
        s = s + self.linear_3(torch.relu(self.linear_2(torch.relu(self.linear_1(s)))))
        return self.layer_norm(self.dropout(s))


class BackboneUpdate(nn.Module):
    """backbone_update.py:23-38: (quaternion x, y, z of (1, x, y, z); translation)."""

    def __init__(self, c_s: int):
        super().__init__()
        self.linear = linear(c_s, 6, init="final")

    def forward(self, s):
        return self.linear(s)


class AngleResnetBlock(nn.Module):
    def __init__(self, c_hidden: int):
        super().__init__()
        self.linear_1 = linear(c_hidden, c_hidden, init="relu")
        self.linear_2 = linear(c_hidden, c_hidden, init="final")

    def forward(self, a):
        return a + self.linear_2(torch.relu(self.linear_1(torch.relu(a))))


class AngleResnet(nn.Module):
    """angle_resnet.py:25-119: 7 torsion angles as (sin, cos), raw and normalised."""

    def __init__(self, c_s: int, c_hidden: int, num_blocks: int, num_angles: int, eps: float):
        super().__init__()
        self.num_angles, self.eps = num_angles, eps
        self.linear_in = linear(c_s, c_hidden)
        self.linear_initial = linear(c_s, c_hidden)
        self.layers = nn.ModuleList(AngleResnetBlock(c_hidden) for _ in range(num_blocks))
        self.linear_out = linear(c_hidden, num_angles * 2)

    def forward(self, s, s_initial):
        s = self.linear_in(torch.relu(s)) + self.linear_initial(torch.relu(s_initial))
        for layer in self.layers:
            s = layer(s)
        s = self.linear_out(torch.relu(s)).unflatten(-1, (self.num_angles, 2))
        norm = torch.sqrt(torch.clamp(torch.sum(s ** 2, dim=-1, keepdim=True), min=self.eps))
        return s, s / norm


def torsion_angles_to_frames(bb: Frames, alpha: torch.Tensor, aatype: torch.Tensor,
                             default_frames: torch.Tensor) -> Frames:
    """The 8 rigid-group frames of each residue in the global frame from its backbone frame and
    7 torsion angles (structure_module.py:294-355): each default frame rotated about its x axis
    by its angle; chi2-4 chained on chi1."""
    d = default_frames[aatype]                                           # [*, N, 8, 4, 4]
    default = Frames.make(d[..., :3, :3], d[..., :3, 3])
    bb_angle = alpha.new_zeros(alpha.shape[:-2] + (1, 2))
    bb_angle[..., 1] = 1.0                                               # (sin, cos) of 0
    sin, cos = torch.cat([bb_angle, alpha], dim=-2).unbind(-1)           # [*, N, 8]
    zero, one = torch.zeros_like(sin), torch.ones_like(sin)
    rot = torch.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], -1).unflatten(-1, (3, 3))
    frames = Frames.make(rot_mul(default.rot, rot.float()), default.trans)
    chi2 = frames.index(4).compose(frames.index(5))
    chi3 = chi2.compose(frames.index(6))
    chi4 = chi3.compose(frames.index(7))
    to_bb = Frames(torch.cat([frames.rot[..., :5, :, :]] + [c.rot.unsqueeze(-3) for c in (chi2, chi3, chi4)], -3),
                   torch.cat([frames.trans[..., :5, :]] + [c.trans.unsqueeze(-2) for c in (chi2, chi3, chi4)], -2))
    return bb.unsqueeze(-1).compose(to_bb)


def frames_to_atom14(frames: Frames, aatype: torch.Tensor, tables: dict) -> torch.Tensor:
    """The atom14 positions: each atom's literature position in its group's frame
    (structure_module.py:358-392)."""
    group = tables["group_idx"][aatype]                                  # [*, N, 14]
    rot = torch.gather(frames.rot, -3, group[..., None, None].expand(*group.shape, 3, 3))
    trans = torch.gather(frames.trans, -2, group[..., None].expand(*group.shape, 3))
    pos = Frames(rot, trans).apply(tables["lit_positions"][aatype])
    return pos * tables["atom14_mask"][aatype].unsqueeze(-1)


class StructureModule(nn.Module):
    """structure_module.py:33-291 (Algorithm 20): 8 blocks sharing weights; the backbone frames
    are quaternions and translations in nm-scaled units (x scale_factor = Angstrom); the
    rotation's gradient is stopped between blocks."""

    def __init__(self, c_s: int, c_z: int, c_hidden_ipa: int, c_hidden_ang_res: int, num_heads_ipa: int,
                 num_qk_points: int, num_v_points: int, dropout_rate: float, num_blocks: int,
                 num_ang_res_blocks: int, num_angles: int, scale_factor: float, inf: float, eps: float):
        super().__init__()
        self.num_blocks, self.scale_factor = num_blocks, scale_factor
        self.layer_norm_s = layer_norm(c_s)
        self.layer_norm_z = layer_norm(c_z)
        self.linear_in = linear(c_s, c_s)
        self.ipa = InvariantPointAttention(c_s, c_z, c_hidden_ipa, num_heads_ipa, num_qk_points, num_v_points,
                                           inf, eps)
        self.ipa_dropout = nn.Dropout(dropout_rate)
        self.layer_norm_ipa = layer_norm(c_s)
        self.transition = SingleTransition(c_s, dropout_rate)
        self.bb_update = BackboneUpdate(c_s)
        self.angle_resnet = AngleResnet(c_s, c_hidden_ang_res, num_ang_res_blocks, num_angles, eps)
        self._tables: dict = {}

    def tables(self, dtype: torch.dtype, device: torch.device) -> dict:
        """The residue tables as tensors (the reference's lazily made buffers,
        structure_module.py:235-278: float tables in the single representation's dtype)."""
        key = (dtype, device)
        if key not in self._tables:
            self._tables[key] = {
                name: torch.as_tensor(a, device=device, dtype=dtype if a.dtype == np.float32 else None)
                for name, a in TABLES.items()}
        return self._tables[key]

    def forward(self, s, z, mask, aatype) -> dict:
        tables = self.tables(s.dtype, s.device)
        s = self.layer_norm_s(s)
        z = self.layer_norm_z(z)
        s_initial = s
        s = self.linear_in(s)
        quats = s.new_zeros(s.shape[:-1] + (4,), dtype=torch.float32)
        quats[..., 0] = 1.0
        trans = s.new_zeros(s.shape[:-1] + (3,), dtype=torch.float32)
        outputs = []
        for _ in range(self.num_blocks):
            rot = quat_to_rot(quats)
            s = s + self.ipa(s, z, Frames(rot, trans), mask)
            s = self.layer_norm_ipa(self.ipa_dropout(s))
            s = self.transition(s)
            update = self.bb_update(s)                                     # rigid_utils.py:1013-1031
            quats_new = (quats + quat_mul_vec(quats, update[..., :3])).float()
            quats_new = quats_new / torch.linalg.norm(quats_new, dim=-1, keepdim=True)
            trans = (trans + rot_vec(rot, update[..., 3:])).float()
            quats = quats_new
            bb = Frames.make(quat_to_rot(quats), trans * self.scale_factor)
            unnormalized, angles = self.angle_resnet(s, s_initial)
            frames = torsion_angles_to_frames(bb, angles, aatype, tables["default_frames"])
            outputs.append({
                "sm_frames": torch.cat([quats, (trans * self.scale_factor).float()], dim=-1),
                "sm_sidechain_frames": frames.to_4x4(),
                "sm_unnormalized_angles": unnormalized,
                "sm_angles": angles,
                "sm_positions": frames_to_atom14(frames, aatype, tables),
                "sm_states": s,
            })
            quats = quats.detach()                                         # stop_rot_gradient
        stacked = {key: torch.stack([o[key] for o in outputs], dim=1) for key in outputs[0]}
        stacked["sm_single"] = s
        return stacked


# ------------------------------------------------------------------ heads and the model

class PerResidueLDDTCaPredictor(nn.Module):
    """auxiliary_heads.py:79-110 (Algorithm 29)."""

    def __init__(self, c_s: int, c_hidden: int, num_bins: int):
        super().__init__()
        self.layer_norm = layer_norm(c_s)
        self.linear_1 = linear(c_s, c_hidden, init="relu")
        self.linear_2 = linear(c_hidden, c_hidden, init="relu")
        self.linear_3 = linear(c_hidden, num_bins, init="final")

    def forward(self, s):
        return self.linear_3(torch.relu(self.linear_2(torch.relu(self.linear_1(self.layer_norm(s))))))


class LinearHead(nn.Module):
    """One zero-initialised projection: the distogram (symmetrised, auxiliary_heads.py:113-144),
    masked-MSA (:147-168), experimentally-resolved (:171-192) and TM-score (:195-220) heads."""

    def __init__(self, c_in: int, c_out: int, symmetric: bool = False):
        super().__init__()
        self.symmetric = symmetric
        self.linear = linear(c_in, c_out, init="final")

    def forward(self, x):
        y = self.linear(x)
        return y + y.transpose(-2, -3) if self.symmetric else y


class AuxiliaryHeads(nn.Module):
    """auxiliary_heads.py:30-76."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.plddt = PerResidueLDDTCaPredictor(**cfg["per_residue_lddt_ca_predictor"])
        self.distogram = LinearHead(cfg["distogram_head"]["c_z"], cfg["distogram_head"]["num_bins"], symmetric=True)
        self.masked_msa = LinearHead(cfg["masked_msa_head"]["c_m"], cfg["masked_msa_head"]["c_out"])
        self.experimentally_resolved = LinearHead(cfg["experimentally_resolved_head"]["c_s"],
                                                  cfg["experimentally_resolved_head"]["c_out"])
        self.tm_score_head_enabled = cfg["tm_score_head_enabled"]
        if self.tm_score_head_enabled:
            self.tm = LinearHead(cfg["tm_score_head"]["c_z"], cfg["tm_score_head"]["num_bins"])

    def forward(self, outputs: dict) -> dict:
        aux = {"lddt_logits": self.plddt(outputs["sm_single"])}
        aux["plddt"] = compute_plddt(aux["lddt_logits"])
        aux["distogram_logits"] = self.distogram(outputs["pair"])
        aux["masked_msa_logits"] = self.masked_msa(outputs["msa"])
        aux["experimentally_resolved_logits"] = self.experimentally_resolved(outputs["single"])
        if self.tm_score_head_enabled:
            aux["tm_logits"] = self.tm(outputs["pair"])
        return aux


def compute_plddt(logits: torch.Tensor) -> torch.Tensor:
    """The expected lDDT-Ca in percent from the 50 bins' logits (loss.py:579-593)."""
    n = logits.shape[-1]
    bounds = torch.arange(0.5 / n, 1.0, 1.0 / n, device=logits.device)
    return torch.sum(torch.softmax(logits, dim=-1) * bounds, dim=-1) * 100


def pseudo_beta(aatype: torch.Tensor, atom37: torch.Tensor) -> torch.Tensor:
    """CB, CA for glycine (alphafold.py:329-341)."""
    return torch.where((aatype == GLY).unsqueeze(-1), atom37[..., CA, :], atom37[..., CB, :])


def build_extra_msa_feat(feats: dict) -> torch.Tensor:
    """alphafold.py:344-351: one-hot residue (23), has deletion, deletion value = 25."""
    return torch.cat([F.one_hot(feats["extra_msa"], 23), feats["extra_has_deletion"].unsqueeze(-1),
                      feats["extra_deletion_value"].unsqueeze(-1)], dim=-1)


def build_template_angle_feat(feats: dict) -> torch.Tensor:
    """alphafold.py:432-448: one-hot residue (22), torsion sin/cos (14), alternative (14),
    torsion mask (7) = 57."""
    sc, alt = feats["template_torsion_angles_sin_cos"], feats["template_alt_torsion_angles_sin_cos"]
    return torch.cat([F.one_hot(feats["template_aatype"], 22), sc.flatten(-2), alt.flatten(-2),
                      feats["template_torsion_angles_mask"]], dim=-1)


def build_template_pair_feat(feats: dict, min_bin: float, max_bin: float, num_bins: int,
                             use_unit_vector: bool, inf: float, eps: float) -> torch.Tensor:
    """alphafold.py:354-429, one template: pseudo-beta distogram (num_bins), its 2D mask, the
    residue one-hot of i and of j (22 + 22), the unit vector j - i in i's backbone frame (3,
    zeroed unless use_unit_vector) and the backbone 2D mask: num_bins + 49 channels, all times
    the backbone 2D mask."""
    pb_mask = feats["template_pseudo_beta_mask"]
    pb_mask_2d = pb_mask.unsqueeze(-1) * pb_mask.unsqueeze(-2)
    tpb = feats["template_pseudo_beta"]
    dgram = torch.sum((tpb.unsqueeze(-2) - tpb.unsqueeze(-3)) ** 2, dim=-1, keepdim=True)
    lower = torch.linspace(min_bin, max_bin, num_bins, device=tpb.device) ** 2
    upper = torch.cat([lower[1:], lower.new_tensor([inf])], dim=-1)
    dgram = ((dgram > lower) * (dgram < upper)).to(dtype=dgram.dtype)
    aa = F.one_hot(feats["template_aatype"], 22)
    n_res = aa.shape[-2]
    pos, atom_mask = feats["template_all_atom_positions"], feats["template_all_atom_mask"]
    n, ca, c = ATOM37.index("N"), ATOM37.index("CA"), ATOM37.index("C")
    frames = backbone_frames_from_atoms(pos[..., n, :], pos[..., ca, :], pos[..., c, :], eps)
    vec = frames.unsqueeze(-1).invert_apply(frames.trans.unsqueeze(-3))      # [*, N, N, 3]
    bb_mask = atom_mask[..., n] * atom_mask[..., ca] * atom_mask[..., c]
    bb_mask_2d = bb_mask.unsqueeze(-1) * bb_mask.unsqueeze(-2)
    unit = vec * (torch.rsqrt(eps + torch.sum(vec ** 2, dim=-1)) * bb_mask_2d).unsqueeze(-1)
    if not use_unit_vector:
        unit = unit * 0.0
    t = torch.cat([dgram, pb_mask_2d.unsqueeze(-1),
                   aa.unsqueeze(-3).expand(*aa.shape[:-2], n_res, -1, -1),
                   aa.unsqueeze(-2).expand(*aa.shape[:-2], -1, n_res, -1),
                   *unit.unsqueeze(-2).unbind(-1), bb_mask_2d.unsqueeze(-1)], dim=-1)
    return t * bb_mask_2d.unsqueeze(-1)


class AlphaFold(nn.Module):
    """alphafold.py:41-326 (Algorithm 2): input and recycling embedding, templates, extra-MSA
    stack, Evoformer, structure module, auxiliary heads; recycling over the batch's last
    dimension."""

    def __init__(self, cfg: dict):
        super().__init__()
        m = cfg["model"]
        self.templates_enabled = m["templates_enabled"]
        self.embed_template_torsion_angles = m["embed_template_torsion_angles"]
        self.template_pair_feat = dict(m["template_pair_feat"])
        self.gradient_checkpointing = m["gradient_checkpointing"]
        self.input_embedder = InputEmbedder(**m["input_embedder"])
        self.recycling_embedder = RecyclingEmbedder(**m["recycling_embedder"])
        if self.templates_enabled:
            self.template_angle_embedder = TemplateAngleEmbedder(**m["template_angle_embedder"])
            self.template_pair_embedder = TemplatePairEmbedder(**m["template_pair_embedder"])
            self.template_pair_stack = TemplatePairStack(m["template_pair_stack"])
            self.template_pointwise_attention = TemplatePointwiseAttention(**m["template_pointwise_attention"])
        self.extra_msa_embedder = ExtraMSAEmbedder(**m["extra_msa_embedder"])
        self.extra_msa_stack = ExtraMSAStack(m["extra_msa_stack"])
        self.evoformer_stack = EvoformerStack(m["evoformer_stack"])
        self.structure_module = StructureModule(**m["structure_module"])
        self.auxiliary_heads = AuxiliaryHeads(m["auxiliary_heads"])

    def forward(self, batch: dict) -> dict:
        prevs: dict = {}
        n_iter = batch["aatype"].shape[-1]
        for j in range(n_iter - 1):           # the recycling iterations, without autograd (:88-98)
            feats = {k: v[..., j].contiguous() for k, v in batch.items() if isinstance(v, torch.Tensor)}
            with torch.no_grad():
                _, prevs = self._iteration(feats, prevs, use_checkpoint=False)
        feats = {k: v[..., -1].contiguous() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        use_checkpoint = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        outputs, _ = self._iteration(feats, prevs, use_checkpoint)
        outputs.update(self.auxiliary_heads(outputs))
        return outputs

    def _iteration(self, feats: dict, prevs: dict, use_checkpoint: bool) -> tuple[dict, dict]:
        """alphafold.py:119-266."""
        n_clust = feats["msa_feat"].shape[1]
        seq_mask = feats["seq_mask"]
        pair_mask = seq_mask.unsqueeze(-1) * seq_mask.unsqueeze(-2)
        msa_mask = feats["msa_mask"]
        m, z = self.input_embedder(feats["target_feat"], feats["residue_index"], feats["msa_feat"])

        m0_prev = prevs.get("m0_prev", torch.zeros_like(m[:, 0]))
        z_prev = prevs.get("z_prev", torch.zeros_like(z))
        x_prev = prevs.get("x_prev", z.new_zeros(z.shape[:2] + (len(ATOM37), 3)))
        x_prev = pseudo_beta(feats["aatype"], x_prev).to(dtype=z.dtype)
        m0_emb, z_emb = self.recycling_embedder(m0_prev, z_prev, x_prev)
        m = torch.cat([m[:, :1] + m0_emb.unsqueeze(1), m[:, 1:]], dim=1)
        z = z + z_emb

        if self.templates_enabled:
            pair_emb, angle_emb = self._embed_templates(feats, z, pair_mask, use_checkpoint)
            z = z + pair_emb
            if self.embed_template_torsion_angles:
                m = torch.cat([m, angle_emb], dim=1)
                msa_mask = torch.cat([feats["msa_mask"], feats["template_torsion_angles_mask"][..., 2]], dim=-2)

        a = self.extra_msa_embedder(build_extra_msa_feat(feats))
        z = self.extra_msa_stack(a, z, feats["extra_msa_mask"].to(dtype=m.dtype), pair_mask.to(dtype=m.dtype),
                                 use_checkpoint)
        m, z, s = self.evoformer_stack(m, z, msa_mask.to(dtype=m.dtype), pair_mask.to(dtype=z.dtype), use_checkpoint)
        outputs = {"msa": m[:, :n_clust], "pair": z, "single": s}
        outputs.update(self.structure_module(s, z, seq_mask.to(dtype=s.dtype), feats["aatype"]))
        atom14 = outputs["sm_positions"][:, -1]
        index = feats["residx_atom37_to_atom14"].unsqueeze(-1).expand(-1, -1, -1, 3)
        exists = feats["atom37_atom_exists"]
        outputs["final_atom_positions"] = torch.gather(atom14, 2, index) * exists.unsqueeze(-1)
        outputs["final_atom_mask"] = exists
        outputs["final_affine_tensor"] = outputs["sm_frames"][:, -1]
        return outputs, {"m0_prev": m[:, 0], "z_prev": z, "x_prev": outputs["final_atom_positions"]}

    def _embed_templates(self, feats: dict, z, pair_mask, use_checkpoint: bool):
        """alphafold.py:268-326: each template's pair features embedded, the pair stack, pointwise
        attention into the pair representation (zero without any template), and the torsion
        angle features as extra MSA rows."""
        tf = {k: v for k, v in feats.items() if k.startswith("template_")}
        p = self.template_pair_feat
        t = torch.stack([
            self.template_pair_embedder(build_template_pair_feat(
                {k: v[:, i] for k, v in tf.items()}, p["distogram_min_bin"], p["distogram_max_bin"],
                p["distogram_num_bins"], p["use_unit_vector"], p["inf"], p["eps"]).to(dtype=z.dtype))
            for i in range(tf["template_aatype"].shape[1])], dim=1)
        t = self.template_pair_stack(t, pair_mask.to(dtype=z.dtype), use_checkpoint)
        t = self.template_pointwise_attention(t, z, tf["template_mask"].to(dtype=z.dtype))
        any_template = (torch.sum(tf["template_mask"], dim=1) > 0).to(dtype=t.dtype)
        t = t * any_template[:, None, None, None]
        angle = self.template_angle_embedder(build_template_angle_feat(tf)) \
            if self.embed_template_torsion_angles else None
        return t, angle


# ------------------------------------------------------------------ config, counts, inputs

def load_model_config(spec: str = "reference", overrides: Iterable[str] = ()) -> dict:
    """configs/<spec>.yaml (or a user file with base: mini|reference) through the kit's
    load_config, which reads hpckit/openfold/configs/ without a benchmark registration."""
    cfg = load_config(BENCHMARK, spec, overrides)
    validate_model_config(cfg)
    return cfg


# a config's widths, head and bin counts, and block counts at most (the reference's largest: 256
# channels, 48 Evoformer blocks)
MAX_WIDTH = 1 << 14
MAX_BLOCKS = 256


def _check_model_numbers(m: dict, prefix: str = "model") -> None:
    """Every real-valued model setting finite and in the range its use needs: a dropout rate in
    [0, 1), an inf, eps or scale factor > 0 (a NaN or infinite one makes every output NaN);
    min_bin below max_bin; every integer of a section, at any depth, a count or width in
    1..MAX_WIDTH (blocks: MAX_BLOCKS), as the parameter count builds the model (on the meta
    device) and a width of 2^64 or a million blocks would fail or never end there (a head's
    c_out under auxiliary_heads, a level below the others, once passed a one-level check:
    fuzz seed 4243, case 8319)."""
    for key, value in m.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            _check_model_numbers(value, name)
        elif isinstance(value, int) and not isinstance(value, bool):
            if prefix != "model":   # inside a section
                most = MAX_BLOCKS if "blocks" in key else MAX_WIDTH
                require(0 < value <= most, name, f"must be an integer in 1..{most} (got {value})")
        elif isinstance(value, float):
            require(math.isfinite(value), name, f"must be a finite number (got {value})")
            if "dropout" in key:
                require(0 <= value < 1, name, f"must be a rate in [0, 1) (got {value})")
            elif key.startswith(("inf", "eps", "scale")):
                require(value > 0, name, f"must be > 0 (got {value})")
    for key in m:
        if key.endswith("min_bin") and key.replace("min_bin", "max_bin") in m:
            high = key.replace("min_bin", "max_bin")
            require(m[key] < m[high], f"{prefix}.{key}", f"must be below {prefix}.{high} ({m[high]})")


def validate_model_config(cfg: dict) -> None:
    """One line naming the key for what would otherwise fail in the middle of a forward: the
    channel widths the modules share, and the feature widths the inputs fix."""
    m = cfg["model"]
    _check_model_numbers(m)
    heads = m["auxiliary_heads"]
    shared = {
        "c_m": ["input_embedder", "recycling_embedder", "template_angle_embedder", "evoformer_stack",
                ("auxiliary_heads", "masked_msa_head")],
        "c_z": ["input_embedder", "recycling_embedder", "template_pointwise_attention", "extra_msa_stack",
                "evoformer_stack", "structure_module", ("auxiliary_heads", "distogram_head"),
                ("auxiliary_heads", "tm_score_head")],
        "c_e": ["extra_msa_embedder", "extra_msa_stack"],
        "c_t": ["template_pair_embedder", "template_pair_stack", "template_pointwise_attention"],
        "c_s": ["evoformer_stack", "structure_module", ("auxiliary_heads", "per_residue_lddt_ca_predictor"),
                ("auxiliary_heads", "experimentally_resolved_head")],
    }
    for key, places in shared.items():
        values = {}
        for place in places:
            section = heads[place[1]] if isinstance(place, tuple) else m[place]
            name = f"model.{'.'.join(place) if isinstance(place, tuple) else place}.{key}"
            values[name] = section[key]
        first = next(iter(values))
        for name, value in values.items():
            require(value == values[first], name, f"must equal {first} ({values[first]}), got {value}")
    fixed = {"input_embedder.tf_dim": 22, "input_embedder.msa_dim": 49, "extra_msa_embedder.emsa_dim": 25,
             "template_angle_embedder.ta_dim": 57, "structure_module.num_angles": 7,
             "template_pair_embedder.tp_dim": m["template_pair_feat"]["distogram_num_bins"] + 49}
    for dotted, want in fixed.items():
        section, key = dotted.split(".")
        require(m[section][key] == want, f"model.{dotted}", f"must be {want}: the width of the reference's features")
    for section in ("extra_msa_stack", "evoformer_stack"):   # outer_product_mean.py:51 asserts it
        require(m[section]["eps_opm"] == 1e-3, f"model.{section}.eps_opm", "must be 0.001 (the reference asserts it)")


def build_model(cfg: dict) -> AlphaFold:
    validate_model_config(cfg)
    return AlphaFold(cfg)


def parameter_count(cfg: dict) -> int:
    with torch.device("meta"):
        model = AlphaFold(cfg)
    return sum(p.numel() for p in model.parameters())


def _n(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def describe_rows(cfg: dict) -> list[tuple[str, str, int]]:
    """(module, what it is, parameters) for every part; together they hold every parameter."""
    m = cfg["model"]
    with torch.device("meta"):
        model = AlphaFold(cfg)
    ie, ev, ex, sm = m["input_embedder"], m["evoformer_stack"], m["extra_msa_stack"], m["structure_module"]
    rows = [("input_embedder", f"target {ie['tf_dim']} and MSA {ie['msa_dim']} features -> MSA {ie['c_m']}, "
                               f"pair {ie['c_z']}; relative position +-{ie['relpos_k']}", _n(model.input_embedder)),
            ("recycling_embedder", f"previous MSA row, pair and {m['recycling_embedder']['num_bins']}-bin "
                                   "pseudo-beta distogram", _n(model.recycling_embedder))]
    if model.templates_enabled:
        tp = m["template_pair_stack"]
        rows += [("template_angle_embedder", f"torsion features {m['template_angle_embedder']['ta_dim']} -> "
                                             f"MSA rows {ie['c_m']}", _n(model.template_angle_embedder)),
                 ("template_pair_embedder", f"pair features {m['template_pair_embedder']['tp_dim']} -> "
                                            f"{tp['c_t']}", _n(model.template_pair_embedder)),
                 ("template_pair_stack", f"{tp['num_blocks']} x triangle attention and multiplication, "
                                         f"c_t {tp['c_t']}", _n(model.template_pair_stack)),
                 ("template_pointwise_attention", f"pair {ie['c_z']} attends over templates, "
                                                  f"{m['template_pointwise_attention']['num_heads']} heads",
                  _n(model.template_pointwise_attention))]
    rows += [("extra_msa_embedder", f"extra MSA features 25 -> {ex['c_e']}", _n(model.extra_msa_embedder)),
             ("extra_msa_stack", f"{ex['num_blocks']} x extra-MSA block (global column attention), "
                                 f"c_e {ex['c_e']}, c_z {ex['c_z']}", _n(model.extra_msa_stack)),
             ("evoformer_stack.blocks", f"{ev['num_blocks']} x Evoformer block, c_m {ev['c_m']}, c_z {ev['c_z']}, "
                                        f"{ev['num_heads_msa']}/{ev['num_heads_tri']} heads",
              _n(model.evoformer_stack.blocks)),
             ("evoformer_stack.linear", f"single representation {ev['c_m']} -> {ev['c_s']}",
              _n(model.evoformer_stack.linear))]
    smod = model.structure_module
    parts = [("ipa", f"invariant point attention, {sm['num_heads_ipa']} heads, {sm['num_qk_points']}/"
                     f"{sm['num_v_points']} points", smod.ipa),
             ("transition", f"single transition {sm['c_s']}", smod.transition),
             ("bb_update", "backbone update (quaternion, translation)", smod.bb_update),
             ("angle_resnet", f"torsion angles, {sm['num_ang_res_blocks']} residual blocks of "
                              f"{sm['c_hidden_ang_res']}", smod.angle_resnet)]
    rest = _n(smod) - sum(_n(mod) for _, _, mod in parts)
    rows.append(("structure_module", f"layer norms and input projection; {sm['num_blocks']} blocks share "
                                     "the weights below", rest))
    rows += [(f"structure_module.{name}", text, _n(mod)) for name, text, mod in parts]
    for name, text in (("plddt", "pLDDT head, 50 bins"), ("distogram", "distogram head, 64 bins"),
                       ("masked_msa", "masked MSA head, 23 classes"),
                       ("experimentally_resolved", "experimentally resolved head, 37 atoms"),
                       ("tm", "TM-score head, 64 bins")):
        if hasattr(model.auxiliary_heads, name):
            rows.append((f"auxiliary_heads.{name}", text, _n(getattr(model.auxiliary_heads, name))))
    return rows


def reference_config_dict(cfg: dict) -> dict:
    """The reference's AlphaFoldConfig fields (config.py:298-399) for this config: sections
    become XxxConfig instances' keyword arguments, template_pair_feat.* the template_pair_feat_*
    fields, the data section the crop and MSA sizes (for building the reference model in
    tests/test_openfold_model.py)."""
    m, data = cfg["model"], cfg["data"]
    out = {f"{k}_config": dict(v) for k, v in m.items()
           if isinstance(v, dict) and k not in ("template_pair_feat", "auxiliary_heads")}
    heads = m["auxiliary_heads"]
    out["auxiliary_heads_config"] = {f"{k}_config": dict(v) for k, v in heads.items() if isinstance(v, dict)}
    out["auxiliary_heads_config"]["tm_score_head_enabled"] = heads["tm_score_head_enabled"]
    out.update({f"template_pair_feat_{k}": v for k, v in m["template_pair_feat"].items()})
    out.update(templates_enabled=m["templates_enabled"],
               embed_template_torsion_angles=m["embed_template_torsion_angles"],
               train_sequence_crop_size=data["crop_size"], max_msa_clusters=data["max_msa_clusters"],
               max_extra_msa=data["max_extra_msa"], max_templates=data["max_templates"],
               num_recycling_iters=data["num_recycling_iters"])
    return out


def example_batch(n_res: int = 16, n_clust: int = 8, n_extra: int = 8, n_templ: int = 2, n_recycle: int = 1,
                  batch_size: int = 1, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """A synthetic feature dict with the reference's names, shapes and recycling dimension (a
    pure function of its arguments, numpy's default_rng(seed)): random residues (the first a
    glycine), the last residue padding (seq_mask 0), MSA and extra MSA with some rows masked,
    templates with random coordinates, the last template absent when there are several, and
    the atom37 <-> atom14 tables of the residues. The MSA features are drawn anew for each
    recycling iteration, the rest repeated."""
    rng = np.random.default_rng(seed)
    B, N, S, E, T, R = batch_size, n_res, n_clust, n_extra, n_templ, n_recycle

    def rep(a):      # the same array for every iteration
        return np.repeat(a[..., None], R, axis=-1)

    aatype = rng.integers(0, 20, (B, N))
    aatype[:, 0] = GLY
    target = np.zeros((B, N, 22))
    np.put_along_axis(target, aatype[..., None] + 1, 1.0, axis=-1)
    seq_mask = np.ones((B, N))
    seq_mask[:, -1] = 0.0
    msa_feat = np.zeros((B, S, N, 49, R))
    msa_feat[..., :23, :] = np.eye(23)[rng.integers(0, 23, (B, S, N, R))].transpose(0, 1, 2, 4, 3)
    msa_feat[..., 23, :] = rng.random((B, S, N, R)) < 0.2
    msa_feat[..., 24, :] = rng.random((B, S, N, R))
    profile = rng.random((B, S, N, 23, R))
    msa_feat[..., 25:48, :] = profile / profile.sum(axis=-2, keepdims=True)
    msa_feat[..., 48, :] = rng.random((B, S, N, R))
    msa_mask = (rng.random((B, S, N, R)) < 0.9).astype(np.float64)
    msa_mask[:, 0] = 1.0
    extra_mask = (rng.random((B, E, N, R)) < 0.9).astype(np.float64)
    pos = rng.normal(0.0, 8.0, (B, T, N, 37, 3))
    angles = rng.uniform(-np.pi, np.pi, (B, T, N, 7))
    alt = angles + np.pi
    template_mask = np.ones((B, T))
    if T > 1:
        template_mask[:, -1] = 0.0
    feats = {
        "aatype": rep(aatype), "residue_index": rep(np.arange(N)[None].repeat(B, 0) + 3),
        "seq_mask": rep(seq_mask), "target_feat": rep(target), "msa_feat": msa_feat, "msa_mask": msa_mask,
        "extra_msa": rng.integers(0, 23, (B, E, N, R)),
        "extra_has_deletion": (rng.random((B, E, N, R)) < 0.2).astype(np.float64),
        "extra_deletion_value": rng.random((B, E, N, R)), "extra_msa_mask": extra_mask,
        "residx_atom37_to_atom14": rep(TABLES["atom37_to_atom14"][aatype]),
        "atom37_atom_exists": rep(TABLES["atom37_mask"][aatype].astype(np.float64)),
        "template_aatype": rep(rng.integers(0, 22, (B, T, N))),
        "template_all_atom_positions": rep(pos),
        "template_all_atom_mask": rep((rng.random((B, T, N, 37)) < 0.9).astype(np.float64)),
        "template_pseudo_beta": rep(pos[..., CB, :]),
        "template_pseudo_beta_mask": rep((rng.random((B, T, N)) < 0.9).astype(np.float64)),
        "template_mask": rep(template_mask),
        "template_torsion_angles_sin_cos": rep(np.stack([np.sin(angles), np.cos(angles)], -1)),
        "template_alt_torsion_angles_sin_cos": rep(np.stack([np.sin(alt), np.cos(alt)], -1)),
        "template_torsion_angles_mask": rep((rng.random((B, T, N, 7)) < 0.8).astype(np.float64)),
    }
    return {k: torch.from_numpy(v) if v.dtype == np.int64 else torch.from_numpy(v).to(dtype)
            for k, v in feats.items()}
