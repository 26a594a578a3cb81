"""The operator UI in headless Chromium over a real Redis store and real prefork workers.

The stacks are the e2e suite's (``tests.e2e.conftest``): a Redis broker and store under a
fresh prefix, its own queue, ``celery worker`` processes. The UI is ``create_app`` over the
test process's ``Sagas`` (same store and broker), served on a loopback port. The run takes a
screenshot of every page (into ``docs/images`` with ``CELERY_SAGAS_WEB_SCREENSHOTS=docs/images``).
"""

from __future__ import annotations

import base64
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_sagas.web import WebUser, create_app
from tests.e2e.approval_app import build as build_gated
from tests.e2e.approval_app import write_settings
from tests.e2e.conftest import REDIS_BROKER, Stack, _make_stack, wait_until
from tests.web.browser import chromium, need_browser, screenshot, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

USERS = (WebUser("olive", "olive-pw", "operator"), WebUser("rita", "rita-pw", "readonly"))
SCRIPT_ID = "<script>alert(1)</script>"
SETTLE = 60.0


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """The e2e order app on Redis (broker and store), with its browser checked first."""
    need_browser()
    yield from _make_stack(tmp_path, REDIS_BROKER, redis_url)


def login(driver: Any, base: str, user: str, password: str, path: str = "/") -> None:
    """Open ``path`` with HTTP basic credentials (the browser keeps them for the site)."""
    host = base.removeprefix("http://")
    driver.get(f"http://{user}:{password}@{host}{path}")


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def eventually(check: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    """Poll ``check`` until the page a click loads passes it: right after a click the old page
    may still be there, or its elements go stale as the new one replaces it."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def passes() -> bool:
        try:
            return bool(check())
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    wait_until(passes, timeout, what)


def state_shown(driver: Any, base: str, saga_id: str, state: str) -> bool:
    """Reload the saga's page and tell whether it shows ``state``."""
    driver.get(f"{base}/saga?{urllib.parse.urlencode({'id': saga_id})}")
    return bool(by_css(driver, "#saga-state").text == state)


def status_of(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def choose(select: Any, value: str) -> None:
    """Pick ``value`` in a ``<select>``."""
    from selenium.webdriver.support.ui import Select

    Select(select).select_by_value(value)


def assert_no_alert(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is how Selenium asks


def test_an_operator_resolves_and_resumes_a_review_from_the_browser(stack: Stack) -> None:
    # given: workers, a completed order, one whose charge went silent, one with a script id
    stack.worker()
    order = stack.shop.order
    order.start({"sku": "A", "amount": 5, "id": "ok-1"}, saga_id="order-ok-1")
    order.start({"sku": "R", "amount": 9, "id": "r1", "plan": {"crash": "charge"}},
                saga_id="order-review-1")
    order.start({"sku": "D", "amount": 7, "id": "d1", "plan": {"decline": "ship"}},
                saga_id="order-declined-1")
    order.start({"sku": "S", "amount": 1, "id": "s1"}, saga_id=SCRIPT_ID)
    for saga_id in ("order-ok-1", "order-review-1", "order-declined-1", SCRIPT_ID):
        stack.wait_settled(saga_id, timeout=SETTLE)
    app = create_app(stack.sagas, users=USERS)

    with serving(app) as base, chromium() as driver:
        # when: log in and open the overview
        login(driver, base, "olive", "olive-pw")
        assert "olive · operator" in by_css(driver, ".who").text
        assert by_css(driver, '.card[data-state="manual-review"] .number').text == "1"
        screenshot(driver, "overview")

        # follow the manual-review saga to its page
        by_css(driver, '.card[data-state="manual-review"]').click()
        eventually(lambda: "state=manual-review" in driver.current_url, "the sagas page")
        screenshot(driver, "sagas")
        driver.find_element("link text", "order-review-1").click()
        eventually(lambda: by_css(driver, "#saga-state").text == "manual-review", "the saga page")
        charge = stack.sagas.get("order-review-1").steps[1]
        assert charge.effect_id in by_css(driver, "main").text
        assert by_css(driver, "tr.effect-unknown td.id").text == charge.effect_id
        screenshot(driver, "saga-review")

        # a declined order's page draws its compensations
        state_shown(driver, base, "order-declined-1", "compensated")
        assert len(all_css(driver, "svg.timeline rect.undo")) == 2
        screenshot(driver, "saga-compensated")

        # the queue says what to do
        driver.get(f"{base}/attention")
        assert f"idempotency key {charge.effect_id}" in by_css(driver, "main").text
        screenshot(driver, "attention")

        # resolve through the form (effect id prefilled), then resume
        state_shown(driver, base, "order-review-1", "manual-review")
        form = by_css(driver, "form.resolve")
        assert form.find_element("name", "effect_id").get_attribute("value") == charge.effect_id
        choose(form.find_element("name", "outcome"), "committed")
        form.find_element("name", "result").send_keys('{"charged": 9}')
        form.find_element("css selector", "button").click()
        eventually(lambda: by_css(driver, "#confirm"), "the confirmation page")
        screenshot(driver, "confirm-resolve")
        by_css(driver, "#confirm").click()
        eventually(lambda: "Resolved." in by_css(driver, ".notice").text, "the resolve notice")
        screenshot(driver, "saga-resolved")
        by_css(driver, "form.resume button").click()
        eventually(lambda: "Resumed" in by_css(driver, ".notice").text, "the resume notice")

        # then: the workers finish it, and the page shows it
        wait_until(lambda: state_shown(driver, base, "order-review-1", "completed"), SETTLE,
                   "the resumed saga to complete")
        screenshot(driver, "saga-completed")
        record = stack.sagas.get("order-review-1")
        assert record.steps[1].result == {"charged": 9}
        assert len(stack.ops("charge.start", "order-review-1")) == 1  # never run again

        # an action without its CSRF token is refused
        order.start({"sku": "C", "amount": 2, "id": "c1", "plan": {"crash": "charge"}},
                    saga_id="order-review-2")
        stack.wait_settled("order-review-2", timeout=SETTLE)
        state_shown(driver, base, "order-review-2", "manual-review")
        driver.execute_script("document.querySelectorAll('input[name=csrf_token]')"
                              ".forEach(function (e) { e.remove(); })")
        choose(by_css(driver, "form.resolve select[name=outcome]"), "not-committed")
        by_css(driver, "form.resolve button").click()
        eventually(lambda: driver.title.startswith("403"), "the 403 page")
        assert "CSRF" in by_css(driver, ".refused").text
        screenshot(driver, "refused-csrf")
        assert stack.sagas.get("order-review-2").state == "manual-review"

        # a saga id holding a script renders as text
        driver.get(f"{base}/saga?{urllib.parse.urlencode({'id': SCRIPT_ID})}")
        assert by_css(driver, "#saga-id").text == SCRIPT_ID
        assert all_css(driver, "script") == []
        assert_no_alert(driver)
        driver.get(f"{base}/sagas?id=%3Cscript")
        assert [a.text for a in all_css(driver, "td.id a")] == [SCRIPT_ID]
        assert_no_alert(driver)

    with serving(app) as base, chromium() as driver:
        # a read-only user sees the pages without any action form
        login(driver, base, "rita", "rita-pw")
        for path in ("/", "/sagas", "/saga?id=order-review-2", "/attention"):
            driver.get(base + path)
            assert "rita · readonly" in by_css(driver, ".who").text
            assert all_css(driver, "form[method=post]") == [], path
            assert all_css(driver, "input[name=csrf_token]") == [], path
        driver.get(base + "/saga?id=order-review-2")
        screenshot(driver, "readonly")

        # requests without credentials (or with wrong ones) get 401
        for path in ("/", "/sagas", "/saga?id=order-review-2", "/attention", "/static/style.css"):
            assert status_of(urllib.request.Request(base + path)) == 401, path
        wrong = "Basic " + base64.b64encode(b"olive:nope").decode()
        assert status_of(urllib.request.Request(base + "/", headers={"Authorization": wrong})) == 401
        post = urllib.request.Request(base + "/actions/resume", data=b"saga_id=order-review-2",
                                      method="POST")
        assert status_of(post) == 401


@pytest.fixture
def gated_stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """The e2e approval app on Redis: reserve, a manager's approval, charge."""
    need_browser()
    for stack in _make_stack(tmp_path, REDIS_BROKER, redis_url):
        write_settings(stack.config.control, secrets.token_hex(32), 900.0)
        stack.shop = build_gated(stack.config)
        stack.app_module = "tests.e2e.approval_app"
        yield stack


def test_an_operator_approves_a_gated_saga_from_the_browser(gated_stack: Stack) -> None:
    # given: a saga waiting at its gate
    stack = gated_stack
    stack.worker()
    stack.shop.order.start({"id": "g-1", "amount": 250, "tenant": "t1", "requester": "alice"},
                           saga_id="gated-1")
    [pending] = wait_until(lambda: stack.sagas.approvals.pending("gated-1"), SETTLE, "the gate")
    app = create_app(stack.sagas, users=USERS)

    with serving(app) as base, chromium() as driver:
        login(driver, base, "olive", "olive-pw", "/saga?id=gated-1")
        assert by_css(driver, "#saga-state").text == "running"
        assert pending.token not in driver.page_source
        screenshot(driver, "saga-gated")

        # when: the operator approves from the queue
        driver.get(f"{base}/attention")
        assert pending.approval_id in by_css(driver, "table.approvals").text
        screenshot(driver, "attention-approval")
        by_css(driver, "form.approve button").click()  # approve: no confirmation needed

        # then: approved by the operator; the requester's token resumes it
        eventually(lambda: "Approved." in by_css(driver, ".notice").text, "the approve notice")
        approval = stack.sagas.approvals.get(pending.approval_id)
        assert (approval.state, approval.decided_by) == ("approved", "olive")
        stack.sagas.approvals.resume("gated-1", pending.token, tenant_id="t1", principal_id="alice")
        wait_until(lambda: state_shown(driver, base, "gated-1", "completed"), SETTLE,
                   "the approved saga to complete")
        screenshot(driver, "saga-approved")
        assert [e["op"] for e in stack.ledger()] == ["reserve", "charge"]

        # a cancel confirmed on its second page takes the saga's approval out of the queue
        stack.shop.order.start({"id": "g-2", "amount": 90, "tenant": "t1", "requester": "bob"},
                               saga_id="gated-2")
        [second] = wait_until(lambda: stack.sagas.approvals.pending("gated-2"), SETTLE, "gate 2")
        state_shown(driver, base, "gated-2", "running")
        assert all_css(driver, "form.resume") == []  # running, its gate waiting: nothing to resume
        by_css(driver, "form.cancel button").click()
        eventually(lambda: by_css(driver, "#confirm"), "the cancel confirmation")
        assert stack.sagas.get("gated-2").state == "running"  # not yet
        by_css(driver, "input[name=reason]").send_keys("requester withdrew the order")
        by_css(driver, "#confirm").click()
        wait_until(lambda: state_shown(driver, base, "gated-2", "compensated"), SETTLE,
                   "the cancelled saga compensated")
        assert "requester withdrew the order" in by_css(driver, "#history").text
        driver.get(f"{base}/attention")
        assert second.approval_id not in by_css(driver, "main").text
        driver.get(f"{base}/")
        assert by_css(driver, "#approvals-waiting").text == "0"
