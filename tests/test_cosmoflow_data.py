"""CosmoFlow data: the generator writes the public formats; both loaders read them."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from conftest import run_hpckit
from hpckit.cosmoflow import data, synthetic

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def small(tmp_path, fmt="tfrecord", seed=3, n_train=6, n_valid=3, size=16, **kw):
    out = tmp_path / f"{fmt}-{seed}"
    synthetic.write_dataset(out, n_train, n_valid, size=size, seed=seed, fmt=fmt, workers=1, **kw)
    return out


def test_tfrecord_layout_manifest_and_checksums(tmp_path):
    root = small(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 6, "validation": 3}
    assert manifest["sample_shape"] == [16, 16, 16, 4]
    for split in ("train", "validation"):
        files = sorted(p.name for p in (root / split).iterdir())
        assert len(files) == manifest["counts"][split] and all(f.endswith(".tfrecord") for f in files)
        for rec in manifest["samples"][split]:
            for name, digest in rec["files"].items():
                assert hashlib.sha256((root / split / name).read_bytes()).hexdigest() == digest
            assert all(-1 <= v <= 1 for v in rec["y"])
            assert set(rec["params"]) == set(synthetic.PARAM_NAMES)
    first = next((root / "train").iterdir())
    assert first.read_bytes()[:2] == b"\x1f\x8b", "samples are GZIP-compressed TFRecords"


def test_generation_is_deterministic_per_seed(tmp_path):
    a, b, c = small(tmp_path, seed=5), small(tmp_path / "again", seed=5), small(tmp_path, seed=6)
    ma, mb, mc = (json.loads((r / "manifest.json").read_text())["samples"] for r in (a, b, c))
    assert ma == mb
    assert ma != mc


def test_targets_are_the_normalised_parameters_and_fields_are_physical(tmp_path):
    root = small(tmp_path, n_train=8, size=32)
    manifest = json.loads((root / "manifest.json").read_text())
    split = data.find_split(root, "train", 8, "data.n_train")
    means = []
    for i, rec in enumerate(manifest["samples"]["train"]):
        x, y = data.read_sample(split, i, 32)
        assert x.dtype == np.int16 and x.shape == (32, 32, 32, 4) and x.min() >= 0
        np.testing.assert_allclose(y, synthetic.normalise(rec["params"]), rtol=1e-6)
        means.append((x.mean(), rec["params"]["Omega_m"]))
        # growth: structure grows with time, so z=0 (channel 0) is clumpier than z=3 (channel 3)
        logx = np.log1p(x.astype(np.float32))
        assert logx[..., 0].std() > logx[..., 3].std()
    # mean counts follow Omega_m (fixed particle mass in M_sun/h)
    counts, omega_m = np.array(means).T
    assert np.corrcoef(counts, omega_m)[0, 1] > 0.99


def test_sigma8_raises_the_variance():
    base = {"sigma_8": 0.6, "n_s": 1.0, "Omega_m": 0.3, "h": 0.7}
    lo = synthetic.universe(base, 32, np.random.default_rng(1))
    hi = synthetic.universe({**base, "sigma_8": 1.0}, 32, np.random.default_rng(1))
    assert np.log1p(hi[..., 0].astype(float)).std() > 1.2 * np.log1p(lo[..., 0].astype(float)).std()


def test_shuffled_labels_permute_targets(tmp_path):
    plain = json.loads((small(tmp_path, seed=4) / "manifest.json").read_text())["samples"]["train"]
    shuf = json.loads((small(tmp_path / "s", seed=4, shuffle_labels=True) / "manifest.json").read_text())["samples"]["train"]
    assert [r["params"] for r in plain] == [r["params"] for r in shuf]
    assert sorted(map(tuple, (r["y"] for r in plain))) == sorted(map(tuple, (r["y"] for r in shuf)))
    assert [r["y"] for r in plain] != [r["y"] for r in shuf]


def test_npy_format_matches_tfrecord(tmp_path):
    tf_root, npy_root = small(tmp_path, "tfrecord", seed=9), small(tmp_path, "npy", seed=9)
    lst = (npy_root / "train" / "files_data.lst").read_text().split()
    assert len(lst) == 6 and all(n.endswith("_data.npy") for n in lst)
    a = data.find_split(tf_root, "train", 6, "data.n_train")
    b = data.find_split(npy_root, "train", 6, "data.n_train")
    assert b.fmt == "npy"
    for i in range(6):
        xa, ya = data.read_sample(a, i, 16)
        xb, yb = data.read_sample(b, i, 16)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_sharding_is_disjoint_and_complete(tmp_path):
    split = data.find_split(small(tmp_path), "train", 6, "data.n_train")
    shards = [split.shard(r, 4).files for r in range(4)]
    assert sorted(f for s in shards for f in s) == split.files
    assert shards[1] == split.files[1::4]


@pytest.mark.parametrize("fmt", ["tfrecord", "npy"])
def test_torch_and_tensorflow_loaders_agree(tmp_path, fmt):
    root = small(tmp_path, fmt, seed=11)
    cfg = {"data": {"sample_size": 16, "batch_size": 3, "apply_log": True, "shuffle": False,
                    "prefetch": 2, "loader_workers": 0}}
    split = data.find_split(root, "validation", 3, "data.n_valid")
    (xt, yt), = list(data.torch_loader(split, cfg, train=False, seed=0))
    (xf, yf), = [(x.numpy(), y.numpy()) for x, y in data.tf_dataset(split, cfg, train=False, seed=0)]
    np.testing.assert_allclose(xt.numpy(), xf, rtol=1e-6)
    np.testing.assert_array_equal(yt.numpy(), yf)
    raw, _ = data.read_sample(split, 0, 16)
    np.testing.assert_allclose(xt[0].numpy(), np.log1p(raw.astype(np.float32)), rtol=1e-6)


def test_datagen_cli_takes_counts_from_config(tmp_path):
    out = tmp_path / "npy"
    proc = run_hpckit("datagen", "cosmoflow", "--config", "mini", "--train", "4", "--valid", "2",
                      "--format", "npy", "--out", out, check=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 4, "validation": 2}
    assert manifest["sample_shape"][0] == 32  # the mini config's size
    assert "wrote 4 train + 2 validation" in proc.stdout


def test_mini_target_is_at_most_half_the_trivial_predictor(mini_data):
    """The trivial predictor (the training mean) on the mini validation set, against the target."""
    from hpckit.common.config import load_config

    manifest = json.loads((mini_data / "manifest.json").read_text())
    y_train = np.array([r["y"] for r in manifest["samples"]["train"]])
    y_valid = np.array([r["y"] for r in manifest["samples"]["validation"]])
    trivial = float(np.abs(y_valid - y_train.mean(axis=0)).mean())
    target = load_config("cosmoflow", "mini")["train"]["target_mae"]
    assert 0.45 < trivial < 0.55
    assert target <= trivial / 2, (target, trivial)


def test_decode_at_staging_writes_what_the_loader_would_read(tmp_path):
    """data.stage_decode: every staged sample is the (x, y) read_sample gives of the TFRecord
    it came from, as npy pairs the npy loader reads; a corrupted record is named, file first."""
    ds = small(tmp_path, n_train=6, n_valid=2)
    split = data.find_dataset(ds, 6, 2)["train"]
    dest = tmp_path / "stage" / "train"
    (tmp_path / "stage").mkdir()
    written = data.decode_into(split, dest, 16)
    staged = data.decoded(split, dest)
    assert staged.fmt == "npy" and written == sum(p.stat().st_size for p in staged.all_paths())
    for i in range(len(split)):
        x0, y0 = data.read_sample(split, i, 16)
        x1, y1 = data.read_sample(staged, i, 16)
        assert x1.dtype == np.int16 and np.array_equal(x0, x1) and np.array_equal(y0, y1)
    bad = split.files[4]
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(data.KitError, match=str(bad)):
        data.decode_into(split, tmp_path / "stage" / "again", 16)


@pytest.mark.slow   # `make test-all` (CI) only: two trainings
def test_training_reads_the_decoded_copy(tmp_path, mini_data):
    """hpckit train --set data.stage_decode=true: staging decodes (logged), the run trains
    from npy files in its own stage directory and converges as from the TFRecords."""
    stage, out = tmp_path / "stage", tmp_path / "out"
    stage.mkdir()
    proc = run_hpckit("train", "cosmoflow", "--data", mini_data, "--config", "mini", "--framework", "pytorch",
                      "--output-dir", out, "--seed", 1, "--stage-dir", stage, "--keep-staged",
                      "--set", "data.stage_decode=true", "--set", "train.n_epochs=2", timeout=900)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    events = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in (out / "mlperf.log").read_text().splitlines()
              if ":::MLLOG " in ln]
    stop = next(e for e in events if e["key"] == "staging_stop")
    assert stop["metadata"]["written_as"] == "decoded" and stop["metadata"]["staged"] is True
    config = next(e for e in events if e["key"] == "hpckit_config")["value"]
    assert config["data.stage_decode"] is True
    (root,) = stage.glob("hpckit-stage-*")
    assert len(list((root / "train").glob("*.tfrecord.x.npy"))) == len(list((root / "train").glob("*.y.npy"))) == 1024
    assert not list((root / "train").glob("*.tfrecord")), "the records were copied as well as decoded"
    assert json.loads((out / "summary.json").read_text())["epochs"] == 2
