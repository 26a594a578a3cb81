"""An async web route that starts sagas: ``sagas.aio`` against the sync client in a thread
pool, measured in the same run (issue 30); and how soon ``aio.wait`` returns once a saga ended.

Starts: uvicorn serves ``bench/async_app.py`` (one process); each round opens ``--concurrency``
kept-alive connections (untimed: one request on each; a plain asyncio client, as httpx's own
pool was the bottleneck at 200 connections), then sends
``--requests`` requests at ``POST /aio`` or ``POST /sync`` (alternating which goes first),
``--concurrency`` of them in flight at a time, and records each request's latency and the
round's requests/s. The
figures are the medians over the rounds of each round's p50, p99 and requests/s, each printed
with the median 1-minute load average of its rounds (figures taken on a loaded machine are
noise: compare aio and sync of the same run only). A request that fails is counted, not fatal.

Wait: with a real worker running the saga, ``--waits`` sagas are started and awaited
concurrently with ``aio.wait``; the delay of each is the time ``wait`` returned minus the
saga's ``updated_at_ms`` (the settle write, same machine clock). Target: median <= 20 ms.

    .venv/bin/python -m bench.async_start                              # Redis store
    .venv/bin/python -m bench.async_start --store postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python -m bench.async_start --store postgres     # CELERY_SAGAS_TEST_POSTGRES
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
import time
import uuid

import httpx

from bench.common import (
    RESULTS,
    ROOT,
    free_port,
    git_commit,
    machine,
    median,
    percentile,
    start_worker,
    wait_until,
    write_json,
)

_REDIS = os.environ.get("CELERY_SAGAS_TEST_REDIS", "redis://127.0.0.1:6379/15")
_BROKER = os.environ.get("CELERY_SAGAS_TEST_BROKER", "redis://127.0.0.1:6379/14")
_POSTGRES = os.environ.get("CELERY_SAGAS_TEST_POSTGRES",
                           "postgresql+psycopg://postgres@127.0.0.1:5432/test")
_STORES = {"redis": _REDIS, "postgres": _POSTGRES, "postgresql": _POSTGRES}


class _Connection:
    """One kept-alive HTTP/1.1 connection sending bodiless POSTs: a load generator lean enough
    not to be the bottleneck (httpx's async pool spent a whole core at 200 connections and
    capped both routes at about 70 requests/s)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def post(self, path: str) -> int:
        """POST ``path``; the response's status (its body read and dropped)."""
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n"
                          .encode())
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def _round(base: str, route: str, concurrency: int, requests: int) -> dict[str, float]:
    host, port = base.removeprefix("http://").split(":")
    connections = await asyncio.gather(*(_Connection.open(host, int(port))
                                         for _ in range(concurrency)))
    path, left, errors, latencies = f"/{route}", requests, 0, []

    async def one(connection: _Connection) -> float:
        nonlocal errors
        began = time.perf_counter()
        try:
            if await connection.post(path) != 200:
                errors += 1
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
            errors += 1
        return (time.perf_counter() - began) * 1000

    async def client(connection: _Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            latencies.append(await one(connection))

    try:
        # Untimed: a request on every connection first, so both sides are warm.
        await asyncio.gather(*(one(c) for c in connections))
        errors = 0
        began = time.perf_counter()
        await asyncio.gather(*(client(c) for c in connections))
        elapsed = time.perf_counter() - began
    finally:
        for connection in connections:
            connection.close()
    return {"p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "rps": (requests - errors) / elapsed, "errors": errors,
            "load": os.getloadavg()[0]}


def _serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench.async_app:web", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning", "--backlog", "2048",
             # a loaded machine can leave a kept-alive connection idle past uvicorn's 5 s
             "--timeout-keep-alive", "120"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/docs", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "uvicorn")
    return proc, base


async def _waits(n: int) -> list[float]:
    from bench.async_app import sagas

    aio = sagas.aio
    try:
        async def one(i: int) -> float:
            handle = await aio.start("async-bench", {"i": i}, saga_id=f"w-{uuid.uuid4().hex}")
            record = await handle.wait(timeout=120)
            returned = time.time() * 1000
            assert record.state == "completed", record.state
            return returned - record.updated_at_ms

        delays = []
        for batch in range(0, n, 10):  # ten at a time: a wait, not a queue, is measured
            delays += await asyncio.gather(*(one(i) for i in range(batch, min(n, batch + 10))))
        return delays
    finally:
        await aio.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="redis",
                        help="store URL, or redis (CELERY_SAGAS_TEST_REDIS) or postgres "
                             "(CELERY_SAGAS_TEST_POSTGRES); default redis")
    parser.add_argument("--broker", default=_BROKER, help="Redis broker URL")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000,
                        help="requests per round, --concurrency of them in flight at a time")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--waits", type=int, default=100)
    args = parser.parse_args()
    args.store = _STORES.get(args.store, args.store)
    prefix = "ab" + uuid.uuid4().hex[:8]
    env = {**os.environ, "ASYNC_BENCH_STORE": args.store, "ASYNC_BENCH_BROKER": args.broker,
           "ASYNC_BENCH_PREFIX": prefix, "ASYNC_BENCH_QUEUE": f"q-{prefix}", "PYTHONPATH": str(ROOT)}
    os.environ.update({k: v for k, v in env.items() if k.startswith("ASYNC_BENCH_")})
    tmp = Path(tempfile.mkdtemp(prefix="async-bench-"))
    server, base = _serve(env, tmp / "uvicorn.log")
    rounds: dict[str, list[dict[str, float]]] = {"aio": [], "sync": []}
    try:
        for r in range(args.rounds):
            order = ("aio", "sync") if r % 2 == 0 else ("sync", "aio")
            for route in order:
                rounds[route].append(asyncio.run(_round(base, route, args.concurrency, args.requests)))
                print(_line(f"round {r + 1} {route:4}", rounds[route][-1]), flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    env["ASYNC_BENCH_READY"] = str(tmp / "ready")
    worker = start_worker("bench.async_app", f"q-{prefix}", env, tmp / "worker.log",
                          tmp / "ready", concurrency=2)
    try:
        delays = asyncio.run(_waits(args.waits))
    finally:
        worker.stop()
        _wipe(args.store, prefix)
    summary = {side: {k: median(r[k] for r in runs) for k in ("p50_ms", "p99_ms", "rps", "load")}
               for side, runs in rounds.items()}
    for side, runs in rounds.items():
        summary[side]["errors"] = sum(r["errors"] for r in runs)
    summary["wait_delay_ms"] = {"median": median(delays), "p99": percentile(delays, 99)}
    load = os.getloadavg()[0]
    kind = args.store.split("://")[0]
    print(f"\nstore {kind}, {args.concurrency} concurrent requests, {args.requests} per round, "
          f"{args.rounds} rounds, "
          f"{os.cpu_count()} cpus")
    for side in ("aio", "sync"):
        print(_line(f"  {side:4}", summary[side]))
    ratios = [a["rps"] / s["rps"] for a, s in zip(rounds["aio"], rounds["sync"], strict=True) if s["rps"]]
    summary["aio_over_sync_rps"] = {"of_medians": summary["aio"]["rps"] / summary["sync"]["rps"],
                                    "median_of_round_pairs": median(ratios)}
    print(f"  aio/sync requests/s: {summary['aio_over_sync_rps']['of_medians']:.2f} "
          f"(median of the rounds' pairs {summary['aio_over_sync_rps']['median_of_round_pairs']:.2f})")
    print(f"  aio.wait after the saga ended: median {summary['wait_delay_ms']['median']:.1f} ms, "
          f"p99 {summary['wait_delay_ms']['p99']:.1f} ms (target: median <= 20 ms)  "
          f"load {load:.2f}")
    write_json(RESULTS / f"async_start_{kind.split('+')[0]}.json",
               {"machine": machine(), "commit": git_commit(), "args": vars(args),
                "rounds": rounds, "summary": summary, "load_end": load})
    return 0


def _line(label: str, figures: dict[str, float]) -> str:
    errors = f"  {figures['errors']:.0f} failed" if figures.get("errors") else ""
    return (f"{label}: p50 {figures['p50_ms']:7.1f} ms  p99 {figures['p99_ms']:7.1f} ms  "
            f"{figures['rps']:6.1f} requests/s  load {figures['load']:.2f}{errors}")


def _wipe(store: str, prefix: str) -> None:
    if store.startswith(("redis://", "rediss://")):
        from redis import Redis

        client = Redis.from_url(store)
        keys = list(client.scan_iter(match=f"{{{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        return
    from celery_sagas.stores.sql.store import SqlStore

    SqlStore.from_url(store, table_prefix=f"{prefix}_").drop_tables()


if __name__ == "__main__":
    raise SystemExit(main())
