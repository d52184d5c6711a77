"""OpenFold's raw features of one sample, as the MLPerf reference makes them from its records.

PDBDataset.__getitem__ (mlcommons/hpc@2c627d4 openfold/openfold/datasets.py:78-128) turns a
chain's records (hpckit.openfold.records.read_sample) into the raw feature dict that
process_features then transforms into the model's input (features.py:161-206, transforms.py):

    raw = {**create_mmcif_features(...), **create_template_features(...), **create_msa_features(...)}

This module makes that dict, as the reference does:

* mmCIF features (features.py:35-93): aatype one-hot over the 20 residue types and X,
  between_segment_residues, domain_name (pdb_id + author chain id, no separator), residue_index,
  seq_length, sequence, all_atom_positions and all_atom_mask (float32), resolution,
  release_date, is_distillation;
* MSA features (features.py:119-158): the three MSAs in the reference's order (uniref90, bfd,
  mgnify), a sequence seen before dropped, hhblits' integer codes, the deletion matrix,
  num_alignments; the query alone where there is no MSA;
* template features (features.py:96-116, templates.py:64-205, 224-760): the hhr's hits
  prefiltered (in chains.csv, not the query's own entry, released at least 60 days before
  the query, aligned over more than 10 % of it, not a near-duplicate, at least 10 residues),
  sorted by sum_probs, the top `shuffle_top_k_prefiltered` shuffled with the sample's seed
  (training), then featurised in that order until `max_template_hits` are: the template's
  chain found in its entry by chain id and sequence, by sequence, or by sequence with X as a
  wildcard, its atoms zero-centred and mapped onto the query through the hhr alignment.

Not yet here: process_features and the transforms (features.py:161-409, transforms.py: MSA
sampling, masking and clustering, atom14 and frames, torsion angles, the crop and padding to
the schema's shapes), the next step. Deviation: a template whose hit sequence is not found in
its chain is realigned by the reference with the kalign binary (templates.py:808-933); here
that hit is skipped, as the reference skips one that fails to realign.
"""

from __future__ import annotations

import datetime
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpckit.common.errors import KitError
from hpckit.openfold import records

# residue_constants.py:597-629: the residue types in the order of their three-letter codes, and X
RESTYPES = "ARNDCQEGHILKMFPSTWYV"
RESTYPE_ORDER_WITH_X = {r: i for i, r in enumerate(RESTYPES + "X")}
ATOM_CA = 1                        # residue_constants.py:521-523 ("N", "CA", ...)
DAYS_BEFORE_RELEASE = 60           # datasets.py:113
MAX_CA_CA_DISTANCE = 150.0         # templates.py:640
MAX_SUBSEQUENCE_RATIO = 0.95       # templates.py:279
MIN_ALIGN_RATIO = 0.1              # templates.py:280
MIN_TEMPLATE_LENGTH = 10           # templates.py:360-362
MAX_TEMPLATES = 4                  # config.py:388
SHUFFLE_TOP_K_PREFILTERED = 20     # config.py:389 (training; validation: none, datasets.py:310)


def sequence_to_onehot(sequence: str, mapping: dict[str, int], map_unknown_to_x: bool = False) -> np.ndarray:
    """residue_constants.py:632-673: int32 (L, classes) one-hot; with map_unknown_to_x an upper-case
    letter outside the mapping is X (anything else a ValueError), without it a KeyError."""
    classes = max(mapping.values()) + 1
    out = np.zeros((len(sequence), classes), dtype=np.int32)
    for i, aa in enumerate(sequence):
        if map_unknown_to_x:
            if not (aa.isalpha() and aa.isupper()):
                raise ValueError(f"invalid character in the sequence: {aa!r}")
            out[i, mapping.get(aa, mapping["X"])] = 1
        else:
            out[i, mapping[aa]] = 1
    return out


def create_sequence_features(sequence: str, domain_name: str) -> dict:
    """features.py:35-56."""
    n = len(sequence)
    return {
        "aatype": sequence_to_onehot(sequence, RESTYPE_ORDER_WITH_X, map_unknown_to_x=True),
        "between_segment_residues": np.zeros(n, dtype=np.int32),
        "domain_name": np.array([domain_name.encode("utf-8")], dtype=np.object_),
        "residue_index": np.arange(n, dtype=np.int32),
        "seq_length": np.full(n, n, dtype=np.int32),
        "sequence": np.array([sequence.encode("utf-8")], dtype=np.object_),
    }


def zero_center(positions: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """mmcif.py:260-267: the observed atoms moved so that their mean is the origin (no atom
    observed: unchanged, where the reference takes the mean of nothing)."""
    positions = positions.copy()
    mask = mask.astype(bool)
    if mask.any():
        positions[mask] -= positions[mask].mean(axis=0)
    return positions


def create_mmcif_features(mmcif_dict: dict, author_chain_id: str, zero_centered: bool = False) -> dict:
    """features.py:59-93, for a mmcif_dict of records.load_mmcif_dict."""
    sequence = mmcif_dict["sequences"][author_chain_id]
    out = create_sequence_features(sequence, mmcif_dict["pdb_id"] + author_chain_id)
    atoms = mmcif_dict["atoms"][author_chain_id]
    positions, mask = atoms["all_atom_positions"], atoms["all_atom_mask"]
    if zero_centered:
        positions = zero_center(positions, mask)
    out["all_atom_positions"] = positions.astype(np.float32)
    out["all_atom_mask"] = mask.astype(np.float32)
    out["resolution"] = np.array([mmcif_dict["resolution"]], dtype=np.float32)
    out["release_date"] = np.array([mmcif_dict["release_date"].encode("utf-8")], dtype=np.object_)
    out["is_distillation"] = np.array(0.0, dtype=np.float32)
    return out


def create_msa_features(sequence: str, msas: list[tuple[list[str], list[list[int]]]]) -> dict:
    """features.py:119-158, for MSAs already parsed (records.parse_a3m, the empty ones left
    out): every sequence not seen before, in order, as hhblits' integer codes, with its
    deletion row; the query alone when there is no MSA."""
    if not msas:
        msas = [([sequence], [[0] * len(sequence)])]
    int_msa, deletions, seen = [], [], set()
    for aligned, deletion_matrix in msas:
        if not aligned:
            raise ValueError("an MSA without a sequence")
        for seq, row in zip(aligned, deletion_matrix):
            if seq in seen:
                continue
            seen.add(seq)
            int_msa.append([records.HHBLITS_AA_TO_ID[c] for c in seq])
            deletions.append(row)
    num_res = len(msas[0][0][0])
    return {"deletion_matrix_int": np.array(deletions, dtype=np.int32),
            "msa": np.array(int_msa, dtype=np.int32),
            "num_alignments": np.array([len(int_msa)] * num_res, dtype=np.int32)}


# ----------------------------------------------------------------- templates

@dataclass
class TemplateSource:
    """What the reference's TemplateHitFeaturizer holds (datasets.py:210-219, 303-312;
    templates.py:68-90): the dicts directory, the pdb_chain_ids and release dates of every chain
    in chains.csv (templates come from all of them, not only the selected split), obsolete.dat's
    mapping, how many templates a sample takes and how many of the best are shuffled."""
    dicts_dir: Path
    template_pdb_chain_ids: set
    pdb_release_dates: dict
    obsolete: dict
    max_template_hits: int = MAX_TEMPLATES
    shuffle_top_k_prefiltered: int | None = SHUFFLE_TOP_K_PREFILTERED

    @classmethod
    def of(cls, chains: list[records.Chain], layout: records.Layout, max_template_hits: int = MAX_TEMPLATES,
           shuffle_top_k_prefiltered: int | None = SHUFFLE_TOP_K_PREFILTERED) -> "TemplateSource":
        dates = {c.pdb_id: _date(c.release_date) for c in chains}    # datasets.py:491-500
        return cls(layout.dicts, {c.pdb_chain_id for c in chains}, dates, records.read_obsolete(layout.obsolete),
                   max_template_hits, shuffle_top_k_prefiltered)


def _date(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%d")


_HIT_ID = re.compile(r"[a-zA-Z\d]{4}_[a-zA-Z0-9.]+")


def hit_pdb_chain(hit: records.TemplateHit, where: str) -> tuple[str, str]:
    """templates.py:367-377: the hit's "pdbid_chain" (pdb id lower-cased); a hit named otherwise
    fails the reference (ValueError): one KitError naming `where` here."""
    match = _HIT_ID.match(hit.name)
    if not match:
        raise KitError(f"{where}: hit {hit.index} is named {hit.name[:40]!r}, not PDBID_chain")
    pdb_id, chain = match.group(0).split("_")
    return pdb_id.lower(), chain


def _current_id(pdb_id: str, source: TemplateSource) -> str:
    """templates.py:301-306, 410-412: an id missing from the release dates but obsolete is its successor's."""
    if pdb_id not in source.pdb_release_dates and pdb_id in source.obsolete:
        return source.obsolete[pdb_id]
    return pdb_id


def hit_rejection(hit: records.TemplateHit, query_sequence: str, query_pdb_id: str | None,
                  max_template_date: datetime.datetime, source: TemplateSource, where: str) -> str | None:
    """_check_if_template_hit_is_acceptable (templates.py:271-364): None, or why the hit is not."""
    pdb_id, chain = hit_pdb_chain(hit, where)
    pdb_id = _current_id(pdb_id, source)
    if f"{pdb_id}_{chain}" not in source.template_pdb_chain_ids:
        return "not in template_pdb_chain_ids"
    if query_pdb_id is not None and pdb_id.lower() == query_pdb_id.lower():
        return "template == query"
    if pdb_id in source.pdb_release_dates and source.pdb_release_dates[pdb_id] > max_template_date:
        return "template_release_date > max_template_date"
    if hit.aligned_cols / len(query_sequence) <= MIN_ALIGN_RATIO:
        return "align_ratio <= min_align_ratio"
    template = hit.hit_sequence.replace("-", "")
    if template in query_sequence and len(template) / len(query_sequence) > MAX_SUBSEQUENCE_RATIO:
        return "is_duplicate"
    if len(template) < MIN_TEMPLATE_LENGTH:
        return "template too short"
    return None


def query_to_hit_mapping(query_sequence: str, hit: records.TemplateHit, where: str = "pdb70_hits.hhr") -> dict[int, int]:
    """_build_query_to_hit_index_mapping (templates.py:488-540). A hit whose query or template
    lines are gaps only has no lowest index, the reference's min() a ValueError: one KitError
    naming `where` here."""
    if not hit.query:
        return {}
    hhsearch_query = hit.query.replace("-", "")
    hit_sequence = hit.hit_sequence.replace("-", "")
    offset = query_sequence.find(hhsearch_query)
    if not any(x > -1 for x in hit.indices_hit) or not any(x > -1 for x in hit.indices_query):
        side = "template" if not any(x > -1 for x in hit.indices_hit) else "query"
        raise KitError(f"{where}: hit {hit.index}: its {side} lines hold gaps only (no residue to align)")
    low_hit = min(x for x in hit.indices_hit if x > -1)
    low_query = min(x for x in hit.indices_query if x > -1)
    mapping = {}
    for q, t in zip(hit.indices_query, hit.indices_hit):
        if q == -1 or t == -1:
            continue
        q, t = q - low_query, t - low_hit
        if t >= len(hit_sequence) or q + offset >= len(query_sequence):
            continue
        mapping[q + offset] = t
    return mapping


def find_template_chain(chain_id: str, template_sequence: str, mmcif_dict: dict) -> tuple[str, str, int] | None:
    """_find_template_in_pdb (templates.py:695-758): (chain sequence, chain id, offset) of the
    chain holding the template: the hit's chain by id and sequence, else any chain by sequence,
    else any by sequence with X a wildcard; None where none does (the reference then realigns
    with kalign)."""
    sequences = mmcif_dict["sequences"]
    seq = sequences.get(chain_id)
    if seq and template_sequence in seq:
        return seq, chain_id, seq.find(template_sequence)
    for cid, seq in sequences.items():
        if seq and template_sequence in seq:
            return seq, cid, seq.find(template_sequence)
    pattern = re.compile("".join("." if aa == "X" else f"(?:{re.escape(aa)}|X)" for aa in template_sequence))
    for cid, seq in sequences.items():
        match = pattern.search(seq)
        if match:
            return seq, cid, match.start()
    return None


def _ca_gaps_ok(positions: np.ndarray, mask: np.ndarray) -> bool:
    """_check_residue_distances (templates.py:784-805): consecutive observed CAs within 150 A."""
    prev = None
    for coords, m in zip(positions, mask):
        if m[ATOM_CA]:
            if prev is not None and np.linalg.norm(coords[ATOM_CA] - prev) > MAX_CA_CA_DISTANCE:
                return False
            prev = coords[ATOM_CA]
        else:
            prev = None
    return True


def featurize_hit(hit: records.TemplateHit, query_sequence: str, max_template_date: datetime.datetime,
                  source: TemplateSource, where: str) -> tuple[dict | None, str | None]:
    """_featurize_template_hit and _extract_template_features (templates.py:380-694):
    (features, None), or (None, why the hit gives none)."""
    pdb_id, chain = hit_pdb_chain(hit, where)
    pdb_id = _current_id(pdb_id, source)
    mapping = query_to_hit_mapping(query_sequence, hit, where)
    template_sequence = hit.hit_sequence.replace("-", "")
    mmcif = records.load_mmcif_dict(source.dicts_dir, pdb_id)
    if _date(mmcif["release_date"]) > max_template_date:     # the reference asserts it (templates.py:431-435)
        raise KitError(f"{records.dicts_file(source.dicts_dir, pdb_id)} key '{pdb_id}': released "
                       f"{mmcif['release_date']}, not the date chains.csv gives it")
    if not mmcif["sequences"]:
        return None, "no chains"
    found = find_template_chain(chain, template_sequence, mmcif)
    if found is None:
        return None, "the hit's sequence is not in the template's chains (the reference realigns it with kalign)"
    _, chain_id, offset = found
    atoms = mmcif["atoms"][chain_id]
    positions = zero_center(atoms["all_atom_positions"], atoms["all_atom_mask"])
    mask = atoms["all_atom_mask"].astype(np.float32)
    if not _ca_gaps_ok(positions, mask):
        return None, "no atom data (a CA-CA distance above 150 A)"
    L = len(query_sequence)
    out_positions = np.zeros((L, records.ATOM_TYPE_NUM, 3), dtype=np.float32)
    out_mask = np.zeros((L, records.ATOM_TYPE_NUM), dtype=np.float32)
    out_sequence = ["-"] * L
    for q, t in mapping.items():
        if not 0 <= t + offset < len(positions):   # an index past the chain: the reference's IndexError
            return None, "the hit's alignment reaches past the template chain"
        out_positions[q] = positions[t + offset]
        out_mask[q] = mask[t + offset]
        out_sequence[q] = template_sequence[t]
    if out_mask.sum() < 5:
        return None, "template all atom mask was all zeros"
    sequence = "".join(out_sequence)
    try:
        aatype = sequence_to_onehot(sequence, records.HHBLITS_AA_TO_ID)
    except KeyError as e:
        raise KitError(f"{where}: hit {hit.index}: residue {e} is not in hhblits' alphabet") from None
    return {"template_domain_names": f"{pdb_id}_{chain_id}", "template_sequence": sequence,
            "template_aatype": aatype, "template_all_atom_positions": out_positions,
            "template_all_atom_mask": out_mask,
            "template_sum_probs": np.array([hit.sum_probs], dtype=np.float32)}, None


def empty_template_features(num_res: int) -> dict:
    """templates.py:207-221."""
    return {"template_domain_names": [], "template_sequence": [],
            "template_aatype": np.zeros((0, num_res), dtype=np.int32),
            "template_all_atom_positions": np.zeros((0, num_res, records.ATOM_TYPE_NUM, 3), dtype=np.float32),
            "template_all_atom_mask": np.zeros((0, num_res, records.ATOM_TYPE_NUM), dtype=np.float32),
            "template_sum_probs": np.zeros((0, 1), dtype=np.float32)}


def create_template_features(query_sequence: str, hits: list[records.TemplateHit], release_date: str,
                             query_pdb_id: str | None, shuffling_seed: int | None, source: TemplateSource,
                             where: str = "pdb70_hits.hhr") -> dict:
    """create_template_features (features.py:96-116) with get_template_features
    (templates.py:92-187): the templates of hits released DAYS_BEFORE_RELEASE days before the
    query at the latest."""
    if not hits:
        return empty_template_features(len(query_sequence))
    max_date = _date(release_date) - datetime.timedelta(days=DAYS_BEFORE_RELEASE)
    accepted = [h for h in hits if hit_rejection(h, query_sequence, query_pdb_id, max_date, source, where) is None]
    accepted.sort(key=lambda h: h.sum_probs, reverse=True)
    k = source.shuffle_top_k_prefiltered
    if k is not None:
        top = accepted[:k]
        random.Random(shuffling_seed).shuffle(top)
        accepted = top + accepted[k:]
    found: list[dict] = []
    for hit in accepted:
        features, _why = featurize_hit(hit, query_sequence, max_date, source, where)
        if features is not None:
            found.append(features)
        if len(found) >= source.max_template_hits:
            break
    if not found:
        return empty_template_features(len(query_sequence))
    out = {key: [f[key] for f in found] for key in found[0]}
    for key in ("template_aatype", "template_all_atom_positions", "template_all_atom_mask", "template_sum_probs"):
        out[key] = np.stack(out[key], axis=0)
    return out


def raw_features(sample: records.SampleRecords, source: TemplateSource, seed: int) -> dict:
    """The raw feature dict of one sample (datasets.py:100-128): mmCIF, template and MSA
    features, the template hits shuffled with the sample's `seed`."""
    chain = sample.chain
    hhr_where = sample.hits_where     # names the shard file the hits were read from
    return {**create_mmcif_features(sample.mmcif_dict, chain.author_chain_id),
            **create_template_features(chain.sequence, sample.template_hits, chain.release_date, chain.pdb_id,
                                       seed, source, hhr_where),
            **create_msa_features(chain.sequence, sample.msas)}
