"""The one error type for bad command-line input to `python -m tf_mixed`.

`UsageError` carries the flag, the value received, what is accepted and how to
fix it; the CLI prints its message as one line and exits with status 2.
Library functions in `data`, `models` and `bench` raise it so that a caller
that is not the CLI still gets an ordinary `ValueError`.
"""

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
