"""Latency of each store primitive on Redis, PostgreSQL and SQLite, against a plain Redis round trip.

For every store, one loop runs each primitive once per iteration in a shuffled order, together
with the baseline: a plain Redis ``GET`` then ``SET`` of a key of the same size, measured in the
same loop (the machine is noisy, so ratios within one loop are what to compare). Bodies are a
real encoded saga record of three committed steps.

Primitives: ``create`` (a fresh id), ``get``, ``compare_and_set`` (state kept, the engine's
common case), ``scan`` (first page and a cursor page of 100 among 1000 matching records),
``acquire_lease`` + ``release_lease`` (a free lease), ``renew_lease`` and ``checkpoint_lease``
(a held lease).

    .venv/bin/python -m bench.store_ops                     # all three stores, 2000 iterations
    .venv/bin/python -m bench.store_ops --n 500 --stores redis
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import random
import secrets
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from redis import Redis

from bench.common import RESULTS, Progress, git_commit, machine, median, percentile, write_json
from celery_sagas._codec import Codec
from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Envelope, Lease, Store

STORES = {
    "redis": "redis://127.0.0.1:6379/13",
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "sqlite": "sqlite:///{tmp}/store_ops.db",
}
KIND = "saga"
SCAN_KIND = "scanned"
SCAN_RECORDS = 1000
PAGE = 100
BASELINE = ("redis GET", "redis SET", "redis GET+SET")


def saga_body() -> Envelope:
    """The envelope of a completed three-step saga, as the engine writes it."""
    now = int(time.time() * 1000)
    steps = tuple(
        StepRecord(
            name=f"bench.noop{i}", task=f"bench.noop{i}", effect_id=str(uuid.uuid4()),
            compensation_effect_id=str(uuid.uuid4()), state=StepState.COMMITTED, args=(i,),
            attempts=1, started_at_ms=now, claimed_by=f"host:1234/{secrets.token_hex(4)}",
            dispatched_at_ms=now, time_limit_ms=300_000, committed_at_ms=now,
        )
        for i in (1, 2, 3)
    )
    record = SagaRecord("bench-template", "bench-3", SagaState.RUNNING, {"i": 1}, now, now, steps)
    return Codec().saga_envelope(record)


class Loop:
    """Runs every operation once per iteration, in a shuffled order, and keeps the timings."""

    def __init__(self) -> None:
        self.ops: dict[str, Callable[[], object]] = {}
        self.samples: dict[str, list[float]] = {}

    def add(self, name: str, op: Callable[[], object]) -> None:
        """Measure ``op`` under ``name``."""
        self.samples[name] = []
        self.ops[name] = lambda: self._timed(name, op)

    def add_pair(self, first: str, op1: Callable[[], object], second: str, op2: Callable[[], object]
                 ) -> None:
        """Measure two operations that must run in this order (acquire, then release)."""
        self.samples[first], self.samples[second] = [], []

        def both() -> None:
            self._timed(first, op1)
            self._timed(second, op2)

        self.ops[f"{first}+{second}"] = both

    def _timed(self, name: str, op: Callable[[], object]) -> None:
        began = time.perf_counter_ns()
        op()
        self.samples[name].append((time.perf_counter_ns() - began) / 1000)

    def run(self, n: int, progress: Progress, label: str) -> None:
        """``n`` iterations."""
        names = list(self.ops)
        for i in range(n):
            random.shuffle(names)
            for name in names:
                self.ops[name]()
            progress.show(f"[{label}] {i + 1}/{n}")
        progress.done()


def build_loop(store: Store, redis: Redis, template: Envelope, tag: str) -> Loop:
    """The operations of one store, set up with their data."""
    loop = Loop()
    body = template.body
    base_key = f"bench:store_ops:{tag}"
    redis.set(base_key, body)
    loop.add("redis GET", lambda: redis.get(base_key))
    loop.add("redis SET", lambda: redis.set(base_key, body))

    def get_set() -> None:
        redis.get(base_key)
        redis.set(base_key, body)

    loop.add("redis GET+SET", get_set)
    now = int(time.time() * 1000)
    counter = iter(range(10**9))

    def create() -> None:
        saga_id = f"{tag}-c{next(counter)}"
        store.create(replace(template, id=saga_id, version=1, updated_at_ms=now))

    loop.add("create", create)
    hot = [replace(template, id=f"{tag}-h{i}", version=1, updated_at_ms=now) for i in range(64)]
    for envelope in hot:
        store.create(envelope)
    versions = {e.id: 1 for e in hot}
    loop.add("get", lambda: store.get(KIND, random.choice(hot).id))

    def cas() -> None:
        envelope = random.choice(hot)
        version = versions[envelope.id]
        updated = replace(envelope, version=version + 1, updated_at_ms=int(time.time() * 1000))
        if not store.compare_and_set(updated, version):
            raise RuntimeError("compare_and_set refused in a single-writer loop")
        versions[envelope.id] = version + 1

    loop.add("compare_and_set", cas)
    _populate_scan(store, template, tag, now)
    first = store.scan(SCAN_KIND, ["running"], limit=PAGE)
    if len(first.items) != PAGE or first.cursor is None:
        raise RuntimeError("scan population is not as expected")
    cursor = first.cursor
    loop.add("scan page (100)", lambda: store.scan(SCAN_KIND, ["running"], limit=PAGE))
    loop.add("scan page (100, cursor)",
             lambda: store.scan(SCAN_KIND, ["running"], cursor=cursor, limit=PAGE))
    _lease_ops(loop, store, tag)
    return loop


def _populate_scan(store: Store, template: Envelope, tag: str, now: int) -> None:
    for i in range(SCAN_RECORDS):
        store.create(replace(template, kind=SCAN_KIND, id=f"{tag}-s{i}", version=1,
                             state="running", updated_at_ms=now - SCAN_RECORDS + i))
        # records in other states must not slow a scan of "running"
        store.create(replace(template, kind=SCAN_KIND, id=f"{tag}-d{i}", version=1,
                             state="completed", updated_at_ms=now - SCAN_RECORDS + i))


def _lease_ops(loop: Loop, store: Store, tag: str) -> None:
    free_name, held_name, owner = f"{tag}-free", f"{tag}-held", "bench-owner"
    granted: list[Lease] = []

    def acquire() -> None:
        lease = store.acquire_lease(free_name, owner, secrets.token_hex(16), _ms(), 60_000)
        if lease is None:
            raise RuntimeError("free lease not granted")
        granted.append(lease)

    def release() -> None:
        if granted and not store.release_lease(granted.pop()):
            raise RuntimeError("lease not released")

    held = store.acquire_lease(held_name, owner, secrets.token_hex(16), _ms(), 3_600_000)
    if held is None:
        raise RuntimeError("lease not granted")
    loop.add_pair("acquire_lease", acquire, "release_lease", release)
    loop.add("renew_lease", lambda: store.renew_lease(held, _ms(), 3_600_000))
    loop.add("checkpoint_lease", lambda: store.checkpoint_lease(held, "c" * 40, _ms()))


def _ms() -> int:
    return int(time.time() * 1000)


def open_for(name: str, url: str, tag: str) -> Store:
    """Open the store with a private prefix."""
    if name == "redis":
        return open_store(url, prefix=tag, require_aof=False)  # the benchmark's Redis has no AOF
    return open_store(url, table_prefix=tag + "_")


def cleanup(name: str, store: Any, url: str, redis: Redis, tag: str) -> None:
    """Remove what this run wrote."""
    if name == "redis":
        keys = list(redis.scan_iter(match=f"*{tag}*", count=1000))
        client = Redis.from_url(url)
        keys += list(client.scan_iter(match=store.layout.pattern(), count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start:start + 1000])
        client.close()
    else:
        store.drop_tables()
    redis.delete(f"bench:store_ops:{tag}")
    store.close()


def summarise(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median and p99 in microseconds, and ratios to the baseline measured in the same loop."""
    one_rt = median(samples["redis GET"])
    get_set = median(samples["redis GET+SET"])
    rows = {}
    for name, values in samples.items():
        med = median(values)
        rows[name] = {
            "median_us": round(med, 1),
            "p99_us": round(percentile(values, 99), 1),
            "x_redis_get_set": round(med / get_set, 2),
            "x_redis_round_trip": round(med / one_rt, 2),
        }
    return rows


def measure_store(name: str, url: str, redis: Redis, n: int, progress: Progress) -> dict[str, Any]:
    """Set up, warm up, measure and clean up one store."""
    tag = f"so{uuid.uuid4().hex[:8]}"
    store = open_for(name, url, tag)
    try:
        loop = build_loop(store, redis, saga_body(), tag)
        loop.run(max(50, n // 10), progress, f"{name} warm-up")
        for values in loop.samples.values():
            values.clear()
        loop.run(n, progress, name)
        return summarise(loop.samples)
    finally:
        cleanup(name, store, url, redis, tag)


def print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    """One row per (store, primitive)."""
    head = f"{'store':<10}{'primitive':<30}{'median us':>10}{'p99 us':>10}{'x GET+SET':>11}{'x 1 RT':>8}"
    print(head)
    print("-" * len(head))
    for store, rows in results.items():
        for name, row in rows.items():
            if name in BASELINE and store != next(iter(results)):
                continue
            shown = "redis" if name in BASELINE else store
            print(f"{shown:<10}{name:<30}{row['median_us']:>10}{row['p99_us']:>10}"
                  f"{row['x_redis_get_set']:>11}{row['x_redis_round_trip']:>8}")
    print("ratios use the Redis GET+SET (and single GET) measured in the same loop as each store")


def main(argv: list[str] | None = None) -> int:
    """Measure the stores the options name; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="iterations (each runs every primitive once)")
    parser.add_argument("--stores", default="redis,postgres,sqlite")
    parser.add_argument("--redis", default=STORES["redis"], help="Redis store URL (also the baseline)")
    parser.add_argument("--postgres", default=STORES["postgres"])
    parser.add_argument("--sqlite", default=None, help="SQLite URL (default: a file in a temp dir)")
    parser.add_argument("--output", type=Path, default=RESULTS / "store_ops.json")
    args = parser.parse_args(argv)
    progress = Progress()
    redis = Redis.from_url(args.redis)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="store-ops-") as tmp:
        urls = {"redis": args.redis, "postgres": args.postgres,
                "sqlite": args.sqlite or STORES["sqlite"].format(tmp=tmp)}
        for name in [s.strip() for s in args.stores.split(",") if s.strip()]:
            if name not in urls:
                raise SystemExit(f"unknown store {name!r}")
            results[name] = measure_store(name, urls[name], redis, args.n, progress)
    redis.close()
    print_table(results)
    write_json(args.output, {"commit": git_commit(), "machine": machine(), "n": args.n,
                             "body_bytes": len(saga_body().body.encode()), "results": results})
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
