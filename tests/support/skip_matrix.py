"""The skipped-step contract's matrix: a run with one bad batch against the
same run with that batch removed from the data (docs/skipped-step.md).

`run` trains a small model under ``fit`` (BatchNormalization, compiled
accuracy, an inner SGD with momentum, EMA and a learning-rate schedule) and
returns every piece of state the contract names; `compare` says, row by row,
whether the bad run ends where the reference ends. Used in-process by
tests/callbacks/test_skip_contract.py and, per worker, by
tests/integration/_skip_worker.py.

The arithmetic is exact by construction: float32 compute, power-of-two loss
scales (a skip halves the scale, and unscaling by a power of two is exact),
so "the same" means bit-identical.
"""

from __future__ import annotations

import numpy as np

FEATURES = 4
CLASSES = 3
BATCH = 8  # global batch; under a strategy each replica gets BATCH / replicas
STEPS = 6
BAD_STEP = 2  # 0-based index of the batch that overflows
ROWS = ("weights", "optimizer", "forward_state", "metrics", "batch_loss",
        "epoch_loss", "history", "float8")
ALL_ROWS = {row: True for row in ROWS}
# Keras's own wrapper, one device (and replica 0 under MirroredStrategy), as
# measured: the inner optimizer is not called on a skip; everything else
# takes the batch.
KERAS_ONE_DEVICE = {**ALL_ROWS, "forward_state": False, "metrics": False,
                    "batch_loss": False, "epoch_loss": False, "history": False}
# Keras's wrapper with float8 layers, one device, as measured: the skip itself
# writes nothing, but the halved loss scale enters the output-gradient
# histories (loss-scaled units), so every later step differs. The float8
# model has no BatchNormalization (forward_state compares nothing).
KERAS_FLOAT8 = {**{row: False for row in ROWS}, "forward_state": True}


def data(steps=STEPS, seed=0):
    """``steps`` fixed batches of (x, y): small integers / 4 (exact in float16)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, size=(steps * BATCH, FEATURES)).astype("float32") / 4
    y = rng.integers(0, CLASSES, size=(steps * BATCH,)).astype("int32")
    return x, y


POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
# The bad batches: an inf in one sample (non-finite input), or a huge but
# finite one (±1e30: finite in float32 and bfloat16, inf in float16). With
# BatchNormalization the huge sample overflows the moving variance while
# every gradient stays finite ("forward"); without it, with Adam, its
# gradients (~1e30) are finite and Adam's square overflows ("update"):
# Adam squares |g| > ~1.8e19 to inf.
KINDS = {"inf": dict(value=np.inf),
         "forward": dict(value=1e30),
         "update": dict(value=-1e30, batchnorm=False, inner="adam")}
# The skip_reason code each (kind, policy) logs (tf_mixed.scaling.write_guard).
REASON = {("inf", p): 1.0 for p in POLICIES}
REASON.update({("forward", p): 2.0 for p in POLICIES})
REASON.update({("update", "float32"): 4.0, ("update", "mixed_bfloat16"): 4.0,
               ("update", "mixed_float16"): 3.0})  # 1e30 is inf in float16


def kind_args(kind):
    """The `build` arguments of a bad-batch kind (`KINDS` without its value)."""
    return {k: v for k, v in KINDS[kind].items() if k != "value"}


def spoil(x, step, replica=0, replicas=1, value=np.inf):
    """``x`` with ``value`` in batch ``step``, in the shard of ``replica``."""
    x = x.copy()
    x[step * BATCH + replica * (BATCH // replicas), 0] = value
    return x


def remove(x, y, steps):
    """``(x, y)`` without the batches in ``steps``."""
    keep = np.ones(len(x), bool)
    for step in steps:
        keep[step * BATCH:(step + 1) * BATCH] = False
    return x[keep], y[keep]


def worker_dataset(strategy, x, y):
    """Each worker's share of every global batch of ``(x, y)`` (no auto-sharding)."""
    import tensorflow as tf

    def per_worker(context):
        workers = context.num_input_pipelines
        share = BATCH // workers
        rows = np.concatenate([
            np.arange(start + context.input_pipeline_id * share,
                      start + (context.input_pipeline_id + 1) * share)
            for start in range(0, len(x), BATCH)])
        return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(
            context.get_per_replica_batch_size(BATCH))

    return strategy.distribute_datasets_from_function(per_worker)


class BatchLogs:
    """Every batch's logs, as Python floats."""

    def __init__(self):
        import keras

        class _Recorder(keras.callbacks.Callback):
            def on_train_batch_end(inner, batch, logs=None):
                self.rows.append({k: float(v) for k, v in (logs or {}).items()})

        self.rows: list[dict] = []
        self.callback = _Recorder()


def build(wrapper="tf_mixed", dropout=False, float8=False, accumulate=None, seed=1,
          dynamic=True, policy=None, batchnorm=True, inner="sgd"):
    """A compiled model; ``wrapper`` "tf_mixed" or "keras" (its own wrapper).

    ``policy`` None: float32 with loss scaling forced (scale 4); a policy
    name: the global policy, and `tf_mixed.wrap_optimizer` as a user gets
    it there (dynamic scaling under mixed_float16, scale 1 otherwise).
    ``inner``: "sgd" (momentum) or "adam", both with EMA and a schedule.
    """
    import keras

    import tf_mixed

    if policy is not None:
        keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu")]
    if not float8 and batchnorm:
        layers.append(keras.layers.BatchNormalization())
    if dropout:
        layers.append(keras.layers.Dropout(0.5, seed=3))
    layers.append(keras.layers.Dense(CLASSES))
    model = keras.Sequential(layers)
    if float8:
        model.quantize("float8")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.5)
    # Keras's own optimizers cannot end a fit with EMA and float8 layers (they
    # write None over the float8 variables); tf_mixed's wrapper can
    # (tf_mixed._internal.shims.overwrite_only_averaged_variables).
    use_ema = not (float8 and wrapper == "keras")
    if inner == "adam":
        inner = keras.optimizers.Adam(schedule, use_ema=use_ema,
                                      ema_overwrite_frequency=None)
    else:
        inner = keras.optimizers.SGD(schedule, momentum=0.5, use_ema=use_ema,
                                     ema_overwrite_frequency=None)
    if wrapper == "tf_mixed":
        optimizer = tf_mixed.wrap_optimizer(
            inner, force=policy is None, initial_scale=4.0, dynamic=dynamic,
            gradient_accumulation_steps=accumulate)
    else:
        optimizer = keras.optimizers.LossScaleOptimizer(inner, initial_scale=4.0)
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def run(x, y, wrapper="tf_mixed", strategy=None, monitor=True, **build_args):
    """One epoch of ``fit``; every piece of state the contract names.

    ``x`` is an array (``y`` its labels) or, with ``y`` None, a distributed
    dataset to fit on (several workers: `worker_dataset`). ``monitor``: True
    (tf_mixed's monitor), False (none), "by_hand" (no monitor; the skip
    contract and the forward state handed over by hand).
    """
    import contextlib

    import tf_mixed

    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = build(wrapper, **build_args)
    if monitor == "by_hand":  # the contract without the monitor, as the docs say
        from tf_mixed.callbacks import skip_contract

        skip_contract.install(model)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model.optimizer.track_forward_state(model)
    logs = BatchLogs()
    callbacks = [tf_mixed.LossScaleMonitor()] if monitor is True else []
    fit_data = dict(x=x) if y is None else dict(x=x, y=y, batch_size=BATCH, shuffle=False)
    history = model.fit(**fit_data, epochs=1, verbose=0,
                        callbacks=[*callbacks, logs.callback])
    inner = model.optimizer.inner_optimizer
    loss_scale = float(model.optimizer.dynamic_scale.numpy())
    float8_state = [_unscaled(v, loss_scale) for v in model.weights if _is_float8(v)]
    forward = [np.asarray(v) for v in model.non_trainable_weights
               if "moving" in v.path]
    return {
        "weights": [np.asarray(v) for v in model.trainable_weights if not _is_float8(v)],
        "optimizer": [np.asarray(v) for v in inner.variables],
        "iterations": int(inner.iterations.numpy()),
        "forward_state": forward,
        "float8": float8_state,
        "metrics": {k: float(v) for k, v in model.get_metrics_result().items()},
        "batch_logs": logs.rows,
        "history": {k: v for k, v in history.history.items()
                    if k in ("loss", "accuracy")},
        "skip_counts": {k: v for k, v in history.history.items()
                        if k.startswith("skipped_") and k != "skipped_fraction"},
    }


def _is_float8(variable):
    """Keras's float8 scales and amax histories (trainable, overwritten)."""
    return "_scale" in variable.path or "_amax_history" in variable.path


def _unscaled(variable, loss_scale):
    """A float8 variable's value; the output-gradient scale without the loss scale.

    Keras's layer divides the *loss-scaled* output gradient by
    ``outputs_grad_scale``, so tf_mixed keeps there the unscaled scale times
    the loss scale, which a skip halves; a power of two, so the division is exact.
    """
    value = np.asarray(variable)
    return value / loss_scale if variable.path.endswith("outputs_grad_scale") else value


def compare(bad, reference, skipped_batches=(BAD_STEP,)):
    """Row -> True when the bad run ends exactly where the reference ends."""
    def same(a, b):
        return len(a) == len(b) and all(
            np.array_equal(u, v, equal_nan=False) for u, v in zip(a, b))

    kept = [row for i, row in enumerate(bad["batch_logs"]) if i not in skipped_batches]
    keys = ("loss", "accuracy")
    return {
        "weights": same(bad["weights"], reference["weights"]),
        "optimizer": (same(bad["optimizer"], reference["optimizer"])
                      and bad["iterations"] == reference["iterations"]),
        "forward_state": same(bad["forward_state"], reference["forward_state"]),
        "float8": same(bad["float8"], reference["float8"]),
        "metrics": bad["metrics"] == reference["metrics"],
        "batch_loss": [{k: r.get(k) for k in keys} for r in kept]
        == [{k: r.get(k) for k in keys} for r in reference["batch_logs"]],
        "epoch_loss": bad["history"].get("loss") == reference["history"].get("loss"),
        "history": bad["history"] == reference["history"],
    }
