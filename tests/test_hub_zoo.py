"""Every model-taking API of tf_mixed over the KerasHub zoo (`zoo.HUB`).

KerasHub 0.32 models built from config, tiny, nothing downloaded (design
fact 30): Gemma's backbone and causal LM, Llama's backbone, a BERT
classifier, ViT's backbone. Importing keras_hub takes seconds: these run in
the slow tier.
"""

import logging
import sys
import warnings

import keras
import numpy as np
import pytest
from zoo import HUB, HUB_LEN

import tf_mixed
from tf_mixed._internal.shims import sublayers
from tf_mixed.models import cloning

pytestmark = pytest.mark.slow

COPYABLE = [name for name, spec in HUB.items() if spec.copyable]
UNCOPYABLE = [name for name, spec in HUB.items() if not spec.copyable]


def _np(value):
    return [np.asarray(keras.ops.convert_to_numpy(v), dtype="float32")
            for v in keras.tree.flatten(value)]


def _one_sentence(message):
    return message.endswith(".") and ". " not in message and "\n" not in message


def _under(policy, build):
    keras.config.set_dtype_policy(policy)
    try:
        return build()
    finally:
        keras.config.set_dtype_policy("float32")


# ---------------------------------------------------------------- copies


@pytest.mark.parametrize("name", COPYABLE)
def test_convert_and_probe_of_a_copyable_hub_model(name):
    spec = HUB[name]
    model = spec.ready()
    x, y = spec.data(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        new = tf_mixed.convert(model, "mixed_bfloat16")
    for want, got in zip(_np(model(x)), _np(new(x))):
        np.testing.assert_allclose(got, want, atol=0.05 * (np.abs(want).max() + 1))
    loss = spec.loss if spec.loss == "mse" else keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)
    report = tf_mixed.probe(model, x, y, loss=loss, half_gradients=False)
    assert report.first_nonfinite is None


@pytest.mark.parametrize("name", UNCOPYABLE)
def test_a_hub_layer_that_does_not_round_trip_is_refused_in_one_sentence(name, tmp_path):
    spec = HUB[name]
    model = spec.ready()
    x, y = spec.data(2)
    calls = {
        "convert": lambda: tf_mixed.convert(model, "mixed_bfloat16"),
        "export": lambda: tf_mixed.export(model, tmp_path / "half", precision="bfloat16"),
        "probe": lambda: tf_mixed.probe(model, x, y, loss="mse"),
    }
    for call in calls.values():
        with pytest.raises(cloning.CopyRefused) as raised:
            call()
        message = str(raised.value)
        assert _one_sentence(message), message
        assert "keras_hub class" in message and "precision='as_trained'" in message


@pytest.mark.parametrize("name", UNCOPYABLE)
def test_an_as_trained_export_makes_no_copy(name, tmp_path, monkeypatch):
    spec = HUB[name]
    model = spec.ready()
    x, _ = spec.data(2)

    def no_copy(*args, **kwargs):
        raise AssertionError("export(precision='as_trained') copied the model")

    monkeypatch.setattr(tf_mixed.models.conversion, "rebuild", no_copy)
    report = tf_mixed.export(model, tmp_path / name, precision="as_trained", sample=x)
    assert report.max_rel_error < 1e-5


@pytest.mark.parametrize("name", ["gemma_causal_lm", "bert_classifier"])
def test_export_takes_a_sample_of_any_sequence_length(name, tmp_path):
    spec = HUB[name]
    model = spec.ready()
    x, _ = spec.data(3)
    assert keras.tree.flatten(model.input)[0].shape == (None, None)
    report = tf_mixed.export(model, tmp_path / name, precision="float32", sample=x)
    assert report.max_rel_error < 1e-5
    assert report.input_shapes[0] == (None, None)


# ---------------------------------------------------------------- findings


def test_audit_judges_a_causal_lms_output_by_its_run_time_dtype():
    model = _under("mixed_float16", HUB["gemma_causal_lm"].build)
    x, _ = HUB["gemma_causal_lm"].data(2)
    assert keras.tree.flatten(model.outputs)[0].dtype == "float16"  # declared
    assert _np(model(x))[0].dtype == np.float32 and model(x).dtype == "float32"  # returned
    report = tf_mixed.audit(model, check_global_policy=False)
    assert report.by_code("half_output") == []
    from tf_mixed.callbacks.monitor import model_setup_problems

    assert not any("half_output" in p or "is float16" in p for p in model_setup_problems(model))
    # A model whose output really is float16 is still reported.
    backbone = _under("mixed_float16", HUB["gemma_backbone"].build)
    assert tf_mixed.audit(backbone, check_global_policy=False).by_code("half_output")


def test_a_model_given_its_policy_by_dtype_gets_true_findings():
    from tf_mixed.callbacks.monitor import model_setup_problems

    model = HUB["gemma_causal_lm"].build("mixed_float16")  # the global policy stays float32
    report = tf_mixed.audit(model)
    assert report.by_code("policy_mismatch") == []
    assert report.by_code("policy_given")[0].severity == "info"
    # KerasHub compiled it with Keras's wrapper; wrap_optimizer needs force=True here.
    finding, = report.by_code("keras_loss_scale_optimizer")
    assert "force=True" in finding.fix
    problems = " ".join(model_setup_problems(model))
    assert "built before the policy was set" not in problems
    assert "force=True" in problems


def test_float8_quantize_finds_the_layers_keras_finds():
    reference = HUB["gemma_causal_lm"].build()
    reference.quantize("float8")
    keras_found = sum(getattr(layer.dtype_policy, "quantization_mode", None) == "float8"
                      for layer in sublayers(reference))
    assert keras_found >= 7
    model = HUB["gemma_causal_lm"].build()
    plan = tf_mixed.float8.quantization.quantize(model, keep_float32=())
    assert len(plan.choices) == keras_found
    assert len(plan.quantized) == keras_found
    assert all("/decoder_block_0/" in name for name in plan.quantized)


def test_census_of_a_causal_lm_has_no_false_alarms():
    from tf_mixed.tools.census import census

    spec = HUB["gemma_causal_lm"]
    model = spec.build("mixed_float16")
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = spec.data(4)
    report = census(model, x, y, batch_size=4)
    assert report.by_code("float64_input") == []  # a NumPy scalar in a layer is not data
    assert all(m.value != HUB_LEN for m in report.misfits)  # a token count is not a width
    assert {i.reason for i in report.islands} == {"inside_layer"}
    assert any(i.layer.endswith("token_embedding") for i in report.islands)


def test_enable_says_what_it_changes_in_from_preset(caplog):
    import keras_hub  # noqa: F401  the user's import

    assert "keras_hub" in sys.modules
    with caplog.at_level(logging.WARNING):
        tf_mixed.enable("mixed_bfloat16", quiet=True)
    notes = [r.getMessage() for r in caplog.records if "from_preset" in r.getMessage()]
    assert len(notes) == 1
    assert "'mixed_bfloat16' (variables in float32, computing in bfloat16)" in notes[0]
