"""Start N local TensorFlow workers on 127.0.0.1, stream their output, stop them together."""

#     from tf_mixed.distribute import run_local_workers
#     results = run_local_workers(2, [sys.executable, "train.py"], timeout=600)
#
# Each worker is a fresh process with its own ``TF_CONFIG`` (the same cluster of
# free 127.0.0.1 ports, its own index) in its own process group. Their output is
# printed line by line as ``[worker i] ...``. If one worker fails, the others
# (stuck in a collective waiting for it) are stopped after ``grace_seconds``;
# every wait is bounded by ``timeout``, and nothing outlives the call: process
# groups are killed on every exit path, and on Linux a worker also dies with
# the launching process.
#
# For several machines there is nothing to launch: set ``TF_CONFIG`` on each
# and run the same script everywhere (README, "Several machines").
#
# From a shell: ``python -m tf_mixed launch N train.py [ARGS ...]``
# (`tf_mixed.cli.launch`).

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from tf_mixed._internal import validate as _validate

LOOPBACK = "127.0.0.1"
_TAIL_LINES = 200
_POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """How one worker ended.

    Attributes:
        index: The worker's index in the cluster.
        returncode: Its exit status; negative: killed by that signal (-9 when
            the launcher stopped it).
        output: The last lines it printed (stdout and stderr), without prefix.
        stopped: True if the launcher stopped it (another worker failed, or
            the timeout passed).
        seconds: When it ended, in seconds after the launch (to the launcher's
            polling interval).
    """

    index: int
    returncode: int
    output: str
    stopped: bool
    seconds: float


class WorkersFailed(RuntimeError):
    """A worker failed, did not start, or the run timed out; all were stopped.

    Attributes:
        results: One `WorkerResult` per worker.
    """

    def __init__(self, message: str, results: list[WorkerResult]):
        super().__init__(message)
        self.results = results


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    Another process can still take one before a worker binds it; the worker
    then fails with "address already in use" and `run_local_workers` says so.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


def tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` JSON of worker ``index`` in a 127.0.0.1 cluster."""
    return json.dumps({
        "cluster": {"worker": [f"{LOOPBACK}:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })


def _check_positive(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _validate.number(
        value, name, rule=lambda v: v > 0,
        valid=f"a positive number of seconds{' or None' if allow_none else ''}")


def _kill_group(proc: subprocess.Popen) -> None:
    # The whole group, also when the leader has exited: a worker's own
    # children must not outlive it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    # Linux: the worker gets SIGKILL if the launching process dies first, so
    # a killed test runner leaves no worker behind.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_local_workers(
    num_workers: int,
    argv: Sequence[str] | Callable[[int], Sequence[str]],
    *,
    timeout: float = 600.0,
    start_timeout: float | None = 120.0,
    grace_seconds: float = 0.0,
    ports: Sequence[int] | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    output: TextIO | None = None,
    check: bool = True,
) -> list[WorkerResult]:
    """Runs ``num_workers`` local worker processes as one TF cluster and waits.

    Args:
        num_workers: How many workers (>= 1).
        argv: The command every worker runs, e.g. ``[sys.executable,
            "train.py"]``, or a function of the worker index returning it.
        timeout: Longest wait for all workers, in seconds; then all are
            stopped.
        start_timeout: Each worker must open its TensorFlow server port (it
            does when it creates its MultiWorkerMirroredStrategy) within this
            many seconds, or exit; else all are stopped. None: no check (for
            commands that start no TF server).
        grace_seconds: After a worker fails, how long the others get to end
            on their own (e.g. by their collective timeout) before they are
            killed.
        ports: The 127.0.0.1 ports to use, one per worker; by default free
            ones are picked.
        env: Extra environment variables for every worker (on top of this
            process's environment, ``TF_CONFIG`` and
            ``TF_CPP_MIN_LOG_LEVEL=2`` unless given).
        cwd: Working directory of the workers.
        output: Where prefixed output lines go (default ``sys.stdout``).
        check: Raise `WorkersFailed` when a worker fails. With False, return
            the results anyway.

    Returns:
        One `WorkerResult` per worker, in index order.

    Raises:
        ValueError: for bad arguments (``num_workers`` < 1; ``argv`` a
            string, empty, or holding a non-string; a port list of the wrong
            length, with a port twice, not a port, or in use; a non-positive
            timeout), before any process starts.
        WorkersFailed: if ``check`` and a worker exited non-zero, could not
            be started, did not start its server in time, or the run
            exceeded ``timeout``. Every worker has been stopped by then.
    """
    _validate.number(num_workers, "num_workers", integer=True,
                     rule=lambda v: v >= 1, valid="an integer >= 1")
    _check_positive("timeout", timeout)
    _check_positive("start_timeout", start_timeout, allow_none=True)
    _validate.number(grace_seconds, "grace_seconds", rule=lambda v: v >= 0,
                     valid="a number >= 0")
    if ports is None:
        ports = free_ports(num_workers)
    else:
        if isinstance(ports, (str, bytes)) or not isinstance(ports, collections.abc.Sequence):
            raise ValueError(f"`ports` must be a list of port numbers, one per worker. "
                             f"Received: ports={ports!r} (of type {type(ports).__name__}).")
        ports = list(ports)
        if len(ports) != num_workers:
            raise ValueError(
                f"`ports` must list one port per worker ({num_workers}). "
                f"Received: ports={ports!r}.")
        ports = [_validate.number(p, f"ports[{i}]", integer=True, rule=lambda v: 0 < v < 65536,
                                  valid="an integer from 1 to 65535")
                 for i, p in enumerate(ports)]
        twice = sorted({p for p in ports if ports.count(p) > 1})
        if twice:
            raise ValueError(
                f"`ports` lists {twice} more than once: each worker needs its own port. "
                f"Received: ports={ports!r}. Pass distinct ports, or ports=None to let "
                "the launcher pick them.")
        busy = [p for p in ports if _port_in_use(p)]
        if busy:
            raise ValueError(
                f"`ports` {busy} on {LOOPBACK} are in use by another process. "
                f"Received: ports={ports!r}. Pass free ports, or ports=None to "
                "let the launcher pick them.")
    commands = [_command(argv(i) if callable(argv) else argv, i, callable(argv))
                for i in range(num_workers)]
    output = output or sys.stdout
    return _Run(commands, ports, env or {}, cwd, output, timeout, start_timeout,
                grace_seconds).wait(check)


def _command(argv, index: int, from_function: bool) -> list[str]:
    """``argv`` checked: a non-empty list of strings (paths are made strings)."""
    where = f"argv({index}) returned" if from_function else "argv is"
    if isinstance(argv, (str, bytes)):
        raise ValueError(
            f"{where} one string, {argv!r}; it must be a list of arguments such as "
            "[sys.executable, 'train.py'] (a string would be run as one program name, "
            f"spaces included). Use shlex.split({argv!r}) to split a command line.")
    try:
        command = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
    except TypeError:
        raise ValueError(f"{where} {argv!r} (of type {type(argv).__name__}); it must be a "
                         "list of strings such as [sys.executable, 'train.py'].") from None
    if not command:
        raise ValueError(f"{where} an empty list: there is no program to run. Pass the "
                         "command, e.g. argv=[sys.executable, 'train.py'].")
    bad = [a for a in command if not isinstance(a, str)]
    if bad:
        raise ValueError(f"{where} {argv!r}: every argument must be a string; not "
                         f"{bad!r}. Convert numbers with str().")
    return command


class _Run:
    """One launch: the processes, their reader threads, the stop logic."""

    def __init__(self, commands, ports, env, cwd, output, timeout, start_timeout, grace):
        self.ports = ports
        self.output = output
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.grace = grace
        self.procs: list[subprocess.Popen] = []
        self.tails = [collections.deque(maxlen=_TAIL_LINES) for _ in commands]
        self.threads = []
        self.write_lock = threading.Lock()
        self.stopped: set[int] = set()
        self.start = time.monotonic()
        self.ended: dict[int, float] = {}
        try:
            for index, command in enumerate(commands):
                worker_env = dict(os.environ)
                worker_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                worker_env.update(env)
                worker_env["TF_CONFIG"] = tf_config(ports, index)
                worker_env["PYTHONUNBUFFERED"] = "1"
                try:
                    proc = subprocess.Popen(
                        command, env=worker_env, cwd=cwd,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                    )
                except OSError as error:
                    self._stop_all()
                    raise WorkersFailed(
                        f"worker {index} could not be started: {error}. "
                        f"Received: argv={command!r}. The workers already started "
                        "were stopped.", self._results()) from error
                self.procs.append(proc)
                thread = threading.Thread(target=self._pump, args=(index, proc),
                                          daemon=True)
                thread.start()
                self.threads.append(thread)
        except BaseException:
            self._stop_all()
            raise

    def _pump(self, index, proc):
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.tails[index].append(line)
            with self.write_lock:
                try:
                    self.output.write(f"[worker {index}] {line}\n")
                    self.output.flush()
                except (ValueError, OSError):
                    pass  # output closed: keep draining the pipe

    def _note_ended(self):
        for index, proc in enumerate(self.procs):
            if index not in self.ended and proc.poll() is not None:
                self.ended[index] = time.monotonic() - self.start

    def _stop_all(self):
        self._note_ended()
        for index, proc in enumerate(self.procs):
            if proc.poll() is None:
                self.stopped.add(index)
                _kill_group(proc)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # unkillable (D state); reported by returncode None
        self._note_ended()
        for thread in self.threads:
            thread.join(timeout=5)

    def _results(self):
        return [
            WorkerResult(index=i, returncode=proc.returncode if proc.returncode is not None else -9,
                         output="\n".join(self.tails[i]), stopped=i in self.stopped,
                         seconds=self.ended.get(i, time.monotonic() - self.start))
            for i, proc in enumerate(self.procs)
        ]

    def _first_failure(self):
        for index, proc in enumerate(self.procs):
            if proc.poll() not in (None, 0):
                return index
        return None

    def wait(self, check):
        started = [False] * len(self.procs)
        problem = None
        try:
            while any(p.poll() is None for p in self.procs):
                self._note_ended()
                elapsed = time.monotonic() - self.start
                failed = self._first_failure()
                if failed is not None:
                    problem = self._failure_message(failed)
                    self._wait_grace()
                    break
                if elapsed > self.timeout:
                    problem = (f"the workers did not finish within timeout="
                               f"{self.timeout} s; all were stopped")
                    break
                if self.start_timeout is not None and not all(started):
                    for i, proc in enumerate(self.procs):
                        if not started[i]:
                            started[i] = proc.poll() is not None or _port_open(self.ports[i])
                    late = [i for i, ok in enumerate(started) if not ok]
                    if late and elapsed > self.start_timeout:
                        problem = (
                            f"worker(s) {late} did not start: no TensorFlow server on "
                            f"{', '.join(f'{LOOPBACK}:{self.ports[i]}' for i in late)} "
                            f"within start_timeout={self.start_timeout} s (does the "
                            "script create a MultiWorkerMirroredStrategy?); all were "
                            "stopped")
                        break
                time.sleep(_POLL_S)
            if problem is None:
                failed = self._first_failure()
                if failed is not None:
                    problem = self._failure_message(failed)
        finally:
            self._stop_all()
        results = self._results()
        if problem and check:
            raise WorkersFailed(f"{problem}. Exit codes: "
                                f"{[r.returncode for r in results]}.", results)
        return results

    def _wait_grace(self):
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            self._note_ended()
            time.sleep(_POLL_S)

    def _failure_message(self, index):
        code = self.procs[index].returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        tail = " ".join(self.tails[index])
        hint = ""
        if "already in use" in tail.lower() or "address in use" in tail.lower():
            hint = (f" (its port {LOOPBACK}:{self.ports[index]} was taken by another "
                    "process: run again, or pass free `ports`)")
        return f"worker {index} {how}{hint}; the other workers were stopped"

