"""One walker over paged scans, with one cursor format (docs/design.md §5, §6).

The sweep (which acts on what it reads) and the findings report (which judges it) walk the
same scans the same way: a list of pagers, each handling one page at a time and returning the
store cursor of its next page. The walker goes through them in order and says, after every
page, where to resume: ``"<pager index>:<store cursor>"``, or None once every pager is done.
A position this version cannot read (another pager list, a garbled checkpoint) raises
``SagaValidationError``; a caller resuming from a saved checkpoint restarts from the top.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from .errors import SagaValidationError

__all__ = ["MAX_POSITION_LENGTH", "Pager", "start_of", "walk"]

MAX_POSITION_LENGTH = 4096


class Pager(Protocol):
    """Handles one page of one scan."""

    def page(self, cursor: str | None) -> str | None:
        """Handle the page at ``cursor``; the cursor of the next page, or None when done."""
        ...


def start_of(position: str | None, pagers: int) -> tuple[int, str | None]:
    """Decode ``"<pager index>:<store cursor>"``; None starts at the top."""
    if position is None:
        return 0, None
    if not isinstance(position, str) or len(position) > MAX_POSITION_LENGTH:
        raise SagaValidationError("malformed walk position")
    index, colon, inner = position.partition(":")
    if not colon or not index.isdigit() or not 0 <= int(index) < pagers:
        raise SagaValidationError("malformed walk position")
    return int(index), inner or None


def walk(pagers: Sequence[Pager], position: str | None) -> Iterator[str | None]:
    """Page through ``pagers`` from ``position``; after each page, yield where to resume (None
    once all are done). Stop iterating at any time: the last position yielded is exact."""
    index, cursor = start_of(position, len(pagers))
    while index < len(pagers):
        cursor = pagers[index].page(cursor)
        if cursor is None:
            index += 1
        yield None if index >= len(pagers) else f"{index}:{cursor or ''}"
