"""Scheduled sagas on real workers and two real ``celery beat`` processes.

Both beats send every tick of the ``tick`` schedule (``tests/e2e/periodic_app.py``, every 2 s);
each tick must start exactly one saga, named by the schedule and the tick's slot. A beat killed
and restarted within a tick sends that tick again: still one saga.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Process, Stack, wait_until
from tests.e2e.periodic_app import INPUT, SCHEDULE

pytestmark = pytest.mark.e2e

SENT = "Sending due task celery_sagas.periodic:tick"
PUBLISHED = "celery_sagas.periodic sent."  # beat's DEBUG line once the publish returned


def sends(beats: list[Process]) -> list[int]:
    """How many ticks each beat sent so far (from its log)."""
    return [beat.text().count(SENT) for beat in beats]


def scheduled_sagas(stack: Stack) -> dict[str, Any]:
    """Every saga of the ``tick`` schedule, by id."""
    found: dict[str, Any] = {}
    cursor = None
    while True:
        page = stack.sagas.browse(definition="e2e-order", cursor=cursor, limit=200)
        found.update((r.saga_id, r) for r in page.records if r.saga_id.startswith(f"{SCHEDULE}@"))
        cursor = page.cursor
        if cursor is None:
            return found


def test_two_beats_sending_every_tick_start_exactly_one_saga_per_tick(stack: Stack) -> None:
    # given: a worker and two beats, each sending the 2 s schedule on its own
    stack.app_module = "tests.e2e.periodic_app"
    schedule = stack.sagas.periodic(stack.shop.order, 2, input=INPUT, name=SCHEDULE)
    stack.worker()
    beats = [stack.beat(), stack.beat()]

    # when: both beats sent at least 3 of the same ticks (beats started apart on a loaded
    # machine share fewer of their first ticks), then both stop
    def sent_by_both() -> int:
        slots = collections.Counter(schedule.saga_id(t["sent_at_ms"] / 1000) for t in stack.ops("tick"))
        return sum(1 for n in slots.values() if n >= 2)

    wait_until(lambda: sent_by_both() >= 3, timeout=120, what="3 ticks sent by both beats")
    for beat in beats:
        beat.stop()
    sent = sum(sends(beats))
    wait_until(lambda: len(stack.ops("tick")) >= sent, timeout=60, what="every tick delivered")

    # then: one saga per slot named by the ticks, however many beats sent it
    ticks = stack.ops("tick")
    assert len(ticks) == sent
    per_slot = collections.Counter(schedule.saga_id(t["sent_at_ms"] / 1000) for t in ticks)
    assert sum(1 for n in per_slot.values() if n == 2) >= 3, per_slot  # both beats sent them
    assert max(per_slot.values()) == 2, per_slot
    sagas = scheduled_sagas(stack)
    assert set(sagas) == set(per_slot)
    for saga_id in sagas:
        assert stack.wait_settled(saga_id).state == "completed"
    # each saga ran its steps once: a duplicate tick sent nothing
    reserves = collections.Counter(e["saga_id"] for e in stack.ops("reserve.done"))
    assert reserves == {saga_id: 1 for saga_id in sagas}


def beat_on(stack: Stack, schedule_file: Path) -> Process:
    """A celery beat keeping its schedule in ``schedule_file`` (kept across restarts)."""
    process = stack._spawn(["beat", "-s", str(schedule_file), "-l", "INFO"], "beat")
    wait_until(lambda: "beat: Starting" in process.text() or process.proc.poll() is not None,
               timeout=60, what="beat started")
    assert process.proc.poll() is None, process.text()[-3000:]
    return process


def test_a_beat_restarted_within_a_tick_sends_it_again_and_starts_nothing_twice(
        redis_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a 20 s schedule and one beat, killed right after it sent a tick: the time of that
    # send was never written to its schedule file (beat writes it every few minutes)
    monkeypatch.setenv("E2E_PERIODIC_EVERY", "20")  # room for a restart on a loaded machine
    stack = redis_stack
    stack.app_module = "tests.e2e.periodic_app"
    schedule = stack.sagas.periodic(stack.shop.order, 20, input=INPUT, name=SCHEDULE)
    stack.worker()
    schedule_file = stack.tmp / "beat-schedule-kept"
    first = beat_on(stack, schedule_file)
    wait_until(lambda: sends([first]) == [1], timeout=60, what="a tick from the first beat")
    # beat logs "Sending due task" before it publishes: kill it only once the tick arrived
    wait_until(lambda: len(stack.ops("tick")) == 1, timeout=60, what="the first tick delivered")
    first.kill()

    # when: it is restarted on the same schedule file within the same tick
    again = beat_on(stack, schedule_file)
    wait_until(lambda: sends([again]) == [1], timeout=60, what="the restarted beat's first send")
    # as above: stop it only once its tick arrived (a stop right after the log can drop it)
    wait_until(lambda: len(stack.ops("tick")) == 2, timeout=60, what="both ticks delivered")
    again.stop()

    # then: both sends named the same tick, and one saga ran for it
    slots = [schedule.saga_id(t["sent_at_ms"] / 1000) for t in stack.ops("tick")]
    assert slots[0] == slots[1], f"the restart took longer than the tick ({slots})"
    assert set(scheduled_sagas(stack)) == {slots[0]}
    assert stack.wait_settled(slots[0]).state == "completed"
    assert len(stack.ops("reserve.done", slots[0])) == 1


# ---------------------------------------------------------------- issue 25 item 8


def exited(process: Process) -> str:
    """The log of a worker or beat that must refuse to start (it exits non-zero)."""
    wait_until(lambda: process.proc.poll() is not None or "ready." in process.text()
               or SENT in process.text(), timeout=90, what="the process to exit")
    assert process.proc.poll() is not None, "it started:\n" + process.text()[-3000:]
    assert process.proc.returncode != 0, process.text()[-3000:]
    return process.text()


def test_a_schedule_naming_an_unknown_definition_stops_worker_and_beat_from_starting(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a schedule naming "e2e-ordre" (a typo: the definition is e2e-order)
    stack.app_module = "tests.e2e.periodic_app"
    monkeypatch.setenv("E2E_PERIODIC_VARIANT", "typo")

    # when
    worker = stack._spawn(["worker", "--pool", "solo", "-Q", stack.config.queue, "-l", "INFO",
                           "--without-gossip", "--without-mingle", "--without-heartbeat"],
                          "worker")
    beat = stack._spawn(["beat", "-s", str(stack.tmp / "beat-typo"), "-l", "INFO"], "beat")

    # then: both refuse, naming the schedule and the definition
    for text in (exited(worker), exited(beat)):
        assert "'e2e-ordre'" in text and "refuses to start" in text, text[-3000:]
    assert SENT not in beat.text()


def test_a_worker_without_the_schedule_never_takes_its_ticks_and_none_is_lost(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: on the queue, a worker of the service whose modules do not declare the schedule
    # (it logged "Received unregistered task of type 'celery_sagas.periodic'" and dropped it)
    stack.app_module = "tests.e2e.periodic_app"
    monkeypatch.setenv("E2E_PERIODIC_VARIANT", "none")
    other = stack.worker()
    monkeypatch.setenv("E2E_PERIODIC_VARIANT", "ok")
    schedule = stack.sagas.periodic(stack.shop.order, 2, input=INPUT, name=SCHEDULE)

    # when: beat sends ticks while only that worker runs (counted once published: a stop
    # may cut a tick between its "Sending due task" line and its publish)
    beat = stack.beat(level="DEBUG")
    wait_until(lambda: beat.text().count(PUBLISHED) >= 2, timeout=90, what="2 ticks sent")
    beat.stop()
    sent = beat.text().count(PUBLISHED)

    # then: it took none of them
    assert "celery_sagas.periodic" not in other.text(), other.text()[-3000:]
    assert stack.ops("tick") == []

    # when: a worker that declares the schedule starts
    stack.worker()

    # then: every tick sent before reaches it and starts its saga
    wait_until(lambda: len(stack.ops("tick")) >= sent, timeout=90, what="every tick delivered")
    slots = {schedule.saga_id(t["sent_at_ms"] / 1000) for t in stack.ops("tick")}
    for saga_id in slots:
        assert stack.wait_settled(saga_id).state == "completed"
