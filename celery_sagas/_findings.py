"""Paged reports of what needs an operator (SPEC §5): findings over sagas and effects.

A walk goes through up to four index-backed scans, in this order, so its cost follows the
matching records and never every record kept:

1. ``manual-review`` sagas (every one: an operator must act);
2. ``running`` and ``compensating`` sagas not updated since ``stale_before``: each is
   ``ambiguous-execution`` / ``ambiguous-compensation`` (a step still in flight or unknown,
   with its effect id) or ``stale``;
3. effects in ``admission`` since before ``stale_before``: ``incomplete``;
4. effects ``executing`` or ``unknown`` since before ``in_flight_before``: ``ambiguous``.

Each scanned record yields exactly one finding (a record that fails read validation yields a
``corrupt`` one), so a page holds up to ``limit`` findings (1..1000) and the opaque cursor
resumes the walk where the page ended. The cursor also carries the window of the first page:
later pages judge staleness against the same instants, however long the walk takes.
``all_findings`` walks every page but raises instead of returning more than 1000.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._engine import Engine
from ._events import FindingEvent
from ._protocol.findings import Finding, FindingKind, effect_finding, saga_finding
from ._records import SAGA, EffectState, SagaState
from ._scans import CorruptRecord, RecordPage, scan_effects, scan_sagas
from .errors import SagaValidationError
from .stores.base import MAX_SCAN_LIMIT, Store

__all__ = [
    "OPEN_SAGA_STATES",
    "REPORTS",
    "FindingPage",
    "Window",
    "all_findings",
    "corrupt_finding",
    "count_sagas",
    "finding_event",
    "page_findings",
    "window_of",
]

OPEN_SAGA_STATES = (SagaState.RUNNING, SagaState.COMPENSATING, SagaState.MANUAL_REVIEW)
REPORTS = ("all", "sagas", "effects")
_CURSOR_VERSION = 1
_MAX_CURSOR_LENGTH = 4096


@dataclass(frozen=True, slots=True)
class Window:
    """The instants (ms) a walk judges against: updated before them means stale."""

    stale_before_ms: int
    in_flight_before_ms: int


@dataclass(frozen=True, slots=True)
class FindingPage:
    """Up to ``limit`` findings and the cursor of the next page (None when the walk is done)."""

    findings: tuple[Finding, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class _Source:
    """One scan of a walk: which records, and how each becomes a finding."""

    report: str
    fetch: Callable[[Store, Window, str | None, int], RecordPage[Any]]
    judge: Callable[[Any, Window], Finding | None]


def _review_sagas(store: Store, _: Window, cursor: str | None, limit: int) -> RecordPage[Any]:
    return scan_sagas(store, [SagaState.MANUAL_REVIEW], cursor=cursor, limit=limit)


def _stale_sagas(store: Store, window: Window, cursor: str | None, limit: int) -> RecordPage[Any]:
    return scan_sagas(store, [SagaState.RUNNING, SagaState.COMPENSATING],
                      updated_before_ms=window.stale_before_ms, cursor=cursor, limit=limit)


def _admitted(store: Store, window: Window, cursor: str | None, limit: int) -> RecordPage[Any]:
    return scan_effects(store, [EffectState.ADMISSION], updated_before_ms=window.stale_before_ms,
                        cursor=cursor, limit=limit)


def _in_flight(store: Store, window: Window, cursor: str | None, limit: int) -> RecordPage[Any]:
    return scan_effects(store, [EffectState.EXECUTING, EffectState.UNKNOWN],
                        updated_before_ms=window.in_flight_before_ms, cursor=cursor, limit=limit)


_SOURCES = (
    _Source("sagas", _review_sagas, lambda r, w: saga_finding(r, w.stale_before_ms)),
    _Source("sagas", _stale_sagas, lambda r, w: saga_finding(r, w.stale_before_ms)),
    _Source("effects", _admitted, lambda r, w: effect_finding(r, w.stale_before_ms)),
    _Source("effects", _in_flight, lambda r, w: effect_finding(r, w.in_flight_before_ms)),
)


def corrupt_finding(corrupt: CorruptRecord) -> Finding:
    """A record that failed read validation, as a finding."""
    return Finding(FindingKind.CORRUPT, corrupt.kind, corrupt.id, reason=corrupt.reason)


def finding_event(finding: Finding, fence: int | None = None) -> FindingEvent:
    """The observer/log event of a finding: ids, states and codes, never its free-text reason."""
    return FindingEvent(
        kind=str(finding.kind), record_kind=finding.record_kind, record_id=finding.record_id,
        state=finding.state, step=finding.step, effect_id=finding.effect_id,
        error_code=finding.error_code, updated_at_ms=finding.updated_at_ms, fence=fence,
    )


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise SagaValidationError(f"limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    return limit


def _check_report(report: object) -> str:
    if report not in REPORTS:
        raise SagaValidationError(f"report must be one of {', '.join(REPORTS)}, got {report!r}")
    assert isinstance(report, str)
    return report


def _encode(report: str, index: int, inner: str | None, window: Window) -> str:
    raw = [_CURSOR_VERSION, report, index, inner, window.stale_before_ms, window.in_flight_before_ms]
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


def _decode(cursor: object) -> tuple[str, int, str | None, Window]:
    # A cursor comes back from callers (CLI, web): bounded, and any garbage is malformed.
    if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR_LENGTH:
        raise SagaValidationError("malformed findings cursor")
    try:
        fields = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        version, report, index, inner, stale, in_flight = fields
    except (ValueError, TypeError, UnicodeError, binascii.Error, RecursionError):
        raise SagaValidationError("malformed findings cursor") from None
    numbers_ok = all(type(n) is int and n >= 0 for n in (index, stale, in_flight))
    if (version != _CURSOR_VERSION or report not in REPORTS or not numbers_ok
            or index >= len(_SOURCES) or not (inner is None or isinstance(inner, str))):
        raise SagaValidationError("malformed findings cursor")
    return report, index, inner, Window(stale, in_flight)


def _start(report: str, window: Window | None, cursor: str | None) -> tuple[int, str | None, Window]:
    if cursor is None:
        if window is None:
            raise SagaValidationError("the first page of a findings walk needs a window")
        return 0, None, window
    started, index, inner, carried = _decode(cursor)
    if started != report or (window is not None and window != carried):
        raise SagaValidationError("this cursor belongs to another findings walk")
    return index, inner, carried


def _relevant(report: str, index: int) -> int:
    """The first source at or after ``index`` that this report walks."""
    while index < len(_SOURCES) and report not in ("all", _SOURCES[index].report):
        index += 1
    return index


def window_of(engine: Engine, now_ms: int | None = None) -> Window:
    """The engine's window now: stale after ``stale_after``; an effect in flight is judged
    only once the longest registered time limit plus the ambiguity grace has passed."""
    now = engine.now() if now_ms is None else now_ms
    timing = engine.settings.timing
    limits = [o.time_limit_ms for o in engine.registry.steps.values() if o.time_limit_ms]
    longest = max([timing.default_time_limit_ms, *limits])
    return Window(max(0, now - timing.stale_ms), max(0, now - longest - timing.grace_ms))


def page_findings(
    store: Store,
    window: Window | None = None,
    *,
    report: str = "all",
    cursor: str | None = None,
    limit: int = 100,
) -> FindingPage:
    """One page of findings (``report``: all, sagas or effects; ``limit`` 1..1000).

    The first page needs ``window``; later pages take it from ``cursor``.
    """
    report, limit = _check_report(report), _check_limit(limit)
    index, inner, window = _start(report, window, cursor)
    found: list[Finding] = []
    index = _relevant(report, index)
    while index < len(_SOURCES) and len(found) < limit:
        source = _SOURCES[index]
        page = source.fetch(store, window, inner, limit - len(found))
        found.extend(corrupt_finding(c) for c in page.corrupt)
        found.extend(f for r in page.records if (f := source.judge(r, window)) is not None)
        if page.cursor is None:
            index, inner = _relevant(report, index + 1), None
        else:
            inner = page.cursor
    done = index >= len(_SOURCES)
    return FindingPage(tuple(found), None if done else _encode(report, index, inner, window))


def all_findings(store: Store, window: Window, *, report: str = "all") -> tuple[Finding, ...]:
    """Every finding; raises SagaValidationError rather than return more than 1000."""
    found: list[Finding] = []
    cursor: str | None = None
    while True:
        # Once 1000 are in hand, ask for one more: only a finding proves there are more.
        limit = min(MAX_SCAN_LIMIT, MAX_SCAN_LIMIT + 1 - len(found))
        page = page_findings(store, None if cursor else window, report=report, cursor=cursor,
                             limit=limit)
        found.extend(page.findings)
        if len(found) > MAX_SCAN_LIMIT:
            raise SagaValidationError(
                f"more than {MAX_SCAN_LIMIT} findings; page with findings(cursor=...) instead"
            )
        if page.cursor is None:
            return tuple(found)
        cursor = page.cursor


def count_sagas(
    store: Store, states: Sequence[SagaState] = OPEN_SAGA_STATES, *, cap: int = 10_000
) -> dict[str, int]:
    """The number of sagas in each state, counted with paged scans and capped at ``cap``."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise SagaValidationError(f"cap must be a positive int, got {cap!r}")
    counts: dict[str, int] = {}
    for state in states:
        name, count, cursor = str(SagaState(state)), 0, None
        while count < cap:
            page = store.scan(SAGA, [name], cursor=cursor, limit=min(MAX_SCAN_LIMIT, cap - count))
            count += len(page.items)
            cursor = page.cursor
            if cursor is None:
                break
        counts[name] = count
    return counts
