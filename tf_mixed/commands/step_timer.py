"""Each ``fit`` step's wall and CPU time, for doctor --measure and the bench's suites."""

from __future__ import annotations

import time

import keras


class StepTimer(keras.callbacks.Callback):
    """Each fit step's wall time, the step waited for (also doctor --measure's).

    ``cpu_times`` holds each step's CPU time of this process (all its
    threads): on a busy machine other processes stretch the wall time, not
    the work a step does.
    """

    def __init__(self):
        super().__init__()
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self._start = self._cpu_start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()
        self._cpu_start = time.process_time()

    def on_train_batch_end(self, batch, logs=None):
        float((logs or {}).get("loss", 0.0))  # wait for the step
        self.times.append(time.perf_counter() - self._start)
        self.cpu_times.append(time.process_time() - self._cpu_start)
