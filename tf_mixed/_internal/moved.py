"""Names that moved keep working for one release, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

MOVED_IN = "0.2.0"
GOES_IN = "0.3.0"


def resolve(old: str, module: str, attribute: str | None) -> Any:
    """Warns that ``old`` moved and returns what it names now.

    Args:
        old: The old dotted spelling (a face's name, a dot, the name).
        module: The module it lives in now (``"tf_mixed.scaling.accumulation"``).
        attribute: Its name inside ``module``, or None when ``old`` names
            ``module`` itself.

    Returns:
        The object (or module) ``old`` names.
    """
    new = module + (f".{attribute}" if attribute else "")
    warnings.warn(
        f"{old} moved to {new} in tf_mixed {MOVED_IN}; the old name goes in {GOES_IN}. "
        f"Use {new}.", DeprecationWarning, stacklevel=3)
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def face_getattr(face: str, moved: dict[str, str],
                 lazy: dict[str, str | None] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for a folder's face.

    Args:
        face: The face's module name (its ``__name__``).
        moved: Each name the face no longer hands on -> the module that hands
            it on now (the defining module's name; ``"tf_mixed"`` for a
            name of the top level).
        lazy: Names the face hands on, imported only when first asked for
            (they load TensorFlow): name -> its module, or None for a
            submodule of the face of that name. No warning.

    Returns:
        A ``__getattr__`` that resolves the lazy names, resolves the moved
        ones with a DeprecationWarning naming the new spelling, and raises
        AttributeError for any other.
    """
    lazy = dict(lazy or {})

    def __getattr__(name: str) -> Any:
        if name in lazy:
            module = lazy[name]
            if module is None:
                return importlib.import_module(f"{face}.{name}")
            return getattr(importlib.import_module(module), name)
        module = moved.get(name)
        if module is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        return resolve(f"{face}.{name}", module, name)

    return __getattr__
