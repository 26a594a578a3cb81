"""Prometheus metrics fed by lifecycle and finding events (the optional extra ``metrics``).

Metrics are opt-in: ``Sagas(app, ..., metrics=True)`` (or ``sagas_metrics = True``) uses
prometheus_client's default registry, ``metrics=<CollectorRegistry>`` another one.
``prometheus_client`` is imported only then; without it the error names the extra to install.

| family | type | labels | fed by |
|---|---|---|---|
| ``celery_sagas_effects_total`` | counter | stage, phase | every lifecycle event |
| ``celery_sagas_step_duration_seconds`` | histogram | stage | run time of each step / compensator body |
| ``celery_sagas_findings_total`` | counter | kind | every finding a sweep reports |
| ``celery_sagas_sagas`` | gauge | state | the sweep: open sagas per state |

``celery_sagas_sagas`` holds the exact number of ``running``, ``compensating`` and
``manual-review`` sagas, read from the store's state index (``Store.count``, one cheap call
per state and bucket) at the end of each sweep this process ran. Final states are not
reported: they only grow until retention deletes them. A sweep re-reports findings that
are still open, so ``celery_sagas_findings_total`` counts reports; alert on its rate.

Labels are stage, phase, state and kind names only: never ids, error codes or payloads, so
the exposition stays bounded and carries nothing a saga was given. Under Celery's prefork
pool run prometheus_client in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``); the gauge then
reports the most recent value of any live process.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._events import EventBus, LifecycleEvent, Phase, Stage
from ._middleware import Middleware, Operation
from ._protocol.findings import Finding, FindingKind
from ._sweep import SweepReport
from .errors import SagaConfigurationError

__all__ = ["DURATION_BUCKETS_S", "SagaMetrics"]

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                      120.0, 300.0)
_STAGES = (Stage.EXECUTION, Stage.COMPENSATION, Stage.RECONCILIATION)
_PHASES = (Phase.INTENT, Phase.EXECUTING, Phase.COMMITTED, Phase.FAILED, Phase.AMBIGUOUS)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise SagaConfigurationError(
            "metrics need prometheus-client: pip install 'celery-sagas[metrics]'"
        ) from None
    return prometheus_client


@dataclass(frozen=True, slots=True)
class _Families:
    """The metric families registered once per registry."""

    effects: Any
    durations: Any
    findings: Any
    sagas: Any


_FAMILIES: weakref.WeakKeyDictionary[Any, _Families] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _register(client: Any, registry: Any) -> _Families:
    families = _Families(
        effects=client.Counter(
            "celery_sagas_effects", "Effect lifecycle events by stage and phase.",
            ["stage", "phase"], registry=registry,
        ),
        durations=client.Histogram(
            "celery_sagas_step_duration_seconds", "Run time of step and compensator bodies.",
            ["stage"], registry=registry, buckets=DURATION_BUCKETS_S,
        ),
        findings=client.Counter(
            "celery_sagas_findings", "Findings reported by reconciliation sweeps, by kind.",
            ["kind"], registry=registry,
        ),
        sagas=client.Gauge(
            "celery_sagas_sagas", "Open sagas per state, counted at the end of the last sweep.",
            ["state"], registry=registry, multiprocess_mode="livemostrecent",
        ),
    )
    # Known label values start at zero, so a rate() has a baseline before the first event.
    for stage in _STAGES:
        for phase in _PHASES:
            families.effects.labels(stage=stage, phase=phase)
    for kind in FindingKind:
        families.findings.labels(kind=str(kind))
    return families


class SagaMetrics(Middleware):
    """Prometheus counters, histogram and gauge for one registry (families shared per registry):
    a middleware of the runtime's chain (events, findings, and the counts a sweep reads)."""

    def __init__(self, registry: Any = None) -> None:
        client = _prometheus()
        self.registry = registry if registry is not None else client.REGISTRY
        with _LOCK:
            families = _FAMILIES.get(self.registry)
            if families is None:
                families = _FAMILIES[self.registry] = _register(client, self.registry)
        self._families = families

    def attach(self, bus: EventBus) -> Callable[[], None]:
        """Subscribe to the bus's lifecycle events and findings; returns a detach function."""
        detach_lifecycle = bus.subscribe(self.observe)
        detach_findings = bus.subscribe_findings(self.observe_finding)

        def detach() -> None:
            detach_lifecycle()
            detach_findings()

        return detach

    def on_event(self, event: LifecycleEvent) -> None:
        """A lifecycle event from the chain: count and time it."""
        self.observe(event)

    def on_finding(self, finding: Finding) -> None:
        """A finding from the chain: count it."""
        self.observe_finding(finding)

    @contextlib.contextmanager
    def around_operation(self, operation: Operation) -> Iterator[None]:
        """After a sweep that counted the open sagas per state: set the gauge."""
        yield
        if isinstance(operation.result, SweepReport) and operation.result.states:
            self.set_saga_counts(operation.result.states)

    def observe(self, event: LifecycleEvent) -> None:
        """Count a lifecycle event; time a body that ran."""
        self._families.effects.labels(stage=event.stage, phase=event.phase).inc()
        if event.duration_ms is not None:
            self._families.durations.labels(stage=event.stage).observe(event.duration_ms / 1000)

    def observe_finding(self, event: Finding) -> None:
        """Count a finding a sweep reported."""
        self._families.findings.labels(kind=event.kind).inc()

    def set_saga_counts(self, counts: Mapping[str, int]) -> None:
        """Set the per-state gauge from a sweep's counts."""
        for state, count in counts.items():
            self._families.sagas.labels(state=state).set(count)
