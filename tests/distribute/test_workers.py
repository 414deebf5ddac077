"""The local workers (`tf_mixed/distribute/workers.py`) and the TF_CONFIG checks, without TF.

Workers here are tiny ``python -c`` programs, so these tests take a few
seconds; the real TensorFlow workers run in tests/integration/test_multi_worker_fit.py.
Every launch is bounded by a timeout; tests that stop workers check that no
process (worker or a worker's own child) is left.
"""

import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tf_mixed.distribute import cluster as distribute
from tf_mixed.distribute.workers import WorkersFailed, free_ports, run_local_workers, tf_config


def _python(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


def _alive(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead


def _wait_dead(pid, within_s=10.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_each_worker_gets_its_tf_config_and_a_prefixed_output():
    out = io.StringIO()
    results = run_local_workers(3, _python("""
        import os
        print(os.environ["TF_CONFIG"])
        print("done")
    """), timeout=60, start_timeout=None, output=out)
    assert [r.returncode for r in results] == [0, 0, 0]
    tasks = [distribute.parse_tf_config(r.output.splitlines()[0]) for r in results]
    assert [t.index for t in tasks] == [0, 1, 2]
    assert [t.is_chief for t in tasks] == [True, False, False]
    assert len({t.workers for t in tasks}) == 1  # one cluster
    assert all(w.startswith("127.0.0.1:") for w in tasks[0].workers)
    assert len(set(tasks[0].workers)) == 3
    lines = out.getvalue().splitlines()
    for index in range(3):
        assert f"[worker {index}] done" in lines


@pytest.mark.slow
def test_argv_may_depend_on_the_worker_index():
    results = run_local_workers(
        2, lambda i: _python(f"print('I am', {i})"), timeout=60, start_timeout=None,
        output=io.StringIO())
    assert [r.output for r in results] == ["I am 0", "I am 1"]


@pytest.mark.slow
def test_one_failing_worker_stops_the_others_and_their_children(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    def argv(i):
        return _python(f"""
        import os, subprocess, sys, time
        if {i} == 1:  # fails once worker 0 has started its own child
            deadline = time.monotonic() + 60
            while not os.path.exists({str(pid_file)!r}) and time.monotonic() < deadline:
                time.sleep(0.05)
            sys.exit(3)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open({str(pid_file)!r} + ".tmp", "w") as f:
            f.write(str(child.pid))
        os.replace({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
        time.sleep(600)
    """)
    start = time.monotonic()
    with pytest.raises(WorkersFailed, match="worker 1 exited with status 3") as info:
        run_local_workers(2, argv, timeout=120, start_timeout=None, output=io.StringIO())
    assert time.monotonic() - start < 60
    results = info.value.results
    assert results[1].returncode == 3 and not results[1].stopped
    assert results[0].returncode == -signal.SIGKILL and results[0].stopped
    assert _wait_dead(int(pid_file.read_text()))


@pytest.mark.slow
def test_timeout_stops_every_worker():
    with pytest.raises(WorkersFailed, match="did not finish within timeout=1") as info:
        run_local_workers(2, _python("import time; time.sleep(600)"), timeout=1,
                          start_timeout=None, output=io.StringIO())
    assert all(r.stopped and r.returncode == -signal.SIGKILL for r in info.value.results)


@pytest.mark.slow
def test_a_worker_that_never_starts_its_server_is_reported():
    with pytest.raises(WorkersFailed, match=r"worker\(s\) \[0, 1\] did not start"):
        run_local_workers(2, _python("import time; time.sleep(600)"), timeout=120,
                          start_timeout=1, output=io.StringIO())


@pytest.mark.slow
def test_a_worker_that_cannot_be_executed_is_reported_and_the_others_stopped():
    def argv(i):
        return _python("import time; time.sleep(600)") if i == 0 else ["/nonexistent/python"]

    with pytest.raises(WorkersFailed, match="worker 1 could not be started") as info:
        run_local_workers(2, argv, timeout=60, output=io.StringIO())
    (started,) = info.value.results
    assert started.stopped and started.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_a_worker_reporting_its_port_taken_gets_a_hint():
    with pytest.raises(WorkersFailed, match="was taken by another process"):
        run_local_workers(
            1, _python("import sys; print('bind: Address already in use'); sys.exit(1)"),
            timeout=60, start_timeout=None, output=io.StringIO())


@pytest.mark.slow
def test_grace_lets_the_others_end_on_their_own(tmp_path):
    # Worker 0 writes its pid and fails; worker 1 ends on its own only once
    # worker 0 is gone (reaped by the launcher): an order, not a delay.
    pid_file = tmp_path / "worker0.pid"
    first = (f"import os, sys; p = {str(pid_file)!r}; "
             "open(p + '.tmp', 'w').write(str(os.getpid())); "
             "os.replace(p + '.tmp', p); sys.exit(1)")
    second = textwrap.dedent(f"""
        import os, pathlib, sys, time
        path = pathlib.Path({str(pid_file)!r})
        deadline = time.monotonic() + 120
        while not path.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pid = int(path.read_text())
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sys.exit(2)
    """)
    def argv(i):
        return _python(first if i == 0 else second)

    with pytest.raises(WorkersFailed) as info:
        run_local_workers(2, argv, timeout=60, start_timeout=None, grace_seconds=30,
                          output=io.StringIO())
    results = info.value.results
    assert [r.returncode for r in results] == [1, 2]
    assert not any(r.stopped for r in results)
    assert results[0].seconds <= results[1].seconds


@pytest.mark.slow
def test_workers_die_with_the_launching_process(tmp_path):
    pid_file = tmp_path / "worker.pid"
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from tf_mixed.distribute.workers import run_local_workers
        run_local_workers(1, [sys.executable, "-c",
            "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(600)"], timeout=600, start_timeout=None)
    """)], env=dict(os.environ), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the worker never started"
            assert launcher.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        launcher.kill()
        launcher.wait(timeout=10)
        assert _wait_dead(worker)
    finally:
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_num_workers_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=f"num_workers={bad!r}"):
        run_local_workers(bad, ["true"])


@pytest.mark.slow
@pytest.mark.parametrize("name, value", [("timeout", 0), ("start_timeout", -1),
                                         ("timeout", "5")])
def test_timeouts_must_be_positive(name, value):
    with pytest.raises(ValueError, match=f"`{name}` must be a positive number"):
        run_local_workers(1, ["true"], **{name: value})


@pytest.mark.slow
def test_ports_in_use_are_refused_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = free_ports(1)[0]
        with pytest.raises(ValueError, match=rf"`ports` \[{port}\] on 127.0.0.1 are in use"):
            run_local_workers(2, ["true"], ports=[port, free])
    with pytest.raises(ValueError, match="one port per worker"):
        run_local_workers(2, ["true"], ports=[free])


# ------------------------------------------------------------------- TF_CONFIG


def test_tf_config_round_trips_through_the_parser():
    task = distribute.parse_tf_config(tf_config([1111, 2222], 1))
    assert task == distribute.Task(index=1, workers=("127.0.0.1:1111", "127.0.0.1:2222"),
                                   is_chief=False, task_type="worker", task_index=1)
    assert task.num_workers == 2


@pytest.mark.slow
@pytest.mark.parametrize("text, message", [
    ("{cluster: }", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"cluster": {}, "task": {"type": "worker", "index": 0}}', 'needs cluster\\["worker"\\]'),
    ('{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}',
     "the same address twice"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "needs task"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
     r"from 0 to 1 \(the cluster lists 2 workers\); got 2"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": -1}}',
     "got -1"),
    ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "0"}}',
     "got '0'"),
])
def test_bad_tf_config_is_refused_with_what_was_received(text, message):
    with pytest.raises(ValueError, match=message) as info:
        distribute.parse_tf_config(text)
    assert "Received: TF_CONFIG=" in str(info.value)


def test_multi_worker_strategy_checks_tf_config_before_starting_anything(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert distribute.current_task() is None
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        distribute.multi_worker_strategy()
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}))
    with pytest.raises(ValueError, match="got 3"):
        distribute.multi_worker_strategy()
    with pytest.raises(ValueError, match="timeout_seconds=0"):
        distribute.multi_worker_strategy(timeout_seconds=0)


# ------------------------------------------------------- chief, argv, ports (issue 17)


def _cluster(chief, workers, task_type, index):
    cluster = {"worker": [f"w:{i}" for i in range(workers)]}
    if chief is not None:
        cluster["chief"] = [f"c:{i}" for i in range(chief)]
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


@pytest.mark.slow
@pytest.mark.parametrize("chief, workers, task_type, index", [
    (None, 3, "worker", 0), (None, 3, "worker", 2), (1, 2, "chief", 0),
    (1, 2, "worker", 0), (1, 2, "worker", 1), (1, 0, "chief", 0),
])
def test_tf_config_follows_tensorflows_cluster_semantics(chief, workers, task_type, index):
    from tensorflow.python.distribute import multi_worker_util as tf_rules

    config = _cluster(chief, workers, task_type, index)
    task = distribute.parse_tf_config(json.dumps(config))
    assert task.index == tf_rules.id_in_cluster(config["cluster"], task_type, index)
    assert task.num_workers == tf_rules.worker_count(config["cluster"], task_type)
    assert task.is_chief == tf_rules.is_chief(config["cluster"], task_type, index)
    assert (task.task_type, task.task_index) == (task_type, index)


def test_every_task_of_a_cluster_with_a_chief_gets_its_own_index():
    configs = [_cluster(1, 2, "chief", 0)] + [_cluster(1, 2, "worker", i) for i in range(2)]
    tasks = [distribute.parse_tf_config(c) for c in configs]
    assert [t.index for t in tasks] == [0, 1, 2]
    assert [t.is_chief for t in tasks] == [True, False, False]
    assert {t.num_workers for t in tasks} == {3}
    # The README's per-worker paths are distinct for every live process.
    paths = ["model.keras" if t.is_chief else f"/tmp/model-{t.index}.keras" for t in tasks]
    backups = [f"/backup/worker-{t.index}" for t in tasks]
    assert len(set(paths)) == len(set(backups)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("config, message", [
    (_cluster(None, 2, "chief", 0), "no 'chief' job"),
    (_cluster(2, 2, "worker", 0), "at most one"),
    (_cluster(1, 2, "chief", 1), r"from 0 to 0 \(the cluster lists 1 chief\); got 1"),
    ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}},
     r"has jobs \['ps'\]"),
    ({"cluster": {"worker": ["a:1"], "chief": ["a:1"]}, "task": {"type": "worker", "index": 0}},
     "the same address twice"),
])
def test_tf_config_refuses_what_tensorflow_refuses(config, message):
    from tensorflow.python.distribute import multi_worker_util as tf_rules

    with pytest.raises(ValueError, match=message):
        distribute.parse_tf_config(config)
    if "ps" not in config["cluster"] and len(set(sum(config["cluster"].values(), []))) == len(
            sum(config["cluster"].values(), [])):
        task = config["task"]
        with pytest.raises(ValueError):  # TF refuses it too
            tf_rules.id_in_cluster(config["cluster"], task["type"], task["index"])


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    ("python w.py", r"one string, 'python w.py'.*shlex.split"),
    ([], "an empty list: there is no program to run"),
    ([sys.executable, 3], r"every argument must be a string; not \[3\]"),
    (lambda i: [], r"argv\(0\) returned an empty list"),
    (lambda i: "python w.py", r"argv\(0\) returned one string"),
])
def test_launcher_refuses_bad_argv_before_starting_anything(argv, message):
    with pytest.raises(ValueError, match=message):
        run_local_workers(2, argv, start_timeout=None)


@pytest.mark.slow
@pytest.mark.parametrize("ports, message", [
    ([5000, 5000], r"lists \[5000\] more than once"),
    ([0, 70000], r"`ports\[0\]` must be an integer from 1 to 65535. Received: ports\[0\]=0"),
    ([5000, True], r"`ports\[1\]` must be an integer from 1 to 65535"),
    ("5000,5001", "must be a list of port numbers"),
])
def test_launcher_refuses_bad_ports(ports, message):
    with pytest.raises(ValueError, match=message):
        run_local_workers(2, [sys.executable, "-c", "pass"], ports=ports, start_timeout=None)


def test_launcher_takes_path_arguments(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("print('ran')")
    results = run_local_workers(1, [sys.executable, script], start_timeout=None,
                                output=open(os.devnull, "w"))
    assert results[0].returncode == 0 and "ran" in results[0].output
