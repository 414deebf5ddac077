"""Runs the compare suite: one training run per policy, then the report.

By default every policy trains in a fresh ``python -m tf_mixed.bench.child``
process (see `tf_mixed.bench.child`): each run starts from the same clean
TensorFlow state (graph options, Keras globals, allocator) and its peak RSS
is its own. ``--isolation=inprocess``
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

from tf_mixed.bench import config as config_module
from tf_mixed.bench import report as report_module, run, serving
from tf_mixed._internal import quiet
from tf_mixed.bench.config import BenchConfig
from tf_mixed._internal.cli_errors import ChildFailed


def run_compare(config: BenchConfig, command: str, *, verbose: bool = False) -> dict[str, Any]:
    """Benchmarks every policy of ``config``, writes the files, prints the table.

    Args:
        config: A validated `BenchConfig` with ``suite="compare"``.
        command: The command line, for the report.
        verbose: Let the policies' processes print TensorFlow's C++ log.

    Returns:
        The report dict written to results.json.

    Raises:
        UsageError: For bad input, before any training starts.
        ChildFailed: If a policy's process failed.
    """
    policies, note = config_module.resolve_policies(config.policies)
    bench_data = config_module.check_data(config)
    created = report_module.check_output_dir(config.output_dir)
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
            results = _run_children(config, policies, verbose)
        else:
            bench_data = bench_data or config_module.load_data(config)
            strategy = run.make_strategy(config)
            results = [
                run.run_policy(config, p, bench_data=bench_data, strategy=strategy)
                for p in policies
            ]
        report_module.add_ratios(results)
        report = {
            "suite": "compare",
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "flags": config.to_json(),
            "host": report_module.host_info(),
            "policies": list(policies),
            "policy_note": note,
            "model": {"name": config.model_name, "params": results[0]["model_params"]},
            "dataset": results[0]["dataset"],
            "results": results,
        }
        paths = report_module.write_outputs(report, config.output_dir)
    except BaseException:
        report_module.remove_if_created(config.output_dir, created)
        raise
    print()
    print(report_module.markdown_table(results))
    serving_table = serving.markdown_table(results)
    if serving_table:
        print()
        print(serving_table)
    print()
    print(note)
    print("Wrote " + ", ".join(paths))
    return report


def _slow_float16_convs(config: BenchConfig, policies: tuple[str, ...]) -> bool:
    from tf_mixed.policy import hardware

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


def _run_children(config: BenchConfig, policies: tuple[str, ...], verbose: bool) -> list[dict]:
    staging = tempfile.mkdtemp(prefix=".tf_mixed_parts.", dir=config.output_dir)
    try:
        config_path = os.path.join(staging, "config.json")
        with open(config_path, "w") as f:
            json.dump(config.to_json(), f)
        results = []
        for policy in policies:
            part = os.path.join(staging, f"{policy}.json")
            if config.strategy == "multiworker":
                _run_workers(config, config_path, policy, part, verbose)
            else:
                _run_one(config_path, policy, part, verbose)
            with open(part) as f:
                results.append(json.load(f))
        return results
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _child_command(config_path: str, policy: str, part: str, error_file: str, verbose: bool) -> list[str]:
    command = [
        sys.executable, "-m", "tf_mixed.bench.child", config_path, policy,
        f"--error_file={error_file}",
    ]
    if part:
        command.append(f"--part={part}")
    if verbose:
        command.append("--verbose")
    return command


def _child_env(verbose: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    quiet.set_log_level(env, verbose)
    env.update(extra or {})
    return env


def _check(policy: str, code: int, error_files: list[str]) -> None:
    """Raises `ChildFailed` for a failed process, with its one-line error if it left one."""
    if code == 0:
        return
    for path in error_files:
        try:
            with open(path) as f:
                message = f.read().strip()
        except OSError:
            continue
        if message:
            raise ChildFailed(message, usage=True)
    if code == 2:
        raise ChildFailed(f"policy {policy}: bad input (see the error above)", usage=True)
    raise ChildFailed(
        f"policy {policy}: its training process failed with exit status {code} "
        "(its error is printed above); no result files were written"
    )


def _run_one(config_path: str, policy: str, part: str, verbose: bool) -> None:
    error_file = part + ".error"
    code = subprocess.call(
        _child_command(config_path, policy, part, error_file, verbose), env=_child_env(verbose)
    )
    _check(policy, code, [error_file])


def _run_workers(config: BenchConfig, config_path: str, policy: str, part: str, verbose: bool) -> None:
    """Starts ``config.workers`` local workers; worker 0 (the chief) writes ``part``."""
    ports = _free_ports(config.workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    processes, error_files = [], []
    for index in range(config.workers):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        error_files.append(f"{part}.{index}.error")
        command = _child_command(
            config_path, policy, part if index == 0 else "", error_files[-1], verbose
        )
        quiet_output = None if index == 0 else subprocess.DEVNULL
        processes.append(subprocess.Popen(
            command, env=_child_env(verbose, {"TF_CONFIG": tf_config}), stdout=quiet_output,
        ))
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
    _check(policy, codes[0] if codes[0] != 0 else max(codes, key=abs), error_files)
