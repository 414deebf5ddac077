"""tf_mixed/commands/output_dir.py: --output_dir checked before the work, removed on failure."""

import pytest

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created


def test_a_missing_directory_is_created_and_said_so(tmp_path):
    path = tmp_path / "new" / "out"
    assert check_output_dir(str(path)) is True
    assert path.is_dir() and list(path.iterdir()) == []  # the write probe is gone
    assert check_output_dir(str(path)) is False  # it exists now


def test_a_file_in_the_way_is_refused_naming_the_flag(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match=r"output_dir.*exists and is not a directory"):
        check_output_dir(str(blocker))
    with pytest.raises(UsageError, match=r"output_dir.*cannot be written"):
        check_output_dir(str(blocker / "sub"))
    assert blocker.read_text() == "x"


def test_only_a_directory_the_run_created_is_removed(tmp_path):
    made, kept = tmp_path / "made", tmp_path / "kept"
    kept.mkdir()
    (kept / "old.json").write_text("{}")
    created = check_output_dir(str(made))
    (made / "half.json").write_text("{")
    remove_if_created(str(made), created)
    remove_if_created(str(kept), check_output_dir(str(kept)))
    assert not made.exists()
    assert (kept / "old.json").read_text() == "{}"
