"""The fast ``replace`` of frozen records gives what ``dataclasses.replace`` gives."""

from __future__ import annotations

import dataclasses

import pytest

from celery_sagas._frozen import _COPIERS, replace
from celery_sagas._records import EffectMark, EffectState, SagaRecord, SagaState, StepRecord, StepState


def _saga() -> SagaRecord:
    step = StepRecord("s1", "t", "e1", "c1", StepState.EXECUTING, args=(1,), kwargs={"k": 2},
                      execution=EffectMark(EffectState.ADMISSION, 5))
    return SagaRecord("id-1", "d", SagaState.RUNNING, {"x": 1}, 1, 2, steps=(step,), version=3)


@pytest.mark.parametrize("changes", [{}, {"version": 4}, {"state": SagaState.COMPLETED,
                                                          "result": [1], "error_code": None}])
def test_a_saga_record_copy_equals_dataclasses_replace(changes: dict[str, object]) -> None:
    saga = _saga()
    copy = replace(saga, **changes)
    assert copy == dataclasses.replace(saga, **changes)
    assert copy is not saga and type(copy) is SagaRecord
    assert saga.version == 3  # the original is untouched


def test_a_step_record_copy_keeps_every_other_field() -> None:
    step = _saga().steps[0]
    copy = replace(step, attempts=1, started_at_ms=9)
    assert (copy.attempts, copy.started_at_ms) == (1, 9)
    assert copy == dataclasses.replace(step, attempts=1, started_at_ms=9)
    assert copy.kwargs is step.kwargs and copy.execution is step.execution


def test_the_copy_stays_frozen() -> None:
    copy = replace(_saga(), version=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.version = 10  # type: ignore[misc]


def test_an_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        replace(_saga(), no_such_field=1)  # type: ignore[call-arg]


def test_classes_with_init_work_go_through_dataclasses_replace() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        a: int
        b: int = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    assert replace(Unslotted(1), b=2) == Unslotted(1, 2)
    with pytest.raises(ValueError):
        replace(Checked(1), a=-1)  # __post_init__ still runs
    assert _COPIERS[Unslotted] is dataclasses.replace
    assert _COPIERS[Checked] is dataclasses.replace
