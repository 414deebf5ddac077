"""One policy's training process: ``python -m tf_mixed.bench.child CONFIG POLICY``."""

# `tf_mixed.bench.compare` starts one per policy (``--workers`` per policy under
# ``--strategy=multiworker``, joined by ``TF_CONFIG``). The child reads the
# `BenchConfig` from the JSON file CONFIG, trains POLICY with
# `tf_mixed.bench.run.run_policy` and writes the result JSON to ``--part``
# (atomically; workers other than the chief get no ``--part``). Bad input is
# written as one line to ``--error_file`` for the parent to print, with exit
# status 2; any other failure prints its traceback and exits 1.
#
# ``--plan_file`` holds the job's per-layer plan for the "plan" policy (made once
# by the parent, so every process and worker trains the same plan).
#
# With ``--control_fd`` the parent paces the training (`PipeGate`): the child
# writes one JSON line per segment to that file descriptor (``{"ready": true}``
# once built, then ``{"times": [...], "finished": bool}``) and reads from stdin
# the number of steps to run next (0: stop now); after its last segment it
# waits for one more line before the census, the serving figures and the file.
#
# It sets up TensorFlow itself, before anything else touches its runtime, so
# the CPU can still be split into logical devices for ``--strategy=mirrored``.

from __future__ import annotations

import argparse
import json
import os
import sys


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tf_mixed.bench.child",
        description="Trains one policy of a bench run (started by python -m tf_mixed bench).",
    )
    parser.add_argument("config", help="JSON file with the BenchConfig fields")
    parser.add_argument("policy", help="canonical policy name")
    parser.add_argument("--part", default="", help="where to write the result JSON")
    parser.add_argument("--error_file", default="", help="where to write a bad-input error")
    parser.add_argument("--verbose", action="store_true", help="TensorFlow's C++ log too")
    parser.add_argument("--control_fd", type=int, default=-1,
                        help="file descriptor for segment reports; steps are read from stdin")
    parser.add_argument("--plan_file", default="",
                        help="the job's per-layer plan (JSON) for the 'plan' policy")
    return parser.parse_args(argv)


class PipeGate:
    """A `tf_mixed.bench.train.Gate` paced by the parent through a pipe and stdin."""

    def __init__(self, control_fd: int):
        self.out = os.fdopen(control_fd, "w")

    def _send(self, message: dict) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def _read(self) -> int:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit("tf_mixed bench: the parent process went away")
        return int(line)

    def begin(self) -> int:
        self._send({"ready": True})
        return self._read()

    def report(self, times, finished: bool) -> None:
        self._send({"times": list(times), "finished": finished})
        if finished:
            self._read()  # wait until every policy has finished training

    def next(self) -> int:
        return self._read()


def main(argv: list[str] | None = None) -> int:
    """Runs one policy.

    Args:
        argv: The arguments after the program name; None for ``sys.argv[1:]``.

    Returns:
        The exit status: 0 success, 2 bad input (message in ``--error_file``).
    """
    args = _parse(sys.argv[1:] if argv is None else argv)
    from tf_mixed._internal import quiet

    quiet.import_tensorflow(args.verbose)
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed.bench import run
    from tf_mixed.bench.config import BenchConfig

    with open(args.config) as f:
        fields = json.load(f)
    fields["policies"] = tuple(fields["policies"])
    config = BenchConfig(**fields)
    try:
        with quiet.summarised_tf_warnings(args.verbose, "bench"):
            if config.strategy == "mirrored":
                run.split_cpu_for_replicas(config.replicas)
            gate = PipeGate(args.control_fd) if args.control_fd >= 0 else None
            plan_record = None
            if args.plan_file:
                with open(args.plan_file) as f:
                    plan_record = json.load(f)
            result = run.run_policy(config, args.policy,
                                    verbose=bool(args.part) and not config.quiet, gate=gate,
                                    plan_record=plan_record)
    except UsageError as error:
        if args.error_file:
            with open(args.error_file, "w") as f:
                f.write(str(error))
        else:
            print(f"tf_mixed bench: error: {error}", file=sys.stderr)
        return 2
    if args.part:
        tmp = args.part + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, allow_nan=False)
        os.replace(tmp, args.part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
