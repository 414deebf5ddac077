"""tf_mixed/commands/step_timer.py: each fit step's wall and CPU time, the step waited for."""

import time

import keras
import numpy as np

from tf_mixed.commands.step_timer import StepTimer


class _Loss:
    """A loss whose reading is recorded (the timer waits for the step by reading it)."""

    def __init__(self, read):
        self.read = read

    def __float__(self):
        self.read.append(True)
        return 0.5


def test_wall_and_cpu_time_per_step_with_given_clocks(monkeypatch):
    wall, cpu = iter([10.0, 10.25, 20.0, 20.5]), iter([1.0, 1.125, 2.0, 2.0625])
    monkeypatch.setattr(time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(time, "process_time", lambda: next(cpu))
    timer, read = StepTimer(), []
    for batch in range(2):
        timer.on_train_batch_begin(batch)
        timer.on_train_batch_end(batch, {"loss": _Loss(read)})
    assert timer.times == [0.25, 0.5]
    assert timer.cpu_times == [0.125, 0.0625]
    assert read == [True, True]  # each step's loss read before its clock stops


def test_one_time_per_fit_step():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    timer = StepTimer()
    model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=2, epochs=1, verbose=0,
              callbacks=[timer])
    assert len(timer.times) == len(timer.cpu_times) == 4
    assert all(t >= 0.0 for t in timer.times + timer.cpu_times)
