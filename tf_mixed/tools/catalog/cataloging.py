"""`tf_mixed.catalog`: layers measured under each half policy against float32, as a `Catalog`."""

#     catalog = tf_mixed.catalog()                      # every keras.layers class (~2 min)
#     print(catalog)                                    # safe input range per layer and policy
#     catalog.plot("catalog.png")
#     tf_mixed.catalog(["UnitNormalization"])           # one class, in seconds
#     tf_mixed.catalog([my_package.MyNorm])             # your own layer class
#
# The registry (`tf_mixed.tools.catalog.registry`) says what is measured, the
# measurement (`measuring`) how, the reading (`reading`) what it means;
# this module picks the cases, runs them with progress, and assembles the value.

from __future__ import annotations

import math
import random
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import COMPUTE_DTYPES, HALF_DTYPES
from tf_mixed.tools.catalog import reading, registry
from tf_mixed.tools.catalog.registry import Case
from tf_mixed.tools.catalog.results import Catalog, Row

__all__ = ["DEFAULT_POLICIES", "catalog", "cases_for"]

DEFAULT_POLICIES = ("mixed_float16", "mixed_bfloat16")


def catalog(layers: Iterable[str | type | Case] | str | type | Case | None = None, *,
            policies: Sequence[str] = DEFAULT_POLICIES,
            magnitudes: Sequence[float] = reading.DEFAULT_MAGNITUDES,
            tolerance: float = reading.DEFAULT_TOLERANCE,
            hub: bool | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> Catalog:
    """Measures layers under each half policy against float32 over input magnitudes.

    Each layer configuration is built in float32 and once per policy with the
    same weights, and run over every magnitude (``max |input|``) in one
    compiled function: forward error, gradient error (inputs and weights) and
    where the half copy overflows, underflows or loses resolution. A point is
    safe when every relative error is at most ``tolerance`` machine epsilons
    of the compute dtype (`tf_mixed.tools.catalog.reading`).

    Args:
        layers: None for every float-computing class of ``keras.layers`` in its
            common configurations (plus ``keras_hub.layers`` with ``hub``); or
            class names ("UnitNormalization": the registry's configurations,
            or the class's defaults for a class it does not know; a dotted
            path for your own class), classes, or `Case` values
            (`tf_mixed.tools.catalog.user_case` sets inputs and arguments).
        policies: half policies to measure.
        magnitudes: the grid of ``max |input|``, increasing and positive
            (default 1e-6 .. 1e6 in half decades).
        tolerance: the tolerance in machine epsilons of the compute dtype.
        hub: add KerasHub's layers when ``layers`` is None (None: when
            KerasHub is installed).
        seed: seeds inputs, weights and the gradient's cotangent. Weights are
            drawn after ``keras.utils.set_random_seed`` (each copy the same
            draws); Python's and NumPy's global random states are restored
            afterwards, TensorFlow's global seed is left as that call set it.
        progress: called with a line per configuration (the command line's
            progress lines).

    Returns:
        A `Catalog`: ``str()`` the table, ``plot()`` the picture,
        ``to_dict()`` results.json.

    Raises:
        ValueError, TypeError: an argument is invalid (named in the message).
    """
    policies = _check_policies(policies)
    grid = _check_magnitudes(magnitudes)
    _validate.number(tolerance, "tolerance", rule=lambda v: v > 0 and math.isfinite(v),
                     owner="catalog()", valid="a positive number of machine epsilons, such as 8")
    cases = cases_for(layers, hub=hub)
    limits = {p: reading.tolerance(p, tolerance) for p in policies}
    from tf_mixed.tools.catalog import measuring

    start = time.perf_counter()
    rows: list[Row] = []
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        for i, case in enumerate(cases):
            if progress is not None:
                progress(f"{i + 1}/{len(cases)} {case.key}")
            found = measuring.measure(case, policies, grid, seed)
            rows.extend(make_row(case, policy, found[policy], grid, limits[policy])
                        for policy in policies)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    return Catalog(rows=tuple(rows), magnitudes=grid, tolerance=limits,
                   versions=_versions(any(c.source == "keras_hub" for c in cases)),
                   host=_host(), seconds=time.perf_counter() - start,
                   left_out=registry.left_out() if layers is None else {},
                   no_float_compute=dict(registry.NO_FLOAT_COMPUTE) if layers is None else {})


def make_row(case: Case, policy: str, found, grid, limit: float) -> Row:
    """A `Row` from one policy's `tf_mixed.tools.catalog.measuring.Measured`."""
    if found.failure:
        return Row(case.layer, case.config, policy, case.source,
                   forward=(None,) * len(grid), gradient=(None,) * len(grid),
                   status=("",) * len(grid),
                   safe=reading.SafeRange(None, None, "", ""), failure=found.failure,
                   covers=case.covers, args=dict(case.args))
    codes = tuple(reading.status(p.forward, p.gradient, p.reference_finite, p.half_finite,
                                 p.flushed, limit) for p in found.points)
    return Row(case.layer, case.config, policy, case.source,
               forward=tuple(p.forward for p in found.points),
               gradient=tuple(p.gradient for p in found.points),
               status=codes, safe=reading.safe_range(grid, codes),
               no_gradient=found.no_gradient, covers=case.covers, args=dict(case.args))


def cases_for(layers, hub: bool | None = None) -> list[Case]:
    """The cases `catalog` measures for its ``layers`` argument."""
    if layers is None:
        cases = registry.keras_cases()
        if hub is None or hub:
            found = registry.hub_cases()
            if hub and not found:
                raise ValueError("hub=True needs KerasHub: pip install keras-hub. "
                                 "Received: hub=True")
            cases += found
        return cases
    if isinstance(layers, (str, type, Case)):
        layers = [layers]
    known = registry.keras_cases()
    cases = []
    for item in layers:
        if isinstance(item, Case):
            cases.append(item)
            continue
        cls = registry.resolve(item)
        # KerasHub is imported only for its own classes (importing it changes
        # what enable() says about from_preset).
        pool = registry.hub_cases() if cls.__module__.startswith("keras_hub") else known
        matching = [c for c in pool if cls.__name__ in (c.layer, *c.covers)
                    and registry.resolve(cls.__name__) is cls]
        # A class the registry knows: its configurations; any other: its defaults.
        cases += matching or [registry.user_case(cls)]
    if not cases:
        raise ValueError("layers must name at least one layer class, such as ['Dense']. "
                         f"Received: layers={layers!r}")
    return cases


def _check_policies(policies) -> tuple[str, ...]:
    half = [name for name, dtype in COMPUTE_DTYPES.items() if dtype in HALF_DTYPES]
    if isinstance(policies, str):
        policies = [policies]
    found = tuple(policies)
    bad = [p for p in found if p not in half]
    if not found or bad:
        raise ValueError(
            f"policies must be one or more of {', '.join(repr(p) for p in half)}. "
            f"Received: policies={list(found)!r}")
    return tuple(dict.fromkeys(found))


def _check_magnitudes(magnitudes) -> tuple[float, ...]:
    try:
        grid = tuple(float(m) for m in magnitudes)
    except (TypeError, ValueError):
        raise TypeError("magnitudes must be a sequence of positive numbers, such as "
                        f"[1e-6, 1e-3, 1, 1e3]. Received: magnitudes={magnitudes!r}") from None
    if (len(grid) < 2 or any(not (m > 0 and math.isfinite(m)) for m in grid)
            or any(b <= a for a, b in zip(grid, grid[1:]))):
        raise ValueError("magnitudes must hold at least two positive finite numbers in "
                         "increasing order, such as [1e-6, 1e-3, 1, 1e3]. Received: "
                         f"magnitudes={list(magnitudes)!r}")
    return grid


def _versions(with_hub: bool) -> dict[str, str]:
    import keras
    import tensorflow as tf

    import tf_mixed

    found = {"keras": keras.__version__, "tensorflow": tf.__version__,
             "tf_mixed": tf_mixed.__version__}
    if with_hub:
        import keras_hub

        found["keras_hub"] = keras_hub.__version__
    return found


def _host() -> str:
    from tf_mixed.policy import hardware

    host = hardware.detect()
    flags = sorted(f for f in host.cpu_flags if "bf16" in f or "fp16" in f or "amx" in f)
    return f"{host.cpu_model or 'unknown CPU'} ({', '.join(flags) or 'no half-precision flags'})"
