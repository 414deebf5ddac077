"""The optional riders of an optimizer's step, as one record the optimizer owns."""

# A ``tf_mixed.LossScaleOptimizer`` keeps its loss-scale state in Keras
# variables (its checkpoint layout is Keras's). Everything else a step may
# carry is one `StepState`, created with the optimizer and read as
# ``optimizer.step_state``:
#
# * ``forward``: the forward state rolled back after a skipped step
#   (`tf_mixed.scaling.rollback`, ``track_forward_state``);
# * ``attribution``: layer attribution of skipped steps, attached or waiting
#   in a file's state (`tf_mixed.scaling.attribution.AttributionSlot`);
# * ``guard``: the write guard, its skip reasons and optional spike rule
#   (`tf_mixed.scaling.write_guard`);
# * ``ledger``: what the misuse checks remember between calls
#   (`tf_mixed.scaling.misuse.Ledger`);
# * ``tally``: the loss tally a monitor attached (`tf_mixed.scaling.loss_tally`), or None;
# * ``float8``: the float8 scales every replica agrees on
#   (`tf_mixed.scaling.float8_sync`), made at ``build``, or None;
# * ``aliases``: the checkpoint aliases `tf_mixed.scaling.formats` keeps for
#   the optimizer's life (one object per alias);
# * ``calibration``: the count of skipped steps that were the loss scale's
#   calibration, before the first applied step
#   (`tf_mixed.scaling.calibration`), made at ``build``.
#
# The record itself is frozen: a part that comes later (the tally, the
# float8 agreement) is a new record (`StepState.with_parts`), made by the
# optimizer only. Each stage of `tf_mixed.scaling.pipeline` and each check of
# `tf_mixed.scaling.misuse` takes the record (or its part) as an argument.
# Saving and loading iterate the parts that save (`Saved`: ``.keras``
# entries, ``tf.train.Checkpoint`` children) without naming them, so a new
# part that saves needs no change in `tf_mixed.scaling.formats`.

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from tf_mixed.scaling.attribution import AttributionSlot
from tf_mixed.scaling.calibration import Calibration
from tf_mixed.scaling.misuse import Ledger
from tf_mixed.scaling.rollback import ForwardState
from tf_mixed.scaling.write_guard import StepGuard

__all__ = ["Saved", "StepState"]


@runtime_checkable
class Saved(Protocol):
    """A part of `StepState` that saves with the optimizer.

    Attributes:
        store_keys: The ``.keras``/``.weights.h5`` entries it may write
            (the optimizer's own entries are the others).
    """

    store_keys: tuple

    def save_into(self, store) -> None:
        """Writes its entries into the optimizer's ``.keras`` store."""

    def load_from(self, store) -> None:
        """Reads its entries back (keeps them for later when not ready)."""

    def checkpoint_children(self) -> dict:
        """Its ``tf.train.Checkpoint`` children, name to trackable."""


@dataclasses.dataclass(frozen=True, eq=False)
class StepState:
    """One optimizer's optional riders (see the module comment).

    Attributes:
        forward: `tf_mixed.scaling.rollback.ForwardState`.
        attribution: `tf_mixed.scaling.attribution.AttributionSlot`.
        guard: `tf_mixed.scaling.write_guard.StepGuard`.
        ledger: `tf_mixed.scaling.misuse.Ledger`.
        tally: `tf_mixed.scaling.LossTally`, or None.
        float8: `tf_mixed.scaling.float8_sync.Float8Sync`, or None.
        aliases: `tf_mixed.scaling.formats`'s checkpoint aliases, name to
            ``(target, alias)``.
        calibration: `tf_mixed.scaling.calibration.Calibration`.
    """

    forward: ForwardState
    attribution: AttributionSlot
    guard: StepGuard
    ledger: Ledger
    tally: Any = None
    float8: Any = None
    aliases: dict = dataclasses.field(default_factory=dict)
    calibration: Calibration = dataclasses.field(default_factory=Calibration)

    @classmethod
    def new(cls) -> StepState:
        """A fresh record: nothing tracked, attached or said yet."""
        forward = ForwardState()
        return cls(forward=forward, attribution=AttributionSlot(),
                   guard=StepGuard(forward), ledger=Ledger())

    def with_parts(self, **parts: Any) -> StepState:
        """This record with ``parts`` (``tally=``, ``float8=``) replaced."""
        return dataclasses.replace(self, **parts)

    def parts(self) -> list[tuple[str, Any]]:
        """``(name, part)`` of every part present, in the record's order."""
        return [(field.name, getattr(self, field.name)) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None]

    def saved_parts(self) -> list[Saved]:
        """The parts that save with the optimizer, in the record's order."""
        return [part for _, part in self.parts() if isinstance(part, Saved)]

    # ------------------------------------------------ saving, every part

    def store_keys(self) -> set:
        """Every ``.keras`` entry a part may write."""
        return {key for part in self.saved_parts() for key in part.store_keys}

    def save_into(self, store) -> None:
        """Each saving part writes its entries into a ``.keras`` store."""
        for part in self.saved_parts():
            part.save_into(store)

    def load_from(self, store) -> None:
        """Each saving part reads its entries back."""
        for part in self.saved_parts():
            part.load_from(store)

    def checkpoint_children(self) -> dict:
        """Every part's ``tf.train.Checkpoint`` children."""
        children: dict = {}
        for part in self.saved_parts():
            children.update(part.checkpoint_children())
        return children
