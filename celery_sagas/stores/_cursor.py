"""Opaque keyset cursors shared by stores that page by (state, updated_at_ms, id)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from ..errors import SagaValidationError

__all__ = ["decode_cursor", "encode_cursor"]

# A real cursor is a few dozen characters; anything far longer is not one of ours.
_MAX_CURSOR = 4096


def encode_cursor(states: Sequence[str], state: str, position: tuple[int, str], *extra: int) -> str:
    """Encode the last position returned (and any store-specific numbers) as an opaque string."""
    raw = json.dumps([list(states).index(state), position[0], position[1], *extra])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(
    cursor: str | None, states: Sequence[str], extras: int = 0
) -> tuple[int, tuple[int, str] | None, tuple[int, ...]]:
    """Decode a cursor into (state index, last position, extras); None starts at the top."""
    if cursor is None:
        return 0, None, (0,) * extras
    if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR:
        raise SagaValidationError("malformed scan cursor")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        fields = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError) as exc:
        raise SagaValidationError("malformed scan cursor") from exc
    if (
        not isinstance(fields, list)
        or len(fields) != 3 + extras
        or not all(type(f) is int for i, f in enumerate(fields) if i != 2)
        or not isinstance(fields[2], str)
        or not 0 <= fields[0] < len(states)
    ):
        raise SagaValidationError("malformed scan cursor")
    return fields[0], (fields[1], fields[2]), tuple(fields[3:])
