"""The one user-facing error type, and the exit codes a script can rely on.

Anything the user can get wrong (a missing file, a corrupt record, a bad config value)
is raised as `KitError`; the CLI prints it as a single line and exits with code 2.
Everything else is a bug in the kit and keeps its traceback.

Exit codes of every subcommand (docs/commands.md "Exit codes"):
  0  success: trained to the target; a check/score verdict that passes
  1  a verdict that does not pass (check: NOT COMPLIANT; score: an invalid set)
  2  bad input: one line on stderr naming the file or key
  3  `hpckit train` ran to its end but did not reach the target (run_stop aborted:
     epochs used up, step-limited, diverged)
  130 interrupted (Ctrl-C); 143 stopped by SIGTERM (scancel, a launcher tearing down)
"""

import errno

EXIT_USAGE = 2
EXIT_NOT_CONVERGED = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class KitError(Exception):
    """A bad input, reported as one line naming the file or key at fault."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class Terminated(KitError):
    """The launcher asked this rank to stop (another rank failed, or the job was cancelled)."""


# a full, over-quota or read-only file system, or a file grown past its limit: bad input
# of the place a command was told to write to, reported as one line (disk_error)
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def is_disk_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in DISK_ERRNOS


def disk_error(e: OSError, path=None) -> KitError:
    """A full, over-quota or read-only file system as one line naming the file written."""
    where = path if path is not None else getattr(e, "filename", None)
    return KitError(f"{where if where is not None else 'writing'}: {e.strerror or e} "
                    f"(the file system is full, over quota or read-only; nothing was overwritten)")
