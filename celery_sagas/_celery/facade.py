"""``Sagas``: the public facade that wires the engine into a Celery app (DESIGN §1)."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from .. import _values as values
from .._approvals.gate import ApprovalGate
from .._approvals.saga_gates import SagaApprovals, approval_expiry_pass
from .._approvals.tokens import TokenSigner
from .._clock import Clock, SystemClock
from .._definitions import (
    Backoff,
    CompensatorOptions,
    Registry,
    SagaDefinition,
    StepOptions,
)
from .._dispatch import Dispatcher
from .._engine import Engine, EngineSettings
from .._events import EventBus, FindingObserver, Observer
from .._findings import FindingPage, all_findings, page_findings, window_of
from .._journal import EffectJournal, EffectRecorder
from .._liveness import claimer_id
from .._metrics import SagaMetrics
from .._protocol.compensation import default_backoff_ms
from .._protocol.findings import Finding
from .._records import SagaRecord, SagaState
from .._sweep import SweepReport, sweep
from ..errors import NonDurableStoreError, SagaConfigurationError, SagaValidationError
from ..stores import open_store
from ..stores.base import Store
from .dispatcher import ADVANCE_TASK, SWEEP_TASK, CeleryDispatcher
from .settings import SagaSettings
from .tasks import CompensatorTask, SagaStepTask

__all__ = ["Saga", "SagaHandle", "Sagas", "sagas_of"]

logger = logging.getLogger("celery_sagas")

_REQUIRED: Any = object()
_REFUSED_OPTIONS = ("autoretry_for", "max_retries", "retry_backoff", "acks_late", "reject_on_worker_lost")
_SETTLED = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.MANUAL_REVIEW)
_PICKLE = ("pickle", "application/x-python-serialize")
_MAX_TIME_LIMIT_S = 366 * 24 * 3600  # as the duration settings: past it, "now + limit" means nothing
# The Sagas created on each app, held weakly both ways (the CLI finds it through sagas_of).
_BY_APP: weakref.WeakKeyDictionary[Celery, weakref.ref[Sagas]] = weakref.WeakKeyDictionary()


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
        """Create the saga and enqueue it; returns at once (safe to call from a web handler)."""
        return self.sagas.start(self.name, input, saga_id=saga_id)

    def __repr__(self) -> str:
        return f"Saga({self.name!r})"


def _name_of(task: Any) -> str | None:
    if task is None:
        return None
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise SagaConfigurationError("compensate= takes a compensator task or its name")
    return name


class Sagas:
    """Durable sagas on a Celery app: steps, compensators, definitions and operator actions."""

    def __init__(self, app: Celery, store: str | Store | None = None, *, clock: Clock | None = None,
                 **options: Any) -> None:
        self.app = app
        self.settings = SagaSettings.load(app.conf, options)
        _refuse_pickle(app.conf.get("task_serializer"))
        _refuse_pickle_accepted(app.conf.get("accept_content"))
        chosen = store if store is not None else self.settings.store
        if chosen is None:
            raise SagaConfigurationError("Sagas needs store= (a URL or a Store) or sagas_store")
        if not isinstance(chosen, str) and not callable(getattr(chosen, "compare_and_set", None)):
            raise SagaConfigurationError(
                f"the saga store must be a URL or a Store object, got {type(chosen).__name__}"
            )
        self._store_arg: str | Store = chosen
        self.registry = Registry()
        self.events = EventBus()
        self._check_durability(chosen)
        self.metrics: SagaMetrics | None = None
        if self.settings.metrics:
            self.metrics = SagaMetrics(self.settings.metrics_registry)
            self.metrics.attach(self.events)
        self.clock = clock
        self.dispatcher: Dispatcher = CeleryDispatcher(app, self.registry, self.settings.queue)
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_pid = 0
        self._step_base = type("SagaStep", (SagaStepTask,), {"sagas": self})
        self._compensator_base = type("SagaCompensator", (CompensatorTask,), {"sagas": self})
        self._secrets = _checked_secrets(self.settings.approval_secrets)
        self.approvals = SagaApprovals(lambda: self.engine, self._approval_gate)
        self._register_internal_tasks()
        worker_process_init.connect(self._forget_engine, weak=False)
        _BY_APP[app] = weakref.ref(self)

    # ------------------------------------------------------------ wiring

    @property
    def engine(self) -> Engine:
        """This process's engine (opened lazily, and again after a fork)."""
        pid = os.getpid()
        with self._lock:
            if self._engine is None or self._engine_pid != pid:
                store, clock = self._open_store(), self.clock or SystemClock()
                engine = Engine(
                    store, self.registry, self.dispatcher, clock=clock, events=self.events,
                    settings=EngineSettings(self.settings.payload_limit, self.settings.timing),
                    journal=self._journal(store, clock),
                )
                if self._secrets:
                    engine.approvals = ApprovalGate(engine.store, engine.clock, self._secrets,
                                                    ttl_ms=self.settings.approval_ttl_ms)
                    engine.reconcile_gates = self.approvals.reconcile
                self._engine, self._engine_pid = engine, pid
            return self._engine

    def _approval_gate(self) -> ApprovalGate:
        gate = self.engine.approvals
        if gate is None:
            raise SagaConfigurationError(
                "approvals need sagas_approval_secrets (32+ random bytes each, newest first)"
            )
        return gate

    @property
    def store(self) -> Store:
        """The store of this process's engine."""
        return self.engine.store

    def _open_store(self) -> Store:
        if not isinstance(self._store_arg, str):
            return self._store_arg
        scheme = self._store_arg.split("://", 1)[0].split("+", 1)[0].lower()
        options: dict[str, Any] = {}
        if scheme in ("redis", "rediss", "unix"):
            options["prefix"] = self.settings.key_prefix
        elif scheme in ("sqlite", "postgresql", "postgres", "mysql", "mariadb"):
            options["table_prefix"] = self.settings.table_prefix
        store = open_store(self._store_arg, **options)
        if not store.durable and not self.settings.allow_non_durable:
            logger.warning("saga store %s keeps nothing across restarts", scheme)
        return store

    def _check_durability(self, store: str | Store) -> None:
        """Refuse, at once, a store the effect journal would refuse when the engine opens."""
        memory = isinstance(store, str) and store.split("://", 1)[0].lower() == "memory"
        durable = not memory and (isinstance(store, str) or getattr(store, "durable", False) is True)
        if self.settings.journal and not durable and not self.settings.allow_non_durable:
            raise NonDurableStoreError(
                "the saga store is not durable; pass allow_non_durable=True (tests, local "
                "development) or sagas_journal=False"
            )

    def _journal(self, store: Store, clock: Clock) -> EffectRecorder | None:
        if not self.settings.journal:
            return None
        journal = EffectJournal(store, clock, allow_non_durable=self.settings.allow_non_durable)
        return EffectRecorder(journal)

    def _forget_engine(self, **_: Any) -> None:
        with self._lock:
            self._engine = None

    def _register_internal_tasks(self) -> None:
        options = {"acks_late": True, "serializer": "json", "ignore_result": True, "shared": False}

        @self.app.task(name=ADVANCE_TASK, **options)  # type: ignore[untyped-decorator]
        def advance(saga_id: str) -> None:
            record = self.engine.get(values.saga_id(saga_id))
            if record is None:
                logger.warning("advance: no saga %s", saga_id)
                return
            self.engine.advance(saga_id, record)

        @self.app.task(name=SWEEP_TASK, **options)  # type: ignore[untyped-decorator]
        def sweep_task() -> None:
            self.sweep()

        queue = {"queue": self.settings.queue} if self.settings.queue else {}
        self.app.add_periodic_task(
            self.settings.sweep_interval_s, self.app.signature(SWEEP_TASK, options=queue),
            name=SWEEP_TASK,
        )

    def _task_options(self, fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
        for refused in _REFUSED_OPTIONS:
            if refused in options:
                raise SagaConfigurationError(
                    f"{refused} is not allowed on saga tasks: use idempotent=/retries= (retries "
                    "and acknowledgement are the saga's job)"
                )
        _refuse_pickle(options.get("serializer", "json"))
        options = dict(options)
        options.setdefault("name", self.app.gen_task_name(fn.__name__, fn.__module__))
        options.setdefault("time_limit", self.settings.timing.default_time_limit_ms / 1000)
        _check_time_limit(options["time_limit"])
        options["shared"] = False
        return options

    # ------------------------------------------------------------ decorators

    def step(self, fn: Callable[..., Any] | None = None, *, compensate: Any = _REQUIRED,
             idempotent: bool = False, not_committed_on: tuple[type[BaseException], ...] = (),
             retries: int = 0, backoff: Backoff | None = None, capability: str | None = None,
             **task_options: Any) -> Any:
        """Make ``fn`` a saga step: a real Celery task plus the saga options."""
        if compensate is _REQUIRED:
            raise SagaConfigurationError(
                "sagas.step needs compensate=<compensator task or name> "
                "(or compensate=None for a step with nothing to undo)"
            )

        def decorate(func: Callable[..., Any]) -> Any:
            opts = self._task_options(func, task_options)
            task = self.app.task(base=self._step_base, **opts)(func)
            self.registry.add_step(StepOptions(
                task=opts["name"], compensator=_name_of(compensate), idempotent=idempotent,
                not_committed_on=tuple(not_committed_on), retries=retries,
                backoff=backoff or default_backoff_ms, time_limit_ms=int(opts["time_limit"] * 1000),
                capability=values.capability(capability) if capability else "saga.execute",
            ))
            return task

        return decorate(fn) if fn is not None else decorate

    def compensator(self, fn: Callable[..., Any] | None = None, *, name: str | None = None,
                    idempotent: bool = False, capability: str | None = None,
                    **task_options: Any) -> Any:
        """Make ``fn`` a compensator task (called with the step's args, ``result``, ``saga``)."""

        def decorate(func: Callable[..., Any]) -> Any:
            opts = self._task_options(func, {**task_options, **({"name": name} if name else {})})
            task = self.app.task(base=self._compensator_base, **opts)(func)
            self.registry.add_compensator(CompensatorOptions(
                opts["name"], idempotent,
                values.capability(capability) if capability else "saga.compensate",
                time_limit_ms=int(opts["time_limit"] * 1000),
            ))
            return task

        return decorate(fn) if fn is not None else decorate

    def saga(self, name: str, *, max_attempts: int = 3, backoff: Backoff | None = None,
             capability: str | None = None) -> Callable[[Callable[..., Any]], Saga]:
        """Define a saga: ``run(ctx, input)`` calls ``ctx.step(...)`` for each side effect."""

        checked = values.capability(capability) if capability is not None else None

        def decorate(run: Callable[..., Any]) -> Saga:
            definition = SagaDefinition(name, run, max_attempts, backoff or default_backoff_ms,
                                        checked)
            self.registry.add_definition(definition)
            return Saga(self, definition)

        return decorate

    # ------------------------------------------------------------ operations

    def start(self, definition: str, input: Any, saga_id: str | None = None) -> SagaHandle:
        """Start ``definition`` with ``input`` (idempotent per saga id)."""
        record = self.engine.start(definition, input, saga_id or str(uuid.uuid4()))
        return SagaHandle(self, record)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None."""
        return self.engine.get(saga_id)

    def wait(self, saga_id: str, timeout: float = 30.0, interval: float = 0.05) -> SagaRecord:
        """Poll until completed, compensated or manual-review; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + _seconds(timeout, "timeout", allow_zero=True)
        interval = _seconds(interval, "interval", allow_zero=False)
        while True:
            record = self.engine.load(saga_id)
            if record.state in _SETTLED:
                return record
            if time.monotonic() > deadline:
                raise TimeoutError(f"saga {saga_id!r} still {record.state} after {timeout}s")
            time.sleep(interval)

    def cancel(self, saga_id: str) -> SagaRecord:
        """Stop forward progress and compensate what committed."""
        return self.engine.cancel(saga_id)

    def resume(self, saga_id: str) -> SagaRecord:
        """Lift manual review (nothing unresolved) and drive the saga on."""
        return self.engine.resume(saga_id)

    def resolve(self, saga_id: str, step: str, effect_id: str, outcome: str, *,
                result: Any = None, error_code: str | None = None) -> SagaRecord:
        """Settle an ambiguous step or compensation as an operator found it."""
        return self.engine.resolve(saga_id, step, effect_id, outcome, result=result,
                                   error_code=error_code)

    def sweep(self) -> SweepReport:
        """One reconciliation pass (what beat runs every ``sagas_sweep_interval`` seconds)."""
        engine = self.engine
        passes = [approval_expiry_pass(engine, self.approvals)] if engine.approvals else []
        cap = self.settings.metrics_count_cap if self.metrics is not None else 0
        report = sweep(engine, owner=claimer_id(), lease_ms=self.settings.sweep_lease_ms,
                       page_size=self.settings.sweep_page_size, extra_passes=passes, count_cap=cap)
        if self.metrics is not None and report.states:
            self.metrics.set_saga_counts(report.states)
        return report

    def findings(self, report: str = "all", *, cursor: str | None = None,
                 limit: int = 100) -> FindingPage:
        """One page of what needs an operator (SPEC §5): manual-review, ambiguous and stale
        sagas, then incomplete and ambiguous effects (``report``: all, sagas or effects).

        ``limit`` is 1..1000; pass the page's ``cursor`` back for the next page (it keeps the
        first page's notion of "stale", so a long walk stays consistent).
        """
        engine = self.engine
        window = window_of(engine) if cursor is None else None
        return page_findings(engine.store, window, report=report, cursor=cursor, limit=limit)

    def all_findings(self, report: str = "all") -> list[Finding]:
        """Every finding of ``findings``; raises SagaValidationError rather than truncate past 1000."""
        engine = self.engine
        return list(all_findings(engine.store, window_of(engine), report=report))

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Receive every lifecycle event; returns an unsubscribe function."""
        return self.events.subscribe(observer)

    def subscribe_findings(self, observer: FindingObserver) -> Callable[[], None]:
        """Receive every finding a sweep of this process reports; returns an unsubscribe function."""
        return self.events.subscribe_findings(observer)


def sagas_of(app: Celery) -> Sagas:
    """The Sagas created on ``app`` (the latest one); SagaConfigurationError when there is none."""
    ref = _BY_APP.get(app)
    found = ref() if ref is not None else None
    if found is None:
        raise SagaConfigurationError(f"no Sagas(app, ...) was created on the Celery app {app.main!r}")
    return found


def _seconds(value: object, name: str, *, allow_zero: bool) -> float:
    """A finite, non-negative (or positive) number of seconds; NaN would never time out."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagaValidationError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value) if abs(value) < 1e300 else math.inf
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise SagaValidationError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'} "
                                  f"number of seconds, got {value!r}")
    return seconds


def _checked_secrets(secrets: tuple[bytes | str, ...]) -> tuple[bytes | str, ...]:
    if not secrets:
        return ()
    try:
        TokenSigner(secrets)
    except SagaValidationError as exc:
        raise SagaConfigurationError(f"sagas_approval_secrets: {exc}") from None
    return secrets


def _check_time_limit(seconds: object) -> None:
    """A saga task needs a hard limit: past it (plus grace) a silent attempt is judged."""
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or not 0 < seconds <= _MAX_TIME_LIMIT_S):
        raise SagaConfigurationError(
            f"time_limit must be a positive number of seconds, at most {_MAX_TIME_LIMIT_S}, "
            f"got {seconds!r}"
        )


def _is_pickle(serializer: object) -> bool:
    return isinstance(serializer, str) and serializer.lower() in _PICKLE


def _refuse_pickle_accepted(accepted: object) -> None:
    """Workers that accept pickle run whatever anyone who can write to the broker sends."""
    if isinstance(accepted, str):
        accepted = (accepted,)
    if isinstance(accepted, (list, tuple, set, frozenset)) and any(map(_is_pickle, accepted)):
        raise SagaConfigurationError(
            "celery_sagas refuses accept_content with pickle: anyone who can write to the "
            "broker could run code in your workers. Use accept_content=['json']."
        )


def _refuse_pickle(serializer: object) -> None:
    if _is_pickle(serializer):
        raise SagaConfigurationError(
            "celery_sagas refuses the pickle serializer: anyone who can write to the broker "
            "could run code in your workers. Use task_serializer='json'."
        )
