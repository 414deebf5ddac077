"""The monitor's view of an optimizer: one adapter per kind it can watch."""

# `view_of` picks `TfMixedView` (``tf_mixed.LossScaleOptimizer``: every rule
# exact), `KerasWrapperView` (``keras.optimizers.LossScaleOptimizer``: skips
# derived from ``iterations``) or `PlainView` (any other optimizer, or none:
# nothing is skipped). The monitor asks the view and never branches on the kind.

from __future__ import annotations

from typing import Any

import keras
from absl import logging

from tf_mixed.callbacks import skip_contract, stop_rules
from tf_mixed.callbacks.stop_rules import Snapshot
from tf_mixed.scaling import compensated
from tf_mixed.scaling import optimizer as loss_scale_module
from tf_mixed.scaling.loss_tally import LossTally
from tf_mixed.scaling.rollback import forward_variables

__all__ = ["KerasWrapperView", "PlainView", "TfMixedView", "view_of"]


class PlainView:
    """An optimizer that does not scale the loss (or no optimizer at all).

    Nothing is ever skipped; only the NaN and set-up checks apply and the
    scale reads as its ``loss_scale_factor`` or 1.0.

    Args:
        optimizer: A Keras optimizer, or None (a model not compiled).
    """

    kind: stop_rules.Kind = "none"
    said = ("the optimizer ({name}) does not scale the loss; only the NaN and "
            "set-up checks apply.")

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer

    def log_seen(self) -> None:
        """Logs (absl, INFO) which optimizer the monitor sees."""
        logging.info("tf_mixed.LossScaleMonitor: %s",
                     self.said.format(name=type(self.optimizer).__name__))

    def scales_loss(self) -> bool:
        """Whether the optimizer multiplies the loss by a scale."""
        return False

    def inner(self) -> Any:
        """The optimizer that updates the weights."""
        return self.optimizer

    def compensates_bfloat16(self) -> bool:
        """Whether bfloat16 weights are updated with compensation."""
        return compensated.compensation_of(self.inner()) is not None

    def prepare(self, model, rollback: bool) -> None:
        """At ``on_train_begin``: hands the optimizer what it needs (nothing)."""

    def corrects_epoch_loss(self, model) -> bool:
        """Whether the epoch loss is replaced by the tally of applied steps."""
        return False

    def judges_loss_by_tally(self) -> bool:
        """Whether the NaN rule reads the optimizer's tally, not Keras's loss."""
        return False

    def threshold(self, min_scale: float | None) -> float:
        """The scale counted as "minimum" by the stop rules."""
        return 1.0 if min_scale is None else min_scale

    def snapshot(self) -> Snapshot:
        """One read of everything the rules need (plain Python values)."""
        if self.optimizer is None:
            return Snapshot(scale=1.0, applied=0)
        state = loss_scale_module.loss_scale_state(self.optimizer)
        return Snapshot(scale=float(state.scale), applied=self._applied())

    def _applied(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def updates(self, batches):
        """Optimizer steps taken for ``batches`` batches."""
        return batches

    def applied_nothing(self, progress) -> bool:
        """Whether the epoch so far applied no step, from exact counters (False: unknown)."""
        return False

    def refresh(self, rollback: bool) -> None:
        """At an epoch's start: refreshes the rollback copies (nothing here)."""

    def wire_cause(self, model) -> str | None:
        """`tf_mixed.callbacks.stop_rules.wire_cause`; None: no wire to blame."""
        return None


class KerasWrapperView(PlainView):
    """Keras's own ``keras.optimizers.LossScaleOptimizer``.

    It keeps no skip counter: the rules derive skips from ``iterations``
    (`tf_mixed.callbacks.stop_rules`), and the epoch loss is not corrected.
    """

    kind: stop_rules.Kind = "keras"
    said = ("the optimizer is Keras's own keras.optimizers.LossScaleOptimizer "
            "(tf_mixed.wrap_optimizer was not used); skips are derived from "
            "iterations and the epoch loss is not corrected.")

    def scales_loss(self) -> bool:
        return True

    def inner(self) -> Any:
        return self.optimizer.inner_optimizer


class TfMixedView(KerasWrapperView):
    """``tf_mixed.LossScaleOptimizer``: its own counters, every rule exact."""

    kind: stop_rules.Kind = "tf_mixed"
    said = "the optimizer is tf_mixed.LossScaleOptimizer; every rule applies."

    def scales_loss(self) -> bool:
        # A pass-through wrapper (fixed scale 1) does not.
        return self.optimizer.dynamic or self.optimizer.initial_scale != 1.0

    def prepare(self, model, rollback: bool) -> None:
        """Hands the model's forward state and a loss tally to the optimizer.

        A step traced before either would not feed them, so the train
        function is made again when anything changed (it retraces once).
        """
        optimizer = self.optimizer
        changed = False
        with model.distribute_strategy.scope():
            wanted = tuple(id(v) for v in forward_variables(model))
            tracked = tuple(id(v) for v in optimizer.tracked_forward_variables)
            if wanted != tracked:
                # roll_back=False: said on purpose, so the optimizer neither
                # rolls the state back nor refuses the step that leaves it.
                optimizer.track_forward_state(model, roll_back=rollback)
                changed = True
            # With the skip contract Keras's own loss leaves skipped steps out;
            # a tally is needed only where an open accumulation window shows a
            # micro-batch's NaN before its window is judged.
            if optimizer.loss_tally is None and optimizer.accumulator is not None:
                optimizer.attach_loss_tally(LossTally())
                changed = True
            # A skipped batch enters no metric and no loss; logs["skipped"].
            changed = skip_contract.install(model) or changed
        if changed and getattr(model, "train_function", None) is not None:
            model.make_train_function(force=True)

    def corrects_epoch_loss(self, model) -> bool:
        # With the skip contract Keras's loss already leaves skipped steps out.
        # It is missing only where something replaced the train step that
        # `prepare` wrapped (a later callback); the tally, where there is one
        # (accumulation), then gives the epoch loss.
        return not skip_contract.installed(model)

    def judges_loss_by_tally(self) -> bool:
        return self.optimizer.loss_tally is not None

    def threshold(self, min_scale: float | None) -> float:
        # Its own minimum, whatever the monitor was given.
        return self.optimizer.min_scale

    def snapshot(self) -> Snapshot:
        state = loss_scale_module.loss_scale_state(self.optimizer)
        tally = self.optimizer.loss_tally
        loss_sum, loss_steps = tally.totals() if tally else (0.0, 0)
        return Snapshot(scale=float(state.scale), applied=self._applied(),
                        skipped=state.skipped_steps,
                        min_scale_skips=state.min_scale_skips,
                        loss_sum=loss_sum, loss_steps=loss_steps,
                        calibration=state.calibration_skips)

    def applied_nothing(self, progress) -> bool:
        # tf_mixed's counters are exact (Keras's wrapper's skips are derived
        # from batch counts, and its epoch loss is nan there anyway).
        return 0 < progress.steps_in_epoch <= progress.skipped_in_epoch

    def updates(self, batches):
        # With accumulation, one update per window.
        accumulator = self.optimizer.accumulator
        if batches and accumulator is not None:
            return batches // accumulator.steps
        return batches

    def refresh(self, rollback: bool) -> None:
        # After every callback's on_train_begin (a BackupAndRestore restore,
        # in either order), so the copies hold the state the epoch starts from.
        if rollback:
            loss_scale_module.refresh_forward_state(self.optimizer)

    def wire_cause(self, model) -> str | None:
        return stop_rules.wire_cause(
            keras.backend.standardize_dtype(model.compute_dtype),
            self.optimizer.communication_dtype)


def view_of(optimizer: Any) -> PlainView:
    """The adapter for ``optimizer`` (None: a model without an optimizer).

    Args:
        optimizer: A Keras optimizer or None.

    Returns:
        A `TfMixedView`, `KerasWrapperView` or `PlainView`.
    """
    if isinstance(optimizer, loss_scale_module.LossScaleOptimizer):
        return TfMixedView(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return KerasWrapperView(optimizer)
    return PlainView(optimizer)
