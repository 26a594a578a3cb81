"""Scan cost follows the matching records, not all records (SPEC §5).

Builds two stores side by side on each backend, under fresh prefixes:

- (a) ``--stale`` stale running sagas (default 1,000) and nothing else;
- (b) the same stale sagas plus ``--final`` final sagas (default 1,000,000; half completed,
  half compensated, all updated long before the staleness cut-off).

Then it times, alternating (a) and (b) so a busy machine slows both alike, one reconciliation
pass (``celery_sagas._sweep.sweep`` with every default pass, as beat runs it) and a scan-only
walk of the states that pass reads (stale ``running``, ``compensating``, ``manual-review``).
The stale sagas wait on a step running elsewhere, so a pass examines every one of them and
writes nothing: each repetition does the same work. It prints the median ratio (b)/(a) per
store (the target is at most 1.5), writes ``bench/results/scan_cost.json``, and removes
everything it created. Exit status 1 when a sweep ratio misses the target.

    .venv/bin/python bench/scan_cost.py                  # 1,000,000 final records
    .venv/bin/python bench/scan_cost.py --final 100000   # a quick run
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from celery_sagas._context import SagaContext
from celery_sagas._definitions import Registry, SagaDefinition, StepOptions, Timing
from celery_sagas._dispatch import RecordingDispatcher
from celery_sagas._engine import Engine, EngineSettings
from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState, saga_to_envelope
from celery_sagas._sweep import sweep
from celery_sagas.stores.base import Envelope, Store
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.stores.sql._schema import build_tables

TARGET = 1.5
STALE_MS = 30_000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
BATCH = 10_000
PROGRESS_EVERY = 100_000
TASKS = ("bench.reserve", "bench.charge", "bench.ship")
DEFINITION = "bench-order"
RESULTS = Path(__file__).resolve().parent / "results" / "scan_cost.json"


def _run(ctx: SagaContext, order: dict[str, Any]) -> None:
    for task in TASKS:
        ctx.step(task, order["id"])


def _registry() -> Registry:
    registry = Registry()
    for task in TASKS:
        registry.add_step(StepOptions(task=task, compensator=f"{task}.undo"))
    registry.add_definition(SagaDefinition(DEFINITION, _run))
    return registry


def _step(task: str, saga_id: str, n: int, state: StepState, at_ms: int) -> StepRecord:
    committed = state is not StepState.EXECUTING
    return StepRecord(
        name=task, task=task, effect_id=f"{saga_id}-{n}e", compensation_effect_id=f"{saga_id}-{n}c",
        state=state, args=(saga_id,), compensator=f"{task}.undo", attempts=1,
        result={"ref": f"{task}-{saga_id}"} if committed else None,
        started_at_ms=at_ms, claimed_by="another-host:1", dispatched_at_ms=at_ms,
        time_limit_ms=DAY_MS, committed_at_ms=at_ms if committed else None,
    )


def waiting_saga(saga_id: str, at_ms: int) -> SagaRecord:
    """Stale and running, its first step still running on another host within its time limit."""
    step = _step(TASKS[0], saga_id, 0, StepState.EXECUTING, at_ms)
    return SagaRecord(saga_id, DEFINITION, SagaState.RUNNING, {"id": saga_id}, at_ms, at_ms, (step,))


def final_body(state: SagaState, at_ms: int) -> str:
    """The JSON body of a realistic final saga (three steps, committed or compensated)."""
    step_state = StepState.COMMITTED if state is SagaState.COMPLETED else StepState.COMPENSATED
    steps = tuple(_step(task, "final", n, step_state, at_ms) for n, task in enumerate(TASKS))
    record = SagaRecord("final", DEFINITION, state, {"id": "final"}, at_ms, at_ms, steps)
    return saga_to_envelope(record).body


# ---------------------------------------------------------------------- loading


@dataclass
class Target:
    """One store under a fresh prefix and the final record ids it holds."""

    name: str
    store: RedisStore | SqlStore
    prefix: str
    final_ids: int = 0
    timings: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def open_target(backend: str, url: str) -> Target:
    """A store under a fresh prefix (``bench<hex>``)."""
    prefix = "bench" + uuid.uuid4().hex[:10]
    if backend == "redis":
        return Target(backend, RedisStore.from_url(url, prefix=prefix), prefix)
    return Target(backend, SqlStore.from_url(url, table_prefix=prefix + "_"), prefix)


def final_envelopes(count: int, now_ms: int) -> Iterator[Envelope]:
    """``count`` final sagas, half completed and half compensated, updated over the last 30 days."""
    base = now_ms - 30 * DAY_MS
    bodies = {state: final_body(state, base) for state in (SagaState.COMPLETED, SagaState.COMPENSATED)}
    states = list(bodies)
    for n in range(count):
        state = states[n % 2]
        at = base + (n * 29 * DAY_MS) // max(count, 1)
        yield Envelope("saga", f"final-{n:08d}", 4 + 2 * (n % 2), str(state), at, bodies[state])


def _batches(items: Iterator[Envelope], size: int) -> Iterator[list[Envelope]]:
    batch: list[Envelope] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def load(target: Target, envelopes: Iterator[Envelope], total: int, label: str) -> float:
    """Write envelopes in the store's own layout, fast; prints a line every 100,000."""
    write = _redis_writer(target.store) if isinstance(target.store, RedisStore) else _sql_writer(target.store)
    started, done, shown = time.perf_counter(), 0, 0
    for batch in _batches(envelopes, BATCH):
        write(batch)
        done += len(batch)
        if done - shown >= PROGRESS_EVERY or done == total:
            shown = done
            print(f"  {target.name}: {label} {done:,}/{total:,} ({time.perf_counter() - started:.1f} s)",
                  flush=True)
    return time.perf_counter() - started


def _redis_writer(store: RedisStore) -> Callable[[list[Envelope]], None]:
    """HSET every record and ZADD it to its bucket's state index, as the create script does."""
    layout, client = store.layout, store._client

    def write(batch: list[Envelope]) -> None:
        pipe = client.pipeline(transaction=False)
        indexes: dict[str, dict[str, int]] = defaultdict(dict)
        for e in batch:
            pipe.hset(layout.record(e.kind, e.id), mapping={
                "id": e.id, "version": e.version, "state": e.state,
                "updated_at_ms": e.updated_at_ms, "body": e.body,
            })
            indexes[layout.record_index(e.kind, e.id, e.state)][e.id] = e.updated_at_ms
        for key, members in indexes.items():
            pipe.zadd(key, members)
        pipe.execute()

    return write


def _sql_writer(store: SqlStore) -> Callable[[list[Envelope]], None]:
    """COPY into the envelope table on PostgreSQL; executemany elsewhere."""
    table = build_tables(store.table_prefix).envelopes
    columns = ("kind", "id", "version", "state", "updated_at_ms", "body")
    if store.engine.dialect.name != "postgresql":
        def insert_many(batch: list[Envelope]) -> None:
            with store.engine.begin() as conn:
                conn.execute(table.insert(), [{c: getattr(e, c) for c in columns} for e in batch])
        return insert_many

    def copy(batch: list[Envelope]) -> None:
        raw = store.engine.raw_connection()
        try:
            with raw.cursor() as cursor:  # type: ignore[attr-defined]
                statement = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN"
                with cursor.copy(statement) as copy_in:
                    for e in batch:
                        copy_in.write_row((e.kind, e.id, e.version, e.state, e.updated_at_ms, e.body))
            raw.commit()
        finally:
            raw.close()

    return copy


def settle(target: Target) -> None:
    """VACUUM (ANALYZE) after a bulk load on PostgreSQL: fresh planner statistics, and no
    autovacuum of a freshly loaded 1M-row table running in the middle of the measurements."""
    if isinstance(target.store, SqlStore) and target.store.engine.dialect.name == "postgresql":
        table = build_tables(target.store.table_prefix).envelopes.name
        with target.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")


def destroy(target: Target) -> None:
    """Remove everything the target holds and close it."""
    store = target.store
    if isinstance(store, SqlStore):
        store.drop_schema()
    else:
        client = store._client
        keys = [store.layout.record("saga", f"final-{n:08d}") for n in range(target.final_ids)]
        for start in range(0, len(keys), BATCH):
            client.unlink(*keys[start:start + BATCH])
        leftovers = list(client.scan_iter(match=store.layout.pattern(), count=10_000))
        for start in range(0, len(leftovers), BATCH):
            client.unlink(*leftovers[start:start + BATCH])
    store.close()


# ---------------------------------------------------------------------- measuring


def sweep_once(engine: Engine, stale: int) -> None:
    """One full reconciliation pass, as beat runs it (with the metrics gauge's saga counts)."""
    report = sweep(engine, owner="bench", lease_ms=600_000, page_size=100, count_cap=10_000)
    if not report.complete or report.examined != stale or report.acted or report.errors:
        raise RuntimeError(f"unexpected sweep: {report.examined} examined, {report.acted} acted, "
                           f"{report.errors} errors, complete={report.complete}")


def scan_once(store: Store, stale: int) -> None:
    """Walk every page of the states the sweep's saga passes read; nothing decoded."""
    before = int(time.time() * 1000) - STALE_MS
    found = 0
    for state, cut in (("running", before), ("compensating", None), ("manual-review", None)):
        cursor: str | None = None
        while True:
            page = store.scan("saga", [state], updated_before_ms=cut, cursor=cursor, limit=100)
            found += len(page.items)
            cursor = page.cursor
            if cursor is None:
                break
    if found != stale:
        raise RuntimeError(f"scan found {found} records, expected {stale}")


def timed(action: Callable[[], None]) -> float:
    """Seconds one call takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(pair: tuple[Target, Target], stale: int, repeat: int) -> None:
    """Alternate (a) and (b), one warm-up round first; timings land in each target."""
    engines = [Engine(t.store, _registry(), RecordingDispatcher(),
                      settings=EngineSettings(timing=Timing(stale_ms=STALE_MS))) for t in pair]
    for round_ in range(repeat + 1):
        for target, engine in zip(pair, engines, strict=True):
            sweep_s = timed(lambda e=engine: sweep_once(e, stale))  # type: ignore[misc]
            scan_s = timed(lambda s=target.store: scan_once(s, stale))  # type: ignore[misc]
            if round_:
                target.timings["sweep"].append(sweep_s)
                target.timings["scan"].append(scan_s)


def summary(pair: tuple[Target, Target]) -> dict[str, Any]:
    """Medians and ratios of one backend."""
    a, b = pair
    out: dict[str, Any] = {"final_records": b.final_ids}
    for what in ("sweep", "scan"):
        med_a, med_b = statistics.median(a.timings[what]), statistics.median(b.timings[what])
        out[what] = {"a_median_s": med_a, "b_median_s": med_b, "ratio": med_b / med_a,
                     "a_runs_s": a.timings[what], "b_runs_s": b.timings[what]}
    return out


# ---------------------------------------------------------------------- main


def bench_backend(backend: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build (a) and (b) on one backend, measure, clean up; returns its summary."""
    print(f"{backend}: {args.stale:,} stale sagas; (b) also holds {args.final:,} final sagas", flush=True)
    pair = (open_target(backend, url), open_target(backend, url))
    try:
        now = int(time.time() * 1000)
        for target in pair:
            stale = (saga_to_envelope(waiting_saga(f"stale-{n:05d}", now - HOUR_MS + n))
                     for n in range(args.stale))
            load(target, iter(stale), args.stale, "stale sagas")
        pair[1].final_ids = args.final
        load_s = load(pair[1], final_envelopes(args.final, now), args.final, "final sagas")
        for target in pair:
            settle(target)
        measure(pair, args.stale, args.repeat)
        result = summary(pair)
        result["load_final_s"] = load_s
    finally:
        for target in pair:
            destroy(target)
    for what in ("sweep", "scan"):
        r = result[what]
        verdict = "ok" if r["ratio"] <= TARGET else f"OVER {TARGET}"
        print(f"{backend}: {what:5s} (a) {r['a_median_s'] * 1000:8.1f} ms"
              f"  (b) {r['b_median_s'] * 1000:8.1f} ms  ratio (b)/(a) {r['ratio']:.2f}  [{verdict}]",
              flush=True)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="Redis store URL")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="PostgreSQL store URL (SQLAlchemy)")
    parser.add_argument("--stores", default="redis,postgres", help="comma-separated: redis, postgres")
    parser.add_argument("--stale", type=int, default=1_000, help="stale running sagas in both stores")
    parser.add_argument("--final", type=int, default=1_000_000, help="final sagas in store (b)")
    parser.add_argument("--repeat", type=int, default=9, help="timed rounds (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a sweep ratio misses the target."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # every stale saga is a finding: keep them off stderr
    urls = {"redis": args.redis, "postgres": args.postgres}
    results: dict[str, Any] = {}
    for backend in [s.strip() for s in args.stores.split(",") if s.strip()]:
        results[backend] = bench_backend(backend, urls[backend], args)
    document = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "stale": args.stale, "final": args.final, "repeat": args.repeat, "target": TARGET,
        "stores": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0 if all(r["sweep"]["ratio"] <= TARGET for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
