"""OpenFold raw features, quick: the mmCIF, MSA and template features of synthetic samples as the
reference's features.py and templates.py make them, the template prefilter rule by rule, and a
badly named hit as one line."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from hpckit.common.errors import KitError
from hpckit.openfold import features, records, synthetic


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("openfold-features") / "data"
    synthetic.write_dataset(root, 16, 3, seed=11, crop=8, msa_depth=5, min_length=12, max_length=20)
    layout = records.Layout.under(root)
    chains = records.read_chains(layout.chains)
    index = records.AlignmentIndex(layout.alignments)
    return layout, chains, index, features.TemplateSource.of(chains, layout)


def test_raw_features_of_every_sample(ds):
    layout, chains, index, source = ds
    templates = 0
    for n, chain in enumerate(chains):
        sample = records.read_sample(chain, layout, index)
        f = features.raw_features(sample, source, seed=n)
        L = chain.sequence_length
        assert f["aatype"].shape == (L, 21) and f["aatype"].dtype == np.int32
        assert "".join((features.RESTYPES + "X")[i] for i in f["aatype"].argmax(1)) == chain.sequence
        assert f["domain_name"][0] == (chain.pdb_id + chain.author_chain_id).encode()
        assert f["sequence"][0] == chain.sequence.encode() and f["release_date"][0] == chain.release_date.encode()
        assert (f["residue_index"] == np.arange(L)).all() and (f["seq_length"] == L).all()
        atoms = sample.mmcif_dict["atoms"][chain.author_chain_id]
        assert np.array_equal(f["all_atom_positions"], atoms["all_atom_positions"])
        assert np.array_equal(f["all_atom_mask"], atoms["all_atom_mask"].astype(np.float32))
        assert f["msa"].dtype == np.int32 and f["msa"].shape == f["deletion_matrix_int"].shape
        assert [records.HHBLITS_AA_TO_ID[c] for c in chain.sequence] == f["msa"][0].tolist()
        assert len({tuple(row) for row in f["msa"].tolist()}) == len(f["msa"])       # duplicates dropped
        assert (f["num_alignments"] == len(f["msa"])).all() and len(f["num_alignments"]) == L
        T = len(f["template_domain_names"])
        assert f["template_aatype"].shape[:2] == (T, L) and f["template_all_atom_positions"].shape == (T, L, 37, 3)
        assert f["template_sum_probs"].shape == (T, 1) and T <= features.MAX_TEMPLATES
        for t, name in enumerate(f["template_domain_names"]):
            pdb_id, author = name.split("_")
            assert pdb_id != chain.pdb_id and source.pdb_release_dates[pdb_id] <= \
                datetime.datetime.strptime(chain.release_date, "%Y-%m-%d") - datetime.timedelta(days=60)
            template = records.load_mmcif_dict(layout.dicts, pdb_id)
            seq = template["sequences"][author]
            assert f["template_sequence"][t] == seq          # aligned residue for residue
            assert f["template_aatype"][t].argmax(1).tolist() == [records.HHBLITS_AA_TO_ID[c] for c in seq]
            pos, mask = template["atoms"][author]["all_atom_positions"], template["atoms"][author]["all_atom_mask"]
            assert np.allclose(f["template_all_atom_positions"][t], np.where(mask[..., None], pos - pos[mask].mean(0), 0),
                               atol=1e-4)
            assert abs(f["template_all_atom_positions"][t][mask].mean(0)).max() < 1e-3      # zero-centred
        templates += T
    assert templates > 0


def test_the_template_shuffle_follows_the_seed(ds):
    layout, chains, index, source = ds
    chain = next(c for c in chains if len(records.read_sample(c, layout, index).template_hits) >= 2)
    hits = records.read_sample(chain, layout, index).template_hits
    source.shuffle_top_k_prefiltered = None
    by_probs = features.create_template_features(chain.sequence, hits, "2999-01-01", chain.pdb_id, 0, source)
    best = max(hits, key=lambda h: h.sum_probs).name.split("_")[0].lower()
    best = best if best in source.pdb_release_dates else source.obsolete[best]
    assert by_probs["template_domain_names"][0].startswith(best + "_")
    source.shuffle_top_k_prefiltered = 20
    orders = {tuple(features.create_template_features(chain.sequence, hits, "2999-01-01", chain.pdb_id, s,
                                                      source)["template_domain_names"]) for s in range(12)}
    again = features.create_template_features(chain.sequence, hits, "2999-01-01", chain.pdb_id, 3, source)
    assert tuple(again["template_domain_names"]) in orders and len(orders) > 1


def hit(name="1abc_A", query="ACDEFGHIKLMN", template="ACDEFGHIKLMV", cols=None, probs=10.0):
    return records.TemplateHit(1, f"{name} some protein", len(query) if cols is None else cols, probs, query,
                               template, list(range(len(query))), list(range(len(template))))


def test_the_prefilter_rule_by_rule(tmp_path):
    dates = {"1abc": datetime.datetime(2000, 1, 1), "2new": datetime.datetime(2021, 1, 1),
             "3qry": datetime.datetime(1999, 1, 1)}
    source = features.TemplateSource(tmp_path, {"1abc_A", "2new_A", "3qry_A"}, dates, {"9old": "1abc"})
    max_date = datetime.datetime(2020, 1, 1)
    query = "ACDEFGHIKLMN"

    def why(h, query_pdb="4qqq"):
        return features.hit_rejection(h, query, query_pdb, max_date, source, "x.hhr")
    assert why(hit()) is None
    assert why(hit("9old_A")) is None                                  # obsolete: its successor's
    assert why(hit("1abc_B")) == "not in template_pdb_chain_ids"
    assert why(hit("3qry_A"), "3QRY") == "template == query"
    assert why(hit("2new_A")) == "template_release_date > max_template_date"
    assert why(hit(cols=1)) == "align_ratio <= min_align_ratio"
    assert why(hit(template=query)) == "is_duplicate"
    assert why(hit(query="ACDEFGHIK", template="ACDEFGHIK"[:-1] + "V")) == "template too short"
    with pytest.raises(KitError) as e:
        why(hit("not-a-pdb-id"))
    assert "\n" not in str(e.value) and "x.hhr" in str(e.value) and "PDBID_chain" in str(e.value)


def test_query_to_hit_mapping_and_chain_search():
    h = records.TemplateHit(1, "1abc_A", 3, 1.0, "CD-F", "CDEF", [2, 3, -1, 4], [5, 6, 7, 8])
    assert features.query_to_hit_mapping("ABCDFG", h) == {2: 0, 3: 1, 4: 3}
    mmcif = {"sequences": {"A": "MMMM", "B": "XXCDEFXX", "C": "QQACDEF"}}
    assert features.find_template_chain("C", "CDEF", mmcif) == ("QQACDEF", "C", 3)
    assert features.find_template_chain("A", "CDEF", mmcif) == ("XXCDEFXX", "B", 2)
    assert features.find_template_chain("A", "WCDE", {"sequences": {"A": "MXCDE"}}) == ("MXCDE", "A", 1)
    assert features.find_template_chain("A", "WWWW", mmcif) is None


def test_msa_and_empty_template_features():
    f = features.create_msa_features("ACD", [(["ACD", "AC-"], [[0, 0, 0], [0, 1, 0]]), (["ACD", "GCD"], [[0] * 3] * 2)])
    assert f["msa"].tolist() == [[0, 1, 2], [0, 1, 21], [5, 1, 2]]
    assert f["deletion_matrix_int"].tolist() == [[0, 0, 0], [0, 1, 0], [0, 0, 0]]
    assert f["num_alignments"].tolist() == [3, 3, 3]
    alone = features.create_msa_features("ACD", [])
    assert alone["msa"].tolist() == [[0, 1, 2]] and alone["deletion_matrix_int"].tolist() == [[0, 0, 0]]
    empty = features.create_template_features("ACDE", [], "2000-01-01", "1abc", 0, None)
    assert empty["template_aatype"].shape == (0, 4) and empty["template_all_atom_positions"].shape == (0, 4, 37, 3)
    assert empty["template_domain_names"] == [] and empty["template_sum_probs"].shape == (0, 1)
