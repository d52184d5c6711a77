"""No input the kit reads runs code or crashes the interpreter (issue 41, docs/security.md).

* The source scan: every call in the kit's source (apps/hpckit, bench, reframe_checks,
  site_profiles) that can run code from what it reads (unpickling, torch.load without
  weights_only, np.load with allow_pickle, yaml.load with a loader that builds objects,
  eval / exec, a shell) or map a file into memory is listed in tests/security_allowlist.txt
  with the reason it is safe; anything else is a failure naming file:line.
* Pickles: an OC20 LMDB whose "length" entry is a pickle that runs a command is one line
  naming the file and key, exit 2, and the command never runs.
* Truncation: a file cut short, for every benchmark and format, read record by record
  through the kit's real readers in a subprocess (a SIGBUS is then a signal exit, not the
  end of pytest): one line naming the file, exit 2.
"""

from __future__ import annotations

import ast
import os
import pickle
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import background
from conftest import NO_ALLOCATOR_RESTART, REPO, run_hpckit

# ---------------------------------------------------------------- the source scan

SCANNED = ("apps/hpckit/**/*.py", "bench/*.py", "reframe_checks/*.py", "site_profiles/**/*.py")
ALLOWLIST = Path(__file__).with_name("security_allowlist.txt")

# calls that unpickle (or load a format that runs code when loaded) whatever their arguments
UNPICKLING = {f"{m}.{f}" for m in ("pickle", "_pickle", "dill", "cloudpickle") for f in
              ("load", "loads", "_load", "_loads", "Unpickler", "_Unpickler")} | {
    "marshal.load", "marshal.loads", "shelve.open", "joblib.load", "pandas.read_pickle", "torch.jit.load"}
UNPICKLER_CLASSES = {"pickle.Unpickler", "pickle._Unpickler", "_pickle.Unpickler", "dill.Unpickler"}
SAFE_YAML_LOADERS = {"yaml.SafeLoader", "yaml.CSafeLoader"}
YAML_UNSAFE = {"yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all"}
SHELLS = {"os.system", "os.popen", "asyncio.create_subprocess_shell"}
MAPPING = {"mmap.mmap", "numpy.memmap", "lmdb.open", "lmdb.Environment"}


@dataclass(frozen=True)
class Finding:
    path: str       # relative to the repository root
    line: int
    scope: str      # the enclosing class / function, dotted ("<module>" at the top level)
    kind: str       # what was found, e.g. "pickle.loads", "torch.load without weights_only=True"

    def __str__(self):
        return f"{self.path}:{self.line}: {self.kind} (in {self.scope})"


def _aliases(tree: ast.AST) -> dict[str, set[str]]:
    """Local name -> the qualified names it is bound to by any import in the file (the kit
    imports inside functions, so every import counts, wherever it is)."""
    names: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names.setdefault(a.asname, set()).add(a.name)
                else:
                    top = a.name.split(".")[0]
                    names.setdefault(top, set()).add(top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names.setdefault(a.asname or a.name, set()).add(f"{node.module}.{a.name}")
    return names


def _qualified(node: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    """The qualified names an expression (a name or an attribute chain) may refer to: `np.load`
    with `import numpy as np` is numpy.load; a bare name not imported is a builtin."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return set()
    tail = ".".join(reversed(parts))
    bases = aliases.get(node.id, {f"builtins.{node.id}"} if not parts else {node.id})
    return {f"{b}.{tail}" if tail else b for b in bases}


def _keyword(call: ast.Call, name: str, position: int | None = None):
    """The argument node given as keyword `name` (or at `position`), or None."""
    for k in call.keywords:
        if k.arg == name:
            return k.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _is_const(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _call_findings(call: ast.Call, aliases: dict[str, set[str]]) -> list[str]:
    names = _qualified(call.func, aliases)
    found = []
    for name in sorted(names):
        if name in UNPICKLING:
            found.append(name)
        elif name == "torch.load" and not _is_const(_keyword(call, "weights_only"), True):
            found.append("torch.load without weights_only=True")
        elif name == "numpy.load":
            pickle_arg = _keyword(call, "allow_pickle", 2)
            if pickle_arg is not None and not _is_const(pickle_arg, False):
                found.append("numpy.load with allow_pickle not False")
            mmap_arg = _keyword(call, "mmap_mode", 1)
            if mmap_arg is not None and not _is_const(mmap_arg, None):
                found.append("numpy.load with mmap_mode")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(call, "Loader", 1)
            if loader is None or not _qualified(loader, aliases) & SAFE_YAML_LOADERS:
                found.append(f"{name} with a loader other than SafeLoader / CSafeLoader")
        elif name in YAML_UNSAFE or name in SHELLS or name in MAPPING:
            found.append(name)
        elif name in ("builtins.eval", "builtins.exec"):
            found.append(name.split(".")[1])
        elif name.startswith("subprocess."):
            shell = _keyword(call, "shell")
            if shell is not None and not _is_const(shell, False):
                found.append(f"{name} with shell=True")
    return found


def scan_source(text: str, path: str) -> list[Finding]:
    """The findings in one file's source (see the module doc)."""
    tree = ast.parse(text, filename=path)
    aliases = _aliases(tree)
    found: list[Finding] = []

    def visit(node: ast.AST, scope: list[str]):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _qualified(base, aliases) & UNPICKLER_CLASSES:
                    found.append(Finding(path, node.lineno, ".".join(scope + [node.name]), "pickle.Unpickler subclass"))
        if isinstance(node, ast.Call):
            for kind in _call_findings(node, aliases):
                found.append(Finding(path, node.lineno, ".".join(scope) or "<module>", kind))
        named = isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        inner = scope + [node.name] if named else scope
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, [])
    return found


def scanned_files() -> list[Path]:
    return sorted({p for pattern in SCANNED for p in REPO.glob(pattern) if p.is_file()})


@dataclass(frozen=True)
class Allowed:
    path: str
    scope: str
    kind: str
    reason: str
    line: int       # in the allow-list file

    def covers(self, f: Finding) -> bool:
        return (f.path, f.scope, f.kind) == (self.path, self.scope, self.kind)


def read_allowlist(text: str) -> list[Allowed]:
    """Entries `file | scope | kind | reason`, one a line; '#' starts a comment line. A
    line with another number of fields, or without a reason, is an error naming it."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 4 or not all(fields) or len(fields[3].split()) < 4:
            raise ValueError(f"{ALLOWLIST.name}:{n}: expected 'file | scope | kind | reason (why it is safe)': "
                             f"{line!r}")
        out.append(Allowed(*fields, n))
    return out


def unexplained(findings: list[Finding], allowed: list[Allowed]) -> tuple[list[Finding], list[Allowed]]:
    """(findings no entry covers, entries that cover no finding)."""
    bad = [f for f in findings if not any(a.covers(f) for a in allowed)]
    stale = [a for a in allowed if not any(a.covers(f) for f in findings)]
    return bad, stale


def test_the_source_runs_nothing_it_reads_outside_the_allowlist():
    findings = []
    for p in scanned_files():
        findings += scan_source(p.read_text(), str(p.relative_to(REPO)))
    bad, stale = unexplained(findings, read_allowlist(ALLOWLIST.read_text()))
    assert not bad, ("calls that can run code from what they read, or map a file, not in "
                     f"{ALLOWLIST.name} (add one with the reason it is safe, or remove the call):\n"
                     + "\n".join(map(str, bad)))
    assert not stale, (f"{ALLOWLIST.name} entries that match nothing in the source (remove them):\n"
                       + "\n".join(f"{ALLOWLIST.name}:{a.line}: {a.path} | {a.scope} | {a.kind}" for a in stale))
    assert len(scanned_files()) > 50   # the globs found the kit's source


UNSAFE_YAML = "yaml.load with a loader other than SafeLoader / CSafeLoader"


def findings_of(code: str) -> list[str]:
    return [f.kind for f in scan_source(code, "x.py")]


@pytest.mark.parametrize("code, kinds", [
    ("import pickle\npickle.loads(x)", ["pickle.loads"]),
    ("import pickle as p\np.load(f)", ["pickle.load"]),
    ("from pickle import loads as undo\nundo(x)", ["pickle.loads"]),
    ("import pickle\npickle.Unpickler(f).load()", ["pickle.Unpickler"]),
    ("import pickle\nclass Mine(pickle.Unpickler):\n    pass", ["pickle.Unpickler subclass"]),
    ("import pickle\npickle.dumps(x)", []),
    ("import torch\ntorch.load(f)", ["torch.load without weights_only=True"]),
    ("import torch\ntorch.load(f, weights_only=flag)", ["torch.load without weights_only=True"]),
    ("import torch\ntorch.load(f, map_location='cpu', weights_only=True)", []),
    ("import numpy as np\nnp.load(p, allow_pickle=True)", ["numpy.load with allow_pickle not False"]),
    ("import numpy\nnumpy.load(p, None, True)", ["numpy.load with allow_pickle not False"]),
    ("import numpy as np\nnp.load(p, allow_pickle=False)", []),
    ("import numpy as np\nnp.load(p)", []),
    ("import numpy as np\nnp.load(p, mmap_mode='r')", ["numpy.load with mmap_mode"]),
    ("import numpy as np\nnp.memmap(p)", ["numpy.memmap"]),
    ("import yaml\nyaml.load(s, Loader=yaml.FullLoader)", [UNSAFE_YAML]),
    ("import yaml\nyaml.load(s)", [UNSAFE_YAML]),
    ("import yaml\nyaml.unsafe_load(s)", ["yaml.unsafe_load"]),
    ("import yaml\nyaml.load(s, Loader=yaml.SafeLoader)", []),
    ("import yaml\nfrom yaml import CSafeLoader\nyaml.load_all(s, CSafeLoader)", []),
    ("import yaml\nyaml.safe_load(s)", []),
    ("eval(s)", ["eval"]),
    ("def f(s):\n    exec(s)", ["exec"]),
    ("import builtins\nbuiltins.eval(s)", ["eval"]),
    ("model.eval()", []),
    ("import subprocess\nsubprocess.run(c, shell=True)", ["subprocess.run with shell=True"]),
    ("from subprocess import Popen\nPopen(c, shell=s)", ["subprocess.Popen with shell=True"]),
    ("import subprocess\nsubprocess.run(['ls', d], check=True)", []),
    ("import subprocess\nsubprocess.check_output(c, shell=False)", []),
    ("import os\nos.system(c)", ["os.system"]),
    ("import os\nos.popen(c).read()", ["os.popen"]),
    ("import os\nos.path.join(a, b)", []),
    ("import lmdb\nlmdb.open(p)", ["lmdb.open"]),
    ("import mmap\nmmap.mmap(fd, 0)", ["mmap.mmap"]),
])
def test_the_scan_finds_what_it_must_and_nothing_else(code, kinds):
    assert findings_of(code) == kinds


def test_a_finding_is_reported_as_file_line_and_scope():
    code = "import pickle\n\n\nclass Reader:\n    def read(self, raw):\n        return pickle.loads(raw)\n"
    found = scan_source(code, "apps/hpckit/x.py")
    assert [str(f) for f in found] == ["apps/hpckit/x.py:6: pickle.loads (in Reader.read)"]


def test_the_allowlist_covers_by_file_scope_and_kind_and_names_stale_entries():
    found = scan_source("import pickle\ndef f(raw):\n    return pickle.loads(raw)\n", "a.py")
    entry = "a.py | f | pickle.loads | the bytes are written by this very process a line earlier"
    assert unexplained(found, read_allowlist(entry)) == ([], [])
    for other in ("b.py | f | pickle.loads | reason enough to be a reason",
                  "a.py | g | pickle.loads | reason enough to be a reason",
                  "a.py | f | pickle.load | reason enough to be a reason"):
        bad, stale = unexplained(found, read_allowlist(other))
        assert bad == found and len(stale) == 1
    with pytest.raises(ValueError, match="expected 'file | scope | kind | reason"):
        read_allowlist("a.py | f | pickle.loads")
    with pytest.raises(ValueError, match=":2: expected"):
        read_allowlist("# comment\na.py | f | pickle.loads | safe")   # a reason says why, in words


# ---------------------------------------------------------------- data sets

@pytest.fixture(scope="module")
def oc20_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("oc20") / "data"
    run_hpckit("datagen", "oc20", "--config", "mini", "--out", root, "--train", 16, "--valid", 8, "--seed", 3,
               check=True)
    return root


def oc20_train(root: Path, out: Path) -> subprocess.CompletedProcess:
    return run_hpckit("train", "oc20", "--data", root, "--config", "mini", "--output-dir", out,
                      "--set", "data.n_train=16", "--set", "data.n_valid=8", "--set", "train.n_epochs=1",
                      *NO_ALLOCATOR_RESTART)


def put(path: Path, key: bytes, value: bytes) -> None:
    """Rewrite one entry of a (copied) LMDB file in place, as anyone who can write it could."""
    import lmdb
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False)
    with env.begin(write=True) as txn:
        txn.put(key, value)
    env.close()


class RunsCommand:
    """Pickles as a call of `func` with `arg`, as a hostile file would hold it."""

    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return self.func, (self.arg,)


@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_a_length_entry_that_runs_code_is_one_line_and_runs_nothing(oc20_data, tmp_path, how):
    """The issue's first case: `length` unpickled with plain pickle.loads ran the command (and
    its exit status, 0, was taken as the record count)."""
    root = tmp_path / "data"
    shutil.copytree(oc20_data, root)
    marker = tmp_path / "marker"
    payload = (RunsCommand(os.system, f"touch {marker}") if how == "os.system" else
               RunsCommand(exec, f"open({str(marker)!r}, 'w').close()"))
    path = root / "train" / "data.0000.lmdb"
    put(path, b"length", pickle.dumps(payload))
    named = {"os.system": f"{os.system.__module__}.system", "builtins.exec": "builtins.exec"}[how]
    proc = oc20_train(root, tmp_path / "out")
    lines = proc.stderr.strip().splitlines()
    assert not marker.exists(), f"the pickle in {path} ran {how}"
    assert proc.returncode == 2 and lines == [
        f"hpckit train: error: {path} key 'length': not a pickled record count (it names {named}, "
        "which a record count does not hold)"], proc.stderr[-3000:]


# Reads every record of a dataset through the kit's own reader, in its own process (a SIGBUS is
# then this process's signal, not pytest's): "read N" and exit 0, or the KitError's line, exit 2.
READ_ALL = r"""
import sys
from pathlib import Path
import numpy as np
from hpckit.common.errors import KitError
reader, root = sys.argv[1], Path(sys.argv[2])
n = 0
try:
    if reader.startswith("oc20"):
        import os
        from hpckit.oc20.records import LmdbFile
        for split in ("train", "validation"):
            for path in sorted((root / split).glob("*.lmdb")):
                f = LmdbFile(path)
                for i in range(f.length()):
                    f.read(i)
                    n += 1
                    if reader == "oc20.cut_while_reading" and n == 1:   # a copy over the file, under way
                        os.truncate(path, path.stat().st_size // 2)
    elif reader.startswith("deepcam"):
        from hpckit.deepcam import data
        h, w, c = (int(v) for v in sys.argv[3:6])
        data.load_stats(root, c)
        for split in data.find_dataset(root, 2, 1).values():
            for path in split.files:
                if reader == "deepcam.read_raw":
                    data.read_raw(path, h, w, c)
                else:
                    data.read_raw_into(path, np.empty((h, w, c), np.float32), np.empty((h, w), np.uint8), h, w, c)
                n += 1
    else:
        from hpckit.cosmoflow import data
        size = int(sys.argv[3])
        for split in data.find_dataset(root, 2, 1).values():
            for i in range(len(split)):
                if reader == "cosmoflow.read_sample":
                    data.read_sample(split, i, size)
                else:
                    data.read_sample_into(split, i, size, np.empty((size,) * 3 + (4,), np.int16),
                                          np.empty(4, np.float32))
                n += 1
except KitError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
print(f"read {n}")
"""

DEEPCAM_HWC = (16, 24, 16)
COSMO_SIZE = 16


def read_all(reader: str, root: Path, *args) -> subprocess.CompletedProcess:
    return background.guarded([sys.executable, "-c", READ_ALL, reader, root, *args], 300, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO / "apps")})


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, oc20_data) -> dict[str, Path]:
    """One small real dataset per benchmark and format, made by `hpckit datagen` (plain
    TFRecord: the GZIP files inflated, which the kit tells apart by their first bytes)."""
    import gzip
    base = tmp_path_factory.mktemp("formats")
    h, w, _ = DEEPCAM_HWC
    made = {"oc20": oc20_data, "deepcam": base / "deepcam", "tfrecord-gzip": base / "gz", "npy": base / "npy"}
    run_hpckit("datagen", "deepcam", "--config", "mini", "--out", made["deepcam"], "--train", 2, "--valid", 1,
               "--height", h, "--width", w, check=True)
    for fmt, key in (("tfrecord", "tfrecord-gzip"), ("npy", "npy")):
        run_hpckit("datagen", "cosmoflow", "--config", "mini", "--out", made[key], "--train", 2, "--valid", 1,
                   "--size", COSMO_SIZE, "--format", fmt, check=True)
    made["tfrecord-plain"] = base / "plain"
    shutil.copytree(made["tfrecord-gzip"], made["tfrecord-plain"])
    for p in made["tfrecord-plain"].rglob("*.tfrecord"):
        p.write_bytes(gzip.decompress(p.read_bytes()))
    return made


# (reader, dataset, the file cut to half its size, the reader's extra arguments)
TRUNCATIONS = {
    "oc20-lmdb": ("oc20", "oc20", "train/data.0000.lmdb", ()),
    "deepcam-hdf5-read_raw": ("deepcam.read_raw", "deepcam", "train/*.h5", DEEPCAM_HWC),
    "deepcam-hdf5-read_raw_into": ("deepcam.read_raw_into", "deepcam", "train/*.h5", DEEPCAM_HWC),
    "deepcam-hdf5-stats": ("deepcam.read_raw", "deepcam", "stats.h5", DEEPCAM_HWC),
    "cosmoflow-tfrecord-gzip": ("cosmoflow.read_sample", "tfrecord-gzip", "train/*.tfrecord", (COSMO_SIZE,)),
    "cosmoflow-tfrecord-plain": ("cosmoflow.read_sample", "tfrecord-plain", "train/*.tfrecord", (COSMO_SIZE,)),
    "cosmoflow-tfrecord-read_sample_into": ("cosmoflow.read_sample_into", "tfrecord-gzip", "train/*.tfrecord",
                                            (COSMO_SIZE,)),
    "cosmoflow-npy-data-read_sample": ("cosmoflow.read_sample", "npy", "train/*_data.npy", (COSMO_SIZE,)),
    "cosmoflow-npy-data-read_sample_into": ("cosmoflow.read_sample_into", "npy", "train/*_data.npy", (COSMO_SIZE,)),
    "cosmoflow-npy-label-read_sample": ("cosmoflow.read_sample", "npy", "train/*_label.npy", (COSMO_SIZE,)),
    "cosmoflow-npy-label-read_sample_into": ("cosmoflow.read_sample_into", "npy", "train/*_label.npy",
                                             (COSMO_SIZE,)),
}


@pytest.mark.parametrize("case", list(TRUNCATIONS))
def test_a_truncated_file_is_one_line_naming_it_for_every_reader(datasets, tmp_path, case):
    """A copy interrupted halfway, read record by record: the LMDB was SIGBUS (exit 135)."""
    reader, dataset, pattern, args = TRUNCATIONS[case]
    root = tmp_path / "data"
    shutil.copytree(datasets[dataset], root)
    whole = read_all(reader, root, *args)
    assert whole.returncode == 0 and whole.stdout.startswith("read "), whole.stderr[-3000:]
    cut = sorted(root.glob(pattern))[0]
    size = cut.stat().st_size
    os.truncate(cut, size // 2)
    proc = read_all(reader, root, *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode} (a negative one is a signal): {proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith(f"error: {cut}"), proc.stderr[-3000:]


def test_training_on_a_truncated_lmdb_is_one_line_and_exit_2(oc20_data, tmp_path):
    """The issue's second case, through `hpckit train`: it was SIGBUS, exit 135, no line."""
    root = tmp_path / "data"
    shutil.copytree(oc20_data, root)
    cut = root / "train" / "data.0000.lmdb"
    size = cut.stat().st_size
    os.truncate(cut, size // 2)
    proc = oc20_train(root, tmp_path / "out")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith(f"hpckit train: error: {cut}: truncated: its LMDB header says "
                                                   f"it holds {size // 4096} pages of 4096 bytes"), lines


def test_a_value_size_past_the_end_of_the_file_is_one_line_naming_file_and_key(oc20_data, tmp_path):
    """A damaged node (its value's size grown by a flipped byte, not its file cut): LMDB would
    copy the value from past the end of the file (SIGBUS)."""
    from hpckit.oc20.records import LmdbFile
    root = tmp_path / "data"
    shutil.copytree(oc20_data, root)
    path = root / "validation" / "data.0000.lmdb"
    f = LmdbFile(path)
    try:
        length = len(f.raw(2))
    finally:
        f.close()
    content = bytearray(path.read_bytes())
    # the leaf node of key "2": size lo, size hi, flags F_BIGDATA (on overflow pages), key size 1, key
    node = struct.pack("=HHHH", length & 0xFFFF, length >> 16, 0x01, 1) + b"2"
    assert content.count(node) == 1
    at = content.index(node)
    struct.pack_into("=H", content, at + 2, 0x00FF)   # the size's high half: 16 MiB more
    path.write_bytes(bytes(content))
    proc = read_all("oc20", root)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode} (a negative one is a signal): {proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith(f"error: {path} key '2': damaged: its value of "
                                                   f"{length + (0xFF << 16)} bytes at byte "), lines


def test_an_lmdb_cut_while_it_is_read_is_one_line_naming_it(oc20_data, tmp_path):
    """The file shrinks after it was opened and checked (a copy over it truncates it first):
    each key is checked against the file's size at its read, not at the open."""
    root = tmp_path / "data"
    shutil.copytree(oc20_data, root)
    proc = read_all("oc20.cut_while_reading", root)
    lines = proc.stderr.strip().splitlines()
    path = root / "train" / "data.0000.lmdb"
    assert proc.returncode == 2, f"exit {proc.returncode} (a negative one is a signal): {proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith(f"error: {path} key "), lines
