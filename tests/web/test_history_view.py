"""The saga page reads the history: an ambiguity and who resolved it stay visible after the
resolve, an approval's wait stays after a cancel, and the timeline is drawn from it."""

from __future__ import annotations

import re

from celery_sagas import SagaState
from celery_sagas.web._history_view import history_timeline
from tests.engine.conftest import CardDeclined
from tests.engine.test_step_failed import two_providers
from tests.web.conftest import Web, gated, in_review
from tests.web.test_actions import resolve_form


def text_of(web: Web, path: str) -> str:
    response = web.get(path)
    assert response.status_code == 200
    return response.get_data(as_text=True)


def test_a_resolved_ambiguity_stays_on_the_page_with_its_cause_and_the_operator(web: Web) -> None:
    # given: the charge's outcome unknown, then resolved and resumed by olive
    effect = in_review(web.shop)
    web.post("/actions/resolve", {**resolve_form(effect), "reason": "provider says it went through"})
    web.post("/actions/resume", {"saga_id": "o-1"})
    web.shop.driver.run_until_idle()
    assert web.shop.record("o-1").state is SagaState.COMPLETED

    # when
    text = text_of(web, "/saga?id=o-1")

    # then: the history keeps the ambiguity with its cause and the resolve with who and why
    history = text.split('id="history"', 1)[1]
    ambiguous = re.search(r'<tr class="event-ambiguous">.*?</tr>', history, re.S)
    assert ambiguous and "shop.charge" in ambiguous.group(0) and "step_error" in ambiguous.group(0)
    resolve = re.search(r'<tr class="event-resolve by-operator">.*?</tr>', history, re.S)
    assert resolve and "olive" in resolve.group(0) and "provider says it went through" in resolve.group(0)
    # and the timeline still draws the unknown outcome, ended by olive's resolve
    timeline = text.split('<svg class="timeline"', 1)[1].split("</svg>", 1)[0]
    assert 'class="mark ambiguous"' in timeline and 'class="bar unknown"' in timeline
    assert "resolved committed by olive" in timeline


def test_a_cancelled_approval_wait_keeps_its_length(web: Web) -> None:
    # given: a gate opened, seven minutes of waiting, then a cancel
    gated(web.shop)
    web.shop.clock.advance(7 * 60_000)
    web.post("/actions/cancel", {"saga_id": "g-1"})
    web.shop.driver.run_until_idle()
    record = web.sagas.get("g-1")
    assert record is not None and record.state is SagaState.COMPENSATED

    # when
    drawn = history_timeline(record, web.shop.clock.now_ms() + 60_000)

    # then: the approval bar runs from the request to the cancel
    [gate] = [b for b in drawn.bars if b.kind == "approval"]
    assert "ended, saga compensating" in gate.title
    assert gate.width > 20
    assert any(m.kind == "operator" and "cancel by olive" in m.title for m in drawn.marks)


def test_a_failure_run_caught_is_on_the_saga_page(web: Web) -> None:
    # given: charge-a declined, run caught StepFailed and charged card B
    definition = two_providers(web.shop)
    web.shop.script.then("charge", CardDeclined("no"))
    definition.start({"id": "o-1"}, saga_id="p-1")
    web.shop.driver.run_until_idle()

    # when
    history = text_of(web, "/saga?id=p-1").split('id="history"', 1)[1]

    # then: the history shows the failure and that run caught it
    caught = re.search(r'<tr class="event-caught">.*?</tr>', history, re.S)
    assert caught and "charge-a" in caught.group(0) and "card_declined" in caught.group(0)
