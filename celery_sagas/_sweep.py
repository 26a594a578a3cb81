"""The reconciliation sweep (SPEC §5): paged passes over open sagas under a fenced lease.

One sweeper at a time holds the lease ``celery_sagas.sweep``. It walks, page by page:

1. ``running`` sagas not updated for ``stale_ms``: re-drive them (lost messages are sent again
   under the same effect id; started-but-silent steps past their time limit become ambiguous);
2. every ``compensating`` saga: run compensation retries that are due;
3. every ``manual-review`` saga: report it;
4. effects journaled in ``admission`` since before ``stale_ms`` (incomplete), and effects
   ``executing``/``unknown`` past the longest time limit plus grace (ambiguous): report them;
5. extra passes registered by other features (approval expiry).

(The due wake-ups pass runs first.) At the end, every finding and corrupt record is reported
as a ``FindingEvent`` on the engine's event bus: logged on ``celery_sagas.findings`` with
structured fields, delivered to finding observers and counted by the metrics.

After each page it renews the lease and checkpoints its cursor; when either fails it stops at
once, and the next holder continues from the checkpoint. Every write it makes carries the
lease's fencing number, so a sweeper paused past its lease (GC, SIGSTOP) cannot write after a
newer grant. Running twice at once is safe anyway: every action is a compare-and-set.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ._engine import Engine
from ._findings import corrupt_finding, count_sagas, finding_event, window_of
from ._leases import Leases
from ._protocol.findings import Finding, FindingKind, effect_finding, saga_finding
from ._records import EffectRecord, EffectState, SagaRecord, SagaState
from ._scans import CorruptRecord, RecordPage, scan_effects, scan_sagas
from ._wakeups import DUE, WAKEUP, Wakeup, fired, wakeup_from_envelope
from .errors import (
    FencedWriteRefused,
    InvalidRecordError,
    LeaseLost,
    SagaError,
    SagaValidationError,
)
from .stores.base import Fence, Lease

__all__ = ["SWEEP_LEASE", "Pass", "SweepReport", "sweep"]

logger = logging.getLogger("celery_sagas.sweep")

SWEEP_LEASE = "celery_sagas.sweep"


@dataclass
class SweepReport:
    """What one sweep did; findings carry ids and codes only."""

    acquired: bool = False
    fence: int | None = None
    complete: bool = False
    lease_lost: bool = False
    examined: int = 0
    acted: int = 0
    errors: int = 0
    findings: list[Finding] = field(default_factory=list)
    corrupt: list[CorruptRecord] = field(default_factory=list)
    pages: int = 0
    states: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pass:
    """One paged walk: fetch a page at a cursor, then act on each record of it."""

    name: str
    fetch: Callable[[str | None, int], RecordPage[object]]
    act: Callable[[object, Fence, SweepReport], None]


def _saga_pass(engine: Engine, state: SagaState, stale_ms: int | None, act: bool) -> Pass:
    now = engine.now()
    before = None if stale_ms is None else now - stale_ms
    stale_before = now - engine.settings.timing.stale_ms

    def fetch(cursor: str | None, limit: int) -> RecordPage[object]:
        page = scan_sagas(engine.store, [state], updated_before_ms=before, cursor=cursor, limit=limit)
        return RecordPage(tuple(page.records), page.corrupt, page.cursor)

    def handle(record: object, fence: Fence, report: SweepReport) -> None:
        assert isinstance(record, SagaRecord)
        current = record
        if act and engine.reconcile_gates is not None and record.state is SagaState.RUNNING:
            current = engine.reconcile_gates(record, fence)
        after = engine.advance(record.saga_id, current, fence) if act else record
        if after.version != record.version:
            report.acted += 1
        if _reported_elsewhere(state, record, after, stale_before):
            return
        finding = saga_finding(after, stale_before)
        if finding is not None and finding.kind is not FindingKind.STALE:
            report.findings.append(finding)

    return Pass(f"sagas:{state}", fetch, handle)


def _reported_elsewhere(state: SagaState, record: SagaRecord, after: SagaRecord,
                        stale_before: int) -> bool:
    """Whether this pass must leave a saga's finding out: once per sweep, operators only.

    A saga this pass sent to manual review is reported by the manual-review pass that follows;
    a saga updated since ``stale_before`` (a compensation just dispatched) is work in flight,
    as in ``reports.page_findings``.
    """
    if state is SagaState.MANUAL_REVIEW:
        return False
    return after.state is SagaState.MANUAL_REVIEW or record.updated_at_ms >= stale_before


def _wakeup_pass(engine: Engine) -> Pass:
    """Sagas whose wake-up (a retry due later than a delivery could wait) is due now."""
    now = engine.now()

    def fetch(cursor: str | None, limit: int) -> RecordPage[object]:
        page = engine.store.scan(WAKEUP, [DUE], updated_before_ms=now + 1, cursor=cursor,
                                 limit=limit)
        wakeups: list[Wakeup] = []
        corrupt: list[CorruptRecord] = []
        for envelope in page.items:
            # A corrupt wake-up stays due: reported like any corrupt record, never acted on.
            try:
                if envelope.kind != WAKEUP or envelope.state != DUE:
                    raise InvalidRecordError(kind=WAKEUP, record_id=envelope.id)
                wakeups.append(wakeup_from_envelope(envelope))
            except InvalidRecordError:
                corrupt.append(CorruptRecord(WAKEUP, envelope.id, "failed read validation"))
        return RecordPage(tuple(wakeups), tuple(corrupt), page.cursor)

    def handle(record: object, fence: Fence, report: SweepReport) -> None:
        assert isinstance(record, Wakeup)
        wakeup = record
        saga = engine.get(wakeup.saga_id)
        if saga is not None:
            after = engine.advance(saga.saga_id, saga, fence)
            report.acted += after.version != saga.version
        fired(engine.store, wakeup, now, fence)

    return Pass("wakeups", fetch, handle)


def _effect_pass(engine: Engine, states: list[EffectState], before: int) -> Pass:
    """Effects left behind (SPEC §5): admission since before ``before`` -> incomplete,
    executing/unknown -> ambiguous. Read-only: the saga record stays authoritative."""

    def fetch(cursor: str | None, limit: int) -> RecordPage[object]:
        page = scan_effects(engine.store, states, updated_before_ms=before, cursor=cursor, limit=limit)
        return RecordPage(tuple(page.records), page.corrupt, page.cursor)

    def handle(record: object, fence: Fence, report: SweepReport) -> None:
        assert isinstance(record, EffectRecord)
        finding = effect_finding(record, before)
        if finding is not None:
            report.findings.append(finding)

    return Pass(f"effects:{'+'.join(str(s) for s in states)}", fetch, handle)


def default_passes(engine: Engine) -> list[Pass]:
    """The saga passes every sweep makes, then the effect-findings passes."""
    stale = engine.settings.timing.stale_ms
    window = window_of(engine)
    return [
        _wakeup_pass(engine),
        _saga_pass(engine, SagaState.RUNNING, stale, act=True),
        _saga_pass(engine, SagaState.COMPENSATING, None, act=True),
        _saga_pass(engine, SagaState.MANUAL_REVIEW, None, act=False),
        _effect_pass(engine, [EffectState.ADMISSION], window.stale_before_ms),
        _effect_pass(engine, [EffectState.EXECUTING, EffectState.UNKNOWN], window.in_flight_before_ms),
    ]


def _position(cursor: str | None, passes: list[Pass]) -> tuple[int, str | None]:
    """Decode ``<pass index>:<store cursor>``; anything unreadable starts from the top."""
    if not cursor or ":" not in cursor:
        return 0, None
    index, _, inner = cursor.partition(":")
    if not index.isdigit() or int(index) >= len(passes):
        return 0, None
    return int(index), inner or None


def sweep(
    engine: Engine,
    *,
    owner: str,
    lease_ms: int,
    page_size: int = 100,
    extra_passes: list[Pass] | None = None,
    on_page: Callable[[Lease, SweepReport], None] | None = None,
    count_cap: int = 0,
) -> SweepReport:
    """One reconciliation pass under the sweep lease; returns at once if another holds it.

    Whatever it found for an operator (and every corrupt record) is reported at the end, even
    when the lease was lost midway: one ``FindingEvent`` each to the engine's event bus (log
    and observers, hence metrics). With ``count_cap`` it also counts the open sagas per state
    (up to that many each) into ``report.states``, for the metrics gauge.
    """
    report = SweepReport()
    leases = Leases(engine.store, engine.clock, owner=owner)
    lease = leases.acquire(SWEEP_LEASE, lease_ms)
    if lease is None:
        return report
    report.acquired, report.fence = True, lease.fence
    # Start and end lines bracket the time the lease is held: their fences prove who swept when.
    logger.info("sweep start fence=%d owner=%s", lease.fence, owner, extra={"fence": lease.fence})
    try:
        passes = default_passes(engine) + list(extra_passes or [])
        _walk(engine, leases, lease, passes, lease_ms, page_size, report, on_page)
        if count_cap:
            report.states = count_sagas(engine.store, cap=count_cap)
    except (LeaseLost, FencedWriteRefused) as exc:
        report.lease_lost = True
        logger.warning("sweep stopped fence=%d: %s", lease.fence, exc, extra={"fence": lease.fence})
        return report
    except Exception:
        # A store outage mid-sweep: free the lease (the checkpoint stays) so the next sweep
        # need not wait for it to expire.
        logger.exception("sweep failed fence=%d", lease.fence, extra={"fence": lease.fence})
        with contextlib.suppress(Exception):
            leases.release(lease)
        raise
    finally:
        _report_findings(engine, report)
    logger.info(
        "sweep end fence=%d examined=%d acted=%d pages=%d",
        lease.fence, report.examined, report.acted, report.pages, extra={"fence": lease.fence},
    )
    leases.release(lease)
    return report


def _walk(
    engine: Engine, leases: Leases, lease: Lease, passes: list[Pass], lease_ms: int,
    page_size: int, report: SweepReport, on_page: Callable[[Lease, SweepReport], None] | None,
) -> None:
    index, cursor = _position(lease.cursor, passes)
    # Only the cursor read from the checkpoint may be one this version cannot read; a cursor
    # the store just returned that it then refuses is a bug, and restarting would loop forever.
    from_checkpoint = cursor is not None
    while index < len(passes):
        current = passes[index]
        try:
            page = current.fetch(cursor, page_size)
        except SagaValidationError:
            if not from_checkpoint:
                raise
            # A checkpoint this version cannot read (other bucket count, other pass order) would
            # fail every sweep from now on: walk this pass again from the top instead.
            logger.warning("sweep %s: unreadable checkpoint, restarting the pass", current.name)
            cursor, from_checkpoint = None, False
            continue
        from_checkpoint = False
        report.pages += 1
        report.corrupt.extend(page.corrupt)
        for record in page.records:
            report.examined += 1
            _act(current, record, Fence.of(lease), report)
        lease = leases.renew(lease, lease_ms)
        if page.cursor is None:
            index, cursor = index + 1, None
        else:
            cursor = page.cursor
        leases.checkpoint(lease, None if index >= len(passes) else f"{index}:{cursor or ''}")
        if on_page is not None:
            on_page(lease, report)
    report.complete = True


def _act(current: Pass, record: object, fence: Fence, report: SweepReport) -> None:
    try:
        current.act(record, fence, report)
    except FencedWriteRefused:
        raise
    except SagaError as exc:
        report.errors += 1
        logger.warning("sweep %s: %s", current.name, type(exc).__name__)
    except Exception:
        report.errors += 1
        logger.exception("sweep %s: unexpected error", current.name)


def _report_findings(engine: Engine, report: SweepReport) -> None:
    """Send every finding and corrupt record of this sweep to the event bus."""
    for finding in (*report.findings, *(corrupt_finding(c) for c in report.corrupt)):
        engine.events.report(finding_event(finding, report.fence))
