"""The shop against PostgreSQL and a real prefork worker (``python manage.py test``).

The test runner (shop_site/testing.py) starts the worker on the test database. These are
``TransactionTestCase``s: every transaction here really commits or rolls back, as in
production, which is what ``start_on_commit`` waits for.
"""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from typing import Any

from django.db import connections, transaction
from django.test import LiveServerTestCase, TransactionTestCase

from celery_sagas import SagaRecord
from celery_sagas.contrib.django import start_on_commit

from .models import Order, Payment, Product, Reservation
from .tasks import place_order, sagas


def order(**changes: Any) -> dict[str, Any]:
    """A valid order body with a fresh id."""
    return {"order_id": uuid.uuid4().hex[:12], "sku": "MUG", "qty": 2, "total": 2400,
            "card": "tok_visa", **changes}


def settled(saga_id: str) -> SagaRecord:
    """The saga once completed, compensated or in manual review."""
    return sagas.wait(saga_id, timeout=60)


class Rollback(Exception):
    """Raised to leave an atomic block by rolling it back."""


class OrderSagaTests(TransactionTestCase):
    """A committed order completes or compensates; a rolled-back one never starts."""

    def setUp(self) -> None:
        Product.objects.update_or_create(sku="MUG", defaults={"stock": 10})

    def test_a_committed_order_s_saga_completes(self) -> None:
        # when
        response = self.client.post("/orders/", order(order_id="c-1"), content_type="application/json")

        # then
        self.assertEqual(response.status_code, 202)
        self.assertEqual(response.json()["saga_id"], "order-c-1")
        self.assertEqual(settled("order-c-1").state, "completed")
        self.assertEqual(Order.objects.get(order_id="c-1").status, "confirmed")
        self.assertEqual(Product.objects.get(sku="MUG").stock, 8)
        self.assertEqual(Payment.objects.filter(order_id="c-1", refunded=False).count(), 1)
        shown = self.client.get("/orders/c-1").json()
        self.assertEqual((shown["status"], shown["saga"]["state"]), ("confirmed", "completed"))

    def test_a_declined_card_is_compensated_and_the_stock_put_back(self) -> None:
        # when
        self.client.post("/orders/", order(order_id="d-1", card="tok_declined_1"),
                         content_type="application/json")

        # then
        record = settled("order-d-1")
        self.assertEqual((record.state, record.error_code), ("compensated", "card_declined"))
        self.assertEqual(Product.objects.get(sku="MUG").stock, 10)
        self.assertTrue(Reservation.objects.get(order_id="d-1").released)
        self.assertFalse(Payment.objects.filter(order_id="d-1").exists())

    def test_a_rolled_back_transaction_starts_no_saga(self) -> None:
        # when: the order and its saga are asked for, then the transaction rolls back
        with self.assertRaises(Rollback), transaction.atomic():
            stored = Order.objects.create(**order(order_id="r-1"))
            saga_id = start_on_commit(place_order, stored.saga_input(), saga_id=stored.saga_id)
            raise Rollback

        # then: nothing was recorded, and nothing reached the worker, which has since run a
        # later order to its end
        self.assertIsNone(sagas.get(saga_id))
        self.client.post("/orders/", order(order_id="r-2"), content_type="application/json")
        self.assertEqual(settled("order-r-2").state, "completed")
        self.assertIsNone(sagas.get(saga_id))
        self.assertFalse(Order.objects.filter(order_id="r-1").exists())
        self.assertFalse(Reservation.objects.filter(order_id="r-1").exists())

    def test_a_bad_order_is_refused_and_starts_nothing(self) -> None:
        # when
        response = self.client.post("/orders/", {"order_id": "x"}, content_type="application/json")

        # then
        self.assertEqual(response.status_code, 400)
        self.assertFalse(Order.objects.exists())


class ConcurrentRequestTests(LiveServerTestCase):
    """Many requests for the same order at once, through a real threaded HTTP server."""

    REQUESTS = 16

    def setUp(self) -> None:
        Product.objects.update_or_create(sku="MUG", defaults={"stock": 100})

    def test_16_concurrent_requests_for_one_order_start_one_saga(self) -> None:
        # given
        before = sagas.counts(definition="orders.place_order")
        body = json.dumps(order(order_id="burst-1")).encode()
        barrier = threading.Barrier(self.REQUESTS)
        answers: list[tuple[int, dict[str, Any]]] = []

        def post() -> None:
            request = urllib.request.Request(f"{self.live_server_url}/orders/", data=body,
                                             headers={"Content-Type": "application/json"})
            barrier.wait()
            with urllib.request.urlopen(request, timeout=30) as response:
                answers.append((response.status, json.loads(response.read())))

        # when
        threads = [threading.Thread(target=post) for _ in range(self.REQUESTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

        # then: every request was answered with the one saga, which ran once
        self.assertEqual(len(answers), self.REQUESTS)
        self.assertEqual({(status, a["saga_id"]) for status, a in answers}, {(202, "order-burst-1")})
        self.assertEqual(sum(a["created"] for _, a in answers), 1)
        self.assertEqual(settled("order-burst-1").state, "completed")
        after = sagas.counts(definition="orders.place_order")
        self.assertEqual({s: after[s] - before[s] for s in after if after[s] != before[s]},
                         {"completed": 1})
        self.assertEqual(Order.objects.filter(order_id="burst-1").count(), 1)
        self.assertEqual(Reservation.objects.filter(order_id="burst-1").count(), 1)
        self.assertEqual(Payment.objects.filter(order_id="burst-1").count(), 1)
        self.assertEqual(Product.objects.get(sku="MUG").stock, 98)

    def tearDown(self) -> None:
        connections.close_all()  # the server threads' connections, before the flush
