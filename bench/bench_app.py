"""The Celery app the benchmark workers run (``celery -A bench.bench_app worker``).

One app holds both sides of the comparison, so sagas and chains share the broker, the worker
and its settings (prefork, ``acks_late``, prefetch 1):

- the saga ``bench-N``: N no-op steps (``bench.noop`` named ``s1..sN``, default 3) in order,
  each sleeping ``BENCH_BODY_MS`` (an I/O call), ``inline=True`` with ``BENCH_INLINE=1``;
- the bare chain it is compared with, of plain tasks: ``link | ... | last_link``, as many
  tasks as the saga has steps (each sleeping as long), ``last_link`` recording the chain's
  finish time (ms since the epoch) in the Redis hash its arguments name.
  ``chain_of(..., baseline="old")`` is the chain measured before issue 13: one more task only
  to record the finish.

Configured from the environment by ``bench/throughput.py``:
BENCH_BROKER, BENCH_STORE, BENCH_PREFIX (store key or table prefix), BENCH_QUEUE,
BENCH_MARKS (Redis URL of the chain finish marks), BENCH_READY (a file written when the worker
is ready), BENCH_STEPS, BENCH_BODY_MS, BENCH_INLINE, and BENCH_COUNT_DIR: when set, the store is
wrapped in ``CountingStore`` and every process dumps its counts to ``<dir>/<pid>.json``.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery, chain
from celery.signals import worker_process_shutdown, worker_ready
from redis import Redis

from celery_sagas import Sagas
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Store
from celery_sagas.testing.proxy import StoreProxy

DEFAULT_BROKER = "redis://127.0.0.1:6379/12"


@dataclass(frozen=True)
class BenchConfig:
    """Where one benchmark worker's broker, store, queue and marks live."""

    broker: str
    store: str
    prefix: str
    queue: str
    marks: str
    ready: Path | None = None
    count_dir: Path | None = None
    steps: int = 3
    body_ms: int = 0
    inline: bool = False

    @classmethod
    def from_env(cls) -> BenchConfig:
        """The configuration a worker process was started with."""
        env = os.environ
        return cls(
            broker=env.get("BENCH_BROKER", DEFAULT_BROKER),
            store=env.get("BENCH_STORE", "redis://127.0.0.1:6379/13"),
            prefix=env.get("BENCH_PREFIX", "bench"),
            queue=env.get("BENCH_QUEUE", "bench"),
            marks=env.get("BENCH_MARKS", DEFAULT_BROKER),
            ready=Path(env["BENCH_READY"]) if env.get("BENCH_READY") else None,
            count_dir=Path(env["BENCH_COUNT_DIR"]) if env.get("BENCH_COUNT_DIR") else None,
            steps=int(env.get("BENCH_STEPS", "3")),
            body_ms=int(env.get("BENCH_BODY_MS", "0")),
            inline=env.get("BENCH_INLINE") == "1",
        )

    def environ(self) -> dict[str, str]:
        """The environment that makes a worker process use this configuration."""
        env = {
            "BENCH_BROKER": self.broker,
            "BENCH_STORE": self.store,
            "BENCH_PREFIX": self.prefix,
            "BENCH_QUEUE": self.queue,
            "BENCH_MARKS": self.marks,
            "BENCH_STEPS": str(self.steps),
            "BENCH_BODY_MS": str(self.body_ms),
            "BENCH_INLINE": "1" if self.inline else "0",
        }
        if self.ready is not None:
            env["BENCH_READY"] = str(self.ready)
        if self.count_dir is not None:
            env["BENCH_COUNT_DIR"] = str(self.count_dir)
        return env

    @property
    def is_redis(self) -> bool:
        """True when the saga store is Redis."""
        return self.store.startswith(("redis://", "rediss://", "unix://"))

    def store_options(self) -> dict[str, Any]:
        """The prefix option ``open_store`` takes for this store (and, for Redis, acceptance
        of a server without AOF: the figures are the store's own cost)."""
        if self.is_redis:
            return {"prefix": self.prefix, "require_aof": False}
        return {"table_prefix": self.prefix + "_"}


# ---------------------------------------------------------------------- counting proxy


# Store primitives the proxy counts; a refused compare-and-set or annotate is also counted apart.
COUNTED = ("create", "get", "compare_and_set", "annotate", "delete", "scan", "scan_due", "count",
           "acquire_lease", "renew_lease", "checkpoint_lease", "release_lease")


class CountingStore(StoreProxy):
    """A Store that forwards every primitive and counts calls (and refusals) per process.

    For a SQL store it also counts the SQL statements actually sent; for Redis the wire-level
    count comes from the server's ``INFO commandstats``.
    """

    def __init__(self, inner: Store, sink: Path | None = None) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.sink = sink
        self._last_dump = 0.0
        engine = getattr(inner, "engine", None)
        if engine is not None:
            from sqlalchemy import event

            event.listen(engine, "before_cursor_execute", self._on_statement)

    def _on_statement(self, *_: Any) -> None:
        self.count_one("sql_statements")

    def count_one(self, name: str) -> None:
        """Count one call of ``name`` (and dump now and then)."""
        with self._lock:
            self.counts[name] += 1
        now = time.monotonic()
        if self.sink is not None and now - self._last_dump > 0.5:
            self._last_dump = now
            self.dump()

    def dump(self) -> None:
        """Write this process's counts to ``<sink>/<pid>.json`` (atomically replaced)."""
        if self.sink is None:
            return
        with self._lock:
            data = dict(self.counts)
        target = self.sink / f"{os.getpid()}.json"
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        temporary.replace(target)

    def close(self) -> None:
        """Dump the counts and close the inner store."""
        self.dump()
        self.inner.close()


def _counted(name: str) -> Any:
    forward = getattr(StoreProxy, name)

    def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        self.count_one(name)
        result = forward(self, *args, **kwargs)
        if name in ("compare_and_set", "annotate") and not result:
            self.count_one(f"{name}_refused")
        return result

    call.__doc__ = f"Counted ``{name}``."
    return call


for _name in COUNTED:
    setattr(CountingStore, _name, _counted(_name))


# ---------------------------------------------------------------------- the app


@dataclass
class Bench:
    """One built app: the Celery app, its Sagas, the saga, the chain's tasks."""

    app: Celery
    sagas: Sagas
    saga: Any
    link: Any
    last_link: Any
    counting: CountingStore | None
    steps: int = 3


def build(config: BenchConfig) -> Bench:
    """Build the benchmark app for ``config`` (the client builds its own; workers use the env)."""
    app = Celery("bench", broker=config.broker)
    app.conf.update(
        task_default_queue=config.queue,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600},
        worker_hijack_root_logger=False,
    )
    counting = None
    store: Any = config.store
    if config.count_dir is not None:
        counting = CountingStore(open_store(config.store, **config.store_options()), config.count_dir)
        store = counting
    options: dict[str, Any] = {"require_aof": False}  # the benchmarks' Redis runs without AOF
    if store is config.store:
        options.update({"key_prefix": config.prefix} if config.is_redis
                       else {"table_prefix": config.prefix + "_"})
    sagas = Sagas(app, store=store, queue=config.queue, **options)

    pause = config.body_ms / 1000
    steps = [f"s{k + 1}" for k in range(config.steps)]

    @sagas.step(compensate=None, name="bench.noop")
    def noop(i: int) -> None:
        """A step that does nothing (for ``body_ms``, as an I/O call would)."""
        if pause:
            time.sleep(pause)

    @sagas.saga(f"bench-{config.steps}", inline=config.inline)
    def saga(ctx: Any, data: dict[str, int]) -> None:
        """``steps`` no-op steps in order."""
        for name in steps:
            ctx.step(noop, data["i"], step_name=name)

    # The chain's links: plain Celery tasks (a saga step refuses to run outside a saga).
    marks = _Marks(config.marks)

    @app.task(name="bench.link", ignore_result=True)  # type: ignore[untyped-decorator]
    def link(i: int) -> None:
        """A chain link that does nothing (for ``body_ms``)."""
        if pause:
            time.sleep(pause)

    @app.task(name="bench.last_link", ignore_result=True)  # type: ignore[untyped-decorator]
    def last_link(i: int, key: str) -> None:
        """The chain's last link: record when chain ``i`` finished, in ms since the epoch."""
        if pause:
            time.sleep(pause)
        marks.client().hset(key, str(i), repr(time.time() * 1000))

    return Bench(app, sagas, saga, link, last_link, counting, config.steps)


class _Marks:
    """A Redis client opened lazily in each process (never shared across a fork)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Redis | None = None
        self._pid = 0

    def client(self) -> Redis:
        """This process's client."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = Redis.from_url(self.url), os.getpid()
        return self._client


# Chain baselines: "new" has as many tasks as the saga has steps, its last one recording the
# finish (like for like); "old" (before issue 13) added one more task only to record the finish.
BASELINES = {"new": 0, "old": 1}


def chain_of(bench: Bench, key: str, i: int, baseline: str = "new") -> Any:
    """The bare Celery chain that mirrors saga ``i`` (as many tasks as the saga has steps,
    ``BASELINES`` more)."""
    links = [bench.link.si(i) for _ in range(bench.steps + BASELINES[baseline] - 1)]
    return chain(*links, bench.last_link.si(i, key))


def _announce_ready(config: BenchConfig) -> None:
    if config.ready is not None:
        config.ready.write_text("ready.\n")


if os.environ.get("BENCH_BROKER"):
    _config = BenchConfig.from_env()
    _bench = build(_config)
    app = _bench.app

    @worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        _announce_ready(_config)

    if _bench.counting is not None:
        _counting = _bench.counting
        worker_process_shutdown.connect(lambda **_: _counting.dump(), weak=False)
        atexit.register(_counting.dump)
