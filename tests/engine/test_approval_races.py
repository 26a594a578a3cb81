"""Approval gates racing the sweep: the approval record decides, the saga follows.

A consume judges the approval (approved, unexpired) and then writes it with a compare-and-set.
If the sweep finds the gate past its expiry in between, exactly one of them may win, and the
saga must end the way the approval record says: never a consumed approval with a saga rolled
back for expiry, and never a requester told "replay" for the first use of a token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._records import APPROVAL, ApprovalState, SagaState, StepState
from celery_sagas.errors import ApprovalTokenExpired
from tests.engine.conftest import ORDER, Shop
from tests.engine.test_approvals import (  # noqa: F401  (fixtures)
    BINDING,
    GATE,
    TTL_MS,
    decide,
    gated,
    parked,
    resume,
    sagas,
)


def around_consume_write(
    monkeypatch: pytest.MonkeyPatch,
    store: MemoryStore,
    meanwhile: Callable[[], None],
    *,
    after: bool = False,
) -> None:
    """Run ``meanwhile`` once, just before (or just after) a consume writes the approval."""
    real = store.compare_and_set
    fired: list[bool] = []

    def hooked(envelope: Any, expected: int, **kwargs: Any) -> bool:
        ours = envelope.kind == APPROVAL and envelope.state == "consumed" and not fired
        if ours:
            fired.append(True)
        if ours and not after:
            meanwhile()
        won = real(envelope, expected, **kwargs)
        if ours and after:
            meanwhile()
        return won

    monkeypatch.setattr(store, "compare_and_set", hooked)


def test_a_consume_racing_the_expiry_sweep_loses_and_the_saga_agrees(
    shop: Shop, gated: Any, store: MemoryStore, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # given: approved; the requester's consume judged it usable, then the sweep runs past expiry
    pending = parked(shop, gated)
    decide(shop, pending)

    def sweep_past_expiry() -> None:
        shop.clock.advance(max(TTL_MS, shop.sagas.settings.timing.stale_ms + 1))
        shop.sagas.sweep()

    around_consume_write(monkeypatch, store, sweep_past_expiry)

    # when
    with pytest.raises(ApprovalTokenExpired):
        resume(shop, pending.token)
    shop.driver.run_until_idle()

    # then: the approval expired, the consume lost, and the saga rolled back for expiry
    approval = shop.sagas.approvals.get(pending.approval_id)
    assert approval is not None and approval.state is ApprovalState.EXPIRED
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "approval_expired")


def test_the_sweep_acting_on_a_stale_pending_record_follows_the_stored_approval(
    shop: Shop, gated: Any  # noqa: F811
) -> None:
    # given: the sweep read the approval while pending; it was then approved and consumed in
    # time, and the process that consumed it died before it wrote the saga
    pending = parked(shop, gated)
    stale = shop.sagas.approvals.get(pending.approval_id)
    assert stale is not None and stale.state is ApprovalState.PENDING
    decide(shop, pending)
    shop.sagas.approvals.gate.consume(pending.token, capability="orders.approve",
                                      target=ORDER["id"], **BINDING)

    # when: the sweep acts on what it read, past the expiry
    shop.clock.advance(TTL_MS)
    shop.sagas.approvals.expire(stale)
    shop.driver.run_until_idle()

    # then: the consumed approval passes the gate; nothing is rolled back for expiry
    approval = shop.sagas.approvals.get(pending.approval_id)
    assert approval is not None and approval.state is ApprovalState.CONSUMED
    assert shop.step(GATE).state == StepState.COMMITTED
    assert shop.record().state == SagaState.COMPLETED


def test_a_sweep_passing_the_gate_before_resume_does_is_no_replay_for_the_requester(
    shop: Shop, gated: Any, store: MemoryStore, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    # given: approved; right after the requester's consume lands, a sweep repairs the gate
    pending = parked(shop, gated)
    decide(shop, pending)
    around_consume_write(monkeypatch, store, shop.sweep_when_stale, after=True)

    # when: the first and only use of the token
    record = resume(shop, pending.token)
    shop.driver.run_until_idle()

    # then: it succeeded, and the saga went on once
    assert record.step(GATE) is not None
    assert shop.step(GATE).state == StepState.COMMITTED
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]
