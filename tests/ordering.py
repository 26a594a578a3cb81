"""Slowest tests first, so a parallel run does not end waiting on a few long ones.

pytest-xdist hands tests out in collection order (``--dist load --maxschedchunk 1``: each
worker holds two, and takes the next as one ends). The chaos scenarios, the browser tests and
the slow end-to-end tests would otherwise come last (their folders sort last) and leave the
run on one or two busy workers for minutes. Every xdist worker sorts its collection by the
seconds ``durations.json`` beside this file records (a stable sort: tests it does not name,
the fast ones, keep their order after the slow ones), so the workers start on the longest
tests and the short ones fill the gaps at the end.

Regenerate the table after a run that wrote a JUnit report:
``python -m pytest --junitxml=/tmp/junit.xml && python -m tests.ordering /tmp/junit.xml``.
A test missing from the table only runs later than it could; nothing fails for it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import pytest

__all__ = ["TABLE", "record", "slowest_first"]

ROOT = Path(__file__).resolve().parents[1]
TABLE = Path(__file__).with_name("durations.json")
FLOOR_S = 1.0  # tests faster than this are left out of the table (and keep their order)


@cache
def _seconds() -> dict[str, float]:
    if not TABLE.exists():
        return {}
    table: dict[str, float] = json.loads(TABLE.read_text())
    return table


def slowest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` by the seconds the table gives them, longest first (stable)."""
    seconds = _seconds()
    return sorted(items, key=lambda item: -seconds.get(item.nodeid, 0.0))


def _nodeid(case: ElementTree.Element) -> str:
    """A JUnit test case's pytest node id (``classname`` is the dotted module path, with the
    class appended for a test in a class)."""
    parts = (case.get("classname") or "").split(".")
    name = case.get("name") or ""
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).exists():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return name


def record(reports: Sequence[Path], floor_s: float = FLOOR_S) -> dict[str, float]:
    """The table from JUnit reports: seconds of every test at least ``floor_s`` long (a test
    in several reports keeps its longest time)."""
    found: dict[str, float] = {}
    for report in reports:
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            seconds = float(case.get("time") or 0.0)
            nodeid = _nodeid(case)
            if seconds >= floor_s and seconds > found.get(nodeid, 0.0):
                found[nodeid] = round(seconds, 1)
    return dict(sorted(found.items(), key=lambda entry: (-entry[1], entry[0])))


if __name__ == "__main__":
    table = record([Path(argument) for argument in sys.argv[1:]])
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} tests of {FLOOR_S} s or more, {sum(table.values()):.0f} s")
