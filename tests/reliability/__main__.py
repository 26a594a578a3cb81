"""Run the reliability suite and print its figures.

    python -m tests.reliability            # the CI-sized scenarios
    python -m tests.reliability --full     # the full run (300 sagas under pool kills, ...)
    python -m tests.reliability --full --only pool-kills,redis-restarts

Needs redis-server on the PATH and the PostgreSQL/RabbitMQ services of tests/conftest.py
(scenarios whose service does not answer are skipped and say so). Exits non-zero when any
invariant is violated or a scenario did not do what it should (e.g. no fault landed).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.conftest import POSTGRES_URL, RABBITMQ_URL, _answers
from tests.isolation import endpoint
from tests.reliability import scenarios
from tests.reliability.fuzz import run_fuzz
from tests.reliability.harness import Report


def _plan(size: scenarios.Size) -> list[tuple[str, Callable[[Path], Report]]]:
    pg_up = _answers(*endpoint(POSTGRES_URL, 5432))
    rabbit_up = _answers(*endpoint(RABBITMQ_URL, 5672))
    plan: list[tuple[str, Callable[[Path], Report]]] = [
        (name, lambda d, f=function: f(d, size))  # type: ignore[misc]
        for name, function in scenarios.SCENARIOS.items()
    ]
    if pg_up:
        plan.append(("pg-terminate",
                     lambda d: scenarios.pg_terminations(d, size, POSTGRES_URL)))
        if rabbit_up and size.name == "full":
            plan.append(("pg-terminate-rabbitmq", lambda d: scenarios.pg_terminations(
                d, size, POSTGRES_URL, broker=RABBITMQ_URL, label="RabbitMQ broker")))
            plan.append(("pool-kills-rabbitmq", lambda d: scenarios.pool_kills(
                d, size, broker=RABBITMQ_URL, store=POSTGRES_URL)))
            plan.append(("worker-kills-rabbitmq", lambda d: scenarios.worker_kills(
                d, size, broker=RABBITMQ_URL, store=POSTGRES_URL)))
    plan.append(("fuzz", lambda d: run_fuzz(examples=2000 if size.name == "full" else 200)))
    return plan


def _totals(reports: list[Report]) -> str:
    faults: Counter[str] = Counter()
    reviews: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for report in reports:
        faults.update(report.faults)
        reviews.update(report.manual_review)
        causes.update(report.review_causes)
        outcomes.update(report.outcomes)
    violations = sum(len(r.violations) for r in reports)
    settles = {r.scenario: r.settle_s for r in reports if r.settle_s is not None and r.faults}
    per_scenario = "; ".join(f"{name}: {s:.1f}s" for name, s in settles.items())
    return "\n".join([
        "=== totals",
        f"sagas run: {sum(r.sagas for r in reports)}  outcomes: {dict(sorted(outcomes.items()))}",
        f"fuzz examples: {sum(sum(r.examples.values()) for r in reports)}",
        f"faults injected: {sum(faults.values())}  by type: {dict(sorted(faults.items()))}",
        f"invariant violations: {violations}",
        f"manual review: {sum(reviews.values())}  reasons: {dict(sorted(reviews.items()))}  "
        f"ambiguous steps by cause: {dict(sorted(causes.items()))}",
        f"time to settle after the last fault: max {max(settles.values(), default=0):.1f}s "
        f"({per_scenario})",
        f"problems: {sum(len(r.problems) for r in reports)}",
    ])


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios, print each report and the totals; 1 on any violation or problem."""
    parser = argparse.ArgumentParser(prog="python -m tests.reliability")
    parser.add_argument("--full", action="store_true", help="full sizes (else the CI sizes)")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    # The figures are the output; the library's own warnings and tracebacks (expected under
    # these faults) would drown them.
    logging.disable(logging.ERROR)
    # Turn SIGTERM into SystemExit so every cluster's finally kills its processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = scenarios.FULL if args.full else scenarios.CI
    wanted = {name for name in args.only.split(",") if name}
    workdir = Path(tempfile.mkdtemp(prefix="celery-sagas-reliability-"))
    reports: list[Report] = []
    began = time.monotonic()
    try:
        for name, run in _plan(size):
            if wanted and name not in wanted:
                continue
            print(f"--- {name} ...", flush=True)
            try:
                report = run(workdir)
            except Exception:
                report = Report(name, problems=[traceback.format_exc()])
            reports.append(report)
            print(report.summary(), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(_totals(reports))
    print(f"wall time: {time.monotonic() - began:.0f}s")
    failed = any(r.violations or r.problems for r in reports)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
