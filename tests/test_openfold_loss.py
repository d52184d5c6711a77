"""OpenFold's training loss, its ground-truth features and lDDT-Ca, quick: against the MLPerf
reference's, and sanity checks that can fail.

The reference is mlcommons/hpc@2c627d4 openfold/. With HPCKIT_OPENFOLD_REFERENCE naming its
openfold/ directory, the reference's openfold.loss, openfold.data.transforms and
openfold.validation_metrics are imported from there (as tests/test_openfold_model.py imports
its model, plus an empty stand-in for Bio.SVDSuperimposer when biopython is missing: only the
superimposition metrics use it, not lDDT-Ca) and run on the same inputs as ours, in float64
(test_*_equal_reference). Without it (CI) our numbers are compared with the reference's, written
once to tests/data/openfold_reference_loss.json; HPCKIT_OPENFOLD_WRITE_GOLDEN=1 with the clone
rewrites that file (test_write_golden).

The inputs (all pure functions of the seeds below):
* the residues: aatype of test_openfold_model's example batch (16 residues, GMFWKSTCREQWYAIT,
  the last one padding);
* the truth: ideal residues (the model's literature positions) on a helical CA trace (radius
  2.3 A, rise 1.5 A, 100 degrees a residue), backbone orientations random unit quaternions,
  psi and chi angles uniform; 5 % of the atoms unresolved (none of PHE 2), residue 3 without
  N, residue 6 without CB, the padding residue without any;
* case "model": the mini model's eval forward (test_openfold_model.our_outputs, fp64, seeded
  weights) as the prediction of two samples with the same truth, use_clamped_fape 1 and 0
  (clamped and unclamped backbone FAPE: the errors are mostly over 10 A), resolutions 2.0 and
  0.05 A (the second outside the pLDDT and resolved range), seq_length 15 and 300;
* case "near": two samples, each a noisy copy of its own truth as a 2-block structure-module
  trajectory (quaternion, translation and angle noise; chi2 of PHE 2 turned by pi in sample 0,
  so that the renaming takes the alternative naming there) with random logits; no
  use_clamped_fape (clamped), resolutions 2.0 and 3.5 A, seq_length 15 and 40 (one chain
  shorter than the 16-residue crop, one longer);
* lDDT-Ca: the truth against itself plus Gaussian noise of 0, 0.25, 0.5, 1, 2, 4 A.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hpckit.common.errors import KitError
from hpckit.openfold import loss as L
from hpckit.openfold import model as M
from test_openfold_model import (INPUT_SEED, INPUTS, REF_ENV, WEIGHT_SEED, WRITE_ENV, import_reference, mini,
                                 our_outputs, seeded_weights)

GOLDEN = Path(__file__).parent / "data" / "openfold_reference_loss.json"
TRUTH_SEEDS, NOISE_SEED, LOGIT_SEED, MSA_SEED = (11, 12), 13, 14, 15
LDDT_NOISE = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
TERMS = ("fape", "supervised_chi", "distogram", "masked_msa", "plddt_loss", "experimentally_resolved",
         "weighted_total_loss", "scaled_weighted_total_loss")
# How closely ours equals the reference's (relative to max(1, |value|)), float64. The frames are
# fp32 in both (the reference's Rigid forces it); the backbone FAPE is computed from them in fp32
# throughout, and our quaternion -> matrix sums its products in another order than the
# reference's, so what contains the backbone FAPE agrees to fp32 rounding; the rest to fp64's.
RTOL_FP32, RTOL_FP64 = 2e-6, 1e-12
FP32_TERMS = ("fape", "backbone", "tm", "weighted_total_loss", "scaled_weighted_total_loss")


def rtol(term: str) -> float:
    return RTOL_FP32 if term in FP32_TERMS else RTOL_FP64


# ----------------------------------------------------------------------------- the inputs

def aatype() -> torch.Tensor:
    return M.example_batch(**INPUTS, seed=INPUT_SEED)["aatype"][..., -1]     # [1, 16]


def _tables(dtype) -> dict:
    return {k: torch.as_tensor(v, dtype=dtype if v.dtype == np.float32 else None) for k, v in M.TABLES.items()}


def build_structure(aa: torch.Tensor, quats: torch.Tensor, trans: torch.Tensor, angles: torch.Tensor,
                    scale: torch.Tensor | None = None) -> dict:
    """A structure-module-like output of one block from backbone quaternions [*, N, 4],
    translations [*, N, 3] and 7 torsion angles [*, N, 7] (radians), with the model's own
    geometry (torsion_angles_to_frames, frames_to_atom14): frames fp32, positions float64."""
    t = _tables(torch.float64)
    alpha = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1)
    quats = quats / torch.linalg.norm(quats, dim=-1, keepdim=True)
    bb = M.Frames.make(M.quat_to_rot(quats.float()), trans)
    frames = M.torsion_angles_to_frames(bb, alpha, aa, t["default_frames"])
    atom14 = M.frames_to_atom14(frames, aa, t)
    index = t["atom37_to_atom14"][aa]
    atom37 = torch.gather(atom14, -2, index[..., None].expand(*index.shape, 3)) * t["atom37_mask"][aa][..., None]
    return {"sm_frames": torch.cat([quats.float(), trans.float()], dim=-1), "sm_sidechain_frames": frames.to_4x4(),
            "sm_angles": alpha, "sm_unnormalized_angles": alpha * (1.0 if scale is None else scale[..., None]),
            "sm_positions": atom14, "final_atom_positions": atom37}


def truth_parameters(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    theta = np.deg2rad(100.0) * i
    trans = np.stack([2.3 * np.cos(theta), 2.3 * np.sin(theta), 1.5 * i], axis=-1)
    quats = rng.normal(size=(n, 4))
    angles = rng.uniform(-np.pi, np.pi, (n, 7))
    return torch.from_numpy(quats), torch.from_numpy(trans), torch.from_numpy(angles)


def truth(aa: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(all_atom_positions [N, 37, 3], all_atom_mask [N, 37]) of one chain, float64."""
    q, t, a = truth_parameters(aa.shape[-1], seed)
    pos = build_structure(aa, q, t, a)["final_atom_positions"]
    mask = torch.as_tensor(M.TABLES["atom37_mask"], dtype=torch.float64)[aa]
    drop = torch.from_numpy(np.random.default_rng(seed + 100).random(mask.shape) < 0.05)
    drop[2] = False     # PHE 2 whole: the renaming test turns its ring
    mask = mask * ~drop
    mask[3, M.ATOM37.index("N")] = 0.0
    mask[6, M.CB] = 0.0
    mask[-1] = 0.0
    return pos * mask[..., None], mask


def loss_batch(aa: torch.Tensor, seeds, use_clamped, resolution, seq_length, gt_features) -> dict:
    """The batch the loss reads: ground-truth features (gt_features(aatype, positions, mask),
    ours or the reference's) and the rest."""
    B, N = len(seeds), aa.shape[-1]
    structures = [truth(aa, s) for s in seeds]
    pos = torch.stack([p for p, _ in structures])
    mask = torch.stack([m for _, m in structures])
    aat = aa.expand(B, N)
    rng = np.random.default_rng(MSA_SEED)
    S = INPUTS["n_clust"]
    seq_mask = torch.ones(B, N, dtype=torch.float64)
    seq_mask[:, -1] = 0.0
    batch = gt_features(aat, pos, mask)
    batch.update({"aatype": aat, "seq_mask": seq_mask, "residue_index": torch.arange(N).expand(B, N),
                  "true_msa": torch.from_numpy(rng.integers(0, 22, (B, S, N))),
                  "bert_mask": torch.from_numpy((rng.random((B, S, N)) < 0.3).astype(np.float64)),
                  "resolution": torch.tensor(resolution, dtype=torch.float64),
                  "seq_length": torch.tensor(seq_length), "all_atom_positions": pos, "all_atom_mask": mask})
    if use_clamped is not None:
        batch["use_clamped_fape"] = torch.tensor(use_clamped, dtype=torch.float32)
    return batch


def near_outputs(aa: torch.Tensor, seeds) -> dict:
    """Case "near": per sample a noisy copy of its truth as a 2-block trajectory, random logits."""
    rng = np.random.default_rng(NOISE_SEED)
    N, S = aa.shape[-1], INPUTS["n_clust"]
    samples = []
    for b, seed in enumerate(seeds):
        q, t, a = truth_parameters(N, seed)
        blocks = []
        for sigma in (0.3, 0.1):
            da = rng.normal(0.0, sigma, a.shape)
            if b == 0 and sigma == 0.1:
                da[2, 4] += np.pi    # PHE 2: chi2 (angle 4) turned by pi: its ring atoms take the swapped names
            blocks.append(build_structure(aa, q + torch.from_numpy(rng.normal(0.0, sigma, q.shape)),
                                          t + torch.from_numpy(rng.normal(0.0, 3 * sigma, t.shape)),
                                          a + torch.from_numpy(da),
                                          torch.from_numpy(rng.uniform(0.7, 1.3, a.shape))))
        out = {k: torch.stack([blk[k] for blk in blocks]) for k in blocks[0] if k != "final_atom_positions"}
        out["final_atom_positions"] = blocks[-1]["final_atom_positions"]
        samples.append(out)
    out = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
    B = len(seeds)
    lg = np.random.default_rng(LOGIT_SEED)
    out.update({"final_affine_tensor": out["sm_frames"][:, -1],
                "distogram_logits": torch.from_numpy(lg.normal(size=(B, N, N, 64))),
                "masked_msa_logits": torch.from_numpy(lg.normal(size=(B, S, N, 23))),
                "lddt_logits": torch.from_numpy(lg.normal(size=(B, N, 50))),
                "experimentally_resolved_logits": torch.from_numpy(lg.normal(size=(B, N, 37)))})
    return out


CASES = {   # name: (truth seeds, use_clamped_fape or None (absent), resolution, seq_length)
    "model": ((TRUTH_SEEDS[0], TRUTH_SEEDS[0]), (1.0, 0.0), (2.0, 0.05), (15, 300)),
    "near": (TRUTH_SEEDS, None, (2.0, 3.5), (15, 40)),
}


def case(name: str, gt_features) -> tuple[dict, dict]:
    seeds, use_clamped, resolution, seq_length = CASES[name]
    aa = aatype()[0]
    if name == "model":     # the one forward for every sample
        outputs = {k: v.expand(len(seeds), *v.shape[1:]) for k, v in our_outputs(torch.float64).items()}
    else:
        outputs = near_outputs(aa, seeds)
    return outputs, loss_batch(aa, seeds, use_clamped, resolution, seq_length, gt_features)


def tm_logits(batch: dict) -> torch.Tensor:
    """Seeded logits for the TM term (its head is off in the MLPerf config, the term is not)."""
    B, N = batch["aatype"].shape
    return torch.from_numpy(np.random.default_rng(LOGIT_SEED + 1).normal(size=(B, N, N, 64)))


def our_terms(outputs: dict, batch: dict, config: dict | None = None) -> dict:
    """Each term's batch mean, and per sample the backbone and side-chain FAPE, the renaming and
    the TM term (on tm_logits)."""
    _, terms = L.AlphaFoldLoss(config)(outputs, batch)
    res = {k: float(v) for k, v in terms.items()}
    renamed = L.compute_renamed_ground_truth(outputs["sm_positions"][:, -1], batch["atom14_gt_positions"],
                                             batch["atom14_alt_gt_positions"], batch["atom14_gt_exists"],
                                             batch["atom14_alt_gt_exists"], batch["atom14_atom_is_ambiguous"])
    res["backbone"] = L.backbone_loss(batch["backbone_rigid_tensor"], batch["backbone_rigid_mask"],
                                      outputs["sm_frames"], batch.get("use_clamped_fape")).tolist()
    res["sidechain"] = L.sidechain_loss(outputs["sm_sidechain_frames"], outputs["sm_positions"],
                                        batch["rigidgroups_gt_frames"], batch["rigidgroups_alt_gt_frames"],
                                        batch["rigidgroups_gt_exists"], renamed["renamed_atom14_gt_positions"],
                                        renamed["renamed_atom14_gt_exists"], renamed["alt_naming_is_better"]).tolist()
    res["alt_naming_is_better"] = renamed["alt_naming_is_better"].tolist()
    res["tm"] = L.tm_loss(tm_logits(batch), outputs["final_affine_tensor"], batch["backbone_rigid_tensor"],
                          batch["backbone_rigid_mask"], batch["resolution"]).tolist()
    return res


def noisy_lddt_inputs(seed: int = TRUTH_SEEDS[0]):
    aa = aatype()[0]
    pos, mask = truth(aa, seed)
    rng = np.random.default_rng(NOISE_SEED + 1)
    preds = torch.stack([pos + torch.from_numpy(rng.normal(0.0, s, pos.shape)) for s in LDDT_NOISE])
    return preds, pos.expand_as(preds), mask.expand(len(LDDT_NOISE), *mask.shape)


def our_lddt() -> dict:
    preds, pos, mask = noisy_lddt_inputs()
    return {"validation_lddt_ca": L.validation_lddt_ca(preds, pos, mask).tolist(),
            "per_residue_noise_1A": L.lddt_ca(preds[3], pos[3], mask[3]).tolist()}


FEATURE_KEYS = ("atom14_atom_exists", "residx_atom14_to_atom37", "residx_atom37_to_atom14", "atom37_atom_exists",
                "atom14_gt_exists", "atom14_gt_positions", "atom14_alt_gt_positions", "atom14_alt_gt_exists",
                "atom14_atom_is_ambiguous", "rigidgroups_gt_frames", "rigidgroups_gt_exists",
                "rigidgroups_group_exists", "rigidgroups_group_is_ambiguous", "rigidgroups_alt_gt_frames",
                "torsion_angles_sin_cos", "alt_torsion_angles_sin_cos", "torsion_angles_mask", "pseudo_beta",
                "pseudo_beta_mask", "backbone_rigid_tensor", "backbone_rigid_mask", "chi_angles_sin_cos", "chi_mask")


def feature_summary(batch: dict) -> dict:
    """Per feature: dtype, shape, sum and L2 norm (as float64)."""
    return {k: {"dtype": str(batch[k].dtype).replace("torch.", ""), "shape": list(batch[k].shape),
                "sum": float(batch[k].double().sum()), "norm": float(batch[k].double().norm())}
            for k in FEATURE_KEYS}


# ----------------------------------------------------------------------------- the reference

def reference_modules(root: Path):
    """(openfold.config, openfold.loss, openfold.data.transforms, openfold.validation_metrics)."""
    config, _, _ = import_reference(root)
    return (config, importlib.import_module("openfold.loss"), importlib.import_module("openfold.data.transforms"),
            importlib.import_module("openfold.validation_metrics"))


def reference_gt_features(aatype: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> dict:
    """The reference's transforms (features.py:293-305 order) on each sample, stacked."""
    _, _, T, _ = reference_modules(Path(os.environ[REF_ENV]))
    samples = []
    for b in range(aatype.shape[0]):
        p = {"aatype": aatype[b], "all_atom_positions": positions[b], "all_atom_mask": mask[b]}
        for f in (T.make_atom14_masks, T.make_atom14_positions, T.atom37_to_frames,
                  T.atom37_to_torsion_angles(""), T.make_pseudo_beta(""), T.get_backbone_frames, T.get_chi_angles):
            p = f(p)
        samples.append(p)
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def reference_terms(outputs: dict, batch: dict) -> dict:
    config, RL, _, _ = reference_modules(Path(os.environ[REF_ENV]))
    lc = config.LossConfig()
    out, b = dict(outputs), dict(batch)        # the reference adds keys to both
    _, terms = RL.AlphaFoldLoss(lc)(out, b)
    res = {k: float(v) for k, v in terms.items()}
    fc = lc.fape_loss_config
    res["backbone"] = RL.backbone_loss(b["backbone_rigid_tensor"], b["backbone_rigid_mask"], outputs["sm_frames"],
                                       b.get("use_clamped_fape"), fc.backbone_clamp_distance,
                                       fc.backbone_loss_unit_distance, fc.eps).tolist()
    res["sidechain"] = RL.sidechain_loss(outputs["sm_sidechain_frames"], outputs["sm_positions"],
                                         b["rigidgroups_gt_frames"], b["rigidgroups_alt_gt_frames"],
                                         b["rigidgroups_gt_exists"], b["renamed_atom14_gt_positions"],
                                         b["renamed_atom14_gt_exists"], b["alt_naming_is_better"],
                                         fc.sidechain_clamp_distance, fc.sidechain_length_scale, fc.eps).tolist()
    res["alt_naming_is_better"] = b["alt_naming_is_better"].tolist()
    tc = lc.tm_loss_config
    res["tm"] = RL.tm_loss(tm_logits(b), outputs["final_affine_tensor"], b["backbone_rigid_tensor"],
                           b["backbone_rigid_mask"], b["resolution"], tc.max_bin, tc.num_bins, tc.min_resolution,
                           tc.max_resolution, tc.eps).tolist()
    return res


def reference_lddt() -> dict:
    _, RL, _, V = reference_modules(Path(os.environ[REF_ENV]))
    preds, pos, mask = noisy_lddt_inputs()
    return {"validation_lddt_ca": [float(V.compute_validation_metrics(preds[i:i + 1], pos[i:i + 1], mask[i:i + 1],
                                                                      {"lddt_ca"})["lddt_ca"])
                                   for i in range(len(LDDT_NOISE))],
            "per_residue_noise_1A": RL.lddt_ca(preds[3], pos[3], mask[3]).tolist()}


def mismatches(ours: dict, ref: dict) -> list[str]:
    """Terms (scalars or per-sample lists) differing by more than rtol(term) x max(1, |ref|)."""
    bad = []
    for key, want in ref.items():
        if key == "violation" or key not in ours and key not in TERMS:
            continue
        got = ours.get(key)
        a, b = np.atleast_1d(np.asarray(got, dtype=float)), np.atleast_1d(np.asarray(want, dtype=float))
        if a.shape != b.shape or not np.all(np.abs(a - b) <= rtol(key) * np.maximum(1.0, np.abs(b))):
            bad.append(f"{key}: {got!r} != {want!r}")
    return bad


def max_abs_diff(ours: dict, ref: dict) -> dict:
    return {k: float(np.max(np.abs(np.asarray(ours[k], dtype=float) - np.asarray(ref[k], dtype=float))))
            for k in ref if k in ours}


needs_reference = pytest.mark.skipif(not os.environ.get(REF_ENV), reason=f"{REF_ENV} not set (no reference clone)")


@needs_reference
def test_ground_truth_features_equal_reference():
    """Our transforms and the reference's on the same truth: the same dtypes, and the same values
    to fp64 rounding (the frames fp32 in both)."""
    aa = aatype()[0]
    seeds = TRUTH_SEEDS
    pos = torch.stack([truth(aa, s)[0] for s in seeds])
    mask = torch.stack([truth(aa, s)[1] for s in seeds])
    aat = aa.expand(len(seeds), -1)
    ours, ref = L.ground_truth_features(aat, pos, mask), reference_gt_features(aat, pos, mask)
    diffs = {}
    for key in FEATURE_KEYS:
        a, b = ours[key], ref[key]
        assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype, a.shape, b.shape)
        diffs[key] = float((a.double() - b.double()).abs().max())
    print({k: f"{v:.1e}" for k, v in diffs.items()})
    assert all(v <= 1e-12 for v in diffs.values()), diffs
    assert ours["chi_mask"].sum() > 20 and ours["rigidgroups_gt_exists"].sum() > 50


@needs_reference
@pytest.mark.parametrize("name", list(CASES))
def test_loss_equals_reference(name):
    """Each term, the totals, per sample the backbone and side-chain FAPE and the renaming: the
    reference's loss on the reference's features against ours on ours."""
    outputs, batch = case(name, L.ground_truth_features)
    _, ref_batch = case(name, reference_gt_features)
    ours, ref = our_terms(outputs, batch), reference_terms(outputs, ref_batch)
    print(name, {k: f"{v:.2e}" for k, v in max_abs_diff(ours, ref).items()})
    assert set(TERMS) <= set(ref) and set(TERMS) <= set(ours)
    assert not mismatches(ours, ref), mismatches(ours, ref)


@needs_reference
def test_lddt_ca_equals_reference():
    ours, ref = our_lddt(), reference_lddt()
    print({k: f"{v:.1e}" for k, v in max_abs_diff(ours, ref).items()})
    for key in ref:
        assert np.allclose(ours[key], ref[key], rtol=0, atol=1e-14), (key, ours[key], ref[key])


@needs_reference
def test_reference_comparison_can_fail():
    """One weight changed (distogram 0.3 -> 0.31) is seen in the totals and nowhere else."""
    outputs, batch = case("near", L.ground_truth_features)
    _, ref_batch = case("near", reference_gt_features)
    bad = mismatches(our_terms(outputs, batch, {"distogram_loss_config": {"weight": 0.31}}),
                     reference_terms(outputs, ref_batch))
    assert sorted(b.split(":")[0] for b in bad) == ["scaled_weighted_total_loss", "weighted_total_loss"], bad


# ----------------------------------------------------------------------------- golden numbers

def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_loss_matches_reference_golden():
    g = golden()
    assert g["seeds"] == {"truth": list(TRUTH_SEEDS), "noise": NOISE_SEED, "logits": LOGIT_SEED, "msa": MSA_SEED,
                          "model_weights": WEIGHT_SEED, "model_inputs": INPUT_SEED}
    for name in CASES:
        outputs, batch = case(name, L.ground_truth_features)
        ours = our_terms(outputs, batch)
        print(name, {k: f"{v:.2e}" for k, v in max_abs_diff(ours, g["cases"][name]).items()})
        assert not mismatches(ours, g["cases"][name]), (name, mismatches(ours, g["cases"][name]))


def test_ground_truth_features_match_reference_golden():
    aa = aatype()[0]
    pos, mask = truth(aa, TRUTH_SEEDS[0])
    ours = feature_summary(L.ground_truth_features(aa[None], pos[None], mask[None]))
    for key, want in golden()["features"].items():
        got = ours[key]
        assert got["dtype"] == want["dtype"] and got["shape"] == want["shape"], (key, got, want)
        for stat in ("sum", "norm"):
            assert abs(got[stat] - want[stat]) <= 1e-9 * max(1.0, abs(want[stat])), (key, stat, got, want)


def test_lddt_ca_matches_reference_golden():
    ours, want = our_lddt(), dict(golden()["lddt_ca"])
    assert want.pop("noise_A") == list(LDDT_NOISE)
    for key in want:
        assert np.allclose(ours[key], want[key], rtol=0, atol=1e-14), (key, ours[key], want[key])


def test_golden_comparison_can_fail():
    """One weight changed (distogram 0.3 -> 0.31) is seen in the totals and nowhere else."""
    outputs, batch = case("near", L.ground_truth_features)
    bad = mismatches(our_terms(outputs, batch, {"distogram_loss_config": {"weight": 0.31}}), golden()["cases"]["near"])
    assert sorted(b.split(":")[0] for b in bad) == ["scaled_weighted_total_loss", "weighted_total_loss"], bad


@pytest.mark.skipif(not (os.environ.get(REF_ENV) and os.environ.get(WRITE_ENV) == "1"),
                    reason=f"rewrites the golden file only with {REF_ENV} and {WRITE_ENV}=1")
def test_write_golden():
    """The reference's loss terms, ground-truth features and lDDT-Ca on this file's inputs, fp64."""
    aa = aatype()[0]
    pos, mask = truth(aa, TRUTH_SEEDS[0])
    doc = {
        "what": "the MLPerf reference's OpenFold loss terms (mlcommons/hpc@2c627d4 openfold/, openfold.loss."
                "AlphaFoldLoss with config.LossConfig() and its backbone_loss, sidechain_loss, renaming), its "
                "ground-truth transforms (openfold.data.transforms) and lDDT-Ca (openfold.validation_metrics), "
                "written by tests/test_openfold_loss.py::test_write_golden",
        "inputs": "tests/test_openfold_loss.py's docstring and case(): truth(), near_outputs(), loss_batch(); "
                  "case 'model' is test_openfold_model.our_outputs(torch.float64) (the mini model, seeded "
                  "weights, example_batch); float64",
        "seeds": {"truth": list(TRUTH_SEEDS), "noise": NOISE_SEED, "logits": LOGIT_SEED, "msa": MSA_SEED,
                  "model_weights": WEIGHT_SEED, "model_inputs": INPUT_SEED},
        "torch": torch.__version__,
        "cases": {name: reference_terms(*case(name, reference_gt_features)) for name in CASES},
        "features": feature_summary(reference_gt_features(aa[None], pos[None], mask[None])),
        "lddt_ca": {"noise_A": list(LDDT_NOISE), **reference_lddt()},
    }
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(_dump(doc) + "\n")
    assert json.loads(GOLDEN.read_text()) == doc


def _dump(obj, path=()) -> str:
    """JSON with one line per term, feature or metric: objects spread over lines down to the
    cases, everything below them on one line."""
    if not isinstance(obj, dict) or not (len(path) < 2 or (path[0] == "cases" and len(path) == 2)):
        return json.dumps(obj)
    pad = " " * (len(path) + 1)
    items = [f"{pad}{json.dumps(k)}: {_dump(v, path + (k,))}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * len(path) + "}"


# ----------------------------------------------------------------------------- sanity

def test_truth_features_recover_the_built_structure():
    """The chi angles and backbone frames read back from the atoms are the ones the truth was
    built from; the renaming permutation swaps exactly the named pairs."""
    aa = aatype()[0]
    q, t, a = truth_parameters(aa.shape[-1], TRUTH_SEEDS[0])
    built = build_structure(aa, q, t, a)
    mask = torch.as_tensor(M.TABLES["atom37_mask"], dtype=torch.float64)[aa]
    f = L.ground_truth_features(aa, built["final_atom_positions"], mask)
    chi = torch.stack([torch.sin(a[:, 3:]), torch.cos(a[:, 3:])], dim=-1)
    m = f["chi_mask"].bool()
    assert m.sum() == L.R["chi_mask"][aa.numpy()].sum() == 31    # the chis of GMFWKSTCREQWYAIT
    assert torch.allclose(f["chi_angles_sin_cos"][m], chi[m], atol=1e-5)
    # psi: the transforms' sign reversal (transforms.py:1052-1057) matches the structure module's
    # psi frame, so the angle read back is the one built with
    psi = torch.stack([torch.sin(a[:, 2]), torch.cos(a[:, 2])], dim=-1)
    assert torch.allclose(f["torsion_angles_sin_cos"][:, 2], psi, atol=1e-5)
    assert torch.allclose(f["backbone_rigid_tensor"][:, :3, :3].double(), built["sm_sidechain_frames"][:, 0, :3, :3]
                          .double(), atol=1e-5)
    assert torch.allclose(f["backbone_rigid_tensor"][:, :3, 3].double(), t, atol=1e-5)
    phe = aa.tolist().index(M.RESTYPES.index("F"))
    names = L.R["atom14_to_atom37"][M.RESTYPES.index("F")]
    perm = L.R["rename_perm"][M.RESTYPES.index("F")]
    assert [M.ATOM37[names[i]] for i in perm[5:11]] == ["CG", "CD2", "CD1", "CE2", "CE1", "CZ"]
    assert torch.equal(f["atom14_alt_gt_positions"][phe, 6], f["atom14_gt_positions"][phe, 7])
    assert torch.equal(f["atom14_alt_gt_positions"][phe, :6], f["atom14_gt_positions"][phe, :6])


def test_true_structure_scores_better_than_perturbed():
    """The truth as prediction: FAPE and chi near 0, lDDT 1; each perturbation raises them."""
    aa = aatype()[0]
    batch = loss_batch(aa, (TRUTH_SEEDS[0],), (1.0,), (2.0,), (15,), L.ground_truth_features)
    loss = L.AlphaFoldLoss()
    results = []
    for sigma in (0.0, 0.2, 1.0):
        q, t, a = truth_parameters(aa.shape[-1], TRUTH_SEEDS[0])
        rng = np.random.default_rng(NOISE_SEED)
        s = build_structure(aa, q + torch.from_numpy(rng.normal(0, sigma, q.shape)),
                            t + torch.from_numpy(rng.normal(0, 3 * sigma, t.shape)),
                            a + torch.from_numpy(rng.normal(0, sigma, a.shape)))
        out = {k: v[None, None] for k, v in s.items() if k != "final_atom_positions"}
        out["final_atom_positions"] = s["final_atom_positions"][None]
        out.update({"distogram_logits": torch.zeros(1, 16, 16, 64), "masked_msa_logits": torch.zeros(1, 8, 16, 23),
                    "lddt_logits": torch.zeros(1, 16, 50), "experimentally_resolved_logits": torch.zeros(1, 16, 37)})
        _, terms = loss(out, batch)
        lddt = float(L.validation_lddt_ca(out["final_atom_positions"], batch["all_atom_positions"],
                                          batch["all_atom_mask"]))
        results.append((float(terms["fape"]), float(terms["supervised_chi"]), float(terms["weighted_total_loss"]),
                        lddt))
    (f0, c0, w0, l0), (f1, c1, w1, l1), (f2, c2, w2, l2) = results
    assert f0 < 2e-3 and c0 < 1e-6 and l0 == pytest.approx(1.0, abs=1e-12), results[0]
    assert f0 < f1 < f2 and c0 < c1 < c2 and w0 < w1 < w2 and l0 > l1 > l2, results


def test_lddt_ca_of_identical_is_one_and_drops_with_noise():
    preds, pos, mask = noisy_lddt_inputs()
    values = L.validation_lddt_ca(preds, pos, mask).tolist()
    assert values[0] == pytest.approx(1.0, abs=1e-12)
    assert all(a > b for a, b in zip(values, values[1:])), values
    assert values[-1] < 0.3
    assert L.average_lddt_ca(values) == pytest.approx(sum(values) / len(values))
    # a residue without CA counts in no pair: moving it changes nothing
    moved = preds.clone()
    moved[:, 4, M.CA] += 50.0
    mask2 = mask.clone()
    mask2[:, 4, M.CA] = 0.0
    assert torch.allclose(L.validation_lddt_ca(moved, pos, mask2), L.validation_lddt_ca(preds, pos, mask2))


def test_renaming_takes_the_alternative_naming_where_it_fits():
    """Case near, sample 0: PHE 2's chi2 turned by pi in the prediction, so its ring atoms match the
    swapped names: alt_naming_is_better is 1 there and 0 for every other residue."""
    outputs, batch = case("near", L.ground_truth_features)
    ours = our_terms(outputs, batch)
    better = np.asarray(ours["alt_naming_is_better"])
    assert better[0, 2] == 1.0 and better[0].sum() == 1.0, better


def test_clamping_and_resolution_range():
    """Case model: the same prediction and truth in both samples; the backbone FAPE clamped at 10 A
    (use_clamped_fape 1) is below the unclamped one; the resolution outside [0.1, 3] A zeroes the
    pLDDT and resolved terms."""
    outputs, batch = case("model", L.ground_truth_features)
    ours = our_terms(outputs, batch)
    assert ours["backbone"][0] < ours["backbone"][1] - 0.05, ours["backbone"]
    plddt = L.lddt_loss(outputs["lddt_logits"], outputs["final_atom_positions"], batch["all_atom_positions"],
                        batch["all_atom_mask"], batch["resolution"])
    resolved = L.experimentally_resolved_loss(outputs["experimentally_resolved_logits"], batch["atom37_atom_exists"],
                                              batch["all_atom_mask"], batch["resolution"], 0.1, 3.0)
    assert plddt[0] > 0 and plddt[1] == 0 and resolved[0] > 0 and resolved[1] == 0


def test_tm_term_when_enabled():
    """With the TM head's term enabled (the ptm presets; off in MLPerf) it is reported and adds
    weight x tm to the total."""
    outputs, batch = case("near", L.ground_truth_features)
    base = our_terms(outputs, batch)
    _, terms = L.AlphaFoldLoss({"tm_loss_config": {"enabled": True, "weight": 0.1}})(
        {**outputs, "tm_logits": tm_logits(batch)}, batch)
    assert float(terms["tm"]) == pytest.approx(np.mean(base["tm"]), rel=1e-12)
    assert float(terms["weighted_total_loss"]) == pytest.approx(base["weighted_total_loss"] + 0.1 * np.mean(base["tm"]),
                                                                rel=1e-12)


def test_loss_backpropagates_into_the_mini_model():
    torch.manual_seed(0)
    model = M.build_model(mini())
    seeded_weights(model, WEIGHT_SEED)
    model.train()
    feats = M.example_batch(**INPUTS, seed=INPUT_SEED)
    outputs = model(feats)
    aa = feats["aatype"][0, :, -1]
    batch = loss_batch(aa, (TRUTH_SEEDS[0],), (0.0,), (2.0,), (15,), L.ground_truth_features)
    batch = {k: v.float() if v.is_floating_point() else v for k, v in batch.items()}
    loss, terms = L.AlphaFoldLoss()(outputs, batch)
    assert loss.ndim == 0 and torch.isfinite(loss) and all(torch.isfinite(v) for v in terms.values()), terms
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    bad = [n for n, g in grads.items() if g is None or not torch.isfinite(g).all()]
    assert not bad, bad[:5]
    for name in ("structure_module.bb_update.linear.weight", "structure_module.angle_resnet.linear_out.weight",
                 "auxiliary_heads.distogram.linear.weight", "auxiliary_heads.masked_msa.linear.weight",
                 "auxiliary_heads.plddt.linear_3.weight", "evoformer_stack.blocks.0.msa_att_row.mha.linear_q.weight"):
        assert grads[name].abs().sum() > 0, name
    # weight 0.0 in the MLPerf preset: no gradient into the experimentally-resolved head
    assert grads["auxiliary_heads.experimentally_resolved.linear.weight"].abs().sum() == 0


def test_loss_config():
    cfg = L.loss_config()
    weights = {k: v["weight"] for k, v in cfg.items()}
    assert weights == {"fape_loss_config": 1.0, "supervised_chi_loss_config": 1.0, "distogram_loss_config": 0.3,
                       "masked_msa_loss_config": 2.0, "plddt_loss_config": 0.01,
                       "experimentally_resolved_loss_config": 0.0, "violation_loss_config": 0.0,
                       "tm_loss_config": 0.0}
    assert L.loss_config({"tm_loss_config": {"enabled": True, "weight": 0.1}})["tm_loss_config"]["weight"] == 0.1
    with pytest.raises(KitError, match="violation_loss_config.weight: the structural-violation loss is not"):
        L.loss_config({"violation_loss_config": {"weight": 1.0}})
    with pytest.raises(KitError, match="fape_loss_config.wieght: unknown key"):
        L.loss_config({"fape_loss_config": {"wieght": 1.0}})
    with pytest.raises(KitError, match="unknown section 'fape'"):
        L.loss_config({"fape": {"weight": 1.0}})
    assert L.use_clamped_fape(0) in (0.0, 1.0)
    assert sum(L.use_clamped_fape(s) for s in range(1000)) == pytest.approx(900, abs=40)
