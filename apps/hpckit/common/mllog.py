"""MLPerf logging through the official `mlperf_logging.mllog`, once for every benchmark.

Only rank 0 writes. Lines go to `OUT/mlperf.log` as they happen (a crash keeps every line
written so far) and to stdout. `run_stop` carries metadata.status (success | aborted).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from mlperf_logging import mllog
from mlperf_logging.mllog import constants

C = constants


class HPC:
    """MLPerf HPC keys that mllog.constants does not (yet) name."""
    DROPOUT = "dropout"
    NUMBER_OF_NODES = "number_of_nodes"
    ACCELERATORS_PER_NODE = "accelerators_per_node"
    EVAL_ERROR = "eval_error"
    THROUGHPUT = "throughput"


class MLLogger:
    def __init__(self, path: Path | None, rank: int = 0, echo: bool = True):
        self.enabled = rank == 0 and path is not None
        self.path = path
        self.run_started = self.run_stopped = False
        self.run_start_time = self.run_stop_time = None
        self._handlers: list[logging.Handler] = []
        if not self.enabled:
            return
        logger = logging.getLogger(f"hpckit.mllog.{id(self)}")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        handlers = [logging.FileHandler(path, mode="w")]
        if echo:
            handlers.append(logging.StreamHandler(sys.stdout))
        for h in handlers:
            h.setLevel(logging.INFO)
            logger.addHandler(h)
        self._handlers = handlers
        self._logger = logger
        mllog.config(logger=logger, default_stack_offset=2,
                     root_dir=str(Path(__file__).resolve().parents[2]))
        self._ml = mllog.get_mllogger()

    def event(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self.enabled:
            self._ml.event(key=key, value=value, metadata=metadata, stack_offset=2)

    def start(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self.enabled:
            self._ml.start(key=key, value=value, metadata=metadata, stack_offset=2)
        if key == C.RUN_START:
            self.run_started, self.run_start_time = True, time.time()

    def end(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self.enabled:
            self._ml.end(key=key, value=value, metadata=metadata, stack_offset=2)
        if key == C.RUN_STOP:
            self.run_stopped, self.run_stop_time = True, time.time()

    def run_stop(self, status: str, **metadata) -> None:
        """Close the timed region once; later calls (an abort after success) do nothing."""
        if self.run_started and not self.run_stopped:
            self.end(C.RUN_STOP, metadata={"status": status, **metadata})

    def close(self) -> None:
        for h in self._handlers:
            h.flush()
            h.close()
            self._logger.removeHandler(h)
        self._handlers = []
