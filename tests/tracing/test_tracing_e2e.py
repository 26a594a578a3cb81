"""One trace per saga across real workers (docs/tracing.md), with and without
``opentelemetry-instrumentation-celery``.

A saga that completes and one that compensates are started from this process inside a
``saga.start`` span; prefork workers run the steps and the compensation, each pool process
exporting its spans to a file. Every span about a saga must sit in the trace of its start,
under it, with the saga's attributes and no payload value; with the Celery instrumentation
the task spans nest under the saga's. The span tree of the compensated saga is the one
docs/tracing.md shows (``CELERY_SAGAS_WRITE_DOCS=1`` rewrites it there).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from tests.conftest import REDIS_BROKER_URL
from tests.e2e.conftest import wait_until
from tests.files import read_json_lines
from tests.tracing.app import Config, build
from tests.tracing.conftest import ROOT, start_worker

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

BROKER = REDIS_BROKER_URL
DOC = ROOT / "docs" / "tracing.md"
SECRETS = ("SKU-SECRET-42", "4111-SECRET", "ORDER-SECRET-7", "1234567")
Span = dict[str, Any]


@pytest.fixture(params=["plain", "instrumented"])
def traced(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
           tracer_provider: Any) -> Iterator[tuple[Any, Config, Any]]:
    """A worker exporting spans to a file, and this process's app, Sagas and exporter."""
    instrumented = request.param == "instrumented"
    tag = "tr" + uuid.uuid4().hex[:10]
    config = Config(BROKER, redis_url, tag, f"q-{tag}", tmp_path / "spans.jsonl", instrumented)
    app, sagas = build(config)
    provider, exporter = tracer_provider
    instrumentor = None
    if instrumented:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        instrumentor = CeleryInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
    worker = start_worker("tests.tracing.app", config.queue, config.environ(), tmp_path / "worker.log")
    try:
        yield sagas, config, exporter
    finally:
        worker.kill()
        if instrumentor is not None:
            instrumentor.uninstrument()
        _cleanup(sagas, app)


def _cleanup(sagas: Any, app: Any) -> None:
    store = sagas.store
    keys = list(store._client.scan_iter(match=store.layout.pattern(), count=1000))
    if keys:
        store._client.delete(*keys)
    store.close()
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(app.conf.task_default_queue)


def test_each_saga_is_one_trace_under_its_start_without_payloads(traced: Any) -> None:
    # given
    sagas, config, exporter = traced
    order = {"order_id": "ORDER-SECRET-7", "sku": "SKU-SECRET-42", "qty": 2, "total": 1234567}
    completed, compensated = f"ok-{config.prefix}", f"no-{config.prefix}"

    # when
    sagas.start("order", {**order, "card": "4111-SECRET"}, saga_id=completed)
    sagas.start("order", {**order, "card": "declined-4111-SECRET"}, saga_id=compensated)
    assert sagas.wait(completed, timeout=60).state == "completed"
    assert sagas.wait(compensated, timeout=60).state == "compensated"
    spans = _all_spans(config, exporter, expected=6)

    # then: one trace per saga, every span of it under its start
    ok = _trace_of(spans, completed)
    assert _saga_spans(ok) == [
        ("saga.start", None), ("saga.step shop.reserve", "committed"),
        ("saga.step shop.charge", "committed"), ("saga.step shop.ship", "committed"),
    ]
    no = _trace_of(spans, compensated)
    assert _saga_spans(no) == [
        ("saga.start", None), ("saga.step shop.reserve", "committed"),
        ("saga.step shop.charge", "failed"), ("saga.compensation shop.reserve", "committed"),
    ]
    for trace_spans in (ok, no):
        _assert_under_start(trace_spans, config.instrument_celery)
    charge = _named(no, "saga.step shop.charge")
    assert charge["attributes"]["saga.error_code"] == "card_declined"
    assert charge["status"]["status_code"] == "ERROR"
    undo = _named(no, "saga.compensation shop.reserve")
    assert {"saga.definition": "order", "saga.step": "shop.reserve", "saga.stage": "compensation",
            "saga.id": compensated}.items() <= undo["attributes"].items()
    assert re.fullmatch(r"[0-9a-f-]{36}", undo["attributes"]["saga.effect_id"])
    # and: no payload value in any attribute or event
    text = json.dumps(spans)
    for secret in SECRETS:
        assert secret not in text, secret
    # and: the docs show this tree
    _check_doc_tree(no, "instrumented" if config.instrument_celery else "plain")


def test_a_step_message_lost_and_sent_again_by_the_sweep_stays_in_the_saga_trace(
        traced: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a saga whose first step message never reaches the broker
    sagas, config, exporter = traced
    saga_id = f"lost-{config.prefix}"
    dropped: list[str] = []
    send_step = sagas.dispatcher.send_step

    def lose_first(saga: str, step: Any, version: int, **options: Any) -> None:
        if not dropped:
            dropped.append(step.name)
            return
        send_step(saga, step, version, **options)

    monkeypatch.setattr(sagas.dispatcher, "send_step", lose_first)
    sagas.start("order", {"order_id": "o", "sku": "SKU-SECRET-42", "qty": 1, "total": 5,
                          "card": "4111-SECRET"}, saga_id=saga_id)
    assert dropped == ["shop.reserve"]

    # when: sweeps run (from this process, in traces of their own) until one sends it again
    wait_until(lambda: sagas.sweep().acted >= 1, 30, "a sweep that sends the lost step again")
    assert sagas.wait(saga_id, timeout=60).state == "completed"
    spans = _all_spans(config, exporter, expected=3)

    # then: one trace: the start, the sweep's send under it, every delivery under the start
    saga_trace = _trace_of(spans, saga_id)
    assert _saga_spans(saga_trace) == [
        ("saga.start", None), ("saga.send shop.reserve", None),
        ("saga.step shop.reserve", "committed"), ("saga.step shop.charge", "committed"),
        ("saga.step shop.ship", "committed"),
    ]
    chains = _chains_to_start(saga_trace)
    send = _named(saga_trace, "saga.send shop.reserve")
    assert chains["saga.send shop.reserve"] == ["saga.send shop.reserve"]
    reserve = chains["saga.step shop.reserve"]
    assert reserve[0] == "saga.step shop.reserve" and reserve[-1] == "saga.send shop.reserve"
    assert len(chains["saga.step shop.charge"]) == len(reserve) - 1
    # and: the send links to the sweep that made it, in the sweep's own trace
    sweeps = {s["context"]["span_id"]: s for s in spans if s["name"] == "saga.sweep"}
    [link] = send["links"]
    assert link["context"]["span_id"] in sweeps
    assert sweeps[link["context"]["span_id"]]["context"]["trace_id"] != send["context"]["trace_id"]
    text = json.dumps(saga_trace)
    for secret in SECRETS:
        assert secret not in text, secret
    if not config.instrument_celery:
        _check_doc_tree(saga_trace, "resent")


def _chains_to_start(spans: list[Span]) -> dict[str, list[str]]:
    """Each span's names up its parents to (not including) ``saga.start``; fails for a span
    that does not descend from the start."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    start = _named(spans, "saga.start")
    chains: dict[str, list[str]] = {}
    for span in spans:
        if span is start:
            continue
        chain, parent = [span["name"]], span["parent_id"]
        while parent is not None and parent in by_id and by_id[parent] is not start:
            chain.append(by_id[parent]["name"])
            parent = by_id[parent]["parent_id"]
        assert parent == start["context"]["span_id"], f"{chain} is not under saga.start"
        chains[span["name"]] = chain
    return chains


def _all_spans(config: Config, exporter: Any, expected: int) -> list[Span]:
    """This process's finished spans and the workers', once ``expected`` saga deliveries and
    their task spans have ended (a delivery span ends just after its last write)."""

    def worker_spans() -> list[Span]:
        return read_json_lines(config.spans)

    def delivered() -> list[Span] | None:
        found = worker_spans()
        deliveries = [s for s in found if s["name"].startswith(("saga.step", "saga.compensation"))]
        runs = [s for s in found if s["name"].startswith("run/")]
        enough = len(deliveries) >= expected and (not config.instrument_celery or len(runs) >= expected)
        return found if enough else None

    found = wait_until(delivered, 30, f"{expected} delivery spans")
    local = [json.loads(span.to_json(indent=None)) for span in exporter.get_finished_spans()]
    return local + found


def _trace_of(spans: list[Span], saga_id: str) -> list[Span]:
    """The spans of the one trace every span about ``saga_id`` belongs to."""
    traces = {s["context"]["trace_id"] for s in spans if s["attributes"].get("saga.id") == saga_id}
    assert len(traces) == 1, f"saga {saga_id} spans are in {len(traces)} traces"
    [trace_id] = traces
    return sorted((s for s in spans if s["context"]["trace_id"] == trace_id), key=lambda s: s["start_time"])


def _saga_spans(spans: list[Span]) -> list[tuple[str, str | None]]:
    return [(s["name"], s["attributes"].get("saga.outcome")) for s in spans
            if s["name"].startswith("saga.")]


def _named(spans: list[Span], name: str) -> Span:
    [span] = [s for s in spans if s["name"] == name]
    return span


def _assert_under_start(spans: list[Span], instrumented: bool) -> None:
    """Every span descends from ``saga.start``; with the instrumentation each delivery span's
    parent is its task's ``run/`` span, whose parent is the ``apply_async/`` span sent from the
    start's context."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    start = _named(spans, "saga.start")
    for span in spans:
        chain, parent = [span["name"]], span["parent_id"]
        while parent is not None and parent in by_id and by_id[parent] is not start:
            chain.append(by_id[parent]["name"])
            parent = by_id[parent]["parent_id"]
        if span is start:
            continue
        assert parent == start["context"]["span_id"], f"{chain} is not under saga.start"
        if span["name"].startswith(("saga.step", "saga.compensation")):
            expected = 3 if instrumented else 1  # delivery <- run/ <- apply_async/ <- start
            assert len(chain) == expected, chain
            if instrumented:
                assert chain[1].startswith("run/") and chain[2].startswith("apply_async/"), chain


# ------------------------------------------------------------ the docs' span tree

_SHOWN = ("saga.definition", "saga.state", "saga.attempt", "saga.outcome", "saga.error_code")


def render_tree(spans: list[Span]) -> str:
    """The trace as an indented tree: span names, the attributes worth reading, events."""
    children: dict[str | None, list[Span]] = {}
    ids = {s["context"]["span_id"] for s in spans}
    for span in spans:
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(span: Span, prefix: str, last: bool, root: bool) -> None:
        keys = _SHOWN if root else _SHOWN[1:]  # the definition once, on the root
        shown = " ".join(f"{k.removeprefix('saga.')}={span['attributes'][k]}" for k in keys
                         if k in span["attributes"])
        branch = "" if root else ("└─ " if last else "├─ ")
        lines.append(f"{prefix}{branch}{span['name']}" + (f"  [{shown}]" if shown else ""))
        inner = prefix if root else prefix + ("   " if last else "│  ")
        kids = children.get(span["context"]["span_id"], [])
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in children.get(None, []):
        walk(root, "", True, True)
    return "\n".join(lines)


def _check_doc_tree(spans: list[Span], variant: str) -> None:
    rendered = render_tree(spans)
    marker = f"<!-- span-tree: {variant} -->\n```text\n"
    text = DOC.read_text()
    start = text.index(marker) + len(marker)
    end = text.index("```", start)
    if os.environ.get("CELERY_SAGAS_WRITE_DOCS") == "1":
        DOC.write_text(text[:start] + rendered + "\n" + text[end:])
        return
    assert text[start:end] == rendered + "\n", f"docs/tracing.md shows another tree:\n{rendered}"


# ------------------------------------------------------------ signals and children (issue 25 item 7)


def _waiting(sagas: Any, saga_id: str) -> bool:
    record = sagas.get(saga_id)
    return record is not None and any(s.state == "waiting" for s in record.steps)


def _descends(spans: list[Span], span: Span, ancestor: Span) -> bool:
    by_id = {s["context"]["span_id"]: s for s in spans}
    parent = span["parent_id"]
    while parent is not None and parent in by_id:
        if parent == ancestor["context"]["span_id"]:
            return True
        parent = by_id[parent]["parent_id"]
    return False


@pytest.mark.parametrize("caller", ["no span", "a webhook span"])
def test_a_signal_joins_the_saga_trace_and_the_steps_after_it_stay_there(
        traced: Any, caller: str) -> None:
    # given: a saga waiting for "paid" (the signal's span started a trace of its own, and every
    # later step of the saga landed in it)
    sagas, config, exporter = traced
    saga_id = f"sig-{config.prefix}"
    sagas.start("paid-order", {"order_id": "o", "sku": "SKU-SECRET-42", "qty": 1},
                saga_id=saga_id)
    wait_until(lambda: _waiting(sagas, saga_id), 60, "the saga waiting for the signal")

    # when: the signal comes from a caller with no span (a script), or inside a request's span
    if caller == "no span":
        sagas.signal(saga_id, "paid", {"amount": 1234567})
    else:
        with trace.get_tracer("webhook").start_as_current_span("POST /webhook"):
            sagas.signal(saga_id, "paid", {"amount": 1234567})
    assert sagas.wait(saga_id, timeout=60).state == "completed"
    spans = _all_spans(config, exporter, expected=2)

    # then: the steps before and after the signal are in the start's trace, under the start
    start = next(s for s in spans if s["name"] == "saga.start"
                 and s["attributes"].get("saga.id") == saga_id)
    steps = [s for s in spans if s["name"].startswith("saga.step")
             and s["attributes"].get("saga.id") == saga_id]
    assert sorted(s["name"] for s in steps) == ["saga.step shop.reserve", "saga.step shop.ship"]
    in_trace = [s for s in spans if s["context"]["trace_id"] == start["context"]["trace_id"]]
    for step in steps:
        assert step["context"]["trace_id"] == start["context"]["trace_id"], step["name"]
        assert _descends(in_trace, step, start), step["name"]
    signal = next(s for s in spans if s["name"] == "saga.signal")
    if caller == "no span":  # the signal span itself is under the start
        assert _descends(in_trace, signal, start)
    else:  # a child of the request, linked to the saga's start
        assert [link["context"]["span_id"] for link in signal["links"]] == [
            start["context"]["span_id"]]
    text = json.dumps(spans)
    for secret in SECRETS:
        assert secret not in text, secret


def test_child_sagas_sit_under_their_parent_s_child_steps_and_siblings_never_nest(
        traced: Any) -> None:
    # given (a child saga had no saga.start span, and the second child's steps nested under
    # the first child's step)
    sagas, config, exporter = traced
    saga_id = f"fam-{config.prefix}"

    # when
    sagas.start("family", {"sku": "SKU-SECRET-42", "qty": 1}, saga_id=saga_id)
    assert sagas.wait(saga_id, timeout=60).state == "completed"
    spans = _all_spans(config, exporter, expected=3)

    # then: one trace; each child has a saga.start under its own saga.child step span, both
    # under the parent's start; each child's step is under its own start only
    family = _trace_of(spans, saga_id)
    root = next(s for s in family if s["name"] == "saga.start"
                and s["attributes"]["saga.id"] == saga_id)
    child_steps = sorted((s for s in family if s["name"].startswith("saga.child ")),
                         key=lambda s: s["start_time"])
    assert [s["name"] for s in child_steps] == ["saga.child child:parcel",
                                                "saga.child child:parcel#2"]
    kids = [s["attributes"]["saga.child"] for s in child_steps]
    for kid, step_span in zip(kids, child_steps, strict=True):
        assert _descends(family, step_span, root)
        [kid_start] = [s for s in family if s["name"] == "saga.start"
                       and s["attributes"]["saga.id"] == kid]
        assert kid_start["parent_id"] == step_span["context"]["span_id"]
        assert kid_start["attributes"]["saga.parent"] == saga_id
        [kid_ship] = [s for s in family if s["name"] == "saga.step shop.ship"
                      and s["attributes"]["saga.id"] == kid]
        assert _descends(family, kid_ship, kid_start)
        others = [s for s in child_steps if s is not step_span]
        assert not any(_descends(family, kid_ship, other) for other in others)
