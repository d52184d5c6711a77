"""DeepCAM data: the generator writes the public HDF5 layout with physically shaped fields;
the loader reads it as the reference does and rejects bad input with one line naming the file."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil

import h5py
import numpy as np
import pytest

from hpckit.common.errors import KitError
from hpckit.deepcam import data, synthetic

H, W = 48, 72
N_TRAIN, N_VALID = 8, 4
SEED = 3
CFG = {"data": {"height": H, "width": W, "n_channels": 16, "n_train": N_TRAIN, "n_valid": N_VALID,
                "batch_size": 3, "loader_workers": 0, "shuffle": True, "normalization": "minmax",
                "prefetch": 2}}
NAME_RE = re.compile(r"^data-\d{4}-\d{2}-\d{2}-\d{2}-[12]\.h5$")


def make(root, seed=SEED, **kw):
    return synthetic.write_dataset(root, N_TRAIN, N_VALID, height=H, width=W, seed=seed, workers=1, **kw)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepcam") / "data"
    manifest = make(root)
    return root, manifest


@pytest.fixture
def data_copy(ds, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(ds[0], root)
    return root


def load(path):
    with h5py.File(path, "r") as f:
        return f["climate/data"][...], f["climate/labels_0"][...], f["climate/labels_1"][...]


def files_of(root, split):
    return sorted((root / split).glob("data-*.h5"))


# ---------------------------------------------------------------- layout and format

def test_layout_names_and_manifest(ds):
    root, manifest = ds
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json", "stats.h5", "train", "validation"]
    assert json.loads((root / "manifest.json").read_text()) == manifest
    assert manifest["counts"] == {"train": N_TRAIN, "validation": N_VALID}
    assert manifest["channels"] == ["TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200",
                                    "T500", "PRECT", "TS", "TREFHT", "Z1000", "Z200", "ZBOT"]
    for split, run in (("train", "1"), ("validation", "2")):
        names = sorted(p.name for p in (root / split).iterdir())
        assert len(names) == manifest["counts"][split]
        assert all(NAME_RE.match(n) and n.endswith(f"-{run}.h5") for n in names), names
        recs = manifest["samples"][split]
        assert [r["name"] for r in recs] == names, "index order is name order"
        for r in recs:
            assert hashlib.sha256((root / split / r["name"]).read_bytes()).hexdigest() == r["sha256"]
    assert hashlib.sha256((root / "stats.h5").read_bytes()).hexdigest() == manifest["stats"]["sha256"]
    assert not list(root.rglob(".*.tmp")), "no temporary files left"


def test_hdf5_datasets_shapes_and_dtypes(ds):
    root, _ = ds
    for path in files_of(root, "train") + files_of(root, "validation"):
        with h5py.File(path, "r") as f:
            assert set(f.keys()) == {"climate"}
            assert set(f["climate"].keys()) == {"data", "labels_0", "labels_1"}
            assert f["climate/data"].shape == (H, W, 16) and f["climate/data"].dtype == np.float32
            for key in ("labels_0", "labels_1"):
                assert f[f"climate/{key}"].shape == (H, W) and f[f"climate/{key}"].dtype == np.float32
        _, l0, l1 = load(path)
        assert set(np.unique(l0)) <= {0.0, 1.0, 2.0}
        assert np.all(l1[l0 > 0] > 0), "relaxed masks contain the default ones"


def test_stats_file_matches_training_files(ds):
    root, manifest = ds
    arrays = np.stack([load(p)[0] for p in files_of(root, "train")]).astype(np.float64)
    flat = arrays.reshape(-1, 16)
    with h5py.File(root / "stats.h5", "r") as f:
        assert set(f["climate"].keys()) == {"count", "mean", "sqmean", "minval", "maxval"}
        assert f["climate/count"].shape == () and int(f["climate/count"][()]) == N_TRAIN
        for key in ("mean", "sqmean", "minval", "maxval"):
            assert f[f"climate/{key}"].shape == (16,) and f[f"climate/{key}"].dtype == np.float32
        np.testing.assert_allclose(f["climate/mean"][...], flat.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(f["climate/sqmean"][...], (flat ** 2).mean(axis=0), rtol=1e-6)
        np.testing.assert_array_equal(f["climate/minval"][...], flat.min(axis=0).astype(np.float32))
        np.testing.assert_array_equal(f["climate/maxval"][...], flat.max(axis=0).astype(np.float32))
    stats = data.load_stats(root)
    assert stats["minval"].shape == (16,) and np.all(stats["maxval"] > stats["minval"])


def test_generation_is_deterministic_per_seed(ds, tmp_path):
    root, manifest = ds
    again = make(tmp_path / "again")
    other = make(tmp_path / "other", seed=SEED + 1)
    assert again == manifest
    assert other["samples"] != manifest["samples"]
    for split in ("train", "validation"):
        for a, b, c in zip(files_of(root, split), files_of(tmp_path / "again", split),
                           files_of(tmp_path / "other", split)):
            for xa, xb, xc in zip(load(a), load(b), load(c)):
                np.testing.assert_array_equal(xa, xb)
            assert not np.array_equal(load(a)[0], load(c)[0])


def test_generator_rejects_bad_arguments(tmp_path):
    for kw in ({"n_train": 0}, {"n_valid": 0}, {"height": 4}, {"n_train": 1, "shuffle_labels": True}):
        args = {"n_train": 2, "n_valid": 2, "height": H, "width": W, "workers": 1, **kw}
        with pytest.raises(KitError):
            synthetic.write_dataset(tmp_path / "x", **args)


# ---------------------------------------------------------------- content

def test_class_fractions(ds):
    root, manifest = ds
    labels = np.stack([load(p)[1] for p in files_of(root, "train") + files_of(root, "validation")])
    frac = np.bincount(labels.astype(np.int64).ravel(), minlength=3) / labels.size
    assert 0.85 < frac[0] < 0.99, frac
    assert frac[1] > 0 and frac[2] > 0, frac
    np.testing.assert_allclose(manifest["class_fractions"], frac, rtol=1e-12)


def _tc_distance_km(lat, lon, tc):
    dlat = (lat[:, None] - tc["lat"]) * synthetic.KM_PER_DEG
    dlon = ((lon[None, :] - tc["lon"] + 180.0) % 360.0 - 180.0) * np.cos(np.radians(lat))[:, None]
    return np.hypot(dlat, dlon * synthetic.KM_PER_DEG)


def test_fields_are_physical(ds):
    root, manifest = ds
    ch = {n: i for i, n in enumerate(manifest["channels"])}
    lat, lon = synthetic.lat_lon(H, W)
    ranges = {"TMQ": (0, 110), "U850": (-90, 90), "V850": (-90, 90), "UBOT": (-90, 90), "VBOT": (-90, 90),
              "QREFHT": (0, 0.04), "PS": (4.5e4, 1.15e5), "PSL": (8.5e4, 1.15e5), "T200": (195, 245),
              "T500": (210, 285), "PRECT": (0, 5e-5), "TS": (190, 320), "TREFHT": (190, 320),
              "Z1000": (-2000, 1500), "Z200": (1.0e4, 1.3e4), "ZBOT": (40, 80)}
    n_tc = n_ar = 0
    for split in ("train", "validation"):
        for path, rec in zip(files_of(root, split), manifest["samples"][split]):
            x, l0, _ = load(path)
            for name, (lo, hi) in ranges.items():
                assert lo <= x[..., ch[name]].min() and x[..., ch[name]].max() <= hi, (name, path.name)
            # the tropics are warmer and moister than the poles
            tropics, polar = np.abs(lat) < 20, np.abs(lat) > 60
            for name in ("TS", "TMQ", "T500"):
                assert x[tropics, :, ch[name]].mean() > x[polar, :, ch[name]].mean() + 5 * (name != "TMQ")
            psl, tmq = x[..., ch["PSL"]], x[..., ch["TMQ"]]
            u, v = x[..., ch["U850"]], x[..., ch["V850"]]
            for tc in rec["events"]["tropical_cyclones"]:
                n_tc += 1
                dist = _tc_distance_km(lat, lon, tc)
                mask = (dist < tc["radius_km"]) & (l0 == 1)
                assert mask.any(), (path.name, tc)
                assert psl[mask].max() < np.median(psl), "pressure minimum inside every cyclone"
                assert tmq[mask].mean() > np.median(tmq)
                # relative vorticity dv/dx - du/dy at the centre cell (rows go north, columns east)
                r, c = np.unravel_index(np.argmin(dist), dist.shape)
                curl = (v[r, (c + 1) % W] - v[r, c - 1]) - (u[r + 1, c] - u[r - 1, c])
                assert np.sign(curl) == np.sign(tc["lat"]), "cyclonic: counter-clockwise in the north"
            river = l0 == 2
            if rec["events"]["atmospheric_rivers"]:
                n_ar += 1
                assert river.any()
                assert tmq[river].mean() > np.median(tmq) + 5
                # the low-level jet runs along the river: poleward and eastward
                north = np.sign(lat)[:, None] * np.ones((1, W))
                assert (v * north)[river].mean() > 0 and u[river].mean() > 0
    assert n_tc > 0 and n_ar > 0


# ---------------------------------------------------------------- reading

def test_normalisation_is_minmax_chw(ds):
    root, _ = ds
    found = data.find_dataset(root, N_TRAIN, N_VALID)
    stats = data.load_stats(root)
    with h5py.File(root / "stats.h5", "r") as f:
        lo, hi = f["climate/minval"][...].astype(np.float64), f["climate/maxval"][...].astype(np.float64)
    for split in ("train", "validation"):
        for i, path in enumerate(found[split].files):
            x, y = data.read_sample(found[split], i, stats, CFG)
            raw, l0, _ = load(path)
            assert x.dtype == np.float32 and x.shape == (16, H, W) and x.flags.c_contiguous
            assert y.dtype == np.int64 and y.shape == (H, W)
            np.testing.assert_allclose(x, ((raw - lo) / (hi - lo)).transpose(2, 0, 1), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(y, l0.astype(np.int64))
            if split == "train":
                assert x.min() >= 0 and x.max() <= 1 + 1e-6
    bad = copy.deepcopy(CFG)
    bad["data"]["normalization"] = "zscore"
    with pytest.raises(KitError, match="data.normalization"):
        data.read_sample(found["train"], 0, stats, bad)


def test_torch_loader_batches(ds):
    import torch

    root, _ = ds
    found = data.find_dataset(root, N_TRAIN, N_VALID)
    stats = data.load_stats(root)
    train = list(data.torch_loader(found["train"], stats, CFG, train=True, seed=1))
    assert len(train) == N_TRAIN // 3, "drop_last for training"
    for x, y in train:
        assert x.dtype == torch.float32 and x.shape == (3, 16, H, W)
        assert y.dtype == torch.int64 and y.shape == (3, H, W)
    valid = list(data.torch_loader(found["validation"], stats, CFG, train=False, seed=1))
    assert [len(x) for x, _ in valid] == [3, 1], "validation keeps every sample, in order"
    x0, _ = data.read_sample(found["validation"], 0, stats, CFG)
    np.testing.assert_array_equal(valid[0][0][0].numpy(), x0)
    # shuffled, reproducibly per seed; one worker process reads the same thing
    cfg1 = copy.deepcopy(CFG)
    cfg1["data"]["loader_workers"] = 1
    again = list(data.torch_loader(found["train"], stats, cfg1, train=True, seed=1))
    for (a, b), (c, d) in zip(train, again):
        assert torch.equal(a, c) and torch.equal(b, d)
    unshuffled = [data.read_sample(found["train"], i, stats, CFG)[1] for i in range(3)]
    assert not all(np.array_equal(train[0][1][i].numpy(), unshuffled[i]) for i in range(3))


def test_sharding_is_disjoint_and_complete(ds):
    root, _ = ds
    files = data.find_dataset(root, N_TRAIN, N_VALID)["train"]
    for size in (1, 2, 3, 5):
        shards = [files.shard(r, size) for r in range(size)]
        seen = [p for s in shards for p in s.files]
        assert sorted(seen) == files.files and len(set(seen)) == len(seen)
        for r, s in enumerate(shards):
            assert s.files == files.files[r::size]
    assert files.files == sorted(files.files)
    assert len(data.find_dataset(root, 5, 2)["train"]) == 5


def test_shuffled_labels_permute_label_maps(ds, tmp_path):
    root, manifest = ds
    shuf = make(tmp_path / "shuffled", shuffle_labels=True)
    assert shuf["shuffled_labels"] is True
    for split in ("train", "validation"):
        plain_files, shuf_files = files_of(root, split), files_of(tmp_path / "shuffled", split)
        perm = [r["labels_from"] for r in shuf["samples"][split]]
        assert sorted(perm) == list(range(len(perm))) and all(p != i for i, p in enumerate(perm))
        for i, (a, b) in enumerate(zip(plain_files, shuf_files)):
            xa, la, _ = load(a)
            xb, lb, _ = load(b)
            np.testing.assert_array_equal(xa, xb)                      # same data
            np.testing.assert_array_equal(lb, load(plain_files[perm[i]])[1])  # another sample's labels
            assert not np.array_equal(la, lb)


# ---------------------------------------------------------------- bad input

def assert_one_line(err: KitError, *needles):
    msg = str(err)
    assert "\n" not in msg
    for needle in needles:
        assert str(needle) in msg, (needle, msg)


def test_discovery_errors(data_copy, tmp_path):
    root = data_copy
    with pytest.raises(KitError) as e:
        data.find_dataset(root, N_TRAIN + 1, N_VALID)
    assert_one_line(e.value, "data.n_train", root / "train")
    with pytest.raises(KitError) as e:
        data.find_dataset(root, N_TRAIN, N_VALID + 1)
    assert_one_line(e.value, "data.n_valid", root / "validation")
    (root / "stats.h5").rename(tmp_path / "stats.h5")
    with pytest.raises(KitError) as e:
        data.find_dataset(root, N_TRAIN, N_VALID)
    assert_one_line(e.value, "missing stats.h5", root / "stats.h5")
    with pytest.raises(KitError, match="missing stats.h5"):
        data.load_stats(root)
    (tmp_path / "stats.h5").rename(root / "stats.h5")
    for p in files_of(root, "validation"):
        p.unlink()
    with pytest.raises(KitError) as e:
        data.find_dataset(root, N_TRAIN, N_VALID)
    assert_one_line(e.value, "empty split folder", root / "validation")
    shutil.rmtree(root / "validation")
    with pytest.raises(KitError) as e:
        data.find_dataset(root, N_TRAIN, N_VALID)
    assert_one_line(e.value, "missing split folder", root / "validation")


@pytest.mark.parametrize("key, value, needle", [
    ("maxval", None, "'climate/maxval'"),
    ("mean", np.zeros(15, np.float32), "'climate/mean'"),
    ("minval", np.full(16, np.nan, np.float32), "'climate/minval'"),
    ("maxval", np.zeros(16, np.float32), "'climate/maxval'"),      # max <= min
])
def test_bad_stats_file(data_copy, key, value, needle):
    with h5py.File(data_copy / "stats.h5", "a") as f:
        del f[f"climate/{key}"]
        if value is not None:
            f[f"climate/{key}"] = value
    with pytest.raises(KitError) as e:
        data.load_stats(data_copy)
    assert_one_line(e.value, data_copy / "stats.h5", needle)


def _rewrite(path, data_arr=None, labels=None, drop=None):
    with h5py.File(path, "a") as f:
        if drop:
            del f[drop]
        if data_arr is not None:
            del f["climate/data"]
            f["climate/data"] = data_arr
        if labels is not None:
            del f["climate/labels_0"]
            f["climate/labels_0"] = labels


def _no_data(p):
    _rewrite(p, drop="climate/data")


def _channels(p):
    _rewrite(p, data_arr=load(p)[0][..., :15])


def _size(p):
    _rewrite(p, data_arr=load(p)[0][:, :-8])


def _labels(p):
    lab = load(p)[1]
    lab[5, 7] = 3
    _rewrite(p, labels=lab)


def _nan(p):
    x = load(p)[0]
    x[10, 20, 4] = np.nan
    _rewrite(p, data_arr=x)


def _inf(p):
    x = load(p)[0]
    x[1, 2, 3] = np.inf
    _rewrite(p, data_arr=x)


def _truncated(p):
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])


def _garbage(p):
    p.write_bytes(b"not an hdf5 file at all")


@pytest.mark.parametrize("damage, needle", [
    (_no_data, "lacks dataset 'climate/data'"),
    (_channels, "15 channels, expected 16"),
    (_size, "data.width"),
    (_labels, "expected classes 0, 1, 2"),
    (_nan, "non-finite"),
    (_inf, "non-finite"),
    (_truncated, "not a readable HDF5 file"),
    (_garbage, "not a readable HDF5 file"),
])
def test_bad_sample_file_is_named(data_copy, damage, needle):
    found = data.find_dataset(data_copy, N_TRAIN, N_VALID)
    stats = data.load_stats(data_copy)
    assert data.find_bad_file(found["train"], stats, CFG) is None
    victim = found["train"].files[5]
    damage(victim)
    with pytest.raises(KitError) as e:
        data.read_sample(found["train"], 5, stats, CFG)
    assert_one_line(e.value, victim, needle)
    err = data.find_bad_file(found["train"], stats, CFG)
    assert isinstance(err, KitError) and str(err) == str(e.value)
    with pytest.raises(KitError, match=re.escape(str(victim))):
        list(data.torch_loader(found["train"], stats, CFG, train=False, seed=0))
