"""``python -m tf_mixed doctor MODEL.keras``: why isn't it faster, and what to change."""

# Loads a saved model, takes the first batch of the data (the bench's data sets, or ``npz:PATH``
# with ``x`` and ``y`` arrays), runs `tf_mixed.census` on the step ``fit`` would run, prints the
# census and its findings and writes ``doctor.json`` to ``--output_dir``. For a model that
# computes in float32 it first says the change that helps most: turn mixed precision on, with the
# calls to make (`first_change`; ``first_change`` in ``doctor.json``).
#
# With ``--measure`` it also times training steps of the model before and after the fixes the
# doctor can apply itself (the findings marked automatic): float32 islands from an explicit dtype
# converted with `tf_mixed.convert`, hidden Dense widths padded with ``convert(pad_to=N)``,
# float64 data cast to float32 in the input pipeline. Timing is the bench's own
# (`tf_mixed.commands.step_timer.StepTimer` around ``fit`` steps), both models alternating for
# ``--rounds`` rounds so machine load hits both; the figures are the ratio of the median step
# times and the median of the rounds' ratios. The saved file is never modified.
#
# ``--output_dir`` is checked (created if missing, and written to once) before any work. The
# data's example shapes are checked against the model's inputs before the census; an error names
# the input, the shape expected and the one got. ``doctor.json`` is written only after everything
# succeeded; bad input prints one line naming the value and exits with status 2, leaving nothing
# behind (an ``--output_dir`` it created is removed).

from __future__ import annotations

import json
import os
import shlex
import statistics
import time

from absl import flags

from tf_mixed._internal import measuring, progress
from tf_mixed.cli import model_command
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

USAGE = """usage: python -m tf_mixed doctor MODEL.keras [--dataset=SPEC] [--policy=NAME]
       [--batch_size=32] [--loss=NAME] [--jit_compile=auto|true|false]
       [--measure [--steps=20] [--rounds=3] [--warmup_steps=3]] [--plan] [--output_dir=DIR]

Traces the training step fit runs and reports, per op type, the dtypes ops
compute in, the share of matmul/conv FLOPs in half precision, every cast per
step by layer, float32 islands and dimensions that miss the hardware's
tiles; then the findings, each with its fix. --measure times the model
before and after the fixes the doctor can apply itself. --plan proposes a
precision per layer, timed on this host (tf_mixed.plan).
"""

_JIT = {"auto": None, "true": True, "false": False}


def _define_flags(fv: flags.FlagValues) -> None:
    model_command.define_data_flags(fv, 4, "Distinct batches --measure cycles through.")
    flags.DEFINE_string("policy", "", "Census the model converted to this policy (default: the "
                        "model's own).", flag_values=fv)
    flags.DEFINE_enum("jit_compile", "auto", list(_JIT),
                      "Census the step compiled with XLA (true), without (false), or as the "
                      "model is compiled (auto).", flag_values=fv)
    flags.DEFINE_boolean("measure", False, "Time the model before and after the automatic fixes.",
                         flag_values=fv)
    flags.DEFINE_integer("steps", 20, "--measure: timed steps per model per round.", flag_values=fv)
    flags.DEFINE_integer("rounds", 3, "--measure: alternating rounds.", flag_values=fv)
    flags.DEFINE_integer("warmup_steps", 3, "--measure: untimed steps first (tracing).",
                         flag_values=fv)
    flags.DEFINE_boolean("plan", False, "Propose a per-layer plan: tf_mixed.plan times each "
                         "layer in each precision on this host (cached per host and model) "
                         "and chooses per layer.", flag_values=fv)
    flags.DEFINE_string("output_dir", "tf_mixed_doctor", "Directory for doctor.json.",
                        flag_values=fv)


def _error(message: str) -> int:
    return model_command.error("doctor", message)


def _policy(name: str) -> str:
    """``--policy`` lower-cased, once it names a policy (no TensorFlow needed)."""
    from tf_mixed._internal.cli_errors import unknown
    from tf_mixed.policy import POLICY_NAMES

    canonical = name.strip().lower()
    if canonical not in POLICY_NAMES or canonical == "auto":
        raise unknown("policy", name, "policy", [n for n in POLICY_NAMES if n != "auto"])
    return canonical


def _check_flags(fv) -> None:
    """The flags checked before TensorFlow loads: --warmup_steps, --policy.

    Raises:
        UsageError: Naming the flag.
    """
    from tf_mixed._internal.cli_errors import below_minimum

    if fv.warmup_steps < 0:
        raise below_minimum("warmup_steps", fv.warmup_steps, 0)
    if fv.policy:
        _policy(fv.policy)


def _prepare(fv, path: str):
    """(model, x, y, loss or None): the model as censused, and its data."""
    import tf_mixed
    from tf_mixed.cli import model_file, probe

    model = model_file.load(path)
    if fv.policy:
        model = _quietly(tf_mixed.convert, model, _policy(fv.policy))
    x, y = probe._batches(fv, model)
    loss = None
    if fv.loss:
        optimizer = model.optimizer if model.compiled else "adam"
        model.compile(optimizer=optimizer, loss=fv.loss)
    elif not model.compiled:
        loss = "sparse_categorical_crossentropy"
    return model, x, y, loss


def _example_shapes(x) -> list[tuple]:
    """The shape of one example of each input (the batch dimension dropped)."""
    import keras
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        spec = spec[0] if isinstance(spec, tuple) else spec
        return [tuple(s.shape[1:]) for s in keras.tree.flatten(spec)]
    return [tuple(getattr(a, "shape", ())[1:]) for a in keras.tree.flatten(x)]


def check_data(model, x, dataset: str) -> None:
    """Refuses inputs whose examples do not have the model's input shapes.

    Args:
        model: The loaded model.
        x: Its inputs, as `_prepare` gives them (arrays, a list of arrays, or
            a dataset of ``(x, y)`` batches).
        dataset: The ``--dataset`` flag's value, for the message.

    Raises:
        UsageError: A count of inputs or a shape (rank, or a dimension the
            model fixes) that differs, in `tf_mixed.cli.npz_data.input_problem`'s
            words: "x has shape (None, 7); model 'm' input 'x' takes (None, 32)
            (width 32 expected, got 7)".
    """
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed.cli import npz_data

    shapes = [(None, *shape) for shape in _example_shapes(x)]
    keys = ["x"] if len(shapes) == 1 else [f"x{i}" for i in range(len(shapes))]
    problem = npz_data.input_problem(model, keys, shapes)
    if problem:
        raise UsageError("dataset", dataset, problem, "data whose x matches the model's inputs")


def _data_error(dataset: str, model, x, y, error: BaseException):
    """A UsageError for data the step cannot take, with both sides' shapes."""
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed.cli.npz_data import shape_text as _shape_text

    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Keras's first line is often "Exception encountered when calling ...":
    # the reason is a later line.
    useful = [line for line in lines if not line.startswith("Exception encountered")]
    reason = (useful or lines or [type(error).__name__])[0][:300].rstrip(".")
    outputs = [_shape_text(tuple(t.shape[1:])) for t in getattr(model, "outputs", [])]
    ys = [] if y is None else _example_shapes(y)
    return UsageError(
        "dataset", dataset,
        f"the data does not fit model '{model.name}' (x examples "
        f"{', '.join(map(_shape_text, _example_shapes(x)))}"
        + (f", y examples {', '.join(map(_shape_text, ys))}" if ys else "")
        + f"; the model gives outputs {', '.join(outputs) or '?'} per example): {reason}",
        "data matching the model's inputs, and targets its loss takes")


def _quietly(function, *args, **kwargs):
    """Calls `function` with `tf_mixed.models.ConversionNote` warnings kept quiet."""
    import warnings

    from tf_mixed.models.conversion import ConversionNote

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionNote)
        return function(*args, **kwargs)


def main(argv: list[str]) -> int:
    """Runs ``python -m tf_mixed doctor``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments.

    Returns:
        The exit status: 0 success, 2 bad input.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    parsed = model_command.parse("doctor", argv, fv, USAGE,
                                 ("batch_size", "batches", "steps", "rounds"),
                                 (_check_flags, model_command.check_dataset))
    if isinstance(parsed, int):
        return parsed
    model_path = parsed

    import tf_mixed
    from tf_mixed._internal.cli_errors import UsageError

    start = time.perf_counter()
    created = False
    try:
        # Before the work: a --output_dir that cannot be written fails now.
        created = check_output_dir(fv.output_dir)
        progress.update(f"step 1/3: loading {model_path} and its data")
        model, x, y, loss = _prepare(fv, model_path)
        check_data(model, x, fv.dataset)
        progress.update(f"step 2/3: the census of {model.name}'s training step")
        try:
            report = tf_mixed.census(model, x, y, loss=loss,
                                     jit_compile=_JIT[fv.jit_compile],
                                     batch_size=fv.batch_size)
        except ValueError as error:
            raise _data_error(fv.dataset, model, x, y, error) from None
        progress.update("step 3/3: timing the step (--measure)" if fv.measure
                        else "step 3/3: report")
        measured = _measure(fv, model, report, x, y) if fv.measure else None
        if fv.plan:
            progress.update(f"the per-layer plan of {model.name} (--plan)")
            proposed = propose_plan(model, x, y, loss, fv.batch_size)
        else:
            proposed = None
    except (UsageError, ValueError, TypeError) as error:
        remove_if_created(fv.output_dir, created)
        return _error(model_command.first_line(error))
    seconds = time.perf_counter() - start

    start_here = first_change(report, model_path)
    record = {
        "command": "python -m tf_mixed doctor " + " ".join(shlex.quote(a) for a in argv[1:]),
        "model_path": model_path,
        "dataset": fv.dataset,
        "batch_size": fv.batch_size,
        "seconds": round(seconds, 2),
        "first_change": start_here,
        "census": report.to_dict(),
        "measured": measured,
        "plan": None if proposed is None else proposed.to_dict(),
    }
    text = json.dumps(record, indent=2)
    # Everything is computed: only now write the file (the directory was
    # checked, and created if missing, before the work).
    try:
        model_command.write_atomically(os.path.join(fv.output_dir, "doctor.json"),
                                       (text + "\n").encode())
    except OSError as error:
        remove_if_created(fv.output_dir, created)
        return _error(f"--output_dir={fv.output_dir!r}: cannot write doctor.json "
                      f"({error.strerror or error})")
    if start_here:
        print(start_here + "\n")
    print(report)
    if measured is not None:
        print()
        print(measured_text(measured))
    if proposed is not None:
        print()
        print(proposed, end="")
    print(f"\nExamined in {seconds:.1f} s; wrote {fv.output_dir}/doctor.json")
    return 0


def propose_plan(model, x, y, loss, batch_size: int):
    """`tf_mixed.plan` of `model` on its first batch of `batch_size` examples.

    Args:
        model: The model as censused.
        x, y: The doctor's data: arrays (or lists of arrays per input), or
            a `tf.data` dataset of ``(x, y)`` batches of `batch_size` with
            ``y`` None (a generated set), whose first batch is planned on.
        loss: The loss, or None for the compiled one.
        batch_size: Examples in the batch planned on.

    Returns:
        The `tf_mixed.tools.planning.Plan`.
    """
    import keras
    import tensorflow as tf

    import tf_mixed

    if isinstance(x, tf.data.Dataset):
        return tf_mixed.plan(model, x, loss=loss)

    def first(a):
        return a[:batch_size]

    return tf_mixed.plan(model, keras.tree.map_structure(first, x),
                         keras.tree.map_structure(first, y), loss=loss)


def host_policy(has_gpu: bool | None = None) -> str:
    """The mixed policy to try next on this host: mixed_float16 with a GPU, else
    mixed_bfloat16 (TPUs and CPUs: float16 on a CPU is far slower).

    Args:
        has_gpu: Whether the host has a GPU; None: detect it.
    """
    if has_gpu is None:
        from tf_mixed.policy import hardware

        has_gpu = hardware.detect().has_gpu
    return "mixed_float16" if has_gpu else "mixed_bfloat16"


def first_change(report, model_path: str, next_policy: str | None = None) -> str | None:
    """The one change that helps most, when it is not among the findings.

    A model that computes in float32 gains nothing from any finding (every
    island, cast or tile is about half precision): the change that helps
    most is turning mixed precision on.

    Args:
        report: The model's `tf_mixed.tools.census.step_census.CensusReport`.
        model_path: The MODEL argument, for the commands in the text.
        next_policy: The policy the commands in the text try (`host_policy`:
            mixed_float16 on a GPU host, mixed_bfloat16 elsewhere); None: detect.

    Returns:
        A paragraph starting "Start here:" with the calls to make, or None
        when the model already computes in half precision.
    """
    import keras

    if keras.DTypePolicy(report.policy).compute_dtype != "float32":
        return None
    path = shlex.quote(model_path)
    policy = next_policy or host_policy()
    return (
        f"Start here: model '{report.model_name}' computes in float32, so none of its "
        "matrix products runs in half precision; turning mixed precision on is the "
        "change that helps most. Call tf_mixed.enable() before building the model (it "
        "picks mixed_float16 on a GPU, mixed_bfloat16 on a TPU or a CPU measured faster "
        f"in bfloat16), or convert the trained model: model = tf_mixed.convert(model, "
        f"'{policy}') on this host ('mixed_float16' for a GPU, 'mixed_bfloat16' for a TPU "
        f"or a CPU). Then see what is left: python -m tf_mixed doctor {path} "
        f"--policy={policy}; or let python -m tf_mixed doctor "
        f"{path} --plan time each layer on this host and propose a precision per layer "
        "(tf_mixed.plan).")


# ------------------------------------------------------------------ --measure


def fixed_model(model, report):
    """The model with the automatic fixes applied, and what was applied.

    Args:
        model: The model the census was taken of.
        report: Its `tf_mixed.tools.census.step_census.CensusReport`.

    Returns:
        ``(model, applied)``: a converted copy (or `model` itself when no
        model fix applies) and the list of fixes in words.
    """
    import tf_mixed

    applied = []
    convert_islands = [f.layer for f in report.by_code("float32_island") if f.automatic]
    pads = [f.layer for f in report.by_code("tile_misfit") if f.automatic]
    if not convert_islands and not pads:
        return model, applied
    # Layers in float32 that no automatic finding names stay float32.
    # (keep_float32 rules never match an input layer.)
    keep = [layer.name for layer in model.layers
            if getattr(layer.dtype_policy, "name", "") == "float32"
            and layer.name not in convert_islands]
    pad_to = max((m.multiple for m in report.misfits if m.layer in pads), default=None)
    fixed = _quietly(tf_mixed.convert, model, report.policy, keep_float32=keep, pad_to=pad_to)
    applied += [f"'{name}' converted to {report.policy}" for name in convert_islands]
    applied += [f"'{name}' padded to a multiple of {pad_to}" for name in pads]
    return fixed, applied


def _dataset(x, y, batch_size: int, cast: bool):
    import tensorflow as tf

    data = x if y is None else tf.data.Dataset.from_tensor_slices((x, y)).batch(
        batch_size, drop_remainder=True)
    if cast:
        data = data.map(lambda a, b: (tf.cast(a, "float32"), b))
    return data.repeat()


def _measure(fv, model, report, x, y) -> dict:
    """Median fit step times before and after the automatic fixes."""
    import tf_mixed
    from tf_mixed.commands.step_timer import StepTimer

    fixed, applied = fixed_model(model, report)
    cast = bool(report.by_code("float64_input"))
    if cast:
        applied.append("the data cast to float32 in the input pipeline")
    if not applied:
        return {"applied": [], "note": "no finding has a fix the doctor applies itself: "
                "nothing to measure"}
    if not fixed.compiled:
        fixed.compile(optimizer="adam", loss=model.loss)
    paths = {"before": (model, _dataset(x, y, fv.batch_size, False)),
             "after": (fixed, _dataset(x, y, fv.batch_size, cast))}
    times: dict[str, list[float]] = {name: [] for name in paths}
    rounds: dict[str, list[float]] = {name: [] for name in paths}
    with tf_mixed.policy_scope(report.policy):  # float16 on a CPU: remapping off
        for m, data in paths.values():
            if fv.warmup_steps:
                m.fit(data, epochs=1, steps_per_epoch=fv.warmup_steps, verbose=0, shuffle=False)
        for index in range(fv.rounds):  # each model leads in turn (measuring.rotated)
            for name in measuring.rotated(list(paths), index):
                m, data = paths[name]
                timer = StepTimer()
                m.fit(data, epochs=1, steps_per_epoch=fv.steps, verbose=0, shuffle=False,
                      callbacks=[timer])
                times[name] += timer.times
                rounds[name].append(1000 * statistics.median(timer.times))
    before, after = (1000 * statistics.median(times[n]) for n in ("before", "after"))
    ratios = measuring.pair_ratios(rounds["after"], rounds["before"])
    interval = measuring.estimate(ratios)
    return {
        "applied": applied,
        "policy": report.policy,
        "rounds": fv.rounds,
        "timed_steps": {n: len(t) for n, t in times.items()},
        "round_medians_ms": rounds,
        "before_step_ms": before,
        "after_step_ms": after,
        "speedup": before / after,
        # Each round times both models back to back: the median of the rounds'
        # ratios cancels load that drifts between rounds.
        "round_speedup_median": statistics.median(ratios),
        "round_speedup_interval": [interval.low, interval.high],
        "load_average": measuring.machine_load()[0],
    }


def measured_text(measured: dict) -> str:
    """The --measure result in a few lines."""
    if not measured.get("applied"):
        return f"Measure: {measured['note']}."
    return "\n".join([
        "Measured (median fit step, " + f"{measured['rounds']} alternating rounds):",
        "  applied: " + "; ".join(measured["applied"]),
        (f"  before {measured['before_step_ms']:.2f} ms, after "
         f"{measured['after_step_ms']:.2f} ms: {measured['speedup']:.2f}x (median of the "
         f"rounds' ratios {measured['round_speedup_median']:.2f}x, 90% interval "
         f"{measured['round_speedup_interval'][0]:.2f}-"
         f"{measured['round_speedup_interval'][1]:.2f}x)"),
        "  per round: " + ", ".join(
            f"{b:.1f}/{a:.1f}" for b, a in zip(measured["round_medians_ms"]["before"],
                                               measured["round_medians_ms"]["after"]))
        + " ms (before/after)",
    ])
