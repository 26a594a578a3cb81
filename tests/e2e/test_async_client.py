"""The asyncio client (``sagas.aio``) on real workers: start, signal, wait, operator calls,
and interoperation with the synchronous client on one store (docs/async.md)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from celery_sagas.aio import _facade
from celery_sagas.errors import SagaConflictError, SagaNotFound, SagaValidationError
from tests.e2e.conftest import Stack

ORDER = {"sku": "A1", "amount": 5, "id": "o1"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.cluster
def test_an_async_start_is_awaited_to_completion(stack: Stack) -> None:
    stack.worker()
    aio = stack.sagas.aio

    async def scenario() -> Any:
        try:
            handle = await aio.start("e2e-order", ORDER, saga_id="aio-1")
            assert handle.record.state == "running"
            return await handle.wait(timeout=60)
        finally:
            await aio.aclose()

    record = run(scenario())
    assert record.state == "completed"
    assert [e["op"] for e in stack.ops("charge.done", "aio-1")] == ["charge.done"]
    assert stack.sagas.get("aio-1").state == "completed"  # the sync client reads the same record


def test_a_wait_is_woken_by_the_store_notification(stack: Stack, monkeypatch: Any) -> None:
    """With the safety poll pushed past the timeout, only a notification can end the wait."""
    monkeypatch.setattr(_facade, "_SAFETY_POLL_S", 600.0)
    stack.worker()
    aio = stack.sagas.aio

    async def scenario() -> Any:
        try:
            handle = await aio.start("e2e-signal", {**ORDER, "waits": 1}, saga_id="aio-notify")
            waiting = asyncio.ensure_future(handle.wait(timeout=60))
            await asyncio.sleep(0)  # the waiter subscribes and reads the running record
            await aio.signal("aio-notify", "go", {"amount": 7})
            return await waiting
        finally:
            await aio.aclose()

    record = run(scenario())
    assert record.state == "completed"
    assert record.result == [{"amount": 7}]


def test_sync_and_async_clients_share_one_store(stack: Stack) -> None:
    stack.worker()
    sync = stack.sagas
    sync.start("e2e-signal", {**ORDER, "waits": 1}, saga_id="mixed-1")
    aio = sync.aio

    async def scenario() -> Any:
        try:
            handle = await aio.start("e2e-signal", {**ORDER, "waits": 1}, saga_id="mixed-2")
            waited = asyncio.ensure_future(aio.wait("mixed-1", timeout=60))
            await aio.signal("mixed-1", "go", {"amount": 1})  # started by the sync client
            return await waited, handle
        finally:
            await aio.aclose()

    first, _ = run(scenario())
    assert first.state == "completed"
    sync.signal("mixed-2", "go", {"amount": 2})  # started by the async client
    assert stack.wait_settled("mixed-2").state == "completed"


def test_async_operator_calls_and_errors_match_the_sync_client(stack: Stack) -> None:
    stack.worker()
    aio = stack.sagas.aio

    async def scenario() -> None:
        try:
            await aio.start("e2e-signal", {**ORDER, "waits": 1}, saga_id="aio-cancel")
            with pytest.raises(SagaConflictError):
                await aio.start("e2e-signal", {**ORDER, "waits": 2}, saga_id="aio-cancel")
            with pytest.raises(SagaValidationError):
                await aio.start("e2e-signal", ORDER, saga_id="bad id")
            with pytest.raises(SagaNotFound):
                await aio.wait("no-such-saga", timeout=1)
            assert await aio.get("no-such-saga") is None
            while not [s for s in (await aio.get("aio-cancel")).steps if s.state == "committed"]:
                await asyncio.sleep(0.05)  # the reservation committed: the saga waits for "go"
            await aio.cancel("aio-cancel")
            record = await aio.wait("aio-cancel", timeout=60)
            assert record.state == "compensated"
            page = await aio.findings()
            assert all(f.record_id != "aio-cancel" for f in page.findings)
        finally:
            await aio.aclose()

    run(scenario())
    assert len(stack.ops("release", "aio-cancel")) == 1  # the reservation undone once


def test_the_event_loop_keeps_running_while_calls_are_in_flight(stack: Stack) -> None:
    """Store round trips and publishes are awaited, not blocking: a ticker task keeps ticking
    through 30 concurrent starts, and every start is made on the loop's own thread."""
    stack.worker()
    aio = stack.sagas.aio
    threads: set[int] = set()

    async def scenario() -> tuple[int, list[Any]]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async def start(n: int) -> Any:
            threads.add(threading.get_ident())
            return await aio.start("e2e-order", {**ORDER, "id": f"t{n}"}, saga_id=f"aio-many-{n}")

        try:
            task = asyncio.ensure_future(ticker())
            handles = await asyncio.gather(*(start(n) for n in range(30)))
            records = await asyncio.gather(*(h.wait(timeout=120) for h in handles))
            stop.set()
            await task
            return ticks, records
        finally:
            await aio.aclose()

    ticks, records = run(scenario())
    assert {r.state for r in records} == {"completed"}
    assert ticks > 30  # the ticker ran between the calls' round trips
    assert len(threads) == 1


def test_publishes_run_in_the_clients_own_threads_and_fail_as_in_sync(
        stack: Stack, monkeypatch: Any, caplog: Any) -> None:
    """Each start publishes its step before it returns, from one of the client's publisher
    threads (``broker_pool_limit`` of them at most), not the loop's default executor; a publish
    that fails is logged and left to the sweep, the start returning the running record, as the
    synchronous client does."""
    inner = stack.sagas.dispatcher
    sent: list[tuple[str, str]] = []

    class Recording:
        def send_step(self, saga_id: str, *args: Any, **kwargs: Any) -> None:
            sent.append((saga_id, threading.current_thread().name))
            if saga_id == "aio-pub-broken":
                raise ConnectionError("broker down")
            inner.send_step(saga_id, *args, **kwargs)

        def send_compensation(self, *args: Any, **kwargs: Any) -> None:
            inner.send_compensation(*args, **kwargs)

    monkeypatch.setattr(stack.sagas, "dispatcher", Recording())
    monkeypatch.setitem(stack.sagas.app.conf, "broker_pool_limit", 3)
    aio = stack.sagas.aio

    async def scenario() -> tuple[list[Any], Any]:
        try:
            handles = await asyncio.gather(*(
                aio.start("e2e-order", {**ORDER, "id": f"p{n}"}, saga_id=f"aio-pub-{n}")
                for n in range(20)))
            assert len(sent) == 20  # every step published before its start returned
            broken = await aio.start("e2e-order", ORDER, saga_id="aio-pub-broken")
            return handles, broken
        finally:
            await aio.aclose()

    with caplog.at_level("ERROR", logger="celery_sagas"):
        handles, broken = run(scenario())
    assert {h.record.state for h in handles} == {"running"}
    threads = {name for _, name in sent}
    assert all(name.startswith("celery-sagas-publish") for name in threads), threads
    assert 1 <= len(threads) <= 3
    assert broken.record.state == "running"
    assert stack.sagas.get("aio-pub-broken").state == "running"  # durable before the publish
    assert "dispatch failed" in caplog.text
