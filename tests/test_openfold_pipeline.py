"""OpenFold input pipeline, quick: raw features -> the model's and the loss's feature dict
(hpckit.openfold.transforms) against the MLPerf reference's process_features, and end to end
through the mini model and the loss.

The reference is mlcommons/hpc@2c627d4 openfold/. With HPCKIT_OPENFOLD_REFERENCE naming its
openfold/ directory, its openfold.data.features.process_features runs on the same raw features
as ours with the same config and seeds (test_pipeline_equals_reference: every feature the same
dtype, shape and values, bit for bit), and its TrainBatchProperties and collate on the same
samples. It is imported as tests/test_openfold_model.py imports the reference, with empty
stand-ins for the Biopython modules its mmcif.py imports (only its mmCIF parser uses them; the
pipeline does not) when biopython is missing. Without it (CI) our features are compared with
numbers the reference's pipeline wrote, tests/data/openfold_reference_pipeline.json;
HPCKIT_OPENFOLD_WRITE_GOLDEN=1 with the clone rewrites that file (test_write_golden).

The inputs: synthetic.write_dataset(DATASET) read back by hpckit.openfold.records and made into
raw features by hpckit.openfold.features (the template hits shuffled with the sample's seed in
training, max_templates of them); CASES picks the chains (by rule, see chosen()), the mode, the
config (configs/mini.yaml's data section, or VARIANT: other sizes, no extra MSA kept, three
recycling iterations) and the seeds (a 64-bit one whose seed + 1 wraps past 2**64, the
validation sampler's seed of the chain's id, 63-bit ones as the training sampler draws).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hpckit.common.errors import KitError
from hpckit.openfold import features, records, synthetic
from hpckit.openfold import loss as L
from hpckit.openfold import model as M
from hpckit.openfold import transforms as TR
from test_openfold_model import REF_ENV, WRITE_ENV, import_reference, mini

GOLDEN = Path(__file__).parent / "data" / "openfold_reference_pipeline.json"
DATASET = dict(n_train=10, n_valid=2, seed=3, crop=16, msa_depth=12, min_length=12, max_length=30)
VARIANT = {"crop_size": 24, "max_msa_clusters": 4, "max_extra_msa": 0, "max_templates": 1,
           "num_recycling_iters": 2, "max_distillation_msa_clusters": 6}
WRAP_SEED = 2 ** 64 - 1
# name: (mode, which chain (chosen()), config ("mini" or "variant"), seed (None: the validation
# sampler's, records.seed_from_string(pdb_chain_id)), is_distillation)
CASES = {
    "train_templates": ("train", "train_2_templates", "mini", 6004865271420530261, False),
    "train_long_wrap": ("train", "train_long_no_template", "mini", WRAP_SEED, False),
    "train_short": ("train", "train_shortest", "mini", 2469553311298312417, False),
    "eval_cameo": ("eval", "valid_first", "mini", None, False),
    "eval_templates": ("eval", "train_2_templates", "mini", None, False),
    "variant_templates": ("train", "train_2_templates", "variant", 8514405271908853179, False),
    "variant_distillation": ("train", "train_1_template", "variant", 907142069837325203, True),
}
RECYCLING = dict(seed=TR.training_dataloader_seed(0), num_recycling_iters=3, draws=16)
FLOAT_RTOL = 1e-6     # golden: of max(1, sum |x|), for float features (a CPU's atan may differ by an ulp)


# ----------------------------------------------------------------------------- the inputs

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("openfold-pipeline") / "data"
    synthetic.write_dataset(root, **DATASET)
    layout = records.Layout.under(root)
    chains = records.read_chains(layout.chains)
    index = records.AlignmentIndex(layout.alignments)
    return layout, chains, index


def config(name: str) -> dict:
    cfg = copy.deepcopy(mini())
    if name == "variant":
        cfg["data"].update(VARIANT)
    return cfg


def chosen(data) -> dict[str, records.Chain]:
    """The chains CASES use, by rule: the first training chain whose raw features (mini) hold 2
    templates, 1 template; the longest without one; the shortest; the first validation chain."""
    layout, chains, index = data
    train = records.training_chains(chains, index)
    source = TR.template_source(chains, layout, mini(), "eval")
    counts = {c.pdb_chain_id: len(features.raw_features(records.read_sample(c, layout, index), source, 0)
                                  ["template_domain_names"]) for c in train}
    return {"train_2_templates": next(c for c in train if counts[c.pdb_chain_id] == 2),
            "train_1_template": next(c for c in train if counts[c.pdb_chain_id] == 1),
            "train_long_no_template": max((c for c in train if counts[c.pdb_chain_id] == 0),
                                          key=lambda c: c.sequence_length),
            "train_shortest": min(train, key=lambda c: c.sequence_length),
            "valid_first": records.validation_chains(chains, index)[0]}


def case_inputs(data, name: str, picked: dict) -> tuple[dict, dict, str, int, records.Chain]:
    """(raw features, config, mode, seed, chain) of a case."""
    layout, chains, index = data
    mode, which, cfg_name, seed, distillation = CASES[name]
    chain = picked[which]
    seed = records.seed_from_string(chain.pdb_chain_id) if seed is None else seed
    cfg = config(cfg_name)
    source = TR.template_source(chains, layout, mini(), mode)     # mini's templates even for the variant
    raw = features.raw_features(records.read_sample(chain, layout, index), source, seed)
    if distillation:
        raw["is_distillation"] = np.array(1.0, dtype=np.float32)
    return raw, cfg, mode, seed, chain


def raw_digest(raw: dict) -> str:
    """sha256 (16 hex digits) of the raw features: their names, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for k in sorted(raw):
        v = raw[k]
        a = np.asarray(v if not isinstance(v, list) else np.array([str(x) for x in v], dtype=object))
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(repr(a.tolist()).encode() if a.dtype == object else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- the reference

def reference_modules(root: Path):
    """(openfold.config, openfold.data.features, openfold.dataloaders, openfold.torch_utils)."""
    import_reference(root)
    return tuple(importlib.import_module(f"openfold.{m}")
                 for m in ("config", "data.features", "dataloaders", "torch_utils"))


def reference_config(config_module, cfg: dict):
    """The reference's AlphaFoldConfig with our data settings (crop_size is its
    train_sequence_crop_size; the other names are its own)."""
    dc = dataclasses.asdict(TR.data_config(cfg))
    dc["train_sequence_crop_size"] = dc.pop("crop_size")
    return dataclasses.replace(config_module.AlphaFoldConfig(), **dc)


def reference_features(raw: dict, cfg: dict, mode: str, seed: int) -> dict:
    config_module, RF, _, _ = reference_modules(Path(os.environ[REF_ENV]))
    import warnings
    with warnings.catch_warnings():     # its list-of-slices indexing, deprecated in torch 2.9
        warnings.simplefilter("ignore", UserWarning)
        return RF.process_features(copy.deepcopy(raw), reference_config(config_module, cfg), mode, seed)


def differences(ours: dict, ref: dict) -> dict[str, str]:
    """{feature: what differs} over both dicts' features: missing, dtype, shape, or the largest
    |ours - ref| where the values are not identical."""
    bad = {}
    for k in sorted(set(ours) | set(ref)):
        if k not in ours or k not in ref:
            bad[k] = "only in " + ("ours" if k in ours else "the reference's")
            continue
        a, b = ours[k], ref[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            bad[k] = f"{a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}"
        elif not torch.equal(a, b):
            bad[k] = f"max |diff| {float((a.double() - b.double()).abs().max()):.3e}"
    return bad


needs_reference = pytest.mark.skipif(not os.environ.get(REF_ENV), reason=f"{REF_ENV} not set (no reference clone)")


@needs_reference
def test_pipeline_equals_reference(data):
    """Every case: the same features, dtypes, shapes and values as the reference's, bit for bit."""
    picked = chosen(data)
    kept = set()
    for name in CASES:
        raw, cfg, mode, seed, _ = case_inputs(data, name, picked)
        ours, ref = TR.process_features(raw, cfg, mode, seed), reference_features(raw, cfg, mode, seed)
        bad = differences(ours, ref)
        assert not bad, (name, bad)
        kept |= {(name, int(ours["template_mask"][..., -1].sum()))}
    # the cases reach what they are there for: templates kept, in training and in eval
    assert dict(kept)["train_templates"] >= 1 and dict(kept)["eval_templates"] == 2, kept


@needs_reference
def test_reference_comparison_can_fail(data, monkeypatch):
    """One transform changed (the extra MSA cut to its first sequences, not a shuffled choice)
    is seen in the extra-MSA features, and the features that do not depend on it stay equal."""
    raw, cfg, mode, seed, _ = case_inputs(data, "train_templates", chosen(data))
    ref = reference_features(raw, cfg, mode, seed)
    monkeypatch.setattr(TR, "crop_extra_msa", extra_msa_unshuffled)
    bad = differences(TR.process_features(raw, cfg, mode, seed), ref)
    assert "extra_msa" in bad and "msa_feat" not in bad and "rigidgroups_gt_frames" not in bad, bad


def extra_msa_unshuffled(p: dict, max_extra_msa: int, seed: int) -> dict:
    return {k: v[:max_extra_msa] if k.startswith("extra_") and k[6:] in TR.MSA_FEATURES else v for k, v in p.items()}


@needs_reference
def test_recycling_and_collate_equal_reference(data):
    """TrainBatchProperties and collate of the reference on two processed samples: the same
    numbers of recycling iterations, drawn per optimizer step with gradient accumulation, and
    the same batches."""
    _, _, DL, TU = reference_modules(Path(os.environ[REF_ENV]))
    picked = chosen(data)
    samples = [TR.process_features(*case_inputs(data, n, picked)[:4]) for n in ("train_templates", "train_short")]
    for accumulation, prev in ((1, 0), (2, 4)):
        ours = TR.RecyclingSchedule(RECYCLING["seed"], 3, accumulation, prev)
        ref = DL.TrainBatchProperties(RECYCLING["seed"], [0, 1, 2, 3], accumulation, prev)
        for _ in range(9):
            a, b = ours(TR.collate(samples)), ref(TU.collate(samples))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    draws = DL._random_num_recycling_iters_generator([0, 1, 2, 3], RECYCLING["seed"])
    ours = TR.recycling_iters_draws(RECYCLING["seed"], 3)
    assert [next(ours) for _ in range(40)] == [next(draws) for _ in range(40)]


# ----------------------------------------------------------------------------- golden numbers

def summary(feats: dict) -> dict:
    """Per feature: [dtype, shape, sum, sum |x|, weighted sum] (float64 of the values; weights
    1..13 cycling over the flat index, so that a permutation is seen)."""
    out = {}
    for k in sorted(feats):
        x = feats[k].double().reshape(-1)
        w = (torch.arange(x.numel(), dtype=torch.float64) % 13) + 1
        out[k] = [str(feats[k].dtype).replace("torch.", ""), list(feats[k].shape), float(x.sum()),
                  float(x.abs().sum()), float((x * w).sum())]
    return out


def golden_mismatches(ours: dict, golden: dict) -> list[str]:
    """Integer and boolean features exactly; float features within FLOAT_RTOL x max(1, sum |x|)."""
    bad = []
    for k in sorted(set(ours) | set(golden)):
        if k not in ours or k not in golden:
            bad.append(f"{k}: only in {'ours' if k in ours else 'the golden file'}")
            continue
        (dt, shape, *stats), (gdt, gshape, *gstats) = ours[k], golden[k]
        if dt != gdt or shape != gshape:
            bad.append(f"{k}: {dt} {shape} != {gdt} {gshape}")
            continue
        tol = FLOAT_RTOL * max(1.0, gstats[1]) * 13 if dt.startswith("float") else 0.0
        for name, v, g in zip(("sum", "abs_sum", "weighted_sum"), stats, gstats):
            if not abs(v - g) <= tol:
                bad.append(f"{k}.{name}: {v!r} != {g!r}")
    return bad


def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_pipeline_matches_reference_golden(data):
    g = golden()
    assert g["dataset"] == DATASET and g["generator_version"] == synthetic.GENERATOR_VERSION
    picked = chosen(data)
    for name, case in g["cases"].items():
        raw, cfg, mode, seed, chain = case_inputs(data, name, picked)
        assert (chain.pdb_chain_id, seed, raw_digest(raw)) == (case["chain"], case["seed"], case["raw_digest"]), \
            (name, "the inputs are not those the golden file was written from (synthetic.py or features.py "
                   "changed?): rewrite it with the reference (test_write_golden)")
        bad = golden_mismatches(summary(TR.process_features(raw, cfg, mode, seed)), case["features"])
        assert not bad, (name, bad)
    assert set(g["cases"]) == set(CASES)
    draws = TR.recycling_iters_draws(RECYCLING["seed"], RECYCLING["num_recycling_iters"])
    assert [next(draws) for _ in range(RECYCLING["draws"])] == g["recycling_draws"]


def test_golden_comparison_can_fail(data, monkeypatch):
    """The same changed transform as test_reference_comparison_can_fail is seen against the
    golden numbers, in the extra-MSA features only."""
    raw, cfg, mode, seed, _ = case_inputs(data, "train_templates", chosen(data))
    monkeypatch.setattr(TR, "crop_extra_msa", extra_msa_unshuffled)
    bad = golden_mismatches(summary(TR.process_features(raw, cfg, mode, seed)),
                            golden()["cases"]["train_templates"]["features"])
    assert any(b.startswith("extra_msa.") for b in bad), bad
    assert all(b.startswith("extra_") for b in bad), bad


@pytest.mark.skipif(not (os.environ.get(REF_ENV) and os.environ.get(WRITE_ENV) == "1"),
                    reason=f"rewrites the golden file only with {REF_ENV} and {WRITE_ENV}=1")
def test_write_golden(data):
    """The reference's process_features on every case's raw features, summarised."""
    picked = chosen(data)
    cases = {}
    for name in CASES:
        raw, cfg, mode, seed, chain = case_inputs(data, name, picked)
        cases[name] = {"mode": mode, "config": CASES[name][2], "chain": chain.pdb_chain_id, "seed": seed,
                       "is_distillation": CASES[name][4], "raw_digest": raw_digest(raw),
                       "features": summary(reference_features(raw, cfg, mode, seed))}
    _, _, DL, _ = reference_modules(Path(os.environ[REF_ENV]))
    draws = DL._random_num_recycling_iters_generator(list(range(RECYCLING["num_recycling_iters"] + 1)),
                                                     RECYCLING["seed"])
    doc = {
        "what": "summary numbers of the MLPerf reference's input pipeline (mlcommons/hpc@2c627d4 openfold/, "
                "openfold.data.features.process_features; dataloaders._random_num_recycling_iters_generator) "
                "written by tests/test_openfold_pipeline.py::test_write_golden",
        "inputs": "hpckit.openfold.synthetic.write_dataset(**dataset) -> records -> features.raw_features (the "
                  "mode's template source from transforms.template_source with configs/mini.yaml) for the "
                  "chains, modes, configs and seeds of tests/test_openfold_pipeline.py's CASES; raw_digest is "
                  "that file's raw_digest() of them",
        "configs": {"mini": "configs/mini.yaml's data section over transforms.DATA_CONFIG",
                    "variant": {"mini with": VARIANT}},
        "summary": "per feature [dtype, shape, sum, sum |x|, sum x_i * (i % 13 + 1)] in float64 "
                   "(test_openfold_pipeline.summary)",
        "dataset": DATASET,
        "generator_version": synthetic.GENERATOR_VERSION,
        "torch": torch.__version__,
        "recycling_seed": RECYCLING["seed"],
        "recycling_draws": [next(draws) for _ in range(RECYCLING["draws"])],
        "cases": cases,
    }
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(_dump(doc) + "\n")
    assert json.loads(GOLDEN.read_text()) == doc


def _dump(obj, depth: int = 0) -> str:
    """JSON with one line per feature: objects spread over lines down to the features."""
    if not isinstance(obj, dict) or depth > 3:
        return json.dumps(obj)
    pad = " " * (depth + 1)
    return "{\n" + ",\n".join(f"{pad}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in obj.items()) + \
        "\n" + " " * depth + "}"


# ----------------------------------------------------------------------------- properties

def test_features_follow_the_schema_and_the_seeds(data):
    """Shapes are the schema's at the config's sizes with the recycling dimension; the crop is
    the same window in every iteration, the MSA sample is not; the query is the first MSA row;
    the same seed gives the same features, another seed others; eval keeps the whole chain."""
    picked = chosen(data)
    raw, cfg, mode, seed, chain = case_inputs(data, "train_long_wrap", picked)
    f = TR.process_features(raw, cfg, mode, seed)
    dc = TR.data_config(cfg)
    sizes = {TR.R: dc.crop_size, TR.C: dc.max_msa_clusters, TR.E: dc.max_extra_msa, TR.T: dc.max_templates}
    n_iter = dc.num_recycling_iters + 1
    assert set(f) == set(TR.FEATURE_SCHEMA) | {"use_clamped_fape"}
    for k, schema in TR.FEATURE_SCHEMA.items():
        assert tuple(f[k].shape) == tuple(sizes.get(d, d) for d in schema) + (n_iter,), k
    assert chain.sequence_length > dc.crop_size and (f["seq_length"] == dc.crop_size).all()
    assert f["seq_mask"].sum() == dc.crop_size * n_iter
    for k in ("aatype", "residue_index", "all_atom_positions", "target_feat", "template_aatype"):
        assert all(torch.equal(f[k][..., 0], f[k][..., i]) for i in range(n_iter)), k
    assert not torch.equal(f["bert_mask"][..., 0], f["bert_mask"][..., 1])
    start = int(f["residue_index"][0, 0])
    assert (f["residue_index"][:, 0] == torch.arange(start, start + dc.crop_size)).all()
    window = chain.sequence[start:start + dc.crop_size]
    assert f["aatype"][:, 0].tolist() == [features.RESTYPES.index(a) for a in window]
    assert torch.equal(f["true_msa"][0], f["aatype"])
    assert 0.05 < float(f["bert_mask"].sum() / f["msa_mask"].sum()) < 0.3
    assert f["use_clamped_fape"].tolist() == [L.use_clamped_fape(seed)] * n_iter
    again = TR.process_features(raw, cfg, mode, seed)
    assert all(torch.equal(again[k], f[k]) for k in f)
    other = TR.process_features(raw, cfg, mode, seed + 7)
    assert not torch.equal(other["msa_feat"], f["msa_feat"])
    # eval: the whole chain, no use_clamped_fape
    e = TR.process_features(raw, cfg, "eval", seed)
    assert e["aatype"].shape == (chain.sequence_length, n_iter) and "use_clamped_fape" not in e
    assert (e["residue_index"][:, 0] == torch.arange(chain.sequence_length)).all()
    assert e["seq_mask"].all()


def test_padding_of_a_short_chain(data):
    raw, _, _, seed, chain = case_inputs(data, "eval_cameo", chosen(data))
    f = TR.process_features(raw, config("variant"), "train", seed)
    n = chain.sequence_length
    assert n < VARIANT["crop_size"] and (f["seq_length"] == n).all()
    assert f["seq_mask"][:n].all() and not f["seq_mask"][n:].any()
    assert not f["all_atom_mask"][n:].any() and not f["msa_mask"][:, n:].any()
    assert "extra_msa" not in f       # max_extra_msa 0: the extra MSA is dropped (transforms.py:236-240)
    assert f["msa_feat"].shape[:2] == (VARIANT["max_msa_clusters"], VARIANT["crop_size"])


def test_bad_config_mode_seed_and_source(data):
    layout, chains, index = data
    with pytest.raises(KitError, match="config key 'data.crop_sise': unknown key"):
        TR.data_config({"data": {"crop_sise": 3}})
    with pytest.raises(KitError, match=r"config key 'data.max_msa_clusters': must be an integer in 1\.\.4096"):
        TR.data_config({"data": {"max_msa_clusters": 0}})
    with pytest.raises(KitError, match="config key 'data.masked_msa_replace_fraction': must be a probability"):
        TR.data_config({"data": {"masked_msa_replace_fraction": 1.5}})
    raw, cfg, _, seed, chain = case_inputs(data, "train_short", chosen(data))
    with pytest.raises(KitError, match="mode 'predict'"):
        TR.process_features(raw, cfg, "predict", seed)
    with pytest.raises(KitError, match="seed must be an integer"):
        TR.process_features(raw, cfg, "train", None)
    sample = records.read_sample(chain, layout, index)
    with pytest.raises(KitError, match=r"make_example \(eval\): the template source .*\(use transforms.template_sou"):
        TR.make_example(sample, TR.template_source(chains, layout, cfg, "train"), cfg, "eval", seed)


# ----------------------------------------------------------------------------- end to end

def training_batch(data, cfg: dict, batch_size: int = 4) -> tuple[dict, list]:
    """batch_size samples as the training loop gets them: (index, seed) pairs from the
    training sampler (records.training_index_seed_pairs, seed 0), make_example, collate, the
    recycling schedule."""
    layout, chains, index = data
    train = records.training_chains(chains, index)
    pairs = records.training_index_seed_pairs(records.sampler_weights(train), 1, batch_size, batch_size,
                                              records.training_sampler_seed(0))
    source = TR.template_source(chains, layout, cfg, "train")
    samples = [TR.make_example(records.read_sample(train[i], layout, index), source, cfg, "train", s)
               for i, s in pairs]
    schedule = TR.RecyclingSchedule(TR.training_dataloader_seed(0), TR.data_config(cfg).num_recycling_iters)
    return schedule(TR.collate(samples)), pairs


def test_end_to_end_forward_loss_backward_and_adam(data):
    """Synthetic set -> records -> raw features -> pipeline -> the mini model -> AlphaFoldLoss:
    finite loss and gradients; then Adam (the reference's betas and eps, gradient clipping at
    0.1) on those 4 samples lowers their loss (eval-mode forward, no dropout) every 2 steps,
    by 2 % at least after 6 (a run here: 33.71, 33.55, 33.25, 32.75)."""
    cfg = mini()
    batch, pairs = training_batch(data, cfg)
    assert batch["aatype"].shape[0] == 4 and len({s for _, s in pairs}) == 4
    torch.manual_seed(0)
    model = M.build_model(cfg)
    model.train()
    torch.manual_seed(1)
    outputs = model(batch)
    loss, terms = L.AlphaFoldLoss()(outputs, TR.last_iteration(batch))
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in terms.values()), terms
    assert terms["fape"] > 0 and terms["masked_msa"] > 0 and terms["distogram"] > 0
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["input_embedder.linear_msa_m.weight"].abs().sum() > 0

    def eval_loss() -> float:
        model.eval()
        with torch.no_grad():
            value = float(L.AlphaFoldLoss()(model(batch), TR.last_iteration(batch))[0])
        model.train()
        return value

    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6)   # config.py:342-346
    history = [eval_loss()]
    for step in range(6):
        torch.manual_seed(100 + step)
        opt.zero_grad()
        loss, _ = L.AlphaFoldLoss()(model(batch), TR.last_iteration(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)              # config.py:349-350
        opt.step()
        if step % 2 == 1:
            history.append(eval_loss())
    print("eval-mode loss before and every 2 Adam steps:", [f"{v:.4f}" for v in history])
    assert all(b < a for a, b in zip(history, history[1:])), history
    assert history[-1] < 0.98 * history[0], history


def test_end_to_end_validation_sample(data):
    """A CAMEO validation sample in eval mode (the whole chain, the validation sampler's seed)
    through the mini model: lDDT-Ca of its prediction in [0, 1]."""
    layout, chains, index = data
    cfg = mini()
    valid = records.validation_chains(chains, index)
    i, seed = records.validation_index_seed_pairs(valid)[0]
    source = TR.template_source(chains, layout, cfg, "eval")
    batch = TR.collate([TR.make_example(records.read_sample(valid[i], layout, index), source, cfg, "eval", seed)])
    torch.manual_seed(0)
    model = M.build_model(cfg).eval()
    with torch.no_grad():
        out = model(batch)
    last = TR.last_iteration(batch)
    assert out["final_atom_positions"].shape == (1, valid[i].sequence_length, 37, 3)
    lddt = float(L.validation_lddt_ca(out["final_atom_positions"], last["all_atom_positions"], last["all_atom_mask"]))
    assert 0.0 <= lddt <= 1.0
