"""``sagas.aio``: the asyncio client, for ``async def`` web handlers (docs/async.md).

Every call runs the same code as the synchronous facade (validation, replay, codec, Lua
scripts, tracing spans, errors) on the asyncio drivers of ``_stores.py``, through the greenlet
bridge of ``_bridge.py``: the event loop is never blocked by a store round trip or a publish.
``wait`` wakes on the store's settle notification (Redis, PostgreSQL) and polls otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from .. import _values as values
from .._celery.settings import SagaSettings
from .._celery.wiring import Runtime, default_clock
from .._clock import Clock
from .._definitions import Registry
from .._dispatch import Dispatcher
from .._findings import FindingPage
from .._middleware import Middlewares
from .._records import SagaHistory, SagaRecord
from .._repository import SETTLED
from ..errors import SagaNotFound
from ..stores.base import Store
from ._bridge import BridgedDispatcher, in_greenlet, publisher_pool
from ._notify import SettleListener
from ._stores import open_async_store


class _Named(Protocol):
    """A saga definition as ``@sagas.saga`` returns it."""

    @property
    def name(self) -> str:
        """The definition name."""
        ...


class SyncClient(Protocol):
    """What the async client needs of ``Sagas``: its configuration and a view of its
    operations over another runtime."""

    app: Any
    settings: SagaSettings
    registry: Registry
    middlewares: Middlewares
    dispatcher: Dispatcher
    clock: Clock | None

    @property
    def store_target(self) -> str | Store:
        """The store URL or object."""
        ...

    def on_runtime(self, runtime: Runtime) -> Any:
        """The facade's operations through ``runtime``."""
        ...

__all__ = ["AsyncSagaHandle", "AsyncSagas", "SyncClient"]

T = TypeVar("T")

_SAFETY_POLL_S = 2.0  # a subscribed waiter still reads now and then: a notification can be lost
_POLL_S = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # the backoff of a waiter without notifications
_PUBLISH_THREADS = 10  # Celery's default broker_pool_limit, when the app sets none


class AsyncSagaHandle:
    """A started saga: its id, the record at start, and awaitable shortcuts."""

    def __init__(self, client: AsyncSagas, record: SagaRecord) -> None:
        self.client = client
        self.saga_id = record.saga_id
        self.record = record

    async def get(self) -> SagaRecord | None:
        """The current record."""
        return await self.client.get(self.saga_id)

    async def wait(self, timeout: float = 30.0) -> SagaRecord:
        """Until the saga is completed, compensated or in manual review."""
        return await self.client.wait(self.saga_id, timeout=timeout)

    def __repr__(self) -> str:
        return f"AsyncSagaHandle({self.saga_id!r})"


class _Loop:
    """What the client holds per event loop: a runtime on async drivers, a listener, and the
    gate that admits as many calls at once as the store has connections."""

    def __init__(self, view: Any, runtime: Runtime, listener: SettleListener,
                 connections: int | None) -> None:
        self.view = view
        self.runtime = runtime
        self.listener = listener
        self.gate = asyncio.Semaphore(connections) if connections else None


class AsyncSagas:
    """The asyncio client of a ``Sagas``: the same operations, awaited (``sagas.aio``)."""

    def __init__(self, sagas: SyncClient) -> None:
        self.sagas = sagas
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Loop] = (
            weakref.WeakKeyDictionary())
        self._publisher: ThreadPoolExecutor | None = None  # shared by this client's loops
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[_Loop]] = (
            weakref.WeakKeyDictionary())

    # ------------------------------------------------------------ operations

    async def start(self, definition: str | _Named, input: Any,
                    saga_id: str | None = None) -> AsyncSagaHandle:
        """As ``Sagas.start``: record the saga with its first step and send that step."""
        name = definition if isinstance(definition, str) else definition.name
        handle = await self._call(lambda view: view.start(name, input, saga_id=saga_id))
        return AsyncSagaHandle(self, handle.record)

    async def get(self, saga_id: str) -> SagaRecord | None:
        """As ``Sagas.get``: the saga record, or None."""
        return await self._call(lambda view: view.get(saga_id))

    async def history(self, saga_id: str) -> SagaHistory:
        """As ``Sagas.history``: what happened to the saga, oldest first."""
        return await self._call(lambda view: view.history(saga_id))

    async def signal(self, saga_id: str, name: str, payload: Any = None,
                     signal_id: str | None = None, *, actor: str | None = None,
                     reason: str | None = None) -> SagaRecord:
        """As ``Sagas.signal``: record the signal (one write) and advance a saga waiting for it."""
        return await self._call(lambda view: view.signal(saga_id, name, payload, signal_id,
                                                         actor=actor, reason=reason))

    async def cancel(self, saga_id: str, *, actor: str | None = None,
                     reason: str | None = None) -> SagaRecord:
        """As ``Sagas.cancel``."""
        return await self._call(lambda view: view.cancel(saga_id, actor=actor, reason=reason))

    async def resume(self, saga_id: str, *, actor: str | None = None,
                     reason: str | None = None) -> SagaRecord:
        """As ``Sagas.resume``."""
        return await self._call(lambda view: view.resume(saga_id, actor=actor, reason=reason))

    async def resolve(self, saga_id: str, step: str, effect_id: str, outcome: str, *,
                      result: Any = None, error_code: str | None = None,
                      actor: str | None = None, reason: str | None = None) -> SagaRecord:
        """As ``Sagas.resolve``."""
        return await self._call(lambda view: view.resolve(
            saga_id, step, effect_id, outcome, result=result, error_code=error_code,
            actor=actor, reason=reason))

    async def findings(self, report: str = "all", *, cursor: str | None = None,
                       limit: int = 100) -> FindingPage:
        """As ``Sagas.findings``: one page of what needs an operator."""
        return await self._call(lambda view: view.findings(report, cursor=cursor, limit=limit))

    async def wait(self, saga_id: str, timeout: float = 30.0) -> SagaRecord:
        """Until completed, compensated or in manual review; ``TimeoutError`` past ``timeout``.

        Woken by the store's notification where it sends them (Redis, PostgreSQL), with a
        read every few seconds in case one is lost; elsewhere it polls with backoff.
        """
        deadline = time.monotonic() + values.wait_seconds(timeout, "timeout", allow_zero=True)
        loop = await self._loop()
        subscribed = await loop.listener.ensure_started()
        polls = 0
        with loop.listener.watch(saga_id) as settled:
            while True:
                settled.clear()
                record = await self.get(saga_id)
                if record is None:
                    raise SagaNotFound(saga_id=saga_id)
                if record.state in SETTLED:
                    return record
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"saga {saga_id!r} still {record.state} after {timeout}s")
                if subscribed and loop.listener.subscribed:
                    pause = min(left, _SAFETY_POLL_S)
                else:
                    pause = min(left, _POLL_S[min(polls, len(_POLL_S) - 1)])
                    polls += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(settled.wait(), pause)

    async def aclose(self) -> None:
        """Close this loop's listener and store connections."""
        loop = self._loops.pop(asyncio.get_running_loop(), None)
        if loop is not None:
            await loop.listener.aclose()
            await in_greenlet(loop.runtime.store.close)

    # ------------------------------------------------------------ plumbing

    async def _call(self, call: Callable[[Any], T]) -> T:
        loop = await self._loop()
        if loop.gate is None:
            return await in_greenlet(call, loop.view)
        # A call past the store's connections waits here, first come first served, before its
        # replay and planning rather than after them at the pool: 200 concurrent starts on 15
        # PostgreSQL connections then finish in waves, as a thread pool's do, instead of all
        # together at the end (docs/async.md, Cost).
        async with loop.gate:
            return await in_greenlet(call, loop.view)

    async def _loop(self) -> _Loop:
        running = asyncio.get_running_loop()
        found = self._loops.get(running)
        if found is None:
            # The first calls on a loop, concurrent, open one store between them (each used to
            # open its own, the last one kept and the others' connections left open).
            opening = self._opening.get(running)
            if opening is None:
                opening = running.create_task(in_greenlet(self._open))
                self._opening[running] = opening
                opening.add_done_callback(lambda _: self._opening.pop(running, None))
            found = await asyncio.shield(opening)
            self._loops[running] = found
        return found

    def _open(self) -> _Loop:
        sagas = self.sagas
        opened = open_async_store(sagas.store_target, sagas.settings)
        if self._publisher is None:
            self._publisher = publisher_pool(_publish_threads(sagas.app))
        runtime = Runtime(opened.store, sagas.settings, sagas.registry, sagas.middlewares,
                          BridgedDispatcher(sagas.dispatcher, self._publisher),
                          default_clock(sagas.clock))
        return _Loop(sagas.on_runtime(runtime), runtime, SettleListener(opened.listen),
                     opened.connections)


def _publish_threads(app: Any) -> int:
    """One publisher thread per producer of the app's pool (``broker_pool_limit``): more would
    only wait for a producer, fewer would queue publishes that a producer could send."""
    limit = getattr(getattr(app, "conf", None), "broker_pool_limit", None)
    return limit if isinstance(limit, int) and limit > 0 else _PUBLISH_THREADS
