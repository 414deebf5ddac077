"""The main job and its suites: a client of tf_mixed's public API."""

# ``python -m tf_mixed`` dispatches here through `tf_mixed.cli.main`, the one
# module that imports this package (tests/test_layout.py walks every module's
# imports); it imports public names of the library, what it shares with the
# commands (`tf_mixed.commands`: data sets, names, output directories) and the
# standard-library helpers of `tf_mixed._internal` docs/layout.md names.
#
#     config.py    `BenchConfig`, policy resolution, the one data loader
#     run.py       one policy trained and measured in this process
#     train.py     the fit and GradientTape loops with their step recorder
#     compare.py   the compare suite: one child process per policy, rounds interleaved
#     child.py     the per-policy process (``python -m tf_mixed.bench.child``)
#     schedule.py  the rounds' order, the time budget's plan, spreads and pair ratios
#     matmul.py    the host's large-matmul half/float32 ratio
#     gpu_suite.py ``--suite=gpu``: ResNet-50 on one GPU, XLA, loss-scale overhead, float8
#     overhead.py  ``--suite=overhead``: tf_mixed against Keras's own scaling
#     report.py    ratios, the Markdown table, the result files, host facts
#     plot.py      bench.png
#     models.py    mlp, cnn, resnet18, resnet50, mobilenetv2, efficientnetb0, transformer
#     serving.py   LiteRT files of the main job's mixed run, sizes and parity
#     comm.py, memory_suite.py, bf16_quality.py, rollback_cost.py,
#     litert_latency.py   the other suites
