"""The web app and saga ``bench/async_start.py`` serves (uvicorn) and runs (celery worker).

    ASYNC_BENCH_BROKER, ASYNC_BENCH_STORE, ASYNC_BENCH_PREFIX, ASYNC_BENCH_QUEUE,
    ASYNC_BENCH_READY (a file the worker writes once ready)

``POST /aio`` starts a saga with ``await sagas.aio.start(...)``; ``POST /sync`` starts the same
saga with the synchronous client in a thread pool (``anyio.to_thread``), as an async handler
must do without an async client.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio.to_thread
from celery import Celery
from celery.signals import worker_ready
from fastapi import FastAPI

from celery_sagas import Sagas

PREFIX = os.environ.get("ASYNC_BENCH_PREFIX", "abench")
app = Celery("async_bench", broker=os.environ.get("ASYNC_BENCH_BROKER", "redis://127.0.0.1:6379/14"))
app.conf.update(task_default_queue=os.environ.get("ASYNC_BENCH_QUEUE", "async-bench"),
                worker_prefetch_multiplier=1, task_acks_late=True,
                broker_connection_retry_on_startup=True)
# require_aof=False: the benchmarks' Redis runs without AOF (the figures are the store's cost).
sagas = Sagas(app, store=os.environ.get("ASYNC_BENCH_STORE", "redis://127.0.0.1:6379/15"),
              key_prefix=PREFIX, table_prefix=f"{PREFIX}_", require_aof=False)


@sagas.step(compensate=None, name="async_bench.noop")
def noop(i: int) -> int:
    """A step with nothing to do."""
    return i


@sagas.saga("async-bench")
def one_step(ctx: Any, data: dict[str, Any]) -> None:
    """One no-op step."""
    ctx.step(noop, data["i"])


@worker_ready.connect(weak=False)
def _ready(**_: Any) -> None:
    ready = os.environ.get("ASYNC_BENCH_READY")
    if ready:
        with open(ready, "w") as marker:
            marker.write("ready.\n")


web = FastAPI()


@web.post("/aio")
async def start_async() -> dict[str, str]:
    """Start a saga with the async client."""
    handle = await sagas.aio.start("async-bench", {"i": 1}, saga_id=f"a-{uuid.uuid4().hex}")
    return {"saga_id": handle.saga_id}


@web.post("/sync")
async def start_in_thread() -> dict[str, str]:
    """Start a saga with the sync client in a worker thread."""
    saga_id = f"s-{uuid.uuid4().hex}"
    await anyio.to_thread.run_sync(lambda: sagas.start("async-bench", {"i": 1}, saga_id=saga_id))
    return {"saga_id": saga_id}
