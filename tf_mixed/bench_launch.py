"""Runs the compare suite: one training run per policy, then the report.

By default every policy trains in a fresh ``python -m tf_mixed bench``
subprocess (hidden flags ``--_config``, ``--_single_policy``, ``--_part``):
each run starts from the same clean TensorFlow state (graph options, Keras
globals, allocator) and its peak RSS is its own. ``--isolation=inprocess``
runs them one after another in this process (what the tests use).
``--strategy=multiworker`` always uses subprocesses: ``--workers`` local
processes per policy, joined by a ``TF_CONFIG`` cluster on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from tf_mixed import bench, bench_report


class ChildFailed(RuntimeError):
    """A policy's subprocess failed; ``usage`` if it exited with status 2."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def run_compare(config: bench.BenchConfig, command: str) -> dict[str, Any]:
    """Benchmarks every policy of ``config``, writes the files, prints the table.

    Args:
        config: A validated `bench.BenchConfig` with ``suite="compare"``.
        command: The command line, for the report.

    Returns:
        The report dict written to results.json.

    Raises:
        UsageError: For bad input, before any training starts.
        ChildFailed: If a policy's subprocess failed.
    """
    policies, note = bench.resolve_policies(config.policies)
    bench_data = bench.check_data(config)
    created = bench_report.check_output_dir(config.output_dir)
    print(note, flush=True)
    if _slow_float16_convs(config, policies):
        print(
            f"Warning: mixed_float16 with --model={config.model_name} on a host without a "
            "GPU is very slow: TensorFlow's float16 Conv2D filter gradient on CPU is "
            "hundreds of times slower than float32 (measured on TF 2.21). Expect that "
            "policy to take far longer; --model=mlp or mixed_bfloat16 is quick here.",
            flush=True,
        )
    print(
        f"Benchmarking --model={config.model_name} on --dataset={config.dataset} with "
        f"policies {', '.join(policies)} (loop={config.loop}, strategy={config.strategy}).",
        flush=True,
    )
    try:
        subprocesses = config.isolation == "subprocess" or config.strategy == "multiworker"
        if subprocesses:
            results = _run_children(config, policies)
        else:
            if bench_data is None:
                from tf_mixed import data as data_module

                bench_data = data_module.load(
                    config.dataset, seed=config.seed, image_size=config.image_size,
                    train_size=config.train_size, val_size=config.val_size,
                )
            strategy = bench.make_strategy(config)
            results = [
                bench.run_policy(config, p, bench_data=bench_data, strategy=strategy)
                for p in policies
            ]
        bench_report.add_ratios(results)
        report = {
            "suite": "compare",
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "flags": config.to_json(),
            "host": bench.host_info(),
            "policies": list(policies),
            "policy_note": note,
            "model": {"name": config.model_name, "params": results[0]["model_params"]},
            "dataset": results[0]["dataset"],
            "results": results,
        }
        paths = bench_report.write_outputs(report, config.output_dir)
    except BaseException:
        if created:
            shutil.rmtree(config.output_dir, ignore_errors=True)
        raise
    print()
    print(bench_report.markdown_table(results))
    print()
    print(note)
    print("Wrote " + ", ".join(paths))
    return report


def _slow_float16_convs(config: bench.BenchConfig, policies: tuple[str, ...]) -> bool:
    from tf_mixed import hardware

    return (
        "mixed_float16" in policies
        and config.model_name != "mlp"
        and not hardware.detect().has_gpu
    )


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _run_children(config: bench.BenchConfig, policies: tuple[str, ...]) -> list[dict]:
    staging = tempfile.mkdtemp(prefix=".tf_mixed_parts.", dir=config.output_dir)
    try:
        config_path = os.path.join(staging, "config.json")
        with open(config_path, "w") as f:
            json.dump(config.to_json(), f)
        results = []
        for policy in policies:
            part = os.path.join(staging, f"{policy}.json")
            if config.strategy == "multiworker":
                _run_workers(config, config_path, policy, part)
            else:
                _run_one(config_path, policy, part)
            with open(part) as f:
                results.append(json.load(f))
        return results
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _child_command(config_path: str, policy: str, part: str) -> list[str]:
    return [
        sys.executable, "-m", "tf_mixed", "bench",
        f"--_config={config_path}", f"--_single_policy={policy}", f"--_part={part}",
    ]


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env


def _check(policy: str, code: int) -> None:
    if code == 2:
        raise ChildFailed(f"policy {policy}: bad input (see the error above)", usage=True)
    if code != 0:
        raise ChildFailed(
            f"policy {policy}: its training process failed with exit status {code} "
            "(its error is printed above); no result files were written"
        )


def _run_one(config_path: str, policy: str, part: str) -> None:
    code = subprocess.call(_child_command(config_path, policy, part), env=_child_env())
    _check(policy, code)


def _run_workers(config: bench.BenchConfig, config_path: str, policy: str, part: str) -> None:
    """Starts ``config.workers`` local workers; worker 0 (the chief) writes ``part``."""
    ports = _free_ports(config.workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    processes = []
    for index in range(config.workers):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        command = _child_command(config_path, policy, part if index == 0 else "")
        quiet = None if index == 0 else subprocess.DEVNULL
        processes.append(
            subprocess.Popen(command, env=_child_env({"TF_CONFIG": tf_config}), stdout=quiet)
        )
    try:
        # A worker that dies leaves the others waiting in a collective: stop them.
        while any(p.poll() is None for p in processes):
            if any(p.returncode not in (None, 0) for p in processes):
                break
            time.sleep(0.2)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in processes]
    _check(policy, codes[0] if codes[0] != 0 else max(codes, key=abs))


def run_child(config_path: str, policy: str, part: str) -> None:
    """The ``--_single_policy`` side: one policy, result JSON into ``part``.

    Called by ``python -m tf_mixed bench --_config=... --_single_policy=...``
    before anything else touches TensorFlow's runtime, so the CPU can still be
    split into logical devices for ``--strategy=mirrored``.
    """
    with open(config_path) as f:
        fields = json.load(f)
    fields["policies"] = tuple(fields["policies"])
    config = bench.BenchConfig(**fields)
    if config.strategy == "mirrored":
        bench.split_cpu_for_replicas(config.replicas)
    result = bench.run_policy(config, policy, verbose=bool(part))
    if part:
        tmp = part + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, allow_nan=False)
        os.replace(tmp, part)

