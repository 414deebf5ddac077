"""What the subcommands taking a saved model share (``probe``, ``doctor``).

`parse` reads ``MODEL.keras [--flag=value ...]`` into a ``FlagValues``;
`error` prints the one line of bad input; `write_atomically` puts a result
file in place only once it is complete.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, Sequence

from absl import flags

from tf_mixed._internal import progress, quiet

# What asks a command for its help (absl's spellings and argparse's -h).
HELP_FLAGS = ("-h", "--help", "-help", "--helpfull")


def define_data_flags(fv: flags.FlagValues, batches: int, batches_help: str) -> None:
    """The flags naming the data, the batches and the loss (what `batches` of
    `tf_mixed.cli.probe` reads): --dataset, --data_dir, --batch_size,
    --batches, --loss, --seed."""
    from tf_mixed.commands import names

    flags.DEFINE_string("dataset", "shapes",
                        f"Data: {names.DATA_ACCEPTED}, or npz:PATH with arrays x and y.",
                        flag_values=fv)
    flags.DEFINE_string("data_dir", "", "TFDS data directory (default: TFDS's own).",
                        flag_values=fv)
    flags.DEFINE_integer("batch_size", 32, "Examples per batch.", flag_values=fv)
    flags.DEFINE_integer("batches", batches, batches_help, flag_values=fv)
    flags.DEFINE_string("loss", "", "Keras loss name (default: the saved model's compiled loss, "
                        "else sparse_categorical_crossentropy).", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for generated data.", flag_values=fv)


def check_dataset(fv: flags.FlagValues) -> None:
    """Refuses a ``--dataset`` of no known form, or ``npz:PATH`` of no file (an
    empty one means none, where allowed), before the model loads.

    Raises:
        tf_mixed._internal.cli_errors.UsageError: As `tf_mixed.commands.names.parse_spec`;
            for ``npz:PATH``, as `tf_mixed.cli.npz_data.load` says of a missing file.
    """
    from tf_mixed.commands import names

    spec = fv.dataset.strip()
    if spec.lower().startswith("npz:"):
        from tf_mixed._internal.cli_errors import UsageError

        path = spec[len("npz:"):]
        if not os.path.isfile(path):
            raise UsageError("dataset", spec, f"no such file {path!r}",
                             "npz:PATH with arrays x and y (or x0, x1, ... and y0, y1, ...)")
    elif spec:
        names.parse_spec(spec)


HALF_POLICIES = ("mixed_float16", "mixed_bfloat16", "fp16", "bf16")
"""The names ``--policy`` of probe takes: the half-precision policies and their aliases."""


def check_half_policy(fv: flags.FlagValues) -> None:
    """Refuses a ``--policy`` that is not a half-precision policy, with "did you mean".

    Raises:
        tf_mixed._internal.cli_errors.UsageError: Naming the flag and the value.
    """
    from tf_mixed._internal.cli_errors import unknown

    if fv.policy and fv.policy.strip().lower() not in HALF_POLICIES:
        raise unknown("policy", fv.policy, "half-precision policy", HALF_POLICIES)


def error(command: str, message: str) -> int:
    """Prints ``tf_mixed COMMAND: error: MESSAGE`` on stderr; returns status 2."""
    print(f"tf_mixed {command}: error: {message}", file=sys.stderr)
    return 2


def first_line(problem: BaseException) -> str:
    """The first line of an exception's message (its type when it has none)."""
    text = str(problem).strip()
    return (text.splitlines()[0] if text else type(problem).__name__)[:500]


def flag_error(problem: flags.Error, fv: flags.FlagValues) -> str:
    """absl's refusal of a flag, in the one wording of every command.

    A value of the wrong type reads ``--epochs='zero': not a whole number.
    Accepted: a whole number, such as --epochs=4 (the default).``; other
    refusals (an unknown flag) keep absl's words.
    """
    found = re.match(r"flag --(\w+)=(.*?): ", str(problem), re.DOTALL)
    if not isinstance(problem, flags.IllegalFlagValueError) or not found:
        return str(problem)
    name, value = found.groups()
    from tf_mixed._internal.cli_errors import KINDS, wrong_type

    if name not in fv or fv[name].parser.flag_type() not in KINDS:
        return str(problem)
    kind = fv[name].parser.flag_type()
    default = str(fv[name].default).lower() if kind == "bool" else fv[name].default
    return str(wrong_type(name, value, kind, default))


def parse(command: str, argv: list[str], fv: flags.FlagValues, usage: str,
          positive: tuple[str, ...],
          checks: Sequence[Callable[[flags.FlagValues], object]] = ()) -> str | int:
    """Parses ``MODEL [flags]`` into `fv`, and checks all it can before TensorFlow loads.

    Args:
        command: The subcommand's name, for messages.
        argv: ``sys.argv``-style list: the program name, then arguments.
        fv: Flag values with the subcommand's flags defined.
        usage: Printed, with the flags' help, for ``--help``.
        positive: Integer flags that must be at least 1.
        checks: Functions of the parsed flags that raise
            `tf_mixed._internal.cli_errors.UsageError` for a bad value; they
            read names and tables only (no TensorFlow).

    Returns:
        The MODEL path, or the exit status to return at once (0 after
        ``--help``, 2 after printing the one line of bad input).
    """
    if any(a in HELP_FLAGS for a in argv[1:]):
        print(usage)
        print(fv.get_help())
        return 0
    try:
        positionals = fv(argv)[1:]
    except flags.Error as problem:
        return error(command, flag_error(problem, fv))
    if len(positionals) != 1:
        return error(command, "expected exactly one MODEL argument, the path of a saved "
                     f".keras model. Received: {positionals}")
    from tf_mixed._internal.cli_errors import UsageError, below_minimum
    from tf_mixed.cli import model_file

    for name in positive:
        if getattr(fv, name) < 1:
            return error(command, str(below_minimum(name, getattr(fv, name), 1)))

    missing = model_file.missing(positionals[0])
    if missing:
        return error(command, missing)
    try:
        for check in checks:
            check(fv)
    except UsageError as problem:
        return error(command, str(problem))
    import_tensorflow()
    return positionals[0]


def import_tensorflow() -> None:
    """Imports TensorFlow quietly, once a command has read its arguments."""
    progress.update("importing TensorFlow")
    quiet.import_tensorflow()
    progress.update("working")


def check_output_dir(path: str) -> None:
    """Checks, before the long work, that result files can be written in `path`.

    Creates `path` if missing and writes a probe entry in it (a real write,
    which also holds for root, whom ``os.access`` always answers yes), then
    removes what it created: a command that fails later leaves nothing.

    Args:
        path: The ``--output_dir`` of the command.

    Raises:
        tf_mixed._internal.cli_errors.UsageError: one line naming the flag,
            the path and why it cannot be written.
    """
    from tf_mixed.commands import output_dir

    output_dir.remove_if_created(path, output_dir.check_output_dir(path))


def write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file and a rename."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)
