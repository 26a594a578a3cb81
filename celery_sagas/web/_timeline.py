"""Geometry of the two server-rendered SVG drawings: a saga's timeline and the finishes chart.

Pure functions of records and numbers; the templates draw the shapes (Jinja escapes every
label). Each step carries an effect mark per effect (docs/design.md §2.3: state, when it last
moved, attempt, error code) besides its latest dispatch, start and commit times, so the
timeline draws:

- forward lane: the wait for a worker (dispatched → started), the run (started → committed,
  or to the execution mark's time when it failed, or to now while executing or unknown), an
  approval gate as a wait from the gate's opening to its decision; a step whose forward times
  were overwritten by its compensation starts at the commit of the step before it;
- compensation lane: from the compensator's dispatch to its mark's time once committed or
  failed, or to now while it runs or its outcome is unknown;
- marks: ✕ failed, ? unknown outcome, ⟳ a retry waiting for its time, and xN after an effect
  that took N attempts; each with the effect's error code in its tooltip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from celery_sagas import EffectState, SagaRecord, StepRecord, StepState

from ._source import Finishes

if TYPE_CHECKING:
    from .._records import EffectMark  # the type of StepRecord.execution, not exported

__all__ = ["Bar", "Chart", "Mark", "Timeline", "chart", "timeline"]

LABEL_WIDTH = 190.0
PLOT_WIDTH = 640.0
ROW_HEIGHT = 34.0
TOP = 26.0
MIN_BAR = 3.0
TIMES = "\N{MULTIPLICATION SIGN}"
_FORWARD = (StepState.EXECUTING, StepState.WAITING, StepState.AWAITING_APPROVAL,
            StepState.COMMITTED, StepState.FAILED, StepState.AMBIGUOUS)
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
class Timeline:
    """Everything the timeline template draws."""

    width: float
    height: float
    rows: tuple[Row, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    ticks: tuple[Tick, ...]
    start_ms: int
    end_ms: int


class _Scale:
    """Maps epoch milliseconds onto the plot."""

    def __init__(self, start_ms: int, end_ms: int) -> None:
        self.start, self.span = start_ms, max(1, end_ms - start_ms)

    def x(self, at_ms: int) -> float:
        fraction = min(1.0, max(0.0, (at_ms - self.start) / self.span))
        return round(LABEL_WIDTH + fraction * PLOT_WIDTH, 1)

    def bar(self, begin: int, end: int, y: float, height: float, kind: str, title: str) -> Bar:
        left = self.x(begin)
        width = max(MIN_BAR, self.x(max(begin, end)) - left)
        return Bar(left, y, round(width, 1), height, kind, title)


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S")


def _tick(ms: int, span_ms: int) -> str:
    """A tick label: seconds, or milliseconds when the whole span is under 20 seconds."""
    if span_ms >= 20_000:
        return _clock(ms)
    return _clock(ms) + f".{ms % 1000:03d}"


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


def _forward(record: SagaRecord, index: int, now: int, scale: _Scale,
             y: float) -> tuple[list[Bar], list[Mark]]:
    step = record.steps[index]
    begin = _forward_begin(record, index)
    started = step.started_at_ms if step.state in _FORWARD else None
    bars: list[Bar] = []
    marks: list[Mark] = []
    top, height = y + 5, 12.0
    if step.approval_id is not None:
        end = step.committed_at_ms or (now if step.state is StepState.AWAITING_APPROVAL else begin)
        bars.append(scale.bar(begin, end, top, height, "approval", f"{step.name}: approval gate"))
        if step.state is StepState.FAILED:  # denied or expired; a gate has no effect marks
            right = bars[-1].x + bars[-1].width + 8
            marks.append(Mark(right, top + 10, "✕", "failed", f"gate closed ({step.error_code})"))
    elif step.task.startswith("celery_sagas."):  # a timer or a signal wait: no task runs
        end = step.committed_at_ms or (now if step.state is StepState.WAITING else begin)
        bars.append(scale.bar(begin, end, top, height, "wait", f"{step.name}: {step.state}"))
    elif step.state is StepState.EXECUTING and started is None and step.next_attempt_at_ms:
        bars.append(scale.bar(begin, step.next_attempt_at_ms, top, height, "retry",
                              f"{step.name}: retry due at {_clock(step.next_attempt_at_ms)} UTC"))
        marks.append(Mark(scale.x(step.next_attempt_at_ms) + 8, top + 10, "⟳", "retry",
                          "retry waiting"))
    else:
        if started is not None and started > begin:
            bars.append(scale.bar(begin, started, top, height, "wait", f"{step.name}: waiting for a worker"))
        run_from = started if started is not None else begin
        state = _state(step.execution)
        kind = "unknown" if state is EffectState.UNKNOWN else "run"
        bars.append(scale.bar(run_from, _forward_end(step, run_from, now), top, height, kind,
                              f"{step.name}: execution {state or step.state}"))
    marks.extend(_outcome_marks(step.execution, step.attempts, bars[-1], top + 10, "execution"))
    return bars, marks


def _forward_end(step: StepRecord, run_from: int, now: int) -> int:
    if step.committed_at_ms is not None:
        return step.committed_at_ms
    mark = step.execution
    if mark is not None and mark.state is EffectState.FAILED:
        return max(run_from, mark.at_ms)
    if step.state in (StepState.EXECUTING, StepState.WAITING, StepState.AWAITING_APPROVAL,
                      StepState.AMBIGUOUS):
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


def _compensation(record: SagaRecord, step: StepRecord, now: int, scale: _Scale,
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
    if step.state is StepState.COMPENSATION_FAILED and step.next_attempt_at_ms:
        due = _clock(step.next_attempt_at_ms)
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
    retries = [s.next_attempt_at_ms for s in record.steps if s.next_attempt_at_ms]
    return record.created_at_ms, max([end, *retries])


def timeline(record: SagaRecord, now_ms: int) -> Timeline:
    """The timeline of ``record`` as seen at ``now_ms``."""
    start, end = _span(record, now_ms)
    scale = _Scale(start, end)
    rows, bars, marks = [], [], []
    for index, step in enumerate(record.steps):
        y = TOP + index * ROW_HEIGHT
        rows.append(Row(y, step.name, str(step.state)))
        for drawn in (_forward(record, index, now_ms, scale, y),
                      _compensation(record, step, now_ms, scale, y)):
            bars.extend(drawn[0])
            marks.extend(drawn[1])
    ticks = tuple(Tick(scale.x(at), _tick(at, end - start))
                  for at in (start + (end - start) * i // 4 for i in range(5)))
    height = TOP + max(1, len(record.steps)) * ROW_HEIGHT + 6
    return Timeline(LABEL_WIDTH + PLOT_WIDTH + 60, height, tuple(rows), tuple(bars), tuple(marks),
                    ticks, start, end)


# ---------------------------------------------------------------- the finishes chart


@dataclass(frozen=True, slots=True)
class Chart:
    """Stacked bars per minute: completions (bottom) and compensations (top)."""

    width: float
    height: float
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    peak: int
    total_completed: int
    total_compensated: int


CHART_WIDTH = 720.0
CHART_HEIGHT = 140.0
_PLOT_TOP, _PLOT_BOTTOM, _PLOT_LEFT = 10.0, 116.0, 36.0


def _column(left: float, width: float, counts: Sequence[tuple[int, str]],
            unit: float, title: str) -> list[Bar]:
    bars, bottom = [], _PLOT_BOTTOM
    for count, kind in counts:
        if count:
            height = round(count * unit, 1)
            bottom -= height
            bars.append(Bar(left, round(bottom, 1), width, height, kind, title))
    return bars


def chart(finishes: Finishes) -> Chart:
    """The finishes chart: one column per minute, oldest on the left."""
    minutes = len(finishes.completed)
    peak = max([1, *(a + b for a, b in zip(finishes.completed, finishes.compensated, strict=True))])
    unit = (_PLOT_BOTTOM - _PLOT_TOP) / peak
    step = (CHART_WIDTH - _PLOT_LEFT - 10) / max(1, minutes)
    bars: list[Bar] = []
    for minute, (done, undone) in enumerate(zip(finishes.completed, finishes.compensated, strict=True)):
        at = finishes.start_ms + minute * 60_000
        title = f"{_clock(at)[:5]} UTC: {done} completed, {undone} compensated"
        bars += _column(round(_PLOT_LEFT + minute * step, 1), round(max(1.0, step - 1), 1),
                        ((done, "completed"), (undone, "compensated")), unit, title)
    ticks = tuple(Tick(round(_PLOT_LEFT + m * step, 1), _clock(finishes.start_ms + m * 60_000)[:5])
                  for m in range(0, minutes, max(1, minutes // 6)))
    return Chart(CHART_WIDTH, CHART_HEIGHT, tuple(bars), ticks, peak, sum(finishes.completed),
                 sum(finishes.compensated))
