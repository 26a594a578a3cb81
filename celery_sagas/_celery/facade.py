"""``Sagas``: the public facade over a Celery app (docs/design.md §1).

It reads the settings, registers the decorated tasks and definitions, and delegates every
operation to this process's ``Runtime`` (``wiring.py``), which is built lazily and again
after a fork.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.schedules import crontab
from celery.signals import worker_process_init

from .. import _values as values
from .._approvals.saga_gates import SagaApprovals
from .._clock import Clock
from .._codec import Codec
from .._definitions import Registry, SagaDefinition, SecondsBackoff
from .._dispatch import Dispatcher
from .._engine import Engine
from .._events import EventBus, FindingObserver, Observer
from .._findings import FindingPage, window_of
from .._metrics import SagaMetrics
from .._middleware import Middleware, Middlewares, Operation
from .._protocol.findings import Finding
from .._records import SAGA, SagaHistory, SagaRecord, SagaState
from .._replay_check import ReplayCheck, replay_check
from .._reseal import ResealPage, reseal_page
from .._scans import BROWSE_ORDERS, RecordPage
from .._sweep import SweepReport
from ..errors import (
    NonDurableStoreError,
    SagaConfigurationError,
    SagaNotFound,
    SagaValidationError,
)
from ..stores.base import Store
from .dispatcher import CeleryDispatcher
from .hooks import guard, guarded, install_beat_entries
from .messages import SWEEP_TASK, sent_at, stamp_sent_at
from .periodic import PeriodicSagas, SagaSchedule
from .registration import (
    checked_secrets,
    refuse_pickle,
    refuse_pickle_accepted,
    register_compensator,
    register_definition,
    register_step,
)
from .settings import SagaSettings
from .tracing import open_tracing
from .wiring import (
    PerProcess,
    Runtime,
    default_clock,
    hide_store_url,
    open_configured_store,
    require_store,
)

if TYPE_CHECKING:
    from ..aio import AsyncSagas

__all__ = ["Saga", "SagaHandle", "Sagas", "sagas_of"]

_REQUIRED: Any = object()
_SETTLED = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.MANUAL_REVIEW)


class SagaHandle:
    """A started saga: its id, the record at start, and shortcuts to the facade."""

    def __init__(self, sagas: Sagas, record: SagaRecord) -> None:
        self.sagas = sagas
        self.saga_id = record.saga_id
        self.record = record

    def get(self) -> SagaRecord | None:
        """The current record."""
        return self.sagas.get(self.saga_id)

    def wait(self, timeout: float = 30.0) -> SagaRecord:
        """Block until the saga is completed, compensated or in manual review."""
        return self.sagas.wait(self.saga_id, timeout=timeout)

    def __repr__(self) -> str:
        return f"SagaHandle({self.saga_id!r})"


class Saga:
    """A saga definition registered with ``@sagas.saga(name)``."""

    def __init__(self, sagas: Sagas, definition: SagaDefinition) -> None:
        self.sagas = sagas
        self.definition = definition

    @property
    def name(self) -> str:
        """The definition name."""
        return self.definition.name

    def start(self, input: Any, saga_id: str | None = None) -> SagaHandle:
        """Record the saga with its first step and send that step; returns at once (safe to
        call from a web handler). Returns and raises as ``Sagas.start`` does."""
        return self.sagas.start(self.name, input, saga_id=saga_id)

    def __repr__(self) -> str:
        return f"Saga({self.name!r})"


class Sagas:
    """Durable sagas on a Celery app: steps, compensators, definitions and operator actions."""

    def __init__(self, app: Celery, store: str | Store | None = None, *, clock: Clock | None = None,
                 **options: Any) -> None:
        self.app = app
        self.settings = SagaSettings.load(app.conf, options)
        refuse_pickle(app.conf.get("task_serializer"))
        refuse_pickle_accepted(app.conf.get("accept_content"))
        self._store_arg = require_store(store if store is not None else self.settings.store)
        hide_store_url(app.conf)
        self._check_durability(self._store_arg)
        checked_secrets(self.settings.approval_secrets)
        self.registry = Registry()
        self.events = EventBus()
        self.metrics: SagaMetrics | None = None
        if self.settings.metrics:
            self.metrics = SagaMetrics(self.settings.metrics_registry)
        self.clock = clock
        self.tracing = open_tracing()
        # The one seam of cross-cutting concerns (docs/design.md §1.1), handed to the runtime.
        chain: list[Middleware] = [self.events, *([self.metrics] if self.metrics else []),
                                   self.tracing]
        self.middlewares = Middlewares(chain)
        self.dispatcher: Dispatcher = CeleryDispatcher(app, self.middlewares)
        # Every task this Sagas registers delivers through this process's runtime.
        self._engines = PerProcess(self._runtime)
        self._process: PerProcess | _Fixed = self._engines
        self._register_sweep()
        self._periodic = PeriodicSagas(
            app, lambda name, input, saga_id: self.start(name, input, saga_id=saga_id).record,
            queue=self.settings.queue, payload_limit=self.settings.payload_limit,
            now_ms=lambda: self.engine.now(),
            on_added=lambda: install_beat_entries(self.app, self),
        )
        self._aio: AsyncSagas | None = None
        worker_process_init.connect(self._forget_runtime, weak=False)
        guard(self)

    # ------------------------------------------------------------ this process's runtime

    def _runtime(self) -> Runtime:
        return self._runtime_over(open_configured_store(self._store_arg, self.settings))

    def _runtime_over(self, store: Store) -> Runtime:
        return Runtime(store, self.settings, self.registry, self.middlewares, self.dispatcher,
                       default_clock(self.clock))

    def _send_through(self, dispatcher: Dispatcher) -> None:
        """Send this process's saga messages through ``dispatcher`` from now on
        (``testing.SagaDriver``): the runtime is built again around it, over the same store,
        so every part of it is handed the dispatcher at construction."""
        self.dispatcher = dispatcher
        self._process.install(self._runtime_over(self._process.current.store))

    def _forget_runtime(self, **_: Any) -> None:
        self._process.forget()

    @property
    def aio(self) -> AsyncSagas:
        """The asyncio client of these sagas (docs/async.md): ``await sagas.aio.start(...)``."""
        if self._aio is None:
            from ..aio import AsyncSagas

            self._aio = AsyncSagas(self)
        return self._aio

    @property
    def store_target(self) -> str | Store:
        """The store as configured: its URL or the Store object given."""
        return self._store_arg

    def on_runtime(self, runtime: Runtime) -> Sagas:
        """These sagas operating through ``runtime`` instead of this process's own: the async
        client runs the facade's operations on a runtime over asyncio drivers."""
        bound = copy.copy(self)
        bound._process = _Fixed(runtime)
        return bound

    @property
    def engine(self) -> Engine:
        """This process's engine (opened lazily, and again after a fork)."""
        return self._process.current.engine

    @property
    def store(self) -> Store:
        """The store of this process's engine."""
        return self._process.current.store

    @property
    def codec(self) -> Codec:
        """The codec of this process's records (it holds the encryption keys, if any)."""
        return self._process.current.codec

    @property
    def approvals(self) -> SagaApprovals:
        """Approval gates of sagas: pending, decide, resume (needs sagas_approval_secrets)."""
        approvals = self._process.current.approvals
        if approvals is None:
            raise SagaConfigurationError(
                "approvals need sagas_approval_secrets (32+ random bytes each, newest first)"
            )
        return approvals

    def _check_durability(self, store: str | Store) -> None:
        """Refuse, at once, a store that keeps nothing, unless allowed (tests, development)."""
        memory = isinstance(store, str) and store.split("://", 1)[0].lower() == "memory"
        durable = not memory and (isinstance(store, str) or getattr(store, "durable", False) is True)
        if not durable and not self.settings.allow_non_durable:
            raise NonDurableStoreError(
                "the saga store is not durable; pass allow_non_durable=True (tests, local "
                "development)"
            )

    def _register_sweep(self) -> None:
        options = {"acks_late": True, "serializer": "json", "ignore_result": True, "shared": False,
                   "bind": True}

        @self.app.task(name=SWEEP_TASK, **options)  # type: ignore[untyped-decorator]
        def sweep_task(task: Any, shard: int = 0, shards: int = 1) -> None:
            # A sweep message that waited in the queue skips the buckets swept since it was
            # sent (docs/design.md §5): queued duplicates cost a lease each, not a sweep.
            self.sweep(shard=shard, shards=shards, sent_at_ms=sent_at(task.request))

        stamp_sent_at()

    def beat_entries(self) -> dict[str, dict[str, Any]]:
        """The beat schedule entries of the sweeps (``sagas_sweep_shards``) and of the scheduled
        sagas, by name; installed now and again whenever the app is configured or beat starts
        (``hooks.py``), so a later ``config_from_object`` cannot drop them."""
        queue = {"queue": self.settings.queue} if self.settings.queue else {}
        shards = self.settings.sweep_shards
        sweeps = {
            (SWEEP_TASK if shard == 0 else f"{SWEEP_TASK}:{shard}"): {
                "schedule": self.settings.sweep_interval_s, "task": SWEEP_TASK, "args": (),
                "kwargs": {"shard": shard, "shards": shards}, "options": dict(queue),
            }
            for shard in range(shards)
        }
        return {**sweeps, **self._periodic.beat_entries}

    def schedules(self) -> Mapping[str, SagaSchedule]:
        """The scheduled sagas declared on this Sagas (``periodic``), by schedule name."""
        return dict(self._periodic.schedules)

    def periodic(self, definition: Saga | str, schedule: float | timedelta | crontab, *,
                 input: Any = None, name: str | None = None) -> SagaSchedule:
        """Start ``definition`` with ``input`` once per tick of ``schedule``, from celery beat.

        Args:
            definition: what ``@sagas.saga`` returned, or its name.
            schedule: seconds, a ``timedelta`` (ticks at the multiples of the interval since the
                epoch) or a ``celery.schedules.crontab`` (its due minutes, in the app's
                timezone).
            input: the input of every tick's saga: JSON values, at most
                ``sagas_payload_limit`` bytes.
            name: the schedule's name (default: the definition's name), at most 100
                characters; each tick's saga id is ``<name>@<tick as UTC>``
                (``nightly@20261203T000000Z``), so a tick sent twice (two beats, a restart)
                starts one saga.

        Returns:
            The ``SagaSchedule`` (``saga_id(when)`` names the saga of a tick).

        Raises:
            SagaConfigurationError: a bad schedule, or a name used twice; nothing is added.
            SagaValidationError: a bad name, or input that is not JSON or is too large.
        """
        return self._periodic.add(definition, schedule, input=input, name=name)

    # ------------------------------------------------------------ decorators

    def step(self, fn: Callable[..., Any] | None = None, *, compensate: Any = _REQUIRED,
             idempotent: bool = False, not_committed_on: tuple[type[BaseException], ...] = (),
             retries: int | None = None, backoff: SecondsBackoff | None = None,
             capability: str | None = None,
             retry_on: tuple[type[Exception], ...] = (), compensate_unknown: bool = False,
             inline: bool = True, **task_options: Any) -> Any:
        """Make ``fn`` a saga step: a real Celery task plus the saga options.

        ``idempotent=True`` retries a step whose outcome is unknown under the same effect id
        (``retries`` more attempts, default 2; ``retries=0`` for none), after
        ``backoff(attempt)`` seconds (default ``min(60, 0.1 * 2**(attempt - 1))``). ``retries``
        without ``idempotent=True`` or ``retry_on`` is refused, and so is a ``backoff`` that
        does not return a number of seconds from 0 to 366 days for every attempt.

        ``retry_on=(RateLimited,)``: exception types that prove nothing was committed and are
        worth trying again; retried after ``backoff`` up to ``retries`` times (default 2), even
        on a step that is not idempotent, then the step fails with a known outcome.
        ``compensate_unknown=True``: when the step's outcome is unknown (worker lost, time
        limit, an undeclared exception), call its compensator (``saga.outcome == "unknown"``;
        it must tolerate nothing to undo) instead of stopping for manual review.
        ``inline=False``: always send this step through the broker, even in a saga that runs
        its steps inline (docs/performance.md).
        """
        if compensate is _REQUIRED:
            raise SagaConfigurationError(
                "sagas.step needs compensate=<compensator task or name> "
                "(or compensate=None for a step with nothing to undo)"
            )

        def decorate(func: Callable[..., Any]) -> Any:
            return register_step(
                self.app, self.registry, self._engines, func, compensate=compensate,
                idempotent=idempotent, not_committed_on=not_committed_on, retries=retries,
                backoff=backoff, capability=capability, task_options=task_options,
                default_time_limit_s=self.settings.timing.default_time_limit_ms / 1000,
                retry_on=retry_on, compensate_unknown=compensate_unknown, inline=inline,
            )

        return decorate(fn) if fn is not None else decorate

    def compensator(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
                    idempotent: bool = False, capability: str | None = None,
                    **task_options: Any) -> Any:
        """Make ``fn`` a compensator task (called with the step's args, ``result``, ``saga``)."""

        def decorate(func: Callable[..., Any]) -> Any:
            return register_compensator(
                self.app, self.registry, self._engines, func, name=name,
                idempotent=idempotent, capability=capability, task_options=task_options,
                default_time_limit_s=self.settings.timing.default_time_limit_ms / 1000,
            )

        return decorate(fn) if fn is not None else decorate

    def saga(self, name: str, *, max_attempts: int = 3, backoff: SecondsBackoff | None = None,
             capability: str | None = None,
             compensation: str = "reverse",
             inline: bool | None = None) -> Callable[[Callable[..., Any]], Saga]:
        """Define a saga: ``run(ctx, input)`` calls ``ctx.step(...)`` for each side effect.

        ``max_attempts`` and ``backoff(attempt) -> seconds`` are the compensation policy: how many
        times each compensator is tried, and how long to wait between tries, before the saga
        goes to manual review (``compensation_exhausted``). A step's own retries are set on
        ``@sagas.step(retries=...)``. ``compensation="parallel"`` sends every committed step's
        compensator at once instead of one at a time, newest first (``"reverse"``).

        ``inline=True`` runs each next step in the worker process that settled the step before
        it, when it can (its queue is the one being consumed, no rate limit, its time limit
        fits): one store write and no broker hop per step (docs/performance.md). ``None``
        follows ``sagas_inline_steps``.
        """
        checked = values.capability(capability) if capability is not None else None

        def decorate(run: Callable[..., Any]) -> Saga:
            definition = register_definition(self.registry, name, run, max_attempts=max_attempts,
                                             backoff=backoff, capability=checked,
                                             compensation=compensation, inline=inline)
            return Saga(self, definition)

        return decorate

    # ------------------------------------------------------------ operations

    def start(self, definition: str, input: Any, saga_id: str | None = None) -> SagaHandle:
        """Start ``definition`` with ``input`` and return at once (safe in a web handler).

        ``run`` is replayed here up to its first step; the saga record is created with that
        step's intent (one write), then the step's task is sent.

        Args:
            definition: the name given to ``@sagas.saga(name)``.
            input: the saga's input: JSON values, at most ``sagas_payload_limit`` bytes.
            saga_id: the saga's id (printable ASCII without spaces, 1..128 characters), or
                None for a random UUID (an empty string is refused, never replaced by a
                random id). Derive it from your business key
                (``f"order-{order.id}"``) so that a retried request finds the same saga.

        Returns:
            A ``SagaHandle`` whose ``record`` is the saga as stored. For a new id: the record
            just created (``running``; or already settled when ``run`` returned or failed
            before its first step). For an id started before with the same definition and
            input: the existing record as it is now; nothing is written or sent again, so
            repeating a start is harmless.

        Raises:
            SagaConflictError: the id was started before with another definition or input.
            SagaValidationError: a bad id, or input that is not JSON or is too large; nothing
                is written.
            SagaConfigurationError: no definition of that name in this process.
            StoreError: the store failed; the saga may or may not exist (start again with the
                same id to find out).
        """
        saga_id = str(uuid.uuid4()) if saga_id is None else saga_id
        operation = Operation("saga.start", saga_id, {"definition": definition})
        record = self._operation(
            operation,
            lambda: self.engine.start(definition, input, saga_id,
                                      trace_parent=operation.trace_parent),
        )
        return SagaHandle(self, record)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None; a payload no ``encryption_keys`` key decrypts reads as
        ``celery_sagas.ENCRYPTED``."""
        return self.engine.get(saga_id)

    def wait(self, saga_id: str, timeout: float = 30.0, interval: float = 0.05) -> SagaRecord:
        """Poll until completed, compensated or manual-review; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + values.wait_seconds(timeout, "timeout", allow_zero=True)
        interval = values.wait_seconds(interval, "interval", allow_zero=False)
        while True:
            record = self.engine.get(saga_id)
            if record is None:
                raise SagaNotFound(saga_id=saga_id)
            if record.state in _SETTLED:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"saga {saga_id!r} still {record.state} after {timeout}s")
            time.sleep(interval)

    def history(self, saga_id: str) -> SagaHistory:
        """What happened to a saga, oldest first (docs/design.md §2.6): every transition with
        its cause and every operator action with its actor and reason, never rewritten; the
        oldest past ``sagas_history_limit`` are counted in ``folded``. SagaNotFound when the
        saga is absent (deleted with it by retention)."""
        record = self.engine.get(saga_id)
        if record is None:
            raise SagaNotFound(saga_id=saga_id)
        return SagaHistory(record.saga_id, tuple(record.history), record.history_folded)

    def cancel(self, saga_id: str, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Stop forward progress and compensate what committed; ``actor`` (who) and
        ``reason`` (why, one line) are kept in the saga's history."""
        return self._operation(
            self._on_saga("saga.cancel", saga_id),
            lambda: self.engine.cancel(saga_id, actor=actor, reason=reason))

    def resume(self, saga_id: str, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Lift manual review (nothing unresolved) and drive the saga on; ``actor`` and
        ``reason`` are kept in the saga's history."""
        return self._operation(
            self._on_saga("saga.resume", saga_id),
            lambda: self.engine.resume(saga_id, actor=actor, reason=reason))

    def resolve(self, saga_id: str, step: str, effect_id: str, outcome: str, *,
                result: Any = None, error_code: str | None = None, actor: str | None = None,
                reason: str | None = None) -> SagaRecord:
        """Settle an ambiguous step or compensation as an operator found it; ``actor`` and
        ``reason`` are kept in the saga's history beside the ambiguity they settle."""
        return self._operation(
            self._on_saga("saga.resolve", saga_id, step=step, effect_id=effect_id,
                          outcome=outcome),
            lambda: self.engine.resolve(saga_id, step, effect_id, outcome, result=result,
                                        error_code=error_code, actor=actor, reason=reason),
        )

    def signal(self, saga_id: str, name: str, payload: Any = None,
               signal_id: str | None = None, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Send the signal ``name`` to a saga (docs/design.md §3.5); returns the saga record.

        The signal is recorded durably with one write at the version read (its limits checked
        first, docs/concepts.md "Limits"); a ``ctx.wait_signal(name)``
        of the saga, waiting now or later, receives ``payload``. Sending again with the same
        ``signal_id`` (say, a webhook delivery id) is one signal; without one each call is a
        new signal. A saga waiting for it is advanced at once, in this process. ``actor`` and
        ``reason`` are kept in the saga's history with the signal.

        Raises:
            SagaValidationError: a bad id, name, actor or reason, or a payload that is not JSON
                or is over a quarter of ``sagas_payload_limit``; nothing is written.
            PayloadTooLarge: the saga record with this signal would pass
                ``sagas_payload_limit``; nothing is written.
            SagaNotFound: no saga has that id.
            SagaAlreadyFinal: the saga is completed or compensated (unless ``signal_id`` is one
                it holds already: then the call is a harmless repeat); nothing is written.
            SignalLimitExceeded: the saga holds ``sagas_signal_limit`` unconsumed signals, or
                this one would pass ``sagas_signal_bytes_limit``; nothing is written.
            UndecryptableRecord: no configured key opens the saga; nothing is written.
        """
        return self._operation(
            self._on_saga("saga.signal", saga_id, signal=name),
            lambda: self.engine.signal(saga_id, name, payload, signal_id, actor=actor,
                                       reason=reason))

    def _on_saga(self, name: str, saga_id: str, **attributes: Any) -> Operation:
        """An operation on an existing saga: the middlewares may read its stored traceparent
        (tracing does only when it records a span)."""

        def read() -> str | None:
            record = self.engine.get(saga_id)
            return record.trace_parent if record is not None else None

        return Operation(name, saga_id, attributes, stored_trace=read)

    def _operation(self, operation: Operation, call: Callable[[], SagaRecord]) -> SagaRecord:
        """``call`` inside the middlewares' ``around_operation`` (a span: docs/tracing.md),
        noting the state it leaves the saga in."""
        with self.middlewares.around_operation(operation):
            record = call()
            operation.finish(record, state=record.state)
            return record

    def browse(self, *, states: Sequence[SagaState | str] | None = None,
               definition: str | None = None, updated_before_ms: int | None = None,
               cursor: str | None = None, limit: int = 50,
               order: str | None = None) -> RecordPage[SagaRecord]:
        """One page of saga records, state by state (every state unless ``states``), oldest
        first, of one definition and last written before ``updated_before_ms`` if given; the
        store's indexes do the filtering (``limit`` 1..1000). ``order="newest"`` or
        ``"oldest"`` lists them by last write across the states instead, ``"newest-created"``
        or ``"oldest-created"`` by creation (the store's ``OrderedScan``). Payloads no key
        decrypts read as ``ENCRYPTED``."""
        scans = self._process.current.views
        chosen = list(states or SagaState)
        if order is None:
            return scans.sagas(chosen, definition=definition,
                               updated_before_ms=updated_before_ms, cursor=cursor, limit=limit)
        if order not in BROWSE_ORDERS:
            raise SagaValidationError(
                f"order must be one of {', '.join(BROWSE_ORDERS)}, got {str(order)[:40]!r}")
        newest_first, by = BROWSE_ORDERS[order]
        return scans.sagas_by_write(chosen, definition=definition,
                                    updated_before_ms=updated_before_ms,
                                    newest_first=newest_first, cursor=cursor, limit=limit, by=by)

    def reseal(self, *, states: Sequence[SagaState | str] | None = None,
               cursor: str | None = None, limit: int = 100) -> ResealPage:
        """Re-encrypt one page of sagas (every state unless ``states``) whose payloads are in
        clear or sealed with an older key, under the newest of ``encryption_keys``: after a
        key rotation, walk every page (pass ``cursor`` back) before removing the old key."""
        return reseal_page(self.engine.repository, states=states, cursor=cursor, limit=limit)

    def replay_check(self, *, definition: str | None = None,
                     limit: int | None = None) -> ReplayCheck:
        """Replay this process's ``run`` code against every saga in flight (of ``definition``,
        at most ``limit``) and report those that would become ``nondeterministic``: the deploy
        check of docs/operations.md, run before new saga code ships. Writes nothing."""
        if definition is not None:
            values.definition_name(definition)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise SagaValidationError(f"limit must be a positive int, got {limit!r}")
        return replay_check(self._process.current.scans, self.registry, self.engine.now(),
                            definition=definition, limit=limit,
                            bucket_of=self.store.bucket_of)

    def counts(self, *, definition: str | None = None) -> dict[str, int]:
        """How many sagas are in each state (of one definition if given), from the indexes."""
        store = self.store
        return {str(s): store.count(SAGA, [str(s)], label=definition) for s in SagaState}

    def sweep(self, *, shard: int = 0, shards: int = 1,
              sent_at_ms: int | None = None) -> SweepReport:
        """One reconciliation pass (what beat runs every ``sagas_sweep_interval`` seconds);
        with ``sent_at_ms`` (when the sweep was asked for), buckets swept to the end since
        then are skipped."""
        operation = Operation("saga.sweep", attributes={"shard": shard, "shards": shards})
        with self.middlewares.around_operation(operation):
            report = self._process.current.sweeper.sweep(shard, shards, sent_at_ms=sent_at_ms)
            operation.finish(report, examined=report.examined, acted=report.acted)
        return report

    def findings(self, report: str = "all", *, cursor: str | None = None,
                 limit: int = 100) -> FindingPage:
        """One page of what needs an operator (docs/design.md §6): manual-review, ambiguous and
        stale sagas, then incomplete and ambiguous effects (``report``: all, sagas or effects).

        ``limit`` is 1..1000; pass the page's ``cursor`` back for the next page (it keeps the
        first page's notion of "stale", so a long walk stays consistent).
        """
        runtime = self._process.current
        window = window_of(runtime.engine) if cursor is None else None
        return runtime.findings.page(window, report=report, cursor=cursor, limit=limit)

    def all_findings(self, report: str = "all") -> list[Finding]:
        """Every finding of ``findings``; raises SagaValidationError rather than truncate past 1000."""
        runtime = self._process.current
        return list(runtime.findings.all(window_of(runtime.engine), report=report))

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Receive every lifecycle event; returns an unsubscribe function."""
        return self.events.subscribe(observer)

    def subscribe_findings(self, observer: FindingObserver) -> Callable[[], None]:
        """Receive every finding a sweep of this process reports; returns an unsubscribe function."""
        return self.events.subscribe_findings(observer)


class _Fixed:
    """A runtime holder that always hands out the same runtime (``Sagas.on_runtime``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime

    def forget(self) -> None:
        """Nothing to forget: the runtime belongs to whoever built it."""

    def install(self, runtime: Runtime) -> None:
        """Hand out ``runtime`` from now on."""
        self.current = runtime


def sagas_of(app: Celery) -> Sagas:
    """The Sagas created on ``app`` (the latest one); SagaConfigurationError when there is none."""
    found = guarded(app)
    if not isinstance(found, Sagas):
        raise SagaConfigurationError(f"no Sagas(app, ...) was created on the Celery app {app.main!r}")
    return found
