"""MLPerf logging through the official `mlperf_logging.mllog`, once for every benchmark.

Only rank 0 writes. Lines go to `OUT/mlperf.log` as they happen (a crash keeps every line
written so far) and to stdout. `run_stop` carries metadata.status (success | aborted).
Each line reaches the file whole or not at all (LineFileHandler): a full disk leaves the
log ending with its last complete line and surfaces as one error naming the log.
"""

from __future__ import annotations

import logging
import os
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


class LogWriteError(OSError):
    """mlperf.log could not take a line (full disk, quota, I/O error): the log still ends
    with its last complete line."""


class LineFileHandler(logging.Handler):
    """Append each record as one whole line with os.write on an O_APPEND descriptor. A
    write that fails part-way (ENOSPC after some bytes) is cut back to the line's start, so
    the file never ends mid-line, and the error is raised to the caller rather than
    printed as logging's "--- Logging error ---" traceback and ignored, as FileHandler does.
    After a failure the handler writes nothing more (mllog catches the error and would log
    a "Failed to encode" line instead); MLLogger raises `failed` to its caller."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)
        self.failed: LogWriteError | None = None
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is not None:
            raise self.failed
        data = (self.format(record) + "\n").encode()
        start = os.fstat(self.fd).st_size
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError as e:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass
            self.failed = LogWriteError(e.errno, e.strerror, str(self.path))
            raise self.failed from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        super().close()


class MLLogger:
    def __init__(self, path: Path | None, rank: int = 0, echo: bool = True, instance: int | None = None):
        self.enabled = rank == 0 and path is not None
        # a throughput campaign's instance: metadata.instance on every line, as the published
        # weak-scaling logs carry it (hpc_results_v2.0 NVIDIA dgxa100_n512_pytorch/weak/cosmoflow)
        self.instance = instance
        self.path = path
        self.run_started = self.run_stopped = False
        self.run_start_time = self.run_stop_time = None
        self._handlers: list[logging.Handler] = []
        if not self.enabled:
            return
        logger = logging.getLogger(f"hpckit.mllog.{id(self)}")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        self._file = LineFileHandler(path)
        handlers = [self._file]
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

    def _meta(self, metadata: dict | None) -> dict | None:
        return metadata if self.instance is None else {**(metadata or {}), "instance": self.instance}

    def _raise_failed(self) -> None:
        """mllog swallows a handler's exception: a line that did not reach the file is raised here."""
        if self._file.failed is not None:
            raise self._file.failed

    def event(self, key: str, value=None, metadata: dict | None = None) -> None:
        if self.enabled:
            self._ml.event(key=key, value=value, metadata=self._meta(metadata), stack_offset=2)
            self._raise_failed()

    def start(self, key: str, value=None, metadata: dict | None = None) -> None:
        if key == C.RUN_START:
            self.run_started, self.run_start_time = True, time.time()
        if self.enabled:
            self._ml.start(key=key, value=value, metadata=self._meta(metadata), stack_offset=2)
            self._raise_failed()

    def end(self, key: str, value=None, metadata: dict | None = None) -> None:
        if key == C.RUN_STOP:
            self.run_stopped, self.run_stop_time = True, time.time()
        if self.enabled:
            self._ml.end(key=key, value=value, metadata=self._meta(metadata), stack_offset=2)
            self._raise_failed()

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
