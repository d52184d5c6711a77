"""Real ranks for the tests that start their own (torch.distributed over gloo), ended the way
`hpckit` ends a process that had a process group: its result handed over first, then
common/dist.py end_process (os._exit), never the interpreter teardown, which can abort in
gloo's destructors ("terminate called without an active exception", exit -6: a CI run of
cf95ba2 failed so in test_bn_stats after the rank had put its results on the queue) or
deadlock (dist.UNSAFE_TEARDOWN).

run_ranks(target, n, *args) runs target(rank, port, *args) in n spawned processes and
returns their return values by rank; a rank that raises fails the test with its traceback.
Timeouts are hang guards only."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import socket
import time
import traceback

HANG_GUARD_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(target, rank: int, port: int, args: tuple, results) -> None:
    code = 1
    try:
        value = target(rank, port, *args)
        results.put((rank, True, value))
        code = 0
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    # the queue's feeder thread delivers before the process ends (os._exit would drop it)
    results.close()
    results.join_thread()
    from hpckit.common.dist import end_process
    end_process(code)


def run_ranks(target, n: int, *args) -> list:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(target, rank, port, args, results), daemon=True)
             for rank in range(n)]
    for p in procs:
        p.start()
    values = {}
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        gone_silent = set()
        while len(values) < n:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue_module.Empty:
                # a rank that ended without a result: its last put would be in the pipe by
                # now (it joins the queue's feeder before it ends), so one more wait decides
                silent = {r for r, p in enumerate(procs) if p.exitcode is not None and r not in values}
                assert not silent & gone_silent and time.monotonic() < deadline, (
                    f"ranks {sorted(set(range(n)) - set(values))} gave no result "
                    f"(exit codes {[p.exitcode for p in procs]})")
                gone_silent |= silent
                continue
            assert ok, f"rank {rank} failed:\n{value}"
            values[rank] = value
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        assert [p.exitcode for p in procs] == [0] * n, [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [values[r] for r in range(n)]
