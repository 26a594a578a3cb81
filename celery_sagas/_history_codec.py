"""A saga's history in its record body, and back (docs/design.md §2.6).

The entries travel in the saga's own body (so they are written by the same compare-and-set,
in the same slot, and deleted with the saga) under ``_history``, with the count folded away
under ``_folded``: both keys sort before every other key of a body, so they are put in front
of the canonical JSON of the rest without encoding it again, and the payload limit keeps
bounding the record without them (the history has its own bound, ``sagas_history_limit``).
Each entry is a small object with one-letter keys, its None fields left out. Entries hold no
payload (ids, names, states, codes, times, the actor and the reason), so they are never sealed.
"""

from __future__ import annotations

import json
from typing import Any

from ._records import HistoryEntry, HistoryEvent, SagaRecord

__all__ = ["HISTORY_KEYS", "history_prefix", "read_history"]

HISTORY_KEYS = ("_folded", "_history")

# entry field -> body key; the order is the dataclass's.
_SHORT = (("at_ms", "t"), ("event", "e"), ("step", "s"), ("attempt", "n"), ("state", "q"),
          ("code", "c"), ("ref", "i"), ("due_ms", "d"), ("actor", "a"), ("reason", "r"))
_INTS = frozenset({"t", "n", "d"})
_MAX_TEXT = 1024  # longest string field accepted back (reasons are at most 500 characters)
_EVENTS = {e.value: e for e in HistoryEvent}
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"),
                            sort_keys=True)


def _out(entry: HistoryEntry) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in _SHORT:
        value = getattr(entry, name)
        if value is not None:
            out[key] = value
    return out


def history_prefix(record: SagaRecord) -> str:
    """The body keys of ``record``'s history, to put right after a body's ``{`` (with its
    trailing comma), or "" when it has none."""
    if not record.history and not record.history_folded:
        return ""
    folded = f'"_folded":{record.history_folded},' if record.history_folded else ""
    return f'{folded}"_history":{_ENCODER.encode([_out(e) for e in record.history])},'


def read_history(raw: dict[str, Any]) -> tuple[tuple[HistoryEntry, ...], int]:
    """The entries and the folded count a decoded body holds, taken out of it; ValueError
    when anything is off."""
    entries, folded = raw.pop("_history", None), raw.pop("_folded", 0)
    if type(folded) is not int or folded < 0:
        raise ValueError("malformed history count")
    if entries is None:
        return (), folded
    if type(entries) is not list:
        raise ValueError("malformed history")
    return tuple(_entry(item) for item in entries), folded


def _entry(item: Any) -> HistoryEntry:
    if type(item) is not dict:
        raise ValueError("malformed history entry")
    values: list[Any] = []
    for _, key in _SHORT:
        value = item.get(key)
        if value is not None and type(value) is not (int if key in _INTS else str):
            raise ValueError("malformed history entry")
        if type(value) is str and len(value) > _MAX_TEXT:
            raise ValueError("malformed history entry")
        values.append(value)
    if values[0] is None or values[1] is None or values[0] < 0:
        raise ValueError("malformed history entry")
    values[1] = _EVENTS.get(values[1], values[1])  # an event of a later release stays a str
    return HistoryEntry(*values)
