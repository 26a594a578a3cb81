"""How long each page of the operator web UI takes with 100,000 sagas in the store.

On each store (Redis, PostgreSQL), under a fresh prefix, it writes ``--sagas`` realistic saga
records straight through the store's own layout (``bench.bulk.load``: pipelined
``HSET``/``ZADD`` on Redis, ``COPY`` on PostgreSQL): three definitions, three steps each, most
completed over the last day, some compensated, running, compensating and in manual review.
Each record carries its definition as the store's label (the label index) and its steps'
effect marks, as the codec writes them. Then it builds ``create_app(sagas)`` over that store
and times every page with Flask's test client: the first request (the overview's cold one
counts every minute of its chart; later ones only the recent minutes), one more warm-up, then
the median (and the slowest) of ``--repeat`` requests: the overview, the sagas list filtered
by state, definition and id prefix (``scan_prefix``: the primary key on PostgreSQL, the id index
on Redis), sorted by last write or by creation either way (``scan_ordered``) and their next
pages, one saga and the attention queue. It also counts the store primitives the first request calls (the
overview calls ``count``, and one ``scan`` of the open sagas idle past ``stale_after``; a list
page one ``scan``, ``scan_prefix`` or ``scan_ordered``). Prints the
figures with the load average, writes ``bench/results/web_pages.json``, and removes what it
wrote.

    .venv/bin/python bench/web_pages.py                      # 100,000 sagas, both stores
    .venv/bin/python bench/web_pages.py --sagas 20000 --stores redis
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `celery_sagas` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import base64
import html
import os
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any, cast

from celery import Celery

from bench.bulk import add_store_arguments, destroy, load, open_store
from bench.common import git_commit, machine, write_json
from celery_sagas import SagaRecord, Sagas, SagaState, StepRecord, StepState, Store
from celery_sagas._codec import Codec
from celery_sagas._protocol.effects import marked
from celery_sagas.stores.base import Envelope, OrderedScan, Page, PrefixScan
from celery_sagas.testing.proxy import StoreProxy
from celery_sagas.web import WebUser, create_app

RESULTS = Path(__file__).resolve().parent / "results" / "web_pages.json"
DAY_MS = 24 * 3_600_000
TARGET_MS = 300.0
USER = WebUser("bench", "bench-password", "operator")
AUTH = {"Authorization": "Basic " + base64.b64encode(b"bench:bench-password").decode()}
DEFINITIONS = (("place-order", 7), ("refund-order", 2), ("sync-user", 1))  # weights
# Of every 1,000 sagas: 2 in manual review, 3 running, 1 compensating, 44 compensated.
MIX = ((SagaState.MANUAL_REVIEW, 2), (SagaState.RUNNING, 3), (SagaState.COMPENSATING, 1),
       (SagaState.COMPENSATED, 44), (SagaState.COMPLETED, 950))
_STEP_STATES = {
    SagaState.COMPLETED: (StepState.COMMITTED,) * 3,
    SagaState.COMPENSATED: (StepState.COMPENSATED, StepState.COMPENSATED, StepState.FAILED),
    SagaState.RUNNING: (StepState.COMMITTED, StepState.EXECUTING),
    SagaState.COMPENSATING: (StepState.COMPENSATED, StepState.COMPENSATING, StepState.FAILED),
    SagaState.MANUAL_REVIEW: (StepState.COMMITTED, StepState.AMBIGUOUS),
}
CODEC = Codec()


def _step(n: int, state: StepState, at: int) -> StepRecord:
    task = ("shop.reserve", "shop.charge", "shop.ship")[n]
    done = state in (StepState.COMMITTED, StepState.COMPENSATED, StepState.COMPENSATING)
    return StepRecord(
        name=task, task=task, effect_id=f"5f0c2a61-8d3e-4b7a-9c11-00000000000{n}",
        compensation_effect_id=f"5f0c2a61-8d3e-4b7a-9c11-10000000000{n}", state=state,
        args=("sku-123", 2) if n == 0 else ("tok_visa", 4200), kwargs={"warehouse": "east"},
        compensator=task + ".undo", result={"ref": f"{task}-ab12cd34", "amount": 4200} if done else None,
        attempts=1, compensation_attempts=1 if state is StepState.COMPENSATED else 0,
        started_at_ms=at + 40 * n + 5, claimed_by="worker-1.example:4242/ab12cd34",
        dispatched_at_ms=at + 40 * n, time_limit_ms=300_000,
        committed_at_ms=at + 40 * n + 30 if done else None,
        error_code={StepState.FAILED: "declined", StepState.AMBIGUOUS: "step_error"}.get(state),
    )


def body(definition: str, state: SagaState, created: int) -> str:
    """The JSON body of one realistic saga record of ``definition`` in ``state``."""
    steps = tuple(_step(n, s, created) for n, s in enumerate(_STEP_STATES[state]))
    reason = "step 'shop.charge' effect 5f0c2a61-8d3e-4b7a-9c11-000000000001 is ambiguous (step_error)"
    record = SagaRecord(
        "x", definition, state,
        {"order": {"id": "o-1", "sku": "sku-123", "qty": 2, "card": "tok_visa", "total": 4200,
                   "customer": {"id": "c-99", "email": "someone@example.com"}}},
        created, created + 1_000, steps,
        error_code={SagaState.MANUAL_REVIEW: "ambiguous_step",
                    SagaState.COMPENSATED: "declined"}.get(state),
        reason=reason if state is SagaState.MANUAL_REVIEW else None,
    )
    return CODEC.saga_envelope(marked(record, created + 1_000)).body


def _plan(count: int) -> list[tuple[SagaState, str]]:
    """The (state, definition) of each saga, interleaved so every page sees a mix."""
    states = [s for s, weight in MIX for _ in range(weight)]
    names = [d for d, weight in DEFINITIONS for _ in range(weight)]
    return [(states[(n * 7919) % len(states)], names[n % len(names)]) for n in range(count)]


def envelopes(count: int, now_ms: int) -> Iterator[Envelope]:
    """``count`` sagas updated over the last day (open ones in the last hour)."""
    created = now_ms - 2 * DAY_MS
    bodies = {(s, d): body(d, s, created) for s, _ in MIX for d, _ in DEFINITIONS}
    for n, (state, definition) in enumerate(_plan(count)):
        final = state in (SagaState.COMPLETED, SagaState.COMPENSATED)
        at = now_ms - (n * DAY_MS) // count if final else now_ms - 3_600_000 + n % 3_600_000
        yield Envelope("saga", f"order-{n:06d}", 6, str(state), at, bodies[(state, definition)],
                       label=definition)


# ---------------------------------------------------------------------- loading


# ---------------------------------------------------------------------- timing


_COUNTED = frozenset({"get", "scan", "scan_due", "count", "scan_prefix", "scan_ordered"})


class CallCounter(StoreProxy):
    """The store, counting the primitives the pages call."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name in _COUNTED and callable(found):
            calls = super().__getattribute__("calls")

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] = calls.get(name, 0) + 1
                return found(*args, **kwargs)

            return counted
        return found

    def scan_prefix(self, *args: Any, **kwargs: Any) -> Page:
        """Delegate (the store's ``PrefixScan``)."""
        return cast(PrefixScan, self.inner).scan_prefix(*args, **kwargs)

    def scan_ordered(self, *args: Any, **kwargs: Any) -> Page:
        """Delegate (the store's ``OrderedScan``)."""
        return cast(OrderedScan, self.inner).scan_ordered(*args, **kwargs)

    def taken(self) -> dict[str, int]:
        """The calls counted since the last ``taken``."""
        taken, self.calls = dict(self.calls), {}
        return taken


def facade(store: Store) -> Sagas:
    """A Sagas over ``store`` with the benchmark's definitions registered (no broker needed)."""
    sagas = Sagas(Celery("bench-web", set_as_current=False), store=store)
    for name, _ in DEFINITIONS:
        sagas.saga(name)(lambda ctx, data: None)
    return sagas


def _get(client: Any, path: str) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.get(path, headers=AUTH)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path}: HTTP {response.status_code}")
    return elapsed, response.get_data(as_text=True)


def pages(client: Any) -> dict[str, str]:
    """The pages to time (the second sagas page follows the first one's cursor)."""
    paths = {
        "overview": "/",
        "sagas (all states)": "/sagas",
        "sagas, state manual-review": "/sagas?state=manual-review",
        "sagas, definition sync-user": "/sagas?definition=sync-user",
        "sagas, id prefix (rare)": "/sagas?id=order-09999",
        "sagas, id prefix (1,000 match)": "/sagas?id=order-001",
        "sagas, id prefix, in review": "/sagas?id=order-0&state=manual-review",
        "sagas, newest first": "/sagas?sort=newest",
        "sagas, oldest first": "/sagas?sort=oldest",
        "sagas, newest created": "/sagas?sort=newest-created",
        "sagas, oldest created": "/sagas?sort=oldest-created",
        "sagas, open, newest created":
            "/sagas?state=running&state=compensating&sort=newest-created",
        "sagas, open, newest first": "/sagas?state=running&state=compensating&sort=newest",
        "sagas, sync-user, newest first": "/sagas?definition=sync-user&sort=newest",
        "saga (manual review)": "/saga?id=" + _review_id(client),
        "needs attention": "/attention",
    }
    for name, first_page in (("sagas, next page", "/sagas"),
                             ("sagas, newest first, next page", "/sagas?sort=newest"),
                             ("sagas, newest created, next",
                              "/sagas?sort=newest-created"),
                             ("sagas, id prefix, next page", "/sagas?id=order-001")):
        _, first = _get(client, first_page)
        found = re.search(r'<a class="next" href="([^"]*)"', first)
        if found:
            paths[name] = html.unescape(found.group(1))
    return paths


def _review_id(client: Any) -> str:
    _, text = _get(client, "/sagas?state=manual-review")
    found = re.search(r'class="id"><a href="[^"]*">([^<]*)</a>', text)
    if found is None:
        raise RuntimeError("no saga in manual review")
    return found.group(1)


def time_pages(client: Any, store: CallCounter, repeat: int) -> dict[str, dict[str, Any]]:
    """Median and slowest milliseconds of each page, and the store calls one request makes."""
    out: dict[str, dict[str, Any]] = {}
    for name, path in pages(client).items():
        store.taken()
        first = _get(client, path)[0]
        calls = store.taken()
        _get(client, path)
        runs = [_get(client, path)[0] for _ in range(repeat)]
        out[name] = {"first_ms": first, "median_ms": statistics.median(runs), "max_ms": max(runs),
                     "path": path, "store_calls_first": calls}
        verdict = "ok" if max(first, out[name]["median_ms"]) < TARGET_MS else "OVER"
        shown = ", ".join(f"{n} {k}" for k, n in sorted(calls.items()))
        print(f"    {name:28s} first {first:6.1f} ms  median {out[name]['median_ms']:6.1f} ms  "
              f"max {max(runs):6.1f} ms  [{verdict}]  (first: {shown})", flush=True)
    return out


def bench_store(backend: str, url: str, count: int, repeat: int) -> dict[str, Any]:
    """Load, time, clean up one store."""
    store = open_store(backend, url, "benchweb")
    try:
        print(f"{backend}: loading {count:,} sagas", flush=True)
        load_s = load(store, envelopes(count, int(time.time() * 1000)), count)
        counter = CallCounter(cast(Store, store))
        client = create_app(facade(counter), users=[USER]).test_client()
        print(f"{backend}: pages (load average {os.getloadavg()[0]:.2f})", flush=True)
        result: dict[str, Any] = {"pages": time_pages(client, counter, repeat), "load_s": load_s}
        shown = _get(client, "/")[1]
        completed = re.search(r'<span class="number">([0-9,]+)</span>\s*<span>completed', shown)
        print(f"    overview shows {completed.group(1) if completed else '?'} completed", flush=True)
        result["loadavg_end"] = os.getloadavg()
        return result
    finally:
        destroy(store)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_store_arguments(parser, "redis,postgres")
    parser.add_argument("--sagas", type=int, default=100_000, help="sagas in each store")
    parser.add_argument("--repeat", type=int, default=9, help="timed requests per page (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a page's first request or median takes 300 ms or more."""
    args = _parser().parse_args(argv)
    urls = {"redis": args.redis, "postgres": args.postgres}
    info = machine()
    print(f"load average at start {info['loadavg_start']}; {info.get('model')}, {info['cpus']} CPUs",
          flush=True)
    results = {name: bench_store(name, urls[name], args.sagas, args.repeat)
               for name in args.stores.split(",")}
    write_json(args.out, {"commit": git_commit(), "machine": info, "sagas": args.sagas,
                          "results": results})
    slow = [(store, page) for store, r in results.items() for page, t in r["pages"].items()
            if max(t["first_ms"], t["median_ms"]) >= TARGET_MS]
    for store, page in slow:
        print(f"OVER {TARGET_MS:.0f} ms: {store} {page}")
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
