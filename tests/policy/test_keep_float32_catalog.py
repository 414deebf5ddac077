"""enable()'s float32 defaults and the numerics catalog rows that justify them, kept in step."""

import keras
import pytest

import tf_mixed
from tf_mixed._internal import facts
from tf_mixed.tools.catalog import registry, results

EVIDENCE = facts.CATALOG_EVIDENCE


def test_every_default_cites_catalog_rows():
    defaults = " ".join(e.default for e in EVIDENCE)
    kept = [keras.layers.Normalization(), keras.layers.Discretization(bin_boundaries=[0.0])]
    assert all(facts.keeps_float32_statistics(layer) for layer in kept)
    for name in ("Normalization", "Discretization", "token ids", *facts.SQUASHING_ACTIVATIONS,
                 *facts.FLOAT32_STATISTICS_NORMS):
        assert name in defaults, name
    keys = {case.key for case in registry.keras_cases()}
    assert {e.row for e in EVIDENCE} <= keys


@pytest.mark.parametrize("evidence", EVIDENCE, ids=lambda e: f"{e.row}-{e.policy}")
def test_the_stored_catalog_says_what_each_default_claims(evidence):
    (row,) = results.stored().find(evidence.row.split("[")[0], evidence.policy,
                                   evidence.row.split("[", 1)[1][:-1])
    assert all(row.safe.contains(m) == evidence.safe for m in evidence.magnitudes), (
        evidence, row.safe)


@pytest.mark.parametrize("row_key", sorted({e.row for e in EVIDENCE}))
def test_the_installed_keras_still_measures_what_each_default_claims(row_key):
    case = [c for c in registry.keras_cases() if c.key == row_key]
    claims = [e for e in EVIDENCE if e.row == row_key]
    found = tf_mixed.catalog(case, policies=sorted({e.policy for e in claims}))
    for claim in claims:
        (row,) = [r for r in found.rows if r.policy == claim.policy]
        assert all(row.safe.contains(m) == claim.safe for m in claim.magnitudes), (
            f"{claim.default}: on Keras {keras.__version__} {row_key} under {claim.policy} is "
            f"safe over {row.safe.text()}; the default assumes safe={claim.safe} at "
            f"{claim.magnitudes}. Revisit the default and facts.CATALOG_EVIDENCE.")
