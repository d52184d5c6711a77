"""The fuzzer (tests/fuzz.py, issue 41) in CI, its oracle, and what it found.

* A seeded campaign of 1,200 cases (120 a format) over every format the kit reads: every case is
  the data read or one KitError line naming the file (exit 2); nothing else.
* The oracle: the same mutations through readers as unsafe as the kit's were before issue
  41 (pickle.loads of the OC20 `length`, the LMDB mapped unchecked, json.load of a FIFO)
  are findings: code run, a signal, a hang, a traceback.
* Each finding the fuzzer made, fixed in the reader, as a test of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fuzz
from hpckit.common.errors import KitError

SIZE = fuzz.COSMO_SIZE
CI_SEED = 41
CI_CASES = 1200      # 120 a format (10 formats): about 30 s on the idle 2-core VM, a minute under load


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder whose corpus every campaign of this module shares (made by the first)."""
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.slow   # `make test-all` (CI) only: a campaign of 1,200 cases
def test_a_seeded_campaign_over_every_format_finds_nothing(work):
    """CI's campaign: every case of every format is the data read or one KitError line
    naming its file; the mutations reach both outcomes in every format (a fuzzer whose
    mutations were all refused at the first byte, or all harmless, would test little)."""
    start = time.monotonic()
    camp = fuzz.run_campaign(CI_CASES, CI_SEED, work=work, log=lambda *a: None)
    lines = []
    fuzz.report(camp, None, log=lines.append)
    print("\n".join(lines), f"\n({time.monotonic() - start:.0f} s)")
    assert not camp.findings, "\n".join(lines)
    assert camp.cases == CI_CASES and set(camp.counts) == set(fuzz.FORMATS)
    for name, counts in camp.counts.items():
        assert counts["read"] > 0 and counts["refused"] > 0, (name, dict(counts))


# The oracle: the kit's readers as they were before issue 41, and the same damage through the
# kit's readers now. Case c is format FORCED_FORMATS[c % 4] with damage c // 4.
FORCED_FORMATS = ["unsafe-lmdb", "lmdb", "unsafe-json", "summary"]


def _lmdb_damage(data_dir, corpus, rng, case):
    path = data_dir / "train" / "data.0000.lmdb"
    if case // 4 == 0:   # the first case: a pickle calling os.system in `length`
        fuzz._lmdb_put(path, {b"length": (corpus / "bank" / "planted" / "os.system.pkl").read_bytes()})
        return path, "all", "plant: length calls os.system"
    os.truncate(path, 2 * 4096)   # the second: a copy cut short, its B-tree's pages not there
    return path, "all", "cut after page 1"


def _json_damage(data_dir, corpus, rng, case):
    path = data_dir / "summary.json"
    if case // 4 == 0:
        path.unlink()
        os.mkfifo(path)
        return path, "summary.json", "replaced by a FIFO"
    path.write_text("[" * 100000 + "]" * 100000)
    return path, "summary.json", "nested 100,000 deep"


def test_the_oracle_finds_code_run_a_signal_a_hang_and_a_traceback(work):
    """The fuzzer's verdicts are what they claim: OC20's `length` through pickle.loads runs
    the planted command (marker file), an LMDB mapped unchecked and cut short dies of SIGBUS,
    json.load of a FIFO hangs and of deep nesting raises; the kit's readers now answer the same
    files with one line each."""
    forced = {"unsafe-lmdb": _lmdb_damage, "lmdb": _lmdb_damage, "unsafe-json": _json_damage,
              "summary": _json_damage}
    camp = fuzz.run_campaign(8, 1, formats=FORCED_FORMATS, timeout=5, work=work, forced=forced,
                             log=lambda *a: None)
    found = {f.case: (f.kind, f.detail) for f in camp.findings}
    assert found.keys() == {0, 2, 4, 6}, found
    assert found[0] == ("code ran", f"the planted pickle created {fuzz.MARKER}")
    assert found[4] == ("signal", "killed by SIGBUS")
    assert found[2] == ("hang", "no answer within the timeout: killed")
    assert found[6][0] == "exception" and found[6][1].startswith("RecursionError"), found[6]
    assert camp.counts["lmdb"]["refused"] == 2 and camp.counts["summary"]["refused"] == 2, dict(camp.counts)


def test_the_cli_prints_each_finding_with_a_replay_that_reproduces_it(work):
    """`tests/fuzz.py` exits 1 on a finding and prints its format, seed and case; the replay
    line it prints damages the same file the same way and finds the same."""
    env = {**os.environ, "PYTHONPATH": str(fuzz.REPO / "apps")}
    run = [sys.executable, str(fuzz.REPO / "tests" / "fuzz.py"), "--work", str(work), "--timeout", "8"]
    proc = subprocess.run(run + ["--formats", "unsafe-json", "--seed", "6", "--first", "94", "--cases", "3"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = re.search(r"^FINDING format=unsafe-json seed=6 case=(\d+): (.*)$", proc.stdout, re.M)
    replay = re.search(r"^    replay: python tests/fuzz.py (.*) --keep DIR$", proc.stdout, re.M)
    assert first and replay, proc.stdout
    assert re.search(r"^unsafe-json\s+3\s+\d+\s+\d+\s+[1-3]$", proc.stdout, re.M), proc.stdout
    again = subprocess.run(run + replay.group(1).split() + ["--keep", str(work / "kept")], capture_output=True,
                           text=True, timeout=300, env=env)
    assert again.returncode == 1 and f"FINDING format=unsafe-json seed=6 case={first.group(1)}: {first.group(2)}" \
        in again.stdout, again.stdout
    kept = work / "kept" / f"unsafe-json-seed6-case{first.group(1)}"
    assert (kept / "finding.txt").is_file() and (kept / "data").is_dir()


# ---------------------------------------------------------------- what the fuzzer found

def npy_split(tmp_path: Path, data: bytes | None = None, label: bytes | None = None):
    """A one-sample CosmoFlow npy split, its files written here (valid unless given)."""
    from hpckit.cosmoflow.data import SplitFiles
    d, y = tmp_path / "s_data.npy", tmp_path / "s_label.npy"
    np.save(d, np.ones((SIZE,) * 3 + (4,), np.int16))
    np.save(y, np.zeros(4, np.float32))
    if data is not None:
        d.write_bytes(data)
    if label is not None:
        y.write_bytes(label)
    return SplitFiles("train", "npy", [d], [y])


def read_both(split):
    """read_sample, then read_sample_into, of sample 0; the KitErrors they raise."""
    from hpckit.cosmoflow import data
    errors = []
    for read in (lambda: data.read_sample(split, 0, SIZE),
                 lambda: data.read_sample_into(split, 0, SIZE, np.empty((SIZE,) * 3 + (4,), np.int16),
                                               np.empty(4, np.float32))):
        with pytest.raises(KitError) as e:
            read()
        errors.append(str(e.value))
    return errors


@pytest.mark.parametrize("which", ["data", "label"])
@pytest.mark.parametrize("damage", ["header length short", "deep nesting", "huge shape"])
def test_a_damaged_npy_header_is_one_line_naming_the_file(tmp_path, which, damage):
    """Found by the fuzzer: a header length field cut short made numpy re-read the header
    as Python 2's and raise tokenize.TokenError, a traceback through read_sample and
    read_sample_into (seed 2, case 83)."""
    shape = (SIZE,) * 3 + (4,) if which == "data" else (4,)
    descr = "<i2" if which == "data" else "<f4"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    body = bytes(int(np.prod(shape)) * 2 if which == "data" else 16)
    if damage == "header length short":
        raw = fuzz.npy_build(header, body, hlen=len(header) - 10)
    elif damage == "deep nesting":
        raw = fuzz.npy_build(header.replace(str(shape), "(" * 3000 + ")" * 3000), body)
    else:
        raw = fuzz.npy_build(header.replace(str(shape), str((2 ** 40,) + shape[1:])), body)
    split = npy_split(tmp_path, **{which: raw})
    path = split.files[0] if which == "data" else split.labels[0]
    for message in read_both(split):
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        # numpy quotes the header it cannot parse: 6,000 characters of it were the line (seed 4, case 470)
        assert len(message) < len(str(path)) + 300, f"{len(message)} characters: {message[:300]}"


def run_limited(code: str, *args, memory: int = 2 << 30, timeout: float = 120):
    """`code` in a fresh interpreter under an address-space limit (a reader that reads an
    endless file fails there, not the machine)."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, cwd=fuzz.REPO)


READ_SPLIT = """
import sys
from hpckit.cosmoflow import data
from hpckit.common.errors import KitError
try:
    data.find_dataset(sys.argv[1], 1, 1)
except KitError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_file_list_that_is_no_regular_file_is_one_line_naming_it(tmp_path, target):
    """Found by the fuzzer: files_data.lst linked to /dev/zero was read until memory ran
    out (a MemoryError traceback under its limit; on a node, all its memory)."""
    import os
    for split in ("train", "validation"):
        split_dir = tmp_path / split
        split_dir.mkdir()
        np.save(split_dir / "a_data.npy", np.ones((SIZE,) * 3 + (4,), np.int16))
        np.save(split_dir / "a_label.npy", np.zeros(4, np.float32))
        (split_dir / "files_label.lst").write_text("a_label.npy\n")
        (split_dir / "files_data.lst").write_text("a_data.npy\n")
    victim = tmp_path / "train" / "files_data.lst"
    victim.unlink()
    if target == "fifo":
        os.mkfifo(victim)
    else:
        victim.symlink_to(target)
    proc = run_limited(READ_SPLIT, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {victim}: file list: not a "
                                                                            "regular file"), proc.stderr[-2000:]


@pytest.mark.parametrize("y", [b"\0" * 16, [b"a", b"b"], "no kind"])
def test_a_tfrecord_whose_y_is_not_numbers_is_one_line_naming_the_file(tmp_path, y):
    """Found by the fuzzer: a y feature of bytes was np.asarray(..., float32)'s ValueError
    traceback (seed 2, case 658)."""
    from hpckit.common import tfrecord
    from hpckit.cosmoflow.data import SplitFiles
    x = np.ones((SIZE,) * 3 + (4,), "<i2").tobytes()
    path = tmp_path / "a.tfrecord"
    if y == "no kind":   # a Feature with none of bytes_list, float_list, int64_list set
        payload = tfrecord.encode_example({"x": x, "y": np.zeros(4, np.float32)})
        tree = fuzz.pb_parse(payload)
        for entry in tree[0]["value"]:
            if entry["value"][0]["value"] == b"y":
                entry["value"][1]["value"] = []
        path.write_bytes(fuzz.tfr_frame(fuzz.pb_encode(tree)))
    else:
        tfrecord.write_example_file(path, {"x": x, "y": y}, compression=None)
    for message in read_both(SplitFiles("train", "tfrecord", [path])):
        assert message.startswith(f"{path}: feature y is not a float feature"), message


def mllog_line(key, value=None, **meta):
    import json
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1000, "event_type": "POINT_IN_TIME", "key": key,
                                     "value": value, "metadata": meta})


@pytest.mark.parametrize("strict", [True, False])
def test_a_log_line_nested_past_json_recursion_is_a_mangled_line(tmp_path, strict):
    """Found by the fuzzer: a :::MLLOG line nested 200,000 deep was json's RecursionError,
    a traceback through parse_log (seed 2, case 212); it is a mangled line, skipped as a cut one."""
    from hpckit.results.logs import parse_log
    path = tmp_path / "mlperf.log"
    deep = ":::MLLOG " + '{"key": "eval_accuracy", "value": ' + "[" * 200000 + "]" * 200000 + "}"
    path.write_text("\n".join([mllog_line("submission_benchmark", "deepcam"), mllog_line("run_start"), deep,
                               mllog_line("eval_accuracy", 0.9, epoch_num=1), mllog_line("run_stop", status="success"),
                               ""]))
    run = parse_log(path, strict=strict)
    assert run.metric_value == 0.9 and run.converged and run.epochs == 1


@pytest.mark.parametrize("value", ["[" * 20000 + "]" * 20000, "2026-02-30", "!!timestamp 2026-13-45", "!!float x"])
def test_a_config_value_yaml_cannot_build_is_one_line_naming_the_file(tmp_path, value):
    """Found by the fuzzer: a value nested past PyYAML's recursion was a RecursionError
    traceback through load_config (seed 2, case 62); a date that does not exist (2026-02-30)
    or a tag whose text is no number was yaml's ValueError, the same."""
    from hpckit.common.config import load_config
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: mini\ndata:\n  n_train: {value}\n")
    with pytest.raises(KitError) as e:
        load_config("deepcam", str(path))
    assert str(e.value).startswith(f"config file {path}: not valid YAML"), e.value
    with pytest.raises(KitError, match=r"^--set 'data.n_train=.*': value is not a valid YAML scalar$"):
        load_config("deepcam", "mini", [f"data.n_train={value}"])


def deepcam_files(tmp_path: Path) -> tuple[Path, Path]:
    """A DeepCAM sample file and a stats.h5 as datagen writes them, at 16 x 24 x 16."""
    import h5py
    h, w, c = fuzz.DEEPCAM_HWC
    sample, stats = tmp_path / "data-1.h5", tmp_path / "stats.h5"
    with h5py.File(sample, "w") as f:
        f.create_dataset("climate/data", data=np.ones((h, w, c), np.float32))
        f.create_dataset("climate/labels_0", data=np.zeros((h, w), np.float32))
    with h5py.File(stats, "w") as f:
        for key in ("count", "mean", "sqmean", "minval", "maxval"):
            f.create_dataset(f"climate/{key}", data=np.full(c, 2.0 if key == "maxval" else 1.0))
    return sample, stats


def damage_h5(path: Path, how: str, name: str) -> None:
    """`name` in the file `path` made unreadable: its object header's version byte garbled
    (as a flipped byte does), a soft link to itself, or an external link to no file."""
    import h5py
    if how == "object header":
        with h5py.File(path, "r") as f:
            addr = h5py.h5o.get_info(f[name].id).addr
        raw = bytearray(path.read_bytes())
        raw[addr] = 0x7F
        path.write_bytes(bytes(raw))
        return
    with h5py.File(path, "a") as f:
        del f[name]
        f[name] = h5py.SoftLink(f"/{name}") if how == "soft link loop" else h5py.ExternalLink("missing.h5", f"/{name}")


@pytest.mark.parametrize("how", ["object header", "soft link loop", "external link"])
@pytest.mark.parametrize("which", ["sample", "stats"])
def test_a_damaged_hdf5_object_is_one_line_naming_the_file(tmp_path, how, which):
    """Found by the fuzzer: h5py raises KeyError ('bad object header version number', an
    external link's "can't open file") and RuntimeError ('too many links', a damaged local
    heap) besides OSError; read_raw, read_raw_into and load_stats caught OSError only, so each
    was a traceback (seed 2, cases 201, 255, 282, 876)."""
    from hpckit.deepcam import data
    h, w, c = fuzz.DEEPCAM_HWC
    sample, stats = deepcam_files(tmp_path)
    if which == "stats":
        damage_h5(stats, how, "climate/mean")
        with pytest.raises(KitError) as e:
            data.load_stats(tmp_path, c)
        expect = "is not a readable HDF5 file (" if how == "object header" else "'climate/mean' is a "
        assert str(e.value).startswith(f"{stats}: stats.h5 {expect}"), e.value
        return
    damage_h5(sample, how, "climate/data")
    for read in (lambda: data.read_raw(sample, h, w, c),
                 lambda: data.read_raw_into(sample, np.empty((h, w, c), np.float32), np.empty((h, w), np.uint8),
                                            h, w, c)):
        with pytest.raises(KitError) as e:
            read()
        assert str(e.value).startswith(f"{sample}: "), e.value


READ_DEEPCAM = """
import sys
from pathlib import Path
import numpy as np
from hpckit.deepcam import data
from hpckit.common.errors import KitError
root, how = Path(sys.argv[1]), sys.argv[2]
h, w, c = 16, 24, 16
try:
    if how == "stats":
        data.load_stats(root, c)
    elif how == "read_raw":
        data.read_raw(root / "data-1.h5", h, w, c)
    else:
        data.read_raw_into(root / "data-1.h5", np.empty((h, w, c), np.float32), np.empty((h, w), np.uint8), h, w, c)
except KitError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("how", ["read_raw", "read_raw_into", "stats"])
@pytest.mark.parametrize("kind", ["external link", "external storage", "virtual", "soft link"])
def test_an_hdf5_dataset_stored_elsewhere_is_refused_before_it_is_opened(tmp_path, how, kind):
    """Found by the fuzzer: a dataset that is an external link, or whose data lies in external
    storage, to a FIFO blocked read_raw, read_raw_into and load_stats forever (HDF5 opens the
    other path to read it; seed 3, cases 822, 1137, 1461). A dataset is read from the file itself."""
    import os

    import h5py
    h, w, c = fuzz.DEEPCAM_HWC
    sample, stats = deepcam_files(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    path, name = (stats, "climate/mean") if how == "stats" else (sample, "climate/data")
    with h5py.File(path, "a") as f:
        shape, dtype = f[name].shape, f[name].dtype
        del f[name]
        if kind == "external link":
            f[name] = h5py.ExternalLink(str(tmp_path / "fifo"), "/x")
        elif kind == "soft link":
            f[name + "_"] = np.ones(shape, dtype)
            f[name] = h5py.SoftLink("/" + name + "_")
        elif kind == "external storage":
            size = dtype.itemsize * int(np.prod(shape))
            f.create_dataset(name, shape=shape, dtype=dtype, external=[(str(tmp_path / "fifo"), 0, size)])
        else:
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource(str(tmp_path / "fifo"), "x", shape=shape)
            f.create_virtual_dataset(name, layout)
    proc = run_limited(READ_DEEPCAM, tmp_path, how, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"error: {path}: {'stats.h5 ' if how == 'stats' else ''}'{name}' is "), lines


@pytest.mark.parametrize("bench, key, value, expected", [
    ("deepcam", "train.class_frequencies", "[0.9, 0.05, [0.05]]", "'train.class_frequencies[2]' in config file "
                                                                  "{path}: expected a number, got [0.05]"),
    ("deepcam", "model.aspp_rates", "[6, 12.5, 18]", "'model.aspp_rates[1]' in config file {path}: expected an "
                                                     "integer, got 12.5"),
    ("oc20", "optimizer.betas", "[0.9, text]", "'optimizer.betas[1]' in config file {path}: expected a number, "
                                               "got 'text'"),
    ("deepcam", "model.aspp_rates", "[3, 6, 9]", [3, 6, 9]),
    ("oc20", "optimizer.betas", "[0, 0.5]", [0.0, 0.5]),
])
def test_a_list_of_numbers_in_a_config_takes_numbers_only(tmp_path, bench, key, value, expected):
    """Found by the fuzzer: a config list of numbers holding a list (class_frequencies: [.., [..]])
    passed load_config and was a TypeError traceback in DeepCAM's validate_config (seed 3,
    case 1151): the items of a list of numbers keep their type as every other value does."""
    import importlib

    from hpckit.common.config import load_config
    section, name = key.split(".")
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: mini\n{section}:\n  {name}: {value}\n")
    if isinstance(expected, list):   # numbers are taken, an int where the base has floats as a float
        cfg = load_config(bench, str(path))
        importlib.import_module(f"hpckit.{bench}.train").validate_config(cfg)
        assert cfg[section][name] == expected and [type(v) for v in cfg[section][name]] == [type(v) for v in expected]
        return
    with pytest.raises(KitError) as e:
        load_config(bench, str(path))
    assert str(e.value) == f"config key {expected.format(path=path)}"


@pytest.mark.parametrize("field", ["perf_value", "job_completion_time"])
def test_a_perflog_value_is_shown_in_a_few_words(tmp_path, field):
    """Found by the fuzzer: a bad perf_value or time was quoted whole in the error, a line of
    5,000 or 16,000 characters (seed 4, cases 583, 1051)."""
    from hpckit.results.perflog import read_perflogs
    row = {"job_completion_time": "2026-11-21T11:46:33", "display_name": "DeepCAMCheck", "perf_var": "epochs",
           "perf_value": "7"}
    row[field] = "9" * 5000
    path = tmp_path / "Check.log"
    path.write_text("|".join(row) + "\n" + "|".join(row.values()) + "\n")
    with pytest.raises(KitError) as e:
        read_perflogs([str(path)])
    message = str(e.value)
    assert message.startswith(f"--perflog {path}: line 2: bad value or time (") and "'9999" in message, message
    assert len(message) < 300, f"{len(message)} characters"


@pytest.mark.parametrize("text", ["data:\n  n_train: {long}\n", "base: {long}\n", "data:\n  ? {long}\n  : 1\n",
                                  "data:\n  shuffle: {long}\n", "data:\n  loader_workers: {long}\n"])
def test_a_config_value_is_shown_in_a_few_words(tmp_path, text):
    """Found by the fuzzer: a wrong value was quoted whole in the error, a line of 5,000
    characters (seed 4, case 1763); a key likewise."""
    from hpckit.common.config import load_config
    path = tmp_path / "mine.yaml"
    path.write_text(("base: mini\n" if not text.startswith("base") else "") + text.format(long="y" * 5000))
    with pytest.raises(KitError) as e:
        load_config("deepcam", str(path))
    assert f"config file {path}" in str(e.value) and "yyy" in str(e.value), e.value
    assert len(str(e.value)) < len(str(path)) + 250, f"{len(str(e.value))} characters: {str(e.value)[:300]}"


def test_an_integer_beyond_a_float_for_a_number_key_is_one_line(tmp_path):
    """Found by the fuzzer: 10**400 for a float key (optimizer.momentum) was float()'s
    OverflowError traceback through load_config (seed 5, case 1052)."""
    from hpckit.common.config import load_config
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: mini\noptimizer:\n  momentum: {10 ** 400}\n")
    with pytest.raises(KitError) as e:
        load_config("cosmoflow", str(path))
    assert str(e.value).startswith(f"config key 'optimizer.momentum' in config file {path}: 1000"), e.value
    assert str(e.value).endswith(" is too large a number")
    with pytest.raises(KitError, match=r"^config key 'optimizer.momentum' in --set: 1000.* is too large a number$"):
        load_config("cosmoflow", "mini", [f"optimizer.momentum={10 ** 400}"])


@pytest.mark.parametrize("shape", [(2 ** 64,), (2 ** 62, 16, 16, 4), (16, 16, 16, 2 ** 63)])
def test_an_npy_shape_beyond_int64_is_one_line(tmp_path, shape):
    """Found by the long campaign: a header whose shape multiplies past int64 was
    OverflowError in rawread's extent size (np.prod with dtype int64), a traceback through
    read_sample_into (seed 1, cases 110, 13394); sizes are Python integers, checked against the file."""
    from hpckit.cosmoflow import data
    header = f"{{'descr': '<i2', 'fortran_order': False, 'shape': {shape}, }}"
    split = npy_split(tmp_path, data=fuzz.npy_build(header, bytes(64)))
    with pytest.raises(KitError) as e:
        data.read_sample_into(split, 0, SIZE, np.empty((SIZE,) * 3 + (4,), np.int16), np.empty(4, np.float32))
    assert str(e.value).startswith(f"{split.files[0]}: "), e.value
    from hpckit.common import rawread
    fd, st = rawread.open_regular(split.files[0])
    try:
        with pytest.raises(KitError, match="truncated or damaged: the array needs bytes"):
            rawread.npy_extent(fd, split.files[0], st.st_size)
    finally:
        os.close(fd)


def test_an_oc20_storage_with_a_damaged_pickle_protocol_prints_nothing():
    """Found by the long campaign: a flipped byte in a tensor storage's pickle header (protocol
    131) was read, but torch printed a UserWarning on stderr: a second line beside the
    command's (seed 1, case 16285). The reader prints nothing."""
    import warnings

    import torch
    from hpckit.oc20.records import check_fields, dumps_record, loads_record
    n, e = 2, 2
    fields = {"pos": torch.zeros(n, 3), "atomic_numbers": torch.full((n,), 6.0), "cell": torch.eye(3)[None],
              "natoms": n, "edge_index": torch.tensor([[0, 1], [1, 0]]),
              "cell_offsets": torch.zeros(e, 3, dtype=torch.int64), "y": 0.5, "force": torch.zeros(n, 3),
              "fixed": torch.zeros(n), "tags": torch.zeros(n, dtype=torch.int64), "sid": 1, "fid": 0}
    raw = dumps_record(fields)
    head = b"_load_from_bytes\x94\x93\x94B"          # a storage: BINBYTES of torch's legacy format
    k = raw.index(head) + len(head) + 4
    assert raw[k:k + 2] == b"\x80\x02"                # its pickle's PROTO 2
    damaged = raw[:k + 1] + b"\x83" + raw[k + 2:]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        read = check_fields(loads_record(damaged), "x")
    assert [str(w.message)[:60] for w in seen] == [] and torch.equal(read["edge_index"], fields["edge_index"])


@pytest.mark.parametrize("layers", [2 ** 31 - 1, 2 ** 63, 10 ** 40, 8])
def test_a_count_of_poolings_beyond_the_sample_is_one_line_at_once(layers):
    """Found by the long campaign (seed 2, case 3887): a huge model.n_conv_layers made the
    CosmoFlow config check compute 2 ** n, which never ended. Refused first: a 16^3 sample
    halves at most 5 times."""
    from hpckit.common.config import load_config
    from hpckit.cosmoflow.model_spec import validate_model_config
    cfg = load_config("cosmoflow", "mini", ["data.sample_size=16", f"model.n_conv_layers={layers}"])
    with pytest.raises(KitError, match="model.n_conv_layers"):   # (before: never returned)
        validate_model_config(cfg)


def test_a_template_hit_with_a_bad_name_is_one_line_naming_the_shard(tmp_path):
    """Found by the fuzzer's first OpenFold campaign (seed 7, cases 757 and 1965): a template hit
    of a pdb70_hits.hhr whose name is not PDBID_chain was refused in a line that named the
    chain and the file's name inside the shard, not a file of the data set. The line names
    the shard it was read from."""
    import json
    import re as _re

    from hpckit.cli import main
    root = tmp_path / "openfold"
    assert main(["datagen", "openfold", "--config", "mini", "--out", str(root), "--train", "4", "--valid", "2",
                 "--seed", "1", "--workers", "1"]) == 0
    align = root / "open_protein_set" / "processed" / "pdb_alignments"
    index = json.loads((align / "super.index").read_text())
    damaged = None
    for key, entry in index.items():
        name, start, size = next(f for f in entry["files"] if f[0] == "pdb70_hits.hhr")
        shard = align / entry["db"]
        data = shard.read_bytes()
        text = data[start:start + size].decode()
        m = _re.search(r"^>(\w{4}_\w+) ", text, _re.M)
        if m:   # the same number of bytes, so that every offset of the index stays right
            bad = text[:m.start(1)] + "0" * len(m.group(1)) + text[m.end(1):]
            shard.write_bytes(data[:start] + bad.encode() + data[start + size:])
            damaged = (key, shard)
            break
    assert damaged, "no chain of the tiny set has a template hit"
    messages = []
    for how in ("train", "eval"):
        try:
            fuzz._read_openfold(root, how)
        except KitError as e:
            messages.append(str(e))
    assert messages, "the damaged hit was read"
    for message in messages:
        assert message.startswith(f"{damaged[1]} (") and f"key '{damaged[0]}'" in message, message
        assert "not PDBID_chain" in message, message


@pytest.mark.parametrize("setting", ["model.evoformer_stack.c_hidden_opm=18446744073709551615",
                                     "model.extra_msa_stack.num_blocks=1000000",
                                     # seed 4243, case 8319 (issue 48's campaign): a head's width
                                     "model.auxiliary_heads.masked_msa_head.c_out=9223372036854775808"])
def test_an_openfold_model_size_beyond_reason_is_one_line(setting):
    """Found by CI's campaign once openfold.yaml was among its configs (seed 41, case 239): a
    width of 2^64 - 1 passed the config check into the model's construction on the meta device
    (for the parameter count) and ended in a traceback there; a million blocks would build for
    hours. Widths, counts and blocks are bounded first, one line naming the key."""
    from hpckit.common.config import load_config
    from hpckit.openfold.train import validate_config
    cfg = load_config("openfold", "mini", [setting])
    with pytest.raises(KitError, match=setting.split("=")[0].replace(".", r"\.") + ".*must be an integer in 1\\.\\."):
        validate_config(cfg)


@pytest.mark.slow   # the replay builds the campaign's corpus
def test_an_openfold_pipeline_setting_out_of_range_says_config_key(tmp_path):
    """Found by the 20,000-case campaign of issue 48 (seed 4242, case 14499): openfold.yaml with
    data.max_msa_clusters = 2^63 was refused in one line, but the line ("data.max_msa_clusters:
    must be ...") said neither the file nor that it is a config key, as every other config
    refusal does. Replayed here, through `hpckit train` as the campaign ran it."""
    from hpckit.common.config import load_config
    from hpckit.openfold.train import validate_config
    cfg = load_config("openfold", "mini", ["data.max_msa_clusters=9223372036854775808"])
    with pytest.raises(KitError, match=r"^config key 'data\.max_msa_clusters': must be an integer in 1\.\.4096"):
        validate_config(cfg)
    proc = subprocess.run([sys.executable, str(fuzz.REPO / "tests" / "fuzz.py"), "--work", str(tmp_path), "--seed",
                           "4242", "--first", "14499", "--cases", "1"], capture_output=True, text=True, timeout=600,
                          cwd=fuzz.REPO, env={**os.environ, "PYTHONPATH": str(fuzz.REPO / "apps")})
    assert proc.returncode == 0 and "FINDING" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
