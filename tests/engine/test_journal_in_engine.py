"""The effect journal in the engine (SPEC §2.1): every step execution and every compensation is
an effect record that follows the saga's lifecycle points with one write each; a journal that
cannot write never costs the saga its work; and the hot path reads nothing it wrote itself."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._journal import EffectJournal, EffectRecorder, journal_target
from celery_sagas._records import EffectRecord, EffectState, SagaState, StepState, effect_from_envelope
from celery_sagas.errors import NonDurableStoreError, StoreUnavailable
from celery_sagas.stores.base import Envelope, Fence, Page
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import HOST, Script, Shop, register_shop

SECRET = "approval-secret-for-engine-tests!"


class CountingStore(MemoryStore):
    """The reference store, counting every primitive call by (operation, record kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, str]] = Counter()

    def create(self, envelope: Envelope) -> bool:
        self.calls["create", envelope.kind] += 1
        return super().create(envelope)

    def get(self, kind: str, record_id: str) -> Envelope | None:
        self.calls["get", kind] += 1
        return super().get(kind, record_id)

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        self.calls["cas", envelope.kind] += 1
        return super().compare_and_set(envelope, expected_version, fence=fence)

    def scan(self, kind: str, states: Sequence[str], *, updated_before_ms: int | None = None,
             cursor: str | None = None, limit: int = 100) -> Page:
        self.calls["scan", kind] += 1
        return super().scan(kind, states, updated_before_ms=updated_before_ms, cursor=cursor,
                            limit=limit)

    def effect_calls(self) -> dict[str, int]:
        """Calls made on effect records, by operation."""
        return {op: n for (op, kind), n in self.calls.items() if kind == "effect"}


class FailingEffects(MemoryStore):
    """The reference store whose effect writes fail while ``failing`` is above zero."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = 0
        self.fail_only: str | None = None

    def _maybe_fail(self, envelope: Envelope) -> None:
        wanted = self.fail_only is None or envelope.state == self.fail_only
        if envelope.kind == "effect" and self.failing and wanted:
            self.failing -= 1
            raise StoreUnavailable("effect store down")

    def create(self, envelope: Envelope) -> bool:
        self._maybe_fail(envelope)
        return super().create(envelope)

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        self._maybe_fail(envelope)
        return super().compare_and_set(envelope, expected_version, fence=fence)


def effect(shop: Shop, effect_id: str) -> EffectRecord:
    """The journaled effect (it must exist)."""
    envelope = shop.sagas.store.get("effect", effect_id)
    assert envelope is not None, f"effect {effect_id} not journaled"
    return effect_from_envelope(envelope, effect_id)


def recorder_of(sagas: Sagas) -> EffectRecorder:
    """The engine's effect recorder (journaling is on)."""
    recorder = sagas.engine.journal
    assert recorder is not None
    return recorder


# ------------------------------------------------------------------ what is journaled


def test_a_committed_step_is_a_committed_effect_naming_its_saga_step_and_stage(shop: Shop) -> None:
    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.charge")
    record = effect(shop, step.effect_id)
    assert (record.state, record.version) == (EffectState.COMMITTED, 3)
    assert (record.saga_id, record.step, record.stage) == ("o-1", "shop.charge", "execution")
    assert record.capability == "saga.execute"


def test_every_step_of_a_completed_saga_is_journaled_and_no_compensation_is(shop: Shop) -> None:
    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    steps = shop.record().steps
    assert [effect(shop, s.effect_id).state for s in steps] == [EffectState.COMMITTED] * 3
    assert [shop.sagas.store.get("effect", s.compensation_effect_id) for s in steps] == [None] * 3


def test_a_compensation_is_a_committed_effect_under_the_compensation_effect_id(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.charge")
    record = effect(shop, step.compensation_effect_id)
    assert (record.state, record.stage, record.capability) == (
        EffectState.COMMITTED, "compensation", "saga.compensate")
    assert effect(shop, step.effect_id).state is EffectState.COMMITTED


def test_a_known_failure_fails_the_effect_with_its_error_code(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    record = effect(shop, shop.step("shop.ship").effect_id)
    assert (record.state, record.error_code) == (EffectState.FAILED, "out_of_stock")


def test_an_unknown_outcome_leaves_the_effect_unknown(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    record = effect(shop, shop.step("shop.charge").effect_id)
    assert (record.state, record.error_code) == (EffectState.UNKNOWN, "step_error")


def test_an_unclaimed_step_abandoned_by_a_cancel_fails_its_effect_as_never_started(shop: Shop) -> None:
    # given: reserve's intent is recorded, its message not yet delivered
    shop.start_order()
    shop.deliver_next()
    effect_id = shop.step("shop.reserve").effect_id
    assert effect(shop, effect_id).state is EffectState.ADMISSION

    # when
    shop.sagas.cancel("o-1")

    # then
    record = effect(shop, effect_id)
    assert (record.state, record.error_code) == (EffectState.FAILED, "not_started")


# ------------------------------------------------------------------ retries under one effect id


def test_an_idempotent_step_retried_inline_is_one_effect_that_stays_executing_until_it_commits(
    shop: Shop,
) -> None:
    # given
    shop.script.then("notify", ConnectionError("flaky"))

    # when
    shop.notify_user.start({"user": "u-1"}, saga_id="n-1")
    shop.driver.run_until_idle()

    # then: admission, executing, executing again (attempt 2 touched it), committed
    step = shop.step("shop.notify", "n-1")
    assert step.attempts == 2
    record = effect(shop, step.effect_id)
    assert (record.state, record.version) == (EffectState.COMMITTED, 4)


def test_an_idempotent_step_waiting_for_its_retry_keeps_its_effect_executing(shop: Shop) -> None:
    # given
    shop.script.then("sync", ConnectionError("flaky"))

    # when: the first attempt fails; the retry is a minute away
    shop.sync_user.start({"user": "u-1"}, saga_id="s-1")
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.sync", "s-1")
    assert step.state is StepState.EXECUTING and step.next_attempt_at_ms is not None
    assert effect(shop, step.effect_id).state is EffectState.EXECUTING


def test_a_compensation_retried_after_a_failure_is_one_effect_that_ends_committed(shop: Shop) -> None:
    # given: release fails once
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.script.then("release", RuntimeError("inventory down"))
    shop.start_order()
    shop.driver.run_until_idle()
    effect_id = shop.step("shop.reserve").compensation_effect_id
    assert effect(shop, effect_id).state is EffectState.EXECUTING

    # when
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert effect(shop, effect_id).state is EffectState.COMMITTED


def test_an_exhausted_compensation_stays_executing_until_the_operator_settles_it(shop: Shop) -> None:
    # given: release fails on every attempt
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.script.then("release", *[RuntimeError("inventory down")] * 3)
    shop.start_order()
    shop.driver.run_until_idle()
    for _ in range(3):
        shop.clock.advance(60_000)
        shop.sagas.sweep()
        shop.driver.run_until_idle()
    step = shop.step("shop.reserve")
    assert shop.record().state == SagaState.MANUAL_REVIEW
    assert effect(shop, step.compensation_effect_id).state is EffectState.EXECUTING

    # when
    shop.sagas.resolve("o-1", "shop.reserve", step.compensation_effect_id, "compensated")

    # then
    assert effect(shop, step.compensation_effect_id).state is EffectState.COMMITTED


# ------------------------------------------------------------------ operator resolution


@pytest.mark.parametrize(("outcome", "state"), [("committed", EffectState.COMMITTED),
                                                 ("not-committed", EffectState.FAILED)])
def test_resolving_an_ambiguous_step_settles_its_unknown_effect(
    shop: Shop, outcome: str, state: EffectState
) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()
    shop.driver.run_until_idle()
    effect_id = shop.step("shop.charge").effect_id

    # when
    shop.sagas.resolve("o-1", "shop.charge", effect_id, outcome, result={"charge": "ch-1"})

    # then
    assert effect(shop, effect_id).state is state


def test_a_compensation_whose_worker_died_is_unknown_until_resolved(shop: Shop, dead_pid: int) -> None:
    # given: refund was claimed by a worker that died, so the redelivery finds it ambiguous
    message = shop.refund_pending()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.charge", compensation=True)
    shop.driver.deliver(message)
    effect_id = shop.step("shop.charge").compensation_effect_id
    assert effect(shop, effect_id).state is EffectState.UNKNOWN

    # when
    shop.sagas.resolve("o-1", "shop.charge", effect_id, "compensated")

    # then
    assert effect(shop, effect_id).state is EffectState.COMMITTED


# ------------------------------------------------------------------ capabilities


def test_capability_comes_from_the_step_then_the_definition_then_the_default(shop: Shop) -> None:
    # given
    sagas = shop.sagas

    @sagas.step(name="pay.charge", compensate="pay.refund", capability="payments.charge")
    def charge(amount: int) -> Any:
        return {"ok": amount}

    @sagas.step(name="pay.note", compensate=None)
    def note(text: str) -> Any:
        return {"noted": True}

    @sagas.compensator(name="pay.refund", capability="payments.refund")
    def refund(amount: int, *, result: Any = None) -> None:
        return None

    @sagas.saga("pay", capability="payments.flow")
    def pay(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(charge, data["amount"])
        ctx.step(note, "done")
        raise StepNotCommitted("changed_mind")

    # when
    pay.start({"amount": 5}, saga_id="p-1")
    shop.driver.run_until_idle()

    # then
    charged, noted = shop.record("p-1").steps
    assert effect(shop, charged.effect_id).capability == "payments.charge"
    assert effect(shop, noted.effect_id).capability == "payments.flow"
    assert effect(shop, charged.compensation_effect_id).capability == "payments.refund"


def test_a_saga_capability_is_validated_when_the_saga_is_defined(shop: Shop) -> None:
    with pytest.raises(ValueError):
        shop.sagas.saga("bad", capability="Not A Capability")


# ------------------------------------------------------------------ cost


@pytest.fixture
def counting() -> CountingStore:
    return CountingStore()


def test_each_step_costs_one_create_and_two_writes_and_no_read_of_the_journal(
    app: Celery, counting: CountingStore, clock: FrozenClock
) -> None:
    # given
    sagas = Sagas(app, store=counting, allow_non_durable=True, clock=clock)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())
    definitions["place-order"].start({"id": "o-1", "sku": "s", "qty": 1, "card": "c", "total": 1},
                                     saga_id="o-1")

    # when
    driver.run_until_idle()

    # then: three steps, each admitted (create), begun and committed (two CAS), never read
    assert sagas.engine.load("o-1").state == SagaState.COMPLETED
    assert counting.effect_calls() == {"create": 3, "cas": 6}


def test_a_step_claimed_where_its_intent_was_not_written_reads_the_journal_once(
    app: Celery, counting: CountingStore, clock: FrozenClock
) -> None:
    # given: the intent is written, then the process forgets it (another worker claims it)
    sagas = Sagas(app, store=counting, allow_non_durable=True, clock=clock)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    for message in driver.take():
        driver.deliver(message)
    recorder_of(sagas).clear()
    counting.calls.clear()

    # when
    driver.run_until_idle()

    # then
    assert counting.effect_calls() == {"get": 1, "cas": 2}


def test_a_stale_remembered_record_loses_its_write_and_is_read_again(shop: Shop) -> None:
    # given: the intent is journaled here; another process begins the effect meanwhile
    shop.start_order()
    shop.deliver_next()
    effect_id = shop.step("shop.reserve").effect_id
    EffectJournal(shop.sagas.store, shop.clock, allow_non_durable=True).begin(effect_id)

    # when
    shop.driver.run_until_idle()

    # then: admission, begun elsewhere, touched here, committed
    record = effect(shop, effect_id)
    assert (record.state, record.version) == (EffectState.COMMITTED, 4)


# ------------------------------------------------------------------ failures and settings


def test_a_journal_that_cannot_write_never_stops_the_saga(
    app: Celery, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    # given
    store = FailingEffects()
    store.failing = 10_000
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())
    recorder_of(sagas).retry_delays_s = (0.0, 0.0)
    caplog.set_level(logging.WARNING, logger="celery_sagas.journal")

    # when
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    driver.run_until_idle()

    # then
    record = sagas.engine.load("n-1")
    assert record.state == SagaState.COMPLETED
    assert store.get("effect", record.steps[0].effect_id) is None
    skipped = [r for r in caplog.records if r.name == "celery_sagas.journal"]
    assert len(skipped) == 3
    assert {getattr(r, "effect_id", None) for r in skipped} == {record.steps[0].effect_id}


def test_a_journal_write_that_fails_once_is_retried(app: Celery, clock: FrozenClock) -> None:
    # given: the first write of each kind fails
    store = FailingEffects()
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())
    recorder_of(sagas).retry_delays_s = (0.0,)

    # when
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    for message in driver.take():
        store.failing = 1
        driver.deliver(message)
    store.failing = 1
    driver.run_until_idle()

    # then
    effect_id = sagas.engine.load("n-1").steps[0].effect_id
    envelope = store.get("effect", effect_id)
    assert envelope is not None and envelope.state == "committed"


def test_an_effect_left_executing_by_a_failed_write_is_reported_by_the_sweep(
    app: Celery, clock: FrozenClock
) -> None:
    # given: the commit of the effect cannot be written
    store = FailingEffects()
    store.failing, store.fail_only = 10_000, "committed"
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())
    recorder_of(sagas).retry_delays_s = ()
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    driver.run_until_idle()
    effect_id = sagas.engine.load("n-1").steps[0].effect_id

    # when: past the longest time limit and its grace
    timing = sagas.settings.timing
    clock.advance(timing.default_time_limit_ms + timing.grace_ms + 1)
    report = sagas.sweep()

    # then
    assert sagas.engine.load("n-1").state == SagaState.COMPLETED
    assert [(str(f.kind), f.record_kind, f.effect_id) for f in report.findings] == [
        ("ambiguous", "effect", effect_id)]


def test_journal_off_writes_no_effect_record(app: Celery, store: MemoryStore, clock: FrozenClock) -> None:
    # given
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, journal=False)
    driver = SagaDriver(sagas)
    _, definitions = register_shop(sagas, Script())

    # when
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    driver.run_until_idle()

    # then
    assert sagas.engine.load("n-1").state == SagaState.COMPLETED
    assert store.scan("effect", [str(s) for s in EffectState], limit=1000).items == ()


@pytest.mark.parametrize("store_arg", [MemoryStore(), "memory://"])
def test_a_non_durable_store_is_refused_unless_allowed(store_arg: Any) -> None:
    app = Celery(f"refused-{uuid.uuid4().hex[:8]}", set_as_current=False)
    with pytest.raises(NonDurableStoreError):
        Sagas(app, store=store_arg)


def test_a_non_durable_store_without_a_journal_is_accepted() -> None:
    app = Celery(f"unjournaled-{uuid.uuid4().hex[:8]}", set_as_current=False)
    assert Sagas(app, store=MemoryStore(), journal=False).engine.journal is None


def test_an_approval_gate_is_not_journaled_as_an_effect(store: MemoryStore, clock: FrozenClock) -> None:
    # given
    app = Celery(f"gates-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, approval_secrets=[SECRET])
    driver = SagaDriver(sagas)
    tasks, _ = register_shop(sagas, Script())

    @sagas.saga("gated")
    def gated(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(tasks["notify"], data["user"])
        ctx.approval("boss", capability="orders.approve", tenant_id="t1", principal_id="alice")
        return ctx.step(tasks["sync"], data["user"])

    gated.start({"user": "u-1"}, saga_id="g-1")
    driver.run_until_idle()
    [pending] = sagas.approvals.pending("g-1")

    # when
    sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="approved", decided_by="bob")
    sagas.approvals.resume("g-1", pending.token, tenant_id="t1", principal_id="alice")
    driver.run_until_idle()

    # then
    notify, gate, sync = sagas.engine.load("g-1").steps
    assert store.get("effect", gate.effect_id) is None
    assert [store.get("effect", s.effect_id) is not None for s in (notify, sync)] == [True, True]


# ------------------------------------------------------------------ the mapping, as a table


@pytest.mark.parametrize(
    ("phase", "step_state", "target"),
    [
        ("intent", StepState.EXECUTING, EffectState.ADMISSION),
        ("intent", StepState.COMPENSATING, EffectState.ADMISSION),
        ("executing", StepState.EXECUTING, EffectState.EXECUTING),
        ("committed", StepState.COMMITTED, EffectState.COMMITTED),
        ("committed", StepState.COMPENSATED, EffectState.COMMITTED),
        ("failed", StepState.FAILED, EffectState.FAILED),
        ("failed", StepState.EXECUTING, None),
        ("failed", StepState.COMPENSATION_FAILED, None),
        ("ambiguous", StepState.AMBIGUOUS, EffectState.UNKNOWN),
        ("ambiguous", StepState.COMPENSATING, EffectState.UNKNOWN),
    ],
)
def test_each_lifecycle_point_maps_to_one_journal_state(
    phase: str, step_state: StepState, target: EffectState | None
) -> None:
    assert journal_target(phase, step_state) is target
