"""Scheduled sagas: the slot of a tick, the saga id it names, the beat entry, validation.

Each test builds a fresh Celery app with a MemoryStore; nothing connects to a broker.
"""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_sagas import MemoryStore, SagaRecord, Sagas, SagaState
from celery_sagas._celery.messages import PERIODIC_TASK, SENT_AT, SWEEP_TASK, _stamp, sent_at
from celery_sagas._celery.periodic import PeriodicSagas
from celery_sagas._celery.schedules import AlignedInterval, CrontabSlots, IntervalSlots, utc_stamp
from celery_sagas.errors import SagaConfigurationError, SagaConflictError, SagaValidationError

UTC = timezone.utc


def fresh_app(**conf: Any) -> Celery:
    app = Celery("periodic-test", set_as_current=False)
    app.conf.update(conf)
    return app


def make(app: Celery | None = None) -> Sagas:
    sagas = Sagas(app or fresh_app(), store=MemoryStore(), allow_non_durable=True)

    @sagas.saga("nightly")
    def nightly(ctx: Any, data: Any) -> None:
        return None

    return sagas


def ms(*args: int, tz: Any = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)


def periodic_entries(app: Celery) -> dict[str, Any]:
    return {k: v for k, v in app.conf.beat_schedule.items() if v["task"] == PERIODIC_TASK}


# ------------------------------------------------------------ interval slots


@pytest.mark.parametrize(("at", "slot"), [
    (ms(2026, 12, 3, 9, 0, 0), ms(2026, 12, 3, 9, 0, 0)),
    (ms(2026, 12, 3, 9, 0, 1), ms(2026, 12, 3, 9, 0, 0)),
    (ms(2026, 12, 3, 9, 0, 1) + 999, ms(2026, 12, 3, 9, 0, 0)),
    (ms(2026, 12, 3, 9, 0, 2), ms(2026, 12, 3, 9, 0, 2)),
])
def test_an_interval_tick_is_its_time_floored_to_the_interval_since_the_epoch(at: int, slot: int) -> None:
    assert IntervalSlots(2000).slot_at(at, UTC) == slot


def test_every_time_within_one_interval_names_the_same_slot() -> None:
    # given: two beats that sent the same tick 1.4 s apart within one 2 s interval
    slots = IntervalSlots(2000)
    base = ms(2026, 12, 3, 9, 0, 0)

    # then
    assert {slots.slot_at(base + offset, UTC) for offset in range(0, 2000, 7)} == {base}
    assert slots.slot_at(base + 2000, UTC) == base + 2000


# ------------------------------------------------------------ crontab slots


def test_a_crontab_tick_is_its_latest_due_minute_at_or_before_the_time() -> None:
    slots = CrontabSlots(crontab(minute=0, hour=9))
    assert slots.slot_at(ms(2026, 12, 3, 9, 0, 0), UTC) == ms(2026, 12, 3, 9, 0)
    assert slots.slot_at(ms(2026, 12, 3, 9, 0, 59), UTC) == ms(2026, 12, 3, 9, 0)
    assert slots.slot_at(ms(2026, 12, 3, 21, 30), UTC) == ms(2026, 12, 3, 9, 0)
    assert slots.slot_at(ms(2026, 12, 3, 8, 59, 59), UTC) == ms(2026, 12, 2, 9, 0)


def test_a_late_crontab_tick_names_the_minute_it_was_due_not_the_minute_it_was_sent() -> None:
    # given: every 15 minutes; beat restarted and sent the 10:15 tick at 10:22
    slots = CrontabSlots(crontab(minute="*/15"))

    # then
    assert slots.slot_at(ms(2026, 12, 3, 10, 22, 5), UTC) == ms(2026, 12, 3, 10, 15)


def test_a_crontab_on_some_weekdays_and_months_skips_the_other_days() -> None:
    # given: Mondays at 06:30 in January; 2027-01-04 is a Monday
    slots = CrontabSlots(crontab(minute=30, hour=6, day_of_week="mon", month_of_year=1))

    # then: from mid-February, back to the last Monday of January
    assert slots.slot_at(ms(2027, 2, 15, 12, 0), UTC) == ms(2027, 1, 25, 6, 30)
    assert slots.slot_at(ms(2027, 1, 4, 6, 29), UTC) == ms(2026, 1, 26, 6, 30)


def test_a_crontab_tick_is_computed_in_the_timezone_given() -> None:
    paris = ZoneInfo("Europe/Paris")
    slots = CrontabSlots(crontab(minute=0, hour=9))
    # 09:00 in Paris is 08:00 UTC in winter
    assert slots.slot_at(ms(2026, 12, 3, 8, 30), paris) == ms(2026, 12, 3, 8, 0)
    assert slots.slot_at(ms(2026, 12, 3, 7, 59), paris) == ms(2026, 12, 2, 8, 0)


# ------------------------------------------------------------ beat fires on slot boundaries


def aligned(seconds: float, now: datetime) -> AlignedInterval:
    return AlignedInterval(timedelta(seconds=seconds), nowfun=lambda: now)


def test_an_aligned_interval_is_due_once_a_boundary_passed_since_the_last_run() -> None:
    last = datetime(2026, 12, 3, 9, 0, 0, 300_000, tzinfo=UTC)  # ran 0.3 s after the 09:00:00 boundary
    assert aligned(2, datetime(2026, 12, 3, 9, 0, 1, 900_000, tzinfo=UTC)).is_due(last) == \
        pytest.approx((False, 0.1))
    assert aligned(2, datetime(2026, 12, 3, 9, 0, 2, 10_000, tzinfo=UTC)).is_due(last) == \
        pytest.approx((True, 1.99))


def test_two_beats_started_apart_fire_at_the_same_boundaries() -> None:
    # given: one beat last ran at 09:00:00.1, the other (started later) at 09:00:01.7
    a_last = datetime(2026, 12, 3, 9, 0, 0, 100_000, tzinfo=UTC)
    b_last = datetime(2026, 12, 3, 9, 0, 1, 700_000, tzinfo=UTC)
    now = datetime(2026, 12, 3, 9, 0, 2, 50_000, tzinfo=UTC)

    # then: both are due at 09:00:02
    assert aligned(2, now).is_due(a_last)[0] and aligned(2, now).is_due(b_last)[0]


# ------------------------------------------------------------ saga ids


def test_a_saga_id_is_the_schedule_name_and_the_slot_in_utc() -> None:
    assert utc_stamp(ms(2026, 12, 3, 9, 0, 2)) == "20261203T090002Z"
    assert utc_stamp(ms(2026, 12, 3, 9, 0, 2) + 250) == "20261203T090002.250Z"
    sagas = make()
    every = sagas.periodic("nightly", 2, input={"day": 1}, name="settle")
    assert every.saga_id(datetime(2026, 12, 3, 9, 0, 3, tzinfo=UTC)) == "settle@20261203T090002Z"
    assert every.saga_id(ms(2026, 12, 3, 9, 0, 3) / 1000) == "settle@20261203T090002Z"


def test_a_crontab_schedule_names_its_ticks_in_the_app_timezone() -> None:
    sagas = make(fresh_app(timezone="Europe/Paris"))
    daily = sagas.periodic("nightly", crontab(minute=0, hour=9))
    assert daily.saga_id(datetime(2026, 12, 3, 8, 30, tzinfo=UTC)) == "nightly@20261203T080000Z"


# ------------------------------------------------------------ the beat entry


@pytest.mark.parametrize("every", [2, 2.0, timedelta(seconds=2), schedule(2)])
def test_periodic_adds_a_beat_entry_aligned_on_the_interval(every: Any) -> None:
    # given
    sagas = make()

    # when
    sagas.periodic(sagas.registry.definitions["nightly"].name, every, input=[1], name="n")

    # then
    entry = periodic_entries(sagas.app)[f"{PERIODIC_TASK}:n"]
    assert isinstance(entry["schedule"], AlignedInterval)
    assert entry["schedule"].run_every == timedelta(seconds=2)
    assert entry["kwargs"] == {"name": "n"}  # the input stays in the process, not the broker
    assert PERIODIC_TASK in sagas.app.tasks


def test_a_crontab_schedule_is_its_own_beat_schedule() -> None:
    sagas = make()
    cron = crontab(minute="*/5")
    saga = sagas.saga("other")(lambda ctx, data: None)

    sagas.periodic(saga, cron)

    assert periodic_entries(sagas.app)[f"{PERIODIC_TASK}:other"]["schedule"] is cron


def test_the_beat_entries_survive_a_later_config_from_object() -> None:
    # given
    app = fresh_app()
    sagas = make(app)
    sagas.periodic("nightly", 60)

    # when: the app is configured again after Sagas was created
    app.config_from_object({"timezone": "UTC"})

    # then
    assert f"{PERIODIC_TASK}:nightly" in app.conf.beat_schedule
    assert SWEEP_TASK in app.conf.beat_schedule


def test_a_schedule_added_after_the_app_is_configured_is_installed_at_once() -> None:
    app = Celery("periodic-late", set_as_current=False)
    sagas = make(app)
    assert app.configured  # Sagas(app) installs the sweep's entries, which configures the app

    sagas.periodic("nightly", 5, name="late")

    assert f"{PERIODIC_TASK}:late" in app.conf.beat_schedule


# ------------------------------------------------------------ validation


@pytest.mark.parametrize("bad", [0, -1, 0.0001, float("nan"), float("inf"), True, "5", None,
                                 timedelta(0), [5]])
def test_a_bad_schedule_is_refused_and_nothing_is_added(bad: Any) -> None:
    sagas = make()
    with pytest.raises(SagaConfigurationError, match="schedule"):
        sagas.periodic("nightly", bad)
    assert periodic_entries(sagas.app) == {}


def test_a_schedule_name_used_twice_is_refused() -> None:
    sagas = make()
    sagas.periodic("nightly", 5)
    with pytest.raises(SagaConfigurationError, match="exists already"):
        sagas.periodic("nightly", 10)
    assert periodic_entries(sagas.app)[f"{PERIODIC_TASK}:nightly"]["schedule"].run_every == \
        timedelta(seconds=5)


@pytest.mark.parametrize("name", ["", "has space", "x" * 101, 5])
def test_a_bad_schedule_name_is_refused(name: Any) -> None:
    sagas = make()
    with pytest.raises(SagaValidationError, match="schedule name"):
        sagas.periodic("nightly", 5, name=name)
    assert periodic_entries(sagas.app) == {}


@pytest.mark.parametrize("definition", [None, 5, "bad name"])
def test_a_bad_definition_is_refused(definition: Any) -> None:
    sagas = make()
    with pytest.raises((SagaConfigurationError, SagaValidationError)):
        sagas.periodic(definition, 5)
    assert periodic_entries(sagas.app) == {}


@pytest.mark.parametrize("bad", [{1, 2}, {"x": float("nan")}, "x" * 2000])
def test_input_that_is_not_json_or_too_large_is_refused(bad: Any) -> None:
    sagas = Sagas(fresh_app(), store=MemoryStore(), allow_non_durable=True, payload_limit=1024)
    with pytest.raises(SagaValidationError):
        sagas.periodic("nightly", 5, input=bad)
    assert periodic_entries(sagas.app) == {}


# ------------------------------------------------------------ a tick


class Starts:
    """A start function that records its calls and returns a record."""

    def __init__(self, conflict: bool = False) -> None:
        self.calls: list[tuple[str, Any, str]] = []
        self.conflict = conflict

    def __call__(self, definition: str, input: Any, saga_id: str) -> SagaRecord:
        self.calls.append((definition, input, saga_id))
        if self.conflict:
            raise SagaConflictError(saga_id=saga_id)
        return SagaRecord(saga_id, definition, SagaState.RUNNING, input, 0, 0)


def periodic_of(starts: Starts, now_ms: int = 0) -> PeriodicSagas:
    return PeriodicSagas(fresh_app(), starts, queue=None, payload_limit=1000, now_ms=lambda: now_ms,
                         on_added=lambda: None)


def test_a_tick_starts_the_saga_of_the_slot_it_was_sent_in() -> None:
    # given
    starts = Starts()
    periodic = periodic_of(starts)
    periodic.add("nightly", 2, input={"n": 1}, name="every2")

    # when: two beats send the tick of 09:00:02, at .05 and at 1.6 s past it
    periodic.tick("every2", ms(2026, 12, 3, 9, 0, 2) + 50)
    periodic.tick("every2", ms(2026, 12, 3, 9, 0, 3) + 600)

    # then: both name the same saga (start is idempotent by id)
    assert starts.calls == [("nightly", {"n": 1}, "every2@20261203T090002Z")] * 2


def test_a_tick_without_a_send_time_uses_the_time_it_runs() -> None:
    starts = Starts()
    periodic = periodic_of(starts, now_ms=ms(2026, 12, 3, 9, 0, 5))
    periodic.add("nightly", 2)
    periodic.tick("nightly", None)
    assert starts.calls[0][2] == "nightly@20261203T090004Z"


def test_a_tick_of_an_unknown_schedule_or_a_conflicting_saga_starts_nothing() -> None:
    starts = Starts(conflict=True)
    periodic = periodic_of(starts)
    periodic.add("nightly", 2)
    assert periodic.tick("gone", 0) is None
    assert periodic.tick("nightly", 0) is None
    assert len(starts.calls) == 1


def test_a_published_tick_is_stamped_once_with_its_send_time() -> None:
    headers: dict[str, Any] = {}
    _stamp(sender=PERIODIC_TASK, headers=headers)
    first = headers[SENT_AT]
    _stamp(sender=PERIODIC_TASK, headers=headers)
    assert headers[SENT_AT] == first and isinstance(first, int)
    other: dict[str, Any] = {}
    _stamp(sender="shop.charge", headers=other)
    assert other == {}


def test_a_published_sweep_is_stamped_with_its_send_time() -> None:
    headers: dict[str, Any] = {}
    _stamp(sender=SWEEP_TASK, headers=headers)
    assert isinstance(headers[SENT_AT], int)


def test_the_sweep_task_sweeps_with_the_send_time_of_its_message() -> None:
    # given: a sweep whose message was stamped when it was sent
    app = Celery("sweep-stamp", set_as_current=False)
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True)
    seen: list[dict[str, Any]] = []
    sagas.sweep = lambda **options: seen.append(options)  # type: ignore[method-assign,assignment,return-value]

    # when
    app.tasks[SWEEP_TASK].apply(kwargs={"shard": 0, "shards": 1}, headers={SENT_AT: 1234})
    app.tasks[SWEEP_TASK].apply(kwargs={"shard": 0, "shards": 1})

    # then: buckets swept since then are skipped (docs/design.md §5); unstamped, none are
    assert seen == [{"shard": 0, "shards": 1, "sent_at_ms": 1234},
                    {"shard": 0, "shards": 1, "sent_at_ms": None}]


@pytest.mark.parametrize(("request_", "expected"), [
    (SimpleNamespace(saga_sent_at_ms=1234), 1234),
    (SimpleNamespace(headers={SENT_AT: 99}), 99),
    (SimpleNamespace(saga_sent_at_ms="1234"), None),
    (SimpleNamespace(saga_sent_at_ms=-5), None),
    (SimpleNamespace(), None),
])
def test_the_send_time_is_read_from_the_request_or_ignored_when_malformed(request_: Any,
                                                                          expected: int | None) -> None:
    assert sent_at(request_) == expected


def test_an_aligned_interval_survives_the_beat_schedule_file() -> None:
    # given: beat's default scheduler pickles its entries into its schedule file
    now = datetime(2026, 12, 3, 9, 0, 2, 50_000, tzinfo=UTC)
    stored = pickle.loads(pickle.dumps(AlignedInterval(timedelta(seconds=2))))

    # then: the same schedule, still aligned
    assert isinstance(stored, AlignedInterval) and stored == AlignedInterval(timedelta(seconds=2))
    stored.nowfun = lambda: now
    assert stored.is_due(datetime(2026, 12, 3, 9, 0, 1, 900_000, tzinfo=UTC))[0]


def test_a_tick_sent_one_millisecond_either_side_of_a_boundary_names_its_own_slot() -> None:
    starts = Starts()
    periodic = periodic_of(starts)
    periodic.add("nightly", 0.25, name="fast")
    boundary = ms(2026, 12, 3, 9, 0, 2) + 750  # 09:00:02.750, a multiple of 250 ms
    for at in (boundary - 1, boundary, boundary + 1):
        periodic.tick("fast", at)
    assert [c[2] for c in starts.calls] == [
        f"fast@{utc_stamp(boundary - 250)}", f"fast@{utc_stamp(boundary)}", f"fast@{utc_stamp(boundary)}"]
