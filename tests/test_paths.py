"""Paths the kit cannot create are one line naming them, exit 2, and nothing is made (issue 41).

A name longer than the file system takes (300 characters; NAME_MAX is 255 bytes), a path
longer than PATH_MAX with what the kit writes under it, a part of the path that is a file
(ENOTDIR) or a symbolic link loop (ELOOP), given to `hpckit datagen --out`, `hpckit train
--output-dir` and `--stage-dir` of every benchmark, and to the writer's helpers
(hpckit.common.fileio) directly. Before, `--output-dir` / `--out` with a 300-character name
was an `OSError: [Errno 36] File name too long` traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import one_line, run_hpckit
from hpckit.common import fileio
from hpckit.common.errors import KitError

BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")
LONG = "n" * 300


def made(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("benchmark", BENCHMARKS)
@pytest.mark.parametrize("where", ["name", "nested"])
def test_datagen_out_with_a_name_too_long(tmp_path, benchmark, where):
    out = tmp_path / LONG if where == "name" else tmp_path / "new" / LONG / "data"
    line = one_line(run_hpckit("datagen", benchmark, "--config", "mini", "--out", out, "--train", 1, "--valid", 1),
                    "--out", out, "is 300 bytes, longer than the 255 a name may have")
    assert line.startswith("hpckit datagen: error: ")
    assert made(tmp_path) == []   # not even new/ above it


@pytest.mark.parametrize("benchmark", BENCHMARKS)
@pytest.mark.parametrize("where", ["name", "nested"])
def test_train_output_dir_with_a_name_too_long(tmp_path, benchmark, where):
    out = tmp_path / LONG if where == "name" else tmp_path / "new" / LONG / "run"
    one_line(run_hpckit("train", benchmark, "--data", tmp_path / "data", "--config", "mini", "--output-dir", out),
             "--output-dir", out, "is 300 bytes, longer than the 255 a name may have")
    assert made(tmp_path) == []


@pytest.mark.parametrize("kind", ["a file on the way", "a link loop"])
@pytest.mark.parametrize("command", ["datagen", "train"])
def test_a_path_through_a_file_or_a_link_loop(tmp_path, kind, command):
    if kind == "a file on the way":
        (tmp_path / "file").write_text("mine\n")
        out, why = tmp_path / "file" / "out", "a part of the path is not a directory"
    else:
        os.symlink("loop", tmp_path / "loop")
        out, why = tmp_path / "loop" / "out", "too many symbolic links in the path"
    before = made(tmp_path)
    if command == "datagen":
        proc = run_hpckit("datagen", "deepcam", "--config", "mini", "--out", out)
    else:
        proc = run_hpckit("train", "deepcam", "--data", tmp_path, "--config", "mini", "--output-dir", out)
    one_line(proc, out, why)
    assert made(tmp_path) == before and (kind != "a file on the way" or (tmp_path / "file").read_text() == "mine\n")


@pytest.fixture(scope="module")
def cosmo_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("paths") / "data"
    run_hpckit("datagen", "cosmoflow", "--config", "mini", "--out", root, "--train", 2, "--valid", 1, "--size", 16,
               check=True)
    return root


def test_train_stage_dir_with_a_name_too_long(cosmo_data, tmp_path):
    """--stage-dir is checked before the run starts: a 300-character name was the OSError
    traceback of the staging, after the run had begun."""
    stage = tmp_path / LONG
    proc = run_hpckit("train", "cosmoflow", "--data", cosmo_data, "--config", "mini", "--output-dir",
                      tmp_path / "out", "--stage-dir", stage, "--framework", "pytorch", "--set", "data.sample_size=16",
                      "--set", "model.n_conv_layers=4", "--set", "data.n_train=2", "--set", "data.n_valid=1",
                      "--set", "data.batch_size=1", "--set", "train.max_steps=1")
    one_line(proc, "--stage-dir", stage, "is 300 bytes, longer than the 255")
    assert not any(p.name.startswith("hpckit-stage") for p in tmp_path.rglob("*"))


def deep_dir(root: Path, total: int) -> Path:
    """A directory whose path is `total` bytes long (names of at most 250), made with relative
    steps (its full path is too long for one mkdir)."""
    here = os.getcwd()
    path = root
    try:
        os.chdir(root)
        while len(str(path)) < total:
            name = "d" * min(250, total - len(str(path)) - 1)
            os.mkdir(name)
            os.chdir(name)
            path = path / name
    finally:
        os.chdir(here)
    return path


def test_the_writers_helpers_refuse_before_making_anything(tmp_path):
    cases = {
        "ensure_writable_dir": lambda p: fileio.ensure_writable_dir(p, "--output-dir"),
        "ensure_new_dir": lambda p: fileio.ensure_new_dir(p, "datagen --out", "hpckit datagen writes"),
        "check_new_dir": lambda p: fileio.check_new_dir(p, "--out", "hpckit report writes"),
        "check_output": lambda p: fileio.check_output(p, "--json"),
        "atomic_write_text": lambda p: fileio.atomic_write_text(p, "x", "--json"),
        "place_tree": lambda p: fileio.place_tree(p.parent, p.name, {"a/b.txt": b"x"}, "--out"),
    }
    for name, call in cases.items():
        for path in (tmp_path / LONG, tmp_path / "new" / LONG / "x"):
            with pytest.raises(KitError, match="is 300 bytes, longer than the 255 a name may have") as e:
                call(path)
            named = path.parent if name == "place_tree" else path   # place_tree names the tree's root
            assert str(named) in str(e.value), (name, str(e.value))
            assert made(tmp_path) == [], name
    # a path that fits, but not with the files a run or a data set writes under it
    deep = deep_dir(tmp_path, 4030)
    before = made(tmp_path)
    with pytest.raises(KitError, match=r"\(and 128 for what is written under it\), longer than the 4095"):
        fileio.ensure_new_dir(deep / "data", "datagen --out", "hpckit datagen writes")
    assert made(tmp_path) == before
    (tmp_path / "fits").mkdir()
    fileio.ensure_new_dir(deep_dir(tmp_path / "fits", 3900) / "data", "datagen --out", "hpckit datagen writes")


@pytest.mark.parametrize("args", [
    ["train", "deepcam", "--config", "mini", "--data", "{long}"],
    ["train", "cosmoflow", "--config", "mini", "--framework", "pytorch", "--data", "{long}"],
    ["train", "oc20", "--config", "mini", "--data", "{long}"],
    ["score", "{long}"], ["analyze", "{long}"], ["check", "{long}/mlperf.log"]],
    ids=["train-deepcam", "train-cosmoflow", "train-oc20", "score", "analyze", "check"])
def test_an_input_path_too_long_to_look_up_is_one_line(tmp_path, args):
    """An input the file system cannot even look up (a 300-character name: Path.exists raises
    ENAMETOOLONG where it returns False for a missing file) is one line naming it, exit 2; it
    was a traceback in train --data, score, analyze and check."""
    long = tmp_path / LONG
    argv = [a.replace("{long}", str(long)) for a in args]
    if argv[0] == "train":
        argv += ["--output-dir", str(tmp_path / "out"), "--seed", "1"]
    one_line(run_hpckit(*argv), LONG)
