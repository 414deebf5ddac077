"""Progress lines: a heartbeat with its stage, absl's format, --quiet.

No test waits on time: the heartbeat's thread is driven with a tiny interval
and the test waits for the line itself (an Event), and elapsed time comes
from an injected clock.
"""

import re
import threading

import pytest

from tf_mixed._internal import progress
from tf_mixed.cli.main import main


@pytest.fixture
def progress_on(monkeypatch):
    monkeypatch.setattr(progress, "_enabled", True)
    monkeypatch.setattr(progress, "_current", None)


def test_line_names_the_work_its_stage_and_the_seconds():
    times = iter([100.0, 112.4])
    beat = progress.Heartbeat("tf_mixed bench", emit=lambda line: None, clock=lambda: next(times))
    beat.update("float32: round 3/~25 done, 1,234 samples/s, step 65/500")
    assert beat.line() == (
        "tf_mixed bench: float32: round 3/~25 done, 1,234 samples/s, step 65/500 (12 s)")


def test_heartbeat_logs_the_current_stage_until_the_work_ends(progress_on):
    lines, seen = [], threading.Event()

    def emit(line):
        lines.append(line)
        seen.set()

    with progress.heartbeat("tf_mixed probe", interval=0.001, emit=emit) as beat:
        assert beat is not None
        progress.update("step 2/3: running the layers")
        seen.clear()
        assert seen.wait(60)  # the next line carries the new stage
        with progress.heartbeat("nested", emit=emit) as inner:
            assert inner is None  # one heartbeat at a time; update reaches the outer one
    count = len(lines)
    assert re.fullmatch(r"tf_mixed probe: step 2/3: running the layers \(\d+ s\)", lines[-1])
    assert not beat._thread.is_alive() and len(lines) == count  # stopped with the block


def test_off_means_no_heartbeat(progress_on):
    assert progress.enabled()
    progress.set_enabled(False)  # what --quiet does (the fixture restores the setting)
    assert not progress.enabled()
    with progress.heartbeat("x", emit=pytest.fail) as beat:
        assert beat is None
    progress.update("ignored")  # no heartbeat: nothing to update, no error


def test_lines_are_plain_lines_on_stderr(capsys):
    # No absl prefix (level, date, thread id, file:line): the line as a person reads it.
    progress._plain_line("tf_mixed bench: float32: warm-up done (5 steps) (7 s)")
    assert capsys.readouterr().err == "tf_mixed bench: float32: warm-up done (5 steps) (7 s)\n"


@pytest.mark.slow
@pytest.mark.parametrize("argv, beats", [(["info"], 1), (["info", "--quiet"], 0),
                                         (["--quiet", "--help"], 0)])
def test_every_command_gets_a_heartbeat_unless_quiet(argv, beats, progress_on, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(progress.Heartbeat, "start",
                        lambda self: started.append(self.label) or self)
    monkeypatch.setattr(progress.Heartbeat, "stop", lambda self: None)
    assert main(["tf_mixed", *argv]) == 0
    assert started == ["tf_mixed info"] * beats
    capsys.readouterr()


def test_an_event_said_at_once_is_one_line(progress_on, capsys):
    """Issue 46: check printed each progress line twice (its own, then the heartbeat's)."""
    times = iter([0.0, 7.0, 9.0])
    beat = progress.Heartbeat("tf_mixed check", emit=lambda line: None, clock=lambda: next(times))
    progress._current = beat
    progress.say("[check] part 1: tf_mixed.LossScaleOptimizer on 2 replicas")
    assert capsys.readouterr().err == "[check] part 1: tf_mixed.LossScaleOptimizer on 2 replicas\n"
    assert beat.line() == "tf_mixed check: still working (7 s)"  # not the event again
    progress.update("part 3: timing")
    assert beat.line() == "tf_mixed check: part 3: timing (9 s)"
    progress.set_enabled(False)
    progress.say("[check] quiet")
    assert capsys.readouterr().err == ""
