"""User-facing errors and warnings: a bad config, argument or file. The CLI prints an error's message on one line
and exits 2; a warning (``warn``) goes to stderr through the "hetfl" logger and the run goes on.

Warnings are about a run's input and conditions, so they are log records, not Python ``warnings`` (which are for
API deprecations, and hetfl deprecates none): silence them with
``logging.getLogger("hetfl").setLevel(logging.ERROR)``.
"""

import logging
import sys

LOGGER = "hetfl"  # the one logger of hetfl's warnings


class HetflError(Exception):
    """A problem with the user's input (config, flags, files); its message names the field and what is allowed."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


def warn(message: str) -> None:
    """Returns None; logs ``message`` as a hetfl warning: "hetfl: warning: <message on one line>" on stderr."""
    logging.getLogger(LOGGER).warning("%s", message)


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is at emit time, not when the handler was made: pytest's
    capsys/capfd and ``contextlib.redirect_stderr`` swap it."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        """Returns the current ``sys.stderr``."""
        return sys.stderr

    @stream.setter
    def stream(self, _):  # StreamHandler assigns its stream; ours is always the current one
        pass


class _OneLine(logging.Formatter):
    """hetfl's format of a record: "hetfl: <level>: <message on one line>"."""

    def format(self, record: logging.LogRecord) -> str:
        """Returns the record as one line, e.g. "hetfl: warning: ..."."""
        return f"hetfl: {record.levelname.lower()}: {' '.join(record.getMessage().split())}"


def _install() -> logging.Logger:
    """Returns the "hetfl" logger, with its stderr handler added unless it has it (a reloaded module adds none)."""
    log = logging.getLogger(LOGGER)
    if not any(getattr(h, "hetfl_stderr", False) for h in log.handlers):
        handler = _CurrentStderr()
        handler.hetfl_stderr = True
        handler.setFormatter(_OneLine())
        log.addHandler(handler)
        log.propagate = False  # the root logger's handlers would print each warning a second time
        if log.level == logging.NOTSET:  # shown whatever the root's level, unless the user set hetfl's
            log.setLevel(logging.WARNING)
    return log


_install()  # at import, under the import lock: once per process


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
