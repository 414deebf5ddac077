"""The value `tf_mixed.export` returns: what was written and how close it computes.

`ExportReport` is frozen plain data: ``str(report)`` is a short table,
``report.to_dict()`` the same for JSON (``export.json`` of the command line).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ExportReport"]


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """What `tf_mixed.export` wrote, checked by running it in its own runtime.

    Attributes:
      path: Where the artifact is (a SavedModel directory or a .tflite file).
      format: "saved_model" or "litert".
      precision: The precision written ("as_trained" resolved to one of
        "float32", "float16_weights", "float16", "bfloat16").
      trained_dtype: The dtype the model in memory computes in.
      input_names, input_dtypes, input_shapes: The artifact's inputs, in
        order (shapes with None for the batch dimension).
      output_names, output_dtypes, output_shapes: Its outputs, likewise.
      bytes: Size on disk (a directory: the sum of its files).
      select_ops: TensorFlow ops the LiteRT file runs through the Flex
        delegate (outside LiteRT's builtin set); () when it needs none,
        and always () for a SavedModel.
      runtime: What ran the artifact for the check: "tf.saved_model",
        "ai_edge_litert" (the builtin interpreter, no Flex delegate), or
        "not run (needs the Flex delegate)" for a LiteRT file with Select
        ops, which no Python runtime here can run.
      tolerance: The largest relative error accepted.
      max_abs_error: With a sample, the largest |artifact - model| over all
        outputs; None without one.
      max_rel_error: With a sample, the largest over the outputs of
        max|artifact - model| / max|model| (per output); None without one.
      worst_output: The output with the largest relative error, or None.
    """

    path: str
    format: str
    precision: str
    trained_dtype: str
    input_names: tuple[str, ...]
    input_dtypes: tuple[str, ...]
    input_shapes: tuple[tuple[int | None, ...], ...]
    output_names: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int | None, ...], ...]
    bytes: int
    select_ops: tuple[str, ...]
    runtime: str
    tolerance: float
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    worst_output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``json`` writes its tuples as lists)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        def io(names, dtypes, shapes):
            return ", ".join(f"{n} {d}{list(s)}" for n, d, s in zip(names, dtypes, shapes))

        parity = ("not checked: no sample was given" if self.max_rel_error is None else
                  f"max abs {self.max_abs_error:.3g}, max rel {self.max_rel_error:.3g} "
                  f"(worst: {self.worst_output}; tolerance {self.tolerance:.3g}), "
                  f"run by {self.runtime}")
        rows = [
            ("artifact", f"{self.format} at {self.path}"),
            ("precision", f"{self.precision} (trained in {self.trained_dtype})"),
            ("inputs", io(self.input_names, self.input_dtypes, self.input_shapes)),
            ("outputs", io(self.output_names, self.output_dtypes, self.output_shapes)),
            ("size", f"{self.bytes:,} bytes"),
            ("select TF ops", ", ".join(self.select_ops) or "none"),
            ("parity", parity),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
