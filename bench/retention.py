"""Retention gives the memory back: Redis memory and keys, PostgreSQL rows (docs/design.md §7).

For each store, under a fresh prefix, with ``retention`` = ``--retention`` seconds (60):

1. a warm-up round of the same work, deleted again, and one sweep (client connections open,
   scripts loaded, bucket leases granted), then the starting figures: Redis ``used_memory``
   and key count, or PostgreSQL row counts and table size;
2. ``--n`` final sagas (100,000): the first ``--engine`` (1,000) run through the real engine
   in-process (``SagaDriver``: start, claim, body, settle, as a worker delivers them), half
   completing and half compensating; the rest are copies of those records under new ids,
   written with the store's ``create`` (running 100,000 sagas through real workers takes far
   longer than this 2-core machine allows; the records are the same);
3. the figures with every saga stored (bytes and keys/rows per saga, for sizing);
4. wait until the last saga is older than the retention, then sweep (``Sagas.sweep``, the
   retention pass with every other pass, as beat runs it) until a sweep deletes nothing;
5. the figures again: each must be within 10 % of its starting value (exit status 1 if not).

It writes ``bench/results/retention.json`` and removes what it created. ``--spawn-redis PORT``
starts a private ``redis-server`` (no persistence) on that port so that ``used_memory`` is this
run's alone, and stops it at the end.

    .venv/bin/python bench/retention.py --spawn-redis 7401 --postgres postgresql+psycopg://postgres@127.0.0.1:5432/wt4
    .venv/bin/python bench/retention.py --n 10000 --retention 5 --stores redis --spawn-redis 7401
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, git_commit, machine, wait_until
from celery_sagas import Sagas, SagaState, StepNotCommitted
from celery_sagas._codec import Codec
from celery_sagas._records import SagaRecord
from celery_sagas.stores.base import delete_all
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.testing.driver import SagaDriver

TOLERANCE = 0.10
CREATE_THREADS = 4
ORDER = {"sku": "sku-123", "qty": 2, "card": "tok_4242424242424242", "total": 4999,
         "address": {"street": "1 Example Road", "city": "Exampleton", "zip": "12345"}}


def define(sagas: Sagas) -> None:
    """A three-step order saga; ``ship`` declines odd-numbered orders (they compensate)."""

    @sagas.step(name="bench.reserve", compensate="bench.release")
    def reserve(sku: str, qty: int) -> dict[str, Any]:
        return {"reservation": f"res-{uuid.uuid4().hex[:12]}", "sku": sku, "qty": qty}

    @sagas.compensator(name="bench.release")
    def release(sku: str, qty: int, *, result: Any = None) -> None:
        return None

    @sagas.step(name="bench.charge", compensate="bench.refund")
    def charge(card: str, total: int) -> dict[str, Any]:
        return {"charge": f"ch_{uuid.uuid4().hex[:16]}", "amount": total}

    @sagas.compensator(name="bench.refund")
    def refund(card: str, total: int, *, result: Any = None) -> None:
        return None

    @sagas.step(name="bench.ship", compensate=None)
    def ship(order: dict[str, Any], n: int) -> dict[str, Any]:
        if n % 2:
            raise StepNotCommitted("out_of_stock")
        return {"tracking": f"trk-{uuid.uuid4().hex[:10]}"}

    @sagas.saga("bench-order")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        order = data["order"]
        ctx.step(reserve, order["sku"], order["qty"])
        ctx.step(charge, order["card"], order["total"])
        return ctx.step(ship, order, data["n"])


# ---------------------------------------------------------------- per-store figures


def redis_figures(store: RedisStore) -> dict[str, int]:
    client = store._client
    client.execute_command("MEMORY", "PURGE")
    info = client.info("memory")
    keys = sum(1 for _ in client.scan_iter(match=store.layout.pattern(), count=5000))
    return {"used_memory": int(info["used_memory"]), "keys": keys, "dbsize": int(client.dbsize()),
            "used_memory_dataset": int(info["used_memory_dataset"]),
            "mem_clients_normal": int(info["mem_clients_normal"])}


def sql_figures(store: SqlStore) -> dict[str, int]:
    prefix = store.table_prefix
    with store.engine.begin() as conn:
        rows = conn.execute(text(f"SELECT count(*) FROM {prefix}envelopes")).scalar_one()
        leases = conn.execute(text(f"SELECT count(*) FROM {prefix}leases")).scalar_one()
        size = conn.execute(text(f"SELECT pg_total_relation_size('{prefix}envelopes')")).scalar_one()
    return {"envelope_rows": int(rows), "lease_rows": int(leases), "envelopes_bytes": int(size)}


# ---------------------------------------------------------------- the run


def settled(figures: Callable[[], dict[str, int]], start: dict[str, int] | None) -> dict[str, int]:
    """The figures once Redis has shrunk its tables (its cron does it within a second or two):
    back within the tolerance of ``start``, or the last reading after 15 s."""
    deadline = time.monotonic() + 15
    found = figures()
    while time.monotonic() < deadline:
        if start is not None and all(_within(start[k], found[k]) for k in _COMPARED if k in found):
            break
        time.sleep(1.0)
        found = figures()
    return found


_COMPARED = ("used_memory", "keys", "envelope_rows", "lease_rows")


def load(sagas: Sagas, n: int, through_engine: int, progress: Callable[[str], None],
         prefix: str = "") -> tuple[int, float]:
    """Store ``n`` final sagas; the newest ``updated_at_ms`` and the mean body size (bytes)."""
    driver = SagaDriver(sagas)
    templates: list[SagaRecord] = []
    for i in range(min(n, through_engine)):
        sagas.start("bench-order", {"order": ORDER, "n": i}, saga_id=f"{prefix}eng-{i}")
        driver.run_until_idle()
        record = sagas.get(f"{prefix}eng-{i}")
        assert record is not None and record.state in (SagaState.COMPLETED, SagaState.COMPENSATED)
        if len(templates) < 2:
            templates.append(record)
    progress(f"{min(n, through_engine)} sagas through the engine")
    codec, store = Codec(sagas.settings.payload_limit), sagas.store

    def create(i: int) -> None:
        now = int(time.time() * 1000)
        template = templates[i % 2]
        record = replace(template, saga_id=f"{prefix}copy-{i}", created_at_ms=now, updated_at_ms=now)
        assert store.create(codec.saga_envelope(record))

    rest = range(through_engine, n)
    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        for done, _ in enumerate(pool.map(create, rest, chunksize=500), start=1):
            if done % 20_000 == 0:
                progress(f"{through_engine + done} sagas stored")
    body = sum(len(codec.saga_envelope(t).body.encode()) for t in templates) / len(templates)
    return int(time.time() * 1000), body


def delete_everything_final(sagas: Sagas) -> None:
    """Delete every final saga at once, page by page (the warm-up's clean-up)."""
    while True:
        page = sagas.browse(states=[SagaState.COMPLETED, SagaState.COMPENSATED], limit=500)
        if not page.records:
            return
        delete_all(sagas.store, [("saga", r.saga_id, r.version) for r in page.records])


def sweep_until_clean(sagas: Sagas, progress: Callable[[str], None]) -> dict[str, Any]:
    """Sweep until a sweep deletes nothing; how many were deleted and how long it took."""
    started, deleted, sweeps = time.monotonic(), 0, 0
    while True:
        report = sagas.sweep()
        sweeps += 1
        deleted += report.deleted
        progress(f"sweep {sweeps}: deleted {report.deleted} (examined {report.examined}, "
                 f"errors {report.errors})")
        if report.deleted == 0 and report.complete:
            return {"deleted": deleted, "sweeps": sweeps, "seconds": time.monotonic() - started}


def run_store(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    def progress(message: str) -> None:
        print(f"[{kind}] {message}", file=sys.stderr, flush=True)

    tag = "ret" + uuid.uuid4().hex[:8]
    app = Celery(f"bench-retention-{tag}", set_as_current=False)
    options: dict[str, Any] = {"key_prefix": tag} if kind == "redis" else {"table_prefix": tag + "_"}
    options["require_aof"] = False  # the benchmark's Redis runs without AOF (ignored by SQL)
    sagas = Sagas(app, store=url, retention=args.retention, sweep_page_size=args.page_size,
                  sweep_lease=120.0, **options)
    define(sagas)
    store = sagas.store
    figures: Callable[[], dict[str, int]] = (
        (lambda: redis_figures(store)) if isinstance(store, RedisStore)  # type: ignore[arg-type]
        else (lambda: sql_figures(store))  # type: ignore[arg-type]
    )
    try:
        # A round of the same work first: client connections open, scripts loaded, the
        # sweep's bucket leases granted (all part of an idle store in production); what it
        # stored is then deleted straight away, without waiting for the retention.
        load(sagas, 200, 20, lambda _: None, prefix="warm")
        delete_everything_final(sagas)
        sagas.sweep()
        start = settled(figures, None)
        progress(f"start {start}")
        began = time.monotonic()
        newest, body_bytes = load(sagas, args.n, args.engine, progress)
        load_s = time.monotonic() - began
        full = figures()
        progress(f"full {full} (loaded in {load_s:.0f} s)")
        due_at = newest / 1000 + args.retention + 1
        progress(f"waiting {max(0.0, due_at - time.time()):.0f} s for the last saga to expire")
        wait_until(lambda: time.time() > due_at, timeout=args.retention + 600, what="expiry",
                   interval=0.5)
        swept = sweep_until_clean(sagas, progress)
        end = settled(figures, start)
        progress(f"end {end}")
    finally:
        if hasattr(store, "drop_tables"):
            store.drop_tables()
        else:
            client = store._client  # type: ignore[attr-defined]
            keys = list(client.scan_iter(match=store.layout.pattern(), count=5000))  # type: ignore[attr-defined]
            for chunk in range(0, len(keys), 1000):
                client.delete(*keys[chunk:chunk + 1000])
        store.close()
    per_saga = {name: (full[name] - start[name]) / args.n for name in start}
    back = {name: _within(start[name], end[name]) for name in _COMPARED if name in start}
    return {"start": start, "full": full, "end": end, "per_saga": per_saga, "load_s": load_s,
            "body_bytes": body_bytes,
            "sweep": swept, "within_10pct": back, "ok": all(back.values())}


def _within(start: int, end: int) -> bool:
    return abs(end - start) <= TOLERANCE * max(start, 1) if start else end == 0


def spawn_redis(port: int) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server on ``port``, no persistence, in a temporary directory."""
    workdir = tempfile.mkdtemp(prefix="bench-retention-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    def answers() -> bool:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.RedisError:
            return False

    wait_until(answers, timeout=30, what="redis-server up", interval=0.1)
    return proc, workdir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--engine", type=int, default=1_000,
                        help="how many of the sagas run through the engine in-process")
    parser.add_argument("--retention", type=float, default=60.0)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--stores", default="redis,postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--spawn-redis", type=int, metavar="PORT",
                        help="start a private redis-server on PORT and use it")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    server = None
    if args.spawn_redis:
        server = spawn_redis(args.spawn_redis)
        args.redis = f"redis://127.0.0.1:{args.spawn_redis}/0"
    results: dict[str, Any] = {"n": args.n, "engine": args.engine, "retention_s": args.retention,
                               "commit": git_commit(), "machine": machine()}
    try:
        for kind in args.stores.split(","):
            url = args.redis if kind == "redis" else args.postgres
            results[kind] = run_store(kind, url, args)
    finally:
        if server is not None:
            proc, workdir = server
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "retention.json").write_text(json.dumps(results, indent=2))
    for kind in args.stores.split(","):
        found = results[kind]
        print(f"{kind}: start {found['start']}  full {found['full']}  end {found['end']}")
        print(f"{kind}: per saga {({k: round(v, 1) for k, v in found['per_saga'].items()})} "
              f"(record body {found['body_bytes']:.0f} bytes); "
              f"load {found['load_s']:.0f} s; retention sweeps {found['sweep']['sweeps']} deleted "
              f"{found['sweep']['deleted']} in {found['sweep']['seconds']:.1f} s; "
              f"back within 10 %: {found['within_10pct']}")
    return 0 if all(results[k]["ok"] for k in args.stores.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
