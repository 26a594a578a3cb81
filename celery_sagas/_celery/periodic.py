"""Scheduled sagas: ``sagas.periodic(...)`` (docs/concepts.md "Scheduled sagas").

Each schedule is a beat entry that sends ``celery_sagas.periodic`` with the schedule's name
only (the input stays in this process's registration, never in the broker), to a queue of its
own that every worker declaring the schedule consumes, whatever its ``-Q``: a worker without
the schedule never receives its ticks, so none is dropped. The process that
publishes the tick stamps the message with the time it sent it (``saga_sent_at_ms``, a
header set in ``before_task_publish``: in beat, right after the tick was due); the worker
turns that time into the tick's slot (``schedules.py``) and starts the saga whose id is the
schedule's name and the slot. Every beat that sends the same tick names the same saga, and
``start`` with an existing id and the same input writes and sends nothing: a duplicate tick
starts nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from celery import Celery

from .. import _values as values
from .._records import SagaRecord
from ..errors import SagaConfigurationError, SagaConflictError
from .messages import PERIODIC_TASK, sent_at, stamp_sent_at
from .schedules import Slots, slots_of, utc_stamp

__all__ = ["PeriodicSagas", "SagaSchedule"]

logger = logging.getLogger("celery_sagas")

_NAME_LIMIT = 100  # the saga id adds "@" and up to 21 characters of slot


@dataclass(eq=False, repr=False)  # one schedule is itself only; its repr is its own
class SagaSchedule:
    """A saga started once per tick of a schedule (what ``Sagas.periodic`` returns).

    Attributes:
        name: the schedule's name: the beat entry is ``celery_sagas.periodic:<name>`` and each
            tick's saga id is ``<name>@<slot>``.
        definition: the saga definition each tick starts.
        input: the input each tick's saga is started with.
        slots: the ticks of the schedule (an interval or a crontab).
        queue: the queue its ticks are sent to, consumed by every worker that declares it.
    """

    name: str
    definition: str
    input: Any
    slots: Slots
    _timezone: Callable[[], tzinfo]  # the app's, read at each tick
    queue: str = ""

    def slot_at(self, when: datetime | float) -> int:
        """The tick at or before ``when`` (an aware datetime or epoch seconds), in ms since
        the epoch."""
        seconds = when.timestamp() if isinstance(when, datetime) else float(when)
        return self.slot_at_ms(round(seconds * 1000))

    def slot_at_ms(self, at_ms: int) -> int:
        """The tick at or before ``at_ms`` (ms since the epoch), in ms since the epoch."""
        return self.slots.slot_at(at_ms, self._timezone())

    def saga_id(self, when: datetime | float) -> str:
        """The id of the saga the tick at or before ``when`` starts:
        ``<name>@<slot as UTC, 20261203T090000Z>``."""
        return self.saga_id_of_slot(self.slot_at(when))

    def saga_id_of_slot(self, slot_ms: int) -> str:
        """The id of the saga of the tick ``slot_ms``."""
        return f"{self.name}@{utc_stamp(slot_ms)}"

    def __repr__(self) -> str:
        return f"SagaSchedule({self.name!r}, {self.definition!r}, {self.slots!r})"


Start = Callable[[str, Any, str], SagaRecord]


class PeriodicSagas:
    """The schedules of one ``Sagas``: their beat entries and the task that starts a tick."""

    def __init__(self, app: Celery, start: Start, *, queue: str | None, payload_limit: int,
                 now_ms: Callable[[], int], on_added: Callable[[], None]) -> None:
        self.app = app
        self._on_added = on_added
        self._start = start
        self._queue = queue
        self._payload_limit = payload_limit
        self._now_ms = now_ms
        self.schedules: dict[str, SagaSchedule] = {}
        self.beat_entries: dict[str, dict[str, Any]] = {}

    def add(self, definition: object, schedule: object, input: Any = None,
            name: str | None = None) -> SagaSchedule:
        """Validate, register and put a beat entry for one schedule (nothing on error)."""
        definition_name = _definition_name(definition)
        slots = slots_of(schedule)
        name = definition_name if name is None else name
        _check_name(name)
        canonical = values.encode_json(input, field="saga input", limit=self._payload_limit)
        if name in self.schedules:
            raise SagaConfigurationError(f"a schedule named {name!r} exists already")
        if not self.schedules:
            self._register_task()
        found = SagaSchedule(name, definition_name, values.decode_json(canonical), slots,
                             lambda: self.app.timezone, queue=self._tick_queue(name))
        self.schedules[name] = found
        self.beat_entries[f"{PERIODIC_TASK}:{name}"] = {
            "task": PERIODIC_TASK, "schedule": slots.beat_schedule(), "args": (),
            "kwargs": {"name": name}, "options": {"queue": found.queue},
        }
        self._on_added()
        return found

    def _tick_queue(self, name: str) -> str:
        """The queue of one schedule's ticks: only workers that declare the schedule consume
        it (``hooks.py`` adds it to each such worker), so no other worker drops a tick."""
        return f"{self._queue or 'celery_sagas'}.periodic.{name}"

    def tick(self, name: str, sent_at_ms: int | None) -> SagaRecord | None:
        """Start the saga of the tick sent at ``sent_at_ms`` (now if unknown); None when the
        schedule is unknown here or the saga exists with another input."""
        found = self.schedules.get(name)
        if found is None:
            logger.error("no saga schedule %r in this process; tick ignored", name)
            return None
        at_ms = sent_at_ms if sent_at_ms is not None else self._now_ms()
        saga_id = found.saga_id_of_slot(found.slot_at_ms(at_ms))
        try:
            return self._start(found.definition, found.input, saga_id)
        except SagaConflictError:
            logger.warning("saga %s exists with another definition or input; tick of %r "
                           "starts nothing", saga_id, name)
            return None

    def _register_task(self) -> None:
        options = {"acks_late": True, "reject_on_worker_lost": True, "serializer": "json",
                   "ignore_result": True, "shared": False, "bind": True}

        @self.app.task(name=PERIODIC_TASK, **options)  # type: ignore[untyped-decorator]
        def periodic_task(task: Any, name: str) -> None:
            self.tick(name, sent_at(task.request))

        stamp_sent_at()


def _definition_name(definition: object) -> str:
    name = getattr(definition, "name", definition)
    if not isinstance(name, str):
        raise SagaConfigurationError(
            "definition must be what @sagas.saga returned or its name, "
            f"got {type(definition).__name__}"
        )
    return values.definition_name(name)


def _check_name(name: object) -> None:
    values.token(name, field="schedule name", max_len=_NAME_LIMIT)
