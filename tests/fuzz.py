"""Fuzzing the kit's readers, bounded and seeded (issue 41, docs/security.md).

    .venv/bin/python tests/fuzz.py [--cases 300] [--seed 1] [--first 0] [--formats a,b,...]
                                   [--timeout 20] [--keep DIR] [--work DIR] [--runs RUN ...] [-v]
    make fuzz CASES=20000 SEED=1

For every on-disk format the kit reads, small valid files are made by the kit's own writers
(`hpckit datagen` at tiny sizes, tfrecord.encode_example, oc20.records.dumps_record, h5py as
datagen writes, the MLPerf logger, write_summary, the site profiles' perflog format, configs
dumped from the built-in mini ones; `--runs`: also the mlperf.log and summary.json of real
kit runs). Each case copies one data set, damages ONE file with a seeded mutation and runs
the kit's REAL reader on it:

| format | reader |
|---|---|
| tfrecord-gzip, tfrecord-plain | cosmoflow.data.find_dataset (SplitFiles), read_sample / read_sample_into |
| npy | the same, on the npy layout (the data, the labels or a file list damaged) |
| hdf5 | deepcam.data.find_dataset, load_stats, read_raw / read_raw_into |
| lmdb | oc20.data.find_dataset (LmdbFile.length), LmdbSplit.read of every record |
| openfold | openfold.records (chains.csv, AlignmentIndex, the training and CAMEO selections), then transforms.make_example of every selected chain; or read_sample of every chain |
| mllog | results.logs.parse_log, strict and not |
| summary | common.summary.read_summary |
| perflog | results.perflog.read_perflogs (the file, or the folder holding it) |
| config | common.config.load_config on a YAML file, then the benchmark's validate_config |

Mutations: the file cut at a random point, bytes flipped, inserted or deleted, a 1/2/4/8-byte
field set to an extreme (0, 2^31-1, 2^32-1, 2^63-1, 2^64-1, ...) anywhere or where the format
keeps a length (a TFRecord's length with its CRC made right, a protobuf length or wire type,
the .npy header's length, shape and dtype, LMDB's meta page and node sizes, HDF5 addresses),
JSON / YAML / log values swapped for another type or an extreme, keys removed or doubled,
deep nesting, valid files of the wrong content written by the kit's writers (a tensor whose
view lies past its storage, labels out of range, NaN), the file replaced by a FIFO, a
directory or a symlink loop; structural damage (issue 48): in OpenFold's mmCIF dicts a dict
key nested deep or doubled through the memo, a value doubled through the memo or an integer
of thousands of digits, a list holding itself, chains sharing one long sequence and its
zeros' zlib (kilobytes inflating to gigabytes); in super.index overlapping, many or GiB
ranges (of a shard grown sparse); in the alignments 250,000 or 5,000,000 lines, long lines,
the hhr summary line that made the reference's regular expression backtrack, gap-only and
thousand-digit fields; and planted code: a pickle calling os.system / exec / eval /
subprocess in the LMDB `length` and records (also inside a torch storage), an .npy object
array and a YAML python tag, each of which would create the file FUZZ-MARKER.

The readers run in a worker process that imports the kit once and forks a child per case
(tests/forkserver.py's model): the child's only outcomes allowed are exit 0 with the data
read, or one KitError: exit 2 and one line on stderr naming a file of the case (or, for a
config, a config key). A finding is anything else: another exception (its traceback), a
signal (SIGSEGV, SIGBUS), no answer within --timeout seconds (the child is killed), output
beyond that one line, a line of more than 2,000 characters (a value shown whole), a KitError
naming nothing, or the marker file. The child runs under
a 3 GiB address-space limit above what the worker maps (an allocation a damaged size asks
for is a MemoryError finding, not the machine's memory). The fuzzer prints the cases and
outcomes per format and every finding with its format, seed and case number, and exits 1
if there was one. `--seed S --first C --cases 1 [--formats F] --keep DIR` replays case C
and keeps its damaged input.

tests/test_fuzz.py runs 1,200 cases in CI and checks the oracle on the kit's former
unsafe reading (pickle.loads of `length`, LMDB mapped unchecked): the fuzzer finds it.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import json
import os
import pickle
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = "FUZZ-MARKER"             # created (in the case's folder, the child's cwd) by a planted pickle
FIFO = "fuzz-fifo"                 # a FIFO a damaged file may link to (made beside it and in the cwd)
MAX_LINE = 2000                    # an error line longer than this (a value shown whole) is not one to read
COSMO_SIZE = 16
DEEPCAM_HWC = (16, 24, 16)
OC20_COUNTS = (2, 1)               # train, validation records
MEMORY_HEADROOM = 3 << 30          # a child's address space: what the worker maps plus this
BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")
OPENFOLD_COUNTS = (4, 2)           # training, validation chains (datagen adds 4 the training filter drops)
REAL_RUN_FILES = ("mlperf.log", "summary.json")

# ================================================================== the worker (runs the readers)


def _import_readers() -> None:
    """Everything the readers use, imported once in the worker (its children share it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import h5py  # noqa: F401
    import lmdb  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import yaml  # noqa: F401
    import hpckit.cli  # noqa: F401
    import hpckit.common.config  # noqa: F401
    import hpckit.common.summary  # noqa: F401
    import hpckit.common.tfrecord  # noqa: F401
    import hpckit.cosmoflow.data  # noqa: F401
    import hpckit.deepcam.data  # noqa: F401
    import hpckit.oc20.data  # noqa: F401
    import hpckit.openfold.records  # noqa: F401
    import hpckit.openfold.transforms  # noqa: F401
    import hpckit.results.logs  # noqa: F401
    import hpckit.results.perflog  # noqa: F401
    for bench in BENCHMARKS:
        __import__(f"hpckit.{bench}.train")


def _read_cosmoflow(root: Path, how: str) -> str:
    import numpy as np
    from hpckit.cosmoflow import data
    n = 0
    for split in data.find_dataset(root, 1, 1).values():
        for i in range(len(split)):
            if how == "read_sample":
                x, y = data.read_sample(split, i, COSMO_SIZE)
                if x.shape != (COSMO_SIZE,) * 3 + (4,) or y.shape != (4,):
                    raise AssertionError(f"read_sample returned {x.shape} {y.shape}")
            else:
                data.read_sample_into(split, i, COSMO_SIZE, np.empty((COSMO_SIZE,) * 3 + (4,), np.int16),
                                      np.empty(4, np.float32))
            n += 1
    return f"{n} samples"


def _read_deepcam(root: Path, how: str) -> str:
    import numpy as np
    from hpckit.deepcam import data
    h, w, c = DEEPCAM_HWC
    n = 0
    splits = data.find_dataset(root, 1, 1)
    data.load_stats(root, c)
    for split in splits.values():
        for path in split.files:
            if how == "read_raw":
                x, y = data.read_raw(path, h, w, c)
                if x.shape != (h, w, c) or y.shape != (h, w):
                    raise AssertionError(f"read_raw returned {x.shape} {y.shape}")
            else:
                data.read_raw_into(path, np.empty((h, w, c), np.float32), np.empty((h, w), np.uint8), h, w, c)
            n += 1
    return f"{n} samples"


def _read_oc20(root: Path, how: str) -> str:
    from hpckit.oc20 import data
    n = 0
    for split in data.find_dataset(root, *OC20_COUNTS).values():
        for i in range(len(split)):
            split.read(i)
            n += 1
    return f"{n} records"


def _read_openfold(root: Path, how: str) -> str:
    """As `hpckit train openfold` reads its data set: the layout's files, chains.csv, the
    alignment index, the reference's training and CAMEO selections and sampling weights, then
    every selected chain's records (mmCIF dict, alignments, template hits with obsolete.dat)
    made into the model's features, in training or evaluation mode; or ("all") every chain's
    records, selected or not."""
    from hpckit.common.config import load_config
    from hpckit.openfold import records
    from hpckit.openfold import train as T
    from hpckit.openfold import transforms as TR
    cfg = load_config("openfold", "mini")
    t = cfg["train"]
    dc = TR.data_config(cfg)
    layout, _ = T.find_layout(str(root))
    chains = records.read_chains(layout.chains)
    index = records.AlignmentIndex(layout.alignments)
    selected = {"train": records.training_chains(chains, index, t["train_max_pdb_release_date"],
                                                 t["filter_by_alignments"]),
                "eval": records.validation_chains(chains, index, t["val_min_cameo_submission_date"],
                                                  t["val_max_cameo_submission_date"], t["val_max_sequence_length"],
                                                  t["filter_by_alignments"], chains_path=str(layout.chains))}
    records.sampler_weights(selected["train"])
    if how == "all":     # every chain's records, selected or not (each dicts file and alignment read)
        for chain in chains:
            records.read_sample(chain, layout, index)
        return f"{len(chains)} chains' records"
    source = TR.template_source(chains, layout, dc, how)
    n = 0
    for k, chain in enumerate(selected[how]):
        example = TR.make_example(records.read_sample(chain, layout, index), source, dc, how, 1000 + k)
        if "aatype" not in example:
            raise AssertionError(f"make_example returned {sorted(example)[:5]}")
        n += 1
    return f"{n} {how} samples"


def _read_mllog(root: Path, how: str) -> str:
    from hpckit.results.logs import parse_log
    strict, name = how.split(":", 1)
    run = parse_log(root / name, strict=strict == "strict")
    return f"converged={run.converged} epochs={run.epochs}"


def _read_summary(root: Path, how: str) -> str:
    from hpckit.common.summary import read_summary
    return f"{len(read_summary(root / how))} keys"


def _read_perflog(root: Path, how: str) -> str:
    from hpckit.results.perflog import read_perflogs
    rows = read_perflogs([str(root if how == "folder" else root / "local" / "default" / "Check.log")])
    return f"{len(rows)} rows"


def _read_config(root: Path, how: str) -> str:
    import importlib
    from hpckit.common.config import load_config
    cfg = load_config(how, str(root / f"{how}.yaml"))
    importlib.import_module(f"hpckit.{how}.train").validate_config(cfg)
    return f"{len(cfg)} sections"


def _unsafe_lmdb(root: Path, how: str) -> str:
    """The oracle's check (tests/test_fuzz.py), not the kit: OC20 LMDBs read as the kit read
    them before issue 41 (lmdb mapped unchecked, `length` through pickle.loads)."""
    import lmdb
    n = 0
    for path in sorted(root.glob("*/*.lmdb")):
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            for _key, value in txn.cursor():   # every value, through the mapping, unchecked
                n += len(value) > 0
            pickle.loads(txn.get(b"length"))   # the unsafe reading this target stands for
    return f"{n} values"


def _unsafe_json(root: Path, how: str) -> str:
    """The oracle's check: summary.json through open() and json.loads, no kit reader."""
    with open(root / how) as f:
        return f"{len(json.load(f))} keys"


TARGETS = {"cosmoflow": _read_cosmoflow, "deepcam": _read_deepcam, "oc20": _read_oc20, "openfold": _read_openfold,
           "mllog": _read_mllog,
           "summary": _read_summary, "perflog": _read_perflog, "config": _read_config,
           "unsafe-lmdb": _unsafe_lmdb, "unsafe-json": _unsafe_json}


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(req: dict, out_path: str, err_path: str) -> None:
    """In the forked child: run one reader (or the corpus maker) and exit 0, 2 or 1."""
    import resource
    import traceback
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    code = 1
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if req.get("memory"):
            limit = _vm_size() + int(req["memory"])
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.chdir(req["cwd"])
        import torch
        torch.set_num_threads(1)
        from hpckit.common.errors import KitError
        try:
            if req["op"] == "corpus":
                make_corpus(Path(req["root"]), [Path(r) for r in req.get("runs", [])])
                print("corpus made")
            else:
                print(f"read: {TARGETS[req['target']](Path(req['root']), req['how'])}")
            code = 0
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            code = 2
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


WALL_FACTOR = 10   # a child starved of the CPU is still killed after this many times --timeout


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """(wait status, killed) of the child `pid`: killed after `timeout` seconds that it did not
    spend waiting for a CPU (background.counted_step, as the test suite's hang guards count: a
    case starved by other work on the machine is not a hang; the 20,000-case campaign of issue
    48 reported one, beside a load at a higher priority, which took 5 s when replayed alone),
    or after WALL_FACTOR times `timeout` whatever it waited for."""
    import background
    schedstat = os.path.exists("/proc/self/schedstat")
    start = last = time.monotonic()
    counted, cpu_seen, waited = 0.0, {}, False
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            now = time.monotonic()
            if waited:   # not before the first wait: most cases end within it, and /proc is not read
                counted += background.counted_step(background._tree(pid), cpu_seen, now - last, schedstat)
            last, waited = now, True
            if counted >= timeout or now - start >= WALL_FACTOR * timeout:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return os.waitpid(pid, 0)[1], True
            left = min(0.25, timeout - counted)
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _head_tail(text: str, n: int = 10000) -> str:
    """A long output's start (a traceback's first line) and end (the exception)."""
    return text if len(text) <= 2 * n else f"{text[:n]}\n[... {len(text) - 2 * n} characters ...]\n{text[-n:]}"


def serve() -> None:
    """The worker: one JSON request a line on stdin, one JSON answer a line on stdout."""
    _import_readers()
    scratch = tempfile.mkdtemp(prefix="hpckit-fuzz-worker-")
    out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
    for p in (out_path, err_path):
        open(p, "w").close()
    try:
        for line in sys.stdin:
            req = json.loads(line)
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:
                _child(req, out_path, err_path)
            status, hang = _wait(pid, float(req.get("timeout", 20)))
            with open(out_path, errors="replace") as f:
                out = _head_tail(f.read())
            with open(err_path, errors="replace") as f:
                err = f.read()
            lines = [ln for ln in err.splitlines() if ln.strip()]
            print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "hang": hang, "stdout": out,
                              "stderr": _head_tail(err), "stderr_lines": len(lines),
                              "stderr_longest": max(map(len, lines), default=0),
                              "seconds": round(time.monotonic() - start, 3)}), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class Worker:
    """The client side: starts the worker, restarts it when it dies."""

    def __init__(self):
        self.proc = None
        self.starts = 0

    def _start(self):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "apps"), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        self.starts += 1

    def run(self, req: dict) -> dict:
        """The worker's answer, or {"worker_died": ...} (then it is started again next time)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            # the worker kills a child at its timeout (_wait); it answers well within this
            ready, _, _ = select.select([self.proc.stdout], [], [],
                                        WALL_FACTOR * float(req.get("timeout", 20)) + 120)
            line = self.proc.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.close()
            return {"worker_died": True, "rc": None, "hang": False, "stdout": "", "stderr": ""}
        return json.loads(line)

    def close(self):
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# ================================================================== the corpus (in a worker child)

class _Call:
    """Pickles as a call of `func(*args)`: what a hostile file holds."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args

    def __call__(self, *args):   # pickle takes only a callable as the function of a reduce
        raise TypeError("a pickled call, not to be called here")


def planted_pickles() -> dict[str, bytes]:
    """Pickles that would create MARKER in the reader's cwd if anything unpickled them."""
    touch = f"open({MARKER!r}, 'w').close()"
    out = {"os.system": pickle.dumps(_Call(os.system, f"touch {MARKER}")),
           "builtins.exec": pickle.dumps(_Call(exec, touch)),
           "builtins.eval": pickle.dumps(_Call(eval, f"exec({touch!r})")),
           "subprocess.call": pickle.dumps(_Call(subprocess.call, ["touch", MARKER])),
           "posix.system-protocol0": f"cposix\nsystem\n(S'touch {MARKER}'\ntR.".encode(),
           "nested-in-a-dict": pickle.dumps({"length": 2, "x": _Call(os.system, f"touch {MARKER}")}),
           "getattr-chain": pickle.dumps(_Call(_Call(getattr, _Call(__import__, "os"), "system"), f"touch {MARKER}"))}
    return out


def _kit_log(path: Path, cfg: dict, prov: dict) -> None:
    """An MLPerf log as `hpckit train` writes it (the kit's MLPerf logger, the events in the
    order common/run.py logs them), its times made deterministic."""
    from hpckit.common import provenance
    from hpckit.common.config import flatten
    from hpckit.common.mllog import HPC, MLLogger, C
    log = MLLogger(path, echo=False)
    log.start(C.INIT_START)
    log.event(C.CACHE_CLEAR, True, {"method": "posix_fadvise_dontneed", "files": 4})
    for key, value in ((C.SEED, 1), ("number_of_ranks", 1), (HPC.NUMBER_OF_NODES, 1), (HPC.ACCELERATORS_PER_NODE, 0),
                       (C.SUBMISSION_BENCHMARK, "deepcam"), (C.SUBMISSION_ORG, "hpckit"),
                       (C.SUBMISSION_DIVISION, "closed"), (C.SUBMISSION_STATUS, "onprem"),
                       (C.SUBMISSION_PLATFORM, "fuzz")):
        log.event(key, value)
    log.event("hpckit_config", {"name": "mini", "framework": "pytorch", "ranks": 1, **flatten(cfg)})
    log.event(provenance.LOG_KEY, provenance.log_value(prov))
    for key, value in ((C.GLOBAL_BATCH_SIZE, 8), (C.TRAIN_SAMPLES, 64), (C.EVAL_SAMPLES, 16), (C.OPT_NAME, "adam")):
        log.event(key, value)
    log.end(C.INIT_STOP)
    log.start(C.RUN_START)
    log.start(C.STAGING_START)
    log.end(C.STAGING_STOP, metadata={"staging_duration": 0.5})
    for epoch, acc in enumerate((0.4, 0.7, 0.85), 1):
        log.start(C.EPOCH_START, metadata={"epoch_num": epoch})
        log.event("throughput", 40.0 + epoch, {"epoch_num": epoch})
        log.start(C.EVAL_START, metadata={"epoch_num": epoch})
        log.event(C.EVAL_ACCURACY, acc, {"epoch_num": epoch})
        log.end(C.EVAL_STOP, metadata={"epoch_num": epoch})
        log.end(C.EPOCH_STOP, metadata={"epoch_num": epoch})
    log.run_stop("success", epoch_num=3)
    log.close()
    lines = []
    for i, line in enumerate(path.read_text().splitlines()):
        head, rec = line.split(":::MLLOG ", 1)
        rec = json.loads(rec)
        rec["time_ms"] = 1_700_000_000_000 + 1000 * i
        lines.append(f"{head}:::MLLOG {json.dumps(rec)}")
    path.write_text("\n".join(lines) + "\n")


def _kit_summary(path: Path, prov: dict) -> None:
    """summary.json as Run._write_summary writes it, through the kit's write_summary."""
    from hpckit.common.summary import USAGE_FIGURES, software_stack, write_summary
    usage = {k: float(i + 1) for i, k in enumerate(USAGE_FIGURES)}
    usage.update(input_wait_share=0.25, gpu_busy_share=0.5, grad_allreduce_share=0.0, cpu_wait_share=0.1)
    write_summary(path, {
        "benchmark": "deepcam", "framework": "pytorch", "config": "mini", "status": "success", "converged": True,
        "time_to_train_s": 123.5, "staging_s": 0.5, "epochs": 3, "metric": "eval_accuracy", "target": 0.8,
        "final_eval_accuracy": 0.85, "train_samples_per_s": 41.0, "eval_samples_per_s": 120.0,
        "global_batch_size": 8, "ranks": 1, "nodes": 1, "ranks_per_node": 1, "accelerators_per_node": 0, "seed": 1,
        "usage": usage, "software": software_stack("pytorch"), "provenance": prov,
        "cores": {"cpus": "0-1", "threads": 1}, "mlperf_log": "mlperf.log"})


def _perflog(path: Path, prov: dict) -> None:
    """A perflog in the site profiles' filelog format (site_common.py), with the stack field."""
    from hpckit.common import provenance
    stack = json.dumps(provenance.stack(prov)).replace("|", "/")
    head = ("job_completion_time|result|display_name|environ|config|seed|perf_var|perf_value|perf_unit|perf_ref|"
            "perf_lower_thres|perf_upper_thres|perf_result|job_nodelist|stack")
    rows = [head]
    for t, v in (("2026-11-21T11:46:33", 41.0), ("2026-11-21T12:39:05+00:00", 21.5)):
        for var, value, unit, ref, low in (("time_to_train", v / 50, "min", 0, "null"),
                                           ("train_throughput", v, "samples/s", 40, "-0.25"),
                                           ("epochs", 7, "epochs", 0, "null")):
            rows.append(f"{t}|pass|DeepCAMCheck %framework=pytorch|hpckit-venv|mini|333|{var}|{value}|{unit}|{ref}|"
                        f"{low}|null|pass|vm|{stack}")
    rows.append("2026-11-21T11:45:37|pass|DeepCAMData ~local|hpckit-venv|mini|0|null|null|null|null|null|null|null|"
                "vm|null")
    path.write_text("\n".join(rows) + "\n")


def _tfrecord_bank(out: Path, example: dict) -> None:
    """Examples the kit's encoder writes whose content is wrong for CosmoFlow."""
    import numpy as np
    from hpckit.common.tfrecord import encode_example
    x, y = bytes(example["x"]), np.asarray(example["y"], np.float32)
    neg = np.frombuffer(x, "<i2").copy()
    neg[5] = -1
    variants = {
        "x-floats": {"x": np.ones(4, np.float32), "y": y}, "x-short": {"x": x[:-2], "y": y},
        "x-long": {"x": x + b"\0\0", "y": y}, "x-missing": {"y": y}, "y-missing": {"x": x},
        "y-bytes": {"x": x, "y": b"\0" * 16}, "y-three": {"x": x, "y": y[:3]},
        "y-nan": {"x": x, "y": np.array([np.nan, 0, 0, 0], np.float32)},
        "y-outside": {"x": x, "y": np.array([2, 0, 0, 0], np.float32)},
        "y-int64": {"x": x, "y": np.array([2 ** 63 - 1, 0, 0, 0], np.int64)},
        "x-negative": {"x": neg.tobytes(), "y": y}, "extra": {"x": x, "y": y, "z": b"\xff" * 64},
        "empty": {}, "x-two-values": {"x": [x, x], "y": y}, "y-empty": {"x": x, "y": np.zeros(0, np.float32)},
    }
    out.mkdir(parents=True)
    for name, feats in variants.items():
        (out / f"{name}.pb").write_bytes(encode_example(feats))


def _npy_bank(out: Path) -> None:
    import numpy as np
    shape = (COSMO_SIZE,) * 3 + (4,)
    out.mkdir(parents=True)
    arrays = {
        "data-float64": np.ones(shape), "data-int32": np.ones(shape, np.int32),
        "data-short": np.ones((8,) + shape[1:], np.int16), "data-fortran": np.asfortranarray(np.ones(shape, np.int16)),
        "data-bigendian": np.ones(shape, ">i2"), "data-0d": np.array(3, np.int16),
        "data-negative": -np.ones(shape, np.int16), "label-float64": np.zeros(4),
        "label-int": np.array([1, 2, 3, 4]), "label-five": np.zeros(5, np.float32),
        "label-text": np.array(["a", "b", "c", "d"]), "label-bool": np.ones(4, bool),
        "label-complex": np.zeros(4, np.complex64), "label-nan": np.array([np.nan, 0, 0, 0], np.float32),
        "label-structured": np.zeros(4, [("a", "<f4"), ("b", "<i2")]), "label-datetime": np.zeros(4, "M8[s]"),
        "label-2d": np.zeros((2, 2), np.float32), "label-huge": np.array([1e30, 0, 0, 0], np.float32),
    }
    for name, arr in arrays.items():
        with open(out / f"{name}.npy", "wb") as f:
            np.save(f, arr, allow_pickle=False)


def _hdf5_bank(out: Path, sample: Path, stats: Path) -> None:
    """Sample and stats files written with h5py, as datagen writes them, of the wrong content."""
    import h5py
    import numpy as np
    h, w, c = DEEPCAM_HWC
    with h5py.File(sample, "r") as f:
        data, labels = f["climate/data"][...], f["climate/labels_0"][...]
    with h5py.File(stats, "r") as f:
        st = {k: f[f"climate/{k}"][()] for k in ("count", "mean", "sqmean", "minval", "maxval")}
    out.mkdir(parents=True)

    def sample_file(name, d=data, lab=labels, **kw):
        with h5py.File(out / f"sample-{name}.h5", "w") as f:
            if d is not None:
                f.create_dataset("climate/data", data=d, **kw)
            if lab is not None:
                f.create_dataset("climate/labels_0", data=lab, **kw)
            return f

    for name, d in (("float64", data.astype(np.float64)), ("int8", data.astype(np.int8)),
                    ("uint64", np.full(data.shape, 2 ** 64 - 1, np.uint64)), ("2d", data[..., 0]),
                    ("channels", data[..., :-1]), ("rows", data[:-1]), ("empty", data[:0]),
                    ("nan", np.where(np.arange(data.size).reshape(data.shape) == 7, np.nan, data)),
                    ("beyond-float32", np.full(data.shape, 1e39)), ("bigendian", data.astype(">f4")),
                    ("text", np.full(data.shape[:2], b"abc")), ("bool", data > 0)):
        sample_file(f"data-{name}", d=d)
    for name, lab in (("three", np.full(labels.shape, 3, labels.dtype)), ("negative", np.full(labels.shape, -1.0)),
                      ("fraction", np.full(labels.shape, 0.5, np.float32)), ("nan", np.full(labels.shape, np.nan)),
                      ("uint8-255", np.full(labels.shape, 255, np.uint8)), ("shape", labels[:, :-1]),
                      ("int64-huge", np.full(labels.shape, 2 ** 62, np.int64))):
        sample_file(f"labels-{name}", lab=lab)
    sample_file("chunked-gzip", chunks=True, compression="gzip")
    sample_file("no-labels", lab=None)
    sample_file("no-data", d=None)
    with h5py.File(out / "sample-unallocated.h5", "w") as f:
        f.create_dataset("climate/data", shape=(h, w, c), dtype="f4")
        f.create_dataset("climate/labels_0", shape=(h, w), dtype="f4")
    with h5py.File(out / "sample-huge-chunked.h5", "w") as f:
        f.create_dataset("climate/data", shape=(2 ** 31, 2 ** 31, c), dtype="f4", chunks=(1, 1, c))
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-data-is-group.h5", "w") as f:
        f.create_group("climate/data")
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-soft-loop.h5", "w") as f:
        f["climate/data"] = h5py.SoftLink("/climate/data")
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-external-link.h5", "w") as f:
        f["climate/data"] = h5py.ExternalLink("missing.h5", "/climate/data")
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-external-self.h5", "w") as f:
        f.create_group("climate")
        f["climate/data"] = h5py.ExternalLink("/dev/zero", "/climate/data")
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-external-storage.h5", "w") as f:
        f.create_dataset("climate/data", shape=data.shape, dtype="f4", external=[("missing.bin", 0, data.nbytes)])
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-external-short.h5", "w") as f:
        f.create_dataset("climate/data", shape=data.shape, dtype="f4", external=[("/dev/null", 0, data.nbytes)])
        f.create_dataset("climate/labels_0", data=labels)
    # links and external storage to a FIFO the mutation makes beside the file and in the cwd
    with h5py.File(out / "sample-fifo-link.h5", "w") as f:
        f["climate/data"] = h5py.ExternalLink(FIFO, "/climate/data")
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-fifo-storage.h5", "w") as f:
        f.create_dataset("climate/data", shape=data.shape, dtype="f4", external=[(FIFO, 0, data.nbytes)])
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "stats-fifo-link.h5", "w") as f:
        for k, v in st.items():
            f.create_dataset(f"climate/{k}", data=v)
        del f["climate/mean"]
        f["climate/mean"] = h5py.ExternalLink(FIFO, "/climate/mean")
    with h5py.File(out / "sample-virtual.h5", "w") as f:
        layout = h5py.VirtualLayout(shape=data.shape, dtype="f4")
        layout[...] = h5py.VirtualSource("missing.h5", "climate/data", shape=data.shape)
        f.create_virtual_dataset("climate/data", layout, fillvalue=0)
        f.create_dataset("climate/labels_0", data=labels)
    with h5py.File(out / "sample-scalar.h5", "w") as f:
        f.create_dataset("climate/data", data=1.0)
        f.create_dataset("climate/labels_0", data=h5py.Empty("f4"))

    def stats_file(name, **changes):
        with h5py.File(out / f"stats-{name}.h5", "w") as f:
            for k, v in {**st, **changes}.items():
                if v is not None:
                    f.create_dataset(f"climate/{k}", data=v)

    ones = np.ones(c)
    for name, changes in (("count-zero", {"count": 0.0}), ("count-nan", {"count": np.nan}),
                          ("count-negative", {"count": -ones}), ("mean-short", {"mean": ones[:-1]}),
                          ("minval-text", {"minval": np.full(c, b"x")}), ("maxval-equal", {"maxval": st["minval"]}),
                          ("range-huge", {"minval": -1e308 * ones, "maxval": 1e308 * ones}),
                          ("range-tiny", {"maxval": st["minval"] + 1e-300}),
                          ("minval-inf", {"minval": np.full(c, -np.inf)}), ("maxval-missing", {"maxval": None}),
                          ("int64-extremes", {"minval": np.full(c, -2 ** 63, np.int64),
                                              "maxval": np.full(c, 2 ** 63 - 1, np.int64)}),
                          ("sqmean-2d", {"sqmean": np.ones((c, 2))}), ("count-vector", {"count": ones})):
        stats_file(name, **changes)


def _oc20_bank(out: Path, lmdb_path: Path) -> None:
    """Records the kit's writer (dumps_record) makes whose content is wrong, tensors whose
    view lies past their storage, and planted code inside a torch storage."""
    import collections

    import torch
    from hpckit.oc20.records import LmdbFile, dumps_record
    f = LmdbFile(lmdb_path)
    try:
        base = f.read(0)
    finally:
        f.close()
    n, e = int(base["natoms"]), int(base["edge_index"].shape[1])

    class Crafted:
        """A tensor rebuilt by torch._utils._rebuild_tensor_v2 with the given geometry."""

        def __init__(self, numel, offset, size, stride, dtype=torch.float32):
            self.storage = torch.zeros(numel, dtype=dtype).untyped_storage()
            self.dtype, self.geometry = dtype, (offset, tuple(size), tuple(stride))

        def __reduce__(self):
            from torch._utils import _rebuild_tensor_v2
            typed = torch.storage.TypedStorage(wrap_storage=self.storage, dtype=self.dtype, _internal=True)
            return _rebuild_tensor_v2, (typed, *self.geometry, False, collections.OrderedDict())

    def with_(**changes):
        fields = dict(base)
        for k, v in changes.items():
            if v is None:
                fields.pop(k, None)
            else:
                fields[k] = v
        return fields

    pos = base["pos"]
    records = {
        "pos-float64": with_(pos=pos.double()), "pos-int64": with_(pos=pos.long()), "pos-2cols": with_(pos=pos[:, :2]),
        "pos-extra-atom": with_(pos=torch.zeros(n + 1, 3)), "pos-list": with_(pos=pos.tolist()),
        "pos-nan": with_(pos=torch.full((n, 3), float("nan"))), "pos-numpy": with_(pos=pos.numpy()),
        "pos-0d": with_(pos=torch.tensor(1.0)), "z-zero": with_(atomic_numbers=torch.zeros(n)),
        "z-95": with_(atomic_numbers=torch.full((n,), 95.0)), "z-fraction": with_(atomic_numbers=torch.full((n,), 2.5)),
        "natoms-text": with_(natoms="10"), "natoms-huge": with_(natoms=2 ** 63), "natoms-negative": with_(natoms=-1),
        "natoms-bool": with_(natoms=True), "natoms-float": with_(natoms=float(n)),
        "natoms-tensor": with_(natoms=torch.tensor([n])), "edge-int32": with_(edge_index=base["edge_index"].int()),
        "edge-past-atoms": with_(edge_index=torch.full((2, e), n, dtype=torch.int64)),
        "edge-negative": with_(edge_index=torch.full((2, e), -1, dtype=torch.int64)),
        "edge-huge": with_(edge_index=torch.full((2, e), 2 ** 62, dtype=torch.int64)),
        "edge-3rows": with_(edge_index=torch.zeros((3, e), dtype=torch.int64)),
        "offsets-extra": with_(cell_offsets=torch.zeros((e + 1, 3), dtype=torch.int64)),
        "cell-3x3": with_(cell=torch.eye(3)), "y-nan": with_(y=float("nan")), "y-text": with_(y="x"),
        "y-list": with_(y=[1.0]), "y-vector": with_(y=torch.tensor([1.0, 2.0])), "force-flat": with_(force=pos[:, 0]),
        "fixed-int": with_(fixed=torch.zeros(n, dtype=torch.int64)), "tags-float": with_(tags=torch.zeros(n)),
        "sid-huge": with_(sid=2 ** 70), "sid-text": with_(sid="1"), "extra": with_(extra=torch.zeros(4)),
        "pos-offset-past-storage": with_(pos=Crafted(n * 3, 10 ** 6, (n, 3), (3, 1))),
        "pos-size-past-storage": with_(pos=Crafted(n * 3, 0, (n, 3 * 10 ** 8), (3 * 10 ** 8, 1))),
        "pos-huge-view": with_(pos=Crafted(n * 3, 0, (2 ** 40, 3), (3, 1))),
        "pos-negative-stride": with_(pos=Crafted(n * 3, 0, (n, 3), (-3, 1))),
        "pos-zero-stride": with_(pos=Crafted(3, 0, (n, 3), (0, 1))),
        "pos-negative-size": with_(pos=Crafted(n * 3, 0, (-n, 3), (3, 1))),
        "z-offset-past-storage": with_(atomic_numbers=Crafted(n, 2 ** 33, (n,), (1,))),
        "edge-past-storage": with_(edge_index=Crafted(2, 0, (2, 10 ** 9), (10 ** 9, 1), torch.int64)),
    }
    for k in base:
        records[f"missing-{k}"] = with_(**{k: None})
    out.mkdir(parents=True)
    for name, fields in records.items():
        (out / f"{name}.pkl").write_bytes(dumps_record(fields))
    # not a Data at all, or a Data whose state is not a mapping
    for name, obj in (("a-list", [1, 2]), ("a-dict", dict(base)), ("an-int", 7), ("none", None),
                      ("a-tensor", pos), ("ordered-dict", collections.OrderedDict(a=1))):
        (out / f"whole-{name}.pkl").write_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    deep = b"\x80\x04" + b"]" * 100000 + b"." * 1
    (out / "whole-deep-lists.pkl").write_bytes(deep)
    # planted code inside a torch storage: torch.save's zip of a pickle calling os.system,
    # rebuilt by torch.storage._load_from_bytes (torch.load(weights_only=True))
    buf = io.BytesIO()
    torch.save(_Call(os.system, f"touch {MARKER}"), buf)
    zipped = buf.getvalue()

    class InStorage:
        def __reduce__(self):
            return torch.storage._load_from_bytes, (zipped,)

    (out / "plant-in-storage.pkl").write_bytes(dumps_record(with_(pos=InStorage())))


def _config_seeds(out: Path) -> None:
    """Per benchmark, a user config: `base: mini` and every key of the mini config."""
    import yaml
    from hpckit.common.config import builtin_config_path
    out.mkdir(parents=True)
    for bench in BENCHMARKS:
        cfg = yaml.safe_load(builtin_config_path(bench, "mini").read_text())
        (out / f"{bench}.yaml").write_text(yaml.safe_dump({"base": "mini", **cfg}, sort_keys=False))


def _datagen(*argv) -> None:
    from hpckit.cli import main
    code = main(["datagen", *map(str, argv), "--workers", "1"])
    if code != 0:
        raise RuntimeError(f"hpckit datagen {' '.join(map(str, argv))}: exit {code}")


def make_corpus(root: Path, runs: list[Path] = ()) -> None:
    """The valid files every case starts from, and the banks of wrong-but-well-formed ones."""
    import yaml
    from hpckit.common import provenance
    from hpckit.common.tfrecord import read_example_file
    h, w, _ = DEEPCAM_HWC
    _datagen("cosmoflow", "--config", "mini", "--out", root / "tfrecord-gzip", "--train", 1, "--valid", 1,
             "--size", COSMO_SIZE, "--format", "tfrecord", "--seed", 1)
    shutil.copytree(root / "tfrecord-gzip", root / "tfrecord-plain")
    for p in (root / "tfrecord-plain").rglob("*.tfrecord"):
        p.write_bytes(gzip.decompress(p.read_bytes()))
    _datagen("cosmoflow", "--config", "mini", "--out", root / "npy", "--train", 1, "--valid", 1, "--size",
             COSMO_SIZE, "--format", "npy", "--seed", 1)
    _datagen("deepcam", "--config", "mini", "--out", root / "hdf5", "--train", 1, "--valid", 1, "--height", h,
             "--width", w, "--seed", 1)
    _datagen("oc20", "--config", "mini", "--out", root / "lmdb", "--train", OC20_COUNTS[0], "--valid",
             OC20_COUNTS[1], "--seed", 1)
    _datagen("openfold", "--config", "mini", "--out", root / "openfold", "--train", OPENFOLD_COUNTS[0], "--valid",
             OPENFOLD_COUNTS[1], "--seed", 1)
    for d in ("tfrecord-gzip", "tfrecord-plain", "npy", "hdf5", "lmdb", "openfold"):
        (root / d / "manifest.json").unlink(missing_ok=True)   # not read by the readers
    prov = provenance.collect("pytorch")
    cfg = yaml.safe_load((REPO / "apps/hpckit/deepcam/configs/mini.yaml").read_text())
    (root / "mllog").mkdir()
    _kit_log(root / "mllog" / "mlperf.log", cfg, prov)
    (root / "summary").mkdir()
    _kit_summary(root / "summary" / "summary.json", prov)
    for i, run in enumerate(runs):
        for name in REAL_RUN_FILES:
            if (run / name).is_file():
                dest = root / ("mllog" if name == "mlperf.log" else "summary") / f"run{i}-{name}"
                shutil.copyfile(run / name, dest)
    (root / "perflog" / "local" / "default").mkdir(parents=True)
    _perflog(root / "perflog" / "local" / "default" / "Check.log", prov)
    _config_seeds(root / "config")
    bank = root / "bank"
    example = read_example_file(next((root / "tfrecord-gzip" / "train").glob("*.tfrecord")), "AUTO")
    _tfrecord_bank(bank / "tfrecord", example)
    _npy_bank(bank / "npy")
    _hdf5_bank(bank / "hdf5", next((root / "hdf5" / "train").glob("*.h5")), root / "hdf5" / "stats.h5")
    _oc20_bank(bank / "oc20", root / "lmdb" / "train" / "data.0000.lmdb")
    (bank / "planted").mkdir()
    for name, raw in planted_pickles().items():
        (bank / "planted" / f"{name}.pkl").write_bytes(raw)


# ================================================================== mutations (in the fuzzer)

EXTREMES = (0, 1, 2 ** 7 - 1, 2 ** 8 - 1, 2 ** 15 - 1, 2 ** 16 - 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32,
            2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1)


def _extreme(rng: random.Random, width: int) -> int:
    return rng.choice([v for v in EXTREMES if v < 1 << (8 * width)])


def bytes_mutation(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One format-blind mutation: a cut, flipped bytes, an extreme field, a splice."""
    n = len(data)
    op = rng.random()
    if op < 0.25 or n == 0:
        k = rng.choice([0, n // 2, max(n - 1, 0), rng.randrange(n + 1)])
        return data[:k], f"cut at byte {k} of {n}"
    if op < 0.5:
        out = bytearray(data)
        spots = sorted(rng.randrange(n) for _ in range(rng.randint(1, 16)))
        for i in spots:
            out[i] = out[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return bytes(out), f"{len(spots)} bytes flipped from byte {spots[0]}"
    if op < 0.75:
        width = rng.choice([1, 2, 4, 8, 8])
        if n < width:
            return data + b"\xff", "a byte appended"
        at = rng.randrange(n - width + 1)
        if rng.random() < 0.6:
            at -= at % width
        value, order = _extreme(rng, width), "little" if rng.random() < 0.8 else "big"
        return data[:at] + value.to_bytes(width, order) + data[at + width:], \
            f"{width}-byte field at {at} = {value:#x} ({order} endian)"
    if op < 0.85:
        k, m = rng.randrange(n + 1), rng.randint(1, 512)
        return data[:k] + data[k + m:], f"{m} bytes deleted at {k}"
    if op < 0.93:
        k = rng.randrange(n + 1)
        junk = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))), data[k:k + 4096], b"\0" * 4096])
        return data[:k] + junk + data[k:], f"{len(junk)} bytes inserted at {k}"
    junk = rng.choice([b"\0" * rng.randint(1, 8192), bytes(rng.randrange(256) for _ in range(64)), data])
    return data + junk, f"{len(junk)} bytes appended"


def special_file(path: Path, rng: random.Random) -> str:
    """The file replaced by something that is not a regular file (or not one to read)."""
    kind = rng.choice(["fifo", "dir", "loop", "devzero", "empty", "dangling"])
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        os.symlink(path.name, path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        os.symlink("missing-target", path)
    return f"replaced by {kind}"


# ---- protobuf (tf.train.Example) as a tree, re-encoded with one field wrong

_SUB = {"example": {1: "features"}, "features": {1: "entry"}, "entry": {2: "feature"},
        "feature": {1: "list", 2: "list", 3: "list"}, "list": {}}


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def pb_parse(buf: bytes, kind: str = "example") -> list[dict]:
    nodes, pos = [], 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        node = {"field": key >> 3, "wire": key & 7}
        if node["wire"] == 0:
            node["value"], pos = _read_varint(buf, pos)
        elif node["wire"] == 2:
            n, pos = _read_varint(buf, pos)
            payload = buf[pos:pos + n]
            pos += n
            sub = _SUB[kind].get(node["field"])
            node["value"] = pb_parse(payload, sub) if sub else payload
        elif node["wire"] in (1, 5):
            k = 8 if node["wire"] == 1 else 4
            node["value"] = buf[pos:pos + k]
            pos += k
        else:
            raise ValueError("bad wire type")
        nodes.append(node)
    return nodes


def pb_encode(nodes: list[dict]) -> bytes:
    out = bytearray()
    for node in nodes:
        out += _varint(node["field"] << 3 | node.get("key_wire", node["wire"]))
        v = node["value"]
        if node["wire"] == 0:
            out += _varint(v)
        elif node["wire"] == 2:
            payload = pb_encode(v) if isinstance(v, list) else v
            out += _varint(node.get("length", len(payload))) + payload
        else:
            out += v
    return bytes(out)


def _pb_nodes(nodes: list[dict], parent=None):
    for i, node in enumerate(nodes):
        yield nodes, i, node
        if isinstance(node["value"], list):
            yield from _pb_nodes(node["value"])


def pb_mutation(payload: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One protobuf field of the Example made wrong, the rest encoded right."""
    tree = pb_parse(payload)
    spots = list(_pb_nodes(tree))
    at = rng.randrange(len(spots))
    parent, i, node = spots[at]
    op = rng.choice(["length", "length", "wire", "field", "drop", "dup", "payload", "varint"])
    if op == "length" and node["wire"] == 2:
        size = len(pb_encode([node])) if not isinstance(node["value"], bytes) else len(node["value"])
        node["length"] = rng.choice([*EXTREMES, size + 1, max(size - 1, 0)])
        what = f"length {node['length']}"
    elif op == "wire":
        node["key_wire"] = rng.choice([w for w in range(8) if w != node["wire"]])
        what = f"wire type {node['key_wire']}"
    elif op == "field":
        node["field"] = rng.choice([0, 1, 2, 3, 4, 2 ** 29 - 1])
        what = f"field number {node['field']}"
    elif op == "drop":
        del parent[i]
        what = "removed"
    elif op == "dup":
        parent.insert(i, _copy_node(node))
        what = "doubled"
    elif op == "payload" and isinstance(node["value"], bytes):
        v = node["value"]
        node["value"] = rng.choice([b"", v[:-1], v + b"\0", b"\xff\xfe", bytes(rng.randrange(256) for _ in range(9)),
                                    b"x", b"y", b"z"])
        what = f"payload -> {len(node['value'])} bytes"
    elif op == "varint" and node["wire"] == 0:
        node["value"] = rng.choice(EXTREMES)
        what = f"varint {node['value']}"
    else:   # the op does not apply to this node: a wire type 2 with an extreme length
        if node["wire"] == 2:
            node["length"] = rng.choice(EXTREMES)
            what = f"length {node['length']}"
        else:
            node["key_wire"] = 2
            what = "wire type 2"
    return pb_encode(tree), f"protobuf node {at} (field {node['field']}): {what}"


def _copy_node(node: dict) -> dict:
    out = dict(node)
    if isinstance(node["value"], list):
        out["value"] = [_copy_node(n) for n in node["value"]]
    return out


# ---- TFRecord framing

def _masked_crc(data: bytes) -> int:
    from hpckit.common.tfrecord import masked_crc32c
    return masked_crc32c(data)


def tfr_frame(payload: bytes, length: int | None = None, length_crc_ok: bool = True, data_crc_ok: bool = True) -> bytes:
    head = struct.pack("<Q", len(payload) if length is None else length)
    lcrc = _masked_crc(head) if length_crc_ok else _masked_crc(head) ^ 1
    dcrc = _masked_crc(payload) if data_crc_ok else _masked_crc(payload) ^ 1
    return head + struct.pack("<I", lcrc) + payload + struct.pack("<I", dcrc)


def tfr_payloads(stream: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(stream):
        n, = struct.unpack_from("<Q", stream, pos)
        out.append(stream[pos + 12:pos + 12 + n])
        pos += 16 + n
    return out


def tfrecord_mutation(stream: bytes, rng: random.Random, bank: Path) -> tuple[bytes, str]:
    """A mutation of an uncompressed TFRecord stream that gets past the CRCs where it means to."""
    payload = tfr_payloads(stream)[0]
    op = rng.random()
    if op < 0.45:
        new, what = pb_mutation(payload, rng)
        return tfr_frame(new), what + " (CRCs made right)"
    if op < 0.6:
        length = rng.choice([*EXTREMES, len(payload) + 1, len(payload) - 1])
        right = rng.random() < 0.85
        return tfr_frame(payload, length, length_crc_ok=right), \
            f"record length {length}{' (its CRC made right)' if right else ''}"
    if op < 0.8:
        name = rng.choice(sorted(p.name for p in bank.glob("*.pb")))
        return tfr_frame((bank / name).read_bytes()), f"the Example replaced by {name}"
    if op < 0.84:
        return tfr_frame(payload, data_crc_ok=False), "data CRC wrong"
    if op < 0.88:
        return b"", "no record"
    if op < 0.93:
        return stream + stream, "two records"
    return stream + rng.choice([b"\0" * 5, b"\xff" * 12, struct.pack("<Q", 2 ** 64 - 1)]), "trailing bytes"


def gzip_mutation(data: bytes, rng: random.Random, bank: Path) -> tuple[bytes, str]:
    op = rng.random()
    if op < 0.55:
        inner, what = tfrecord_mutation(gzip.decompress(data), rng, bank)
        return gzip.compress(inner, mtime=0), f"inside the gzip stream: {what}"
    if op < 0.65:   # the gzip header: FEXTRA with an extreme XLEN, an unterminated FNAME
        flag = rng.choice([0x04, 0x08, 0x10, 0x02, 0xE0])
        body = data[10:]
        extra = {0x04: struct.pack("<H", rng.choice([0, 0xFFFF, 7])), 0x08: b"name-without-end",
                 0x10: b"comment", 0x02: b"\xff\xff", 0xE0: b""}[flag]
        return data[:3] + bytes([data[3] | flag]) + data[4:10] + extra + body, f"gzip header flag {flag:#x}"
    if op < 0.75:   # the trailer: CRC32 or ISIZE extreme
        at = len(data) - rng.choice([8, 4])
        return data[:at] + struct.pack("<I", _extreme(rng, 4)) + data[at + 4:], f"gzip trailer field at {at}"
    if op < 0.8:
        return data + data, "two gzip members"
    if op < 0.85:
        return data + b"\0" * rng.randint(1, 4096), "zero padding after the stream"
    if op < 0.9:
        return zlib.compress(gzip.decompress(data)), "a zlib stream, not gzip"
    return data + gzip.compress(b"\xff" * 16, mtime=0), "a second member of garbage"


# ---- npy

def npy_parts(data: bytes) -> tuple[tuple[int, int], str, bytes]:
    major, minor = data[6], data[7]
    if major == 1:
        hlen, = struct.unpack_from("<H", data, 8)
        start = 10
    else:
        hlen, = struct.unpack_from("<I", data, 8)
        start = 12
    return (major, minor), data[start:start + hlen].decode("latin-1"), data[start + hlen:]


def npy_build(header: str, body: bytes, version: tuple[int, int] = (1, 0), hlen: int | None = None) -> bytes:
    head_start = 10 if version[0] == 1 else 12
    text = header.rstrip("\n")
    pad = (-(head_start + len(text) + 1)) % 64
    text = (text + " " * pad + "\n").encode("latin-1")
    n = len(text) if hlen is None else hlen
    size = struct.pack("<H", n & 0xFFFF) if version[0] == 1 else struct.pack("<I", n & 0xFFFFFFFF)
    return b"\x93NUMPY" + bytes(version) + size + text + body


def npy_mutation(path: Path, data: bytes, rng: random.Random, bank: Path, planted: Path) -> str:
    if path.suffix == ".lst":
        return list_mutation(path, rng)
    version, header, body = npy_parts(data)
    op = rng.random()
    if op < 0.35:
        try:
            d = ast.literal_eval(header)
        except (ValueError, SyntaxError):
            d = {}
        key = rng.choice(["shape", "shape", "descr", "descr", "fortran_order", "remove", "extra", "not-a-dict"])
        if key == "shape":
            shape = rng.choice([(2 ** 31 - 1, 16, 16, 4), (16, 16, 16, 2 ** 62), (-1, 16, 16, 4), (0, 16, 16, 4), (),
                                (16,) * 32, (2 ** 64,), (16, 16, 16, 4, 1), (4,), (2 ** 63 - 1,), (5,), "16"])
            d["shape"], what = shape, f"shape {shape!r:.40}"
        elif key == "descr":
            d["descr"] = rng.choice(["|O", "<f8", ">i2", "<i8", "|u1", "|b1", "<U2", "|S2", "|V8", "<c8", "<M8[s]",
                                     "<f2", "bogus", [("a", "<i2")], ("<i2", (2,)), 7, ""])
            what = f"descr {d['descr']!r}"
        elif key == "fortran_order":
            d["fortran_order"] = rng.choice([True, 1, "x", None])
            what = f"fortran_order {d['fortran_order']!r}"
        elif key == "remove" and d:
            what = f"{rng.choice(sorted(d))} removed"
            del d[what.split()[0]]
        elif key == "extra":
            d["extra"], what = 1, "an extra key"
        else:
            d, what = [1, 2], "the header a list"
        _write(path, npy_build(repr(d), body, version))
        return f"npy header: {what}"
    if op < 0.45:
        text = rng.choice(["{'descr': '<i2', 'fortran_order': False, 'shape': " + "(" * 3000 + ")" * 3000 + "}",
                           "__import__('os').system('touch " + MARKER + "')", "{", "", "\0" * 100,
                           "{'descr': '<i2', 'fortran_order': False, 'shape': (16, 16, 16, 4), }" + "#" * 70000,
                           "{'descr': '<i2', 'fortran_order': False, 'shape': (" + "9" * 5000 + ",)}"])
        _write(path, npy_build(text, body, version))
        return f"npy header text {text[:30]!r}..."
    if op < 0.55:
        hlen = _extreme(rng, 2 if version[0] == 1 else 4)
        _write(path, npy_build(header, body, version, hlen))
        return f"npy header length {hlen}"
    if op < 0.6:
        v = rng.choice([(0, 0), (2, 0), (3, 0), (9, 9), (255, 255)])
        _write(path, npy_build(header, body, v))
        return f"npy version {v}"
    if op < 0.7:
        out = bytearray(body)
        if "label" in path.name:
            at = rng.randrange(max(len(out) // 4, 1)) * 4
            out[at:at + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), 1e30, 2.0, -1.3]))
        else:
            at = rng.randrange(max(len(out) // 2, 1)) * 2
            out[at:at + 2] = struct.pack("<h", rng.choice([-1, -32768, 32767]))
        _write(path, npy_build(header, bytes(out), version))
        return f"npy value at data byte {at}"
    if op < 0.78:
        name = rng.choice(sorted(p.name for p in bank.glob("*.npy")))
        shutil.copyfile(bank / name, path)
        return f"replaced by {name}"
    if op < 0.82:
        name = rng.choice(sorted(p.name for p in planted.glob("*.pkl")))
        body = (planted / name).read_bytes()
        _write(path, npy_build("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", body))
        return f"plant: an object array whose pickle is {name}"
    new, what = bytes_mutation(data, rng)
    _write(path, new)
    return what


def list_mutation(path: Path, rng: random.Random) -> str:
    names = path.read_text().splitlines()
    other = sorted(p.name for p in path.parent.glob("*.npy"))
    choice = rng.choice(["missing", "parent", "devzero", "proc", "empty", "two", "binary", "dir", "long", "other"])
    lines = {"missing": ["nope.npy"], "parent": ["../../../../etc/passwd"], "devzero": ["/dev/zero"],
             "proc": ["/proc/self/status"], "empty": [], "two": names + names, "dir": ["."],
             "long": ["x" * 300 + ".npy"], "other": [rng.choice(other)] if other else names,
             "binary": None}[choice]
    if lines is None:
        path.write_bytes(b"\xff\xfe\x00bad\n")
    else:
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
    return f"file list: {choice}"


# ---- LMDB

def _lmdb_put(path: Path, changes: dict) -> None:
    """Entries put into (or, with None, removed from) a private copy of an LMDB file, as
    anyone who can write the data set could."""
    import lmdb
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30, lock=False)
    try:
        with env.begin(write=True) as txn:
            for k, v in changes.items():
                if v is None:
                    txn.delete(k)
                else:
                    txn.put(k, v)
    finally:
        env.close()


LENGTH_VALUES = (-1, 0, 1, 2 ** 31 - 1, 2 ** 63, 2 ** 64 - 1, 10 ** 100, "2", 2.0, True, None, [2], {"n": 2}, b"2",
                 float("nan"))


def _lmdb_fields(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, width, name) of the fields LMDB keeps sizes and page numbers in: both meta
    pages, and every page's header and node headers."""
    psize = struct.unpack_from("=I", data, 40)[0] if len(data) >= 44 else 4096
    if psize not in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        psize = 4096
    spots = []
    for meta in (0, psize):
        for off, width, name in ((10, 2, "flags"), (16, 4, "magic"), (20, 4, "version"), (32, 8, "mapsize"),
                                 (40, 4, "psize"), (92, 2, "db flags"), (94, 2, "depth"), (96, 8, "branch pages"),
                                 (120, 8, "entries"), (128, 8, "root"), (136, 8, "last_pg"), (144, 8, "txnid")):
            spots.append((meta + off, width, f"meta page {meta // psize} {name}"))
    for pg in range(2, len(data) // psize):
        base = pg * psize
        spots += [(base, 8, f"page {pg} pgno"), (base + 10, 2, f"page {pg} flags"), (base + 12, 2, f"page {pg} lower"),
                  (base + 14, 2, f"page {pg} upper")]
        lower, = struct.unpack_from("=H", data, base + 12)
        for i in range(max(0, min((lower - 16) // 2, 64))):
            ptr, = struct.unpack_from("=H", data, base + 16 + 2 * i)
            if ptr + 8 <= psize:
                for off, name in ((0, "size lo"), (2, "size hi"), (4, "flags"), (6, "key size")):
                    spots.append((base + ptr + off, 2, f"page {pg} node {i} {name}"))
                spots.append((base + 16 + 2 * i, 2, f"page {pg} node pointer {i}"))
    return [s for s in spots if s[0] + s[1] <= len(data)]


def lmdb_mutation(path: Path, rng: random.Random, bank: Path, planted: Path) -> str:
    op = rng.random()
    if op < 0.12:
        value = rng.choice(LENGTH_VALUES)
        raw = pickle.dumps(value, protocol=rng.choice([0, 2, pickle.HIGHEST_PROTOCOL]))
        _lmdb_put(path, {b"length": raw})
        return f"length = pickled {value!r:.30}"
    if op < 0.2:
        name = rng.choice(sorted(p.name for p in planted.glob("*.pkl")))
        _lmdb_put(path, {b"length": (planted / name).read_bytes()})
        return f"plant: length = {name}"
    if op < 0.26:
        name = rng.choice(sorted(p.name for p in planted.glob("*.pkl")) + ["plant-in-storage.pkl"])
        raw = (planted / name).read_bytes() if (planted / name).exists() else (bank / name).read_bytes()
        _lmdb_put(path, {b"0": raw})
        return f"plant: record 0 = {name}"
    if op < 0.5:
        name = rng.choice(sorted(p.name for p in bank.glob("*.pkl")))
        _lmdb_put(path, {b"0": (bank / name).read_bytes()})
        return f"record 0 = {name}"
    if op < 0.6:
        import lmdb
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            raw = txn.get(b"0")
            length = txn.get(b"length")
        env.close()
        key = rng.choice([b"0", b"length"])
        new, what = bytes_mutation(raw if key == b"0" else length, rng)
        _lmdb_put(path, {key: new})
        return f"{key.decode()}'s pickle: {what}"
    if op < 0.66:
        key = rng.choice([b"0", b"length", b"1"])
        _lmdb_put(path, {key: None} if key != b"1" else {b"1": None, b"00": b"x" * 5000})
        return f"key {key.decode()} removed"
    data = path.read_bytes()
    if op < 0.8:
        spots = _lmdb_fields(data)
        at, width, name = rng.choice(spots)
        value = _extreme(rng, width)
        _write(path, data[:at] + value.to_bytes(width, "little") + data[at + width:])
        return f"LMDB {name} (byte {at}) = {value:#x}"
    psize = 4096
    if op < 0.84:
        pg = rng.randrange(max(len(data) // psize, 1))
        _write(path, data[:pg * psize] + bytes(psize) + data[(pg + 1) * psize:])
        return f"page {pg} zeroed"
    if op < 0.9:   # a copy interrupted at a page: the pages past it are not mapped at all
        pg = rng.randrange(max(len(data) // psize, 1))
        _write(path, data[:pg * psize])
        return f"cut after page {pg - 1} ({pg * psize} of {len(data)} bytes)"
    new, what = bytes_mutation(data, rng)
    _write(path, new)
    return what


# ---- JSON, logs, perflogs, YAML

def hostile_value(rng: random.Random):
    return rng.choice([float("nan"), float("inf"), float("-inf"), -1, 0, 2 ** 31 - 1, 2 ** 63, 2 ** 64 - 1, 10 ** 400,
                       1e308, -1e308, 0.5, "text", "", None, True, False, [], {}, [1, "a"], {"a": {"b": None}},
                       "x" * 300, "1e999", 10 ** 30, "y" * 5000])


def _paths(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, (list, tuple)):   # tuples: the mmCIF dicts' arrays
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def doc_mutation(doc, rng: random.Random):
    """One node of a parsed document replaced by a hostile value, removed or retyped."""
    paths = [p for p, _ in _paths(doc)]
    path = rng.choice(paths)
    if not path:
        return hostile_value(rng), "document replaced"
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    op = rng.random()
    where = ".".join(map(str, path))
    if op < 0.6:
        parent[key] = hostile_value(rng)
        return doc, f"{where} = {parent[key]!r:.40}"
    if op < 0.75:
        del parent[key]
        return doc, f"{where} removed"
    if op < 0.85:
        parent[key] = [parent[key]] if not isinstance(parent[key], list) else {"x": parent[key]}
        return doc, f"{where} retyped"
    parent[key] = _deep(rng.choice([100, 5000, 200000]))
    return doc, f"{where} nested deep"


def _deep(n: int):
    class Deep:   # json.dumps / yaml.safe_dump of n nested lists without recursing
        pass
    return Deep, n


def _dumps_json(doc) -> str:
    """json.dumps, with Deep placeholders written as n nested lists."""
    holes = []

    def default(o):
        raise TypeError

    def walk(o):
        if isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], type) and o[0].__name__ == "Deep":
            holes.append(o[1])
            return f"@@DEEP{len(holes) - 1}@@"
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    text = json.dumps(walk(doc), allow_nan=True, indent=1)
    for i, n in enumerate(holes):
        text = text.replace(f'"@@DEEP{i}@@"', "[" * n + "]" * n)
    return text


def json_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    op = rng.random()
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if op < 0.65 and doc is not None:
        doc, what = doc_mutation(doc, rng)
        path.write_text(_dumps_json(doc) + "\n")
        return what
    if op < 0.75 and isinstance(doc, dict) and doc:
        key = rng.choice(sorted(doc))
        text = data.decode()
        value = json.dumps(hostile_value(rng), allow_nan=True)
        path.write_text(text.rstrip().rstrip("}") + f', "{key}": {value}}}\n')
        return f"key {key} doubled ({value:.30})"
    new, what = bytes_mutation(data, rng)
    _write(path, new)
    return what


def deep_pickle(n: int) -> bytes:
    """A valid pickle of n nested lists, made opcode by opcode (pickle.dumps would recurse)."""
    return b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."


# Structures pickle.dumps cannot make, as the opcodes that push them (issue 48): a tuple nested
# `depth` deep (hashing it recursed past the C stack), one doubled through the memo `levels`
# times (a kilobyte whose hash or repr never ends), an integer of `digits` digits (LONG4).
def nested_tuple_ops(depth: int) -> bytes:
    return b")" + b"\x85" * depth


def doubled_tuple_ops(levels: int, memo_base: int = 1 << 20) -> bytes:
    """T0 = (), T(k+1) = (Tk, Tk): each level put in the memo (LONG_BINPUT) and got back (LONG_BINGET)."""
    return b")" + b"".join(b"r" + struct.pack("<I", memo_base + k) + b"j" + struct.pack("<I", memo_base + k) + b"\x86"
                           for k in range(levels))


def huge_int_ops(digits: int) -> bytes:
    data = (10 ** digits - 1).to_bytes((10 ** digits).bit_length() // 8 + 1, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(data)) + data


def pickle_with(doc, holes: dict) -> bytes:
    """pickle.dumps(doc) (protocol 3: bytes as bytes, no frames to keep right) with each placeholder string named
    in `holes` replaced by the opcodes given for it (which push one value)."""
    raw = pickle.dumps(doc, protocol=3)
    for name, ops in holes.items():
        enc = name.encode()
        placeholder = b"X" + struct.pack("<I", len(enc)) + enc
        if raw.count(placeholder) != 1:
            raise ValueError(f"placeholder {name!r} is not in the pickle once")
        raw = raw.replace(placeholder, ops)
    return raw


def _replace_at(node, path: tuple, value):
    """node with the value at path replaced (tuples rebuilt; None as value: the key removed)."""
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(node, dict):
        out = dict(node)
        if value is None and not rest:
            del out[k]
        else:
            out[k] = _replace_at(node[k], rest, value)
        return out
    items = list(node)
    items[k] = _replace_at(items[k], rest, value)
    return tuple(items) if isinstance(node, tuple) else items


def mmcif_dicts_mutation(data: bytes, rng: random.Random, planted: Path) -> tuple[bytes, str]:
    """A dicts file ({pdb_id: mmcif_dict}, builtins only, atom arrays as (zlib bytes, shape,
    dtype)): a value replaced by a hostile one, another shape, dtype or compressed payload
    (a zlib bomb among them), a key removed, code planted, nesting made deep."""
    from hpckit.openfold.records import loads_builtins
    op = rng.random()
    if op < 0.12:
        name = rng.choice(sorted(p.name for p in planted.glob("*.pkl")))
        return (planted / name).read_bytes(), f"plant: {name}"
    if op < 0.16:
        n = rng.choice([1000, 100000])
        return deep_pickle(n), f"{n} nested lists"
    doc = loads_builtins(data)
    if op < 0.3:
        return structural_dicts_mutation(doc, rng)
    paths = [p for p, _ in _paths(doc) if p]
    path = rng.choice(paths)
    where = ".".join(map(str, path))
    node = doc
    for k in path:
        node = node[k]
    op = rng.random()
    if isinstance(node, bytes) and op < 0.5:
        value = rng.choice([zlib.compress(b"\0" * (64 << 20), 9), b"", b"x\x9c" + node[2:len(node) // 2],
                            zlib.compress(b"\1" * 17)])
        what = f"{where} = a compressed payload of {len(value)} bytes"
    elif isinstance(node, tuple) and op < 0.5:
        value = rng.choice([(2 ** 31, 37, 3), (-1, 37, 3), (0,), (1, 2 ** 40), ((1, 2), 3), "text", None])
        what = f"{where} = {value!r:.40}"
    elif isinstance(node, str) and op < 0.5:
        value = rng.choice(["", "float64", "object", "O", "<U4", "../../x", "X" * 5000, "ACDE" * 1000, "\x00"])
        what = f"{where} = {value!r:.40}"
    elif op < 0.7:
        value = hostile_value(rng)
        what = f"{where} = {value!r:.40}"
    elif op < 0.85:
        doc = _replace_at(doc, path, None) if isinstance(_parent(doc, path), dict) else _replace_at(doc, path, [])
        return pickle.dumps(doc, protocol=rng.choice([0, 2, pickle.HIGHEST_PROTOCOL])), f"{where} removed"
    else:
        value = [node] if not isinstance(node, list) else {"x": node}
        what = f"{where} retyped"
    doc = _replace_at(doc, path, value)
    return pickle.dumps(doc, protocol=rng.choice([0, 2, pickle.HIGHEST_PROTOCOL])), what


HOLE = "@FUZZ-HOLE@"


def structural_dicts_mutation(doc: dict, rng: random.Random) -> tuple[bytes, str]:
    """What pickle.dumps of a real dict cannot make, spliced in as opcodes (issue 48): a dict key
    nested deep or doubled through the memo, a value (a shape, the resolution, anything) doubled
    through the memo or an integer of thousands of digits, a list that holds itself, or an
    entry's chains multiplied, all sharing one long sequence and its zeros' zlib through the memo
    (kilobytes that inflate to gigabytes)."""
    kind = rng.choice(["deep key", "doubled key", "doubled value", "huge int", "cycle", "shared atoms"])
    pdb_id = rng.choice(sorted(doc))
    entry = doc[pdb_id]
    if kind.endswith("key"):
        dicts = [p for p, v in _paths(doc) if isinstance(v, dict)]
        path = rng.choice(dicts)
        target = _replace_at(doc, path, {**_parent(doc, path + (None,)), HOLE: None}) if path else {**doc, HOLE: None}
        ops = nested_tuple_ops(rng.choice([40, 1_000_000])) if kind == "deep key" else doubled_tuple_ops(
            rng.choice([30, 100]))
        return pickle_with(target, {HOLE: ops}), f"{kind} in {'.'.join(map(str, path)) or 'the file'}"
    if kind in ("doubled value", "huge int"):
        shapes = [p for p, v in _paths(doc) if isinstance(v, tuple) and v and all(isinstance(n, int) for n in v)]
        paths = [p for p, _ in _paths(doc) if p]
        path = rng.choice(shapes + [(pdb_id, "resolution")] * 2 + paths[:1] + [rng.choice(paths)])
        if kind == "huge int" and path in shapes and rng.random() < 0.5:
            path = path + (rng.randrange(len(_parent(doc, path + (None,)))),)
        ops = doubled_tuple_ops(rng.choice([30, 100])) if kind == "doubled value" else huge_int_ops(
            rng.choice([25, 400, 5000]))
        return pickle_with(_replace_at(doc, path, HOLE), {HOLE: ops}), f"{'.'.join(map(str, path))} = {kind}"
    if kind == "cycle":
        loop: list = []
        loop.append(loop)
        path = rng.choice([p for p, _ in _paths(doc) if p])
        return pickle.dumps(_replace_at(doc, path, loop), protocol=4), f"{'.'.join(map(str, path))} = a list in itself"
    n, k = rng.choice([(70_000, 1), (20_000, 150), (3_000, 2000)])
    ids = [f"Z{i}" for i in range(k)]
    seq = "A" * n
    arrays = {"all_atom_positions": (zlib.compress(bytes(n * 444), 9), (n, 37, 3)),
              "all_atom_mask": (zlib.compress(bytes(n * 37), 9), (n, 37))}
    doc = {**doc, pdb_id: {**entry, "author_chain_ids": ids, "sequences": {c: seq for c in ids},
                           "atoms": {c: arrays for c in ids}}}
    return pickle.dumps(doc, protocol=4), f"{pdb_id}: {k} chains of {n} residues sharing one sequence and its atoms"


def _parent(doc, path: tuple):
    for k in path[:-1]:
        doc = doc[k]
    return doc


def alignment_index_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    """super.index: an entry's shard pointed outside the folder (a path, '..', an absolute one),
    a file's byte range set to an extreme, or a JSON-level mutation."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    op = rng.random()
    if op < 0.15 and isinstance(doc, dict) and doc:
        what = index_ranges_mutation(path, doc, rng)
        path.write_text(json.dumps(doc) + "\n")
        return what
    if op < 0.45 and isinstance(doc, dict) and doc:
        key = rng.choice(sorted(doc))
        entry = doc[key]
        if rng.random() < 0.5 and isinstance(entry, dict):
            entry["db"] = rng.choice(["../../../pdb_mmcif/processed/chains.csv", "/etc/passwd", "/proc/self/mem",
                                      "0.db/../1.db", "", ".", "missing.db", "/dev/zero", "sub/0.db", FIFO,
                                      "../" * 40 + "etc/hostname"])
            what = f"{key}.db = {entry['db']!r:.50}"
        elif isinstance(entry, dict) and isinstance(entry.get("files"), list) and entry["files"]:
            i = rng.randrange(len(entry["files"]))
            f = entry["files"][i]
            if isinstance(f, list) and len(f) == 3:
                j = rng.choice([1, 2])
                f[j] = rng.choice([-1, 2 ** 31 - 1, 2 ** 63 - 1, 2 ** 64, 10 ** 30, 0, 1.5, "12", None])
                what = f"{key}.files[{i}][{j}] = {f[j]!r}"
            else:
                entry["files"][i] = hostile_value(rng)
                what = f"{key}.files[{i}] = {entry['files'][i]!r:.40}"
        else:
            doc[key] = hostile_value(rng)
            what = f"{key} = {doc[key]!r:.40}"
        if FIFO in what:
            for d in (path.parent, path.parent.parent):
                if not (d / FIFO).exists():
                    os.mkfifo(d / FIFO)
        path.write_text(json.dumps(doc) + "\n")
        return what
    return json_mutation(path, data, rng)


def index_ranges_mutation(path: Path, doc: dict, rng: random.Random) -> str:
    """An entry's byte ranges made to overlap (each file the whole shard, or one file at
    another's bytes), made many, or made gibibytes of a shard grown sparse (issue 48: each read
    whole was a MemoryError)."""
    key = rng.choice(sorted(doc))
    entry = doc[key]
    if not (isinstance(entry, dict) and isinstance(entry.get("files"), list) and entry["files"]
            and isinstance(entry.get("db"), str) and (path.parent / entry["db"]).is_file()):
        return f"{key}: not an entry to mutate"
    files, shard = entry["files"], path.parent / entry["db"]
    kind = rng.choice(["whole shard", "another's bytes", "many", "gibibytes"])
    if kind == "gibibytes":
        size = 3 << 30      # past the bound whatever the entry's file count (1 GiB read whole is allowed)
        os.truncate(shard, max(size, shard.stat().st_size))   # sparse: on no disk
        for f in files:
            f[1:] = [0, size]
    elif kind == "whole shard":
        for f in files:
            f[1:] = [0, shard.stat().st_size]
    elif kind == "another's bytes" and len(files) > 1:
        files[-1][1:] = list(files[0][1:])
    else:
        entry["files"] = [[f"f{i}.a3m", 0, 1] for i in range(rng.choice([17, 10000]))]
    return f"{key}: ranges {kind}"


def alignment_text_mutation(text: str, rng: random.Random, name: str = "") -> tuple[str, str]:
    """One alignment file (a3m or hhr: `name`) damaged at the level of its text."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    op = rng.random()
    if op < 0.12:   # the structural damage of issue 48: many lines, long lines, lines that backtracked
        kind = rng.choice(["summary line", "gaps only", "digits", "long line"] if name.endswith(".hhr")
                          else ["many lines", "long line"])
        if kind == "many lines":
            lines[i:i + 1] = [lines[i][:20]] * 250_000 if rng.random() < 0.5 else [""] * 5_000_000
        elif kind == "long line":
            lines[i] = lines[i] + "A" * rng.choice([70_000, 1 << 20])
        elif kind == "summary line":
            i = rng.choice([k for k, line in enumerate(lines) if line.startswith("Probab=")] or [i])
            lines[i] = "Probab=" + "E-value=1 Score=2 Aligned_cols=3 Identities=4% Similarity=5 Sum_probs=6 " * 50 + \
                rng.choice(["", "Template_Neff=1"])
        elif kind == "gaps only":
            q = [k for k, line in enumerate(lines) if line.startswith(("Q ", "T "))]
            if q:
                k = rng.choice(q)
                lines[k] = lines[k][:17] + "".join("-" if c.isupper() else c for c in lines[k][17:])
        else:
            q = [k for k, line in enumerate(lines) if line.startswith(("Q ", "T ", "No "))]
            if q:
                k = rng.choice(q)
                lines[k] = re.sub(r"[0-9]+", lambda m: "9" * rng.choice([19, 5000]), lines[k], count=1)
        return "\n".join(lines), kind
    if op < 0.3:
        lines[i] = rng.choice(["", ">", "-" * 5000, "a" * 300, "\x00\xff", "Q" * 100000, "No 1", "Probab=1e999",
                               " 1 x y 2 3 4 5 6 7 8 9 10", ">x\n\n\n", "#" * 10, lines[i] * 50])
        return "\n".join(lines), f"line {i} replaced"
    if op < 0.5:
        del lines[i]
        return "\n".join(lines), f"line {i} removed"
    if op < 0.65:
        return "\n".join(lines[:i]), f"cut after line {i}"
    words = lines[i].split()
    if words:
        j = rng.randrange(len(words))
        words[j] = str(rng.choice([-1, 0, 2 ** 31 - 1, 2 ** 63, 10 ** 30, "nan", "inf", "-0", "1e999", "x"]))
        lines[i] = " ".join(words)
    return "\n".join(lines), f"line {i} word changed"


def alignment_shard_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    """A shard (<n>.db, the alignment files concatenated): one of its files damaged as text at
    the byte range super.index gives (the index fixed to the new length), or the bytes damaged."""
    index_path = path.parent / "super.index"
    try:
        index = json.loads(index_path.read_bytes())
        spans = [(key, k, f) for key, e in index.items() if isinstance(e, dict) and e.get("db") == path.name
                 for k, f in enumerate(e["files"])]
    except (ValueError, OSError, KeyError, TypeError, AttributeError):
        spans = []
    if spans and rng.random() < 0.6:
        key, k, (name, start, size) = rng.choice(spans)
        old = data[start:start + size].decode("utf-8", "replace")
        new_text, what = alignment_text_mutation(old, rng, name)
        new = new_text.encode("utf-8", "surrogateescape")
        delta = len(new) - size
        _write(path, data[:start] + new + data[start + size:])
        for e in index.values():
            if isinstance(e, dict) and e.get("db") == path.name:
                for f in e["files"]:
                    if f[1] > start:
                        f[1] += delta
        index[key]["files"][k][2] = len(new)
        index_path.write_text(json.dumps(index) + "\n")
        return f"{key}'s {name}: {what}"
    new, what = bytes_mutation(data, rng)
    _write(path, new)
    return what


def openfold_mutation(path: Path, data: bytes, rng: random.Random, planted: Path) -> str:
    if path.name == "super.index":
        return alignment_index_mutation(path, data, rng)
    if path.suffix == ".db":
        return alignment_shard_mutation(path, data, rng)
    if path.parent.name == "dicts" and rng.random() < 0.7:
        new, what = mmcif_dicts_mutation(data, rng, planted)
        _write(path, new)
        return what
    if path.name == "chains.csv" and rng.random() < 0.6:
        lines = data.decode().split("\n")
        i = rng.randrange(min(len(lines), 12))
        cells = lines[i].split(",")
        j = rng.randrange(len(cells))
        cells[j] = rng.choice(["", "-1", "0", "2147483648", "99999999999999999999", "nan", "inf", "1e999", "x" * 3000,
                               "2021-02-30", "9999-12-31", "../x", "A;B;;", '"', "Q" * 100000, cells[j] * 2])
        lines[i] = ",".join(cells)
        if rng.random() < 0.2:
            lines.insert(i, lines[i])
        path.write_text("\n".join(lines))
        return f"chains.csv line {i + 1} cell {j} = {cells[j]!r:.40}"
    new, what = bytes_mutation(data, rng)
    _write(path, new)
    return what


def mllog_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    lines = data.split(b"\n")
    marked = [i for i, ln in enumerate(lines) if b":::MLLOG " in ln]
    if not marked or rng.random() < 0.15:
        new, what = bytes_mutation(data, rng)
        _write(path, new)
        return what
    i = rng.choice(marked)
    line = lines[i]
    cut = line.rindex(b":::MLLOG ") + len(b":::MLLOG ")
    op = rng.random()
    try:
        rec = json.loads(line[cut:])
    except ValueError:
        rec = None
    if op < 0.6 and isinstance(rec, dict):
        fld = rng.choice(["value", "value", "time_ms", "time_ms", "metadata.epoch_num", "metadata.status", "metadata",
                          "key", "event_type", "metadata.instance", "deep", "deep"])
        if fld == "deep":
            rec, what = doc_mutation(rec, rng)
        elif fld.startswith("metadata."):
            meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            meta[fld.split(".", 1)[1]] = hostile_value(rng)
            rec["metadata"], what = meta, fld
        elif fld == "key":
            rec["key"] = rng.choice(["run_start", "run_stop", "epoch_start", "eval_accuracy", "eval_error",
                                     "global_batch_size", "number_of_nodes", "hpckit_config", "submission_benchmark",
                                     7, None])
            what = f"key -> {rec['key']}"
        else:
            rec[fld] = hostile_value(rng)
            what = fld
        lines[i] = line[:cut] + _dumps_json(rec).replace("\n", "").encode()
        _write(path, b"\n".join(lines))
        return f"line {i + 1}: {what}"
    if op < 0.68:
        lines[i] = line[:cut] + line[cut:].replace(b'"key"', b'"key": "run_stop", "key"', 1)
        what = "a duplicated key"
    elif op < 0.76:
        del lines[i]
        what = "dropped"
    elif op < 0.84:
        lines.insert(i, line)
        what = "doubled"
    elif op < 0.92:
        lines[i] = line[:rng.randrange(len(line) + 1)]
        what = "cut"
    else:
        j = rng.choice(marked)
        lines[i], lines[j] = lines[j], lines[i]
        what = f"swapped with line {j + 1}"
    _write(path, b"\n".join(lines))
    return f"line {i + 1} {what}"


PERFLOG_HOSTILE = ["nan", "inf", "-inf", "", "null", "abc", "1e400", "-5", "0", "2026-13-45T99:99:99",
                   "2026-11-22T10:00:00+05:00", "{", "[]", '{"packages": 5}', '{"commit": 7}', '"text"', "%",
                   "x" * 200, "1e308", "9" * 5000, "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                   "DeepCAMCheck %a=b %c", "[" * 100000 + "]" * 100000]


def perflog_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    if rng.random() < 0.15:
        new, what = bytes_mutation(data, rng)
        _write(path, new)
        return what
    lines = data.decode(errors="replace").split("\n")
    body = [i for i, ln in enumerate(lines) if ln.strip() and i > 0]
    i = 0 if not body or rng.random() < 0.1 else rng.choice(body)
    fields = lines[i].split("|")
    op = rng.random()
    if op < 0.7:
        k = rng.randrange(len(fields))
        if fields[k].startswith("{") and rng.random() < 0.6:
            doc, what = doc_mutation(json.loads(fields[k]), rng)
            fields[k] = _dumps_json(doc).replace("\n", "").replace("|", "/")
        else:
            fields[k] = rng.choice(PERFLOG_HOSTILE)
            what = f"{fields[k][:20]!r}"
        lines[i] = "|".join(fields)
        what = f"line {i + 1} field {k + 1}: {what}"
    elif op < 0.8:
        del fields[rng.randrange(len(fields))]
        lines[i] = "|".join(fields)
        what = f"line {i + 1}: a field dropped"
    elif op < 0.9:
        lines.insert(i, lines[i])
        what = f"line {i + 1} doubled"
    else:
        del lines[i]
        what = f"line {i + 1} dropped"
    path.write_text("\n".join(lines))
    return what


YAML_TEXTS = ["!!python/object/apply:os.system ['touch " + MARKER + "']",
              "!!python/object/apply:builtins.exec [\"open('" + MARKER + "', 'w').close()\"]",
              "!!python/name:os.system", "!!binary aGVsbG8=", "!!set {a, b}", "2026-11-21", "!!timestamp 2026-11-21",
              "1e999", ".inf", ".nan", "-.inf", "0x7fffffff", "0o777", "1_000_000", "1:20:30", "~", "0b101",
              "!!float 1e400", "!!int 99999999999999999999999", "!!omap [{a: 1}]", "*undefined_alias",
              "&a [*a]", "{" * 20000 + "}" * 20000, "[" * 20000 + "]" * 20000, "'unterminated", "\t- tab",
              "!!str", "{a: 1, a: 2}", "[1, 2, [3, [4]]]", "yes", "off", "9" * 5000]


def yaml_mutation(path: Path, data: bytes, rng: random.Random) -> str:
    import yaml
    op = rng.random()
    if op < 0.12:
        new, what = bytes_mutation(data, rng)
        _write(path, new)
        return what
    lines = data.decode().split("\n")
    keyed = [i for i, ln in enumerate(lines) if ":" in ln and not ln.lstrip().startswith("#")]
    if op < 0.4:
        i = rng.choice(keyed)
        head = lines[i].split(":", 1)[0]
        text = rng.choice(YAML_TEXTS)
        lines[i] = f"{head}: {text}"
        path.write_text("\n".join(lines))
        return f"line {i + 1} ({head.strip()}): {text[:40]!r}"
    if op < 0.5:
        i = rng.choice(keyed)
        lines.insert(i, lines[i])
        path.write_text("\n".join(lines))
        return f"line {i + 1} doubled (a duplicated key)"
    doc = yaml.safe_load(data)
    if op < 0.6:
        section = rng.choice([k for k in doc if isinstance(doc[k], dict)])
        doc[section][rng.choice(["unknown_key", "n_train ", "N_TRAIN"])] = 1
        what = f"an unknown key in {section}"
    else:
        doc, what = doc_mutation(doc, rng)

    def plain(o):   # Deep placeholders as nested lists (yaml.safe_dump recurses: few levels only)
        if isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], type):
            out = []
            for _ in range(min(o[1], 200)):
                out = [out]
            return out
        if isinstance(o, dict):
            return {k: plain(v) for k, v in o.items()}
        if isinstance(o, list):
            return [plain(v) for v in o]
        return o

    path.write_text(yaml.safe_dump(plain(doc), sort_keys=False))
    return what


def _write(path: Path, data: bytes) -> bool:
    path.write_bytes(data)
    return True


# ================================================================== the formats and the campaign

@dataclass(frozen=True)
class Format:
    name: str
    corpus: str        # folder of the corpus copied into each case
    target: str        # TARGETS key
    hows: tuple        # the reader's variants, chosen per case
    files: tuple       # glob patterns (relative to the case's data) of the files to damage


FORMATS = {f.name: f for f in (
    Format("tfrecord-gzip", "tfrecord-gzip", "cosmoflow", ("read_sample", "read_sample_into"), ("*/*.tfrecord",)),
    Format("tfrecord-plain", "tfrecord-plain", "cosmoflow", ("read_sample", "read_sample_into"), ("*/*.tfrecord",)),
    Format("npy", "npy", "cosmoflow", ("read_sample", "read_sample_into"),
           ("*/*_data.npy", "*/*_data.npy", "*/*_label.npy", "*/*_label.npy", "*/*.lst")),
    Format("hdf5", "hdf5", "deepcam", ("read_raw", "read_raw_into"), ("*/*.h5", "*/*.h5", "stats.h5")),
    Format("lmdb", "lmdb", "oc20", ("all",), ("*/*.lmdb",)),
    Format("openfold", "openfold", "openfold", ("train", "eval", "all"),
           ("pdb_mmcif/processed/chains.csv", "pdb_mmcif/processed/obsolete.dat", "pdb_mmcif/processed/dicts/*",
            "pdb_mmcif/processed/dicts/*", "open_protein_set/processed/pdb_alignments/super.index",
            "open_protein_set/processed/pdb_alignments/*.db")),
    Format("mllog", "mllog", "mllog", ("strict", "lenient"), ("*",)),
    Format("summary", "summary", "summary", ("",), ("*",)),
    Format("perflog", "perflog", "perflog", ("file", "folder"), ("local/default/Check.log",)),
    Format("config", "config", "config", ("",), ("*.yaml",)),
)}
# the oracle's own checks (tests/test_fuzz.py): readers as unsafe as the kit's were
ORACLE_FORMATS = {f.name: f for f in (
    Format("unsafe-lmdb", "lmdb", "unsafe-lmdb", ("all",), ("*/*.lmdb",)),
    Format("unsafe-json", "summary", "unsafe-json", ("",), ("*",)),
)}
ALL_FORMATS = {**FORMATS, **ORACLE_FORMATS}


def mutate(fmt: Format, data_dir: Path, corpus: Path, rng: random.Random) -> tuple[Path, str, str]:
    """Damage one file of the case's data; (the file, the reader's variant, what was done)."""
    pattern = rng.choice(fmt.files)
    path = rng.choice(sorted(data_dir.glob(pattern)))
    if fmt.target == "mllog":
        how = f"{rng.choice(fmt.hows)}:{path.name}"
    elif fmt.target in ("summary", "unsafe-json"):
        how = path.name
    elif fmt.target == "config":
        how = path.stem
    else:
        how = rng.choice(fmt.hows)
    bank, planted = corpus / "bank", corpus / "bank" / "planted"
    if rng.random() < 0.03:
        return path, how, special_file(path, rng)
    data = path.read_bytes()
    kind = fmt.corpus
    if kind == "tfrecord-gzip":
        if rng.random() < 0.3:
            new, what = bytes_mutation(data, rng)
        else:
            new, what = gzip_mutation(data, rng, bank / "tfrecord")
        path.write_bytes(new)
    elif kind == "tfrecord-plain":
        if rng.random() < 0.3:
            new, what = bytes_mutation(data, rng)
        else:
            new, what = tfrecord_mutation(data, rng, bank / "tfrecord")
        path.write_bytes(new)
    elif kind == "npy":
        what = npy_mutation(path, data, rng, bank / "npy", planted)
    elif kind == "hdf5":
        op = rng.random()
        stats = path.name == "stats.h5"
        if op < 0.4:
            choices = sorted(p.name for p in (bank / "hdf5").glob("stats-*.h5" if stats else "sample-*.h5"))
            name = rng.choice(choices)
            data = (bank / "hdf5" / name).read_bytes()
            what = f"replaced by {name}"
            if "fifo" in name:
                for d in (path.parent, data_dir.parent):
                    if not (d / FIFO).exists():
                        os.mkfifo(d / FIFO)
            if op < 0.08:
                data, more = bytes_mutation(data, rng)
                what += f", then {more}"
            path.write_bytes(data)
        else:
            new, what = bytes_mutation(data, rng)
            path.write_bytes(new)
    elif kind == "lmdb":
        what = lmdb_mutation(path, rng, bank / "oc20", planted)
    elif kind == "openfold":
        what = openfold_mutation(path, data, rng, planted)
    elif kind == "mllog":
        what = mllog_mutation(path, data, rng)
    elif kind == "summary":
        what = json_mutation(path, data, rng)
    elif kind == "perflog":
        what = perflog_mutation(path, data, rng)
    elif kind == "config":
        what = yaml_mutation(path, data, rng)
    else:
        raise ValueError(kind)
    return path, how, what


@dataclass
class Finding:
    format: str
    seed: int
    case: int
    kind: str         # "exception", "signal", "hang", "code ran", "output", "unnamed", "worker died"
    detail: str
    mutation: str
    file: str
    stderr: str

    def replay(self, formats: list[str] | None) -> str:
        only = f" --formats {','.join(formats)}" if formats else ""
        return f"python tests/fuzz.py --seed {self.seed} --first {self.case} --cases 1{only} --keep DIR"

    def signature(self) -> tuple:
        return (self.format, self.kind, self.detail.split(" (")[0][:160])


@dataclass
class Campaign:
    seed: int
    counts: dict = field(default_factory=lambda: defaultdict(Counter))   # format -> outcome -> cases
    findings: list = field(default_factory=list)
    seconds: float = 0.0
    worker_starts: int = 0

    @property
    def cases(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())


def _traceback_summary(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "(no output)"
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    kit = [f for f in frames if "hpckit" in f] or frames
    return f"{last[:300]} ({kit[-1] if kit else 'no frame'})"


def judge(answer: dict, case_dir: Path, data_dir: Path, fmt: Format, listed: tuple = ()) -> tuple[str, str | None, str]:
    """(outcome, finding kind or None, detail) of one case's answer. A refusal must name a
    file of the case, a path a damaged file list names (`listed`), or a config's key."""
    if (case_dir / MARKER).exists():
        return "finding", "code ran", f"the planted pickle created {MARKER}"
    if answer.get("worker_died"):
        return "finding", "worker died", "the worker process died"
    if answer["hang"]:
        return "finding", "hang", "no answer within the timeout: killed"
    rc, err = answer["rc"], answer["stderr"]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    n_lines, longest = answer.get("stderr_lines", len(lines)), answer.get("stderr_longest", 0)
    if rc < 0:
        return "finding", "signal", f"killed by {signal.Signals(-rc).name}"
    if rc == 0:
        if lines:
            return "finding", "output", f"read, but printed on stderr: {lines[0][:200]}"
        return "read", None, answer["stdout"].strip()
    if rc == 2:
        if n_lines != 1:
            return "finding", "output", f"{n_lines} lines on stderr: {' / '.join(lines)[:300]}"
        if longest > MAX_LINE:
            return "finding", "output", f"an error line of {longest} characters: {lines[0][:200]}"
        named = (str(data_dir) in lines[0] or (fmt.target == "config" and "config key" in lines[0])
                 or any(name in lines[0] for name in listed))
        if not named:
            return "finding", "unnamed", f"the error names no file of the case: {lines[0][:300]}"
        return "refused", None, lines[0]
    if rc == 1 and "Traceback (most recent call last)" in err:
        return "finding", "exception", _traceback_summary(err)
    return "finding", "exit", f"exit {rc}: {err.strip()[-300:]}"


def _unwritable(given: Path) -> str | None:
    """Why the folder `given` (made with its parents when missing) cannot take this run's
    files, or None: a file is made in it, or in the nearest folder above it that exists, and
    removed again."""
    if given.exists() and not given.is_dir():
        return "not a directory"
    where = given
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return f"{where} is not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=".hpckit-probe-", dir=where)
    except OSError as e:
        return f"cannot write into {where} ({e.strerror or e})"
    os.close(fd)
    os.unlink(name)
    return None


def run_campaign(cases: int, seed: int, first: int = 0, formats: list[str] | None = None, timeout: float = 20,
                 work: Path | None = None, keep: Path | None = None, runs: list[Path] = (),
                 log=print, verbose: bool = False, forced: dict | None = None) -> Campaign:
    """`cases` cases numbered first.., case c of format names[c % len(names)] (names: all
    the kit's formats, or `formats`), its mutation drawn from random.Random(f"{seed}:{c}").
    `work`: where the corpus is made (once: a later campaign with the same `work` reuses it)
    and the cases run; `forced`: format -> function(data_dir, corpus, rng, case) -> (file,
    reader variant, what) that damages the case instead of `mutate` (tests/test_fuzz.py)."""
    names = list(formats or FORMATS)
    for n in names:
        if n not in ALL_FORMATS:
            raise ValueError(f"unknown format {n!r} (one of {', '.join(ALL_FORMATS)})")
    own_work = work is None
    work = Path(tempfile.mkdtemp(prefix="hpckit-fuzz-") if own_work else work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus"
    camp = Campaign(seed)
    worker = Worker()
    start = time.monotonic()
    try:
        if not corpus.is_dir():
            tmp = work / "corpus.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            made = worker.run({"op": "corpus", "root": str(tmp), "cwd": str(tmp), "timeout": 600,
                               "runs": [str(Path(r).resolve()) for r in runs]})
            if made.get("rc") != 0:
                raise RuntimeError(f"making the corpus failed:\n{made.get('stderr', '')[-5000:]}")
            tmp.rename(corpus)
        for case in range(first, first + cases):
            fmt = ALL_FORMATS[names[case % len(names)]]
            rng = random.Random(f"{seed}:{case}")
            case_dir = work / "cases" / str(case)
            shutil.rmtree(case_dir, ignore_errors=True)
            data_dir = case_dir / "data"
            shutil.copytree(corpus / fmt.corpus, data_dir, symlinks=True)
            if forced and fmt.name in forced:
                path, how, what = forced[fmt.name](data_dir, corpus, rng, case)
            else:
                path, how, what = mutate(fmt, data_dir, corpus, rng)
            answer = worker.run({"op": "read", "target": fmt.target, "how": how, "root": str(data_dir),
                                 "cwd": str(case_dir), "timeout": timeout, "memory": MEMORY_HEADROOM})
            listed = _listed(path)
            outcome, kind, detail = judge(answer, case_dir, data_dir, fmt, listed)
            camp.counts[fmt.name][outcome] += 1
            rel = str(path.relative_to(data_dir))
            if verbose:
                log(f"case {case} {fmt.name} [{how}] {rel}: {what} -> {outcome}: {detail[:160]}")
            if kind is not None:
                found = Finding(fmt.name, seed, case, kind, detail, what, rel, answer.get("stderr", "")[-3000:])
                camp.findings.append(found)
                log(f"FINDING format={fmt.name} seed={seed} case={case}: {kind}: {detail}\n"
                    f"    file {rel} [{how}]: {what}\n    replay: {found.replay(formats)}")
                if keep is not None:
                    dest = Path(keep) / f"{fmt.name}-seed{seed}-case{case}"
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.copytree(case_dir, dest, symlinks=True)
                    (dest / "finding.txt").write_text(f"{found}\n\n{answer.get('stderr', '')}")
            elif keep is not None and cases == 1:
                dest = Path(keep) / f"{fmt.name}-seed{seed}-case{case}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(case_dir, dest, symlinks=True)
            _remove(case_dir)
    finally:
        worker.close()
        camp.worker_starts = worker.starts
        camp.seconds = time.monotonic() - start
        if own_work:
            _remove(work)
    return camp


def _listed(path: Path) -> tuple:
    """The names a damaged file list (npy's files_*.lst) holds: what an error may name."""
    if path.suffix != ".lst" or path.is_symlink() or not path.is_file():
        return ()
    try:
        return tuple(ln.strip() for ln in path.read_text().splitlines() if ln.strip())
    except (OSError, UnicodeDecodeError):
        return ()


def _remove(path: Path) -> None:
    """rmtree that also takes folders a mutation left unreadable or odd (FIFOs, links)."""
    def again(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=again)


def report(camp: Campaign, formats: list[str] | None, log=print) -> None:
    log(f"fuzz: {camp.cases} cases from seed {camp.seed} in {camp.seconds:.0f} s "
        f"(worker started {camp.worker_starts} time(s))")
    log(f"{'format':<16}{'cases':>7}{'read':>7}{'refused':>9}{'findings':>10}")
    for name in sorted(camp.counts):
        c = camp.counts[name]
        log(f"{name:<16}{sum(c.values()):>7}{c['read']:>7}{c['refused']:>9}{c['finding']:>10}")
    if not camp.findings:
        log("no findings: every case read its data or was one KitError line naming its file (exit 2)")
        return
    distinct = Counter(f.signature() for f in camp.findings)
    log(f"{len(camp.findings)} finding(s), {len(distinct)} distinct:")
    for sig, n in distinct.most_common():
        f = next(x for x in camp.findings if x.signature() == sig)
        log(f"  {n:>5} x {sig[0]}: {sig[1]}: {f.detail[:200]}")
        log(f"          first: seed={f.seed} case={f.case} ({f.file}: {f.mutation[:120]}); replay: {f.replay(formats)}")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr and exit 2 (`make fuzz CASES=abc`
    printed the usage and the error, five lines with make's, for one mistake); --help as before."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    from hpckit.common.inputs import cli_float, cli_int
    ap = OneLineParser(prog="tests/fuzz.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=cli_int(1, 10 ** 9), default=300)
    ap.add_argument("--seed", type=cli_int(-(2 ** 63), 2 ** 63 - 1), default=1)
    ap.add_argument("--first", type=cli_int(0, 10 ** 12), default=0,
                    help="the first case's number (replay: --first C --cases 1)")
    ap.add_argument("--formats", help=f"comma-separated, of: {', '.join(ALL_FORMATS)} (default: the kit's formats)")
    ap.add_argument("--timeout", type=cli_float(0, 86400, low_open=True), default=20,
                    help="seconds per case before it counts as a hang")
    ap.add_argument("--work", type=Path, help="a folder for the corpus and the cases (default: a temporary one)")
    ap.add_argument("--keep", type=Path, help="copy each finding's case (its damaged input) here")
    ap.add_argument("--runs", type=Path, nargs="*", default=[], help="kit run folders: their mlperf.log and "
                                                                      "summary.json join the corpus")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        serve()
        return 0
    formats = args.formats.split(",") if args.formats else None
    unknown = [f for f in formats or () if f not in ALL_FORMATS]
    if formats is not None and (unknown or not formats):
        ap.error(f"--formats {args.formats!r}: {'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'empty'} "
                 f"(of {', '.join(ALL_FORMATS)})")
    for option, given in (("--work", args.work), ("--keep", args.keep)):
        if given is not None:   # checked now, not when the corpus is made or the first finding kept
            problem = _unwritable(Path(given))
            if problem:
                ap.error(f"{option} {given}: {problem}")
    try:
        camp = run_campaign(args.cases, args.seed, args.first, formats, args.timeout, args.work, args.keep,
                            args.runs, verbose=args.verbose)
    except ValueError as e:
        ap.error(str(e))
    report(camp, formats)
    return 1 if camp.findings else 0


if __name__ == "__main__":
    sys.exit(main())
