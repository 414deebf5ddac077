"""Per-layer plans with the choices a test names, for the bench's "per-layer plan" row.

`injected` replaces `tf_mixed.bench.plan_row.make_plan`: no timing, so what the
row does follows the test, not this host's hardware.
"""

from tf_mixed._internal.facts import FLOAT32_HEADS
from tf_mixed.tools.planning.plan_table import LayerChoice, Plan


def injected(keep_first_float32: bool):
    """A ``make_plan(model, train_set)`` choosing bfloat16 for every layer, or, with
    ``keep_first_float32``, float32 for the first layer with weights."""
    def make_plan(model, train_set):
        rows, kept = [], False
        for layer in model.layers[1:]:
            head = type(layer).__name__ in FLOAT32_HEADS
            first = keep_first_float32 and not kept and bool(layer.weights) and not head
            kept = kept or first
            seconds = {"float32": 2e-3, "bfloat16": 1e-3} if layer.weights else {}
            rows.append(LayerChoice(layer.name, type(layer).__name__, seconds, 0.0, 0.0,
                                    "float32" if head or first else "bfloat16", "injected"))
        return Plan(model.name, "mixed_bfloat16", "bfloat16", ("float32", "bfloat16"),
                    tuple(rows), {"float32": 0.01, "bfloat16": 0.005, "plan": 0.005},
                    "injected by the test", "test host")

    return make_plan
