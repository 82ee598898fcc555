"""hetfl's warnings go through the "hetfl" logger: one line on the current stderr, once, silenced by its level."""

import contextlib
import io
import logging
import subprocess
import sys

import pytest

from hetfl import errors
from hetfl.errors import warn


@pytest.fixture
def hetfl_logger():
    """The "hetfl" logger, its level and handlers restored after the test."""
    log = logging.getLogger(errors.LOGGER)
    level, handlers = log.level, list(log.handlers)
    yield log
    log.setLevel(level)
    log.handlers[:] = handlers


def test_a_warning_is_one_line_in_hetfls_format(capsys):
    warn("the data\n   has   gaps;\tgoing on")
    warn(42)  # not text: written as str() writes it
    captured = capsys.readouterr()
    assert captured.err == "hetfl: warning: the data has gaps; going on\nhetfl: warning: 42\n"
    assert captured.out == ""
    warn("100% of %s clients")  # no %-formatting of the message
    assert capsys.readouterr().err == "hetfl: warning: 100% of %s clients\n"


def test_the_handler_writes_to_stderr_as_it_is_when_warning(capfd):
    swapped = io.StringIO()
    with contextlib.redirect_stderr(swapped):
        warn("into the swapped stream")
    assert swapped.getvalue() == "hetfl: warning: into the swapped stream\n"
    warn("and back")
    assert capfd.readouterr().err == "hetfl: warning: and back\n"


def test_the_level_switch_silences_warnings(capsys, hetfl_logger):
    hetfl_logger.setLevel(logging.ERROR)
    warn("not shown")
    assert capsys.readouterr().err == ""
    hetfl_logger.setLevel(logging.WARNING)
    warn("shown")
    assert capsys.readouterr().err == "hetfl: warning: shown\n"


def test_no_double_printing_through_the_root_logger(capsys, hetfl_logger):
    root = logging.getLogger()
    echo = logging.StreamHandler(sys.stderr)  # an application's own handler on the root logger
    root.addHandler(echo)
    try:
        warn("once")
    finally:
        root.removeHandler(echo)
    assert capsys.readouterr().err == "hetfl: warning: once\n"
    errors._install()  # installing again adds no second handler
    assert sum(getattr(h, "hetfl_stderr", False) for h in hetfl_logger.handlers) == 1
    assert hetfl_logger.propagate is False


def test_a_fresh_process_warns_on_stderr_only():
    done = subprocess.run([sys.executable, "-c", "from hetfl.errors import warn; warn('fresh  process')"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "hetfl: warning: fresh process\n"
