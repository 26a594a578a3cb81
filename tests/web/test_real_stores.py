"""The UI over the real Redis and PostgreSQL stores: exact counts, label scans, id prefixes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_sagas import SagaRecord, Sagas, SagaState, open_store
from celery_sagas._codec import Codec
from celery_sagas.web import create_app
from tests.e2e.conftest import wipe_store
from tests.web.conftest import CSRF_SECRET, USERS, basic

pytestmark = [pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture(params=["redis", "postgres"])
def sagas(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[Sagas]:
    """A Sagas over a fresh prefix of the real store, two definitions registered."""
    url = request.getfixturevalue(f"{request.param}_url")
    store = open_store(url, key_prefix=unique_prefix, table_prefix=unique_prefix + "_",
                       require_aof=False)  # the test Redis runs without AOF
    facade = Sagas(Celery(f"web-{uuid.uuid4().hex[:8]}", set_as_current=False), store=store)
    for name in ("place-order", "sync-user"):
        facade.saga(name)(lambda ctx, data: None)
    try:
        yield facade
    finally:
        wipe_store(store)
        store.close()


def seed(sagas: Sagas) -> None:
    """40 place-order sagas (30 completed, 10 in review) and 5 sync-user ones, completed now."""
    codec = Codec()
    now = sagas.engine.now()
    plan = [("place-order", SagaState.COMPLETED, "o", 30), ("place-order", SagaState.MANUAL_REVIEW, "r", 10),
            ("sync-user", SagaState.COMPLETED, "u", 5)]
    for definition, state, prefix, count in plan:
        for n in range(count):
            record = SagaRecord(f"{prefix}-{n:03d}", definition, state, {}, now - n, now - n)
            assert sagas.store.create(codec.saga_envelope(record))


def page(sagas: Sagas, path: str) -> str:
    app = create_app(sagas, users=USERS, secret=CSRF_SECRET)
    response = app.test_client().get(path, headers=basic("olive"))
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return response.get_data(as_text=True)


def ids(text: str) -> list[str]:
    return re.findall(r'class="id"><a href="[^"]*">([^<]*)</a>', text)


def test_the_overview_counts_from_the_real_indexes(sagas: Sagas) -> None:
    # given
    seed(sagas)

    # when
    text = page(sagas, "/")

    # then
    assert re.search(r'<span class="number">35</span>\s*<span>completed', text)
    assert re.search(r'<span class="number">10</span>\s*<span>manual-review', text)
    assert 'href="/sagas?definition=sync-user&amp;state=completed">5</a>' in text
    assert "completed (35)" in text


def test_the_list_filters_by_definition_in_the_store_and_by_id_prefix(sagas: Sagas) -> None:
    # given
    seed(sagas)

    # then
    users = page(sagas, "/sagas?definition=sync-user")
    assert sorted(ids(users)) == [f"u-{n:03d}" for n in range(5)] and "5 sagas match" in users
    reviews = page(sagas, "/sagas?id=r-00&state=manual-review&state=completed")
    assert sorted(ids(reviews)) == [f"r-{n:03d}" for n in range(10)]


def test_the_list_pages_through_the_real_scan(sagas: Sagas, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.setattr("celery_sagas.web._pages.PAGE_SIZE", 7)
    seed(sagas)
    seen: list[str] = []
    path: Any = "/sagas?state=completed"

    # when
    while path:
        text = page(sagas, path)
        seen += ids(text)
        found = re.search(r'<a class="next" href="([^"]*)"', text)
        path = found.group(1).replace("&amp;", "&") if found else None

    # then
    assert len(seen) == 35 == len(set(seen))


def test_a_prefix_with_a_rare_state_reaches_its_match_page_by_page(
        sagas: Sagas, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: 600 completed sagas, then one in review, all with the prefix "z-"
    monkeypatch.setattr("celery_sagas.web._pages.PAGE_SIZE", 10)
    codec, now = Codec(), sagas.engine.now()
    for n in range(601):
        state = SagaState.MANUAL_REVIEW if n == 600 else SagaState.COMPLETED
        record = SagaRecord(f"z-{n:04d}", "place-order", state, {}, now, now)
        assert sagas.store.create(codec.saga_envelope(record))
    path: Any = "/sagas?id=z-&state=manual-review"
    found: list[str] = []

    # when: next pages are followed (Redis reads the id index by id, then filters by state)
    for _ in range(10):
        text = page(sagas, path)
        found += ids(text)
        assert "none among" not in text
        link = re.search(r'<a class="next" href="([^"]*)"', text)
        if link is None:
            break
        assert found or 'id="none-yet"' in text
        path = link.group(1).replace("&amp;", "&")

    # then
    assert found == ["z-0600"]
