"""The bench and the command line: a client of tf_mixed's public API.

``python -m tf_mixed`` dispatches to `tf_mixed.bench.cli`. Nothing in the
library imports this package (a test walks every module's imports); it
imports only public names of the library.

    cli.py       flags and subcommands: bench, info, audit
    config.py    `BenchConfig`, policy resolution, the one data loader
    run.py       one policy trained and measured in this process
    train.py     the fit and GradientTape loops with their step recorder
    compare.py   the compare suite: one child process per policy
    child.py     the per-policy process (``python -m tf_mixed.bench.child``)
    overhead.py  ``--suite=overhead``: tf_mixed against Keras's own scaling
    report.py    ratios, the Markdown table, the result files, host facts
    plot.py      bench.png
    data.py      shapes, tfds:NAME, folder:PATH
    models.py    mlp, cnn, resnet18, resnet50
    info.py      the hardware report of ``python -m tf_mixed info``
    audit_command.py  ``python -m tf_mixed audit PATH``
    doctor.py    ``python -m tf_mixed doctor MODEL``: census, findings, --measure
    model_command.py  what probe and doctor share: MODEL parsing, errors, atomic writes
    quiet.py     TensorFlow's log level and the quiet import
    errors.py    `UsageError`, `ChildFailed`
"""
