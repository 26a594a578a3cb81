"""The middleware seam (docs/design.md §1.1): one chain whose hooks nest in order, whose
event hooks survive a failing member, and that sees every delivery, send, operation and
lifecycle event of a ``Sagas``."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_sagas import MemoryStore, Sagas
from celery_sagas._events import LifecycleEvent
from celery_sagas._middleware import Delivering, Middleware, Middlewares, Operation, Sending
from celery_sagas._protocol.findings import Finding
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver


class Recorder(Middleware):
    """Writes down every hook it sees, as ``(name, what)``."""

    def __init__(self, name: str, seen: list[tuple[str, str]]) -> None:
        self.name = name
        self.seen = seen

    @contextlib.contextmanager
    def _around(self, what: str) -> Iterator[None]:
        self.seen.append((self.name, f"enter {what}"))
        try:
            yield
        finally:
            self.seen.append((self.name, f"leave {what}"))

    def around_delivery(self, delivery: Delivering) -> contextlib.AbstractContextManager[None]:
        kind = "compensation" if delivery.compensation else "step"
        return self._around(f"delivery {kind} {delivery.step} {delivery.effect_id}")

    @contextlib.contextmanager
    def around_send(self, sending: Sending) -> Iterator[None]:
        sending.headers[f"x-{self.name}"] = sending.saga_id
        with self._around(f"send {sending.step}"):
            yield

    @contextlib.contextmanager
    def around_operation(self, operation: Operation) -> Iterator[None]:
        with self._around(f"operation {operation.name} {operation.saga_id}"):
            yield
        self.seen.append((self.name, f"noted {sorted((k, str(v)) for k, v in operation.noted.items())}"))

    def on_event(self, event: LifecycleEvent) -> None:
        self.seen.append((self.name, f"event {event.step} {event.phase}"))

    def on_finding(self, finding: Finding) -> None:
        self.seen.append((self.name, f"finding {finding.kind}"))


def test_around_hooks_nest_with_the_first_member_outermost_and_an_error_passes_through() -> None:
    # given
    seen: list[tuple[str, str]] = []
    chain = Middlewares([Recorder("a", seen)])
    chain.add(Recorder("b", seen))

    # when
    with pytest.raises(KeyError), chain.around_operation(Operation("saga.cancel", "s-1")):
        raise KeyError("boom")

    # then
    assert seen == [("a", "enter operation saga.cancel s-1"), ("b", "enter operation saga.cancel s-1"),
                    ("b", "leave operation saga.cancel s-1"), ("a", "leave operation saga.cancel s-1")]


def test_a_member_that_raises_on_an_event_is_logged_and_the_next_still_sees_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # given
    class Broken(Middleware):
        def on_event(self, event: LifecycleEvent) -> None:
            raise RuntimeError("middleware bug")

    seen: list[tuple[str, str]] = []
    chain = Middlewares([Broken(), Recorder("after", seen)])
    event = LifecycleEvent("fx-1", "execute", "execution", "committed", 1,  # type: ignore[arg-type]
                           "s-1", "d", "charge")

    # when
    chain.on_event(event)

    # then
    assert seen == [("after", "event charge committed")]
    assert any(r.levelno == logging.ERROR and "middleware" in r.getMessage() for r in caplog.records)


@pytest.fixture
def sagas() -> Sagas:
    """Sagas over the memory broker with a one-step saga."""
    app = Celery(f"middleware-{uuid.uuid4().hex[:8]}", broker="memory://localhost/",
                 set_as_current=False)
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True, clock=FrozenClock())

    @sagas.step(compensate=None, name="mw.pay")
    def pay(amount: int) -> str:
        return "paid"

    @sagas.saga("pay-once")
    def pay_once(ctx: Any, amount: int) -> None:
        ctx.step(pay, amount)

    return sagas


def test_a_start_runs_inside_the_operation_hook_and_its_message_carries_the_send_headers(
        sagas: Sagas) -> None:
    # given
    seen: list[tuple[str, str]] = []
    sagas.middlewares.add(Recorder("rec", seen))
    published: list[dict[str, Any]] = []

    def keep(headers: dict[str, Any] | None = None, **_: Any) -> None:
        published.append(dict(headers or {}))

    before_task_publish.connect(keep, weak=False)
    try:
        # when
        sagas.start("pay-once", 5, saga_id="m-1")
    finally:
        before_task_publish.disconnect(keep)

    # then
    assert [what for _, what in seen] == [
        "enter operation saga.start m-1", "event mw.pay intent", "enter send mw.pay",
        "leave send mw.pay", "leave operation saga.start m-1", "noted [('state', 'running')]",
    ]
    assert [h.get("x-rec") for h in published] == ["m-1"]


def test_a_delivery_runs_inside_the_delivery_hook_and_its_events_reach_the_chain(
        sagas: Sagas) -> None:
    # given
    seen: list[tuple[str, str]] = []
    sagas.middlewares.add(Recorder("rec", seen))
    driver = SagaDriver(sagas)
    sagas.start("pay-once", 5, saga_id="m-2")
    [message] = driver.take()
    seen.clear()

    # when
    driver.deliver(message)

    # then
    assert [what for _, what in seen] == [
        f"enter delivery step mw.pay {message.effect_id}", "event mw.pay executing",
        "event mw.pay committed", f"leave delivery step mw.pay {message.effect_id}",
    ]
    record = sagas.get("m-2")
    assert record is not None and record.state == "completed"
