"""One precision value: `decide`'s rules in order, the map as Keras's DTypePolicyMap,
and what a plan, audit or probe shows for a layer is what applying builds (over the zoo)."""

import json

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal.facts import walk_layers
from tf_mixed.policy import hardware, precision_map
from tf_mixed.policy.precision_map import PrecisionMap, decide
from tf_mixed.tools.planning import LayerTiming, Measurement
from tf_mixed.tools.planning.layer_timing import layer_graph
from tf_mixed.tools.planning.plan_table import Plan
from tf_mixed.tools.planning.planner import plan

AMX_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16"}))


def _every_rule():
    ids = keras.Input((3,), name="ids")  # float token ids straight from an input
    feats = keras.Input((4,), name="feats")
    e = keras.layers.Embedding(1000, 4, name="emb")(ids)  # ids above 256: bfloat16 rounds
    e = keras.layers.Flatten(name="flat")(e)
    n = keras.layers.Normalization(name="norm")(feats)
    h = keras.layers.Concatenate(name="cat")([e, n])
    h = keras.layers.Dense(8, name="kept")(h)
    h = keras.layers.Dense(8, name="planned")(h)
    h = keras.layers.Dense(8, name="healed")(h)
    probs = keras.layers.Dense(3, activation="softmax", name="probs")(h)
    value = keras.layers.Dense(1, name="value")(h)
    return keras.Model([ids, feats], [probs, value], name="every_rule")


def test_each_rule_sets_its_layers_in_the_stated_order():
    model = _every_rule()
    precision = decide(model, "mixed_bfloat16", keep_float32=["kept"],
                       plan={"planned": "float32", "probs": "mixed_bfloat16",
                             "norm": "mixed_bfloat16", "healed": "mixed_bfloat16"},
                       healed=["healed"])
    assert precision_map.RULES == ("float32 head", "statistics", "token ids", "keep_float32",
                                   "plan", "healed")
    assert precision.reasons == {
        "emb": "token ids", "flat": "target", "norm": "statistics", "cat": "target",
        "kept": "keep_float32", "planned": "plan", "healed": "healed", "probs": "plan",
        "value": "float32 head"}
    # The plan cannot move out of float32 what an earlier rule kept there ('norm'),
    # and healing moves a planned half layer to float32 last.
    assert precision.layers == {
        "emb": "float32", "flat": "mixed_bfloat16", "norm": "float32", "cat": "mixed_bfloat16",
        "kept": "float32", "planned": "float32", "healed": "float32",
        "probs": "mixed_bfloat16", "value": "float32"}
    assert precision.heads == {"probs": "softmax"}  # computed as logits, a float32 head after
    policy_for = precision.policy_for(model)
    assert policy_for(model.get_layer("norm")) == "float32"
    assert policy_for(model.get_layer("flat")) == "mixed_bfloat16"
    with pytest.raises(ValueError, match="'chain' does not have: \\['cat', 'emb', "):
        precision.policy_for(_chain())
    assert precision.float32_names() == ("emb", "norm", "kept", "planned", "healed", "value")


def test_a_float32_target_sets_every_layer_float32_and_no_head():
    precision = decide(_every_rule(), "float32")
    assert set(precision.layers.values()) == {"float32"}
    assert precision.heads == {} and precision.float32_names() == ()


def test_the_map_is_keras_dtype_policy_map_and_back_losslessly():
    precision = decide(_every_rule(), "mixed_float16", keep_float32=["kept"])
    keras_map = precision.to_keras()
    assert isinstance(keras_map, keras.dtype_policies.DTypePolicyMap)
    assert keras_map.default_policy.name == "mixed_float16"
    assert keras_map["kept"].name == "float32" and keras_map["flat"].name == "mixed_float16"
    back = PrecisionMap.from_keras(keras_map)
    assert (back.target, back.layers) == (precision.target, precision.layers)
    assert keras_map["healed"].name == "mixed_float16"  # not in the map: the default


def test_a_dict_round_trips_and_every_bad_value_is_named():
    precision = decide(_every_rule(), "mixed_bfloat16")
    assert PrecisionMap.from_dict(json.loads(json.dumps(precision.to_dict()))) == precision
    with pytest.raises(ValueError, match="'target' and 'layers'"):
        PrecisionMap.from_dict(["float32"])
    with pytest.raises(ValueError, match="layer 'kept'.*not a policy Keras knows.*'float33'"):
        PrecisionMap("mixed_bfloat16", {"kept": "float33"})
    with pytest.raises(ValueError, match="layer 'kept' must be a float policy.*'int8_from_"):
        PrecisionMap("mixed_bfloat16", {"kept": "int8_from_float32"})
    with pytest.raises(ValueError, match="reasons must be among"):
        PrecisionMap("float32", {"a": "float32"}, {"a": "because"})


def test_keep_float32_names_the_model_lacks_are_refused_with_close_matches():
    with pytest.raises(ValueError, match="'kep'.*did you mean 'kept'"):
        decide(_every_rule(), "mixed_bfloat16", keep_float32=["kep"])


# ------------------------------------------------ what is shown is what is built


def _fake_timer(model, batch, precisions, half_policy):
    """Every timed layer faster in half precision (so the plan picks half)."""
    timed, producers, followers = layer_graph(model)
    rows = tuple(LayerTiming(layer.name, type(layer).__name__, producers[layer.name],
                             {p: (1e-3 if p == "float32" else 5e-4,) * 3 for p in precisions},
                             (1e-5,) * 3) for layer in timed)
    return Measurement(tuple(precisions), rows, followers)


def _built(applied) -> dict[str, str]:
    """Top-level layer name -> the dtype it computes in, as built; a layer split
    into logits and a float32 head reads as its logits (the head is float32)."""
    built = {layer.name: keras.backend.standardize_dtype(layer.compute_dtype)
             for layer in applied.layers}
    for name in list(built):
        for suffix in ("_logits", "_half"):
            if name.endswith(suffix) and name[: -len(suffix)] in built:
                built[name[: -len(suffix)]] = built.pop(name)
    return built


def _audited(applied) -> dict[str, str]:
    """Layer name -> the compute dtype `tf_mixed.audit` prints for it (a layer
    split into logits and a float32 head reads as its logits, as `_built`)."""
    shown = {row.name: row.compute_dtype for row in tf_mixed.audit(applied).rows}
    for name in list(shown):
        for suffix in ("_logits", "_half"):
            if name.endswith(suffix) and name[: -len(suffix)] in shown:
                shown[name[: -len(suffix)]] = shown.pop(name)
    return shown


def _check_plan_shows_what_applying_builds(model, x, y):
    p = plan(model, x, y, loss="mse", info=AMX_CPU, timer=_fake_timer, probe_report={},
             step_check=False, cache=False)
    applied = p.apply(model)
    built = _built(applied)
    assert {row.name: row.choice for row in p.layers} == {
        row.name: built[row.name] for row in p.layers}
    # What audit prints for each layer of the applied model is the plan's row
    # (audit lists the layers inside a nested model, which the map names too).
    audited = _audited(applied)
    assert {row.name: row.choice for row in p.layers if row.name in audited} == {
        row.name: audited[row.name] for row in p.layers if row.name in audited}
    expected = {name: p.precision_map.compute_dtype(name) for name in audited}
    assert {n: d for n, d in audited.items() if expected[n] not in (None, "float8")} == {
        n: d for n, d in expected.items() if d not in (None, "float8")}
    # The plan read back from JSON builds the same.
    back = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert _built(back.apply(model)) == built
    return p, applied


@pytest.mark.parametrize("name", ZOO)
def test_a_plan_shows_what_applying_builds_over_the_zoo(name):
    spec = ZOO[name]
    x, y = spec.data(8)
    _check_plan_shows_what_applying_builds(spec.ready(), x, y)


def test_a_plan_row_of_a_statistics_layer_says_float32_as_built():
    inputs = keras.Input((4,))
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(np.arange(40, dtype="float32").reshape(10, 4) * 1e3)
    h = keras.layers.Dense(8, name="hidden")(norm(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(h))
    x = np.ones((8, 4), "float32")
    p, applied = _check_plan_shows_what_applying_builds(model, x, np.zeros((8, 1), "float32"))
    row = {r.name: r for r in p.layers}["norm"]
    assert row.choice == "float32" and row.why.startswith("statistics")
    assert p.precision.reasons["norm"] == "statistics"


@pytest.mark.parametrize("name", ZOO)
def test_a_plan_shows_what_applying_builds_under_a_strategy_scope(name, mirrored):
    spec = ZOO[name]
    with mirrored.scope():
        model = spec.ready()
    x, y = spec.data(8)
    _check_plan_shows_what_applying_builds(model, x, y)


@pytest.mark.parametrize("name", ["functional", "nested", "embedding"])
def test_probe_computes_each_layer_as_convert_builds_it(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    report = tf_mixed.probe(model, x, y, loss=spec.loss, policy="mixed_bfloat16")
    converted = tf_mixed.convert(model, "mixed_bfloat16")
    outputs = {t._keras_history.operation.name for t in keras.tree.flatten(converted.outputs)}
    built = {layer.name: keras.backend.standardize_dtype(layer.compute_dtype)
             for _, layer in walk_layers(converted)}
    for row in report.layers:
        leaf = row.name.rsplit("/", 1)[-1]
        if leaf in built and leaf not in outputs:  # output layers: convert's float32 head
            assert row.compute_dtype == built[leaf], row.name


# ------------------------------------------------------------ loading a plan


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("policy"), "needs the key 'policy'"),
    (lambda r: r.update(policy="mixed_bfloat17"), "'policy' must be one of"),
    (lambda r: r.update(layers="first"), "'layers' must be a list"),
    (lambda r: r["layers"][0].update(choice="int8"), r"layers\[0\]\['choice'\].*'first'"),
    (lambda r: r["layers"][0].pop("why"), r"layers\[0\] needs the key 'why'"),
    (lambda r: r["precision"]["layers"].update(first="float64"), "'precision'.*'first'"),
])
def test_every_value_a_plan_loads_from_is_checked_with_a_clear_error(change, message):
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="last")(h))
    p = plan(model, np.ones((8, 8), "float32"), np.ones((8, 1), "float32"), loss="mse",
             info=AMX_CPU, timer=_fake_timer, probe_report={}, step_check=False, cache=False)
    record = json.loads(json.dumps(p.to_dict()))
    change(record)
    with pytest.raises(ValueError, match=message):
        Plan.from_dict(record)
    with pytest.raises(ValueError, match="must be a dict"):
        Plan.from_dict("plan.json")


def _chain():
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    h = keras.layers.Dense(16, name="second")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="last")(h), name="chain")


def test_enable_with_a_plan_builds_what_the_plan_shows_and_apply_builds():
    x, y = np.ones((8, 8), "float32"), np.ones((8, 1), "float32")
    p = plan(_chain(), x, y, loss="mse", info=AMX_CPU, timer=_fake_timer, probe_report={},
             step_check=False, cache=False)
    # 'last' is the regression output: float32 as convert keeps it, though half was faster.
    assert p.choices == {"first": "bfloat16", "second": "bfloat16", "last": "float32"}
    applied = _built(p.apply(_chain()))
    assert {k: applied[k] for k in p.choices} == p.choices
    tf_mixed.enable("auto", plan=p, quiet=True)
    built = _built(_chain())
    assert {k: built[k] for k in p.choices} == p.choices


def test_a_plan_record_from_before_the_precision_value_reads_its_rows():
    x, y = np.ones((8, 8), "float32"), np.ones((8, 1), "float32")
    p = plan(_chain(), x, y, loss="mse", info=AMX_CPU, timer=_fake_timer, probe_report={},
             step_check=False, cache=False)
    record = json.loads(json.dumps(p.to_dict()))
    del record["precision"]
    old = Plan.from_dict(record)
    assert old.precision is None
    assert old.precision_map.layers == {"first": "mixed_bfloat16", "second": "mixed_bfloat16",
                                        "last": "float32"}
    built, expected = _built(old.apply(_chain())), _built(p.apply(_chain()))
    assert {k: built[k] for k in p.choices} == {k: expected[k] for k in p.choices}
