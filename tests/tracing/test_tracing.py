"""Tracing in one process (docs/tracing.md): what ``start()``, operator actions, the dispatcher
and a delivery put in spans and message headers, and that nothing happens without a provider
or without the API."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_sagas import Sagas
from celery_sagas._celery import tracing
from celery_sagas.errors import SagaConflictError
from celery_sagas.testing import FrozenClock

SECRET = "CARD-4242-SECRET"


@pytest.fixture
def sagas() -> Sagas:
    """Sagas over the memory store and the memory broker, with a two-step saga."""
    app = Celery("tracing-unit", broker="memory://localhost/")
    sagas = Sagas(app, store="memory://", allow_non_durable=True)

    @sagas.step(compensate=None, name="unit.pay")
    def pay(card: str) -> str:
        return "paid"

    @sagas.saga("checkout")
    def checkout(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(pay, data["card"])
        ctx.step(pay, data["card"])

    return sagas


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """The headers of every message published while the test runs."""
    seen: list[dict[str, Any]] = []

    def keep(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.append(dict(headers or {}))

    before_task_publish.connect(keep, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(keep)


def _hex(number: int, width: int) -> str:
    return f"{number:0{width}x}"


def test_start_opens_a_span_whose_context_every_message_of_the_saga_carries(
        sagas: Sagas, tracer_provider: Any, published: list[dict[str, Any]]) -> None:
    # given
    _, exporter = tracer_provider

    # when
    sagas.start("checkout", {"card": SECRET}, saga_id="s-1")

    # then
    [start] = exporter.get_finished_spans()
    assert start.name == "saga.start"
    assert dict(start.attributes or {}) == {"saga.id": "s-1", "saga.definition": "checkout",
                                            "saga.state": "running"}
    assert [e.name for e in start.events] == ["saga.intent"]
    [headers] = published
    trace_id, span_id = _hex(start.context.trace_id, 32), _hex(start.context.span_id, 16)
    assert headers["saga_traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert headers["traceparent"] == headers["saga_traceparent"]
    assert SECRET not in str(start.to_json()) + str(headers)


def test_a_conflicting_start_marks_its_span_failed_with_the_error_type_only(
        sagas: Sagas, tracer_provider: Any) -> None:
    # given
    _, exporter = tracer_provider
    sagas.start("checkout", {"card": "a"}, saga_id="s-2")

    # when
    with pytest.raises(SagaConflictError):
        sagas.start("checkout", {"card": SECRET}, saga_id="s-2")

    # then
    failed = exporter.get_finished_spans()[-1]
    assert failed.status.status_code.name == "ERROR"
    assert failed.status.description == "SagaConflictError"
    assert failed.attributes is not None and failed.attributes["error.type"] == "SagaConflictError"
    assert not failed.events and SECRET not in failed.to_json()


def test_a_delivery_takes_its_parent_from_the_message_and_says_when_it_ran_nothing(
        tracer_provider: Any) -> None:
    # given: a message sent from inside another trace
    _, exporter = tracer_provider
    traced = tracing.OtelTracing()
    with traced.operation("saga.start", "s-4") as _note, traced.sending("s-4") as headers:
        pass
    [start] = exporter.get_finished_spans()
    request = SimpleNamespace(**headers, id="effect-1")

    # when: the delivery's claim is refused (no lifecycle event for its effect)
    with traced.delivery(request, "s-4", "unit.pay", "effect-1", compensation=False):
        pass

    # then
    delivery = exporter.get_finished_spans()[-1]
    assert delivery.name == "saga.step unit.pay"
    assert delivery.parent is not None and delivery.parent.span_id == start.context.span_id
    assert delivery.attributes is not None and delivery.attributes["saga.outcome"] == "skipped"


def test_without_a_tracer_provider_nothing_is_traced_or_added_to_messages(
        sagas: Sagas, published: list[dict[str, Any]]) -> None:
    # given: the API is installed, no provider is set
    assert isinstance(sagas.tracing, tracing.OtelTracing) and not sagas.tracing.live()

    # when
    sagas.start("checkout", {"card": SECRET}, saga_id="s-5")

    # then
    [headers] = published
    assert "traceparent" not in headers and "saga_traceparent" not in headers


def test_without_the_api_tracing_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the otel extra is not installed
    monkeypatch.setattr(tracing, "trace", None)

    # when
    chosen = tracing.open_tracing()

    # then
    assert isinstance(chosen, tracing.NoTracing)
    with chosen.operation("saga.start", "s-6") as note, chosen.sending("s-6") as headers:
        note(state="running")
        assert headers == {}


# ------------------------------------------------------------ the saga's stored trace context


@pytest.fixture
def clocked() -> tuple[Sagas, FrozenClock]:
    """Like ``sagas``, on a frozen clock and with a one-second staleness limit."""
    clock = FrozenClock()
    app = Celery("tracing-stored", broker="memory://localhost/")
    sagas = Sagas(app, store="memory://", allow_non_durable=True, clock=clock, stale_after=1.0)

    @sagas.step(compensate="unit.refund", name="unit.pay")
    def pay(card: str) -> str:
        return "paid"

    @sagas.compensator(name="unit.refund")
    def refund(card: str, *, result: Any = None) -> None:
        return None

    @sagas.saga("checkout")
    def checkout(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(pay, data["card"])

    return sagas, clock


def _traceparent(span: Any) -> str:
    context = span.context
    return f"00-{_hex(context.trace_id, 32)}-{_hex(context.span_id, 16)}-{int(context.trace_flags):02x}"


def _spans(exporter: Any, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _started(sagas: Sagas, exporter: Any, saga_id: str) -> Any:
    """Start a checkout saga; its ``saga.start`` span."""
    sagas.start("checkout", {"card": SECRET}, saga_id=saga_id)
    [start] = _spans(exporter, "saga.start")
    return start


def test_start_stores_the_traceparent_of_its_span_in_the_saga_record(
        sagas: Sagas, tracer_provider: Any) -> None:
    # given
    _, exporter = tracer_provider

    # when
    sagas.start("checkout", {"card": SECRET}, saga_id="t-1")

    # then
    [start] = _spans(exporter, "saga.start")
    record = sagas.get("t-1")
    assert record is not None and record.trace_parent == _traceparent(start)


def test_without_a_tracer_provider_no_traceparent_is_stored(sagas: Sagas) -> None:
    sagas.start("checkout", {"card": SECRET}, saga_id="t-2")
    record = sagas.get("t-2")
    assert record is not None and record.trace_parent is None


def test_a_lost_step_message_sent_again_by_the_sweep_joins_the_saga_trace(
        clocked: tuple[Sagas, FrozenClock], tracer_provider: Any,
        published: list[dict[str, Any]]) -> None:
    # given: a saga whose first step message nobody received, past the staleness limit
    sagas, clock = clocked
    _, exporter = tracer_provider
    start = _started(sagas, exporter, "t-3")
    clock.advance(5_000)

    # when: a sweep (in a trace of its own) sends it again
    report = sagas.sweep()

    # then: the message is sent from a saga.send span under the start, linked to the sweep
    assert report.acted == 1
    [sweep] = _spans(exporter, "saga.sweep")
    [send] = _spans(exporter, "saga.send unit.pay")
    assert sweep.context.trace_id != start.context.trace_id
    assert send.context.trace_id == start.context.trace_id
    assert send.parent is not None and send.parent.span_id == start.context.span_id
    assert [link.context.span_id for link in send.links] == [sweep.context.span_id]
    assert dict(send.attributes or {}) == {"saga.id": "t-3", "saga.step": "unit.pay"}
    first, again = published
    assert again["saga_traceparent"] == first["saga_traceparent"] == _traceparent(start)
    assert again["traceparent"] == _traceparent(send)
    assert SECRET not in str(send.to_json()) + str(again)


def test_an_operator_action_without_a_current_span_joins_the_saga_trace(
        clocked: tuple[Sagas, FrozenClock], tracer_provider: Any,
        published: list[dict[str, Any]]) -> None:
    # given: a saga started in one trace; a CLI with no span of its own
    sagas, _ = clocked
    _, exporter = tracer_provider
    start = _started(sagas, exporter, "t-4")

    # when
    sagas.cancel("t-4")

    # then: the cancel span is a child of the start, and what it sends carries the saga's context
    [cancel] = _spans(exporter, "saga.cancel")
    assert cancel.context.trace_id == start.context.trace_id
    assert cancel.parent is not None and cancel.parent.span_id == start.context.span_id
    assert all(h["saga_traceparent"] == _traceparent(start) for h in published)


def test_an_operator_action_inside_a_request_span_links_to_the_saga_trace(
        clocked: tuple[Sagas, FrozenClock], tracer_provider: Any) -> None:
    # given: a saga started in one trace; an operator acting from a traced web request
    sagas, _ = clocked
    provider, exporter = tracer_provider
    start = _started(sagas, exporter, "t-5")

    # when
    with provider.get_tracer("web").start_as_current_span("POST /sagas/t-5/cancel") as request:
        sagas.cancel("t-5")

    # then: the cancel span is the request's child, linked to the saga's start
    [cancel] = _spans(exporter, "saga.cancel")
    assert cancel.parent is not None and cancel.parent.span_id == request.get_span_context().span_id
    assert [link.context.span_id for link in cancel.links] == [start.context.span_id]


def test_a_stored_traceparent_that_cannot_be_read_leaves_the_action_in_its_own_trace(
        tracer_provider: Any) -> None:
    # given
    _, exporter = tracer_provider
    traced = tracing.OtelTracing()

    def broken() -> str | None:
        raise ConnectionError("store down")

    # when
    for stored in (broken, lambda: "not-a-traceparent", lambda: None):
        with traced.operation("saga.resume", "t-6", trace_parent=stored):
            pass

    # then: three root spans, nothing raised
    spans = _spans(exporter, "saga.resume")
    assert len(spans) == 3 and all(s.parent is None and not s.links for s in spans)
