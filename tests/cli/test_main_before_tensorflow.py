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
# Arguments refused from names, tables and numbers alone (no TensorFlow needed), each
# with exit status 2. "{model}" stands for a file that exists (never read: the error
# comes first).
REFUSED_FROM_TABLES = [
    ["bench", "--model=nope"], ["bench", "--policies=float32,half"], ["bench", "--policy=fp12"],
    ["bench", "--suite=speed"], ["bench", "--dataset=imagenet"], ["bench", "--epochs=0"],
    ["bench", "--strategy=tpu"], ["bench", "--learning_rate=0"],
    ["bench", "--model=transformer", "--dataset=tfds:mnist"], ["bench", "--image_size=8"],
    ["bench", "--batch_size=100000"], ["bench", "--suite=comm", "--workers=1"],
    ["bench", "--suite=overhead", "--strategy=mirrored"],
    ["audit", "nope.keras"], ["probe", "nope.keras"], ["probe", "{model}", "--dataset=nope"],
    ["doctor", "{model}", "--policy=fp12"], ["doctor", "{model}", "--warmup_steps=-1"],
    ["export", "{model}", "--format=onnx"], ["export", "{model}", "--tolerance=-1"],
    ["export", "{model}", "--precision=fp8"], ["export", "{model}", "--precision=bfloat16"],
    ["bench", "--suite=memory", "--batch_size=6"], ["bench", "--suite=memory", "--policies=fp16"],
    ["bench", "--suite=memory", "--policies=fp8"],
    ["bench", "--suite=overhead", "--policies=fp16,bf16"],
    ["bench", "--suite=overhead", "--policies=float32"],
    ["bench", "--epochs=zero"], ["bench", "--download=maybe"], ["probe", "{model}", "--batches=x"],
    ["audit", "{npz}"], ["doctor", "{npz}"], ["export", "{model}", "--precision=int8"],
    ["rollback-cost", "--steps=x"], ["litert-latency", "--model=vgg"],
    # Issue 46: refused in 0.1 s, not after the model loads (about 9 s), with "did you mean".
    ["probe", "{model}", "--policy=mixed_flaot16"], ["doctor", "{model}", "--policy=mixed_flaot6"],
    ["bench", "--policy=mixed_bfloat61"], ["bench", "--model=cnnn"],
    ["probe", "{model}", "--dataset=npz:/no/such/data.npz"],
    ["doctor", "{model}", "--dataset=npz:/no/such/d.npz"],
    ["export", "{model}", "--dataset=npz:/no/such/e.npz"], ["probe", "{model}", "--dataset=shapse"],
]
# What some of them say (flag, value, what is wrong, what is accepted).
SAID = {
    "--precision=bfloat16": "--precision='bfloat16': --format=litert cannot write it (it is a "
                            "saved_model precision). Accepted: float32, float16_weights, "
                            "as_trained.",
    "--batch_size=6": "--batch_size=6: must split into 4 micro-batches. Accepted: a multiple of 4.",
    "--policies=fp16": "--policies='fp16': no path of the memory suite uses it. Accepted: float32, "
                       "mixed_bfloat16, bfloat16.",
    "--policies=fp8": "--policies='fp8': unknown policy.",
    "--policies=fp16,bf16": "--policies='fp16,bf16': the overhead suite times exactly one mixed "
                            "policy. Accepted: mixed_float16 or mixed_bfloat16.",
    "--policies=float32": "--policies='float32': the overhead suite times exactly one mixed",
    "--epochs=zero": "--epochs='zero': not a whole number. Accepted: a whole number, such as "
                     "--epochs=4 (the default).",
    "--download=maybe": "--download='maybe': not true or false. Accepted: true or false, such as "
                        "--download=true (the default).",
    "--batches=x": "--batches='x': not a whole number.",
    "{npz}": "MODEL='{npz}': not a saved Keras model (Keras loads .keras, .h5, .hdf5 files). Pass "
             "the path of a saved .keras model",
    "--precision=int8": "--precision='int8': unknown precision. Accepted: with --format=litert: "
                        "float32, float16_weights, as_trained; with --format=saved_model: ",
    "--steps=x": "tf_mixed rollback-cost: error: --steps='x': not a whole number. Accepted: a "
                 "whole number, such as --steps=20 (the default).",
    "--policy=mixed_flaot16": "--policy='mixed_flaot16': unknown half-precision policy. Accepted: "
                              "mixed_float16, mixed_bfloat16, fp16, bf16. Did you mean "
                              "'mixed_float16'?",
    "--policy=mixed_flaot6": "Did you mean 'mixed_float16'?",
    "--policy=mixed_bfloat61": "Did you mean 'mixed_bfloat16'?",
    "--model=cnnn": "Did you mean 'cnn'?",
    "--dataset=npz:/no/such/data.npz": "--dataset='npz:/no/such/data.npz': no such file "
                                       "'/no/such/data.npz'. Accepted: npz:PATH",
    "--dataset=shapse": "Did you mean 'shapes'?",
    "--model=vgg": "argument --model: invalid choice: 'vgg' (choose from 'mlp', 'cnn', 'resnet18', "
                   "'resnet50'); see python -m tf_mixed litert-latency --help",
}


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.keras"
    path.write_bytes(b"")
    (tmp_path / "x.npz").write_bytes(b"")  # "{npz}": a file, not a model
    return str(path)


def _with(args, model_file):
    npz = model_file.replace("m.keras", "x.npz")
    return [{"{model}": model_file, "{npz}": npz}.get(a, a) for a in args]


class _Imported(Exception):
    pass


@pytest.fixture
def no_tensorflow(monkeypatch):
    def refuse(verbose=None):
        raise _Imported()

    monkeypatch.setattr(quiet, "import_tensorflow", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("args,status", ANSWERED_AT_ONCE,
                         ids=lambda a: " ".join(a) if isinstance(a, list) else str(a))
def test_help_and_argument_errors_answer_before_importing_tensorflow(args, status, no_tensorflow,
                                                                    capsys):
    assert cli_main.main(["tf_mixed", *args]) == status
    out, err = capsys.readouterr()
    if status == 2:  # one line (argparse's own errors add its usage above it)
        assert ": error: " in err.strip().splitlines()[-1], err


def test_names_tables_and_numbers_are_checked_before_importing_tensorflow(no_tensorflow,
                                                                         model_file, capsys):
    for args in REFUSED_FROM_TABLES:
        assert cli_main.main(["tf_mixed", *_with(args, model_file)]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"tf_mixed {args[0]}: error: ") and len(err.splitlines()) == 1, err
        if args[-1] in SAID:
            said = SAID[args[-1]].replace("{npz}", _with(["{npz}"], model_file)[0])
            assert said in err, err


def test_the_overhead_suite_counts_auto_once_tensorflow_has_resolved_it(no_tensorflow):
    # "auto" may be the one mixed policy, or float32: the count waits for TensorFlow.
    with pytest.raises(_Imported):
        cli_main.main(["tf_mixed", "bench", "--suite=overhead", "--policies=float32,auto"])


def test_a_number_below_its_minimum_is_said_the_same_way_by_every_command(no_tensorflow, capsys,
                                                                         model_file):
    for args, minimum in (
            (["probe", "m.keras", "--batches=0"], 1), (["rollback-cost", "--steps=0"], 1),
            (["litert-latency", "--rounds=0"], 1), (["bench", "--epochs=0"], 1),
            (["bench", "--time_budget=-1"], 0), (["doctor", model_file, "--warmup_steps=-1"], 0)):
        assert cli_main.main(["tf_mixed", *args]) == 2
        flag = args[-1].replace("-1", "-1.0") if "budget" in args[-1] else args[-1]
        assert capsys.readouterr().err == (
            f"tf_mixed {args[0]}: error: {flag}: must be at least {minimum}.\n")


@pytest.mark.slow
@pytest.mark.parametrize("args", [["info"], ["bench", "--model=mlp"], ["audit", "{model}"],
                                  ["check"]])
def test_a_command_whose_arguments_parse_imports_tensorflow_next(args, no_tensorflow, model_file):
    with pytest.raises(_Imported):
        cli_main.main(["tf_mixed", *_with(args, model_file)])


_FRESH = """
import io, contextlib, json, sys, time
from tf_mixed.cli import main
cases = json.loads(sys.argv[1])
seen = []
for args, status in cases:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main.main(["tf_mixed", *args])
    seen.append([args, code, any(m in sys.modules for m in ("tensorflow", "keras", "numpy"))])
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_in_a_fresh_process_parsing_loads_no_tensorflow(model_file):
    # A fresh interpreter: the test process itself has TensorFlow loaded.
    cases = ANSWERED_AT_ONCE + [(_with(args, model_file), 2) for args in REFUSED_FROM_TABLES]
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(cases)],
                          capture_output=True, text=True, timeout=300, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(args, code) for args, code, _ in seen] == [tuple(c) for c in cases]
    assert [args for args, _, loaded in seen if loaded] == []


def test_the_bench_refuses_bad_names_in_a_fresh_process_before_tensorflow():
    # The bench's flag checks (BenchConfig.validate) read names and tables only.
    bench = [(args, 2) for args in REFUSED_FROM_TABLES if args[0] == "bench"][:6]
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(bench)],
                          capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(args, code, loaded) for args, code, loaded in seen] == [
        (args, 2, False) for args, _ in bench]
