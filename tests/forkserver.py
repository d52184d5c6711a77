"""Run `hpckit` command lines fast, each in its own forked process, as `python -m hpckit`
would: the bad-input battery's engine (tests/test_bad_input_battery.py).

The server imports the kit and its light dependencies once (never TensorFlow, and it runs
no PyTorch op, so no thread pool exists to fork), then for each request on stdin, a JSON
line {"argv": [...], "cwd": DIR, "env": {...}, "timeout": S}, forks a child that changes to
`cwd`, redirects stdout/stderr to files and calls `hpckit.cli.main(argv)` exactly as
`hpckit/__main__.py` does. An exception escaping main() is printed as the interpreter
prints it (a traceback, exit code 1), so a traceback here is one a user would see. A child
running past its timeout is killed with its process group and reported as a hang. The
answer is one JSON line {"rc", "stdout", "stderr", "hang", "seconds"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy  # noqa: E402,F401  (shared by the children: imported once)
import h5py  # noqa: E402,F401
import yaml  # noqa: E402,F401
import torch  # noqa: E402,F401
import mlperf_logging.mllog  # noqa: E402,F401
import hpckit.cli  # noqa: E402


def child(req: dict, out_path: str, err_path: str) -> None:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    os.environ.update(req.get("env") or {})
    os.chdir(req["cwd"])
    sys.argv = ["hpckit", *req["argv"]]
    try:
        code = hpckit.cli.main(req["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:   # what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else 0)


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.NamedTemporaryFile(delete=False) as o, tempfile.NamedTemporaryFile(delete=False) as e:
            out_path, err_path = o.name, e.name
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(req, out_path, err_path)
        hang = False
        deadline = start + float(req.get("timeout", 120))
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                hang = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        rc = os.waitstatus_to_exitcode(status)
        with open(out_path, errors="replace") as f:
            out = f.read()
        with open(err_path, errors="replace") as f:
            err = f.read()
        os.unlink(out_path)
        os.unlink(err_path)
        print(json.dumps({"rc": rc, "stdout": out, "stderr": err, "hang": hang,
                          "seconds": time.monotonic() - start}), flush=True)


if __name__ == "__main__":
    serve()
