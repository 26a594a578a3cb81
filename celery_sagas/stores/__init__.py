"""Stores: the storage port, the shipped backends, and ``open_store`` by URL."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from ..errors import StoreUnavailable
from ._urls import redact, url_problem
from .base import (
    CountSnapshot,
    Envelope,
    Fence,
    IdIndexing,
    Lease,
    LeaseHolder,
    LeaseTakeover,
    OrderedScan,
    Page,
    PrefixScan,
    StateListing,
    Store,
)
from .memory import MemoryStore

__all__ = ["CountSnapshot", "Envelope", "Fence", "IdIndexing", "Lease", "LeaseHolder",
           "LeaseTakeover", "MemoryStore", "OrderedScan", "Page", "PrefixScan", "StateListing",
           "Store", "open_store"]

ENTRY_POINT_GROUP = "celery_sagas.stores"

_REDIS = ("celery_sagas.stores.redis", "RedisStore")
_SQL = ("celery_sagas.stores.sql", "SqlStore")

# scheme (before any "+driver") -> (module, class, extra that provides its driver)
_BUILTIN: dict[str, tuple[tuple[str, str], str | None]] = {
    "redis": (_REDIS, None),
    "rediss": (_REDIS, None),
    "unix": (_REDIS, None),
    "sqlite": (_SQL, None),
    "postgresql": (_SQL, "postgres"),
    "postgres": (_SQL, "postgres"),
    "mysql": (_SQL, "mysql"),
    "mariadb": (_SQL, "mysql"),
}


def open_store(url: str, *, key_prefix: str | None = None, table_prefix: str | None = None,
               require_aof: bool = True, **options: Any) -> Store:
    """Open a store from a URL: memory://, redis://, rediss://, redis+cluster://,
    rediss+cluster://, sqlite://, postgresql+psycopg://, mysql+pymysql://, or a scheme
    registered in the ``celery_sagas.stores`` entry-point group. A malformed URL raises
    ``StoreUnavailable`` saying what is wrong (with a hint for the usual near-misses).

    ``key_prefix`` reaches a Redis store (as its ``prefix``), ``table_prefix`` a SQL store;
    each is ignored by the other kinds; so is ``require_aof=False``, which lets a Redis store
    accept a server without AOF (docs/guarantees.md#durability). Other ``options`` go to the
    store as they are.
    """
    problem = url_problem(url, plugin_schemes())
    if problem is not None:
        raise StoreUnavailable(problem)
    scheme = url.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if base == "memory":
        return MemoryStore()
    if base in _BUILTIN:
        (module, name), extra = _BUILTIN[base]
        if (module, name) == _REDIS and key_prefix is not None:
            options.setdefault("prefix", key_prefix)
        if (module, name) == _REDIS and not require_aof:
            options["require_aof"] = False
        if (module, name) == _SQL and table_prefix is not None:
            options["table_prefix"] = table_prefix
        try:
            factory = getattr(import_module(module), name)
            store: Store = factory.from_url(url, **options)
        except ImportError as exc:
            hint = f"pip install 'celery-sagas[{extra}]'" if extra else "reinstall celery-sagas"
            raise StoreUnavailable(
                f"the {scheme!r} store needs a missing package ({exc.name}): {hint}"
            ) from exc
        return store
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == scheme or entry.name == base:
            plugin: Store = entry.load()(url, **options)
            return plugin
    raise StoreUnavailable(f"no store for scheme {scheme!r}: {redact(url)}")


def plugin_schemes() -> frozenset[str]:
    """The schemes of the stores installed through the ``celery_sagas.stores`` entry points."""
    return frozenset(entry.name for entry in entry_points(group=ENTRY_POINT_GROUP))
