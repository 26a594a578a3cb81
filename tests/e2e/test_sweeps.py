"""Reconciliation sweeps under fenced bucket leases, on Redis and PostgreSQL (docs/design.md §5).

- two real ``celery beat`` processes and two workers: sweeps of one bucket never overlap, its
  fences only grow;
- a sweeper SIGSTOPped past its lease loses it, the next holder of that bucket continues from
  the checkpointed cursor, and the paused sweeper's writes after SIGCONT are refused;
- a sweeper SIGKILLed mid-sweep, holding its bucket's lease for another minute, has the lease
  taken over at once by a worker's sweep: a lost message in that bucket is re-sent within 10 s;
- a corrupt record is reported by the sweep and does not stop it;
- 10,000 stale sagas are all found across pages exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_sagas._codec import Codec
from celery_sagas._engine import Engine
from celery_sagas._leases import Leases
from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState
from celery_sagas._scans import RecordPage, Scans
from celery_sagas._sweep import SWEEP_LEASE, Pass, SweepReport
from celery_sagas.stores.base import Fence, Lease, Store
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.dispatcher import RecordingDispatcher
from tests import processes
from tests.e2e.conftest import REDIS_BROKER, ROOT, Stack, _make_stack, wait_until
from tests.e2e.sweep_app import (
    HOUR_MS,
    bulk_create,
    destroy,
    due_compensation,
    engine_on,
    read_trace,
    stale_saga,
    store_for,
    sweeper_of,
    waiting_saga,
)

pytestmark = pytest.mark.e2e

STALE_MS = 60_000  # seeded sagas are an hour old; sagas a sweep re-drove never turn stale again


@dataclass
class Backend:
    """A real store under a fresh prefix, and what a subprocess needs to open it again."""

    name: str
    url: str
    prefix: str
    store: Store

    def engine(self, dispatcher: RecordingDispatcher | None = None,
               clock: FrozenClock | None = None) -> Engine:
        """An engine on this store with the sweep test saga registered."""
        return engine_on(self.store, dispatcher or RecordingDispatcher(), stale_ms=STALE_MS,
                         clock=clock)

    def saga(self, saga_id: str) -> SagaRecord:
        """The stored saga."""
        return Codec().saga(self.store.get("saga", saga_id), saga_id)

    def ids_in_one_bucket(self, prefix: str, count: int, bucket: int = 0) -> list[str]:
        """``count`` saga ids that all fall in ``bucket`` (one lease covers them all)."""
        found: list[str] = []
        n = 0
        while len(found) < count:
            candidate = f"{prefix}{n:05d}"
            if self.store.bucket_of(candidate) == bucket:
                found.append(candidate)
            n += 1
        return found


@pytest.fixture(params=["redis", "redis_cluster", "postgres"])
def backend(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[Backend]:
    """Redis, Redis Cluster and PostgreSQL stores under a unique prefix, removed afterwards."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    store = store_for(url, unique_prefix)
    try:
        yield Backend(request.param, url, unique_prefix, store)
    finally:
        destroy(store)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _seed(store: Store, records: list[SagaRecord]) -> None:
    for record in records:
        assert store.create(Codec().saga_envelope(record))


# ---------------------------------------------------------------- every stale saga exactly once


def _counting_pass(seen: Counter[str]) -> Any:
    """An extra pass that walks the stale running sagas again and counts every id it is given."""

    def make(engine: Engine, scans: Scans, now: int) -> Pass[SagaRecord]:
        def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
            return scans.sagas([SagaState.RUNNING], updated_before_ms=now - STALE_MS, bucket=bucket,
                               cursor=cursor, limit=limit)

        def act(record: SagaRecord, fence: Fence, report: SweepReport) -> None:
            seen[record.saga_id] += 1

        return Pass("count", fetch, act)

    return make


@pytest.mark.slow
def test_ten_thousand_stale_sagas_are_each_found_exactly_once_across_pages(backend: Backend) -> None:
    # given: 10,000 stale sagas, 200 of them per millisecond (ties split across pages)
    now = _now_ms()
    ids = [f"s{n:05d}" for n in range(10_000)]
    bulk_create(backend.store, [waiting_saga(i, n, now - HOUR_MS + n // 200) for n, i in enumerate(ids)])
    engine = backend.engine()
    seen: Counter[str] = Counter()

    # when
    report = sweeper_of(engine, "sweeper", lease_ms=60_000, page_size=97,
                        extra_passes=[_counting_pass(seen)]).sweep()

    # then
    assert report.complete and report.errors == 0 and report.corrupt == []
    assert set(seen) == set(ids) and set(seen.values()) == {1}
    assert report.examined == 2 * len(ids)  # the running pass and the counting pass
    # each reported once too (and its effect, started an hour ago, as ambiguous)
    assert sorted(f.record_id for f in report.findings if f.record_kind == "saga") == ids
    effects = [f.effect_id for f in report.findings if f.record_kind == "effect"]
    assert sorted(effects) == sorted(f"{i}-e" for i in ids)


# ---------------------------------------------------------------- corrupt records


def _corrupt(backend: Backend, saga_id: str, how: str) -> None:
    """Write garbage under a saga's key or row, bypassing the store."""
    store: Any = backend.store
    if backend.name.startswith("redis"):
        key = store.layout.record("saga", saga_id)
        if how == "body":
            store._client.hset(key, "body", "{not json")
        elif how == "type":
            store._client.delete(key)
            store._client.set(key, "garbage")
        else:  # the record vanished, its index entry stayed
            store._client.delete(key)
        return
    table = f"{store.table_prefix}envelopes"
    change = {"body": "body = '{not json'", "type": "version = 0", "gone": "body = '[]'"}[how]
    with store.engine.begin() as connection:
        connection.execute(text(f"UPDATE {table} SET {change} WHERE kind = 'saga' AND id = :id"),
                           {"id": saga_id})


def test_a_corrupt_record_is_reported_and_the_sweep_repairs_the_others(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # given: 30 stale sagas whose first step's message was lost, three overwritten with garbage
    now = _now_ms()
    ids = [f"c{n:02d}" for n in range(30)]
    _seed(backend.store, [stale_saga(i, n, now - HOUR_MS + n) for n, i in enumerate(ids)])
    broken = {"c03": "body", "c14": "type", "c25": "gone"}
    for saga_id, how in broken.items():
        _corrupt(backend, saga_id, how)
    dispatcher = RecordingDispatcher()

    # when
    with caplog.at_level(logging.ERROR):
        report = sweeper_of(backend.engine(dispatcher), "sweeper", lease_ms=30_000, page_size=4).sweep()

    # then: reported (report and log), and every good saga re-driven once
    assert sorted(c.id for c in report.corrupt) == sorted(broken)
    assert report.complete and report.errors == 0
    logged = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert sorted(re.findall(r"\b(c\d\d)\b", " ".join(logged))) == sorted(broken)
    good = [i for i in ids if i not in broken]
    assert sorted(s.saga_id for s in dispatcher.sent if s.kind == "step") == good
    assert all(len(backend.saga(i).steps) == 1 for i in good)


# ---------------------------------------------------------------- regressions


def test_a_checkpoint_this_version_cannot_read_restarts_its_pass_instead_of_jamming_every_sweep(
    backend: Backend,
) -> None:
    # given: a checkpoint left by another layout (say another bucket count or pass order)
    now = _now_ms()
    ids = [f"k{n}" for n in range(5)]
    _seed(backend.store, [stale_saga(i, n, now - HOUR_MS + n) for n, i in enumerate(ids)])
    engine = backend.engine()
    old = Leases(backend.store, engine.clock, owner="older-version").acquire(SWEEP_LEASE, 30_000)
    assert old is not None
    Leases(backend.store, engine.clock, owner="older-version").checkpoint(old, "1:bm90LWEtY3Vyc29y")
    assert backend.store.release_lease(old)

    # when
    first = sweeper_of(engine, "sweeper", lease_ms=30_000).sweep()
    second = sweeper_of(engine, "sweeper", lease_ms=30_000).sweep()

    # then: the pass it pointed into was walked from the top, and sweeping goes on
    assert first.complete and second.complete
    assert all(len(backend.saga(i).steps) == 1 for i in ids)


def test_a_sweeper_whose_lease_moved_on_cannot_write_to_its_bucket(backend: Backend) -> None:
    # given: two due compensation retries in one bucket; sweeper A handles one page of one record
    clock = FrozenClock(_now_ms())
    now = clock.now_ms()
    ids = backend.ids_in_one_bucket("u", 2)
    _seed(backend.store, [due_compensation(saga_id, n, now - HOUR_MS) for n, saga_id in enumerate(ids)])
    engine = backend.engine(clock=clock)

    def taken_over_after_the_first_page(lease: Lease, report: SweepReport) -> None:
        if report.pages == 1:
            clock.advance(1_001)  # A pauses past its lease; B is granted the bucket's next fence
            assert Leases(backend.store, clock, owner="b").acquire(SWEEP_LEASE, 60_000, bucket=0)

    # when
    report = sweeper_of(engine, "a", lease_ms=1_000, page_size=1,
                        on_page=taken_over_after_the_first_page).sweep()

    # then: A stopped at its first write under the old fence; the second retry is still due
    assert report.lease_lost
    attempts = sorted(backend.saga(i).steps[0].compensation_attempts for i in ids)
    assert attempts == [1, 2]


# ---------------------------------------------------------------- a paused sweeper is fenced out


@dataclass
class Sweeper:
    """A standalone sweeper subprocess and its files."""

    owner: str
    proc: subprocess.Popen[str]
    trace: Path
    marker: Path
    go: Path

    def report(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for it to exit; its printed report."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-3000:]
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def events(self, op: str | None = None) -> list[dict[str, Any]]:
        """Its trace (of one op)."""
        return [e for e in read_trace(self.trace) if op in (None, e["op"])]


def _start_sweeper(backend: Backend, tmp: Path, name: str, *, lease_ms: int, pause_at: int,
                   page_size: int, owner: str | None = "", timeout: float = 300.0) -> Sweeper:
    """A standalone sweeper named ``name``; its lease owner is ``name`` unless ``owner`` is
    None (its claimer id, as a worker's)."""
    files = [tmp / f"{name}.{suffix}" for suffix in ("trace", "marker", "go")]
    args = ["--store", backend.url, "--prefix", backend.prefix,
            *(["--owner", owner or name] if owner is not None else []),
            "--trace", str(files[0]), "--marker", str(files[1]), "--go", str(files[2]),
            "--lease-ms", str(lease_ms), "--page-size", str(page_size),
            "--stale-ms", str(STALE_MS), "--pause-at", str(pause_at), "--timeout", str(timeout)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("E2E_BROKER", None)
    proc = processes.spawn([sys.executable, "-m", "tests.e2e.sweep_app", *args], cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Sweeper(name, proc, *files)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


@pytest.mark.slow
def test_a_sweeper_paused_past_its_lease_is_fenced_out_and_the_next_continues_from_its_checkpoint(
    backend: Backend, tmp_path: Path
) -> None:
    # given: 40 stale sagas of one bucket (8 pages of 5); sweeper A stops after its second page
    now = _now_ms()
    ids = backend.ids_in_one_bucket("p", 40)
    _seed(backend.store, [stale_saga(i, n, now - HOUR_MS + n) for n, i in enumerate(ids)])
    a = _start_sweeper(backend, tmp_path, "sweeper-a", lease_ms=1_500, pause_at=10, page_size=5)
    b: Sweeper | None = None
    try:
        wait_until(a.marker.exists, what="sweeper A between pages")
        fence_a = json.loads(a.marker.read_text())["fence"]

        # when: A is paused (SIGSTOP) past its lease, B takes over and stops after one page
        os.kill(a.proc.pid, signal.SIGSTOP)
        wait_until(lambda: _stopped(a.proc.pid), what="sweeper A stopped")
        a.go.touch()
        b = _start_sweeper(backend, tmp_path, "sweeper-b", lease_ms=60_000, pause_at=1, page_size=5)
        wait_until(b.marker.exists, what="sweeper B holding the lease")
        fence_b = json.loads(b.marker.read_text())["fence"]
        os.kill(a.proc.pid, signal.SIGCONT)
        report_a = a.report()
        b.go.touch()
        report_b = b.report()
    finally:
        for sweeper in (a, b):
            if sweeper is not None and sweeper.proc.poll() is None:
                os.kill(sweeper.proc.pid, signal.SIGCONT)
                sweeper.proc.kill()
                sweeper.proc.wait()
            if sweeper is not None:
                processes.forget(sweeper.proc)

    # then: A lost the lease and nothing it tried after resuming landed
    assert report_a["acquired"] and report_a["fences"]["0"] == fence_a and report_a["lease_lost"]
    assert report_b["acquired"] and report_b["fences"]["0"] == fence_b > fence_a
    assert report_b["complete"]
    resumed_at = a.events("resumed")[0]["t"]
    before = [e for e in a.events("cas") if e["t"] < resumed_at]
    after = [e for e in a.events("cas") if e["t"] > resumed_at]
    assert [e["outcome"] for e in before] == ["written"] * 10
    assert after and {e["outcome"] for e in after} == {"fenced"}
    assert [e for e in a.events("send") if e["t"] > resumed_at] == []
    # B started from the cursor A checkpointed after its second page, not from the top
    running = [e for e in a.events("scan") if e["states"] == ["running"] and e["bucket"] == 0]
    [first, second, *_] = running
    assert first["cursor"] is None and len(first["ids"]) == len(second["ids"]) == 5
    b_running = [e for e in b.events("scan") if e["states"] == ["running"] and e["bucket"] == 0]
    assert b_running[0]["cursor"] == second["next"] is not None
    # every stale saga re-driven exactly once, by one of them
    written_a = {e["id"] for e in before}
    written_b = {e["id"] for e in b.events("cas") if e["outcome"] == "written"}
    assert written_a.isdisjoint(written_b) and written_a | written_b == set(ids)
    sends = Counter(e["saga_id"] for s in (a, b) for e in s.events("send"))
    assert sends == Counter(ids)
    assert all(backend.saga(i).version == 2 and len(backend.saga(i).steps) == 1 for i in ids)



# ---------------------------------------------------------------- two beats, two workers

_LINE = re.compile(r"^(\d+\.\d+) .*sweep (start|end|stopped|failed) bucket=(\d+) fence=(\d+)")
_END = re.compile(r"sweep end bucket=(\d+) fence=\d+ examined=(\d+)")
_DONE = re.compile(r"^(\d+\.\d+) .*Task celery_sagas\.sweep\[[^]]+\] succeeded")

Interval = tuple[int, float, float]  # (fence, start, end) of one sweep of one bucket


def _sweep_tasks_done(processes: list[Any]) -> list[float]:
    """When each sweep task finished (whether or not it got a lease)."""
    return [float(m[1]) for p in processes for m in map(_DONE.match, p.text().splitlines()) if m]


def _contended(processes: list[Any], intervals: dict[int, list[Interval]]) -> bool:
    """Whether a sweep task finished while a bucket's lease was held by a sweep."""
    done = _sweep_tasks_done(processes)
    return any(start < at < end for at in done for spans in intervals.values() for _, start, end in spans)


def _sweep_lines(processes: list[Any]) -> list[tuple[float, str, int, int]]:
    """(time, start/end/stopped/failed, bucket, fence) of every sweep log line, in time order."""
    found = []
    for process in processes:
        for line in process.text().splitlines():
            match = _LINE.match(line)
            if match:
                found.append((float(match[1]), match[2], int(match[3]), int(match[4])))
    return sorted(found)


def _intervals(lines: list[tuple[float, str, int, int]]) -> dict[int, list[Interval]]:
    """Every sweep of every bucket; only a bucket's last may still run (its end is infinite)."""
    by_bucket: dict[int, list[Interval]] = {}
    for bucket in sorted({line[2] for line in lines}):
        mine = [(at, what, fence) for at, what, b, fence in lines if b == bucket]
        starts = [(fence, at) for at, what, fence in mine if what == "start"]
        ends = {fence: at for at, what, fence in mine if what != "start"}
        assert len({fence for fence, _ in starts}) == len(starts), f"bucket {bucket}: a fence granted twice"
        unfinished = [fence for fence, _ in starts if fence not in ends]
        assert unfinished in ([], [starts[-1][0]] if starts else []), f"sweeps {unfinished} never ended"
        by_bucket[bucket] = [(fence, at, ends.get(fence, float("inf"))) for fence, at in starts]
    return by_bucket


@pytest.fixture(params=["redis", "redis+cluster", "rabbitmq+postgres"])
def sweep_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """Both production stacks and a Redis Cluster store, with beat sending the sweep every
    half second."""
    if request.param == "redis":
        broker, store = REDIS_BROKER, request.getfixturevalue("redis_url")
    elif request.param == "redis+cluster":
        broker, store = REDIS_BROKER, request.getfixturevalue("redis_cluster_url")
    else:
        broker = request.getfixturevalue("rabbitmq_url")
        store = request.getfixturevalue("postgres_url")
    yield from _make_stack(tmp_path, broker, store, sweep_interval=0.5)


def test_two_beats_and_two_workers_never_sweep_one_bucket_at_once(sweep_stack: Stack) -> None:
    stack = sweep_stack
    # given: work that makes every sweep walk many pages, and garbage it must report
    stack.app_module = "tests.e2e.sweep_app"
    store = stack.sagas.store
    now = _now_ms()
    orders = [_retrying_order(f"w{n:04d}", now + n) for n in range(1500)]
    bulk_create(store, orders)
    _seed(store, [_retrying_order("garbage", now)])
    _corrupt_any(store, "garbage")
    per_bucket = Counter(store.bucket_of(order.saga_id) for order in orders)

    # when: two beats send the sweep every 0.5 s to two workers (four pool processes)
    workers = [stack.worker(), stack.worker()]
    beats = [stack.beat(), stack.beat()]

    def enough() -> bool:
        intervals = _intervals(_sweep_lines(workers))
        return min((len(v) for v in intervals.values()), default=0) >= 4 and _contended(workers, intervals)

    wait_until(enough, timeout=90, what="four sweeps of each bucket, one of them contended")
    # All at once: a pool process is ended by the SIGTERM mid-sweep, and a worker stopped after
    # it could start the bucket's next sweep in the meantime (two unfinished sweeps).
    for process in beats + workers:
        process.terminate()
    for process in beats + workers:
        process.stop()

    # then: no two sweeps of one bucket overlapped, and its fences grew with time
    lines = _sweep_lines(workers)
    assert not [line for line in lines if line[1] in ("stopped", "failed")], "a sweeper lost its lease"
    intervals = _intervals(lines)
    assert set(intervals) == set(range(store.buckets))
    for spans in intervals.values():
        for (fence, start, end), (later, next_start, _) in pairwise(spans):
            assert start <= end < next_start, f"sweep {fence} overlaps sweep {later}"
            assert later > fence
    # and a lease was contended: sweep tasks finished while another sweep held one
    assert _contended(workers, intervals)
    logs = "\n".join(w.text() for w in workers)
    assert re.search(r"corrupt.*\bgarbage\b", logs), "the corrupt record was not reported"
    walked = {(int(b), int(n)) for b, n in _END.findall(logs)}
    assert all((b, n) in walked for b, n in per_bucket.items()), "a sweep did not walk every page"


def _retrying_order(saga_id: str, at_ms: int) -> SagaRecord:
    """An e2e order compensating, its next release attempt due tomorrow: every sweep walks it
    (the compensating pass has no staleness filter) and leaves it alone."""
    plan: dict[str, Any] = {}
    reserve = "tests.e2e.app.reserve"
    step = StepRecord(
        name=reserve, task=reserve, effect_id=f"{saga_id}-e", compensation_effect_id=f"{saga_id}-c",
        state=StepState.COMPENSATION_FAILED, args=("S", plan), compensator="e2e.release",
        result={"reservation": "res-S"}, attempts=1, compensation_attempts=1,
        next_attempt_at_ms=at_ms + 24 * HOUR_MS, committed_at_ms=at_ms, error_code="compensation_failed",
    )
    data = {"sku": "S", "amount": 1, "id": saga_id, "plan": plan}
    return SagaRecord(saga_id, "e2e-order", SagaState.COMPENSATING, data, at_ms, at_ms, (step,))


def _corrupt_any(store: Any, saga_id: str) -> None:
    if hasattr(store, "layout"):
        store._client.hset(store.layout.record("saga", saga_id), "body", "{not json")
        return
    table = f"{store.table_prefix}envelopes"
    with store.engine.begin() as connection:
        connection.execute(text(f"UPDATE {table} SET body = '{{not json' WHERE id = :id"),
                           {"id": saga_id})


# ---------------------------------------------------------------- a killed sweeper's bucket

RECOVERY_S = 10.0  # docs/reliability.md: a lost message in a dead sweeper's bucket is re-sent by then


def _lost_order(saga_id: str, at_ms: int) -> SagaRecord:
    """An e2e order whose first step's message was lost an hour ago: a sweep sends it again."""
    plan: dict[str, Any] = {}
    reserve = "tests.e2e.app.reserve"
    step = StepRecord(name=reserve, task=reserve, effect_id=f"{saga_id}-e",
                      compensation_effect_id=f"{saga_id}-c", state=StepState.EXECUTING,
                      args=("S", plan), compensator="e2e.release", dispatched_at_ms=at_ms)
    data = {"sku": "S", "amount": 1, "id": saga_id, "plan": plan}
    return SagaRecord(saga_id, "e2e-order", SagaState.RUNNING, data, at_ms, at_ms, (step,))


def _ids_in_bucket(store: Store, prefix: str, count: int, bucket: int = 0) -> list[str]:
    ids = (f"{prefix}{n:05d}" for n in range(100_000))
    return [i for i in ids if store.bucket_of(i) == bucket][:count]


def test_a_sweeper_killed_mid_sweep_has_its_bucket_taken_over_and_a_lost_message_resent_at_once(
    sweep_stack: Stack, tmp_path: Path
) -> None:
    stack = sweep_stack
    stack.app_module = "tests.e2e.sweep_app"
    store = stack.sagas.store
    # given: bucket 0 holds a saga a sweep only looks at, then an order whose message was lost
    now = _now_ms()
    looked_at, lost = _ids_in_bucket(store, "k", 2)
    _seed(store, [waiting_saga(looked_at, 0, now - HOUR_MS), _lost_order(lost, now - HOUR_MS + 1_000)])
    # a standalone sweeper (its owner its claimer id, like a worker's) stops mid-sweep of
    # bucket 0 holding its lease for a minute
    backend = Backend(stack.config.prefix, stack.config.store, stack.config.prefix, store)
    a = _start_sweeper(backend, tmp_path, "killed", lease_ms=60_000, pause_at=1, page_size=1,
                       owner=None)
    try:
        wait_until(a.marker.exists, timeout=60, what="the sweeper between pages of bucket 0")
        held = json.loads(a.marker.read_text())
        assert held["bucket"] == 0 and held["pid"] == a.proc.pid

        # while it lives, a worker's sweeps leave its bucket alone
        worker = stack.worker()
        stack.beat()
        wait_until(lambda: len(_sweep_tasks_done([worker])) >= 2, timeout=60,
                   what="two sweeps of the worker while the sweeper lives")
        assert stack.ops("reserve.start", lost) == []
        holder = store.lease_holder(SWEEP_LEASE, bucket=0)
        assert holder is not None and (holder.owner, holder.fence) == (held["owner"], held["fence"])

        # when: it is SIGKILLed (and reaped, as a worker's parent or init does)
        assert store.delete("saga", looked_at, 1)  # the worker's app has no such definition
        os.kill(a.proc.pid, signal.SIGKILL)
        killed_at = time.time()
        a.proc.wait(timeout=30)
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()
        processes.forget(a.proc)

    # then: the lost message is sent again, and run, within RECOVERY_S of the kill
    [started] = wait_until(lambda: stack.ops("reserve.start", lost), timeout=RECOVERY_S + 5,
                           what="the lost message re-sent and run")
    recovered_s = started["t"] - killed_at
    print(f"kill to re-sent step running: {recovered_s:.2f} s ({stack.config.store.split(':')[0]})")
    assert recovered_s < RECOVERY_S
    # by a worker's sweep that took the dead sweeper's lease over under a newer fence
    log = worker.text()
    assert re.search(rf"lease {SWEEP_LEASE} bucket=0 taken over from {re.escape(held['owner'])} ",
                     log), log[-3000:]
    fences = [fence for _, what, bucket, fence in _sweep_lines([worker])
              if what == "start" and bucket == 0]
    assert fences and min(fences) > held["fence"]
    assert stack.wait_settled(lost).state == SagaState.COMPLETED
