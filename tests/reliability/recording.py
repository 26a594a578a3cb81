"""A store wrapper that traces lease grants and fenced writes, and a skewed clock.

``TracingStore`` passes every primitive through to a real store (opened lazily, once per
process, so a prefork child never shares its parent's sockets) and appends one JSON line per
lease grant, lease release, fenced compare-and-set, and unfenced compare-and-set made while
the thread runs a sweep, to a trace file shared by every process of a run. Times are
``time.monotonic_ns()``, which on Linux is one clock for every process of
the host, so the invariant checker can order a write after a grant made by another process.

``SkewedClock`` is the wall clock plus a fixed offset: the suite runs some workers with it to
show what clock skew between workers does.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery_sagas.errors import FencedWriteRefused
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Envelope, Fence, Lease, LeaseHolder, LeaseTakeover, Page, Store
from tests.files import read_json_lines

Listener = Callable[[Envelope, int, bool], None]


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """Append one JSON line with a single O_APPEND write (whole across processes)."""
    data = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a trace or ledger file."""
    return read_json_lines(path)


class SkewedClock:
    """The system clock shifted by ``offset_ms`` (positive: this process runs ahead)."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        """Wall-clock milliseconds plus the offset."""
        return time.time_ns() // 1_000_000 + self.offset_ms


class TracingStore:
    """A pass-through Store that records lease grants and fenced writes to ``trace``."""

    durable = True

    def __init__(self, url: str, *, prefix: str, trace: Path, scan_delay_ms: int = 0) -> None:
        self.url = url
        self.prefix = prefix
        self.trace = trace
        self.scan_delay_ms = scan_delay_ms
        self.listeners: list[Listener] = []
        self._sweeping = threading.local()
        self._lock = threading.Lock()
        self._inner: Store | None = None
        self._pid = 0

    @property
    def inner(self) -> Store:
        """The real store of this process (opened on first use after a fork)."""
        with self._lock:
            if self._inner is None or self._pid != os.getpid():
                self._inner, self._pid = self._open(), os.getpid()
            return self._inner

    def _open(self) -> Store:
        if self.url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
            # A private redis-server runs with AOF (checked); the test cluster runs without.
            cluster = self.url.startswith(("redis+cluster://", "rediss+cluster://"))
            return open_store(self.url, prefix=self.prefix, require_aof=not cluster)
        return open_store(self.url, table_prefix=self.prefix + "_")

    @contextmanager
    def sweeping(self) -> Iterator[None]:
        """Mark this thread as running a sweep: its unfenced writes are traced as such."""
        self._sweeping.on = True
        try:
            yield
        finally:
            self._sweeping.on = False

    def _log(self, event: str, **fields: Any) -> None:
        append_line(self.trace, {"ev": event, "pid": os.getpid(), **fields})

    def bucket_of(self, record_id: str) -> int:
        """Pass through."""
        return self.inner.bucket_of(record_id)

    @property
    def buckets(self) -> int:
        """Pass through."""
        return self.inner.buckets

    def create(self, envelope: Envelope) -> bool:
        """Pass through."""
        return self.inner.create(envelope)

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Pass through."""
        return self.inner.get(kind, record_id)

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        """Pass through (a note is a worker's claim or a signal: never a sweep's write)."""
        return self.inner.annotate(kind, record_id, note, expected_version=expected_version)

    def compare_and_set(self, envelope: Envelope, expected_version: int, *,
                        fence: Fence | None = None) -> bool:
        """Pass through; a fenced write is traced with its fence and its start/end times."""
        started = time.monotonic_ns()
        try:
            ok = self.inner.compare_and_set(envelope, expected_version, fence=fence)
        except FencedWriteRefused:
            self._fenced(fence, started, "refused", envelope.id)
            raise
        if fence is not None:
            self._fenced(fence, started, "ok" if ok else "stale", envelope.id)
        elif getattr(self._sweeping, "on", False):
            self._log("unfenced", kind=envelope.kind, id=envelope.id, state=envelope.state,
                      outcome="ok" if ok else "stale")
        for listener in self.listeners:
            listener(envelope, expected_version, ok)
        return ok

    def delete(self, kind: str, record_id: str, expected_version: int, *,
               fence: Fence | None = None) -> bool:
        """Pass through; a fenced delete is traced like a fenced write."""
        started = time.monotonic_ns()
        try:
            ok = self.inner.delete(kind, record_id, expected_version, fence=fence)
        except FencedWriteRefused:
            self._fenced(fence, started, "refused", record_id)
            raise
        if fence is not None:
            self._fenced(fence, started, "ok" if ok else "stale", record_id)
        return ok

    def _fenced(self, fence: Fence | None, started: int, outcome: str, record_id: str) -> None:
        if fence is not None:
            self._log("write", lease=_lease(fence.lease, fence.bucket), fence=fence.number,
                      t0=started, t1=time.monotonic_ns(), outcome=outcome, id=record_id)

    def scan(self, kind: str, states: Sequence[str], *, label: str | None = None,
             updated_before_ms: int | None = None, bucket: int | None = None,
             cursor: str | None = None, limit: int = 100) -> Page:
        """Pass through (after an optional delay that makes sweeps slow enough to pause,
        traced as ``scan_wait``: a probe pauses a sweeper there)."""
        if self.scan_delay_ms:
            self._log("scan_wait", t1=time.monotonic_ns())
            time.sleep(self.scan_delay_ms / 1000)
        return self.inner.scan(kind, states, label=label, updated_before_ms=updated_before_ms,
                               bucket=bucket, cursor=cursor, limit=limit)

    def scan_due(self, kind: str, *, due_before_ms: int, bucket: int | None = None,
                 cursor: str | None = None, limit: int = 100) -> Page:
        """Pass through."""
        return self.inner.scan_due(kind, due_before_ms=due_before_ms, bucket=bucket, cursor=cursor,
                                   limit=limit)

    def count(self, kind: str, states: Sequence[str], *, label: str | None = None,
              updated_after_ms: int | None = None, updated_before_ms: int | None = None) -> int:
        """Pass through."""
        return self.inner.count(kind, states, label=label, updated_after_ms=updated_after_ms,
                                updated_before_ms=updated_before_ms)

    def acquire_lease(self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
                      bucket: int = 0) -> Lease | None:
        """Pass through; a grant is traced with the time it was known to exist."""
        lease = self.inner.acquire_lease(name, owner, token, now_ms, lease_ms, bucket=bucket)
        if lease is not None:
            self._log("grant", lease=_lease(name, bucket), fence=lease.fence, t1=time.monotonic_ns())
        return lease

    def lease_holder(self, name: str, *, bucket: int = 0) -> LeaseHolder | None:
        """Pass through."""
        inner = self.inner
        return inner.lease_holder(name, bucket=bucket) if isinstance(inner, LeaseTakeover) else None

    def take_over_lease(self, name: str, owner: str, token: str, now_ms: int, lease_ms: int, *,
                        expected_fence: int, bucket: int = 0) -> Lease | None:
        """Pass through; a takeover is a grant, traced as one (with the fence it replaced)."""
        inner = self.inner
        if not isinstance(inner, LeaseTakeover):
            return None
        lease = inner.take_over_lease(name, owner, token, now_ms, lease_ms,
                                      expected_fence=expected_fence, bucket=bucket)
        if lease is not None:
            self._log("grant", lease=_lease(name, bucket), fence=lease.fence, t1=time.monotonic_ns(),
                      replaced=expected_fence)
        return lease

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Pass through."""
        return self.inner.renew_lease(lease, now_ms, lease_ms)

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Pass through."""
        return self.inner.checkpoint_lease(lease, cursor, now_ms)

    def release_lease(self, lease: Lease) -> bool:
        """Pass through; traced so a fault injector can tell who is sweeping right now."""
        released = self.inner.release_lease(lease)
        self._log("release", lease=_lease(lease.name, lease.bucket), fence=lease.fence,
                  t1=time.monotonic_ns())
        return released

    def close(self) -> None:
        """Close this process's real store."""
        with self._lock:
            if self._inner is not None and self._pid == os.getpid():
                self._inner.close()
            self._inner = None


def _lease(name: str, bucket: int) -> str:
    """A lease as the trace names it: fencing numbers grow per (name, bucket)."""
    return f"{name}@{bucket}"
