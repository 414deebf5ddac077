"""The plan's per-layer errors read from the numerics catalog, where that saves the probe."""

# `tf_mixed.plan` needs each timed layer's error in the half dtype. The probe
# measures it by running the whole model twice (half and float32, forward
# and backward); the stored catalog (docs/catalog.md) already holds, per
# layer configuration and input magnitude, the error of the layer's output
# in each half policy against float32. So when every timed layer is covered
# — its class is in the catalog, a measured configuration is close to its
# own (`tf_mixed.tools.catalog.matching`), and the max |input| it sees on the
# batch (one float32 forward pass of a tap on the plan's survey,
# `tf_mixed.tools.catalog.model_check.surveyed_magnitudes`) lies on the
# catalog's grid — the plan takes the catalog's errors and skips the probe.
# One layer not covered (a nested model, a class the catalog does not
# measure, a configuration none is close to, ids into an Embedding) and the
# probe runs for all, as before: reading some layers from the catalog would
# save nothing.
#
# A layer's catalog error is the larger of the output errors at the two grid
# points around its magnitude (half a decade apart). It is the layer's own
# error with float32 inputs rounded to the half dtype, where the probe's is
# the error its output carries in the half model (its producers' included).
# A layer is blocked (kept float32) as the probe's rule says: not finite in
# half precision (the catalog's "overflow" at either point: the output or a
# gradient), or an error above the plan's tolerance.

from __future__ import annotations

from typing import NamedTuple, Sequence

import keras

from tf_mixed.policy import precision_map
from tf_mixed.tools.catalog import model_check
from tf_mixed.tools.catalog.results import Catalog, stored

__all__ = ["FromCatalog", "read"]


class FromCatalog(NamedTuple):
    """Every timed layer's error, read from the catalog.

    Attributes:
        errors: layer name -> its output's relative error in the half dtype.
        blocked: layer name -> why it stays float32 (the unsafe ones).
        rows: layer name -> the catalog row it was read from, and where
            (``"Dense[units=64] at max |x| 3.2"``).
    """

    errors: dict[str, float]
    blocked: dict[str, str]
    rows: dict[str, str]


def read(found: precision_map.Survey, batch, names: Sequence[str], half_policy: str,
         tolerance: float, catalog: Catalog | None = None) -> FromCatalog | None:
    """The errors of the layers ``names`` from the catalog, or None if one is not covered.

    Args:
        found: the planned Sequential or functional model's survey
            (`tf_mixed.policy.precision_map.survey`: the plan's one walk).
        batch: inputs the model takes (the probe's examples).
        names: the timed top-level layers.
        half_policy: "mixed_float16" or "mixed_bfloat16".
        tolerance: the plan's largest output error of a half-precision layer.
        catalog: the catalog (default: the stored one).

    Returns:
        A `FromCatalog`, or None when some layer is not covered (the probe
        measures them all then).
    """
    catalog = catalog if catalog is not None else stored()
    top = {layer.name: layer for layer in found.top}
    # What the batch gives each layer (one float32 pass of a tap on the
    # survey's tensors), then what the catalog measured there.
    magnitudes = model_check.surveyed_magnitudes(found, batch)
    errors, blocked, rows = {}, {}, {}
    for name in names:
        layer, magnitude = top[name], magnitudes.get(name)
        match = (None if isinstance(layer, keras.Model)
                 else model_check.surveyed_match(catalog, found, layer, half_policy))
        points = catalog.points_around(magnitude)
        if match is None or not match.close or match.row.failure or points is None:
            return None
        row = match.row
        statuses = {row.status[i] for i in points}
        values = [row.forward[i] for i in points]
        if "float32_nonfinite" in statuses or any(v is None or v != v for v in values):
            return None
        where = f"{row.key} at max |x| {magnitude:.2g}"
        error = max(v for v in values if v is not None)
        errors[name], rows[name] = error, where
        if "overflow" in statuses:
            blocked[name] = f"not finite in half precision (catalog {where}): float32"
        elif error > tolerance:
            blocked[name] = (f"error {error:.2g} above the tolerance {tolerance:g} "
                             f"(catalog {where}): float32")
    return FromCatalog(errors, blocked, rows)
