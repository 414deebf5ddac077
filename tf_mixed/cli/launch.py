"""``python -m tf_mixed launch N SCRIPT [ARGS ...]``: N local workers of one script."""

#     python -m tf_mixed launch 2 train.py --epochs=3
#     python -m tf_mixed launch --timeout=3600 2 -m mypackage.train
#
# Runs ``SCRIPT ARGS`` (or ``-m MODULE ARGS``) in N fresh Python processes on
# this machine as one TensorFlow cluster, with
# `tf_mixed.distribute.run_local_workers`: each gets its own ``TF_CONFIG``,
# their output is streamed as ``[worker i] ...``, and when one fails the
# others are stopped. Flags for the launcher come before N; everything after SCRIPT
# goes to the script unchanged. Bad input (N, a missing script, a flag) is one
# line on stderr and exit status 2, before any worker starts; a failed worker
# is exit status 1.

from __future__ import annotations

import math
import os
import sys

USAGE = """usage: python -m tf_mixed launch [--timeout=SECONDS] [--start_timeout=SECONDS]
                                 N SCRIPT.py [ARGS ...]
       python -m tf_mixed launch [flags] N -m MODULE [ARGS ...]

Runs SCRIPT in N local worker processes as one TensorFlow cluster on
127.0.0.1: each worker gets its own TF_CONFIG (so the script's
tf_mixed.distribute.multi_worker_strategy() or MultiWorkerMirroredStrategy()
finds the cluster), its output is printed as "[worker i] ...", and when one
worker fails the others are stopped. Exit status: 0 when every worker exited
0, 1 when one failed, 2 on bad input.

flags (before N):
  --timeout=SECONDS        stop every worker after this long (default: no limit)
  --start_timeout=SECONDS  each worker must start its TensorFlow server (create its
                           strategy) within this long, or all are stopped
                           (default 120; 0: no check)
"""

_FLAGS = ("timeout", "start_timeout")


class _Usage(ValueError):
    pass


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _Usage(f"--{name}={text!r}: not a number of seconds") from None
    if not value >= 0 or value == math.inf:
        raise _Usage(f"--{name}={text!r}: must be a finite number of seconds, at least 0")
    return value


def parse(args: list[str]) -> tuple[int, list[str], dict[str, float | None]]:
    """Reads ``[flags] N SCRIPT [ARGS ...]``.

    Args:
        args: The arguments after ``launch``.

    Returns:
        ``(num_workers, worker_argv, options)``: the worker command starts
        with ``sys.executable``; ``options`` are `run_local_workers`'s
        ``timeout`` and ``start_timeout``.

    Raises:
        ValueError: bad input, with a one-line message naming it.
    """
    options: dict[str, float | None] = {"timeout": math.inf, "start_timeout": 120.0}
    rest = list(args)
    while rest and rest[0].startswith("--"):
        name, equals, value = rest.pop(0)[2:].partition("=")
        if name not in _FLAGS:
            raise _Usage(f"unknown flag --{name}; launcher flags are --timeout and "
                         "--start_timeout, given before N (flags after SCRIPT go to the script)")
        if not equals:
            raise _Usage(f"--{name} needs a value: --{name}=SECONDS")
        seconds = _seconds(name, value)
        if name == "timeout":
            options[name] = seconds or math.inf
        else:
            options[name] = seconds or None
    if len(rest) < 2:
        raise _Usage("expected N and SCRIPT: python -m tf_mixed launch N SCRIPT.py [ARGS ...]")
    count, script, script_args = rest[0], rest[1], rest[2:]
    if not count.isdigit():
        raise _Usage(f"N={count!r}: the number of workers must be a whole number "
                     "(python -m tf_mixed launch 2 train.py)")
    if int(count) < 1:
        raise _Usage(f"N={int(count)}: must be at least 1, the number of workers "
                     "(python -m tf_mixed launch 2 train.py)")
    if script == "-m":
        if not script_args:
            raise _Usage("-m needs a MODULE: python -m tf_mixed launch 2 -m package.train")
        return int(count), [sys.executable, "-m", *script_args], options
    if not os.path.isfile(script):
        raise _Usage(f"SCRIPT={script!r}: no such file (from {os.getcwd()!r}); pass the "
                     "path of the Python script every worker runs, or -m MODULE")
    return int(count), [sys.executable, script, *script_args], options


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m tf_mixed launch``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments;
            None for ``sys.argv``.

    Returns:
        0 every worker exited 0, 1 one failed (the others were stopped),
        2 bad input (nothing started).
    """
    args = list(sys.argv if argv is None else argv)[1:]
    if args and args[0] in ("-h", "--help", "-help", "help"):
        print(USAGE)
        return 0
    try:
        num_workers, command, options = parse(args)
    except _Usage as error:
        print(f"tf_mixed launch: error: {error}", file=sys.stderr)
        return 2

    from tf_mixed.distribute import WorkersFailed, run_local_workers

    try:
        run_local_workers(num_workers, command, timeout=options["timeout"] or math.inf,
                          start_timeout=options["start_timeout"])
    except WorkersFailed as error:
        print(f"tf_mixed launch: {error}", file=sys.stderr)
        return 1
    return 0
