"""A real prefork worker per test (``tests.e2e``'s process helpers), and the test process's own
tracer provider.

The OpenTelemetry API lets a process set its global tracer provider once; ``tracer_provider``
sets one with an in-memory exporter and puts the API's globals back afterwards, so the rest
of the session runs with no provider, as a deployment without tracing does.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from tests import forkserver
from tests.e2e.conftest import Process, wait_until

ROOT = Path(__file__).resolve().parents[2]


def reset_trace_globals() -> None:
    """Forget the global tracer provider (the API offers no public way)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def tracer_provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A global SDK tracer provider keeping finished spans in memory, for one test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_trace_globals()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
        reset_trace_globals()


def start_worker(app_module: str, queue: str, env: dict[str, str], log: Path) -> Process:
    """A prefork ``celery worker`` on ``queue``, once it is ready."""
    proc = forkserver.celery(
        ["-A", app_module, "worker", "--pool", "prefork", "-c", "2", "-Q", queue,
         "-n", f"w{uuid.uuid4().hex[:8]}@%h", "-l", "INFO", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        ROOT, {**os.environ, **env, "PYTHONPATH": str(ROOT)}, log,
    )
    worker = Process(proc, log)
    wait_until(lambda: "ready." in worker.text() or proc.poll() is not None, 60, "worker ready")
    assert proc.poll() is None, worker.text()[-3000:]
    return worker
