"""What the CLI prints: JSON views and plain-text tables of sagas, findings and sweeps.

JSON views carry ids, states, attempts, codes and times (``*_ms``, epoch milliseconds). They
never carry the saga input or step arguments unless ``payload=True``; ``saga_view`` includes
step results, which an operator needs to resolve what came after them. A payload no configured
key decrypts (``ENCRYPTED``) prints as ``<encrypted>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from ._protocol import codes
from ._protocol.findings import Finding, FindingKind, hint_of, review_advice
from ._protocol.kinds import child_id_of
from ._records import (
    ENCRYPTED,
    ApprovalRecord,
    SagaRecord,
    StepRecord,
    StepState,
)
from ._scans import CorruptRecord
from ._sweep import SweepReport
from ._values import printable

__all__ = [
    "approval_view",
    "corrupt_view",
    "dumps",
    "finding_hint",
    "finding_view",
    "findings_text",
    "iso",
    "printable",
    "saga_summary",
    "saga_table",
    "saga_text",
    "saga_view",
    "shown",
    "step_view",
    "sweep_text",
    "sweep_view",
    "table",
]


def dumps(value: Any) -> str:
    """Stable, indented JSON for scripts."""
    return json.dumps(value, indent=2, sort_keys=True)


def shown(value: object, convert: Callable[[Any], Any] | None = None) -> Any:
    """A payload as printed (through ``convert``): ``<encrypted>`` where no key decrypted it."""
    if value is ENCRYPTED:
        return str(value)
    return value if convert is None else convert(value)


def iso(ms: int | None) -> str:
    """Epoch milliseconds as UTC ISO 8601 with milliseconds; ``-`` for none."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; ``None`` shows as ``-``; control
    characters in a cell are escaped, so no value can forge a row."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None else printable(c) for c in row] for row in rows]
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
        "exception": shown(record.exception),
        "traceback": record.traceback,
        "created_at_ms": record.created_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }


_COMPENSATION_PHASE = frozenset(
    {StepState.COMPENSATING, StepState.COMPENSATION_FAILED, StepState.COMPENSATED}
)


def _phase_times(step: StepRecord) -> dict[str, int | None]:
    """The step's times split by phase: the record keeps one ``started_at_ms`` (and one
    ``dispatched_at_ms``, ``next_attempt_at_ms``) for whichever attempt is current, so a
    compensated step's "started" is its compensator's, never its forward attempt's."""
    current = (step.dispatched_at_ms, step.started_at_ms, step.next_attempt_at_ms)
    none = (None, None, None)
    forward, back = (none, current) if step.state in _COMPENSATION_PHASE else (current, none)
    mark = step.compensation
    compensated = step.state is StepState.COMPENSATED and mark is not None
    return {
        "dispatched_at_ms": forward[0],
        "started_at_ms": forward[1],
        "committed_at_ms": step.committed_at_ms,
        "next_attempt_at_ms": forward[2],
        "compensation_dispatched_at_ms": back[0],
        "compensation_started_at_ms": back[1],
        "compensated_at_ms": mark.at_ms if compensated and mark is not None else None,
        "compensation_next_attempt_at_ms": back[2],
    }


def step_view(step: StepRecord, *, payload: bool = False) -> dict[str, Any]:
    """One step: ids, state, attempts, codes, forward and compensation times and result
    (arguments only with payload)."""
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
        "exception": shown(step.exception),
        "traceback": step.traceback,
        **_phase_times(step),
        "time_limit_ms": step.time_limit_ms,
        "claimed_by": step.claimed_by,
        "approval_id": step.approval_id,
        "group": step.group,
        "wake_at_ms": step.wake_at_ms,
        "outcome_unknown": bool(step.outcome_unknown),
        "result": shown(step.result),
    }
    if payload:
        view["args"] = shown(step.args, list)
        view["kwargs"] = shown(step.kwargs, dict)
    return view


def saga_view(record: SagaRecord, *, payload: bool = False) -> dict[str, Any]:
    """A saga with its steps, patches, parent and signals (their payloads, the input and the
    result only with ``payload``)."""
    view = saga_summary(record)
    view["steps"] = [step_view(step, payload=payload) for step in record.steps]
    view["patches"] = list(record.patches)
    view["parent"] = None if record.parent is None else {
        "saga_id": record.parent.saga_id, "step": record.parent.step}
    view["signals"] = [
        {"signal_id": s.signal_id, "name": s.name, "sent_at_ms": s.sent_at_ms,
         "consumed_by": s.consumed_by, **({"payload": s.payload} if payload else {})}
        for s in record.signals
    ]
    if payload:
        view["input"] = shown(record.input)
        view["result"] = shown(record.result)
    return view


def saga_table(records: Sequence[SagaRecord]) -> str:
    """The ``list`` table."""
    rows = [
        (r.saga_id, r.definition, r.state, len(r.steps), r.error_code, iso(r.updated_at_ms))
        for r in records
    ]
    return table(("SAGA", "DEFINITION", "STATE", "STEPS", "ERROR", "UPDATED"), rows)


def _compact(value: object, convert: Callable[[Any], Any] | None = None) -> str:
    if value is ENCRYPTED:
        return str(value)
    return json.dumps(shown(value, convert), sort_keys=True, separators=(",", ":"))


def _times(times: dict[str, int | None], labels: Sequence[tuple[str, str]]) -> str:
    return "".join(f"  {label} {iso(times[key])}" for key, label in labels
                   if times[key] is not None)


_FORWARD_TIMES = (("started_at_ms", "started"), ("committed_at_ms", "committed"),
                  ("next_attempt_at_ms", "next attempt"))
_COMPENSATION_TIMES = (("compensation_started_at_ms", "started"),
                       ("compensated_at_ms", "compensated"),
                       ("compensation_next_attempt_at_ms", "next attempt"))


def _step_lines(index: int, step: StepRecord, payload: bool) -> list[str]:
    error = f"  error {step.error_code}" if step.error_code else ""
    unknown = "  (outcome unknown: compensated as declared)" if step.outcome_unknown else ""
    lines = [f"{index:>2}. {step.name}  {step.state}{error}{unknown}"]
    times = _phase_times(step)
    lines.append(f"    effect        {step.effect_id}  attempts {step.attempts}"
                 f"{_times(times, _FORWARD_TIMES)}")
    if step.compensator is not None:
        lines.append(f"    compensation  {step.compensation_effect_id}  attempts "
                     f"{step.compensation_attempts}  by {step.compensator}"
                     f"{_times(times, _COMPENSATION_TIMES)}")
    if step.approval_id is not None:
        lines.append(f"    approval      {step.approval_id}")
    if step.exception is not None:
        lines.append(f"    raised        {printable(str(step.exception))}")
    lines += _frames(step.traceback, "    where         ")
    if step.wake_at_ms is not None:
        lines.append(f"    wakes         {iso(step.wake_at_ms)}")
    child = child_id_of(step)  # None for ENCRYPTED kwargs without keys
    if child is not None:
        lines.append(f"    child saga    {printable(str(child))}")
    if payload:
        lines.append(f"    args {_compact(step.args, list)}  kwargs {_compact(step.kwargs, dict)}")
        lines.append(f"    result {_compact(step.result)}")
    return lines


def _frames(summary: str | None, label: str) -> list[str]:
    """The lines of a traceback summary, the first after ``label``, the others aligned."""
    if not summary:
        return []
    pad = " " * len(label)
    return [f"{label if n == 0 else pad}{printable(line)}"
            for n, line in enumerate(summary.splitlines())]


def saga_text(record: SagaRecord, *, payload: bool = False) -> str:
    """The ``show`` view: a header, then each step as a line of the timeline."""
    state = f"{record.state} ({record.error_code})" if record.error_code else str(record.state)
    lines = [
        f"saga        {record.saga_id}",
        f"definition  {record.definition}",
        f"state       {printable(state)}",
    ]
    if record.reason:
        lines.append(f"reason      {printable(record.reason)}")
    if record.exception:
        lines.append(f"raised      {printable(str(record.exception))}")
    lines += _frames(record.traceback, "where       ")
    if record.parent is not None:
        lines.append(f"parent      {record.parent.saga_id} (step {record.parent.step})")
    if record.patches:
        lines.append(f"patches     {printable(', '.join(record.patches))}")
    for signal in record.signals:
        taken = f"received by {signal.consumed_by}" if signal.consumed_by else "not received yet"
        lines.append(f"signal      {printable(signal.name)} {printable(signal.signal_id)} at "
                     f"{iso(signal.sent_at_ms)}, {taken}")
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
    """What an operator does next about a finding (true for its kind, state and error code)."""
    if finding.kind is FindingKind.MANUAL_REVIEW:
        saga, step, effect = finding.record_id, finding.step, finding.effect_id
        advice = review_advice(finding.error_code)
        if finding.error_code == codes.COMPENSATION_EXHAUSTED and step is not None:
            advice += f" (resolve {saga} --step {step} --effect-id {effect} --compensated)"
        return f"{advice}: resume {saga} | cancel {saga}"
    return hint_of(finding).cli


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
        lines.extend(printable(f"{f.record_kind} {f.record_id}: {finding_hint(f)}")
                     for f in findings)
    for bad in corrupt:
        lines.append(f"corrupt {bad.kind} record {bad.id!r}: {printable(bad.reason)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- sweeps and approvals


_SWEEP_FIELDS = ("acquired", "fence", "complete", "lease_lost", "held", "examined", "acted",
                 "deleted", "errors", "pages")  # as they are; findings and corrupt records by their views


def sweep_view(report: SweepReport) -> dict[str, Any]:
    """A sweep report as JSON (ids and codes only)."""
    view = {name: getattr(report, name) for name in _SWEEP_FIELDS}
    view["findings"] = [finding_view(f) for f in report.findings]
    view["corrupt"] = [corrupt_view(c) for c in report.corrupt]
    return view


def sweep_text(report: SweepReport) -> str:
    """A sweep report for people."""
    if not report.acquired:
        return "sweep skipped: another sweeper holds the lease"
    head = f"sweep complete under fence {report.fence}"
    if report.lease_lost:
        head = f"sweep stopped early (lease lost) under fence {report.fence}"
    elif report.held:
        swept = report.total_buckets - len(report.held)
        head = (f"sweep partial under fence {report.fence}: swept {swept} of "
                f"{report.total_buckets} buckets; another sweeper holds bucket "
                + ", ".join(map(str, sorted(report.held))))
    lines = [
        head,
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
