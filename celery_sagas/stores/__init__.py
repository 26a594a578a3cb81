"""Stores: the storage port, the shipped backends, and ``open_store`` by URL."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from ..errors import StoreUnavailable
from .base import Envelope, Fence, Lease, Page, Store
from .memory import MemoryStore

__all__ = ["Envelope", "Fence", "Lease", "MemoryStore", "Page", "Store", "open_store"]

ENTRY_POINT_GROUP = "celery_sagas.stores"

# scheme (before any "+driver") -> (module, class, extra that provides its driver)
_BUILTIN: dict[str, tuple[str, str, str | None]] = {
    "redis": ("celery_sagas.stores.redis", "RedisStore", None),
    "rediss": ("celery_sagas.stores.redis", "RedisStore", None),
    "unix": ("celery_sagas.stores.redis", "RedisStore", None),
    "sqlite": ("celery_sagas.stores.sql", "SqlStore", None),
    "postgresql": ("celery_sagas.stores.sql", "SqlStore", "postgres"),
    "postgres": ("celery_sagas.stores.sql", "SqlStore", "postgres"),
    "mysql": ("celery_sagas.stores.sql", "SqlStore", "mysql"),
    "mariadb": ("celery_sagas.stores.sql", "SqlStore", "mysql"),
}


def open_store(url: str, **options: Any) -> Store:
    """Open a store from a URL: memory://, redis://, rediss://, sqlite://, postgresql+psycopg://,
    mysql+pymysql://, or a scheme registered in the ``celery_sagas.stores`` entry-point group."""
    if not isinstance(url, str) or "://" not in url:
        raise StoreUnavailable(f"store URL must look like scheme://..., got {_redacted(url)}")
    scheme = url.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if base == "memory":
        return MemoryStore()
    if base in _BUILTIN:
        module, name, extra = _BUILTIN[base]
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
    raise StoreUnavailable(f"no store for scheme {scheme!r}: {_redacted(url)}")


def _redacted(url: object) -> str:
    """Show a URL without its password."""
    text = str(url)
    if "@" in text and "://" in text:
        scheme, rest = text.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return text[:80]
