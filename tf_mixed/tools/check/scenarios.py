"""What `python -m tf_mixed check` proves on this host's own devices."""

# Three parts, each returning plain values (the command line in
# `tf_mixed.cli.check` only prints and writes them):
#
# 1. For each replica k of a MirroredStrategy (all visible GPUs; with fewer
#    than two, two logical CPUs), inf is injected into replica k's gradients
#    only. tf_mixed's `LossScaleOptimizer` must skip the step on every replica
#    (weights, optimizer slots and iterations unchanged, loss scale backed off)
#    and then apply the next finite step identically everywhere.
# 2. The same scenario with `keras.optimizers.LossScaleOptimizer`, to report
#    whether Keras still writes non-finite values into the weights when a
#    replica other than the first overflows (its finite check reads the
#    first replica's local gradients).
# 3. Seconds per step of each policy on the probe workload of
#    `tf_mixed.policy.autotune`, and what "auto" picks from them.
# 4. The installed Keras/TF's known mixed-precision defects, each reproduced
#    on fakes, present or absent, and whether tf_mixed neutralises it
#    (`tf_mixed.tools.check.upstream_defects`).
#
# Logical CPUs must be configured before TensorFlow initialises: call
# `prepare_devices()` first thing in a fresh process.

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from tf_mixed._internal import measuring

# (key, what it means): one table, from which the CLI's rows are generated.
CHECKS: tuple[tuple[str, str], ...] = (
    ("weights_unchanged", "weights unchanged on every replica"),
    ("slots_unchanged", "optimizer slots unchanged on every replica"),
    ("iterations_unchanged", "iterations unchanged"),
    ("scale_backed_off", "loss scale halved on every replica"),
    ("weights_finite", "no inf/NaN written into any weight"),
    ("finite_step_identical", "next finite step applied, identical on every replica"),
)

_INITIAL_SCALE = 2.0**10
_LEARNING_RATE = 0.01


class StrategyUnavailable(RuntimeError):
    """A MirroredStrategy with at least two replicas cannot be built here."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One overflow scenario: inf in `bad_replica`'s gradients only.

    Attributes:
        bad_replica: The replica whose gradients were made non-finite.
        checks: Each key of `CHECKS` -> whether it held.
    """

    bad_replica: int
    checks: Mapping[str, bool]

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Part 3: the probe timed under each policy.

    Attributes:
        seconds_per_step: By policy.
        speedups: float32's time divided by each policy's.
        auto_policy: What `enable("auto")` picks on this host.
        auto_reason: Why.
        estimates: Each half policy's speed-up as the median of its paired
            rounds with a 90% interval (`measuring.Estimate`); whether the
            interval answers "faster here" is `Estimate.answers`.
    """

    seconds_per_step: Mapping[str, float]
    speedups: Mapping[str, float]
    auto_policy: str
    auto_reason: str
    estimates: Mapping[str, measuring.Estimate] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Everything `run_check` found.

    Attributes:
        devices: The devices the MirroredStrategy ran on.
        tf_mixed: Part 1, one `Scenario` per replica.
        keras: Part 2, one `Scenario` per replica (empty if not run).
        throughput: Part 3 (None if not run).
        defects: Part 4, the installed Keras/TF's known defects
            (`tf_mixed.tools.check.upstream_defects.run`; empty if not run).
    """

    devices: tuple[str, ...]
    tf_mixed: tuple[Scenario, ...]
    keras: tuple[Scenario, ...]
    throughput: Throughput | None
    defects: tuple = ()

    @property
    def passed(self) -> bool:
        """Whether every tf_mixed correctness check held (Keras's do not count)."""
        return bool(self.tf_mixed) and all(s.passed for s in self.tf_mixed)

    @property
    def keras_corrupts_weights(self) -> bool | None:
        """Whether Keras's optimizer wrote non-finite or changed weights on a skipped step."""
        if not self.keras:
            return None
        return not all(
            s.checks["weights_finite"] and s.checks["weights_unchanged"] for s in self.keras
        )

    def to_json(self) -> dict:
        """A JSON-able dict of every figure and verdict."""

        def scenarios(items):
            return [
                {"bad_replica": s.bad_replica, "passed": s.passed, "checks": dict(s.checks)}
                for s in items
            ]

        throughput = None
        if self.throughput is not None:
            throughput = {
                "seconds_per_step": dict(self.throughput.seconds_per_step),
                "speedup_vs_float32": dict(self.throughput.speedups),
                "interval_vs_float32": {name: e.to_dict() | {"answers": e.answers()}
                                        for name, e in self.throughput.estimates.items()},
                "auto": {"policy": self.throughput.auto_policy,
                         "reason": self.throughput.auto_reason},
            }
        return {
            "devices": list(self.devices),
            "replicas": len(self.devices),
            "tf_mixed_optimizer": {"passed": self.passed, "scenarios": scenarios(self.tf_mixed)},
            "keras_optimizer": {
                "corrupts_weights": self.keras_corrupts_weights,
                "scenarios": scenarios(self.keras),
            },
            "throughput": throughput,
            "upstream_defects": [d.to_json() for d in self.defects],
            "passed": self.passed,
        }


def prepare_devices(logical_cpus: int = 2) -> None:
    """Splits the CPU into logical devices when there are fewer than 2 GPUs.

    Must run before TensorFlow initialises its runtime; afterwards it changes
    nothing (the devices are then whatever the process already has).

    Args:
        logical_cpus: How many logical CPUs to make.
    """
    import tensorflow as tf

    if len(tf.config.list_physical_devices("GPU")) >= 2:
        return
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * logical_cpus
        )
    except (RuntimeError, ValueError):
        pass  # already initialised: choose_devices says whether it is enough


def _logical_devices() -> tuple[list[str], list[str]]:
    import tensorflow as tf

    return (
        [d.name for d in tf.config.list_logical_devices("GPU")],
        [d.name for d in tf.config.list_logical_devices("CPU")],
    )


def choose_devices() -> tuple[str, ...]:
    """All visible GPUs if there are at least two, else two logical CPUs.

    Returns:
        Device names for the MirroredStrategy.

    Raises:
        StrategyUnavailable: If neither two GPUs nor two logical CPUs exist.
    """
    gpus, cpus = _logical_devices()
    if len(gpus) >= 2:
        return tuple(gpus)
    if len(cpus) >= 2:
        return tuple(cpus[:2])
    raise StrategyUnavailable(
        f"a MirroredStrategy needs at least 2 devices; this process has "
        f"{len(gpus)} GPU(s) and {len(cpus)} logical CPU(s), and TensorFlow was "
        "initialised before the CPU could be split: run `python -m tf_mixed check` "
        "in a fresh process"
    )


def make_tf_mixed_optimizer():
    """The optimizer under test in part 1 (tests replace it to see a failure)."""
    import keras

    from tf_mixed.scaling.optimizer import LossScaleOptimizer

    return LossScaleOptimizer(
        keras.optimizers.Adam(_LEARNING_RATE), initial_scale=_INITIAL_SCALE
    )


def make_keras_optimizer():
    """The optimizer of part 2: Keras's own loss-scale wrapper."""
    import keras

    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(_LEARNING_RATE), initial_scale=_INITIAL_SCALE
    )


def overflow_scenario(strategy, make_optimizer: Callable, bad_replica: int) -> Scenario:
    """Injects inf into one replica's gradients, then takes a finite step.

    Args:
        strategy: A MirroredStrategy (its replicas are compared).
        make_optimizer: Returns a fresh loss-scale optimizer (built inside
            ``strategy.scope()``).
        bad_replica: The replica whose loss (so gradients) becomes inf.

    Returns:
        A `Scenario`.
    """
    import keras
    import tensorflow as tf

    with strategy.scope():
        layer = keras.layers.Dense(3, dtype="float32", name="check_dense")
        layer.build((None, 4))
        optimizer = make_optimizer()
        optimizer.build(layer.trainable_variables)
    x = tf.constant(np.linspace(-1.0, 1.0, 8 * 4).reshape(8, 4), tf.float32)
    y = tf.constant(np.linspace(0.5, -0.5, 8 * 3).reshape(8, 3), tf.float32)

    @tf.function
    def step(bad):
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(layer(x) - y))
                loss *= tf.where(tf.equal(replica, bad), math.inf, 1.0)
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, layer.trainable_variables)
            optimizer.apply_gradients(zip(grads, layer.trainable_variables))

        strategy.run(replica_fn)

    def snapshot():
        return {
            "weights": [_locals(strategy, v) for v in layer.trainable_variables],
            "slots": [_locals(strategy, v) for v in _slot_variables(optimizer)],
            "iterations": _locals(strategy, optimizer.iterations),
            "scale": _scale_locals(strategy, optimizer),
        }

    step(tf.constant(-1))  # a finite step first: slots and iterations non-zero
    before = snapshot()
    step(tf.constant(bad_replica))
    after_bad = snapshot()
    step(tf.constant(-1))
    after_good = snapshot()

    weights_bad = [c for copies in after_bad["weights"] for c in copies]
    checks = {
        "weights_unchanged": _all_equal_to(after_bad["weights"], before["weights"]),
        "slots_unchanged": _all_equal_to(after_bad["slots"], before["slots"]),
        "iterations_unchanged": _all_equal_to(
            [after_bad["iterations"]], [before["iterations"]]),
        "scale_backed_off": (
            before["scale"] is not None and after_bad["scale"] is not None
            and all(a == b * 0.5 for a, b in zip(after_bad["scale"], before["scale"]))
        ),
        "weights_finite": all(np.isfinite(c).all() for c in weights_bad),
        "finite_step_identical": _finite_step_identical(before, after_bad, after_good),
    }
    return Scenario(bad_replica=bad_replica, checks=checks)


def _locals(strategy, variable) -> list[np.ndarray]:
    """Every replica's copy of ``variable`` (``strategy``'s, as its scope is entered)."""
    from tf_mixed.scaling.replicas import local_copies

    return local_copies(variable)


def _slot_variables(optimizer) -> list:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return [v for v in inner.variables if v is not inner.iterations]


def _scale_locals(strategy, optimizer) -> list[float] | None:
    for name in ("loss_scale", "dynamic_scale"):
        variable = getattr(optimizer, name, None)
        if variable is not None:
            return [float(v) for v in _locals(strategy, variable)]
    return None


def _all_equal_to(now: Sequence[list], then: Sequence[list]) -> bool:
    return all(
        np.array_equal(copy, reference)
        for copies, references in zip(now, then)
        for copy, reference in zip(copies, references)
    )


def _finite_step_identical(before, after_bad, after_good) -> bool:
    for copies in after_good["weights"]:
        if not all(np.isfinite(c).all() and np.array_equal(c, copies[0]) for c in copies):
            return False
    moved = any(
        not np.array_equal(good[0], old[0])
        for good, old in zip(after_good["weights"], after_bad["weights"])
    )
    iterations = [int(i) for i in after_good["iterations"]]
    expected = [int(i) + 1 for i in before["iterations"]]
    return moved and iterations == expected


def measure_throughput(info=None, *, budget_s: float = 0.5, timer=None) -> Throughput:
    """Part 3: times the probe under each policy; says what "auto" picks.

    Args:
        info: The host; default `hardware.detect()`.
        budget_s: Seconds for the timed rounds (see `autotune.time_rounds`).
        timer: Replaces `autotune.time_rounds` (called with the policies):
            seconds per step by policy, a list of interleaved rounds or one
            figure.

    Returns:
        A `Throughput`. On GPUs and TPUs "auto" follows its rules; on CPUs it
        is the decision from these very timings.
    """
    from tf_mixed.policy import autotune, hardware
    from tf_mixed.policy import global_policy as policy

    info = hardware.detect() if info is None else info
    accelerator = bool(info.gpus or info.tpu)
    names = (
        (autotune.FLOAT32, autotune.MIXED_BFLOAT16, autotune.MIXED_FLOAT16)
        if accelerator else autotune.candidates(info)
    )
    raw = (autotune.time_rounds(names, budget_s=budget_s) if timer is None
           else dict(timer(names)))
    rounds = {name: list(v) if isinstance(v, (list, tuple)) else [v] for name, v in raw.items()}
    decision = autotune.choose_from_rounds(rounds)
    timings = {name: measuring.quartiles(v)[1] for name, v in rounds.items()}
    estimates = {name: measuring.estimate(measuring.pair_ratios(v, rounds[autotune.FLOAT32]))
                 for name, v in rounds.items() if name != autotune.FLOAT32}
    if accelerator:
        auto_policy, auto_reason = policy.choose_auto(info)
    else:
        auto_policy = decision.policy
        ratio = decision.speedups[decision.policy]
        measured = estimates.get(decision.policy)
        auto_reason = (
            f"{decision.policy} measured {ratio:.2f}x float32 here"
            + (f" ({measured.text()})" if measured is not None else "")
            + f"; a half policy needs >= {decision.margin:.2f}x"
        )
    return Throughput(timings, decision.speedups, auto_policy, auto_reason, estimates)


def run_check(
    *,
    parts: Sequence[str] = ("tf_mixed", "keras", "throughput"),
    budget_s: float = 0.5,
    progress: Callable[[str], None] = lambda message: None,
) -> CheckResult:
    """Runs the chosen parts on this host's devices.

    Args:
        parts: Any of "tf_mixed" (part 1, always run), "keras", "throughput".
            (Part 4 is `tf_mixed.tools.check.upstream_defects.run`, which the command line
            adds to the result: that module uses this one's scenarios.)
        budget_s: Timing budget of part 3, in seconds.
        progress: Called with a short line before each step (the CLI prints it).

    Returns:
        A `CheckResult`.

    Raises:
        StrategyUnavailable: If a MirroredStrategy cannot be built here.
    """
    from tf_mixed.distribute.mirrored import shared_mirrored_strategy

    devices = choose_devices()
    try:
        strategy = shared_mirrored_strategy(list(devices))
    except (RuntimeError, ValueError) as error:
        raise StrategyUnavailable(
            f"cannot build a MirroredStrategy over {', '.join(devices)}: {error}"
        ) from error
    replicas = range(strategy.num_replicas_in_sync)
    progress(f"part 1: tf_mixed.LossScaleOptimizer on {len(devices)} replicas")
    ours = tuple(overflow_scenario(strategy, make_tf_mixed_optimizer, k) for k in replicas)
    theirs: tuple[Scenario, ...] = ()
    if "keras" in parts:
        progress("part 2: keras.optimizers.LossScaleOptimizer")
        theirs = tuple(overflow_scenario(strategy, make_keras_optimizer, k) for k in replicas)
    throughput = None
    if "throughput" in parts:
        progress("part 3: throughput of each policy on the probe")
        throughput = measure_throughput(budget_s=budget_s)
    return CheckResult(tuple(devices), ours, theirs, throughput)
