"""The one walker over paged scans (docs/design.md §5, §6): pagers in order, one position
format ``"<pager index>:<store cursor>"``, exact wherever the walk is stopped."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._walker import MAX_POSITION_LENGTH, start_of, walk
from celery_sagas.errors import SagaValidationError


class ListPager:
    """Pages through a list, ``size`` items a page; the store cursor is the next offset."""

    def __init__(self, items: list[str], size: int, seen: list[str]) -> None:
        self.items, self.size, self.seen = items, size, seen

    def page(self, cursor: str | None) -> str | None:
        start = int(cursor or 0)
        self.seen.extend(self.items[start:start + self.size])
        following = start + self.size
        return str(following) if following < len(self.items) else None


def pagers(seen: list[str]) -> list[ListPager]:
    return [ListPager(["a1", "a2", "a3"], 2, seen), ListPager([], 2, seen),
            ListPager(["c1", "c2"], 2, seen)]


def test_a_walk_visits_every_pager_in_order_and_says_where_to_resume() -> None:
    seen: list[str] = []
    positions = list(walk(pagers(seen), None))
    assert seen == ["a1", "a2", "a3", "c1", "c2"]
    assert positions == ["0:2", "1:", "2:", None]


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_resuming_from_any_position_neither_loses_nor_repeats(stop_after: int) -> None:
    # given: a walk stopped after some pages
    seen: list[str] = []
    position: str | None = None
    for count, reached in enumerate(walk(pagers(seen), None), start=1):
        position = reached
        if count == stop_after:
            break

    # when
    list(walk(pagers(seen), position))

    # then
    assert seen == ["a1", "a2", "a3", "c1", "c2"]


def test_the_top_is_where_no_position_is() -> None:
    assert start_of(None, 3) == (0, None)
    assert start_of("2:", 3) == (2, None)
    assert start_of("1:abc:def", 3) == (1, "abc:def")


@pytest.mark.parametrize("position", ["", "3:", "-1:", "x:", "1", 7, "0:" + "x" * MAX_POSITION_LENGTH])
def test_a_position_this_walk_cannot_read_is_refused(position: Any) -> None:
    with pytest.raises(SagaValidationError):
        start_of(position, 3)
    with pytest.raises(SagaValidationError):
        next(walk(pagers([]), position))
