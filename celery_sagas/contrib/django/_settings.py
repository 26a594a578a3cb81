"""Saga options from Django settings: ``SAGAS = {...}``, else Celery's ``CELERY_SAGAS_*``.

``SAGAS`` is a dict of ``Sagas`` options (``store``, ``sweep_interval``, ...: the names of
docs/configuration.md without ``sagas_``). Projects that configure Celery from Django settings
with ``namespace="CELERY"`` may instead write ``CELERY_SAGAS_STORE`` and so on: Celery hands
those to ``Sagas`` itself. The store defaults to ``django://default``: the SQL store on the
``default`` database, its tables made by this app's migration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from ...errors import SagaConfigurationError

__all__ = ["DEFAULT_STORE", "SCHEME", "database_alias", "options", "setting", "table_prefix"]

SCHEME = "django"
DEFAULT_STORE = "django://default"
DEFAULT_TABLE_PREFIX = "sagas_"


def options() -> dict[str, Any]:
    """The ``SAGAS`` dict of the Django settings (empty when there is none)."""
    configured = getattr(settings, "SAGAS", None)
    if configured is None:
        return {}
    if not isinstance(configured, Mapping) or not all(isinstance(k, str) for k in configured):
        raise SagaConfigurationError("settings.SAGAS must be a dict of Sagas options")
    return dict(configured)


def setting(name: str, default: Any) -> Any:
    """One option: from ``SAGAS``, else ``CELERY_SAGAS_<NAME>``, else ``default``."""
    configured = options()
    if name in configured:
        return configured[name]
    return getattr(settings, f"CELERY_SAGAS_{name.upper()}", default)


def table_prefix() -> str:
    """The prefix of the saga tables (the migration and the store read the same one)."""
    prefix = setting("table_prefix", DEFAULT_TABLE_PREFIX)
    if not isinstance(prefix, str):
        raise SagaConfigurationError("the sagas table_prefix setting must be a str")
    return prefix


def database_alias(store: object = None) -> str | None:
    """The Django database a ``django://<alias>`` store URL names (the configured store's when
    none is given); None for any other store."""
    url = setting("store", DEFAULT_STORE) if store is None else store
    if not isinstance(url, str) or urlsplit(url).scheme != SCHEME:
        return None
    return urlsplit(url).netloc or "default"
