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

Ranks are assumed block-distributed over nodes (ranks 0..L-1 on the first node), the
default of srun, mpirun and torchrun. The rendezvous address is MASTER_ADDR when set
(every launcher), the first node of the Slurm step, or 127.0.0.1 when all ranks are on
one node; the port is MASTER_PORT or derived from the job id.

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
import time
from dataclasses import dataclass, field
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

    @property
    def is_root(self) -> bool:
        return self.rank == 0


# ---------------------------------------------------------------- detection

def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host list: 'nid[001-003,007],login1' -> nid001 nid002 nid003 nid007 login1."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", spec):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
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


class Comm:
    """One process: every collective is the identity."""
    kind = "none"

    def __init__(self, ranks: Ranks):
        self.ranks = ranks

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
# gil_scoped_acquire). cli.main ends such a process with os._exit once everything is
# written and flushed.
UNSAFE_TEARDOWN = False


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
            return DistributedDataParallel(model, device_ids=ids)
        # DeepCAM keeps rank-local batch-norm statistics between its averagings, as the
        # reference does; torch 2.13 deprecates broadcast_buffers=False with a FutureWarning
        # on every rank, but its replacement still syncs buffers at init, and the warning
        # says to keep using broadcast_buffers=False for rank-local buffers: it is not shown
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
            return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

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


class HorovodComm(Comm):
    """horovod.torch: gradients averaged with grouped allreduce, initial state from rank 0."""
    kind = "horovod"

    def __init__(self, ranks: Ranks, device, timeout_s: float):
        import torch
        import horovod.torch as hvd
        self.torch, self.hvd, self.device = torch, hvd, device
        super().__init__(ranks)
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
            self.hvd.grouped_allreduce_(grads, op=self.hvd.Average, name="hpckit.grads")

    def close(self):
        self.hvd.shutdown()


class TFComm(Comm):
    """tf.distribute.MultiWorkerMirroredStrategy over gRPC; one replica per rank."""
    kind = "tf"

    def __init__(self, ranks: Ranks, timeout_s: float):
        import json
        super().__init__(ranks)
        if ranks.nodes > 1 and len(ranks.node_hosts) < ranks.nodes:
            raise KitError(f"--dist tf on {ranks.nodes} nodes needs the host of every rank: launch with "
                           "srun (SLURM_STEP_NODELIST) or mpirun inside a Slurm allocation")
        def host(r):   # block distribution: rank r runs on node r // ranks-per-node
            return _url_host(ranks.node_hosts[r // ranks.local_size]) if ranks.nodes > 1 else "127.0.0.1"

        # one gRPC port per rank on its node, above the torch rendezvous port
        workers = [f"{host(r)}:{ranks.master_port + 1 + r % ranks.local_size}" for r in range(ranks.size)]
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                              "task": {"type": "worker", "index": ranks.rank}})
        # MultiWorkerMirroredStrategy() waits for every worker for ever, deaf to SIGTERM
        # while it blocks in C++: meet first, on the rendezvous port, under the timeout
        rendezvous(ranks, timeout_s, "tf.distribute")
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


def rendezvous(ranks: Ranks, timeout_s: float, what: str) -> None:
    """All ranks meet at master_addr:master_port within timeout_s, or each says in one line
    (KitError) who did not come: rank 0 listens, every other rank connects and sends its
    number, rank 0 answers all of them once everyone is there. For communicators whose own
    start-up waits without a deadline (tf.distribute)."""
    where = f"{what} rendezvous at {ranks.master_addr}:{ranks.master_port} (rank {ranks.rank} of {ranks.size})"
    deadline = time.monotonic() + timeout_s
    family = socket.AF_INET6 if ":" in ranks.master_addr else socket.AF_INET

    def left() -> float:
        return max(0.01, deadline - time.monotonic())

    if ranks.rank == 0:
        try:
            server = socket.create_server(("", ranks.master_port), family=family)
        except OSError as e:
            raise KitError(f"{where} failed: cannot listen on port {ranks.master_port} ({e.strerror}); "
                           "set MASTER_PORT to a free port") from None
        peers: dict[int, socket.socket] = {}
        try:
            while len(peers) < ranks.size - 1 and time.monotonic() < deadline:
                server.settimeout(left())
                try:
                    conn, _ = server.accept()
                    conn.settimeout(left())
                    peers[struct.unpack("!i", conn.recv(4, socket.MSG_WAITALL))[0]] = conn
                except (OSError, struct.error):
                    continue
            missing = [r for r in range(1, ranks.size) if r not in peers]
            if missing:
                shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
                raise KitError(f"{where} failed: {len(missing)} of {ranks.size} ranks did not arrive within "
                               f"{timeout_s:g} s (--collective-timeout): rank {shown}")
            for conn in peers.values():
                conn.sendall(b"go")
        finally:
            for conn in peers.values():
                conn.close()
            server.close()
        return
    while True:
        try:
            conn = socket.create_connection((ranks.master_addr, ranks.master_port), timeout=left())
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise KitError(f"{where} failed: rank 0 was not reachable within {timeout_s:g} s "
                               "(--collective-timeout)") from None
            time.sleep(0.2)
    try:
        conn.settimeout(left())
        conn.sendall(struct.pack("!i", ranks.rank))
        if conn.recv(2, socket.MSG_WAITALL) != b"go":
            raise OSError("rank 0 closed the connection")
    except OSError as e:
        raise KitError(f"{where} failed: not every rank arrived within {timeout_s:g} s "
                       f"(--collective-timeout): {e}") from None
    finally:
        conn.close()


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




def raise_on_sigterm() -> None:
    """SIGTERM (srun/mpirun/torchrun tearing down a job whose other rank died, scancel)
    becomes an exception, so the run protocol writes run_stop aborted and summary.json."""
    def handler(signum, frame):
        signal.signal(signum, signal.SIG_DFL)   # a second SIGTERM kills at once
        raise Terminated(f"terminated by {signal.Signals(signum).name}: the launcher stopped this rank "
                         "(another rank failed, or the job was cancelled)")
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, handler)


def hold_sigterm() -> None:
    """From here on a SIGTERM no longer interrupts: called when the run closes its log and
    writes summary.json, so a launcher tearing the job down at that moment cannot cut the
    close short (the Python-level handler runs in the main thread whichever thread the
    signal hit, so the handler is replaced rather than the signal masked). The process
    ends soon after with its own exit status; a launcher that insists escalates to SIGKILL
    as always."""
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
