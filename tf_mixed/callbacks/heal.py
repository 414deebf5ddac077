"""`Heal`: a ``fit`` callback that moves a layer that keeps overflowing to float32."""

from __future__ import annotations

from typing import Any

import keras
from absl import logging

from tf_mixed._internal import validate as _validate
from tf_mixed.callbacks.monitor import LossScaleFailure
from tf_mixed.scaling.healed_set import retrace_keras_functions
from tf_mixed.scaling.healing import Decision, Healer, HealRule

__all__ = ["Heal"]


class Heal(keras.callbacks.Callback):
    """Heals a ``fit`` run: a layer that keeps overflowing computes in float32.

    Every skipped step of a ``tf_mixed.LossScaleOptimizer`` is attributed to
    a layer inside the step (`tf_mixed.scaling.attribution`). When one layer
    is the culprit of ``skips`` skipped steps within ``window`` steps (a
    forward output, or a gradient at the minimum loss scale: what a lower
    scale cannot cure), that layer and its sublayers move to float32
    compute, the train function is retraced, and the run goes on from the
    next step. Each healing is logged (layer, evidence, step) and
    ``healed_layers`` (a float) is in the batch and epoch logs. A healing
    that would move more than ``max_fraction`` of the layers stops the run
    instead, with the evidence (``model.stop_training``; a
    `LossScaleFailure` with ``raise_on_failure=True``).

    The healed set is kept in the optimizer's state (``.keras``,
    ``.weights.h5``, ``tf.train.Checkpoint``): a resumed run (``BackupAndRestore``,
    a restored checkpoint) moves the same layers before its first step. The
    moved layers' policy is float32 in the model's config, so a saved
    ``.keras`` model loads healed. Rule and defaults: docs/healing.md.

    Example:

    ```python
    model.fit(x, y, callbacks=[tf_mixed.LossScaleMonitor(), tf_mixed.callbacks.Heal()])
    ```

    Args:
        skips: Culprit skips of one layer that move it (default 5).
        window: Steps the count looks back over (default 50).
        max_fraction: Largest fraction of the attributed layers that may move
            (default 0.25; at least one layer).
        check_every_n_batches: How often the rule runs (default 1: a read of
            one scalar per batch while nothing is attributed).
        raise_on_failure: Raise `LossScaleFailure` at the limit instead of
            only stopping.

    Raises:
        ValueError: for a knob that breaks its rule (the message names it).
    """

    def __init__(self, skips: int = HealRule.skips, window: int = HealRule.window,
                 max_fraction: float = HealRule.max_fraction,
                 check_every_n_batches: int = 1, raise_on_failure: bool = False):
        super().__init__()
        self.rule = HealRule(skips=skips, window=window, max_fraction=max_fraction)
        self.check_every_n_batches = _validate.number(
            check_every_n_batches, "check_every_n_batches", integer=True,
            valid="an integer >= 1, such as 1", rule=lambda v: v >= 1, owner="Heal")
        self.raise_on_failure = _validate.boolean(raise_on_failure, "raise_on_failure",
                                                  owner="Heal")
        self.healer: Healer | None = None
        self.healings: list = []
        self.stopped: str | None = None
        self._batches = 0

    def get_config(self) -> dict[str, Any]:
        return {"skips": self.rule.skips, "window": self.rule.window,
                "max_fraction": self.rule.max_fraction,
                "check_every_n_batches": self.check_every_n_batches,
                "raise_on_failure": self.raise_on_failure}

    @property
    def healed_layers(self) -> tuple:
        """Names of the layers moved to float32 (in this run or a resumed one)."""
        return () if self.healer is None else self.healer.healed

    def set_model(self, model) -> None:
        # Before every callback's on_train_begin: the attribution state must
        # exist when BackupAndRestore loads the optimizer's.
        super().set_model(model)
        self._attach()

    def _attach(self) -> bool:
        if self.healer is not None:
            return True
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or not model.built:
            return False
        if not optimizer.built:
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
        self.healer = Healer(model, optimizer, self.rule)
        return True

    def on_train_begin(self, logs=None):
        self._batches = 0
        self.stopped = None
        if self._attach():
            self._reapply()

    def on_epoch_begin(self, epoch, logs=None):
        # After every on_train_begin: a BackupAndRestore listed after this
        # callback has restored the healed set by now.
        if self.healer is not None:
            self._reapply()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        if self.healer is None:
            # A model fit built at its first step: attribute from the next.
            if self._attach():
                self.model.make_train_function(force=True)
            return
        self._batches += 1
        if self._batches % self.check_every_n_batches == 0:
            self._act(self.healer.check())
        logs["healed_layers"] = float(len(self.healed_layers))

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        if self.healer is not None:
            self._act(self.healer.check())
        logs["healed_layers"] = float(len(self.healed_layers))

    def _reapply(self) -> None:
        assert self.healer is not None
        moved = self.healer.reapply()
        if moved:
            logging.warning("tf_mixed healing: resumed with layers %s in float32 compute "
                            "(healed before); the step is retraced.", list(moved))
            self._retrace()

    def _act(self, decision: Decision) -> None:
        assert self.healer is not None
        if decision.stop is not None and self.stopped is None:
            self.stopped = decision.stop
            self.model.stop_training = True
            message = f"tf_mixed healing stopped the run: {decision.stop}"
            logging.error(message)
            if self.raise_on_failure:
                raise LossScaleFailure(message)
        if decision.move:
            message = self.healer.message(decision)
            self.healings.append(message)
            logging.warning(message)
            self._retrace()

    def _retrace(self) -> None:
        retrace_keras_functions(self.model)
