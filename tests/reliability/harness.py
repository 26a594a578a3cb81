"""Run many sagas against real workers while injecting faults, then check the invariants.

``run_load`` starts ``count`` sagas (at most ``in_flight`` unsettled at once, as a web tier
would), while a fault thread fires one injector about every ``fault_every`` seconds, until
only the tail of the load is still open. Then the faults stop, and it drives sweeps from the
test process (beat may run too) until every saga is completed, compensated or in manual
review, or the deadline passes; waits until the providers' ledger is quiet; kills the
processes; and checks the invariants (``invariants.check``). A supervisor thread restarts
any worker that exits by itself, as systemd would. The returned ``Report`` carries the
figures the full run prints.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_sagas._protocol.kinds import CHILD_TASK
from celery_sagas._records import SagaRecord, StepState
from celery_sagas.errors import SagaError
from tests.reliability.app import definition_for
from tests.reliability.cluster import Cluster
from tests.reliability.invariants import SETTLED, Violation, check, fence_stats
from tests.reliability.recording import append_line, read_lines

logger = logging.getLogger("tests.reliability")

PlanFactory = Callable[[random.Random, int], dict[str, Any]]


@dataclass
class Fault:
    """One injected fault."""

    kind: str
    at: float
    detail: str = ""
    wall: float = 0.0
    body: dict[str, Any] | None = None


@dataclass
class FaultLog:
    """Faults injected so far (thread-safe append)."""

    faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, detail: str = "", body: dict[str, Any] | None = None) -> None:
        """Record a fault injected now (``body``: the ledger line of the body it killed)."""
        with self._lock:
            self.faults.append(Fault(kind, time.monotonic(), detail, time.time(), body))

    def counts(self) -> Counter[str]:
        """Faults by kind."""
        with self._lock:
            return Counter(f.kind for f in self.faults)

    def last(self) -> float | None:
        """When the last fault was injected (monotonic seconds)."""
        with self._lock:
            return max((f.at for f in self.faults), default=None)


Injector = Callable[[Cluster, random.Random, FaultLog], None]


@dataclass
class Report:
    """What one scenario did and whether it kept the invariants."""

    scenario: str
    sagas: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    manual_review: Counter[str] = field(default_factory=Counter)
    review_causes: Counter[str] = field(default_factory=Counter)  # of the ambiguous steps
    settle_s: float | None = None
    duration_s: float = 0.0
    fences: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    examples: Counter[str] = field(default_factory=Counter)
    records: dict[str, SagaRecord | None] = field(default_factory=dict, repr=False)
    ledger: list[dict[str, Any]] = field(default_factory=list, repr=False)
    fault_log: list[Fault] = field(default_factory=list, repr=False)

    def ops(self, op: str) -> list[dict[str, Any]]:
        """Ledger lines of one op."""
        return [line for line in self.ledger if line["op"] == op]

    def summary(self) -> str:
        """One block of text with every figure."""
        settle = "n/a" if self.settle_s is None else f"{self.settle_s:.1f}s"
        lines = [
            f"{self.scenario}: {self.sagas} sagas in {self.duration_s:.1f}s, "
            f"settled {settle} after the last fault",
            f"  outcomes: {dict(sorted(self.outcomes.items()))}",
            f"  faults: {dict(sorted(self.faults.items()))}",
            f"  manual review: {sum(self.manual_review.values())} "
            f"{dict(sorted(self.manual_review.items()))}"
            + (f", ambiguous steps by cause {dict(sorted(self.review_causes.items()))}"
               if self.review_causes else ""),
            f"  fences: {dict(sorted(self.fences.items()))}",
            f"  invariant violations: {len(self.violations)}",
            *(f"    {v}" for v in self.violations[:20]),
            *([f"  examples: {dict(sorted(self.examples.items()))}"] if self.examples else []),
            *(f"  note: {n}" for n in self.notes),
            *(f"  PROBLEM: {p}" for p in self.problems),
        ]
        return "\n".join(lines)


def retrying(action: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Call ``action`` until it stops raising a store/broker error (a client would retry)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except (SagaError, OSError, ConnectionError) as exc:
            if isinstance(exc, SagaError) and not _transient(exc):
                raise
            if time.monotonic() > deadline:
                raise
            logger.info("%s: %s, retrying", what, type(exc).__name__)
            time.sleep(0.2)
        except Exception as exc:  # kombu's OperationalError and friends
            if time.monotonic() > deadline or "Error" not in type(exc).__name__:
                raise
            time.sleep(0.2)


def _transient(exc: SagaError) -> bool:
    from celery_sagas.errors import SagaConcurrencyError, StoreError
    return isinstance(exc, (StoreError, SagaConcurrencyError))


class Tracker:
    """The sagas started so far and which of them are not settled yet."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.started: list[str] = []
        self.open: dict[str, None] = {}  # in start order: the oldest settle first

    def add(self, saga_id: str) -> None:
        """A saga was started."""
        self.started.append(saga_id)
        self.open[saga_id] = None

    def refresh(self, down_to: int = 0) -> int:
        """Re-read the open sagas, oldest first, until at most ``down_to`` are open; returns
        how many are still open. Only the record's state is read (the store's envelope, not
        the decoded saga): this runs every 0.1 s through a load."""
        for saga_id in list(self.open):
            if len(self.open) <= down_to:
                break
            try:
                envelope = self.cluster.sagas.store.get("saga", saga_id)
            except SagaError:
                break
            if envelope is not None and envelope.state in SETTLED:
                del self.open[saga_id]
        return len(self.open)


def _fault_loop(cluster: Cluster, injectors: list[tuple[Injector, float]], every: float,
                rng: random.Random, log: FaultLog, stop: threading.Event,
                errors: list[str]) -> None:
    functions = [i for i, _ in injectors]
    weights = [w for _, w in injectors]
    while not stop.wait(every * rng.uniform(0.5, 1.5)):
        try:
            rng.choices(functions, weights)[0](cluster, rng, log)
        except Exception:
            errors.append(traceback.format_exc())


def _supervise(cluster: Cluster, stop: threading.Event, notes: Counter[str]) -> None:
    """Restart workers that died on their own (what systemd or Kubernetes would do)."""
    while not stop.wait(0.5):
        try:
            for reason in cluster.revive():
                notes[f"worker exited by itself and was restarted: {reason}"] += 1
        except Exception:
            notes[f"supervisor error: {traceback.format_exc().strip().splitlines()[-1]}"] += 1


def _sweep_quietly(cluster: Cluster, notes: Counter[str]) -> None:
    try:
        cluster.sagas.sweep()
    except SagaError as exc:
        notes[f"test-process sweep raised {type(exc).__name__}"] += 1


def _ledger_quiet(cluster: Cluster, seconds: float, timeout: float) -> None:
    """Wait until the ledger has not grown for ``seconds``."""
    path = cluster.config.ledger
    deadline = time.monotonic() + timeout
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = path.stat().st_size if path.exists() else 0
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        time.sleep(0.1)


def settle(cluster: Cluster, tracker: Tracker, timeout: float, notes: Counter[str]) -> float | None:
    """Sweep from here until every saga settled; the monotonic time it happened, or None."""
    deadline = time.monotonic() + timeout
    last_sweep = 0.0
    while time.monotonic() < deadline:
        if tracker.refresh() == 0:
            settled_at = time.monotonic()
            _ledger_quiet(cluster, 0.5, 15.0)
            if tracker.refresh() == 0 and _all_settled(cluster, tracker):
                return settled_at
        if time.monotonic() - last_sweep > 1.0:
            _sweep_quietly(cluster, notes)
            last_sweep = time.monotonic()
        time.sleep(0.1)
    return None


def settle_all(cluster: Cluster, saga_ids: Iterable[str], timeout: float = 60.0) -> None:
    """Sweep from here until every one of ``saga_ids`` settled; AssertionError with the logs
    past ``timeout``."""
    tracker = Tracker(cluster)
    for saga_id in saga_ids:
        tracker.add(saga_id)
    if settle(cluster, tracker, timeout, Counter()) is None:
        raise AssertionError(f"sagas {sorted(tracker.open)} did not settle\n{cluster.logs()}")


def settle_one(cluster: Cluster, saga_id: str, timeout: float = 60.0) -> SagaRecord:
    """Sweep from here until one saga settled; AssertionError with the logs past ``timeout``."""
    settle_all(cluster, [saga_id], timeout)
    record = cluster.sagas.get(saga_id)
    assert record is not None
    return record


def _all_settled(cluster: Cluster, tracker: Tracker) -> bool:
    for saga_id in tracker.started:
        record = cluster.sagas.get(saga_id)
        if record is None or record.state not in SETTLED:
            tracker.open[saga_id] = None
            return False
    return True


@dataclass
class Load:
    """What to run: how many sagas, their plans, the faults and the pacing."""

    count: int
    plans: PlanFactory
    injectors: list[tuple[Injector, float]] = field(default_factory=list)
    fault_every: float = 1.0
    in_flight: int = 24
    settle_timeout: float = 90.0
    seed: int = 0
    faults_after_load: float = 0.0


def run_load(cluster: Cluster, load: Load, scenario: str) -> Report:
    """Start the sagas, inject faults meanwhile, settle, stop everything, check invariants."""
    rng = random.Random(load.seed)
    report = Report(scenario)
    log, stop, errors = FaultLog(), threading.Event(), []
    tracker = Tracker(cluster)
    notes: Counter[str] = Counter()
    began = time.monotonic()
    faults = threading.Thread(
        target=_fault_loop, name="faults", daemon=True,
        args=(cluster, load.injectors, load.fault_every, random.Random(load.seed + 1), log, stop,
              errors),
    )
    halt = threading.Event()
    supervisor = threading.Thread(target=_supervise, args=(cluster, halt, notes), daemon=True)
    supervisor.start()
    if load.injectors:
        faults.start()
    try:
        try:
            _submit(cluster, load, rng, tracker)
            _drain(tracker, max(2, load.in_flight // 4), load.settle_timeout)
            if load.faults_after_load:
                time.sleep(load.faults_after_load)
        finally:
            stop.set()
            if faults.is_alive():
                faults.join(timeout=60)
        load_done = time.monotonic()
        settled_at = settle(cluster, tracker, load.settle_timeout, notes)
    finally:
        halt.set()
        supervisor.join(timeout=60)
    last_fault = log.last() or load_done
    report.settle_s = None if settled_at is None else max(0.0, settled_at - last_fault)
    report.duration_s = time.monotonic() - began
    _stop_processes(cluster)
    report.faults = log.counts()
    report.fault_log = list(log.faults)  # before _collect: the invariants read what was killed
    _collect(cluster, tracker, report)
    for fault in log.faults:  # kept beside the logs for post-mortems
        append_line(cluster.config.workdir / "faults.jsonl",
                    {"kind": fault.kind, "at": fault.at, "wall": fault.wall, "detail": fault.detail})
    report.notes.extend(f"{k} ({v}x)" for k, v in notes.items())
    report.notes.extend(f"injector error: {e.strip().splitlines()[-1]}" for e in errors)
    if settled_at is None:
        report.notes.append(f"not settled within {load.settle_timeout}s")
    return report


def _submit(cluster: Cluster, load: Load, rng: random.Random, tracker: Tracker) -> None:
    for index in range(load.count):
        deadline = time.monotonic() + load.settle_timeout
        while tracker.refresh(down_to=load.in_flight - 1) >= load.in_flight:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(tracker.open)} sagas made no progress for "
                                     f"{load.settle_timeout}s\n{cluster.logs()}")
            time.sleep(0.1)
        saga_id = f"{cluster.config.prefix}-{index}"
        data = {"sku": f"sku{index}", "amount": index + 1, "id": f"o{index}",
                "plan": load.plans(rng, index)}
        definition = definition_for(data["plan"])
        retrying(lambda s=saga_id, d=data, n=definition: cluster.sagas.start(n, d, saga_id=s),
                 f"start {saga_id}")
        tracker.add(saga_id)
        _signal_later(cluster, saga_id, data["plan"], rng)


def _signal_later(cluster: Cluster, saga_id: str, plan: dict[str, Any],
                  rng: random.Random) -> None:
    """Send the signal "go" a plan waits for, twice under one id: at once (most likely before
    the wait) or after 0.5-2 s (most likely after it); a "timeout" plan gets none."""
    when = plan.get("signal")
    if when not in ("early", "late"):
        return

    def send() -> None:
        from celery_sagas.errors import SagaAlreadyFinal

        for _ in range(2):
            try:
                retrying(lambda: cluster.sagas.signal(saga_id, "go", {"by": "harness"},
                                                      signal_id=f"{saga_id}-go"),
                         f"signal {saga_id}")
            except SagaAlreadyFinal:
                return  # a fault ended the saga before its signal: it is refused, not lost

    if when == "early":
        send()
    else:
        timer = threading.Timer(rng.uniform(0.5, 2.0), send)
        timer.daemon = True
        timer.start()


def _drain(tracker: Tracker, remaining: int, timeout: float) -> None:
    """Keep the faults coming until only ``remaining`` sagas are still open (the tail)."""
    deadline = time.monotonic() + timeout
    while tracker.refresh(down_to=remaining) > remaining and time.monotonic() < deadline:
        time.sleep(0.1)


def _stop_processes(cluster: Cluster) -> None:
    # Every saga settled and the ledger is quiet, so nothing of interest is running any more.
    for process in cluster.processes:
        process.kill()


def finish(cluster: Cluster, started: list[str], report: Report) -> Report:
    """Stop the processes and check the invariants over ``started``."""
    _stop_processes(cluster)
    tracker = Tracker(cluster)
    for saga_id in started:
        tracker.add(saga_id)
    _collect(cluster, tracker, report)
    return report


def started_children(record: SagaRecord | None) -> list[str]:
    """The ids of the child sagas a parent started (a child step failed before it began has
    none)."""
    if record is None:
        return []
    return [str(step.kwargs["saga_id"]) for step in record.steps
            if step.task == CHILD_TASK and step.error_code != "not_started"]


def killed_pids(faults: Iterable[Fault]) -> frozenset[int]:
    """Every process a fault SIGKILLed: pool children, and whole workers with their pool."""
    found: set[int] = set()
    for fault in faults:
        if fault.kind.startswith("kill-"):
            found.update(int(pid) for pid in re.findall(r"\bpid (\d+)", fault.detail))
            for group in re.findall(r"\bchildren ([\d ]+)", fault.detail):
                found.update(int(pid) for pid in group.split())
    return frozenset(found)


def _collect(cluster: Cluster, tracker: Tracker, report: Report) -> None:
    records = {
        saga_id: retrying(lambda s=saga_id: cluster.sagas.get(s), "read back")
        for saga_id in tracker.started
    }
    children = [child for record in records.values() for child in started_children(record)]
    for child_id in children:
        records[child_id] = retrying(lambda s=child_id: cluster.sagas.get(s), "read back")
    tracker.started.extend(children)
    ledger = read_lines(cluster.config.ledger)
    trace = read_lines(cluster.config.fences)
    report.sagas = len(tracker.started)
    report.records, report.ledger = records, ledger
    report.outcomes = Counter(str(r.state) if r else "lost" for r in records.values())
    report.manual_review = Counter(
        r.error_code or "?" for r in records.values() if r and r.state == "manual-review"
    )
    report.review_causes = Counter(
        step.error_code or "?" for r in records.values() if r and r.state == "manual-review"
        for step in r.steps if step.state is StepState.AMBIGUOUS)
    report.fences = fence_stats(trace)
    stopped = sum(p.text().count("sweep stopped bucket=") for p in cluster.processes)
    if stopped:
        report.fences["sweeps_stopped"] = stopped
    killed = [f.body for f in report.fault_log if f.body is not None]
    report.violations = check(tracker.started, records, ledger, trace, killed,
                              killed_pids=killed_pids(report.fault_log))
