"""The Celery app the tracing tests' workers run (``celery -A tests.tracing.app worker``).

Configured from the environment: TRACE_BROKER, TRACE_STORE, TRACE_PREFIX, TRACE_QUEUE,
TRACE_SPANS (a file every finished span is appended to, one JSON line each) and
TRACE_INSTRUMENT_CELERY=1 to add ``opentelemetry-instrumentation-celery``. Each pool process
gets its own SDK tracer provider (``worker_process_init``), as a deployment would set it up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from celery_sagas import Sagas, StepNotCommitted


@dataclass(frozen=True)
class Config:
    """Where one test's worker, store, queue and span file live."""

    broker: str
    store: str
    prefix: str
    queue: str
    spans: Path
    instrument_celery: bool = False

    @classmethod
    def from_env(cls) -> Config:
        """The configuration a worker process was started with."""
        env = os.environ
        return cls(env["TRACE_BROKER"], env["TRACE_STORE"], env["TRACE_PREFIX"], env["TRACE_QUEUE"],
                   Path(env["TRACE_SPANS"]), env.get("TRACE_INSTRUMENT_CELERY") == "1")

    def environ(self) -> dict[str, str]:
        """The environment that makes a worker use this configuration."""
        return {"TRACE_BROKER": self.broker, "TRACE_STORE": self.store, "TRACE_PREFIX": self.prefix,
                "TRACE_QUEUE": self.queue, "TRACE_SPANS": str(self.spans),
                "TRACE_INSTRUMENT_CELERY": "1" if self.instrument_celery else "0"}


class JsonLinesExporter(SpanExporter):
    """Appends every finished span to a file as one JSON line (O_APPEND keeps lines whole)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write the spans."""
        with open(self.path, "a", encoding="utf-8") as handle:
            for span in spans:
                handle.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


def build(config: Config) -> tuple[Celery, Sagas]:
    """The app and its Sagas: an order saga of three steps, the second of which declines a
    card whose number starts with "declined"; ``paid-order`` (a step, a wait for the signal
    ``paid``, a step) and ``family`` (a step, then two child sagas ``parcel`` one after the
    other)."""
    app = Celery("tracing", broker=config.broker)
    app.conf.update(task_default_queue=config.queue, worker_prefetch_multiplier=1,
                    task_acks_late=True, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    prefix = {"key_prefix": config.prefix} if config.store.startswith("redis") else {
        "table_prefix": config.prefix + "_"}
    # A short staleness limit lets a test's sweep send a lost message again within seconds.
    # require_aof=False: the test Redis runs without AOF (a SQL store ignores it).
    sagas = Sagas(app, store=config.store, queue=config.queue, stale_after=2.0,
                  require_aof=False, **prefix)

    @sagas.step(compensate="shop.release", name="shop.reserve")
    def reserve(sku: str, qty: int) -> dict[str, str]:
        return {"reservation": f"res-{sku}"}

    @sagas.compensator(name="shop.release")
    def release(sku: str, qty: int, *, result: Any = None) -> None:
        return None

    @sagas.step(compensate="shop.refund", name="shop.charge")
    def charge(card: str, total: int) -> dict[str, int]:
        if card.startswith("declined"):
            raise StepNotCommitted("card_declined")
        return {"charged": total}

    @sagas.compensator(name="shop.refund")
    def refund(card: str, total: int, *, result: Any = None) -> None:
        return None

    @sagas.step(compensate=None, name="shop.ship")
    def ship(order_id: str) -> dict[str, str]:
        return {"tracking": f"trk-{order_id}"}

    @sagas.saga("order")
    def order(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(reserve, data["sku"], data["qty"])
        ctx.step(charge, data["card"], data["total"])
        ctx.step(ship, data["order_id"])

    @sagas.saga("paid-order")  # waits for the signal "paid" between its two steps
    def paid_order(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(reserve, data["sku"], data["qty"])
        ctx.wait_signal("paid")
        ctx.step(ship, data["order_id"])

    @sagas.saga("parcel")  # the child of "family", twice
    def parcel(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(ship, data["order_id"])

    @sagas.saga("family")
    def family(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(reserve, data["sku"], data["qty"])
        ctx.child("parcel", {"order_id": "first"})
        ctx.child("parcel", {"order_id": "second"})

    return app, sagas


def install_tracing(config: Config) -> TracerProvider:
    """This process's tracer provider, exporting to the span file (and the Celery
    instrumentation when asked)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(config.spans)))
    trace.set_tracer_provider(provider)
    if config.instrument_celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(tracer_provider=provider)
    return provider


if "TRACE_QUEUE" in os.environ:  # a worker process: tests build their own app
    CONFIG = Config.from_env()
    app, sagas = build(CONFIG)

    @worker_process_init.connect(weak=False)
    def _trace_this_process(**_: Any) -> None:
        install_tracing(CONFIG)
