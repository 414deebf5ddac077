"""The output directory of a command or suite: checked before the work, removed on failure."""

# Every command that writes files (probe, doctor, export, catalog and each
# bench suite) checks its ``--output_dir`` here before the long work starts,
# and removes a directory it created when the work fails: nothing half-written.

from __future__ import annotations

import os
import shutil
import tempfile

from tf_mixed._internal.cli_errors import UsageError


def check_output_dir(path: str) -> bool:
    """Creates ``path`` if needed and checks that files can be written in it.

    Returns:
        Whether the directory was created by this call.

    Raises:
        UsageError: If it cannot be created or written.
    """
    created = not os.path.exists(path)
    accepted = "a directory this user can create and write"
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError("output_dir", path, "exists and is not a directory", accepted)
    try:
        os.makedirs(path, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".tf_mixed_probe.", dir=path)
        os.rmdir(probe)
    except OSError as error:
        if created and os.path.isdir(path):
            _remove_if_empty(path)
        raise UsageError("output_dir", path, f"cannot be written ({error.strerror or error})",
                         accepted) from None
    return created


def remove_if_created(path: str, created: bool) -> None:
    """Removes the output directory a failed run created (nothing half-written).

    Args:
        path: The ``--output_dir`` of the run.
        created: What `check_output_dir` returned for it.
    """
    if created:
        shutil.rmtree(path, ignore_errors=True)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
