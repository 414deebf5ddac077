"""The command line: ``python -m tf_mixed [bench|info|audit|check|probe|export|doctor|catalog]``."""

#     python -m tf_mixed                 same as ``bench`` with its defaults
#     python -m tf_mixed bench --help    the bench's flags
#     python -m tf_mixed info            this host's hardware and what "auto" picks
#     python -m tf_mixed audit PATH      per-layer dtype report of a saved model
#     python -m tf_mixed check           prove the skip decision on this host's devices
#     python -m tf_mixed probe MODEL     per-layer numerics of a saved model in half precision
#     python -m tf_mixed rollback-cost   step time and memory of BatchNorm rollback (ResNet-18)
#     python -m tf_mixed export MODEL    a checked SavedModel or LiteRT file of a saved model
#     python -m tf_mixed litert-latency  float32 vs float16-weight LiteRT: size, parity, latency
#     python -m tf_mixed doctor MODEL    why isn't it faster: census of the train step, fixes
#     python -m tf_mixed launch N SCRIPT N local workers of SCRIPT as one TF cluster
#     python -m tf_mixed catalog         each layer's safe input range in float16 / bfloat16
#
# Flags are absl flags, parsed into a private ``FlagValues`` per call so that
# `main` can be called more than once in a process (the tests do). Bad input
# prints one line naming the flag, the value and what is accepted, and exits
# with status 2. TensorFlow's C++ start-up log is kept off stderr unless
# ``--verbose`` is given (see `tf_mixed._internal.quiet`).
#
# A new subcommand is a function ``(argv) -> int`` in `COMMANDS`.

from __future__ import annotations

import importlib
import shlex
import sys
from typing import Callable

from absl import flags

from tf_mixed._internal import progress, quiet
from tf_mixed.cli import model_command
from tf_mixed.cli.model_command import HELP_FLAGS as _HELP

USAGE = """usage: python -m tf_mixed [bench] [--flag=value ...] [--verbose]
       python -m tf_mixed info [--verbose]
       python -m tf_mixed audit PATH [--custom_modules=M,...] [--safe_mode=false] [--verbose]
       python -m tf_mixed check [--output=FILE]   (prove tf_mixed on this host's devices)
       python -m tf_mixed probe MODEL.keras [--dataset=SPEC]   (find the layer that breaks)
       python -m tf_mixed rollback-cost [--steps=N]   (what BatchNorm rollback costs)
       python -m tf_mixed export MODEL.keras [--format=litert] [--precision=float32]
                                 [--dataset=SPEC]   (serve what you trained)
       python -m tf_mixed litert-latency [--model=cnn]   (float32 vs float16-weight LiteRT)
       python -m tf_mixed doctor MODEL.keras [--dataset=SPEC] [--measure]   (why isn't it faster)
       python -m tf_mixed launch N SCRIPT.py [ARGS ...]   (N local workers, one TF cluster)
       python -m tf_mixed catalog [--layers=A,B] [--compare=OLD.json]   (layers' safe ranges)

Every command takes --help.

bench (the default) trains the same model on the same data under float32 and
mixed precision, and reports throughput, memory, loss and accuracy per policy:
a Markdown table on stdout, results.json, results.md and bench.png in
--output_dir. --suite=overhead times tf_mixed's optimizer and callback against
plain Keras mixed precision instead; --suite=comm the gradient all-reduce;
--suite=memory peak memory and speed per precision (pure bfloat16 and
gradient accumulation included); --suite=bf16 what bfloat16 weights learn;
--suite=heal float32 / mixed / mixed + Heal side by side (docs/healing.md);
--suite=heal_cost the step time of layer attribution (default model cnn).
--verbose lets TensorFlow's own log and
warnings through.
"""
_VERBOSE = ("--verbose", "--verbose=true", "--verbose=1", "--verbose=True")
_QUIET = ("--quiet", "--quiet=true", "--quiet=1", "--quiet=True")


def _define_flags(fv: flags.FlagValues) -> None:
    # Nothing here imports TensorFlow: --help answers at once.
    from tf_mixed.bench import config

    flags.DEFINE_list(
        "policies", [],
        "Policies to compare: any name tf_mixed.enable accepts "
        "(tf_mixed.policy.POLICY_NAMES: float32, "
        "mixed_float16, mixed_bfloat16, ...), float8, plan (the per-layer plan) or "
        "auto-checked (auto's choice checked on the model's own first steps). Default: "
        "float32 and what enable('auto') picks, plus mixed_bfloat16 where auto picks float32.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "policy", "",
        "One policy to compare against float32 and mixed_bfloat16 (e.g. float8: Keras float8 "
        "via tf_mixed.float8.quantize on bfloat16 compute). Use --policies for a full list.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "float8_layers", "auto",
        "float8 policy: 'auto' (tf_mixed.float8.quantize's default: first, last and "
        "unaligned Dense layers stay out) or 'all' (every Dense layer).",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "model", "", f"One of {', '.join(config.MODEL_NAMES)}. Default: cnn (overhead suite: mlp).",
        flag_values=fv,
    )
    flags.DEFINE_string("dataset", "shapes", f"Data set: {config.DATA_ACCEPTED}.", flag_values=fv)
    flags.DEFINE_string("data_dir", "", "TFDS data directory (default: TFDS's own).",
                        flag_values=fv)
    flags.DEFINE_boolean("download", True, "Let TFDS download a data set that is not prepared.",
                         flag_values=fv)
    flags.DEFINE_integer(
        "image_size", 0,
        "Square image side; 0: 32 for shapes, native for TFDS, 64 for folder.", flag_values=fv)
    flags.DEFINE_integer(
        "train_size", 0,
        "Training examples (shapes: generated, default 8000; else a cap).", flag_values=fv)
    flags.DEFINE_integer("val_size", 0, "Validation examples (shapes default 2000; else a cap).",
                         flag_values=fv)
    flags.DEFINE_integer("batch_size", 64, "Global batch size (split across replicas).",
                         flag_values=fv)
    flags.DEFINE_integer("epochs", 4, "Epochs per policy.", flag_values=fv)
    flags.DEFINE_integer("steps", 0, "Steps per epoch; 0 for one pass over the training data.",
                         flag_values=fv)
    flags.DEFINE_integer("warmup_steps", 5, "Leading steps not timed (tracing, caches).",
                         flag_values=fv)
    flags.DEFINE_float(
        "learning_rate", 1e-3,
        "Adam initial learning rate (cosine decay to 0 over the run).", flag_values=fv)
    flags.DEFINE_string("strategy", "default", f"One of {', '.join(config.STRATEGIES)}.",
                        flag_values=fv)
    flags.DEFINE_integer("replicas", 2, "mirrored on a CPU-only host: logical CPU devices to use.",
                         flag_values=fv)
    flags.DEFINE_integer("workers", 2, "multiworker: local worker processes per policy.",
                         flag_values=fv)
    flags.DEFINE_string("loop", "fit", f"Training loop: {', '.join(config.LOOPS)}.", flag_values=fv)
    flags.DEFINE_string("suite", "compare", f"One of {', '.join(config.SUITES)}.", flag_values=fv)
    flags.DEFINE_string(
        "isolation", "subprocess",
        "subprocess: each policy in a fresh process (clean state, own peak memory); "
        "inprocess: all here.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "output_dir", "tf_mixed_bench", "Directory for results.json, results.md, bench.png.",
        flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for data, initial weights and data order.",
                         flag_values=fv)
    from tf_mixed.bench.config import DEFAULT_ROUNDS, OTHER_ROUNDS  # no TensorFlow

    flags.DEFINE_integer(
        "rounds", 0, "Overhead, comm, memory and heal_cost suites: timing rounds "
        "per path; 0: the suite's default ("
        + ", ".join(f"{suite} {n}" for suite, n in DEFAULT_ROUNDS.items())
        + f", the others {OTHER_ROUNDS}).", flag_values=fv)
    flags.DEFINE_integer(
        "round_steps", 20,
        "Steps per timing round; the policies' rounds alternate (A B A B ...).", flag_values=fv)
    flags.DEFINE_float(
        "time_budget", 120.0,
        "Seconds the main job plans to keep to: a policy whose full run does not fit is timed "
        "on a few rounds, its accuracy not compared. 0: every policy in full.", flag_values=fv)
    flags.DEFINE_boolean("quiet", False, "No progress lines.", flag_values=fv)
    flags.DEFINE_integer(
        "matmul_size", 0,
        "Side of the host's reference matmul (half vs float32); 0: 1024 on a CPU, 4096 on a GPU.",
        flag_values=fv)
    flags.DEFINE_boolean("verbose", False, "Let TensorFlow's C++ log and its warnings through.",
                         flag_values=fv)


def _help(fv: flags.FlagValues) -> str:
    """The flags' help under one heading (absl heads it with a module path)."""
    lines = ["bench flags:"]
    lines += [line for line in fv.get_help().splitlines()
              if not line.strip() or line.startswith(" ")]
    return "\n".join(lines)


def _config_from(fv: flags.FlagValues):
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed.bench.config import BenchConfig
    from tf_mixed.commands import names

    policies = tuple(p.strip() for p in fv.policies if p.strip())
    single = fv.policy.strip()
    if single and policies:
        raise UsageError("policy", single, "given together with --policies",
                         "one of them: --policy=X compares X with float32 and mixed_bfloat16")
    if single:
        names.check_policy(single, flag="policy")
        policies = ("float32", "mixed_bfloat16", single)
    return BenchConfig(
        policies=policies,
        float8_layers=fv.float8_layers.strip().lower(),
        model=fv.model.strip().lower(),
        dataset=fv.dataset,
        data_dir=fv.data_dir,
        download=fv.download,
        image_size=fv.image_size,
        train_size=fv.train_size,
        val_size=fv.val_size,
        batch_size=fv.batch_size,
        epochs=fv.epochs,
        steps=fv.steps,
        warmup_steps=fv.warmup_steps,
        learning_rate=fv.learning_rate,
        strategy=fv.strategy.strip().lower(),
        replicas=fv.replicas,
        workers=fv.workers,
        loop=fv.loop.strip().lower(),
        suite=fv.suite.strip().lower(),
        isolation=fv.isolation.strip().lower(),
        output_dir=fv.output_dir,
        seed=fv.seed,
        rounds=fv.rounds,
        round_steps=fv.round_steps,
        time_budget=fv.time_budget,
        quiet=fv.quiet,
        matmul_size=fv.matmul_size,
    ).validate()


def _error(command: str, message: str) -> int:
    print(f"tf_mixed{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    return 2


def _bench(argv: list[str]) -> int:
    fv = flags.FlagValues()
    _define_flags(fv)
    if any(a in _HELP for a in argv[1:]):
        print(USAGE)
        print(_help(fv))
        return 0
    try:
        positionals = fv(argv)[1:]
    except flags.Error as error:
        return _error("bench", model_command.flag_error(error, fv))
    if positionals:
        return _error("bench",
                      f"unexpected argument {positionals[0]!r}; flags look like --model=cnn")
    from tf_mixed._internal.cli_errors import ChildFailed, UsageError

    try:  # every check that needs only names and numbers, before TensorFlow
        config = _config_from(fv)
    except UsageError as error:
        return _error("bench", str(error))
    _import_tensorflow()

    from tf_mixed.bench import compare, overhead

    try:
        command = "python -m tf_mixed bench " + " ".join(shlex.quote(a) for a in argv[1:])
        if config.quiet:
            progress.set_enabled(False)
        with quiet.summarised_tf_warnings(fv.verbose, "bench"):
            if config.suite == "gpu":
                from tf_mixed.bench.gpu_suite import run_gpu

                return run_gpu(config, command.strip())
            if config.suite == "overhead":
                overhead.run_overhead(config, command.strip())
            elif config.suite == "comm":
                from tf_mixed.bench import comm

                comm.run_comm(config, command.strip())
            elif config.suite == "memory":
                from tf_mixed.bench import memory_suite

                memory_suite.run_memory(config, command.strip())
            elif config.suite in ("heal", "heal_cost"):
                from tf_mixed.bench import heal_suite

                (heal_suite.run_heal if config.suite == "heal"
                 else heal_suite.run_heal_cost)(config, command.strip())
            elif config.suite == "bf16":
                from tf_mixed.bench import bf16_quality

                bf16_quality.run_quality(config, command.strip())
            else:
                compare.run_compare(config, command.strip(), verbose=fv.verbose)
    except UsageError as error:
        return _error("bench", str(error))
    except ChildFailed as error:
        if error.usage:
            return _error("bench", str(error))
        print(f"tf_mixed bench: {error}", file=sys.stderr)
        return 1
    return 0



INFO_USAGE = """usage: python -m tf_mixed info [--verbose]

Prints this host's CPU (its half-precision flags, AMX), GPUs and TPU, and the
policy tf_mixed.enable("auto") picks here, with the reason."""

AUDIT_USAGE = """usage: python -m tf_mixed audit PATH [--custom_modules=M,...] [--safe_mode=false] \
[--verbose]

Loads the model saved at PATH (.keras) and prints tf_mixed.audit's report:
per layer, its compute and variable dtypes and what to change."""


def _info(argv: list[str]) -> int:
    if any(a in _HELP for a in argv[1:]):
        print(INFO_USAGE)
        return 0
    if len(argv) > 1:
        return _error("info", f"unexpected argument {argv[1]!r}; 'info' takes only --verbose")
    _import_tensorflow()
    from tf_mixed.cli import info

    print(info.report())
    return 0


def _audit(argv: list[str]) -> int:
    from tf_mixed.cli import audit as audit_command
    from tf_mixed.cli import model_command, model_file

    fv = flags.FlagValues()
    model_file.define_flags(fv)
    parsed = model_command.parse("audit", argv, fv, AUDIT_USAGE, ())
    if isinstance(parsed, int):
        return parsed
    return audit_command.run(parsed, safe_mode=fv.safe_mode,
                             custom_modules=fv.custom_modules)


def _import_tensorflow() -> None:
    """Imports TensorFlow quietly, once a command's arguments are read."""
    progress.update("importing TensorFlow")
    quiet.import_tensorflow()
    progress.update("working")


def _command(module: str, *, with_program: bool = True) -> Callable[[list[str]], int]:
    """A command that imports ``module`` only when it runs, then calls its ``main``.

    Args:
        module: The module holding ``main(argv) -> int``.
        with_program: Whether that ``main`` takes the program name first
            (absl style) or only the arguments (argparse style).
    """
    def run(argv: list[str]) -> int:
        main = importlib.import_module(module).main
        return main(argv if with_program else argv[1:])

    return run


_check = _command("tf_mixed.cli.check", with_program=False)
_probe = _command("tf_mixed.cli.probe")
_doctor = _command("tf_mixed.cli.doctor")
_rollback_cost = _command("tf_mixed.bench.rollback_cost", with_program=False)
_export = _command("tf_mixed.cli.export")
_launch = _command("tf_mixed.cli.launch")
_litert_latency = _command("tf_mixed.bench.litert_latency", with_program=False)
_catalog = _command("tf_mixed.cli.catalog")


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "bench": _bench, "info": _info, "audit": _audit, "check": _check, "probe": _probe,
    "rollback-cost": _rollback_cost, "export": _export,
    "litert-latency": _litert_latency, "doctor": _doctor, "launch": _launch,
    "catalog": _catalog,
}


def main(argv: list[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: ``sys.argv``-style list (program name first); None for ``sys.argv``.

    Returns:
        The exit status: 0 success, 1 a run failed, 2 bad input.
    """
    argv = list(sys.argv if argv is None else argv)
    program, args = argv[0], argv[1:]
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if not args or args[0].startswith("-"):
        command, rest = "bench", args
    elif args[0] in COMMANDS:
        command, rest = args[0], args[1:]
    else:
        return _error(
            "", f"unknown command {args[0]!r}; accepted: {', '.join(COMMANDS)} "
            "(no command runs bench)",
        )
    verbose = any(a in _VERBOSE for a in rest)
    if any(a in _QUIET for a in rest) and command != "launch":
        progress.set_enabled(False)
    if command == "launch":  # every argument after SCRIPT is the script's own
        verbose = False
    elif command != "bench":  # bench parses --verbose and --quiet as its flags
        rest = [a for a in rest if a not in _VERBOSE + _QUIET]
    # A progress line at least every few seconds while a command works
    # (tf_mixed._internal.progress); --quiet turns them off.
    # TensorFlow is imported once the command has read its arguments
    # (quiet.import_tensorflow), so --help and bad input answer at once.
    quiet.defer(verbose)
    with progress.heartbeat(f"tf_mixed {command}"):
        progress.update("working")
        try:
            return COMMANDS[command]([f"{program} {command}"] + rest)
        except SystemExit as exit_:  # argparse's --help (0) and its bad flags (2)
            return exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)


def run() -> None:
    """Console-script entry point (``tf-mixed``)."""
    sys.exit(main())
