"""OpenFold data, quick: the synthetic set in the reference's processed layout read back field by
field; the readers against hand-written files of that layout (a chains.csv row, an index entry
and its shard, obsolete.dat lines, an mmCIF dicts pickle, a3m and hhr text); the training and
CAMEO validation selections; and every bad input as one KitError line naming the file (and key
or line) at fault, never a traceback and never a pickle run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pickle
import pickletools
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from hpckit.common.errors import KitError
from hpckit.openfold import records, synthetic

N_TRAIN, N_VALID, SEED, CROP = 8, 4, 5, 8
LENGTHS = dict(min_length=12, max_length=20)


def make(root, seed=SEED, **kw):
    return synthetic.write_dataset(root, N_TRAIN, N_VALID, seed=seed, crop=CROP, msa_depth=6, **LENGTHS, **kw)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("openfold") / "data"
    return root, make(root)


@pytest.fixture
def data_copy(ds, tmp_path):
    dst = tmp_path / "data"
    shutil.copytree(ds[0], dst)
    return dst


def one_line(excinfo, *names) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and len(msg) < 2000, msg
    for name in names:
        assert str(name) in msg, (name, msg)
    return msg


# ----------------------------------------------------------------- the synthetic set, read back

def test_the_layout_is_the_references(ds):
    root, manifest = ds
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert "pdb_mmcif/processed/chains.csv" in files and "pdb_mmcif/processed/obsolete.dat" in files
    assert "open_protein_set/processed/pdb_alignments/super.index" in files
    assert {"open_protein_set/processed/pdb_alignments/0.db", "open_protein_set/processed/pdb_alignments/1.db"} <= set(files)
    dicts = [f for f in files if f.startswith("pdb_mmcif/processed/dicts/")]
    assert dicts and all(len(Path(f).name) == 2 for f in dicts)
    assert not [f for f in files if Path(f).name.startswith(".")]     # no temporary file left
    assert manifest["counts"] == {"train": N_TRAIN, "validation": N_VALID, "filtered_out": 4}
    assert json.loads((root / "manifest.json").read_text())["seed"] == SEED


def test_every_field_reads_back_as_written(ds):
    root, _ = ds
    entries, obsolete = synthetic.plan(N_TRAIN, N_VALID, SEED, **LENGTHS)
    layout = records.Layout.under(root)
    chains = records.read_chains(layout.chains)
    by_id = {c.pdb_chain_id: c for c in chains}
    expected = [row for e in entries for row in e.rows()]
    assert sorted(by_id) == sorted(r.pdb_chain_id for r in expected)
    assert [c.pdb_id[1:3] for c in chains] == sorted(c.pdb_id[1:3] for c in chains)   # the preprocessing's order
    for row in expected:
        got = by_id[row.pdb_chain_id]
        for name in records.CHAINS_COLUMNS:
            a, b = getattr(got, name), getattr(row, name)
            assert a == b or (name == "resolution" and math.isnan(a) and math.isnan(b)), (name, a, b)
    assert records.read_obsolete(layout.obsolete) == obsolete
    index = records.AlignmentIndex(layout.alignments)
    index.check_all()
    assert set(index.keys()) == set(by_id)
    for entry in entries:
        d = records.load_mmcif_dict(layout.dicts, entry.pdb_id)
        assert list(d) == ["pdb_id", "exptl_method", "release_date", "resolution", "author_chain_ids",
                           "entity_id_to_mmcif_chain_ids", "mmcif_chain_id_to_author_chain_id", "sequences", "atoms"]
        assert (d["pdb_id"], d["exptl_method"], d["release_date"]) == (entry.pdb_id, entry.exptl_method,
                                                                       entry.release_date)
        assert d["resolution"] == entry.resolution or (math.isnan(d["resolution"]) and math.isnan(entry.resolution))
        assert d["author_chain_ids"] == [c.author for c in entry.chains]
        assert set(d["mmcif_chain_id_to_author_chain_id"]) == {m for c in entry.chains for m in c.mmcif_ids}
        for c in entry.chains:
            assert d["sequences"][c.author] == c.sequence
            pos, mask = d["atoms"][c.author]["all_atom_positions"], d["atoms"][c.author]["all_atom_mask"]
            assert pos.dtype == np.float32 and pos.shape == (len(c.sequence), 37, 3)
            assert mask.dtype == bool and mask.shape == (len(c.sequence), 37)
            assert np.array_equal(pos, c.positions) and np.array_equal(mask, c.mask)
            assert not mask[:, 5:].any() and (pos[~mask] == 0).all()
            key = f"{entry.pdb_id}_{c.author}"
            texts = index.load(key)
            assert list(texts) == list(synthetic.ALIGNMENT_FILES)
            for name in records.MSA_FILES:
                msa, deletions = records.parse_a3m(texts[name], name)
                assert msa[0] == c.sequence and all(len(s) == len(c.sequence) for s in msa)
                assert all(len(row) == len(c.sequence) for row in deletions)
            for hit in records.parse_hhr(texts[records.TEMPLATE_HITS], key):
                hit_id, hit_chain = hit.name.split()[0].split("_")
                hit_id = obsolete.get(hit_id, hit_id)
                template = records.load_mmcif_dict(layout.dicts, hit_id)["sequences"][hit_chain]
                assert hit.query == c.sequence and hit.hit_sequence == template
                assert hit.indices_query == list(range(len(c.sequence))) == hit.indices_hit
                assert by_id[f"{hit_id}_{hit_chain}"].pdb_cluster_id == by_id[key].pdb_cluster_id


def test_the_references_selection_finds_the_splits(ds):
    root, _ = ds
    layout = records.Layout.under(root)
    chains = records.read_chains(layout.chains)
    index = records.AlignmentIndex(layout.alignments)
    train = records.training_chains(chains, index)
    assert len(train) == N_TRAIN
    assert all(c.release_date <= records.TRAIN_MAX_PDB_RELEASE_DATE and c.pdb_cluster_id >= 0 for c in train)
    assert len(chains) == N_TRAIN + N_VALID + len(synthetic.FILTERED_OUT)
    sizes = {c.pdb_cluster_id: sum(d.pdb_cluster_id == c.pdb_cluster_id for d in train) for c in train}
    assert all(c.pdb_cluster_size == sizes[c.pdb_cluster_id] for c in train)
    weights = records.sampler_weights(train)
    assert weights == pytest.approx([0.5 / math.sqrt(c.pdb_cluster_size) for c in train])   # all shorter than 256
    valid = records.validation_chains(chains, index)
    targets = [t for _, t in synthetic.cameo_targets_in_window()[:N_VALID]]
    assert sorted(c.cameo_target_id for c in valid) == sorted(targets)
    assert not {c.pdb_chain_id for c in valid} & {c.pdb_chain_id for c in train}
    assert any(c.author_chain_id not in c.mmcif_chain_ids.split(";") for c in valid)   # found by its mmCIF id
    sample = records.read_sample(train[0], layout, index)
    assert sample.chain == train[0] and len(sample.msas) == 3
    pairs = records.training_index_seed_pairs(weights, 3, 1, 2, records.training_sampler_seed(1))
    assert len(pairs) == 6 and all(0 <= i < len(train) for i, _ in pairs)
    assert pairs == records.training_index_seed_pairs(weights, 3, 1, 2, records.training_sampler_seed(1))
    assert records.training_index_seed_pairs(weights, 3, 1, 2, 7, rank=1, world_size=2) == \
        records.training_index_seed_pairs(weights, 3, 1, 2, 7)[1::2]
    vpairs = records.validation_index_seed_pairs(valid, rank=0, world_size=3)
    assert [i for i, _ in vpairs] == [0, 3]        # 4 samples padded to 6 from the start, every third
    assert vpairs[0][1] == records.seed_from_string(valid[0].pdb_chain_id)


def test_the_structure_follows_the_sequence(ds):
    entries, _ = synthetic.plan(N_TRAIN, N_VALID, SEED, **LENGTHS)
    chain = entries[0].chains[0]
    ideal, _ = synthetic.backbone(chain.sequence)
    ok = chain.mask[:, 1]
    ca, ica = chain.positions[ok, 1], ideal[ok, 1]
    got = np.linalg.norm(ca[:, None] - ca[None], axis=-1)
    want = np.linalg.norm(ica[:, None] - ica[None], axis=-1)
    assert np.abs(got - want).max() < 0.2        # the same fold, placed and with noise
    steps = np.linalg.norm(np.diff(ideal[:, 1], axis=0), axis=1)
    assert np.allclose(steps, 3.80, atol=0.1)     # CA-CA
    assert np.allclose(np.linalg.norm(ideal[:, 1] - ideal[:, 0], axis=1), synthetic.N_CA)
    helix = synthetic.backbone("AELMQKRAELMQKR")[0][:, 1]
    strand = synthetic.backbone("VIYFWTCVIYFWTC")[0][:, 1]
    assert synthetic.secondary_structure("AELMQKRAELMQKR") == "H" * 14
    assert synthetic.secondary_structure("VIYFWTCVIYFWTC") == "E" * 14
    assert np.linalg.norm(helix[7] - helix[3]) < 7.0 < np.linalg.norm(strand[7] - strand[3])
    assert synthetic.secondary_structure("AELGGGGVIYF") == "CCCCCCCEEEE"


def test_the_pickles_name_no_global_and_the_set_is_deterministic(ds, tmp_path):
    root, _ = ds
    for f in (root / records.PDB_MMCIF_DIR / records.DICTS_DIR).iterdir():
        ops = {op.name for op, _, _ in pickletools.genops(f.read_bytes())}
        assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "NEWOBJ", "INST", "OBJ"}, (f, ops)
    again, other = tmp_path / "again", tmp_path / "other"
    make(again)
    make(other, seed=SEED + 1)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    assert all((root / n).read_bytes() == (again / n).read_bytes() for n in names)
    assert (root / "pdb_mmcif/processed/chains.csv").read_bytes() != \
        (other / "pdb_mmcif/processed/chains.csv").read_bytes()


def test_sabotage_breaks_the_sequence_structure_rule(tmp_path):
    entries, _ = synthetic.plan(N_TRAIN, N_VALID, SEED, **LENGTHS, shuffle_labels=True)
    straight, _ = synthetic.plan(N_TRAIN, N_VALID, SEED, **LENGTHS)
    a, b = entries[0].chains[0], straight[0].chains[0]
    assert a.sequence == b.sequence and a.mask[:, 1].any()
    assert not np.allclose(a.positions[:, 1], b.positions[:, 1])
    assert np.array_equal(entries[-1].chains[-1].positions, straight[-1].chains[-1].positions)   # validation kept


def test_segments_set_the_root_sequences(ds, tmp_path):
    """data.synthetic.segments: the classes it names replace SEGMENTS' (weights normalised); the
    defaults named, the same data set as none given (the one written before the key existed)."""
    assert synthetic.parse_segments(None) == synthetic.SEGMENTS
    strands = synthetic.parse_segments({"helix": [0, 5, 8], "coil": [0, 2, 4]})
    assert strands == {"H": (0.0, 5, 8), "E": (1.0, 4, 8), "C": (0.0, 2, 4)}
    seq = synthetic.root_sequence(np.random.default_rng(0), 60, strands)
    assert sum(synthetic.CLASS_OF[a] == "E" for a in seq) > 45
    manifest = make(tmp_path / "a", segments={"strand": [0.3, 4, 8]})     # the default, named
    assert manifest["structure"]["segments"]["strand"] == [0.3, 4, 8]
    names = sorted(str(p.relative_to(ds[0])) for p in ds[0].rglob("*") if p.is_file())
    assert all((ds[0] / n).read_bytes() == (tmp_path / "a" / n).read_bytes() for n in names if n != "manifest.json")
    for bad in ({"turn": [1, 2, 3]}, {"helix": [1, 5, 4]}, {"helix": [1, 0, 4]}, {"coil": [-1, 2, 4]},
                {"helix": [0, 5, 8], "strand": [0, 4, 8], "coil": [0, 2, 4]}, [1, 2, 3]):
        with pytest.raises(KitError) as e:
            synthetic.parse_segments(bad)
        one_line(e, "segments")


def test_datagen_refuses_a_filled_directory_and_writes_nothing_there(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "theirs.txt").write_text("not the kit's")
    with pytest.raises(KitError) as e:
        make(out)
    one_line(e, out, "not empty")
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]     # no staging directory left


def test_datagen_command(tmp_path, capsys):
    args = argparse.Namespace(out=str(tmp_path / "a" / "d"), config=None, train=3, valid=2, seed=1,
                              format="tfrecord", size=None, height=None, width=None, shuffle_labels=False)
    assert synthetic.datagen_command(args) == 0
    assert "3 training + 2 validation chains" in capsys.readouterr().out
    layout = records.Layout.under(args.out)
    chains = records.read_chains(layout.chains)
    assert len(records.training_chains(chains, records.AlignmentIndex(layout.alignments))) == 3
    with pytest.raises(KitError) as e:
        synthetic.datagen_command(argparse.Namespace(**{**vars(args), "out": str(tmp_path / "b"), "valid": None}))
    one_line(e, "--train and --valid")
    with pytest.raises(KitError) as e:
        synthetic.datagen_command(argparse.Namespace(**{**vars(args), "out": str(tmp_path / "c"), "valid": 184}))
    one_line(e, "--valid 184", "183")


# ----------------------------------------------------------------- the readers, by hand

def test_a_chains_csv_row_as_the_reference_writes_it(tmp_path):
    path = tmp_path / "chains.csv"
    path.write_text("pdb_chain_id,pdb_id,author_chain_id,mmcif_chain_ids,release_date,resolution,pdb_cluster_id,"
                    "sequence_length,sequence\n"
                    "101m_A,101m,A,A;C;D,1998-04-08,2.07,1234,10,MVLSEGEWQL\n"
                    "1abc_NA,1abc,NA,B,2021-09-18,,-1,5,MKVXA\n")
    a, b = records.read_chains(path)
    assert a == records.Chain("101m_A", "101m", "A", "A;C;D", "1998-04-08", 2.07, 1234, 10, "MVLSEGEWQL")
    assert (b.author_chain_id, b.pdb_cluster_id, b.sequence) == ("NA", -1, "MKVXA")   # "NA" is a chain, not missing
    assert math.isnan(b.resolution)
    assert a.csv_row() == "101m_A,101m,A,A;C;D,1998-04-08,2.07,1234,10,MVLSEGEWQL".split(",")
    assert b.csv_row()[5] == ""


def test_selection_by_hand():
    def chain(cid, mmcif, date="2000-01-01", res=2.0, cluster=1, seq="ACDEFGHIKL"):
        pdb, author = cid.split("_")
        return records.Chain(cid, pdb, author, mmcif, date, res, cluster, len(seq), seq)
    chains = [chain("1aaa_A", "A"), chain("1bbb_A", "A", cluster=2, seq="ACDEFGHIKL" * 30),
              chain("1ccc_A", "A", res=9.0), chain("1ddd_A", "A", res=float("nan")), chain("1eee_A", "A", cluster=-1),
              chain("1fff_A", "A", seq="QQQQQQQQQA"), chain("1ggg_A", "A", date="2021-09-17"), chain("1hhh_B", "B", cluster=2),
              chain("7bgg_B", "A;C"), chain("7s13_X", "C"), chain("7s13_L", "L", seq="A" * 701), chain("7dxs_C", "D")]
    train = records.with_cluster_sizes(records.filter_for_training(chains, max_release_date="2021-09-16"))
    assert [c.pdb_chain_id for c in train] == ["1aaa_A", "1bbb_A", "1ddd_A", "1hhh_B", "7bgg_B", "7s13_X", "7dxs_C"]
    sizes = {c.pdb_chain_id: c.pdb_cluster_size for c in train}
    assert sizes["1bbb_A"] == 2 and sizes["1aaa_A"] == 5
    weights = dict(zip(sizes, records.sampler_weights(train)))
    assert weights["1bbb_A"] == pytest.approx(300 / 512 / math.sqrt(2))
    assert weights["1aaa_A"] == pytest.approx(0.5 / math.sqrt(5))
    assert records.sampling_weight(dataclasses.replace(chains[0], pdb_cluster_size=0, sequence_length=600)) == 1.0
    # CAMEO: "7bgg [A]" by its mmCIF chain A (author B); "7s13 [C]" by mmCIF C, "7s13 [L]" too long;
    # "7dxs [C]" by the author chain (no mmCIF chain C of 7dxs)
    valid = records.select_cameo_targets(chains, "2021-09-17", "2021-12-11")
    assert [(c.pdb_chain_id, c.cameo_target_id) for c in valid] == [("7bgg_B", "7bgg [A]"), ("7s13_X", "7s13 [C]"),
                                                                    ("7dxs_C", "7dxs [C]")]
    assert records.select_cameo_targets(chains, "2021-09-17", "2021-09-18") == valid[:1]
    assert records.parse_cameo_target("7BGG [A]") == "7bgg_A"
    with pytest.raises(KitError) as e:
        records.pdb_chain_ids_mapping([chain("1aaa_A", "A"), chain("1aaa_B", "A")], "x/chains.csv")
    one_line(e, "x/chains.csv", "1aaa_A")


def test_an_index_entry_and_its_shard_by_hand(tmp_path):
    a3m = ">101m_A\nAC-E\n>hit\nAcgC-E\n"
    hhr = HHR
    shard = (a3m + hhr).encode()
    (tmp_path / "3.db").write_bytes(b"xx" + shard)
    (tmp_path / "super.index").write_text(json.dumps({
        "101m_A": {"db": "3.db", "files": [["uniref90_hits.a3m", 2, len(a3m)], ["pdb70_hits.hhr", 2 + len(a3m), len(hhr)]]},
        "101m_B": {"db": "3.db", "files": [["uniref90_hits.a3m", 2, len(a3m)], ["pdb70_hits.hhr", 2 + len(a3m), len(hhr)]]}}))
    index = records.AlignmentIndex(tmp_path)
    assert len(index) == 2 and "101m_B" in index
    texts = index.load("101m_A")
    assert texts == {"uniref90_hits.a3m": a3m, "pdb70_hits.hhr": hhr} == index.load("101m_B")
    assert records.parse_a3m(texts["uniref90_hits.a3m"], "x") == (["AC-E", "AC-E"], [[0, 0, 0, 0], [0, 2, 0, 0]])
    [hit] = records.parse_hhr(texts["pdb70_hits.hhr"], "x")
    assert (hit.index, hit.name, hit.aligned_cols, hit.sum_probs) == (1, "1abc_A mol:protein length:9  XYZ", 8, 7.5)
    assert (hit.query, hit.hit_sequence) == ("MKV-LAEGQR", "MKVALA--QR")
    assert hit.indices_query == [2, 3, 4, -1, 5, 6, 7, 8, 9, 10]
    assert hit.indices_hit == [0, 1, 2, 3, 4, 5, -1, -1, 6, 7]


HHR = """Query         101m_A
Match_columns 11

 No Hit                             Prob E-value P-value  Score    SS Cols Query HMM  Template HMM
  1 1abc_A mol:protein length:9  X  99.0 1.2E-10 3.4E-14   50.0   0.0    8    3-11     1-8 (9)

No 1
>1abc_A mol:protein length:9  XYZ
Probab=99.00  E-value=1.2e-10  Score=50.00  Aligned_cols=8  Identities=75%  Similarity=0.9  Sum_probs=7.5  Template_Neff=1.0

Q 101m_A            3 MKV-LAE   8 (11)
Q Consensus         3 mkv-lae   8 (11)
                      |||
T Consensus         1 mkvala   6 (9)
T 1abc_A            1 MKVALA-   6 (9)

Q 101m_A            9 GQR   11 (11)
T 1abc_A            7 -QR   8 (9)

Done!
"""


def test_obsolete_dat_by_hand(tmp_path):
    path = tmp_path / "obsolete.dat"
    path.write_text(" LIST OF OBSOLETE COORDINATE ENTRIES AND SUCCESSORS\n"
                    "OBSLTE    31-JUL-94 116L     216L\n"
                    "OBSLTE    30-SEP-08 2G8V     3DTU 3DTV\n"
                    "OBSLTE    29-FEB-08 1CMW\n")
    assert records.read_obsolete(path) == {"116l": "216l", "2g8v": "3dtu"}


def reference_entry(pdb_id="1abc", seq="MKV", positions=None):
    """An mmcif_dict as mmcif.py:196-206 makes it and compress_mmcif_dict_atoms (:210-230) packs it."""
    pos = np.arange(len(seq) * 37 * 3, dtype=np.float32).reshape(len(seq), 37, 3) if positions is None else positions
    mask = np.zeros((len(seq), 37), dtype=bool)
    mask[:, :3] = True
    return {"pdb_id": pdb_id, "exptl_method": "X-RAY DIFFRACTION", "release_date": "1999-01-02", "resolution": 1.5,
            "author_chain_ids": ["A"], "entity_id_to_mmcif_chain_ids": {"1": ["A"], "2": ["B"]},
            "mmcif_chain_id_to_author_chain_id": {"A": "A", "B": "A"}, "sequences": {"A": seq},
            "atoms": {"A": {"all_atom_positions": (zlib.compress(pos.tobytes()), pos.shape),
                            "all_atom_mask": (zlib.compress(mask.tobytes()), mask.shape)}}}


def test_an_mmcif_dicts_pickle_by_hand(tmp_path):
    (tmp_path / "ab").write_bytes(pickle.dumps({"1abc": reference_entry()}))   # the reference: pickle.dump, default protocol
    d = records.load_mmcif_dict(tmp_path, "1abc")
    assert d["sequences"] == {"A": "MKV"} and d["resolution"] == 1.5
    assert np.array_equal(d["atoms"]["A"]["all_atom_positions"], np.arange(333, dtype=np.float32).reshape(3, 37, 3))
    assert d["atoms"]["A"]["all_atom_mask"].sum() == 9 and d["atoms"]["A"]["all_atom_mask"].dtype == bool
    assert records.dicts_file(tmp_path, "1abc") == tmp_path / "ab"


# ----------------------------------------------------------------- bad input: one line, the file named

def test_a_pickle_that_names_a_global_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    dicts = tmp_path / "dicts"
    dicts.mkdir()
    # GLOBAL os.system called with a command: what plain pickle.load would run
    (dicts / "ab").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    with pytest.raises(KitError) as e:
        records.load_mmcif_dict(dicts, "1abc")
    one_line(e, dicts / "ab", "os.system", "refused")

    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    (dicts / "ab").write_bytes(pickle.dumps({"1abc": {"pdb_id": Runs()}}, protocol=4))   # STACK_GLOBAL
    with pytest.raises(KitError) as e:
        records.load_mmcif_dict(dicts, "1abc")
    one_line(e, dicts / "ab", ".system", "refused")
    (dicts / "ab").write_bytes(pickle.dumps({"1abc": np.zeros(3)}))    # a numpy array: not what the dicts hold
    with pytest.raises(KitError) as e:
        records.load_mmcif_dict(dicts, "1abc")
    one_line(e, dicts / "ab", "_reconstruct")
    assert not marker.exists()


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:len(b) // 2], "not a pickle"),
    (lambda b: b"", "not a pickle"),
    (lambda b: pickle.dumps(["1abc"]), "holds a list"),
    (lambda b: pickle.dumps({"1xyz": reference_entry("1xyz")}), "key '1abc': no such entry"),
    (lambda b: pickle.dumps({"1abc": {**reference_entry(), "sequences": {"A": "MKVL"}}}), "shape"),
    (lambda b: pickle.dumps({"1abc": {**reference_entry(), "atoms": {"A": {
        "all_atom_positions": (zlib.compress(b"\0" * 10 ** 6), (3, 37, 3)),
        "all_atom_mask": (zlib.compress(b"\1" * 111), (3, 37))}}}}), "more than"),
    (lambda b: pickle.dumps({"1abc": reference_entry(positions=np.full((3, 37, 3), np.nan, np.float32))}),
     "non-finite"),
    (lambda b: pickle.dumps({"1abc": {**reference_entry(), "release_date": "yesterday"}}), "release_date"),
])
def test_a_damaged_dicts_file_is_one_line_naming_it(tmp_path, damage, words):
    (tmp_path / "ab").write_bytes(damage(pickle.dumps({"1abc": reference_entry()})))
    with pytest.raises(KitError) as e:
        records.load_mmcif_dict(tmp_path, "1abc")
    one_line(e, tmp_path / "ab", words)


def test_a_missing_file_is_one_line_naming_it(data_copy):
    layout = records.Layout.under(data_copy)
    chain = records.read_chains(layout.chains)[0]
    records.dicts_file(layout.dicts, chain.pdb_id).unlink()
    with pytest.raises(KitError) as e:
        records.load_mmcif_dict(layout.dicts, chain.pdb_id)
    one_line(e, records.dicts_file(layout.dicts, chain.pdb_id), "No such file")
    for path, read in ((layout.chains, records.read_chains), (layout.obsolete, records.read_obsolete),
                       (layout.alignments / records.SUPER_INDEX, lambda p: records.AlignmentIndex(p.parent))):
        path.unlink()
        with pytest.raises(KitError) as e:
            read(path)
        one_line(e, path)
    with pytest.raises(KitError) as e:
        records.dicts_file(layout.dicts, "../x")
    one_line(e, "not a PDB id")


def _index(root: Path) -> tuple[Path, dict]:
    path = records.Layout.under(root).alignments / records.SUPER_INDEX
    return path, json.loads(path.read_text())


def _key_in_shard(index: dict, db: str) -> str:
    return next(k for k, v in index.items() if v["db"] == db)


def test_a_truncated_shard_is_one_line_naming_it(data_copy):
    path, index = _index(data_copy)
    shard = path.parent / "0.db"
    key = max((k for k, v in index.items() if v["db"] == "0.db"), key=lambda k: index[k]["files"][-1][1])
    os.truncate(shard, index[key]["files"][-1][1] + 1)
    alignments = records.AlignmentIndex(path.parent)
    with pytest.raises(KitError) as e:
        alignments.load(key)
    one_line(e, shard, path, key, "truncated shard")
    with pytest.raises(KitError) as e:
        alignments.check_all()
    one_line(e, shard)


def test_an_index_range_past_the_end_is_one_line_naming_the_index_and_key(data_copy):
    path, index = _index(data_copy)
    key = _key_in_shard(index, "1.db")
    size = (path.parent / "1.db").stat().st_size
    index[key]["files"][1][1] = size - 3
    path.write_text(json.dumps(index))
    with pytest.raises(KitError) as e:
        records.AlignmentIndex(path.parent).load(key)
    one_line(e, path, f"key '{key}'", f"{size} bytes")


@pytest.mark.parametrize("db, words", [
    ("../../../pdb_mmcif/processed/chains.csv", "out of"),
    ("sub/../../x.db", "out of"),
    ("/etc/passwd", "out of"),
    ("", "not a shard file name"),
    (7, "not a shard file name"),
    ("escape.db", "symbolic link"),
])
def test_an_index_path_out_of_its_directory_is_refused(data_copy, db, words):
    path, index = _index(data_copy)
    (path.parent / "escape.db").symlink_to(data_copy / "pdb_mmcif/processed/chains.csv")
    key = next(iter(index))
    index[key]["db"] = db
    path.write_text(json.dumps(index))
    with pytest.raises(KitError) as e:
        records.AlignmentIndex(path.parent).load(key)
    one_line(e, path, f"key '{key}'", words)


@pytest.mark.parametrize("entry, words", [
    ([], "not an entry"),
    ({"db": "0.db"}, "not an entry"),
    ({"db": "0.db", "files": [["a.a3m", -1, 3]]}, "files[0]"),
    ({"db": "0.db", "files": [["a.a3m", 0, "3"]]}, "files[0]"),
    ({"db": "0.db", "files": [["a.a3m", 0, 1], ["a.a3m", 1, 1]]}, "again"),
])
def test_a_malformed_index_entry_is_one_line(data_copy, entry, words):
    path, index = _index(data_copy)
    key = next(iter(index))
    index[key] = entry
    path.write_text(json.dumps(index))
    with pytest.raises(KitError) as e:
        records.AlignmentIndex(path.parent).load(key)
    one_line(e, path, key, words)


@pytest.mark.parametrize("text", ['{"1abc_A": {"db": "0.db"', "", "[1, 2]", "\xff"])
def test_a_broken_super_index_is_one_line_naming_it(data_copy, text):
    path, _ = _index(data_copy)
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(KitError) as e:
        records.AlignmentIndex(path.parent)
    one_line(e, path)


def _set(i, value):
    def edit(row):
        cells = row.split(",")
        cells[i] = value
        return ",".join(cells)
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set(7, "99"), "line 2: column sequence_length"),
    (_set(5, "high"), "line 2: column resolution"),
    (_set(5, "nan"), "line 2: column resolution"),
    (_set(6, "1.5"), "line 2: column pdb_cluster_id"),
    (_set(4, "2021-02-30"), "line 2: column release_date"),
    (_set(1, "../x"), "line 2: column pdb_id"),
    (_set(0, "1abc_B"), "line 2: column pdb_chain_id"),
    (_set(8, "mkv"), "line 2: column sequence"),
    (lambda row: row + ",extra", "line 2: 10 fields"),
    (lambda row: '"' + row, "not CSV"),
])
def test_a_bad_chains_csv_row_is_one_line_naming_file_and_line(data_copy, edit, words):
    path = records.Layout.under(data_copy).chains
    header, first, *rest = path.read_text().splitlines()
    path.write_text("\n".join([header, edit(first), *rest]) + "\n")
    with pytest.raises(KitError) as e:
        records.read_chains(path)
    one_line(e, path, words)


def test_a_chains_csv_without_a_column_or_with_a_repeated_chain(data_copy):
    path = records.Layout.under(data_copy).chains
    header, first, *rest = path.read_text().splitlines()
    path.write_text("\n".join([header.replace("resolution", "res"), first, *rest]) + "\n")
    with pytest.raises(KitError) as e:
        records.read_chains(path)
    one_line(e, path, "line 1", "resolution")
    path.write_text("\n".join([header, first, *rest, first]) + "\n")
    with pytest.raises(KitError) as e:
        records.read_chains(path)
    one_line(e, path, "again", "line 2")


def test_bad_alignment_text_is_one_line_naming_where(tmp_path):
    for text, words in ((">q\nACD\n>h\nAC\n", "2 aligned columns"), (">q\nAC1\n", "'1'"), ("ACD\n", "before the first"),
                        ("", "no sequence")):
        with pytest.raises(KitError) as e:
            records.parse_a3m(text, "0.db (x)")
        one_line(e, "0.db (x)", words)
    for text in (HHR.replace("Probab=", "Prob="), HHR.replace("MKV-LAE   8", "MKV-LAE   9"),
                 HHR.replace("Q 101m_A            3", "Q 101m_A            x"), "No 1\n>x\n",
                 HHR.replace("T 1abc_A            1 MKVALA-", "T 1abc_A            1 MKVALA")):
        with pytest.raises(KitError) as e:
            records.parse_hhr(text, "0.db (y)")
        one_line(e, "0.db (y)")


def test_a_missing_alignment_entry_is_one_line(data_copy):
    layout = records.Layout.under(data_copy)
    chains = records.read_chains(layout.chains)
    path, index = _index(data_copy)
    train = records.training_chains(chains, records.AlignmentIndex(path.parent))
    del index[train[0].pdb_chain_id]
    path.write_text(json.dumps(index))
    alignments = records.AlignmentIndex(path.parent)
    with pytest.raises(KitError) as e:
        records.training_chains(chains, alignments)
    one_line(e, path, train[0].pdb_chain_id, "1 of the chains")
    assert len(records.training_chains(chains, alignments, filter_by_alignments=True)) == N_TRAIN - 1
