"""``python -m tf_mixed check``: prove tf_mixed on this host's own devices."""

#     python -m tf_mixed check [--output=check.json] [--budget=2]
#                              [--parts=tf_mixed,keras,throughput,defects]
#
# Prints a table per part (see `tf_mixed.tools.check.scenarios`), writes every figure to
# ``--output`` as JSON (atomically: a temporary file, then a rename), and exits
# 0 only when every tf_mixed correctness check passed, 1 when one failed, 2 on
# bad input or when no MirroredStrategy can be built here (one line on stderr).

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from typing import Iterator

from absl import flags

from tf_mixed._internal import measuring, progress, quiet
from tf_mixed._internal.cli_errors import UsageError

PARTS = ("tf_mixed", "keras", "throughput", "defects")
_OK, _FAIL = "ok", "FAIL"


USAGE = """usage: python -m tf_mixed check [--output=FILE] [--budget=2] [--parts=PART,...]

Checks, on this host's devices, that an overflow on any one replica is skipped
on every replica, compares Keras's own loss-scale optimizer, and times each
policy (the median of interleaved rounds with its 90% interval)."""


def _define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("output", "", "Write the results as JSON to this file.", flag_values=fv)
    flags.DEFINE_float("budget", 2.0, "Seconds for the throughput timing rounds, in (0, 60].",
                       flag_values=fv)
    flags.DEFINE_list("parts", list(PARTS), f"Parts to run, of {', '.join(PARTS)} "
                      "(tf_mixed always runs).", flag_values=fv)


def _parse(argv: list[str]) -> flags.FlagValues | int:
    """The flags, checked before TensorFlow loads; or the exit status to return at once."""
    from tf_mixed.cli import model_command

    fv = flags.FlagValues()
    _define_flags(fv)
    if any(a in model_command.HELP_FLAGS for a in argv):
        print(USAGE)
        print(fv.get_help())
        return 0
    try:
        positionals = fv(["check", *argv])[1:]
    except flags.Error as error:
        return _error(model_command.flag_error(error, fv))
    if positionals:
        return _error(f"unexpected argument {positionals[0]!r}; flags look like --parts=tf_mixed")
    try:
        _check(fv)
    except UsageError as error:
        return _error(str(error))
    return fv


def _check(fv: flags.FlagValues) -> None:
    parts = tuple(p.strip() for p in fv.parts if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise UsageError("parts", ",".join(fv.parts), f"unknown part {unknown[0]!r}",
                         ", ".join(PARTS))
    fv["parts"].value = list(parts)
    if not fv.budget > 0 or fv.budget > 60:
        raise UsageError("budget", fv.budget, "must be a number of seconds in (0, 60]")
    if fv.output:
        directory = os.path.dirname(os.path.abspath(fv.output))
        if not os.path.isdir(directory):
            raise UsageError("output", fv.output, f"directory {directory!r} does not exist")
        if os.path.isdir(fv.output):
            raise UsageError("output", fv.output, "is a directory",
                             fix="Pass a file path such as check.json.")
        try:  # a real write: os.access answers yes to root even where it cannot write
            fd, trial = tempfile.mkstemp(dir=directory, prefix=".check-", suffix=".tmp")
            os.close(fd)
            os.unlink(trial)
        except OSError as error:
            raise UsageError(
                "output", fv.output,
                f"directory {directory!r} is not writable ({error.strerror or error})") from None


def _table(title: str, result_rows: list[tuple[str, list[str]]], header: list[str]) -> str:
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([label] + cells) + " |" for label, cells in result_rows]
    return "\n".join(lines)


def _scenario_table(title: str, scenarios) -> str:
    from tf_mixed.tools.check import scenarios as selfcheck

    header = ["check"] + [f"replica {s.bad_replica} overflows" for s in scenarios]
    rows = [
        (text, [_OK if s.checks[key] else _FAIL for s in scenarios])
        for key, text in selfcheck.CHECKS
    ]
    return _table(title, rows, header)


def render(result, info) -> str:
    """The stdout report for a `selfcheck.CheckResult`."""
    import keras
    import tensorflow as tf

    from tf_mixed.policy import model_check

    parts = [
        f"tf_mixed check: TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"Python {platform.python_version()}; CPU {info.cpu_model or 'unknown'}; "
        f"GPUs: {', '.join(g.name for g in info.gpus) or 'none'}",
        f"MirroredStrategy over {', '.join(result.devices)} ({len(result.devices)} replicas)",
        "",
        _scenario_table(
            "1. tf_mixed.LossScaleOptimizer, inf injected into one replica's gradients",
            result.tf_mixed,
        ),
        "",
        "=> PASS: every replica skipped the step and the next finite step applied "
        "identically" if result.passed else
        "=> FAIL: tf_mixed did not keep every replica consistent (see the FAIL rows)",
    ]
    if result.keras:
        bad = [s.bad_replica for s in result.keras
               if not (s.checks["weights_finite"] and s.checks["weights_unchanged"])]
        parts += [
            "",
            _scenario_table("2. keras.optimizers.LossScaleOptimizer, the same scenario",
                            result.keras),
            "",
            "=> Keras's optimizer "
            + (f"corrupts the weights on this TF/Keras when replica(s) "
               f"{', '.join(map(str, bad))} overflow" if bad else
               "no longer corrupts the weights on this TF/Keras")
            + " (reported; it does not change the exit status)",
        ]
    if result.throughput is not None:
        t = result.throughput
        rows = [
            (name, [f"{seconds * 1000:.2f}", *_ratio_cells(t, name)])
            for name, seconds in t.seconds_per_step.items()
        ]
        parts += [
            "",
            _table("3. Throughput: probe training step (Dense + Conv2D, forward and backward)",
                   rows, ["policy", "ms/step", "vs float32", "90% interval (paired rounds)"]),
            "",
            f"=> enable('auto') picks {t.auto_policy}: {t.auto_reason}",
            "   measured on: the probe above (one Dense, one Conv2D), not a model of yours; "
            + model_check.when_checked(),
        ]
    if result.defects:
        rows = [(d.spec.key, ["-" if d.present is None else ("present" if d.present else "absent"),
                              "yes" if d.neutralised else "no", d.spec.reference])
                for d in result.defects]
        parts += [
            "",
            _table(f"4. Known mixed-precision defects of Keras {keras.__version__} / "
                   f"TensorFlow {tf.__version__}, reproduced on fakes",
                   rows, ["defect", "here", "tf_mixed neutralises", "reference"]),
            "",
            *(f"- {d.spec.key}: {d.spec.title}. Here: {d.detail}. Remedy: {d.spec.remedy}."
              for d in result.defects),
        ]
    parts += ["", "Result: " + ("PASS" if result.passed else "FAIL")]
    return "\n".join(parts)


def _write_json_atomically(path: str, payload: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".check-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _ratio_cells(throughput, name: str) -> list[str]:
    """The "vs float32" and interval cells: a ratio where its interval answers
    "faster here, and by about how much", else "no ratio" beside the interval."""
    estimate = throughput.estimates.get(name)
    if estimate is None:  # float32 itself
        return [f"{throughput.speedups[name]:.2f}x", "-"]
    interval = f"{estimate.low:.2f}-{estimate.high:.2f}x over {estimate.pairs} round(s)"
    if estimate.answers():
        return [f"{estimate.median:.2f}x", interval]
    return ["no ratio", interval + (" (too few rounds: raise --budget)"
                                    if estimate.pairs < measuring.MIN_PAIRS else " (holds 1)")]


def _error(message: str) -> int:
    print(f"tf_mixed check: error: {message}", file=sys.stderr)
    return 2


def _progress_line(line: str) -> None:
    progress.say(f"[check] {line}")  # once; the heartbeat then says only "still working"


def main(argv: list[str]) -> int:
    """Runs the check.

    Args:
        argv: The arguments after ``check`` (no program name).

    Returns:
        0 every tf_mixed check passed, 1 one failed, 2 bad input or no
        MirroredStrategy possible here.
    """
    args = _parse(list(argv))
    if isinstance(args, int):
        return args
    from tf_mixed.cli import model_command

    model_command.import_tensorflow()  # once the arguments are read
    from tf_mixed.tools.check import scenarios as selfcheck

    selfcheck.prepare_devices()  # before anything initialises TensorFlow

    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed import __version__
    from tf_mixed.policy import hardware

    start = time.perf_counter()
    # The scenarios overflow and skip steps on purpose, so tf_mixed warns as it
    # should, and they call the same tf.function in many set-ups, so TensorFlow
    # logs that it retraces: both held back while they run, shown only if the
    # check fails (TensorFlow's log also with --verbose).
    with warnings.catch_warnings(record=True) as raised, _held_tf_log() as logged:
        warnings.simplefilter("always", tf_mixed.callbacks.MixedPrecisionWarning)
        try:
            result = _run_parts(args, selfcheck)
        except selfcheck.StrategyUnavailable as error:
            return _error(str(error))
    info = hardware.detect()
    print(render(result, info))
    _show_warnings(raised, shown_all=not result.passed)
    if not result.passed or quiet.is_verbose():
        for record in logged:
            logging.getLogger("tensorflow").handle(record)
    if args.output:
        payload = dict(
            result.to_json(),
            format=1,
            seconds=round(time.perf_counter() - start, 2),
            versions={"tf_mixed": __version__, "tensorflow": tf.__version__,
                      "keras": keras.__version__, "python": platform.python_version()},
            host={"cpu_model": info.cpu_model,
                  "gpus": [{"name": g.name, "compute_capability": g.compute_capability}
                           for g in info.gpus]},
        )
        try:
            _write_json_atomically(args.output, payload)
        except OSError as error:
            return _error(f"--output={args.output!r}: cannot write: {error}")
        print(f"Wrote {args.output}")
    return 0 if result.passed else 1


def _run_parts(args, selfcheck):
    """The scenarios, then (with the defects part) the upstream defects."""
    result = selfcheck.run_check(parts=args.parts, budget_s=args.budget, progress=_progress_line)
    if "defects" in args.parts:
        import dataclasses

        from tf_mixed.tools.check import upstream_defects
        from tf_mixed.training import shared_mirrored_strategy

        _progress_line("part 4: known defects of the installed Keras/TensorFlow")
        strategy = shared_mirrored_strategy(list(result.devices))  # the one run_check used
        result = dataclasses.replace(result, defects=upstream_defects.run(strategy))
    return result


class _Holding(logging.Handler):
    def __init__(self, held: list[logging.LogRecord]):
        super().__init__(logging.WARNING)
        self.held = held

    def emit(self, record: logging.LogRecord) -> None:
        self.held.append(record)


@contextlib.contextmanager
def _held_tf_log() -> Iterator[list[logging.LogRecord]]:
    """Holds back the records of TensorFlow's Python logger (its own handlers
    included) while the block runs; yields the list they are kept in."""
    logger = logging.getLogger("tensorflow")
    held: list[logging.LogRecord] = []
    saved = (list(logger.handlers), logger.propagate)
    logger.handlers = [_Holding(held)]
    logger.propagate = False
    try:
        yield held
    finally:
        logger.handlers, logger.propagate = saved


def _show_warnings(raised, *, shown_all: bool) -> None:
    """Shows the warnings a run held back: tf_mixed's own only when the check failed."""
    import tf_mixed

    for record in raised:
        if shown_all or not issubclass(record.category, tf_mixed.callbacks.MixedPrecisionWarning):
            warnings.showwarning(record.message, record.category, record.filename, record.lineno)
