"""enable() and KerasHub's from_preset: said only when keras_hub is imported."""

import sys
import types

from tf_mixed.policy import global_policy


def test_the_from_preset_note_needs_keras_hub_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "keras_hub", raising=False)
    assert global_policy.from_preset_note("mixed_float16") is None
    monkeypatch.setitem(sys.modules, "keras_hub", types.ModuleType("keras_hub"))
    assert global_policy.from_preset_note("float32") is None
    note = global_policy.from_preset_note("mixed_float16")
    assert note == (
        "tf_mixed: KerasHub's from_preset() now loads a float preset under 'mixed_float16' "
        "(variables in float32, computing in float16), not in the preset's own dtype: pass "
        "dtype= to from_preset() to choose, such as dtype='bfloat16' for bfloat16 weights.")
