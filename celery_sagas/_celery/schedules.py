"""The ticks of a saga schedule (docs/concepts.md "Scheduled sagas").

A tick is named by its **slot**: the scheduled time it stands for, the same in every process
that computes it. For an interval the slots are the multiples of the interval since the epoch
(``slot_at(t) = t - t mod interval``), and beat is given ``AlignedInterval``, which fires once
per slot right after its boundary, so two beats started at different moments tick together.
For a ``crontab`` the slot is its latest due minute at or before ``t`` (in the app's timezone),
which is what beat fires on. Whoever receives a tick computes ``slot_at(sent_at)``: two beats
that both send the tick of 09:00 name the same slot, so they name the same saga.
"""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any, Protocol

from celery.schedules import crontab, schedstate, schedule

from ..errors import SagaConfigurationError

__all__ = ["AlignedInterval", "CrontabSlots", "IntervalSlots", "Slots", "slots_of"]

# A crontab naming a day that comes rarely (29 February on a Monday) is searched this far back.
_SEARCH_DAYS = 366 * 28


class Slots(Protocol):
    """The slots of one schedule, and the beat schedule that fires on them."""

    def slot_at(self, at_ms: int, tz: tzinfo) -> int:
        """The latest slot at or before ``at_ms`` (ms since the epoch)."""
        ...

    def beat_schedule(self) -> Any:
        """What to put in the beat entry's ``schedule``."""
        ...


class IntervalSlots:
    """Every ``interval_ms`` since the epoch."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms

    def slot_at(self, at_ms: int, tz: tzinfo) -> int:
        """``at_ms`` floored to a multiple of the interval."""
        return at_ms - at_ms % self.interval_ms

    def beat_schedule(self) -> AlignedInterval:
        """A beat schedule that fires right after each slot's boundary."""
        return AlignedInterval(timedelta(milliseconds=self.interval_ms))

    def __repr__(self) -> str:
        return f"IntervalSlots({self.interval_ms} ms)"


class CrontabSlots:
    """The due minutes of a Celery ``crontab``."""

    def __init__(self, cron: crontab) -> None:
        self.cron = cron

    def slot_at(self, at_ms: int, tz: tzinfo) -> int:
        """The latest minute at or before ``at_ms`` that the crontab names, in ``tz``."""
        local = datetime.fromtimestamp(at_ms // 1000, tz).replace(second=0, microsecond=0)
        day = local.date()
        for _ in range(_SEARCH_DAYS):
            found = self._last_in_day(day, local, tz)
            if found is not None:
                return int(found.timestamp()) * 1000
            day -= timedelta(days=1)
        raise SagaConfigurationError(f"crontab {self.cron!r} names no minute in the past 28 years")

    def _last_in_day(self, day: date, limit: datetime, tz: tzinfo) -> datetime | None:
        cron = self.cron
        if day.month not in cron.month_of_year or day.day not in cron.day_of_month \
                or day.isoweekday() % 7 not in cron.day_of_week:
            return None
        today = day == limit.date()
        for hour in sorted(cron.hour, reverse=True):
            if today and hour > limit.hour:
                continue
            late = limit.minute if today and hour == limit.hour else 59
            minutes = [m for m in cron.minute if m <= late]
            if minutes:
                return datetime(day.year, day.month, day.day, hour, max(minutes), tzinfo=tz)
        return None

    def beat_schedule(self) -> crontab:
        """The crontab itself: beat fires on its due minutes."""
        return self.cron

    def __repr__(self) -> str:
        return f"CrontabSlots({self.cron!r})"


class AlignedInterval(schedule):  # type: ignore[misc]
    """A Celery interval schedule due once per multiple of ``run_every`` since the epoch, not
    ``run_every`` after the last run: every beat fires at the same moments."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time until the next boundary after the slot of ``last_run_at``."""
        interval = self.run_every.total_seconds()
        last = self.maybe_make_aware(last_run_at).timestamp()
        boundary = (math.floor(last / interval) + 1) * interval
        return timedelta(seconds=boundary - self.maybe_make_aware(self.now()).timestamp())

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        """Due when a boundary passed since the last run; check again at the next boundary."""
        interval = self.run_every.total_seconds()
        now = self.maybe_make_aware(self.now()).timestamp()
        last = self.maybe_make_aware(last_run_at).timestamp()
        until_next = (math.floor(now / interval) + 1) * interval - now
        due = math.floor(now / interval) > math.floor(last / interval)
        state: tuple[bool, float] = schedstate(is_due=due, next=until_next)
        return state

    def __repr__(self) -> str:
        return f"<aligned freq: {self.human_seconds}>"


def slots_of(value: object) -> Slots:
    """The slots of a schedule given as seconds, a ``timedelta``, a Celery ``schedule`` or a
    ``crontab``; SagaConfigurationError for anything else."""
    if isinstance(value, crontab):
        return CrontabSlots(value)
    if isinstance(value, schedule):
        value = value.run_every
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagaConfigurationError(
            "schedule must be seconds, a timedelta or a celery.schedules.crontab, "
            f"got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0.001:
        raise SagaConfigurationError(f"schedule must be at least 0.001 s, got {value!r}")
    return IntervalSlots(round(value * 1000))


def utc_stamp(at_ms: int) -> str:
    """``20261203T090000Z`` (with ``.250`` before the Z when the ms are not zero)."""
    moment = datetime.fromtimestamp(at_ms // 1000, timezone.utc)
    millis = at_ms % 1000
    return moment.strftime("%Y%m%dT%H%M%S") + (f".{millis:03d}" if millis else "") + "Z"
