"""Configuration loaded after ``Sagas(app)`` cannot drop the sweep's beat entries or slip
pickle past the check (issue 16 item 6); real workers and beat: tests/e2e/test_misuse.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._celery import hooks
from celery_sagas.testing import FrozenClock

SWEEP = "celery_sagas.sweep"


def test_config_from_object_after_sagas_keeps_the_sweep_entries(app: Celery, sagas: Sagas) -> None:
    # when
    app.config_from_object(SimpleNamespace(task_default_queue="orders"))

    # then
    assert app.conf.task_default_queue == "orders"
    assert app.conf.beat_schedule[SWEEP]["task"] == SWEEP


def test_every_shard_gets_its_entry_after_a_later_configuration(
    app: Celery, store: MemoryStore, clock: FrozenClock
) -> None:
    Sagas(app, store=store, allow_non_durable=True, clock=clock, sweep_shards=3, queue="sweeps")

    app.config_from_object(SimpleNamespace(timezone="UTC"))

    entries = {k: v for k, v in app.conf.beat_schedule.items() if k.startswith(SWEEP)}
    assert sorted(entries) == [SWEEP, f"{SWEEP}:1", f"{SWEEP}:2"]
    assert [e["kwargs"] for e in entries.values()] == [
        {"shard": n, "shards": 3} for n in range(3)
    ]
    assert {e["options"]["queue"] for e in entries.values()} == {"sweeps"}


def test_a_later_configuration_accepting_pickle_is_logged_at_once(
    app: Celery, sagas: Sagas, caplog: pytest.LogCaptureFixture
) -> None:
    app.config_from_object(SimpleNamespace(accept_content=["json", "pickle"]))

    assert any(r.levelname == "ERROR" and "pickle" in r.getMessage() for r in caplog.records)


def test_a_worker_whose_later_configuration_accepts_pickle_refuses_to_start(
    app: Celery, sagas: Sagas
) -> None:
    app.config_from_object(SimpleNamespace(accept_content=["json", "pickle"]))

    with pytest.raises(SystemExit, match="pickle"):
        hooks._worker_starting(SimpleNamespace(app=app))


class _Scheduler:
    """What beat's scheduler offers the hook: its schedule and update_from_dict."""

    def __init__(self, schedule: dict[str, Any]) -> None:
        self.schedule = dict(schedule)

    def update_from_dict(self, entries: dict[str, Any]) -> None:
        self.schedule.update(entries)


def test_beat_gets_the_sweep_even_when_beat_schedule_was_replaced(app: Celery, sagas: Sagas) -> None:
    # given: the app's own schedule replaced the whole dict after Sagas(app)
    app.conf.beat_schedule = {"report": {"task": "report", "schedule": 60.0}}
    scheduler = _Scheduler(app.conf.beat_schedule)

    # when: beat starts
    hooks._beat_starting(SimpleNamespace(app=app, scheduler=scheduler))

    # then
    assert set(scheduler.schedule) == {"report", SWEEP}


def test_hooks_leave_an_app_without_sagas_alone(caplog: pytest.LogCaptureFixture) -> None:
    plain = Celery("plain", set_as_current=False)
    caplog.set_level(logging.DEBUG)

    hooks._beat_starting(SimpleNamespace(app=plain, scheduler=_Scheduler({})))
    hooks._worker_starting(SimpleNamespace(app=plain))
    assert hooks.guarded(plain) is None
