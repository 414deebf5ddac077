"""``MixedPrecisionWarning``, the one warning class tf_mixed says mistakes with.

Below every concern, so the optimizer, the loop helpers and the callbacks warn
with one class; its one public home is ``tf_mixed.callbacks.MixedPrecisionWarning``.
"""

from __future__ import annotations

__all__ = ["MixedPrecisionWarning"]


class MixedPrecisionWarning(UserWarning):
    """A mixed-precision set-up that will train badly or not at all."""
