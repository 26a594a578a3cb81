"""Opaque keyset cursors shared by stores that page by (state, updated_at_ms, id)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import _values as values
from ..errors import SagaValidationError
from .base import OrderKey

__all__ = ["decode_cursor", "decode_position", "encode_cursor", "encode_position"]

# The "state" an ordered-scan cursor names: what it sorts by (a cursor of one sort is refused
# by the other; "ordered", the sort by last write, is what cursors named before "created").
_ORDERED: dict[OrderKey, str] = {"updated": "ordered", "created": "created"}

# A real cursor is a few dozen characters; anything far longer is not one of ours.
_MAX_CURSOR = 4096


def encode_cursor(states: Sequence[str], state: str, position: tuple[int, str], *extra: int) -> str:
    """Encode the last position returned (and any store-specific numbers) as an opaque string."""
    return values.cursor_text([list(states).index(state), position[0], position[1], *extra])


def decode_cursor(
    cursor: str | None, states: Sequence[str], extras: int = 0
) -> tuple[int, tuple[int, str] | None, tuple[int, ...]]:
    """Decode a cursor into (state index, last position, extras); None starts at the top."""
    if cursor is None:
        return 0, None, (0,) * extras
    fields = values.cursor_fields(cursor, "scan", count=3 + extras, max_len=_MAX_CURSOR)
    if (
        not all(type(f) is int for i, f in enumerate(fields) if i != 2)
        or not isinstance(fields[2], str)
        or not 0 <= fields[0] < len(states)
    ):
        raise SagaValidationError("malformed scan cursor")
    return fields[0], (fields[1], fields[2]), tuple(fields[3:])


def encode_position(position: tuple[int, str], by: OrderKey = "updated") -> str:
    """The cursor of an ordered scan by ``by``: the (position, id) its next page starts at."""
    return encode_cursor(list(_ORDERED.values()), _ORDERED[by], position)


def decode_position(cursor: str | None, by: OrderKey = "updated") -> tuple[int, str] | None:
    """The (position, id) an ordered-scan cursor of the sort ``by`` names; None starts at the
    top; a cursor of the other sort is refused."""
    names = list(_ORDERED.values())
    index, position, _ = decode_cursor(cursor, names)
    if cursor is not None and names[index] != _ORDERED[by]:
        raise SagaValidationError("a cursor of another sort")
    return position
