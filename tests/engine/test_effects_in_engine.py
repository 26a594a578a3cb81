"""Effects in the engine (docs/design.md §2.3): every step execution and every compensation is an
effect whose state is derived from the saga record, written in the same atomic write as the
saga (no journal round trip), so a step costs exactly two store round trips: the claim note
and the settle."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._protocol.effects import effects_of
from celery_sagas._records import EffectRecord, EffectState, SagaState, StepState
from celery_sagas.errors import NonDurableStoreError, SagaConfigurationError
from celery_sagas.stores.base import Envelope, Fence
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import HOST, Script, Shop, register_shop

SECRET = "approval-secret-for-engine-tests!"


class CountingStore(MemoryStore):
    """The reference store, counting every record primitive call by operation."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def create(self, envelope: Envelope) -> bool:
        self.calls["create"] += 1
        return super().create(envelope)

    def get(self, kind: str, record_id: str) -> Envelope | None:
        self.calls["get"] += 1
        return super().get(kind, record_id)

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        self.calls["cas"] += 1
        return super().compare_and_set(envelope, expected_version, fence=fence)

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        self.calls["annotate"] += 1
        return super().annotate(kind, record_id, note, expected_version=expected_version)


def effect(shop: Shop, effect_id: str, saga_id: str = "o-1") -> EffectRecord:
    """The effect of ``effect_id`` as the saga record says (it must exist)."""
    found = [e for e in effects_of(shop.record(saga_id), shop.sagas.engine.announcer.capability)
             if e.effect_id == effect_id]
    assert found, f"no effect {effect_id}"
    return found[0]


def has_effect(shop: Shop, effect_id: str, saga_id: str = "o-1") -> bool:
    """Whether the saga record has an effect of that id (a compensation that never began has none)."""
    return any(e.effect_id == effect_id
               for e in effects_of(shop.record(saga_id), shop.sagas.engine.announcer.capability))


# ------------------------------------------------------------------ what each effect says


def test_a_committed_step_is_a_committed_effect_naming_its_saga_step_and_stage(shop: Shop) -> None:
    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.charge")
    record = effect(shop, step.effect_id)
    assert record.state is EffectState.COMMITTED
    assert (record.saga_id, record.step, record.stage) == ("o-1", "shop.charge", "execution")
    assert record.capability == "saga.execute"


def test_every_step_of_a_completed_saga_is_journaled_and_no_compensation_is(shop: Shop) -> None:
    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    steps = shop.record().steps
    assert [effect(shop, s.effect_id).state for s in steps] == [EffectState.COMMITTED] * 3
    assert [has_effect(shop, s.compensation_effect_id) for s in steps] == [False] * 3


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

    # then: one effect id for both attempts, committed once the second one did
    step = shop.step("shop.notify", "n-1")
    assert step.attempts == 2
    assert effect(shop, step.effect_id, "n-1").state is EffectState.COMMITTED


def test_an_idempotent_step_waiting_for_its_retry_keeps_its_effect_executing(shop: Shop) -> None:
    # given
    shop.script.then("sync", ConnectionError("flaky"))

    # when: the first attempt fails; the retry is a minute away
    shop.sync_user.start({"user": "u-1"}, saga_id="s-1")
    shop.driver.run_until_idle()

    # then
    step = shop.step("shop.sync", "s-1")
    assert step.state is StepState.EXECUTING and step.next_attempt_at_ms is not None
    assert effect(shop, step.effect_id, "s-1").state is EffectState.EXECUTING


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
    assert effect(shop, charged.effect_id, "p-1").capability == "payments.charge"
    assert effect(shop, noted.effect_id, "p-1").capability == "payments.flow"
    assert effect(shop, charged.compensation_effect_id, "p-1").capability == "payments.refund"


def test_a_saga_capability_is_validated_when_the_saga_is_defined(shop: Shop) -> None:
    with pytest.raises(ValueError):
        shop.sagas.saga("bad", capability="Not A Capability")


# ------------------------------------------------------------------ cost


@pytest.fixture
def counting() -> CountingStore:
    return CountingStore()


def _shop_on(app: Celery, store: MemoryStore, clock: FrozenClock) -> tuple[Sagas, SagaDriver, Any]:
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock)
    _, definitions = register_shop(sagas, Script())
    return sagas, SagaDriver(sagas), definitions


def test_a_saga_costs_one_create_and_two_round_trips_per_step(
    app: Celery, counting: CountingStore, clock: FrozenClock
) -> None:
    # given
    sagas, driver, definitions = _shop_on(app, counting, clock)
    order = {"id": "o-1", "sku": "s", "qty": 1, "card": "c", "total": 1}

    # when
    definitions["place-order"].start(order, saga_id="o-1")
    driver.run_until_idle()

    # then: start creates the saga with its first step; each step is claimed by a note (no
    # read) and settled by one write that also records the next step's intent
    assert sagas.engine.load("o-1").state == SagaState.COMPLETED
    counting.calls.pop("get")  # the load just above
    assert counting.calls == {"create": 1, "annotate": 3, "cas": 3}


def test_a_step_delivered_to_a_process_that_never_saw_its_saga_claims_without_a_read(
    app: Celery, counting: CountingStore, clock: FrozenClock
) -> None:
    # given: the saga was started by another process (this one forgets what it wrote)
    sagas, driver, definitions = _shop_on(app, counting, clock)
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    sagas.engine.repository.recent.forget("n-1")
    counting.calls.clear()

    # when
    driver.run_until_idle()

    # then: the message's version was enough to claim on
    assert counting.calls == {"annotate": 1, "cas": 1}


def test_a_claim_on_a_version_that_moved_on_reads_the_record_once_and_claims_again(
    app: Celery, counting: CountingStore, clock: FrozenClock
) -> None:
    # given: after the intent, something else wrote the saga (its message's version is stale)
    sagas, driver, definitions = _shop_on(app, counting, clock)
    definitions["notify-user"].start({"user": "u-1"}, saga_id="n-1")
    record = sagas.engine.load("n-1")
    sagas.engine.repository.write(record, record.__class__(**{**_fields(record), "version": 2}))
    sagas.engine.repository.recent.forget("n-1")
    counting.calls.clear()

    # when
    driver.run_until_idle()

    # then
    assert sagas.engine.load("n-1").state == SagaState.COMPLETED
    counting.calls["get"] -= 1  # the load just above
    assert counting.calls == {"annotate": 2, "get": 1, "cas": 1}


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__slots__}


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("store_arg", [MemoryStore(), "memory://"])
def test_a_non_durable_store_is_refused_unless_allowed(store_arg: Any) -> None:
    app = Celery(f"refused-{uuid.uuid4().hex[:8]}", set_as_current=False)
    with pytest.raises(NonDurableStoreError):
        Sagas(app, store=store_arg)


def test_the_removed_journal_option_says_why(store: MemoryStore) -> None:
    app = Celery(f"journal-{uuid.uuid4().hex[:8]}", set_as_current=False)
    with pytest.raises(SagaConfigurationError, match="derived from the saga records"):
        Sagas(app, store=store, allow_non_durable=True, journal=False)


def test_an_approval_gate_has_no_effect(store: MemoryStore, clock: FrozenClock) -> None:
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
    record = sagas.engine.load("g-1")
    notify, gate, sync = record.steps
    effects = {e.effect_id for e in effects_of(record, sagas.engine.announcer.capability)}
    assert gate.effect_id not in effects
    assert {notify.effect_id, sync.effect_id} <= effects
