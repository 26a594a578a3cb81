"""FrozenClock: time that moves only when the test says so."""

from __future__ import annotations

import pytest

from celery_sagas._clock import now_ms
from celery_sagas.errors import SagaValidationError
from celery_sagas.testing import FrozenClock


def test_the_clock_stays_where_it_was_set() -> None:
    clock = FrozenClock(1_000)
    assert clock.now_ms() == clock.now_ms() == 1_000
    assert now_ms(clock) == 1_000


def test_advance_moves_forward_and_returns_the_new_time() -> None:
    clock = FrozenClock(1_000)
    assert clock.advance(250) == 1_250
    assert clock.now_ms() == 1_250


def test_set_may_move_backwards() -> None:
    clock = FrozenClock(1_000)
    clock.set(10)
    assert clock.now_ms() == 10


@pytest.mark.parametrize("delta", [0, -1, True, 1.5])
def test_advance_refuses_a_non_positive_or_non_integer_step(delta: object) -> None:
    with pytest.raises(SagaValidationError):
        FrozenClock().advance(delta)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, 2**53, 1.5, "1"])
def test_an_invalid_time_is_refused(value: object) -> None:
    with pytest.raises(SagaValidationError):
        FrozenClock(value)  # type: ignore[arg-type]
    with pytest.raises(SagaValidationError):
        FrozenClock().set(value)  # type: ignore[arg-type]
