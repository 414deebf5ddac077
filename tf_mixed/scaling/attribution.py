"""Which layer made a skipped step non-finite, found inside the step itself."""

# `LayerAttribution.attach(model, optimizer)` splits the model into the layers
# it attributes (`attributed_layers`: every layer of the model, nested models
# entered, each layer that holds layers counted as one block) and, from then
# on, every step of ``optimizer`` that is skipped names its *culprit*:
#
# * **forward**: the first layer, in the model's layer order (topological for
#   a functional model), whose output held a NaN or an infinity on any replica
#   or worker. Each attributed layer's ``call`` is wrapped (one shim,
#   `tf_mixed._internal.shims.wrap_call`) so its outputs are noted while the
#   step is traced; no extra pass runs. With one replica the outputs are
#   checked only in the branch of a skipped step (a ``tf.cond`` on the
#   verdict): an applied step pays nothing but the cond. With several
#   replicas each replica's per-layer flags (one float per layer) ride the
#   step's single gradient all-reduce as one more piece of its buffer
#   (`tf_mixed.scaling.pipeline`), so every replica reads the same summed
#   flags and names the same culprit.
# * **gradient**: when every forward output was finite, the layer closest to
#   the output whose variables' reduced gradients are not finite: the first
#   place the backward pass overflowed (everything before it is poisoned by
#   it). A layer without variables cannot be named this way. The kind says
#   whether the loss scale was already at its minimum (a gradient overflow
#   above it is the scale's own business: it backs off).
#
# The counters live in variables of their own (`AttributionState`, aggregation
# "none": every replica writes the same values, computed from the all-reduced
# verdict): skips per layer, a ring of the last `LOG_SIZE` attributed skips
# (step, layer, kind) and which layers were healed. A ``tf.train.Checkpoint``
# of the optimizer holds them (child ``layer_attribution``), and so do its
# ``.keras``/``.weights.h5`` entries (one entry, `STORE_KEY`). The optimizer
# keeps its attribution in an `AttributionSlot`, one part of its step state
# (`tf_mixed.scaling.step_state`): the one attached, or a state read from a
# file before any was.


from __future__ import annotations

import json
import threading
import weakref
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.scaling import healed_set
from tf_mixed.scaling.healed_set import attributed_layers
from tf_mixed.scaling.waiting import Waiting, note_model_call

__all__ = ["FORWARD", "GRADIENT", "GRADIENT_AT_MIN_SCALE", "KINDS", "LOG_SIZE",
           "STORE_KEY", "AttributedSkip", "AttributionReading", "AttributionSlot",
           "LayerAttribution", "attributed_layers"]

FORWARD, GRADIENT, GRADIENT_AT_MIN_SCALE = 0, 1, 2
KINDS = {FORWARD: "forward output", GRADIENT: "gradient",
         GRADIENT_AT_MIN_SCALE: "gradient at the minimum loss scale"}
LOG_SIZE = 64
"""How many attributed skips the ring keeps (the healing window reads it)."""

STORE_KEY = "layer_attribution"


class AttributedSkip(NamedTuple):
    """One skipped step and its culprit: optimizer step (1-based), layer, kind."""

    step: int
    layer: str
    kind: int


class AttributionReading(NamedTuple):
    """One host read of the attribution state (the same on every replica)."""

    counts: dict
    skips: tuple
    healed: tuple


class _Recorder:
    """Layer outputs noted while a step is traced, per graph and thread.

    Under ``MirroredStrategy`` every replica traces the step in its own
    thread of the same graph; the optimizer step of a replica reads what
    that replica's forward pass noted.
    """

    _EAGER = object()
    _LIMIT_FACTOR = 4

    def __init__(self, groups: int):
        self.groups = groups
        self._lock = threading.Lock()
        self._by_graph: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._eager: dict = {}

    def _table(self) -> dict:
        if tf.executing_eagerly():
            return self._eager
        graph = tf.compat.v1.get_default_graph()
        table = self._by_graph.get(graph)
        if table is None:
            table = self._by_graph[graph] = {}
        return table

    def note(self, group: int, outputs) -> None:
        tensors = [t for t in tf.nest.flatten(outputs)
                   if isinstance(t, (tf.Tensor, tf.Variable)) and t.dtype.is_floating]
        if not tensors:
            return
        with self._lock:
            records = self._table().setdefault(threading.get_ident(), [])
            records.append((group, tensors))
            # A forward pass no step consumes (predict, evaluate) must not
            # hold its tensors for ever.
            del records[:-self._LIMIT_FACTOR * max(self.groups, 1) - 8]

    def take(self) -> list:
        with self._lock:
            return self._table().pop(threading.get_ident(), [])


class AttributionState(tf.Module):
    """The attribution's variables (checkpointed with the optimizer)."""

    def __init__(self, groups: int):
        super().__init__(name="layer_attribution")

        def variable(name, shape):
            return keras.Variable(np.zeros(shape, np.int64), dtype="int64",
                                  trainable=False, aggregation="none", name=name)

        self.counts = variable("culprit_counts", (groups,))
        self.log = variable("culprit_log", (LOG_SIZE, 3))
        self.log_size = variable("culprit_log_size", (1,))
        self.healed = variable("healed", (groups,))

    def ordered(self) -> list:
        return [self.counts, self.log, self.log_size, self.healed]


class LayerAttribution:
    """In-step attribution of skipped steps to layers (see the module doc).

    Create it with `attach`; `tf_mixed.scaling.pipeline` calls
    `local_outputs`, `forward_flags` and `record` during each step.
    """

    def __init__(self, model, optimizer, layers, slot: "AttributionSlot | None" = None):
        self.model = model
        self.optimizer = optimizer
        self.slot = slot if slot is not None else AttributionSlot()
        self.names = [name for name, _ in layers]
        self.layers = [layer for _, layer in layers]
        self._recorder = _Recorder(len(self.layers))
        self._group_of_variable: dict = {}
        for group, layer in enumerate(self.layers):
            for variable in layer.trainable_variables:
                self._group_of_variable.setdefault(id(variable), group)
        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        with strategy.scope():
            self.state = AttributionState(len(self.layers))
        for group, layer in enumerate(self.layers):
            _internals.wrap_call(layer, _noting(self._recorder, group))

    # ------------------------------------------------------------- set-up

    @classmethod
    def attach(cls, model, optimizer) -> "LayerAttribution":
        """Attributes every skipped step of ``optimizer`` to a layer of ``model``.

        Attaching again to the same model returns the attribution in place.
        Call it before the step is traced (``Heal`` does, in ``set_model``)
        and, under a strategy, with the model built in its scope. State read
        from a saved optimizer before this call (`AttributionSlot.load_from`)
        is applied here. The attribution lives in the optimizer's
        `AttributionSlot` (``optimizer.step_state.attribution``).

        Args:
            model: A built ``keras.Model``.
            optimizer: A ``tf_mixed.LossScaleOptimizer`` (checked by the caller).

        Returns:
            The attribution.

        Raises:
            ValueError: if the model is not built, has no layer to attribute,
                is attached to another model, or the optimizer accumulates
                gradients (a window sums micro-steps: not attributed yet).
        """
        # The optimizer's type is checked by the caller (`tf_mixed.scaling.
        # healing.Healer`): importing the optimizer here would be a circle.
        if optimizer.accumulator is not None:
            raise ValueError(
                "Layer attribution does not support gradient accumulation yet. "
                "Received: gradient_accumulation_steps="
                f"{optimizer.accumulator.steps}. Train without accumulation to heal.")
        slot = optimizer.step_state.attribution
        present = slot.attached
        if present is not None:
            if present.model is not model:
                raise ValueError(
                    "This optimizer already attributes skips to the layers of model "
                    f"'{present.model.name}'. Received: model '{model.name}'. Use one "
                    "optimizer per model.")
            return present
        if not model.built:
            raise ValueError(
                f"Layer attribution needs a built model. Received: model '{model.name}'"
                " not built yet. Build it (keras.Input, or call it on a batch) first.")
        layers = attributed_layers(model)
        if not layers:
            raise ValueError(
                f"Model '{model.name}' has no layer to attribute skips to. Received: "
                f"{len(model.layers)} layers, none but inputs.")
        attribution = cls(model, optimizer, layers, slot)
        slot.attached = attribution
        pending, slot.pending = slot.pending, None
        if pending is not None:
            attribution.assign_saved(pending)
        slot.take_waiting(attribution)
        return attribution

    def detach(self) -> None:
        """Unwraps the layers' calls and forgets the optimizer (state kept)."""
        for layer in self.layers:
            _internals.unwrap_call(layer)
        if self.slot.attached is self:
            self.slot.attached = None

    # ----------------------------------------------------------- the step

    def local_outputs(self) -> list:
        """The outputs this replica's forward pass noted in this trace."""
        return self._recorder.take()

    def forward_flags(self, records) -> tf.Tensor:
        """A float32 ``[layers]`` vector: 1.0 where a noted output is not finite."""
        flags = [tf.constant(False)] * len(self.layers)
        for group, tensors in records:
            bad = [tf.logical_not(tf.reduce_all(tf.math.is_finite(t))) for t in tensors]
            flags[group] = tf.reduce_any(tf.stack([flags[group]] + bad))
        return tf.cast(tf.stack(flags), tf.float32)

    def _gradient_flags(self, grads, variables) -> tf.Tensor:
        flags = [tf.constant(False)] * len(self.layers)
        for grad, variable in zip(grads, variables):
            group = self._group_of_variable.get(id(variable))
            if grad is None or group is None:
                continue
            values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
            flags[group] = tf.logical_or(
                flags[group], tf.logical_not(tf.reduce_all(tf.math.is_finite(values))))
        return tf.stack(flags)

    def record(self, finite, grads, variables, forward) -> None:
        """Names the culprit of a skipped step and writes the counters.

        Args:
            finite: The global verdict (True: applied, nothing recorded).
            grads, variables: The all-reduced gradients and their variables.
            forward: The summed forward flags (`forward_flags` all-reduced),
                or a callable that computes them (one replica: only run on
                a skipped step).
        """
        optimizer = self.optimizer
        groups = len(self.layers)

        # Everything but the cond runs on a skipped step only: an applied
        # step (the good path) pays for the cond and nothing else.
        def culprit():
            flags = forward() if callable(forward) else forward
            forward_bad = tf.greater(flags, 0.0)
            grad_bad = self._gradient_flags(grads, variables)
            at_min = tf.less_equal(optimizer.dynamic_scale.value,
                                   tf.cast(optimizer.config.min_scale, tf.float32))
            index = tf.range(groups, dtype=tf.int64)
            first_forward = tf.reduce_min(tf.where(forward_bad, index, groups))
            last_grad = tf.reduce_max(tf.where(grad_bad, index, -1))
            is_forward = first_forward < groups
            group = tf.where(is_forward, first_forward, last_grad)
            kind = tf.where(is_forward, tf.constant(FORWARD, tf.int64),
                            tf.where(at_min, tf.constant(GRADIENT_AT_MIN_SCALE, tf.int64),
                                     tf.constant(GRADIENT, tf.int64)))
            self._write(group, kind)
            return tf.constant(True)

        tf.cond(finite, lambda: tf.constant(False), culprit)

    def _write(self, group, kind) -> None:
        """Counts a skip of culprit ``group`` (-1: none named) and logs it."""
        optimizer = self.optimizer
        named = tf.greater_equal(group, 0)
        state = self.state
        steps = tf.cast(optimizer.iterations, tf.int64) + tf.cast(
            optimizer.skipped_steps.value, tf.int64) + 1
        state.counts.assign_add(tf.one_hot(group, len(self.layers), dtype=tf.int64))
        size = state.log_size.value[0]
        entry = tf.stack([steps, group, kind])
        row = tf.one_hot(size % LOG_SIZE, LOG_SIZE, dtype=tf.int64)[:, None]
        log = state.log.value
        state.log.assign(tf.where(named, log * (1 - row) + row * entry[None, :], log))
        state.log_size.assign_add(tf.reshape(tf.cast(named, tf.int64), [1]))

    # -------------------------------------------------------- host reads

    def read(self) -> AttributionReading:
        """The counters in Python values (one host read)."""
        counts = self.state.counts.numpy()
        log = self.state.log.numpy()
        size = int(self.state.log_size.numpy()[0])
        healed = self.state.healed.numpy()
        rows = [log[i % LOG_SIZE] for i in range(max(0, size - LOG_SIZE), size)]
        skips = tuple(AttributedSkip(int(r[0]), self.names[int(r[1])], int(r[2]))
                      for r in rows if 0 <= int(r[1]) < len(self.names))
        return AttributionReading(
            counts={n: int(c) for n, c in zip(self.names, counts) if c},
            skips=skips,
            healed=tuple(n for n, h in zip(self.names, healed) if h))

    def log_size(self) -> int:
        """How many skips were attributed so far (a one-scalar read)."""
        return int(self.state.log_size.numpy()[0])

    def mark_healed(self, names) -> None:
        """Writes ``names`` into the healed set (every replica's copy)."""
        healed = self.state.healed.numpy().copy()
        for name in names:
            healed[self.index(name)] = 1
        self.state.healed.assign(healed)

    def index(self, name: str) -> int:
        """The position of the layer called ``name``.

        Raises:
            ValueError: for a name the attribution does not know.
        """
        if name not in self.names:
            raise ValueError(
                f"No attributed layer is called {name!r}. Valid names: "
                f"{', '.join(self.names)}.")
        return self.names.index(name)

    # ---------------------------------------------------- saving, loading

    def saved(self) -> dict:
        """The state as plain values, keyed by layer name (`STORE_KEY`)."""
        reading = self.read()
        return {"layers": self.names, "counts": reading.counts,
                "skips": [list(s) for s in reading.skips], "healed": list(reading.healed)}

    def assign_saved(self, saved: dict) -> None:
        """Writes a `saved` dict back (unknown names refused).

        Saved names are matched to this model's as
        `tf_mixed.scaling.healed_set.resolve` says: by name, or the layer
        Keras renamed with an ``_N`` suffix at this load.
        """
        skips = saved.get("skips", [])[-LOG_SIZE:]
        wanted = (list(saved.get("healed", ())) + list(saved.get("counts", {}))
                  + [name for _, name, _ in skips])
        resolution = healed_set.resolve(self.model, wanted, saved.get("layers"))
        unknown = [n for n in dict.fromkeys(wanted)
                   if resolution.names.get(n) not in self.names]
        if unknown:
            raise ValueError(
                f"The saved layer attribution names layers this model lacks: {unknown}. "
                f"Received a state for layers {saved.get('layers')}; this model's: "
                f"{self.names}. Restore into the model that was saved.")

        def index(name):
            return self.index(resolution.names[name])

        counts = np.zeros(len(self.names), np.int64)
        for name, count in saved.get("counts", {}).items():
            counts[index(name)] = count
        log = np.zeros((LOG_SIZE, 3), np.int64)
        for i, (step, name, kind) in enumerate(skips):
            log[i] = (step, index(name), kind)
        healed = np.zeros(len(self.names), np.int64)
        for name in saved.get("healed", ()):
            healed[index(name)] = 1
        self.state.counts.assign(counts)
        self.state.log.assign(log)
        self.state.log_size.assign(np.array([len(skips)], np.int64))
        self.state.healed.assign(healed)

    def adopt(self, counters: dict) -> None:
        """Writes counters a checkpoint held (`tf_mixed.scaling.waiting.COUNTERS`) back.

        Raises:
            ValueError: if they count another number of layers than this model
                attributes (nothing written).
        """
        state = {"counts": self.state.counts, "log": self.state.log,
                 "log_size": self.state.log_size, "healed": self.state.healed}
        wrong = {name: counters[name].shape for name, variable in state.items()
                 if tuple(counters[name].shape) != tuple(variable.shape)}
        if wrong:
            raise ValueError(
                f"The restored layer attribution counts {len(counters['counts'])} layers; "
                f"model '{self.model.name}' attributes {len(self.names)}: {self.names}. "
                "Restore into the model that was saved.")
        for name, variable in state.items():
            variable.assign(counters[name])


def _noting(recorder: _Recorder, group: int):
    def after_call(outputs):
        recorder.note(group, outputs)
    return after_call


# ------------------------------------------- the optimizer's saving hooks


class AttributionSlot:
    """Where an optimizer keeps its layer attribution (a part of its step state).

    Every restore of the healed set it saves moves the layers at once
    (`tf_mixed.scaling.healed_set.apply_restored`) in the model it trains:
    the attached attribution's; else the model whose state is being restored
    when that model's optimizer owns this slot (Keras's
    ``load_weights``/``load_model``, a ``tf.train.Checkpoint`` holding the
    model); else the model last called with this optimizer compiled in
    (`owner`). With none of them (a checkpoint of the optimizer alone, read
    before its model was ever called), the set is `unapplied`: the next call
    of a model compiled with this optimizer, `tf_mixed.training.make_train_step`
    or an attached healer moves it, and a step of the optimizer refuses to run
    before (`refuse_unapplied`). The counters a checkpoint holds wait in
    `waiting` for an attribution and are saved again meanwhile.

    Attributes:
        attached: The `LayerAttribution` attached to the optimizer, or None.
        pending: A state read from a file or checkpoint before any attribution
            was attached (applied by `LayerAttribution.attach`), or None.
        waiting: The checkpoint child listed while nothing is attached
            (`tf_mixed.scaling.waiting.Waiting`), once made, or None.
        owner: A weak reference to the model last called with this
            optimizer compiled in (`tf_mixed.scaling.waiting.note_model_call`), or None.
        unapplied: ``(names, order)`` of a healed set restored with no model
            to move, or None.
    """

    store_keys = (STORE_KEY,)

    def __init__(self) -> None:
        self.attached: LayerAttribution | None = None
        self.pending: dict | None = None
        self.waiting: Waiting | None = None
        self.owner: weakref.ref | None = None
        self.unapplied: tuple | None = None
        _internals.add_layer_call_hook(note_model_call)

    def save_into(self, store) -> None:
        """Adds the attribution state to a ``.keras``/``.weights.h5`` store entry.

        Nothing attached, a state read from a file (`pending`) is written back
        as read: a load and a save without healing keep the healed set.
        """
        saved = self.pending if self.attached is None else self.attached.saved()
        if saved is None:
            return
        text = json.dumps(saved).encode()
        store[STORE_KEY] = np.frombuffer(text, np.uint8)

    def load_from(self, store) -> None:
        """Reads `STORE_KEY` from a store and moves the healed layers it names.

        Nothing attached, the state is kept for a later `attach`.
        """
        if STORE_KEY not in list(store.keys()):
            return
        saved = json.loads(bytes(np.asarray(store[STORE_KEY][...], np.uint8)).decode())
        if self.attached is None:
            self.pending = saved
        else:
            self.attached.assign_saved(saved)
        self._apply(list(saved.get("healed", ())), saved.get("layers"))

    def checkpoint_children(self) -> dict:
        """``{"layer_attribution": ...}`` for a ``tf.train.Checkpoint``, or ``{}``.

        Attached, the attribution's state. Nothing attached, `waiting`: a
        child taking the healed map and the counters (a checkpoint hands a
        value only to an object listed when it is read), listed during every
        ``tf.train.Checkpoint`` read, and for a save while it holds what a
        read or a file gave (`pending` healed names, counters); else nothing,
        as before healing existed.
        """
        if self.attached is not None:
            return {STORE_KEY: self.attached.state}
        reading = _internals.checkpoint_being_read()
        if self.waiting is None:
            if not reading and not self.pending_healed():
                return {}
            self.waiting = Waiting(_internals.checkpoint_value(
                lambda: healed_set.to_tensors(self.pending_healed()), self._restore_waiting))
        self.waiting.list_counters(reading)
        if not (reading or self.pending_healed() or self.waiting.counters() is not None):
            return {}
        return {STORE_KEY: self.waiting}

    def pending_healed(self) -> tuple:
        """Healed layer names read from a file before any attribution was attached."""
        return tuple((self.pending or {}).get("healed", ()))

    def claim(self, model) -> tuple:
        """``model`` trains with this optimizer: a healed set restored with no
        model to move (`unapplied`) moves its layers now.

        Returns:
            The names whose layer moved now.
        """
        if self.owner is None or self.owner() is not model:
            self.owner = weakref.ref(model)
        if self.unapplied is None:
            return ()
        (names, order), self.unapplied = self.unapplied, None
        return healed_set.apply_restored(model, names, order)

    def refuse_unapplied(self) -> None:
        """Raises before a step while a restored healed set waits for its model.

        Raises:
            ValueError: if `unapplied` holds a set: the step would train the
                healed layers in half precision.
        """
        if self.unapplied is None:
            return
        raise ValueError(
            f"This optimizer's restored state holds healed layers {self.unapplied[0]} "
            "(moved to float32 compute before it was saved), and no model has taken "
            "them: the checkpoint held the optimizer without its model, and no model "
            "compiled with this optimizer has been called since. A step now would train "
            "them in half precision. Before the step, compile the model with this "
            "optimizer (model.compile(optimizer=optimizer, ...)), restore with the model "
            "(tf.train.Checkpoint(model=model, optimizer=optimizer)), use "
            "tf_mixed.training.make_train_step(model, loss, optimizer), or attach healing "
            "(tf_mixed.scaling.Healer(model, optimizer)).")

    def take_waiting(self, attribution: LayerAttribution) -> None:
        """Hands a newly attached ``attribution`` what waited for it: the
        counters a checkpoint held, and a healed set no model took."""
        held = None if self.waiting is None else self.waiting.counters()
        if self.waiting is not None and held is not None:
            attribution.adopt(held)
            self.waiting.forget_counters()
        if self.unapplied is not None:
            (names, order), self.unapplied = self.unapplied, None
            healed_set.apply_restored(attribution.model, names, order)

    def _restore_waiting(self, tensors: dict) -> None:
        names = healed_set.from_tensors(tensors)
        if names:
            self.pending = dict(self.pending or {}, healed=names)
            self._apply(names)

    def _apply(self, names: list, order=None) -> None:
        """Moves ``names`` in the model this optimizer trains, or holds them
        (`unapplied`) with a warning when no model is known yet."""
        model = self._model()
        if model is not None:
            self.unapplied = None
            healed_set.apply_restored(model, names, order)
            return
        from absl import logging

        self.unapplied = (list(names), order)
        logging.warning(
            "tf_mixed healing: the restored optimizer state holds healed layers %s, and "
            "no model was restored with it or called with it yet. They move to float32 "
            "compute at the next call of a model compiled with this optimizer, at "
            "make_train_step(model, loss, optimizer), or when healing is attached; a "
            "step of this optimizer refuses to run before. A step function traced "
            "before this restore computes them in half precision: create it again.",
            list(names))

    def _model(self):
        """The model this optimizer trains, if known: attached, being restored, or `owner`."""
        if self.attached is not None:
            return self.attached.model
        restoring = self._restoring()
        if restoring is not None:
            return restoring
        owner = None if self.owner is None else self.owner()
        return owner if owner is not None and self._owned_by(owner) else None

    def _owned_by(self, model) -> bool:
        state = getattr(getattr(model, "optimizer", None), "step_state", None)
        return state is not None and state.attribution is self

    def _restoring(self):
        """The model whose state is being restored now, when its optimizer owns this slot."""
        return _internals.model_being_restored(self._owned_by)
