"""What one process needs to run sagas, built in one place from the settings (docs/design.md §1).

``Runtime`` hands every collaborator to what needs it at construction: the middleware chain
(docs/design.md §1.1); store, codec and repository; the approval gate and the gates the
engine consults; the engine; the scans, the sweeper and the findings over the same store.
``PerProcess`` builds a runtime lazily and again after a fork (a pool child must not share
its parent's sockets).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from .._approvals.gate import ApprovalGate
from .._approvals.saga_gates import SagaApprovals, SagaGates, expiry_pass
from .._clock import Clock, SystemClock
from .._codec import Codec
from .._definitions import Registry
from .._delivery import DeliveryParts
from .._dispatch import Dispatcher
from .._engine import Engine, EngineSettings
from .._findings import Findings
from .._liveness import claimer_id
from .._middleware import Middlewares
from .._repository import SagaRepository
from .._retention import Archive, approval_retention_pass, retention_pass
from .._scans import Scans
from .._sweep import PassFactory, Sweeper
from ..errors import SagaConfigurationError
from ..stores import open_store, plugin_schemes
from ..stores._urls import HiddenUrl, redact, url_problem
from ..stores.base import Notifying, Store
from .settings import SagaSettings

__all__ = ["PerProcess", "Runtime", "hide_store_url", "open_configured_store", "resolve_archive"]

logger = logging.getLogger("celery_sagas")

def open_configured_store(target: str | Store, settings: SagaSettings) -> Store:
    """The store a URL names, with the key or table prefix and the AOF requirement of the
    settings (or the store given)."""
    if not isinstance(target, str):
        return target
    store = open_store(target, key_prefix=settings.key_prefix, table_prefix=settings.table_prefix,
                       require_aof=settings.require_aof)
    if not store.durable and not settings.allow_non_durable:
        logger.warning("saga store %s keeps nothing across restarts", target.split("://", 1)[0])
    return store


class Runtime:
    """The engine of this process and everything built around it."""

    def __init__(self, store: Store, settings: SagaSettings, registry: Registry,
                 middlewares: Middlewares, dispatcher: Dispatcher, clock: Clock) -> None:
        codec = Codec(settings.payload_limit, encryption_keys=settings.encryption_keys)
        self.codec = codec
        self.store = store
        self.middlewares = middlewares  # the one seam of cross-cutting concerns (§1.1)
        notifier = store.notify_settled if isinstance(store, Notifying) and settings.notify else None
        self.repository = SagaRepository(store, codec, on_settled=notifier,
                                          history_limit=settings.history_limit)
        self.gate = _gate(store, clock, settings, codec)
        self.engine = Engine(
            self.repository, registry, dispatcher, gates=SagaGates(self.gate) if self.gate else None,
            middlewares=middlewares, clock=clock,
            settings=EngineSettings(settings.payload_limit, settings.timing, settings.limits,
                                    inline=settings.inline_steps,
                                    inline_max_steps=settings.inline_max_steps,
                                    inline_max_seconds=settings.inline_max_seconds),
        )
        self.deliveries = DeliveryParts.of(self.engine)
        self.approvals = SagaApprovals(self.engine, self.gate) if self.gate else None
        self.scans = Scans(store, codec)
        self.views = Scans(store, codec, display=True)
        self.findings = Findings(self.scans)
        self.sweeper = Sweeper(
            self.engine, self.scans, owner=claimer_id(), lease_ms=settings.sweep_lease_ms,
            page_size=settings.sweep_page_size, interval_ms=int(settings.sweep_interval_s * 1000),
            extra_passes=_extra_passes(self.approvals, settings),
            count_states=settings.metrics,
        )


def _extra_passes(approvals: SagaApprovals | None, settings: SagaSettings) -> list[PassFactory]:
    """Approval expiry (with approvals), then retention of sagas and of the approvals no saga
    owns (unless sagas are kept forever)."""
    passes = [expiry_pass(approvals)] if approvals else []
    if settings.retention_ms is not None:
        passes.append(retention_pass(settings.retention_ms, resolve_archive(settings.archive)))
        passes.append(approval_retention_pass(settings.retention_ms))
    return passes


def resolve_archive(archive: object) -> Archive | None:
    """The archive callable, importing a dotted path. One that cannot be imported becomes an
    archive that raises: every saga past retention is then kept and reported
    (``archive_failed``), never deleted unarchived."""
    if archive is None or callable(archive):
        return archive
    path = str(archive)
    try:
        found = _imported(path)
    except Exception as exc:
        problem = f"sagas_archive {path!r} cannot be imported: {type(exc).__name__}"
    else:
        if callable(found):
            return found
        problem = f"sagas_archive {path!r} is not callable"
    logger.error("%s: sagas past retention are kept until it is fixed", problem)

    def unavailable(record: object) -> None:
        raise SagaConfigurationError(problem)

    return unavailable


def _gate(store: Store, clock: Clock, settings: SagaSettings, codec: Codec) -> ApprovalGate | None:
    if not settings.approval_secrets:
        return None
    return ApprovalGate(store, clock, settings.approval_secrets, ttl_ms=settings.approval_ttl_ms,
                        codec=codec)


class PerProcess:
    """Builds a ``Runtime`` on first use in each process (again after a fork)."""

    def __init__(self, build: Callable[[], Runtime]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._runtime: Runtime | None = None
        self._pid = 0

    @property
    def current(self) -> Runtime:
        """This process's runtime."""
        pid = os.getpid()
        with self._lock:
            if self._runtime is None or self._pid != pid:
                self._runtime, self._pid = self._build(), pid
            return self._runtime

    def install(self, runtime: Runtime) -> None:
        """Use ``runtime`` in this process from now on (built by the caller)."""
        with self._lock:
            self._runtime, self._pid = runtime, os.getpid()

    def forget(self) -> None:
        """Build afresh on next use (a forked pool child)."""
        with self._lock:
            self._runtime = None


def _imported(path: str) -> object:
    """``package.module:name`` or ``package.module.name``, imported."""
    module, colon, name = path.partition(":")
    if not colon:
        module, _, name = path.rpartition(".")
    found: object = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def default_clock(clock: Clock | None) -> Clock:
    """The clock given, or the system's."""
    return clock or SystemClock()


def hide_store_url(conf: Any) -> None:
    """Put a ``HiddenUrl`` in place of a ``sagas_store`` URL that holds a password, so that
    ``celery report`` and ``celery inspect conf`` never show it (settings read it through)."""
    url = conf.get("sagas_store")
    if isinstance(url, str) and not isinstance(url, HiddenUrl) and redact(url, limit=None) != url:
        conf["sagas_store"] = HiddenUrl(url)


def require_store(chosen: object) -> str | Store:
    """A well-formed store URL or a Store object; SagaConfigurationError otherwise (saying
    what is wrong with a URL, with a hint for the usual near-misses)."""
    if chosen is None:
        raise SagaConfigurationError("Sagas needs store= (a URL or a Store) or sagas_store")
    if isinstance(chosen, str):
        problem = url_problem(chosen, plugin_schemes())
        if problem is not None:
            raise SagaConfigurationError(problem)
        return chosen
    if not isinstance(chosen, str) and not callable(getattr(chosen, "compare_and_set", None)):
        raise SagaConfigurationError(
            f"the saga store must be a URL or a Store object, got {type(chosen).__name__}"
        )
    return chosen  # type: ignore[return-value]
