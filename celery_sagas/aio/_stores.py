"""The stores of the async client: the same store classes, opened on asyncio drivers.

A Redis URL opens ``redis.asyncio`` (``RedisCluster`` for ``redis+cluster://``) behind
``BridgedRedis``; a SQL URL opens SQLAlchemy's async engine (psycopg's async mode for
PostgreSQL, aiomysql for MySQL/MariaDB, aiosqlite for SQLite) and the store runs on its
``sync_engine``. The memory store does no I/O and is shared with the synchronous client.
Call these inside ``in_greenlet``: opening a SQL store creates its schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._celery.settings import SagaSettings
from ..errors import SagaConfigurationError, StoreUnavailable
from ..stores._urls import CLUSTER_SCHEMES, redact, split_cluster, url_problem
from ..stores.base import Store
from ..stores.memory import MemoryStore
from ._bridge import BridgedRedis
from ._notify import Listen, postgres_listen, redis_listen

__all__ = ["ASYNC_SQL_DRIVERS", "AsyncStore", "open_async_store"]

# The async driver of each SQLAlchemy backend (the extra ``aio`` installs them).
ASYNC_SQL_DRIVERS = {"postgresql": "psycopg", "mysql": "aiomysql", "mariadb": "aiomysql",
                     "sqlite": "aiosqlite"}
_POOL_SIZE = 100  # connections per event loop (a max_connections= in the URL wins)
_POOL_WAIT_S = 30.0
_SQL = {"postgresql", "postgres", "mysql", "mariadb", "sqlite"}
_REDIS = {"redis", "rediss", "unix", *CLUSTER_SCHEMES}


@dataclass(frozen=True)
class AsyncStore:
    """A store on asyncio drivers, how to listen for settled sagas on it (None: poll), and
    how many calls it serves at once (its connections; None: no bound)."""

    store: Store
    listen: Listen | None
    connections: int | None = None


def open_async_store(target: str | Store, settings: SagaSettings) -> AsyncStore:
    """The store ``target`` names, on asyncio drivers; a Store object only if it does no I/O."""
    if not isinstance(target, str):
        if isinstance(target, MemoryStore):
            return AsyncStore(target, None)
        raise SagaConfigurationError(
            "sagas.aio needs the store as a URL (redis://, redis+cluster://, postgresql+psycopg://, "
            f"mysql+pymysql://, sqlite://), not a {type(target).__name__} object"
        )
    problem = url_problem(target)
    if problem is not None:
        raise StoreUnavailable(problem)
    scheme = target.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if scheme == "memory":
        raise SagaConfigurationError("sagas.aio cannot share a memory:// store between clients; "
                                     "pass the MemoryStore object to Sagas(store=...)")
    if scheme in _REDIS:
        return _redis_store(target, settings)
    if base in _SQL:
        return _sql_store(target, settings)
    raise SagaConfigurationError(f"sagas.aio has no async driver for {redact(target)}")


def _redis_store(url: str, settings: SagaSettings) -> AsyncStore:
    import redis.asyncio as aredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from ..stores.redis._keys import DEFAULT_BUCKETS
    from ..stores.redis.store import RedisStore, _split_store_options

    url, buckets, aof_in_url = _split_store_options(url)
    scheme = url.split("://", 1)[0].lower()
    client: Any
    if scheme in CLUSTER_SCHEMES:
        parsed = split_cluster(url)
        nodes = [ClusterNode(host, port) for host, port in parsed.nodes[1:]]
        client = RedisCluster.from_url(parsed.node_url, startup_nodes=nodes, **parsed.options)
    else:
        # A request that finds every connection busy waits for one (up to _POOL_WAIT_S) instead
        # of failing: an async web tier runs far more concurrent calls than it has connections.
        pool = aredis.BlockingConnectionPool.from_url(url, max_connections=_POOL_SIZE,
                                                      timeout=_POOL_WAIT_S)
        client = aredis.Redis(connection_pool=pool)
    store: Any = RedisStore(BridgedRedis(client), prefix=settings.key_prefix,
                            buckets=buckets if buckets is not None else DEFAULT_BUCKETS,
                            require_aof=settings.require_aof and aof_in_url is not False)
    store._owns_client = True  # closed with the async client
    # Cluster pub/sub of redis.asyncio varies by version: cluster waiters poll.
    listen = None if scheme in CLUSTER_SCHEMES else redis_listen(client, store.settle_channel)
    connections = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    return AsyncStore(store, listen, connections if isinstance(connections, int) else _POOL_SIZE)


def _sql_store(url: str, settings: SagaSettings) -> AsyncStore:
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from ..stores.sql._dialects import engine_settings, prepare_engine
    from ..stores.sql.store import SqlStore

    parsed, options = engine_settings(make_url(url), {})
    driver = ASYNC_SQL_DRIVERS.get(parsed.get_backend_name())
    if driver is None:
        raise SagaConfigurationError(f"sagas.aio has no async driver for {redact(url)}")
    parsed = parsed.set(drivername=f"{parsed.get_backend_name()}+{driver}")
    options.pop("poolclass", None)  # the async engine brings its own queue pool
    options.pop("connect_args", None)
    engine = create_async_engine(parsed, **_kept_pool(options))
    prepare_engine(engine.sync_engine)
    store = SqlStore(engine.sync_engine, table_prefix=settings.table_prefix)
    store._owns_engine = True  # disposed of with the async client
    channel = store.settle_channel
    connections = _sql_connections(options)
    if channel is None:
        return AsyncStore(store, None, connections)
    dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    return AsyncStore(store, postgres_listen(dsn, channel), connections)


def _kept_pool(options: dict[str, Any]) -> dict[str, Any]:
    """The options with the pool's overflow kept open: ``pool_size`` grows by ``max_overflow``.

    A loop's admission gate runs ``pool_size + max_overflow`` calls at once all the time, so
    an overflow connection closed on its return was opened again at once: 76 connects per 400
    starts, a fifth of the async client's CPU on PostgreSQL (docs/async.md, Cost). An
    unbounded overflow (-1) is left as given."""
    overflow = int(options.get("max_overflow", 10))
    if "pool_size" not in options or overflow < 0:
        return options
    return {**options, "pool_size": int(options["pool_size"]) + overflow, "max_overflow": 0}


def _sql_connections(options: dict[str, Any]) -> int | None:
    """The pool's pool_size + max_overflow; None when the store sets no bound (SQLite files)
    or the overflow is unbounded (-1)."""
    if "pool_size" not in options or int(options.get("max_overflow", 10)) < 0:
        return None
    return int(options["pool_size"]) + int(options.get("max_overflow", 10))
