"""What a run used, measured while it runs, never estimated: resident memory and bytes read.

Read from Linux's own accounting of the process, so it costs a few /proc reads per epoch:

- bytes read: `rchar` of /proc/<pid>/io, the bytes every read(2), pread, sendfile and
  copy_file_range returned, page cache hits included (`read_bytes`, what reached the block
  layer, is kept beside it: 0 on a warm page cache or a tmpfs). Summed over this process
  and its live descendants (PyTorch's loader workers, tf.data's threads are in-process);
  a reaped child's counts are already in its parent's (the kernel adds them at wait()), so
  nothing is counted twice or lost when workers are restarted each epoch.
- peak resident memory: `VmHWM` of /proc/self/status (the main process: model, optimizer,
  activations, batches) and, separately, the largest of its loader workers (live ones' VmHWM,
  reaped ones' ru_maxrss of RUSAGE_CHILDREN): a node needs the main process plus each worker.
- GPU memory: torch.cuda.max_memory_allocated when the run is on CUDA.
- CPU wait: of the time the rank's threads (and its loader workers') wanted a CPU, the share
  they spent waiting in a run queue (the 2nd field of /proc/<pid>/task/<tid>/schedstat,
  run_delay, against the 1st, the time they ran). Near 0 on a machine the run has to
  itself; another process computing on its cores raises it, up to about 0.5 where a
  2-thread rank's threads take turns on one core (docs/scaling.md, "A machine shared with
  another job"). A throughput measured at a high share is not the machine's.

Where /proc is absent (not Linux) the counters read None and the run goes on.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def _children(pid: int | str) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int | str = "self") -> list[int]:
    """Live descendants of pid (loader workers and their children)."""
    seen, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.append(p)
            todo += _children(p)
    return seen


def _io(pid: int | str) -> dict[str, int] | None:
    try:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return {"rchar": int(fields["rchar"]), "read_bytes": int(fields["read_bytes"])}
    except (OSError, ValueError, KeyError):
        return None


def io_counters() -> dict[str, int] | None:
    """rchar and read_bytes of this process and its live descendants, or None without /proc."""
    own = _io("self")
    if own is None:
        return None
    for pid in descendants():
        child = _io(pid)   # a worker that exits meanwhile is in ours already, or will be
        if child:
            own = {k: own[k] + child[k] for k in own}
    return own


def io_delta(before: dict | None, after: dict | None) -> dict[str, int] | None:
    if before is None or after is None:
        return None
    return {k: max(after[k] - before[k], 0) for k in before}


def _sched(pid: int | str, into: dict) -> None:
    """Add (ran, waited) nanoseconds of each thread of pid to `into`, by thread id."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "schedstat").read_text().split()
            into[int(task.name)] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue   # a thread that ended meanwhile


def cpu_counters(pid: int | str = "self") -> dict[int, tuple[int, int]] | None:
    """thread id -> (ran, waited) nanoseconds, for the threads of pid (this process) and its
    live descendants' (the CPU wait above), or None where the kernel keeps no schedstat."""
    if not Path(f"/proc/{pid}/schedstat").is_file():
        return None
    threads: dict[int, tuple[int, int]] = {}
    _sched(pid, threads)
    for child in descendants(pid):
        _sched(child, threads)
    return threads


def cpu_delta(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """ran_ns and waited_ns between two cpu_counters, over the threads alive at the second
    (a loader worker started between them counts from 0; one that ended is left out: its
    counts are gone with it)."""
    if before is None or after is None:
        return None
    ran = waited = 0
    for tid, (r, w) in after.items():
        r0, w0 = before.get(tid, (0, 0))
        if r >= r0 and w >= w0:        # else the id was reused by another thread
            ran, waited = ran + r - r0, waited + w - w0
        else:
            ran, waited = ran + r, waited + w
    return {"ran_ns": ran, "waited_ns": waited}


def wait_share(ran_ns: float, waited_ns: float) -> float | None:
    return waited_ns / (ran_ns + waited_ns) if ran_ns + waited_ns > 0 else None


def _hwm(pid: int | str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


class PeakMemory:
    """The peaks seen so far; sample() at epoch ends and before the summary."""

    def __init__(self) -> None:
        self.workers = 0

    def sample(self) -> dict[str, int | None]:
        for pid in descendants():
            self.workers = max(self.workers, _hwm(pid) or 0)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024   # KiB on Linux
        self.workers = max(self.workers, reaped)
        out = {"main_bytes": _hwm("self"), "workers_bytes": self.workers or None, "gpu_bytes": None}
        try:
            torch = sys.modules.get("torch")   # never imported here just to ask
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                out["gpu_bytes"] = int(torch.cuda.max_memory_allocated())
        except Exception:   # a broken CUDA runtime is not this module's verdict to give
            pass
        return out


def mb_per_s(nbytes: float | None, seconds: float | None) -> float | None:
    if nbytes is None or not seconds or seconds <= 0:
        return None
    return nbytes / seconds / 1e6


class LoopClock:
    """The training loop's own clock (`timed` drives it around every batch: MLPerfRun.limited,
    bench/feed_rate.py):

    - input wait: the time the loop was blocked asking for its next batch, less the part a
      GPU loader spent waiting for the device to hand a buffer back (common/feed.py
      held_seconds: that loop is GPU-bound, not starved). On the CPU paths every second the
      loop waits for the loader counts.
    - on CUDA, the GPU's busy time: a CUDA event recorded on the loop's stream when a batch
      is handed out and another when the next one is asked for (after the step on it was
      queued), summed over the epoch: the time the GPU spent on the steps, gaps between
      steps (data not there, the host late) left out. Against the epoch's wall time it is
      the GPU's busy share: 1 when the loop keeps the GPU fed.
    Read once per epoch (`take`), after the epoch's end has synchronised with the device."""

    def __init__(self, device=None):
        self.cuda = getattr(device, "type", None) == "cuda"
        self.waited_s = 0.0
        self._spans: list = []
        self._open = None

    def timed(self, batches, more=None):
        """Iterate `batches` as a training loop does, timing each wait and (on CUDA) each
        step; `more()` false: stop before asking for another batch."""
        import time

        from hpckit.common import feed
        it = iter(batches)
        try:
            while more is None or more():
                t0, held0 = time.perf_counter(), feed.held_seconds()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self.waited(time.perf_counter() - t0, feed.held_seconds() - held0)
                self.step_begins()
                yield batch
                self.step_ends()
        finally:
            self.step_ends()

    def waited(self, seconds: float, held: float = 0.0) -> None:
        self.waited_s += max(seconds - held, 0.0)

    def step_begins(self) -> None:
        if self.cuda:
            import torch
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()

    def step_ends(self) -> None:
        if self._open is not None:
            import torch
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans.append((self._open, end))
            self._open = None

    def take(self) -> tuple[float, float | None]:
        """(seconds waited for input, seconds the GPU was busy or None off CUDA) since the last
        take; the events of the epoch are synchronised and dropped."""
        busy = None
        if self.cuda:
            self.step_ends()
            busy = 0.0
            if self._spans:
                self._spans[-1][1].synchronize()
                busy = sum(a.elapsed_time(b) for a, b in self._spans) / 1e3
        waited, self.waited_s, self._spans = self.waited_s, 0.0, []
        return waited, busy
