"""Registers tf_mixed's Keras objects the moment Keras is imported."""

# Keras's deserializer imports a class's module only for packages named
# ``keras*``, so a ``.keras`` file that uses tf_mixed's
# layers or optimizer loads only once `tf_mixed.layers` and
# `tf_mixed.scaling.optimizer` have registered them. Importing those modules from
# ``tf_mixed/__init__.py`` would import TensorFlow there, before the command line
# can set TensorFlow's log level (`tf_mixed._internal.quiet`). Both hold with
# `register_when_keras_loads`:
#
# - Keras already imported: register now (TensorFlow is loaded anyway);
# - otherwise: a finder at the front of ``sys.meta_path`` waits for the import
#   of the top-level ``keras`` package, lets the usual finder load it, then
#   registers and removes itself. ``import tf_mixed`` stays free of TensorFlow,
#   and any later ``import keras`` (also through ``tf.keras``) is followed by
#   the registration, before any ``keras.models.load_model`` can run.
#
# Standard library only: this module is imported by ``tf_mixed/__init__.py``.

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Sequence

_KERAS = "keras"


def register_when_keras_loads(modules: Sequence[str]) -> None:
    """Imports `modules` now if Keras is loaded, else right after Keras loads.

    Args:
        modules: Full module names whose import registers Keras objects.
    """
    if _KERAS in sys.modules:
        _import_all(modules)
        return
    if not any(isinstance(finder, _AfterKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKeras(tuple(modules)))


def _import_all(modules: Sequence[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # never break `import keras`; say what is lost
            warnings.warn(
                f"tf_mixed could not register its Keras objects ({name}: "
                f"{type(error).__name__}: {error}); keras.models.load_model will not "
                f"find tf_mixed's layers or optimizer until `import {name}` succeeds.",
                stacklevel=2,
            )


class _AfterKeras(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``keras`` so the import is followed
    by the registration (once; the finder then leaves ``sys.meta_path``)."""

    def __init__(self, modules: tuple[str, ...]):
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _KERAS:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module):
            load(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _import_all(self.modules)

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec
