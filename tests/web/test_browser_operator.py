"""Issue 26 in headless Chromium over a real Redis store and real prefork workers.

One stack holds what an on-call operator meets: 100 sagas waiting for a signal, a saga whose
worker was SIGKILLed mid-charge (``worker_lost``), one stuck mid-step past ``stale_after``.
The operator sees only the two that need a human counted, the waits apart with what they
wait for, the cause of the ambiguity; resolves it through a confirmation page with a reason;
and the page still shows the ambiguity, its cause and who resolved it. Forged and cross-site
posts are refused and log nothing they carried.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import signal
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from celery_sagas.web import WebUser, create_app
from tests.e2e.conftest import REDIS_BROKER, Stack, _make_stack, wait_until
from tests.web.browser import chromium, need_browser, screenshot, serving
from tests.web.test_browser import (
    all_css,
    by_css,
    choose,
    eventually,
    login,
    state_shown,
    status_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

USERS = (WebUser("olive", "olive-pw", "operator"),)
SETTLE = 120.0
WAITERS = 100
ORDER = {"sku": "W", "amount": 3, "id": "w"}
FORGED = "/actions/resume%0Aweb:%20approve%20of%20saga%20order-1000%20by%20boss"


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """The e2e apps on Redis (broker and store), ``stale_after`` 2 s."""
    need_browser()
    yield from _make_stack(tmp_path, REDIS_BROKER, redis_url)


def number(driver: Any, selector: str) -> int:
    return int(by_css(driver, selector).text.replace(",", "").rstrip("+"))


def foreign_site(base: str) -> Flask:
    """Another origin's page with forms posting to the UI: one forging a log line through the
    action's URL, one cancelling a saga (the browser holds the operator's credentials)."""
    site = Flask("evil")

    @site.get("/")
    def page() -> str:
        return (f'<form id="forge" method="post" action="{base}{FORGED}">'
                '<input name="saga_id" value="order-lost"><button>forge</button></form>'
                f'<form id="cancel" method="post" action="{base}/actions/cancel">'
                '<input name="saga_id" value="order-stuck"><input name="confirmed" value="yes">'
                '<button>cancel</button></form>')

    return site


def test_an_operator_sees_what_needs_a_human_why_and_who_resolved_it(
        stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    # given: workers; 100 sagas waiting for "go"; a charge killed mid-body; one stuck mid-step
    stack.worker(concurrency=3)
    for n in range(WAITERS):
        stack.sagas.start("e2e-signal", {**ORDER, "id": f"w{n}"}, saga_id=f"waiting-{n:03d}")
    order = stack.shop.order
    order.start({"sku": "K", "amount": 9, "id": "k1", "plan": {"block": "charge", "release": "never"}},
                saga_id="order-lost")
    order.start({"sku": "S", "amount": 4, "id": "s1", "plan": {"block": "ship", "release": "never"}},
                saga_id="order-stuck")
    [started] = wait_until(lambda: stack.ops("charge.start", "order-lost"), SETTLE, "charge begun")
    os.kill(int(started["pid"]), signal.SIGKILL)
    lost = stack.wait_settled("order-lost", timeout=SETTLE)
    assert lost.state == "manual-review"
    charge = next(s for s in lost.steps if s.state == "ambiguous")
    assert charge.error_code == "worker_lost", (charge.error_code, lost.reason)
    wait_until(lambda: stack.ops("ship.start", "order-stuck"), SETTLE, "ship begun")

    def all_waiting() -> bool:
        waits = [stack.sagas.get(f"waiting-{n:03d}") for n in range(WAITERS)]
        return all(r is not None and r.steps and r.steps[-1].state == "waiting" for r in waits)

    wait_until(all_waiting, SETTLE * 2, "100 sagas waiting for their signal")
    stale_ms = stack.sagas.settings.timing.stale_ms
    wait_until(lambda: stack.sagas.engine.now() - stack.sagas.get("order-stuck").updated_at_ms
               > stale_ms + 500, SETTLE, "the stuck saga past stale_after")
    app = create_app(stack.sagas, users=USERS)

    with serving(app) as base, serving(foreign_site(base)) as evil, chromium() as driver:
        # item 3: the overview counts manual review plus the truly stale, the waits apart
        login(driver, base, "olive", "olive-pw")
        assert number(driver, '.card[data-state="manual-review"] .number') == 1
        assert number(driver, "#attention-waiting") == 2
        assert number(driver, "#waiting-by-design") >= WAITERS
        screenshot(driver, "overview")

        # the queue: one compact row each, oldest first; the waits with what and until when
        driver.get(f"{base}/attention")
        rows = all_css(driver, "table.queue tr.finding")
        assert sorted(r.find_element("css selector", "td.id").text for r in rows) == [
            "order-lost", "order-stuck"]
        assert "waiting-000" not in by_css(driver, "table.queue").text
        waits = by_css(driver, "table.waiting").text
        assert "signal go" in waits and "no time limit" in waits
        screenshot(driver, "attention")
        driver.get(f"{base}/attention?kind=stale")
        assert "No stale finding." in by_css(driver, "table.queue").text

        # item 6: the sagas stopped by a lost worker
        driver.get(f"{base}/sagas?error=worker_lost")
        assert [a.text for a in all_css(driver, "table.sagas td.id a")] == ["order-lost"]

        # item 4 and 5: why, and only what can work: resolve first, no resume, no cancel
        state_shown(driver, base, "order-lost", "manual-review")
        main = by_css(driver, "main").text
        assert "worker_lost" in main and charge.effect_id in main
        assert all_css(driver, "form.resume") == [] and all_css(driver, "form.cancel") == []
        assert "first" in by_css(driver, "#no-action").text
        outcome = by_css(driver, "form.resolve select[name=outcome]")
        assert outcome.get_attribute("value") == ""  # no default outcome
        screenshot(driver, "saga-review")

        # resolve: the provider says it went through; a confirmation page with a reason
        choose(outcome, "committed")
        by_css(driver, "form.resolve textarea[name=result]").send_keys('{"charged": 9}')
        by_css(driver, "form.resolve button").click()
        eventually(lambda: by_css(driver, "#confirm"), "the confirmation page")
        assert stack.sagas.get("order-lost").state == "manual-review"  # nothing yet
        by_css(driver, "input[name=reason]").send_keys("provider dashboard shows ch_9 paid")
        screenshot(driver, "confirm-resolve")
        by_css(driver, "#confirm").click()
        eventually(lambda: "Resolved." in by_css(driver, ".notice").text, "the resolve notice")
        by_css(driver, "form.resume button").click()
        eventually(lambda: "Resumed" in by_css(driver, ".notice").text, "the resume notice")
        stack.release("never")
        wait_until(lambda: state_shown(driver, base, "order-lost", "completed"), SETTLE,
                   "the resolved saga to complete")

        # item 2 (history): the ambiguity, its cause and the resolving operator stay visible
        history = by_css(driver, "#history").text
        assert re.search(r"ambiguous\s+\S+\s+1\s+worker_lost", history), history
        resolve = by_css(driver, "#history tr.event-resolve").text
        assert "olive" in resolve and "provider dashboard shows ch_9 paid" in resolve
        assert all_css(driver, "svg.timeline .mark.ambiguous")
        assert all_css(driver, "svg.timeline rect.unknown")
        assert "nothing is left to do" in by_css(driver, "#no-action").text
        screenshot(driver, "saga-resolved")
        assert len(stack.ops("charge.start", "order-lost")) == 1  # never run again

        # item 8: a signal wait is drawn as such, the idle stretch as a marked break
        driver.get(f"{base}/saga?id=waiting-000")
        assert all_css(driver, "svg.timeline rect.signal")
        assert all_css(driver, "svg.timeline rect.break")
        assert "signal" in by_css(driver, "#waits").text
        assert [f.get_attribute("class") for f in all_css(driver, "form.signal")] == ["action signal"]
        screenshot(driver, "saga-waiting")

        # item 6: an id prefix over the store, error codes, opt-in auto-refresh (no script)
        driver.get(f"{base}/sagas?id=waiting-09")
        assert len(all_css(driver, "table.sagas td.id a")) == 10
        by_css(driver, "#refresh").click()
        eventually(lambda: "refresh=30" in driver.current_url, "the refreshing page")
        assert all_css(driver, 'meta[http-equiv="refresh"]') and all_css(driver, "script") == []
        screenshot(driver, "sagas")

        # item 7: cross-site posts are refused, the forged segment logged as nothing
        with caplog.at_level(logging.INFO, logger="celery_sagas.web"):
            foreign = evil.replace("127.0.0.1", "localhost")
            driver.get(foreign + "/")
            by_css(driver, "#forge button").click()
            eventually(lambda: refused(driver), "the forged post refused")
            driver.get(foreign + "/")
            by_css(driver, "#cancel button").click()
            eventually(lambda: refused(driver), "the cross-site cancel refused")
        assert stack.sagas.get("order-stuck").error_code != "cancelled"
        ours = [r.getMessage() for r in caplog.records if r.name.startswith("celery_sagas")]
        assert all("\n" not in line and "boss" not in line for line in ours), ours
        # the server's access log keeps the request line as sent: percent-encoded, one line
        assert all("\n" not in r.getMessage() for r in caplog.records)

    # failed logins are throttled; the Server header names no version
    with serving(app) as base:
        wrong = {"Authorization": "Basic " + base64.b64encode(b"olive:guess").decode()}
        codes = [status_of(urllib.request.Request(base + "/", headers=wrong)) for _ in range(11)]
        assert codes[:10] == [401] * 10 and codes[10] == 429
        server = _header(base + "/static/style.css", "Server")
        assert server == "celery-sagas"


def refused(driver: Any) -> bool:
    """The page a refused post shows: our 403 (foreign origin) or a 401 (no credentials)."""
    source = driver.page_source
    return "not sent from a page of this app" in source or "authentication required" in source


def _header(url: str, name: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.headers.get(name)
    except urllib.error.HTTPError as error:
        return error.headers.get(name)
