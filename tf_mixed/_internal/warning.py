"""``MixedPrecisionWarning``, the one warning class tf_mixed says mistakes with.

It lives here, below every concern, so the optimizer (`tf_mixed.scaling`) and
the callbacks warn with the same class; ``tf_mixed.callbacks.MixedPrecisionWarning``
and ``tf_mixed.callbacks.MixedPrecisionWarning`` are this class.
"""

from __future__ import annotations

__all__ = ["MixedPrecisionWarning"]


class MixedPrecisionWarning(UserWarning):
    """A mixed-precision set-up that will train badly or not at all."""
