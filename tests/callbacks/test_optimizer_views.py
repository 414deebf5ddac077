"""The monitor reads each optimizer kind through one adapter and never branches."""

import ast
import pathlib

import keras
import pytest

import tf_mixed
from tf_mixed.callbacks import monitor, optimizer_views
from tf_mixed.scaling.optimizer import LossScaleOptimizer

MONITOR = pathlib.Path(monitor.__file__)


def test_monitor_never_branches_on_the_optimizer_kind():
    tree = ast.parse(MONITOR.read_text())
    kinds = {"tf_mixed", "keras", "none"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            found.append(ast.unparse(node))
        if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in kinds
                for c in [node.left, *node.comparators]):
            found.append(ast.unparse(node))
    assert found == []


@pytest.mark.slow
@pytest.mark.parametrize("make, view, kind, scales", [
    (lambda: LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0),
     optimizer_views.TfMixedView, "tf_mixed", True),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5)),
     optimizer_views.KerasWrapperView, "keras", True),
    (lambda: keras.optimizers.SGD(0.5), optimizer_views.PlainView, "none", False),
    (lambda: None, optimizer_views.PlainView, "none", False),
])
def test_one_adapter_per_kind(make, view, kind, scales):
    adapter = optimizer_views.view_of(make())
    assert type(adapter) is view
    assert adapter.kind == kind
    assert adapter.scales_loss() is scales
    assert adapter.updates(8) == 8


@pytest.mark.filterwarnings("ignore:LossScaleOptimizer.apply\\(\\) got gradients")  # fed by hand
def test_tf_mixed_view_reads_its_own_counters():
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0,
                             min_scale=2.0, gradient_accumulation_steps=4)
    view = optimizer_views.view_of(opt)
    v = keras.Variable(1.0)
    opt.apply([keras.ops.convert_to_tensor(float("inf"))], [v])
    snap = view.snapshot()
    assert (snap.scale, snap.applied) == (8.0, 0)  # mid-window: nothing decided
    assert view.threshold(None) == 2.0 and view.updates(8) == 2
    assert view.judges_loss_by_tally() is False  # no tally attached yet
    assert view.corrects_epoch_loss(keras.Sequential())


def test_pass_through_wrapper_does_not_scale():
    with tf_mixed.policy_scope("float32"):
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    assert not optimizer_views.view_of(opt).scales_loss()
