"""Saga throughput against bare Celery chains, measured in the same run (issue 8).

For each store (Redis, PostgreSQL) one real prefork worker (2 processes, ``acks_late``,
prefetch 1, Redis broker) serves both sides of the comparison:

- a saga of ``--steps`` no-op steps (``bench-N``, default 3; ``--body-ms`` each; ``--inline``
  for ``@sagas.saga(inline=True)``), started with ``start()``; it is done when the
  store shows it ``completed`` (finish time = the record's ``updated_at_ms``);
- a bare chain of three plain tasks, the last recording its finish time in Redis, sent with
  ``apply_async`` (``--baseline old``: the pre-issue-13 chain of four tasks, a fourth only to
  record the finish; ``--baseline both`` measures both against the same sagas).

Throughput is measured in rounds that alternate which side goes first (the machine is noisy);
each batch is submitted as fast as the client can and timed from its first submission to its
last finish. The reported figures are the medians over the rounds, and the ratio is the median
of the per-round saga/chain ratios. Latency (start call to finish) is measured one at a time
(closed loop, sagas and chains alternating), so it is the path's latency, not queueing.

Round trips: a second worker whose store is wrapped in a counting proxy runs a batch of sagas;
the proxy counts store primitives per process (and SQL statements on a SQL store); on Redis a
private ``redis-server`` holds that batch's store so ``INFO commandstats`` gives the wire count.

Tracing (docs/tracing.md): ``--tracing off`` (the default) runs with whatever OpenTelemetry the
venv has and no tracer provider: the cost of the hooks alone (run it in a venv without the
``otel`` extra for the no-API figure); ``--tracing sdk`` gives the client and every pool process
the SDK's tracer provider (``OTEL_PYTHON_TRACER_PROVIDER=sdk_tracer_provider``), so each saga
records its spans (not exported) while the plain chains record none.

Modes: ``--memory`` (worker RSS over 20,000 sagas) and ``--profile`` (py-spy on the pool during
a saga batch and a chain batch). Results go to ``bench/results/*.json``.

    .venv/bin/python -m bench.throughput                 # both stores, N=2000
    .venv/bin/python -m bench.throughput --n 500 --stores redis
    .venv/bin/python -m bench.throughput --memory        # 20,000 sagas, Redis store
    .venv/bin/python -m bench.throughput --profile       # py-spy, both stores
    .venv/bin/python -m bench.throughput --tracing sdk   # sagas recording their spans
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from redis import Redis

from bench.bench_app import Bench, BenchConfig, build, chain_of
from bench.common import (
    RESULTS,
    Progress,
    Worker,
    free_port,
    git_commit,
    machine,
    median,
    percentile,
    profile_summary,
    rss_kib,
    start_py_spy,
    start_worker,
    stop_py_spy,
    wait_until,
    write_json,
)
from celery_sagas._records import SAGA, SagaState

STORES = {
    "redis": "redis://127.0.0.1:6379/13",
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
}
BROKER = "redis://127.0.0.1:6379/12"


# ---------------------------------------------------------------------- one store's stack


@dataclass
class Stack:
    """A worker and the client-side app for one store configuration."""

    config: BenchConfig
    bench: Bench
    worker: Worker
    marks: Redis
    label: str
    tags: list[str] = field(default_factory=list)

    def tag(self, kind: str) -> str:
        """A fresh id prefix for one batch."""
        tag = f"{self.config.prefix}-{kind}{len(self.tags)}"
        self.tags.append(tag)
        return tag


@contextlib.contextmanager
def stack(config: BenchConfig, workdir: Path, label: str, loglevel: str,
          concurrency: int = 2) -> Iterator[Stack]:
    """Start a worker for ``config``, build the client app, clean everything up afterwards."""
    ready = workdir / f"ready-{config.queue}"
    config = replace(config, ready=ready)
    bench = build(config)
    worker = start_worker("bench.bench_app", config.queue, config.environ(),
                          workdir / f"worker-{config.queue}.log", ready, concurrency=concurrency,
                          loglevel=loglevel)
    built = Stack(config, bench, worker, Redis.from_url(config.marks), label)
    try:
        yield built
    finally:
        worker.stop()
        _cleanup(built)


def _cleanup(built: Stack) -> None:
    store: Any = built.bench.sagas.store
    inner = getattr(store, "inner", store)
    if hasattr(inner, "drop_tables"):
        inner.drop_tables()
    elif hasattr(inner, "layout"):
        client = Redis.from_url(built.config.store)
        for batch in _chunks(list(client.scan_iter(match=inner.layout.pattern(), count=1000)), 1000):
            client.delete(*batch)
        client.close()
    store.close()
    for tag in built.tags:
        built.marks.delete(f"bench:marks:{tag}")
    built.marks.close()
    # kombu's queue_delete only knows the bindings its own channel declared: delete the keys
    queue = built.config.queue
    with Redis.from_url(built.config.broker) as broker:
        broker.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# ---------------------------------------------------------------------- batches


@dataclass
class Batch:
    """One timed batch: when each item was submitted and when it finished (ms since the epoch)."""

    kind: str
    submitted: list[float]
    finished: list[float]

    @property
    def seconds(self) -> float:
        """First submission to last finish."""
        return (max(self.finished) - self.submitted[0]) / 1000

    @property
    def rate(self) -> float:
        """Items per second."""
        return len(self.finished) / self.seconds

    def latencies(self) -> list[float]:
        """Finish minus submission, per item (ms)."""
        return [f - s for s, f in zip(self.submitted, self.finished, strict=True)]


def _now_ms() -> float:
    return time.time() * 1000


def saga_batch(st: Stack, n: int, progress: Progress, poll: str = "scan") -> Batch:
    """Start ``n`` sagas as fast as possible and wait until none is running.

    ``poll="count"`` waits with ``Store.count`` only (ZCOUNT on Redis, which no store script
    calls, so the wire count can leave the client's polling out) and reads no finish times.
    """
    tag = st.tag("s")
    sagas = st.bench.sagas
    submitted: list[float] = []
    for i in range(n):
        submitted.append(_now_ms())
        st.bench.saga.start({"i": i}, saga_id=f"{tag}-{i}")
        progress.show(f"[{st.label}] sagas: submitted {i + 1}/{n}")
    store = sagas.store
    deadline = time.monotonic() + max(120.0, n / 5)
    if poll == "count":
        while store.count(SAGA, [SagaState.RUNNING.value]):
            _check(st, deadline, "sagas")
            time.sleep(0.05)
        progress.done()
        return Batch("saga", submitted, submitted)
    if poll == "scan":
        while store.scan(SAGA, [SagaState.RUNNING.value], limit=1).items:
            _check(st, deadline, "sagas")
            if progress.due():
                left = len(store.scan(SAGA, [SagaState.RUNNING.value], limit=1000).items)
                progress.show(f"[{st.label}] sagas: {n - left if left < 1000 else '<' + str(n - 999)}"
                              f"/{n} done")
            time.sleep(0.02)
    finished: list[float] = []
    for i in range(n):
        while True:
            record = sagas.get(f"{tag}-{i}")
            if record is not None and record.state is not SagaState.RUNNING:
                break
            _check(st, deadline, "sagas")
            time.sleep(0.05)
        if record.state is not SagaState.COMPLETED:
            raise RuntimeError(f"saga {tag}-{i} ended {record.state}: {record.error_code} {record.reason}")
        finished.append(float(record.updated_at_ms))
    progress.done()
    return Batch("saga", submitted, finished)


def chain_batch(st: Stack, n: int, progress: Progress, baseline: str = "new") -> Batch:
    """Send ``n`` chains as fast as possible and wait until every last link recorded its finish."""
    tag = st.tag("c")
    key = f"bench:marks:{tag}"
    submitted: list[float] = []
    for i in range(n):
        submitted.append(_now_ms())
        chain_of(st.bench, key, i, baseline).apply_async()
        progress.show(f"[{st.label}] chains ({baseline}): submitted {i + 1}/{n}")
    deadline = time.monotonic() + max(120.0, n / 5)
    while (done := int(st.marks.hlen(key))) < n:
        _check(st, deadline, "chains")
        progress.show(f"[{st.label}] chains: {done}/{n} done")
        time.sleep(0.02)
    marks = st.marks.hgetall(key)
    progress.done()
    return Batch(f"chain-{baseline}", submitted, [float(marks[str(i).encode()]) for i in range(n)])


def _check(st: Stack, deadline: float, what: str) -> None:
    if st.worker.proc.poll() is not None:
        raise RuntimeError(f"worker died during {what}:\n{st.worker.text()[-3000:]}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what} did not finish; worker log:\n{st.worker.text()[-3000:]}")


def closed_loop_latency(st: Stack, n: int, progress: Progress) -> dict[str, list[float]]:
    """Start-to-finish latency one at a time, sagas and chains alternating (ms)."""
    tag = st.tag("l")
    key = f"bench:marks:{tag}"
    found: dict[str, list[float]] = {"saga": [], "chain": []}
    for i in range(n):
        deadline = time.monotonic() + 30
        begun = _now_ms()
        st.bench.saga.start({"i": i}, saga_id=f"{tag}-{i}")
        while (record := st.bench.sagas.get(f"{tag}-{i}")) is None or record.state is SagaState.RUNNING:
            _check(st, deadline, "a saga")
            time.sleep(0.002)
        found["saga"].append(record.updated_at_ms - begun)
        begun = _now_ms()
        chain_of(st.bench, key, i).apply_async()
        while (mark := st.marks.hget(key, str(i))) is None:
            _check(st, deadline, "a chain")
            time.sleep(0.002)
        found["chain"].append(float(mark) - begun)
        progress.show(f"[{st.label}] latency: {i + 1}/{n}")
    progress.done()
    return found


def _figures(latencies: list[float]) -> dict[str, float]:
    return {
        "n": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


# ---------------------------------------------------------------------- throughput


def measure(st: Stack, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Warm up, run the alternating rounds, then the closed-loop latency phase."""
    saga_batch(st, args.warmup, progress)
    for baseline in args.baselines:
        chain_batch(st, args.warmup, progress, baseline)
    per_round = max(1, args.n // args.rounds)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        kinds = ["saga", *args.baselines]
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # each side goes first in turn
        got = {kind: saga_batch(st, per_round, progress) if kind == "saga"
               else chain_batch(st, per_round, progress, kind) for kind in order}
        saga = got["saga"]
        row: dict[str, Any] = {
            "round": r + 1, "first": order[0], "n": per_round,
            "sagas_per_s": round(saga.rate, 1),
            "loadavg_1min": round(os.getloadavg()[0], 2),
            "saga_batch_latency": _figures(saga.latencies()),
        }
        for baseline in args.baselines:
            chain = got[baseline]
            row[f"chains_{baseline}_per_s"] = round(chain.rate, 1)
            row[f"ratio_{baseline}"] = round(saga.rate / chain.rate, 3)
            row[f"chain_{baseline}_batch_latency"] = _figures(chain.latencies())
        rounds.append(row)
        ratios = ", ".join(f"chains ({b}) {row[f'chains_{b}_per_s']}/s ratio {row[f'ratio_{b}']}"
                           for b in args.baselines)
        print(f"[{st.label}] round {r + 1}/{args.rounds} ({order[0]} first, load "
              f"{row['loadavg_1min']}): sagas {row['sagas_per_s']}/s, {ratios}", flush=True)
    latency = closed_loop_latency(st, args.latency_n, progress)
    result: dict[str, Any] = {
        "store": st.label,
        "n_per_round": per_round,
        "rounds": rounds,
        "sagas_per_s": round(median(r["sagas_per_s"] for r in rounds), 1),
        "latency": {kind: _figures(values) for kind, values in latency.items()},
        "loadavg_1min_max": max(r["loadavg_1min"] for r in rounds),
    }
    for baseline in args.baselines:
        result[f"chains_{baseline}_per_s"] = round(median(r[f"chains_{baseline}_per_s"] for r in rounds), 1)
        result[f"ratio_{baseline}"] = round(median(r[f"ratio_{baseline}"] for r in rounds), 3)
    return result


# ---------------------------------------------------------------------- round trips


@contextlib.contextmanager
def private_redis(workdir: Path) -> Iterator[str]:
    """A throw-away ``redis-server`` on a free port (its commandstats count only our calls)."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: _pings(url), 20, "private redis-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _pings(url: str) -> bool:
    try:
        with Redis.from_url(url) as client:
            return bool(client.ping())
    except Exception:
        return False


def _commandstats(url: str) -> dict[str, int]:
    with Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def count_round_trips(config: BenchConfig, args: argparse.Namespace, workdir: Path, label: str,
                      progress: Progress) -> dict[str, Any]:
    """Run sagas on a fresh counting worker; store calls per saga and per step, by primitive.

    No warm-up: the counts cover whole processes, so one-off costs (loading a Lua script, opening
    a connection) are included, spread over ``--count-n`` sagas.
    """
    count_dir = workdir / f"counts-{config.queue}"
    count_dir.mkdir()
    with contextlib.ExitStack() as stack_:
        if config.is_redis:
            config = replace(config, store=stack_.enter_context(private_redis(workdir)))
        config = replace(config, count_dir=count_dir, queue=config.queue + "-count")
        st = stack_.enter_context(stack(config, workdir, label + "/count", args.loglevel))
        assert st.bench.counting is not None
        client_counts = st.bench.counting
        client_counts.sink = None  # the client's polling is not the saga's cost
        client_counts.counts.clear()
        if config.is_redis:
            with Redis.from_url(config.store) as server:
                server.config_resetstat()
        batch = saga_batch(st, args.count_n, progress, poll="count")
        after = _commandstats(config.store) if config.is_redis else {}
        client = dict(client_counts.counts)
        st.worker.stop()
        worker = _sum_counts(count_dir)
    n = len(batch.finished)
    by_primitive = {k: v for k, v in worker.items() if k != "sql_statements"}
    by_primitive["create"] = by_primitive.get("create", 0) + client.get("create", 0)
    calls = sum(v for k, v in by_primitive.items() if k != "compare_and_set_refused")
    result: dict[str, Any] = {
        "sagas": n,
        "steps_per_saga": args.steps,
        "store_calls_per_saga": round(calls / n, 2),
        "store_calls_per_step": round(calls / n / args.steps, 2),
        "store_calls_per_step_after_start": round((calls - client.get("create", 0)) / n / args.steps, 2),
        # each step after the first: its settle (inline: which also claims the step after
        # it) and, on the default path, its claim; start()'s create and step 1's claim and
        # settle left out (docs/performance.md, "Inline steps")
        "store_calls_per_step_after_first": round(
            (calls - client.get("create", 0) - 2 * n) / n / (args.steps - 1), 2)
        if args.steps > 1 else None,
        "by_primitive_per_saga": {k: round(v / n, 2) for k, v in sorted(by_primitive.items())},
        "note": "create is the client's start(); every other call is the worker's",
    }
    if "sql_statements" in worker:
        statements = worker["sql_statements"] + client.get("create", 0)
        result["sql_statements_per_saga"] = round(statements / n, 2)
        result["sql_statements_per_step"] = round(statements / n / args.steps, 2)
        result["sql_statements_per_step_after_start"] = round(
            worker["sql_statements"] / n / args.steps, 2)
    if after:
        inside = _script_commands()
        client_only = ("info", "config|resetstat", "zcount")  # reading the stats, the polling
        wire = {k: v for k, v in after.items() if k not in inside and k not in client_only}
        total = sum(wire.values())
        result["redis_commands_per_saga"] = {k: round(v / n, 3) for k, v in sorted(wire.items()) if v}
        result["redis_commands_in_scripts_per_saga"] = {
            k: round(v / n, 2) for k, v in sorted(after.items()) if k in inside}
        result["redis_round_trips_per_saga"] = round(total / n, 2)
        result["redis_round_trips_per_step"] = round(total / n / args.steps, 2)
        # start()'s create is the client's one round trip per saga; the rest is per step
        result["redis_round_trips_per_step_after_start"] = round(
            (total - client.get("create", 0)) / n / args.steps, 2)
    return result


def _script_commands() -> set[str]:
    """Commands the store's Lua scripts call (commandstats counts those too; they are no round trip)."""
    found: set[str] = set()
    for entry in resources.files("celery_sagas.stores.redis").joinpath("lua").iterdir():
        if entry.name.endswith(".lua"):
            text = entry.read_text("utf-8")
            found.update(m.lower() for m in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", text))
    return found


def _sum_counts(directory: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for path in directory.glob("*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + int(value)
    return total


# ---------------------------------------------------------------------- memory


def memory_run(st: Stack, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """RSS of the pool processes after a warm-up and after ``args.memory_n`` more sagas."""
    saga_batch(st, args.memory_warmup, progress)
    children = st.worker.children()
    start = {pid: rss_kib(pid) for pid in children}
    samples = [{"sagas": 0, "rss_kib": dict(start)}]
    print(f"[{st.label}] after warm-up ({args.memory_warmup} sagas): pool RSS {start} KiB", flush=True)
    done = 0
    while done < args.memory_n:
        n = min(args.memory_batch, args.memory_n - done)
        saga_batch(st, n, progress)
        done += n
        sample = {pid: rss_kib(pid) for pid in children}
        samples.append({"sagas": done, "rss_kib": sample})
        print(f"[{st.label}] {done}/{args.memory_n} sagas: pool RSS {sample} KiB", flush=True)
    if st.worker.children() != children:
        raise RuntimeError("a pool process was replaced during the memory run")
    end = samples[-1]["rss_kib"]
    growth = {str(pid): round(100 * (end[pid] - start[pid]) / start[pid], 2) for pid in children}
    total = round(100 * (sum(end.values()) - sum(start.values())) / sum(start.values()), 2)
    return {
        "store": st.label, "warmup_sagas": args.memory_warmup, "sagas": args.memory_n,
        "rss_after_warmup_kib": {str(k): v for k, v in start.items()},
        "rss_end_kib": {str(k): v for k, v in end.items()},
        "growth_percent": growth, "total_growth_percent": total,
        "samples": [{"sagas": s["sagas"], "rss_kib": {str(k): v for k, v in s["rss_kib"].items()}}
                    for s in samples],
    }


# ---------------------------------------------------------------------- profile


def profile_run(st: Stack, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """py-spy on the worker (main + pool) during one saga batch and one chain batch."""
    saga_batch(st, args.warmup, progress)
    chain_batch(st, args.warmup, progress)
    out: dict[str, Any] = {"store": st.label}
    for kind in ("saga", "chain"):
        safe = st.label.replace("/", "-")
        roles = {st.worker.pid: "main", **{pid: "pool" for pid in st.worker.children()}}
        spy = start_py_spy(roles, RESULTS / f"profile-{safe}-{kind}", rate=args.profile_rate)
        try:
            batch = (saga_batch if kind == "saga" else chain_batch)(st, args.profile_n, progress)
        finally:
            stop_py_spy(spy)
        summary = profile_summary(spy, args.profile_rate, items=len(batch.finished))
        summary["rate_per_s_under_py_spy"] = round(batch.rate, 1)
        out[kind] = summary
        print(f"[{st.label}] profiled {kind}s: {summary['task_ms_per_item']} ms of pool task time "
              f"per {kind} ({batch.rate:.0f}/s under py-spy)", flush=True)
        for row in summary["top_inclusive"][:12]:
            print(f"    {row['percent_of_task']:>5}%  {row['frame']}")
    return out


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="sagas (and chains) per store, over all rounds")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds (medians reported)")
    parser.add_argument("--warmup", type=int, default=100, help="sagas and chains run before measuring")
    parser.add_argument("--latency-n", type=int, default=200, help="closed-loop latency samples of each")
    parser.add_argument("--count-n", type=int, default=200, help="sagas run on the counting worker (0: skip)")
    parser.add_argument("--stores", default="redis,postgres", help="comma-separated: redis, postgres")
    parser.add_argument("--steps", type=int, default=3, help="steps per saga (and tasks per chain)")
    parser.add_argument("--body-ms", type=int, default=0,
                        help="each step body and chain task sleeps this long, as an I/O call would")
    parser.add_argument("--inline", action="store_true",
                        help="the saga runs its steps inline (@sagas.saga(inline=True))")
    parser.add_argument("--concurrency", default="2",
                        help="worker processes, comma-separated to measure several (e.g. 2,4,8)")
    parser.add_argument("--redis-store", default=STORES["redis"])
    parser.add_argument("--postgres-store", default=STORES["postgres"])
    parser.add_argument("--broker", default=BROKER, help="broker URL (chain marks go to the same Redis)")
    parser.add_argument("--loglevel", default="WARNING", help="worker log level")
    parser.add_argument("--baseline", choices=("new", "old", "both"), default="new",
                        help="chain baseline: new (as many tasks as the saga has steps, the last "
                             "recording the finish), old (a fourth task records it), or both")
    parser.add_argument("--tracing", choices=("off", "sdk"), default="off",
                        help="sdk: the OpenTelemetry SDK tracer provider in client and workers")
    parser.add_argument("--memory", action="store_true", help="memory mode: RSS over --memory-n sagas")
    parser.add_argument("--memory-n", type=int, default=20_000)
    parser.add_argument("--memory-warmup", type=int, default=1000)
    parser.add_argument("--memory-batch", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="profile mode: py-spy on the worker")
    parser.add_argument("--profile-n", type=int, default=1000)
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--output", type=Path, default=None, help="JSON file (default bench/results/…)")
    args = parser.parse_args(argv)
    args.baselines = ["new", "old"] if args.baseline == "both" else [args.baseline]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark the options ask for; print a summary and write the JSON."""
    args = parse_args(argv)
    if not args.broker.startswith("redis"):
        raise SystemExit("--broker must be a Redis URL (the chain marks live there)")
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(stores) - set(STORES)
    if unknown:
        raise SystemExit(f"unknown store(s): {', '.join(sorted(unknown))}")
    urls = {"redis": args.redis_store, "postgres": args.postgres_store}
    if args.tracing == "sdk":  # read by the OpenTelemetry API here and in the workers it starts
        os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    run_id = uuid.uuid4().hex[:8]
    progress = Progress()
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    report: dict[str, Any] = {
        "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(), "options": {k: str(v) for k, v in vars(args).items()},
        "worker": {"pool": "prefork", "concurrency": args.concurrency, "acks_late": True,
                   "prefetch_multiplier": 1,
                   "broker": args.broker, "loglevel": args.loglevel},
    }
    mode = "memory" if args.memory else "profile" if args.profile else "throughput"
    suffix = "-tracing" if args.tracing == "sdk" else ""
    output = args.output or RESULTS / f"{mode}{suffix}.json"
    try:
        runs = []
        for name in stores:
            for concurrency in [int(c) for c in str(args.concurrency).split(",")]:
                prefix = f"b{run_id}{len(runs)}"
                config = BenchConfig(broker=args.broker, store=urls[name], prefix=prefix,
                                     queue=f"bench-{prefix}", marks=args.broker, steps=args.steps,
                                     body_ms=args.body_ms, inline=args.inline)
                label = name if "," not in str(args.concurrency) else f"{name}/c{concurrency}"
                run = _run_one(config, label, mode, args, workdir, progress, concurrency)
                run["concurrency"] = concurrency
                runs.append(run)
        report["runs"] = runs
        report["loadavg_end"] = os.getloadavg()
        if mode == "throughput":
            _print_table(runs, args.baselines)
            if "," in str(args.concurrency):
                report["best_of_concurrencies"] = _print_best(runs, stores, args.baselines[0])
        write_json(output, report)
        print(f"wrote {output}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _run_one(config: BenchConfig, label: str, mode: str, args: argparse.Namespace, workdir: Path,
             progress: Progress, concurrency: int = 2) -> dict[str, Any]:
    with stack(config, workdir, label, args.loglevel, concurrency) as st:
        if mode == "memory":
            return memory_run(st, args, progress)
        if mode == "profile":
            return profile_run(st, args, progress)
        result = measure(st, args, progress)
    if args.count_n > 0:
        result["round_trips"] = count_round_trips(config, args, workdir, label, progress)
    return result


def _print_best(runs: list[dict[str, Any]], stores: list[str], baseline: str) -> dict[str, Any]:
    """Per store, the best saga rate and the best chain rate over the concurrencies measured
    (each at the concurrency that suits it, as a user would pick), and their ratio."""
    best: dict[str, Any] = {}
    for name in stores:
        mine = [r for r in runs if r["store"].split("/")[0] == name]
        saga = max(mine, key=lambda r: r["sagas_per_s"])
        chain = max(mine, key=lambda r: r[f"chains_{baseline}_per_s"])
        rates = (saga["sagas_per_s"], chain[f"chains_{baseline}_per_s"])
        best[name] = {"sagas_per_s": rates[0], "saga_concurrency": saga["concurrency"],
                      "chains_per_s": rates[1], "chain_concurrency": chain["concurrency"],
                      "ratio": round(rates[0] / rates[1], 2) if rates[1] else None}
        print(f"best of each, {name}: {rates[0]} sagas/s (c{saga['concurrency']}), {rates[1]} "
              f"chains/s (c{chain['concurrency']}), ratio {best[name]['ratio']}")
    return best


def _print_table(runs: list[dict[str, Any]], baselines: list[str]) -> None:
    head = f"{'store':<10}{'sagas/s':>9}"
    for baseline in baselines:
        head += f"{'chains/s ' + baseline:>14}{'ratio':>7}"
    head += f"{'saga p50':>10}{'p99':>8}{'chain p50':>11}{'p99':>8}"
    head += f"{'calls/step':>12}{'after 1st':>11}{'RT/step':>9}{'load':>6}"
    print(head)
    print("-" * len(head))
    for run in runs:
        lat, trips = run["latency"], run.get("round_trips", {})
        wire = trips.get("redis_round_trips_per_step", trips.get("sql_statements_per_step", "-"))
        line = f"{run['store']:<10}{run['sagas_per_s']:>9}"
        for baseline in baselines:
            line += f"{run[f'chains_{baseline}_per_s']:>14}{run[f'ratio_{baseline}']:>7}"
        line += (f"{lat['saga']['p50_ms']:>10}{lat['saga']['p99_ms']:>8}"
                 f"{lat['chain']['p50_ms']:>11}{lat['chain']['p99_ms']:>8}"
                 f"{trips.get('store_calls_per_step', '-'):>12}"
                 f"{trips.get('store_calls_per_step_after_first', '-'):>11}"
                 f"{wire:>9}{run['loadavg_1min_max']:>6}")
        print(line)
    print("latencies in ms (closed loop, one at a time, the new chain); calls = store primitives, "
          "RT = wire round trips (both per step, start()'s create included); after 1st = store "
          "calls per step after the first step (inline target: 1.0); load = the highest "
          "1-minute load average of the rounds")


if __name__ == "__main__":
    sys.exit(main())
