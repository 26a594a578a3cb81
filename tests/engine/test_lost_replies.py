"""Writes whose reply is lost (docs/design.md §3.2, §3.10): the store applied the claim or the
outcome, or did not, and the writer cannot tell from the error. A claim of its own found on the
record is taken back and made again (its body never began), never judged as a vanished attempt;
an outcome found on the record (its write id) counts as written, and the next step goes out at
once. Nothing here may send a saga to review: every body began and ended with a known outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import NonDurableStoreError, StoreError
from celery_sagas.stores.base import Envelope, Fence
from celery_sagas.testing import FrozenClock
from tests.engine.conftest import Shop


class LossyStore(MemoryStore):
    """A memory store whose next calls of one operation lose their reply: the write is applied
    (or, with ``applied=False``, not) and the caller gets a StoreError either way; ``down``
    more calls of any operation fail after that (the store is still unreachable)."""

    def __init__(self) -> None:
        super().__init__()
        self._lose: dict[str, list[bool]] = {}
        self.down = 0
        self.lost: list[str] = []

    def lose(self, operation: str, *, applied: bool = True, times: int = 1) -> None:
        """Lose the reply of the next ``times`` calls of ``operation``."""
        self._lose.setdefault(operation, []).extend([applied] * times)

    def _call(self, operation: str, call: Any) -> Any:
        if self.down > 0:
            self.down -= 1
            raise StoreError(f"memory {operation} failed: TimeoutError")
        pending = self._lose.get(operation)
        if not pending:
            return call()
        applied = pending.pop(0)
        if applied:
            call()
        self.lost.append(operation)
        raise StoreError(f"memory {operation} failed: TimeoutError")

    def get(self, kind: str, record_id: str) -> Envelope | None:
        return self._call("get", lambda: super(LossyStore, self).get(kind, record_id))  # type: ignore[no-any-return]

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        return self._call("annotate", lambda: super(LossyStore, self).annotate(  # type: ignore[no-any-return]
            kind, record_id, note, expected_version=expected_version))

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        return self._call("compare_and_set", lambda: super(LossyStore, self).compare_and_set(  # type: ignore[no-any-return]
            envelope, expected_version, fence=fence))


@pytest.fixture
def store() -> LossyStore:
    """The shop's store, losing replies when told to."""
    return LossyStore()


@pytest.fixture
def sagas(app: Celery, store: LossyStore, clock: FrozenClock) -> Sagas:
    """Sagas on the lossy store."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock)


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Waits for the store in milliseconds, not seconds."""
    monkeypatch.setattr("celery_sagas._delivery._STORE_PAUSE_S", 0.001, raising=False)
    monkeypatch.setattr("celery_sagas._repository._STORE_POLL_S", 0.001)
    yield


def _no_review(shop: Shop) -> None:
    record = shop.record()
    assert record.state is SagaState.COMPLETED, (record.state, record.error_code)
    assert all(step.state is StepState.COMMITTED for step in record.steps)
    assert shop.script.names() == ["reserve", "charge", "ship"]
    assert [step.attempts for step in record.steps] == [1, 1, 1]


# ------------------------------------------------------------ claims


def test_a_claim_applied_whose_reply_was_lost_is_taken_back_and_made_again(
        shop: Shop, store: LossyStore) -> None:
    # given: reserve's blind claim lands, but its reply is lost
    shop.start_order()
    store.lose("annotate")

    # when
    shop.driver.run_until_idle()

    # then: the body ran once, after a claim of its own; no ambiguity, no review
    assert store.lost == ["annotate"]
    _no_review(shop)


def test_a_claim_not_applied_whose_reply_was_lost_is_made_again(
        shop: Shop, store: LossyStore) -> None:
    # given
    shop.start_order()
    store.lose("annotate", applied=False)

    # when
    shop.driver.run_until_idle()

    # then
    assert store.lost == ["annotate"]
    _no_review(shop)


def test_a_claim_waits_for_a_store_that_stays_silent_for_a_while(
        shop: Shop, store: LossyStore) -> None:
    # given: the claim lands, then the store answers nothing for five more calls
    shop.start_order()
    store.lose("annotate")
    store.down = 5

    # when
    shop.driver.run_until_idle()

    # then
    assert store.down == 0
    _no_review(shop)


def test_a_claim_found_by_a_driver_retry_is_recognised_as_its_own(
        shop: Shop, store: LossyStore) -> None:
    # given: the claim landed, and a driver retry of it reported the version moved (redis-py
    # retries a command whose reply timed out): the delivery sees its own claim on the record
    shop.start_order()
    [message] = shop.driver.take()
    real = MemoryStore.annotate
    calls: list[int] = []

    def landed_then_moved(self: MemoryStore, kind: str, record_id: str, note: str, *,
                          expected_version: int | None = None) -> Envelope | None:
        calls.append(1)
        written = real(self, kind, record_id, note, expected_version=expected_version)
        return None if len(calls) == 1 else written

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MemoryStore, "annotate", landed_then_moved)
        shop.driver.deliver(message)

    # then: the body ran once, under a claim made again; the saga goes on
    assert shop.script.names() == ["reserve"]
    assert shop.step("shop.reserve").state is StepState.COMMITTED
    assert shop.step("shop.reserve").attempts == 1
    shop.driver.run_until_idle()
    _no_review(shop)


def test_a_compensation_claim_whose_reply_was_lost_is_taken_back_and_made_again(
        shop: Shop, store: LossyStore) -> None:
    # given: a saga rolling back (ship declined), refund's message pending
    refund = shop.refund_pending()
    store.lose("annotate")

    # when
    shop.driver.deliver(refund)
    shop.driver.run_until_idle()

    # then: every compensator ran once, the saga compensated, no review
    record = shop.record()
    assert record.state is SagaState.COMPENSATED, (record.state, record.error_code)
    assert shop.script.names().count("refund") == 1
    assert shop.script.names().count("release") == 1
    assert store.lost == ["annotate"]


def test_a_store_silent_past_the_time_limit_fails_the_delivery_without_running_the_body(
        shop: Shop, store: LossyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the store stops answering for good
    monkeypatch.setattr("celery_sagas._delivery.Delivery._time_limit_ms", lambda self: 50)
    shop.start_order()
    [message] = shop.driver.take()
    store.lose("annotate")
    store.down = 10**9

    # when / then
    with pytest.raises(StoreError):
        shop.driver.deliver(message)
    assert shop.script.calls == []


# ------------------------------------------------------------ outcomes


def test_an_outcome_applied_whose_reply_was_lost_counts_as_written_and_the_next_step_goes_out(
        shop: Shop, store: LossyStore, caplog: pytest.LogCaptureFixture) -> None:
    # given: reserve ran; its outcome write lands but the reply is lost
    shop.start_order()
    [reserve] = shop.driver.take()
    store.lose("compare_and_set")

    # when
    with caplog.at_level(logging.INFO, logger="celery_sagas"):
        shop.driver.deliver(reserve)

    # then: no "moved on" warning, and charge's message went out from this delivery
    assert store.lost == ["compare_and_set"]
    assert not [r for r in caplog.records if "moved on" in r.getMessage()]
    assert [m.step for m in shop.driver.take()] == ["shop.charge"]
    assert shop.step("shop.reserve").state is StepState.COMMITTED


def test_an_outcome_not_applied_whose_reply_was_lost_is_written_again(
        shop: Shop, store: LossyStore) -> None:
    # given
    shop.start_order()
    store.lose("compare_and_set", applied=False)

    # when
    shop.driver.run_until_idle()

    # then
    assert store.lost == ["compare_and_set"]
    _no_review(shop)


def test_every_write_losing_its_reply_once_still_completes_without_review(
        shop: Shop, store: LossyStore) -> None:
    # given: the first reply of every claim and every outcome of the saga is lost
    shop.start_order()
    store.lose("annotate", times=3)
    store.lose("compare_and_set", times=3)

    # when
    shop.driver.run_until_idle()

    # then
    _no_review(shop)


def test_a_store_refused_at_first_use_fails_the_delivery_at_once(
        shop: Shop, store: LossyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: the store answers a claim with a refusal (not silence): nothing to wait for
    shop.start_order()
    [message] = shop.driver.take()

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NonDurableStoreError("the Redis server keeps nothing (appendonly no)")

    monkeypatch.setattr(store, "annotate", refused)
    waited: list[float] = []
    monkeypatch.setattr("celery_sagas._delivery.time.sleep", waited.append)

    # when / then
    with pytest.raises(NonDurableStoreError):
        shop.driver.deliver(message)
    assert waited == [] and shop.script.calls == []


def test_a_delivery_that_waited_past_half_its_time_limit_takes_its_claim_back_for_a_fresh_one(
        shop: Shop, store: LossyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: reserve's claim lands, its reply is lost, and the store answers only once this
    # delivery is past half its time limit (a body begun now could outlast the hard limit)
    monkeypatch.setattr("celery_sagas._delivery.Delivery._too_late_to_begin",
                        lambda self: self._waited_for_store)
    shop.start_order()
    [message] = shop.driver.take()
    store.lose("annotate")

    # when
    shop.driver.deliver(message)

    # then: no body ran, the claim was taken back (nothing ambiguous), no message went out
    assert shop.script.calls == []
    reserve = shop.step("shop.reserve")
    assert (reserve.state, reserve.attempts, reserve.started_at_ms) == (StepState.EXECUTING, 0, None)
    assert shop.driver.take() == []

    # when: the sweep sends the step again once stale, to a delivery with its whole limit
    monkeypatch.undo()
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then
    _no_review(shop)
