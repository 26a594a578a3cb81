"""Issue 26 items 4 and 6 in headless Chromium over a real Redis store and a real worker: a
saga whose charge raised shows where (its traceback summary); over 1,200 sagas an id prefix
finds every match through the Redis id index, page after page, and the list sorts by last
write or by creation, newest or oldest first, server-side (a saga written again keeps its place
by creation)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from celery_sagas import SagaRecord, SagaState
from celery_sagas.web import WebUser, create_app
from tests.e2e.conftest import REDIS_BROKER, Stack, _make_stack
from tests.web.browser import chromium, need_browser, screenshot, serving
from tests.web.test_browser import all_css, by_css, choose, eventually, login, state_shown

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

USERS = (WebUser("olive", "olive-pw", "operator"),)
BULK = 1_200
STATES = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.RUNNING)


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """The e2e apps on Redis (broker and store)."""
    need_browser()
    yield from _make_stack(tmp_path, REDIS_BROKER, redis_url)


def seed(stack: Stack, now_ms: int) -> list[SagaRecord]:
    """``BULK`` sagas written a second apart over the last 20 minutes, in three states."""
    made = []
    for n in range(BULK):
        at = now_ms - (BULK - n) * 1_000
        record = SagaRecord(f"bulk-{n:04d}", "e2e-order", STATES[n % 3], {"id": n}, at, at)
        assert stack.sagas.store.create(stack.sagas.codec.saga_envelope(record))
        made.append(record)
    return made


def listed(driver: Any) -> list[str]:
    return [a.text for a in all_css(driver, "table.sagas td.id a")]


def test_where_a_step_raised_a_prefix_over_the_store_and_a_sort_in_the_browser(
        stack: Stack) -> None:
    # given: a charge that raises in a real worker, and 1,200 more sagas in the store
    stack.worker(concurrency=2)
    stack.shop.order.start({"sku": "C", "amount": 5, "id": "c1", "plan": {"crash": "charge"}},
                           saga_id="order-crash")
    crashed = stack.wait_settled("order-crash", timeout=120.0)
    assert crashed.state == "manual-review"
    made = seed(stack, crashed.updated_at_ms - 1)
    app = create_app(stack.sagas, users=USERS)

    with serving(app) as base, chromium() as driver:
        # item 4: what raised, and where: the innermost frames, the worker's task last
        login(driver, base, "olive", "olive-pw")
        state_shown(driver, base, "order-crash", "manual-review")
        frames = by_css(driver, "dd.traceback pre").text.splitlines()
        assert frames[-1].startswith("e2e/app.py:") and frames[-1].endswith(" in behave")
        assert "provider timed out" in by_css(driver, "dd.raised").text
        assert "provider timed out" not in "\n".join(frames)  # names only, never the message
        screenshot(driver, "saga-traceback")

        # item 6: an id prefix over the whole store: 100 of 1,201 match, two full pages
        driver.get(f"{base}/sagas?id=bulk-11")
        first = listed(driver)
        by_css(driver, "a.next").click()
        eventually(lambda: "cursor=" in driver.current_url, "the next page")
        second = listed(driver)
        assert first + second == [f"bulk-{n}" for n in range(1100, 1200)]
        assert all_css(driver, "a.next") == [] and "none among" not in by_css(driver, "main").text
        driver.get(f"{base}/sagas?id=bulk-0&state=running")
        assert listed(driver)[:3] == ["bulk-0002", "bulk-0005", "bulk-0008"]

        # item 6: sort by last write, server-side, across every state, either way
        driver.get(f"{base}/sagas")
        choose(by_css(driver, "select#sort"), "newest")
        by_css(driver, "form.filter button").click()
        eventually(lambda: "sort=newest" in driver.current_url, "the sorted list")
        newest = [r.saga_id for r in sorted(made, key=lambda r: r.updated_at_ms, reverse=True)]
        assert listed(driver) == ["order-crash", *newest[:49]]
        screenshot(driver, "sagas-sorted")
        by_css(driver, "a.next").click()
        eventually(lambda: "cursor=" in driver.current_url, "the sorted next page")
        assert listed(driver) == newest[49:99]
        by_css(driver, "#sort-updated a").click()  # the header turns the order over
        eventually(lambda: "sort=oldest" in driver.current_url, "the oldest first")
        assert listed(driver) == [f"bulk-{n:04d}" for n in range(50)]

        # item 6, by creation: the three sagas created first are written again now; by last
        # write they come first, by creation they keep their place (last, newest first)
        store = stack.sagas.store
        for n in range(3):
            stored = store.get("saga", f"bulk-{n:04d}")
            assert stored is not None
            again = replace(stored, version=stored.version + 1,
                            updated_at_ms=crashed.updated_at_ms + 1_000 + n)
            assert store.compare_and_set(again, stored.version)
        open_and_done = "state=completed&state=compensated&state=running"
        driver.get(f"{base}/sagas?{open_and_done}&sort=newest")
        assert listed(driver)[:4] == ["bulk-0002", "bulk-0001", "bulk-0000", "bulk-1199"]
        by_css(driver, "#sort-created a").click()
        eventually(lambda: "sort=newest-created" in driver.current_url, "newest created first")
        assert listed(driver) == [f"bulk-{n:04d}" for n in range(1199, 1149, -1)]
        assert by_css(driver, "select#sort option:checked").get_attribute("value") == \
            "newest-created"
        by_css(driver, "#sort-created a").click()  # turned over: oldest created first
        eventually(lambda: "sort=oldest-created" in driver.current_url, "oldest created first")
        assert listed(driver)[:4] == ["bulk-0000", "bulk-0001", "bulk-0002", "bulk-0003"]
        screenshot(driver, "sagas-by-creation")
        first_row = all_css(driver, "table.sagas tbody tr")[0]
        created_cell = first_row.find_element("css selector", "td.created").text
        updated_cell = first_row.find_element("css selector", "td.updated").text
        assert created_cell and updated_cell and created_cell < updated_cell
