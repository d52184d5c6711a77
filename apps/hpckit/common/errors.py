"""The one user-facing error type, and the exit codes a script can rely on.

Anything the user can get wrong (a missing file, a corrupt record, a bad config value)
is raised as `KitError`; the CLI prints it as a single line and exits with code 2.
Everything else is a bug in the kit and keeps its traceback.

Exit codes of every subcommand (README "Exit codes"):
  0  success: trained to the target; a check/score verdict that passes
  1  a verdict that does not pass (check: NOT COMPLIANT; score: an invalid set)
  2  bad input: one line on stderr naming the file or key
  3  `hpckit train` ran to its end but did not reach the target (run_stop aborted:
     epochs used up, step-limited, diverged)
  130 interrupted (Ctrl-C); 143 stopped by SIGTERM (scancel, a launcher tearing down)
"""

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
