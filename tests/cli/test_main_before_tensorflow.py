"""The command line answers --help and bad arguments before TensorFlow is imported.

`tf_mixed.cli.main` imports TensorFlow (`tf_mixed._internal.quiet.import_tensorflow`)
only once a command has read its arguments, so ``--help`` and an argument
error take well under a second instead of TensorFlow's import (4-8 s on a
busy 2-core host).
"""

import json
import subprocess
import sys

import pytest

from tf_mixed._internal import quiet
from tf_mixed.cli import main as cli_main

# (arguments, exit status): every command's --help, and arguments each command
# refuses while parsing them.
ANSWERED_AT_ONCE = [
    (["--help"], 0), (["bench", "--help"], 0), (["--nope=1"], 2), (["bench", "extra"], 2),
    (["info", "--help"], 0), (["info", "extra"], 2),
    (["audit", "--help"], 0), (["audit"], 2),
    (["probe", "--help"], 0), (["probe"], 2), (["probe", "m.keras", "--batches=0"], 2),
    (["doctor", "--help"], 0), (["doctor", "a.keras", "b.keras"], 2),
    (["export", "--help"], 0), (["export", "m.keras", "--nope=1"], 2),
    (["check", "--help"], 0), (["check", "--nope"], 2),
    (["rollback-cost", "--help"], 0), (["rollback-cost", "--steps=0"], 2),
    (["litert-latency", "--help"], 0), (["litert-latency", "--rounds=0"], 2),
    (["launch", "--help"], 0), (["nope"], 2),
]


class _Imported(Exception):
    pass


@pytest.fixture
def no_tensorflow(monkeypatch):
    def refuse(verbose=None):
        raise _Imported()

    monkeypatch.setattr(quiet, "import_tensorflow", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("args,status", ANSWERED_AT_ONCE, ids=lambda a: " ".join(a) if isinstance(a, list) else str(a))
def test_help_and_argument_errors_answer_before_importing_tensorflow(args, status, no_tensorflow, capsys):
    assert cli_main.main(["tf_mixed", *args]) == status
    out, err = capsys.readouterr()
    if status == 2:  # one line (argparse's own errors add its usage above it)
        assert ": error: " in err.strip().splitlines()[-1], err


def test_a_number_below_one_is_said_the_same_way_by_every_command(no_tensorflow, capsys):
    for args in (["probe", "m.keras", "--batches=0"], ["rollback-cost", "--steps=0"],
                 ["litert-latency", "--rounds=0"]):
        assert cli_main.main(["tf_mixed", *args]) == 2
        flag = args[-1]
        assert capsys.readouterr().err == f"tf_mixed {args[0]}: error: {flag}: must be at least 1.\n"


@pytest.mark.slow
@pytest.mark.parametrize("args", [["info"], ["bench", "--model=mlp"], ["audit", "m.keras"],
                                  ["check"]])
def test_a_command_whose_arguments_parse_imports_tensorflow_next(args, no_tensorflow):
    with pytest.raises(_Imported):
        cli_main.main(["tf_mixed", *args])


_FRESH = """
import io, contextlib, json, sys, time
from tf_mixed.cli import main
cases = json.loads(sys.argv[1])
seen = []
for args, status in cases:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main.main(["tf_mixed", *args])
    seen.append([args, code, "tensorflow" in sys.modules or "keras" in sys.modules])
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_in_a_fresh_process_parsing_loads_no_tensorflow():
    # A fresh interpreter: the test process itself has TensorFlow loaded.
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(ANSWERED_AT_ONCE)],
                          capture_output=True, text=True, timeout=300, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(args, code) for args, code, _ in seen] == [tuple(c) for c in ANSWERED_AT_ONCE]
    assert [args for args, _, loaded in seen if loaded] == []
