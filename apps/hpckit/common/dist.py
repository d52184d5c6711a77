"""Distributed wire-up, once for every benchmark: who am I among the ranks, and the
communicator the training uses.

Detection reads the launcher's environment, first match wins:

    torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT
    openmpi    OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (mpirun, also under Slurm)
    slurm      SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_NODES,
               master = first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, else
               SLURM_LAUNCH_NODE_IPADDR (srun only: a batch script's own shell, which has
               SLURM_PROCID but no step, is one process)
    pmi        PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH / Intel MPI hydra)
    pmix       PMIX_RANK with PMIX_SIZE
    none       a single process: rank 0 of 1

Where each rank runs is never assumed from a distribution: Slurm (SLURM_NODEID,
SLURM_LOCALID) and torchrun (GROUP_RANK, LOCAL_RANK) say it; for every multi-rank run the
ranks then tell each other their host at the rendezvous (`roll_call`), which gives the
node and local rank under Open MPI, PMI and PMIx (whose environments do not name the node)
and every rank's address for TensorFlow's worker list. The rendezvous address is
MASTER_ADDR when set (every launcher), the first node of the Slurm step or allocation (the
node of task 0 under srun's block, cyclic and plane distributions and mpirun's default
mapping), or 127.0.0.1 when all ranks are on one node; the port is MASTER_PORT or derived
from the job id.

Communicators (`--dist`):
    torch    torch.distributed: gloo on CPU, nccl on GPU; models wrapped in DDP; a gloo
             side group carries control traffic (barriers with their own timeout, scalars)
    tf       tf.distribute.MultiWorkerMirroredStrategy, TF_CONFIG built from the detection
    horovod  horovod.torch (allreduce of gradients, broadcast of the initial state); launch
             it with srun or mpirun only, never with horovodrun (see README)
    none     one process

A dead peer must not leave the others hanging: torch collectives fail when a peer's
connection drops and time out after `timeout_s` otherwise; SIGTERM from a launcher that
is tearing the job down becomes an exception, so the run protocol still writes
run_stop aborted and summary.json before the process exits non-zero.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta

from hpckit.common.errors import KitError, Terminated

DIST_CHOICES = ("auto", "torch", "tf", "horovod", "none")
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0
    nodes: int = 1
    launcher: str = "none"
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    node_hosts: tuple[str, ...] = field(default=())   # one per node, when the launcher says
    # per rank, from the roll call (roll_call): host name, address the others reach it at, local rank
    hosts: tuple[str, ...] = field(default=())
    addrs: tuple[str, ...] = field(default=())
    local_ranks: tuple[int, ...] = field(default=())

    @property
    def is_root(self) -> bool:
        return self.rank == 0


# ---------------------------------------------------------------- detection

def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host list -> host names, in Slurm's order. `scontrol show
    hostnames` expands it where Slurm is configured (inside a job: SLURM_CONF, or the
    system's slurm.conf); elsewhere, or where scontrol refuses, the kit's own parser, which
    takes every form Slurm writes (tested against scontrol in tests/test_multinode.py):
    'nid[001-003,007],login1', several groups 'cn[01-02],gpu[1-2],fat1', several brackets
    in one name 'r[1-2]n[01-02]' (r1n01 r1n02 r2n01 r2n02), and a text after the bracket."""
    spec = spec.strip()
    if not spec:
        return []
    slurm = _scontrol_hostnames(spec)
    return slurm if slurm is not None else _parse_hostlist(spec)


_SCONTROL_CACHE: dict[str, list[str] | None] = {}


def _scontrol_hostnames(spec: str) -> list[str] | None:
    import shutil
    import subprocess
    if spec in _SCONTROL_CACHE:
        return _SCONTROL_CACHE[spec]
    hosts = None
    if shutil.which("scontrol") and (os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")):
        try:
            proc = subprocess.run(["scontrol", "show", "hostnames", spec], capture_output=True, text=True, timeout=10)
            if proc.returncode == 0 and proc.stdout.split():
                hosts = proc.stdout.split()
        except (OSError, subprocess.SubprocessError):
            pass
    _SCONTROL_CACHE[spec] = hosts
    return hosts


def _split_top(spec: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise KitError(f"host list {spec!r}: ']' without '['")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise KitError(f"host list {spec!r}: '[' without ']'")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _parse_hostlist(spec: str) -> list[str]:
    import itertools
    hosts: list[str] = []
    for item in _split_top(spec):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for piece in pieces:
            if not piece.startswith("["):
                choices.append([piece])
                continue
            values: list[str] = []
            for part in piece[1:-1].split(","):
                lo, _, hi = part.strip().partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise KitError(f"host list {spec!r}: range [{part}] is not numeric")
                if not hi:
                    values.append(lo)
                    continue
                width = len(lo)
                values.extend(f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
            choices.append(values)
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """SLURM_TASKS_PER_NODE '2(x3),1' -> tasks on node `node`."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else None


def _int(env, key, default=None):
    v = env.get(key)
    if v in (None, ""):
        return default
    try:
        return int(v)
    except ValueError:
        raise KitError(f"environment variable {key}={v!r} is not an integer") from None


def _job_port(env) -> int:
    """A port both ranks derive alike: MASTER_PORT, else from the job id, else the default."""
    if env.get("MASTER_PORT"):
        return _int(env, "MASTER_PORT")
    for key in ("SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"):
        if env.get(key):
            digits = int.from_bytes(env[key].encode()[-8:], "big")
            return 20000 + (digits * 7919 + _int(env, "SLURM_STEP_ID", 0)) % 20000
    return DEFAULT_PORT


def detect(env=os.environ) -> Ranks:
    launcher = None
    if env.get("RANK") is not None and env.get("WORLD_SIZE") is not None:
        launcher = "torchrun"
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank, local_size = _int(env, "LOCAL_RANK", 0), _int(env, "LOCAL_WORLD_SIZE", size)
        node = _int(env, "GROUP_RANK", rank // max(1, local_size))
    elif env.get("OMPI_COMM_WORLD_RANK") is not None:
        launcher = "openmpi"
        rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", size)
        node = rank // max(1, local_size)
    elif env.get("SLURM_PROCID") is not None and env.get("SLURM_STEP_NUM_TASKS") is not None:
        launcher = "slurm"
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
        local_rank, node = _int(env, "SLURM_LOCALID", 0), _int(env, "SLURM_NODEID", 0)
        local_size = (_tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), node)
                      or _tasks_on_node(env.get("SLURM_TASKS_PER_NODE", ""), node) or size)
    elif env.get("PMI_RANK") is not None and env.get("PMI_SIZE") is not None:
        launcher = "pmi"
        rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        local_rank, local_size = _int(env, "MPI_LOCALRANKID", 0), _int(env, "MPI_LOCALNRANKS", size)
        node = rank // max(1, local_size)
    elif env.get("PMIX_RANK") is not None:
        if env.get("PMIX_SIZE") is None:
            raise KitError("PMIx launch without PMIX_SIZE: set it, or launch with srun/mpirun")
        launcher = "pmix"
        rank, size = _int(env, "PMIX_RANK"), _int(env, "PMIX_SIZE")
        local_rank, local_size = _int(env, "PMIX_LOCAL_RANK", 0), _int(env, "PMIX_LOCAL_SIZE", size)
        node = rank // max(1, local_size)
    if launcher is None:
        return Ranks()
    if not (size >= 1 and 0 <= rank < size and 0 <= local_rank < local_size <= size):
        raise KitError(f"{launcher} environment is inconsistent: rank {rank} of {size}, "
                       f"local rank {local_rank} of {local_size}")
    nodes = -(-size // local_size)
    hosts: tuple[str, ...] = ()
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if launcher in ("slurm", "openmpi") and nodelist:
        hosts = tuple(expand_hostlist(nodelist))
        if launcher == "slurm":
            nodes = _int(env, "SLURM_STEP_NUM_NODES", len(hosts))
    if env.get("MASTER_ADDR"):
        master = env["MASTER_ADDR"]
    elif nodes == 1:
        master = "127.0.0.1"
    elif hosts:
        master = hosts[0]
    elif env.get("SLURM_LAUNCH_NODE_IPADDR"):
        master = env["SLURM_LAUNCH_NODE_IPADDR"]
    else:
        raise KitError(f"{size} ranks on {nodes} nodes ({launcher}) and no rendezvous address: "
                       "export MASTER_ADDR=<host of rank 0> to every rank")
    return Ranks(rank, size, local_rank, local_size, node, nodes, launcher, master, _job_port(env), hosts)


# ---------------------------------------------------------------- communicators

def choose(requested: str, framework: str, ranks: Ranks) -> str:
    """The communicator for `--dist requested` with this framework and rank count."""
    if requested not in DIST_CHOICES:
        raise KitError(f"--dist {requested}: choose one of {', '.join(DIST_CHOICES)}")
    if requested == "auto":
        if ranks.size == 1:
            return "none"
        return "tf" if framework == "tensorflow" else "torch"
    if requested == "none" and ranks.size > 1:
        raise KitError(f"--dist none with {ranks.size} ranks ({ranks.launcher}): every rank would train "
                       "alone into the same output; use --dist auto, or launch one process")
    if requested == "torch" and framework != "pytorch":
        raise KitError(f"--dist torch needs --framework pytorch (got {framework}); TensorFlow uses --dist tf")
    if requested == "tf" and framework != "tensorflow":
        raise KitError(f"--dist tf needs --framework tensorflow (got {framework}); PyTorch uses --dist torch")
    if requested == "horovod":
        module = "horovod.torch" if framework == "pytorch" else "horovod.tensorflow"
        try:
            __import__(module)
        except Exception as e:   # ImportError, or a Horovod built without this framework
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise KitError(f"--dist horovod: {module} is not importable here ({first}); "
                           "install Horovod built for this framework, or use --dist auto") from None
    return requested


class GradSync:
    """The gradient all-reduces of this rank, counted where they are issued: bytes, and the
    time at least one is in flight (the union of launch-to-completion intervals: DDP's
    buckets overlap the backward pass, so this bounds from above the time the step waits
    for the network; a synchronous all-reduce, Horovod's, is all waiting)."""

    def __init__(self):
        import threading
        self.bytes = 0
        self.busy_s = 0.0
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0

    def started(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy_s += time.perf_counter() - self._since

    def read(self) -> dict:
        with self._lock:
            return {"bytes": self.bytes, "busy_s": self.busy_s}


class Comm:
    """One process: every collective is the identity."""
    kind = "none"

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.grad_sync: GradSync | None = None   # set where gradients are all-reduced

    def allreduce_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def broadcast_int(self, value: int) -> int:
        return value

    def barrier(self, timeout_s: float | None = None) -> None:
        pass

    def average_tensors(self, tensors) -> None:
        """In place: every rank's tensors become the mean over the ranks."""

    def close(self) -> None:
        pass


# Set once a torch.distributed process group existed in this process. Its interpreter
# teardown can deadlock: seen 2026-11-24 under Slurm (2 gloo ranks, run converged, summary
# written): the main thread, holding the GIL, destroyed DDP's Reducer and with it the gloo
# process group, joining a runloop thread that waited for the GIL to free a finished
# allreduce's tensors (gdb: ~ProcessGroupGloo -> thread::join; ~AsyncAllreduceWork ->
# gil_scoped_acquire). Or it aborts: "terminate called without an active exception",
# SIGABRT, seen 2026-11-26 in a test's rank after its results were handed over. cli.main
# ends such a process with end_process once everything is written and flushed.
UNSAFE_TEARDOWN = False


def end_process(code: int):
    """End this process now with exit status `code`, skipping the interpreter teardown
    (UNSAFE_TEARDOWN): stdout and stderr are flushed first; everything else the process
    had to hand over (logs, summary.json, a test rank's results) must be written and closed
    before. The one way a process that had a process group ends, in the kit (cli.main) and
    in the tests' own ranks (tests/ranks.py)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed or broken stream: nothing more to say
            pass
    os._exit(code)
# This process's place in a throughput campaign (run.launch sets it): cli.main waits at
# its end barrier before the process exits.
ACTIVE_CAMPAIGN = None


class TorchComm(Comm):
    kind = "torch"

    def __init__(self, ranks: Ranks, device, timeout_s: float):
        import torch
        import torch.distributed as tdist
        self.torch, self.tdist, self.device = torch, tdist, device
        self.timeout_s = timeout_s
        super().__init__(ranks)
        backend = "nccl" if device.type == "cuda" else "gloo"
        global UNSAFE_TEARDOWN
        UNSAFE_TEARDOWN = True
        try:
            tdist.init_process_group(backend, init_method=f"tcp://{_url_host(ranks.master_addr)}:{ranks.master_port}",
                                     rank=ranks.rank, world_size=ranks.size, timeout=timedelta(seconds=timeout_s))
            # control traffic (barriers with their own timeout, scalars) on CPU, whatever the device
            self.control = tdist.new_group(backend="gloo") if backend != "gloo" else tdist.group.WORLD
        except Exception as e:
            raise KitError(f"torch.distributed rendezvous at {ranks.master_addr}:{ranks.master_port} "
                           f"(rank {ranks.rank} of {ranks.size}) failed: {_first_line(e)}") from None

    def allreduce_sum(self, values):
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.tdist.all_reduce(t, group=self.control)
        return t.tolist()

    def broadcast_int(self, value):
        t = self.torch.tensor([value], dtype=self.torch.int64)
        self.tdist.broadcast(t, src=0, group=self.control)
        return int(t.item())

    def barrier(self, timeout_s=None):
        self.tdist.monitored_barrier(group=self.control, timeout=timedelta(seconds=timeout_s or self.timeout_s),
                                     wait_all_ranks=True)

    def wrap_model(self, model, broadcast_buffers: bool = True):
        import warnings
        from torch.nn.parallel import DistributedDataParallel
        ids = [self.device.index] if self.device.type == "cuda" else None
        if broadcast_buffers:
            ddp = DistributedDataParallel(model, device_ids=ids)
        else:
            # DeepCAM keeps rank-local batch-norm statistics between its averagings, as the
            # reference does; torch 2.13 deprecates broadcast_buffers=False with a FutureWarning
            # on every rank, but its replacement still syncs buffers at init, and the warning
            # says to keep using broadcast_buffers=False for rank-local buffers: it is not shown
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
                ddp = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        if self.device.type == "cpu":
            # counted on the CPU only: a CUDA all-reduce completes on a stream, not where a
            # host callback could time it, and DDP's built-in C++ hook stays on the GPU path
            self.grad_sync = GradSync()
            ddp.register_comm_hook(self.grad_sync, _counted_allreduce)
        return ddp

    def average_tensors(self, tensors) -> None:
        if not tensors:
            return
        torch = self.torch
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
            self.tdist.all_reduce(flat)
            flat /= self.ranks.size
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def average_gradients(self, params) -> None:
        """DDP averages in backward; nothing to do here."""

    def close(self):
        if self.tdist.is_initialized():
            self.tdist.destroy_process_group()


def _counted_allreduce(sync: GradSync, bucket):
    """DDP's own default, counted: torch 2.13's allreduce_hook (torch/distributed/algorithms/
    ddp_comm_hooks/default_hooks.py:18-32, _allreduce_fut: divide by the group size, then an
    asynchronous all_reduce of the bucket) with GradSync's counts around it."""
    import torch.distributed as tdist
    buf = bucket.buffer()
    buf.div_(tdist.get_world_size())
    sync.started(buf.numel() * buf.element_size())
    fut = tdist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        sync.finished()
        return f.value()[0]
    return fut.then(done)


class HorovodComm(Comm):
    """horovod.torch: gradients averaged with grouped allreduce, initial state from rank 0."""
    kind = "horovod"

    def __init__(self, ranks: Ranks, device, timeout_s: float):
        import torch
        import horovod.torch as hvd
        self.torch, self.hvd, self.device = torch, hvd, device
        super().__init__(ranks)
        self.grad_sync = GradSync()   # average_gradients: synchronous, so timed on any device
        hvd.init()
        if (hvd.rank(), hvd.size()) != (ranks.rank, ranks.size):
            raise KitError(f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher {ranks.rank} of "
                           f"{ranks.size} ({ranks.launcher}): launch with srun or mpirun")

    def allreduce_sum(self, values):
        t = self.torch.tensor(values, dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Sum, name="hpckit.scalars").tolist()

    def broadcast_int(self, value):
        t = self.torch.tensor([value], dtype=self.torch.int64)
        return int(self.hvd.broadcast(t, root_rank=0, name="hpckit.bcast").item())

    def barrier(self, timeout_s=None):
        self.hvd.barrier()

    def wrap_model(self, model, broadcast_buffers: bool = True):
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)   # once, at the start
        return model

    def average_tensors(self, tensors) -> None:
        if tensors:
            self.hvd.grouped_allreduce_(list(tensors), op=self.hvd.Average, name="hpckit.average")

    def average_gradients(self, params) -> None:
        params = [p for p in params if p.grad is not None]
        grads = [p.grad for p in params]
        if grads:
            self.grad_sync.started(sum(g.numel() * g.element_size() for g in grads))
            try:
                self.hvd.grouped_allreduce_(grads, op=self.hvd.Average, name="hpckit.grads")
            finally:
                self.grad_sync.finished()

    def close(self):
        self.hvd.shutdown()


def tf_workers(ranks: Ranks) -> list[str]:
    """TensorFlow's worker list: one gRPC port per rank on its node, above the roll call's
    port, at the address the rank really has (roll_call): srun -m cyclic and mpirun
    --map-by node place rank r on node r mod N, not r // ranks-per-node."""
    if len(ranks.addrs) != ranks.size or len(ranks.local_ranks) != ranks.size:
        raise KitError("--dist tf: the ranks' hosts are unknown (no roll call): start it through hpckit train")
    return [f"{_url_host(ranks.addrs[r])}:{ranks.master_port + TF_WORKER_PORT_OFFSET + ranks.local_ranks[r]}"
            for r in range(ranks.size)]


class TFComm(Comm):
    """tf.distribute.MultiWorkerMirroredStrategy over gRPC; one replica per rank."""
    kind = "tf"

    def __init__(self, ranks: Ranks, timeout_s: float):
        import json
        super().__init__(ranks)
        workers = tf_workers(ranks)
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                              "task": {"type": "worker", "index": ranks.rank}})
        # MultiWorkerMirroredStrategy() waits for every worker for ever, deaf to SIGTERM
        # while it blocks in C++: the roll call (all ranks met, under the timeout) came first
        import tensorflow as tf
        self.tf = tf
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=timeout_s)
        try:
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except Exception as e:
            raise KitError(f"tf.distribute rendezvous of {len(workers)} workers ({workers[0]}...) "
                           f"failed: {_first_line(e)}") from None
        if self.strategy.num_replicas_in_sync != ranks.size:
            raise KitError(f"tf.distribute has {self.strategy.num_replicas_in_sync} replicas, the launcher "
                           f"{ranks.size} ranks: use one CPU device or GPU per rank")

    def _reduce(self, tensor):
        tf, strategy = self.tf, self.strategy

        def replica_fn(v):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)

        out = strategy.run(replica_fn, args=(tensor,))
        return strategy.experimental_local_results(out)[0]

    def allreduce_sum(self, values):
        return [float(v) for v in self._reduce(self.tf.constant(values, dtype=self.tf.float64)).numpy()]

    def broadcast_int(self, value):
        mine = value if self.ranks.rank == 0 else 0
        return int(self._reduce(self.tf.constant([mine], dtype=self.tf.int64)).numpy()[0])

    def barrier(self, timeout_s=None):
        self.allreduce_sum([0.0])


COMM_NAMES = {"torch": "torch.distributed", "tf": "tf.distribute", "horovod": "horovod"}
# Ports on the rendezvous host: MASTER_PORT is torch's store (torchrun's own agent store
# under torchrun), the roll call listens on the next one, TensorFlow's workers on the ones
# after it (one per local rank)
ROLL_CALL_PORT_OFFSET = 1
TF_WORKER_PORT_OFFSET = 2


def roll_call(ranks: Ranks, timeout_s: float, what: str = "hpckit") -> Ranks:
    """Every rank tells rank 0 where it runs, rank 0 answers with the whole table: the
    ranks learn each other's host from the ranks themselves, never from an assumed
    distribution (srun -m cyclic puts rank 1 on the second node; mpirun --map-by node
    too). Returns `ranks` with, per rank, its host name, the address the others reach it
    at (what rank 0 saw it connect from; rank 0's is the rendezvous address) and its local
    rank; and this rank's node, local rank and local size where the launcher does not say
    them (Open MPI, PMI, PMIx: from the ranks that share this host; Slurm and torchrun
    say them and are kept). All ranks meet at master_addr:master_port within timeout_s, or
    each says in one line who did not come. A single process returns at once."""
    import json
    if ranks.size == 1:
        return replace(ranks, hosts=(socket.gethostname(),), addrs=(ranks.master_addr,), local_ranks=(0,))
    me = {"host": socket.gethostname(), "local_rank": ranks.local_rank}
    table = _meet(ranks, timeout_s, what, json.dumps(me).encode())
    rows = [json.loads(raw) for raw in table]
    hosts = tuple(r["host"] for r in rows)
    addrs = tuple(r["addr"] for r in rows)
    local_ranks = tuple(int(r["local_rank"]) for r in rows)
    out = replace(ranks, hosts=hosts, addrs=addrs, local_ranks=local_ranks)
    if ranks.launcher in ("openmpi", "pmi", "pmix", "none"):
        out = _placed(out, ranks.rank)
    elif not ranks.node_hosts:
        out = replace(out, node_hosts=_placement(hosts)[0])
    return out


def _placement(hosts: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """From every rank's host: the nodes in the order of their first rank, and each rank's
    local rank among the ranks on its host."""
    count: dict[str, int] = {}
    local = []
    for h in hosts:
        local.append(count.get(h, 0))
        count[h] = local[-1] + 1
    return tuple(count), tuple(local)


def _placed(ranks: Ranks, rank: int) -> Ranks:
    """ranks with rank `rank`'s node, local rank and size taken from its host table."""
    hosts = ranks.hosts
    node_hosts, local = _placement(hosts)
    return replace(ranks, node=node_hosts.index(hosts[rank]), nodes=len(node_hosts), local_rank=local[rank],
                   local_size=hosts.count(hosts[rank]), node_hosts=node_hosts, local_ranks=local)


def peer_named_in(ranks: Ranks, text: str) -> str | None:
    """The node a communicator's error names by address ('Read error [10.77.0.12]:35209:
    Connection reset by peer'), from the roll call's table: 'node cn02 (ranks 1, 4 at
    10.77.0.12)', or None when the text names no rank's address."""
    if not ranks.addrs:
        return None
    for addr in re.findall(r"\[?([0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)\]?:[0-9]+", text):
        on = [r for r in range(ranks.size) if ranks.addrs[r] == addr]
        if not on:   # rank 0's entry is the rendezvous name: compare by what it resolves to
            try:
                resolved = {ai[4][0] for ai in socket.getaddrinfo(ranks.addrs[0], None)}
            except OSError:
                resolved = set()
            on = [0] if addr in resolved else []
        if on and ranks.rank not in on:
            host = ranks.hosts[on[0]] if ranks.hosts else addr
            return f"node {host} (rank{'s' if len(on) > 1 else ''} {', '.join(map(str, on))} at {addr})"
    return None


def rendezvous(ranks: Ranks, timeout_s: float, what: str) -> None:
    """All ranks meet at master_addr:master_port within timeout_s, or each says in one line
    (KitError) who did not come."""
    _meet(ranks, timeout_s, what, b"{}")


# ---------------------------------------------------------------- throughput campaigns
# M model instances of S ranks each in one launch of M x S ranks (the "weak scaling" of
# MLPerf HPC, mlcommons/training_policies@d73e20f hpc_training_rules.adoc:132-167): rank r
# belongs to instance r // S and is rank r % S of it. Ports on the rendezvous host of the
# whole launch: P (torch's store; torchrun's own), P+1 the roll call of all ranks, P+2 the
# start barrier of all ranks (before run_start), P+3 the end barrier; instance i's own
# rendezvous is the host of its first rank, at port P + 4 + i x (2 + ranks per node):
# its torch store, its roll call and its TensorFlow workers, as one training's P, P+1, P+2...
CAMPAIGN_START_PORT_OFFSET = 2
CAMPAIGN_END_PORT_OFFSET = 3
CAMPAIGN_INSTANCE_PORT_OFFSET = 4
# how long an instance that finished waits at the end for the others (the launcher would
# otherwise take its exit status as the job's and stop the instances still training)
CAMPAIGN_END_TIMEOUT_S = 7 * 24 * 3600


def campaign_slot(ranks: Ranks, instances: int) -> tuple[int, int, int]:
    """(instance, rank within it, ranks per instance) of this rank in a campaign of
    `instances` instances over all the launch's ranks."""
    if instances < 1:
        raise KitError(f"--instances {instances}: must be a number of model instances >= 1")
    if ranks.size % instances:
        raise KitError(f"--instances {instances}: the launch's {ranks.size} ranks ({ranks.launcher}) do not split "
                       f"into {instances} instances of equal size; launch instances x ranks-per-instance ranks")
    per = ranks.size // instances
    return ranks.rank // per, ranks.rank % per, per


@dataclass(frozen=True)
class Campaign:
    """One rank's place in a throughput campaign: its instance, and every rank of the
    launch (`world`, after the roll call) for the barriers across all instances."""
    instance: int
    instances: int
    world: Ranks
    timeout_s: float

    def start_barrier(self) -> str | None:
        """All ranks of all instances meet before run_start, so the instances start
        together (time_to_train_all runs from the earliest run_start). An instance that did
        not come (it failed in its initialisation) does not stop the others: after
        timeout_s they start without it. Returns None, or the one line saying who was
        missing."""
        return self._meet("start barrier", CAMPAIGN_START_PORT_OFFSET, self.timeout_s)

    def end_barrier(self) -> str | None:
        """Every rank waits here, its instance finished (converged or not), until all have:
        mpirun and torchrun stop every rank once one exits non-zero, which would end the
        instances still training."""
        return self._meet("end barrier", CAMPAIGN_END_PORT_OFFSET, CAMPAIGN_END_TIMEOUT_S)

    def _meet(self, what: str, offset: int, timeout_s: float) -> str | None:
        if self.world.size == 1:
            return None
        try:
            _meet(self.world, timeout_s, f"campaign {what}", b"{}", port_offset=offset)
        except KitError as e:
            return f"instance {self.instance}: {e}; this instance goes on"
        return None


def instance_ranks(world: Ranks, instances: int) -> Ranks:
    """This rank's Ranks inside its instance, from the roll call of the whole launch: rank
    and size within the instance, its node and local rank among the instance's ranks on
    that node, the instance's own rendezvous (the address of its first rank, a port of its
    own) and the instance's slice of the host table."""
    if len(world.hosts) != world.size:
        raise KitError("--instances: the ranks' hosts are unknown (no roll call)")
    instance, rank, per = campaign_slot(world, instances)
    first = instance * per
    hosts = world.hosts[first:first + per]
    addrs = world.addrs[first:first + per]
    widest = max(world.hosts.count(h) for h in set(world.hosts))   # ranks on the fullest node
    port = world.master_port + CAMPAIGN_INSTANCE_PORT_OFFSET + instance * (TF_WORKER_PORT_OFFSET + widest)
    return _placed(replace(world, rank=rank, size=per, master_addr=addrs[0], master_port=port, hosts=hosts,
                           addrs=addrs), rank)


def _send_blob(conn: socket.socket, blob: bytes) -> None:
    conn.sendall(struct.pack("!I", len(blob)) + blob)


def _recv_blob(conn: socket.socket) -> bytes:
    head = conn.recv(4, socket.MSG_WAITALL)
    if len(head) != 4:
        raise OSError("the connection closed")
    n = struct.unpack("!I", head)[0]
    if n > 1 << 24:
        raise OSError(f"a message of {n} bytes")
    blob = conn.recv(n, socket.MSG_WAITALL) if n else b""
    if len(blob) != n:
        raise OSError("the connection closed")
    return blob


def _meet(ranks: Ranks, timeout_s: float, what: str, mine: bytes,
          port_offset: int = ROLL_CALL_PORT_OFFSET) -> list[bytes]:
    """Rank 0 listens (on master_port + port_offset), every other rank connects and sends
    its number and `mine` (a JSON object); rank 0 answers all of them, once everyone is
    there, with every rank's object (with "addr": where it connected from) in rank order.
    Returns that list."""
    import json
    port = ranks.master_port + port_offset
    where = f"{what} rendezvous at {ranks.master_addr}:{port} (rank {ranks.rank} of {ranks.size})"
    deadline = time.monotonic() + timeout_s
    family = socket.AF_INET6 if ":" in ranks.master_addr else socket.AF_INET

    def left() -> float:
        return max(0.01, deadline - time.monotonic())

    if ranks.rank == 0:
        try:
            server = socket.create_server(("", port), family=family)
        except OSError as e:
            raise KitError(f"{where} failed: cannot listen on port {port} ({e.strerror}); "
                           "set MASTER_PORT to a free port (the kit uses it and the next ranks-per-node + 1)") from None
        peers: dict[int, socket.socket] = {}
        rows: dict[int, dict] = {0: {**json.loads(mine), "addr": ranks.master_addr}}
        try:
            while len(peers) < ranks.size - 1 and time.monotonic() < deadline:
                server.settimeout(left())
                try:
                    conn, peer = server.accept()
                    conn.settimeout(left())
                    rank = struct.unpack("!i", conn.recv(4, socket.MSG_WAITALL))[0]
                    row = json.loads(_recv_blob(conn))
                except (OSError, struct.error, ValueError):
                    continue
                if not 0 < rank < ranks.size:
                    conn.close()
                    continue
                if rank in peers:
                    peers[rank].close()
                peers[rank] = conn
                rows[rank] = {**row, "addr": peer[0]}
            missing = [r for r in range(1, ranks.size) if r not in peers]
            if missing:
                shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
                why = (f"{len(missing)} of {ranks.size} ranks did not arrive within {timeout_s:g} s "
                       f"(--collective-timeout): rank {shown}")
                for conn in peers.values():   # the ranks that came learn who did not
                    try:
                        _send_blob(conn, json.dumps({"error": why}).encode())
                    except OSError:
                        pass
                raise KitError(f"{where} failed: {why}")
            table = json.dumps([rows[r] for r in range(ranks.size)]).encode()
            for conn in peers.values():
                _send_blob(conn, table)
            # the ranks close first, so the port is free at once for the communicator
            for conn in peers.values():
                try:
                    conn.settimeout(left())
                    conn.recv(1)
                except OSError:
                    pass
        finally:
            for conn in peers.values():
                conn.close()
            server.close()
        return [json.dumps(rows[r]).encode() for r in range(ranks.size)]
    while True:
        try:
            conn = socket.create_connection((ranks.master_addr, port), timeout=left())
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise KitError(f"{where} failed: rank 0 was not reachable within {timeout_s:g} s "
                               "(--collective-timeout)") from None
            time.sleep(0.2)
    try:
        # connected, so rank 0 listens and decides within timeout_s from now at most: wait a
        # little longer for its answer, to hear from it who did not come
        conn.settimeout(timeout_s + 5)
        conn.sendall(struct.pack("!i", ranks.rank))
        _send_blob(conn, mine)
        table = json.loads(_recv_blob(conn))
    except (OSError, ValueError) as e:
        raise KitError(f"{where} failed: not every rank arrived within {timeout_s:g} s "
                       f"(--collective-timeout): {e}") from None
    finally:
        conn.close()
    if isinstance(table, dict) and "error" in table:
        raise KitError(f"{where} failed: {table['error']}")
    if len(table) != ranks.size:
        raise KitError(f"{where} failed: rank 0 answered for {len(table)} ranks")
    return [json.dumps(row).encode() for row in table]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def torch_device(requested: str, ranks: Ranks):
    """cpu, or the local rank's GPU (cuda:<local_rank mod visible GPUs>)."""
    import torch
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise KitError("--device cuda: no CUDA device is visible to this process")
    index = ranks.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def make_comm(kind: str, ranks: Ranks, *, device=None, timeout_s: float = 60.0) -> Comm:
    if kind == "none":
        return Comm(ranks)
    if kind == "torch":
        return TorchComm(ranks, device, timeout_s)
    if kind == "horovod":
        return HorovodComm(ranks, device, timeout_s)
    if kind == "tf":
        return TFComm(ranks, timeout_s)
    raise KitError(f"--dist {kind}: unknown communicator")




# The signals that stop a run: SIGTERM (srun/mpirun/torchrun tearing down a job whose
# other rank died, scancel, a batch system's time limit) and SIGINT (Ctrl-C).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop(signum, frame):
    signal.signal(signum, signal.SIG_DFL)   # a second one kills at once
    if signum == signal.SIGINT:
        raise KeyboardInterrupt("interrupted by SIGINT (Ctrl-C)")
    raise Terminated(f"terminated by {signal.Signals(signum).name}: the launcher stopped this rank "
                     "(another rank failed, or the job was cancelled)")


def raise_on_signals() -> None:
    """SIGTERM becomes Terminated (exit 143), SIGINT KeyboardInterrupt (exit 130), in
    whichever phase the run is: the run protocol then writes run_stop aborted and
    summary.json, and removes what it staged (common/run.py MLPerfRun.__exit__)."""
    if sys.platform != "win32":
        for signum in STOP_SIGNALS:
            signal.signal(signum, _stop)


def hold_signals() -> None:
    """From here on SIGTERM and SIGINT no longer interrupt: called when the run closes its
    log and writes summary.json, so a launcher tearing the job down at that moment cannot
    cut the close short (the Python-level handler runs in the main thread whichever thread
    the signal hit, so the handler is replaced rather than the signal masked). The process
    ends soon after with its own exit status; a launcher that insists escalates to SIGKILL
    as always."""
    if sys.platform != "win32":
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda signum, frame: None)


@contextmanager
def signals_deferred():
    """SIGTERM and SIGINT arriving inside the block take effect when it ends (the handler in
    place then runs): for a step that must not be cut in two, such as creating a directory
    and recording that this run made it (nothing of the run may be left behind, and nothing
    it did not make removed). In the main thread only, where Python runs its handlers."""
    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signum, handler = caught[0], previous[caught[0]]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
