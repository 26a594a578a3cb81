"""Prometheus metrics: effect counters by stage and phase, a
step-duration histogram, a findings counter and a per-state gauge refreshed by the sweep."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from prometheus_client import REGISTRY, CollectorRegistry

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._events import EventBus, FindingEvent, LifecycleEvent
from celery_sagas._metrics import SagaMetrics
from celery_sagas.errors import SagaConfigurationError
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, register_shop


def lifecycle(stage: str = "execution", phase: str = "committed", duration_ms: int | None = None
              ) -> LifecycleEvent:
    return LifecycleEvent("fx-1", "orders.charge", stage, phase, 1, "o-1", "place-order",
                          "charge", None, duration_ms)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


# ------------------------------------------------------------------ the collector


def test_each_lifecycle_event_counts_once_by_stage_and_phase(registry: CollectorRegistry) -> None:
    metrics = SagaMetrics(registry)

    for phase in ("intent", "executing", "committed", "committed"):
        metrics.observe(lifecycle(phase=phase))
    metrics.observe(lifecycle("compensation", "failed"))

    assert value(registry, "celery_sagas_effects_total", stage="execution", phase="committed") == 2
    assert value(registry, "celery_sagas_effects_total", stage="execution", phase="intent") == 1
    assert value(registry, "celery_sagas_effects_total", stage="compensation", phase="failed") == 1
    assert value(registry, "celery_sagas_effects_total", stage="execution", phase="ambiguous") == 0


def test_a_body_run_time_is_observed_in_seconds_by_stage(registry: CollectorRegistry) -> None:
    metrics = SagaMetrics(registry)

    metrics.observe(lifecycle(duration_ms=250))
    metrics.observe(lifecycle(duration_ms=1500))
    metrics.observe(lifecycle(phase="intent"))  # no body ran: not timed

    assert value(registry, "celery_sagas_step_duration_seconds_count", stage="execution") == 2
    assert value(registry, "celery_sagas_step_duration_seconds_sum", stage="execution") == 1.75
    assert value(registry, "celery_sagas_step_duration_seconds_bucket", stage="execution",
                 le="0.25") == 1


def test_findings_count_by_kind_and_the_gauge_takes_the_sweeps_counts(registry: CollectorRegistry) -> None:
    metrics = SagaMetrics(registry)

    metrics.observe_finding(FindingEvent("manual-review", "saga", "o-1"))
    metrics.observe_finding(FindingEvent("manual-review", "saga", "o-2"))
    metrics.set_saga_counts({"running": 4, "manual-review": 2})
    metrics.set_saga_counts({"running": 3})

    assert value(registry, "celery_sagas_findings_total", kind="manual-review") == 2
    assert value(registry, "celery_sagas_findings_total", kind="corrupt") == 0
    assert value(registry, "celery_sagas_sagas", state="running") == 3
    assert value(registry, "celery_sagas_sagas", state="manual-review") == 2


def test_attached_metrics_follow_the_bus_until_detached(registry: CollectorRegistry) -> None:
    bus = EventBus()
    detach = SagaMetrics(registry).attach(bus)

    bus.emit(lifecycle())
    bus.report(FindingEvent("stale", "saga", "o-1"))
    detach()
    bus.emit(lifecycle())
    bus.report(FindingEvent("stale", "saga", "o-1"))

    assert value(registry, "celery_sagas_effects_total", stage="execution", phase="committed") == 1
    assert value(registry, "celery_sagas_findings_total", kind="stale") == 1


def test_two_collectors_on_one_registry_share_its_families(registry: CollectorRegistry) -> None:
    SagaMetrics(registry).observe(lifecycle())
    SagaMetrics(registry).observe(lifecycle())

    assert value(registry, "celery_sagas_effects_total", stage="execution", phase="committed") == 2


def test_without_prometheus_client_the_error_names_the_extra(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)

    with pytest.raises(SagaConfigurationError, match=r"celery-sagas\[metrics\]"):
        SagaMetrics(registry)


# ------------------------------------------------------------------ through Sagas


@dataclass
class Rig:
    """The test shop on its own Sagas, with metrics on ``registry``."""

    sagas: Sagas
    driver: SagaDriver
    script: Script
    definitions: dict[str, Any]

    def start_orders(self, *saga_ids: str) -> None:
        for saga_id in saga_ids:
            self.definitions["place-order"].start(ORDER, saga_id=saga_id)


def rig(registry: Any, **options: Any) -> Rig:
    app = Celery(f"metrics-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True, clock=FrozenClock(),
                  metrics=registry, **options)
    driver = SagaDriver(sagas)
    script = Script()
    _, definitions = register_shop(sagas, script)
    return Rig(sagas, driver, script, definitions)


def test_metrics_are_off_unless_asked_for() -> None:
    app = Celery(f"metrics-{uuid.uuid4().hex[:8]}", set_as_current=False)
    assert Sagas(app, store=MemoryStore(), allow_non_durable=True).metrics is None


def test_metrics_true_uses_the_default_registry() -> None:
    app = Celery(f"metrics-{uuid.uuid4().hex[:8]}", set_as_current=False)
    metrics = Sagas(app, store=MemoryStore(), allow_non_durable=True, metrics=True).metrics
    assert metrics is not None and metrics.registry is REGISTRY


def test_a_metrics_setting_that_is_no_registry_is_refused() -> None:
    app = Celery(f"metrics-{uuid.uuid4().hex[:8]}", set_as_current=False)
    with pytest.raises(SagaConfigurationError):
        Sagas(app, store=MemoryStore(), allow_non_durable=True, metrics="yes")


def test_a_driven_saga_is_counted_and_timed(registry: CollectorRegistry) -> None:
    # given
    shop = rig(registry)
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when: reserve and charge commit, ship fails, both are compensated
    shop.start_orders("o-1")
    shop.driver.run_until_idle()

    # then
    def effects(stage: str, phase: str) -> float | None:
        return value(registry, "celery_sagas_effects_total", stage=stage, phase=phase)

    assert [effects("execution", p) for p in ("intent", "executing", "committed", "failed")] == [3, 3, 2, 1]
    assert [effects("compensation", p) for p in ("intent", "executing", "committed")] == [2, 2, 2]
    assert value(registry, "celery_sagas_step_duration_seconds_count", stage="execution") == 3
    assert value(registry, "celery_sagas_step_duration_seconds_count", stage="compensation") == 2


def test_the_sweep_refreshes_the_gauge_and_counts_what_it_reports(registry: CollectorRegistry) -> None:
    # given: one saga in manual review (ambiguous charge), two parked mid-way (messages lost)
    shop = rig(registry)
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_orders("o-1")
    shop.driver.run_until_idle()
    shop.start_orders("o-2", "o-3")
    shop.driver.take()

    # when
    shop.sagas.sweep()

    # then
    assert value(registry, "celery_sagas_sagas", state="manual-review") == 1
    assert value(registry, "celery_sagas_sagas", state="running") == 2
    assert value(registry, "celery_sagas_sagas", state="compensating") == 0
    assert value(registry, "celery_sagas_findings_total", kind="ambiguous-execution") == 1


def test_the_gauge_counts_exactly_from_the_store_indexes(registry: CollectorRegistry) -> None:
    # given: more open sagas than a sweep page holds, and final ones the gauge leaves out
    shop = rig(registry, sweep_page_size=2)
    shop.start_orders(*(f"o-{n}" for n in range(7)))
    shop.driver.take()
    shop.start_orders("done-1", "done-2")
    shop.driver.run_until_idle()
    counted: list[tuple[str, tuple[str, ...]]] = []
    count = shop.sagas.store.count

    def spy(kind: str, states: Any, **kwargs: Any) -> int:
        counted.append((kind, tuple(states)))
        return count(kind, states, **kwargs)

    shop.sagas.store.count = spy  # type: ignore[method-assign]

    # when
    shop.sagas.sweep()

    # then: every open state counted by the store, none capped, no final state counted
    assert value(registry, "celery_sagas_sagas", state="running") == 7
    assert value(registry, "celery_sagas_sagas", state="completed") is None
    assert sorted(counted) == [("saga", ("compensating",)), ("saga", ("manual-review",)),
                               ("saga", ("running",))]


def test_without_metrics_a_sweep_counts_nothing() -> None:
    # given
    shop = rig(None)
    shop.start_orders("o-1")
    shop.driver.take()

    # when
    report = shop.sagas.sweep()

    # then
    assert shop.sagas.metrics is None and report.states == {}
