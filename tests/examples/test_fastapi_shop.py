"""The FastAPI example served for real: uvicorn, a celery worker, httpx (docs/async.md)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import processes

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[2]
from tests.e2e.conftest import wait_until  # noqa: E402 - after the importorskips

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def shop(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A worker and a uvicorn server of examples.fastapi_shop on this test's queue and prefix."""
    from tests.conftest import REDIS_BROKER_URL

    tag = "fa" + uuid.uuid4().hex[:8]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FASTAPI_SHOP_BROKER": REDIS_BROKER_URL,
           # the test Redis runs without AOF: opted out in the URL, as the example's doc says
           "FASTAPI_SHOP_STORE": f"{redis_url}?require_aof=false", "FASTAPI_SHOP_QUEUE": f"q-{tag}",
           "FASTAPI_SHOP_PREFIX": tag, "FASTAPI_SHOP_SWEEP_INTERVAL": "1"}
    logs = {name: tmp_path / f"{name}.log" for name in ("worker", "web")}
    commands = {
        "worker": [sys.executable, "-m", "celery", "-A", "examples.fastapi_shop.app", "worker",
                   "-B", "-s", str(tmp_path / "beat"), "-c", "2", "-l", "INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat"],
        "web": [sys.executable, "-m", "uvicorn", "examples.fastapi_shop.web:app",
                "--host", "127.0.0.1", "--port", str(port)],
    }
    procs = []
    try:
        for name, command in commands.items():
            with open(logs[name], "wb") as out:
                procs.append(processes.spawn(command, cwd=ROOT, env=env, stdout=out,
                                             stderr=subprocess.STDOUT))
        wait_until(lambda: "ready." in logs["worker"].read_text(errors="replace"), 60,
                   "worker ready")
        wait_until(lambda: "Uvicorn running" in logs["web"].read_text(errors="replace"), 60,
                   "uvicorn running")
        yield f"http://127.0.0.1:{port}", {k: str(v) for k, v in logs.items()}
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            processes.forget(proc)
        import redis

        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{{{tag}:*", count=1000))
        if keys:
            client.delete(*keys)


def test_an_order_started_and_paid_through_async_routes_completes(shop: Any) -> None:
    base, _ = shop
    with httpx.Client(base_url=base, timeout=60) as http:
        started = http.post("/orders", json={"id": "fa-1", "sku": "A", "qty": 2})
        assert started.status_code == 202
        assert started.json() == {"saga_id": "fa-1", "state": "running"}
        assert http.post("/orders", json={"id": "fa-1", "sku": "A", "qty": 2}).status_code == 202
        assert http.post("/orders", json={"id": "fa-1", "sku": "B", "qty": 2}).status_code == 409
        wait_until(
            lambda: ["fastapi_shop.reserve", "committed"] in http.get("/orders/fa-1").json()["steps"],
            60, "reservation committed")
        for _ in range(2):  # the provider retries its webhook: one signal
            paid = http.post("/webhooks/payment",
                             json={"order_id": "fa-1", "delivery_id": "d-1", "status": "succeeded"})
            assert paid.status_code == 200
        done = http.get("/orders/fa-1/wait", params={"timeout": 60})
        assert done.status_code == 200
        assert done.json()["state"] == "completed"
        assert done.json()["result"] == {"tracking": "trk-fa-1"}


def test_a_failed_payment_compensates_and_errors_are_http_errors(shop: Any) -> None:
    base, _ = shop
    with httpx.Client(base_url=base, timeout=60) as http:
        assert http.post("/orders", json={"id": "fa-2", "sku": "A", "qty": 1}).status_code == 202
        paid = http.post("/webhooks/payment",
                         json={"order_id": "fa-2", "delivery_id": "d-2", "status": "declined"})
        assert paid.status_code == 200
        done = http.get("/orders/fa-2/wait", params={"timeout": 60}).json()
        assert (done["state"], done["error_code"]) == ("compensated", "payment_failed")
        assert http.post("/orders", json={"id": "has space", "sku": "A", "qty": 1}).status_code == 400
        assert http.get("/orders/nope").status_code == 404
        assert http.post("/webhooks/payment", json={"order_id": "nope"}).status_code == 404
        pending = http.post("/orders", json={"id": "fa-3", "sku": "A", "qty": 1})
        assert pending.status_code == 202
        assert http.get("/orders/fa-3/wait", params={"timeout": 0.5}).status_code == 408
