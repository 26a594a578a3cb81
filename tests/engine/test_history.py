"""A saga's history (docs/design.md §2.6), driven in-process: every transition appended by the
write that makes it, operator actions with their actor and reason, never rewritten, bounded,
in clear beside sealed payloads, handed to the archive."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_sagas import HistoryEvent, MemoryStore, Sagas, SagaState, StepNotCommitted
from celery_sagas._protocol import codes
from celery_sagas._records import SAGA, HistoryEntry
from celery_sagas.errors import SagaNotFound, SagaValidationError
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, Shop, register_shop
from tests.engine.test_jitter import drawing

E = HistoryEvent
SECRET = "approval-secret-for-engine-tests!"
BINDING: dict[str, str] = {"tenant_id": "t1", "principal_id": "alice"}


def _shop(sagas: Sagas, clock: FrozenClock, script: Script) -> Shop:
    tasks, definitions = register_shop(sagas, script)
    return Shop(sagas, SagaDriver(sagas), clock, script, tasks, definitions)


def events(shop: Shop, saga_id: str = "o-1") -> list[tuple[Any, ...]]:
    """(event, step) of each history entry."""
    return [(e.event, e.step) for e in shop.sagas.history(saga_id)]


def ambiguous_charge(shop: Shop) -> str:
    """An order in manual review because charge's outcome is unknown; charge's effect id."""
    shop.script.then("charge", ConnectionError("reset after the request left"))
    shop.start_order()
    shop.driver.run_until_idle()
    assert shop.record().state is SagaState.MANUAL_REVIEW
    return shop.step("shop.charge").effect_id


def test_a_completed_saga_lists_each_step_in_order(shop: Shop) -> None:
    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    per_step = [(ev, s) for ev, s in events(shop) if s is not None]
    assert events(shop)[0] == (E.CREATED, None)
    assert per_step == [
        (ev, f"shop.{name}") for name in ("reserve", "charge", "ship")
        for ev in (E.INTENT, E.CLAIMED, E.COMMITTED)
    ]
    assert events(shop)[-1] == (E.STATE, None)
    assert shop.sagas.history("o-1").entries[-1].state == "completed"
    times = [e.at_ms for e in shop.sagas.history("o-1")]
    assert times == sorted(times)


def test_resolve_after_an_ambiguity_keeps_the_ambiguity_its_cause_and_the_operator(
    shop: Shop,
) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    shop.sagas.resolve("o-1", "shop.charge", effect_id, "committed", result={"charge": "c-1"},
                       actor="alice", reason="provider says it went through")

    # then
    history = shop.sagas.history("o-1").entries
    ambiguity = next(e for e in history if e.event is E.AMBIGUOUS)
    resolution = next(e for e in history if e.event is E.RESOLVE)
    assert (ambiguity.step, ambiguity.code) == ("shop.charge", codes.STEP_ERROR)
    review = next(e for e in history if e.event is E.STATE and e.state == "manual-review")
    assert review.code == codes.AMBIGUOUS_STEP
    assert (resolution.step, resolution.state, resolution.actor, resolution.reason) == (
        "shop.charge", "committed", "alice", "provider says it went through")
    assert history.index(ambiguity) < history.index(resolution)
    assert history[history.index(resolution) + 1].event is E.COMMITTED


def test_resume_and_its_actor_are_recorded(shop: Shop) -> None:
    # given: an order whose refund failed until its budget ran out
    shop.script.then("refund", *[RuntimeError("refund down")] * 3)
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order()
    for _ in range(10):
        shop.driver.run_until_idle()
        shop.clock.advance(60_000)
        shop.sagas.sweep()
    assert shop.record().state is SagaState.MANUAL_REVIEW

    # when
    shop.sagas.resume("o-1", actor="bob", reason="refund provider is back")
    shop.driver.run_until_idle()

    # then
    history = list(shop.sagas.history("o-1"))
    [resumed] = [e for e in history if e.event is E.RESUME]
    assert (resumed.actor, resumed.reason) == ("bob", "refund provider is back")
    assert shop.record().state is SagaState.COMPENSATED
    exhausted = [e for e in history if e.event is E.COMPENSATION_FAILED]
    assert len(exhausted) == 3 and all(e.step == "shop.charge" for e in exhausted)
    assert history.index(exhausted[-1]) < history.index(resumed)


def test_a_compensator_that_failed_and_was_sent_again_in_one_write_is_recorded_as_failed(
        shop: Shop) -> None:
    # given: the jitter draws 0, so a failed compensator's retry is due when its failure is
    # written, and that write sends the retry too (its claim cleared, attempt 2 dispatched)
    drawing(shop, lambda: 0.0)
    shop.script.then("refund", RuntimeError("refund down"))
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then: the attempt that ran and failed is told as failed, never as a claim taken back
    # (which says the body never began)
    charge = [(e.event, e.attempt) for e in shop.sagas.history("o-1") if e.step == "shop.charge"]
    assert (E.CLAIM_WITHDRAWN, 1) not in charge
    assert charge[-6:] == [(E.COMPENSATION_INTENT, 1), (E.COMPENSATION_CLAIMED, 1),
                           (E.COMPENSATION_FAILED, 1), (E.COMPENSATION_INTENT, 2),
                           (E.COMPENSATION_CLAIMED, 2), (E.COMPENSATED, 2)]
    assert shop.record().state is SagaState.COMPENSATED


def test_cancel_records_its_actor_and_the_compensation_it_caused(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.deliver_next()  # reserve commits

    # when
    shop.sagas.cancel("o-1", actor="carol", reason="customer asked")
    shop.driver.run_until_idle()

    # then
    kinds = events(shop)
    cancel = kinds.index((E.CANCEL, None))
    assert kinds[cancel + 1] == (E.STATE, None)
    assert (E.COMPENSATION_INTENT, "shop.reserve") in kinds[cancel:]
    assert (E.COMPENSATED, "shop.reserve") in kinds[cancel:]
    [entry] = [e for e in shop.sagas.history("o-1") if e.event is E.CANCEL]
    assert (entry.actor, entry.reason) == ("carol", "customer asked")


def test_a_known_failure_and_the_compensations_are_each_recorded(shop: Shop) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    history = list(shop.sagas.history("o-1"))
    failed = next(e for e in history if e.event is E.FAILED)
    assert (failed.step, failed.code) == ("shop.ship", "out_of_stock")
    undone = [e.step for e in history if e.event is E.COMPENSATED]
    assert undone == ["shop.charge", "shop.reserve"]
    assert [e.state for e in history if e.event is E.STATE] == ["compensating", "compensated"]


@pytest.mark.parametrize(("actor", "reason"), [("two words", None), ("x" * 129, None),
                                               ("alice", "line\nforged"), ("alice", "")])
def test_a_malformed_actor_or_reason_is_refused_and_writes_nothing(
    shop: Shop, actor: str, reason: str | None
) -> None:
    # given
    shop.start_order()
    before = shop.record()

    # when / then
    with pytest.raises(SagaValidationError):
        shop.sagas.cancel("o-1", actor=actor, reason=reason)
    assert shop.record() == before


def test_a_signal_is_recorded_with_its_sender(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    shop.sagas.signal("o-1", "address-changed", {"street": "secret"}, signal_id="sig-1",
                      actor="support-7", reason="called in")

    # then
    [signal] = [e for e in shop.sagas.history("o-1") if e.event is E.SIGNAL]
    assert (signal.code, signal.ref, signal.actor, signal.reason) == (
        "address-changed", "sig-1", "support-7", "called in")
    assert "secret" not in repr(shop.sagas.history("o-1"))


def test_the_history_of_an_unknown_saga_is_not_found(shop: Shop) -> None:
    with pytest.raises(SagaNotFound):
        shop.sagas.history("nope")


# ---------------------------------------------------------------- bound


@pytest.fixture
def bounded(app: Celery, store: MemoryStore, clock: FrozenClock, script: Script) -> Shop:
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, history_limit=10)
    shop = _shop(sagas, clock, script)
    return shop


def test_past_the_bound_the_oldest_entries_fold_into_a_count(bounded: Shop) -> None:
    # when
    bounded.start_order()
    bounded.driver.run_until_idle()

    # then: 1 creation + 3 x 3 step entries + 1 state = 11 entries, 10 kept
    history = bounded.sagas.history("o-1")
    assert (len(history), history.folded) == (10, 1)
    assert history.entries[0].event is E.INTENT
    assert history.entries[-1].state == "completed"


def test_the_bound_must_be_sane(app: Celery, store: MemoryStore) -> None:
    from celery_sagas.errors import SagaConfigurationError

    with pytest.raises(SagaConfigurationError, match="sagas_history_limit"):
        Sagas(app, store=store, allow_non_durable=True, history_limit=3)


# ---------------------------------------------------------------- approvals


@pytest.fixture
def gated_shop(app: Celery, store: MemoryStore, clock: FrozenClock, script: Script) -> Shop:
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock,
                  approval_secrets=[SECRET])
    shop = _shop(sagas, clock, script)
    reserve = shop.tasks["reserve"]

    @sagas.saga("gated")
    def gated(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(reserve, order["sku"], order["qty"])
        return ctx.approval("manager", capability="orders.approve", target=order["id"], **BINDING)

    shop.definitions["gated"] = gated
    gated.start(ORDER, saga_id="o-1")
    shop.driver.run_until_idle()
    return shop


def test_a_cancel_keeps_the_approval_wait_it_ended(gated_shop: Shop) -> None:
    # given
    clock = gated_shop.clock
    requested = next(e for e in gated_shop.sagas.history("o-1")
                     if e.event is E.APPROVAL_REQUESTED)
    clock.advance(7 * 60_000)

    # when
    gated_shop.sagas.cancel("o-1", actor="carol")
    gated_shop.driver.run_until_idle()

    # then
    history = list(gated_shop.sagas.history("o-1"))
    assert requested in history
    cancel = next(e for e in history if e.event is E.CANCEL)
    assert cancel.at_ms - requested.at_ms == 7 * 60_000
    assert gated_shop.record().state is SagaState.COMPENSATED


def test_an_approval_and_a_denial_name_who_decided_and_why(gated_shop: Shop) -> None:
    # given
    [pending] = gated_shop.sagas.approvals.pending("o-1")

    # when
    gated_shop.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="denied",
                                      decided_by="boss", reason="over budget")
    gated_shop.driver.run_until_idle()

    # then
    history = list(gated_shop.sagas.history("o-1"))
    deny = next(e for e in history if e.event is E.DENY)
    decided = history[history.index(deny) + 1]
    assert (deny.actor, deny.reason, deny.ref) == ("boss", "over budget", pending.approval_id)
    assert (decided.event, decided.state, decided.code) == (
        E.APPROVAL_DECIDED, "failed", codes.APPROVAL_DENIED)


def test_an_approval_is_recorded_when_granted_and_when_its_token_is_used(
    gated_shop: Shop,
) -> None:
    # given
    [pending] = gated_shop.sagas.approvals.pending("o-1")

    # when
    gated_shop.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="approved",
                                      decided_by="boss")
    gated_shop.sagas.approvals.resume("o-1", pending.token, **BINDING)

    # then
    history = list(gated_shop.sagas.history("o-1"))
    approve = next(e for e in history if e.event is E.APPROVE)
    decided = next(e for e in history if e.event is E.APPROVAL_DECIDED)
    assert approve.actor == decided.actor == "boss"
    assert decided.state == "committed"
    assert gated_shop.record().state is SagaState.COMPLETED


# ---------------------------------------------------------------- storage


def test_the_history_is_kept_in_clear_beside_sealed_payloads(
    app: Celery, store: MemoryStore, clock: FrozenClock, script: Script,
) -> None:
    # given
    from cryptography.fernet import Fernet

    key = Fernet.generate_key()
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, encryption_keys=[key])
    shop = _shop(sagas, clock, script)

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    body = store.get(SAGA, "o-1")
    assert body is not None
    assert '"_history":' in body.body and ORDER["card"] not in body.body
    keyless = Sagas(Celery("keyless", set_as_current=False), store=store,
                    allow_non_durable=True, clock=clock)
    assert list(keyless.history("o-1")) == list(sagas.history("o-1"))


def test_the_history_does_not_count_against_the_payload_limit(shop: Shop) -> None:
    # given: a record whose history alone is larger than the rest
    shop.start_order()
    shop.driver.run_until_idle()
    record = shop.record()
    codec = shop.sagas.engine.repository.codec
    many = tuple(HistoryEntry(record.updated_at_ms, E.RESENT, "shop.ship", 1)
                 for _ in range(200))
    from dataclasses import replace

    big = replace(record, history=many)
    plain = len(codec.saga_envelope(replace(record, history=())).body)

    # when
    envelope = codec.saga_envelope(big, stamp=True)

    # then
    assert len(envelope.body) > plain + 200 * 20
    assert codec.saga(envelope, "o-1").history == many


def test_a_release_that_knew_no_history_reads_back_unchanged(shop: Shop) -> None:
    # given: a body as an earlier release wrote it
    shop.start_order()
    codec = shop.sagas.engine.repository.codec
    from dataclasses import replace

    old = replace(shop.record(), history=(), history_folded=0)

    # when
    envelope = codec.saga_envelope(old)

    # then
    assert "_history" not in envelope.body
    assert codec.saga(envelope, "o-1") == old


@pytest.mark.parametrize("history", ['"no list"', '[[null,"created"]]', '[[-1,"x"]]',
                                     '[[1,"x",7]]', '[3]', '[[1]]', '[{"t":1,"e":"x"}]'])
def test_a_malformed_history_makes_the_record_invalid(shop: Shop, history: str) -> None:
    # given
    from dataclasses import replace

    from celery_sagas.errors import InvalidRecordError

    shop.start_order()
    codec = shop.sagas.engine.repository.codec
    envelope = codec.saga_envelope(replace(shop.record(), history=()))
    broken = replace(envelope, body='{"_history":' + history + "," + envelope.body[1:])

    # when / then: on reading the record, or at the latest on reading its history
    with pytest.raises(InvalidRecordError):
        list(codec.saga(broken, "o-1").history)


def test_an_event_of_a_later_release_reads_back_as_a_string(shop: Shop) -> None:
    from dataclasses import replace

    shop.start_order()
    codec = shop.sagas.engine.repository.codec
    envelope = codec.saga_envelope(replace(shop.record(), history=()))
    later = replace(envelope, body='{"_history":[[5,"teleported",null,null,null,null,null,null,'
                                   'null,null,"a field added later"]],' + envelope.body[1:])

    [entry] = codec.saga(later, "o-1").history

    assert (entry.event, entry.at_ms) == ("teleported", 5)
