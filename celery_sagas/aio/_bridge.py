"""Running the saga code on asyncio drivers: greenlets, as SQLAlchemy's asyncio extension does.

The engine, the repository, the codec and the stores are written once, synchronously. The
async client runs that same code inside ``greenlet_spawn``; where it reaches the network, the
objects here hand the call to the event loop with ``await_only``: an async Redis client behind
the synchronous interface the Redis store uses, SQLAlchemy's async engine behind its
``sync_engine``, and the Celery publish in a thread of the client's own publisher pool (kombu
has no asyncio transport). The event loop keeps running while a store or broker call is in
flight: nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.util import await_only, greenlet_spawn

from .._dispatch import Dispatcher
from .._records import StepRecord

__all__ = ["BridgedDispatcher", "BridgedRedis", "in_greenlet", "publisher_pool"]

T = TypeVar("T")


async def in_greenlet(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run synchronous saga code whose I/O goes through the bridges below."""
    result: T = await greenlet_spawn(call, *args, **kwargs)
    return result


def _awaited(value: Awaitable[T]) -> T:
    return await_only(value)


class _BridgedScript:
    """A registered Lua script of an async client, called like redis-py's sync ``Script``."""

    def __init__(self, script: Any) -> None:
        self._script = script

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        return _awaited(self._script(keys=list(keys), args=list(args)))


class _BridgedPipeline:
    """A non-transactional pipeline of an async client: commands queue, ``execute`` awaits."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline

    def hgetall(self, key: str) -> _BridgedPipeline:
        """Queue HGETALL."""
        self._pipeline.hgetall(key)
        return self

    def zscore(self, key: str, member: str) -> _BridgedPipeline:
        """Queue ZSCORE."""
        self._pipeline.zscore(key, member)
        return self

    def zcount(self, key: str, low: Any, high: Any) -> _BridgedPipeline:
        """Queue ZCOUNT."""
        self._pipeline.zcount(key, low, high)
        return self

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands; their replies in order."""
        replies: list[Any] = _awaited(self._pipeline.execute(raise_on_error=raise_on_error))
        return replies


class BridgedRedis:
    """The synchronous client interface ``RedisStore`` uses, over a ``redis.asyncio`` client
    (plain or cluster). Only the commands the store sends are offered."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def register_script(self, text: str) -> _BridgedScript:
        """Register a Lua script (EVALSHA, reloaded on NOSCRIPT by redis-py)."""
        return _BridgedScript(self.client.register_script(text))

    def pipeline(self, transaction: bool = False) -> _BridgedPipeline:
        """A pipeline of commands sent in one round trip."""
        return _BridgedPipeline(self.client.pipeline(transaction=transaction))

    def hgetall(self, key: str) -> Any:
        """HGETALL."""
        return _awaited(self.client.hgetall(key))

    def hmget(self, key: str, fields: list[str]) -> Any:
        """HMGET (a lease's holder)."""
        return _awaited(self.client.hmget(key, fields))

    def zrange(self, key: str, start: Any, end: Any, **options: Any) -> Any:
        """ZRANGE with redis-py's options."""
        return _awaited(self.client.zrange(key, start, end, **options))

    def info(self, section: str | None = None, *args: Any, **options: Any) -> Any:
        """INFO (the store reads the server's persistence)."""
        return _awaited(self.client.info(section, *args, **options))

    def publish(self, channel: str, message: str) -> Any:
        """PUBLISH."""
        return _awaited(self.client.publish(channel, message))

    def close(self) -> None:
        """Close the async client's connections."""
        _awaited(self.client.aclose())


def publisher_pool(threads: int) -> ThreadPoolExecutor:
    """The threads the Celery publishes of one async client run in.

    Not the loop's default executor: that one has ``min(32, cpus + 4)`` threads (6 on two
    cores), fewer than the app's producer pool (``broker_pool_limit``, 10 by default), and is
    shared with whatever else the application and asyncio (``getaddrinfo``) run there, so 200
    concurrent starts queued their publishes behind each other (docs/async.md, Cost)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="celery-sagas-publish")


class BridgedDispatcher:
    """Sends through the synchronous dispatcher in a thread of ``executor``, awaited by the
    loop: the step is published before the call returns, as with the synchronous client, and a
    failed publish raises in the caller's greenlet exactly as it would there."""

    def __init__(self, inner: Dispatcher, executor: Executor) -> None:
        self._inner = inner
        self._executor = executor

    def send_step(self, saga_id: str, step: StepRecord, version: int, *,
                  trace_parent: str | None = None, time_limit_s: float | None = None) -> None:
        """Send the step's task (a publisher thread sends; the loop goes on meanwhile)."""
        self._in_thread(functools.partial(self._inner.send_step, saga_id, step, version,
                                          trace_parent=trace_parent, time_limit_s=time_limit_s))

    def send_compensation(self, saga_id: str, step: StepRecord, version: int, *,
                          trace_parent: str | None = None) -> None:
        """Send the step's compensator (in a publisher thread, as ``send_step``)."""
        self._in_thread(functools.partial(self._inner.send_compensation, saga_id, step, version,
                                          trace_parent=trace_parent))

    def _in_thread(self, send: Callable[[], None]) -> None:
        # The caller's context goes along (as asyncio.to_thread does): tracing reads it.
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        _awaited(loop.run_in_executor(self._executor, context.run, send))
