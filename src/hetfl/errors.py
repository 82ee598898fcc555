"""User-facing errors and warnings: a bad config, argument or file. The CLI prints an error's message on one line
and exits 2; a warning (``warn``) goes to stderr through the "hetfl" logger and the run goes on.

Warnings are about a run's input and conditions, so they are log records, not Python ``warnings`` (which are for
API deprecations, and hetfl deprecates none): silence them with
``logging.getLogger("hetfl").setLevel(logging.ERROR)``.
"""

import logging
import sys
from contextlib import contextmanager

LOGGER = "hetfl"  # the one logger of hetfl's warnings


class HetflError(Exception):
    """A problem with the user's input (config, flags, files); its message names the field and what is allowed."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


_held: list[logging.LogRecord] | None = None  # a command's set-up warnings, while it may still be refused


@contextmanager
def set_up_warnings_held():
    """Holds hetfl's warnings while a command is set up. Refused there (HetflError), the command prints its one
    error line alone; otherwise its warnings are printed when its work starts (``release_warnings``) or at its end.
    (A dataset whose test classes lack training samples, refused for having fewer samples than clients, is one
    line, not a warning and an error.)"""
    global _held
    _held = []
    try:
        yield
    except HetflError:
        _held = None
        raise
    finally:
        release_warnings()


def release_warnings() -> None:
    """Returns None; prints the warnings held since ``set_up_warnings_held`` began, and stops holding them."""
    global _held
    held, _held = _held, None
    for record in held or ():
        logging.getLogger(LOGGER).handle(record)


def _hold(record: logging.LogRecord) -> bool:
    """The logger's filter: False (held, not printed now) while a command is being set up."""
    if _held is None:
        return True
    _held.append(record)
    return False


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
        log.addFilter(_hold)
        log.propagate = False  # the root logger's handlers would print each warning a second time
        if log.level == logging.NOTSET:  # shown whatever the root's level, unless the user set hetfl's
            log.setLevel(logging.WARNING)
    return log


_install()  # at import, under the import lock: once per process


def spans(indices, limit: int | None = None) -> str:
    """Increasing integers ``indices`` as compact ranges, "3, 10..199" (the first ``limit`` ranges, then "...")."""
    ranges: list[list[int]] = []
    for i in indices:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    text = [f"{a}..{b}" if b > a else str(a) for a, b in ranges[:limit]]
    return ", ".join(text + (["..."] if limit is not None and len(ranges) > limit else []))


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
