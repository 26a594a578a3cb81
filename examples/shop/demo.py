"""The README's main job: run two orders through the place-order saga and print them.

    python -m examples.shop.demo                       # no services needed
    python -m examples.shop.demo --broker redis://127.0.0.1:6379/0 \\
                                 --store redis://127.0.0.1:6379/1

With no URLs it embeds everything: the in-memory broker, a SQLite saga store in a temporary
directory, a worker thread pool in this process and a sweeper standing in for beat. One order
completes; the next one's card is declined, so its stock reservation is released; the third is
large enough to need a manager's approval, which the demo grants before the order goes on; the
fourth's card is refused by the primary acquirer and charged by the backup one (``run``
catches ``StepFailed``); the fifth's carrier times out while buying the label, so the label is
cancelled by its request id whatever came of it, and the order is compensated, not left for
review (``compensate_unknown``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", help="broker URL (default: in-memory, this process only)")
    parser.add_argument("--store", help="saga store URL (default: SQLite in a temp directory)")
    parser.add_argument("--no-worker", action="store_true",
                        help="rely on workers started elsewhere instead of an embedded one")
    return parser.parse_args(argv)


@contextmanager
def _embedded_worker(app: Any, sagas: Any) -> Iterator[None]:
    """A worker thread pool in this process, plus a thread that sweeps like beat would."""
    from celery.contrib.testing.worker import start_worker

    stop = threading.Event()

    def sweeper() -> None:
        while not stop.wait(0.5):
            sagas.sweep()

    thread = threading.Thread(target=sweeper, name="demo-sweeper", daemon=True)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30):
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _approve(sagas: Any, order: dict[str, Any]) -> None:
    """Wait for the large order to park at its gate, approve it, resume it with the token."""
    deadline = time.monotonic() + 60
    while not (pending := sagas.approvals.pending(order["id"])):
        if time.monotonic() > deadline:
            raise TimeoutError("the large order never reached its approval gate")
        time.sleep(0.05)
    approval = pending[0]
    print(f"saga {order['id']}: awaiting approval {approval.approval_id} "
          f"({approval.capability} for {approval.target})")
    sagas.approvals.decide(approval.approval_id, tenant_id="shop", decision="approved",
                           decided_by="manager-mia")
    print(f"  approved by manager-mia; resuming with the token for {order['customer']}")
    sagas.approvals.resume(order["id"], approval.token, tenant_id="shop",
                           principal_id=order["customer"])


def _show(record: Any) -> None:
    print(f"saga {record.saga_id}: {record.state}"
          + (f" ({record.error_code})" if record.error_code else ""))
    for step in record.steps:
        detail = f"result={step.result}" if step.result is not None else f"error={step.error_code}"
        print(f"  {step.name:<20} {step.state:<12} attempts={step.attempts} "
              f"undo-attempts={step.compensation_attempts} {detail}")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    args = _parse(argv)
    workdir = tempfile.mkdtemp(prefix="shop-demo-")
    os.environ["SHOP_BROKER"] = args.broker or "memory://localhost/"
    os.environ["SHOP_STORE"] = args.store or f"sqlite:///{workdir}/sagas.db"
    os.environ.setdefault("SHOP_PROVIDER_DB", f"{workdir}/provider.db")
    from .app import app, sagas
    from .orders import place_order
    from .provider import provider

    if not args.broker:  # kombu polls the in-memory broker, by default once a second
        app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                             "polling_interval": 0.05}

    run = uuid.uuid4().hex[:6]
    orders = [
        {"id": f"order-{run}-1", "sku": "BOOK-42", "qty": 1, "card": "4242", "total": 30},
        {"id": f"order-{run}-2", "sku": "LAMP-7", "qty": 2, "card": "declined-0002", "total": 80},
        {"id": f"order-{run}-3", "sku": "SOFA-1", "qty": 1, "card": "4242", "total": 900,
         "customer": "carol"},
        {"id": f"order-{run}-4", "sku": "MUG-3", "qty": 4, "card": "risky-0004", "total": 48},
        {"id": f"order-{run}-5", "sku": "VASE-9", "qty": 1, "card": "4242", "total": 60,
         "carrier": "flaky"},
    ]
    worker = _embedded_worker(app, sagas) if not args.no_worker else contextmanager(
        lambda: iter([None]))()
    with worker:
        handles = [place_order.start(order, saga_id=order["id"]) for order in orders]
        _approve(sagas, orders[2])
        records = [handle.wait(timeout=60) for handle in handles]
    for record in records:
        _show(record)
    print("provider effects (service, action):")
    for service, action, _key in provider().effects():
        print(f"  {service:<10} {action}")
    expected = ["completed", "compensated", "completed", "completed", "compensated"]
    return 0 if [str(r.state) for r in records] == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
