"""Geometry of a saga's timeline, drawn as SVG on the server (the finishes chart: ``_chart``).

Pure functions of records and numbers; the templates draw the shapes (Jinja escapes every
label). Each step carries an effect mark per effect (docs/design.md §2.3: state, when it last
moved, attempt, error code) besides its latest dispatch, start and commit times, so the
timeline draws:

- forward lane: the wait for a worker (dispatched → started), the run (started → committed,
  or to the execution mark's time when it failed, or to now while executing or unknown), an
  approval gate as a wait from the gate's opening to its decision, a timer, a signal wait and
  a child saga each as its own kind of wait, with a ◆ at its wake-up or timeout; a step whose forward times
  were overwritten by its compensation starts at the commit of the step before it;
- compensation lane: from the compensator's dispatch to its mark's time once committed or
  failed, or to now while it runs or its outcome is unknown;
- marks: ✕ failed, ? unknown outcome, ⟳ a retry waiting for its time (none in manual review:
  nothing is retried there), and xN after an effect that took N attempts; each with the
  effect's error code in its tooltip;
- the scale: piecewise, each long idle stretch a marked break (``Scale``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from celery_sagas import EffectState, SagaRecord, SagaState, StepRecord, StepState

from .._protocol.kinds import HELD_STATES, kind_of

if TYPE_CHECKING:
    from .._records import EffectMark  # the type of StepRecord.execution, not exported

__all__ = [
    "Bar",
    "Gap",
    "Mark",
    "Plot",
    "Row",
    "Scale",
    "Tick",
    "Timeline",
    "clock",
    "ticks_of",
    "timeline",
]

LABEL_WIDTH = 190.0
PLOT_WIDTH = 640.0
ROW_HEIGHT = 34.0
TICK_GAP = 90.0
TOP = 26.0
MIN_BAR = 3.0
BREAK_WIDTH = 26.0
GAP_SHARE = 0.25  # an idle stretch longer than this share of the span becomes a break
MIN_GAP_MS = 2_000
MAX_GAPS = 6
TIMES = "\N{MULTIPLICATION SIGN}"
_FORWARD = (StepState.EXECUTING, *HELD_STATES, StepState.COMMITTED, StepState.FAILED,
            StepState.AMBIGUOUS)
_COMPENSATION = (StepState.COMPENSATING, StepState.COMPENSATION_FAILED, StepState.COMPENSATED)


@dataclass(frozen=True, slots=True)
class Bar:
    """A rectangle: ``kind`` is its CSS class (run, wait, approval, retry, unknown, undo)."""

    x: float
    y: float
    width: float
    height: float
    kind: str
    title: str


@dataclass(frozen=True, slots=True)
class Mark:
    """A symbol at a point (✕, ?, ⟳, xN) with its CSS class and tooltip."""

    x: float
    y: float
    symbol: str
    kind: str
    title: str


@dataclass(frozen=True, slots=True)
class Row:
    """One step's row: its name and where the row starts."""

    y: float
    label: str
    state: str


@dataclass(frozen=True, slots=True)
class Tick:
    """A time axis tick."""

    x: float
    label: str


@dataclass(frozen=True, slots=True)
class Plot:
    """An SVG plot of bars over a time axis: its size, its bars and the axis's ticks."""

    width: float
    height: float
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]


@dataclass(frozen=True, slots=True)
class Timeline(Plot):
    """Everything the timeline template draws."""

    rows: tuple[Row, ...]
    marks: tuple[Mark, ...]
    start_ms: int
    end_ms: int
    gaps: tuple[Gap, ...] = ()


@dataclass(frozen=True, slots=True)
class Gap:
    """A long idle stretch the scale leaves out: drawn as a marked break of ``BREAK_WIDTH``."""

    x: float
    start_ms: int
    end_ms: int

    @property
    def label(self) -> str:
        """How long nothing happened, in words."""
        return f"idle {_duration(self.end_ms - self.start_ms)}"


class Scale:
    """Maps epoch milliseconds onto the plot, piecewise: an idle stretch between two moments of
    activity longer than ``MIN_GAP_MS`` and than ``GAP_SHARE`` of the time left once longer
    ones are left out becomes a break of fixed width (``MAX_GAPS`` at most), so seconds of
    work are not squeezed into pixels by hours of waiting."""

    def __init__(self, start_ms: int, end_ms: int, busy: Sequence[tuple[int, int]] = ()) -> None:
        self.start, self.end = start_ms, max(start_ms + 1, end_ms)
        span = self.end - self.start
        gaps: list[tuple[int, int]] = []
        active = span
        # Longest first, each judged against what is left once the longer ones are left out.
        for a, b in sorted(_idle(self.start, self.end, busy), key=lambda g: g[0] - g[1])[:MAX_GAPS]:
            if b - a > max(MIN_GAP_MS, active * GAP_SHARE):
                gaps.append((a, b))
                active -= b - a
        gaps.sort()
        active = max(1, active)
        self._unit = (PLOT_WIDTH - BREAK_WIDTH * len(gaps)) / active
        self._gaps = gaps
        self.gaps = tuple(Gap(self._x_before(a), a, b) for a, b in gaps)

    def _x_before(self, at_ms: int) -> float:
        """x of ``at_ms``, counting active time and the breaks before it."""
        skipped = 0.0
        breaks = 0.0
        for a, b in self._gaps:
            if at_ms <= a:
                break
            if at_ms < b:  # inside a break: proportionally across it
                return round(LABEL_WIDTH + (a - self.start - skipped) * self._unit + breaks
                             + BREAK_WIDTH * (at_ms - a) / (b - a), 1)
            skipped += b - a
            breaks += BREAK_WIDTH
        return round(LABEL_WIDTH + (at_ms - self.start - skipped) * self._unit + breaks, 1)

    def x(self, at_ms: int) -> float:
        """The x of ``at_ms`` (clamped to the span)."""
        return self._x_before(min(self.end, max(self.start, at_ms)))

    def bar(self, begin: int, end: int, y: float, height: float, kind: str, title: str) -> Bar:
        """The bar from ``begin`` to ``end`` (at least ``MIN_BAR`` wide)."""
        left = self.x(begin)
        width = max(MIN_BAR, self.x(max(begin, end)) - left)
        return Bar(left, y, round(width, 1), height, kind, title)


def _idle(start: int, end: int, busy: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stretches of [start, end] no busy interval (or moment: a zero-length one) covers."""
    idle, at = [], start
    for a, b in sorted((max(start, a), min(end, b)) for a, b in busy if b >= start and a <= end):
        if a > at:
            idle.append((at, a))
        at = max(at, b)
    if end > at:
        idle.append((at, end))
    return idle


def _duration(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def clock(ms: int) -> str:
    """``HH:MM:SS`` of epoch milliseconds, UTC."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S")


def _tick(ms: int, span_ms: int) -> str:
    """A tick label: seconds, or milliseconds when the whole span is under 20 seconds."""
    if span_ms >= 20_000:
        return clock(ms)
    return clock(ms) + f".{ms % 1000:03d}"


def _forward_begin(record: SagaRecord, index: int) -> int:
    step = record.steps[index]
    if step.state in _FORWARD and step.dispatched_at_ms is not None:
        return step.dispatched_at_ms
    if step.state in _FORWARD and step.started_at_ms is not None:
        return step.started_at_ms
    earlier = [s.committed_at_ms for s in record.steps[:index]
               if s.committed_at_ms is not None and (s.group is None or s.group != step.group)]
    return max([record.created_at_ms, *earlier])


def _state(mark: EffectMark | None) -> EffectState | None:
    return None if mark is None else mark.state


def _forward(record: SagaRecord, index: int, now: int, scale: Scale,
             y: float) -> tuple[list[Bar], list[Mark]]:
    step = record.steps[index]
    begin = _forward_begin(record, index)
    started = step.started_at_ms if step.state in _FORWARD else None
    bars: list[Bar] = []
    marks: list[Mark] = []
    top, height = y + 5, 12.0
    kind = kind_of(step)
    if step.approval_id is not None:
        end = step.committed_at_ms or (now if step.state is kind.held_state else begin)
        bars.append(scale.bar(begin, end, top, height, "approval", f"{step.name}: approval gate"))
        if step.state is StepState.FAILED:  # denied or expired; a gate has no effect marks
            right = bars[-1].x + bars[-1].width + 8
            marks.append(Mark(right, top + 10, "✕", "failed", f"gate closed ({step.error_code})"))
    elif kind.held:  # a timer, a signal wait, a child, any held kind: no task runs
        end = step.committed_at_ms or (now if step.state is kind.held_state else begin)
        bars.append(scale.bar(begin, end, top, height, kind.name, _held(step)))
        if step.wake_at_ms is not None and step.state is kind.held_state:
            marks.append(Mark(scale.x(step.wake_at_ms), top + 10, "◆", "deadline",
                              f"{step.name} {kind.deadline} at {clock(step.wake_at_ms)} UTC"))
    elif step.state is StepState.EXECUTING and started is None and step.next_attempt_at_ms:
        bars.append(scale.bar(begin, step.next_attempt_at_ms, top, height, "retry",
                              f"{step.name}: retry due at {clock(step.next_attempt_at_ms)} UTC"))
        marks.append(Mark(scale.x(step.next_attempt_at_ms) + 8, top + 10, "⟳", "retry",
                          "retry waiting"))
    else:
        if started is not None and started > begin:
            bars.append(scale.bar(begin, started, top, height, "wait", f"{step.name}: waiting for a worker"))
        run_from = started if started is not None else begin
        state = _state(step.execution)
        drawn = "unknown" if state is EffectState.UNKNOWN else "run"
        bars.append(scale.bar(run_from, _forward_end(step, run_from, now), top, height, drawn,
                              f"{step.name}: execution {state or step.state}"))
    marks.extend(_outcome_marks(step.execution, step.attempts, bars[-1], top + 10, "execution"))
    return bars, marks


def _held(step: StepRecord) -> str:
    """The tooltip of a step no task runs: what its kind says it does, until when."""
    kind = kind_of(step)
    until = "" if step.wake_at_ms is None else f", {kind.deadline} at {clock(step.wake_at_ms)} UTC"
    return f"{step.name}: {kind.describe(step)}{until} ({step.state})"


def _forward_end(step: StepRecord, run_from: int, now: int) -> int:
    if step.committed_at_ms is not None:
        return step.committed_at_ms
    mark = step.execution
    if mark is not None and mark.state is EffectState.FAILED:
        return max(run_from, mark.at_ms)
    if step.state in (StepState.EXECUTING, *HELD_STATES, StepState.AMBIGUOUS):
        return now
    return run_from


def _outcome_marks(mark: EffectMark | None, attempts: int, bar: Bar, y: float,
                   what: str) -> list[Mark]:
    """✕ or ? after the bar of an effect that failed or whose outcome is unknown, then xN."""
    right = bar.x + bar.width + 8
    marks = []
    code = f" ({mark.error_code})" if mark is not None and mark.error_code else ""
    if mark is not None and mark.state is EffectState.FAILED:
        marks.append(Mark(right, y, "✕", "failed", f"{what} failed{code}"))
    elif mark is not None and mark.state is EffectState.UNKNOWN:
        marks.append(Mark(right, y, "?", "ambiguous", f"{what} outcome unknown{code}"))
    tries = max(attempts, mark.attempt if mark is not None else 0)
    if tries > 1:
        marks.append(Mark(right + (14 if marks else 0), y, f"{TIMES}{tries}", "attempts",
                          f"{what}: {tries} attempts"))
    return marks


def _compensation(record: SagaRecord, step: StepRecord, now: int, scale: Scale,
                  y: float) -> tuple[list[Bar], list[Mark]]:
    mark = step.compensation
    if step.state not in _COMPENSATION or mark is None:
        return [], []
    begin = step.dispatched_at_ms if step.dispatched_at_ms is not None else mark.at_ms
    top, height = y + 20, 8.0
    if mark.state in (EffectState.COMMITTED, EffectState.FAILED):
        end = mark.at_ms
    elif step.state is StepState.COMPENSATION_FAILED:
        end = max(begin, mark.at_ms)
    else:
        end = now
    kind = "unknown" if mark.state is EffectState.UNKNOWN else "undo"
    bars = [scale.bar(begin, end, top, height, kind,
                      f"{step.name}: compensation {mark.state} ({step.state})")]
    if step.state is StepState.COMPENSATION_FAILED and step.next_attempt_at_ms and \
            record.state is not SagaState.MANUAL_REVIEW:  # in review nothing is retried
        due = clock(step.next_attempt_at_ms)
        bars.append(scale.bar(end, step.next_attempt_at_ms, top, height, "retry",
                              f"{step.name}: compensation retry due at {due} UTC"))
    failed = step.state is StepState.COMPENSATION_FAILED
    shown = mark if not failed else _failed(mark, step.error_code)
    return bars, _outcome_marks(shown, step.compensation_attempts, bars[0], top + 8, "compensation")


def _failed(mark: EffectMark, code: str | None) -> EffectMark:
    """A compensator that raised keeps its effect executing (it is retried under the same
    id); the timeline marks the failed try all the same."""
    return replace(mark, state=EffectState.FAILED, error_code=mark.error_code or code)


def _span(record: SagaRecord, now: int) -> tuple[int, int]:
    end = record.updated_at_ms if record.state.final else max(now, record.updated_at_ms)
    later = [] if record.state.final or record.state is SagaState.MANUAL_REVIEW else [
        t for s in record.steps for t in (s.next_attempt_at_ms, s.wake_at_ms) if t]
    return record.created_at_ms, max([end, *later])


def _busy(record: SagaRecord, now: int) -> list[tuple[int, int]]:
    """When something happened or ran: each step's work (sent to done; a timer, a signal
    wait, a child or a gate only where it began and ended) and every instant recorded. The
    rest is idle time the scale may leave out."""
    busy = [(t, t) for t in (record.created_at_ms, record.updated_at_ms, now)]
    for step in record.steps:
        times = [t for t in (step.dispatched_at_ms, step.started_at_ms, step.committed_at_ms,
                             step.next_attempt_at_ms, step.wake_at_ms) if t]
        times += [m.at_ms for m in (step.execution, step.compensation) if m is not None]
        busy += [(t, t) for t in times]
        if times and not step.task.startswith("celery_sagas."):
            running = step.state in (StepState.EXECUTING, StepState.COMPENSATING)
            busy.append((min(times), now if running else max(times)))
    busy += [(signal.sent_at_ms, signal.sent_at_ms) for signal in record.signals]
    return busy


def timeline(record: SagaRecord, now_ms: int) -> Timeline:
    """The timeline of ``record`` as seen at ``now_ms``."""
    start, end = _span(record, now_ms)
    scale = Scale(start, end, _busy(record, now_ms))
    rows, bars, marks = [], [], []
    for index, step in enumerate(record.steps):
        y = TOP + index * ROW_HEIGHT
        rows.append(Row(y, step.name, str(step.state)))
        for drawn in (_forward(record, index, now_ms, scale, y),
                      _compensation(record, step, now_ms, scale, y)):
            bars.extend(drawn[0])
            marks.extend(drawn[1])
    height = TOP + max(1, len(record.steps)) * ROW_HEIGHT + 6
    return Timeline(LABEL_WIDTH + PLOT_WIDTH + 60, height, tuple(bars), ticks_of(scale, start, end),
                    rows=tuple(rows), marks=tuple(marks), start_ms=start, end_ms=end,
                    gaps=scale.gaps)


def ticks_of(scale: Scale, start: int, end: int) -> tuple[Tick, ...]:
    """Ticks at the start, around each break and at the end, with more in between where the
    plot has room; none closer than ``TICK_GAP`` pixels to the one before."""
    moments = [start]
    edges = [start, *(t for gap in scale.gaps for t in (gap.start_ms, gap.end_ms)), end]
    for a, b in zip(edges[::2], edges[1::2], strict=False):
        moments += [a + (b - a) * i // 4 for i in range(5)]
    ticks: list[Tick] = []
    for at in sorted(set(moments)):
        x = scale.x(at)
        if not ticks or x - ticks[-1].x >= TICK_GAP:
            ticks.append(Tick(x, _tick(at, end - start)))
    return tuple(ticks)
