"""The probe reads the one survey of the model and the copies it makes: after
`precision_map.survey`, it asks Keras's graph nothing more (no walk, no
output or call lists), and its loss is resolved from the survey's output
names."""

import sys

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal import losses
from tf_mixed.policy import precision_map
from tf_mixed.tools import probing

PROBED = [name for name in ZOO if name != "sequential_no_input"]  # built on its first call
# What the survey holds or the copies give: the probe never asks these itself.
ASKED_BEFORE = {("facts.py", "walk_layers"), ("facts.py", "model_outputs"),
                ("facts.py", "layer_outputs"), ("shims.py", "call_outputs"),
                ("precision_map.py", "survey"), ("losses.py", "output_names")}


def _calls(fn):
    """(file, function) of every tf_mixed function `fn()` calls, with its result."""
    seen = set()

    def record(frame, event, arg):
        if event == "call" and "/tf_mixed/" in frame.f_code.co_filename:
            seen.add((frame.f_code.co_filename.rsplit("/", 1)[1], frame.f_code.co_name))

    sys.setprofile(record)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return seen, result


@pytest.mark.parametrize("name", PROBED)
def test_after_the_survey_the_probe_asks_the_graph_nothing(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    found = precision_map.survey(model)
    loss_fn = losses.resolve_named(spec.loss, found.output_names, model, "probe()")
    seen, report = _calls(lambda: probing.probe_surveyed(found, x, y, loss_fn))
    assert not seen & ASKED_BEFORE, seen & ASKED_BEFORE
    assert {row.name for row in report.layers} <= {n for n, _ in found.layers}


@pytest.mark.parametrize("name", ["functional", "nested", "multi_output"])
def test_the_public_probe_walks_the_model_once(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    seen, report = _calls(lambda: tf_mixed.probe(model, x, y, loss=spec.loss))
    assert ("facts.py", "walk_layers") in seen  # the survey's one walk
    assert not seen & (ASKED_BEFORE - {("facts.py", "walk_layers"),
                                       ("precision_map.py", "survey")})
    assert report.layers


def test_a_loss_dict_is_keyed_by_the_surveyed_output_names():
    spec = ZOO["multi_output"]
    model = spec.ready()
    x, y = spec.data(8)
    names = precision_map.survey(model).output_names
    by_list = tf_mixed.probe(model, x, y, loss=spec.loss)
    by_dict = tf_mixed.probe(model, x, dict(zip(names, y)), loss=dict(zip(names, spec.loss)))
    np.testing.assert_allclose([r.rel_error for r in by_dict.layers],
                               [r.rel_error for r in by_list.layers])
    with pytest.raises(ValueError, match=r"does not have: \['nope'\]"):
        tf_mixed.probe(model, x, y, loss={"nope": "mse"})


def test_the_probe_without_a_loss_says_so_naming_itself():
    spec = ZOO["functional"]
    x, y = spec.data(8)
    with pytest.raises(ValueError, match=r"^probe\(\) needs a loss to differentiate"):
        tf_mixed.probe(spec.ready(), x, y)


def test_a_compiled_models_loss_is_the_default():
    spec = ZOO["functional"]
    model = spec.compiled()
    x, y = spec.data(8)
    by_default = tf_mixed.probe(model, x, y)
    given = tf_mixed.probe(model, x, y, loss=spec.loss)
    assert [r.rel_error for r in by_default.layers] == [r.rel_error for r in given.layers]


def test_a_mixed_model_is_probed_in_its_own_half_dtype_read_from_the_survey():
    spec = ZOO["functional"]
    mixed = tf_mixed.convert(spec.ready(), "mixed_bfloat16")
    x, y = spec.data(8)
    found = precision_map.survey(mixed)
    assert found.half_policy == "mixed_bfloat16"
    report = probing.probe_surveyed(found, x, y, losses.resolve_named(
        "mse", found.output_names, mixed, "probe()"))
    assert report.policy == "mixed_bfloat16"
    kept = {n for n, p in precision_map.observed(mixed).layers.items() if p == "float32"}
    for row in report.layers:  # its float32 layers stay float32
        assert (row.compute_dtype == "float32") == (row.name in kept), row.name


def test_a_float32_model_is_probed_in_the_global_half_policy():
    spec = ZOO["functional"]
    model = spec.ready()
    x, y = spec.data(8)
    assert precision_map.survey(model).half_policy is None
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        report = tf_mixed.probe(model, x, y, loss="mse")
    finally:
        keras.config.set_dtype_policy("float32")
    assert report.policy == "mixed_bfloat16"
