"""The optimizer's saved layouts: ``.keras`` entries, checkpoint children, older layouts."""

# `LossScaleOptimizer.save_own_variables` / ``load_own_variables`` and its
# ``tf.train.Checkpoint`` children (`checkpoint_children`) call these plain
# functions. Accumulation buffers are kept per replica (all workers' too,
# gathered at save time), so a run resumed inside a window makes the update
# the uninterrupted run makes; older layouts (Keras's wrapper, tf_mixed's
# before the vector entry) load through `load_listed_layout` and
# `load_unsplit_layout`.

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals

__all__ = ["EXTRA_STATE", "checkpoint_children", "load_listed_layout", "load_own",
           "load_unsplit_layout", "save_own"]

# The state variables after Keras's own (`step_counter`, `dynamic_scale`), in
# checkpoint order. A file written by Keras's wrapper lacks exactly these.
EXTRA_STATE = ("overflow_streak", "skipped_steps", "last_step_skipped",
               "min_scale_skips")

# The inner optimizer's children that Keras's wrapper (and tf_mixed's before
# issue 27) also kept at its top level, as its own unused copies (0 and 0.0).
_SHADOWED = ("_iterations", "_learning_rate")


# ------------------------------------------------------------ .keras files


def _own(optimizer) -> tuple[list, list]:
    """The wrapper's own variables: (scalars, arrays), in creation order."""
    own = _internals.optimizer_own_variables(optimizer)
    # len(): a mirrored variable's TensorShape([]) is truthy.
    return ([v for v in own if len(v.shape) == 0],
            [v for v in own if len(v.shape) > 0])


def _entries(optimizer) -> dict[int, str]:
    """The store key of each array variable (``id`` to key): "1", "2", ..."""
    return {id(v): str(i) for i, v in enumerate(_own(optimizer)[1], start=1)}


def save_own(optimizer, store, state) -> None:
    """Writes the wrapper's own state into a ``.keras`` store.

    The inner optimizer's variables are saved once, by the inner optimizer
    itself (Keras walks it as a child); Keras's own wrapper stores them a
    second time. Entry ``"0"`` holds every scalar state variable as one
    float64 vector (exact for counters below 2**53; one HDF5 dataset instead
    of eight); each array variable (an accumulation buffer) follows as its
    own entry, in order: ``[replicas, *shape]`` on several replicas, its own
    shape on one. The parts of its step state that save
    (`tf_mixed.scaling.step_state.StepState.save_into`: healed layers, the
    spike history) add their own entries.
    """
    scalars, arrays = _own(optimizer)
    state.save_into(store)
    store["0"] = np.array([np.float64(v.numpy()) for v in scalars], dtype=np.float64)
    for i, value in enumerate(_replica_rows(arrays), start=1):
        store[str(i)] = value if value.shape[0] > 1 else value[0]


def load_own(optimizer, store, keras_load, state) -> None:
    """Reads a ``.keras`` store written by `save_own`, or an older layout.

    Args:
        optimizer: A ``tf_mixed.LossScaleOptimizer``.
        store: The optimizer's entries of the file.
        keras_load: Keras's wrapper's ``load_own_variables`` (its layout
            before it was built: Keras's own error then).
        state: The optimizer's `tf_mixed.scaling.step_state.StepState`
            (each part that saves reads its entries).
    """
    scalars, arrays = _own(optimizer)
    state.load_from(store)
    riders = state.store_keys()
    keys = [k for k in store.keys() if k not in riders]
    if (optimizer.built and "0" in keys and len(store["0"].shape) == 1
            and store["0"].shape[0] == len(scalars)
            and len(keys) == 1 + len(arrays)):
        for value, variable in zip(store["0"][...], scalars):
            variable.assign(np.asarray(value).astype(variable.dtype))
        _assign_rows(arrays, [np.asarray(store[str(i)], np.float32)
                              for i in range(1, len(arrays) + 1)])
        return
    if (optimizer.built and "0" in keys and store["0"].shape == (0,)
            and len(keys) == 1 + len(scalars) + len(arrays)):
        load_unsplit_layout(optimizer, store)
        return
    if optimizer.built and len(keys) == len(optimizer.variables) - len(EXTRA_STATE):
        load_listed_layout(optimizer, store)
        return
    keras_load(store)


def load_unsplit_layout(optimizer, store) -> None:
    """The layout tf_mixed wrote under a strategy before the scalars were split.

    Entry ``"0"`` is an empty vector and every own variable follows, in
    order (a mirrored scalar's shape read as not empty); accumulation
    buffers hold every replica's row.
    """
    own = _internals.optimizer_own_variables(optimizer)
    arrays = []
    for i, variable in enumerate(own, start=1):
        if len(variable.shape) == 0:
            variable.assign(np.asarray(store[str(i)]).astype(variable.dtype))
        else:
            arrays.append((variable, np.asarray(store[str(i)], np.float32)))
    _assign_rows([v for v, _ in arrays], [rows for _, rows in arrays])


def load_listed_layout(optimizer, store) -> None:
    """The older layout: the wrapper's variables, then the inner optimizer's.

    Keras's wrapper and tf_mixed's before the vector entry wrote one entry
    per variable (entry ``"0"`` is the wrapper's unused scalar iterations);
    the inner optimizer loads its own again from its own entry. Keras's
    wrapper lacks the counters of `EXTRA_STATE`, which stay at 0.
    """
    own = _internals.optimizer_own_variables(optimizer)
    ours = optimizer.variables
    extra_start = len(own) - len(EXTRA_STATE)
    targets = ours[:extra_start] + ours[len(own):]
    for i, variable in enumerate(targets):
        variable.assign(store[str(i)])


# ------------------------------------------------- buffers, per replica


def _local_copies(variable) -> list:
    """This process's copies of a (Keras) variable: one per local replica."""
    value = getattr(variable, "value", variable)
    if isinstance(value, tf.distribute.DistributedValues):
        return list(value.values)
    return [value]


def _replicas_of(variable):
    """``(strategy, global ids of the local copies, replicas in sync)``."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, tf.distribute.DistributedValues):
        return None, [0], 1
    strategy = value.distribute_strategy
    with strategy.scope():
        ids = strategy.run(
            lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
        ids = [int(i) for i in strategy.experimental_local_results(ids)]
    return strategy, ids, strategy.num_replicas_in_sync


def _replica_rows(buffers) -> list[np.ndarray]:
    """Every replica's copy of each buffer, stacked ``[replicas, ...]``.

    Across workers this is a collective (every worker must save, as the
    docs of multi-worker training say).
    """
    if not buffers:
        return []
    strategy, _, replicas = _replicas_of(buffers[0])
    if replicas == 1:
        return [np.stack([c.numpy() for c in _local_copies(b)]) for b in buffers]
    gathered = []
    with strategy.scope():
        for buffer in buffers:
            # Read in replica context: each replica's own copy. (One buffer
            # per run: a list returned by `run` gathers one replica only.)
            local = strategy.run(
                lambda b=buffer: tf.expand_dims(tf.convert_to_tensor(b.value), 0))
            gathered.append(np.asarray(strategy.gather(local, axis=0)))
    return gathered


def _assign_rows(buffers, saved: list[np.ndarray]) -> None:
    """Gives each replica its own saved row (``[replicas, ...]`` or one copy).

    Saved on another number of replicas, the window's sum is kept (on the
    first replica, zeros on the others) and a warning says the rounding may
    differ from the uninterrupted run.
    """
    if not buffers:
        return
    _, ids, replicas = _replicas_of(buffers[0])
    folded_from = None
    for buffer, rows in zip(buffers, saved):
        if rows.shape == tuple(buffer.shape):
            rows = rows[None]
        if len(rows) != replicas:
            folded_from = folded_from or (len(rows) if len(rows) > 1 else None)
            total = rows.sum(axis=0, dtype=np.float32)
            rows = np.stack([total if i == 0 else np.zeros_like(total)
                             for i in range(replicas)])
        for copy, replica in zip(_local_copies(buffer), ids):
            copy.assign(rows[replica])
    if folded_from:
        warnings.warn(
            f"The optimizer's accumulation buffers were saved on {folded_from} "
            f"replicas and are restored onto {replicas}: the window's sum is kept "
            "(on the first replica), but its rounding may differ from the "
            "uninterrupted run.", RuntimeWarning, stacklevel=4)


# ------------------------------------------------------- tf.train.Checkpoint


def checkpoint_children(wrapper, default: dict, state) -> dict:
    """The checkpoint layout: the inner optimizer's, plus the wrapper's state.

    A ``tf.train.Checkpoint`` of the plain inner optimizer restores into the
    wrapper and back (tf-keras's promise): the inner optimizer's children
    (iterations, learning rate, slots) sit where a plain optimizer keeps
    them; the wrapper adds its state variables by name, ``inner_optimizer``
    and, when accumulating, ``accumulation_micro_step`` and
    ``accumulation_buffers`` (every replica's buffer, all workers' gathered
    at save; restored as `load_own` does). A checkpoint in the older layout
    (Keras's wrapper, tf_mixed's before) holds unused top-level
    ``iterations`` (0) and ``learning_rate`` (0.0) beside the real ones
    under ``inner_optimizer/``: the top-level iterations and learning rate
    are aliases that yield to the ``inner_optimizer/`` values when the
    checkpoint holds them (`tf_mixed._internal.shims.checkpoint_alias`).

    Args:
        wrapper: A ``tf_mixed.LossScaleOptimizer``.
        default: Keras's children of the wrapper.
        state: The wrapper's `tf_mixed.scaling.step_state.StepState`: the
            children of its parts that save, and the aliases kept for the
            wrapper's life.

    Returns:
        The children, name to trackable.
    """
    inner = wrapper.inner_optimizer
    children = _internals.trackable_children(inner)
    aliases = state.aliases
    for name in _SHADOWED:
        target = children.get(name)
        if not isinstance(target, (keras.Variable, tf.Variable)):
            continue
        # One alias object per variable: a save lists the children more
        # than once and needs the same object each time.
        if name not in aliases or aliases[name][0] is not target:
            aliases[name] = (target, _internals.checkpoint_alias(target))
        children[name] = aliases[name][1]
    children["inner_optimizer"] = inner
    for name in ("step_counter", "dynamic_scale") + EXTRA_STATE:
        if name in default:
            children[name] = default[name]
    accumulator = wrapper.accumulator
    if accumulator is not None and accumulator.buffers:
        children["accumulation_micro_step"] = accumulator.micro_step
        if "buffers" not in aliases or aliases["buffers"][0] is not accumulator:
            aliases["buffers"] = (accumulator, _buffers_trackable(accumulator.buffers))
        children["accumulation_buffers"] = aliases["buffers"][1]
    children.update(state.checkpoint_children())  # healed layers, spike history
    return children


def _buffers_trackable(buffers) -> Any:
    """A checkpoint child saving every replica's accumulation buffers."""
    names = [str(i) for i in range(len(buffers))]

    def save() -> dict:
        return {name: tf.constant(rows)
                for name, rows in zip(names, _replica_rows(buffers))}

    def restore(tensors: dict) -> None:
        _assign_rows(buffers, [np.asarray(tensors[name], np.float32) for name in names])

    return _internals.checkpoint_value(save, restore)
