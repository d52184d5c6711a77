"""OpenFold's input pipeline after the raw features: one sample's raw feature dict
(hpckit.openfold.features.raw_features) to the model's feature dict with the loss's ground
truth, as the MLPerf reference's process_features and transforms make it, and the batches the
training loop feeds.

Followed: mlcommons/hpc@2c627d4 openfold/openfold/data/features.py:161-409 (process_features:
which raw features, the order of the transforms, their seeds, the recycling dimension),
data/transforms.py (each transform), config.py:338-414, 464-469, 552-602 (the data settings and
the feature schema), datasets.py:67-139 (what a sample is made of), dataloaders.py:213-262 and
torch_utils.py:48-59 (collation and the number of recycling iterations of a batch) and
train.py:700-765 (their seeds, and that the loss reads the last iteration). Citations are
`file:line` in hpc@2c627d4 openfold/openfold/ (train.py one level up).

process_features(raw, cfg, mode, seed), mode "train" or "eval":

* on the whole chain, once (features.py:264-312): ints to int64; the MSA's hhblits codes to the
  residue order; aatype from its one-hot; seq_length and num_alignments to scalars, a trailing
  dimension of 1 squeezed (resolution); MSA residues replaced by X with probability 0 (a
  no-op, kept as the reference configures it); seq_mask, msa_mask, msa_row_mask; the MSA
  profile; the templates' aatype in the residue order, template_mask, their pseudo-beta and
  torsion angles; the atom14 tables; the ground truth (atom14 positions, rigid-group frames,
  torsion and chi angles, pseudo-beta, backbone frames), made by hpckit.openfold.loss;
* then once per recycling iteration i = 0..num_recycling_iters, each from the same
  whole-chain features (features.py:246-259, 315-402), seeded with seed + i: (train) a
  distillation sample's MSA cut to max_distillation_msa_clusters; the MSA sampled into
  max_msa_clusters cluster centres (the query first, the rest shuffled) and the extra MSA;
  BERT masking of the cluster centres (15 %: 10 % a uniform residue, 10 % from the profile,
  10 % unchanged, 70 % the mask token; true_msa, bert_mask); each extra sequence assigned to
  its nearest centre by Hamming agreement and the clusters' profiles and mean deletions; the
  extra MSA cut to max_extra_msa (shuffled); msa_feat (49), target_feat (22), the extra MSA's
  deletion features; only the schema's features kept; the crop, seeded with `seed` itself so
  that every iteration is cut alike: a contiguous window of crop_size residues at a uniform
  start (train; eval keeps the whole chain), the templates (train) shuffled and a uniform
  number dropped from the front, at most max_templates kept; seq_length set to the residues
  kept; every feature zero-padded to the schema's sizes (crop_size or the chain's length,
  max_msa_clusters, max_extra_msa, max_templates);
* the iterations stacked as the last dimension of every feature; (train) use_clamped_fape,
  1.0 with probability 0.9 drawn from the seed (features.py:194-204).

make_example(sample, source, cfg, mode, seed) is datasets.py:67-139 (raw features then
process_features) for the training loop; collate stacks samples into a batch
(torch_utils.py:48-59); RecyclingSchedule cuts a training batch's recycling dimension to a
number of iterations drawn per optimizer step (dataloaders.py:213-262); last_iteration gives
the loss its batch (train.py:762-765). Validation batches (one sample each) keep every
iteration (ValidationDataloader has no such schedule, dataloaders.py:192-210; train.py:355-362).

Equality: on the same raw features and seeds every output is the reference's, dtype, shape and
value, bit for bit (tests/test_openfold_pipeline.py, on synthetic samples in both modes, with
and without templates, chains shorter and longer than the crop, a seed wrapping past 2**64, a
distillation sample). The random draws are the reference's: its torch.Generator calls, seeded
as it seeds them, in its order.

Differences (one line each):
  * mode "predict" (inference without the ground truth) is not offered; training and
    validation use "train" and "eval" only;
  * the reference takes a random seed when given None (features.py:184-185); here a seed is
    required;
  * the MSA profile is counted per residue instead of averaging a one-hot of the whole MSA
    (the same float32 values, without the [num_seq, num_res, 22] tensor);
  * the reference's "id" tuple (datasets.py:137) is the caller's to add (collate keeps any
    non-tensor value as a list, as the reference's does);
  * one-hot features are float32; the reference's are torch's default dtype (float32 unless a
    caller changes it);
  * the reference asserts that the BERT categorical probabilities are a simplex
    (transforms.py:420-421); they are by construction, and it is not checked here.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from hpckit.common.errors import KitError
from hpckit.openfold import features as FT
from hpckit.openfold import loss as L
from hpckit.openfold import records

TORCH_SEED_MODULUS = 2 ** 64          # torch_utils.py:22

# config.py:338-389: the data settings of AlphaFoldConfig (the initial_training preset's
# crop and MSA sizes, config.py:464-469); a config's `data:` section may set any of them.
DATA_CONFIG = {
    "crop_size": 256,                       # train_sequence_crop_size, :357, :466
    "max_msa_clusters": 124,                # :376, :467
    "max_extra_msa": 1024,                  # :377, :468
    "max_templates": 4,                     # :388
    "num_recycling_iters": 3,               # :360
    "max_distillation_msa_clusters": 1000,  # :378
    "masked_msa_enabled": True,             # :379
    "masked_msa_profile_prob": 0.1,         # :380
    "masked_msa_same_prob": 0.1,            # :381
    "masked_msa_uniform_prob": 0.1,         # :382
    "masked_msa_replace_fraction": 0.15,    # :383
    "msa_cluster_features": True,           # :384
    "shuffle_top_k_prefiltered": 20,        # :389
    "use_clamped_fape_probability": 0.9,    # :338
}
# Each integer data setting's range (docs/security.md "Bounds"): what the reference's data and
# model can use, generously, and finite (a crop of 10^9 residues or 10^12 recycling iterations
# hung or allocated gigabytes before a sample was read). The reference's initial training uses
# crop 256, 124 MSA clusters, 1,024 extra sequences, 4 templates and 3 recycling iterations
# (AlphaFold's fine-tuning 384, 512 and 5,120); each bound is 8 to 16 times the larger, and
# every feature the pipeline makes stays below a few GiB at the bounds together.
DATA_BOUNDS = {
    "crop_size": (1, 4096),                       # residues; 16 x the reference's 256
    "max_msa_clusters": (1, 4096),                # 33 x 124, 8 x fine-tuning's 512
    "max_distillation_msa_clusters": (1, 4096),   # 4 x its 1,000
    "max_extra_msa": (0, 16384),                  # 16 x 1,024, 3 x fine-tuning's 5,120
    "max_templates": (0, 64),                     # 16 x 4 (hhsearch's hits: some hundred; the model takes 4)
    "num_recycling_iters": (0, 32),               # 3 in training; AlphaFold's inference up to 20
    "shuffle_top_k_prefiltered": (0, 4096),       # 20 (or null: no shuffling)
}
# The kit's own keys of a config's `data:` section, read by the training loop and datagen, not by
# the pipeline (data_config passes over them): the split sizes, the local batch, the loader's
# workers, the synthetic data's shape.
KIT_DATA_KEYS = ("n_train", "n_valid", "batch_size", "loader_workers", "synthetic")
MSA_UNKNOWN_REPLACE_PROPORTION = 0.0  # features.py:274
GAP_AGREEMENT_WEIGHT = 0.0            # transforms.py:279
NUM_RESTYPES_WITH_X = 21              # the 20 residue types and X
GAP, MASK_TOKEN = 21, 22              # MSA codes after the residue types and X

# hhblits' residue codes (records.HHBLITS_AA_TO_ID) are its alphabet's order; the model's are
# features.RESTYPES + X + gap (residue_constants.py:752-782).
HHBLITS_ALPHABET = "ACDEFGHIKLMNPQRSTVWYX-"
MAP_HHBLITS_TO_RESTYPE = tuple((FT.RESTYPES + "X-").index(a) for a in HHBLITS_ALPHABET)
assert all(records.HHBLITS_AA_TO_ID[a] == i for i, a in enumerate(HHBLITS_ALPHABET))

MSA_FEATURES = ("msa", "deletion_matrix", "msa_mask", "msa_row_mask", "bert_mask", "true_msa")  # transforms.py:30-37

# config.py:363-414: the raw features process_features takes (features.py:209-218).
PRIMARY_RAW = ("aatype", "residue_index", "msa", "num_alignments", "seq_length", "between_segment_residues",
               "deletion_matrix")
TEMPLATE_RAW = ("template_all_atom_positions", "template_sum_probs", "template_aatype", "template_all_atom_mask")
SUPERVISED_RAW = ("all_atom_mask", "all_atom_positions", "resolution", "is_distillation")

# config.py:552-602: each feature the model and the loss are fed, its dimensions by name
# (N_res residues, N_clust cluster centres, N_extra_seq extra sequences, N_templ templates)
# or size; everything else is dropped before the crop.
R, C, E, T = "N_res", "N_clust", "N_extra_seq", "N_templ"
FEATURE_SCHEMA = {
    "aatype": (R,), "residue_index": (R,), "seq_mask": (R,), "seq_length": (), "resolution": (),
    "is_distillation": (), "target_feat": (R, 22),
    "msa_feat": (C, R, 49), "msa_mask": (C, R), "msa_row_mask": (C,), "true_msa": (C, R), "bert_mask": (C, R),
    "extra_msa": (E, R), "extra_msa_mask": (E, R), "extra_msa_row_mask": (E,), "extra_has_deletion": (E, R),
    "extra_deletion_value": (E, R),
    "template_aatype": (T, R), "template_all_atom_positions": (T, R, 37, 3), "template_all_atom_mask": (T, R, 37),
    "template_mask": (T,), "template_sum_probs": (T, 1), "template_pseudo_beta": (T, R, 3),
    "template_pseudo_beta_mask": (T, R), "template_torsion_angles_sin_cos": (T, R, 7, 2),
    "template_alt_torsion_angles_sin_cos": (T, R, 7, 2), "template_torsion_angles_mask": (T, R, 7),
    "all_atom_positions": (R, 37, 3), "all_atom_mask": (R, 37), "atom37_atom_exists": (R, 37),
    "atom14_atom_exists": (R, 14), "residx_atom14_to_atom37": (R, 14), "residx_atom37_to_atom14": (R, 37),
    "atom14_gt_exists": (R, 14), "atom14_gt_positions": (R, 14, 3), "atom14_alt_gt_exists": (R, 14),
    "atom14_alt_gt_positions": (R, 14, 3), "atom14_atom_is_ambiguous": (R, 14),
    "rigidgroups_gt_frames": (R, 8, 4, 4), "rigidgroups_alt_gt_frames": (R, 8, 4, 4),
    "rigidgroups_gt_exists": (R, 8), "rigidgroups_group_exists": (R, 8), "rigidgroups_group_is_ambiguous": (R, 8),
    "backbone_rigid_tensor": (R, 4, 4), "backbone_rigid_mask": (R,), "pseudo_beta": (R, 3), "pseudo_beta_mask": (R,),
    "chi_angles_sin_cos": (R, 4, 2), "chi_mask": (R, 4),
}
MODES = ("train", "eval")


# ------------------------------------------------------------------ configuration

@dataclasses.dataclass(frozen=True)
class DataConfig:
    """DATA_CONFIG's settings with the model's template switches (config.py:387, 390)."""
    crop_size: int
    max_msa_clusters: int
    max_extra_msa: int
    max_templates: int
    num_recycling_iters: int
    max_distillation_msa_clusters: int
    masked_msa_enabled: bool
    masked_msa_profile_prob: float
    masked_msa_same_prob: float
    masked_msa_uniform_prob: float
    masked_msa_replace_fraction: float
    msa_cluster_features: bool
    shuffle_top_k_prefiltered: int | None
    use_clamped_fape_probability: float
    templates_enabled: bool = True
    embed_template_torsion_angles: bool = True


def data_config(cfg: dict | DataConfig) -> DataConfig:
    """The pipeline's settings from a kit config (its `data:` section over DATA_CONFIG, the
    template switches from `model:`); an unknown key or a bad value is one KitError naming it."""
    if isinstance(cfg, DataConfig):
        return cfg
    values = dict(DATA_CONFIG)
    for key, value in (cfg.get("data") or {}).items():
        if key in KIT_DATA_KEYS:
            continue
        if key not in DATA_CONFIG:
            raise KitError(f"config key 'data.{key}': unknown key (known: {', '.join(DATA_CONFIG)})")
        values[key] = value
    for key, (low, high) in DATA_BOUNDS.items():
        v = values[key]
        if key == "shuffle_top_k_prefiltered" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise KitError(f"config key 'data.{key}': must be an integer in {low}..{high} (got {v!r:.40})")
    for key in ("masked_msa_enabled", "msa_cluster_features"):
        if not isinstance(values[key], bool):
            raise KitError(f"config key 'data.{key}': must be true or false (got {values[key]!r:.40})")
    probs = [values[k] for k in ("masked_msa_profile_prob", "masked_msa_same_prob", "masked_msa_uniform_prob")]
    for key in ("masked_msa_profile_prob", "masked_msa_same_prob", "masked_msa_uniform_prob",
                "masked_msa_replace_fraction", "use_clamped_fape_probability"):
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise KitError(f"config key 'data.{key}': must be a probability in [0, 1] (got {v!r})")
    if 1.0 - probs[0] - probs[1] - probs[2] < 0:   # transforms.py:468-469 asserts it
        raise KitError("config key 'data.masked_msa_*_prob': profile + same + uniform must not exceed 1")
    model = cfg.get("model") or {}
    return DataConfig(**values, templates_enabled=bool(model.get("templates_enabled", True)),
                      embed_template_torsion_angles=bool(model.get("embed_template_torsion_angles", True)))


# ------------------------------------------------------------------ helpers

def _generator(seed: int) -> torch.Generator:
    """A CPU generator seeded as the reference seeds each transform's (seed % 2**64)."""
    g = torch.Generator()
    g.manual_seed(seed % TORCH_SEED_MODULUS)
    return g


def one_hot(x: torch.Tensor, num_classes: int) -> torch.Tensor:
    """float32 one-hot (make_one_hot, transforms.py:49-52)."""
    return F.one_hot(x.long(), num_classes).to(torch.float32)


def _segment_sum(data: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """unsorted_segment_sum (transforms.py:317-335): rows of data summed by segment, float32."""
    out = torch.zeros(num_segments, *data.shape[1:], dtype=torch.float32)
    return out.index_add_(0, segment_ids, data.float()).to(data.dtype)


# ------------------------------------------------------------------ whole-chain transforms

def select_raw_features(raw: dict, dc: DataConfig) -> dict:
    """features.py:169-182, 209-218: deletion_matrix_int as float32 deletion_matrix, and the raw
    features the config uses, as tensors (the caller's dict is not changed)."""
    raw = dict(raw)
    if "deletion_matrix_int" in raw:
        raw["deletion_matrix"] = raw.pop("deletion_matrix_int").astype(np.float32)
    names = PRIMARY_RAW + (TEMPLATE_RAW if dc.templates_enabled else ()) + SUPERVISED_RAW
    missing = [n for n in names if n not in raw]
    if missing:
        raise KitError(f"raw features: missing {', '.join(missing)}")
    return {n: torch.tensor(np.asarray(raw[n])) for n in names}


def cast_to_64bit_ints(p: dict) -> dict:
    """transforms.py:40-46."""
    return {k: v.long() if v.dtype == torch.int32 else v for k, v in p.items()}


def correct_msa_restypes(p: dict) -> dict:
    """transforms.py:101-123: the MSA's hhblits codes in the residue order."""
    return {**p, "msa": torch.tensor(MAP_HHBLITS_TO_RESTYPE, dtype=torch.int64)[p["msa"]]}


def squeeze_features(p: dict) -> dict:
    """transforms.py:126-154: aatype from its one-hot; a trailing dimension of 1 dropped; the
    per-residue seq_length and num_alignments as scalars."""
    p = {**p, "aatype": torch.argmax(p["aatype"], dim=-1)}
    for k in ("domain_name", "msa", "num_alignments", "seq_length", "sequence", "superfamily", "deletion_matrix",
              "resolution", "between_segment_residues", "residue_index", "template_all_atom_mask"):
        if k in p and p[k].shape[-1] == 1:
            p[k] = p[k].squeeze(-1)
    for k in ("seq_length", "num_alignments"):
        if k in p:
            p[k] = p[k][0]
    return p


def replace_msa_with_unknown(p: dict, proportion: float, seed: int) -> dict:
    """randomly_replace_msa_with_unknown (transforms.py:157-179): MSA residues (not gaps) and
    query residues replaced by X with `proportion` (0 in the reference: nothing changes)."""
    if proportion == 0:
        return p
    g = _generator(seed)
    x = NUM_RESTYPES_WITH_X - 1
    hit = (torch.rand(p["msa"].shape, generator=g) < proportion) & (p["msa"] != GAP)
    msa = torch.where(hit, torch.full_like(p["msa"], x), p["msa"])
    hit = torch.rand(p["aatype"].shape, generator=g) < proportion
    return {**p, "msa": msa, "aatype": torch.where(hit, torch.full_like(p["aatype"], x), p["aatype"])}


def make_masks(p: dict) -> dict:
    """make_seq_mask and make_msa_mask (transforms.py:55-57, 362-366): all ones, float32."""
    return {**p, "seq_mask": torch.ones(p["aatype"].shape, dtype=torch.float32),
            "msa_mask": torch.ones(p["msa"].shape, dtype=torch.float32),
            "msa_row_mask": torch.ones(p["msa"].shape[0], dtype=torch.float32)}


def make_hhblits_profile(p: dict) -> dict:
    """transforms.py:429-438: each residue's frequency of the 22 MSA codes over all sequences
    (counted, then divided by the number of sequences: the mean of the one-hot)."""
    if "hhblits_profile" in p:
        return p
    msa = p["msa"]
    n_seq, n_res = msa.shape
    counts = torch.zeros(n_res * 22, dtype=torch.float32)
    counts.index_add_(0, (torch.arange(n_res) * 22 + msa).reshape(-1),
                      torch.ones(msa.numel(), dtype=torch.float32))
    return {**p, "hhblits_profile": counts.reshape(n_res, 22) / n_seq}


def template_features(p: dict, embed_torsion_angles: bool) -> dict:
    """fix_templates_aatype, make_template_mask, make_pseudo_beta("template_") and
    atom37_to_torsion_angles("template_") (transforms.py:60-64, 82-98, 395-407, 917-1079): the
    templates' one-hot hhblits residues as residue-order indices, a mask of ones, their
    pseudo-beta and torsion angles (loss.make_pseudo_beta, loss.atom37_to_torsion_angles)."""
    p = dict(p)
    aatype = p["template_aatype"]
    if aatype.shape[0] > 0:
        aatype = torch.tensor(MAP_HHBLITS_TO_RESTYPE, dtype=torch.int64)[torch.argmax(aatype, dim=-1)]
    p["template_aatype"] = aatype
    p["template_mask"] = torch.ones(aatype.shape[0], dtype=torch.float32)
    pos, mask = p["template_all_atom_positions"], p["template_all_atom_mask"]
    n = aatype.shape[0]
    if n == 0:     # loss's gathers cannot reshape an empty batch: one zero template, then none of it
        aatype, pos, mask = (torch.zeros(1, *x.shape[1:], dtype=x.dtype) for x in (aatype, pos, mask))
    made = L.make_pseudo_beta(aatype, pos, mask)
    if embed_torsion_angles:
        made.update(L.atom37_to_torsion_angles(aatype, pos, mask))
    p.update({"template_" + k: v[:n] for k, v in made.items()})
    return p


def ground_truth(p: dict) -> dict:
    """make_atom14_positions, atom37_to_frames, atom37_to_torsion_angles(""), make_pseudo_beta(""),
    get_backbone_frames, get_chi_angles on the whole chain (features.py:300-310), made by
    loss.ground_truth_features (make_atom14_masks, features.py:294-298, among them)."""
    return {**p, **L.ground_truth_features(p["aatype"], p["all_atom_positions"], p["all_atom_mask"])}


def whole_chain_transforms(p: dict, dc: DataConfig, seed: int) -> dict:
    """_nonensembled_transform_fns (features.py:264-312), in its order, train and eval alike."""
    p = cast_to_64bit_ints(p)
    p = correct_msa_restypes(p)
    p = squeeze_features(p)
    p = replace_msa_with_unknown(p, MSA_UNKNOWN_REPLACE_PROPORTION, seed)
    p = make_masks(p)
    p = make_hhblits_profile(p)
    if dc.templates_enabled:
        p = template_features(p, dc.embed_template_torsion_angles)
    return ground_truth(p)


# ------------------------------------------------------------------ per-iteration transforms

def sample_msa(p: dict, max_seq: int, keep_extra: bool, seed: int) -> dict:
    """transforms.py:182-203: the query and max_seq - 1 other sequences in a random order stay,
    the others become extra_* (keep_extra) or are dropped."""
    num_seq = p["msa"].shape[0]
    g = _generator(seed)
    order = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(num_seq - 1, generator=g) + 1])
    n = min(max_seq, num_seq)
    kept, rest = order[:n], order[n:]
    p = dict(p)
    for k in MSA_FEATURES:
        if k in p:
            if keep_extra:
                p["extra_" + k] = p[k][rest]
            p[k] = p[k][kept]
    return p


def sample_msa_distillation(p: dict, max_seq: int, seed: int) -> dict:
    """transforms.py:212-216: a distillation sample's MSA cut (none in the PDB set)."""
    return sample_msa(p, max_seq, False, seed) if p["is_distillation"] == 1 else p


def make_masked_msa(p: dict, profile_prob: float, same_prob: float, uniform_prob: float, replace_fraction: float,
                    seed: int) -> dict:
    """BERT masking (transforms.py:416-426, 441-484): each MSA position picked with
    replace_fraction is replaced by a draw from uniform_prob x uniform over the 20 residues +
    profile_prob x the profile + same_prob x itself + the rest x the mask token; bert_mask
    marks them, true_msa keeps the MSA."""
    g = _generator(seed)
    uniform = torch.tensor([0.05] * 20 + [0.0, 0.0], dtype=torch.float32)
    msa = p["msa"]
    probs = uniform_prob * uniform + profile_prob * p["hhblits_profile"] + same_prob * one_hot(msa, 22)
    mask_prob = 1.0 - profile_prob - same_prob - uniform_prob
    probs = F.pad(probs, (0, 1), value=mask_prob)
    picked = torch.rand(msa.shape, generator=g) < replace_fraction
    flat = torch.reshape(probs + 1e-10, (-1, probs.shape[-1]))
    drawn = torch.multinomial(flat, num_samples=1, replacement=True, generator=g).squeeze(-1).reshape(msa.shape)
    return {**p, "bert_mask": picked.to(torch.float32), "true_msa": msa, "msa": torch.where(picked, drawn, msa)}


def nearest_neighbor_clusters(p: dict, gap_agreement_weight: float = GAP_AGREEMENT_WEIGHT) -> dict:
    """transforms.py:278-314: each extra sequence's cluster centre, the one it agrees with at
    most residues (the 21 residue codes weigh 1, gap gap_agreement_weight, the mask token 0);
    the first such centre on a tie."""
    weights = torch.tensor([1.0] * 21 + [gap_agreement_weight, 0.0], dtype=torch.float32)
    centres = (p["msa_mask"][:, :, None] * one_hot(p["msa"], 23) * weights).flatten(1)
    extra = (p["extra_msa_mask"][:, :, None] * one_hot(p["extra_msa"], 23)).flatten(1)
    return {**p, "extra_cluster_assignment": torch.argmax(extra @ centres.T, dim=1).to(torch.int64)}


def summarize_clusters(p: dict) -> dict:
    """transforms.py:338-359: per cluster centre, the residue profile (23 codes) and the mean
    deletion over the centre and its extra sequences."""
    num_seq = p["msa"].shape[0]
    ids = p["extra_cluster_assignment"]
    mask = p["extra_msa_mask"]
    counts = 1e-6 + p["msa_mask"] + _segment_sum(mask, ids, num_seq)
    profile = _segment_sum(mask[:, :, None] * one_hot(p["extra_msa"], 23), ids, num_seq) + one_hot(p["msa"], 23)
    deletions = _segment_sum(mask * p["extra_deletion_matrix"], ids, num_seq) + p["deletion_matrix"]
    return {**p, "cluster_profile": profile / counts[:, :, None], "cluster_deletion_mean": deletions / counts}


def crop_extra_msa(p: dict, max_extra_msa: int, seed: int) -> dict:
    """transforms.py:219-233: at most max_extra_msa extra sequences, in a random order."""
    num_seq = p["extra_msa"].shape[0]
    keep = torch.randperm(num_seq, generator=_generator(seed))[:min(max_extra_msa, num_seq)]
    return {k: v[keep] if k.startswith("extra_") and k[6:] in MSA_FEATURES else v for k, v in p.items()}


def delete_extra_msa(p: dict) -> dict:
    """transforms.py:236-240."""
    return {k: v for k, v in p.items() if not (k.startswith("extra_") and k[6:] in MSA_FEATURES)}


def _deletion_value(d: torch.Tensor) -> torch.Tensor:
    return torch.atan(d / 3.0) * (2.0 / np.pi)


def make_msa_feat(p: dict) -> dict:
    """transforms.py:532-576: target_feat = [domain break, aatype one-hot (21)]; msa_feat =
    [MSA one-hot (23), has deletion, deletion value, cluster profile (23), mean deletion
    value]; the extra MSA's has-deletion and deletion value."""
    p = dict(p)
    has_break = torch.clip(p["between_segment_residues"].to(torch.float32), 0, 1)
    msa_feat = [one_hot(p["msa"], 23), torch.clip(p["deletion_matrix"], 0.0, 1.0)[..., None],
                _deletion_value(p["deletion_matrix"])[..., None]]
    if "cluster_profile" in p:
        msa_feat += [p["cluster_profile"], _deletion_value(p["cluster_deletion_mean"])[..., None]]
    if "extra_deletion_matrix" in p:
        p["extra_has_deletion"] = torch.clip(p["extra_deletion_matrix"], 0.0, 1.0)
        p["extra_deletion_value"] = _deletion_value(p["extra_deletion_matrix"])
    p["msa_feat"] = torch.cat(msa_feat, dim=-1)
    p["target_feat"] = torch.cat([has_break[..., None], one_hot(p["aatype"], 21)], dim=-1)
    return p


def crop_and_subsample_templates(p: dict, crop_size: int, max_templates: int, subsample_templates: bool,
                                 seed: int) -> dict:
    """random_crop_and_template_subsampling (transforms.py:1099-1180): one generator seeded with
    the sample's seed (every iteration cut alike); with subsample_templates (train) and any
    template, a start in 0..num_templates and a permutation of the templates drawn; then the
    residue window's start in 0..seq_length - crop; the templates permuted, those from the
    start kept (at most max_templates), the residues of the window kept; seq_length = the
    residues kept."""
    g = _generator(seed)
    seq_length = int(p["seq_length"])
    n_res = min(seq_length, crop_size)
    n_templates = p["template_mask"].shape[-1] if "template_mask" in p else 0
    subsample = subsample_templates and n_templates > 0

    def randint(low: int, high: int) -> int:     # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=g)[0])

    t_start, perm = 0, None
    if subsample:
        t_start = randint(0, n_templates)
        perm = torch.randperm(n_templates, generator=g)
    n_templ = min(n_templates - t_start, max_templates)
    r_start = randint(0, seq_length - n_res)
    out = {}
    for key, x in p.items():
        schema = FEATURE_SCHEMA[key]
        is_template = key.startswith("template")
        if is_template or R in schema:
            if is_template and perm is not None:
                x = x[perm]
            index = tuple(slice(t_start, t_start + n_templ) if dim == T and is_template
                          else slice(r_start, r_start + n_res) if dim == R else slice(None) for dim in schema)
            x = x[index]
        out[key] = x
    out["seq_length"] = torch.full_like(p["seq_length"], n_res)
    return out


def pad_to_schema(p: dict, num_res: int, num_clust: int, num_extra: int, num_templates: int) -> dict:
    """pad_to_schema_shape (transforms.py:487-529): zeros after each feature up to the sizes."""
    sizes = {R: num_res, C: num_clust, E: num_extra, T: num_templates}
    out = {}
    for key, x in p.items():
        schema = FEATURE_SCHEMA[key]
        if len(schema) != x.ndim:
            raise KitError(f"feature {key}: shape {tuple(x.shape)}, the schema's {schema}")
        pads = [sizes.get(dim, n) - n for dim, n in zip(schema, x.shape)]
        if any(n < 0 for n in pads):
            raise KitError(f"feature {key}: shape {tuple(x.shape)} beyond the pad sizes {sizes}")
        out[key] = F.pad(x, [v for n in reversed(pads) for v in (0, n)]) if pads else x
    return out


def iteration_transforms(p: dict, dc: DataConfig, mode: str, seed: int, iteration: int, crop_size: int) -> dict:
    """_ensembled_transform_fns (features.py:315-402) for one recycling iteration, in its order."""
    s = seed + iteration
    if mode == "train":
        p = sample_msa_distillation(p, dc.max_distillation_msa_clusters, s)
    p = sample_msa(p, dc.max_msa_clusters, True, s)
    if dc.masked_msa_enabled:
        p = make_masked_msa(p, dc.masked_msa_profile_prob, dc.masked_msa_same_prob, dc.masked_msa_uniform_prob,
                            dc.masked_msa_replace_fraction, s)
    if dc.msa_cluster_features:
        p = summarize_clusters(nearest_neighbor_clusters(p))
    p = crop_extra_msa(p, dc.max_extra_msa, s) if dc.max_extra_msa else delete_extra_msa(p)
    p = make_msa_feat(p)
    p = {k: v for k, v in p.items() if k in FEATURE_SCHEMA}
    p = crop_and_subsample_templates(p, crop_size, dc.max_templates, mode == "train", seed)
    return pad_to_schema(p, crop_size, dc.max_msa_clusters, dc.max_extra_msa, dc.max_templates)


# ------------------------------------------------------------------ one sample, a batch

def process_features(raw: dict, cfg: dict | DataConfig, mode: str, seed: int) -> dict[str, torch.Tensor]:
    """The model's and the loss's features of one sample from its raw features
    (features.py:161-206): every feature with a last dimension of num_recycling_iters + 1
    iterations; train: cropped to crop_size, use_clamped_fape drawn from the seed; eval: the
    whole chain."""
    if mode not in MODES:
        raise KitError(f"process_features: mode {mode!r} (known: {', '.join(MODES)})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise KitError(f"process_features: seed must be an integer (got {seed!r})")
    dc = data_config(cfg)
    p = select_raw_features(raw, dc)
    crop_size = dc.crop_size if mode == "train" else int(p["seq_length"][0])
    p = whole_chain_transforms(p, dc, seed)
    iterations = [iteration_transforms(p, dc, mode, seed, i, crop_size) for i in range(dc.num_recycling_iters + 1)]
    out = {k: torch.stack([it[k] for it in iterations], dim=-1) for k in iterations[0]}
    if mode == "train":
        out["use_clamped_fape"] = torch.full([dc.num_recycling_iters + 1],
                                             L.use_clamped_fape(seed, dc.use_clamped_fape_probability),
                                             dtype=torch.float32)
    return out


def template_source(chains: list[records.Chain], layout: records.Layout, cfg: dict | DataConfig,
                    mode: str) -> FT.TemplateSource:
    """The templates a sample may use (datasets.py:210-219, 303-312): those of every chain in
    chains.csv, max_templates of them, the best shuffle_top_k_prefiltered shuffled in training
    only."""
    dc = data_config(cfg)
    return FT.TemplateSource.of(chains, layout, dc.max_templates,
                                dc.shuffle_top_k_prefiltered if mode == "train" else None)


def make_example(sample: records.SampleRecords, source: FT.TemplateSource, cfg: dict | DataConfig, mode: str,
                 seed: int) -> dict[str, torch.Tensor]:
    """One sample as PDBDataset.__getitem__ makes it (datasets.py:78-134): its raw features
    (the template hits shuffled with `seed`), then process_features with the same seed. The
    seed is the sampler's: records.training_index_seed_pairs or validation_index_seed_pairs."""
    dc = data_config(cfg)
    want = (dc.max_templates, dc.shuffle_top_k_prefiltered if mode == "train" else None)
    have = (source.max_template_hits, source.shuffle_top_k_prefiltered)
    if have != want:
        raise KitError(f"make_example ({mode}): the template source takes {have[0]} templates shuffling the best "
                       f"{have[1]}; the config says {want[0]} and {want[1]} (use transforms.template_source)")
    return process_features(FT.raw_features(sample, source, seed), dc, mode, seed)


def collate(samples: list[dict]) -> dict:
    """torch_utils.py:48-59: each key of the first sample, tensors stacked along a new first
    dimension, anything else as a list."""
    if not samples:
        raise KitError("collate: no samples")
    return {k: torch.stack([s[k] for s in samples]) if isinstance(samples[0][k], torch.Tensor)
            else [s[k] for s in samples] for k in samples[0]}


def recycling_iters_draws(seed: int, num_recycling_iters: int) -> Iterator[int]:
    """_random_num_recycling_iters_generator (dataloaders.py:251-262) over 0..num_recycling_iters
    (train.py:708-710): the values shuffled by random.Random(seed), again and again."""
    rng = random.Random(seed)
    while True:
        values = list(range(num_recycling_iters + 1))
        rng.shuffle(values)
        yield from values


def training_dataloader_seed(seed: int) -> int:
    """The seed train.py gives the training dataloader (train.py:707)."""
    return records.seed_from_string(f"initial_training_dataloader_{seed}")


class RecyclingSchedule:
    """TrainBatchProperties (dataloaders.py:213-248): called on each training batch, it keeps
    the first n + 1 entries of every tensor's last (recycling) dimension, n drawn anew at the
    first batch of each optimizer step (gradient_accumulation_iters batches); num_prev_iters
    batches already done are skipped over."""

    def __init__(self, seed: int, num_recycling_iters: int, gradient_accumulation_iters: int = 1,
                 num_prev_iters: int = 0):
        if gradient_accumulation_iters < 1 or num_prev_iters < 0 or num_prev_iters % gradient_accumulation_iters:
            raise KitError("RecyclingSchedule: gradient_accumulation_iters >= 1 and num_prev_iters >= 0, "
                           "a multiple of it")
        self._draws = recycling_iters_draws(seed, num_recycling_iters)
        self._accumulation = gradient_accumulation_iters
        self._iteration = num_prev_iters
        self.num_recycling_iters: int | None = None
        for _ in range(num_prev_iters // gradient_accumulation_iters):
            next(self._draws)

    def __call__(self, batch: dict) -> dict:
        self._iteration += 1
        if (self._iteration - 1) % self._accumulation == 0:
            self.num_recycling_iters = next(self._draws)
        n = self.num_recycling_iters + 1
        return {k: v[..., :n] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def last_iteration(batch: dict) -> dict:
    """The batch the loss and the validation metric read: every tensor's last recycling
    iteration (train.py:362, 762-765)."""
    return {k: v[..., -1] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


__all__ = ["DATA_CONFIG", "DataConfig", "FEATURE_SCHEMA", "RecyclingSchedule", "collate", "data_config",
           "last_iteration", "make_example", "process_features", "recycling_iters_draws", "template_source",
           "training_dataloader_seed"]
