"""Progress lines for command-line work that takes more than a few seconds."""

# `heartbeat(label)` starts a daemon thread that writes a plain line to stderr
# (no log prefix) at least every `INTERVAL_S` seconds while the work runs: the label, what
# the work last said it was doing (`update`) and the seconds so far. A command
# sets its stage with `update("round 3/25: float32 ...")`; ``--quiet`` turns the
# lines off (`set_enabled(False)`), and so does ``TF_MIXED_PROGRESS=0`` in the
# environment (the test suite sets it, so no test sees a line it did not ask
# for). Only the standard library.

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Iterator

INTERVAL_S = 5.0
_enabled = os.environ.get("TF_MIXED_PROGRESS", "1").strip() != "0"
_current: "Heartbeat | None" = None


def set_enabled(enabled: bool) -> None:
    """Turns progress lines on or off for this process (``--quiet``: off)."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    """Whether progress lines are on."""
    return _enabled


def _plain_line(line: str) -> None:
    """Writes ``line`` to stderr as it is: no log prefix (level, time, thread id)."""
    print(line, file=sys.stderr, flush=True)


class Heartbeat:
    """The stage of one piece of work, logged every ``interval`` seconds.

    Args:
        label: What runs, e.g. "tf_mixed bench".
        interval: Seconds between lines.
        emit: Where a line goes (a plain line on stderr by default).
        clock: Seconds, for the elapsed time shown.
    """

    def __init__(self, label: str, interval: float = INTERVAL_S,
                 emit: Callable[[str], None] = _plain_line,
                 clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.interval = interval
        self.emit = emit
        self.clock = clock
        self.stage = "starting"
        self.said = False  # the stage was written at once (`say`): not repeated
        self._start = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tf_mixed-progress", daemon=True)

    def line(self) -> str:
        """The line logged now (a stage already written by `say` is not repeated)."""
        stage = "still working" if self.said else self.stage
        return f"{self.label}: {stage} ({self.clock() - self._start:.0f} s)"

    def update(self, stage: str, *, said: bool = False) -> None:
        self.stage = stage
        self.said = said

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.emit(self.line())

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def heartbeat(label: str, *, interval: float = INTERVAL_S,
              emit: Callable[[str], None] = _plain_line) -> Iterator[Heartbeat | None]:
    """Logs ``label`` and the current stage every ``interval`` s while the block runs.

    Yields:
        The `Heartbeat`, or None when progress lines are off (or one already runs:
        the outer one keeps going and `update` reaches it).
    """
    global _current
    if not _enabled or _current is not None:
        yield None
        return
    beat = Heartbeat(label, interval, emit).start()
    _current = beat
    try:
        yield beat
    finally:
        _current = None
        beat.stop()


def update(stage: str) -> None:
    """Sets what the running heartbeat says the work is doing (no-op without one)."""
    if _current is not None:
        _current.update(stage)


def say(line: str) -> None:
    """Writes one progress line for an event now (when lines are on).

    The running heartbeat then says only that the work goes on ("still
    working"), so each event is one line.
    """
    if _enabled:
        _plain_line(line)
    if _current is not None:
        _current.update(line, said=True)
