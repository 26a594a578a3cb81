"""The invariants a run must keep, checked from the providers' ledger and the fence trace.

The ledger is what the fake providers saw, keyed by effect id; the saga records are what the
store says at the end. Together they must show:

1. no saga lost or stuck: every started saga exists and is completed, compensated or in
   manual review;
2. no non-idempotent body ran twice: one ``<op>.start`` per effect id for a step; for a
   compensator and a step declared ``retry_on``, a new run only after the provider reported a
   known failure; and no provider applied one effect id twice;
3. no ambiguous step was compensated, no compensator undid an effect the provider never
   applied, and no step recorded ``failed`` (a known failure: ``run`` may have caught it and
   gone on, nothing will undo it) had its effect applied;
4. a compensated saga undid every committed effect exactly once (a completed one none), and
   every effect a provider applied belongs to a step of its saga's record;
5. no write under a stale lease grant was accepted: a fenced write that began after a newer
   grant of the same lease was known to exist must have been refused, and a sweep made no
   write without its fence;
6. ambiguity is never guessed away: a non-idempotent body SIGKILLed before it finished leaves
   its step ``ambiguous`` (its compensation ``ambiguous_compensation``) for an operator,
   unless the step is declared ``compensate_unknown``: then it is compensated (its step
   record says ``outcome_unknown``), and only such a step may be. A compensation of a
   declared step is no blind compensation: its compensator may start for an effect the
   provider never applied, and must then find nothing to undo;
7. no spurious review: every ambiguity left for an operator traces to a body that really began
   (a ledger ``<op>.start`` of its effect id and attempt), never to a claim whose body never
   ran (a lost claim reply, a worker without the encryption key), unless a fault SIGKILLed
   the claiming process: a claim whose process died before its body began cannot be told
   from one that died in the body, and the system never guesses, so that review is honest.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_sagas._protocol.kinds import kind_of
from celery_sagas._records import SagaRecord, SagaState, StepState
from tests.reliability.app import (
    COMPENSATE_UNKNOWN_STEPS,
    NON_IDEMPOTENT_STEPS,
    RETRIED_AFTER_A_KNOWN_FAILURE,
)

SETTLED = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.MANUAL_REVIEW)
COMPENSATOR_OPS = ("release", "refund")
TERMINAL = (".done", ".dedup", ".fail", ".nothing")
_COMMITTED_ONCE = (StepState.COMMITTED, StepState.COMPENSATING, StepState.COMPENSATION_FAILED,
                   StepState.COMPENSATED)


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with the saga and effect it concerns."""

    rule: str
    saga_id: str | None
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] saga={self.saga_id} {self.detail}"


def _by_op(ledger: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    grouped: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in ledger:
        grouped[line["op"]].append(line)
    return grouped


def _lost_or_stuck(started: Iterable[str], records: Mapping[str, SagaRecord | None]) -> list[Violation]:
    found = []
    for saga_id in started:
        record = records.get(saga_id)
        if record is None:
            found.append(Violation("lost", saga_id, "no record in the store"))
        elif record.state not in SETTLED:
            found.append(Violation("stuck", saga_id, f"still {record.state}"))
    return found


def _double_runs(ops: Mapping[str, list[Mapping[str, Any]]]) -> list[Violation]:
    found = []
    for op in (*NON_IDEMPOTENT_STEPS, "release"):
        starts = Counter(line["effect_id"] for line in ops.get(f"{op}.start", []))
        # The non-idempotent compensator and a retry_on step run again under their effect id
        # only after a known failure (nothing was applied).
        failures = Counter(x["effect_id"] for x in ops.get(f"{op}.fail", [])) \
            if op in RETRIED_AFTER_A_KNOWN_FAILURE else Counter()
        for effect, count in starts.items():
            if count > 1 + failures[effect]:
                saga = next(x["saga_id"] for x in ops[f"{op}.start"] if x["effect_id"] == effect)
                found.append(Violation("double-run", saga, f"{op} body ran {count}x for {effect} "
                                       f"after {failures[effect]} known failures"))
    for op in {key.split(".")[0] for key in ops}:
        for effect, count in Counter(x["effect_id"] for x in ops.get(f"{op}.done", [])).items():
            if count > 1:
                found.append(Violation("double-apply", None, f"{op} applied {count}x for {effect}"))
    return found


def _applied(ops: Mapping[str, list[Mapping[str, Any]]]) -> set[str]:
    """Execution effect ids some provider applied."""
    return {
        line["effect_id"]
        for key, lines in ops.items()
        if key.endswith((".done", ".dedup")) and key.split(".")[0] not in COMPENSATOR_OPS
        for line in lines
    }


def _undos(ops: Mapping[str, list[Mapping[str, Any]]]) -> Counter[str]:
    """How many times each execution effect id was undone by a provider. A ``.dedup`` line
    counts as one undo when no ``.done`` line of its compensation effect id is there: the
    attempt that applied it was killed between the provider's marker and its ledger line."""
    done: Counter[tuple[str, str]] = Counter()
    deduped: set[tuple[str, str]] = set()
    for op in COMPENSATOR_OPS:
        done.update((x["undoes"], x["effect_id"]) for x in ops.get(f"{op}.done", []))
        deduped.update((x["undoes"], x["effect_id"]) for x in ops.get(f"{op}.dedup", []))
    undos: Counter[str] = Counter()
    for undoes, effect in done.keys() | deduped:
        undos[undoes] += done[(undoes, effect)] or 1
    return undos


def _compensation_rules(records: Mapping[str, SagaRecord | None],
                        ops: Mapping[str, list[Mapping[str, Any]]]) -> list[Violation]:
    found = []
    applied, undos = _applied(ops), _undos(ops)
    comp_started = {(x["saga_id"], x["step"]) for op in COMPENSATOR_OPS for x in ops.get(f"{op}.start", [])}
    declared = _declared_unknown(records)
    for line in (x for op in COMPENSATOR_OPS for x in ops.get(f"{op}.start", [])):
        if line["undoes"] not in applied and (line["saga_id"], line["step"]) not in declared:
            found.append(Violation("undo-unapplied", line["saga_id"],
                                   f"{line['op']} started for {line['undoes']}, never applied"))
    for effect, count in undos.items():
        if count > 1:
            found.append(Violation("double-undo", None, f"{effect} undone {count}x"))
    for saga_id, record in records.items():
        if record is None:
            continue
        for step in record.steps:
            if kind_of(step).held:
                continue  # a timer, a signal wait or a child step: no provider effect of its own
            if step.outcome_unknown and step.task not in COMPENSATE_UNKNOWN_STEPS:
                found.append(Violation("blind-compensation", saga_id,
                                       f"{step.name} compensated though not declared"))
            if step.state in _COMMITTED_ONCE and step.effect_id not in applied \
                    and not step.outcome_unknown:
                found.append(Violation("phantom-commit", saga_id,
                                       f"{step.name} is {step.state}, never applied"))
            if step.state is StepState.FAILED and step.effect_id in applied:
                found.append(Violation("failed-applied", saga_id,
                                       f"{step.name} is failed ({step.error_code}), but "
                                       f"{step.effect_id} was applied"))
            if step.state is StepState.AMBIGUOUS and (saga_id, step.name) in comp_started:
                found.append(Violation("ambiguous-compensated", saga_id, f"step {step.name}"))
            if record.state is SagaState.COMPENSATED and step.compensator is not None \
                    and step.effect_id in applied and undos[step.effect_id] != 1:
                found.append(Violation("undo-count", saga_id,
                                       f"{step.name} {step.effect_id} undone "
                                       f"{undos[step.effect_id]}x"))
            if record.state is SagaState.COMPLETED and undos[step.effect_id]:
                found.append(Violation("undo-completed", saga_id, f"{step.name} was undone"))
    return found


def _declared_unknown(records: Mapping[str, SagaRecord | None]) -> set[tuple[str, str]]:
    """(saga, step) of every step compensated although its outcome was unknown, as declared."""
    return {(saga_id, step.name) for saga_id, record in records.items() if record is not None
            for step in record.steps
            if step.outcome_unknown and step.task in COMPENSATE_UNKNOWN_STEPS}


def _orphans(records: Mapping[str, SagaRecord | None],
             ops: Mapping[str, list[Mapping[str, Any]]]) -> list[Violation]:
    """Every applied effect belongs to a step of its saga's record."""
    found = []
    for key, lines in ops.items():
        op = key.split(".")[0]
        if not key.endswith(".done"):
            continue
        for line in lines:
            record = records.get(line["saga_id"])
            if record is None:
                continue
            step = record.step(line["step"])
            expected = None if step is None else (
                step.compensation_effect_id if op in COMPENSATOR_OPS else step.effect_id)
            if expected != line["effect_id"]:
                found.append(Violation("orphan-effect", line["saga_id"],
                                       f"{key} {line['effect_id']} is not in the record"))
    return found


def stale_fenced_writes(trace: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Accepted fenced writes that began after a newer grant of their lease (of their bucket)
    was known."""
    grants: dict[str, list[tuple[int, int]]] = defaultdict(list)
    writes = []
    for entry in trace:
        if entry["ev"] == "grant":
            grants[entry["lease"]].append((entry["t1"], entry["fence"]))
        elif entry["ev"] == "write" and entry["outcome"] == "ok":
            writes.append(entry)
    newest: dict[str, tuple[list[int], list[int]]] = {}
    for lease, items in grants.items():
        items.sort()
        times, running, best = [], [], -1
        for t1, fence in items:
            best = max(best, fence)
            times.append(t1)
            running.append(best)
        newest[lease] = (times, running)
    found = []
    for write in writes:
        times, running = newest.get(write["lease"], ([], []))
        index = bisect.bisect_left(times, write["t0"]) - 1
        if index >= 0 and running[index] > write["fence"]:
            found.append(Violation("stale-fence", write.get("id"),
                                   f"write under fence {write['fence']} accepted after grant "
                                   f"{running[index]}"))
    return found


def unfenced_sweep_writes(trace: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Writes a sweep made without its lease's fence."""
    return [
        Violation("unfenced-sweep-write", e["id"], f"{e['kind']} -> {e['state']} ({e['outcome']})")
        for e in trace if e["ev"] == "unfenced"
    ]


def fence_stats(trace: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Grants (takeovers among them), and fenced writes by outcome."""
    counts: Counter[str] = Counter()
    for entry in trace:
        if entry["ev"] == "grant":
            counts["grants"] += 1
            if entry.get("replaced") is not None:  # a lease taken over from a gone holder
                counts["takeovers"] += 1
        elif entry["ev"] == "write":
            counts[f"writes_{entry['outcome']}"] += 1
        elif entry["ev"] == "unfenced":
            counts[f"unfenced_{entry['kind']}_writes"] += 1
    return dict(counts)


def _unguessed(killed: Iterable[Mapping[str, Any]], records: Mapping[str, SagaRecord | None],
               ops: Mapping[str, list[Mapping[str, Any]]]) -> list[Violation]:
    """A non-idempotent body killed before it finished leaves its outcome unknown for good."""
    finished = {(x["effect_id"], x["attempt"]) for key, lines in ops.items()
                if key.endswith(TERMINAL) for x in lines}
    found = []
    for body in killed:
        op = body["op"].split(".")[0]
        record = records.get(body["saga_id"])
        step = None if record is None else record.step(body["step"])
        if step is None or (body["effect_id"], body["attempt"]) in finished:
            continue
        if op in NON_IDEMPOTENT_STEPS and step.state is not StepState.AMBIGUOUS \
                and not (step.outcome_unknown and step.task in COMPENSATE_UNKNOWN_STEPS):
            found.append(Violation("guessed", body["saga_id"],
                                   f"{op} killed mid-body, step ended {step.state}"))
        if op == "release" and not (step.state is StepState.COMPENSATING
                                    and step.error_code == "ambiguous_compensation"):
            found.append(Violation("guessed", body["saga_id"],
                                   f"release killed mid-body, step ended {step.state}"))
    return found


def _spurious_reviews(records: Mapping[str, SagaRecord | None],
                      ops: Mapping[str, list[Mapping[str, Any]]],
                      killed_pids: frozenset[int] = frozenset()) -> list[Violation]:
    """Every ambiguous step or compensation has a body that began under its effect id and
    attempt (the providers' ledger), or a claimer a fault SIGKILLed."""
    began = {(line["effect_id"], line["attempt"]) for key, lines in ops.items()
             if key.endswith(".start") for line in lines}
    found = []
    for saga_id, record in records.items():
        for step in () if record is None else record.steps:
            if kind_of(step).held:
                continue
            if step.state is StepState.AMBIGUOUS:
                attempt = (step.effect_id, step.attempts)
            elif step.state is StepState.COMPENSATING and step.error_code == "ambiguous_compensation":
                attempt = (step.compensation_effect_id, step.compensation_attempts)
            else:
                continue
            if attempt not in began and _claimer_pid(step.claimed_by) not in killed_pids:
                found.append(Violation("spurious-review", saga_id,
                                       f"{step.name} is {step.state} ({step.error_code}) but no "
                                       f"body began for {attempt[0]} attempt {attempt[1]}"))
    return found


def _claimer_pid(claimed_by: str | None) -> int | None:
    """The pid of a claim tag (``host:pid/nonce``), if it has one."""
    pid = (claimed_by or "").split("/", 1)[0].rpartition(":")[2]
    return int(pid) if pid.isdigit() else None


def check(started: Iterable[str], records: Mapping[str, SagaRecord | None],
          ledger: Iterable[Mapping[str, Any]], trace: Iterable[Mapping[str, Any]],
          killed: Iterable[Mapping[str, Any]] = (),
          killed_pids: frozenset[int] = frozenset()) -> list[Violation]:
    """Every invariant violation of a run (an empty list when the run was correct).

    ``killed``: ledger ``.start`` lines of bodies a fault SIGKILLed while they ran;
    ``killed_pids``: every process a fault SIGKILLed.
    """
    ops = _by_op(ledger)
    return [
        *_lost_or_stuck(started, records),
        *_double_runs(ops),
        *_compensation_rules(records, ops),
        *_orphans(records, ops),
        *_unguessed(killed, records, ops),
        *_spurious_reviews(records, ops, killed_pids),
        *stale_fenced_writes(trace),
        *unfenced_sweep_writes(trace),
    ]
