"""Finding things: filters by error code and time, and an opt-in auto-refresh with no script."""

from __future__ import annotations

import re

from celery_sagas._cli_format import iso
from celery_sagas.web._source import SagaFilter, SagaSource
from tests.web.conftest import Web, in_review


def text_of(web: Web, path: str) -> str:
    response = web.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)[-400:]
    return response.get_data(as_text=True)


def test_the_list_filters_by_error_code(web: Web) -> None:
    # given: one saga in review (ambiguous_step), one completed
    in_review(web.shop, "o-1")
    web.shop.start_order("o-2", id="o-2")
    web.shop.driver.run_until_idle()
    code = web.shop.record("o-1").error_code

    # when
    text = text_of(web, f"/sagas?error={code}")

    # then
    assert 'href="/saga?id=o-1"' in text and 'href="/saga?id=o-2"' not in text


def test_the_list_filters_by_time_through_the_index(web: Web) -> None:
    # given: o-1 written, then later o-2
    web.shop.start_order("o-1", id="o-1")
    web.shop.driver.run_until_idle()
    between = web.shop.record("o-1").updated_at_ms + 1
    web.shop.clock.advance(60_000)
    web.shop.start_order("o-2", id="o-2")
    web.shop.driver.run_until_idle()

    # when
    text = text_of(web, f"/sagas?before={iso(between)[:-1]}")

    # then
    assert 'href="/saga?id=o-1"' in text and 'href="/saga?id=o-2"' not in text
    assert 'id="matching">1 saga match' in text
    assert web.get("/sagas?before=yesterday").status_code == 400


def test_auto_refresh_is_opt_in_and_needs_no_script(web: Web) -> None:
    # when
    plain = web.get("/attention")
    refreshing = web.get("/attention?refresh=30")

    # then
    assert 'http-equiv="refresh"' not in plain.get_data(as_text=True)
    assert 'href="/attention?refresh=30"' in plain.get_data(as_text=True)
    assert '<meta http-equiv="refresh" content="30">' in refreshing.get_data(as_text=True)
    assert "script-src" not in refreshing.headers["Content-Security-Policy"]
    assert 'content="5"' not in web.get("/?refresh=5").get_data(as_text=True)  # only 10, 30, 60


def _listed(text: str) -> list[str]:
    return re.findall(r'<td class="id"><a href="/saga\?id=([^"]+)">', text)


def test_the_list_sorts_by_last_write_across_states_both_ways_page_by_page(web: Web) -> None:
    # given: six sagas written a minute apart, one left in review, the others completed
    for n in range(6):
        if n == 2:
            in_review(web.shop, "o-2")
        else:
            web.shop.start_order(f"o-{n}", id=f"o-{n}")
            web.shop.driver.run_until_idle()
        web.shop.clock.advance(60_000)
    web.shop.clock.advance(60_000)
    order = sorted((web.shop.record(f"o-{n}") for n in range(6)), key=lambda r: r.updated_at_ms)
    by_write = [r.saga_id for r in order]

    # when
    newest = text_of(web, "/sagas?sort=newest")
    oldest = text_of(web, "/sagas?sort=oldest")
    index = text_of(web, "/sagas")

    # then: newest first across both states; the index order is state by state
    assert _listed(newest) == by_write[::-1] and _listed(oldest) == by_write
    assert _listed(index)[0] == "o-2" != by_write[0]
    assert '<option value="newest" selected>' in newest
    assert 'sort=oldest" title="sort by last write"' in newest  # the header turns it over
    assert web.get("/sagas?sort=sideways").status_code == 400


def test_a_sorted_list_pages_with_its_cursor_and_keeps_the_sort(web: Web) -> None:
    # given
    for n in range(5):
        web.shop.start_order(f"p-{n}", id=f"p-{n}")
        web.shop.driver.run_until_idle()
        web.shop.clock.advance(1_000)
    chosen = SagaFilter.of([], None, None, order="newest")

    # when: pages of two
    source = SagaSource(web.sagas, lambda action: None)
    seen: list[str] = []
    cursor = None
    while True:
        page = source.page(chosen, cursor, limit=2)
        seen += [r.saga_id for r in page.records]
        if (cursor := page.cursor) is None:
            break

    # then
    assert seen == [f"p-{n}" for n in range(4, -1, -1)]
    first = text_of(web, "/sagas?sort=newest")
    assert "sort=newest" in first.split('class="pager"')[1]


def test_the_list_sorts_by_creation_which_a_later_write_does_not_change(web: Web) -> None:
    # given: c-0, c-1, c-2 created a minute apart, in review; then c-0 resolved (written last)
    effects = []
    for n in range(3):
        effects.append(in_review(web.shop, f"c-{n}"))
        web.shop.clock.advance(60_000)
    web.sagas.resolve("c-0", "shop.charge", effects[0], "committed", result={"charge": "ch-1"},
                      actor="ops", reason="charged at the bank")

    # when
    by_creation = text_of(web, "/sagas?sort=newest-created")
    oldest_created = text_of(web, "/sagas?sort=oldest-created")
    by_write = text_of(web, "/sagas?sort=newest")

    # then: the created column, newest created first; by last write c-0 comes first
    assert _listed(by_creation) == ["c-2", "c-1", "c-0"]
    assert _listed(oldest_created) == ["c-0", "c-1", "c-2"]
    assert _listed(by_write) == ["c-0", "c-2", "c-1"]
    assert '<option value="newest-created" selected>' in by_creation
    assert 'sort=oldest-created" title="sort by creation">created ↓' in by_creation
    created = iso(web.shop.record("c-1").created_at_ms)
    assert f'<td class="time created">{created}</td>' in by_creation
