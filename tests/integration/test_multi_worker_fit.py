"""`fit`, `evaluate` and `predict` under MultiWorkerMirroredStrategy, and a lost worker.

Two local worker processes (tests/integration/_mw_fit_worker.py, started by
`tf_mixed.distribute.workers.run_local_workers`) train with ``model.fit``; the
single-process reference runs the same worker code in this process, on the
same global batches. Also here: the probe that tells us when Keras fixes
keras-team/keras#20585 (then tf_mixed/distribute/keras_fix_20585.py can go), and the
fault-tolerance run (SIGKILL one worker, restart both, resume from
BackupAndRestore). Every launch has a timeout and kills what is left.
"""

import concurrent.futures
import importlib.util
import json
import pathlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from tf_mixed.distribute import cluster as distribute
from tf_mixed.distribute import keras_fix_20585 as fix
from tf_mixed.distribute.workers import run_local_workers

# Every test here starts worker processes (module fixtures included).
pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_mw_fit_worker.py")
POLICIES = ("mixed_float16", "mixed_bfloat16", "float32")
# Worker 1's first batch overflows float16: in epoch 1 before any step was
# applied (the loss scale's calibration, counted once: the same batch in
# later epochs is a skip like any other).
BAD_STEP = 1
LAUNCH_TIMEOUT_S = 240  # bounds a hang; a 2-worker run takes 10-30 s under load


def _worker_module():
    spec = importlib.util.spec_from_file_location("_mw_fit_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(tmp_path, name, grace=0.0, **config):
    config.setdefault("out", str(tmp_path / f"{name}{{i}}.json"))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    results = run_local_workers(
        2, [sys.executable, str(WORKER), str(path)], timeout=LAUNCH_TIMEOUT_S,
        check=False, grace_seconds=grace,
    )
    return results, [tmp_path / f"{name}{i}.json" for i in range(2)]


def _outputs(results, paths):
    for result in results:
        assert result.returncode == 0, result.output[-3000:]
    return [json.loads(p.read_text()) for p in paths]


# --------------------------------------------------------------- the Keras defect


def test_keras_still_has_defect_20585():
    """Fails once Keras fixes #20585: then delete tf_mixed/distribute/keras_fix_20585.py."""
    defects = fix.probe()
    assert defects == fix.Defects(build_reduces_batch=True, scalar_reduce_axis0=True), (
        f"Keras {fix.keras.__version__} no longer has (all of) keras-team/keras#20585 "
        f"({defects}): remove or narrow tf_mixed/distribute/keras_fix_20585.py")


def test_fix_feeds_build_the_first_local_batch_and_reduces_scalars_with_axis_none():
    trainer = fix._trainer_module()
    original_build = trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = trainer.reduce_per_replica
    assert fix.apply() is True
    try:
        assert fix.apply() is True  # idempotent
        strategy = fix._fake_multi_worker_strategy()
        built = []
        first, second = tf.fill((2, 1), 1.0), tf.fill((2, 1), 2.0)
        fake_model = types.SimpleNamespace(
            _distribute_strategy=strategy, distribute_strategy=strategy,
            _symbolic_build=lambda data_batch=None: built.append(data_batch))
        trainer.TensorFlowTrainer._maybe_symbolic_build(
            fake_model, iterator=[(0, 0, iter([fix._FakePerReplica((first, second))]))])
        assert strategy.reduces == []
        assert built[0] is first

        strategy = fix._fake_multi_worker_strategy()
        trainer.reduce_per_replica({"loss": tf.constant(3.0)}, strategy, "auto")
        assert [axis for _, axis in strategy.reduces] == [None]
        # The originals still answer every other case: probing them shows the defect.
        assert fix.probe().any
    finally:
        fix.restore()
    assert trainer.TensorFlowTrainer._maybe_symbolic_build is original_build
    assert trainer.reduce_per_replica is original_reduce
    assert not fix.is_applied()


def test_fit_support_changes_nothing_without_several_workers(mirrored):
    assert distribute.fit_support() is False
    assert distribute.fit_support(mirrored) is False
    assert not fix.is_applied()


def test_multi_worker_strategy_installs_the_fix_where_fit_is_prepared(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 0}}))
    fake = fix._fake_multi_worker_strategy()
    # distribute's own `tf` sees a strategy class that starts no cluster.
    monkeypatch.setattr(distribute, "tf", types.SimpleNamespace(
        distribute=types.SimpleNamespace(
            MultiWorkerMirroredStrategy=lambda **_: fake,
            experimental=tf.distribute.experimental,
            get_strategy=tf.distribute.get_strategy)))
    try:
        assert distribute.multi_worker_strategy() is fake
        assert fix.is_applied()
    finally:
        distribute.remove_fit_support()
    assert not fix.is_applied()


def test_the_optimizer_does_not_install_the_fix(monkeypatch):
    import keras

    import tf_mixed

    monkeypatch.setattr(tf.distribute, "get_strategy", fix._fake_multi_worker_strategy)
    try:
        tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        assert not fix.is_applied()
    finally:
        distribute.remove_fit_support()


def test_fix_is_not_installed_on_another_keras_major(monkeypatch):
    monkeypatch.setattr(fix.keras, "__version__", "4.0.0")
    assert fix.apply() is False
    assert not fix.is_applied()


# ------------------------------------------------------- fit / evaluate / predict


@pytest.fixture(scope="module")
def fit_runs(tmp_path_factory):
    """Two workers and the in-process reference, each over all three policies."""
    tmp_path = tmp_path_factory.mktemp("mw_fit")
    config = dict(mode="fit", policies=list(POLICIES), epochs=2,
                  bad_step={"mixed_float16": BAD_STEP})
    workers = _outputs(*_launch(tmp_path, "worker", **config))
    out = tmp_path / "reference{i}.json"
    _worker_module().main(dict(config, mode="reference", out=str(out)))
    reference = json.loads(pathlib.Path(str(out).replace("{i}", "0")).read_text())
    return workers, reference


@pytest.mark.slow
def test_overflow_on_worker_1_is_skipped_on_both_like_one_process(fit_runs):
    (w0, w1), reference = fit_runs
    a, b, ref = w0["mixed_float16"], w1["mixed_float16"], reference["mixed_float16"]
    assert w0["replicas"] == w1["replicas"] == 2
    assert a == b  # every weight bit, the scale, the counters, the logs
    # 2 epochs x 4 steps, step 1 of each epoch overflows (the same data again):
    # 2 skipped, 6 applied; the scale halves twice from 2**10. The first skip
    # came before any applied step: calibration, on both workers alike.
    assert (a["skipped_steps"], a["iterations"], a["loss_scale"]) == (2, 6, 256.0)
    assert (ref["skipped_steps"], ref["iterations"], ref["loss_scale"]) == (2, 6, 256.0)
    assert a["epoch_logs"]["skipped_steps"] == [1.0, 1.0]
    assert a["epoch_logs"]["calibration_steps"] == [1.0, 0.0]
    assert a["calibration_skips"] == ref["calibration_skips"] == 1
    for got, want in zip(a["weights"], ref["weights"]):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)  # float16 rounding


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_fit_evaluate_predict_agree_across_workers_and_with_one_process(fit_runs, policy):
    (w0, w1), reference = fit_runs
    a, b, ref = w0[policy], w1[policy], reference[policy]
    assert a == b
    atol = {"float32": 1e-5, "mixed_float16": 2e-3, "mixed_bfloat16": 3e-2}[policy]
    for got, want in zip(a["weights"], ref["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    np.testing.assert_allclose(a["evaluate"], ref["evaluate"], rtol=4 * atol, atol=atol)
    # predict on arrays: auto-sharded, gathered from both workers in order.
    assert len(a["predict"]) == len(ref["predict"]) == 32
    np.testing.assert_allclose(a["predict"], ref["predict"], rtol=0, atol=4 * atol)
    if policy != "mixed_float16":
        assert a["skipped_steps"] == 0 and a["iterations"] == 8


def test_the_chief_saves_a_model_that_loads_with_the_trained_weights(fit_runs):
    import keras

    (w0, _), _ = fit_runs
    assert w0["saved"]["float32"].endswith("-float32-model.keras")
    loaded = keras.saving.load_model(w0["saved"]["float32"])
    assert [w.ravel().tolist() for w in loaded.get_weights()] == w0["float32"]["weights"]


# ------------------------------------------------------------ a worker dies


@pytest.mark.slow
def test_a_hand_built_strategy_fits_like_one_process(tmp_path):
    # Issue 27: `tf.distribute.MultiWorkerMirroredStrategy()` built by hand failed
    # in Keras's fit with "unsupported type PerReplica"; `import tf_mixed` now
    # arms the keras-team/keras#20585 fix for the first fit across workers.
    config = dict(mode="fit", policies=["mixed_float16"], epochs=2, hand_built=True,
                  bad_step={"mixed_float16": BAD_STEP})
    w0, w1 = _outputs(*_launch(tmp_path, "hand", **config))
    out = tmp_path / "hand_reference{i}.json"
    _worker_module().main(dict(config, mode="reference", hand_built=False, out=str(out)))
    reference = json.loads(pathlib.Path(str(out).replace("{i}", "0")).read_text())
    ref = reference["mixed_float16"]
    for worker in (w0, w1):
        assert worker["replicas"] == 2 and worker["fix_installed_before_fit"] is False
        assert worker["mixed_float16"]["fix_installed_after_fit"] is True
    a, b = w0["mixed_float16"], w1["mixed_float16"]
    assert a == b  # every weight bit, the scale, the counters, the logs
    # As with multi_worker_strategy(): 2 skipped, 6 applied, the scale halved twice.
    assert (a["skipped_steps"], a["iterations"], a["loss_scale"]) == (2, 6, 256.0)
    assert (ref["skipped_steps"], ref["iterations"], ref["loss_scale"]) == (2, 6, 256.0)
    for got, want in zip(a["weights"], ref["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)  # float16 rounding


def test_importing_tf_mixed_arms_the_watch_and_it_passes_single_worker_through(mirrored):
    import keras

    import tf_mixed  # noqa: F401

    assert fix.is_watching() and not fix.is_applied()
    with mirrored.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), batch_size=2, verbose=0)
    assert fix.is_watching() and not fix.is_applied()  # MirroredStrategy: Keras's own


def test_the_watch_installs_the_fix_at_the_first_multi_worker_build():
    trainer = fix._trainer_module()
    assert fix.is_watching()
    built = []
    strategy = fix._fake_multi_worker_strategy()
    model = types.SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy,
                                  _symbolic_build=lambda data_batch=None: built.append(data_batch))
    batch = fix._FakePerReplica((tf.zeros((2, 1)), tf.ones((2, 1))))
    try:
        trainer.TensorFlowTrainer._maybe_symbolic_build(model, iterator=[(0, 0, iter([batch]))])
        assert fix.is_applied() and fix.is_watching()
        np.testing.assert_array_equal(built[0], np.zeros((2, 1)))  # the first local batch
        assert not strategy.reduces  # no cross-worker reduce of a data batch
    finally:
        distribute.remove_fit_support()
    assert fix.is_watching() and not fix.is_applied()  # the watch is back


def test_unwatch_and_watch_round_trip():
    trainer = fix._trainer_module()
    armed = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
    try:
        fix.unwatch()
        assert not fix.is_watching()
        assert trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"] is armed.__wrapped__
    finally:
        assert fix.watch()
    assert fix.is_watching()


@pytest.mark.slow
def test_killed_worker_resumes_from_backup_like_an_uninterrupted_run(tmp_path):
    """SIGKILL worker 1 mid-epoch, restart both: same weights and scale as no kill.

    Bit-exact because every epoch's data is a fixed function of the worker
    (no shuffling) and BackupAndRestore(save_freq="epoch") resumes at the
    start of the interrupted epoch from the state saved at the end of the
    one before (Keras 3.15 restores the epoch only, never a batch).
    growth_interval=3 makes the restored good-step counter matter: a lost
    counter would grow the scale one step late.
    """
    common = dict(mode="backup", policies=["mixed_float16"], epochs=3,
                  bad_step={"mixed_float16": BAD_STEP}, growth_interval=3,
                  collective_timeout=30)
    backup = str(tmp_path / "b_killed")
    # The uninterrupted run and the one that loses a worker are two separate
    # clusters: run them side by side (the second mostly waits for TF to
    # notice the lost worker).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole_run = pool.submit(_launch, tmp_path, "whole",
                                backup_dir=str(tmp_path / "b_whole"), **common)
        killed, _ = _launch(tmp_path, "killed", backup_dir=backup, die_worker=1,
                            die_epoch=1, die_batch=2, grace=60, **common)
        whole = _outputs(*whole_run.result(timeout=LAUNCH_TIMEOUT_S + 30))
    # Worker 1 died by SIGKILL; worker 0 was not left waiting: it failed on its
    # own, naming the lost task, before the launcher would have stopped it.
    assert killed[1].returncode == -9, killed[1].output[-2000:]
    assert killed[0].returncode not in (0, None) and not killed[0].stopped
    assert "task:1" in killed[0].output, killed[0].output[-3000:]
    assert killed[0].seconds - killed[1].seconds < 60
    resumed = _outputs(*_launch(tmp_path, "resumed", backup_dir=backup, **common))

    for outputs in (whole, resumed):
        assert outputs[0]["mixed_float16"]["weights"] == outputs[1]["mixed_float16"]["weights"]
    got, want = resumed[0]["mixed_float16"], whole[0]["mixed_float16"]
    assert got["weights"] == want["weights"]
    assert (got["loss_scale"], got["skipped_steps"], got["iterations"]) == (
        want["loss_scale"], want["skipped_steps"], want["iterations"])
    # The calibration count came back from the backup in the new processes.
    assert got["calibration_skips"] == want["calibration_skips"] == 1
    # Resumed at epoch 2 of 3: its History holds the last two epochs only.
    assert len(got["loss"]) == 2 and len(want["loss"]) == 3
    assert got["epoch_logs"]["loss_scale"] == want["epoch_logs"]["loss_scale"][1:]
