"""A saga's history in its record body, and back (docs/design.md §2.6).

The entries travel in the saga's own body (so they are written by the same compare-and-set,
in the same slot, and deleted with the saga) under ``_history``, with the count folded away
under ``_folded``: both keys sort before every other key of a body, so they are put in front
of the canonical JSON of the rest without encoding it again, and the payload limit keeps
bounding the record without them (the history has its own bound, ``sagas_history_limit``).
Each entry is a JSON array of its fields in a fixed order (``_FIELDS``), trailing None fields
left out: no keys to parse or sort, which keeps carrying it on every write cheap. Entries hold no
payload (ids, names, states, codes, times, the actor and the reason), so they are never sealed.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ._records import EMPTY_HISTORY, History, HistoryEntry, HistoryEvent, SagaRecord

__all__ = ["HISTORY_KEYS", "history_prefix", "read_history"]

HISTORY_KEYS = ("_folded", "_history")

# The fields of an entry, in the order of its JSON array, with the JSON type of each.
_FIELDS = ("at_ms", "event", "step", "attempt", "state", "code", "ref", "due_ms", "actor",
           "reason")
_KINDS = (int, str, str, int, str, str, str, int, str, str)
_MAX_TEXT = 1024  # longest string field accepted back (reasons are at most 500 characters)
_EVENTS = {e.value: e for e in HistoryEvent}
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=8192)
def _text(entry: HistoryEntry) -> str:
    """One entry's JSON array, its trailing None fields left out. Entries never change and
    each is written again with every later write of its saga: a worker writing the saga's
    next step finds the text here."""
    values = [getattr(entry, name) for name in _FIELDS]
    while values[-1] is None:
        values.pop()
    return _ENCODER.encode(values)


def history_prefix(record: SagaRecord) -> str:
    """The body keys of ``record``'s history, to put right after a body's ``{`` (with its
    trailing comma), or "" when it has none."""
    if not record.history and not record.history_folded:
        return ""
    folded = f'"_folded":{record.history_folded},' if record.history_folded else ""
    items = record.history.items if isinstance(record.history, History) else record.history
    # Stored entries go back as they were read, in one call; only new ones are encoded here.
    split = next((n for n, i in enumerate(items) if type(i) is not list), len(items))
    texts = [_ENCODER.encode(list(items[:split]))[1:-1]] if split else []
    texts += [_ENCODER.encode(i) if type(i) is list else _text(i) for i in items[split:]]
    return f'{folded}"_history":[{",".join(texts)}],'


def read_history(raw: dict[str, Any], fail: Exception) -> tuple[History, int]:
    """The entries and the folded count a decoded body holds, taken out of it; ValueError
    when their shape is off. Each entry is checked when first read (``fail`` raised for a
    malformed one): a worker carrying the history forward never builds them."""
    entries, folded = raw.pop("_history", None), raw.pop("_folded", 0)
    if type(folded) is not int or folded < 0:
        raise ValueError("malformed history count")
    if entries is None:
        return EMPTY_HISTORY, folded
    if type(entries) is not list or not all(type(i) is list for i in entries):
        raise ValueError("malformed history")

    def decode(item: Any) -> HistoryEntry:
        try:
            return _entry(item)
        except ValueError:
            raise fail from None

    return History.stored(entries, decode), folded


def _entry(item: Any) -> HistoryEntry:
    if type(item) is not list or len(item) < 2:
        raise ValueError("malformed history entry")
    values = item[:len(_FIELDS)]  # a later release may add fields at the end
    for value, kind in zip(values, _KINDS, strict=False):
        if value is not None and (type(value) is not kind or
                                  (type(value) is str and len(value) > _MAX_TEXT)):
            raise ValueError("malformed history entry")
    at, event = values[0], values[1]
    if at is None or event is None or at < 0:
        raise ValueError("malformed history entry")
    values[1] = _EVENTS.get(event, event)  # an event of a later release stays a str
    return HistoryEntry(*values)
