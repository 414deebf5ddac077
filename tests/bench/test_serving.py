"""The main job's serving table (tf_mixed.bench.serving), from fixed figures."""

from tf_mixed.bench import serving


def _figures(size, error):
    return {"bytes": size, "max_abs_error": error, "max_rel_error": error,
            "tolerance": 0.1, "worst_output": "out"}


def test_table_rows_sizes_ratio_and_errors():
    results = [
        {"policy": "float32", "serving": None},
        {"policy": "mixed_bfloat16", "serving": {"float32": _figures(4096, 1.5e-3),
                                                 "float16_weights": _figures(2048, 2.5e-3)}},
    ]
    table = serving.markdown_table(results)
    assert "| mixed_bfloat16 | 4.0 | 2.0 | 0.50x | 1.50e-03 | 2.50e-03 |" in table
    assert "| float32 |" not in table


def test_failed_export_is_shown_not_raised():
    results = [{"policy": "mixed_float16", "serving": {
        "float32": _figures(1024, 0.0), "float16_weights": {"error": "boom"}}}]
    assert ("| mixed_float16 | 1.0 | failed | n/a | 0.00e+00 | boom |"
            in serving.markdown_table(results))


def test_no_serving_figures_no_table():
    assert serving.markdown_table([{"policy": "float32", "serving": None}]) == ""
