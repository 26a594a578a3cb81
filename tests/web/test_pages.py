"""What each page shows, and that ids, reasons and payloads are escaped everywhere."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from typing import Any

import pytest
from cryptography.fernet import Fernet
from markupsafe import escape

from celery_sagas import ENCRYPTED, SagaRecord, SagaState, StepNotCommitted
from celery_sagas._codec import Codec
from tests.web.conftest import Web, gated, in_review

SCRIPT_ID = "<script>alert(1)</script>"


def text_of(web: Web, path: str, user: str = "olive") -> str:
    """The page's HTML (it must be a 200)."""
    response = web.get(path, user=user)
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    return response.get_data(as_text=True)


def finish(web: Web, count: int, *, declined: int = 0) -> None:
    """``count`` completed orders and ``declined`` compensated ones."""
    for n in range(count):
        web.shop.start_order(f"done-{n}", id=f"done-{n}")
    for n in range(declined):
        web.shop.script.then("ship", StepNotCommitted("out_of_stock"))
        web.shop.start_order(f"undone-{n}", id=f"undone-{n}")
        web.shop.driver.run_until_idle()
    web.shop.driver.run_until_idle()


def card(text: str, label: str) -> str:
    """The number on the overview card labelled ``label``."""
    found = re.search(r'<span class="number"[^>]*>([^<]*)</span>\s*<span>' + re.escape(label), text)
    assert found is not None, label
    return found.group(1).strip()


# ---------------------------------------------------------------- overview


def test_the_overview_counts_by_state_and_definition_and_charts_finishes(web: Web) -> None:
    # given
    in_review(web.shop)
    gated(web.shop)
    finish(web, 3, declined=1)

    # when
    text = text_of(web, "/")

    # then
    assert (card(text, "manual-review"), card(text, "running"), card(text, "completed"),
            card(text, "compensated"), card(text, "compensating")) == ("1", "1", "3", "1", "0")
    assert card(text, "need an operator") == "1"  # the review (the gate is not stale yet)
    assert card(text, "approvals waiting") == "1"
    assert re.search(r'<a href="/sagas\?definition=place-order">place-order</a>', text)
    assert 'href="/sagas?definition=gated-order&amp;state=running">1</a>' in text
    assert '<svg class="chart"' in text and "completed (3)" in text and "compensated (1)" in text
    assert "6 sagas kept" in text


def test_the_overview_counts_thousands_without_reading_them(web: Web) -> None:
    # given: 1,500 completed sagas written straight to the store
    codec = Codec()
    now = web.sagas.engine.now()
    for n in range(1500):
        record = SagaRecord(f"bulk-{n:05d}", "place-order", SagaState.COMPLETED, {}, now, now)
        web.sagas.store.create(codec.saga_envelope(record))

    # when
    text = text_of(web, "/")

    # then
    assert card(text, "completed") == "1,500"
    assert "completed (1,500)" in text


# ---------------------------------------------------------------- sagas list


def test_the_sagas_list_filters_by_state_definition_and_id_prefix(web: Web) -> None:
    # given
    in_review(web.shop)
    gated(web.shop)
    finish(web, 3)

    # then
    everything = text_of(web, "/sagas")
    assert all(f">{saga_id}</a>" in everything for saga_id in ("o-1", "g-1", "done-0", "done-2"))
    review = text_of(web, "/sagas?state=manual-review")
    assert ">o-1</a>" in review and ">done-0</a>" not in review
    gates = text_of(web, "/sagas?definition=gated-order")
    assert ">g-1</a>" in gates and ">o-1</a>" not in gates
    prefixed = text_of(web, "/sagas?id=done-&state=completed&state=running")
    assert prefixed.count('class="id"><a') == 3 and ">g-1</a>" not in prefixed
    assert "has exactly this id" not in prefixed
    exact = text_of(web, "/sagas?id=done-1")
    assert "has exactly this id" in exact


def test_the_sagas_list_pages_with_a_cursor(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.setattr("celery_sagas.web._pages.PAGE_SIZE", 2)
    finish(web, 5)
    seen: list[str] = []
    path: str | None = "/sagas?state=completed"

    # when
    while path is not None:
        text = text_of(web, path)
        seen += re.findall(r'class="id"><a href="[^"]*">([^<]*)</a>', text)
        found = re.search(r'<a class="next" href="([^"]*)"', text)
        path = html.unescape(found.group(1)) if found else None

    # then
    assert sorted(seen) == [f"done-{n}" for n in range(5)]


@pytest.mark.parametrize("query", ["cursor=garbage", "state=finished", "id=a%20b", "definition=a%20b"])
def test_bad_filters_and_cursors_are_a_400_not_a_crash(web: Web, query: str) -> None:
    # then
    response = web.get(f"/sagas?{query}")
    assert response.status_code == 400
    assert "Not valid" in response.get_data(as_text=True)


def test_a_cursor_of_another_filter_is_refused(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.setattr("celery_sagas.web._pages.PAGE_SIZE", 1)
    finish(web, 2)
    text = text_of(web, "/sagas?state=completed")
    cursor = re.search(r"cursor=([^\"&]*)", text)
    assert cursor is not None

    # then
    response = web.get(f"/sagas?state=running&cursor={cursor.group(1)}")
    assert response.status_code == 400
    assert "another filter" in response.get_data(as_text=True)


# ---------------------------------------------------------------- one saga


def test_the_saga_page_shows_steps_ids_codes_payloads_timeline_and_events(web: Web) -> None:
    # given
    effect = in_review(web.shop)
    record = web.shop.record("o-1")

    # when
    text = text_of(web, "/saga?id=o-1")

    # then
    assert 'id="saga-state">manual-review</span>' in text and "ambiguous_step" in text
    assert str(escape(record.reason)) in text
    for step in record.steps:
        assert step.effect_id in text and step.compensation_effect_id in text
    assert '<svg class="timeline"' in text and 'class="mark ambiguous"' in text
    assert "&#34;reservation&#34;: &#34;r-sku-1&#34;" in text  # reserve's result
    assert "&#34;card&#34;: &#34;card-1&#34;" in text  # the input
    assert f'name="effect_id" value="{effect}"' in text
    assert '<span class="pill ambiguous">ambiguous</span>' in text  # in the history
    assert text.count("2023-") >= 4 and "Z" in text  # ISO UTC times


def test_the_saga_page_shows_each_effect_as_its_mark_says(web: Web) -> None:
    # given: reserve committed, charge's outcome unknown, ship never recorded
    effect = in_review(web.shop)
    charge = web.shop.step("shop.charge", "o-1")
    assert charge.execution is not None

    # when
    text = text_of(web, "/saga?id=o-1")

    # then
    row = re.search(r'<tr class="effect-unknown"><td>execution</td><td class="id">([^<]*)</td>', text)
    assert row is not None and row.group(1) == effect
    assert text.count('<tr class="effect-committed"><td>execution</td>') == 1  # reserve
    assert '<tr class="effect-none"><td>compensation</td>' in text  # nothing undone yet


def test_the_saga_page_of_a_gated_saga_shows_its_approval_but_never_a_token(web: Web) -> None:
    # given
    gated(web.shop)
    [pending] = web.sagas.approvals.pending("g-1")

    # when
    text = text_of(web, "/saga?id=g-1")

    # then
    assert pending.approval_id in text and "orders.approve" in text
    assert 'class="bar approval"' in text
    assert pending.token not in text
    assert 'value="approve"' in text and 'value="deny"' in text
    assert 'value="cancel"' in text and 'value="resume"' not in text  # running: resume is a no-op
    gate = web.sagas.get("g-1").steps[-1]  # type: ignore[union-attr]
    assert gate.effect_id not in text  # a gate has no effect, only its approval


def test_a_compensated_saga_draws_its_compensations_and_failure(web: Web) -> None:
    # given
    finish(web, 0, declined=1)

    # when
    text = text_of(web, "/saga?id=undone-0")

    # then
    assert text.count('class="bar undo"') == 2
    assert 'class="mark failed"' in text and "out_of_stock" in text
    assert 'method="post"' not in text  # nothing to do on a final saga


def test_an_unknown_saga_is_a_404_that_escapes_the_id(web: Web) -> None:
    # when
    response = web.get("/saga?id=" + SCRIPT_ID)

    # then
    assert response.status_code == 404
    body = response.get_data(as_text=True)
    assert SCRIPT_ID not in body and str(escape(SCRIPT_ID)) in body


def test_payloads_that_could_not_be_decrypted_show_as_encrypted(web: Web) -> None:
    # given: a completed order whose payloads were sealed with a key this process lacks
    finish(web, 1)
    done = web.sagas.get("done-0")
    assert done is not None
    sealing = Codec(encryption_keys=[Fernet.generate_key()])
    web.sagas.store.create(sealing.saga_envelope(replace(done, saga_id="sealed-1")))

    # when
    page = text_of(web, "/saga?id=sealed-1")
    listed = text_of(web, "/sagas?id=sealed-")

    # then: the timeline is there; each payload reads <encrypted>
    assert "completed" in page and "shop.charge" in page
    assert "&lt;encrypted&gt;" in page or "&#34;&lt;encrypted&gt;&#34;" in page
    assert "sku-1" not in page
    assert "sealed-1" in listed and "corrupt" not in listed
    source: Any = web.app.extensions["celery_sagas.web"].source
    assert '"card": "<encrypted>"' in source.payload({"card": ENCRYPTED, "n": [1, ENCRYPTED]})


# ---------------------------------------------------------------- needs attention


def test_the_attention_page_lists_findings_with_what_to_do_and_approvals(web: Web) -> None:
    # given
    effect = in_review(web.shop)
    gated(web.shop)

    # when
    text = text_of(web, "/attention")

    # then
    assert "ambiguous-execution" in text and f"idempotency key {effect}" in text
    assert f'name="effect_id" value="{effect}"' in text
    assert 'value="resume"' not in text  # refused while the charge is unresolved
    [pending] = web.sagas.approvals.pending("g-1")
    assert pending.approval_id in text and pending.token not in text
    assert text.count('value="approve"') == 1


def test_the_attention_page_says_when_nothing_needs_an_operator(web: Web) -> None:
    # then
    text = text_of(web, "/attention")
    assert "No findings: nothing needs an operator." in text


# ---------------------------------------------------------------- escaping


def test_a_saga_id_holding_a_script_renders_as_text_everywhere(web: Web) -> None:
    # given
    in_review(web.shop, SCRIPT_ID)
    escaped = str(escape(SCRIPT_ID))

    # then
    paths = ("/", "/sagas", "/sagas?id=%3Cscript", "/attention", "/saga?id=%3Cscript%3Ealert(1)%3C/script%3E")
    for path in paths:
        text = text_of(web, path)
        assert "<script" not in text, path
        if path != "/":
            assert escaped in text, path
    saga_page = text_of(web, "/saga?id=%3Cscript%3Ealert(1)%3C/script%3E")
    assert f'<span class="id" id="saga-id">{escaped}</span>' in saga_page
    assert f'name="saga_id" value="{escaped}"' in saga_page
