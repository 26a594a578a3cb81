"""Nothing a saga was given ever leaves the saga store: lifecycle events,
finding events, every log record of every logger, the Prometheus exposition and the effect
journal are captured while sagas run through every path (completion, compensation with a
failing compensator, ambiguity and its resolution, idempotent retries, a crashing run(), an
approval gate, a corrupt record), and none of them carries a marker planted in the saga
input, step arguments, results, exception messages or the approval token."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._events import FindingEvent, LifecycleEvent
from celery_sagas._protocol.effects import effects_of
from celery_sagas._records import SagaState
from celery_sagas.errors import ApprovalTokenInvalid
from celery_sagas.stores.base import Envelope
from celery_sagas.testing import FrozenClock
from tests.engine.conftest import ORDER, Shop

MARK = "MARKER"
SECRET = "approval-secret-for-engine-tests!"
BINDING = {"tenant_id": "t1", "principal_id": "alice"}


@pytest.fixture
def registry() -> CollectorRegistry:
    """The registry the metrics of this test go to."""
    return CollectorRegistry()


@pytest.fixture
def sagas(app: Celery, store: MemoryStore, clock: FrozenClock, registry: CollectorRegistry) -> Sagas:
    """Sagas with approvals and metrics (overrides the engine conftest's)."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock, approval_secrets=[SECRET],
                 metrics=registry)


class Capture:
    """Every lifecycle event and finding of the test."""

    def __init__(self, sagas: Sagas) -> None:
        self.events: list[LifecycleEvent] = []
        self.findings: list[FindingEvent] = []
        sagas.subscribe(self.events.append)
        sagas.subscribe_findings(self.findings.append)


def later(shop: Shop, ms: int) -> None:
    """Let time pass, sweep, and deliver what the sweep sent."""
    shop.clock.advance(ms)
    shop.sagas.sweep()
    shop.driver.run_until_idle()


def run_every_path(shop: Shop) -> str:
    """Drive marked sagas through every path; returns the approval token used."""
    tasks, script, sagas = shop.tasks, shop.script, shop.sagas
    note = {"note": f"{MARK}-INPUT-note"}

    # completes, with marked arguments and results
    script.then("reserve", {"reservation": f"{MARK}-RESULT-r1"})
    shop.start_order("m-1", sku=f"{MARK}-ARG-sku", **note)
    shop.driver.run_until_idle()

    # a known failure, then compensation whose first refund raises a marked message
    script.then("reserve", {"reservation": f"{MARK}-RESULT-r2"})
    script.then("ship", StepNotCommitted("out_of_stock", f"{MARK}-EXC-ship"))
    script.then("refund", RuntimeError(f"{MARK}-EXC-refund"))
    shop.start_order("m-2", card=f"{MARK}-ARG-card", **note)
    shop.driver.run_until_idle()
    later(shop, 60_000)

    # an unknown outcome, reported by sweeps, then resolved with a marked result
    script.then("charge", ConnectionError(f"{MARK}-EXC-charge"))
    shop.start_order("m-3", total=f"{MARK}-ARG-total", **note)
    shop.driver.run_until_idle()
    timing = sagas.settings.timing
    later(shop, timing.default_time_limit_ms + timing.grace_ms + 1)
    charge = shop.step("shop.charge", "m-3")
    sagas.resolve("m-3", "shop.charge", charge.effect_id, "committed",
                  result={"charge": f"{MARK}-RESULT-resolved"})
    sagas.resume("m-3")
    shop.driver.run_until_idle()

    # an idempotent step retried after a marked failure
    script.then("notify", ConnectionError(f"{MARK}-EXC-notify"))
    shop.notify_user.start({"user": f"{MARK}-ARG-user"}, saga_id="m-4")
    shop.driver.run_until_idle()

    # run() crashes with a marked message
    @sagas.saga("marked-crash")
    def crash(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(tasks["notify"], f"{MARK}-ARG-crash")
        raise ValueError(f"{MARK}-EXC-run {data}")

    crash.start({"secret": f"{MARK}-INPUT-crash"}, saga_id="m-5")
    shop.driver.run_until_idle()

    # an approval gate: a bogus token is refused, the real one resumes the saga
    @sagas.saga("marked-gate")
    def gated(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(tasks["reserve"], order["sku"], order["qty"])
        ctx.approval("manager", capability="orders.approve", **BINDING)
        return ctx.step(tasks["ship"], order["id"], stock["reservation"])

    gated.start({**ORDER, "sku": f"{MARK}-ARG-gated", **note}, saga_id="m-6")
    shop.driver.run_until_idle()
    [pending] = sagas.approvals.pending("m-6")
    sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="approved", decided_by="bob")
    with pytest.raises(ApprovalTokenInvalid):
        sagas.approvals.resume("m-6", f"{MARK}-TOKEN-bogus", **BINDING)
    sagas.approvals.resume("m-6", pending.token, **BINDING)
    shop.driver.run_until_idle()

    # a signal with a marked payload wakes a waiting child saga; the parent gets its result
    @sagas.saga("marked-child")
    def waiting_child(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.sleep(1)
        return ctx.wait_signal("paid")

    @sagas.saga("marked-parent")
    def parent(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.child(waiting_child, {"secret": f"{MARK}-INPUT-child"})

    parent.start({}, saga_id="m-8")
    later(shop, 1_000)
    child_id = shop.record("m-8").steps[0].kwargs["saga_id"]
    sagas.signal(child_id, "paid", {"card": f"{MARK}-SIGNAL-payload"}, signal_id="sig-1")
    shop.driver.run_until_idle()
    assert shop.record("m-8").result == {"card": f"{MARK}-SIGNAL-payload"}

    # a corrupt record whose body holds a marker
    body = f'{{"definition": "place-order", "input": "{MARK}-INPUT-corrupt"'
    assert shop.sagas.store.create(Envelope("saga", "m-7", 1, "manual-review", shop.clock.now_ms(), body))
    later(shop, 1)
    return pending.token


def effect_bodies(shop: Shop) -> list[str]:
    """Every effect of every saga, as the effect view derives it from the saga records."""
    capability = shop.sagas.engine.announcer.capability
    return [repr(effect) for saga_id in ("m-1", "m-2", "m-3", "m-4", "m-5", "m-6")
            for effect in effects_of(shop.record(saga_id), capability)]


def test_no_event_log_record_metric_or_effect_record_carries_a_payload_or_token(
    shop: Shop, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    # given: every logger at DEBUG, every event captured
    caplog.set_level(logging.DEBUG)
    for name in ("celery_sagas", "celery_sagas.events", "celery_sagas.findings",
                 "celery_sagas.sweep", "celery_sagas.engine"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.DEBUG
    capture = Capture(shop.sagas)

    # when
    token = run_every_path(shop)

    # then: the sagas took every path ...
    states = {saga_id: shop.record(saga_id).state
              for saga_id in ("m-1", "m-2", "m-3", "m-4", "m-6", "m-8")}
    assert states == {"m-1": SagaState.COMPLETED, "m-2": SagaState.COMPENSATED,
                      "m-3": SagaState.COMPLETED, "m-4": SagaState.COMPLETED,
                      "m-6": SagaState.COMPLETED, "m-8": SagaState.COMPLETED}
    assert shop.record("m-5").state == SagaState.MANUAL_REVIEW
    phases = {(e.stage, e.phase) for e in capture.events}
    assert phases >= {("execution", p) for p in ("intent", "executing", "committed", "failed", "ambiguous")}
    assert phases >= {("compensation", p) for p in ("intent", "executing", "committed", "failed")}
    assert ("reconciliation", "committed") in phases
    kinds = {f.kind for f in capture.findings}
    assert kinds >= {"ambiguous-execution", "ambiguous", "manual-review", "corrupt"}
    loggers = {r.name for r in caplog.records}
    assert loggers >= {"celery_sagas.events", "celery_sagas.findings", "celery_sagas.sweep"}
    exposition = generate_latest(registry).decode()
    assert "celery_sagas_effects_total" in exposition and "celery_sagas_sagas" in exposition
    journal = effect_bodies(shop)
    assert len(journal) >= 10

    # ... and nothing it captured carries a marker or the token
    def leaks(text: str) -> bool:
        return MARK in text or token in text

    formatter = logging.Formatter()
    assert [e for e in capture.events if leaks(repr(asdict(e)))] == []
    assert [f for f in capture.findings if leaks(repr(asdict(f)))] == []
    # The traceback of an ERROR line reporting what user code raised carries that exception's
    # own message (the user's business, issue 16 item 10); everything the library writes does not.
    def own(r: logging.LogRecord) -> dict[str, Any]:
        return {k: v for k, v in vars(r).items() if k not in ("exc_info", "exc_text")}

    assert [(r.name, r.getMessage()) for r in caplog.records
            if leaks(r.getMessage() + repr(own(r)))] == []
    assert [(r.name, r.getMessage()) for r in caplog.records
            if leaks(formatter.format(r)) and not (r.exc_info and "MARKER-EXC" in
                                                   formatter.formatException(r.exc_info))] == []
    assert not leaks(exposition)
    assert [body for body in journal if leaks(body)] == []
