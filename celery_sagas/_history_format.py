"""A saga's history as people read it (``celery sagas history``, ``celery sagas show``).

One row per entry: when, what, which step, the details (attempt, new state, code, id, when it
falls due), who and why. Every string is passed through ``printable``: an actor, a reason or a
name read from a store can never forge a line of the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._cli_format import iso, table
from ._records import HistoryEntry, HistoryEvent, SagaHistory
from ._values import printable

__all__ = ["ROUTINE", "detail", "events_text", "history_rows", "history_text", "notable"]

E = HistoryEvent

# Step progress that goes as it should: ``show`` leaves it to the steps' own lines.
ROUTINE = frozenset({E.INTENT, E.CLAIMED, E.COMMITTED, E.COMPENSATION_INTENT,
                     E.COMPENSATION_CLAIMED, E.COMPENSATED, E.RESENT})


def detail(entry: HistoryEntry) -> str:
    """The details of an entry in a few words: ``#2 -> failed (card_declined) ref due <time>``."""
    parts = []
    if entry.attempt:
        parts.append(f"#{entry.attempt}")
    if entry.state is not None:
        parts.append(f"-> {entry.state}")
    if entry.code is not None:
        parts.append(f"({entry.code})")
    if entry.ref is not None:
        parts.append(entry.ref)
    if entry.due_ms is not None:
        parts.append(f"due {iso(entry.due_ms)}")
    return printable(" ".join(parts))


def history_rows(entries: Iterable[HistoryEntry]) -> list[tuple[str, ...]]:
    """The rows of the history table, oldest first."""
    return [(iso(e.at_ms), printable(str(e.event)), printable(e.step or "-"), detail(e) or "-",
             printable(e.actor or "-"), printable(e.reason or "-")) for e in entries]


_HEADERS = ("TIME", "EVENT", "STEP", "DETAIL", "BY", "REASON")


def history_text(history: SagaHistory) -> str:
    """The ``history`` command's table, with a line for entries the bound folded away."""
    lines = []
    if history.folded:
        lines.append(f"({history.folded} earlier entries folded away by sagas_history_limit)")
    lines.append(table(_HEADERS, history_rows(history.entries)) if history.entries
                 else "no history recorded")
    return "\n".join(lines)


def notable(entries: Sequence[HistoryEntry]) -> list[HistoryEntry]:
    """What ``show`` lists: every entry but routine step progress (failures, ambiguities and
    their causes, changes of state, waits, signals, children, approvals, operator actions)."""
    return [e for e in entries if e.event not in ROUTINE]


def events_text(history: SagaHistory) -> str:
    """``show``'s history section: the notable entries, or a line saying there are none."""
    shown = notable(history.entries)
    routine = len(history.entries) - len(shown)
    head = f"history ({routine} routine step entries left out; all: history {history.saga_id})"
    if history.folded:
        head += f"; {history.folded} earlier entries folded away"
    body = table(_HEADERS, history_rows(shown)) if shown else "nothing but routine step progress"
    return f"{printable(head)}\n{body}"
