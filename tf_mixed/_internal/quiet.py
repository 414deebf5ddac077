"""Keeps TensorFlow's start-up chatter off a normal run's stderr."""

# TensorFlow 2.21 logs its C++ start-up lines (oneDNN, cudart, cpu_feature_guard)
# through absl before its log level applies, so ``TF_CPP_MIN_LOG_LEVEL`` alone
# does not hide them; `import_tensorflow` imports TensorFlow with file
# descriptor 2 caught and writes back every line that is not such a log line.
# ``TF_CPP_MIN_LOG_LEVEL`` (set by `set_log_level` before the import, and passed
# to every child process) hides the later ones, such as the failed cuInit on a
# host without a GPU. `summarised_tf_warnings` turns Python warnings raised
# inside TensorFlow and Keras into one line at the end. ``--verbose`` lets
# everything through.

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from typing import Iterator, MutableMapping

LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LOG_LEVEL = "3"  # errors too: a real failure reaches the user as a Python exception
VERBOSE_LOG_LEVEL = "0"

# "I0000 00:00:1795330598.903093    8612 port.cc:153] ..." (absl's C++ log prefix).
_TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.\-/]+:\d+\] ")
_TF_LOG_EXTRAS = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",  # second line of cpu_feature_guard's message
)
_TF_PACKAGES = ("tensorflow", "keras", "tf_keras", "tensorflow_datasets")


def set_log_level(environ: MutableMapping[str, str], verbose: bool) -> None:
    """Sets ``TF_CPP_MIN_LOG_LEVEL`` in ``environ``; a level the user set is kept unless verbose."""
    if verbose:
        environ[LOG_LEVEL_VARIABLE] = VERBOSE_LOG_LEVEL
    else:
        environ.setdefault(LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL)


def is_tf_log_line(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's C++ log lines."""
    return bool(_TF_LOG_LINE.match(line)) or line.startswith(_TF_LOG_EXTRAS)


_verbose = False  # what `defer` was told: the command line's --verbose


def defer(verbose: bool) -> None:
    """Sets the log level and remembers ``verbose`` for a later `import_tensorflow`.

    The command line calls this first and imports TensorFlow only once a
    command's arguments are parsed, so ``--help`` and bad arguments answer at
    once (TensorFlow's import takes seconds).
    """
    global _verbose
    _verbose = bool(verbose)
    set_log_level(os.environ, _verbose)


def is_verbose() -> bool:
    """What `defer` was told: whether the command line was given ``--verbose``."""
    return _verbose


def import_tensorflow(verbose: bool | None = None) -> None:
    """Sets the log level, then imports TensorFlow and Keras without their C++ log lines.

    Args:
        verbose: Let every line through; None: what `defer` was told.
    """
    verbose = _verbose if verbose is None else verbose
    set_log_level(os.environ, verbose)
    if verbose or "tensorflow" in sys.modules:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import keras  # noqa: F401
            import tensorflow as tf

            tf.config.list_physical_devices()  # loads the device plug-ins (cudart, cuInit)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", errors="replace")
    kept = [line for line in text.splitlines() if not is_tf_log_line(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)


def _from_tf(filename: str) -> bool:
    parts = os.path.normpath(filename or "").split(os.sep)
    return any(package in parts for package in _TF_PACKAGES)


class _Holding(logging.Filter):
    """A filter on TensorFlow's logger: a warning or worse is kept, not shown.

    A logger's filter runs before any of its handlers (TensorFlow adds its own
    stream handler to the "tensorflow" logger, which propagation settings do
    not reach), so a record held here is shown by none of them, and the
    summary line is the only time the user hears of it.
    """

    def __init__(self, caught: list[str]):
        super().__init__()
        self.caught = caught

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        self.caught.append(f"{record.levelname.lower()}: {record.getMessage()}")
        return False


@contextlib.contextmanager
def summarised_tf_warnings(verbose: bool, command: str) -> Iterator[list[str]]:
    """Holds back warnings raised inside TensorFlow/Keras and prints one line about them.

    Warnings from tf_mixed and user code pass through unchanged.

    Args:
        verbose: Do nothing: every warning is shown as usual.
        command: The command name for the summary line, e.g. ``"bench"``.

    Yields:
        The list the held-back warnings are collected in.
    """
    caught: list[str] = []
    if verbose:
        yield caught
        return
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if _from_tf(filename):
            caught.append(f"{category.__name__}: {str(message).strip()}")
        else:
            original(message, category, filename, lineno, file, line)

    tf_logger = logging.getLogger("tensorflow")
    holding = _Holding(caught)
    tf_logger.addFilter(holding)
    warnings.showwarning = show
    try:
        yield caught
    finally:
        warnings.showwarning = original
        tf_logger.removeFilter(holding)
        if caught:
            first = caught[0].splitlines()[0][:160]
            print(
                f"tf_mixed {command}: {len(caught)} TensorFlow/Keras warning(s) hidden "
                f"(first: {first}); --verbose shows them.",
                file=sys.stderr,
            )
