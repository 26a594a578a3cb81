"""Paged reports of what needs an operator (docs/design.md §6): findings over sagas and effects.

A walk goes through the walker's pagers in this order, each an index-backed scan of saga
records, so its cost follows the matching records and never every record kept:

1. ``manual-review`` sagas (every one: an operator must act);
2. ``running`` and ``compensating`` sagas not updated since ``stale_before``: each is
   ``ambiguous-execution`` / ``ambiguous-compensation`` (a step still in flight or unknown,
   with its effect id) or ``stale``;
3. and 4. the effects of those same sagas (docs/design.md §2.3): ``admission`` since before
   ``stale_before`` is ``incomplete``; ``executing`` or ``unknown`` since before
   ``in_flight_before`` is ``ambiguous``;
5. sagas in a state this release does not know (on a store that lists its states), each
   ``corrupt``: no other scan would ever show them.

A page holds up to ``limit`` findings (1..1000; a few more when the last saga on it has several
effects to report) and the opaque cursor resumes the walk where the page
ended. The cursor also carries the window of the first page: later pages judge staleness
against the same instants, however long the walk takes. ``all_findings`` walks every page but
raises instead of returning more than 1000.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _values as values
from ._definitions import COMPENSATE_CAPABILITY, EXECUTE_CAPABILITY
from ._engine import Engine
from ._protocol.effects import effects_of
from ._protocol.findings import Finding, FindingKind, effect_finding, saga_finding
from ._records import SAGA, EffectState, SagaRecord, SagaState
from ._scans import CorruptRecord, RecordPage, Scans
from ._walker import walk
from .errors import SagaValidationError
from .stores.base import MAX_SCAN_LIMIT

__all__ = [
    "REPORTS",
    "FindingPage",
    "Findings",
    "Window",
    "corrupt_finding",
    "effect_findings",
    "window_of",
]

REPORTS = ("all", "sagas", "effects")
_CURSOR_VERSION = 2
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


def window_of(engine: Engine, now_ms: int | None = None) -> Window:
    """The engine's window now: stale after ``stale_after``; an effect in flight is judged
    only once the longest registered time limit plus the ambiguity grace has passed."""
    now = engine.now() if now_ms is None else now_ms
    timing = engine.settings.timing
    limits = [o.time_limit_ms for o in engine.registry.steps.values() if o.time_limit_ms]
    longest = max([timing.default_time_limit_ms, *limits])
    return Window(max(0, now - timing.stale_ms), max(0, now - longest - timing.grace_ms))


def _capability(_saga: object, _step: object, compensation: bool) -> str:
    return COMPENSATE_CAPABILITY if compensation else EXECUTE_CAPABILITY


def effect_findings(saga: SagaRecord, window: Window) -> list[Finding]:
    """The findings of a saga's effects: incomplete (never begun, stale) or ambiguous (began,
    silent past every time limit, or unknown)."""
    found = []
    for effect in effects_of(saga, _capability):
        before = window.stale_before_ms if effect.state is EffectState.ADMISSION else \
            window.in_flight_before_ms
        finding = effect_finding(effect, before)
        if finding is not None:
            found.append(finding)
    return found


def corrupt_finding(corrupt: CorruptRecord) -> Finding:
    """A record that failed read validation (or that no configured key decrypts), as a finding."""
    kind = FindingKind.UNDECRYPTABLE if corrupt.undecryptable else FindingKind.CORRUPT
    return Finding(kind, corrupt.kind, corrupt.id, reason=corrupt.reason)


# ---------------------------------------------------------------- the walk

Judge = Callable[[SagaRecord, Window], list[Finding]]


def _saga_judge(saga: SagaRecord, window: Window) -> list[Finding]:
    finding = saga_finding(saga, window.stale_before_ms)
    return [] if finding is None else [finding]


@dataclass(frozen=True, slots=True)
class _Source:
    """One scan of a walk: which sagas, and how each becomes findings."""

    report: str
    states: tuple[SagaState, ...]
    stale_only: bool
    judge: Judge
    strays: bool = False  # sagas in a state none of these scans asks for, reported corrupt


_SOURCES = (
    _Source("sagas", (SagaState.MANUAL_REVIEW,), False, _saga_judge),
    _Source("sagas", (SagaState.RUNNING, SagaState.COMPENSATING), True, _saga_judge),
    _Source("effects", (SagaState.MANUAL_REVIEW,), False, effect_findings),
    _Source("effects", (SagaState.RUNNING, SagaState.COMPENSATING), True, effect_findings),
    _Source("sagas", tuple(SagaState), False, _saga_judge, strays=True),
)


class _Pager:
    """One source bound to a window and the findings of the page being built."""

    def __init__(self, scans: Scans, source: _Source, window: Window, found: list[Finding],
                 limit: int, *, corrupt: bool = True) -> None:
        self._scans, self._source, self._window = scans, source, window
        self._found, self._limit = found, limit
        self._corrupt = corrupt  # report unreadable records (once per walk: not in both reports)

    def _fetch(self, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
        if self._source.strays:
            known = [str(state) for state in self._source.states]
            found = self._scans.strays(SAGA, known, cursor=cursor, limit=limit)
            return RecordPage((), found.corrupt, found.cursor)
        before = self._window.stale_before_ms if self._source.stale_only else None
        return self._scans.sagas(self._source.states, updated_before_ms=before, cursor=cursor,
                                 limit=limit)

    def page(self, cursor: str | None) -> str | None:
        room = self._limit - len(self._found)
        limit = room
        while True:
            page = self._fetch(cursor, limit)
            judged = [self._source.judge(record, self._window) for record in page.records]
            corrupt = page.corrupt if self._corrupt else ()
            used = len(corrupt) + sum(map(len, judged))
            if used <= room or limit == 1:
                break
            # One saga can report several effects: read the page again, as far as fits (and
            # the saga that overflows, so the walk always moves on).
            limit = min(limit - 1, _leading(judged, room - len(corrupt)) + 1)
        self._found.extend(corrupt_finding(c) for c in corrupt)
        self._found.extend(f for findings in judged for f in findings)
        return page.cursor


def _leading(judged: list[list[Finding]], room: int) -> int:
    """How many of the first sagas' findings fit in ``room``."""
    used = 0
    for count, findings in enumerate(judged):
        used += len(findings)
        if used > room:
            return count
    return len(judged)


class Findings:
    """Paged findings over one store's scans."""

    def __init__(self, scans: Scans) -> None:
        self.scans = scans

    def page(self, window: Window | None = None, *, report: str = "all",
             cursor: str | None = None, limit: int = 100) -> FindingPage:
        """One page of findings (``report``: all, sagas or effects; ``limit`` 1..1000).

        The first page needs ``window``; later pages take it from ``cursor``.
        """
        report, limit = _check_report(report), _check_limit(limit)
        position, window = _start(report, window, cursor)
        sources = [s for s in _SOURCES if report in ("all", s.report)]
        found: list[Finding] = []
        pagers = [_Pager(self.scans, s, window, found, limit,
                         corrupt=report != "all" or s.report == "sagas") for s in sources]
        resume = position
        for reached in walk(pagers, position):
            resume = reached
            if len(found) >= limit:
                break
        return FindingPage(tuple(found), None if resume is None else _encode(report, resume, window))

    def all(self, window: Window, *, report: str = "all") -> tuple[Finding, ...]:
        """Every finding; raises SagaValidationError rather than return more than 1000."""
        found: list[Finding] = []
        cursor: str | None = None
        while True:
            # Once 1000 are in hand, ask for one more: only a finding proves there are more.
            limit = min(MAX_SCAN_LIMIT, MAX_SCAN_LIMIT + 1 - len(found))
            page = self.page(None if cursor else window, report=report, cursor=cursor, limit=limit)
            found.extend(page.findings)
            if len(found) > MAX_SCAN_LIMIT:
                raise SagaValidationError(
                    f"more than {MAX_SCAN_LIMIT} findings; page with findings(cursor=...) instead"
                )
            if page.cursor is None:
                return tuple(found)
            cursor = page.cursor


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise SagaValidationError(f"limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    return limit


def _check_report(report: object) -> str:
    if report not in REPORTS:
        raise SagaValidationError(f"report must be one of {', '.join(REPORTS)}, got {report!r}")
    assert isinstance(report, str)
    return report


def _encode(report: str, position: str, window: Window) -> str:
    return values.cursor_text([_CURSOR_VERSION, report, position, window.stale_before_ms,
                               window.in_flight_before_ms])


def _decode(cursor: object) -> tuple[str, str, Window]:
    version, report, position, stale, in_flight = values.cursor_fields(
        cursor, "findings", count=5, max_len=_MAX_CURSOR_LENGTH)
    numbers_ok = all(type(n) is int and n >= 0 for n in (stale, in_flight))
    if version != _CURSOR_VERSION or report not in REPORTS or not numbers_ok \
            or not isinstance(position, str):
        raise SagaValidationError("malformed findings cursor")
    return report, position, Window(stale, in_flight)


def _start(report: str, window: Window | None, cursor: str | None) -> tuple[str | None, Window]:
    if cursor is None:
        if window is None:
            raise SagaValidationError("the first page of a findings walk needs a window")
        return None, window
    started, position, carried = _decode(cursor)
    if started != report or (window is not None and window != carried):
        raise SagaValidationError("this cursor belongs to another findings walk")
    return position, carried
