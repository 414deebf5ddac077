"""The "auto" probe prints no TensorFlow alarm (issue 45): no retracing warning.

The probe makes one ``tf.function`` per policy and size from the same Python
code; TF counts their traces as one function's and, from five traces in ten
calls (three policies screened, then probed), logs "triggered tf.function
retracing" on the first ``enable()`` of a host.
"""

import logging

import tensorflow as tf

from tf_mixed.policy import autotune


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_six_probe_steps_in_a_row_log_no_retracing_warning():
    # time_rounds with three policies: three screen steps, then three probe
    # steps, each traced once (here float32 only, tiny: the count is what TF sees).
    inputs = autotune._probe_inputs(tf, (8, 16), (1, 4, 4, 4))
    handler = _Collect()
    tf.get_logger().addHandler(handler)
    try:
        for _ in range(6):
            autotune.first_call(autotune._probe_step(tf, "float32"), inputs,
                                remapping_off=False)
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in handler.messages if "retracing" in m], handler.messages
