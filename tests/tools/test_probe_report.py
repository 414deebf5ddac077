"""probe.png readable for a 200-layer model (issue 46: 5,024 px wide, a y axis to 2^128)."""

import struct

from tf_mixed.tools import probe_report
from tf_mixed.tools.probe_report import LayerStats, ProbeReport, VariableStats, plot_layout


def test_the_layout_of_a_200_layer_bfloat16_model():
    layout = plot_layout(200, "mixed_bfloat16", [-3.0, 2.0, 9.5])
    assert layout["width_in"] == probe_report.MAX_WIDTH_IN
    assert layout["label_every"] == 4  # 50 names under the axis, not 200
    assert layout["ylim"] == (-5.0, 13.5)  # the data, not bfloat16's 2^128
    assert layout["lines"] == []
    assert layout["note"] == "; bfloat16's largest finite, 2^128, is far above the chart"


def test_the_layout_of_a_small_float16_model_draws_its_limits():
    layout = plot_layout(5, "mixed_float16", [1.0, 3.0])
    assert layout["width_in"] == 6.0 and layout["label_every"] == 1
    top = layout["lines"][0][0]
    assert 15.9 < top < 16.0 and layout["ylim"] == (-16.0, top + 2.0)
    assert [label for _, label, _ in layout["lines"]] == [
        "float16 largest finite (2^16.0)", "float16 smallest normal (2^-14)"]
    assert layout["note"] == ""


def test_a_200_layer_png_is_at_most_1540_px_wide():
    layers = tuple(LayerStats(f"layer_{i}", "Dense", "bfloat16", "bfloat16", 2.0 ** (i % 7),
                              2.0 ** (i % 7), 120.0, 0.0, 0.0, 0.0, 0.0, None, None)
                   for i in range(200))
    report = ProbeReport("deep", "mixed_bfloat16", 1, 8, layers, (), 1.0, 1.0, 0, 0, None, None,
                         "", "predicted")
    png = report.plot()
    width, height = struct.unpack(">II", png[16:24])
    assert width <= 14 * 110 and height <= 5 * 110


def test_the_backward_table_says_the_dtype_is_the_layers_compute_dtype():
    # Under mixed_float16 the kernel is a float32 variable: a column "dtype"
    # reading float16 beside its name said otherwise.
    variable = VariableStats("dense/kernel", "dense", "float16", 8, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0)
    report = ProbeReport("m", "mixed_float16", 1, 8, (), (variable,), 2.0**15, 2.0**15, 0, 0,
                         None, None, "", "predicted")
    lines = str(report).splitlines()
    header = lines[lines.index(next(x for x in lines if x.startswith("Backward"))) + 1]
    assert header.split()[:2] == ["variable", "computes"], header
