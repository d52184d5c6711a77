"""Batches read by threads of the training process straight into pinned host memory: the
loader of the GPU path (cosmoflow/data.py and deepcam/data.py torch_loader on CUDA).

Why not DataLoader's worker processes there: a worker process collates each batch into a new
shared-memory segment (its pages allocated and zeroed every batch), the training process maps
it, and its single pin-memory thread copies every byte once more into pinned memory and frees
the segment's pages. bench/feed_rate.py measured that thread at 7-8 ms of CPU per 16 MB
CosmoFlow sample and 18-24 ms per 57 MB DeepCAM sample on a 2-core EPYC: one thread caps the
whole feed at about 125-147 and 41-51 samples/s, below NVIDIA's 206 and 82 per H100, whatever
the number of workers (bench/README.md "feed_rate.py"). Here the readers (gunzip, HDF5 and file
reads, numpy's checks: all release the GIL for their bulk work) write each sample into its
place in one of a ring of pinned batch buffers, and the host-to-device copy reads it from
there: no segment, no second copy, no single thread in the way. As NVIDIA's DALI readers do.

The ring: `depth` batch buffers, the batch the consumer holds and `depth - 1` being read
ahead. When the consumer asks for batch k + 1 it is done with batch k's host memory except
for the asynchronous copies it queued from it: an event recorded on the current CUDA stream
at that moment marks them, and the readers that refill the buffer wait for it first. A read
that fails raises its KitError (naming the file) when its batch is asked for.

Waiting for the GPU is not waiting for data: with the step running ahead of the host only
as far as the ring allows, a consumer that asks for its next batch while the readers are
still waiting for the device to release that batch's buffer is held by the GPU (the run is
GPU-bound), not starved. `held_seconds()` counts that part of the consumer's waits (the
time until the last of the batch's reads got its buffer back), so that the training loop's
input wait (MLPerfRun.limited) leaves it out.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence


class _Held:
    """Seconds consumers of this process waited for the device to release a buffer."""

    def __init__(self):
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


_HELD = _Held()


def held_seconds() -> float:
    """The time, so far in this process, that training loops waiting for a batch were held
    by the device (its buffer not yet released), not by the readers."""
    return _HELD.seconds


class PinnedBatches:
    """An iterable of batches, one pass over `sampler` per iteration (as a DataLoader).

    `parts`: per output array, (shape of one sample, torch dtype); `read_into(index, views)`
    writes sample `index` into `views` (numpy arrays, one per part); `make(tensors)` builds
    the batch from the parts' tensors (pinned, sliced to the batch's samples)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool, parts: Sequence[tuple[tuple, object]],
                 read_into: Callable, make: Callable, threads: int, depth: int, pin: bool):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.parts, self.read_into, self.make, self.pin = list(parts), read_into, make, pin
        self.threads = max(1, threads)
        # enough samples in flight to keep every reader busy, and the consumer's batch
        self.depth = max(depth, math.ceil(self.threads / batch_size) + 1, 2)
        self._pool: ThreadPoolExecutor | None = None
        self._slots: list | None = None
        self._released: list = []
        self._queued: deque = deque()   # the last pass's reads not yet handed out

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _buffers(self):
        import torch
        if self._slots is None:
            self._slots = [[torch.empty((self.batch_size, *shape), dtype=dtype, pin_memory=self.pin)
                            for shape, dtype in self.parts] for _ in range(self.depth)]
            self._released = [None] * self.depth
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="hpckit-reader")
        return self._slots

    def _read(self, index: int, slot: int, row: int, released, holds: list) -> None:
        if released is not None:
            t0 = time.perf_counter()
            released.synchronize()   # the copies queued from this buffer have finished
            t1 = time.perf_counter()
            if t1 - t0 > 1e-4:
                holds[row] = t1   # the buffer came back only now: the reads waited for the device
        self.read_into(index, [t[row].numpy() for t in self._slots[slot]])

    def __iter__(self):
        for _, _, futures, _ in self._queued:   # an earlier pass left early (train.max_steps): its reads end first
            for f in futures:
                f.exception()
        slots = self._buffers()
        # whatever the consumer still copies out of any buffer was queued before now
        self._released = [self._event()] * self.depth
        order = list(self.sampler)
        stops = range(0, len(order) - (len(order) % self.batch_size if self.drop_last else 0), self.batch_size)
        batches = [order[i:i + self.batch_size] for i in stops]
        queued = self._queued = deque()

        def submit(k: int) -> None:
            s = k % self.depth
            holds = [0.0] * len(batches[k])
            queued.append((s, len(batches[k]), [self._pool.submit(self._read, index, s, row, self._released[s], holds)
                                                 for row, index in enumerate(batches[k])], holds))

        for k in range(min(self.depth - 1, len(batches))):
            submit(k)
        for k in range(len(batches)):
            s, n, futures, holds = queued.popleft()
            asked = time.perf_counter()
            for f in futures:
                f.result()   # raises the reader's KitError
            got = time.perf_counter()
            if max(holds) > asked:   # part of this wait was the device holding the buffer
                _HELD.add(min(max(holds), got) - asked)
            yield self.make([t[:n] for t in slots[s]])
            # the consumer asked for the next batch: batch k's host memory is free once the
            # copies it queued from it are done
            self._released[s] = self._event()
            if k + self.depth - 1 < len(batches):
                submit(k + self.depth - 1)

    def _event(self):
        import torch
        if not (self.pin and torch.cuda.is_available()):
            return None
        event = torch.cuda.Event(blocking=True)   # a reader waiting on it sleeps, not spins
        event.record()
        return event
