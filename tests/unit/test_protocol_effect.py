"""Effects (docs/design.md §2.3): the state machine from its table, every (state, target) pair,
and the effect view ``effects_of`` derives from a saga record, step state by step state."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from celery_sagas._protocol import moves
from celery_sagas._protocol.effects import (
    EFFECT_TRANSITIONS,
    FINAL_EFFECT_STATES,
    effects_of,
)
from celery_sagas._protocol.kinds import APPROVAL_TASK
from celery_sagas._protocol.resolution import Resolution, resolve
from celery_sagas._records import (
    AttemptRef,
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    StepRecord,
)

from .protocol_builders import (
    AM,
    AW,
    CD,
    CF,
    CM,
    CREATED,
    FL,
    P0,
    P1,
    PA,
    T0,
    UPDATED,
    VARIANTS,
    X0,
    X1,
    XR,
    cx,
    fx,
    saga,
    step,
)

E = EffectState

# Written out from the effect diagram of docs/design.md §2.3, not from the module's own table.
LEGAL = {
    (E.ADMISSION, E.EXECUTING),
    (E.ADMISSION, E.FAILED),
    (E.EXECUTING, E.COMMITTED),
    (E.EXECUTING, E.FAILED),
    (E.EXECUTING, E.UNKNOWN),
    (E.UNKNOWN, E.COMMITTED),
    (E.UNKNOWN, E.FAILED),
}
PAIRS = list(itertools.product(E, E))


def test_the_module_table_is_the_spec_table() -> None:
    table = {(a, b) for a, targets in EFFECT_TRANSITIONS.items() for b in targets}
    assert table == LEGAL
    assert set(EFFECT_TRANSITIONS) == set(E)
    assert frozenset({E.COMMITTED, E.FAILED}) == FINAL_EFFECT_STATES


# ---------------------------------------------------------------- the effect view of a saga

# docs/design.md §2.3, written out per step variant (tests/unit/protocol_builders.py): the
# execution effect's (state, updated_at, error code), then the compensation effect's (None
# while no compensation began). An admission is as old as its dispatch, a claimed attempt as
# its claim, a commit as its commit; anything else moved with the saga's last write.
VIEW: dict[str, tuple[tuple[EffectState, int, str | None],
                      tuple[EffectState, int, str | None] | None]] = {
    X0: ((E.ADMISSION, T0, None), None),
    X1: ((E.EXECUTING, T0 + 10, None), None),
    XR: ((E.EXECUTING, UPDATED, None), None),
    CM: ((E.COMMITTED, T0 + 20, None), None),
    FL: ((E.FAILED, UPDATED, "card_declined"), None),
    AM: ((E.UNKNOWN, UPDATED, "worker_lost"), None),
    P0: ((E.COMMITTED, UPDATED, None), (E.ADMISSION, T0 + 30, None)),
    P1: ((E.COMMITTED, UPDATED, None), (E.EXECUTING, T0 + 40, None)),
    PA: ((E.COMMITTED, UPDATED, None), (E.UNKNOWN, UPDATED, "ambiguous_compensation")),
    CF: ((E.COMMITTED, UPDATED, None), (E.EXECUTING, UPDATED, None)),
    CD: ((E.COMMITTED, UPDATED, None), (E.COMMITTED, UPDATED, None)),
}


def capability(_saga: SagaRecord, found: StepRecord, compensation: bool) -> str:
    return f"cap.{found.name}.{'undo' if compensation else 'do'}"


def view_of(record: SagaRecord) -> dict[str, EffectRecord]:
    return {e.effect_id: e for e in effects_of(record, capability)}


def test_the_view_covers_every_step_variant_but_the_gate() -> None:
    assert set(VIEW) == set(VARIANTS) - {AW}


@pytest.mark.parametrize("variant", sorted(VIEW))
def test_each_step_state_gives_the_effect_states_of_the_design_table(variant: str) -> None:
    # given
    record = saga(step(variant))

    # when
    view = view_of(record)

    # then
    execution, compensation = VIEW[variant]
    expected = {fx("s"): execution, **({cx("s"): compensation} if compensation else {})}
    assert {k: (e.state, e.updated_at_ms, e.error_code) for k, e in view.items()} == expected


@pytest.mark.parametrize("variant", sorted(VIEW))
def test_an_effect_names_its_saga_step_and_stage_and_carries_the_saga_version(variant: str) -> None:
    # given
    record = saga(step(variant), version=9)

    # when
    view = view_of(record)

    # then
    execution = view[fx("s")]
    assert (execution.saga_id, execution.step, execution.stage, execution.capability) == (
        "order-42", "s", "execution", "cap.s.do")
    assert all(e.version == 9 for e in view.values())
    assert all(e.created_at_ms == min(CREATED, e.updated_at_ms) for e in view.values())
    if cx("s") in view:
        undo = view[cx("s")]
        assert (undo.saga_id, undo.step, undo.stage, undo.capability) == (
            "order-42", "s", "compensation", "cap.s.undo")


@pytest.mark.parametrize("variant", sorted(VIEW))
def test_an_effect_never_carries_a_payload(variant: str) -> None:
    # given: payloads no other field could hold by chance
    record = SagaRecord("order-42", "place-order", SagaState.RUNNING, {"secret": "input-payload"},
                        CREATED, UPDATED, (step(variant, args=("args-payload",),
                                                kwargs={"k": "kwargs-payload"},
                                                result={"r": "result-payload"}),))

    # when
    shown = [repr(e) for e in effects_of(record, capability)]

    # then
    assert shown
    for text in shown:
        assert "payload" not in text, text


def test_an_approval_gate_is_no_side_effect_and_has_no_effect() -> None:
    gate = step(AW, "gate", task=APPROVAL_TASK, compensator=None)
    record = saga(step(CM, "before"), gate)
    assert set(view_of(record)) == {fx("before")}


def test_a_compensation_retried_and_not_yet_claimed_is_still_executing() -> None:
    # given: the second compensation attempt was sent, not yet claimed
    record = saga(step(P0, compensation_attempts=2), state=SagaState.COMPENSATING)

    # then: the effect began with the first attempt; it is not admitted again
    assert view_of(record)[cx("s")].state is E.EXECUTING


def test_the_effects_of_a_saga_follow_its_steps_in_order() -> None:
    record = saga(step(CM, "a"), step(P1, "b"), step(X0, "c"))
    assert [e.effect_id for e in effects_of(record, capability)] == [
        fx("a"), fx("b"), cx("b"), fx("c")]


# ---------------------------------------------------------------- moves move the view along the table


def _off_the_table(before: SagaRecord, after: SagaRecord) -> list[str]:
    """Each effect of ``before`` that vanished from ``after`` or moved off EFFECT_TRANSITIONS."""
    old, new = view_of(before), view_of(after)
    wrong = [f"{k}: {e.state} -> gone" for k, e in old.items() if k not in new]
    wrong += [f"{k}: {e.state} -> {new[k].state}" for k, e in old.items()
              if k in new and new[k].state is not e.state
              and new[k].state not in EFFECT_TRANSITIONS[e.state]]
    return wrong


def _late_failure_of_an_ambiguous_compensation() -> tuple[SagaRecord, SagaRecord]:
    # the attempt judged vanished reports, late, that the compensator raised
    before = saga(step(PA), state=SagaState.MANUAL_REVIEW, rolling_back=True,
                  error_code="ambiguous_compensation", reason="compensation of step 's' is ambiguous")
    found = before.step("s")
    assert found is not None
    return before, moves.compensation_failed(before, AttemptRef.compensation(found), T0 + 900, T0 + 800)


def _ambiguous_compensation_resolved_not_compensated() -> tuple[SagaRecord, SagaRecord]:
    before = saga(step(PA), state=SagaState.MANUAL_REVIEW, rolling_back=True,
                  error_code="ambiguous_compensation", reason="compensation of step 's' is ambiguous")
    return before, resolve(before, "s", cx("s"), Resolution.NOT_COMPENSATED, now_ms=T0 + 800,
                           max_compensation_attempts=3)


def _resume_after_compensation_ran_out() -> tuple[SagaRecord, SagaRecord]:
    before = saga(step(CF, compensation_attempts=3), state=SagaState.MANUAL_REVIEW, rolling_back=True,
                  error_code="compensation_exhausted", reason="compensation of step 's' failed 3 times")
    return before, moves.resume(before, T0 + 800)


@pytest.mark.parametrize("scenario", [
    _late_failure_of_an_ambiguous_compensation,
    _ambiguous_compensation_resolved_not_compensated,
    _resume_after_compensation_ran_out,
], ids=lambda f: f.__name__.strip("_"))
def test_a_legal_saga_move_moves_each_effect_along_the_table_only(scenario: Any) -> None:
    # given / when: a move the protocol accepts
    before, after = scenario()

    # then: the compensation effect (executing or unknown before) stays on the effect table
    assert after.version == before.version + 1
    assert _off_the_table(before, after) == []
