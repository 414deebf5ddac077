"""The installed Keras/TF's known mixed-precision defects (tf_mixed.tools.check.upstream_defects).

One canary per defect: it asserts the defect is still present, so it fails
on the first Keras/TF that fixes it. Then retire the entry in
``upstream_defects.DEFECTS`` and the workaround it names.
"""

import json

import pytest

from tf_mixed.cli import check as bench_check
from tf_mixed.tools.check import upstream_defects


def _canary(key, strategy=None):
    defect = upstream_defects.check(key, strategy)
    assert defect.present is True, (
        f"the installed Keras/TF no longer has {key} ({defect.detail}): retire it from "
        f"tf_mixed.tools.check.upstream_defects.DEFECTS and drop the workaround: "
        f"{defect.spec.remedy}")
    assert defect.neutralised is True, defect.detail
    return defect


@pytest.mark.filterwarnings("ignore::tf_mixed.MixedPrecisionWarning")  # the canary provokes them
def test_canary_scale_collapse():
    defect = _canary("scale_collapse")
    keras_part, ours = defect.detail.split("; tf_mixed: ")
    assert keras_part.startswith("Keras: scale 0, weights ") and "inf" in keras_part
    assert ours.startswith("scale 1, weights ")  # the floor held, the clean step applied


@pytest.mark.slow
def test_canary_first_replica_verdict(mirrored):
    defect = _canary("first_replica_verdict", mirrored)
    assert defect.detail == ("inf on replica 1 only: Keras changed the weights, "
                             "tf_mixed skipped the step")


def test_canary_multi_worker_fit_20585():
    _canary("multi_worker_fit_20585")


def test_canary_jit_under_strategy(mirrored):
    defect = _canary("jit_under_strategy", mirrored)
    assert defect.detail.startswith("XLA: InvalidArgumentError")
    assert defect.detail.endswith("tf_mixed refuses it up front")


def test_defects_that_need_a_strategy_say_so_without_one():
    for key in ("first_replica_verdict", "jit_under_strategy"):
        defect = upstream_defects.check(key)
        assert (defect.present is None
                and defect.detail == "needs a MirroredStrategy with two replicas")
    with pytest.raises(ValueError, match="Unknown defect 'nope'; known: scale_collapse"):
        upstream_defects.check("nope")


@pytest.mark.slow
def test_check_reports_the_defects_in_its_table_and_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert bench_check.main([f"--output={out}", "--parts=defects"]) == 0
    stdout = capsys.readouterr().out
    assert "4. Known mixed-precision defects of Keras" in stdout
    for spec in upstream_defects.DEFECTS:
        assert f"| {spec.key} | present | yes | {spec.reference} |" in stdout
    found = json.loads(out.read_text())["upstream_defects"]
    assert [d["key"] for d in found] == [s.key for s in upstream_defects.DEFECTS]
    for entry in found:
        assert entry["present"] is True and entry["neutralised_by_tf_mixed"] is True
        assert entry["how"] and entry["detail"] and 0 <= entry["seconds"] < 60
