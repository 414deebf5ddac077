"""Tests for tf_mixed._internal.measuring: rounds, quartiles, intervals, load, cache.

No test times this host: every figure and clock reading is given.
"""

import json
import os
import re
import statistics

import pytest

from tf_mixed._internal import measuring


def test_quartiles_are_statistics_inclusive_quartiles():
    for values in ([4.0, 1.0, 3.0, 2.0, 5.0], [1.0, 2.0], [0.5, 9.0, 2.5, 7.0, 1.0, 3.0]):
        q1, median, q3 = measuring.quartiles(values)
        assert (q1, q3) == pytest.approx(
            tuple(statistics.quantiles(values, n=4, method="inclusive")[::2]))
        assert median == statistics.median(values)
    assert measuring.quartiles([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="no values"):
        measuring.quartiles([])


def test_quantile_interpolates_between_ranks():
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]  # sorted: 1 2 3 4 5 10
    assert measuring.quantile(values, 0.0) == 1.0
    assert measuring.quantile(values, 1.0) == 10.0
    assert measuring.quantile(values, 0.5) == statistics.median(values) == 3.5
    assert measuring.quantile(values, 0.9) == pytest.approx(7.5)  # 5 + 0.5 * (10 - 5)
    assert measuring.quantile([2.0], 0.9) == 2.0
    for q in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"0 <= q <= 1\. Received: q="):
            measuring.quantile(values, q)
    with pytest.raises(ValueError, match="no values"):
        measuring.quantile([], 0.5)


def test_spread_and_relative_spread():
    summary = measuring.spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert summary == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0, "n": 5}
    assert measuring.relative_spread(summary) == pytest.approx(2.0 / 3.0)
    # Under 4 values the width is max - min.
    assert measuring.relative_spread(measuring.spread([1.8, 2.0, 2.4])) == pytest.approx(0.3)


def test_interleaved_rounds_rotate_and_keep_to_the_budget():
    calls = []
    ticks = iter(range(100))

    def measure(name, figure):
        def run():
            calls.append(name)
            return figure
        return run

    figures = measuring.interleaved_rounds(
        {"a": measure("a", 1.0), "b": measure("b", 2.0), "c": measure("c", 3.0)}, 4)
    assert figures == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}
    assert calls == [*"abc", *"bca", *"cab", *"cba"]  # measuring.rotated, round by round
    calls.clear()
    # The clock moves 1 s per reading: the budget of 2 s stops after the second round.
    figures = measuring.interleaved_rounds({"a": measure("a", 1.0)}, 10, budget_s=2.0,
                                           clock=lambda: float(next(ticks)))
    assert figures == {"a": [1.0, 1.0]}
    with pytest.raises(ValueError, match="rounds >= 1"):
        measuring.interleaved_rounds({"a": measure("a", 1.0)}, 0)


def test_interleaved_rounds_keep_min_rounds_and_say_each_round():
    calls, said = [], []
    ticks = iter(range(100))

    def measure(name):
        def run():
            calls.append(name)
            return 1.0
        return run

    # The clock moves 1 s per reading (read at the start and after each round
    # from the third): a spent budget of 0 s still runs the first 3 rounds.
    figures = measuring.interleaved_rounds(
        {"a": measure("a"), "b": measure("b")}, 10, budget_s=0.0, min_rounds=3,
        clock=lambda: float(next(ticks)), on_round=said.append)
    assert figures == {"a": [1.0] * 3, "b": [1.0] * 3}
    assert calls == [*"ab", *"ba", *"ba"] and said == [0, 1, 2]
    assert next(ticks) == 2  # one reading at the start, one after the third round


def test_grouped_rounds_rotate_the_groups_and_within_each_group():
    calls = []

    def measure(group, name):
        def run():
            calls.append(f"{group}.{name}")
            return float(len(calls))  # the call's place in the whole sequence
        return run

    groups = {"x": {"f": measure("x", "f"), "h": measure("x", "h")},
              "y": {"f": measure("y", "f"), "h": measure("y", "h"), "c": measure("y", "c")},
              "z": {"f": measure("z", "f")}}
    figures = measuring.grouped_rounds(groups, 4)
    assert calls == [
        "x.f", "x.h", "y.f", "y.h", "y.c", "z.f",  # round 0: both levels as given
        "y.h", "y.c", "y.f", "z.f", "x.h", "x.f",  # round 1: each from its second
        "z.f", "x.h", "x.f", "y.c", "y.f", "y.h",  # round 2: x's second cycle runs backwards
        "z.f", "y.c", "y.h", "y.f", "x.f", "x.h"]  # round 3: so do the groups' and y's
    # Each figure lands in its group and name, round by round.
    assert figures == {"x": {"f": [1.0, 12.0, 15.0, 23.0], "h": [2.0, 11.0, 14.0, 24.0]},
                       "y": {"f": [3.0, 9.0, 17.0, 22.0], "h": [4.0, 7.0, 18.0, 21.0],
                             "c": [5.0, 8.0, 16.0, 20.0]},
                       "z": {"f": [6.0, 10.0, 13.0, 19.0]}}
    # One group is `interleaved_rounds`.
    calls.clear()
    assert measuring.grouped_rounds({"y": groups["y"]}, 2)["y"] == {
        "f": [1.0, 6.0], "h": [2.0, 4.0], "c": [3.0, 5.0]}
    assert calls == ["y.f", "y.h", "y.c", "y.h", "y.c", "y.f"]


@pytest.mark.parametrize("groups, rounds, found", [
    ({}, 1, "Received: 0 groups, rounds=1"),
    ({"a": {}}, 1, "Received: 1 groups ('a' empty), rounds=1"),
    ({"a": {"f": lambda: 1.0}}, 0, "Received: 1 groups, rounds=0")])
def test_grouped_rounds_refuse_no_group_an_empty_group_or_no_round(groups, rounds, found):
    with pytest.raises(ValueError, match=re.escape(found)):
        measuring.grouped_rounds(groups, rounds)


def test_fastest_keeps_the_shortest_call():
    readings = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])
    assert measuring.fastest(lambda: None, 3, clock=lambda: next(readings)) == 1.0


def test_rotated_order():
    names = ["a", "b", "c"]
    orders = [measuring.rotated(names, r) for r in range(6)]
    assert [o[0] for o in orders] == ["a", "b", "c", "c", "a", "b"]
    with pytest.raises(ValueError, match="round index"):
        measuring.rotated(names, -1)


def test_estimate_is_the_median_with_a_seeded_interval():
    ratios = [3.06, 1.56, 3.4, 2.9, 3.1, 2.2, 3.3, 3.0, 2.8]
    first = measuring.estimate(ratios)
    assert first == measuring.estimate(ratios)  # seeded
    assert first.median == statistics.median(ratios) == 3.0
    assert first.pairs == 9 and first.confidence == 0.9
    assert 1.56 <= first.low <= first.median <= first.high <= 3.4
    # Every pair faster: the interval answers "faster here" however wide the pairs spread
    # (the old rule, IQR within 20% of the median, refused this one).
    assert first.answers()
    assert first.text().startswith("3.00x (90% interval ")
    assert first.to_dict()["median"] == 3.0


def test_an_interval_across_one_answers_nothing_unless_narrow():
    across = measuring.estimate([0.7, 1.3, 0.8, 1.2, 1.0, 0.9, 1.1])
    assert across.low < 1.0 < across.high and not across.answers()
    # About the same speed: an interval that holds 1 but is narrow answers "no faster".
    same = measuring.estimate([0.99, 1.01, 1.0, 1.02, 0.98, 1.0, 1.01])
    assert same.low <= 1.0 <= same.high and same.answers()
    # Fewer than MIN_PAIRS pairs never answer.
    assert not measuring.estimate([2.0, 2.0]).answers()
    assert measuring.estimate([2.0, 2.0, 2.0]).answers()
    # A constant is its own interval.
    assert measuring.estimate([2.0] * 5) == measuring.Estimate(2.0, 2.0, 2.0, 5, 0.9)


@pytest.mark.parametrize("ratios, match", [([], "at least one ratio"), ([1.0, 0.0], "positive"),
                                           ([float("inf")], "positive")])
def test_estimate_refuses_bad_ratios(ratios, match):
    with pytest.raises(ValueError, match=match):
        measuring.estimate(ratios)


def test_estimate_refuses_bad_draws():
    with pytest.raises(ValueError, match="confidence=1.0"):
        measuring.estimate([1.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples=0"):
        measuring.estimate([1.0], resamples=0)


def test_pooled_ratio_and_its_interval():
    base = [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]
    other = [[3.0, 3.0], [6.0, 6.0], [3.0, 3.0]]
    assert measuring.pooled_ratio(base, other) == 3.0
    assert measuring.ratio_interval(base, other) == (3.0, 3.0)
    with pytest.raises(ValueError, match="same number of rounds"):
        measuring.pooled_ratio(base, other[:2])
    with pytest.raises(ValueError, match=r"rounds\[1\] is an empty round"):
        measuring.ratio_interval(base, [[1.0], [], [1.0]])


def test_load_is_read_in_one_place(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 2.0, 1.0))
    assert measuring.load_averages() == [3.5, 2.0, 1.0]
    assert measuring.machine_load() == (3.5, os.cpu_count() or 1)

    def missing():
        raise OSError("no load here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert measuring.load_averages() is None
    assert measuring.machine_load()[0] is None
    assert measuring.busy(None, 2) == ""
    assert measuring.busy(3.0, 2) == ""
    assert measuring.busy(3.1, 2) == "the machine was busy: load average 3.1 on 2 CPUs"


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_MIXED_CACHE_DIR", str(tmp_path / "explicit"))
    assert measuring.cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("TF_MIXED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert measuring.cache_dir() == str(tmp_path / "xdg" / "tf_mixed")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert measuring.cache_dir() == str(tmp_path / "home" / ".cache" / "tf_mixed")


def test_cache_round_trip_and_what_it_ignores(tmp_path):
    key = {"cpu": "x", "n": 1}
    path = measuring.cache_path(key, str(tmp_path), prefix="plan")
    assert os.path.basename(path).startswith("plan-")
    record = {"format": measuring.CACHE_FORMAT, "key": key, "figure": 2.0}
    assert measuring.write_cache(path, record)
    assert measuring.read_cache(path, key) == record
    assert measuring.read_cache(path, {"cpu": "y", "n": 1}) is None  # another key
    assert measuring.read_cache(path, key, lambda r: "too old") is None
    assert measuring.read_cache(path, key, lambda r: r["missing"]) is None  # unreadable
    with open(path, "w") as f:
        json.dump(dict(record, format=1), f)
    assert measuring.read_cache(path, key) is None  # another format
    with open(path, "w") as f:
        f.write("{half")
    assert measuring.read_cache(path, key) is None
    assert measuring.read_cache(str(tmp_path / "absent.json"), key) is None
    assert not measuring.write_cache(str(tmp_path / "x.json"), {"not json": object()})
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no temporary left
