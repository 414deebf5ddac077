"""Sweep of `Heal`'s ``skips`` and ``window``: steps to heal, and false heals."""

#     python -m tf_mixed.bench.heal_sweep [--seeds N]
#
# Three scenarios under mixed_float16, each trained once per seed with layer
# attribution on and no rule acting (`tf_mixed.callbacks.Heal` with a count no
# run reaches), every attributed skip recorded:
# * demo: `tf_mixed.bench.heal_suite`'s demo, where a layer truly outgrows
#   float16 (healing is right): the step of the first healing counts;
# * outliers: the demo model on standardised data with corrupt rows (a
#   feature read as 99999) in about 1 batch in 100: a skipped batch, nothing
#   wrong with the layer (healing is wrong);
# * scale spikes: standardised data, the loss scale growing every 25 steps
#   until the gradients overflow and it halves (healing is wrong).
# The rule is a pure function (`tf_mixed.scaling.healing.decide`), replayed
# over the record for every (skips, window): exact up to the first healing,
# which is all that is counted (a run that healed is no longer the recorded one).

from __future__ import annotations

import argparse
import time
from typing import Any

import keras
import numpy as np

import tf_mixed
from tf_mixed.bench import heal_suite
from tf_mixed.scaling.healing import HealRule, decide

__all__ = ["SKIPS", "WINDOWS", "first_healing", "main", "record"]

SKIPS = (1, 2, 3, 5)
WINDOWS = (50, 200, 1000)
OUTLIER = 99999.0
OUTLIER_RATE = 0.01
NEVER = 10**9


def record(x, y, *, epochs: int, seed: int, **knobs) -> tuple[list, list, int]:
    """Trains the demo model once with attribution on; returns what it attributed.

    Returns:
        ``(skips, names, steps)``: every attributed skip (step, layer, kind),
        the attributed layers' names, and the steps run.
    """
    keras.backend.clear_session()
    tf_mixed.enable("mixed_float16", quiet=True)
    model = heal_suite.demo_model(seed)
    model.compile(tf_mixed.wrap_optimizer(
        keras.optimizers.Adam(heal_suite.LEARNING_RATE), **knobs),
        "sparse_categorical_crossentropy")
    heal = tf_mixed.callbacks.Heal(skips=NEVER, window=NEVER)
    seen: dict = {}

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if heal.healer is not None:           # attached before the first step
                for skip in heal.healer.attribution.read().skips:
                    seen[skip.step] = skip

    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[heal, Recorder()])
    optimizer = model.optimizer
    steps = int(optimizer.iterations.numpy()) + int(optimizer.skipped_steps.numpy())
    assert heal.healer is not None
    return [seen[s] for s in sorted(seen)], list(heal.healer.attribution.names), steps


def first_healing(skips, names, rule: HealRule) -> int | None:
    """The step of the first healing ``rule`` takes over a recorded run, or None."""
    for i, skip in enumerate(skips):
        if decide(rule, skips[: i + 1], (), names, skip.step).move:
            return skip.step
    return None


def _outliers(x, rate: float, seed: int):
    x = x.copy()
    rng = np.random.default_rng(seed)
    batches = np.flatnonzero(rng.random(len(x) // 32) < rate)
    x[batches * 32, 0] = OUTLIER
    return x, len(batches)


def main(argv=None) -> list[dict]:
    """Prints the sweep as Markdown tables; returns its rows."""
    parser = argparse.ArgumentParser(prog="python -m tf_mixed.bench.heal_sweep")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per scenario")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = []
    for seed in range(args.seeds):
        x, y, _, _ = heal_suite.demo_data(seed=seed)
        runs.append(("demo", seed, "", *record(x, y, epochs=4, seed=seed + 1)))
        x, y, _, _ = heal_suite.demo_data(train=48000, seed=seed)
        x = x / heal_suite.RAW_SCALE
        bad, count = _outliers(x, OUTLIER_RATE, seed)
        runs.append(("outliers", seed, f"{count} corrupt batches",
                     *record(bad, y, epochs=1, seed=seed + 1)))
        runs.append(("scale spikes", seed, "",
                     *record(x, y, epochs=1, seed=seed + 1, dynamic_growth_steps=25,
                             max_scale=2.0**40)))
    rows = []
    for scenario, seed, note, skips, names, steps in runs:
        kinds = dict[int, int]()
        for s in skips:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        row = dict[str, Any](
            scenario=scenario, seed=seed, steps=steps, note=note,
            attributed={tf_mixed.scaling.attribution.KINDS[k]: n
                        for k, n in sorted(kinds.items())},
            healing={})
        for skips_n in SKIPS:
            for window in WINDOWS:
                row["healing"][(skips_n, window)] = first_healing(
                    skips, names, HealRule(skips=skips_n, window=window))
        rows.append(row)
    print("python -m tf_mixed.bench.heal_sweep"
          + (f" --seeds {args.seeds}" if argv else "") + "\n")
    print("| scenario | seed | steps | attributed skips | "
          + " | ".join(f"{k}/{w}" for k in SKIPS for w in WINDOWS) + " |")
    print("|---|---|---|---|" + "---|" * (len(SKIPS) * len(WINDOWS)))
    for row in rows:
        attributed = "; ".join(f"{n} {k}" for k, n in row["attributed"].items()) or "none"
        if row["note"]:
            attributed += f" ({row['note']})"
        cells = [str(row["healing"][(k, w)] or "-") for k in SKIPS for w in WINDOWS]
        print(f"| {row['scenario']} | {row['seed']} | {row['steps']} | {attributed} | "
              + " | ".join(cells) + " |")
    print(f"\ncells: skips/window -> the step of the first healing ('-': none); "
          f"{time.perf_counter() - start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
