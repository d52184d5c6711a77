"""The one user-facing error type.

Anything the user can get wrong (a missing file, a corrupt record, a bad config value)
is raised as `KitError`; the CLI prints it as a single line and exits with code 2.
Everything else is a bug in the kit and keeps its traceback.
"""

EXIT_USAGE = 2


class KitError(Exception):
    """A bad input, reported as one line naming the file or key at fault."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
