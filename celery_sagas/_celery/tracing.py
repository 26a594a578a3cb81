"""OpenTelemetry tracing of sagas (docs/tracing.md): one trace per saga, ids and codes only.

``start()`` opens a ``saga.start`` span in the caller's context. That span's context is the
saga's: every message the dispatcher sends for the saga carries it twice, in the headers of the
configured propagator (``traceparent``: what ``opentelemetry-instrumentation-celery`` and any
other consumer read; that instrumentation replaces it with its publish span) and as
``saga_traceparent``/``saga_tracestate`` (W3C), which nothing else touches. A delivery runs in a
``saga.step <name>`` or ``saga.compensation <name>`` span: a child of the task span when one is
current (the instrumentation opened it), else of the message's context; the next messages it
sends carry the saga's context again, so every step is a child of the start, not of the step
before. Lifecycle events (``_events.py``) become span events and, for the delivery's own effect,
its ``saga.outcome``, ``saga.attempt`` and ``saga.error_code``. Sweeps run in spans of their own,
in the caller's context.

The start span's ``traceparent`` is stored in the saga record (``SagaRecord.trace_parent``), so
work begun without the saga's context in scope still joins its trace: a message sent by a sweep
or an approval expiry goes out in a ``saga.send <step>`` span, a child of the start linked to
the span that was current (the sweep's), and the delivery it causes nests under it; an operator
action (cancel, resume, resolve) is a child of the start when no span is current (a CLI), else a
child of the current one (a web request) with a link to the start, and the messages it sends
carry the saga's context.

Nothing here costs more than a check when ``opentelemetry-api`` is not installed (``NoTracing``)
or no tracer provider is set. Attributes and events carry ids, names, states, attempts and error
codes; never input, arguments, results, exception messages or tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .._events import LifecycleEvent, Phase
from .._middleware import Delivering, Middleware, Operation, Sending

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the ``otel`` extra is not installed
    trace = None  # type: ignore[assignment]

__all__ = [
    "SAGA_TRACEPARENT",
    "SAGA_TRACESTATE",
    "NoTracing",
    "OtelTracing",
    "Tracing",
    "open_tracing",
]

SAGA_TRACEPARENT = "saga_traceparent"
SAGA_TRACESTATE = "saga_tracestate"
INSTRUMENTATION = "celery_sagas"
_OUTCOMES = (Phase.COMMITTED, Phase.FAILED, Phase.AMBIGUOUS)

Note = Callable[..., None]
"""Sets attributes (``saga.<name>``) on the span of an operation once it knows them."""

StoredParent = Callable[[], "str | None"]
"""Reads a saga's stored traceparent (a store read: called only when a span is recorded)."""


def _ignore(**_: Any) -> None:
    return None


class NoTracing(Middleware):
    """Tracing without OpenTelemetry: every call is a no-op (and so is every hook)."""

    @contextlib.contextmanager
    def operation(self, name: str, saga_id: str | None = None, *,
                  trace_parent: StoredParent | None = None, **attributes: Any) -> Iterator[Note]:
        """No span."""
        yield _ignore

    def traceparent(self) -> str | None:
        """No trace."""
        return None

    @contextlib.contextmanager
    def sending(self, saga_id: str, trace_parent: str | None = None,
                step: str | None = None) -> Iterator[dict[str, str]]:
        """No headers."""
        yield {}

    @contextlib.contextmanager
    def delivery(self, request: Any, saga_id: str, step: str, effect_id: str,
                 compensation: bool) -> Iterator[None]:
        """No span."""
        yield

    @contextlib.contextmanager
    def child_start(self, parent_trace: str | None, parent_id: str, step: str, child_id: str,
                    definition: str) -> Iterator[str | None]:
        """No trace."""
        yield None


@dataclass(slots=True)
class _Scope:
    """The saga this thread is working for: its context and, in a delivery, the span and what
    the lifecycle events said of the delivery's own effect."""

    saga_id: str
    context: Any  # the saga's context, carried by every message sent within the scope
    span: Any
    effect_id: str | None = None
    definition: str | None = None
    attempt: int | None = None
    outcome: str | None = None
    error_code: str | None = None


_SCOPE: ContextVar[_Scope | None] = ContextVar("celery_sagas_trace_scope", default=None)


class _RequestGetter:
    """Reads propagation headers from a Celery task request (headers are its attributes)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


class OtelTracing(Middleware):
    """Spans and context propagation through the OpenTelemetry API (see the module docstring):
    a middleware of the runtime's chain."""

    def __init__(self) -> None:
        self._tracer = trace.get_tracer(INSTRUMENTATION)
        self._w3c = TraceContextTextMapPropagator()
        self._getter: Getter[Any] = _RequestGetter()  # type: ignore[assignment]

    @staticmethod
    def live() -> bool:
        """True once a real tracer provider is set (not the API's proxy or no-op one)."""
        provider = trace.get_tracer_provider()
        return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))

    # ------------------------------------------------------------ the middleware hooks

    @contextlib.contextmanager
    def around_operation(self, operation: Operation) -> Iterator[None]:
        """The operation's span (``operation``; ``child_start`` for a child saga's start); a
        start's traceparent goes to ``operation.trace_parent``, the noted attributes to the
        span."""
        child = operation.child_of
        if child is not None:
            with self.child_start(child.parent_trace, child.parent_id, child.step,
                                  str(operation.saga_id),
                                  str(operation.attributes.get("definition"))) as traced:
                operation.trace_parent = traced
                yield
            return
        with self.operation(operation.name, operation.saga_id, trace_parent=operation.stored_trace,
                            **operation.attributes) as note:
            operation.trace_parent = self.traceparent()
            yield
            note(**operation.noted)

    @contextlib.contextmanager
    def around_send(self, sending: Sending) -> Iterator[None]:
        """The saga's context in the message's headers (``sending``)."""
        with self.sending(sending.saga_id, sending.trace_parent, sending.step) as headers:
            sending.headers.update(headers)
            yield

    def around_delivery(self, delivery: Delivering) -> contextlib.AbstractContextManager[None]:
        """The delivery's span (``delivery``)."""
        return self.delivery(delivery.carrier, delivery.saga_id, delivery.step,
                             delivery.effect_id, delivery.compensation)

    def on_event(self, event: LifecycleEvent) -> None:
        """Turn a lifecycle event into a span event or a delivery's outcome (``observe``)."""
        self.observe(event)

    # ------------------------------------------------------------ facade calls

    @contextlib.contextmanager
    def operation(self, name: str, saga_id: str | None = None, *,
                  trace_parent: StoredParent | None = None, **attributes: Any) -> Iterator[Note]:
        """A span in the caller's context, or in the saga's when the caller has none (see the
        module docstring); within it, messages of ``saga_id`` carry the saga's context (its
        stored one, else this span's)."""
        if not self.live():
            yield _ignore
            return
        stored = self._stored_context(trace_parent)
        parent: Any = None
        links: tuple[Any, ...] = ()
        if stored is not None:
            if trace.get_current_span().get_span_context().is_valid:
                links = (trace.Link(trace.get_current_span(stored).get_span_context()),)
            else:
                parent = stored
        span = self._tracer.start_span(name, context=parent, links=links,
                                       attributes=_attributes(id=saga_id, **attributes))

        def note(**more: Any) -> None:
            span.set_attributes(_attributes(**more))

        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):
            token = None
            if saga_id is not None:
                context = stored if stored is not None else otel_context.get_current()
                token = _SCOPE.set(_Scope(saga_id, context, span))
            try:
                yield note
            except BaseException as exc:
                _failed(span, type(exc).__name__)
                raise
            finally:
                if token is not None:
                    _SCOPE.reset(token)

    # ------------------------------------------------------------ messages

    def traceparent(self) -> str | None:
        """The W3C traceparent of the current span, when one is recorded."""
        if not self.live() or not trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._w3c.inject(carrier)
        return carrier.get("traceparent")

    @contextlib.contextmanager
    def sending(self, saga_id: str, trace_parent: str | None = None,
                step: str | None = None) -> Iterator[dict[str, str]]:
        """Headers carrying the saga's context: the scope's when the saga's context is in scope
        (a delivery, an operation), else the stored ``trace_parent`` (inside a ``saga.send``
        span, for a sweep), else the current context. The context the headers name is current
        during the send, so a publish span of the instrumentation nests under it."""
        if not self.live():
            yield {}
            return
        scope = _SCOPE.get()
        if scope is not None and scope.saga_id == saga_id:
            with self._publishing(scope.context, scope.context) as headers:
                yield headers
            return
        stored = self._stored_context(lambda: trace_parent)
        if stored is None:
            current = otel_context.get_current()
            with self._publishing(current, current) as headers:
                yield headers
            return
        with self._send_span(stored, saga_id, step) as context, \
                self._publishing(context, stored) as headers:
            yield headers

    @contextlib.contextmanager
    def _publishing(self, context: Any, saga_context: Any) -> Iterator[dict[str, str]]:
        """The propagator's headers for ``context`` and the saga's own for ``saga_context``;
        ``context`` is current meanwhile."""
        headers: dict[str, str] = {}
        propagate.inject(headers, context=context)
        own: dict[str, str] = {}
        self._w3c.inject(own, context=saga_context)
        if "traceparent" in own:
            headers[SAGA_TRACEPARENT] = own["traceparent"]
            if "tracestate" in own:
                headers[SAGA_TRACESTATE] = own["tracestate"]
        token = otel_context.attach(context)
        try:
            yield headers
        finally:
            otel_context.detach(token)

    @contextlib.contextmanager
    def _send_span(self, stored: Any, saga_id: str, step: str | None) -> Iterator[Any]:
        """A ``saga.send`` span under the saga's start, linked to the current span (a sweep's);
        yields its context."""
        current = trace.get_current_span().get_span_context()
        links = (trace.Link(current),) if current.is_valid else ()
        span = self._tracer.start_span(f"saga.send {step}" if step else "saga.send",
                                       context=stored, kind=trace.SpanKind.PRODUCER, links=links,
                                       attributes=_attributes(id=saga_id, step=step))
        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):
            yield otel_context.get_current()

    def _stored_context(self, trace_parent: StoredParent | None) -> Any:
        """The context a stored traceparent names, or None (absent, unreadable, invalid)."""
        if trace_parent is None:
            return None
        try:
            value = trace_parent()
        except Exception:  # tracing never fails the operation it observes
            return None
        if not isinstance(value, str):
            return None
        context = self._w3c.extract({"traceparent": value})
        return context if trace.get_current_span(context).get_span_context().is_valid else None

    @contextlib.contextmanager
    def delivery(self, request: Any, saga_id: str, step: str, effect_id: str,
                 compensation: bool) -> Iterator[None]:
        """A span around one delivery: child of the current task span if there is one, else of
        the message's context; the saga's context (from ``saga_traceparent``) stays in scope."""
        if not self.live():
            yield
            return
        nested = trace.get_current_span().get_span_context().is_valid
        parent = None if nested else propagate.extract(request, getter=self._getter)
        saga_context = self._saga_context(request) or parent or otel_context.get_current()
        kind = "compensation" if compensation else "step"
        span = self._tracer.start_span(
            f"saga.{kind} {step}", context=parent,
            kind=trace.SpanKind.INTERNAL if nested else trace.SpanKind.CONSUMER,
            attributes=_attributes(id=saga_id, step=step, effect_id=effect_id,
                                   stage="compensation" if compensation else "execution"),
        )
        scope = _Scope(saga_id, saga_context, span, effect_id)
        token = _SCOPE.set(scope)
        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):
            try:
                yield
            except BaseException as exc:
                _failed(span, type(exc).__name__)
                raise
            finally:
                _SCOPE.reset(token)
                _settle(span, scope)

    @contextlib.contextmanager
    def child_start(self, parent_trace: str | None, parent_id: str, step: str, child_id: str,
                    definition: str) -> Iterator[str | None]:
        """A ``saga.child <step>`` span for the parent's ``ctx.child`` step, under the parent's
        start (in its trace; linked to the current span, the delivery that got there), and the
        child's ``saga.start`` under it: the child's traceparent, so its spans sit under its
        parent's step and a sibling's never nest in them."""
        if not self.live():
            yield None
            return
        parent = self._stored_context(lambda: parent_trace)
        current = trace.get_current_span().get_span_context()
        links = (trace.Link(current),) if current.is_valid and parent is not None else ()
        step_span = self._tracer.start_span(f"saga.child {step}", context=parent, links=links,
                                            attributes=_attributes(id=parent_id, step=step,
                                                                   child=child_id))
        with trace.use_span(step_span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False), \
                self.operation("saga.start", child_id, definition=definition,
                               parent=parent_id) as note:
            yield self.traceparent()
            note()

    def _saga_context(self, request: Any) -> Any:
        carrier = {"traceparent": getattr(request, SAGA_TRACEPARENT, None),
                   "tracestate": getattr(request, SAGA_TRACESTATE, None)}
        present = {key: value for key, value in carrier.items() if isinstance(value, str)}
        if "traceparent" not in present:
            return None
        context = self._w3c.extract(present)
        return context if trace.get_current_span(context).get_span_context().is_valid else None

    # ------------------------------------------------------------ lifecycle events

    def observe(self, event: LifecycleEvent) -> None:
        """Record one lifecycle event: on the delivery's own effect it settles the delivery's
        outcome; every event is also a span event of the current saga span."""
        if not self.live():
            return
        scope = _SCOPE.get()
        span = scope.span if scope is not None else trace.get_current_span()
        if not span.is_recording():
            return
        if scope is not None and event.effect_id == scope.effect_id:
            scope.definition, scope.attempt = event.definition, event.attempt
            if event.phase in _OUTCOMES:
                scope.outcome, scope.error_code = str(event.phase), event.error_code
        span.add_event(f"saga.{event.phase}", _attributes(
            step=event.step, effect_id=event.effect_id, stage=str(event.stage),
            attempt=event.attempt, error_code=event.error_code,
        ))


def _attributes(**values: Any) -> dict[str, Any]:
    """``saga.<name>`` attributes of the values that are set (str, int or bool only)."""
    return {f"saga.{name}": value if isinstance(value, (bool, int)) else str(value)
            for name, value in values.items() if value is not None}


def _failed(span: Any, error_type: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))


def _settle(span: Any, scope: _Scope) -> None:
    """The delivery's outcome as its last lifecycle event said; ``skipped`` when it ran no body
    (a duplicate or late message: the claim was refused)."""
    span.set_attributes(_attributes(definition=scope.definition, attempt=scope.attempt,
                                    outcome=scope.outcome or "skipped",
                                    error_code=scope.error_code))
    if scope.outcome in (Phase.FAILED, Phase.AMBIGUOUS):
        span.set_status(trace.Status(trace.StatusCode.ERROR, scope.error_code or scope.outcome))


Tracing = OtelTracing | NoTracing
"""What ``open_tracing`` chooses: both are middlewares (``_middleware.py``)."""


def open_tracing() -> Tracing:
    """``OtelTracing`` when ``opentelemetry-api`` is installed, else ``NoTracing``."""
    return OtelTracing() if trace is not None else NoTracing()
