"""User-facing errors: a bad config, argument or file. The CLI prints the message on one line and exits 2."""


class HetflError(Exception):
    """A problem with the user's input (config, flags, files); its message names the field and what is allowed."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


def warn(message: str) -> None:
    """Returns None; prints ``message`` on one line to stderr as a hetfl warning (the run goes on)."""
    import sys

    print(f"hetfl: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
