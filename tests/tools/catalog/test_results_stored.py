"""CI's upgrade guard: the stored catalog is what the installed Keras measures now."""

import keras
import pytest

import tf_mixed
from tf_mixed.tools.catalog import compare, stored


@pytest.mark.slow
def test_the_stored_catalog_is_current():
    # The whole of keras.layers (~2-4 minutes on 2 cores): every safe range as
    # stored, within one grid step (half a decade) for another host's kernels.
    shipped = stored()
    assert shipped.versions["keras"] == keras.__version__
    now = tf_mixed.catalog(hub=False)
    keras_rows = [row for row in shipped.rows if row.source == "keras"]
    old = type(shipped)(tuple(keras_rows), shipped.magnitudes, shipped.tolerance,
                        shipped.versions)
    changed = compare(old, now, slack=0.5)
    assert not changed, (
        f"{changed}\nRe-measure: python -m tf_mixed catalog --output_dir=/tmp/c and copy "
        "/tmp/c/results.json to tf_mixed/tools/catalog/stored/keras_layers.json")
