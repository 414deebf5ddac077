"""``python -m tf_mixed catalog [--layers=A,B] [--compare=OLD.json]``: the numerics catalog."""

# Measures layers under each half policy against float32 (`tf_mixed.catalog`),
# prints the table of safe input ranges, and writes ``results.json`` and
# ``catalog.png`` to ``--output_dir`` (only once everything is measured).
# ``--compare=OLD.json`` (or ``--compare=stored``, the catalog shipped with
# tf_mixed) then lists the rows whose safe range changed and exits 1 if any
# did; with ``--new=NEW.json`` it compares two files without measuring.

from __future__ import annotations

import os

from absl import flags

from tf_mixed._internal import progress
from tf_mixed.cli import model_command
from tf_mixed.commands.png import png_or_none

USAGE = """usage: python -m tf_mixed catalog [--layers=NAME,...] [--policies=P,...]
       [--tolerance=8] [--hub=auto] [--output_dir=DIR] [--compare=OLD.json|stored]
       [--new=NEW.json] [--quiet]

Measures every float-computing layer class of keras.layers (and keras_hub.layers
when installed; or the classes --layers names, your own by dotted path) under
mixed_float16 and mixed_bfloat16 against float32, over input magnitudes 1e-6 ..
1e6: forward and gradient error, where it overflows, underflows or loses
resolution. Prints the safe input range per layer and policy and writes
results.json and catalog.png. --compare lists the layers whose safe range changed
against an earlier results.json (exit status 1 when one did).
"""

_HUB = {"auto": None, "true": True, "false": False}


def _define_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_list("layers", [], "Layer classes: keras.layers names (Dense), or a dotted "
                      "path to your own class (my_package.layers.MyNorm). Default: all.",
                      flag_values=fv)
    flags.DEFINE_list("policies", ["mixed_float16", "mixed_bfloat16"], "Half policies.",
                      flag_values=fv)
    flags.DEFINE_float("tolerance", 8.0, "Tolerance in machine epsilons of the compute dtype.",
                       flag_values=fv)
    flags.DEFINE_enum("hub", "auto", list(_HUB), "Add keras_hub.layers (auto: when installed).",
                      flag_values=fv)
    flags.DEFINE_string("output_dir", "tf_mixed_catalog",
                        "Directory for results.json and catalog.png.", flag_values=fv)
    flags.DEFINE_string("compare", "", "An earlier results.json (or 'stored': the catalog "
                        "shipped with tf_mixed): list the rows whose safe range changed.",
                        flag_values=fv)
    flags.DEFINE_string("new", "", "With --compare: a second results.json to compare, "
                        "instead of measuring now.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for inputs and weights.", flag_values=fv)


def _error(message: str) -> int:
    return model_command.error("catalog", message)


def _parse(argv: list[str], fv: flags.FlagValues) -> int | None:
    if any(a in model_command.HELP_FLAGS for a in argv[1:]):
        print(USAGE)
        print("\n".join(line for line in fv.get_help().splitlines()
                        if not line.strip() or line.startswith(" ")))
        return 0
    try:
        rest = fv(argv)[1:]
    except flags.Error as error:
        return _error(model_command.flag_error(error, fv))
    if rest:
        return _error(f"unexpected argument {rest[0]!r}; flags look like --layers=Dense")
    if fv.new and not fv.compare:
        return _error(f"--new={fv.new!r} needs --compare=OLD.json: it is the second file")
    if not fv.tolerance > 0:
        return _error(f"--tolerance={fv.tolerance!r} must be a positive number of "
                      "machine epsilons, such as 8")
    return None


def _load(path: str, flag: str):
    from tf_mixed.tools.catalog import results

    if path == "stored":
        return results.stored()
    try:
        return results.load(path)
    except ValueError as error:
        raise ValueError(f"--{flag}={path!r}: {error}") from None


def main(argv: list[str]) -> int:
    """Runs ``python -m tf_mixed catalog``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments.

    Returns:
        0 success (no range changed), 1 a compared range changed, 2 bad input.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    parsed = _parse(argv, fv)
    if parsed is not None:
        return parsed
    try:
        old = _load(fv.compare, "compare") if fv.compare else None
        new = _load(fv.new, "new") if fv.new else None
        if new is None:
            model_command.check_output_dir(fv.output_dir)
    except ValueError as error:
        return _error(str(error))
    if new is None:
        progress.update("importing TensorFlow")
        from tf_mixed._internal import quiet

        quiet.import_tensorflow()
        import tf_mixed

        try:
            new = tf_mixed.catalog(fv.layers or None, policies=fv.policies,
                                   tolerance=fv.tolerance, hub=_HUB[fv.hub], seed=fv.seed,
                                   progress=lambda line: progress.update(f"measuring {line}"))
        except (TypeError, ValueError) as error:
            return _error(model_command.first_line(error))
        progress.update("writing results.json and catalog.png")
        png = png_or_none("catalog", "catalog.png", new.plot)
        try:
            os.makedirs(fv.output_dir, exist_ok=True)
            model_command.write_atomically(os.path.join(fv.output_dir, "results.json"),
                                           new.to_json().encode())
            if png is not None:
                model_command.write_atomically(os.path.join(fv.output_dir, "catalog.png"), png)
        except OSError as error:
            return _error(f"--output_dir={fv.output_dir!r}: cannot write "
                          f"({error.strerror or error})")
        print(new)
        print(f"\nMeasured {len(new.rows)} rows in {new.seconds:.0f} s; wrote "
              f"{fv.output_dir}/results.json" + (" and catalog.png" if png is not None else ""))
    if old is None:
        return 0
    import dataclasses

    from tf_mixed.tools.catalog.comparing import compare

    if (fv.layers or fv.hub == "false") and not fv.new:  # only the rows measured now
        keys = {(row.key, row.policy) for row in new.rows}
        old = dataclasses.replace(old, rows=tuple(r for r in old.rows
                                                  if (r.key, r.policy) in keys))
    comparison = compare(old, new)
    print(comparison)
    return 1 if comparison else 0
