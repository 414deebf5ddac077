"""Every access to private Keras/TensorFlow API in tf_mixed, or a pointer to it.

- ``tf_mixed/_keras_fix_20585.py`` (the workaround for keras-team/keras#20585,
  ``fit`` under MultiWorkerMirroredStrategy): replaces
  ``keras.src.backend.tensorflow.trainer.TensorFlowTrainer._maybe_symbolic_build``
  and ``keras.src.backend.tensorflow.trainer.reduce_per_replica`` (Keras 3.x,
  measured on 3.15.1), and calls ``strategy.extended._in_multi_worker_mode()``.
  It is kept in its own module so it can be deleted whole once Keras is fixed;
  ``tests/test_multi_worker_fit.py::test_keras_still_has_defect_20585`` fails
  on the first Keras without the defect.
"""
