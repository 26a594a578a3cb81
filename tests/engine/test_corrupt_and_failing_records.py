"""A sweep meets a record it cannot use: it names the record and the cause, reports a record in
a state no scan asks for, and escapes control characters in what it prints (issue 16)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._cli_format import saga_table, table
from celery_sagas._values import printable
from celery_sagas.errors import StoreError
from celery_sagas.stores.base import Envelope, Fence
from tests.engine.conftest import ORDER, Shop

STALE_MS = 10 * 60_000


def stale_running(shop: Shop, saga_id: str) -> None:
    shop.start_order(saga_id, id=saga_id)
    shop.driver.take()  # the first step's message is lost
    shop.clock.advance(STALE_MS)


def test_a_failing_write_is_logged_with_the_saga_id_and_the_cause(
    shop: Shop, store: MemoryStore, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given: a stale saga whose every write fails in the store
    stale_running(shop, "o-broken")

    def refuse(envelope: Envelope, expected: int, *, fence: Fence | None = None) -> bool:
        cause = ConnectionError("reset by peer")
        raise StoreError("redis compare_and_set failed: ConnectionError") from cause

    monkeypatch.setattr(store, "compare_and_set", refuse)

    # when
    with caplog.at_level(logging.WARNING, logger="celery_sagas.sweep"):
        report = shop.sagas.sweep()

    # then
    assert report.errors == 1
    [line] = [r.getMessage() for r in caplog.records if r.name == "celery_sagas.sweep"]
    assert "saga o-broken" in line
    assert "StoreError: redis compare_and_set failed: ConnectionError" in line
    assert "caused by ConnectionError" in line
    assert ORDER["card"] not in line


def test_a_record_in_an_unknown_state_is_reported_corrupt_by_the_sweep(
    shop: Shop, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a record written in a state this version does not know (a newer release, a hand edit)
    store.create(Envelope("saga", "o-future", 1, "paused", shop.clock.now_ms(), "{}", "shop"))

    # when
    with caplog.at_level(logging.ERROR, logger="celery_sagas.findings"):
        report = shop.sagas.sweep()

    # then
    assert [(c.id, c.reason) for c in report.corrupt] == [("o-future", "unknown state 'paused'")]
    [line] = [r.getMessage() for r in caplog.records if r.name == "celery_sagas.findings"]
    assert "saga o-future" in line and "unknown state 'paused'" in line


def test_findings_list_a_record_in_an_unknown_state(shop: Shop, store: MemoryStore) -> None:
    # given
    store.create(Envelope("saga", "o-future", 1, "paused", shop.clock.now_ms(), "{}", "shop"))

    # when
    page = shop.sagas.findings()

    # then
    assert [(str(f.kind), f.record_id, f.reason) for f in page.findings] == [
        ("corrupt", "o-future", "unknown state 'paused'")]


def test_a_version_over_2_53_is_reported_corrupt_with_its_cause(
    shop: Shop, store: MemoryStore
) -> None:
    # given: a stale running saga whose stored version is then pushed to 2**63-1
    stale_running(shop, "o-big")
    stored = store.get("saga", "o-big")
    assert stored is not None
    store._records[("saga", "o-big")] = Envelope(
        stored.kind, stored.id, 2**63 - 1, stored.state, stored.updated_at_ms, stored.body,
        stored.label, stored.due_at_ms)

    # when
    report = shop.sagas.sweep()

    # then: named and explained, not an anonymous error on every sweep
    assert report.errors == 0
    assert ("o-big", "version 9223372036854775807 is outside 1..2**53-1") in [
        (c.id, c.reason) for c in report.corrupt]


@pytest.mark.parametrize("text", ["a\nb", "x\x1b[31my", "left\u202eright", "tab\there", "nul\x00"])
def test_printable_escapes_every_control_character(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable() and "\n" not in shown
    assert shown.encode("ascii", "backslashreplace").decode("unicode_escape") == text


def test_printable_keeps_printable_text() -> None:
    assert printable("saga o-1: résumé ✓") == "saga o-1: résumé ✓"


def test_a_table_cell_cannot_forge_a_row() -> None:
    rendered = table(("ID", "REASON"), [("o-1", "fine\no-2  completed")])
    assert rendered.count("\n") == 1 and "fine\\no-2" in rendered


def test_the_list_table_escapes_what_it_shows(shop: Shop) -> None:
    shop.start_order("o-1")
    shop.driver.run_until_idle()
    record: Any = shop.record("o-1")
    forged = type(record)(**{**{f: getattr(record, f) for f in record.__slots__},
                             "error_code": "x\ncompleted"})
    assert saga_table([forged]).count("\n") == 1
