"""Approval gates in sagas, driven in-process on the memory store.

The gated order reserves stock, waits for a manager at ``ctx.approval("manager", ...)``, then
charges and ships. The gate holds no worker: while it waits no message is in flight. The
starter reads the token with ``sagas.approvals.pending``, a manager decides, the requester
resumes with the token; a denial or an expiry rolls back what came before.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._approvals.gate import PendingApproval
from celery_sagas._approvals.tokens import TokenSigner
from celery_sagas._events import LifecycleEvent
from celery_sagas._records import ApprovalState, SagaState, StepState
from celery_sagas._sweep import SWEEP_LEASE
from celery_sagas.errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    FencedWriteRefused,
    SagaConfigurationError,
    SagaNotFound,
)
from celery_sagas.stores.base import Fence
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Shop, kinds

SECRET = "approval-secret-for-engine-tests!"  # 33 bytes
TTL_MS = 15 * 60_000
GATE = "manager"
BINDING: dict[str, str] = {"tenant_id": "t1", "principal_id": "alice"}


@pytest.fixture
def sagas(app: Celery, store: MemoryStore, clock: FrozenClock) -> Sagas:
    """Sagas with approval secrets (overrides the engine conftest's)."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock, approval_secrets=[SECRET])


@pytest.fixture
def gated(shop: Shop) -> Any:
    """reserve -> manager approval (bound to the order id) -> charge -> ship."""
    tasks = shop.tasks

    @shop.sagas.saga("gated-order")
    def gated_order(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(tasks["reserve"], order["sku"], order["qty"])
        decision = ctx.approval(GATE, capability="orders.approve", target=order["id"], **BINDING)
        ctx.step(tasks["charge"], order["card"], order["total"])
        ctx.step(tasks["ship"], order["id"], stock["reservation"])
        return decision

    return gated_order


def parked(shop: Shop, gated: Any, saga_id: str = "o-1", **changes: Any) -> PendingApproval:
    """Start the gated order, run it up to the gate, and return the pending approval."""
    gated.start({**ORDER, **changes}, saga_id=saga_id)
    shop.driver.run_until_idle()
    [pending] = shop.sagas.approvals.pending(saga_id)
    return pending


def decide(shop: Shop, pending: PendingApproval, decision: str = "approved") -> None:
    shop.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision=decision,
                                decided_by="bob")


def resume(shop: Shop, token: object, saga_id: str = "o-1", **changes: str) -> Any:
    return shop.sagas.approvals.resume(saga_id, token, **{**BINDING, **changes})


def approval_state(shop: Shop, pending: PendingApproval) -> ApprovalState:
    record = shop.sagas.approvals.get(pending.approval_id)
    assert record is not None
    return record.state


# ---------------------------------------------------------------- parking


def test_a_gate_parks_the_saga_without_a_message_in_flight(shop: Shop, gated: Any) -> None:
    # given / when
    gated.start(ORDER, saga_id="o-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert record.state == SagaState.RUNNING
    assert [(s.name, s.state) for s in record.steps] == [
        ("shop.reserve", StepState.COMMITTED), (GATE, StepState.AWAITING_APPROVAL)]
    assert shop.driver.take() == []
    assert shop.script.names() == ["reserve"]


def test_a_parked_saga_stays_parked_through_sweeps(shop: Shop, gated: Any) -> None:
    # given
    parked(shop, gated)

    # when
    shop.sweep_when_stale()
    shop.sweep_when_stale()

    # then
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL
    assert shop.driver.take() == []
    assert shop.record().state == SagaState.RUNNING


def test_pending_gives_the_starter_the_gate_and_its_token(shop: Shop, gated: Any) -> None:
    # when
    pending = parked(shop, gated)

    # then
    gate = shop.step(GATE)
    assert (pending.approval_id, pending.effect_id) == (gate.approval_id, gate.effect_id)
    assert (pending.saga_id, pending.step, pending.state) == ("o-1", GATE, "pending")
    assert (pending.capability, pending.target) == ("orders.approve", ORDER["id"])
    assert (pending.tenant_id, pending.principal_id) == ("t1", "alice")
    assert pending.expires_at_ms == shop.clock.now_ms() + TTL_MS
    assert pending.token.startswith("v1.")


def test_pending_shows_the_same_token_every_time(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    assert shop.sagas.approvals.pending("o-1") == [pending]


def test_pending_of_a_saga_without_gates_is_empty(shop: Shop) -> None:
    shop.start_order()
    shop.driver.run_until_idle()
    assert shop.sagas.approvals.pending("o-1") == []


def test_pending_of_an_unknown_saga_is_not_found(shop: Shop) -> None:
    with pytest.raises(SagaNotFound):
        shop.sagas.approvals.pending("nope")


def test_the_gate_emits_an_intent_event(
    shop: Shop, gated: Any, events: list[LifecycleEvent]
) -> None:
    pending = parked(shop, gated)
    gate_events = [(e.effect_id, e.phase) for e in events if e.step == GATE]
    assert gate_events == [(pending.effect_id, "intent")]


# ---------------------------------------------------------------- approve and resume


def test_approve_then_resume_continues_the_saga(shop: Shop, gated: Any) -> None:
    # given
    pending = parked(shop, gated)
    decide(shop, pending)

    # when
    resumed = resume(shop, pending.token)
    shop.driver.run_until_idle()

    # then
    assert resumed.step(GATE).state == StepState.COMMITTED
    record = shop.record()
    assert record.state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]
    assert shop.step(GATE).result == {"approval_id": pending.approval_id, "decided_by": "bob"}
    assert approval_state(shop, pending) == ApprovalState.CONSUMED


def test_resume_sends_the_next_step_at_once(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    resume(shop, pending.token)
    assert kinds(shop.driver.take()) == [("step", "shop.charge")]


def test_approving_alone_does_not_move_the_saga(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL
    assert shop.driver.take() == []
    assert [p.state for p in shop.sagas.approvals.pending("o-1")] == ["approved"]


def test_a_second_resume_is_a_replay(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    resume(shop, pending.token)
    with pytest.raises(ApprovalTokenReplay):
        resume(shop, pending.token)


def test_resume_before_the_decision_is_pending_and_changes_nothing(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    before = shop.record()
    with pytest.raises(ApprovalPending):
        resume(shop, pending.token)
    assert shop.record() == before
    assert approval_state(shop, pending) == ApprovalState.PENDING


@pytest.mark.parametrize("changes", [{"principal_id": "mallory"}, {"tenant_id": "t2"}])
def test_resume_by_another_requester_is_a_binding_error(
    shop: Shop, gated: Any, changes: dict[str, str]
) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    with pytest.raises(ApprovalBindingError):
        resume(shop, pending.token, **changes)
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL
    resume(shop, pending.token)  # the rightful requester still can
    assert shop.step(GATE).state == StepState.COMMITTED


def test_resume_with_the_token_of_another_saga_is_refused(shop: Shop, gated: Any) -> None:
    # given: two parked orders, both approved
    first = parked(shop, gated, "o-1")
    second = parked(shop, gated, "o-2", id="o-2")
    decide(shop, first)
    decide(shop, second)

    # when
    with pytest.raises(ApprovalTokenInvalid):
        resume(shop, second.token, saga_id="o-1")

    # then: neither gate moved and the other token is still good for its own saga
    assert shop.step(GATE, "o-1").state == StepState.AWAITING_APPROVAL
    assert approval_state(shop, second) == ApprovalState.APPROVED
    resume(shop, second.token, saga_id="o-2")
    assert shop.step(GATE, "o-2").state == StepState.COMMITTED


@pytest.mark.parametrize("token", ["", "v1.abc.def", "x" * 5000, None])
def test_resume_with_a_garbage_token_is_invalid(shop: Shop, gated: Any, token: object) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    with pytest.raises(ApprovalTokenInvalid):
        resume(shop, token)
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL


def test_the_gate_commits_with_events_for_intent_and_commit(
    shop: Shop, gated: Any, events: list[LifecycleEvent]
) -> None:
    pending = parked(shop, gated)
    decide(shop, pending)
    resume(shop, pending.token)
    assert [e.phase for e in events if e.step == GATE] == ["intent", "committed"]


# ---------------------------------------------------------------- deny and expiry


def test_deny_compensates_what_came_before(shop: Shop, gated: Any) -> None:
    # given
    pending = parked(shop, gated)

    # when
    decide(shop, pending, "denied")
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "approval_denied")
    gate = shop.step(GATE)
    assert (gate.state, gate.error_code) == (StepState.FAILED, "approval_denied")
    assert shop.script.names() == ["reserve", "release"]
    assert shop.sagas.approvals.pending("o-1") == []


def test_resume_after_a_denial_is_denied(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    decide(shop, pending, "denied")
    shop.driver.run_until_idle()
    with pytest.raises(ApprovalDenied):
        resume(shop, pending.token)
    assert shop.record().state == SagaState.COMPENSATED


def test_deciding_twice_is_refused(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    decide(shop, pending, "approved")
    with pytest.raises(ApprovalDecisionError):
        decide(shop, pending, "denied")
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL


def test_another_tenant_cannot_decide(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    with pytest.raises(ApprovalDecisionError):
        shop.sagas.approvals.decide(pending.approval_id, tenant_id="t2", decision="denied",
                                    decided_by="eve")
    assert approval_state(shop, pending) == ApprovalState.PENDING
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL


def test_expiry_found_by_the_sweep_counts_as_denied(shop: Shop, gated: Any) -> None:
    # given
    pending = parked(shop, gated)

    # when
    shop.clock.advance(TTL_MS)
    report = shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert report.acted >= 1
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "approval_expired")
    assert shop.step(GATE).error_code == "approval_expired"
    assert shop.script.names() == ["reserve", "release"]
    assert approval_state(shop, pending) == ApprovalState.EXPIRED


def test_nothing_expires_a_millisecond_early(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    shop.clock.advance(TTL_MS - 1)
    shop.sagas.sweep()
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL
    assert approval_state(shop, pending) == ApprovalState.PENDING


def test_after_expiry_neither_decide_nor_resume_works(shop: Shop, gated: Any) -> None:
    pending = parked(shop, gated)
    shop.clock.advance(TTL_MS)
    with pytest.raises(ApprovalTokenExpired):
        decide(shop, pending)
    with pytest.raises(ApprovalTokenExpired):
        resume(shop, pending.token)


def test_an_approval_never_used_before_expiry_counts_as_expired(shop: Shop, gated: Any) -> None:
    # given: approved, but the requester never comes back with the token
    pending = parked(shop, gated)
    decide(shop, pending)

    # when
    shop.clock.advance(TTL_MS)
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "approval_expired")
    assert shop.sagas.approvals.pending("o-1") == []


@pytest.mark.parametrize("approved", [False, True])
def test_a_sweeper_that_lost_its_lease_cannot_expire_an_approval(
    shop: Shop, gated: Any, store: MemoryStore, approved: bool
) -> None:
    # given: an approval past its expiry, seen by a sweeper whose lease another one then took
    pending = parked(shop, gated)
    if approved:
        decide(shop, pending)
    record = shop.sagas.approvals.get(pending.approval_id)
    assert record is not None
    now = shop.clock.advance(TTL_MS)
    stale = store.acquire_lease(SWEEP_LEASE, "beat-1", "t" * 32, now, 1_000)
    assert stale is not None
    now = shop.clock.advance(1_000)
    newer = store.acquire_lease(SWEEP_LEASE, "beat-2", "u" * 32, now, 30_000)
    assert newer is not None and newer.fence > stale.fence

    # when / then: its expiry write is refused, and neither the approval nor the gate moved
    with pytest.raises(FencedWriteRefused):
        shop.sagas.approvals.expire(record, Fence.of(stale))
    expected = ApprovalState.APPROVED if approved else ApprovalState.PENDING
    assert approval_state(shop, pending) == expected
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL

    # and the current holder's write goes through
    shop.sagas.approvals.expire(record, Fence.of(newer))
    assert approval_state(shop, pending) == ApprovalState.EXPIRED
    assert shop.step(GATE).error_code == "approval_expired"


def test_an_approval_no_gate_holds_just_expires(shop: Shop, gated: Any) -> None:
    # given: besides the real gate's approval, one whose step intent lost its write
    pending = parked(shop, gated)
    shop.sagas.approvals.gate.open(
        effect_id="e-lost-intent", approval_id="ap-lost-intent", capability="orders.approve",
        target=ORDER["id"], saga_id="o-1", step=GATE, **BINDING,
    )

    # when
    shop.clock.advance(TTL_MS)
    report = shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then: both expired, the sweep saw no error, and the saga rolled back on its own gate
    orphan = shop.sagas.approvals.get("ap-lost-intent")
    assert orphan is not None and orphan.state is ApprovalState.EXPIRED
    assert approval_state(shop, pending) == ApprovalState.EXPIRED
    assert report.errors == 0
    assert shop.record().state is SagaState.COMPENSATED


# ---------------------------------------------------------------- crash repair and cancel


def test_a_crash_between_consume_and_the_saga_update_is_repaired_by_the_sweep(
    shop: Shop, gated: Any
) -> None:
    # given: the token was consumed, then the process died before the saga was written
    pending = parked(shop, gated)
    decide(shop, pending)
    shop.sagas.approvals.gate.consume(pending.token, capability="orders.approve",
                                      target=ORDER["id"], **BINDING)
    assert shop.step(GATE).state == StepState.AWAITING_APPROVAL

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.step(GATE).state == StepState.COMMITTED
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]
    with pytest.raises(ApprovalTokenReplay):
        resume(shop, pending.token)


def test_a_crash_after_a_denial_is_repaired_by_the_sweep(shop: Shop, gated: Any) -> None:
    # given: the denial was stored, then the process died before the saga was written
    pending = parked(shop, gated)
    shop.sagas.approvals.gate.decide(pending.approval_id, tenant_id="t1", decision="denied",
                                     decided_by="bob")

    # when
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.step(GATE).error_code == "approval_denied"


def test_cancel_while_awaiting_approval_compensates(shop: Shop, gated: Any) -> None:
    # given
    pending = parked(shop, gated)

    # when
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "cancelled")
    assert (shop.step(GATE).state, shop.step(GATE).error_code) == (StepState.FAILED, "not_started")
    assert shop.script.names() == ["reserve", "release"]
    assert shop.sagas.approvals.pending("o-1") == []
    with pytest.raises(ApprovalDenied, match="no longer waits"):
        resume(shop, pending.token)
    assert shop.record().state == SagaState.COMPENSATED


def test_a_decision_after_cancel_is_refused_and_changes_nothing(shop: Shop, gated: Any) -> None:
    # given: a saga cancelled while its gate waited
    pending = parked(shop, gated)
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # when / then
    for decision in ("approved", "denied"):
        with pytest.raises(ApprovalDecisionError, match="its gate no longer waits"):
            decide(shop, pending, decision)
    assert approval_state(shop, pending) is ApprovalState.PENDING


@pytest.mark.parametrize("decided", [False, True], ids=["pending", "approved-then-cancelled"])
def test_an_approval_whose_gate_was_cancelled_ends_expired(shop: Shop, gated: Any,
                                                          decided: bool) -> None:
    # given: approved (or not) a moment before the saga was cancelled
    pending = parked(shop, gated)
    if decided:
        decide(shop, pending)
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()

    # when: its expiry passes and the sweep runs
    shop.clock.advance(TTL_MS)
    shop.sagas.sweep()

    # then
    assert approval_state(shop, pending) is ApprovalState.EXPIRED
    assert shop.record().state == SagaState.COMPENSATED


def forged(pending: PendingApproval) -> str:
    """A token signed with the right secret for the right approval, with another nonce."""
    return TokenSigner([SECRET]).mint(approval_id=pending.approval_id, nonce="not-the-stored-nonce-at-all",
                                      expires_at_ms=pending.expires_at_ms)


@pytest.mark.parametrize("closed_by", ["resume", "deny", "cancel"])
def test_a_forged_token_is_invalid_whatever_the_gate_became(shop: Shop, gated: Any,
                                                            closed_by: str) -> None:
    # given: a gate passed, denied or cancelled
    pending = parked(shop, gated)
    if closed_by == "resume":
        decide(shop, pending)
        resume(shop, pending.token)
    elif closed_by == "deny":
        decide(shop, pending, "denied")
    else:
        shop.sagas.cancel("o-1")
    before = shop.record()

    # when / then: its state is told to no one but the token's holder
    with pytest.raises(ApprovalTokenInvalid):
        resume(shop, forged(pending))
    with pytest.raises(ApprovalBindingError):
        resume(shop, pending.token, principal_id="mallory")
    assert shop.record() == before


# ---------------------------------------------------------------- configuration and misuse


def test_a_gate_without_approval_secrets_goes_to_manual_review(
    app: Celery, clock: FrozenClock, shop: Shop
) -> None:
    # given: another Sagas, configured without sagas_approval_secrets
    plain = Sagas(Celery("plain", set_as_current=False), store=MemoryStore(),
                  allow_non_durable=True, clock=clock)
    driver = SagaDriver(plain)

    @plain.saga("ungated")
    def ungated(ctx: Any, _: Any) -> None:
        ctx.approval(GATE, capability="orders.approve", **BINDING)

    # when
    ungated.start({}, saga_id="u-1")
    driver.run_until_idle()

    # then
    record = plain.get("u-1")
    assert record is not None
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert record.reason is not None and "approval secrets" in record.reason
    assert record.steps == ()
    with pytest.raises(SagaConfigurationError, match="sagas_approval_secrets"):
        _ = plain.approvals.gate


def test_an_invalid_gate_binding_goes_to_manual_review(shop: Shop) -> None:
    @shop.sagas.saga("bad-gate")
    def bad_gate(ctx: Any, _: Any) -> None:
        ctx.approval(GATE, capability="Not A Capability", **BINDING)

    bad_gate.start({}, saga_id="b-1")
    shop.driver.run_until_idle()
    record = shop.record("b-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert shop.sagas.store.scan("approval", ["pending"], limit=10).items == ()


@pytest.mark.parametrize("secrets", [["short"], [b"x" * 31], ["s" * 32, "tiny"]])
def test_a_short_secret_is_refused_at_configuration(
    app: Celery, store: MemoryStore, secrets: list[Any]
) -> None:
    with pytest.raises(SagaConfigurationError, match="32") as caught:
        Sagas(app, store=store, allow_non_durable=True, approval_secrets=secrets)
    assert "tiny" not in str(caught.value) and "short" not in str(caught.value)


def test_a_short_secret_in_app_conf_is_refused(store: MemoryStore) -> None:
    app = Celery("conf", set_as_current=False)
    app.conf.sagas_approval_secrets = ["short"]
    with pytest.raises(SagaConfigurationError):
        Sagas(app, store=store, allow_non_durable=True)


def test_two_gates_are_passed_one_after_the_other(shop: Shop) -> None:
    tasks = shop.tasks

    @shop.sagas.saga("two-gates")
    def two_gates(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        ctx.approval("manager", capability="orders.approve", **BINDING)
        ctx.approval("finance", capability="orders.finance", **BINDING)
        return ctx.step(tasks["charge"], order["card"], order["total"])

    two_gates.start(ORDER, saga_id="g-2")
    shop.driver.run_until_idle()
    for name in ("manager", "finance"):
        [pending] = shop.sagas.approvals.pending("g-2")
        assert pending.step == name
        decide(shop, pending)
        resume(shop, pending.token, saga_id="g-2")
        shop.driver.run_until_idle()
    assert shop.record("g-2").state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge"]
