"""Finding things: filters by error code and time, and an opt-in auto-refresh with no script."""

from __future__ import annotations

from celery_sagas._cli_format import iso
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
