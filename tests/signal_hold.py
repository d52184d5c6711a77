"""`python tests/signal_hold.py PHASE READY_FD RELEASE_FD hpckit-arguments...`: runs the real
`hpckit` command (cli.main, as `python -m hpckit` does) and holds it once at a point inside
PHASE, so that tests/test_signals.py can signal it there and not by a race against a
clock. At that point it writes one line to READY_FD and waits for a byte on RELEASE_FD; the
test sends its signal, then releases. In the main thread the signal interrupts the wait
(its handler raises there); in a staging worker thread the wait ends at the release and the
main thread, waiting for that worker, takes the signal.

The points (the mlperf.log says which phase the run was in):
  init            right after init_start is logged (before run_start)
  before-staging  right after run_start is logged (before staging_start)
  staging         right after the first file is staged (a copy, a decoded .npy), or the
                  second record put into a node's staged LMDB (OpenCatalyst)
  train           in the second training step's backward pass (PyTorch)
  eval            in the first forward pass after eval_start is logged (PyTorch)
"""

from __future__ import annotations

import os
import sys
import threading

PHASE, READY_FD, RELEASE_FD = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ARGV = sys.argv[4:]
_lock = threading.Lock()
_state = {"held": False, "last_start": None, "backward": 0}


def hold(where: str) -> None:
    with _lock:
        if _state["held"]:
            return
        _state["held"] = True
    os.write(READY_FD, f"{PHASE}: {where}\n".encode())
    os.close(READY_FD)
    os.read(RELEASE_FD, 1)


def install() -> None:
    from hpckit.common import mllog
    start = mllog.MLLogger.start

    def logged_start(self, key, *args, **kwargs):
        start(self, key, *args, **kwargs)
        _state["last_start"] = key
        if (PHASE, key) in (("init", "init_start"), ("before-staging", "run_start")):
            hold(f"{key} logged")
    mllog.MLLogger.start = logged_start

    if PHASE == "staging":
        from hpckit.common import staging
        from hpckit.cosmoflow import data
        copy_fd, save_npy = staging._copy_fd, data._save_npy

        def staged_copy(src, dst, *args, **kwargs):
            result = copy_fd(src, dst, *args, **kwargs)
            path = os.readlink(f"/proc/self/fd/{dst}")
            if "hpckit-stage-" in path:
                hold(f"copied {path}")
            return result

        def staged_npy(path, arr, *args, **kwargs):
            n = save_npy(path, arr, *args, **kwargs)
            hold(f"decoded {path}")
            return n
        staging._copy_fd, data._save_npy = staged_copy, staged_npy

        from hpckit.oc20 import records
        write_lmdb = records.write_lmdb

        def held_records(path, recs, **kwargs):
            def each():
                for n, rec in enumerate(recs):
                    if n == 2:
                        hold(f"lmdb record 2 of {path}")
                    yield rec
            return write_lmdb(path, each(), **kwargs)
        records.write_lmdb = held_records

    if PHASE in ("train", "eval"):
        import torch
        backward, call = torch.Tensor.backward, torch.nn.Module.__call__

        def counted_backward(self, *args, **kwargs):
            _state["backward"] += 1
            if PHASE == "train" and _state["backward"] == 2:
                hold("second backward pass")
            return backward(self, *args, **kwargs)

        def watched_call(self, *args, **kwargs):
            if PHASE == "eval" and _state["last_start"] == "eval_start":
                hold(f"{type(self).__name__} forward after eval_start")
            return call(self, *args, **kwargs)
        torch.Tensor.backward, torch.nn.Module.__call__ = counted_backward, watched_call


if __name__ == "__main__":
    if PHASE not in ("init", "before-staging", "staging", "train", "eval"):
        raise SystemExit(f"signal_hold.py: unknown phase {PHASE!r}")
    install()
    from hpckit.cli import main
    raise SystemExit(main(ARGV))
