"""What every worker and beat of an app with sagas must have, installed through Celery's
signals so that no later configuration drops it (docs/design.md §8).

- When the app is configured (again: ``config_from_object`` after ``Sagas(app)`` builds a new
  configuration), the sweep's beat entries are put back and a pickle setting is logged.
- When beat starts, its scheduler gets the sweep entries it lacks (``beat_schedule`` may have
  been replaced after the app was configured).
- When a worker starts, it refuses to run (exits, naming the cause) if its effective settings
  accept pickle or a step names a compensator that is not registered.
- When a worker receives a saga task it does not have, the saga goes to manual review
  (``unknown_task``) instead of the sweep re-sending the message forever.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from celery import Celery
from celery.local import Proxy
from celery.signals import beat_init, celeryd_after_setup, task_unknown, worker_init

from .._definitions import Registry
from .._engine import Engine
from ..errors import SagaConfigurationError
from .messages import SAGA_REF, parse_ref
from .periodic import SagaSchedule
from .registration import refuse_pickle, refuse_pickle_accepted

__all__ = [
    "Guarded",
    "guard",
    "guarded",
    "install_beat_entries",
    "unknown_schedule_definitions",
    "unregistered_compensators",
]

logger = logging.getLogger("celery_sagas")


class Guarded(Protocol):
    """What the hooks need of a ``Sagas``."""

    app: Celery
    registry: Registry

    @property
    def engine(self) -> Engine:
        """This process's engine."""
        ...

    def beat_entries(self) -> dict[str, dict[str, Any]]:
        """The beat schedule entries of the sweeps and the scheduled sagas, by name."""
        ...

    def schedules(self) -> Mapping[str, SagaSchedule]:
        """The scheduled sagas declared on this Sagas, by schedule name."""
        ...


# The Sagas created on each app (the latest), held weakly both ways.
_BY_APP: weakref.WeakKeyDictionary[Celery, weakref.ref[Any]] = weakref.WeakKeyDictionary()


def guard(sagas: Guarded) -> None:
    """Make ``sagas`` the one the hooks of its app act for, and install its beat entries now
    and on every later configuration of the app."""
    app = sagas.app
    _BY_APP[app] = weakref.ref(sagas)
    app.on_after_configure.connect(_configured, sender=app, weak=False,
                                   dispatch_uid="celery_sagas.configured")
    install_beat_entries(app, sagas)


def guarded(app: Celery) -> Guarded | None:
    """The Sagas created on ``app``, if any is alive; ``app`` may be Celery's ``current_app``
    (a proxy, which cannot be weakly referenced: the app behind it is looked up)."""
    ref = _BY_APP.get(_unproxied(app))
    return ref() if ref is not None else None


def _unproxied(app: Celery) -> Celery:
    real: Celery = app._get_current_object() if isinstance(app, Proxy) else app
    return real


def install_beat_entries(app: Celery, sagas: Guarded) -> None:
    """Put every beat entry of ``sagas`` (sweeps, schedules) into the app's beat schedule."""
    schedule = app.conf.beat_schedule
    if schedule is None:
        app.conf.beat_schedule = schedule = {}
    schedule.update(sagas.beat_entries())


def _configured(sender: Celery, **_: Any) -> None:
    sagas = guarded(sender)
    if sagas is None:
        return
    install_beat_entries(sender, sagas)
    try:
        _refuse_pickle_settings(sender.conf)
    except SagaConfigurationError as exc:
        logger.error("%s (a worker with this configuration refuses to start)", exc)


def _refuse_pickle_settings(conf: Mapping[str, Any]) -> None:
    refuse_pickle(conf.get("task_serializer"))
    refuse_pickle_accepted(conf.get("accept_content"))


def unregistered_compensators(registry: Registry) -> list[str]:
    """A sentence for each step whose compensator is not a registered ``@sagas.compensator``."""
    return [
        f"step {name!r} names compensator {options.compensator!r}, which is not a registered "
        "@sagas.compensator"
        for name, options in sorted(registry.steps.items())
        if options.compensator is not None and options.compensator not in registry.compensators
    ]


def unknown_schedule_definitions(sagas: Guarded) -> list[str]:
    """A sentence for each schedule whose definition is not a registered ``@sagas.saga``."""
    return [
        f"schedule {name!r} names saga definition {schedule.definition!r}, which is not a "
        "registered @sagas.saga"
        for name, schedule in sorted(sagas.schedules().items())
        if schedule.definition not in sagas.registry.definitions
    ]


def _refuse_to_start(what: str, problems: list[str]) -> None:
    """SystemExit naming each problem (signal handlers' other exceptions are only logged)."""
    if problems:
        for problem in problems:
            logger.critical("celery_sagas: %s", problem)
        raise SystemExit(f"celery_sagas: the {what} refuses to start: " + "; ".join(problems))


def _worker_starting(sender: Any, **_: Any) -> None:
    """Refuse to start a worker whose sagas cannot run safely."""
    sagas = guarded(sender.app)
    if sagas is None:
        return
    problems = unregistered_compensators(sagas.registry) + unknown_schedule_definitions(sagas)
    try:
        _refuse_pickle_settings(sender.app.conf)
    except SagaConfigurationError as exc:
        problems.append(str(exc))
    _refuse_to_start("worker", problems)


def _consume_ticks(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Make a starting worker consume the tick queue of every schedule it declares."""
    sagas = guarded(instance.app) if instance is not None else None
    if sagas is None:
        return
    for schedule in sagas.schedules().values():
        instance.app.amqp.queues.select_add(schedule.queue)


def _beat_starting(sender: Any, **_: Any) -> None:
    sagas = guarded(sender.app)
    if sagas is None:
        return
    _refuse_to_start("beat", unknown_schedule_definitions(sagas))
    scheduler = sender.scheduler
    missing = {name: entry for name, entry in sagas.beat_entries().items()
               if name not in scheduler.schedule}
    if missing:
        scheduler.update_from_dict(missing)


def _unknown_task(sender: Any, message: Any = None, name: str = "", id: str = "", **_: Any) -> None:
    """A worker got a task it does not have: if it was a saga's, stop that saga for review."""
    sagas = guarded(sender.app)
    if sagas is None or message is None:
        return
    ref = _saga_ref(message)
    if ref is None:
        return
    try:
        parsed = parse_ref(ref)
        sagas.engine.unknown_task(parsed.saga_id, parsed.step, id, name)
    except Exception:
        logger.exception("unknown task %s for a saga could not be recorded", name)


def _saga_ref(message: Any) -> object:
    """The saga reference in a task message body (protocol 2 or 1), or None."""
    try:
        payload = message.payload
    except Exception:
        return None
    if isinstance(payload, (list, tuple)) and len(payload) == 3:
        kwargs = payload[1]
    elif isinstance(payload, Mapping):
        kwargs = payload.get("kwargs")
    else:
        return None
    return kwargs.get(SAGA_REF) if isinstance(kwargs, Mapping) else None


worker_init.connect(_worker_starting, weak=False, dispatch_uid="celery_sagas.worker_init")
celeryd_after_setup.connect(_consume_ticks, weak=False, dispatch_uid="celery_sagas.after_setup")
beat_init.connect(_beat_starting, weak=False, dispatch_uid="celery_sagas.beat_init")
task_unknown.connect(_unknown_task, weak=False, dispatch_uid="celery_sagas.task_unknown")
