"""Waking async waiters when a saga settles (docs/async.md).

Workers tell the store whenever they move a saga into a settled state (``notify_settled``:
Redis PUBLISH on ``<prefix>:settled``, PostgreSQL NOTIFY on ``<table prefix>settled``). Each
async client keeps one listener per event loop on that channel and sets the events of the
``wait`` calls watching that saga. A listener that is not (yet, or any more) subscribed leaves
its waiters polling, so a missed or lost notification costs latency, never an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

__all__ = ["Listen", "SettleListener", "postgres_listen", "redis_listen"]

logger = logging.getLogger("celery_sagas")

# Listen(on_id, ready): receives settled ids until cancelled; sets ``ready`` once subscribed.
Listen = Callable[[Callable[[str], None], asyncio.Event], Awaitable[None]]

_RECONNECT_S = (0.1, 0.5, 1.0, 2.0, 5.0)


class SettleListener:
    """Holds the waiters of one client on one loop and the task that wakes them."""

    def __init__(self, listen: Listen | None) -> None:
        self._listen = listen
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def subscribed(self) -> bool:
        """True while notifications arrive (else waiters poll)."""
        return self._ready.is_set()

    async def ensure_started(self, within_s: float = 1.0) -> bool:
        """Start listening if the store can notify; wait up to ``within_s`` to be subscribed."""
        if self._listen is None:
            return False
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        if not self._ready.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), within_s)
        return self._ready.is_set()

    @contextlib.contextmanager
    def watch(self, saga_id: str) -> Iterator[asyncio.Event]:
        """An event set when ``saga_id`` is announced as settled, for the block's duration."""
        event = asyncio.Event()
        self._waiters.setdefault(saga_id, set()).add(event)
        try:
            yield event
        finally:
            watchers = self._waiters.get(saga_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._waiters[saga_id]

    def wake(self, saga_id: str) -> None:
        """Set the events of every waiter of ``saga_id``."""
        for event in self._waiters.get(saga_id, ()):
            event.set()

    async def aclose(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _run(self) -> None:
        assert self._listen is not None
        failures = 0
        while True:
            try:
                await self._listen(self.wake, self._ready)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost connection: waiters poll until re-subscribed
                logger.warning("celery_sagas async listener lost its subscription: %s",
                               type(exc).__name__)
            self._ready.clear()
            await asyncio.sleep(_RECONNECT_S[min(failures, len(_RECONNECT_S) - 1)])
            failures += 1


def redis_listen(client: Any, channel: str) -> Listen:
    """Subscribe ``client`` (``redis.asyncio``) to ``channel``."""

    async def listen(on_id: Callable[[str], None], ready: asyncio.Event) -> None:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            ready.set()
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "message":
                    on_id(_text(message["data"]))
        finally:
            ready.clear()
            await pubsub.aclose()

    return listen


def postgres_listen(dsn: str, channel: str) -> Listen:
    """LISTEN on ``channel`` over a psycopg async connection of its own."""

    async def listen(on_id: Callable[[str], None], ready: asyncio.Event) -> None:
        import psycopg
        from psycopg import sql

        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            ready.set()
            async for notification in conn.notifies():
                on_id(notification.payload)
        finally:
            ready.clear()
            await conn.close()

    return listen


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
