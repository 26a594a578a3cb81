"""What the CLI prints: JSON views and plain-text tables of sagas, findings and sweeps.

JSON views carry ids, states, attempts, codes and times (``*_ms``, epoch milliseconds). They
never carry the saga input or step arguments unless ``payload=True``; ``saga_view`` includes
step results, which an operator needs to resolve what came after them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from ._protocol.findings import Finding, FindingKind
from ._records import ApprovalRecord, SagaRecord, SagaState, StepRecord
from ._scans import CorruptRecord
from ._sweep import SweepReport

__all__ = [
    "approval_view",
    "corrupt_view",
    "dumps",
    "finding_hint",
    "finding_view",
    "findings_text",
    "iso",
    "saga_summary",
    "saga_table",
    "saga_text",
    "saga_view",
    "step_view",
    "sweep_text",
    "sweep_view",
    "table",
]


def dumps(value: Any) -> str:
    """Stable, indented JSON for scripts."""
    return json.dumps(value, indent=2, sort_keys=True)


def iso(ms: int | None) -> str:
    """Epoch milliseconds as UTC ISO 8601 with milliseconds; ``-`` for none."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; ``None`` shows as ``-``."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


# ---------------------------------------------------------------- sagas


def saga_summary(record: SagaRecord) -> dict[str, Any]:
    """One saga without steps or payloads."""
    return {
        "saga_id": record.saga_id,
        "definition": record.definition,
        "state": str(record.state),
        "version": record.version,
        "steps": len(record.steps),
        "error_code": record.error_code,
        "reason": record.reason,
        "created_at_ms": record.created_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }


def step_view(step: StepRecord, *, payload: bool = False) -> dict[str, Any]:
    """One step: ids, state, attempts, codes, times and result (arguments only with payload)."""
    view: dict[str, Any] = {
        "name": step.name,
        "task": step.task,
        "compensator": step.compensator,
        "state": str(step.state),
        "effect_id": step.effect_id,
        "compensation_effect_id": step.compensation_effect_id,
        "attempts": step.attempts,
        "compensation_attempts": step.compensation_attempts,
        "error_code": step.error_code,
        "dispatched_at_ms": step.dispatched_at_ms,
        "started_at_ms": step.started_at_ms,
        "committed_at_ms": step.committed_at_ms,
        "next_attempt_at_ms": step.next_attempt_at_ms,
        "time_limit_ms": step.time_limit_ms,
        "claimed_by": step.claimed_by,
        "approval_id": step.approval_id,
        "group": step.group,
        "result": step.result,
    }
    if payload:
        view["args"] = list(step.args)
        view["kwargs"] = dict(step.kwargs)
    return view


def saga_view(record: SagaRecord, *, payload: bool = False) -> dict[str, Any]:
    """A saga with its steps; the input only with ``payload``."""
    view = saga_summary(record)
    view["steps"] = [step_view(step, payload=payload) for step in record.steps]
    if payload:
        view["input"] = record.input
    return view


def saga_table(records: Sequence[SagaRecord]) -> str:
    """The ``list`` table."""
    rows = [
        (r.saga_id, r.definition, r.state, len(r.steps), r.error_code, iso(r.updated_at_ms))
        for r in records
    ]
    return table(("SAGA", "DEFINITION", "STATE", "STEPS", "ERROR", "UPDATED"), rows)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _step_lines(index: int, step: StepRecord, payload: bool) -> list[str]:
    error = f"  error {step.error_code}" if step.error_code else ""
    lines = [f"{index:>2}. {step.name}  {step.state}{error}"]
    started = f"  started {iso(step.started_at_ms)}" if step.started_at_ms is not None else ""
    committed = f"  committed {iso(step.committed_at_ms)}" if step.committed_at_ms is not None else ""
    lines.append(f"    effect        {step.effect_id}  attempts {step.attempts}{started}{committed}")
    if step.compensator is not None:
        due = f"  next attempt {iso(step.next_attempt_at_ms)}" if step.next_attempt_at_ms else ""
        lines.append(f"    compensation  {step.compensation_effect_id}  attempts "
                     f"{step.compensation_attempts}  by {step.compensator}{due}")
    if step.approval_id is not None:
        lines.append(f"    approval      {step.approval_id}")
    if payload:
        lines.append(f"    args {_compact(list(step.args))}  kwargs {_compact(dict(step.kwargs))}")
        lines.append(f"    result {_compact(step.result)}")
    return lines


def saga_text(record: SagaRecord, *, payload: bool = False) -> str:
    """The ``show`` view: a header, then each step as a line of the timeline."""
    state = f"{record.state} ({record.error_code})" if record.error_code else str(record.state)
    lines = [
        f"saga        {record.saga_id}",
        f"definition  {record.definition}",
        f"state       {state}",
    ]
    if record.reason:
        lines.append(f"reason      {record.reason}")
    lines.append(f"created     {iso(record.created_at_ms)}")
    lines.append(f"updated     {iso(record.updated_at_ms)}  (version {record.version})")
    if payload:
        lines.append(f"input       {_compact(record.input)}")
    lines.append("")
    if not record.steps:
        lines.append("no steps recorded yet")
    for index, step in enumerate(record.steps, start=1):
        lines.extend(_step_lines(index, step, payload))
    return "\n".join(lines)


# ---------------------------------------------------------------- findings


def finding_view(finding: Finding) -> dict[str, Any]:
    """A finding as JSON, with the suggested next action."""
    return {
        "kind": str(finding.kind),
        "record_kind": finding.record_kind,
        "record_id": finding.record_id,
        "state": finding.state,
        "step": finding.step,
        "effect_id": finding.effect_id,
        "error_code": finding.error_code,
        "reason": finding.reason,
        "updated_at_ms": finding.updated_at_ms,
        "hint": finding_hint(finding),
    }


def corrupt_view(corrupt: CorruptRecord) -> dict[str, Any]:
    """A record that failed read validation."""
    return {"kind": corrupt.kind, "id": corrupt.id, "reason": corrupt.reason}


def finding_hint(finding: Finding) -> str:
    """What an operator does next about a finding."""
    saga, step, effect = finding.record_id, finding.step, finding.effect_id
    waiting = finding.state != str(SagaState.MANUAL_REVIEW)
    if finding.kind is FindingKind.AMBIGUOUS_EXECUTION:
        if waiting:
            return "in flight past stale_after: the sweep re-sends or judges it (are workers up?)"
        return (f"ask the provider about idempotency key {effect}, then: resolve {saga} "
                f"--step {step} --effect-id {effect} --committed --result JSON | --not-committed")
    if finding.kind is FindingKind.AMBIGUOUS_COMPENSATION:
        if waiting:
            return "compensator in flight past stale_after: the sweep judges it (are workers up?)"
        return (f"ask the provider whether {effect} was undone, then: resolve {saga} "
                f"--step {step} --effect-id {effect} --compensated | --not-compensated")
    if finding.kind is FindingKind.MANUAL_REVIEW:
        return f"fix the cause ({finding.error_code or 'see reason'}), then: resume {saga}"
    if finding.kind is FindingKind.STALE:
        return "not updated for stale_after: is beat running the sweep?"
    if finding.kind is FindingKind.AMBIGUOUS:
        return "began long ago and its outcome is unknown: ask the provider about this effect id"
    if finding.kind is FindingKind.INCOMPLETE:
        return "admitted but never began: see its saga (the sweep re-drives it)"
    if finding.kind is FindingKind.ARCHIVE_FAILED:
        return "past retention but the archive raised: kept; fix the archive (see the ERROR log)"
    return f"{finding.record_kind} record failed read validation: inspect it in the store"


def findings_text(findings: Sequence[Finding], corrupt: Sequence[CorruptRecord]) -> str:
    """The ``findings`` report: one table row per finding, each followed by its hint."""
    if not findings and not corrupt:
        return "no findings: nothing needs an operator"
    lines: list[str] = []
    if findings:
        rows = [
            (f.kind, f.record_id, f.state, f.step, f.effect_id, f.error_code, iso(f.updated_at_ms))
            for f in findings
        ]
        lines.append(table(("KIND", "RECORD", "STATE", "STEP", "EFFECT ID", "ERROR", "UPDATED"), rows))
        lines.append("")
        lines.extend(f"{f.record_kind} {f.record_id}: {finding_hint(f)}" for f in findings)
    for bad in corrupt:
        lines.append(f"corrupt {bad.kind} record {bad.id!r}: {bad.reason}")
    return "\n".join(lines)


# ---------------------------------------------------------------- sweeps and approvals


def sweep_view(report: SweepReport) -> dict[str, Any]:
    """A sweep report as JSON (ids and codes only)."""
    return {
        "acquired": report.acquired,
        "fence": report.fence,
        "complete": report.complete,
        "lease_lost": report.lease_lost,
        "examined": report.examined,
        "acted": report.acted,
        "deleted": report.deleted,
        "errors": report.errors,
        "pages": report.pages,
        "findings": [finding_view(f) for f in report.findings],
        "corrupt": [corrupt_view(c) for c in report.corrupt],
    }


def sweep_text(report: SweepReport) -> str:
    """A sweep report for people."""
    if not report.acquired:
        return "sweep skipped: another sweeper holds the lease"
    status = "complete" if report.complete else "stopped early (lease lost)"
    lines = [
        f"sweep {status} under fence {report.fence}",
        f"examined {report.examined}  acted on {report.acted}  deleted {report.deleted}  "
        f"errors {report.errors}  pages {report.pages}",
    ]
    if report.findings or report.corrupt:
        lines += ["", findings_text(report.findings, report.corrupt)]
    return "\n".join(lines)


def approval_view(record: ApprovalRecord) -> dict[str, Any]:
    """An approval without its token hash."""
    return {
        "approval_id": record.approval_id,
        "state": str(record.state),
        "tenant_id": record.tenant_id,
        "principal_id": record.principal_id,
        "capability": record.capability,
        "target": record.target,
        "decided_by": record.decided_by,
        "saga_id": record.saga_id,
        "step": record.step,
        "expires_at_ms": record.expires_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }
