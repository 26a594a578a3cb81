"""The shop example: its web handlers and the README's demo command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The example's Flask app over a memory store, driven in-process."""
    os.environ["SHOP_STORE"] = "memory://"
    os.environ["SHOP_BROKER"] = "memory://localhost/"
    os.environ["SHOP_PROVIDER_DB"] = str(tmp_path_factory.mktemp("shop") / "provider.db")
    from celery_sagas.testing.driver import SagaDriver
    from examples.shop import web

    driver = SagaDriver(web.sagas)
    yield web.app.test_client(), driver


def test_post_order_returns_at_once_and_get_shows_the_completed_saga(shop: Any) -> None:
    client, driver = shop
    order = {"id": "web-1", "sku": "A", "qty": 1, "card": "4242", "total": 10}
    response = client.post("/orders", json=order)
    assert response.status_code == 202
    assert response.get_json() == {"saga_id": "web-1", "state": "running"}
    # recorded with its first step's intent, which is sent to a worker
    [first] = client.get("/orders/web-1").get_json()["steps"]
    assert (first["state"], first["attempts"]) == ("executing", 0)
    driver.run_until_idle()
    body = client.get("/orders/web-1").get_json()
    assert body["state"] == "completed"
    assert [s["state"] for s in body["steps"]] == ["committed"] * 4
    assert "4242" not in str(body)


def test_a_declined_card_is_compensated_and_a_bad_order_is_refused(shop: Any) -> None:
    client, driver = shop
    client.post("/orders", json={"id": "web-2", "sku": "B", "qty": 1, "card": "declined-1",
                                 "total": 10})
    driver.run_until_idle()
    body = client.get("/orders/web-2").get_json()
    assert (body["state"], body["error_code"]) == ("compensated", "card_declined")
    assert client.post("/orders", json=["not", "an", "object"]).status_code == 400
    assert client.post("/orders", json={"id": "has space", "total": 1}).status_code == 400
    assert client.get("/orders/nope").status_code == 404


def test_a_large_order_waits_for_a_manager_then_resumes_with_its_token(shop: Any) -> None:
    client, driver = shop
    client.post("/orders", json={"id": "web-3", "sku": "C", "qty": 1, "card": "4242",
                                 "total": 900, "customer": "carol"})
    driver.run_until_idle()
    assert client.get("/orders/web-3").get_json()["steps"][1]["state"] == "awaiting-approval"
    approval = client.get("/orders/web-3/approval").get_json()
    wrong = client.post(f"/approvals/{approval['approval_id']}/decision",
                        json={"decision": "approved", "decided_by": "mia", "tenant_id": "other"})
    assert wrong.status_code == 409
    decided = client.post(f"/approvals/{approval['approval_id']}/decision",
                          json={"decision": "approved", "decided_by": "mia", "tenant_id": "shop"})
    assert decided.get_json()["state"] == "approved"
    stolen = client.post("/orders/web-3/resume",
                         json={"token": approval["token"], "principal_id": "mallory"})
    assert stolen.status_code == 409
    resumed = client.post("/orders/web-3/resume",
                          json={"token": approval["token"], "principal_id": "carol"})
    assert resumed.status_code == 200
    driver.run_until_idle()
    assert client.get("/orders/web-3").get_json()["state"] == "completed"
    replay = client.post("/orders/web-3/resume",
                         json={"token": approval["token"], "principal_id": "carol"})
    assert replay.get_json() == {"error": "ApprovalTokenReplay"}


def test_a_tracked_order_waits_for_the_carrier_webhook_and_a_retried_hook_counts_once(
        shop: Any) -> None:
    client, driver = shop
    client.post("/orders", json={"id": "web-4", "sku": "D", "qty": 1, "card": "4242",
                                 "total": 10, "track_delivery": True})
    driver.run_until_idle()
    body = client.get("/orders/web-4").get_json()
    assert (body["state"], body["steps"][-1]["state"]) == ("running", "waiting")
    hook = {"order_id": "web-4", "event": "delivered", "delivery_id": "dlv-1", "at": "noon"}
    assert client.post("/webhooks/carrier", json=hook).status_code == 202
    assert client.post("/webhooks/carrier", json={**hook, "at": "retry"}).status_code == 202
    driver.run_until_idle()
    record = web_sagas().get("web-4")
    assert record.state == "completed"
    assert [s.payload["at"] for s in record.signals] == ["noon"]
    assert client.post("/webhooks/carrier", json={**hook, "order_id": "nope"}).status_code == 404
    assert client.post("/webhooks/carrier", json={"event": "lost"}).status_code == 400


def test_a_card_the_primary_acquirer_refuses_is_charged_by_the_backup_one(shop: Any) -> None:
    # given: a card the primary acquirer's fraud rules decline
    client, driver = shop
    client.post("/orders", json={"id": "web-5", "sku": "E", "qty": 1, "card": "risky-5",
                                 "total": 12})

    # when
    driver.run_until_idle()

    # then: run caught StepFailed and charged with the backup acquirer
    body = client.get("/orders/web-5").get_json()
    assert body["state"] == "completed"
    assert [(s["name"], s["state"]) for s in body["steps"]][1:3] == [
        ("shop.charge_card", "failed"), ("shop.charge_backup", "committed")]


def test_a_label_whose_purchase_timed_out_is_cancelled_and_the_order_compensated(
        shop: Any) -> None:
    # given: the carrier times out after the label was bought
    from examples.shop.provider import provider

    client, driver = shop
    client.post("/orders", json={"id": "web-6", "sku": "F", "qty": 1, "card": "4242",
                                 "total": 14, "carrier": "flaky"})

    # when
    driver.run_until_idle()

    # then: compensated (not in review): the label cancelled by its request id, the charge
    # refunded saying why, the stock released
    record = web_sagas().get("web-6")
    assert (record.state, record.error_code) == ("compensated", "step_error")
    label = record.step("shop.buy_label")
    assert label is not None and label.outcome_unknown
    # the label bought under its effect id was cancelled by that request id, as unknown
    assert ("shipping", "label", label.effect_id) in provider().effects()
    cancel = provider().call(label.compensation_effect_id, "shipping", "cancel-label", {})
    assert cancel == {"cancelled": label.effect_id, "outcome": "unknown"}
    refund = provider().call(record.step("shop.charge_card").compensation_effect_id,
                             "payments", "refund", {})
    assert refund["why"] == "shop.buy_label: step_error"


def test_a_busy_carrier_is_asked_again(shop: Any) -> None:
    client, driver = shop
    client.post("/orders", json={"id": "web-7", "sku": "G", "qty": 1, "card": "4242",
                                 "total": 16, "carrier": "busy"})
    for _ in range(20):  # its retry is due 0.2 s later
        driver.run_until_idle()
        if web_sagas().get("web-7").state == "completed":
            break
        time.sleep(0.1)
        web_sagas().sweep()
    record = web_sagas().get("web-7")
    assert record.state == "completed"
    assert record.step("shop.buy_label").attempts == 2


def web_sagas() -> Any:
    from examples.shop import web

    return web.sagas


def test_the_readme_demo_runs_without_services(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_")}
    env["SHOP_PROVIDER_DB"] = str(tmp_path / "provider.db")
    done = subprocess.run([sys.executable, "-m", "examples.shop.demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count(": completed") == 3 and ": compensated (card_declined)" in out
    assert ": compensated (step_error)" in out  # the label whose outcome was unknown
    assert "shop.charge_backup" in out and "cancel-label" in out
    assert "approved by manager-mia" in out
    assert "shop.charge_card     failed" in out
