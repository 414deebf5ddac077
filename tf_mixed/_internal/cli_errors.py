"""The bench's error types."""

# `UsageError` carries the flag, the value received, what is accepted and how to
# fix it; the CLI prints its message as one line and exits with status 2. It is
# a `ValueError`, so a caller that is not the CLI gets an ordinary error.
# `ChildFailed` is a policy's process that failed for another reason.

from __future__ import annotations


class UsageError(ValueError):
    """A flag has a value that cannot be used.

    Attributes:
        flag: The flag name without dashes, e.g. ``"model"``.
        value: The value received.
        problem: What is wrong, e.g. ``"unknown model"``.
        accepted: What the flag accepts, e.g. ``"mlp, cnn, resnet18"``.
        fix: Optional hint on how to fix it.
    """

    def __init__(
        self, flag: str, value: object, problem: str, accepted: str = "", fix: str = ""
    ):
        self.flag = flag
        self.value = value
        self.problem = problem
        self.accepted = accepted
        self.fix = fix
        super().__init__(self._message())

    def _message(self) -> str:
        message = f"--{self.flag}={self.value!r}: {self.problem}."
        if self.accepted:
            message += f" Accepted: {self.accepted}."
        if self.fix:
            message += f" {self.fix}"
        return message


def below_minimum(flag: str, value: object, minimum: object, fix: str = "") -> UsageError:
    """The one wording, in every command, for a number under its minimum.

    Args:
        flag: The flag without dashes.
        value: The value received.
        minimum: The smallest value accepted.
        fix: Optional hint, e.g. what 0 means.

    Returns:
        ``UsageError`` reading ``--steps=0: must be at least 1.`` (then ``fix``).
    """
    return UsageError(flag, value, f"must be at least {minimum}", fix=fix)


def unknown(flag: str, value: object, what: str, choices: "list[str] | tuple[str, ...]",
            fix: str = "") -> UsageError:
    """The one wording for a name that is none of ``choices``, with "did you mean".

    Args:
        flag: The flag without dashes.
        value: The value received.
        what: What the value should name, e.g. ``"policy"``.
        choices: Every accepted name.
        fix: Optional hint after the suggestion.

    Returns:
        ``UsageError`` reading ``--policy='mixed_flaot16': unknown policy. Accepted:
        mixed_float16, mixed_bfloat16. Did you mean 'mixed_float16'?``.
    """
    return UsageError(flag, value, f"unknown {what}", ", ".join(choices),
                      " ".join(p for p in (did_you_mean(value, choices), fix) if p))


def did_you_mean(value: object, choices: "list[str] | tuple[str, ...]") -> str:
    """``Did you mean 'x'?`` for the closest of ``choices`` (difflib), or ""."""
    import difflib

    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value.strip().lower(), list(choices), n=1, cutoff=0.6)
    return f"Did you mean {close[0]!r}?" if close else ""


# A flag's type -> how a message names what it takes.
KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}


def wrong_type(flag: str, value: object, kind: str, default: object) -> UsageError:
    """The one wording, in every command, for a value of the wrong type.

    Args:
        flag: The flag without dashes.
        value: The text received.
        kind: The flag's type, a key of `KINDS` (``"int"``, ``"float"``, ``"bool"``).
        default: The flag's default, shown as an example.

    Returns:
        ``UsageError`` reading ``--epochs='zero': not a whole number. Accepted:
        a whole number, such as --epochs=4 (the default).``
    """
    taken = KINDS[kind]
    return UsageError(flag, value, f"not {taken}", f"{taken}, such as --{flag}={default} "
                      "(the default)")


class ChildFailed(RuntimeError):
    """A policy's process failed.

    Attributes:
        usage: Whether it failed on bad input (exit status 2); the message is
            then the child's own one-line error.
    """

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage
