"""The effect state machine (SPEC §2.1) from its table: every (state, target) pair."""

from __future__ import annotations

import itertools

import pytest

from celery_sagas._protocol.effect import (
    EFFECT_TRANSITIONS,
    FINAL_EFFECT_STATES,
    transition_effect,
)
from celery_sagas._records import EffectRecord, EffectState
from celery_sagas.errors import IllegalTransition, SagaValidationError

from .protocol_builders import T0, frozen_copy

E = EffectState

# Written out from the SPEC diagram, not from the module's own table.
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


def effect(state: EffectState, *, updated: int = T0 + 100, error_code: str | None = None) -> EffectRecord:
    """An effect record in ``state`` with every optional field set."""
    return EffectRecord(
        effect_id="fx-1",
        capability="orders.charge",
        state=state,
        created_at_ms=T0,
        updated_at_ms=updated,
        version=4,
        target="card-1",
        digest="ab" * 32,
        tenant_id="t1",
        principal_id="alice",
        error_code=error_code,
        saga_id="order-42",
        step="charge",
        stage="execution",
    )


def test_the_module_table_is_the_spec_table() -> None:
    table = {(a, b) for a, targets in EFFECT_TRANSITIONS.items() for b in targets}
    assert table == LEGAL
    assert set(EFFECT_TRANSITIONS) == set(E)
    assert frozenset({E.COMMITTED, E.FAILED}) == FINAL_EFFECT_STATES


@pytest.mark.parametrize(("source", "target"), [p for p in PAIRS if p in LEGAL], ids=str)
def test_legal_transition_bumps_version_and_time(source: EffectState, target: EffectState) -> None:
    record = effect(source)
    moved = transition_effect(record, target, T0 + 500)
    assert moved.state is target
    assert moved.version == record.version + 1
    assert moved.updated_at_ms == T0 + 500
    assert moved.created_at_ms == record.created_at_ms
    unchanged = ("effect_id", "capability", "target", "digest", "tenant_id", "principal_id",
                 "saga_id", "step", "stage", "error_code")
    assert all(getattr(moved, f) == getattr(record, f) for f in unchanged)


@pytest.mark.parametrize(("source", "target"), [p for p in PAIRS if p not in LEGAL], ids=str)
def test_illegal_transition_raises_and_changes_nothing(source: EffectState, target: EffectState) -> None:
    record = effect(source)
    before = frozen_copy(record)
    with pytest.raises(IllegalTransition) as caught:
        transition_effect(record, target, T0 + 500, error_code="late_report")
    assert record == before
    assert caught.value.state == str(source)  # type: ignore[attr-defined]
    assert caught.value.event == str(target)  # type: ignore[attr-defined]


@pytest.mark.parametrize("final", sorted(FINAL_EFFECT_STATES), ids=str)
def test_final_states_have_no_way_out(final: EffectState) -> None:
    for target in E:
        with pytest.raises(IllegalTransition):
            transition_effect(effect(final), target, T0 + 500)


def test_clock_going_back_never_moves_updated_at_back() -> None:
    moved = transition_effect(effect(E.ADMISSION, updated=T0 + 100), E.EXECUTING, T0)
    assert moved.updated_at_ms == T0 + 100
    assert moved.created_at_ms <= moved.updated_at_ms


def test_error_code_is_recorded_when_given_and_kept_when_not() -> None:
    failed = transition_effect(effect(E.EXECUTING), E.FAILED, T0 + 500, error_code="card_declined")
    assert failed.error_code == "card_declined"
    unknown = transition_effect(effect(E.EXECUTING, error_code="time_limit"), E.UNKNOWN, T0 + 500)
    assert unknown.error_code == "time_limit"
    settled = transition_effect(unknown, E.COMMITTED, T0 + 600)
    assert settled.error_code == "time_limit"
    assert settled.version == unknown.version + 1


@pytest.mark.parametrize("bad", ["", "Card", "has space", "9lives", "x" * 65, 7])
def test_invalid_error_code_is_refused_before_anything_changes(bad: object) -> None:
    record = effect(E.EXECUTING)
    before = frozen_copy(record)
    with pytest.raises(SagaValidationError):
        transition_effect(record, E.FAILED, T0 + 500, error_code=bad)  # type: ignore[arg-type]
    assert record == before


def test_a_whole_life_admission_to_committed_through_unknown() -> None:
    record = effect(E.ADMISSION)
    for i, target in enumerate((E.EXECUTING, E.UNKNOWN, E.COMMITTED), start=1):
        record = transition_effect(record, target, T0 + 100 + i)
        assert record.version == 4 + i
    assert record.state is E.COMMITTED
    assert record.updated_at_ms == T0 + 103
