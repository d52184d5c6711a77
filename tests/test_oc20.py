"""OC20 (DimeNet++) pieces, quick: the model against the reference's arithmetic, the graph
against brute force, the bases against the sympy/scipy forms the reference lambdifies, the
synthetic forces against finite differences, the records in the reference's pickle layout,
and bad records as one line naming the file and key."""

from __future__ import annotations

import itertools
import math
import pickle
import pickletools

import numpy as np
import pytest
import torch

from conftest import NO_ALLOCATOR_RESTART, run_hpckit
from hpckit.common.config import load_config
from hpckit.common.errors import KitError
from hpckit.oc20 import data, model, records, synthetic
from hpckit.oc20.train import lr_factor, validate_config

REFERENCE_PARAMETERS = 1_810_182   # the reference's DimeNetPlusPlusWrap at mlperf_hpc.yml's settings


def test_describe_prints_the_reference_parameter_count():
    proc = run_hpckit("describe", "oc20", "--config", "reference", check=True)
    assert proc.stdout.strip().splitlines()[-1] == f"parameters: {REFERENCE_PARAMETERS}"
    assert "interaction_blocks.2" in proc.stdout and "output_blocks.3" in proc.stdout


def test_parameter_count_by_the_reference_arithmetic():
    """PyG's DimeNetPlusPlus at these settings has 1,809,414; the reference's output blocks
    add a bias to lin_up (dimenet_plus_plus.py:178): 4 x 192 more."""
    cfg = load_config("oc20", "reference")
    assert model.parameter_count(cfg) == REFERENCE_PARAMETERS == 1_809_414 + 4 * 192
    names = dict(model.build_model(cfg).named_parameters())
    assert names["output_blocks.0.lin_up.bias"].shape == (192,)
    assert "interaction_blocks.0.lin_up.bias" not in names


def brute_triplets(edge_index, cell_offsets):
    row, col = edge_index.tolist()
    out = set()
    for ji in range(len(row)):
        for kj in range(len(row)):
            if col[kj] != row[ji]:
                continue
            i, j, k = col[ji], row[ji], row[kj]
            if i == k and not any(cell_offsets[kj] + cell_offsets[ji]):
                continue
            out.add((i, j, k, kj, ji))
    return out


def test_triplets_and_radius_graph_against_brute_force():
    rng = np.random.default_rng(3)
    cell = np.diag([3.1, 3.4, 9.0]) + np.array([[0, 0, 0], [0.8, 0, 0], [0, 0, 0]])
    pos = rng.random((5, 3)) @ cell
    e, off, dist = model.radius_graph_pbc(pos, cell, 3.5, 7)
    # brute force over a generous image range: every pair within 3.5 A, the 7 nearest per centre
    pairs = []
    for i, j in itertools.product(range(5), range(5)):
        for n in itertools.product(range(-3, 4), repeat=3):
            d = np.linalg.norm(pos[j] + np.array(n) @ cell - pos[i])
            if 1e-8 <= d <= 3.5:
                pairs.append((i, d))
    for i in range(5):
        mine = np.sort(dist[e[1] == i])
        want = np.sort([d for c, d in pairs if c == i])[:7]
        np.testing.assert_allclose(mine, want, rtol=1e-12)
    assert np.all(np.diff(e[1]) >= 0)                       # grouped by centre, as the reference stores them
    for i in range(5):
        assert np.all(np.diff(dist[e[1] == i]) >= 0)        # nearest first
    ei, co = torch.from_numpy(e), torch.from_numpy(off)
    got = set(zip(*(t.tolist() for t in model.triplets(ei, co, 5))))
    assert got == brute_triplets(ei, co) and len(got) > 50


def test_bases_match_the_sympy_forms_the_reference_lambdifies():
    """The Bessel zeros, normalisers and spherical harmonics of PyG's dimenet_utils (sympy,
    scipy), evaluated in float64, against the kit's sympy-free layer."""
    sp = pytest.importorskip("scipy.special")
    brentq = pytest.importorskip("scipy.optimize").brentq
    n, k, cutoff = 4, 5, 5.0

    def jn(r, order):
        return np.sqrt(np.pi / (2 * r)) * sp.jv(order + 0.5, r)

    zeros = np.zeros((n, k), dtype="float32")
    zeros[0] = np.arange(1, k + 1) * np.pi
    points = np.arange(1, k + n) * np.pi
    roots = np.zeros(k + n - 1, dtype="float32")
    for i in range(1, n):
        for j in range(k + n - 1 - i):
            roots[j] = brentq(jn, points[j], points[j + 1], (i,))
        points = roots
        zeros[i][:k] = roots[:k]
    np.testing.assert_array_equal(model.bessel_zeros(n, k), zeros)

    layer = model.SphericalBasis(n, k, cutoff, 5).double()
    dist = torch.tensor([0.9, 1.7, 2.5, 4.2], dtype=torch.float64)
    idx_kj = torch.tensor([0, 1, 2, 3, 3, 0])                  # per triplet: its k -> j edge
    angle = torch.tensor([0.3, 1.2, 2.0, 3.0, 0.01, 1.6], dtype=torch.float64)
    got = layer(dist, angle, idx_kj)
    d = dist.numpy()[idx_kj.numpy()] / cutoff
    env = model.Envelope(5)(torch.from_numpy(d)).numpy()
    want = np.zeros((6, n * k))
    for l in range(n):
        legendre = sp.eval_legendre(l, np.cos(angle.numpy())) * math.sqrt((2 * l + 1) / (4 * math.pi))
        for m in range(k):
            norm = 1 / math.sqrt(0.5 * jn(float(zeros[l, m]), l + 1) ** 2)
            want[:, l * k + m] = env * norm * jn(float(zeros[l, m]) * d, l) * legendre
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)


def test_forces_are_minus_dE_dpos_through_the_distances_only():
    """-dE/dpos by autograd (the reference's forward); the angles see detached positions,
    so the forces equal the gradient of the energy with the angles held fixed; the energy
    does not change when the whole structure moves."""
    cfg = load_config("oc20", "mini")
    torch.manual_seed(0)
    net = model.build_model(cfg).double()
    for p in net.parameters():          # the output layers start at zero (upstream): give them weights
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    s = synthetic.make_structure(synthetic.Shape.of(cfg), np.random.default_rng(1))
    batch = data.collate([synthetic.to_fields(s, 0, 0)])
    batch = {k: (v.double() if v.is_floating_point() else v) for k, v in batch.items()}
    net.eval()
    energy, forces = net(batch)
    pos = batch["pos"].clone().requires_grad_(True)
    e2 = net.energy(batch, pos)
    grad, = torch.autograd.grad(e2.sum(), pos)
    torch.testing.assert_close(forces, -grad)
    assert forces.abs().max() > 0
    moved = {**batch, "pos": batch["pos"] + torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)}
    torch.testing.assert_close(net(moved)[0], energy, rtol=1e-9, atol=1e-9)


def test_synthetic_forces_are_minus_the_potential_gradient():
    cfg = load_config("oc20", "mini")
    shape = synthetic.Shape.of(cfg)
    s = synthetic.make_structure(shape, np.random.default_rng(5))
    e0, f = synthetic.energy_forces(s["pos"], s["cell"], s["z"], shape.potential_cutoff)
    for atom, axis in ((0, 0), (len(s["z"]) - 1, 2), (3, 1)):
        step = np.zeros_like(s["pos"])
        step[atom, axis] = 1e-5
        ep = synthetic.energy_forces(s["pos"] + step, s["cell"], s["z"], shape.potential_cutoff)[0]
        em = synthetic.energy_forces(s["pos"] - step, s["cell"], s["z"], shape.potential_cutoff)[0]
        assert f[atom, axis] == pytest.approx(-(ep - em) / 2e-5, rel=1e-5, abs=1e-8)
    assert set(s["tags"]) == {0, 1, 2} and np.all(s["fixed"] == (s["tags"] == 0))


def reference_state_keys():
    return ["x", "edge_index", "edge_attr", "y", "pos", "normal", "face", "cell", "atomic_numbers", "natoms",
            "cell_offsets", "force", "fixed", "tags", "sid", "fid"]


def test_records_are_pickled_pyg1_data_and_read_back(tmp_path):
    cfg = load_config("oc20", "mini")
    fields = synthetic.to_fields(synthetic.make_structure(synthetic.Shape.of(cfg), np.random.default_rng(2)), 7, 3)
    raw = records.dumps_record(fields)
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(raw)]
    names = [arg for name, arg in ops if name == "SHORT_BINUNICODE"]
    assert names[:2] == ["torch_geometric.data.data", "Data"]           # the class PyG unpickles
    assert ("STACK_GLOBAL", None) in ops and ("NEWOBJ", None) in ops and ("BUILD", None) in ops
    state_keys = [n for n in names if n in reference_state_keys()]
    assert state_keys[:len(reference_state_keys())] == reference_state_keys()   # PyG 1.7's attribute order
    back = records.loads_record(raw)
    assert set(back) == set(records.FIELDS) and back["sid"] == 7 and back["fid"] == 3
    for key, value in fields.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(back[key], value) and back[key].dtype == value.dtype
    records.check_fields(back, "x")
    # the reference's file layout: data.0000.lmdb, keys "0".."n-1" and "length"
    import lmdb
    path = tmp_path / "data.0000.lmdb"
    assert records.write_lmdb(path, [raw, raw]) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.0000.lmdb"]
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert sorted(k for k, _ in txn.cursor()) == [b"0", b"1", b"length"]
        assert pickle.loads(txn.get(b"length")) == 2
    env.close()


def test_a_pyg2_record_reads_as_fairchem_converts_it():
    """A PyG 2.x Data pickles its fields in a GlobalStorage under `_store` (with a back
    reference to the Data, and DataEdgeAttr-style classes in newer releases): the fields are
    the store's mapping."""
    cfg = load_config("oc20", "mini")
    fields = synthetic.to_fields(synthetic.make_structure(synthetic.Shape.of(cfg), np.random.default_rng(2)), 1, 0)

    class Store:
        pass

    class Data2:
        pass

    store, obj = Store(), Data2()
    store.__dict__.update({"_mapping": dict(fields), "_parent": obj})
    obj.__dict__.update({"_store": store, "_edge_attr_cls": Store})

    class Pickler(pickle._Pickler):
        def save_global(self, o, name=None):
            where = {Store: ("torch_geometric.data.storage", "GlobalStorage"),
                     Data2: ("torch_geometric.data.data", "Data")}.get(o)
            if where is None:
                return super().save_global(o, name)
            self.save(where[0])
            self.save(where[1])
            self.write(pickle.STACK_GLOBAL)
            self.memoize(o)

    import io
    buf = io.BytesIO()
    Pickler(buf, protocol=4).dump(obj)
    back = records.check_fields(records.loads_record(buf.getvalue()), "x")
    assert torch.equal(back["force"], fields["force"]) and back["natoms"] == fields["natoms"]


def test_a_record_that_names_other_code_is_refused():
    evil = pickle.dumps({"pos": __import__("os").getcwd})     # a global that is not torch's
    with pytest.raises(Exception) as e:
        records.loads_record(evil)
    assert "posix.getcwd" in str(e.value) or "os.getcwd" in str(e.value)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("oc20") / "data"
    run_hpckit("datagen", "oc20", "--config", "mini", "--out", root, "--train", 16, "--valid", 8, "--seed", 3,
               check=True)
    return root


def bad_copy(tiny_data, tmp_path, mutate):
    """A copy of tiny_data whose validation record 2 is rewritten by mutate(fields) (or raw bytes)."""
    import shutil
    import lmdb
    root = tmp_path / "data"
    shutil.copytree(tiny_data, root)
    path = root / "validation" / "data.0000.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        raw = txn.get(b"2")
        new = mutate(raw)
        txn.put(b"2", new)
    env.close()
    for p in root.rglob("*-lock"):
        p.unlink()
    return root, path


CASES = {
    "corrupt": (lambda raw: raw[: len(raw) // 2], "not a pickled torch_geometric Data record"),
    "missing-force": (lambda raw: records.dumps_record({k: v for k, v in records.loads_record(raw).items()
                                                         if k != "force"}), "the record has no field 'force'"),
    "pos-float64": (lambda raw: records.dumps_record({**records.loads_record(raw),
                                                      "pos": records.loads_record(raw)["pos"].double()}),
                    "field 'pos' is float64, expected float32"),
    "edge-out-of-range": (lambda raw: records.dumps_record({**records.loads_record(raw), "edge_index":
                                                            records.loads_record(raw)["edge_index"] + 1000}),
                          "field 'edge_index' refers to an atom outside"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_record_is_one_line_naming_file_and_key(tiny_data, tmp_path, case):
    mutate, message = CASES[case]
    root, path = bad_copy(tiny_data, tmp_path, mutate)
    split = data.find_dataset(root, 16, 8)["validation"]
    error = data.find_bad_record(split)
    assert isinstance(error, KitError)
    assert str(error).startswith(f"{path} key '2': ") and message in str(error), str(error)


def test_a_bad_record_stops_training_with_exit_2(tiny_data, tmp_path):
    root, path = bad_copy(tiny_data, tmp_path, CASES["pos-float64"][0])
    proc = run_hpckit("train", "oc20", "--data", root, "--config", "mini", "--output-dir", tmp_path / "out",
                      "--set", "data.n_train=16", "--set", "data.n_valid=8", "--set", "train.n_epochs=1",
                      *NO_ALLOCATOR_RESTART)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"hpckit train: error: {path} key '2': field 'pos' is float64, expected float32"], lines


def test_missing_split_and_short_split_are_one_line(tiny_data, tmp_path):
    import shutil
    shutil.copytree(tiny_data / "train", tmp_path / "d" / "train")
    with pytest.raises(KitError, match=r"d/validation: missing split folder"):
        data.find_dataset(tmp_path / "d", 1, 1)
    (tmp_path / "d" / "validation").mkdir()
    with pytest.raises(KitError, match=r"d/validation: empty split folder \(no \*.lmdb files\)"):
        data.find_dataset(tmp_path / "d", 1, 1)
    with pytest.raises(KitError, match=r"holds 16 records but config key 'data.n_train' asks for 17"):
        data.find_dataset(tiny_data, 17, 8)


def test_sharded_by_record_and_staged_as_an_lmdb(tiny_data, tmp_path):
    split = data.find_dataset(tiny_data, 16, 8)["train"]
    assert len(split.files) == 2
    share = split.shard(1, 3)
    assert len(share) == 5                             # records 1, 4, 7, 10, 13 (over both files)
    nbytes = data.stage_share(share, tmp_path / "stage" / "train")
    assert nbytes == (tmp_path / "stage" / "train" / "data.0000.lmdb").stat().st_size
    local = data.staged(share, tmp_path / "stage" / "train")
    for i in range(5):
        assert local.raw(i) == split.raw(1 + 3 * i)
    assert local.read(4)["sid"] == 13


def test_the_learning_rate_schedule_is_the_reference_lambda():
    """utils.py warmup_lr_lambda: linear from warmup_factor over warmup_steps, then x gamma
    per milestone passed (bisect: a step equal to a milestone is already decayed)."""
    o = load_config("oc20", "reference")["optimizer"]
    assert lr_factor(0, o) == pytest.approx(0.2)
    assert lr_factor(15626, o) == pytest.approx(0.2 * 0.5 + 0.5)
    assert lr_factor(31252, o) == pytest.approx(1.0)
    assert lr_factor(125007, o) == pytest.approx(1.0)
    assert lr_factor(125008, o) == pytest.approx(0.1)
    assert lr_factor(250016, o) == pytest.approx(0.001)


def test_config_errors_name_the_key():
    cfg = load_config("oc20", "mini", ["optimizer.name=Adam"])
    with pytest.raises(KitError, match="config key 'optimizer.name'"):
        validate_config(cfg)
    with pytest.raises(KitError, match="config key 'model.num_radial'"):
        validate_config(load_config("oc20", "mini", ["model.num_radial=65"]))
    validate_config(load_config("oc20", "mini", ["optimizer.lr=0"]))   # the sabotage the checks use is valid


@pytest.mark.parametrize("args, names", [
    (["datagen", "oc20", "--out", "{t}/new", "--config", "mini", "--height", "8"], "--height"),
    (["datagen", "oc20", "--out", "{t}/new"], "--train and --valid"),
    (["describe", "oc20", "--set", "model.num_blocks=0"], "model.num_blocks"),
    (["train", "oc20", "--data", "{t}/nope", "--output-dir", "{t}/out", *NO_ALLOCATOR_RESTART], "{t}/nope"),
])
def test_bad_command_lines_are_one_line(tmp_path, args, names):
    proc = run_hpckit(*[a.replace("{t}", str(tmp_path)) for a in args])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and names.replace("{t}", str(tmp_path)) in lines[0], proc.stderr


@pytest.mark.parametrize("value, message", [
    (7, None), (0, None),
    ([0] * 50, "does not hold a record count (it holds a list)"),
    (True, "does not hold a record count (it holds True)"),
    (-1, "does not hold a record count (it holds -1)"),
    (2.0, "does not hold a record count (it holds 2.0)"),
    ("7", "does not hold a record count (it holds '7')"),
    (__import__("collections").OrderedDict(), "not a pickled record count (it names collections.OrderedDict, "
                                              "which a record count does not hold)"),
])
def test_the_length_entry_holds_an_int_and_nothing_else(value, message):
    raw = pickle.dumps(value, protocol=-1)
    if message is None:
        assert records.loads_length(raw, "f key 'length'") == value
    else:
        with pytest.raises(KitError) as e:
            records.loads_length(raw, "f key 'length'")
        assert str(e.value) == f"f key 'length': {message}"
    with pytest.raises(KitError, match="^f key 'length': not a pickled record count"):
        records.loads_length(raw[:-1], "f key 'length'")


def test_keys_are_located_with_pread_where_lmdb_finds_them(tmp_path):
    """value_extent (the check before LMDB reads a key) walks a B-tree of branch and leaf
    pages to the value LMDB returns, inline or on overflow pages, and finds no absent key."""
    import os

    import lmdb
    rng = np.random.default_rng(4)
    values = [rng.bytes(int(rng.choice([3, 60, 1500, 9000]))) for _ in range(700)]
    path = tmp_path / "data.0000.lmdb"
    records.write_lmdb(path, values)
    f = records.LmdbFile(path)
    try:
        opened = f._open()
        assert f.env().stat()["depth"] >= 2 and f.env().stat()["overflow_pages"] > 0
        for i, want in enumerate(values):
            offset, length = records.value_extent(path, opened.fd, opened.size, opened.meta, str(i).encode())
            assert os.pread(opened.fd, length, offset) == want == f.raw(i)
        for absent in (b"", b"700", b"-1", b"lengths", b"69 ", b"\xff"):
            assert records.value_extent(path, opened.fd, opened.size, opened.meta, absent) is None
        assert f.length() == 700
    finally:
        f.close()
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"700") is None and txn.get(b"699") == values[699]
    env.close()
