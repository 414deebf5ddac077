"""Checking numeric and bool arguments: one helper, one exception per kind of error."""

# Every public function that takes a number or a flag checks it here, so the
# same mistake gets the same exception and the same message everywhere:
#
# * the wrong type (a string, None, a bool where a number is due, a float
#   where an integer is due) raises `ArgumentTypeError`, a ``TypeError`` that
#   is also a ``ValueError``: Keras's convention (TypeError for a wrong type)
#   and tf_mixed's promise that ``except ValueError`` catches every bad value
#   of an argument both hold;
# * a number of the right type that breaks its rule (``patience=0``, a NaN
#   scale) raises ``ValueError``.
#
# Messages name the argument, the value received, its type and what is valid:
# ``LossScaleMonitor argument `patience` must be an integer >= 1. Received:
# patience=0.``

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

__all__ = ["ArgumentTypeError", "boolean", "number"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (both a TypeError and a ValueError)."""


def _where(name: str, owner: str | None) -> str:
    return f"{owner} argument `{name}`" if owner else f"`{name}`"


def number(value: Any, name: str, *, valid: str,
           rule: Callable[[Any], bool] | None = None, integer: bool = False,
           integral_floats: bool = False, owner: str | None = None) -> Any:
    """Checks a numeric argument; returns it as a Python ``int`` or ``float``.

    Numpy scalars are accepted; bools (Python or numpy) are not numbers here.

    Args:
        value: The value received.
        name: The argument's name, as the caller spells it.
        valid: What is valid, for the message ("an integer >= 1").
        rule: Called with the converted value; False raises ValueError.
            None: any finite or infinite number of the right type.
        integer: Whether an integer is due (else any real number).
        integral_floats: With ``integer``, also accept floats with an
            integral value (``100.0``), converted to ``int``.
        owner: The function or class named in the message, or None.

    Returns:
        The value as ``int`` (``integer``) or ``float``.

    Raises:
        ArgumentTypeError: if ``value`` is not a number of the right kind.
        ValueError: if it breaks ``rule``.
    """
    converted: int | float | None = None
    # numpy's bool_ is not a numbers.Real; Python's bool is, and is refused.
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not integer:
            converted = float(value)
        elif isinstance(value, numbers.Integral):
            converted = int(value)
        elif integral_floats and math.isfinite(value) and float(value).is_integer():
            converted = int(float(value))
    if converted is None:
        raise ArgumentTypeError(
            f"{_where(name, owner)} must be {valid}. Received: {name}={value!r} "
            f"(of type {type(value).__name__}).")
    if rule is not None and not rule(converted):
        raise ValueError(
            f"{_where(name, owner)} must be {valid}. Received: {name}={value!r}.")
    return converted


def boolean(value: Any, name: str, *, owner: str | None = None,
            valid: str = "True or False", hint: str = "") -> bool:
    """Checks a flag: ``True`` or ``False`` only (not 0/1, not None).

    Args:
        value: The value received.
        name: The argument's name.
        owner: The function or class named in the message, or None.
        valid: What is valid, for the message.
        hint: Appended to the message (a sentence saying what to pass).

    Returns:
        ``value``.

    Raises:
        ArgumentTypeError: if ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise ArgumentTypeError(
            f"{_where(name, owner)} must be {valid}. Received: "
            f"{name}={value!r} (of type {type(value).__name__}).{hint}")
    return value
