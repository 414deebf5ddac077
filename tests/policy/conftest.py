"""Fixtures of the tests of auto's check on the model's own step."""

import pytest
from model_checks import HALF

from tf_mixed._internal import measuring
from tf_mixed.policy import global_policy, model_check


@pytest.fixture
def check_on(monkeypatch, tmp_path):
    """The check turned on, its cache in a fresh directory, auto's host choice bfloat16."""
    monkeypatch.setenv(model_check.ENV, "1")
    monkeypatch.setenv("TF_MIXED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(global_policy, "resolve_auto",
                        lambda info=None, measure=None: (HALF, "host probe (faked)"))
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.0, 2))  # an idle host
    model_check._WARNED.clear()
    return tmp_path
