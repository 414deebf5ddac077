"""tf_mixed.scaling.step_state: one record of a step's riders, owned by the optimizer."""

import dataclasses
import gc
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import formats, misuse
from tf_mixed.scaling.accumulation import Accumulator, WindowOfOne
from tf_mixed.scaling.attribution import AttributionSlot
from tf_mixed.scaling.optimizer import float32_on_purpose, step_state_of
from tf_mixed.scaling.rollback import ForwardState
from tf_mixed.scaling.step_state import Saved, StepState
from tf_mixed.scaling.write_guard import StepGuard


def _built(**knobs):
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0, **knobs)
    opt.build([w])
    return w, opt


def test_a_new_optimizer_owns_one_record_with_every_part():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    state = opt.step_state
    assert isinstance(state, StepState) and step_state_of(opt) is state
    assert isinstance(state.forward, ForwardState)
    assert isinstance(state.attribution, AttributionSlot) and state.attribution.attached is None
    assert isinstance(state.guard, StepGuard) and state.guard.forward is state.forward
    assert isinstance(state.ledger, misuse.Ledger) and state.ledger.said == set()
    assert state.tally is None and state.float8 is None and state.aliases == {}
    assert [name for name, _ in state.parts()] == [
        "forward", "attribution", "guard", "ledger", "aliases", "calibration"]
    # Another optimizer has none.
    assert step_state_of(keras.optimizers.SGD(1.0)) is None and step_state_of(None) is None


def test_the_record_is_frozen_and_a_later_part_makes_a_new_one():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    before = opt.step_state
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.tally = object()  # type: ignore[misc]
    tally = tf_mixed.scaling.LossTally()
    opt.attach_loss_tally(tally)
    after = opt.step_state
    assert after is not before and before.tally is None
    assert after.tally is tally and opt.loss_tally is tally
    # Every other part is the same object: what was tracked or said stays.
    assert all(getattr(after, f) is getattr(before, f)
               for f in ("forward", "attribution", "guard", "ledger", "aliases",
                         "calibration"))


def test_the_parts_that_save_are_the_attribution_the_guard_and_the_calibration():
    state = StepState.new()
    assert state.saved_parts() == [state.attribution, state.guard, state.calibration]
    assert all(isinstance(part, Saved) for part in state.saved_parts())
    assert not isinstance(state.ledger, Saved) and not isinstance(state.forward, Saved)
    assert state.store_keys() == {"layer_attribution", "skip_reasons", "last_skip_reason",
                                  "spike_guard", "calibration_skips"}
    # Nothing attached, no spike rule, not built: nothing written, no child.
    store: dict = {}
    state.save_into(store)
    assert store == {} and state.checkpoint_children() == {}


class _Extra:
    """A part that saves, unknown to formats.py."""

    store_keys = ("extra",)

    def __init__(self):
        self.value = tf.Variable(3.0)
        self.loaded = None

    def save_into(self, store):
        store["extra"] = np.array([float(self.value.numpy())])

    def load_from(self, store):
        if "extra" in store:
            self.loaded = float(store["extra"][0])

    def checkpoint_children(self):
        return {"extra": self.value}


@dataclasses.dataclass(frozen=True, eq=False)
class _WithExtra(StepState):
    extra: object = None


class _Store(dict):
    """A ``.keras`` store as `formats` reads it (keys and entries)."""


def test_saving_and_loading_iterate_the_parts_without_naming_them():
    _, opt = _built()
    base = opt.step_state
    extra = _Extra()
    state = _WithExtra(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                       extra=extra)
    store = _Store()
    formats.save_own(opt, store, state)
    assert set(store) == {"0", "extra", "calibration_skips", "skip_reasons", "last_skip_reason"}
    _, fresh = _built()
    fresh.step_counter.assign(7)
    formats.load_own(fresh, store, lambda s: pytest.fail("Keras's layout"), state)
    assert extra.loaded == 3.0 and int(fresh.step_counter.numpy()) == 0
    children = formats.checkpoint_children(opt, {}, state)
    assert children["extra"] is extra.value and "inner_optimizer" in children


def test_the_wrappers_of_an_inner_optimizer_are_kept_on_it_not_in_a_registry():
    inner = keras.optimizers.SGD(1.0)
    first = tf_mixed.LossScaleOptimizer(inner)
    second = tf_mixed.LossScaleOptimizer(inner)
    ledger = misuse.inner_ledger(inner)
    assert ledger.wrappers() == [first, second]
    del first
    gc.collect()
    assert ledger.wrappers() == [second]
    assert not any(name.isupper() and not name.startswith("__") and isinstance(value, dict)
                   for name, value in vars(misuse).items())


def test_a_dropped_wrapper_is_remembered_by_its_inner_optimizer():
    inner = keras.optimizers.SGD(1.0)
    w = keras.Variable(np.zeros(2, np.float32))
    first = tf_mixed.LossScaleOptimizer(inner, initial_scale=1.0, dynamic=False)
    first.apply([tf.ones(2)], [w])
    assert misuse.inner_ledger(inner).stepped_by() is first
    del first
    gc.collect()
    second = tf_mixed.LossScaleOptimizer(inner, initial_scale=1.0, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second.apply([tf.ones(2)], [w])
        second.apply([tf.ones(2)], [w])
    said = [str(c.message) for c in caught if "now dropped" in str(c.message)]
    assert len(said) == 1 and misuse.inner_ledger(inner).told_dropped


def test_the_ledger_refuses_an_unsaid_apply_after_unscale_gradients():
    ledger = misuse.Ledger()
    assert misuse.take_unscaled(ledger, None) is False
    misuse.note_unscaled(ledger)
    with pytest.raises(ValueError, match="Received: unscaled=None"):
        misuse.take_unscaled(ledger, None)
    assert ledger.unscaled_since_apply == 0  # counted again from the next call
    misuse.note_unscaled(ledger)
    misuse.note_unscaled(ledger, tf_keras=True)
    assert misuse.take_unscaled(ledger, True) is True
    assert ledger.tf_keras_unscaled is False and ledger.unscaled_since_apply == 0


def test_float32_on_purpose_notes_it_in_the_ledger_of_a_wrapper_only():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    float32_on_purpose(opt)
    assert "built_before_enable" in opt.step_state.ledger.said
    float32_on_purpose(keras.optimizers.SGD(1.0))  # any other optimizer: nothing
    float32_on_purpose(None)


def test_a_single_step_is_a_window_of_one():
    grads = [tf.constant([8.0, 16.0])]
    assert WindowOfOne.steps == 1
    # Its gradients pass as they are, it is always the last micro-step (no op).
    out, unscaled, last = WindowOfOne().collect(grads, None)
    assert out is grads and unscaled is True and last is True
    out, unscaled, last = WindowOfOne().collect(grads, lambda g: pytest.fail("divided"))
    assert out is grads and unscaled is False and last is True
    # A window of two unscales, adds and says when it ends.
    _, opt = _built(gradient_accumulation_steps=2)
    window = opt.accumulator
    assert isinstance(window, Accumulator)
    sums, unscaled, last = window.collect(grads, lambda g: [x / 8.0 for x in g])
    np.testing.assert_array_equal(sums[0], [1.0, 2.0])
    assert unscaled is True and not bool(last)


@pytest.mark.parametrize("steps", [None, 2])
def test_one_pipeline_runs_a_step_and_a_window(steps):
    """The applied steps, bit for bit: a window of one applies each gradient, a window of
    two their mean; a non-finite micro-step discards its window and backs the scale off."""
    w, opt = _built(**({} if steps is None else {"gradient_accumulation_steps": steps}))
    with warnings.catch_warnings():  # hand-made "scaled" gradients: no scale_loss
        warnings.simplefilter("ignore")
        applied = [bool(opt.apply([tf.constant(g)], [w])) for g in
                   ([4.0, 8.0], [12.0, 4.0], [np.inf, 0.0], [4.0, 4.0])]
    state = opt.loss_scale_state()
    if steps is None:
        assert applied == [True, True, False, True]
        np.testing.assert_array_equal(w.numpy(), [-(1 + 3 + 2), -(2 + 1 + 2)])
        assert state.skipped_steps == 1 and state.scale == 2.0
    else:
        assert applied == [True, True, True, False]  # the second window is discarded
        np.testing.assert_array_equal(w.numpy(), [-2.0, -1.5])  # the first window's mean
        assert state.skipped_steps == 1 and state.scale == 2.0
    assert int(opt.iterations.numpy()) == (3 if steps is None else 1)
