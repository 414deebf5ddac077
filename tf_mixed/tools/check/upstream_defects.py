"""Known mixed-precision defects of the installed Keras / TensorFlow, reproduced in seconds."""

# Each entry of `DEFECTS` is reproduced on small fakes (one variable, a fake
# strategy, two logical CPUs), reported as present or absent on the installed
# versions, and says whether tf_mixed neutralises it and how. ``python -m
# tf_mixed check`` prints them and writes them into its JSON; a user of Keras's
# own wrapper learns here what tf_mixed works around. Each one has a canary in
# tests/tools/check/test_upstream_defects.py that fails once upstream fixes it, so the
# entry (and tf_mixed's workaround) can be retired.
#
#     scale_collapse            Keras's LossScaleOptimizer has no floor: after enough
#                               non-finite steps its scale is 0.0 and the next clean
#                               step writes inf/NaN into the weights.
#     first_replica_verdict     Under MirroredStrategy Keras takes the skip verdict from
#                               replica 0's local gradients: an overflow on another
#                               replica writes inf into the weights.
#     multi_worker_fit_20585    Keras's fit fails under MultiWorkerMirroredStrategy
#                               (keras-team/keras#20585).
#     jit_under_strategy        jit_compile=True under a multi-replica strategy fails
#                               with an XLA resource-device error.

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

__all__ = ["DEFECTS", "Defect", "DefectSpec", "check", "run"]


@dataclasses.dataclass(frozen=True)
class DefectSpec:
    """One known defect: what it is and what tf_mixed does about it.

    Attributes:
        key: Short identifier (JSON key, canary test name).
        title: One line saying what goes wrong.
        reference: Where it is documented: the upstream issue, else the
            canary test that reproduces it here.
        remedy: How tf_mixed neutralises it (or refuses it up front).
    """

    key: str
    title: str
    reference: str
    remedy: str


@dataclasses.dataclass(frozen=True)
class Defect:
    """A defect as found on this installation.

    Attributes:
        spec: The `DefectSpec`.
        present: Whether the installed Keras/TF still has it; None when it
            could not be reproduced here (``detail`` says why).
        neutralised: Whether tf_mixed's own path avoided it in the same
            reproduction (measured, except where ``remedy`` says otherwise).
        detail: What the reproduction observed.
        seconds: How long the reproduction took.
    """

    spec: DefectSpec
    present: bool | None
    neutralised: bool
    detail: str
    seconds: float

    def to_json(self) -> dict:
        """A JSON-able dict."""
        return {"key": self.spec.key, "title": self.spec.title,
                "reference": self.spec.reference, "present": self.present,
                "neutralised_by_tf_mixed": self.neutralised, "how": self.spec.remedy,
                "detail": self.detail, "seconds": round(self.seconds, 3)}


DEFECTS: tuple[DefectSpec, ...] = (
    DefectSpec(
        "scale_collapse",
        "Keras's LossScaleOptimizer halves its scale down to 0.0, then a clean step "
        "writes inf/NaN into the weights",
        "tests/tools/check/test_upstream_defects.py::test_canary_scale_collapse",
        "tf_mixed.LossScaleOptimizer never goes below min_scale (default 1.0)"),
    DefectSpec(
        "first_replica_verdict",
        "Keras's LossScaleOptimizer under MirroredStrategy decides skip/apply from "
        "replica 0 alone: an overflow on another replica writes inf into the weights",
        "tests/tools/check/test_upstream_defects.py::test_canary_first_replica_verdict",
        "tf_mixed takes the verdict from the all-reduced gradients, the same on every replica"),
    DefectSpec(
        "multi_worker_fit_20585",
        "Keras's fit fails under MultiWorkerMirroredStrategy",
        "keras-team/keras#20585",
        "tf_mixed.distribute.multi_worker_strategy() / fit_support() install "
        "tf_mixed/distribute/keras_fix_20585.py (a real 2-worker fit is tested; not re-run here)"),
    DefectSpec(
        "jit_under_strategy",
        "jit_compile=True under a multi-replica strategy fails with an XLA "
        "resource-device error",
        "tests/tools/check/test_upstream_defects.py::test_canary_jit_under_strategy",
        "refused up front with a clear error (make_train_step(jit_compile=True), "
        "a jit-compiled LossScaleOptimizer step under a strategy)"),
)

_SPECS = {spec.key: spec for spec in DEFECTS}


# ------------------------------------------------------------ reproductions


def _collapse(make_optimizer) -> tuple[bool, float, str]:
    """Non-finite steps from a tiny scale, then one clean step: (weights finite, scale)."""
    import keras
    import tensorflow as tf

    variable = keras.Variable(np.ones(2, "float32"), name="collapse_probe")
    optimizer = make_optimizer()
    optimizer.build([variable])
    bad = [tf.constant([np.inf, 1.0])]
    for _ in range(4):  # 2**-146 -> ... -> 2**-149 -> 0.0 without a floor
        optimizer.apply(bad, [variable])
    scale = float(optimizer.dynamic_scale.numpy())
    optimizer.apply([tf.constant([1.0, 1.0])], [variable])
    weights = variable.numpy()
    return bool(np.isfinite(weights).all()), scale, f"scale {scale:g}, weights {weights.tolist()}"


def _scale_collapse(strategy) -> tuple[bool | None, bool, str]:
    import keras

    from tf_mixed.scaling.optimizer import LossScaleOptimizer

    theirs_finite, theirs_scale, theirs = _collapse(
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                                    initial_scale=2.0**-146))
    # tf_mixed's from its floor (min_scale, default 1.0): the same steps.
    ours_finite, ours_scale, ours = _collapse(
        lambda: LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1.0))
    present = theirs_scale == 0.0 or not theirs_finite
    return present, ours_finite and ours_scale > 0, f"Keras: {theirs}; tf_mixed: {ours}"


def _first_replica_verdict(strategy) -> tuple[bool | None, bool, str]:
    if strategy is None or strategy.num_replicas_in_sync < 2:
        return None, False, "needs a MirroredStrategy with two replicas"
    from tf_mixed.tools.check import scenarios as selfcheck

    def corrupts(make):
        s = selfcheck.overflow_scenario(strategy, make, strategy.num_replicas_in_sync - 1)
        return not (s.checks["weights_finite"] and s.checks["weights_unchanged"])

    theirs = corrupts(selfcheck.make_keras_optimizer)
    ours = corrupts(selfcheck.make_tf_mixed_optimizer)
    last = strategy.num_replicas_in_sync - 1
    return theirs, not ours, (f"inf on replica {last} only: Keras "
                              f"{'changed the weights' if theirs else 'skipped the step'}, "
                              f"tf_mixed {'changed the weights' if ours else 'skipped the step'}")


def _multi_worker_fit(strategy) -> tuple[bool | None, bool, str]:
    from tf_mixed.distribute import keras_fix_20585 as fix

    defects = fix.probe()
    installable = fix.keras_major() == 3
    return defects.any, installable, (
        f"on a fake 2-worker strategy: build all-reduces a data batch: "
        f"{defects.build_reduces_batch}; scalars reduced with axis=0: "
        f"{defects.scalar_reduce_axis0}")


def _jit_under_strategy(strategy) -> tuple[bool | None, bool, str]:
    if strategy is None or strategy.num_replicas_in_sync < 2:
        return None, False, "needs a MirroredStrategy with two replicas"
    import keras
    import tensorflow as tf

    from tf_mixed.scaling.optimizer import LossScaleOptimizer

    with strategy.scope():
        variable = tf.Variable(1.0)

    @tf.function(jit_compile=True)
    def step():
        return strategy.run(lambda: variable.assign_add(1.0))

    try:
        step()
        present, what = False, "a jit-compiled step under the strategy ran"
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            tf.errors.InternalError) as error:
        first = str(error).strip().splitlines()[0][:160]
        present, what = True, f"XLA: {type(error).__name__}: {first}"
    # tf_mixed's refusal, in the optimizer (make_train_step(jit_compile=True)
    # refuses the same way before it traces): a jit-compiled step under the
    # strategy is stopped at its trace with a clear error, before XLA's.
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = LossScaleOptimizer(keras.optimizers.SGD(0.1))
        optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=True)
    def scaled_step():
        def replica():
            variables = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = optimizer.scale_loss(tf.reduce_sum(model(tf.ones((1, 2)))))
            return optimizer.apply(tape.gradient(loss, variables), variables)
        return strategy.run(replica)

    try:
        scaled_step()
        refused = False
    except ValueError:
        refused = True
    return present, refused, what + ("; tf_mixed refuses it up front" if refused else "")


_REPRODUCTIONS: dict[str, Callable] = {
    "scale_collapse": _scale_collapse,
    "first_replica_verdict": _first_replica_verdict,
    "multi_worker_fit_20585": _multi_worker_fit,
    "jit_under_strategy": _jit_under_strategy,
}


def check(key: str, strategy=None) -> Defect:
    """Reproduces one defect.

    Args:
        key: A key of `DEFECTS`.
        strategy: A MirroredStrategy over at least two devices, for the
            defects that need one (else they are reported as not checked).

    Returns:
        The `Defect`.

    Raises:
        ValueError: ``key`` is not a known defect.
    """
    if key not in _SPECS:
        raise ValueError(f"Unknown defect {key!r}; known: {', '.join(_SPECS)}.")
    start = time.perf_counter()
    present, neutralised, detail = _REPRODUCTIONS[key](strategy)
    return Defect(_SPECS[key], present, neutralised, detail, time.perf_counter() - start)


def run(strategy=None) -> tuple[Defect, ...]:
    """Reproduces every defect of `DEFECTS` (see `check`)."""
    return tuple(check(spec.key, strategy) for spec in DEFECTS)
