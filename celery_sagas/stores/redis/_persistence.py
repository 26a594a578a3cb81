"""Does the Redis server keep what it acknowledges? Read on a store's first use
(docs/guarantees.md#durability).

Redis ships with ``appendonly no``: a crash or restart then loses every write since the last
snapshot, fencing counters included, so old fence numbers are granted again and steps run
twice. The store reads ``INFO persistence`` (``CONFIG GET`` is often disabled on managed
services) from the server, or from every master of a cluster it reaches, and:

- AOF on everywhere: goes on, silently;
- AOF off somewhere: refuses (``NonDurableStoreError``, naming the fix), unless opened with
  ``require_aof=False``, which logs one WARNING per process and server;
- persistence unreadable (INFO refused, or no ``aof_enabled`` field): warns once and goes on.

A refusal is not remembered: the next use reads again, so turning AOF on needs no restart.
Connection errors propagate as driver errors (the store translates them): nothing was decided.
"""

from __future__ import annotations

from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from ...errors import NonDurableStoreError
from .._durability import warn_once

__all__ = ["Persistence"]

_FIX = ("turn it on (redis.conf, or CONFIG SET appendonly yes then CONFIG REWRITE): "
        "appendonly yes with appendfsync everysec (a killed server loses nothing, a power loss "
        "up to about one second of writes) or appendfsync always (nothing lost, every write "
        "waits for the disk)")
_LOSS = ("a crash or restart loses every write since its last snapshot (completed sagas and "
         "fencing numbers included), so steps may run twice")
_OPT_OUT = ("to accept it anyway (a development box), add ?require_aof=false to the store URL or "
            "set sagas_require_aof = False")


class Persistence:
    """The durability check of one store: made on first use, made again while it refuses."""

    def __init__(self, client: Any, *, require_aof: bool) -> None:
        self._client = client
        self._require = require_aof
        self._done = False
        self._durable = True

    @property
    def durable(self) -> bool:
        """False once a server was found without AOF (and accepted: ``require_aof=False``)."""
        return self._durable

    def check(self) -> None:
        """Read the server's persistence unless done; raise ``NonDurableStoreError`` on a
        server without AOF unless ``require_aof`` is off. Driver errors propagate."""
        # No lock: concurrent first uses may each read INFO (harmless, and warnings are once
        # per process anyway), whereas a lock held across the read would deadlock greenlets
        # sharing a thread (sagas.aio bridges the store over one event loop).
        if not self._done:
            self._decide(aof_by_server(self._client))
            self._done = True

    def _decide(self, found: dict[str, bool | None]) -> None:
        off = ", ".join(server for server, aof in found.items() if aof is False)
        unknown = ", ".join(server for server, aof in found.items() if aof is None)
        if off and self._require:
            raise NonDurableStoreError(
                f"the Redis server at {off} runs without an append-only file (INFO "
                f"persistence: aof_enabled:0): {_LOSS}; {_FIX}; {_OPT_OUT}"
            )
        if off:
            self._durable = False
            warn_once("redis-aof-off", off,
                      f"the Redis server at {off} runs without an append-only file, accepted "
                      f"because the store has require_aof=false: {_LOSS}; for anything but "
                      f"development, {_FIX}")
        if unknown:
            warn_once("redis-aof-unknown", unknown,
                      f"cannot read the persistence of the Redis server at {unknown} (INFO "
                      f"persistence refused or without aof_enabled): unless it runs with an "
                      f"append-only file, {_LOSS}; make sure it does: {_FIX}")


def aof_by_server(client: Any) -> dict[str, bool | None]:
    """``aof_enabled`` of the server (or of each cluster master reached), by ``host:port``;
    None where it cannot be read."""
    if not isinstance(client, RedisCluster):
        return _aof_of(_server(client), lambda: client.info("persistence"))
    found: dict[str, bool | None] = {}
    failure: Exception | None = None
    for node in client.get_primaries():  # type: ignore[no-untyped-call]
        try:
            found.update(_aof_of(node.name, lambda node=node: client.info(
                "persistence", target_nodes=node)))
        except (RedisError, RedisClusterException) as exc:
            failure = exc  # a master out of reach: judged by the ones reached
    if not found and failure is not None:
        raise failure
    return found


def _aof_of(server: str, read: Any) -> dict[str, bool | None]:
    """The AOF flag of one reply: a server's INFO, or one INFO per node (a cluster client
    that asked every node)."""
    try:
        info = read()
    except ResponseError:  # INFO renamed, disabled or not permitted (NOPERM)
        return {server: None}
    if isinstance(info, dict) and info and "aof_enabled" not in info \
            and all(isinstance(reply, dict) for reply in info.values()):
        return {str(node): _flag(reply) for node, reply in info.items()}
    return {server: _flag(info)}


def _flag(info: object) -> bool | None:
    value = info.get("aof_enabled") if isinstance(info, dict) else None
    if value in (1, "1"):
        return True
    if value in (0, "0"):
        return False
    return None


def _server(client: Any) -> str:
    """``host:port`` (or the socket path) of a client's connections, never its password; a
    bridged asyncio client is looked through."""
    pool = getattr(client, "connection_pool", None) \
        or getattr(getattr(client, "client", None), "connection_pool", None)
    options = getattr(pool, "connection_kwargs", {}) or {}
    if options.get("path"):
        return str(options["path"])
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
