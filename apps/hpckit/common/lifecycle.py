"""The lifecycle of one `hpckit train` run, once for every benchmark.

A benchmark's train() reads its config, claims the output folder, launches its ranks and finds
its data; then it hands this module its parts (a `Parts`) and the lifecycle runs them in the
MLPerf phases' order:

    init_start   hyperparameters() logged, input_files()' page-cache pages dropped
    build(run)   model, optimizer, schedule: the init phase, before the clock starts
    run_start    the clock starts (MLPerfRun.start_run)
    prepare(run) staging, sharding, loaders: inside the clock, as the rules count them
    epochs       train_epoch(epoch, run), timed here, then evaluate(), timed here, until the
                 target, n_epochs, divergence or train.max_steps (MLPerfRun.epochs)
    run_stop     every rank's fingerprint() compared, summary.json, the verdict line

and returns the exit code (0 converged, EXIT_NOT_CONVERGED otherwise). MLPerfRun (common/run.py)
is the protocol's state and its log; this is the order its steps are taken in, which before
lived as a copy in each of the four benchmarks' train().
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from hpckit.common.benchmark import Benchmark
from hpckit.common.errors import EXIT_NOT_CONVERGED
from hpckit.common.run import Launch, LogStyle, MLPerfRun, Quality


class Parts(ABC):
    """What one benchmark hands the lifecycle. A subclass sets `descriptor` (the package's
    DESCRIPTOR) and `style` (its reference's event order), and `framework` where it is not
    PyTorch; the lifecycle calls its methods in the order of the module doc."""

    descriptor: Benchmark
    style: LogStyle
    framework: str = "pytorch"

    def __init__(self, cfg: dict, launched: Launch, global_batch: int):
        self.cfg, self.launched, self.global_batch = cfg, launched, global_batch
        self.ranks, self.comm = launched.ranks, launched.comm

    @abstractmethod
    def hyperparameters(self) -> list[tuple[str, object]]:
        """The keys logged at init_start, in the reference's order."""

    @abstractmethod
    def input_files(self) -> list[Path]:
        """The data set's files, whose page-cache pages are dropped before the run (cache_clear)."""

    @abstractmethod
    def build(self, run: MLPerfRun) -> None:
        """Model, optimizer, schedule: the init phase, before run_start."""

    @abstractmethod
    def prepare(self, run: MLPerfRun) -> None:
        """After run_start: staging, sharding, the loaders (their time counts)."""

    @property
    def n_epochs(self) -> int:
        """Epochs (or evaluation cycles) at most."""
        return self.cfg["train"]["n_epochs"]

    def epoch_num(self, epoch: int) -> int:
        """The log's metadata.epoch_num for the 1-based epoch (a reference that numbers its
        cycles otherwise overrides it)."""
        return epoch

    @abstractmethod
    def train_epoch(self, epoch: int, run: MLPerfRun) -> int:
        """Train one epoch (1-based) over run.limited(batches); the samples trained, summed
        over all ranks."""

    @abstractmethod
    def evaluate(self) -> tuple:
        """(metric, samples over all ranks) or (metric, samples, [(key, value), ...]): events
        logged right after the metric."""

    @abstractmethod
    def fingerprint(self) -> float:
        """A number equal on every rank when the replicas are equal (weights, statistics)."""


def train(parts: Parts, out_dir: str | Path) -> int:
    """Run `parts` from init_start to run_stop into out_dir; the exit code."""
    with MLPerfRun(benchmark=parts.descriptor.name, framework=parts.framework, cfg=parts.cfg,
                   launched=parts.launched, out_dir=out_dir, quality=Quality.of(parts.descriptor, parts.cfg),
                   global_batch=parts.global_batch, style=parts.style) as run:
        run.init_start(parts.hyperparameters(), parts.input_files())
        parts.build(run)
        run.start_run()
        parts.prepare(run)

        def train_epoch(epoch: int) -> tuple[int, float]:
            t0 = time.perf_counter()
            samples = parts.train_epoch(epoch, run)
            return int(samples), time.perf_counter() - t0

        def evaluate() -> tuple:
            t0 = time.perf_counter()
            metric, samples, *extra = parts.evaluate()
            return (metric, int(samples), time.perf_counter() - t0, *extra)

        run.epochs(parts.n_epochs, train_epoch, evaluate, epoch_num=parts.epoch_num)
        run.check_replicas(parts.fingerprint())
    if parts.ranks.is_root:
        print(run.verdict())
    return 0 if run.status == "success" else EXIT_NOT_CONVERGED
