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
from functools import lru_cache
from typing import Any

from ._records import EMPTY_HISTORY, History, HistoryEntry, HistoryEvent, SagaRecord

__all__ = ["HISTORY_KEYS", "history_prefix", "read_history"]

HISTORY_KEYS = ("_folded", "_history")

# entry field -> body key; the order is the dataclass's.
_SHORT = (("at_ms", "t"), ("event", "e"), ("step", "s"), ("attempt", "n"), ("state", "q"),
          ("code", "c"), ("ref", "i"), ("due_ms", "d"), ("actor", "a"), ("reason", "r"))
_TYPES = {key: int if key in ("t", "n", "d") else str for _, key in _SHORT}
_MAX_TEXT = 1024  # longest string field accepted back (reasons are at most 500 characters)
_EVENTS = {e.value: e for e in HistoryEvent}
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"),
                            sort_keys=True)


@lru_cache(maxsize=8192)
def _text(entry: HistoryEntry) -> str:
    """One entry's JSON. Entries never change and each is written again with every later
    write of its saga: a worker writing the saga's next step finds the text here."""
    out: dict[str, Any] = {}
    for name, key in _SHORT:
        value = getattr(entry, name)
        if value is not None:
            out[key] = value
    return _ENCODER.encode(out)


def history_prefix(record: SagaRecord) -> str:
    """The body keys of ``record``'s history, to put right after a body's ``{`` (with its
    trailing comma), or "" when it has none."""
    if not record.history and not record.history_folded:
        return ""
    folded = f'"_folded":{record.history_folded},' if record.history_folded else ""
    items = record.history.items if isinstance(record.history, History) else record.history
    # Stored entries go back as they were read, in one call; only new ones are encoded here.
    stored = [i for i in items if type(i) is dict]
    if len(stored) == len(items):
        return f'{folded}"_history":{_ENCODER.encode(stored)},'
    texts = [_ENCODER.encode(i) if type(i) is dict else _text(i) for i in items]
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
    if type(entries) is not list or not all(type(i) is dict for i in entries):
        raise ValueError("malformed history")

    def decode(item: Any) -> HistoryEntry:
        try:
            return _entry(item)
        except ValueError:
            raise fail from None

    return History.stored(entries, decode), folded


def _entry(item: Any) -> HistoryEntry:
    if type(item) is not dict:
        raise ValueError("malformed history entry")
    for key, value in item.items():  # only the keys present (most entries have three or four)
        kind = _TYPES.get(key)
        if (kind is not None and type(value) is not kind) or \
                (type(value) is str and len(value) > _MAX_TEXT):
            raise ValueError("malformed history entry")
    at, event = item.get("t"), item.get("e")
    if at is None or event is None or at < 0:
        raise ValueError("malformed history entry")
    get = item.get
    named = _EVENTS[event] if event in _EVENTS else str(event)
    return HistoryEntry(at, named, get("s"), get("n"), get("q"), get("c"),
                        get("i"), get("d"), get("a"), get("r"))
