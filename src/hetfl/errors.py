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


def read_text_file(path, what: str) -> str:
    """The UTF-8 text of the file ``path``; HetflError naming ``what`` when it is missing, a folder, unreadable or
    not UTF-8."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HetflError(f"{what} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise HetflError(f"{what} cannot be read: {e.strerror or e}") from None
