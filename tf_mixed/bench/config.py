"""What a bench run is: `BenchConfig`, the policies it compares, its data."""

# `BenchConfig` holds the validated flags. `resolve_policies` turns
# ``--policies`` into canonical names. `load_data` is the one place that loads
# the ``--dataset`` a config names and checks that the batch fits in it;
# `check_data` runs the same checks in the parent before any process starts
# (without generating the shapes set, which each process makes itself).

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tf_mixed._internal.cli_errors import UsageError, below_minimum
from tf_mixed.commands import names
from tf_mixed.commands.names import (  # noqa: F401 (no TensorFlow)
    BENCH_POLICIES,
    DATA_ACCEPTED,
    MODEL_NAMES,
)

STRATEGIES = ("default", "mirrored", "multiworker")
LOOPS = ("fit", "custom")
SUITES = ("compare", "overhead", "comm", "memory", "bf16", "gpu", "heal", "heal_cost")
ISOLATIONS = ("subprocess", "inprocess")
DEFAULT_MODEL = {"compare": "cnn", "overhead": "mlp", "comm": "mlp", "memory": "mlp",
                 "bf16": "mlp", "gpu": "resnet50", "heal": "mlp", "heal_cost": "cnn"}
# --rounds=0: timing rounds per path by suite (else OTHER_ROUNDS). The overhead
# suite needs many short rounds to judge 1% (tf_mixed.bench.overhead), a
# multiple of twice its paths so that its rotation is balanced.
DEFAULT_ROUNDS = {"overhead": 18}
OTHER_ROUNDS = 3
# --float8_layers: which Dense layers the float8 run quantizes.
FLOAT8_LAYERS = ("auto", "all")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a bench run (the CLI flags, validated).

    Attributes:
        policies: Policy names as given; empty for the default pair.
        model: One of `tf_mixed.bench.models.MODEL_NAMES`; "" for the suite's default.
        dataset: A `tf_mixed.commands.data` spec: "shapes", "tfds:NAME[:SPLIT]", "folder:PATH".
        data_dir: TFDS data directory ("" for TFDS's default).
        download: Whether TFDS may download a missing data set.
        image_size: Square image side; 0 for the data set's default.
        train_size: Training examples (shapes: generated; others: a cap; 0: default).
        val_size: Validation examples, as ``train_size``.
        batch_size: Global batch size (split across replicas).
        epochs: Number of epochs.
        steps: Steps per epoch; 0 for one pass over the training data.
        warmup_steps: Leading steps left out of the timing (tracing, caches).
        learning_rate: Adam's initial learning rate (cosine decay to 0 over the run).
        strategy: One of `STRATEGIES`.
        replicas: Replicas for "mirrored" on a host without GPUs (the CPU is
            split into this many logical devices).
        workers: Worker processes for "multiworker".
        loop: One of `LOOPS`.
        suite: One of `SUITES`.
        isolation: One of `ISOLATIONS`: a fresh process per policy, or all in this one.
        output_dir: Where results.json, results.md and bench.png go.
        seed: Seed for data, initial weights and data order.
        rounds: Overhead, comm, memory and heal_cost suites: timing rounds per
            path (their order alternates or rotates); 0 for the suite's default
            (`DEFAULT_ROUNDS`, else `OTHER_ROUNDS`).
        round_steps: Compare suite: steps per timing round (the policies' rounds alternate).
        round_seconds: Compare suite: a round also ends after this many seconds.
        time_budget: Compare suite: seconds the job plans to keep to (0: no budget,
            every policy in full); see `tf_mixed.bench.schedule`.
        quiet: No progress lines.
        matmul_size: Compare suite: the side of the reference matmul (0: 1024 on a CPU,
            4096 on a GPU).
        float8_layers: The float8 policy's layers: "auto" (tf_mixed.float8.quantize's
            default: first, last and unaligned Dense layers kept out) or "all".
    """

    policies: tuple[str, ...] = ()
    model: str = ""
    dataset: str = "shapes"
    data_dir: str = ""
    download: bool = True
    image_size: int = 0
    train_size: int = 0
    val_size: int = 0
    batch_size: int = 64
    epochs: int = 4
    steps: int = 0
    warmup_steps: int = 5
    learning_rate: float = 1e-3
    strategy: str = "default"
    replicas: int = 2
    workers: int = 2
    loop: str = "fit"
    suite: str = "compare"
    isolation: str = "subprocess"
    output_dir: str = "tf_mixed_bench"
    seed: int = 0
    rounds: int = 0
    float8_layers: str = "auto"
    round_steps: int = 20
    round_seconds: float = 4.0
    time_budget: float = 120.0
    quiet: bool = False
    matmul_size: int = 0

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL[self.suite]

    @property
    def timing_rounds(self) -> int:
        """``rounds``, or the suite's default for 0."""
        return self.rounds or DEFAULT_ROUNDS.get(self.suite, OTHER_ROUNDS)

    def validate(self) -> "BenchConfig":
        """Checks every field that can be checked without loading anything.

        Imports no TensorFlow: the command line calls it before TensorFlow loads,
        so a bad flag is answered at once.

        Returns:
            A copy with canonical model name.

        Raises:
            UsageError: Naming the first bad flag.
        """
        for flag, value, choices in (
            ("strategy", self.strategy, STRATEGIES),
            ("loop", self.loop, LOOPS),
            ("suite", self.suite, SUITES),
            ("isolation", self.isolation, ISOLATIONS),
            ("float8_layers", self.float8_layers, FLOAT8_LAYERS),
        ):
            if value not in choices:
                raise UsageError(flag, value, f"unknown {flag}", ", ".join(choices))
        for flag, number, minimum in (
            ("batch_size", self.batch_size, 1),
            ("epochs", self.epochs, 1),
            ("steps", self.steps, 0),
            ("warmup_steps", self.warmup_steps, 0),
            ("replicas", self.replicas, 1),
            ("workers", self.workers, 1),
            ("train_size", self.train_size, 0),
            ("val_size", self.val_size, 0),
            ("image_size", self.image_size, 0),
            ("rounds", self.rounds, 0),
            ("round_steps", self.round_steps, 1),
            ("time_budget", self.time_budget, 0),
            ("matmul_size", self.matmul_size, 0),
        ):
            if number < minimum:
                raise below_minimum(flag, number, minimum)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise UsageError("learning_rate", self.learning_rate, "must be a positive number",
                             "e.g. 0.001")
        if not self.output_dir:
            raise UsageError("output_dir", self.output_dir, "empty path", "a writable directory")
        for name in self.policies:
            names.check_policy(name)
        self._check_suite()
        model = names.check_model(self.model_name)
        dataset = self.dataset
        sequence_model = model in names.SEQUENCE_MODELS
        if sequence_model and dataset == names.SHAPES:
            dataset = names.TOKENS  # the default data set, made for this model
        kind, _, _ = names.parse_spec(dataset)
        if sequence_model != (kind == names.TOKENS):
            raise UsageError(
                "dataset", self.dataset,
                f"--model={model} needs " + ("token sequences" if sequence_model else "images"),
                "tokens (generated in process) for --model=transformer; shapes, tfds:NAME or "
                "folder:PATH for the image models")
        checked = dataclasses.replace(self, model=model, dataset=dataset)
        if checked.suite == "compare" and kind == names.SHAPES:
            check_shapes(checked)
        return checked

    def _check_suite(self) -> None:
        """The flags a suite cannot honour, told before any work.

        Raises:
            UsageError: Naming the flag.
        """
        if self.suite == "comm":
            if self.workers < 2:
                raise below_minimum("workers", self.workers, 2,
                                    "The comm suite needs 2 workers or more to all-reduce.")
            if self.batch_size % self.workers:
                raise UsageError("batch_size", self.batch_size,
                                 f"must split evenly over --workers={self.workers}",
                                 f"a multiple of {self.workers}")
        if self.suite == "overhead" and self.strategy != "default":
            raise UsageError("strategy", self.strategy,
                             "the overhead suite runs without a strategy", "default")
        if self.suite == "overhead" and self.policies:
            # Counted from the names; "auto" is counted once resolved, after TensorFlow
            # loads (tf_mixed.bench.overhead), unless the names alone are too many.
            keys = {names.canonical(p) for p in self.policies}
            mixed = keys - {"float32", "auto"}
            if len(mixed) > 1 or ("auto" not in keys and len(mixed) != 1):
                raise not_one_mixed_policy(self.policies)
        if self.suite == "memory":
            from tf_mixed.bench import memory_suite  # no TensorFlow at import

            memory_suite.selected_paths(self.policies, self.batch_size)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def not_one_mixed_policy(policies: tuple[str, ...]) -> UsageError:
    """The overhead suite's refusal of a ``--policies`` list that is not one mixed policy."""
    return UsageError("policies", ",".join(policies),
                      "the overhead suite times exactly one mixed policy",
                      "mixed_float16 or mixed_bfloat16")


def resolve_policies(requested: tuple[str, ...], *,
                     with_plan: bool = False) -> tuple[tuple[str, ...], str]:
    """Turns ``--policies`` into canonical, de-duplicated policy names.

    With nothing requested the pair is float32 and what ``enable("auto")``
    picks; where auto picks float32 (a CPU without fast half precision),
    mixed_bfloat16 is added so that two policies are always compared.

    Args:
        requested: Names as given (aliases and "auto" accepted).
        with_plan: With nothing requested, add "plan" (the per-layer plan,
            `tf_mixed.bench.plan_row`) as a third row: the compare suite's
            default.

    Returns:
        ``(policies, note)``: the names, float32 first when present, and a
        sentence saying how the list was chosen.

    Raises:
        UsageError: For an unknown name.
    """
    from tf_mixed.policy import global_policy as policy
    from tf_mixed.policy import hardware

    keys = [names.check_policy(name) for name in requested or ("float32", "auto")]
    auto, reason = policy.resolve_auto(hardware.detect())  # measured on CPUs
    chosen: list[str] = []
    for key in keys:
        if key in BENCH_POLICIES:
            if key not in chosen:
                chosen.append(key)
            continue
        canonical = policy.canonical_name(key)
        canonical = auto if canonical == "auto" else canonical
        if canonical not in chosen:
            chosen.append(canonical)
    if not requested:
        if auto == "float32":
            chosen.append("mixed_bfloat16")
            note = (
                f"Default policies: float32 and enable('auto'), which picks float32 here "
                f"({reason}); mixed_bfloat16 was added so two policies are compared"
            )
        else:
            note = f"Default policies: float32 and enable('auto') = {auto} ({reason})"
        if with_plan:
            chosen.append("plan")
            note += "; and the per-layer plan (tf_mixed.plan) as a third row"
        note += "."
    else:
        note = f"Policies as requested (--policies); enable('auto') would pick {auto} ({reason})."
    chosen.sort(key=lambda n: n != "float32")
    return tuple(chosen), note



# --- data ------------------------------------------------------------------------


def load_data(config: BenchConfig, *, default_train_size: int = 0, default_val_size: int = 0):
    """Loads the data set ``config`` names and checks that a batch fits in it.

    Args:
        config: A validated `BenchConfig`.
        default_train_size: Training examples when ``config.train_size`` is 0
            (0: the data set's own default).
        default_val_size: The same for validation.

    Returns:
        A `tf_mixed.commands.data.BenchData`.

    Raises:
        UsageError: For a data set that cannot be loaded or a batch larger
            than its training examples.
    """
    from tf_mixed.commands import data

    bench_data = data.load(
        config.dataset, seed=config.seed, image_size=config.image_size,
        train_size=config.train_size or default_train_size,
        val_size=config.val_size or default_val_size,
        data_dir=config.data_dir or None, download=config.download,
    )
    check_batch(config, bench_data.train_size, bench_data.name)
    return bench_data


def check_data(config: BenchConfig):
    """Checks the data before any training process starts, so bad input fails early.

    The shapes set is only validated (each policy's process generates it);
    every other set is loaded, which also checks its files.

    Returns:
        The loaded `BenchData`, or None for the generated shapes set.

    Raises:
        UsageError: As `load_data`.
    """
    kind, _, _ = names.parse_spec(config.dataset)
    if kind != names.SHAPES:
        return load_data(config)
    check_shapes(config)
    return None


def check_shapes(config: BenchConfig) -> None:
    """Checks ``--image_size`` and ``--batch_size`` against the generated shapes set.

    Imports no TensorFlow (`BenchConfig.validate` calls it for the compare suite).

    Raises:
        UsageError: For images too small or a batch larger than the set.
    """
    size = config.image_size or names.DEFAULT_SHAPES_SIZE
    if size < names.MIN_SHAPES_SIZE:
        raise UsageError(
            "image_size", config.image_size, "too small for the shapes data set",
            f"{names.MIN_SHAPES_SIZE} or more (0 picks {names.DEFAULT_SHAPES_SIZE})",
        )
    check_batch(config, config.train_size or names.DEFAULT_SHAPES_TRAIN, names.SHAPES)


def check_batch(config: BenchConfig, train_size: int, name: str) -> None:
    """Raises `UsageError` when ``--batch_size`` exceeds ``train_size``."""
    if train_size < config.batch_size:
        raise UsageError(
            "batch_size", config.batch_size,
            f"larger than the {train_size} training examples of {name}",
            f"1 to {train_size}",
        )
