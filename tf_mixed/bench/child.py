"""One policy's training process: ``python -m tf_mixed.bench.child CONFIG POLICY``.

`tf_mixed.bench.compare` starts one per policy (``--workers`` per policy under
``--strategy=multiworker``, joined by ``TF_CONFIG``). The child reads the
`BenchConfig` from the JSON file CONFIG, trains POLICY with
`tf_mixed.bench.run.run_policy` and writes the result JSON to ``--part``
(atomically; workers other than the chief get no ``--part``). Bad input is
written as one line to ``--error_file`` for the parent to print, with exit
status 2; any other failure prints its traceback and exits 1.

It sets up TensorFlow itself, before anything else touches its runtime, so
the CPU can still be split into logical devices for ``--strategy=mirrored``.
"""

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
    return parser.parse_args(argv)


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
    from tf_mixed.bench import run
    from tf_mixed.bench.config import BenchConfig
    from tf_mixed._internal.cli_errors import UsageError

    with open(args.config) as f:
        fields = json.load(f)
    fields["policies"] = tuple(fields["policies"])
    config = BenchConfig(**fields)
    try:
        with quiet.summarised_tf_warnings(args.verbose, "bench"):
            if config.strategy == "mirrored":
                run.split_cpu_for_replicas(config.replicas)
            result = run.run_policy(config, args.policy, verbose=bool(args.part))
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
