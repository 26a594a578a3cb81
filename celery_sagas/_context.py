"""The contexts user code sees: ``SagaContext`` for ``run(ctx, input)``, ``StepContext`` for
step and compensator bodies.

``replay`` runs a definition's ``run`` against a saga record. Each ``ctx.step`` consults the
record through ``protocol.replay.match_call``: a committed step returns its stored result, an
uncommitted one stops the replay (by raising a ``BaseException`` that user ``except Exception``
blocks do not catch), a new one is turned into a step record to append.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from . import _values as values
from ._definitions import Registry, SagaDefinition
from ._events import Stage
from ._frozen import replace
from ._protocol import codes
from ._protocol.children import child_saga_id
from ._protocol.kinds import APPROVAL, CHILD, SIGNAL, TIMER, StepKind, kind_of, timed_out
from ._protocol.replay import (
    Crashed,
    Diverged,
    Mismatch,
    New,
    Outcome,
    Refused,
    Returned,
    StepCall,
    Suspended,
    match_call,
    unreached,
)
from ._records import SagaRecord, StepRecord, StepState
from .errors import SagaValidationError, SignalTimeout, StepFailed, StepNotCommitted

__all__ = [
    "Call",
    "ChildCall",
    "CompensationReason",
    "SagaContext",
    "StepContext",
    "replay",
    "signature_of",
    "step_accepts",
]

logger = logging.getLogger("celery_sagas.engine")



@dataclass(frozen=True, slots=True)
class CompensationReason:
    """Why a saga compensates: the step and error code that turned it back (``step`` is None
    when ``run`` refused to go on, or the saga was cancelled: code ``cancelled``)."""

    code: str
    step: str | None = None

    def __str__(self) -> str:
        return self.code if self.step is None else f"{self.step}: {self.code}"


@dataclass(frozen=True, slots=True)
class StepContext:
    """Handed to a step or compensator body that declares a keyword ``saga``.

    A compensator's context also says what it undoes and why: ``input`` (the saga's input),
    ``forward_effect_id`` (the effect id of the step being undone: the idempotency key its
    provider saw), ``reason`` (a ``CompensationReason``) and ``outcome`` (``"committed"``, or
    ``"unknown"`` for a step declared ``compensate_unknown`` whose outcome is unknown: there
    may be nothing to undo). They are None for a step body.
    """

    saga_id: str
    step: str
    effect_id: str
    attempt: int
    stage: Stage = Stage.EXECUTION
    input: Any = None
    forward_effect_id: str | None = None
    reason: CompensationReason | None = None
    outcome: str | None = None

    @property
    def idempotency_key(self) -> str:
        """The key to hand to the provider: the effect id."""
        return self.effect_id


@dataclass(frozen=True, slots=True)
class Call:
    """A step to run inside ``ctx.parallel``; made by ``ctx.call``."""

    task: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    step_name: str | None = None


@dataclass(frozen=True, slots=True)
class ChildCall:
    """A child saga to run inside ``ctx.parallel``; made by ``ctx.call_child``."""

    definition: Any
    input: Any
    saga_id: str | None = None


class _Suspend(BaseException):
    """Stops a replay at uncommitted steps."""

    def __init__(self, new_steps: tuple[StepRecord, ...] = ()) -> None:
        super().__init__("suspend")
        self.new_steps = new_steps


class _Stop(BaseException):
    """Stops a replay with a final outcome (divergence or misuse)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("stop")
        self.outcome = outcome


class SagaContext:
    """What ``run(ctx, input)`` uses to ask for steps; every call is matched to the record."""

    def __init__(
        self,
        saga: SagaRecord,
        registry: Registry,
        new_id: Callable[[], str],
        now_ms: int,
        local_id: Callable[[], str] | None = None,
        colocate: Callable[[str], str] | None = None,
    ) -> None:
        # new_id draws effect ids; local_id draws ids of records the saga owns (approvals),
        # which must fall in the saga's bucket (docs/design.md §4.2); colocate moves a default
        # child saga id into it the same way on every replay.
        self._saga = saga
        self._colocate = colocate or (lambda candidate: candidate)
        self._registry = registry
        self._new_id = new_id
        self._local_id = local_id or new_id
        self._now_ms = now_ms
        self._position = 0
        self._names: dict[str, int] = {}
        self._used: set[str] = set()
        self.new_patches: list[str] = []

    @property
    def saga_id(self) -> str:
        """The id of the saga being replayed."""
        return self._saga.saga_id

    @property
    def input(self) -> Any:
        """The saga input (also passed to run as its second argument)."""
        return self._saga.input

    def step(self, task: Any, *args: Any, step_name: str | None = None, **kwargs: Any) -> Any:
        """Run ``task(*args, **kwargs)`` as the next step; returns its committed result."""
        return self.parallel(Call(task, args, kwargs, step_name))[0]

    def call(self, task: Any, *args: Any, step_name: str | None = None, **kwargs: Any) -> Call:
        """Describe a step for ``ctx.parallel`` without running it."""
        return Call(task, args, kwargs, step_name)

    def child(self, definition: Any, input: Any, saga_id: str | None = None) -> Any:
        """Run the saga ``definition`` (the object ``@sagas.saga`` returned, or its name) with
        ``input`` as a child of this one and return its result (the value its ``run``
        returned). The parent holds no worker meanwhile. A child that ends compensated fails
        this call as not committed (``child_compensated``); when this saga compensates later,
        a completed child is compensated as a unit. ``saga_id`` defaults to one derived from
        this saga's id and the call's position (docs/design.md §3.7)."""
        return self.parallel(self.call_child(definition, input, saga_id))[0]

    def call_child(self, definition: Any, input: Any, saga_id: str | None = None) -> ChildCall:
        """Describe a child saga for ``ctx.parallel`` (beside ``ctx.call(...)`` steps)."""
        return ChildCall(definition, input, saga_id)

    def parallel(self, *calls: Call | ChildCall) -> list[Any]:
        """Run several steps (and child sagas) at once; returns their results in order once
        all committed."""
        if not calls:
            return []  # a fan-out whose width comes from the input may be empty
        if not all(isinstance(c, (Call, ChildCall)) for c in calls):
            self._misuse("ctx.parallel takes ctx.call(...) or ctx.call_child(...) values "
                         "(unpack a list with *)")
        group = f"parallel-{self._position + 1}" if len(calls) > 1 else None
        step_calls = [self._child_call(c, group, self._position + i) if isinstance(c, ChildCall)
                      else self._step_call(c, group) for i, c in enumerate(calls)]
        matches = [match_call(self._saga, self._position + i, c) for i, c in enumerate(step_calls)]
        self._position += len(calls)
        for match in matches:
            if isinstance(match, Mismatch):
                raise _Stop(Diverged(match.reason))
        if all(isinstance(m, New) for m in matches):
            raise _Suspend(tuple(self._new_step(c) for c in step_calls))
        if any(isinstance(m, New) for m in matches):
            raise _Stop(Diverged("a parallel group was recorded only in part"))
        recorded = [m.step for m in matches if not isinstance(m, (New, Mismatch))]
        if all(s.state is StepState.COMMITTED for s in recorded):
            return [s.result for s in recorded]
        if len(recorded) == 1 and recorded[0].state is StepState.FAILED \
                and recorded[0].group is None and not self._saga.rolling_back:
            failed = recorded[0]  # a known failure left to run (docs/design.md §3.2)
            raise StepFailed(failed.name, failed.error_code or codes.NOT_COMMITTED,
                             str(failed.exception or ""))
        raise _Suspend()

    def approval(
        self,
        name: str,
        *,
        capability: str,
        tenant_id: str,
        principal_id: str,
        target: str | None = None,
        digest: str | None = None,
    ) -> Any:
        """Stop until a human approves (then return the decision) or denies (then roll back).

        The gate is a step named ``name`` that holds no worker while it waits. The token goes
        to whoever started the saga (``sagas.approvals.pending(saga_id)``); approving and then
        ``sagas.approvals.resume(saga_id, token, ...)`` lets the saga go on. A denial or the
        approval's expiry counts as not committed: what came before is compensated.
        """
        binding = {"capability": capability, "tenant_id": tenant_id,
                   "principal_id": principal_id, "target": target, "digest": digest}
        try:
            values.capability(capability)
            values.tenant_id(tenant_id)
            values.principal_id(principal_id)
            _ = target is None or values.target(target)
            _ = digest is None or values.digest(digest)
        except SagaValidationError as exc:
            raise _Stop(Crashed(codes.INVALID_STEP_CALL, str(exc))) from None
        call = StepCall(self._name(name, APPROVAL.task), APPROVAL.task, (), binding, None)
        return self._held(call, lambda: {"state": APPROVAL.held_state,
                                         "approval_id": self._local_id()})

    def sleep(self, seconds: float | timedelta, *, step_name: str | None = None) -> None:
        """Park the saga for ``seconds`` (a number or a ``timedelta``, at most 366 days; no
        worker waits, no message is queued): the sweep resumes it once the time has come; on
        replay a fired timer returns at once."""
        delay = self._checked(lambda: values.seconds_ms(seconds, field="sleep seconds"))
        self._timer({"seconds": values.plain_seconds(seconds)}, self._now_ms + delay, step_name)

    def sleep_until(self, when: Any, *, step_name: str | None = None) -> None:
        """Park the saga until ``when`` (an aware ``datetime`` or epoch seconds, at most 366
        days ahead, as ``sleep``)."""
        until = self._checked(lambda: self._until_ms(when))
        self._timer({"until_ms": until}, until, step_name)

    def _until_ms(self, when: Any) -> int:
        until: int = values.when_ms(when, field="sleep_until time")
        if until - self._now_ms > values.MAX_WAIT_SECONDS * 1000:
            raise SagaValidationError(
                f"sleep_until time must be at most {values.MAX_WAIT_SECONDS} seconds (366 days) "
                "ahead, the longest ctx.sleep")
        return until

    def _timer(self, kwargs: dict[str, Any], wake_at_ms: int, step_name: str | None) -> None:
        self.hold(TIMER, kwargs, step_name=step_name or "sleep",
                  wake_at_ms=min(wake_at_ms, values.MAX_SAFE_INTEGER))

    def wait_signal(self, name: str, timeout: float | timedelta | None = None, *,
                    step_name: str | None = None) -> Any:
        """Wait for the signal ``name`` (``sagas.signal(saga_id, name, payload)``) and return
        its payload: the first signal of that name no earlier wait consumed, sent before or
        after this call. With ``timeout`` (seconds or a ``timedelta``, at most 366 days), raise
        ``SignalTimeout`` once it passed without one; ``run`` may catch it to take another
        path."""
        self._checked(lambda: values.signal_name(name))
        limit = None if timeout is None else self._checked(
            lambda: values.seconds_ms(timeout, field="wait_signal timeout"))
        result = self.hold(SIGNAL, {"signal": name, "timeout": values.plain_seconds(timeout)},
                           step_name=step_name or f"signal:{name}", timeout_ms=limit)
        if timed_out(result):
            raise SignalTimeout(signal=name)
        return result.get("payload") if isinstance(result, dict) else None

    def patched(self, change_id: str) -> bool:
        """True when this saga reaches this point on code that has the change ``change_id``;
        False on replay for a saga that passed this point before the change existed, so a
        deploy can change steps under sagas in flight (docs/design.md §3.6)."""
        self._checked(lambda: values.change_id(change_id))
        if change_id in self._saga.patches or change_id in self.new_patches:
            return True
        if self._position < len(self._saga.steps):
            return False  # steps were recorded past this point by code without the change
        self.new_patches.append(change_id)
        return True

    def hold(self, kind: StepKind, kwargs: Mapping[str, Any], *, step_name: str,
             wake_at_ms: int | None = None, timeout_ms: int | None = None) -> Any:
        """A step of the held ``kind`` (docs/design.md §3.11), named ``step_name``, waiting for
        what ``kwargs`` (JSON values) say, until ``wake_at_ms`` (or ``timeout_ms`` from now) at
        the latest: its committed result, or stop the replay there (recording it when it is
        new) until the kind wakes it. The ``ctx`` method of a new step kind calls this one."""
        arguments = self._checked(lambda: values.json_value(dict(kwargs), field=step_name))
        call = StepCall(self._name(step_name, kind.task), kind.task, (), arguments, kind.compensator)
        if wake_at_ms is None and timeout_ms is not None:
            wake_at_ms = self._now_ms + timeout_ms
        return self._held(call, lambda: {"state": kind.held_state, "wake_at_ms": wake_at_ms})

    def _held(self, call: StepCall, fields: Callable[[], dict[str, Any]]) -> Any:
        """A step no task runs (a gate, a timer, a signal wait): its committed result, or stop
        the replay there (recording it, with ``fields``, when it is new)."""
        match = match_call(self._saga, self._position, call)
        self._position += 1
        if isinstance(match, Mismatch):
            raise _Stop(Diverged(match.reason))
        if isinstance(match, New):
            raise _Suspend((replace(self._new_step(call), dispatched_at_ms=None, **fields()),))
        if match.step.state is StepState.COMMITTED:
            return match.step.result
        raise _Suspend()

    def _checked(self, check: Callable[[], Any]) -> Any:
        try:
            return check()
        except SagaValidationError as exc:
            raise _Stop(Crashed(codes.INVALID_STEP_CALL, str(exc))) from None

    def _misuse(self, reason: str) -> None:
        raise _Stop(Crashed(codes.INVALID_STEP_CALL, reason))

    def _step_call(self, call: Call, group: str | None) -> StepCall:
        if isinstance(call.task, (Call, ChildCall)):
            self._misuse(f"a step's task cannot be a {type(call.task).__name__}: run a child saga "
                         "with ctx.child(definition, input), or pass ctx.call(...) and "
                         "ctx.call_child(...) values to ctx.parallel")
        task = getattr(call.task, "name", call.task)
        if not isinstance(task, str) or task not in self._registry.steps:
            self._misuse(f"{task!r} is not a registered saga step")
        options = self._registry.steps[task]
        name = self._name(call.step_name, task)
        try:
            args = tuple(values.json_value(list(call.args), field=f"arguments of {name}"))
            kwargs = values.json_value(dict(call.kwargs), field=f"keyword arguments of {name}")
        except SagaValidationError as exc:
            raise _Stop(Crashed(codes.INVALID_STEP_CALL, str(exc))) from None
        return StepCall(name, task, args, kwargs, options.compensator, options.time_limit_ms, group)

    def _child_call(self, call: ChildCall, group: str | None, position: int) -> StepCall:
        definition = getattr(call.definition, "name", call.definition)
        if not isinstance(definition, str) or definition not in self._registry.definitions:
            self._misuse(f"{definition!r} is not a saga definition of this process")
        child_id = call.saga_id if call.saga_id is not None else self._colocate(
            child_saga_id(self.saga_id, position))
        base = f"child:{definition}" if len(definition) <= 110 else "child"
        name = self._name(None, base)
        child_input = self._checked(lambda: values.json_value(call.input, field=f"input of {name}"))
        self._checked(lambda: values.saga_id(child_id))
        if child_id == self.saga_id:
            self._misuse("a child saga cannot have its parent's id")
        kwargs = {"definition": definition, "input": child_input, "saga_id": child_id}
        return StepCall(name, CHILD.task, (), kwargs, CHILD.compensator, None, group)

    def _name(self, explicit: str | None, task: str) -> str:
        base = explicit if explicit is not None else task
        count = self._names.get(base, 0) + 1
        self._names[base] = count
        name = base if count == 1 else f"{base}#{count}"
        try:
            values.step_name(name)
        except SagaValidationError as exc:
            raise _Stop(Crashed(codes.INVALID_STEP_CALL, str(exc))) from None
        if name in self._used:
            # An explicit name can take the "#n" a later default name would get.
            self._misuse(f"step name {name!r} is used twice in this saga; pass step_name=")
        self._used.add(name)
        return name

    def _new_step(self, call: StepCall) -> StepRecord:
        step = StepRecord(
            name=call.name,
            task=call.task,
            effect_id=self._new_id(),
            compensation_effect_id=self._new_id(),
            state=StepState.EXECUTING,
            args=call.args,
            kwargs=call.kwargs,
            compensator=call.compensator,
            time_limit_ms=call.time_limit_ms,
            dispatched_at_ms=self._now_ms,
            group=call.group,
        )
        kind = kind_of(step)
        if kind.held:  # no task runs: it waits until its kind wakes it (a child: its saga ends)
            return replace(step, state=kind.held_state, dispatched_at_ms=None)
        return step

    @property
    def calls_made(self) -> int:
        """How many recorded positions this replay has visited."""
        return self._position


def replay(definition: SagaDefinition, ctx: SagaContext) -> Outcome:
    """Run ``definition.run`` against the record of ``ctx``; user errors become outcomes,
    never escape."""
    saga = ctx._saga
    try:
        value = definition.run(ctx, saga.input)
    except _Suspend as suspend:
        return Suspended(suspend.new_steps, tuple(ctx.new_patches))
    except _Stop as stop:
        return stop.outcome
    except StepFailed as exc:  # a step's known failure that run did not catch
        code = _code(exc)
        return Refused(code, f"step {exc.step!r} did not commit ({code})")
    except StepNotCommitted as exc:
        code = _code(exc)
        return Refused(code, f"run() refused to go on ({code})")
    except Exception as exc:
        logger.error("saga %s: run() of %r raised %s", saga.saga_id, saga.definition,
                     type(exc).__name__, exc_info=True)
        return Crashed(codes.RUN_FAILED, f"run() raised {type(exc).__name__}",
                       values.exception_text(exc), values.traceback_text(exc))
    diverged = unreached(saga, ctx.calls_made)
    if diverged is not None:
        return diverged
    try:
        result = values.json_value(value, field="run() result")
    except SagaValidationError:
        return Crashed(codes.INVALID_RESULT, "run() returned a value that is not JSON")
    return Returned(result, tuple(ctx.new_patches))


def _code(exc: StepNotCommitted) -> str:
    code = getattr(exc, "code", codes.NOT_COMMITTED)
    try:
        return values.error_code(code)
    except SagaValidationError:
        return codes.NOT_COMMITTED


@functools.lru_cache(maxsize=1024)  # a task's signature does not change; reading it is slow
def signature_of(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature of a step or compensator function (None when Python cannot tell)."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def step_accepts(func: Callable[..., Any], keyword: str) -> bool:
    """True when ``func`` declares ``keyword`` (or takes ``**kwargs``)."""
    signature = signature_of(func)
    if signature is None:
        return False
    params = signature.parameters
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

