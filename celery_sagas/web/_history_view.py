"""A saga's timeline drawn from its history (docs/design.md §2.6), which is never rewritten.

The record keeps only each step's latest times, so after a resolve an ambiguity would vanish
and after a cancel an approval's wait would collapse; the history keeps both. Each entry
opens or closes a span of its step's row: a step's intent opens the wait for a worker, its
claim the run; a commit, failure or ambiguity ends the run (an ambiguity opens the unknown
outcome until an operator resolves it); a timer, a signal wait, a child or an approval gate
is a wait of its own kind from its opening to its end, or to the saga's change of state
that ended it (a cancel); a compensation runs in the row's lower lane. Operator actions are
marked with who took them and why. Spans still open end at ``now`` (or at the saga's last
write once it is final). The scale leaves long idle stretches out (``_timeline.Scale``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from celery_sagas import SagaRecord

from .._records import HistoryEntry, HistoryEvent
from ._timeline import (
    LABEL_WIDTH,
    PLOT_WIDTH,
    ROW_HEIGHT,
    TOP,
    Mark,
    Row,
    Scale,
    Timeline,
    clock,
    ticks_of,
)

__all__ = ["Span", "history_timeline"]

E = HistoryEvent
_HELD_OPEN = {E.TIMER_SET: "timer", E.SIGNAL_WAIT: "signal", E.CHILD_STARTED: "child",
              E.APPROVAL_REQUESTED: "approval"}
_HELD_CLOSE = (E.TIMER_FIRED, E.SIGNAL_CONSUMED, E.SIGNAL_TIMED_OUT, E.CHILD_ENDED,
               E.APPROVAL_DECIDED)
_OPERATOR = (E.RESOLVE, E.RESUME, E.CANCEL, E.APPROVE, E.DENY)
_IDLE_KINDS = ("timer", "signal", "child", "approval", "unknown", "retry")


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of one step's row in time: ``lane`` 0 forward, 1 compensation."""

    row: int
    lane: int
    begin_ms: int
    end_ms: int
    kind: str
    title: str


@dataclass(frozen=True, slots=True)
class Point:
    """A mark at one instant of a row (``row`` None: the saga's, drawn on the top lane)."""

    row: int | None
    lane: int
    at_ms: int
    symbol: str
    kind: str
    title: str


@dataclass
class _Open:
    """What is open on one row: since when, of which kind, with which tooltip."""

    forward: tuple[int, str, str] | None = None
    compensation: tuple[int, str, str] | None = None
    held: tuple[int, str, str, int | None] | None = None


@dataclass
class _Drawing:
    """Spans and points collected while walking the history."""

    rows: dict[str, int]
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    open: dict[int, _Open] = field(default_factory=dict)

    def state(self, row: int) -> _Open:
        return self.open.setdefault(row, _Open())

    def close(self, row: int, lane: int, at: int, suffix: str = "") -> None:
        state = self.state(row)
        if lane == 0 and state.forward is not None:
            begin, kind, title = state.forward
            self.spans.append(Span(row, 0, begin, at, kind, title + suffix))
            state.forward = None
        if lane == 1 and state.compensation is not None:
            begin, kind, title = state.compensation
            self.spans.append(Span(row, 1, begin, at, kind, title + suffix))
            state.compensation = None

    def close_held(self, row: int, at: int, how: str) -> None:
        state = self.state(row)
        if state.held is not None:
            begin, kind, title, _ = state.held
            self.spans.append(Span(row, 0, begin, at, kind, f"{title}: {how}"))
            state.held = None


def _who(entry: HistoryEntry) -> str:
    who = f" by {entry.actor}" if entry.actor else ""
    return who + (f": {entry.reason}" if entry.reason else "")


def _step_entry(d: _Drawing, row: int, e: HistoryEntry) -> None:
    """Open or close the spans of ``e``'s step."""
    state, at, name, event = d.state(row), e.at_ms, e.step or "", e.event
    code = f" ({e.code})" if e.code else ""
    if event in (E.INTENT, E.RESENT, E.CLAIM_WITHDRAWN):  # withdrawn: the body never began
        d.close(row, 0, at)
        state.forward = (at, "wait", f"{name}: waiting for a worker")
    elif event is E.CLAIMED:
        d.close(row, 0, at)
        state.forward = (at, "run", f"{name}: attempt {e.attempt} running")
    elif event is E.COMMITTED:
        d.close(row, 0, at, ", committed")
    elif event in (E.FAILED, E.AMBIGUOUS):
        d.close(row, 0, at)
        if state.held is not None:
            d.close_held(row, at, f"failed{code}")
        failed = event is E.FAILED
        d.points.append(Point(row, 0, at, "✕" if failed else "?", "failed" if failed else
                              "ambiguous", f"{name}: {'failed' if failed else 'outcome unknown'}"
                              f"{code} at {clock(at)} UTC"))
        if not failed:
            state.forward = (at, "unknown", f"{name}: outcome unknown{code}")
    elif event is E.RETRY:
        d.close(row, 0, at)
        state.forward = (at, "retry", f"{name}: retry due at {clock(e.due_ms or at)} UTC")
    elif event in _HELD_OPEN:
        until = f" until {clock(e.due_ms)} UTC" if e.due_ms else ""
        what = f" {e.code or e.ref or ''}".rstrip()
        state.held = (at, _HELD_OPEN[E(event)], f"{name}: {_HELD_OPEN[E(event)]}{what}{until}",
                      e.due_ms)
    elif event in _HELD_CLOSE:
        d.close_held(row, at, str(event).replace("_", " ") + (f" ({e.state})" if e.state else "")
                     + _who(e))
    elif event is E.COMPENSATION_INTENT:
        d.close(row, 1, at)
        state.compensation = (at, "undo", f"{name}: compensation sent")
    elif event is E.COMPENSATION_CLAIMED:  # one bar from the compensation's intent on
        begin = state.compensation[0] if state.compensation is not None else at
        state.compensation = (begin, "undo", f"{name}: compensation attempt {e.attempt}")
    elif event is E.COMPENSATED:
        d.close(row, 1, at, ", compensated")
    elif event in (E.COMPENSATION_FAILED, E.COMPENSATION_AMBIGUOUS):
        d.close(row, 1, at)
        unknown = event is E.COMPENSATION_AMBIGUOUS
        d.points.append(Point(row, 1, at, "?" if unknown else "✕", "ambiguous" if unknown else
                              "failed", f"{name}: compensation {'unknown' if unknown else 'failed'}"
                              f"{code} at {clock(at)} UTC"))
        if unknown:
            state.compensation = (at, "unknown", f"{name}: compensation outcome unknown{code}")


def _operator(d: _Drawing, e: HistoryEntry) -> None:
    """An operator's action: a mark on its step's row (or the saga's), naming who and why."""
    row = d.rows.get(e.step or "") if e.step else None
    outcome = f" {e.state}" if e.state else ""
    title = f"{e.event}{outcome}{_who(e)} at {clock(e.at_ms)} UTC"
    if row is not None and e.event is E.RESOLVE:
        state = d.state(row)
        lane = 0 if state.forward is not None and state.forward[1] == "unknown" else 1
        d.close(row, lane, e.at_ms, f"; resolved{outcome}{_who(e)}")
    d.points.append(Point(row, 0, e.at_ms, "✎", "operator", title))


def _saga_state(d: _Drawing, e: HistoryEntry) -> None:
    """The saga stopped going forward (cancelled, compensating, final): waits end here."""
    if e.state in ("compensating", "compensated", "completed"):
        for row in list(d.open):
            d.close_held(row, e.at_ms, f"ended, saga {e.state}")


def spans(record: SagaRecord, now_ms: int) -> _Drawing:
    """The spans and marks of ``record``'s history as seen at ``now_ms``."""
    d = _Drawing({step.name: index for index, step in enumerate(record.steps)})
    for e in record.history:
        if e.event in _OPERATOR:
            _operator(d, e)
        elif e.event is E.STATE:
            _saga_state(d, e)
        elif e.step is not None and e.step in d.rows:
            _step_entry(d, d.rows[e.step], e)
    end = record.updated_at_ms if record.state.final else max(now_ms, record.updated_at_ms)
    for row in list(d.open):
        d.close(row, 0, end)
        d.close(row, 1, end)
        d.close_held(row, end, "waiting")
    return d


def history_timeline(record: SagaRecord, now_ms: int) -> Timeline:
    """The timeline of ``record`` drawn from its history (``record.history`` non-empty)."""
    d = spans(record, now_ms)
    start = record.created_at_ms
    end = record.updated_at_ms if record.state.final else max(now_ms, record.updated_at_ms)
    busy = [(s.begin_ms, s.end_ms) for s in d.spans if s.kind not in _IDLE_KINDS]
    busy += [(e.at_ms, e.at_ms) for e in record.history] + [(start, start), (end, end)]
    scale = Scale(start, end, busy)
    bars, marks = [], []
    for s in d.spans:
        y = TOP + s.row * ROW_HEIGHT + (5 if s.lane == 0 else 20)
        bars.append(scale.bar(s.begin_ms, s.end_ms, y, 12.0 if s.lane == 0 else 8.0, s.kind,
                              s.title))
    for p in d.points:
        y = (TOP + p.row * ROW_HEIGHT if p.row is not None else TOP - 8) + (15 if p.lane == 0 else 28)
        marks.append(Mark(scale.x(p.at_ms), y, p.symbol, p.kind, p.title))
    rows = tuple(Row(TOP + i * ROW_HEIGHT, step.name, str(step.state))
                 for i, step in enumerate(record.steps))
    height = TOP + max(1, len(record.steps)) * ROW_HEIGHT + 6
    return Timeline(LABEL_WIDTH + PLOT_WIDTH + 60, height, tuple(bars), ticks_of(scale, start, end),
                    rows=rows, marks=tuple(marks), start_ms=start, end_ms=end, gaps=scale.gaps)
