"""``sagas_*`` settings, read once from ``app.conf`` (keyword arguments win) into a frozen value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .. import _values as values
from .._crypto import sealer_of
from .._definitions import Timing
from .._protocol.history import DEFAULT_HISTORY_LIMIT
from .._protocol.limits import Limits
from ..errors import SagaConfigurationError
from ..stores._urls import redact, reveal

__all__ = ["SETTING_DOCS", "SagaSettings"]

_DEFAULT_TIMING = Timing()
_LIMITS = Limits()
_HIDDEN = frozenset({"approval_secrets", "encryption_keys"})  # never shown by repr

# name: (default, one-line description); the docs' configuration reference is built from this.
SETTING_DOCS: dict[str, tuple[Any, str]] = {
    "store": (None, "store URL (redis://, postgresql+psycopg://, sqlite:///, memory://)"),
    "sweep_interval": (5.0, "seconds between beat-driven sweeps"),
    "stale_after": (_DEFAULT_TIMING.stale_ms / 1000,
                    "seconds before an unclaimed dispatched step is sent again"),
    "ambiguity_grace": (_DEFAULT_TIMING.grace_ms / 1000,
                        "seconds past a step's time limit before a silent attempt is ambiguous"),
    "default_time_limit": (_DEFAULT_TIMING.default_time_limit_ms / 1000,
                           "hard time limit (s) given to steps and compensators that set none"),
    "payload_limit": (values.DEFAULT_PAYLOAD_LIMIT, "maximum bytes of one saga record"),
    "child_depth_limit": (_LIMITS.child_depth, "how deep child sagas nest below a saga started "
                          "by start(); a deeper ctx.child step fails (child_depth_exceeded)"),
    "children_limit": (_LIMITS.children, "child sagas one saga may start; one more ctx.child "
                       "step fails (too_many_children)"),
    "signal_limit": (_LIMITS.signals, "signals a saga holds unconsumed; one more is refused "
                     "(SignalLimitExceeded)"),
    "signal_bytes_limit": (_LIMITS.signal_bytes, "bytes of JSON payload of the signals a saga "
                           "holds unconsumed; one more is refused (SignalLimitExceeded)"),
    "key_prefix": ("sagas", "Redis key prefix of the store"),
    "table_prefix": ("sagas_", "SQL table prefix of the store"),
    "queue": (None, "queue of the sweep task (None: the default queue)"),
    "sweep_lease": (30.0, "seconds a sweeper's lease lasts before another may take over"),
    "sweep_page_size": (100, "records read per sweep page (1..1000)"),
    "sweep_shards": (1, "sweep tasks beat sends per interval; each takes the buckets it can lease"),
    "approval_secrets": ((), "HMAC secrets for approval tokens, newest first (32+ bytes each)"),
    "approval_ttl": (900.0, "seconds an approval stays decidable"),
    "encryption_keys": ((), "Fernet keys that encrypt payloads at rest, newest first (extra 'crypto')"),
    "allow_non_durable": (False, "allow the memory store outside tests (loses everything on exit)"),
    "require_aof": (True, "refuse a Redis store server without an append-only file (False: "
                          "accept it, warning once per process; a development box)"),
    "retention": (604800.0, "seconds a completed or compensated saga is kept before the sweep "
                            "deletes it (None: forever)"),
    "archive": (None, "callable (or dotted path) receiving each saga record before retention "
                      "deletes it"),
    "inline_steps": (False, "run each next step of a saga in the worker process that settled the "
                            "step before it (the default of @sagas.saga(inline=...))"),
    "inline_max_steps": (16, "consecutive steps one task may run inline before sending the next"),
    "inline_max_seconds": (60.0, "seconds one task may go on running inline steps (also widens the "
                                 "hard limit an inline saga's steps are sent with)"),
    "notify": (True, "publish each settled saga's id (Redis PUBLISH, PostgreSQL NOTIFY) so "
                     "async waits wake at once: one round trip per saga, not per step"),
    "history_limit": (DEFAULT_HISTORY_LIMIT, "history entries kept per saga; older ones are folded "
                                             "into a count (docs/design.md §2.6)"),
    "metrics": (False, "Prometheus metrics (extra 'metrics'): True for the default registry, or a "
                       "CollectorRegistry"),
}


# Settings of earlier releases that no longer mean anything: naming them is a mistake to report,
# not to ignore silently.
_REMOVED = {
    "journal": "effects are derived from the saga records, in the same write, and cost nothing "
    "(docs/design.md §2.3)",
    "metrics_count_cap": "the sagas gauge reads exact counts from the store's state index",
}


# Durations are added to and subtracted from "now" (lease expiry, staleness cut-offs): past a
# year they stop meaning anything and, near the float/2**53 limits, overflow.
_MAX_SECONDS = 366 * 24 * 3600


def _seconds_ms(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_SECONDS:
        raise SagaConfigurationError(
            f"sagas_{name} must be a positive number of seconds or a timedelta, at most {_MAX_SECONDS}"
        )
    return max(1, int(value * 1000))


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SagaConfigurationError(f"sagas_{name} must be True or False")
    return value


def _queue(value: Any) -> str | None:
    """``sagas_queue``: a queue name, or None (or "") for Celery's default queue."""
    if value is not None and not isinstance(value, str):
        raise SagaConfigurationError("sagas_queue must be a queue name (a str) or None")
    return value or None


def _registry(value: Any) -> Any:
    """``sagas_metrics``: a bool, or a prometheus_client registry (anything with ``register``)."""
    if value is None or isinstance(value, bool):
        return None
    if not callable(getattr(value, "register", None)):
        raise SagaConfigurationError("sagas_metrics must be True, False or a CollectorRegistry")
    return value


def _encryption_keys(value: Any) -> tuple[bytes | str, ...]:
    """``sagas_encryption_keys``: a list of Fernet keys (None or empty: encryption off), each
    checked now so a bad key fails ``Sagas(...)``, never a worker mid-saga."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SagaConfigurationError("sagas_encryption_keys must be a list of Fernet keys, newest first")
    keys = tuple(value)
    sealer_of(keys)
    return keys
# Retention may be years (audit rules); past a century "now - retention" is before the epoch.
_MAX_RETENTION_SECONDS = 100 * 366 * 24 * 3600


def _retention(value: Any) -> int | None:
    """``sagas_retention``: None (keep forever) or a positive number of seconds, in ms."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= _MAX_RETENTION_SECONDS:
        raise SagaConfigurationError(
            "sagas_retention must be None (keep forever) or a positive number of seconds or a timedelta, "
            f"at most {_MAX_RETENTION_SECONDS}"
        )
    return max(1, int(value * 1000))


def _archive(value: Any) -> Any:
    """``sagas_archive``: None, a callable, or the dotted path of one (imported when used)."""
    if value is None or callable(value):
        return value
    if not isinstance(value, str) or not value.strip():
        raise SagaConfigurationError(
            "sagas_archive must be a callable taking a SagaRecord, or its dotted path "
            "('package.module:function')"
        )
    return value


def _count(name: str, value: Any, top: int) -> int:
    """A ``sagas_*`` limit: an int in 1..``top``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise SagaConfigurationError(f"sagas_{name} must be an int in 1..{top}")
    return value


def _inline_steps(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise SagaConfigurationError("sagas_inline_max_steps must be an int in 1..1000")
    return value


def _limits(raw: Mapping[str, Any]) -> Limits:
    """The limits of saga trees and signals (docs/concepts.md "Limits")."""
    return Limits(
        child_depth=_count("child_depth_limit", raw["child_depth_limit"], 100),
        children=_count("children_limit", raw["children_limit"], 100_000),
        signals=_count("signal_limit", raw["signal_limit"], 100_000),
        signal_bytes=_count("signal_bytes_limit", raw["signal_bytes_limit"], 2**31),
    )


def _history_limit(value: Any) -> int:
    """``sagas_history_limit``: how many history entries a saga keeps (10..10000)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 10 <= value <= 10_000:
        raise SagaConfigurationError("sagas_history_limit must be an int in 10..10000")
    return value


def _shards(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise SagaConfigurationError("sagas_sweep_shards must be an int in 1..64")
    return value


@dataclass(frozen=True, slots=True)
class SagaSettings:
    """Every ``sagas_*`` setting, validated."""

    store: str | None
    sweep_interval_s: float
    timing: Timing
    payload_limit: int
    key_prefix: str
    table_prefix: str
    queue: str | None
    sweep_lease_ms: int
    sweep_page_size: int
    approval_secrets: tuple[bytes | str, ...]
    approval_ttl_ms: int
    allow_non_durable: bool
    require_aof: bool = True
    sweep_shards: int = 1
    metrics: bool = False
    metrics_registry: Any = None
    encryption_keys: tuple[bytes | str, ...] = ()
    retention_ms: int | None = 604_800_000
    archive: Any = None  # a callable, or its dotted path (resolved by the runtime)
    notify: bool = True
    limits: Limits = _LIMITS
    inline_steps: bool = False
    inline_max_steps: int = 16
    inline_max_seconds: float = 60.0
    history_limit: int = DEFAULT_HISTORY_LIMIT

    @classmethod
    def load(cls, conf: Mapping[str, Any], overrides: Mapping[str, Any]) -> SagaSettings:
        """Read ``sagas_<name>`` from ``conf``; keyword ``<name>`` in ``overrides`` wins."""
        for name, why in _REMOVED.items():
            if name in overrides or f"sagas_{name}" in conf:
                raise SagaConfigurationError(f"sagas_{name} was removed: {why}")
        unknown = set(overrides) - set(SETTING_DOCS)
        if unknown:
            raise SagaConfigurationError(f"unknown saga options: {', '.join(sorted(unknown))}")
        raw = {
            name: overrides.get(name, conf.get(f"sagas_{name}", default))
            for name, (default, _) in SETTING_DOCS.items()
        }
        return cls._build(raw)

    @classmethod
    def _build(cls, given: Mapping[str, Any]) -> SagaSettings:
        # Every duration setting takes seconds or a timedelta.
        raw: dict[str, Any] = {name: values.plain_seconds(value) for name, value in given.items()}
        page = raw["sweep_page_size"]
        if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= 1000:
            raise SagaConfigurationError("sagas_sweep_page_size must be an int in 1..1000")
        limit = raw["payload_limit"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1024:
            raise SagaConfigurationError("sagas_payload_limit must be an int of at least 1024 bytes")
        secrets = raw["approval_secrets"]
        if isinstance(secrets, (str, bytes)) or not isinstance(secrets, Sequence):
            raise SagaConfigurationError("sagas_approval_secrets must be a list of secrets")
        _seconds_ms("sweep_interval", raw["sweep_interval"])
        return cls(
            store=reveal(raw["store"]),
            sweep_interval_s=float(raw["sweep_interval"]),
            timing=Timing(
                stale_ms=_seconds_ms("stale_after", raw["stale_after"]),
                grace_ms=_seconds_ms("ambiguity_grace", raw["ambiguity_grace"]),
                default_time_limit_ms=_seconds_ms("default_time_limit", raw["default_time_limit"]),
            ),
            payload_limit=limit,
            key_prefix=values.identifier(raw["key_prefix"], field="sagas_key_prefix"),
            table_prefix=values.identifier(raw["table_prefix"], field="sagas_table_prefix"),
            queue=_queue(raw["queue"]),
            sweep_lease_ms=_seconds_ms("sweep_lease", raw["sweep_lease"]),
            sweep_page_size=page,
            approval_secrets=tuple(secrets),
            approval_ttl_ms=_seconds_ms("approval_ttl", raw["approval_ttl"]),
            allow_non_durable=_flag("allow_non_durable", raw["allow_non_durable"]),
            require_aof=_flag("require_aof", raw["require_aof"]),
            sweep_shards=_shards(raw["sweep_shards"]),
            metrics=raw["metrics"] is not False and raw["metrics"] is not None,
            metrics_registry=_registry(raw["metrics"]),
            encryption_keys=_encryption_keys(raw["encryption_keys"]),
            retention_ms=_retention(raw["retention"]),
            archive=_archive(raw["archive"]),
            notify=_flag("notify", raw["notify"]),
            limits=_limits(raw),
            inline_steps=_flag("inline_steps", raw["inline_steps"]),
            inline_max_steps=_inline_steps(raw["inline_max_steps"]),
            inline_max_seconds=_seconds_ms("inline_max_seconds", raw["inline_max_seconds"]) / 1000,
            history_limit=_history_limit(raw["history_limit"]),
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={self._shown(f.name)}" for f in fields(self))
        return f"SagaSettings({shown})"

    def _shown(self, name: str) -> str:
        value = getattr(self, name)
        if name in _HIDDEN:
            return "<hidden>"
        if name == "store" and isinstance(value, str):
            return repr(redact(value, limit=None))
        return repr(value)
