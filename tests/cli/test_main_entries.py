"""The command line's entries (issue 27): every --help exits 0, every output path is
checked before the long work, and the launcher runs as the command it looks like."""

import os
import subprocess
import sys
import textwrap

import keras
import pytest

import tf_mixed
from tf_mixed.cli import launch as launch_command
from tf_mixed.cli.main import COMMANDS, main

# A place no user, root included, can create a directory or file in (Linux).
UNWRITABLE = "/proc/tf_mixed_cannot_write_here"
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_help_exits_0_with_its_usage(command, capsys):
    assert main(["tf_mixed", command, "--help"]) == 0
    captured = capsys.readouterr()
    assert "usage" in captured.out.lower()
    assert "error" not in captured.err.lower()


def _one_line_error(capsys, flag):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert flag in err[0] and "Traceback" not in err[0]
    return err[0]


def _forbid(monkeypatch, *names):
    """Makes the long work fail loudly if a command reaches it."""
    def reached(*args, **kwargs):
        raise AssertionError("the long work ran before the output path was checked")

    for name in names:
        monkeypatch.setattr(tf_mixed, name, reached)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.keras"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.save(path)
    return str(path)


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("command, work", [
    ("probe", "probe"), ("doctor", "census"), ("export", "export")])
def test_model_commands_check_output_dir_before_the_work(command, work, saved_model,
                                                         monkeypatch, capsys):
    _forbid(monkeypatch, work)
    code = main(["tf_mixed", command, saved_model, "--dataset=shapes",
                 f"--output_dir={UNWRITABLE}/out"])
    line = _one_line_error(capsys, f"--output_dir='{UNWRITABLE}/out'")
    assert code == 2 and "cannot be written" in line
    assert not os.path.exists(UNWRITABLE)


@needs_proc
def test_check_output_is_checked_by_a_real_write(monkeypatch, capsys):
    from tf_mixed.tools.check import scenarios

    monkeypatch.setattr(scenarios, "run_check", lambda **kw: pytest.fail("ran the check"))
    assert main(["tf_mixed", "check", "--output=/proc/check.json"]) == 2
    assert "is not writable" in _one_line_error(capsys, "--output='/proc/check.json'")


@needs_proc
def test_litert_latency_checks_output_dir_before_the_work(monkeypatch, capsys):
    _forbid(monkeypatch, "export")
    assert main(["tf_mixed", "litert-latency", f"--output_dir={UNWRITABLE}"]) == 2
    assert "cannot be written" in _one_line_error(capsys, f"--output_dir='{UNWRITABLE}'")


@needs_proc
def test_bench_checks_output_dir_before_the_work(monkeypatch, capsys):
    from tf_mixed.bench import run

    monkeypatch.setattr(run, "run_policy", lambda *a, **k: pytest.fail("trained"))
    assert main(["tf_mixed", "bench", "--isolation=inprocess", f"--output_dir={UNWRITABLE}",
                 "--train_size=32", "--val_size=16", "--batch_size=16", "--epochs=1"]) == 2
    assert "cannot be written" in _one_line_error(capsys, f"--output_dir='{UNWRITABLE}'")


def test_a_writable_output_dir_is_left_as_it_was(saved_model, tmp_path, monkeypatch, capsys):
    # The check writes nothing that stays: a failed run leaves no directory.
    _forbid(monkeypatch, "census")
    out = tmp_path / "new" / "out"
    try:  # fails at the census (forbidden) or before it (the data's width)
        assert main(["tf_mixed", "doctor", saved_model, f"--output_dir={out}"]) == 2
    except AssertionError as error:
        assert "long work ran" in str(error)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    ([], "expected N and SCRIPT"),
    (["2"], "expected N and SCRIPT"),
    (["0", "train.py"], "N=0: must be at least 1, the number of workers"),
    (["two", "train.py"], "N='two'"),
    (["2", "no_such_script.py"], "SCRIPT='no_such_script.py': no such file"),
    (["2", "-m"], "-m needs a MODULE"),
    (["--timeout=soon", "2", "x.py"], "--timeout='soon': not a number of seconds"),
    (["--workers=2", "x.py"], "unknown flag --workers"),
])
def test_launch_refuses_bad_input_in_one_line_before_starting(args, message, capsys):
    assert main(["tf_mixed", "launch", *args]) == 2
    assert message in _one_line_error(capsys, "tf_mixed launch: error:")


def test_launch_passes_the_scripts_arguments_unchanged(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    count, argv, options = launch_command.parse(
        ["--start_timeout=0", "3", str(script), "--epochs=2", "--verbose", "x"])
    assert count == 3 and argv == [sys.executable, str(script), "--epochs=2", "--verbose", "x"]
    assert options == {"timeout": float("inf"), "start_timeout": None}
    assert launch_command.parse(["2", "-m", "pkg.train", "-v"])[1] == [
        sys.executable, "-m", "pkg.train", "-v"]


# A subprocess started from tmp_path imports this checkout's tf_mixed, not an installed one.
_THIS_CHECKOUT = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                  "PYTHONPATH": os.path.dirname(os.path.dirname(tf_mixed.__file__))}


@pytest.mark.slow
def test_the_old_launch_spelling_points_to_the_command_and_runs_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    run = subprocess.run(
        [sys.executable, "-m", "tf_mixed.distribute.launch", "2", str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_THIS_CHECKOUT)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines()[-1] == (
        "python -m tf_mixed.distribute.launch moved: run python -m tf_mixed launch N SCRIPT.py "
        "[ARGS ...] (this pointer goes in tf_mixed 0.3.0)")
    assert "RuntimeWarning" not in run.stderr  # no face imports the module it runs
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow
def test_launch_runs_a_script_in_n_workers_from_the_shell(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        print("worker", task["index"], "args", sys.argv[1:])
        sys.exit(3 if "--fail" in sys.argv and task["index"] == 1 else 0)
    """))
    run = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "launch", "--start_timeout=0", "2", str(script),
         "--epochs=2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_THIS_CHECKOUT)
    assert run.returncode == 0, run.stderr
    assert "[worker 0] worker 0 args ['--epochs=2']" in run.stdout
    assert "[worker 1] worker 1 args ['--epochs=2']" in run.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "launch", "--start_timeout=0", "2", str(script),
         "--fail"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_THIS_CHECKOUT)
    assert failed.returncode == 1
    assert "tf_mixed launch: worker 1 exited with status 3" in failed.stderr
