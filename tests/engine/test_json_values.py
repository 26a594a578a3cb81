"""Values JSON cannot carry are refused where they enter, with an error that says which value
and what is wrong (issue 16 items 11 and 20): at ``start()`` with ``SagaValidationError``,
from a step body as ``invalid_result``; no error or log line carries the record or payload."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._codec import Codec
from celery_sagas._protocol import codes
from celery_sagas._records import SagaRecord, SagaState, StepState
from celery_sagas.errors import PayloadTooLarge, SagaValidationError
from tests.engine.conftest import ORDER, Shop, nothing_stored

MARKER = "zq-marker-7d1f"  # a payload value no log line may contain
LONE_SURROGATE = "\ud800"
HUGE_INT = 10**4400


def _deep(levels: int) -> Any:
    value: Any = MARKER
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"note": MARKER + LONE_SURROGATE}, "['note'] contains a lone surrogate"),
        ({"items": [1, {"qty": HUGE_INT}]}, "['items'][1]['qty'] contains an integer of more than 4300"),
        ({LONE_SURROGATE: 1}, "contains a lone surrogate"),
        ({"order": _deep(70)}, "['order'][0][0]"),
    ],
    ids=["lone-surrogate", "huge-int", "surrogate-key", "too-deep"],
)
def test_start_refuses_what_json_cannot_carry_and_says_where(
    shop: Shop, store: MemoryStore, bad: dict[str, Any], says: str
) -> None:
    # when / then: a validation error naming the value's path, not a raw UnicodeEncodeError
    with pytest.raises(SagaValidationError) as raised:
        shop.place_order.start({**ORDER, **bad}, saga_id="o-1")
    assert str(raised.value).startswith("saga input")
    assert says in str(raised.value)
    assert MARKER not in str(raised.value)
    assert nothing_stored(store)
    assert shop.driver.take() == []


def test_a_too_deep_input_is_refused_naming_the_depth(shop: Shop) -> None:
    with pytest.raises(SagaValidationError, match="nested deeper than 64 levels"):
        shop.place_order.start({**ORDER, "order": _deep(70)}, saga_id="o-1")


@pytest.mark.parametrize("bad", [MARKER + LONE_SURROGATE, HUGE_INT, {"n": [HUGE_INT]}],
                         ids=["lone-surrogate", "huge-int", "nested-huge-int"])
def test_a_result_json_cannot_carry_is_invalid_result(
    shop: Shop, bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: the reserve body returns a value JSON cannot carry
    shop.script.then("reserve", lambda: bad)
    caplog.set_level(logging.DEBUG)

    # when
    shop.start_order()
    shop.driver.run_until_idle()

    # then: the body ran, its outcome cannot be recorded: ambiguous, for an operator
    step = shop.step("shop.reserve")
    assert (step.state, step.error_code) == (StepState.AMBIGUOUS, codes.INVALID_RESULT)
    assert shop.record().state == SagaState.MANUAL_REVIEW
    assert any(r.levelname == "ERROR" and codes.INVALID_RESULT in r.getMessage()
               for r in caplog.records)
    _no_payload_logged(caplog)


def _no_payload_logged(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info)
                                      if record.exc_info else "")
        assert MARKER not in text and '"definition"' not in text, text


def test_the_codec_refuses_a_record_json_cannot_carry_without_echoing_it() -> None:
    # given: a record that slipped past the entry checks (the codec is the last line)
    record = SagaRecord("s-1", "d", SagaState.RUNNING, {"note": MARKER + LONE_SURROGATE}, 1, 1)

    # when / then
    with pytest.raises(SagaValidationError) as raised:
        Codec().saga_envelope(record)
    assert MARKER not in str(raised.value) and MARKER not in repr(raised.value)


def test_an_input_under_the_limit_in_a_record_over_it_names_the_input_size(
    shop: Shop, store: MemoryStore
) -> None:
    # given: an input just under the limit; the record around it (ids, the first step) is not
    limit = shop.sagas.settings.payload_limit
    data = {**ORDER, "note": ""}
    overhead = len(Codec().saga_envelope(
        SagaRecord("o-1", "place-order", SagaState.RUNNING, data, 1, 1)).body) - 2
    data["note"] = "x" * (limit - overhead - 50)
    size = len(json.dumps(data, separators=(",", ":")).encode())
    assert size <= limit

    # when / then
    with pytest.raises(PayloadTooLarge) as raised:
        shop.place_order.start(data, saga_id="o-1")
    message = str(raised.value)
    assert f"saga input is {size} bytes" in message
    assert f"{limit}-byte limit" in message and "sagas_payload_limit" in message
    assert not message.startswith("saga record")
    assert nothing_stored(store)


def test_an_input_over_the_limit_names_its_own_size_and_the_setting(shop: Shop) -> None:
    limit = shop.sagas.settings.payload_limit
    with pytest.raises(PayloadTooLarge, match=rf"saga input is \d+ bytes, over the {limit}-byte "
                                              r"limit \(sagas_payload_limit\)"):
        shop.place_order.start({**ORDER, "note": "x" * limit}, saga_id="o-1")


def test_a_resolved_result_too_large_names_its_own_size(shop: Shop) -> None:
    # given: charge is ambiguous
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()
    shop.driver.run_until_idle()
    step = shop.step("shop.charge")
    limit = shop.sagas.settings.payload_limit

    # when / then
    big = {"charge": "x" * limit}
    with pytest.raises(PayloadTooLarge, match=rf"result is {limit + 13} bytes; .*{limit}-byte limit"):
        shop.sagas.resolve("o-1", "shop.charge", step.effect_id, "committed", result=big)
    assert shop.step("shop.charge").state == StepState.AMBIGUOUS


@pytest.mark.parametrize(("levels", "accepted"), [(64, True), (65, False)])
def test_nesting_is_accepted_up_to_64_levels(levels: int, accepted: bool) -> None:
    from celery_sagas import _values as values

    value = {"a": _deep(levels - 1)}  # the marker string sits at depth `levels`
    if accepted:
        assert values.json_value(value) == value
    else:
        with pytest.raises(SagaValidationError, match="nested deeper than 64"):
            values.json_value(value)


@pytest.mark.parametrize("value", [(1, 2), {"t": (1, [2.5, None, True])}, "é", {"é": ["ü"]}])
def test_tuples_floats_and_non_ascii_text_are_accepted(value: Any) -> None:
    from celery_sagas import _values as values

    assert json.dumps(values.json_value(value)) == json.dumps(value)
