"""The reconciliation sweep: paged passes over each bucket under its fenced lease (docs/design.md §5).

A sweep walks the store's buckets, starting at its shard's offset. For each bucket whose lease
``celery_sagas.sweep`` it can take, it runs the passes below over that bucket only, page by
page, renewing the lease and checkpointing its position after each page; a bucket swept to
the end less than half a sweep interval ago (by another shard) is skipped. Passes:

1. sagas whose due time has passed (retries waiting for their time): advance them;
2. ``running`` sagas not updated for ``stale_after``: re-send lost messages, judge started
   attempts past their time limit, bring approval gates in line with their approvals;
3. every ``compensating`` saga: run compensation retries that are due;
4. every ``manual-review`` saga: report it;
5. passes handed in by other features: approval expiry, then retention (final sagas past
   ``retention`` archived and deleted, ``_retention.py``);
6. saga and approval records in a state no pass above asks for, on a store that lists its
   states (``StateListing``): reported corrupt, never left invisible.

At the end every finding (sagas, and the effects of the sagas it read, docs/design.md §2.3) and
every corrupt record is reported as a ``Finding``: logged on ``celery_sagas.findings``,
delivered to finding observers and counted by the metrics. Every write carries the bucket
lease's fence, so a sweeper paused past its lease (GC, SIGSTOP) cannot write after a newer
grant; when renewing or checkpointing fails it stops at once and the next holder continues
from the checkpoint. The lease owner is the sweeping process's claimer id, so a bucket whose
holder was killed on this host is taken over at once, not after the lease expires (``Leases``,
docs/design.md §5). Running twice at once is safe anyway: every action is a compare-and-set.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from ._engine import Engine
from ._findings import Window, corrupt_finding, effect_findings, window_of
from ._leases import Leases
from ._protocol.findings import Finding, FindingKind, saga_finding
from ._records import APPROVAL, SAGA, ApprovalRecord, ApprovalState, SagaRecord, SagaState
from ._repairs import Repairer, default_repairers, repaired
from ._scans import CorruptRecord, RecordPage, Scans
from ._values import printable
from ._walker import walk
from .errors import FencedWriteRefused, LeaseLost, SagaError, SagaValidationError
from .stores.base import Fence, Lease

__all__ = ["SWEEP_LEASE", "Pass", "SweepReport", "Sweeper", "default_passes", "stray_passes"]

logger = logging.getLogger("celery_sagas.sweep")

SWEEP_LEASE = "celery_sagas.sweep"
_DONE = "done@"  # a bucket's checkpoint once swept to the end: done@<ms>
_OPEN_STATES = (SagaState.RUNNING, SagaState.COMPENSATING, SagaState.MANUAL_REVIEW)

R = TypeVar("R")


@dataclass
class SweepReport:
    """What one sweep did; findings carry ids and codes only."""

    acquired: bool = False
    fence: int | None = None  # the highest fencing number held (of any bucket)
    fences: dict[int, int] = field(default_factory=dict)  # bucket -> fencing number held
    complete: bool = False
    lease_lost: bool = False
    held: list[int] = field(default_factory=list)  # buckets another sweeper held: not swept
    total_buckets: int = 0  # the store's buckets, each tried once
    buckets: int = 0
    examined: int = 0
    acted: int = 0
    deleted: int = 0  # sagas the retention pass deleted
    errors: int = 0
    findings: list[Finding] = field(default_factory=list)
    corrupt: list[CorruptRecord] = field(default_factory=list)
    pages: int = 0
    states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pass(Generic[R]):
    """One paged walk of a bucket: fetch a page at a cursor, act on each record of it, then
    (when given) ``settle`` the page: what ``act`` gathered is written in one batch."""

    name: str
    fetch: Callable[[int, str | None, int], RecordPage[R]]
    act: Callable[[R, Fence, SweepReport], None]
    settle: Callable[[Fence, SweepReport], None] | None = None


PassFactory = Callable[[Engine, Scans, int], Pass[Any]]


class _BucketPager(Generic[R]):
    """A pass bound to one bucket, its fence and the report: one page per call."""

    def __init__(self, sweep_pass: Pass[R], bucket: int, fence: Fence, report: SweepReport,
                 page_size: int) -> None:
        self._pass, self._bucket, self._fence = sweep_pass, bucket, fence
        self._report, self._page_size = report, page_size

    def page(self, cursor: str | None) -> str | None:
        page = self._pass.fetch(self._bucket, cursor, self._page_size)
        self._report.pages += 1
        self._report.corrupt.extend(page.corrupt)
        for record in page.records:
            self._report.examined += 1
            self._guarded(partial(self._pass.act, record, self._fence, self._report), record)
        if self._pass.settle is not None:
            self._guarded(partial(self._pass.settle, self._fence, self._report), None)
        return page.cursor

    def _guarded(self, call: Callable[[], None], record: object | None) -> None:
        """Run one action; a lost lease stops the sweep, any other error is counted and logged
        with the record's kind and id (``page`` for a page's batch)."""
        named = _named(record) if record is not None else "page"
        extra = {"record_id": _record_id(record)}
        try:
            call()
        except (FencedWriteRefused, LeaseLost):
            raise
        except SagaError as exc:
            self._report.errors += 1
            logger.warning("sweep %s: %s: %s", self._pass.name, named, _cause(exc), extra=extra)
        except Exception:
            self._report.errors += 1
            logger.exception("sweep %s: %s: unexpected error", self._pass.name, named,
                             extra=extra)


def _record_id(record: object) -> str | None:
    if isinstance(record, SagaRecord):
        return record.saga_id
    if isinstance(record, ApprovalRecord):
        return record.approval_id
    return None


def _named(record: object) -> str:
    """``saga <id>`` / ``approval <id>`` for a log line, control characters escaped."""
    record_id = _record_id(record)
    kind = APPROVAL if isinstance(record, ApprovalRecord) else SAGA
    return f"{kind} {printable(record_id)}" if record_id is not None else type(record).__name__


def _cause(exc: BaseException) -> str:
    """The error's type and first line (the library's own messages carry ids and codes, never
    payloads), then its cause's type: enough to act on without the record."""
    first = str(exc).splitlines()[0][:200] if str(exc) else "-"
    text = f"{type(exc).__name__}: {printable(first)}"
    if exc.__cause__ is not None:
        text += f" (caused by {type(exc.__cause__).__name__})"
    return text


class Sweeper:
    """Runs sweeps over one engine's store: its passes, leases and checkpoints."""

    def __init__(
        self, engine: Engine, scans: Scans, *, owner: str, lease_ms: int, page_size: int = 100,
        interval_ms: int = 5_000, extra_passes: Sequence[PassFactory] = (), count_states: bool = False,
        on_page: Callable[[Lease, SweepReport], None] | None = None,
        repairers: Sequence[Repairer] | None = None,
    ) -> None:
        self.engine = engine
        self.scans = scans
        self.owner = owner
        self.lease_ms = lease_ms
        self.page_size = page_size
        self.fresh_ms = interval_ms // 2
        self.extra_passes = tuple(extra_passes)
        self.count_states = count_states
        self.on_page = on_page  # called after each checkpointed page (tests and tools watch)
        # the repairs of held steps each saga gets before its next decision (_repairs.py)
        self.repairers = list(default_repairers(engine) if repairers is None else repairers)

    def sweep(self, shard: int = 0, shards: int = 1, *,
              sent_at_ms: int | None = None) -> SweepReport:
        """One reconciliation pass over every bucket this call can lease, from its shard's
        offset; returns at once for buckets another sweeper holds. ``sent_at_ms`` is when
        this sweep was asked for: a bucket swept to the end since then is skipped, so sweeps
        queued up behind slow ones (two beats, a busy queue) do not walk it again."""
        report = SweepReport()
        store = self.engine.repository.store
        first = (shard * store.buckets) // max(1, shards)
        order = [(first + i) % store.buckets for i in range(store.buckets)]
        report.total_buckets = len(order)
        leases = Leases(store, self.engine.clock, owner=self.owner)
        swept = 0
        try:
            for bucket in order:
                swept += self._bucket(leases, bucket, report, skip_fresh=shards > 1,
                                      sent_at_ms=sent_at_ms)
            report.complete = swept == len(order)
            if self.count_states:
                report.states = {str(s): store.count(SAGA, [str(s)]) for s in _OPEN_STATES}
        except (LeaseLost, FencedWriteRefused):
            report.lease_lost = True
        finally:
            # A record two passes read (due, and stale) is reported once.
            unreadable = dict.fromkeys(report.corrupt)
            for finding in (*report.findings, *(corrupt_finding(c) for c in unreadable)):
                self.engine.middlewares.on_finding(finding.observed(report.fence))
        return report

    def _bucket(self, leases: Leases, bucket: int, report: SweepReport, *, skip_fresh: bool,
                sent_at_ms: int | None = None) -> int:
        """Sweep one bucket if its lease can be taken: 1 when swept (or, with ``skip_fresh``,
        just swept by another shard, or swept since ``sent_at_ms``), else 0."""
        lease = leases.acquire(SWEEP_LEASE, self.lease_ms, bucket=bucket)
        if lease is None:
            report.held.append(bucket)
            return 0
        report.acquired = True
        report.fence = max(report.fence or 0, lease.fence)
        report.fences[bucket] = lease.fence
        done = _done_at(lease)
        fresh = skip_fresh and done is not None and self.engine.now() - done < self.fresh_ms
        if fresh or (done is not None and sent_at_ms is not None and done >= sent_at_ms):
            leases.release(lease)
            return 1
        # Start and end lines bracket the time the lease is held: their fences prove who swept when.
        extra = {"fence": lease.fence, "bucket": bucket}
        logger.info("sweep start bucket=%d fence=%d owner=%s", bucket, lease.fence, self.owner,
                    extra=extra)
        try:
            before = report.examined
            self._walk(leases, lease, report)
        except (LeaseLost, FencedWriteRefused):
            logger.warning("sweep stopped bucket=%d fence=%d", bucket, lease.fence, extra=extra)
            raise
        except Exception:
            # A store outage mid-sweep: free the lease (the checkpoint stays) so the next sweep
            # need not wait for it to expire.
            logger.exception("sweep failed bucket=%d fence=%d", bucket, lease.fence, extra=extra)
            with contextlib.suppress(Exception):
                leases.release(lease)
            raise
        logger.info("sweep end bucket=%d fence=%d examined=%d", bucket, lease.fence,
                    report.examined - before, extra=extra)
        report.buckets += 1
        leases.release(lease)
        return 1

    def _walk(self, leases: Leases, lease: Lease, report: SweepReport) -> None:
        now = self.engine.now()
        passes = default_passes(self.engine, self.scans, now, self.repairers)
        passes += [make(self.engine, self.scans, now) for make in self.extra_passes]
        passes += stray_passes(self.scans)
        fence = Fence.of(lease)
        pagers = [_BucketPager(p, lease.bucket, fence, report, self.page_size) for p in passes]
        start = lease.cursor if lease.cursor and not lease.cursor.startswith(_DONE) else None
        positions = walk(pagers, start)
        try:
            first = next(positions)
        except SagaValidationError:
            if start is None:
                raise
            # A checkpoint this version cannot read (another bucket count, another pass order)
            # would fail every sweep from now on: walk the bucket again from the top instead.
            logger.warning("sweep bucket=%d: unreadable checkpoint, starting over", lease.bucket)
            positions = walk(pagers, None)
            first = next(positions)
        lease = self._checkpoint(leases, lease, first, report)
        for position in positions:
            lease = self._checkpoint(leases, lease, position, report)

    def _checkpoint(self, leases: Leases, lease: Lease, position: str | None,
                    report: SweepReport) -> Lease:
        """Renew the lease and save where the walk is (a done marker at the end)."""
        lease = leases.renew(lease, self.lease_ms)
        leases.checkpoint(lease, position or f"{_DONE}{self.engine.now()}")
        if self.on_page is not None:
            self.on_page(lease, report)
        return lease


def _done_at(lease: Lease) -> int | None:
    """When the lease's bucket was last swept to the end (its ``done@`` checkpoint), or None."""
    cursor = lease.cursor or ""
    if not cursor.startswith(_DONE) or not cursor[len(_DONE):].isdigit():
        return None
    return int(cursor[len(_DONE):])


# ---------------------------------------------------------------- the default passes


def default_passes(engine: Engine, scans: Scans, now: int,
                   repairers: Sequence[Repairer] | None = None) -> list[Pass[Any]]:
    """The saga passes every sweep makes over a bucket, in order; each saga they read gets the
    ``repairers`` (default: the built-in kinds', ``_repairs.default_repairers``) first."""
    timing = engine.settings.timing
    window = window_of(engine, now)
    repairs = list(default_repairers(engine) if repairers is None else repairers)
    return [
        Pass("sagas:due", lambda b, c, n: scans.due_sagas(now + 1, bucket=b, cursor=c, limit=n),
             _advancing(engine, repairs, None, window)),
        _saga_pass(engine, scans, repairs, SagaState.RUNNING, now - timing.stale_ms, window),
        _saga_pass(engine, scans, repairs, SagaState.COMPENSATING, None, window),
        _saga_pass(engine, scans, repairs, SagaState.MANUAL_REVIEW, None, window, act=False),
    ]


def stray_passes(scans: Scans) -> list[Pass[None]]:
    """The last passes of a sweep: saga and approval records in a state no other pass asks
    for (after every other pass, so an older checkpoint keeps its positions)."""
    return [_stray_pass(scans, kind, known) for kind, known in _KNOWN_STATES]


_KNOWN_STATES = ((SAGA, [str(s) for s in SagaState]), (APPROVAL, [str(s) for s in ApprovalState]))


def _stray_pass(scans: Scans, kind: str, known: list[str]) -> Pass[None]:
    """Records in a state no other pass asks for (written by a newer version, or edited by
    hand) are reported corrupt rather than never seen (docs/design.md §5)."""

    def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[None]:
        return scans.strays(kind, known, bucket=bucket, cursor=cursor, limit=limit)

    def act(record: None, fence: Fence, report: SweepReport) -> None:
        """Never called: a stray page holds corrupt records only."""

    return Pass(f"{kind}s:unknown-states", fetch, act)


def _saga_pass(engine: Engine, scans: Scans, repairs: list[Repairer], state: SagaState,
               before: int | None, window: Window, *, act: bool = True) -> Pass[SagaRecord]:
    def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
        return scans.sagas([state], updated_before_ms=before, bucket=bucket, cursor=cursor,
                           limit=limit)

    handle = _advancing(engine, repairs, state, window) if act else _reporting(repairs, window)
    return Pass(f"sagas:{state}", fetch, handle)


def _advancing(engine: Engine, repairs: list[Repairer], state: SagaState | None, window: Window
               ) -> Callable[[SagaRecord, Fence, SweepReport], None]:
    def act(record: SagaRecord, fence: Fence, report: SweepReport) -> None:
        current = repaired(repairs, record, fence)  # held steps: docs/design.md §3.11
        after = engine.advance(record.saga_id, current, fence)
        if after.version != record.version:
            report.acted += 1
        if state is not None and not _reported_elsewhere(state, record, after, window):
            _report(report, after, window)

    return act


def _reporting(repairs: list[Repairer], window: Window
               ) -> Callable[[SagaRecord, Fence, SweepReport], None]:
    def act(record: SagaRecord, fence: Fence, report: SweepReport) -> None:
        # in review for its child: the child may have ended since and its report been lost
        # (docs/design.md §3.7); the child kind's repairer wants it
        _report(report, repaired(repairs, record, fence), window)

    return act


def _report(report: SweepReport, saga: SagaRecord, window: Window) -> None:
    finding = saga_finding(saga, window.stale_before_ms)
    if finding is not None and finding.kind is not FindingKind.STALE:
        report.findings.append(finding)
    report.findings.extend(effect_findings(saga, window))


def _reported_elsewhere(state: SagaState, record: SagaRecord, after: SagaRecord,
                        window: Window) -> bool:
    """Whether this pass must leave a saga's findings out: once per sweep, operators only.

    A saga this pass sent to manual review is reported by the manual-review pass that follows;
    a saga updated since ``stale_before`` (a compensation just dispatched) is work in flight,
    as in the findings report.
    """
    return after.state is SagaState.MANUAL_REVIEW or record.updated_at_ms >= window.stale_before_ms
