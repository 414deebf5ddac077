"""What the command line and the bench share: data sets, names, output directories, parsing."""

# Below both `tf_mixed.cli` and `tf_mixed.bench` (docs/layout.md): the commands
# (probe, doctor, export, catalog) and the bench's suites import these modules;
# these import neither. Like cli/ and bench/, a client of the public API (and of
# the TensorFlow-free helpers in `tf_mixed._internal` the layout names).
#
#     names.py            model, data-set and policy names and their checks (no TensorFlow)
#     data.py             shapes, tfds:NAME, folder:PATH, tokens
#     output_dir.py       --output_dir checked before the work, removed on failure
#     one_line_parser.py  argparse with one line per bad flag
#     step_timer.py       each fit step's wall and CPU time
