"""The numerics catalog: each layer's safe input range in half precision (docs/catalog.md)."""

from tf_mixed.tools.catalog.cataloging import catalog
from tf_mixed.tools.catalog.comparing import compare
from tf_mixed.tools.catalog.model_check import input_magnitudes
from tf_mixed.tools.catalog.registry import Case, user_case
from tf_mixed.tools.catalog.results import Catalog, Row, load, stored

__all__ = ["Case", "Catalog", "Row", "catalog", "compare", "input_magnitudes", "load", "stored",
           "user_case"]
