"""What a survey holds for the probe: the outputs' names and the half dtype
the model computes in (`precision_map.Survey.output_names`, `.half_policy`),
so the probe and the plan's loss ask the model nothing more."""

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal import losses
from tf_mixed.policy import precision_map


@pytest.mark.parametrize("name", ZOO)
def test_the_survey_names_the_outputs_as_a_loss_dict_keys_them(name):
    model = ZOO[name].ready()
    found = precision_map.survey(model)
    assert list(found.output_names) == losses.output_names(model)
    assert len(found.output_names) == len(keras.tree.flatten(model.outputs))


def test_a_sequential_models_outputs_are_named_by_their_layer():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="last")])
    assert precision_map.survey(model).output_names == ("last",)


def test_a_functional_models_outputs_keep_keras_names():
    inputs = keras.Input((3,))
    h = keras.layers.Dense(2, name="h")(inputs)
    model = keras.Model(inputs, {"b": keras.layers.Dense(1, name="b")(h),
                                 "a": keras.ops.add(h, 1.0)})
    assert precision_map.survey(model).output_names == tuple(model.output_names)


@pytest.mark.parametrize("name", ZOO)
def test_a_float32_model_has_no_half_policy(name):
    assert precision_map.survey(ZOO[name].ready()).half_policy is None


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", ["functional", "nested", "multi_output", "embedding"])
def test_a_converted_model_has_its_half_policy(name, policy):
    mixed = tf_mixed.convert(ZOO[name].ready(), policy)
    assert precision_map.survey(mixed).half_policy == policy


def test_the_first_half_layer_names_it_before_the_models_own_policy():
    inputs = keras.Input((4,))
    h = keras.layers.Dense(4, dtype="mixed_bfloat16", name="half")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(h))
    model.dtype_policy = keras.DTypePolicy("mixed_float16")
    assert precision_map.survey(model).half_policy == "mixed_bfloat16"


def test_a_model_whose_layers_all_stay_float32_has_its_own_policys():
    # convert gives the copy the target policy even when every layer it
    # left ended up float32 on purpose: the model was made mixed.
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(inputs))
    model.dtype_policy = keras.DTypePolicy("mixed_float16")
    assert precision_map.survey(model).half_policy == "mixed_float16"


def test_a_subclassed_model_is_surveyed_without_a_graph():
    # The monitor's fit-start tap surveys whatever model fit trains; a
    # subclassed model has no inputs, outputs or operations (AttributeError).
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3, name="dense")

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.ones((2, 4), "float32"))
    found = precision_map.survey(model)
    assert found.outputs == () and found.output_layers == ()
    assert [name for name, _ in found.layers] == ["dense"]
    assert "dense" in found.operations
