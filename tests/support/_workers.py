"""Runs a test worker script as two local MultiWorkerMirroredStrategy workers.

Shared by the multi-worker tests whose worker scripts take ``INDEX PORTS OUT
[EXTRA...]``: `tf_mixed.distribute.workers.run_local_workers` starts them on free
127.0.0.1 ports, bounds every wait and stops both if one fails.
"""

import json
import sys

from tf_mixed.distribute import workers as launch


def run_two_workers(script, tmp_path, *extra, timeout=240):
    """Runs ``script`` as workers 0 and 1; returns what each wrote to OUT.

    Args:
        script: Path of the worker script.
        tmp_path: Directory for the workers' JSON outputs.
        *extra: Further arguments after ``INDEX PORTS OUT``.
        timeout: Longest wait for both, in seconds (workers disagreeing
            would hang in a collective; the launcher then stops them).

    Returns:
        The two decoded JSON outputs, worker 0 first.
    """
    ports = launch.free_ports(2)
    joined = ",".join(str(p) for p in ports)
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    results = launch.run_local_workers(
        2, lambda i: [sys.executable, str(script), str(i), joined, str(outs[i]),
                      *map(str, extra)],
        ports=ports, timeout=timeout, check=False)
    for result in results:
        assert result.returncode == 0, (
            f"worker {result.index} ended with {result.returncode}"
            f"{' (stopped: timeout or its peer failed)' if result.stopped else ''}:\n"
            f"{result.output[-3000:]}")
    return [json.loads(out.read_text()) for out in outs]
