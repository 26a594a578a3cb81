"""Operator resolution: the operator's effect id
must be the stored one; execution outcomes send the saga forward or back; compensation
outcomes settle the compensator; anything else raises and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaResolutionError
from tests.engine.conftest import HOST, Shop, kinds


@pytest.fixture
def ambiguous_charge(shop: Shop) -> str:
    """An order in manual review because charge's outcome is unknown; returns its effect id."""
    shop.script.then("charge", ConnectionError("reset after the request left"))
    shop.start_order()
    shop.driver.run_until_idle()
    assert shop.record().state == SagaState.MANUAL_REVIEW
    return shop.step("shop.charge").effect_id


@pytest.fixture
def ambiguous_refund(shop: Shop, dead_pid: int) -> str:
    """An order whose refund was claimed by a worker that died; returns its compensation effect id."""
    message = shop.refund_pending()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.charge", compensation=True)
    shop.driver.deliver(message)
    record = shop.record()
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_compensation")
    return shop.step("shop.charge").compensation_effect_id


# ------------------------------------------------------------ refusals


def test_a_wrong_effect_id_is_refused_and_changes_nothing(shop: Shop, ambiguous_charge: str) -> None:
    # given
    before = shop.record()

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", "shop.charge", "a-stale-effect-id", "committed", result={})
    assert shop.record() == before


def test_the_compensation_effect_id_cannot_settle_an_execution(shop: Shop, ambiguous_charge: str) -> None:
    # given
    before = shop.record()
    compensation_id = shop.step("shop.charge").compensation_effect_id

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", "shop.charge", compensation_id, "committed", result={})
    assert shop.record() == before


def test_the_execution_effect_id_cannot_settle_a_compensation(shop: Shop, ambiguous_refund: str) -> None:
    # given
    before = shop.record()
    execution_id = shop.step("shop.charge").effect_id

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", "shop.charge", execution_id, "compensated")
    assert shop.record() == before


@pytest.mark.parametrize(
    ("step", "outcome"),
    [("shop.nope", "committed"), ("shop.reserve", "committed"), ("shop.charge", "maybe")],
    ids=["unknown-step", "step-not-ambiguous", "bad-outcome"],
)
def test_an_impossible_resolution_is_refused_and_changes_nothing(
    shop: Shop, ambiguous_charge: str, step: str, outcome: str
) -> None:
    # given
    before = shop.record()
    effect_id = shop.step("shop.reserve").effect_id if step == "shop.reserve" else ambiguous_charge

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", step, effect_id, outcome, result={})
    assert shop.record() == before


def test_resolving_a_final_saga_is_refused(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.run_until_idle()
    before = shop.record()

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resolve("o-1", "shop.charge", before.steps[1].effect_id, "committed", result={})
    assert shop.record() == before


def test_resume_is_refused_while_an_outcome_is_unknown(shop: Shop, ambiguous_charge: str) -> None:
    # given
    before = shop.record()

    # when / then
    with pytest.raises(SagaResolutionError):
        shop.sagas.resume("o-1")
    assert shop.record() == before


# ------------------------------------------------------------ execution outcomes


def test_resolving_committed_records_the_result_and_puts_the_saga_back_to_running(
    shop: Shop, ambiguous_charge: str
) -> None:
    # when
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "committed", result={"charge": "ch-op"})

    # then
    charge = shop.step("shop.charge")
    assert (charge.state, charge.result) == (StepState.COMMITTED, {"charge": "ch-op"})
    assert shop.record().state == SagaState.RUNNING
    assert shop.driver.take() == []


def test_resume_after_a_committed_resolution_completes_the_saga(shop: Shop, ambiguous_charge: str) -> None:
    # given
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "committed", result={"charge": "ch-op"})

    # when
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_resolving_not_committed_fails_the_step_and_turns_the_saga_compensating(
    shop: Shop, ambiguous_charge: str
) -> None:
    # when
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "not-committed", error_code="card_declined")

    # then
    charge = shop.step("shop.charge")
    assert (charge.state, charge.error_code) == (StepState.FAILED, "card_declined")
    assert shop.record().state == SagaState.COMPENSATING


def test_resume_after_a_not_committed_resolution_compensates_the_earlier_steps(
    shop: Shop, ambiguous_charge: str
) -> None:
    # given
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "not-committed", error_code="card_declined")

    # when
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "charge", "release"]


def test_the_sweep_also_drives_a_saga_resolved_as_not_committed(shop: Shop, ambiguous_charge: str) -> None:
    # given
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "not-committed", error_code="card_declined")

    # when
    shop.sagas.sweep()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPENSATED


def test_a_resolution_emits_a_reconciliation_event(
    shop: Shop, ambiguous_charge: str, events: list[Any]
) -> None:
    # when
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_charge, "committed", result={})

    # then
    last = events[-1]
    assert (last.stage, last.phase, last.effect_id) == ("reconciliation", "committed", ambiguous_charge)


# ------------------------------------------------------------ compensation outcomes


def test_resolving_compensated_settles_the_step_and_the_saga_compensates_on(
    shop: Shop, ambiguous_refund: str
) -> None:
    # when
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_refund, "compensated")

    # then
    assert shop.step("shop.charge").state == StepState.COMPENSATED
    assert shop.record().state == SagaState.COMPENSATING


def test_resume_after_a_compensated_resolution_finishes_the_compensation(
    shop: Shop, ambiguous_refund: str
) -> None:
    # given
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_refund, "compensated")

    # when
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then: the refund is not run again; release runs
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "charge", "ship", "release"]


def test_resolving_not_compensated_makes_the_step_compensation_failed_and_retries_it(
    shop: Shop, ambiguous_refund: str
) -> None:
    # when
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_refund, "not-compensated")

    # then
    step = shop.step("shop.charge")
    assert (step.state, step.compensation_attempts) == (StepState.COMPENSATION_FAILED, 1)
    assert shop.record().state == SagaState.COMPENSATING


def test_resume_after_not_compensated_runs_the_compensator_again_under_the_same_effect_id(
    shop: Shop, ambiguous_refund: str
) -> None:
    # given
    shop.sagas.resolve("o-1", "shop.charge", ambiguous_refund, "not-compensated")

    # when
    shop.sagas.resume("o-1")
    sent = shop.driver.take()
    for message in sent:
        shop.driver.deliver(message)
    shop.driver.run_until_idle()

    # then
    assert kinds(sent) == [("compensation", "shop.charge")]
    assert sent[0].effect_id == ambiguous_refund
    assert shop.record().state == SagaState.COMPENSATED
    assert shop.step("shop.charge").compensation_attempts == 2


def test_not_compensated_on_an_exhausted_budget_goes_to_manual_review(shop: Shop, dead_pid: int) -> None:
    # given: a definition that allows one compensation attempt; its only attempt vanished
    run = shop.define_refusing("one-try", max_attempts=1)
    run.start({}, saga_id="x-1")
    shop.deliver_next()
    [message] = shop.driver.take()
    shop.claim_as(f"{HOST}:{dead_pid}", "shop.reserve", "x-1", compensation=True)
    shop.driver.deliver(message)
    effect_id = shop.step("shop.reserve", "x-1").compensation_effect_id

    # when
    shop.sagas.resolve("x-1", "shop.reserve", effect_id, "not-compensated")

    # then
    record = shop.record("x-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "compensation_exhausted")


def test_an_exhausted_compensation_resolved_as_compensated_can_be_resumed_to_the_end(shop: Shop) -> None:
    # given: release failed on its only allowed attempt and the saga is in manual review
    run = shop.define_refusing("one-try", max_attempts=1)
    shop.script.then("release", RuntimeError("inventory down"))
    run.start({}, saga_id="x-1")
    shop.driver.run_until_idle()
    shop.clock.advance(60_000)
    shop.sagas.sweep()
    assert shop.record("x-1").error_code == "compensation_exhausted"
    effect_id = shop.step("shop.reserve", "x-1").compensation_effect_id

    # when: the operator undid the reservation by hand
    shop.sagas.resolve("x-1", "shop.reserve", effect_id, "compensated")
    shop.sagas.resume("x-1")

    # then
    assert shop.record("x-1").state == SagaState.COMPENSATED
    assert len(shop.script.of("release")) == 1
