"""The one seam for cross-cutting concerns: tracing, metrics, events and logging
(docs/design.md §1.1 "Middleware").

A ``Middleware`` has four hooks, each a no-op by default: around one delivery of a step or
compensator, around the send of one step or compensator message, around one operator
operation (start, signal, cancel, resume, resolve, a child saga's start, a sweep), and on each
lifecycle event and finding. The runtime holds one ``Middlewares`` chain and every part that
reaches a hook goes through it: the task classes (delivery), the dispatcher (send), the facade
and the child sagas (operation), the announcer and the sweep (events). The chain is composed
once, in ``Sagas.__init__`` (``_celery/facade.py``): the ``EventBus`` (logs and observers),
the metrics when asked for, then tracing. A new concern is one more ``Middleware`` there,
never a new call in the code it observes.

Hooks see ids, names, states and codes; never input, arguments, results or tokens.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ._protocol.events import LifecycleEvent
from ._protocol.findings import Finding

__all__ = ["ChildOf", "Delivering", "Middleware", "Middlewares", "Operation", "Sending"]

logger = logging.getLogger("celery_sagas.events")


@dataclass(slots=True)
class Delivering:
    """One delivery of a step or compensator (its task id is ``effect_id``)."""

    saga_id: str
    step: str
    effect_id: str
    compensation: bool
    carrier: Any  # the message's headers, as attributes (a Celery task request)


@dataclass(slots=True)
class Sending:
    """One step or compensator message about to be published; a middleware adds ``headers``."""

    saga_id: str
    step: str
    trace_parent: str | None = None  # the saga's stored traceparent (docs/tracing.md)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChildOf:
    """The parent of a child saga's start: its stored traceparent, id and ``ctx.child`` step."""

    parent_trace: str | None
    parent_id: str
    step: str


@dataclass(slots=True)
class Operation:
    """One operator operation (``saga.start``, ``saga.cancel``, ..., ``saga.sweep``).

    A middleware may set ``trace_parent`` (what a new saga record keeps); the operation sets
    ``result`` and ``noted`` (attributes worth recording: ids, states, counts) before it ends.
    """

    name: str
    saga_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    stored_trace: Callable[[], str | None] | None = None  # reads the saga's stored traceparent
    child_of: ChildOf | None = None
    trace_parent: str | None = None
    result: object = None
    noted: dict[str, Any] = field(default_factory=dict)

    def finish(self, result: object, **noted: Any) -> None:
        """Record what the operation returned and the attributes it notes."""
        self.result = result
        self.noted.update(noted)


class Middleware:
    """Hooks around what the runtime does; every hook does nothing unless overridden.

    An ``around_*`` hook returns a context manager entered before the work and left after it
    (an exception of the work passes through it). ``on_event`` and ``on_finding`` must not
    raise: the chain logs and ignores what they raise.
    """

    def around_delivery(self, delivery: Delivering) -> contextlib.AbstractContextManager[None]:
        """Around one delivery of a step or compensator."""
        return contextlib.nullcontext()

    def around_send(self, sending: Sending) -> contextlib.AbstractContextManager[None]:
        """Around the publishing of one step or compensator message."""
        return contextlib.nullcontext()

    def around_operation(self, operation: Operation) -> contextlib.AbstractContextManager[None]:
        """Around one operator operation."""
        return contextlib.nullcontext()

    def on_event(self, event: LifecycleEvent) -> None:
        """One lifecycle event (an effect transition)."""

    def on_finding(self, finding: Finding) -> None:
        """One finding a sweep reports."""


class Middlewares:
    """The chain the runtime holds: each hook calls every member's, in the order added (the
    ``around_*`` ones nest: the first added is outermost)."""

    def __init__(self, members: Iterable[Middleware] = ()) -> None:
        self._members: tuple[Middleware, ...] = tuple(members)
        self._lock = threading.Lock()

    @property
    def members(self) -> tuple[Middleware, ...]:
        """The middlewares of the chain, outermost first."""
        return self._members

    def add(self, middleware: Middleware) -> None:
        """Append ``middleware`` (innermost) to the chain."""
        with self._lock:
            self._members = (*self._members, middleware)

    @contextlib.contextmanager
    def around_delivery(self, delivery: Delivering) -> Iterator[None]:
        """Every member's ``around_delivery``, nested."""
        with self._nested(lambda m: m.around_delivery(delivery)):
            yield

    @contextlib.contextmanager
    def around_send(self, sending: Sending) -> Iterator[None]:
        """Every member's ``around_send``, nested."""
        with self._nested(lambda m: m.around_send(sending)):
            yield

    @contextlib.contextmanager
    def around_operation(self, operation: Operation) -> Iterator[None]:
        """Every member's ``around_operation``, nested."""
        with self._nested(lambda m: m.around_operation(operation)):
            yield

    def on_event(self, event: LifecycleEvent) -> None:
        """Hand a lifecycle event to every member."""
        for member in self._members:
            _guarded(member.on_event, event)

    def on_finding(self, finding: Finding) -> None:
        """Hand a finding to every member."""
        for member in self._members:
            _guarded(member.on_finding, finding)

    @contextlib.contextmanager
    def _nested(self, hook: Callable[[Middleware], contextlib.AbstractContextManager[None]]
                ) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for member in self._members:
                stack.enter_context(hook(member))
            yield


def _guarded(handle: Callable[[Any], None], event: object) -> None:
    try:
        handle(event)
    except Exception:
        logger.exception("saga middleware %r failed", handle)
