"""The MLPerf HPC run protocol, written once for every benchmark.

    cache_clear -> init_start, submission/system/hyperparameter keys -> init_stop
    -> run_start -> staging_start/stop -> per epoch: epoch_start, eval_start, eval_stop,
       epoch_stop, <metric> -> run_stop {status: success | aborted}

A benchmark supplies its files, its hyperparameter keys and two callables (train one
epoch, evaluate); this module owns the clock, the log and summary.json. Whatever happens,
the log written so far stays, and an exception closes the run as aborted and still writes
summary.json (atomically) before it propagates.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hpckit.common import cores, determinism, energy, memory, precision, provenance, staging, usage
from hpckit.common.config import flatten
from hpckit.common import dist
from hpckit.common.dist import Ranks
from hpckit.common.errors import KitError, Terminated, disk_error, is_disk_error
from hpckit.common.fileio import ensure_writable_dir
from hpckit.common.mllog import HPC, C, MLLogger
from hpckit.common.summary import software_stack, write_summary

# The kit's own log keys for what a run used (usage_record), beside hpckit_config.
HPC_USAGE = "hpckit_usage"
HPC_USAGE_EPOCH = "hpckit_epoch_usage"

# Waiting for the slowest node to stage its share (a global barrier with its own timeout:
# staging a 1/N share of a multi-TB dataset takes minutes, longer than a collective may).
STAGING_TIMEOUT_S = 3 * 3600


def replicas_agree(comm, fingerprint: float) -> tuple[bool, float, float]:
    """(all ranks passed the same fingerprint, their mean, their spread): two collectives,
    the mean, then the deviations from it. (One pass, E[f^2] - E[f]^2, cancels: with equal
    fingerprints near 1e4-1e5 on 3 ranks it left up to 1e-3 of rounding, above the 1e-9
    relative tolerance, for about 1 value in 7.)"""
    size = comm.ranks.size
    mean = comm.allreduce_sum([fingerprint])[0] / size
    spread = (comm.allreduce_sum([(fingerprint - mean) ** 2])[0] / size) ** 0.5
    return spread <= 1e-9 * max(1.0, abs(mean)), mean, spread


def equal_train_split(split, ranks: Ranks, unit: int, config_key: str = "data.batch_size"):
    """How many training samples every rank takes per epoch: the same whole number of
    steps on every rank (unit = local batch x accumulation), `ranks.size * per_rank` of the
    split, the remainder left out. As the reference's DistributedSampler(drop_last=True)
    (mlcommons/hpc@2c627d4 deepcam/src/deepCam/data/__init__.py:31-42) the remainder is
    the tail of each epoch's fresh permutation, so a different few samples sit out each
    epoch and every file is trained on over the run: the split is kept whole and the
    per-epoch sampler (EpochSampler, length per_rank) does the cutting. Without equal
    shares, 121,266 samples over 2,048 ranks give 434 ranks 60 samples and 1,614 ranks 59,
    and the ranks disagree on the number of steps: DDP's all-reduces pair up wrongly or hang.
    Returns (split, samples each rank trains on per epoch, samples left out per epoch)."""
    per_rank = len(split) // ranks.size // unit * unit
    if per_rank == 0:
        raise KitError(f"config key '{config_key}': a rank's step takes {unit} samples, more than its share of "
                       f"the {len(split)} training samples over {ranks.size} ranks")
    return split, per_rank, len(split) - per_rank * ranks.size


def check_equal_steps(comm, steps: int) -> None:
    """Every rank will take the same number of training steps per epoch, or none starts:
    a rank count that does not spread evenly over the nodes (the shares are taken per node,
    then per rank) would otherwise hang the first collective of an epoch."""
    agree, mean, _ = replicas_agree(comm, float(steps))
    if not agree:
        raise KitError(f"ranks disagree on the number of training steps per epoch (this rank {steps}, mean "
                       f"{mean:g}): launch the same number of ranks on every node")


def node_share(split, ranks: Ranks):
    """The files this node stages: every `nodes`-th file from the node's index."""
    return split.shard(ranks.node, ranks.nodes)


def rank_share(node_files, ranks: Ranks):
    """The files this rank reads out of its node's share (without reshuffling)."""
    return node_files.shard(ranks.local_rank, ranks.local_size)


class EpochSampler:
    """The indices into a file pool that one rank reads, epoch after epoch: each epoch a
    fresh permutation of the whole pool, the same on every rank that draws from it (seeded
    by the run's seed and the epoch), then every `count`-th index from `index`, the first
    `length` of them. Without shuffling: pool[index::count].

    This is the reference's order. CosmoFlow shuffles the file list with
    reshuffle_each_iteration and then shards it (mlcommons/hpc@2c627d4
    cosmoflow/data/cosmo.py:115-118), over the node's staged files by local rank, or over
    all files by rank when not staging (cosmo.py:193-198); DeepCAM's DistributedSampler
    permutes all indices with seed + epoch and takes rank::size
    (deepcam/src/deepCam/data/__init__.py:31-42, train.py:206 set_epoch). Each iteration
    (one per epoch; a torch DataLoader's sampler, a tf.data generator) starts the next epoch.
    """

    def __init__(self, pool: int, index: int, count: int, length: int | None, seed: int, shuffle: bool):
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"bad shard {index} of {count}")
        reach = len(range(index, pool, count))
        self.pool, self.index, self.count, self.seed, self.shuffle = pool, index, count, seed, shuffle
        self.length = reach if length is None else min(length, reach)
        self.epoch = 0

    def __len__(self) -> int:
        return self.length

    def indices(self, epoch: int) -> list[int]:
        import numpy as np
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.pool) if self.shuffle
                 else np.arange(self.pool))
        return order[self.index::self.count][:self.length].tolist()

    def __iter__(self):
        self.epoch += 1
        return iter(self.indices(self.epoch))


@dataclass
class StageAs:
    """A split staged in another form than copies of its files: `write(split, dest)` makes
    the node's share in the new directory dest (bytes written), `relocate(split, dest)` is
    the split every rank then reads from dest (names only: ranks other than the node's
    local rank 0 compute it without waiting for the files)."""
    write: Callable
    relocate: Callable
    written_as: str        # what the staging_stop metadata says the node's copy is


@dataclass
class Reading:
    """What one rank reads of one split: the pool of files it draws from (the node's staged
    copy, or the whole split when not staging) and its sampler into that pool."""
    files: object
    sampler: EpochSampler


@dataclass
class Quality:
    metric: str            # MLPerf key: eval_error | eval_accuracy
    target: float
    higher_is_better: bool

    def reached(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return value >= self.target if self.higher_is_better else value <= self.target

    @classmethod
    def of(cls, bench, cfg: dict) -> "Quality":
        """The benchmark's metric and direction (its descriptor) with the config's target."""
        return cls(bench.metric, float(flatten(cfg)[bench.target_key]), bench.higher_is_better)


@dataclass(frozen=True)
class LogStyle:
    """Where a benchmark's reference puts the events the kit writes for both (each
    benchmark's package defines its LOG_STYLE from its reference's train.py)."""
    cache_clear_first: bool          # cache_clear before init_start, else right after it
    metric_at: str                   # the quality metric: "eval" (between eval_start and eval_stop),
                                     # "after_eval" (between eval_stop and epoch_stop), "after_epoch"
    target_event: str | None = None  # logged with the target when it is reached
    # the evaluation inside the epoch (eval_start ... eval_stop before epoch_stop), or after it
    # (epoch_stop, then eval_start ... eval_stop: a reference whose "epoch" is the training
    # between two evaluations); metric_at "after_epoch" has no meaning then
    eval_in_epoch: bool = True
    epoch_unit: str = "epochs"       # what the verdict calls the epochs (a reference without epochs)

    def __post_init__(self):
        if self.metric_at not in ("eval", "after_eval", "after_epoch"):
            raise ValueError(f"LogStyle.metric_at: {self.metric_at!r}")
        if not self.eval_in_epoch and self.metric_at == "after_epoch":
            raise ValueError("LogStyle: metric_at after_epoch needs eval_in_epoch")


@dataclass
class Launch:
    """Who this process is and how it was asked to run: ranks, communicator, device, seed,
    staging target."""
    ranks: Ranks
    comm: dist.Comm
    device: object          # torch.device for PyTorch runs, None for TensorFlow
    seed: int
    stage_dir: Path | None
    cores: cores.CorePlan
    keep_staged: bool = False   # --keep-staged: leave the staged copies (else removed at the end)
    allocator: str = "unchanged"   # memory.tune_allocator's settings, logged
    campaign: dist.Campaign | None = None   # --instances M: this rank's instance of a throughput campaign
    data_root: Path | None = None   # --data: staging copies only files inside it (staging.copy_files)

    @property
    def accelerators_per_node(self) -> int:
        return self.ranks.local_size if getattr(self.device, "type", "cpu") == "cuda" else 0


def launch(args, framework: str, cfg: dict) -> Launch:
    """The preamble every `hpckit train` shares: ranks from the launcher, this rank's cores
    and threads (common/cores.py; cfg's data.loader_workers is fitted into them), the
    communicator (`--dist`), the device, one seed for all ranks (given, or rank 0's
    clock-derived one; always > 0 and logged), and a stage dir that cannot clobber the data."""
    timeout_s = getattr(args, "collective_timeout", 60.0)
    if not timeout_s > 0:
        raise KitError(f"--collective-timeout {timeout_s:g}: must be a number of seconds > 0")
    world = dist.detect()
    instances = getattr(args, "instances", 1) or 1
    _, _, per_instance = dist.campaign_slot(world, instances)
    ranks = replace(world, size=per_instance) if instances > 1 else world
    if instances > 1 and getattr(args, "dist", "auto") == "horovod":
        raise KitError("--instances with --dist horovod: Horovod's communicator spans every rank of the launch; "
                       "a campaign's instances use --dist auto (torch.distributed or tf.distribute per instance)")
    kind = dist.choose(getattr(args, "dist", "auto"), framework, ranks)
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise KitError(f"--threads {threads}: must be a number of threads >= 1")
    stage_dir = Path(args.stage_dir) if args.stage_dir else None
    if stage_dir is not None:
        staging.check_stage_dir(stage_dir, Path(args.data))
    # where every rank really runs (node, local rank, address), told by the ranks themselves
    world = dist.roll_call(world, timeout_s, dist.COMM_NAMES.get(kind, "hpckit") if instances == 1 else "campaign")
    ranks, campaign = world, None
    if instances > 1:   # a throughput campaign: this rank's instance is its run
        ranks = dist.instance_ranks(world, instances)
        campaign = dist.Campaign(world.rank // per_instance, instances, world, timeout_s)
        dist.ACTIVE_CAMPAIGN = campaign
    device = None
    if framework == "pytorch":   # the GPU and the cores by the rank's place among all ranks of its node
        device = dist.torch_device(getattr(args, "device", "auto"), world)
    elif getattr(args, "device", "auto") == "cuda":
        raise KitError("--device applies to PyTorch; TensorFlow places ops on the visible GPUs itself")
    precision.check(cfg["train"]["precision"], getattr(device, "type", "cpu"), framework)
    core_plan = cores.plan(world.local_rank, world.local_size, threads, cfg["data"]["loader_workers"],
                           accelerator=getattr(device, "type", "cpu") != "cpu")
    cfg["data"]["loader_workers"] = core_plan.loader_workers
    replaced = cores.replaced_omp_threads(core_plan)
    if replaced and world.local_rank == 0:
        print(f"hpckit train: warning: {replaced}", file=sys.stderr, flush=True)
    cores.apply(core_plan, framework)   # before the communicator starts the runtime
    allocator = memory.tune_allocator()
    cfg["train"]["deterministic"] = cfg["train"]["deterministic"] or bool(getattr(args, "deterministic", False))
    # resolves the op implementations cfg chooses (model.max_pool) or refuses, before staging
    determinism.apply(framework, cfg["train"]["deterministic"], getattr(device, "type", "cpu"), cfg)
    dist.raise_on_signals()
    comm = dist.make_comm(kind, ranks, device=device, timeout_s=timeout_s)
    if campaign is None:
        seed = args.seed if args.seed is not None else 1 + int(time.time() * 1000) % (2 ** 31 - 1)
    elif args.seed is not None:   # instance i: --seed + i, distinct for every instance
        seed = (args.seed + campaign.instance) % 2 ** 31
    else:   # each instance's first rank draws its own (instances start in the same millisecond)
        import secrets
        seed = 1 + secrets.randbelow(2 ** 31 - 1)
    seed = comm.broadcast_int(seed)
    return Launch(ranks, comm, device, seed, stage_dir, core_plan, bool(getattr(args, "keep_staged", False)),
                  allocator, campaign, Path(args.data) if getattr(args, "data", None) else None)


class Diverged(Exception):
    """The training became non-finite: the run stops as not converged (exit 3)."""


def check_finite(value: float, step: int, what: str) -> None:
    """Stop the run at the first step where `value` (a quantity equal on every rank: the
    averaged gradients' norm, the replicated weights' norm, so all ranks stop together and
    none waits in a collective) is not finite: one line naming the step."""
    if not math.isfinite(value):
        raise Diverged(f"{what} is {value} at training step {step}: the training diverged (a learning rate "
                       "too high, or non-finite input data)")


_CLAIMS: dict[Path, int] = {}   # output dir -> the lock's file descriptor, held until exit
RUN_FILES = ("mlperf.log", "summary.json")


def campaign_output_dir(path: str | os.PathLike, instances: int) -> Path:
    """--output-dir of this rank's run: OUT itself, or OUT/instance_<i> in a campaign of
    `instances` instances (rank r of M x S ranks is in instance r // S)."""
    if instances <= 1:
        return Path(path)
    instance, _, _ = dist.campaign_slot(dist.detect(), instances)
    return Path(path) / f"instance_{instance}"


def claim_output_dir(path: str | os.PathLike, instances: int = 1) -> Path:
    """An output directory belongs to one run. Rank 0 takes an exclusive lock on
    DIR/.hpckit.lock for the process's lifetime (a second run started into it stops at
    once), and refuses a directory that holds an earlier run's mlperf.log or summary.json:
    the kit never replaces a run's results. In a campaign the first rank of each instance
    claims its instance's directory. Called first thing by `hpckit train`, before
    anything is written there."""
    import fcntl
    path = ensure_writable_dir(path, "--output-dir")
    if dist.campaign_slot(dist.detect(), instances)[1] != 0 or path.resolve() in _CLAIMS:
        return path
    earlier = _earlier_run(path)
    if earlier:   # refused before anything is made there (a lock file left behind would be one)
        raise KitError(earlier)
    try:
        fd = os.open(path / ".hpckit.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as e:
        raise KitError(f"--output-dir {path}: cannot create its lock file ({e.strerror or e})")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise KitError(f"--output-dir {path}: another hpckit run is writing into it (its .hpckit.lock is held)")
    earlier = _earlier_run(path)   # again under the lock: a run that finished meanwhile
    if earlier:
        os.close(fd)
        raise KitError(earlier)
    _CLAIMS[path.resolve()] = fd
    return path


def _earlier_run(path: Path) -> str | None:
    for name in RUN_FILES:
        if (path / name).exists():
            return (f"--output-dir {path}: holds an earlier run's {name}; the kit never replaces a "
                    "run's results: give a new directory")
    return None


def diagnosed(batches, locate_bad_file: Callable[[], KitError | None], where: str):
    """Iterate a framework's loader; when its reader fails (a tf.errors op error, a worker
    process's wrapped exception), re-read the files with the strict reader and raise the
    one-line KitError that names the bad file."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except KitError:
            raise
        except Exception as e:
            bad = locate_bad_file()
            if bad is not None:
                raise bad from None
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise KitError(f"{where}: reading the data failed: {first}") from None
        yield batch


class MLPerfRun:
    def __init__(self, *, benchmark: str, framework: str, cfg: dict, launched: Launch,
                 out_dir: str | os.PathLike, quality: Quality, global_batch: int, style: LogStyle):
        self.benchmark, self.framework, self.cfg, self.style = benchmark, framework, cfg, style
        self.seed, self.ranks, self.comm = launched.seed, launched.ranks, launched.comm
        self.quality, self.global_batch = quality, global_batch
        self.accelerators_per_node = launched.accelerators_per_node
        self.cores, self.allocator = launched.cores, launched.allocator
        self.out_dir = ensure_writable_dir(out_dir, "--output-dir")
        self.campaign = launched.campaign
        self.log = MLLogger(self.out_dir / "mlperf.log" if self.ranks.rank == 0 else None, self.ranks.rank,
                            instance=self.campaign.instance if self.campaign else None)
        self.start_barrier: str | None = None   # a campaign's start barrier that missed instances
        self.staging_s = 0.0
        self.epochs_done = 0
        self.last_metric = float("nan")
        self.train_samples = self.eval_samples = 0
        self.flops_per_sample: float | None = None
        self.train_seconds = self.eval_seconds = 0.0
        self.status = None
        self.cache_report: dict = {}
        self.replicas_in_sync: bool | None = None
        self.max_steps = cfg["train"].get("max_steps")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int)
                                           or self.max_steps < 1):
            raise KitError(f"config key 'train.max_steps': {self.max_steps!r} is not a number of steps >= 1 (or null)")
        self.steps_done = 0
        self.keep_staged = launched.keep_staged
        self.data_root = launched.data_root
        self.stop_reason: str | None = None   # why a run stopped early (diverged)
        self.staged_made: list[Path] = []   # what staging created on this node, removed at the end
        # what the run used (common/usage.py): bytes read, summed over all ranks, and every
        # rank's peak memory as of its last epoch end (gathered with the epoch's counts)
        self.peaks = usage.PeakMemory()
        self.used: dict = {"staging_read_bytes": None, "staging_read_MBps": None,
                           "train_read_bytes": 0, "eval_read_bytes": 0, "io_epochs": 0,
                           "sync_bytes": 0.0, "sync_batches": 0, "sync_busy_s": 0.0, "sync_train_s": 0.0,
                           "peak_rss_bytes_per_rank": None, "peak_worker_rss_bytes_per_rank": None,
                           "peak_gpu_bytes_per_rank": None, "cpu_ran_ns": 0.0, "cpu_waited_ns": 0.0,
                           "input_waited_s": 0.0, "loop_train_s": 0.0, "gpu_busy_s": None,
                           "gpu_energy_j": None, "cpu_energy_j": None, "energy_s": 0.0}
        # the training loop's input wait and GPU busy time (usage.LoopClock, driven by
        # limited()), and the energy counters where readable (common/energy.py)
        self.clock = usage.LoopClock(launched.device)
        self.gpu_energy = energy.GpuEnergy(launched.device)
        self.cpu_energy = energy.CpuEnergy(self.ranks.local_rank == 0)
        # the stack and machine this run is made with, recorded now (common/provenance.py)
        self.provenance = provenance.collect(framework) if self.ranks.rank == 0 else None

    # -- context: nothing is lost -------------------------------------------------------
    def __enter__(self) -> "MLPerfRun":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        dist.hold_signals()   # the close below is not to be interrupted
        self._remove_staged()
        if exc is None:
            try:
                self._write_summary()
            finally:
                self.log.close()
                self.comm.close()
            return False
        self.status = "aborted"
        original = exc
        if is_disk_error(exc):   # mlperf.log (LogWriteError) or another file could not be written
            exc = disk_error(exc)
        reason = str(exc) if isinstance(exc, KitError) else f"{type(exc).__name__}: {exc}"
        reason = (reason.strip().splitlines() or [type(exc).__name__])[0]
        if self.ranks.size > 1 and not isinstance(exc, (KitError, KeyboardInterrupt)):
            # a collective failed under us (a peer died, a timeout): say so in one line; the
            # process group is left alone, the launcher tears the job down
            lost = dist.peer_named_in(self.ranks, reason)
            if lost:
                reason = (f"rank {self.ranks.rank} of {self.ranks.size}: lost {lost}: a collective failed "
                          f"({reason}); that node or its ranks died: see its output")
            else:
                reason = (f"rank {self.ranks.rank} of {self.ranks.size}: a collective failed ({reason}); "
                          "another rank probably died or hung: see its output")
        # on a full disk these may fail too: the log keeps its last complete line and
        # summary.json is absent (atomic), the original error is the one reported
        try:
            self._run_stop("aborted", reason=reason)
        except OSError:
            pass
        try:
            self._write_summary(error=reason)
        except KitError:
            pass
        self.log.close()
        if exc is not original or (self.ranks.size > 1 and not isinstance(exc, KitError)):
            raise KitError(reason) from None
        return False

    # -- phases -------------------------------------------------------------------------
    def clear_caches(self, files: list[Path]) -> None:
        self.cache_report = staging.evict_from_page_cache(files)
        self.log.event(C.CACHE_CLEAR, value=True, metadata=self.cache_report)

    def init_start(self, hyperparameters: list[tuple[str, object]], cache_files: list[Path]) -> None:
        mlp = self.cfg["mlperf"]
        if self.style.cache_clear_first:
            self.clear_caches(cache_files)
        self.log.start(C.INIT_START)
        if not self.style.cache_clear_first:
            self.clear_caches(cache_files)
        # seed and scale first, as both references log them (cosmoflow/train.py:244-248,
        # deepcam/src/deepCam/train.py:72-95 at 2c627d4)
        self.log.event(C.SEED, self.seed)
        self.log.event("number_of_ranks", self.ranks.size)
        self.log.event(HPC.NUMBER_OF_NODES, self.ranks.nodes)
        self.log.event(HPC.ACCELERATORS_PER_NODE, self.accelerators_per_node)
        self.log.event(C.SUBMISSION_BENCHMARK, self.benchmark)
        self.log.event(C.SUBMISSION_ORG, mlp["org"])
        self.log.event(C.SUBMISSION_DIVISION, mlp["division"])
        self.log.event(C.SUBMISSION_STATUS, mlp["status"])
        self.log.event(C.SUBMISSION_PLATFORM, mlp["platform"])
        self.log.event("hpckit_config", {"name": self.cfg["name"], "framework": self.framework,
                                         "ranks": self.ranks.size, "ranks_per_node": self.ranks.local_size,
                                         "launcher": self.ranks.launcher, "dist": self.comm.kind,
                                         "cores": self.cores.as_log(), "allocator": self.allocator,
                                         **self._campaign_fields(),
                                         **{k: v for k, v in flatten(self.cfg).items() if k != "name"}})
        if self.provenance is not None:
            self.log.event(provenance.LOG_KEY, provenance.log_value(self.provenance))
        for key, value in hyperparameters:
            self.log.event(key, value)
        if self.ranks.rank == 0:   # the rank that writes summary.json and the log
            self.flops_per_sample = self._count_flops()

    def _count_flops(self) -> float | None:
        """The network's training FLOPs per sample (common/flops.py), counted before the
        clock starts; None (and the run goes on) where torch is not in the stack."""
        try:
            from hpckit.common.flops import train_flops_per_sample
            return train_flops_per_sample(self.benchmark, self.cfg)
        except ImportError:
            return None

    def start_run(self) -> None:
        if self.campaign is not None:
            # all instances start together: every rank of the launch meets here, before
            # the clock starts; an instance that never comes delays the others by at most
            # the collective timeout and stops none of them
            self.start_barrier = self.campaign.start_barrier()
            if self.start_barrier and self.ranks.rank == 0:
                print(f"hpckit train: warning: {self.start_barrier}", file=sys.stderr, flush=True)
        self.log.end(C.INIT_STOP)
        self.log.start(C.RUN_START)

    def stage(self, shares: dict[str, list[Path]], stage_dir: Path | None,
              write: Callable[[str, Path], int] | None = None, written_as: str = "copies") -> dict[str, Path] | None:
        """Copy this node's share of each split inside the clock, as the reference does: the
        node's local rank 0 copies, every rank waits for all nodes. The copies go into a
        directory this run creates, STAGE_DIR/hpckit-stage-<run token>/<split>, never into
        anything already in STAGE_DIR, and are removed when the run ends (--keep-staged
        keeps them). `write(split, dest)`, where given, stages a split in a form of its own
        instead of copying its files (CosmoFlow's data.stage_decode). Only regular files
        inside the data set's root (--data) are staged, as the readers see them: a
        symbolic link out of it is refused, naming it, before anything is written
        (staging.check_sources); copies keep their source's permission bits, never wider.
        Returns the staged directories, or None when not staging."""
        import secrets
        self.log.start(C.STAGING_START)
        watch = staging.Stopwatch()
        io_before = usage.io_counters()
        dest = root = None
        nbytes = 0
        if stage_dir is not None:
            token = self.comm.broadcast_int(secrets.randbelow(2 ** 31))
            root = Path(stage_dir) / f"hpckit-stage-{token:08x}"
            dest = {split: root / split for split in shares}
            if self.ranks.local_rank == 0:
                try:
                    if self.data_root is None:
                        raise ValueError("MLPerfRun.stage: the launch names no data root (--data)")
                    for files in shares.values():   # every stager's sources, before anything is made
                        staging.check_sources(files, self.data_root)
                    with dist.signals_deferred():   # made and recorded as made, or neither
                        self.staged_made = staging.make_own_dir(root)
                    for split, files in shares.items():
                        nbytes += (write(split, dest[split]) if write is not None
                                   else staging.copy_files(files, dest[split], inside=self.data_root))
                except Terminated:   # a stop, not a staging error: exit 143, as in every phase
                    raise
                except KitError as e:   # which node's scratch failed, on a job of many
                    raise KitError(f"node {socket.gethostname()}: staging: {e}") from None
            copy_s = watch.elapsed()   # this node's own copy (local rank 0), before waiting for the others
            self.comm.barrier(timeout_s=STAGING_TIMEOUT_S)
        else:
            copy_s = 0.0
        self.staging_s = watch.elapsed()
        read = usage.io_delta(io_before, usage.io_counters()) or {"rchar": 0}
        n = self.ranks.size
        vec = [float(read["rchar"])] + [0.0] * n
        vec[1 + self.ranks.rank] = copy_s if self.ranks.local_rank == 0 else 0.0
        total = self.comm.allreduce_sum(vec)
        read_all = int(total[0])   # every node's copy
        hosts = self.ranks.hosts if len(self.ranks.hosts) == n else tuple(f"rank {r}" for r in range(n))
        self.used["staging_copy_s_per_node"] = (
            {hosts[r]: round(total[1 + r], 3) for r in range(n) if total[1 + r] > 0} if dest is not None else None)
        self.used["staging_read_bytes"] = read_all
        self.used["staging_read_MBps"] = usage.mb_per_s(read_all, self.staging_s) if dest is not None else None
        self.log.end(C.STAGING_STOP, metadata={"staging_duration": self.staging_s, "staged": dest is not None,
                                                "written_as": written_as if dest is not None else None,
                                                "bytes": nbytes, "stage_dir": str(root) if root else None,
                                                "read_bytes_all_ranks": read_all})
        return dest

    def _remove_staged(self) -> None:
        if self.staged_made and not self.keep_staged:
            staging.remove_own_dirs(self.staged_made)
        self.staged_made = []

    def stage_and_shard(self, files: dict, per_rank: int, dropped: int, unit: int, stage_dir: Path | None,
                        shuffle: bool, stage_as: StageAs | None = None) -> dict[str, Reading]:
        """Staging, then what each rank reads of each split (both benchmarks): the node's
        share copied to node-local storage inside the clock (stage), each rank drawing its
        per-epoch shard from the node's copy, or from the whole split when not staging
        (EpochSampler); every rank takes per_rank training samples, `unit` per step.
        `stage_as`: the node's share staged in another form than copies (StageAs)."""
        ranks = self.ranks
        on_node = {name: node_share(split, ranks) for name, split in files.items()}
        write = (lambda name, dest: stage_as.write(on_node[name], dest)) if stage_as is not None else None
        staged = self.stage({name: s.all_paths() for name, s in on_node.items()}, stage_dir, write,
                            stage_as.written_as if stage_as is not None else "copies")
        reading = {}
        for name, split in files.items():
            if staged is not None:
                pool = (stage_as.relocate(on_node[name], staged[name]) if stage_as is not None
                        else on_node[name].relocated(staged[name]))
                index, count = ranks.local_rank, ranks.local_size
            else:
                pool, index, count = split, ranks.rank, ranks.size
            train = name == "train"
            reading[name] = Reading(pool, EpochSampler(len(pool), index, count, per_rank if train else None,
                                                       self.seed, shuffle and train))
        check_equal_steps(self.comm, len(reading["train"].sampler) // unit)
        self.log.event("hpckit_train_share", {"samples_per_rank": per_rank, "dropped_samples": dropped,
                                              "shuffle": "per-epoch permutation of the staged node share"
                                              if staged is not None else "per-epoch global permutation"
                                              if shuffle else "none"})
        return reading

    def limited(self, batches):
        """The training batches of one epoch, cut where train.max_steps is reached (every
        rank takes the same number of steps, so all stop together), timed by the run's
        LoopClock: the wait for each batch (less what the device held: feed.held_seconds),
        and on CUDA each step's span on the GPU."""
        for batch in self.clock.timed(batches, lambda: self.max_steps is None or self.steps_done < self.max_steps):
            self.steps_done += 1
            yield batch

    def _log_metric(self, epoch: int, metric: float, extra: list[tuple[str, float]] = ()) -> None:
        self.log.event(self.quality.metric, float(metric), metadata={"epoch_num": epoch})
        for key, value in extra:
            self.log.event(key, float(value), metadata={"epoch_num": epoch})
        if self.style.target_event and self.quality.reached(metric):
            self.log.event(self.style.target_event, self.quality.target, metadata={"epoch_num": epoch})

    def epochs(self, n_epochs: int, train_epoch: Callable[[int], tuple[int, float]],
               evaluate: Callable[[], tuple], epoch_num: Callable[[int], int] | None = None) -> bool:
        """Run up to n_epochs (1-based in the log); stop at the target. Returns converged.
        train_epoch(epoch) -> (samples, seconds); evaluate() -> (metric, samples, seconds)
        or (metric, samples, seconds, [(key, value), ...]): events logged right after the
        metric (DeepCAM's eval_loss). `epoch_num(epoch)`, where given, is the number the log's
        metadata.epoch_num carries for the 1-based epoch (a reference that numbers its cycles
        otherwise, e.g. by the training samples seen by their end); train_epoch still gets the
        1-based epoch."""
        for index in range(1, n_epochs + 1):
            if self._epoch(index, epoch_num(index) if epoch_num is not None else index, train_epoch, evaluate):
                return self.status == "success"
        self.status = "aborted"
        self._run_stop("aborted", reason=f"target not reached in {n_epochs} {self.style.epoch_unit}")
        return False

    def _epoch(self, index: int, epoch: int, train_epoch: Callable[[int], tuple[int, float]],
               evaluate: Callable[[], tuple]) -> bool:
        """One epoch (`index` 1-based, logged as `epoch`) and its evaluation; True when the run
        stopped (run_stop logged: the target reached, diverged, step-limited)."""
        self.log.start(C.EPOCH_START, metadata={"epoch_num": epoch})
        io_start, sync_start, steps_start = usage.io_counters(), self._grad_sync(), self.steps_done
        cpu_start = usage.cpu_counters()
        energy_start = (self.gpu_energy.read(), self.cpu_energy.read(), time.perf_counter())
        self.clock.take()   # nothing before this epoch's first batch counts
        try:
            samples, seconds = train_epoch(index)
        except Diverged as e:
            self.epochs_done, self.status, self.stop_reason = index, "aborted", str(e)
            self._run_stop("aborted", reason=str(e))
            return True
        loop = self.clock.take()
        io_trained, cpu_trained = usage.io_counters(), usage.cpu_counters()
        self.train_samples += samples
        self.train_seconds += seconds
        self.log.event(HPC.THROUGHPUT, samples / seconds if seconds > 0 else 0.0, metadata={"epoch_num": epoch})
        if not self.style.eval_in_epoch:
            self.log.end(C.EPOCH_STOP, metadata={"epoch_num": epoch})
        self.log.start(C.EVAL_START, metadata={"epoch_num": epoch})
        metric, n_eval, eval_s, *rest = evaluate()
        extra = rest[0] if rest else []
        io_evaluated = usage.io_counters()
        self.eval_samples += n_eval
        self.eval_seconds += eval_s
        if self.style.metric_at == "eval":
            self._log_metric(epoch, metric, extra)
        self.log.end(C.EVAL_STOP, metadata={"epoch_num": epoch})
        if self.style.metric_at == "after_eval":
            self._log_metric(epoch, metric, extra)
        if self.style.eval_in_epoch:
            self.log.end(C.EPOCH_STOP, metadata={"epoch_num": epoch})
        if self.style.metric_at == "after_epoch":
            self._log_metric(epoch, metric, extra)
        self.epochs_done, self.last_metric = index, float(metric)
        sync = {k: (v - (sync_start[k] or 0)) if v is not None else None for k, v in self._grad_sync().items()}
        energy_end = (self.gpu_energy.read(), self.cpu_energy.read(), time.perf_counter())
        used = [None if a is None or b is None else max(b - a, 0.0) for a, b in zip(energy_start, energy_end)]
        self._count_epoch(epoch, usage.io_delta(io_start, io_trained), usage.io_delta(io_trained, io_evaluated),
                          seconds, sync, self.steps_done - steps_start, usage.cpu_delta(cpu_start, cpu_trained),
                          loop, used)
        if self.quality.reached(metric):
            self.status = "success"
            self._run_stop("success")
            return True
        if not math.isfinite(metric):
            self.status, self.stop_reason = "aborted", f"{self.quality.metric} is {metric}: training diverged"
            self._run_stop("aborted", reason=self.stop_reason)
            return True
        if self.max_steps is not None and self.steps_done >= self.max_steps:
            self.status = "aborted"
            self._run_stop("aborted", reason=f"step-limited: train.max_steps {self.max_steps} reached "
                                                "(a smoke test of the full path, not an MLPerf result)")
            return True
        return False

    def _grad_sync(self) -> dict:
        sync = self.comm.grad_sync
        return sync.read() if sync is not None else {"bytes": None, "busy_s": None}

    def _count_epoch(self, epoch: int, train_io: dict | None, eval_io: dict | None, train_s: float,
                     sync: dict, batches: int, train_cpu: dict | None, loop: tuple = (0.0, None),
                     used: list = (None, None, None)) -> None:
        """One collective per epoch, on every rank: the bytes all ranks read while training
        and evaluating, the gradient all-reduces' bytes and time in flight summed over ranks,
        the time the ranks' threads ran and waited for a CPU while training, the training
        loops' input wait and GPU busy time (`loop`: LoopClock.take), the energy the ranks'
        GPUs and the nodes' CPU packages used over the epoch and its wall time (`used`; a
        counter not read: absent, and its count says how many ranks did read it), and each
        rank's peak memory so far (rank r's slots of the vector)."""
        n = self.ranks.size
        peak = self.peaks.sample()
        counted = sync["bytes"] is not None   # the same communicator on every rank
        waited, busy = loop
        gpu_j, cpu_j, wall = used
        vec = [float((train_io or {}).get("rchar", 0)), float((eval_io or {}).get("rchar", 0)),
               float(sync["bytes"] or 0), float(sync["busy_s"] or 0), float(train_s),
               float((train_cpu or {}).get("ran_ns", 0)), float((train_cpu or {}).get("waited_ns", 0)),
               float(waited), float(busy or 0.0), float(busy is not None), float(gpu_j or 0.0), float(gpu_j is not None),
               float(cpu_j or 0.0), float(cpu_j is not None), float(wall or 0.0)] + [0.0] * (3 * n)
        head = 15
        for i, key in enumerate(("main_bytes", "workers_bytes", "gpu_bytes")):
            vec[head + i * n + self.ranks.rank] = float(peak[key] or 0)
        total = self.comm.allreduce_sum(vec)
        train_b, eval_b = int(total[0]), int(total[1])
        self.used["train_read_bytes"] += train_b
        self.used["eval_read_bytes"] += eval_b
        self.used["io_epochs"] += 1
        self.used["cpu_ran_ns"] += total[5]
        self.used["cpu_waited_ns"] += total[6]
        self.used["input_waited_s"] += total[7]
        self.used["loop_train_s"] += total[4]
        input_wait = total[7] / total[4] if total[4] > 0 else None
        gpu_busy = total[8] / total[4] if total[9] == n and total[4] > 0 else None   # every rank on CUDA
        if total[9] == n:
            self.used["gpu_busy_s"] = (self.used["gpu_busy_s"] or 0.0) + total[8]
        self.used["energy_s"] += total[14] / n
        # a run's energy covers every epoch or is absent: every rank's GPU read, one reader per
        # node and every node read, in each epoch
        for key, got, readers in (("gpu_energy_j", 10, n), ("cpu_energy_j", 12, self.ranks.nodes)):
            if total[got + 1] == readers and self.used.get(f"{key}_whole", True):
                self.used[key] = (self.used[key] or 0.0) + total[got]
            else:
                self.used[key], self.used[f"{key}_whole"] = None, False
        if counted:   # means over the ranks
            self.used["sync_bytes"] += total[2] / n
            self.used["sync_batches"] += batches
            self.used["sync_busy_s"] += total[3] / n
            self.used["sync_train_s"] += total[4] / n
        for i, key in enumerate(("peak_rss_bytes_per_rank", "peak_worker_rss_bytes_per_rank",
                                 "peak_gpu_bytes_per_rank")):
            values = [int(v) for v in total[head + i * n: head + (i + 1) * n]]
            self.used[key] = values if any(values) else None
        self.log.event(HPC_USAGE_EPOCH, {"train_read_bytes": train_b, "eval_read_bytes": eval_b,
                                         "train_read_MBps": usage.mb_per_s(train_b, train_s),
                                         "grad_allreduce_share": total[3] / total[4]
                                         if counted and total[4] > 0 else None,
                                         "cpu_wait_share": usage.wait_share(total[5], total[6]),
                                         "input_wait_share": input_wait, "gpu_busy_share": gpu_busy,
                                         "gpu_energy_j": total[10] if total[11] == n else None,
                                         "cpu_energy_j": total[12] if total[13] == self.ranks.nodes else None},
                       metadata={"epoch_num": epoch})

    def usage_record(self) -> dict:
        """summary.json's `usage` block and the hpckit_usage log line: measured, all ranks."""
        u, epochs = self.used, self.used["io_epochs"]
        peaks = u["peak_rss_bytes_per_rank"]
        return {
            "peak_rss_bytes_per_rank": peaks,
            "peak_rss_bytes_max": max(peaks) if peaks else None,
            "peak_worker_rss_bytes_per_rank": u["peak_worker_rss_bytes_per_rank"],
            "peak_gpu_bytes_per_rank": u["peak_gpu_bytes_per_rank"],
            "staging_read_bytes": u["staging_read_bytes"],
            "staging_read_MBps": u["staging_read_MBps"],
            "staging_copy_s_per_node": u.get("staging_copy_s_per_node"),
            "train_read_bytes_per_epoch": u["train_read_bytes"] / epochs if epochs else None,
            "train_read_MBps": usage.mb_per_s(u["train_read_bytes"], self.train_seconds),
            "eval_read_bytes_per_epoch": u["eval_read_bytes"] / epochs if epochs else None,
            "grad_allreduce_bytes_per_batch": u["sync_bytes"] / u["sync_batches"] if u["sync_batches"] else None,
            "grad_allreduce_share": u["sync_busy_s"] / u["sync_train_s"] if u["sync_train_s"] else None,
            "train_flops_per_sample": self.flops_per_sample,
            "cpu_wait_share": usage.wait_share(u["cpu_ran_ns"], u["cpu_waited_ns"]),
            "input_wait_share": u["input_waited_s"] / u["loop_train_s"] if u["loop_train_s"] > 0 else None,
            "gpu_busy_share": (u["gpu_busy_s"] / u["loop_train_s"]
                               if u["gpu_busy_s"] is not None and u["loop_train_s"] > 0 else None),
            "gpu_energy_j": u["gpu_energy_j"],
            "gpu_power_w": u["gpu_energy_j"] / u["energy_s"] if u["gpu_energy_j"] is not None and u["energy_s"] else None,
            "cpu_energy_j": u["cpu_energy_j"],
            "cpu_power_w": u["cpu_energy_j"] / u["energy_s"] if u["cpu_energy_j"] is not None and u["energy_s"] else None,
            "energy_not_read": {k: v for k, v in (("gpu", self.gpu_energy.why), ("cpu", self.cpu_energy.why))
                                if v and u[f"{k}_energy_j"] is None} or None,
            "train_flops_per_s_per_rank": (self.flops_per_sample * self.train_samples / self.train_seconds
                                           / self.ranks.size) if self.flops_per_sample and self.train_seconds else None,
            "measured": "rchar of /proc/<pid>/io over each rank and its loader workers, summed over ranks; "
                        "peaks: VmHWM of each rank's main process, its largest worker; gradient all-reduce: "
                        "bytes per rank and training batch, and the share of the training time with one in "
                        "flight (mean over ranks; DDP overlaps it with the backward pass: an upper bound of "
                        "the wait; none on one rank, with TensorFlow, or under DDP on CUDA); FLOP/s: the network's "
                        "forward + backward FLOPs per sample (counted on meta tensors, common/flops.py) x the "
                        "training samples per second, per rank; CPU wait: the share of the ranks' and their "
                        "workers' thread time spent waiting in a run queue while training (schedstat run_delay "
                        "against run time, all ranks); input wait: the share of the training epochs' time the "
                        "loops were blocked asking for their next batch (less the device holding a buffer: a "
                        "GPU-bound loop), all ranks; GPU busy: CUDA events around every training step on the "
                        "loop's stream against the epochs' time, all ranks (none off CUDA); energy over the "
                        "epochs, training and evaluation: NVML's total energy counter of each rank's GPU, summed, "
                        "and RAPL's package counters of each node (powercap, read by local rank 0), summed; "
                        "power: energy over the epochs' wall time; absent where not readable (energy_not_read "
                        "says why)",
        }

    def _run_stop(self, status: str, reason: str | None = None) -> None:
        if self.log.run_started and not self.log.run_stopped:   # inside the timed region, once
            self.log.event(HPC_USAGE, self.usage_record())
        if reason is None:
            self.log.run_stop(status)
        else:
            self.log.run_stop(status, reason=reason)

    def check_replicas(self, fingerprint: float) -> None:
        """Every rank's model must be the same at the end (data parallelism that does not
        average would still 'train', on 1/N of the data): compare a weight fingerprint
        across ranks and fail the run if they differ."""
        if self.ranks.size == 1 or self.stop_reason:   # a diverged run's weights are not finite
            return
        self.replicas_in_sync, mean, spread = replicas_agree(self.comm, fingerprint)
        if not self.replicas_in_sync:
            raise KitError(f"the {self.ranks.size} model replicas differ after training (weight fingerprint "
                           f"mean {mean:.9g}, spread {spread:.3g}): gradients were not averaged across ranks")

    def _campaign_fields(self) -> dict:
        if self.campaign is None:
            return {}
        return {"instance": self.campaign.instance, "instances": self.campaign.instances,
                "campaign_ranks": self.campaign.world.size}

    # -- results ------------------------------------------------------------------------
    def verdict(self) -> str:
        """The one line `hpckit train` prints at the end."""
        state = "converged" if self.status == "success" else "NOT converged"
        if self.stop_reason:
            state += f" ({self.stop_reason})"
        return (f"hpckit train {self.benchmark}: {state}: {self.quality.metric} {self.last_metric:.4f} "
                f"(target {self.quality.target}) after {self.epochs_done} {self.style.epoch_unit}; "
                f"{self.out_dir / 'mlperf.log'}, {self.out_dir / 'summary.json'}")

    def _write_summary(self, error: str | None = None) -> None:
        if self.ranks.rank != 0:
            return
        start, stop = self.log.run_start_time, self.log.run_stop_time
        converged = self.status == "success"
        summary = {
            "benchmark": self.benchmark,
            "framework": self.framework,
            "config": self.cfg["name"],
            "status": self.status or "aborted",
            "converged": converged,
            "time_to_train_s": (stop - start) if start and stop else None,
            "staging_s": self.staging_s,
            "epochs": self.epochs_done,
            f"final_{self.quality.metric}": self.last_metric if math.isfinite(self.last_metric) else None,
            "metric": self.quality.metric,
            "target": self.quality.target,
            "train_samples_per_s": self.train_samples / self.train_seconds if self.train_seconds else None,
            "eval_samples_per_s": self.eval_samples / self.eval_seconds if self.eval_seconds else None,
            "global_batch_size": self.global_batch,
            "ranks": self.ranks.size,
            "nodes": self.ranks.nodes,
            "ranks_per_node": self.ranks.local_size,
            "accelerators_per_node": self.accelerators_per_node,
            "launcher": self.ranks.launcher,
            "dist": self.comm.kind,
            "cores": self.cores.as_log(),
            "allocator": self.allocator,
            "seed": self.seed,
            "replicas_in_sync": self.replicas_in_sync,
            "cache_clear": self.cache_report,
            "usage": self.usage_record(),
            "software": software_stack(self.framework),
            "provenance": self.provenance,
            "mlperf_log": "mlperf.log",
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        summary.update(self._campaign_fields())
        if self.start_barrier:
            summary["start_barrier"] = self.start_barrier
        if self.stop_reason:
            summary["stop_reason"] = self.stop_reason
        if error:
            summary["error"] = error
        write_summary(self.out_dir / "summary.json", summary)
