"""OpenFold's training loss, its ground-truth features and the validation metric, as the MLPerf
HPC v3.0 reference computes them.

Followed: mlcommons/hpc@2c627d4 openfold/openfold/loss.py (the terms and their weighting),
config.py:197-295 (LossConfig: the weights; the initial_training preset train.py builds changes
none of them, config.py:464-469), data/transforms.py and data/features.py:264-305 (the
ground-truth features the loss reads, made from a chain's aatype, atom37 positions and mask),
validation_metrics.py (lDDT-Ca, the MLPerf quality metric) and train.py (how the loss and the
metric are called). Citations are `file:line` in hpc@2c627d4 openfold/openfold/ (train.py is
one level up).

The loss (AlphaFoldLoss, loss.py:32-215), per sample, of the model's output dict and a batch
without the recycling dimension (train.py:762-765 passes batch[..., -1]):

    total = 1.0 fape + 1.0 supervised_chi + 0.3 distogram + 2.0 masked_msa + 0.01 plddt_loss
            + 0.0 experimentally_resolved (+ 0.0 violation, + tm when enabled: off in MLPerf)
    loss  = mean over the batch of sqrt(min(seq_length, crop size)) x total

with fape = 0.5 backbone FAPE (clamped at 10 A, or unclamped where the batch's
use_clamped_fape is 0: 10 % of the training samples, features.py:193-204) averaged over the
structure module's blocks + 0.5 side-chain FAPE (clamped, last block, against the ground truth
renamed to the better of its two namings for the symmetric side chains). A term that comes out
NaN or infinite is replaced by zero with a warning (loss.py:190-195).

The ground-truth features (ground_truth_features): atom14 layout and masks with the alternative
naming (transforms.py:597-759), the 8 rigid-group frames with their ambiguous variants
(transforms.py:762-888), torsion and chi angles (transforms.py:917-1097), pseudo-beta
(transforms.py:369-408) and the backbone frames (transforms.py:1082-1087). The reference's
pipeline computes them on the whole chain before cropping; all are per residue except the
pre-omega and phi torsions (which read the previous residue and are not used by the loss), so
computing them on a crop gives the crop of the whole chain's.

Precision: the reference's Rigid and Rotation force their rotations and translations to fp32
(rigid_utils.py:336-340, 877-878), so its frames (the ground truth's and the predicted ones in
the FAPE and TM terms) are fp32 whatever the input dtype; kept here (model.Frames.make), so an
fp64 run computes what the reference's does. The rest follows the inputs' dtype; the distogram
and TM bin edges are in torch's default dtype, as torch.linspace makes them in the reference.

Differences (one line each; docs are not edited here):
  * the structural-violation term is not computed: its weight is 0.0 in the MLPerf preset
    (config.py:251-252; 1.0 only in fine-tuning, config.py:481-483), so it never changes the
    loss; the reference computes and logs it anyway, and a config giving it a weight is refused;
  * the reference's forward adds the renamed ground truth to the caller's batch and the
    violations to the outputs (loss.py:65-80); here neither dict is changed;
  * the reference prints its NaN warning; here it goes to the logging module.
"""

from __future__ import annotations

import copy
import logging
import random

import torch
import torch.nn.functional as F
from torch import nn

from hpckit.common.errors import KitError
from hpckit.openfold import model as M
from hpckit.openfold.residue import TABLES as R

log = logging.getLogger(__name__)

# config.py:197-295, the reference's LossConfig with its section and field names; the
# initial_training preset (the MLPerf one, train.py:477-480) keeps every default.
LOSS_CONFIG = {
    "fape_loss_config": {"weight": 1.0, "backbone_clamp_distance": 10.0, "backbone_loss_unit_distance": 10.0,
                         "backbone_weight": 0.5, "sidechain_clamp_distance": 10.0,
                         "sidechain_length_scale": 10.0, "sidechain_weight": 0.5, "eps": 1e-4},
    "supervised_chi_loss_config": {"weight": 1.0, "chi_weight": 0.5, "angle_norm_weight": 0.01, "eps": 1e-8},
    "distogram_loss_config": {"weight": 0.3, "min_bin": 2.3125, "max_bin": 21.6875, "num_bins": 64, "eps": 1e-8},
    "masked_msa_loss_config": {"weight": 2.0, "eps": 1e-8},
    "plddt_loss_config": {"weight": 0.01, "cutoff": 15.0, "min_resolution": 0.1, "max_resolution": 3.0,
                          "num_bins": 50, "eps": 1e-8},
    "experimentally_resolved_loss_config": {"weight": 0.0, "min_resolution": 0.1, "max_resolution": 3.0,
                                            "eps": 1e-8},
    "violation_loss_config": {"weight": 0.0, "violation_tolerance_factor": 12.0, "clash_overlap_tolerance": 1.5,
                              "eps": 1e-8},
    "tm_loss_config": {"enabled": False, "weight": 0.0, "min_resolution": 0.1, "max_resolution": 3.0,
                       "num_bins": 64, "max_bin": 31, "eps": 1e-8},
}
USE_CLAMPED_FAPE_PROBABILITY = 0.9   # config.py:338
VALIDATION_LDDT_EPS = 1e-8           # validation_metrics.py:46-52
TARGET_AVG_LDDT_CA = 0.8             # the MLPerf quality target on the CAMEO set (train.py:109-112)


def loss_config(overrides: dict | None = None) -> dict:
    """LOSS_CONFIG with `overrides` (the same nesting, any subset) applied; an unknown section or
    key, or a term this module does not compute given a weight, is refused (KitError)."""
    cfg = copy.deepcopy(LOSS_CONFIG)
    for section, values in (overrides or {}).items():
        if section not in cfg or not isinstance(values, dict):
            raise KitError(f"loss config: unknown section {section!r} (known: {', '.join(cfg)})")
        for key, value in values.items():
            if key not in cfg[section]:
                raise KitError(f"loss config: {section}.{key}: unknown key (known: {', '.join(cfg[section])})")
            cfg[section][key] = value
    if cfg["violation_loss_config"]["weight"] != 0:
        raise KitError("loss config: violation_loss_config.weight: the structural-violation loss is not "
                       "implemented (its weight is 0.0 in the MLPerf initial_training preset)")
    return cfg


# ------------------------------------------------------------------ frames (fp32, as Rigid)

def _table(name: str, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    a = R[name]
    return torch.as_tensor(a, device=like.device, dtype=dtype if a.dtype.kind == "f" else None)


def frames_from_4x4(t: torch.Tensor) -> M.Frames:
    """Rigid.from_tensor_4x4 (rigid_utils.py:1117-1133)."""
    return M.Frames.make(t[..., :3, :3], t[..., :3, 3])


def frames_from_tensor_7(t: torch.Tensor) -> M.Frames:
    """Rigid.from_tensor_7 without normalising the quaternion (rigid_utils.py:1150-1166)."""
    return M.Frames.make(M.quat_to_rot(t[..., :4].float()), t[..., 4:])


def invert_frames(f: M.Frames) -> M.Frames:
    """Rigid.invert (rigid_utils.py:1071-1081): the transposed rotation and the translation
    -(R^T t); applying it is R^T p + (-(R^T t)) as in the reference, not R^T (p - t)."""
    rot = f.rot.transpose(-1, -2)
    return M.Frames.make(rot, -1 * M.rot_vec(rot, f.trans))


def frames_from_3_points(p_neg_x_axis: torch.Tensor, origin: torch.Tensor, p_xy_plane: torch.Tensor,
                         eps: float) -> M.Frames:
    """Gram-Schmidt (Algorithm 21, rigid_utils.py:1168-1210): x from p_neg_x_axis towards origin,
    y towards p_xy_plane, at origin; computed in the points' dtype, kept in fp32."""
    ax, ay, az = (o - p for o, p in zip(origin.unbind(-1), p_neg_x_axis.unbind(-1)))
    bx, by, bz = (q - o for q, o in zip(p_xy_plane.unbind(-1), origin.unbind(-1)))
    n = torch.sqrt(ax * ax + ay * ay + az * az + eps)
    ax, ay, az = ax / n, ay / n, az / n
    dot = ax * bx + ay * by + az * bz
    bx, by, bz = bx - ax * dot, by - ay * dot, bz - az * dot
    n = torch.sqrt(bx * bx + by * by + bz * bz + eps)
    bx, by, bz = bx / n, by / n, bz / n
    cx, cy, cz = ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx
    rot = torch.stack([ax, bx, cx, ay, by, cy, az, bz, cz], dim=-1).unflatten(-1, (3, 3))
    return M.Frames.make(rot, origin)


# ------------------------------------------------------------------ ground-truth features

def _gather_mask(mask: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """An atom37 mask [*, N, 37] at atom37 indices idx [*, N, ...] -> [*, N, ...]."""
    flat = idx.reshape(*mask.shape[:-1], -1)
    return torch.gather(mask, -1, flat).reshape(idx.shape)


def _gather_xyz(pos: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Atom37 positions [*, N, 37, 3] at atom37 indices idx [*, N, ...] -> [*, N, ..., 3]."""
    flat = idx.reshape(*pos.shape[:-2], -1)
    return torch.gather(pos, -2, flat[..., None].expand(*flat.shape, 3)).reshape(*idx.shape, 3)


def make_atom14_masks(aatype: torch.Tensor) -> dict:
    """transforms.py:597-666: which atom14 and atom37 slots each residue type has (float32, as
    the reference makes them) and the index maps between the two layouts."""
    aatype = aatype.long()
    return {"atom14_atom_exists": _table("atom14_mask", aatype, torch.float32)[aatype],
            "residx_atom14_to_atom37": _table("atom14_to_atom37", aatype)[aatype],
            "residx_atom37_to_atom14": _table("atom37_to_atom14", aatype)[aatype],
            "atom37_atom_exists": _table("atom37_mask", aatype, torch.float32)[aatype]}


def make_atom14_positions(aatype: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor,
                          atom14_atom_exists: torch.Tensor, residx_atom14_to_atom37: torch.Tensor) -> dict:
    """transforms.py:669-759: the ground truth in the atom14 layout, the same with the names of
    each symmetric pair swapped (ASP, GLU, PHE, TYR), and which atoms are in such a pair."""
    aatype = aatype.long()
    gt_exists = atom14_atom_exists * _gather_mask(all_atom_mask, residx_atom14_to_atom37)
    gt_positions = gt_exists[..., None] * _gather_xyz(all_atom_positions, residx_atom14_to_atom37)
    perm = _table("rename_perm", aatype)[aatype]                                    # [*, N, 14]
    alt_positions = torch.gather(gt_positions, -2, perm[..., None].expand(*perm.shape, 3))
    alt_exists = torch.gather(gt_exists, -1, perm)
    return {"atom14_gt_exists": gt_exists, "atom14_gt_positions": gt_positions,
            "atom14_alt_gt_positions": alt_positions, "atom14_alt_gt_exists": alt_exists,
            "atom14_atom_is_ambiguous": _table("atom14_ambiguous", aatype, all_atom_mask.dtype)[aatype]}


def atom37_to_frames(aatype: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor,
                     eps: float = 1e-8) -> dict:
    """transforms.py:762-888: each residue's 8 rigid-group frames from its atoms (backbone: C, CA,
    N then the x and z axes reversed; psi: CA, C, O; chi k: the last three atoms of chi k) as
    fp32 4x4 tensors, which exist, and the alternative frames of the ambiguous groups (rotated
    by pi about x)."""
    aatype = aatype.long()
    base = _table("group_base_atoms", aatype)[aatype]                               # [*, N, 8, 3]
    pos = _gather_xyz(all_atom_positions, base)                                   # [*, N, 8, 3, 3]
    frames = frames_from_3_points(pos[..., 0, :], pos[..., 1, :], pos[..., 2, :], eps)
    group_exists = _table("group_exists", aatype, all_atom_mask.dtype)[aatype]
    gt_exists = torch.min(_gather_mask(all_atom_mask, base), dim=-1)[0] * group_exists

    flip = torch.eye(3, dtype=torch.float32, device=aatype.device).repeat(8, 1, 1)
    flip[0, 0, 0] = flip[0, 2, 2] = -1.0
    frames = frames.compose(M.Frames(flip, torch.zeros(8, 3, device=aatype.device)))
    ambiguous = _table("group_ambiguous", aatype, all_atom_mask.dtype)[aatype]
    alt_rot = torch.eye(3, dtype=torch.float32, device=aatype.device).repeat(R["group_ambiguous"].shape[0], 8, 1, 1)
    amb = torch.as_tensor(R["group_ambiguous"], device=aatype.device) > 0
    alt_rot[amb, 1, 1] = alt_rot[amb, 2, 2] = -1.0
    alt = frames.compose(M.Frames(alt_rot[aatype], torch.zeros(*aatype.shape, 8, 3, device=aatype.device)))
    return {"rigidgroups_gt_frames": frames.to_4x4(), "rigidgroups_gt_exists": gt_exists,
            "rigidgroups_group_exists": group_exists, "rigidgroups_group_is_ambiguous": ambiguous,
            "rigidgroups_alt_gt_frames": alt.to_4x4()}


def atom37_to_torsion_angles(aatype: torch.Tensor, all_atom_positions: torch.Tensor,
                             all_atom_mask: torch.Tensor) -> dict:
    """transforms.py:917-1079: the 7 torsion angles of each residue (pre-omega, phi, psi, chi1-4)
    as (sin, cos), their mask and the alternative angles (chi + pi for the pi-periodic chis).
    Each angle is the fourth atom's direction in the frame of the first three (x along the
    second -> third bond); psi's sign reversed, as the reference does."""
    aatype = torch.clamp(aatype.long(), max=20)
    pos, mask = all_atom_positions, all_atom_mask
    prev_pos = torch.cat([pos.new_zeros(*pos.shape[:-3], 1, 37, 3), pos[..., :-1, :, :]], dim=-3)
    prev_mask = torch.cat([mask.new_zeros(*mask.shape[:-2], 1, 37), mask[..., :-1, :]], dim=-2)
    pre_omega = torch.cat([prev_pos[..., 1:3, :], pos[..., :2, :]], dim=-2)        # CA-, C-, N, CA
    phi = torch.cat([prev_pos[..., 2:3, :], pos[..., :3, :]], dim=-2)              # C-, N, CA, C
    psi = torch.cat([pos[..., :3, :], pos[..., 4:5, :]], dim=-2)                    # N, CA, C, O
    pre_omega_mask = torch.prod(prev_mask[..., 1:3], dim=-1) * torch.prod(mask[..., :2], dim=-1)
    phi_mask = prev_mask[..., 2] * torch.prod(mask[..., :3], dim=-1, dtype=mask.dtype)
    psi_mask = torch.prod(mask[..., :3], dim=-1, dtype=mask.dtype) * mask[..., 4]
    chi_idx = _table("chi_atoms", aatype)[aatype]                                   # [*, N, 4, 4]
    chi_pos = _gather_xyz(pos, chi_idx)                                           # [*, N, 4, 4, 3]
    chi_mask = _table("chi_mask", aatype, mask.dtype)[aatype] * torch.prod(
        _gather_mask(mask, chi_idx), dim=-1, dtype=mask.dtype)
    atoms = torch.cat([pre_omega[..., None, :, :], phi[..., None, :, :], psi[..., None, :, :], chi_pos], dim=-3)
    angles_mask = torch.cat([pre_omega_mask[..., None], phi_mask[..., None], psi_mask[..., None], chi_mask], dim=-1)

    frames = frames_from_3_points(atoms[..., 1, :], atoms[..., 2, :], atoms[..., 0, :], eps=1e-8)
    fourth = invert_frames(frames).apply(atoms[..., 3, :])
    sin_cos = torch.stack([fourth[..., 2], fourth[..., 1]], dim=-1)
    sin_cos = sin_cos / torch.sqrt(torch.sum(torch.square(sin_cos), dim=-1, dtype=sin_cos.dtype, keepdim=True) + 1e-8)
    sin_cos = sin_cos * mask.new_tensor([1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0])[:, None]
    periodic = _table("chi_pi_periodic", aatype, sin_cos.dtype)[aatype]
    mirror = torch.cat([mask.new_ones(*aatype.shape, 3), 1.0 - 2.0 * periodic], dim=-1)
    return {"torsion_angles_sin_cos": sin_cos, "alt_torsion_angles_sin_cos": sin_cos * mirror[..., None],
            "torsion_angles_mask": angles_mask}


def make_pseudo_beta(aatype: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor) -> dict:
    """transforms.py:369-408: CB, CA for glycine, and whether that atom was resolved."""
    is_gly = aatype == M.GLY
    return {"pseudo_beta": M.pseudo_beta(aatype, all_atom_positions),
            "pseudo_beta_mask": torch.where(is_gly, all_atom_mask[..., M.CA], all_atom_mask[..., M.CB])}


def ground_truth_features(aatype: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor) -> dict:
    """The structure features the loss reads, from a chain's (or a crop's) aatype [*, N] int,
    all_atom_positions [*, N, 37, 3] and all_atom_mask [*, N, 37], made as the reference's
    training and eval pipeline makes them (features.py:293-305: make_atom14_masks,
    make_atom14_positions, atom37_to_frames, atom37_to_torsion_angles, make_pseudo_beta,
    get_backbone_frames, get_chi_angles). Returns the inputs with the reference's keys added."""
    out = {"aatype": aatype, "all_atom_positions": all_atom_positions, "all_atom_mask": all_atom_mask}
    out.update(make_atom14_masks(aatype))
    out.update(make_atom14_positions(aatype, all_atom_positions, all_atom_mask, out["atom14_atom_exists"],
                                     out["residx_atom14_to_atom37"]))
    out.update(atom37_to_frames(aatype, all_atom_positions, all_atom_mask))
    out.update(atom37_to_torsion_angles(aatype, all_atom_positions, all_atom_mask))
    out.update(make_pseudo_beta(aatype, all_atom_positions, all_atom_mask))
    # transforms.py:1082-1097
    out["backbone_rigid_tensor"] = out["rigidgroups_gt_frames"][..., 0, :, :]
    out["backbone_rigid_mask"] = out["rigidgroups_gt_exists"][..., 0]
    out["chi_angles_sin_cos"] = out["torsion_angles_sin_cos"][..., 3:, :].to(all_atom_mask.dtype)
    out["chi_mask"] = out["torsion_angles_mask"][..., 3:].to(all_atom_mask.dtype)
    return out


def use_clamped_fape(seed: int, probability: float = USE_CLAMPED_FAPE_PROBABILITY) -> float:
    """1.0 (clamped backbone FAPE) or 0.0 for a training sample, drawn as features.py:193-204
    does from the sample's seed: 1.0 with the given probability."""
    return float(random.Random(seed).uniform(0, 1) < probability)


# ------------------------------------------------------------------ the terms

def softmax_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """loss.py:218-220."""
    return -torch.sum(targets * torch.log_softmax(logits, dim=-1), dim=-1)


def masked_mean(mask: torch.Tensor, value: torch.Tensor, dim, eps: float = 1e-4) -> torch.Tensor:
    """loss.py:1572-1579 (its eps 1e-4, whatever the term's configured eps)."""
    mask = mask.expand(*value.shape)
    return torch.sum(mask * value, dim=dim) / (eps + torch.sum(mask, dim=dim))


def compute_fape(pred_frames: M.Frames, target_frames: M.Frames, frames_mask: torch.Tensor,
                 pred_positions: torch.Tensor, target_positions: torch.Tensor, positions_mask: torch.Tensor,
                 length_scale: float, l1_clamp_distance: float | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Frame-aligned point error (Algorithm 28, loss.py:228-283): every position seen from every
    frame, predicted against true, sqrt(d^2 + eps), clamped, / length_scale, averaged over the
    masked frames then the masked positions. Frames [*, F], positions [*, P, 3] -> [*]."""
    local_pred = invert_frames(pred_frames).unsqueeze(-1).apply(pred_positions[..., None, :, :])
    local_target = invert_frames(target_frames).unsqueeze(-1).apply(target_positions[..., None, :, :])
    error = torch.sqrt(torch.sum((local_pred - local_target) ** 2, dim=-1) + eps)
    if l1_clamp_distance is not None:
        error = torch.clamp(error, min=0, max=l1_clamp_distance)
    error = error / length_scale * frames_mask[..., None] * positions_mask[..., None, :]
    error = torch.sum(error, dim=-1) / (eps + torch.sum(frames_mask, dim=-1))[..., None]
    return torch.sum(error, dim=-1) / (eps + torch.sum(positions_mask, dim=-1))


def _batch_frames(f: M.Frames, index) -> M.Frames:
    return M.Frames(f.rot[index], f.trans[index])


def backbone_loss(backbone_rigid_tensor: torch.Tensor, backbone_rigid_mask: torch.Tensor, traj: torch.Tensor,
                  use_clamped_fape: torch.Tensor | None = None, clamp_distance: float = 10.0,
                  loss_unit_distance: float = 10.0, eps: float = 1e-4) -> torch.Tensor:
    """loss.py:286-343: FAPE of the backbone frames of every structure-module block traj
    [B, K, N, 7] against the true ones [B, N, 4, 4], positions = the frames' origins (CA);
    clamped, or a per-sample mix of clamped and unclamped by use_clamped_fape [B]; mean over
    the blocks -> [B]."""
    pred = frames_from_tensor_7(traj)
    gt = _batch_frames(frames_from_4x4(backbone_rigid_tensor), (slice(None), None))
    mask = backbone_rigid_mask[:, None]

    def fape(clamp):
        return compute_fape(pred, gt, mask, pred.trans, gt.trans, mask, loss_unit_distance, clamp, eps)

    value = fape(clamp_distance)
    if use_clamped_fape is not None:
        use = use_clamped_fape.unsqueeze(-1)
        value = value * use + fape(None) * (1 - use)
    return torch.mean(value, dim=1)


def sidechain_loss(sidechain_frames: torch.Tensor, sidechain_atom_pos: torch.Tensor,
                   rigidgroups_gt_frames: torch.Tensor, rigidgroups_alt_gt_frames: torch.Tensor,
                   rigidgroups_gt_exists: torch.Tensor, renamed_atom14_gt_positions: torch.Tensor,
                   renamed_atom14_gt_exists: torch.Tensor, alt_naming_is_better: torch.Tensor,
                   clamp_distance: float = 10.0, length_scale: float = 10.0, eps: float = 1e-4) -> torch.Tensor:
    """loss.py:346-388: FAPE of all atoms in all rigid-group frames of the last block, the true
    frames of the ambiguous groups taken in the naming the renaming chose -> [B]."""
    alt = alt_naming_is_better[..., None, None, None]
    gt_frames = (1.0 - alt) * rigidgroups_gt_frames + alt * rigidgroups_alt_gt_frames
    b = sidechain_frames.shape[0]
    pred = frames_from_4x4(sidechain_frames[:, -1].reshape(b, -1, 4, 4))
    gt = frames_from_4x4(gt_frames.reshape(b, -1, 4, 4))
    return compute_fape(pred, gt, rigidgroups_gt_exists.reshape(b, -1),
                        sidechain_atom_pos[:, -1].reshape(b, -1, 3), renamed_atom14_gt_positions.reshape(b, -1, 3),
                        renamed_atom14_gt_exists.reshape(b, -1), length_scale, clamp_distance, eps)


def compute_renamed_ground_truth(atom14_pred_positions: torch.Tensor, atom14_gt_positions: torch.Tensor,
                                 atom14_alt_gt_positions: torch.Tensor, atom14_gt_exists: torch.Tensor,
                                 atom14_alt_gt_exists: torch.Tensor, atom14_atom_is_ambiguous: torch.Tensor,
                                 eps: float = 1e-10) -> dict:
    """Algorithm 26 (loss.py:1470-1569): per residue, the naming of its symmetric atoms whose
    distances to all unambiguous atoms better match the prediction's (the sum of
    sqrt(eps + (d_pred - d_true)^2)); the ground truth and its mask in that naming."""
    def dists(x):    # [B, N(i), N(j), 14(a), 14(b)]: atom a of residue i to atom b of residue j
        return torch.sqrt(eps + torch.sum((x[..., None, :, None, :] - x[..., None, :, None, :, :]) ** 2, dim=-1))

    pred = dists(atom14_pred_positions)
    err = torch.sqrt(eps + (pred - dists(atom14_gt_positions)) ** 2)
    alt_err = torch.sqrt(eps + (pred - dists(atom14_alt_gt_positions)) ** 2)
    ex, amb = atom14_gt_exists, atom14_atom_is_ambiguous
    mask = (ex[..., None, :, None] * amb[..., None, :, None]                       # ambiguous atom (i, a)
            * ex[..., None, :, None, :] * (1.0 - amb[..., None, :, None, :]))       # unambiguous (j, b)
    better = (torch.sum(mask * alt_err, dim=(-1, -2, -3)) < torch.sum(mask * err, dim=(-1, -2, -3)))
    better = better.type(atom14_pred_positions.dtype)
    return {"alt_naming_is_better": better,
            "renamed_atom14_gt_positions": (1.0 - better[..., None, None]) * atom14_gt_positions
            + better[..., None, None] * atom14_alt_gt_positions,
            "renamed_atom14_gt_exists": (1.0 - better[..., None]) * atom14_gt_exists
            + better[..., None] * atom14_alt_gt_exists}


def supervised_chi_loss(angles_sin_cos: torch.Tensor, unnormalized_angles_sin_cos: torch.Tensor,
                        aatype: torch.Tensor, seq_mask: torch.Tensor, chi_mask: torch.Tensor,
                        chi_angles_sin_cos: torch.Tensor, chi_weight: float, angle_norm_weight: float,
                        eps: float = 1e-6) -> torch.Tensor:
    """Algorithm 27 (loss.py:434-495): the squared (sin, cos) error of the four chi angles of
    every block, the smaller of the errors against the true and the pi-shifted true angle for
    the pi-periodic chis, x chi_weight; plus angle_norm_weight x the mean |norm - 1| of the
    unnormalised 7 angles."""
    pred = angles_sin_cos[..., 3:, :]                                               # [B, K, N, 4, 2]
    periodic = _table("chi_pi_periodic", aatype, angles_sin_cos.dtype)[aatype.long()]
    true = chi_angles_sin_cos[:, None]
    shifted = (1 - 2 * periodic).unsqueeze(-1).unsqueeze(-4) * true
    error = torch.minimum(torch.sum((true - pred) ** 2, dim=-1), torch.sum((shifted - pred) ** 2, dim=-1))
    loss = chi_weight * masked_mean(chi_mask[..., None, :, :], error, dim=(-1, -2, -3))
    norm = torch.sqrt(torch.sum(unnormalized_angles_sin_cos ** 2, dim=-1) + eps)
    return loss + angle_norm_weight * masked_mean(seq_mask[..., None, :, None], torch.abs(norm - 1.0),
                                                  dim=(-1, -2, -3))


def distogram_loss(logits: torch.Tensor, pseudo_beta: torch.Tensor, pseudo_beta_mask: torch.Tensor,
                   min_bin: float = 2.3125, max_bin: float = 21.6875, num_bins: int = 64,
                   eps: float = 1e-6) -> torch.Tensor:
    """loss.py:498-536: cross-entropy of the distogram against the pseudo-beta distance's bin
    (num_bins - 1 edges from min_bin to max_bin), averaged over resolved pairs."""
    edges = torch.linspace(min_bin, max_bin, num_bins - 1, device=logits.device) ** 2
    d2 = torch.sum((pseudo_beta[..., None, :] - pseudo_beta[..., None, :, :]) ** 2, dim=-1, keepdim=True)
    errors = softmax_cross_entropy(logits, F.one_hot(torch.sum(d2 > edges, dim=-1), num_bins))
    square = pseudo_beta_mask[..., None] * pseudo_beta_mask[..., None, :]
    denom = eps + torch.sum(square, dim=(-1, -2))
    return torch.sum(torch.sum(errors * square, dim=-1) / denom[..., None], dim=-1)


def masked_msa_loss(logits: torch.Tensor, true_msa: torch.Tensor, bert_mask: torch.Tensor,
                    eps: float = 1e-8) -> torch.Tensor:
    """loss.py:539-576: cross-entropy of the masked MSA head at the BERT-masked positions."""
    errors = softmax_cross_entropy(logits, F.one_hot(true_msa.long(), num_classes=23))
    scale = 0.5    # the reference's fp16-friendly halving, undone at the end
    denom = eps + torch.sum(scale * bert_mask, dim=(-1, -2))
    return torch.sum(torch.sum(errors * bert_mask, dim=-1) / denom[..., None], dim=-1) * scale


def lddt(all_atom_pred_pos: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor,
         cutoff: float = 15.0, eps: float = 1e-10, per_residue: bool = True) -> torch.Tensor:
    """lDDT (loss.py:596-649): over the pairs of resolved points closer than `cutoff` in the
    truth, the mean of the fractions of the thresholds 0.5, 1, 2, 4 A their distance error stays
    under; per residue or over all. Positions [*, N, 3], mask [*, N, 1]."""
    n = all_atom_mask.shape[-2]

    def dmat(x):
        return torch.sqrt(eps + torch.sum((x[..., None, :] - x[..., None, :, :]) ** 2, dim=-1))

    d_true = dmat(all_atom_positions)
    d_pred = dmat(all_atom_pred_pos)
    scored = ((d_true < cutoff) * all_atom_mask * torch.swapdims(all_atom_mask, -2, -1)
              * (1.0 - torch.eye(n, device=all_atom_mask.device)))
    l1 = torch.abs(d_true - d_pred)
    score = sum((l1 < t).type(l1.dtype) for t in (0.5, 1.0, 2.0, 4.0)) * 0.25
    dims = (-1,) if per_residue else (-2, -1)
    return 1.0 / (eps + torch.sum(scored, dim=dims)) * (eps + torch.sum(scored * score, dim=dims))


def lddt_ca(all_atom_pred_pos: torch.Tensor, all_atom_positions: torch.Tensor, all_atom_mask: torch.Tensor,
            cutoff: float = 15.0, eps: float = 1e-10, per_residue: bool = True) -> torch.Tensor:
    """lDDT of the CA atoms of atom37 positions [*, N, 37, 3] and mask [*, N, 37] (loss.py:652-672)."""
    return lddt(all_atom_pred_pos[..., M.CA, :], all_atom_positions[..., M.CA, :],
                all_atom_mask[..., M.CA:M.CA + 1], cutoff=cutoff, eps=eps, per_residue=per_residue)


def validation_lddt_ca(predicted_atom_positions: torch.Tensor, target_atom_positions: torch.Tensor,
                       atom_mask: torch.Tensor) -> torch.Tensor:
    """The MLPerf metric of one validation target [*]: lDDT-Ca over the whole chain of the eval
    forward's final_atom_positions against the target's atom37 positions and mask
    (validation_metrics.py:27-53, called by train.py:366-372 with eps 1e-8, per_residue False)."""
    return lddt_ca(predicted_atom_positions, target_atom_positions, atom_mask, eps=VALIDATION_LDDT_EPS,
                   per_residue=False)


def average_lddt_ca(per_target) -> float:
    """The evaluation's avg lDDT-Ca: the plain mean over the validation targets (train.py:885-887);
    MLPerf's target is >= 0.8 (TARGET_AVG_LDDT_CA)."""
    values = [float(v) for v in per_target]
    if not values:
        raise KitError("average_lddt_ca: no validation targets")
    return sum(values) / len(values)


def lddt_loss(logits: torch.Tensor, all_atom_pred_pos: torch.Tensor, all_atom_positions: torch.Tensor,
              all_atom_mask: torch.Tensor, resolution: torch.Tensor, cutoff: float = 15.0, num_bins: int = 50,
              min_resolution: float = 0.1, max_resolution: float = 3.0, eps: float = 1e-10) -> torch.Tensor:
    """pLDDT head loss (loss.py:675-717): cross-entropy of the lddt logits against the bin of each
    residue's true lDDT-Ca of the final structure (no gradient through it); zero for samples
    whose resolution is outside [min, max]."""
    mask = all_atom_mask[..., M.CA:M.CA + 1]
    score = lddt(all_atom_pred_pos[..., M.CA, :], all_atom_positions[..., M.CA, :], mask, cutoff=cutoff,
                 eps=eps).detach()
    bins = torch.clamp(torch.floor(score * num_bins).long(), max=num_bins - 1)
    errors = softmax_cross_entropy(logits, F.one_hot(bins, num_classes=num_bins))
    mask = mask.squeeze(-1)
    loss = torch.sum(errors * mask, dim=-1) / (eps + torch.sum(mask, dim=-1))
    return loss * ((resolution >= min_resolution) & (resolution <= max_resolution))


def experimentally_resolved_loss(logits: torch.Tensor, atom37_atom_exists: torch.Tensor,
                                 all_atom_mask: torch.Tensor, resolution: torch.Tensor, min_resolution: float,
                                 max_resolution: float, eps: float = 1e-8) -> torch.Tensor:
    """loss.py:720-736: sigmoid cross-entropy of each existing atom's resolved logit against
    its mask, averaged over the existing atoms; zero outside the resolution range."""
    errors = F.binary_cross_entropy_with_logits(logits, all_atom_mask, reduction="none")
    loss = torch.sum(errors * atom37_atom_exists, dim=-1)
    loss = loss / (eps + torch.sum(atom37_atom_exists, dim=(-1, -2)))[..., None]
    return torch.sum(loss, dim=-1) * ((resolution >= min_resolution) & (resolution <= max_resolution))


def tm_loss(logits: torch.Tensor, final_affine_tensor: torch.Tensor, backbone_rigid_tensor: torch.Tensor,
            backbone_rigid_mask: torch.Tensor, resolution: torch.Tensor, max_bin: int = 31, num_bins: int = 64,
            min_resolution: float = 0.1, max_resolution: float = 3.0, eps: float = 1e-8) -> torch.Tensor:
    """loss.py:844-899 (with the TM head, off in the MLPerf preset): cross-entropy of the aligned
    error logits [B, N, N, bins] against the bin of the squared error of each CA seen from each
    residue's frame, predicted against true."""
    def points(f: M.Frames):
        return invert_frames(f).unsqueeze(-1).apply(f.trans[..., None, :, :])

    sq = torch.sum((points(frames_from_tensor_7(final_affine_tensor))
                    - points(frames_from_4x4(backbone_rigid_tensor))) ** 2, dim=-1).detach()
    edges = torch.linspace(0, max_bin, num_bins - 1, device=logits.device) ** 2
    errors = softmax_cross_entropy(logits, F.one_hot(torch.sum(sq[..., None] > edges, dim=-1), num_bins))
    square = backbone_rigid_mask[..., None] * backbone_rigid_mask[..., None, :]
    scale = 0.5
    denom = eps + torch.sum(scale * square, dim=(-1, -2))
    loss = torch.sum(torch.sum(errors * square, dim=-1) / denom[..., None], dim=-1) * scale
    return loss * ((resolution >= min_resolution) & (resolution <= max_resolution))


# ------------------------------------------------------------------ the loss

class AlphaFoldLoss(nn.Module):
    """The training loss (loss.py:32-215). forward(outputs, batch) -> (loss, terms): the model's
    output dict (sm_frames, sm_sidechain_frames, sm_positions, sm_angles, sm_unnormalized_angles,
    final_atom_positions, distogram_logits, masked_msa_logits, lddt_logits,
    experimentally_resolved_logits, and tm_logits with the TM term) and a batch without the
    recycling dimension holding ground_truth_features' keys and aatype [B, N], seq_mask [B, N],
    true_msa and bert_mask [B, S, N], resolution [B], seq_length [B] (the chain's length before
    cropping) and optionally use_clamped_fape [B]. loss: the batch mean of the scaled weighted
    total, with autograd; terms: each unweighted term, weighted_total_loss and
    scaled_weighted_total_loss, batch means, detached."""

    def __init__(self, config: dict | None = None):
        super().__init__()
        self.config = loss_config(config)

    def forward(self, outputs: dict, batch: dict) -> tuple[torch.Tensor, dict]:
        c = self.config
        fc = c["fape_loss_config"]
        batch = {**batch, **compute_renamed_ground_truth(
            outputs["sm_positions"][:, -1], batch["atom14_gt_positions"], batch["atom14_alt_gt_positions"],
            batch["atom14_gt_exists"], batch["atom14_alt_gt_exists"], batch["atom14_atom_is_ambiguous"])}
        bb = backbone_loss(batch["backbone_rigid_tensor"], batch["backbone_rigid_mask"], outputs["sm_frames"],
                           batch.get("use_clamped_fape"), fc["backbone_clamp_distance"],
                           fc["backbone_loss_unit_distance"], fc["eps"])
        sc = sidechain_loss(outputs["sm_sidechain_frames"], outputs["sm_positions"], batch["rigidgroups_gt_frames"],
                            batch["rigidgroups_alt_gt_frames"], batch["rigidgroups_gt_exists"],
                            batch["renamed_atom14_gt_positions"], batch["renamed_atom14_gt_exists"],
                            batch["alt_naming_is_better"], fc["sidechain_clamp_distance"],
                            fc["sidechain_length_scale"], fc["eps"])
        cc, dc, mc = c["supervised_chi_loss_config"], c["distogram_loss_config"], c["masked_msa_loss_config"]
        pc, ec, tc = c["plddt_loss_config"], c["experimentally_resolved_loss_config"], c["tm_loss_config"]
        losses = {
            "fape": bb * fc["backbone_weight"] + sc * fc["sidechain_weight"],
            "supervised_chi": supervised_chi_loss(
                outputs["sm_angles"], outputs["sm_unnormalized_angles"], batch["aatype"], batch["seq_mask"],
                batch["chi_mask"], batch["chi_angles_sin_cos"], cc["chi_weight"], cc["angle_norm_weight"], cc["eps"]),
            "distogram": distogram_loss(outputs["distogram_logits"], batch["pseudo_beta"], batch["pseudo_beta_mask"],
                                        dc["min_bin"], dc["max_bin"], dc["num_bins"], dc["eps"]),
            "masked_msa": masked_msa_loss(outputs["masked_msa_logits"], batch["true_msa"], batch["bert_mask"],
                                          mc["eps"]),
            "plddt_loss": lddt_loss(outputs["lddt_logits"], outputs["final_atom_positions"],
                                    batch["all_atom_positions"], batch["all_atom_mask"], batch["resolution"],
                                    pc["cutoff"], pc["num_bins"], pc["min_resolution"], pc["max_resolution"],
                                    pc["eps"]),
            "experimentally_resolved": experimentally_resolved_loss(
                outputs["experimentally_resolved_logits"], batch["atom37_atom_exists"], batch["all_atom_mask"],
                batch["resolution"], ec["min_resolution"], ec["max_resolution"], ec["eps"]),
        }
        weights = {"fape": fc["weight"], "supervised_chi": cc["weight"], "distogram": dc["weight"],
                   "masked_msa": mc["weight"], "plddt_loss": pc["weight"], "experimentally_resolved": ec["weight"]}
        if tc["enabled"]:
            losses["tm"] = tm_loss(outputs["tm_logits"], outputs["final_affine_tensor"],
                                   batch["backbone_rigid_tensor"], batch["backbone_rigid_mask"], batch["resolution"],
                                   tc["max_bin"], tc["num_bins"], tc["min_resolution"], tc["max_resolution"],
                                   tc["eps"])
            weights["tm"] = tc["weight"]
        size = batch["aatype"].shape[0]
        for name, value in losses.items():
            if value.shape != (size,):
                raise KitError(f"loss term {name}: shape {tuple(value.shape)}, expected ({size},)")
        weighted = {}
        for name, value in losses.items():
            w = value * weights[name]
            if torch.isnan(w).any() or torch.isinf(w).any():     # loss.py:190-195
                log.warning("OpenFold loss: weighted %s is %s; replaced by 0", name, w.detach().tolist())
                w = torch.zeros_like(w, requires_grad=True)
            weighted[name] = w
        total = sum(weighted.values())
        # loss.py:199-212: x sqrt of the residues after cropping, so that chains shorter than
        # the crop weigh less
        seq_length = batch["seq_length"].float()
        crop = torch.ones_like(seq_length) * batch["aatype"].shape[1]
        scaled = torch.sqrt(torch.minimum(seq_length, crop)) * total
        report = {name: value.detach().clone().mean() for name, value in losses.items()}
        report["weighted_total_loss"] = total.detach().clone().mean()
        report["scaled_weighted_total_loss"] = scaled.detach().clone().mean()
        return scaled.mean(), report
