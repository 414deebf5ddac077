"""The old `tf_mixed.distribute.launch`: its names resolve, with a warning, until 0.3.0."""

import importlib

import pytest

from tf_mixed.distribute import workers

MOVED = ("LOOPBACK", "WorkerResult", "WorkersFailed", "free_ports", "run_local_workers",
         "tf_config")


@pytest.mark.slow
@pytest.mark.parametrize("name", MOVED)
def test_an_old_name_warns_and_is_the_workers_module_s(name):
    launch = importlib.import_module("tf_mixed.distribute.launch")
    with pytest.warns(DeprecationWarning, match=rf"^tf_mixed\.distribute\.launch\.{name} moved to "
                      rf"tf_mixed\.distribute\.workers\.{name} in tf_mixed 0\.2\.0"):
        assert getattr(launch, name) is getattr(workers, name)


def test_nothing_else_resolves_and_importing_it_runs_nothing(capsys):
    launch = importlib.import_module("tf_mixed.distribute.launch")
    with pytest.raises(AttributeError, match="has no attribute 'main'"):
        launch.main  # noqa: B018
    assert capsys.readouterr() == ("", "")
