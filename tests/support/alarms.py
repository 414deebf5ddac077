"""TensorFlow and Keras alarms in a process's output, and whose code printed them.

An alarm is output a user should never see from tf_mixed's documented paths
(issue 45): AutoGraph giving up on a function ("AutoGraph could not
transform"), TF's frequent-retracing warning, and a deprecation warning of
TensorFlow, Keras or Python raised by tf_mixed's code or by the script run
(the README's and docs' blocks, the examples). A deprecation raised inside
another package on its own behalf is not ours and is not counted.

Run the process with `WARNINGS_ENV` so Python prints DeprecationWarnings from
every module, not only ``__main__``; run code from script files, since
AutoGraph converts only functions whose source it can read.
"""

from __future__ import annotations

import pathlib
import re

WARNINGS_ENV = {"PYTHONWARNINGS": "default::DeprecationWarning,default::PendingDeprecationWarning"}

_ALWAYS = re.compile(r"AutoGraph could not transform|triggered tf\.function retracing")
# TF's deprecation logger: "From /path/file.py:12: name (from module) is deprecated ..."
_TF_DEPRECATION = re.compile(r"From (?P<file>[^\s:]+\.py):\d+: .*(?:is deprecated|deprecated "
                             r"and will be removed)")
# Python's warning line: "/path/file.py:12: DeprecationWarning: ...", or any
# warning class saying "deprecated" (Keras warns with a UserWarning).
_PY_DEPRECATION = re.compile(
    r"^(?P<file>[^\s:]+\.py):\d+: (?:\w*DeprecationWarning|FutureWarning"
    r"|\w+Warning(?=: .*[Dd]eprecat)): ", re.M)
# Keras's logged deprecations ("WARNING:absl:The `save_format` argument is
# deprecated"): no file named, and no package but the caller's makes Keras say it.
_KERAS_LOGGED = re.compile(r"^WARNING:absl:.*\bdeprecated\b")


def _ours(file: str, roots: tuple[pathlib.Path, ...]) -> bool:
    path = pathlib.Path(file).resolve()
    return any(path == root or root in path.parents for root in roots)


def alarms(output: str, roots) -> list[str]:
    """The alarm lines in ``output``.

    Args:
        output: A process's stdout and stderr.
        roots: Files and folders whose deprecations count (tf_mixed's package,
            the scripts run).

    Returns:
        Each alarm's line, in order.
    """
    roots = tuple(pathlib.Path(r).resolve() for r in roots)
    found = []
    for line in output.splitlines():
        if _ALWAYS.search(line) or _KERAS_LOGGED.search(line):
            found.append(line)
            continue
        for pattern in (_TF_DEPRECATION, _PY_DEPRECATION):
            match = pattern.search(line)
            if match and _ours(match["file"], roots):
                found.append(line)
                break
    return found
