"""Keep framework C++ chatter (TensorFlow's absl/oneDNN lines) off the user's terminal.

TensorFlow's native logger writes to file descriptor 2 whatever TF_CPP_MIN_LOG_LEVEL says.
`divert_native_stderr(path)` points fd 2 at `path` (kept with the run's outputs, so
nothing is lost) while Python's `sys.stderr` keeps the original stream, so the kit's own
messages, one-line errors included, still reach the user.
"""

from __future__ import annotations

import os
import sys

_diverted = False


def divert_native_stderr(path: str | os.PathLike = os.devnull) -> None:
    global _diverted
    if _diverted:
        return
    sys.stderr.flush()
    original = os.dup(2)
    sys.stderr = os.fdopen(original, "w", buffering=1, closefd=True)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 2)
    os.close(target)
    _diverted = True
