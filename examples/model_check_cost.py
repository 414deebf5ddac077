"""What auto's check on the model's own step decides, and what it costs, on this host.

    python examples/model_check_cost.py --model=mobilenetv2
    python examples/model_check_cost.py --model=efficientnetb0
    python examples/model_check_cost.py --model=resnet50

Trains with README.md's `fit` lines (`tf_mixed.enable()`, `wrap_optimizer`,
`LossScaleMonitor`) a `keras.applications` model (weights=None, small
inputs, random data) for a run of ``--epochs`` x ``--train_size /
--batch_size`` steps, long enough that the check's budget (5% of the planned
training, at most 60 s of CPU) covers a trace of the step, and stops
``--steps_after`` steps after the check's verdict (a real run would go on in
the policy decided). Prints the machine (CPU, bfloat16 flags, load), what
`enable()` chose, the check's verdict with its figures, its cost in CPU
seconds (`time.process_time`, robust on a shared machine) and the wall and
CPU seconds from the first step to the verdict, then the step time after it.
Uses a fresh cache directory, so the check measures.
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tf_mixed  # noqa: E402

MODELS = {"mobilenetv2": "MobileNetV2", "efficientnetb0": "EfficientNetB0",
          "resnet50": "ResNet50"}


def _model(name, size, classes):
    if name == "dense":  # a small model, for a quick run of the script itself
        return keras.Sequential([keras.Input((size, size, 3)), keras.layers.Flatten(),
                                 keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(classes), tf_mixed.OutputActivation("softmax")])
    base = getattr(keras.applications, MODELS[name])(
        weights=None, input_shape=(size, size, 3), classes=classes,
        classifier_activation=None)  # logits, in half precision
    outputs = tf_mixed.OutputActivation("softmax")(base.output)  # softmax in float32
    return keras.Model(base.inputs, outputs, name=base.name)


class _After(keras.callbacks.Callback):
    """Times each step; stops ``steps`` steps after the monitor's verdict."""

    def __init__(self, monitor, steps):
        super().__init__()
        self.monitor, self.steps, self.begun = monitor, steps, None
        self.start = self.verdict_at = None
        self.after = []

    def on_train_batch_begin(self, batch, logs=None):
        self.begun = (time.perf_counter(), time.process_time())
        if self.start is None:
            self.start = self.begun

    def on_train_batch_end(self, batch, logs=None):
        check = self.monitor.model_check
        decided = check is None or not check.active
        if decided and self.verdict_at is None:
            self.verdict_at = (time.perf_counter(), time.process_time())
            return
        if self.verdict_at is not None:
            self.after.append(time.perf_counter() - self.begun[0])
            if len(self.after) >= self.steps:
                self.model.stop_training = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "dense"], default="mobilenetv2")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--train_size", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--steps_after", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("TF_MIXED_CACHE_DIR", tempfile.mkdtemp(prefix="tf_mixed_check_"))
    info = tf_mixed.policy.hardware.detect()
    flags = sorted(f for f in info.cpu_flags if "bf16" in f or f.startswith("amx"))
    print(f"host: {info.cpu_model}, {os.cpu_count()} CPUs, flags {' '.join(flags) or 'none'}; "
          f"load average {os.getloadavg()[0]:.2f}")

    enabled = tf_mixed.enable()          # "auto": chooses for this hardware
    print(f"enable(): {enabled.policy} - {enabled.reason}")
    rng = np.random.default_rng(0)
    x = rng.random((args.train_size, args.image_size, args.image_size, 3), dtype=np.float32)
    y = rng.integers(0, 5, args.train_size)
    model = _model(args.model, args.image_size, 5)
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam()),
                  loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor()
    after = _After(monitor, args.steps_after)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              callbacks=[monitor, after])

    check = monitor.model_check
    verdict = None if check is None else check.verdict
    print(f"model: {model.name}, {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"planned {args.epochs} epochs x {-(-args.train_size // args.batch_size)} steps")
    if verdict is None:
        print("check: " + (check.skipped if check is not None else "not run"))
    else:
        print(f"check: {verdict.action}, trains in {verdict.policy}"
              + (f" with {len(verdict.plan.float32_layers)} layers in float32"
                 if verdict.action == "planned" else "")
              + f"; cost {verdict.cost_s:.1f} s of CPU (the check's own figure)")
        print(verdict.message)
    if after.verdict_at is not None and after.start is not None:
        wall = after.verdict_at[0] - after.start[0]
        cpu = after.verdict_at[1] - after.start[1]
        print(f"first step to verdict: {wall:.1f} s wall, {cpu:.1f} s CPU (training steps and "
              f"traces included)")
    if after.after:
        print(f"step after the verdict: median {1e3 * statistics.median(after.after):.0f} ms "
              f"wall over {len(after.after)} steps; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
