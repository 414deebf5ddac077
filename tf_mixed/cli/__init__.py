"""``python -m tf_mixed``: the command line, one module per command."""

#     main.py           flags and subcommands; dispatches to the modules below and to the bench
#                       (the one module here that imports tf_mixed.bench)
#     info.py           ``info``: the devices found and what "auto" picks
#     audit.py          ``audit PATH``
#     check.py          ``check``: what each policy gives on this host
#     probe.py          ``probe MODEL``
#     doctor.py         ``doctor MODEL``: census, findings, --measure
#     export.py         ``export MODEL``
#     model_command.py  what probe, doctor and export share: MODEL parsing, errors, atomic writes
#     model_file.py     loading a MODEL file
#
# This file imports nothing, so the command line can set TensorFlow's log level
# before TensorFlow loads.
