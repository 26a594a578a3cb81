"""Sweep tests' helpers: an e2e app whose log lines carry microseconds, and a standalone sweeper.

As a Celery app (``celery -A tests.e2e.sweep_app worker``) this is ``tests.e2e.app`` with worker
log lines that start with ``%(created).6f``, so a test can order the sweep's ``sweep start`` and
``sweep end`` lines across processes.

As a program (``python -m tests.e2e.sweep_app --store URL --prefix P [--owner A] ...``) it runs
one reconciliation sweep in its own process (its lease owner this process's claimer id, as a
worker's, unless ``--owner`` names another), on a test saga definition, and records what it did
as JSON lines in ``--trace``: every scan page (cursor in, ids out), every compare-and-set and
its outcome (``written``, ``stale`` or ``fenced``), every message it would send. With
``--pause-at N`` it stops after the page on which it had examined N records, writes
``--marker`` and waits for ``--go`` to exist, so a test can SIGSTOP it at a known point.
It prints its ``SweepReport`` as JSON when done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from celery_sagas._codec import Codec
from celery_sagas._context import SagaContext
from celery_sagas._definitions import CompensatorOptions, Registry, SagaDefinition, StepOptions, Timing
from celery_sagas._engine import Engine, EngineSettings
from celery_sagas._liveness import claimer_id
from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState
from celery_sagas._repository import SagaRepository
from celery_sagas._scans import Scans
from celery_sagas._sweep import Sweeper, SweepReport
from celery_sagas.errors import FencedWriteRefused
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Envelope, Fence, Lease, Page, Store
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.stores.sql._schema import build_tables
from celery_sagas.testing.proxy import StoreProxy
from tests.files import read_json_lines, write_atomically

DEFINITION = "sweep-test"
STEP_TASK = "sweep.work"
UNDO_TASK = "sweep.undo"
HOUR_MS = 3_600_000


def _run(ctx: SagaContext, data: dict[str, Any]) -> None:
    ctx.step(STEP_TASK, data["n"])


def registry() -> Registry:
    """A registry with the one-step test saga the sweeper re-drives."""
    found = Registry()
    found.add_step(StepOptions(task=STEP_TASK, compensator=UNDO_TASK))
    found.add_compensator(CompensatorOptions(UNDO_TASK))
    found.add_definition(SagaDefinition(DEFINITION, _run))
    return found


def engine_on(store: Store, dispatcher: Any, *, stale_ms: int, clock: Any = None) -> Engine:
    """An engine over ``store`` with the sweep test saga registered."""
    return Engine(SagaRepository(store, Codec()), registry(), dispatcher, clock=clock,
                  settings=EngineSettings(timing=Timing(stale_ms=stale_ms)))


def sweeper_of(engine: Engine, owner: str, **options: Any) -> Sweeper:
    """A sweeper of ``engine``'s store."""
    return Sweeper(engine, Scans(engine.repository.store, Codec()), owner=owner, **options)


def _step(saga_id: str, n: int, at_ms: int, **changes: Any) -> StepRecord:
    fields: dict[str, Any] = {
        "name": STEP_TASK, "task": STEP_TASK, "effect_id": f"{saga_id}-e",
        "compensation_effect_id": f"{saga_id}-c", "state": StepState.EXECUTING, "args": (n,),
        "compensator": UNDO_TASK, "dispatched_at_ms": at_ms,
    }
    return StepRecord(**{**fields, **changes})


def stale_saga(saga_id: str, n: int, at_ms: int) -> SagaRecord:
    """A running saga whose first step's message was lost: a sweep sends it again."""
    return SagaRecord(saga_id, DEFINITION, SagaState.RUNNING, {"n": n}, at_ms, at_ms,
                      (_step(saga_id, n, at_ms),))


def due_compensation(saga_id: str, n: int, at_ms: int) -> SagaRecord:
    """A compensating saga whose compensation retry fell due at ``at_ms``: the due pass begins
    it again (a write) and sends the compensator."""
    step = _step(saga_id, n, at_ms, state=StepState.COMPENSATION_FAILED, attempts=1,
                 compensation_attempts=1, next_attempt_at_ms=at_ms, committed_at_ms=at_ms,
                 error_code="compensation_failed", started_at_ms=None)
    return SagaRecord(saga_id, DEFINITION, SagaState.COMPENSATING, {"n": n}, at_ms, at_ms, (step,),
                      rolling_back=True, error_code="cancelled", reason="cancelled")


def waiting_saga(saga_id: str, n: int, at_ms: int) -> SagaRecord:
    """A running saga whose step runs elsewhere within its time limit: a sweep leaves it alone."""
    step = _step(saga_id, n, at_ms, attempts=1, started_at_ms=at_ms, claimed_by="another-host:1",
                 time_limit_ms=24 * HOUR_MS)
    return SagaRecord(saga_id, DEFINITION, SagaState.RUNNING, {"n": n}, at_ms, at_ms, (step,))


def store_for(url: str, prefix: str) -> Store:
    """The store at ``url`` under ``prefix`` (Redis key prefix, or SQL table prefix + '_')."""
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")):
        return open_store(url, prefix=prefix, require_aof=False)  # test servers run without AOF
    return open_store(url, table_prefix=prefix + "_")


def bulk_create(store: Store, records: Sequence[SagaRecord]) -> None:
    """Insert many new sagas quickly (see ``bulk_insert``)."""
    bulk_insert(store, [Codec().saga_envelope(record) for record in records])


def bulk_insert(store: Store, envelopes: Sequence[Envelope]) -> None:
    """Insert many new records quickly, in the store's own layout (Redis pipeline, SQL executemany)."""
    if isinstance(store, RedisStore):
        _redis_insert(store, envelopes)
        return
    assert isinstance(store, SqlStore)
    table = build_tables(store.table_prefix).envelopes
    rows = [{"kind": e.kind, "id": e.id, "version": e.version, "state": e.state,
             "updated_at_ms": e.updated_at_ms, "body": e.body, "label": e.label,
             "due_at_ms": e.due_at_ms, "notes": None} for e in envelopes]
    with store.engine.begin() as connection:
        connection.execute(insert(table), rows)


def _redis_insert(store: RedisStore, envelopes: Sequence[Envelope]) -> None:
    layout = store.layout
    pipe = store._client.pipeline(transaction=False)
    for e in envelopes:
        fields: dict[Any, Any] = {"id": e.id, "version": e.version, "state": e.state,
                                  "updated_at_ms": e.updated_at_ms, "body": e.body}
        if e.label is not None:
            fields["label"] = e.label
            pipe.zadd(layout.record_index(e.kind, e.id, e.state, e.label), {e.id: e.updated_at_ms})
        if e.due_at_ms is not None:
            fields["due_at_ms"] = e.due_at_ms
            pipe.zadd(layout.due(e.kind, layout.bucket(e.id)), {e.id: e.due_at_ms})
        pipe.hset(layout.record(e.kind, e.id), mapping=fields)
        pipe.zadd(layout.record_index(e.kind, e.id, e.state), {e.id: e.updated_at_ms})
    pipe.execute()


def destroy(store: Store) -> None:
    """Remove everything a test wrote under the store's prefix, then close it."""
    if isinstance(store, SqlStore):
        store.drop_schema()
    elif isinstance(store, RedisStore):
        client = store._client
        for chunk in _chunks(list(client.scan_iter(match=store.layout.pattern(), count=1000)), 1000):
            client.delete(*chunk)
    store.close()


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class Trace:
    """Appends one JSON line per event to a file (O_APPEND keeps lines whole)."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self._lock = threading.Lock()

    def write(self, op: str, **fields: Any) -> None:
        """Record one event."""
        line = json.dumps({"op": op, "owner": self.owner, "t": time.time(), **fields})
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def read_trace(path: Path) -> list[dict[str, Any]]:
    """Every event a trace file holds (whole lines only)."""
    return read_json_lines(path)


class TracingStore(StoreProxy):
    """Delegates to a store and traces scans and compare-and-sets."""

    def __init__(self, inner: Store, trace: Trace) -> None:
        super().__init__(inner)
        self.trace = trace

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Delegate and trace the outcome."""
        number = None if fence is None else fence.number
        try:
            written = self.inner.compare_and_set(envelope, expected_version, fence=fence)
        except FencedWriteRefused:
            self.trace.write("cas", id=envelope.id, fence=number, outcome="fenced")
            raise
        self.trace.write("cas", id=envelope.id, fence=number, outcome="written" if written else "stale")
        return written

    def scan(self, kind: str, states: Sequence[str], *, label: str | None = None,
             updated_before_ms: int | None = None, bucket: int | None = None,
             cursor: str | None = None, limit: int = 100) -> Page:
        """Delegate and trace the page."""
        page = self.inner.scan(kind, states, label=label, updated_before_ms=updated_before_ms,
                               bucket=bucket, cursor=cursor, limit=limit)
        self.trace.write("scan", states=list(states), bucket=bucket, cursor=cursor,
                         ids=[item.id for item in page.items], next=page.cursor)
        return page

    def close(self) -> None:
        """Delegate."""
        self.inner.close()


class TracingDispatcher:
    """Traces every message instead of sending it."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def send_step(self, saga_id: str, step: StepRecord, version: int, **_: Any) -> None:
        """Trace a step message."""
        self.trace.write("send", kind="step", saga_id=saga_id, effect_id=step.effect_id)

    def send_compensation(self, saga_id: str, step: StepRecord, version: int, **_: Any) -> None:
        """Trace a compensation message."""
        self.trace.write("send", kind="compensation", saga_id=saga_id, effect_id=step.compensation_effect_id)


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def _report_json(report: SweepReport) -> str:
    return json.dumps({
        "acquired": report.acquired, "fence": report.fence, "complete": report.complete,
        "buckets": report.buckets, "fences": report.fences,
        "lease_lost": report.lease_lost, "examined": report.examined, "acted": report.acted,
        "errors": report.errors, "pages": report.pages, "corrupt": [c.id for c in report.corrupt],
    })


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Run one sweep under the sweep lease.")
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--owner", help="lease owner (default: this process's claimer id)")
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--lease-ms", type=int, default=30_000)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--stale-ms", type=int, default=1_000)
    parser.add_argument("--pause-at", type=int, default=0, help="block once this many records were "
                        "examined (0: never)")
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--go", type=Path)
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Sweep until every bucket was swept (waiting for leases others hold), then print the last
    report as JSON."""
    args = _parser().parse_args(argv)
    args.owner = args.owner or claimer_id()
    trace = Trace(args.trace, args.owner)
    store = TracingStore(store_for(args.store, args.prefix), trace)
    engine = engine_on(store, TracingDispatcher(trace), stale_ms=args.stale_ms)

    paused = False

    def on_page(lease: Lease, report: SweepReport) -> None:
        nonlocal paused
        trace.write("page", n=report.pages, examined=report.examined, fence=lease.fence)
        if args.pause_at and not paused and report.examined >= args.pause_at:
            paused = True
            assert args.marker is not None and args.go is not None
            write_atomically(args.marker, json.dumps({"pid": os.getpid(), "fence": lease.fence,
                                                      "bucket": lease.bucket, "owner": args.owner}))
            _wait_for(args.go, args.timeout)
            trace.write("resumed", fence=lease.fence)

    deadline = time.monotonic() + args.timeout
    sweeper = sweeper_of(engine, args.owner, lease_ms=args.lease_ms, page_size=args.page_size,
                         on_page=on_page)
    while True:
        report = sweeper.sweep()
        if report.complete or report.lease_lost or time.monotonic() > deadline:
            break
        time.sleep(0.02)  # another sweeper holds a bucket's lease: try again until it expires
    print(_report_json(report), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
elif os.environ.get("E2E_BROKER"):
    from tests.e2e.app import Config, build

    app = build(Config.from_env()).app
    app.conf.worker_log_format = "%(created).6f [%(levelname)s/%(processName)s] %(message)s"
