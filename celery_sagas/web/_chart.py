"""Geometry of the overview's finishes chart: completions and compensations per minute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._source import Finishes
from ._timeline import Bar, Plot, Tick, clock

__all__ = ["Chart", "chart"]



@dataclass(frozen=True, slots=True)
class Chart(Plot):
    """Stacked bars per minute: completions (bottom) and compensations (top)."""

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
        title = f"{clock(at)[:5]} UTC: {done} completed, {undone} compensated"
        bars += _column(round(_PLOT_LEFT + minute * step, 1), round(max(1.0, step - 1), 1),
                        ((done, "completed"), (undone, "compensated")), unit, title)
    ticks = tuple(Tick(round(_PLOT_LEFT + m * step, 1), clock(finishes.start_ms + m * 60_000)[:5])
                  for m in range(0, minutes, max(1, minutes // 6)))
    return Chart(CHART_WIDTH, CHART_HEIGHT, tuple(bars), ticks, peak, sum(finishes.completed),
                 sum(finishes.compensated))
