"""Two catalogs side by side: the layers whose safe range changed (a Keras or TF upgrade)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tf_mixed.tools.catalog.reading import SafeRange
from tf_mixed.tools.catalog.results import Catalog

__all__ = ["Change", "Comparison", "compare"]


@dataclasses.dataclass(frozen=True)
class Change:
    """One row whose safe range differs.

    Attributes:
        key: ``Layer[config]``.
        policy: the half policy.
        old, new: the safe range in each catalog (None: the row is missing).
        old_failure, new_failure: why it did not run ("" where it ran).
    """

    key: str
    policy: str
    old: SafeRange | None
    new: SafeRange | None
    old_failure: str = ""
    new_failure: str = ""

    def __str__(self) -> str:
        return f"{self.key} {self.policy}: {_text(self.old, self.old_failure)} -> " \
               f"{_text(self.new, self.new_failure)}"


def _text(safe: SafeRange | None, failure: str) -> str:
    if safe is None:
        return "not measured"
    return "does not run" if failure else safe.text()


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What `compare` found.

    Attributes:
        changes: the rows whose safe range (or ability to run) changed.
        old_versions, new_versions: each catalog's versions.
        same_grid: whether both used the same magnitudes and tolerance (if
            not, ranges differ by construction).
    """

    changes: tuple[Change, ...]
    old_versions: dict[str, str]
    new_versions: dict[str, str]
    same_grid: bool

    def __bool__(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {"old_versions": self.old_versions, "new_versions": self.new_versions,
                "same_grid": self.same_grid,
                "changes": [{"key": c.key, "policy": c.policy, "old": _range(c.old),
                             "new": _range(c.new), "old_failure": c.old_failure,
                             "new_failure": c.new_failure} for c in self.changes]}

    def __str__(self) -> str:
        versions = (f"{_versions(self.old_versions)} -> {_versions(self.new_versions)}")
        lines = [f"Safe ranges compared ({versions}):"]
        if not self.same_grid:
            lines.append("  (the two catalogs used different magnitudes or tolerances)")
        if not self.changes:
            lines.append("  no layer's safe range changed")
        lines += [f"  {change}" for change in self.changes]
        return "\n".join(lines)


def _range(safe: SafeRange | None):
    return None if safe is None else safe._asdict()


def _versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items() if k != "tf_mixed")


def _same(a: SafeRange, b: SafeRange, slack: float) -> bool:
    if a == b:
        return True
    ends = [(a.low, b.low), (a.high, b.high)]
    if any((x is None) != (y is None) for x, y in ends):
        return False
    return all(x is None or y is None or abs(math.log10(x) - math.log10(y)) <= slack + 1e-9
               for x, y in ends)


def compare(old: Catalog, new: Catalog, *, slack: float = 0.0) -> Comparison:
    """The rows whose safe range differs between two catalogs.

    Args:
        old: the earlier catalog (`tf_mixed.tools.catalog.load` reads a file).
        new: the later one.
        slack: decades an end of a range may move and still count as the same
            (0: any move is a change; another host's kernels can move an end
            that sits at the tolerance by one grid step).

    Returns:
        A `Comparison`; rows present in one catalog only are listed too.
    """
    before = {(row.key, row.policy): row for row in old.rows}
    after = {(row.key, row.policy): row for row in new.rows}
    changes = []
    for key in list(before) + [k for k in after if k not in before]:
        a, b = before.get(key), after.get(key)
        same = (a is not None and b is not None and _same(a.safe, b.safe, slack)
                and bool(a.failure) == bool(b.failure))
        if not same:
            changes.append(Change(key[0], key[1], a.safe if a else None,
                                  b.safe if b else None, a.failure if a else "",
                                  b.failure if b else ""))
    same_grid = (tuple(old.magnitudes) == tuple(new.magnitudes)
                 and old.tolerance == new.tolerance)
    return Comparison(tuple(changes), dict(old.versions), dict(new.versions), same_grid)
