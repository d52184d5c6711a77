"""Staging copies regular files inside the data set only, never wider than they were (issue 48).

A data set whose folder held a symbolic link to a private file elsewhere (mode 600) was staged
with `--stage-dir`: staging followed the link and wrote the private bytes into the stage
directory, mode 644, readable by every account. Now a link whose target lies outside the data
set's root (`--data`) is refused in one line naming the link, exit 2, before anything of it is
read, by every benchmark's stager (copies: CosmoFlow, DeepCAM, OpenFold's layout; their own
forms: CosmoFlow's data.stage_decode, OC20's one LMDB); links inside the root are followed as
the readers follow them; every staged file keeps its source's permission bits at most.
Real files and links on disk, real data sets made by `hpckit datagen`.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_ALLOCATOR_RESTART, one_line, run_hpckit
from hpckit.common import staging
from hpckit.common.errors import KitError

SECRET = b"the private key of somebody else\n" * 64


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def private(tmp_path: Path) -> Path:
    """A private file (mode 600) outside any data set."""
    home = tmp_path / "home"
    home.mkdir()
    p = home / "id_rsa"
    p.write_bytes(SECRET)
    p.chmod(0o600)
    return p


def holds_secret(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and SECRET[:32] in p.read_bytes()]


# ---- copy_files --------------------------------------------------------------------------

def test_a_link_out_of_the_data_set_is_refused_naming_it(tmp_path):
    secret = private(tmp_path)
    ds = tmp_path / "data" / "train"
    ds.mkdir(parents=True)
    (ds / "a.h5").write_bytes(b"a" * 100)
    link = ds / "b.h5"
    link.symlink_to(os.path.relpath(secret, ds))
    stage = tmp_path / "stage"
    stage.mkdir()
    with pytest.raises(KitError) as e:
        staging.copy_files([ds / "a.h5", link], stage / "train", inside=tmp_path / "data")
    line = str(e.value)
    assert line.startswith(f"{link}: a symbolic link to {secret}, outside the data set {tmp_path / 'data'}"), line
    assert "\n" not in line
    assert holds_secret(stage) == []


def test_a_folder_linked_out_of_the_data_set_is_refused(tmp_path):
    """A link on the way (a split folder that is a link out) is a link out as well."""
    secret = private(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train").symlink_to(secret.parent, target_is_directory=True)
    (tmp_path / "stage").mkdir()
    f = tmp_path / "data" / "train" / "id_rsa"
    with pytest.raises(KitError, match=f"^{f}: a symbolic link to {secret}, outside the data set"):
        staging.copy_files([f], tmp_path / "stage" / "train", inside=tmp_path / "data")
    assert holds_secret(tmp_path / "stage") == []


def test_links_inside_the_data_set_are_staged_as_the_readers_see_them(tmp_path):
    root = tmp_path / "data"
    (root / "gen").mkdir(parents=True)
    (root / "train").mkdir()
    (root / "gen" / "s0.h5").write_bytes(b"zero" * 1000)
    (root / "gen" / "s1.h5").write_bytes(b"one" * 1000)
    (root / "train" / "s0.h5").symlink_to("../gen/s0.h5")                # relative, inside
    (root / "train" / "s1.h5").symlink_to(root / "gen" / "s1.h5")        # absolute, inside
    (root / "alias").symlink_to("gen", target_is_directory=True)          # a folder linked inside
    files = [root / "train" / "s0.h5", root / "train" / "s1.h5"]
    (tmp_path / "stage").mkdir()
    n = staging.copy_files(files, tmp_path / "stage" / "train", inside=root)
    assert n == 7000
    for f in files:
        copy = tmp_path / "stage" / "train" / f.name
        assert not copy.is_symlink() and copy.read_bytes() == f.read_bytes()
    # the data set's root itself may be a link (a project's folder linked into place)
    (tmp_path / "linked").symlink_to(root, target_is_directory=True)
    via = [tmp_path / "linked" / "alias" / "s0.h5"]
    assert staging.copy_files(via, tmp_path / "stage" / "alias", inside=tmp_path / "linked") == 4000
    # and the layout kept (OpenFold's stage_tree passes the root)
    tree = [root / "train" / "s0.h5", root / "alias" / "s1.h5"]
    staging.copy_files(tree, tmp_path / "stage" / "tree", root)
    assert (tmp_path / "stage" / "tree" / "alias" / "s1.h5").read_bytes() == b"one" * 1000


@pytest.mark.parametrize("source_mode", [0o600, 0o640, 0o400, 0o644, 0o755])
def test_a_staged_copy_is_never_wider_than_its_source(tmp_path, source_mode):
    root = tmp_path / "data"
    root.mkdir()
    src = root / "sample.h5"
    src.write_bytes(b"x" * 5000)
    src.chmod(source_mode)
    (tmp_path / "stage").mkdir()
    staging.copy_files([src], tmp_path / "stage" / "train", inside=root)
    got = mode(tmp_path / "stage" / "train" / "sample.h5")
    assert got == source_mode & ~umask(), (oct(got), oct(source_mode))
    assert got & ~source_mode == 0
    assert (tmp_path / "stage" / "train" / "sample.h5").read_bytes() == b"x" * 5000


def test_a_fifo_or_a_folder_is_refused_not_read(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    os.mkfifo(root / "pipe.h5")
    (root / "dir.h5").mkdir()
    (tmp_path / "stage").mkdir()
    for i, f in enumerate((root / "pipe.h5", root / "dir.h5")):
        with pytest.raises(KitError, match=f"^{f}: not a regular file"):
            staging.copy_files([f], tmp_path / "stage" / f"s{i}", inside=root)


def test_check_sources_refuses_a_link_out_and_gives_the_modes(tmp_path):
    secret = private(tmp_path)
    root = tmp_path / "data"
    root.mkdir()
    (root / "a").write_bytes(b"a")
    (root / "a").chmod(0o640)
    (root / "b").symlink_to("a")
    assert staging.check_sources([root / "a", root / "b"], root) == [0o640, 0o640]
    (root / "c").symlink_to(secret)
    with pytest.raises(KitError, match=f"^{root / 'c'}: a symbolic link to {secret}, outside the data set"):
        staging.check_sources([root / "a", root / "c"], root)


# ---- the stagers that write their own form ------------------------------------------------

def test_decoded_staging_keeps_the_records_mode(tmp_path):
    from hpckit.cosmoflow import data as cdata
    from hpckit.cosmoflow.synthetic import write_dataset
    write_dataset(tmp_path / "cf", 2, 1, size=16, seed=1, fmt="tfrecord")
    split = cdata.find_split(tmp_path / "cf", "train", 2, "data.n_train")
    split.files[0].chmod(0o600)
    split.files[1].chmod(0o640)
    (tmp_path / "stage").mkdir()
    cdata.decode_into(split, tmp_path / "stage" / "train", 16)
    out = cdata.decoded(split, tmp_path / "stage" / "train")
    for i, want in enumerate((0o600, 0o640)):
        for p in (out.files[i], out.labels[i]):
            assert mode(p) == want & ~umask(), (p, oct(mode(p)))


def test_the_staged_lmdb_is_no_wider_than_its_narrowest_source(tmp_path):
    from hpckit.common.config import load_config
    from hpckit.oc20 import data as odata
    from hpckit.oc20.synthetic import write_dataset
    write_dataset(tmp_path / "oc", load_config("oc20", "mini"), 4, 1, seed=1)
    split = odata.find_dataset(tmp_path / "oc", 4, 1)["train"]
    for f in split.files:
        f.chmod(0o640)
    split.files[0].chmod(0o600)
    odata.stage_share(split, tmp_path / "stage" / "train")
    staged = tmp_path / "stage" / "train" / odata.STAGED_FILE
    assert mode(staged) == 0o600 & ~umask(), oct(mode(staged))
    assert len(odata.staged(split, tmp_path / "stage" / "train")) == 4


# ---- hpckit train --stage-dir, every benchmark ---------------------------------------------

TINY = {
    "cosmoflow": ["--framework", "pytorch", "--set", "data.sample_size=16", "--set", "data.n_train=4",
                  "--set", "data.n_valid=2", "--set", "data.batch_size=2", "--set", "model.n_conv_layers=4",
                  "--set", "train.n_epochs=1"],
    "deepcam": ["--set", "data.n_train=8", "--set", "data.n_valid=4", "--set", "data.height=32",
                "--set", "data.width=48", "--set", "train.n_epochs=1"],
    "oc20": ["--set", "train.n_epochs=1"],
    "openfold": ["--set", "train.max_steps=1", "--set", "data.loader_workers=1"],
}
GEN = {
    "cosmoflow": ["--train", 4, "--valid", 2, "--size", 16, "--workers", 1],
    "deepcam": ["--train", 8, "--valid", 4, "--height", 32, "--width", 48, "--workers", 1],
    "oc20": [],
    "openfold": [],
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Each benchmark's mini data set, made once by hpckit datagen."""
    root = tmp_path_factory.mktemp("staging-data")
    for b, extra in GEN.items():
        run_hpckit("datagen", b, "--config", "mini", "--out", root / b, "--seed", 1, *extra, check=True)
    return root


def a_data_file(b: str, data: Path) -> Path:
    if b == "openfold":
        return sorted((data / "pdb_mmcif" / "processed" / "dicts").iterdir())[0]
    pattern = {"cosmoflow": "*.tfrecord*", "deepcam": "data-*.h5", "oc20": "*.lmdb"}[b]
    return sorted((data / "train").glob(pattern))[0]


@pytest.mark.parametrize("case", ["cosmoflow", "cosmoflow-decoded", "deepcam", "oc20", "openfold"])
def test_training_with_a_link_out_of_the_data_set_is_refused_naming_it(made, tmp_path, case):
    """One data file moved out of the data set into a private folder (mode 600) and linked
    back: every benchmark's staging refuses the link, exit 2, one line naming it; nothing of
    the private file reaches the stage directory, and the run's stage folder is gone."""
    b = case.split("-")[0]
    data = tmp_path / "data"
    shutil.copytree(made / b, data, symlinks=True)
    link = a_data_file(b, data)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    secret = home / link.name
    shutil.move(link, secret)
    secret.chmod(0o600)
    link.symlink_to(secret)
    stage = tmp_path / "stage"
    stage.mkdir()
    extra = ["--set", "data.stage_decode=true"] if case == "cosmoflow-decoded" else []
    proc = run_hpckit("train", b, "--data", data, "--config", "mini", "--output-dir", tmp_path / "out",
                      "--seed", 1, "--threads", 1, "--stage-dir", stage, *NO_ALLOCATOR_RESTART, *TINY[b], *extra,
                      timeout=600)
    line = one_line(proc, f"{link}: a symbolic link to {secret}, outside the data set {data}")
    assert "staging" in line
    assert list(stage.iterdir()) == [], list(stage.rglob("*"))


def test_training_stages_links_inside_and_keeps_modes(made, tmp_path):
    """Samples linked from inside the data set are staged (as regular files), and a sample of
    mode 600 is staged 600 (kept with --keep-staged to look)."""
    data = tmp_path / "data"
    shutil.copytree(made / "cosmoflow", data)
    files = sorted((data / "train").glob("*.tfrecord*"))
    (data / "pool").mkdir()
    shutil.move(files[1], data / "pool" / files[1].name)
    files[1].symlink_to(Path("..") / "pool" / files[1].name)
    files[0].chmod(0o600)
    stage = tmp_path / "stage"
    stage.mkdir()
    proc = run_hpckit("train", "cosmoflow", "--data", data, "--config", "mini", "--output-dir", tmp_path / "out",
                      "--seed", 1, "--threads", 1, "--stage-dir", stage, "--keep-staged", *NO_ALLOCATOR_RESTART,
                      *TINY["cosmoflow"], timeout=600)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    (own,) = stage.glob("hpckit-stage-*")
    c0, c1 = own / "train" / files[0].name, own / "train" / files[1].name
    assert mode(c0) == 0o600 & ~umask(), oct(mode(c0))
    assert not c1.is_symlink() and c1.read_bytes() == (data / "pool" / files[1].name).read_bytes()
    assert np.all([mode(p) & ~0o666 == 0 for p in (own / "train").iterdir()])
