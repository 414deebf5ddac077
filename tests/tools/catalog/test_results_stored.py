"""The stored catalog: shipped with the package, and (CI's slow tier) what Keras measures now."""

import fnmatch
import json
import pathlib

import keras
import pytest

import tf_mixed
from tf_mixed.tools.catalog import compare, results

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_stored_catalog_ships_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["tf_mixed.tools.catalog"]
    stored_file = pathlib.Path(results.STORED_FILE)
    relative = stored_file.relative_to(ROOT / "tf_mixed" / "tools" / "catalog").as_posix()
    assert stored_file.exists() and any(fnmatch.fnmatch(relative, p) for p in patterns)


def test_the_stored_rows_carry_the_registrys_configurations():
    # What a layer is matched on (tools/catalog/matching.py) is the registry's:
    # a configuration added or changed there is re-measured into the stored file.
    from tf_mixed.tools.catalog import registry

    cases = {case.key: case for case in registry.keras_cases()}
    shipped = [row for row in results.stored().rows if row.source == "keras"]
    keys = {row.key for row in shipped}
    assert keys <= set(cases)
    # Measured without scipy (not a dependency): STFTSpectrogram is left out there.
    assert all(key.startswith("STFTSpectrogram[") for key in set(cases) - keys)
    for row in shipped:
        assert row.args == json.loads(json.dumps(cases[row.key].args)), row.key


@pytest.mark.slow
def test_the_stored_catalog_is_current():
    # The whole of keras.layers (~2-4 minutes on 2 cores): every safe range as
    # stored, within one grid step (half a decade) for another host's kernels.
    shipped = results.stored()
    assert shipped.versions["keras"] == keras.__version__
    now = tf_mixed.catalog(hub=False)
    keras_rows = tuple(row for row in shipped.rows if row.source == "keras")
    old = results.Catalog(keras_rows, shipped.magnitudes, shipped.tolerance, shipped.versions)
    changed = compare(old, now, slack=0.5)
    assert not changed, (
        f"{changed}\nRe-measure: python -m tf_mixed catalog --output_dir=/tmp/c and copy "
        "/tmp/c/results.json to tf_mixed/tools/catalog/stored/keras_layers.json")
