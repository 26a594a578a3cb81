"""Starting a saga: idempotent per saga id, conflicts refused, and
nothing stored or sent when the input is invalid."""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._records import SagaState
from celery_sagas.errors import PayloadTooLarge, SagaConflictError, SagaValidationError
from tests.engine.conftest import ORDER, Shop, kinds, nothing_stored


def test_starting_again_with_the_same_id_and_input_returns_the_existing_saga(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.run_until_idle()
    finished = shop.record()

    # when
    again = shop.start_order()

    # then: the same record comes back, nothing runs again, nothing is sent
    assert again == finished
    assert again.state == SagaState.COMPLETED
    assert shop.driver.take() == []
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_starting_twice_before_any_worker_ran_still_runs_each_step_once(shop: Shop) -> None:
    # given
    shop.start_order()

    # when: the second start re-sends the advance; both advances get delivered
    shop.start_order()
    shop.driver.run_until_idle()

    # then
    assert shop.record().state == SagaState.COMPLETED
    assert shop.script.names() == ["reserve", "charge", "ship"]


def test_same_id_with_another_input_is_a_conflict_and_changes_nothing(shop: Shop) -> None:
    # given
    shop.start_order()
    before = shop.record()
    shop.driver.take()

    # when / then
    with pytest.raises(SagaConflictError):
        shop.start_order(qty=3)
    assert shop.record() == before
    assert shop.driver.take() == []


def test_same_id_with_another_definition_is_a_conflict(shop: Shop) -> None:
    # given
    shop.start_order()
    before = shop.record()
    shop.driver.take()

    # when / then
    with pytest.raises(SagaConflictError):
        shop.sagas.start("notify-user", ORDER, saga_id="o-1")
    assert shop.record() == before
    assert shop.driver.take() == []


def test_the_same_input_written_with_another_key_order_is_the_same_saga(shop: Shop) -> None:
    # given
    shop.start_order()

    # when
    reordered = dict(reversed(list(ORDER.items())))
    again = shop.place_order.start(reordered, saga_id="o-1").record

    # then
    assert again.saga_id == "o-1" and again.input == ORDER


@pytest.mark.parametrize(
    "saga_id",
    ["", "has space", "x" * 129, "caf\u00e9", "tab\there", "new\nline", 42, None],
    ids=["empty", "space", "too-long", "non-ascii", "tab", "newline", "int", "none"],
)
def test_an_invalid_saga_id_is_refused_and_nothing_is_stored(
    shop: Shop, store: MemoryStore, saga_id: Any
) -> None:
    # when / then
    with pytest.raises((ValueError, TypeError)):
        shop.sagas.engine.start("place-order", ORDER, saga_id)
    assert nothing_stored(store)
    assert shop.driver.take() == []


@pytest.mark.parametrize("via", ["sagas", "saga"])
def test_an_empty_saga_id_is_refused_not_replaced_by_a_random_one(
    shop: Shop, store: MemoryStore, via: str
) -> None:
    # given: a web handler passing an empty form field as the id
    start = (shop.place_order.start if via == "saga"
             else lambda data, saga_id: shop.sagas.start("place-order", data, saga_id=saga_id))

    # when / then: refused like any invalid id (a random id would lose the idempotency)
    with pytest.raises(SagaValidationError, match="saga id"):
        start(ORDER, saga_id="")
    assert nothing_stored(store)
    assert shop.driver.take() == []


def test_only_a_missing_saga_id_generates_one(shop: Shop) -> None:
    first = shop.place_order.start(ORDER).record
    second = shop.place_order.start(ORDER, saga_id=None).record

    assert first.saga_id != second.saga_id
    assert all(len(record.saga_id) == 36 for record in (first, second))


def test_a_saga_id_of_128_printable_characters_is_accepted(shop: Shop) -> None:
    # when
    saga_id = "a" * 127 + "~"
    shop.place_order.start(ORDER, saga_id=saga_id)

    # then
    assert shop.record(saga_id).state == SagaState.RUNNING


@pytest.mark.parametrize(
    "bad_input",
    [
        {"tags": {"a", "b"}},
        {"total": math.nan},
        {"total": math.inf},
        {"total": -math.inf},
        {"when": object()},
        {1: "non-string key"},
        b"bytes",
        {"nested": [1, {"deep": (lambda: None)}]},
    ],
    ids=["set", "nan", "inf", "-inf", "object", "int-key", "bytes", "nested-function"],
)
def test_non_json_input_is_refused_and_nothing_is_stored(
    shop: Shop, store: MemoryStore, bad_input: Any
) -> None:
    # when / then
    with pytest.raises(SagaValidationError):
        shop.place_order.start(bad_input, saga_id="o-1")
    assert nothing_stored(store)
    assert shop.sagas.get("o-1") is None
    assert shop.driver.take() == []


def test_input_over_the_payload_limit_is_refused_and_nothing_is_stored(
    shop: Shop, store: MemoryStore
) -> None:
    # given
    limit = shop.sagas.settings.payload_limit
    huge = {**ORDER, "note": "x" * limit}

    # when / then
    with pytest.raises(PayloadTooLarge):
        shop.place_order.start(huge, saga_id="o-1")
    assert nothing_stored(store)
    assert shop.driver.take() == []


def test_an_unknown_definition_is_refused_and_nothing_is_stored(shop: Shop, store: MemoryStore) -> None:
    # when / then
    with pytest.raises(Exception, match="no saga definition"):
        shop.sagas.start("no-such-saga", ORDER, saga_id="o-1")
    assert nothing_stored(store)
    assert kinds(shop.driver.take()) == []


TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_trace_parent_given_to_start_is_kept_by_every_later_write(shop: Shop) -> None:
    # given / when
    shop.sagas.engine.start("place-order", ORDER, "tp-1", trace_parent=TRACE_PARENT)
    shop.driver.run_until_idle()

    # then
    record = shop.record("tp-1")
    assert record.state == SagaState.COMPLETED and record.version > 1
    assert record.trace_parent == TRACE_PARENT


@pytest.mark.parametrize("bad", ["garbage", TRACE_PARENT.upper(), ""])
def test_a_malformed_trace_parent_is_dropped_and_the_saga_still_starts(shop: Shop, bad: str) -> None:
    shop.sagas.engine.start("place-order", ORDER, "tp-2", trace_parent=bad)
    assert shop.record("tp-2").trace_parent is None
    assert shop.driver.take()  # the first step was sent
