"""Probes: races and faults staged at one precise point, on real workers.

- ``paused_sweeper``: a sweeper SIGSTOPped past its lease while a newer grant exists must have
  its next write refused (the fence), and the next holder re-drives the rest.
- ``resume_race``: 16 threads resume one manual-review saga at once: one write lifts the
  review, the next step (or compensator) is sent once, its body runs once.

Each returns a ``Report`` whose invariants are checked like a load's, plus ``problems`` for
what the probe expected and did not see.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery_sagas._celery.messages import SWEEP_TASK
from celery_sagas._clock import SystemClock
from celery_sagas._leases import Leases
from celery_sagas._sweep import SWEEP_LEASE
from celery_sagas.errors import SagaError
from celery_sagas.stores.base import Lease
from celery_sagas.testing.racing import race
from tests.e2e.conftest import wait_until
from tests.reliability import faults
from tests.reliability.app import DEFINITION, STEP_NAMES
from tests.reliability.cluster import Cluster, children_of, make_cluster
from tests.reliability.harness import FaultLog, Report, finish, settle_all, settle_one
from tests.reliability.recording import read_lines


def _expect(report: Report, condition: bool, problem: str) -> None:
    if not condition:
        report.problems.append(problem)


def _probe(workdir: Path, name: str, build: Callable[[Path], Cluster],
           body: Callable[[Cluster], Report]) -> Report:
    cluster = build(workdir / name)
    try:
        return body(cluster)
    finally:
        cluster.close()


def paused_sweeper(workdir: Path, stale: int = 6) -> Report:
    """A sweeper SIGSTOPped past its lease while a newer grant exists: its writes are refused.

    ``stale`` sagas (their messages purged) give the sweep work; a worker with one process
    starts a slow sweep (one saga per page, a pause before each scan); after its first
    re-drive it is stopped, its lease expires, this process takes a newer grant, and the
    sweeper is continued: its next write carries the old fence. Then the sagas are settled
    normally and every invariant is checked.
    """

    def build(path: Path) -> Cluster:
        return make_cluster(path, scan_delay_ms=400, sweep_page_size=1, sweep_lease=1.5)

    def body(cluster: Cluster) -> Report:
        report = Report("sweeper paused past its lease (fenced out)")
        # One bucket: the sweeper pauses inside it, and the newer grant is of that bucket's lease.
        started = _ids_in_bucket_zero(cluster, f"{cluster.config.prefix}-stale-", stale)
        for saga_id in started:
            cluster.sagas.start(DEFINITION, {"sku": "s", "amount": 1, "id": saga_id, "plan": {}},
                                saga_id=saga_id)
        faults.purge_queue(cluster, random.Random(0), FaultLog())
        time.sleep(cluster.config.stale_after + 0.2)  # the sagas must be stale to be re-driven
        worker = cluster.worker(concurrency=1)
        cluster.shop.app.send_task(SWEEP_TASK, queue=cluster.config.queue)
        children = set(children_of(worker.pid))
        # Stop it after its first re-drive, once it waits before its next page's scan (its
        # checkpoint done): resumed, it scans and writes before it renews the lease.
        pid = wait_until(lambda: _writer_among(cluster, children), timeout=30,
                         what="a fenced write by the sweeping worker")
        wait_until(lambda: _waits_after_a_write(cluster, pid), timeout=30,
                   what="the sweeper to wait before its next scan")
        newer = _stop_past_lease(cluster, pid, report)
        wait_until(lambda: "sweep stopped bucket=" in worker.text(), timeout=30,
                   what="the paused sweeper to stop")
        if newer is not None:
            Leases(cluster.shop.store, SystemClock(), owner="probe").release(newer)
        settle_all(cluster, started)
        finish(cluster, started, report)
        refused = [e for e in read_lines(cluster.config.fences)
                   if e["ev"] == "write" and e["pid"] == pid and e["outcome"] == "refused"]
        report.faults["sweeper-paused-past-lease"] += 1
        _expect(report, bool(refused), "the resumed sweeper made no refused write")
        return report

    return _probe(workdir, "paused-sweeper", build, body)


def _stop_past_lease(cluster: Cluster, pid: int, report: Report) -> Lease | None:
    """SIGSTOP ``pid`` until its lease expired and this process holds a newer grant (returned,
    for the caller to release), then SIGCONT it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(cluster.config.sweep_lease + 0.5)
        newer = Leases(cluster.shop.store, SystemClock(), owner="probe").acquire(SWEEP_LEASE, 60_000)
        _expect(report, newer is not None, "the paused sweeper's lease did not expire")
    finally:
        os.kill(pid, signal.SIGCONT)
    return newer


def _ids_in_bucket_zero(cluster: Cluster, prefix: str, count: int) -> list[str]:
    store = cluster.shop.store
    candidates = (f"{prefix}{n}" for n in range(100_000))
    return [i for i in candidates if store.bucket_of(i) == 0][:count]


def _waits_after_a_write(cluster: Cluster, pid: int) -> bool:
    """Whether ``pid`` began a scan's wait after its first fenced write."""
    mine = [e["ev"] for e in read_lines(cluster.config.fences) if e["pid"] == pid]
    return "write" in mine and "scan_wait" in mine[mine.index("write"):]


def _writer_among(cluster: Cluster, pids: set[int]) -> int | None:
    writers = [e["pid"] for e in read_lines(cluster.config.fences) if e["ev"] == "write"]
    return next((pid for pid in writers if pid in pids), None)


class _CountingDispatcher:
    """Counts the step and compensator messages this process sends, by step name."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def send_step(self, saga_id: str, step: Any, version: int, **options: Any) -> None:
        with self._lock:
            self.sent.append(("step", step.name))
        self.inner.send_step(saga_id, step, version, **options)

    def send_compensation(self, saga_id: str, step: Any, version: int, **options: Any) -> None:
        with self._lock:
            self.sent.append(("compensation", step.name))
        self.inner.send_compensation(saga_id, step, version, **options)

    def count(self, kind: str, step: str) -> int:
        """Messages of ``kind`` sent for ``step`` so far."""
        with self._lock:
            return self.sent.count((kind, step))


def resume_race(workdir: Path, threads: int = 16) -> Report:
    """16 threads resume one manual-review saga at once: one resume, one dispatch, one body."""

    def body(cluster: Cluster) -> Report:
        cluster.worker()
        report = Report(f"{threads} threads resume one saga")
        counting = _CountingDispatcher(cluster.sagas.dispatcher)
        cluster.sagas._send_through(counting)
        started = [_forward_race(cluster, report, counting, threads),
                   _compensation_race(cluster, report, counting, threads)]
        expectations = list(report.problems)
        finish(cluster, started, report)
        report.problems = expectations
        return report

    return _probe(workdir, "resume-race", make_cluster, body)


def _race_resumes(cluster: Cluster, report: Report, saga_id: str, threads: int) -> int:
    """Resume ``saga_id`` from ``threads`` threads at once; how many writes lifted the review."""
    review = cluster.sagas.get(saga_id)
    assert review is not None
    wins: list[int] = []

    def on_write(envelope: Any, expected: int, ok: bool) -> None:
        if ok and envelope.id == saga_id and expected == review.version:
            wins.append(expected)

    cluster.shop.store.listeners.append(on_write)
    try:
        results = race(lambda _: cluster.sagas.resume(saga_id), threads=threads)
    finally:
        cluster.shop.store.listeners.remove(on_write)
    errors = [r for r in results if isinstance(r, BaseException)]
    _expect(report, all(isinstance(e, SagaError) for e in errors),
            f"resume raised undocumented errors: {errors!r}")
    return len(wins)


def _forward_race(cluster: Cluster, report: Report, counting: _CountingDispatcher,
                  threads: int) -> str:
    """Charge applied but unknown → review; resolve committed; 16 resumes → ship runs once."""
    sagas = cluster.sagas
    saga_id = f"{cluster.config.prefix}-fwd"
    sagas.start(DEFINITION, {"sku": "s", "amount": 5, "id": "o", "plan": {"crash_after": "charge"}},
                saga_id=saga_id)
    record = settle_one(cluster, saga_id)
    _expect(report, record.state == "manual-review", f"forward saga is {record.state}")
    charge = record.step(STEP_NAMES["charge"])
    assert charge is not None
    resolved = sagas.resolve(saga_id, STEP_NAMES["charge"], charge.effect_id, "committed",
                             result={"effect": charge.effect_id, "charged": 5})
    _race_resumes(cluster, report, saga_id, threads)
    final = settle_one(cluster, saga_id)
    _expect(report, final.state == "completed", f"forward saga ended {final.state}")
    ships = [x for x in read_lines(cluster.config.ledger)
             if x["op"] == "ship.start" and x["saga_id"] == saga_id]
    _expect(report, len(ships) == 1, f"ship body ran {len(ships)}x")
    sent = counting.count("step", STEP_NAMES["ship"])
    _expect(report, sent == 1, f"ship dispatched {sent}x by the resuming threads")
    report.notes.append(f"forward: resolved to {resolved.state}, then {threads} resumes; "
                        f"ship sent {sent}x, run {len(ships)}x")
    return saga_id


def _compensation_race(cluster: Cluster, report: Report, counting: _CountingDispatcher,
                       threads: int) -> str:
    """Compensation exhausted → review; fix the provider; 16 resumes → one resume, one undo."""
    sagas = cluster.sagas
    saga_id = f"{cluster.config.prefix}-comp"
    down = cluster.config.control / "inventory-down"
    down.touch()
    plan = {"decline": "ship", "inventory": "inventory-down"}
    sagas.start(DEFINITION, {"sku": "s", "amount": 6, "id": "o", "plan": plan}, saga_id=saga_id)
    record = settle_one(cluster, saga_id)
    _expect(report, record.error_code == "compensation_exhausted",
            f"compensation saga is {record.state}/{record.error_code}")
    down.unlink()
    before = counting.count("compensation", STEP_NAMES["reserve"])
    wins = _race_resumes(cluster, report, saga_id, threads)
    final = settle_one(cluster, saga_id)
    _expect(report, final.state == "compensated", f"compensation saga ended {final.state}")
    _expect(report, wins == 1, f"{wins} resumes lifted the review")
    sent = counting.count("compensation", STEP_NAMES["reserve"]) - before
    _expect(report, sent == 1, f"release dispatched {sent}x by the resuming threads")
    done = [x for x in read_lines(cluster.config.ledger)
            if x["op"] == "release.done" and x["saga_id"] == saga_id]
    _expect(report, len(done) == 1, f"release applied {len(done)}x")
    report.notes.append(f"compensation: {wins} of {threads} resumes lifted the review; "
                        f"release sent {sent}x, applied {len(done)}x")
    return saga_id
