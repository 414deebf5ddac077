"""Runs the compare suite: one training run per policy, then the report."""

# By default every policy trains in a fresh ``python -m tf_mixed.bench.child``
# process (see `tf_mixed.bench.child`): each run starts from the same clean
# TensorFlow state (graph options, Keras globals, allocator) and its peak RSS
# is its own. The processes run at the same time but take turns: this process
# hands each one its warm-up, then one round of ``--round_steps`` steps at a
# time, policies alternating, through a pipe (one JSON line per segment back,
# one number of steps, or 0 for "stop", forth), so only one trains at any
# moment and a change in load hits every policy. After every policy's first
# round, `tf_mixed.bench.schedule.plan_run` decides which train in full and
# which are only timed, to keep to ``--time_budget``. ``--isolation=inprocess``
# runs them one after another in this process (what the tests use), the same
# scheduler deciding when each stops.
# ``--strategy=multiworker`` always uses subprocesses: ``--workers`` local
# processes per policy, joined by a ``TF_CONFIG`` cluster on 127.0.0.1.

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from tf_mixed._internal import measuring, progress, quiet
from tf_mixed._internal.cli_errors import ChildFailed
from tf_mixed.bench import config as config_module
from tf_mixed.bench import plan_row, run, schedule, serving
from tf_mixed.bench import report as report_module
from tf_mixed.bench.config import BenchConfig
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created


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
    policies, note = config_module.resolve_policies(config.policies, with_plan=True)
    bench_data = config_module.check_data(config)
    created = check_output_dir(config.output_dir)
    print(note, flush=True)
    plan_record, trained, same = None, policies, None
    if plan_row.PLAN in policies:
        # Planned once, here, before any policy trains (every process, every
        # worker trains this plan); a plan equal to a whole-model policy of the
        # run is not trained again (plan_row.same_as).
        progress.update(f"planning {config.model_name} per layer (tf_mixed.plan)")
        if bench_data is None and config.isolation == "inprocess":
            bench_data = config_module.load_data(config)
        try:
            plan_record = run.plan_layers(config, bench_data)
        except BaseException:
            remove_if_created(config.output_dir, created)
            raise
        same = plan_row.same_as(plan_record, policies)
        if same:
            trained = tuple(p for p in policies if p != plan_row.PLAN)
            print(f"The per-layer plan is {same}: every layer in {same}'s precision, so it "
                  f"is not trained again; its row is {same}'s.", flush=True)
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
    started = time.monotonic()
    round_order: list[str] = []
    try:
        if config.strategy == "multiworker":
            results = _run_children(config, trained, verbose, plan_record)
        else:
            bench_data = bench_data if bench_data is not None or config.isolation == "subprocess" \
                else config_module.load_data(config)
            scheduler = make_scheduler(
                config, trained, bench_data, lambda: time.monotonic() - started)
            if config.isolation == "subprocess":
                results = _run_interleaved(config, trained, verbose, scheduler, plan_record)
            else:
                strategy = run.make_strategy(config)
                results = [
                    run.run_policy(config, p, bench_data=bench_data, strategy=strategy,
                                   verbose=not config.quiet, gate=LocalGate(scheduler, p, config),
                                   plan_record=plan_record if p == plan_row.PLAN else None)
                    for p in trained
                ]
            for result in results:
                result["plan"] = {**scheduler.plan(result["policy"]).to_dict(),
                                  "extra_rounds": scheduler.extra_rounds.get(result["policy"], 0)}
                lane = scheduler.lanes.get(result["policy"])
                result["round_loads"] = list(lane.loads) if lane else []
            round_order = scheduler.order
        report_module.add_ratios(results)
        if same and plan_record is not None:
            row = next(r for r in results if r["policy"] == same)
            results.insert(policies.index(plan_row.PLAN), plan_row.reused_row(plan_record, row))
        progress.update("measuring the host's large matmul, float32 against half precision")
        matmul = _matmul_reference(policies, config.matmul_size)
        report = {
            **report_module.suite_header("compare", config, command),
            "policies": list(policies),
            "policy_note": note,
            "model": {"name": config.model_name, "params": results[0]["model_params"]},
            "dataset": results[0]["dataset"],
            "round_order": round_order,
            "matmul_ratio": None if matmul is None else matmul["ratio"],
            "matmul": matmul,
            "wall_time_s": time.monotonic() - started,
            "results": results,
        }
        report["notes"] = report_module.notes(report)
        paths = report_module.write_outputs(report, config.output_dir)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    print()
    print(report_module.caption(report))
    print(report_module.markdown_table(results))
    for line in report["notes"]:
        print(line)
    serving_table = serving.markdown_table(results)
    if serving_table:
        print()
        print(serving_table)
    print()  # the policy note was printed once, before the training (issue 46)
    print("Wrote " + ", ".join(paths))
    return report


def make_scheduler(config: BenchConfig, policies: tuple[str, ...], bench_data,
                   clock) -> schedule.Scheduler:
    """The scheduler of a run: its steps, rounds, warm-up and budget."""
    from tf_mixed.commands import data

    if bench_data is not None:
        train_size = bench_data.train_size
    else:  # the generated sets: their size is known without generating them
        train_size = config.train_size or data.DEFAULT_SHAPES_TRAIN
    steps = config.steps or train_size // config.batch_size
    total = steps * config.epochs
    return schedule.Scheduler(
        policies, total_steps=total, round_steps=config.round_steps,
        warmup_steps=min(config.warmup_steps, total - 1),
        budget_s=config.time_budget, reserve_s=RESERVE_S,
        clock=clock, emulated=emulated_policies(policies),
        load=lambda: measuring.machine_load()[0],
    )


# Seconds of the budget kept, at least, for what follows the training: the
# census, the LiteRT files, the matmul reference and the result files (the
# scheduler keeps more on a host where the policies were slow to start).
RESERVE_S = 15.0


def emulated_policies(policies: tuple[str, ...]) -> tuple[str, ...]:
    """The policies whose half type this host has no instructions for (CPU only)."""
    from tf_mixed.policy import hardware

    info = hardware.detect()
    if info.has_gpu:
        return ()
    flags = info.cpu_flags
    bf16 = info.amx_bf16_usable or "avx512_bf16" in flags
    fp16 = "avx512_fp16" in flags or "amx_fp16" in flags
    return tuple(
        p for p in policies
        if (p in ("mixed_bfloat16", "bfloat16", "float8") and not bf16)
        or (p in ("mixed_float16", "float16") and not fp16)
    )


def _matmul_reference(policies: tuple[str, ...], size: int) -> dict[str, Any] | None:
    """The host's large-matmul half/float32 ratio for the first mixed policy's dtype."""
    from tf_mixed.bench import matmul

    for name in policies:
        compute = config_module.BENCH_POLICIES.get(name, name)
        if compute in ("mixed_bfloat16", "bfloat16"):
            return matmul.measure_ratio("bfloat16", size=size, rounds=5)
        if compute in ("mixed_float16", "float16"):
            return matmul.measure_ratio("float16", size=size, rounds=5)
    return None


class LocalGate:
    """A gate (`tf_mixed.bench.train.Gate`) that asks the scheduler in this process."""

    def __init__(self, scheduler: schedule.Scheduler, policy: str, config: BenchConfig):
        self.scheduler = scheduler
        self.policy = policy
        self.config = config

    def begin(self) -> int:
        return self.scheduler.command(self.policy)

    def report(self, times, finished: bool) -> None:
        self.scheduler.record(self.policy, times, finished=finished)
        _progress(self.scheduler, self.policy, self.config.batch_size)

    def next(self) -> int:
        return self.scheduler.command(self.policy)


def _progress(scheduler: schedule.Scheduler, policy: str, batch_size: int) -> None:
    lane = scheduler.lanes[policy]
    if not lane.rounds:
        progress.update(f"{policy}: warm-up done ({lane.steps_done} steps)")
        return
    plan = scheduler.plans.get(policy) if scheduler.plans else None
    if plan is not None and not plan.full:
        extra = scheduler.extra_rounds.get(policy, 0)  # granted while its pairs disagree
        expected = f"{plan.rounds}" + (f"+{extra} extra" if extra else "")
    else:
        left = max(0, scheduler.total_steps - lane.steps_done)
        expected = f"~{len(lane.rounds) + -(-left // scheduler.round_steps)}"
    rate = scheduler.round_rates(policy, batch_size)[-1]
    progress.update(
        f"{policy}: round {len(lane.rounds)}/{expected} done, {rate:,.0f} samples/s, "
        f"step {lane.steps_done}/{scheduler.total_steps}")


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


def _write_inputs(config: BenchConfig, staging: str, plan_record) -> str:
    """Writes the config (and the plan, `_plan_path`) the children read; returns the
    config's path."""
    config_path = os.path.join(staging, "config.json")
    with open(config_path, "w") as f:
        json.dump(config.to_json(), f)
    if plan_record is not None:
        with open(_plan_path(config_path), "w") as f:
            json.dump(plan_record, f)
    return config_path


def _plan_path(config_path: str) -> str:
    """Where the job's per-layer plan lies for the children, beside their config."""
    return os.path.join(os.path.dirname(config_path), "plan.json")


def _run_children(config: BenchConfig, policies: tuple[str, ...], verbose: bool,
                  plan_record=None) -> list[dict]:
    staging = tempfile.mkdtemp(prefix=".tf_mixed_parts.", dir=config.output_dir)
    try:
        config_path = _write_inputs(config, staging, plan_record)
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


class _ChildLane:
    """One policy's process and its control pipe (see the module docstring)."""

    def __init__(self, config: BenchConfig, config_path: str, policy: str, part: str,
                 verbose: bool):
        self.policy, self.part = policy, part
        self.error_file = part + ".error"
        read_fd, write_fd = os.pipe()
        command = _child_command(config_path, policy, part, self.error_file, verbose)
        command.append(f"--control_fd={write_fd}")
        self.process = subprocess.Popen(
            command, env=_child_env(verbose), stdin=subprocess.PIPE, pass_fds=(write_fd,),
            text=True)
        os.close(write_fd)
        self.messages = os.fdopen(read_fd)

    def send(self, steps: int) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{steps}\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.fail()

    def receive(self) -> dict[str, Any]:
        line = self.messages.readline()
        if not line:
            self.fail()
        return json.loads(line)

    def fail(self) -> None:
        """The process ended early: raise its error."""
        code = self.process.wait()
        _check(self.policy, code or 1, [self.error_file])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.messages.close()


def _run_interleaved(config: BenchConfig, policies: tuple[str, ...], verbose: bool,
                     scheduler: schedule.Scheduler, plan_record=None) -> list[dict]:
    """Every policy in its own process, their rounds alternating (module docstring)."""
    staging = tempfile.mkdtemp(prefix=".tf_mixed_parts.", dir=config.output_dir)
    lanes: list[_ChildLane] = []
    try:
        config_path = _write_inputs(config, staging, plan_record)
        progress.update(f"starting {len(policies)} training processes (TensorFlow, data, "
                        f"{config.model_name})")
        lanes = [_ChildLane(config, config_path, p, os.path.join(staging, f"{p}.json"), verbose)
                 for p in policies]
        for lane in lanes:
            lane.receive()  # "ready": built, waiting for its first steps
        active = list(lanes)
        while active:
            for lane in list(active):
                steps = scheduler.command(lane.policy)
                progress.update(f"{lane.policy}: running {steps or 'no more'} steps "
                                f"(step {scheduler.lanes[lane.policy].steps_done}"
                                f"/{scheduler.total_steps})")
                lane.send(steps)
                message = lane.receive()
                scheduler.record(lane.policy, message["times"], finished=message["finished"])
                if message["finished"]:
                    active.remove(lane)
                else:
                    _progress(scheduler, lane.policy, config.batch_size)
        progress.update("training done: census of each policy's step, LiteRT files")
        for lane in lanes:
            lane.send(0)  # go on: census, serving figures, result file
        results = []
        for lane in lanes:
            code = lane.process.wait()
            _check(lane.policy, code, [lane.error_file])
            with open(lane.part) as f:
                results.append(json.load(f))
        return results
    finally:
        for lane in lanes:
            lane.close()
        shutil.rmtree(staging, ignore_errors=True)


def _child_command(config_path: str, policy: str, part: str, error_file: str,
                   verbose: bool) -> list[str]:
    command = [
        sys.executable, "-m", "tf_mixed.bench.child", config_path, policy,
        f"--error_file={error_file}",
    ]
    if part:
        command.append(f"--part={part}")
    if verbose:
        command.append("--verbose")
    if policy == plan_row.PLAN and os.path.exists(_plan_path(config_path)):
        command.append(f"--plan_file={_plan_path(config_path)}")
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


def _run_workers(config: BenchConfig, config_path: str, policy: str, part: str,
                 verbose: bool) -> None:
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
