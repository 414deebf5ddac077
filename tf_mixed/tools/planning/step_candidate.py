"""A per-layer plan as the model check's third candidate, on the loop's first batch's shapes."""

# `tf_mixed.policy.model_check.Check` tries a per-layer plan when auto's half
# policy loses to float32 on the model's own step and its budget allows
# (docs/policies.md). This is its ``plan_source`` in `fit` and in
# `tf_mixed.training.make_train_step`: `tf_mixed.plan`
# with no probe (auto kept the whole model in the half policy without one, so
# a plan that keeps fewer layers there needs none either) and no whole-step
# check of its own (the check times the plan on the model's own step next),
# on a batch of random values with the shapes and dtypes of the loop's first
# batch: fit's iterator's element spec (fit shows its callbacks no batch; an
# unknown batch size is `BATCH`), or `spec_of` the first call's (x, y) in
# make_train_step (one replica's share under a strategy). Its per-layer
# timings go to the plan's cache, so `tf_mixed.plan` on the same host, model
# and shapes reads them.

from __future__ import annotations

from typing import Any, Sequence

import keras
import numpy as np

from tf_mixed._internal.facts import FLOAT32
from tf_mixed.policy import model_check

__all__ = ["BATCH", "batch_like", "plan_source", "spec_of"]

BATCH = 32
"""The batch size of the plan's timing when fit's iterator leaves it unknown."""


def batch_like(spec, batch_size: int = BATCH):
    """Random inputs shaped as ``spec``, the x part of a dataset's element spec.

    Args:
        spec: A `tf.TensorSpec` or a structure of them (an element spec's
            ``(x, y[, sample_weight])`` tuple gives its x).
        batch_size: The size of an unknown batch dimension.

    Returns:
        NumPy arrays in the structure of x.
    """
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        spec = spec[0]
    rng = np.random.default_rng(0)

    def one(tensor_spec):
        shape = [batch_size if d is None else d for d in tensor_spec.shape]
        dtype = tensor_spec.dtype.as_numpy_dtype
        if np.issubdtype(dtype, np.floating):
            return rng.normal(size=shape).astype(dtype)
        return np.zeros(shape, dtype)

    return keras.tree.map_structure(one, spec)


def spec_of(batch):
    """The `tf.TensorSpec` structure of a batch (what `batch_like` takes).

    Args:
        batch: Tensors or NumPy arrays in any structure, such as ``(x, y)``.

    Returns:
        The same structure of `tf.TensorSpec` with each one's shape and dtype.
    """
    import tensorflow as tf

    return keras.tree.map_structure(
        lambda t: tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype)), batch)


def plan_source(seen: list, who: str = "fit") -> model_check.PlanSource:
    """The check's ``plan_source`` for a loop whose first batch's spec lands in
    ``seen`` (its first item) by the first step.

    Args:
        seen: A list that holds the spec (`spec_of`, or a dataset's element
            spec: ``(x, y[, sample_weight])`` or x) once the loop has seen
            its first batch.
        who: The loop, for the plan's summary ("fit", "make_train_step").

    Returns:
        A `tf_mixed.policy.model_check.PlanSource`.
    """

    def source(model, budget_cpu_s: float) -> tuple[Sequence[str], str] | str:
        if not seen or seen[0] is None:
            return f"{who} showed no batch shapes to time the layers on"
        from tf_mixed.tools.planning.planner import plan

        x = batch_like(seen[0])
        try:
            found = plan(model, x, probe_report={}, step_check=False,
                         budget_s=max(budget_cpu_s, 1.0))
        except (TypeError, ValueError) as error:
            return f"tf_mixed.plan cannot plan this model ({error})"
        float32_layers = [row.name for row in found.layers if row.choice == FLOAT32]
        return (float32_paths(model, float32_layers),
                f"tf_mixed.plan: {found.summary}, on a batch of {_size(x)} of {who}'s shapes")

    return source


def float32_paths(model, names: Sequence[str]) -> list[str]:
    """The paths of the named top-level layers and of every layer inside them."""
    paths: list[str] = []
    for name in names:
        paths.extend(model_check.policies_of(model.get_layer(name)))
    return paths


def _size(x: Any) -> int:
    return int(keras.tree.flatten(x)[0].shape[0])
