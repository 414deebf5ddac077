"""A command's PNG, or one line on stderr when matplotlib is not installed."""

# matplotlib is optional (the ``plot`` extra in pyproject.toml): a command that
# draws a picture beside its results writes the results anyway and says, in one
# line naming the extra, which picture it could not write. Only the standard
# library: the command line imports this before TensorFlow.

from __future__ import annotations

import sys
from typing import Callable

__all__ = ["INSTALL", "png_or_none"]

INSTALL = "pip install 'tf-mixed[plot]'"


def png_or_none(command: str, filename: str, draw: Callable[[], bytes]) -> bytes | None:
    """``draw()``'s PNG bytes, or None with one line on stderr if matplotlib is missing.

    Args:
        command: The command's name, for the line (``"probe"``).
        filename: The picture not written, for the line (``"probe.png"``).
        draw: Makes the PNG; it imports matplotlib.

    Returns:
        The PNG bytes, or None when matplotlib (or one of its modules) cannot be
        imported.

    Raises:
        ImportError: any other module's, as ``draw`` raised it.
    """
    try:
        return draw()
    except ImportError as error:
        if not (error.name or "").partition(".")[0] == "matplotlib":
            raise
        print(f"tf_mixed {command}: matplotlib is not installed: {filename} not written "
              f"({INSTALL})", file=sys.stderr)
        return None
