"""Needs attention means needs a human: manual review and truly stale sagas, not those waiting
by design (timers, signals, children, approvals), which are listed apart with what they wait
for; and approvals whose gate no longer waits leave the queue."""

from __future__ import annotations

import re
from typing import Any

from celery_sagas import SagaState
from tests.web.conftest import Web, gated, in_review


def text_of(web: Web, path: str) -> str:
    response = web.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)[-500:]
    return response.get_data(as_text=True)


def signal_waiters(web: Web, count: int) -> None:
    """``count`` sagas waiting for the signal ``go`` (an hour at most)."""

    @web.sagas.saga("web-waiter")
    def waiter(ctx: Any, data: Any) -> Any:
        return ctx.wait_signal("go", timeout=3600)

    for n in range(count):
        waiter.start({}, saga_id=f"wait-{n:03d}")
    web.shop.driver.run_until_idle()


def past_stale_after(web: Web) -> None:
    web.shop.clock.advance(web.sagas.settings.timing.stale_ms + 1000)


def test_need_an_operator_counts_review_and_truly_stale_not_sagas_waiting_by_design(web: Web) -> None:
    # given: one in review, one stuck (its step sent, never run), a gate, 30 signal waits
    in_review(web.shop, "o-review")
    signal_waiters(web, 30)
    gated(web.shop, "g-1")
    web.shop.start_order("o-stuck", id="o-stuck")  # its message is never delivered
    past_stale_after(web)

    # when
    overview = text_of(web, "/")

    # then
    assert re.search(r'id="attention-waiting">2<', overview)
    assert re.search(r'id="waiting-by-design">31<', overview)


def test_the_queue_lists_only_what_needs_a_human_and_the_waits_apart(web: Web) -> None:
    # given
    in_review(web.shop, "o-review")
    signal_waiters(web, 3)
    gated(web.shop, "g-1")
    web.shop.start_order("o-stuck", id="o-stuck")
    past_stale_after(web)

    # when
    text = text_of(web, "/attention")
    queue, waiting = text.split('id="waiting"', 1)

    # then: one compact row each in the queue; the waits with what and until when
    assert queue.count('<tr class="finding') == 2
    assert "o-review" in queue and "o-stuck" in queue and "wait-000" not in queue
    assert "g-1" not in queue.split("Approvals waiting")[0]
    assert waiting.count('<tr class="waiting-row">') == 4
    assert "wait-002" in waiting and "signal</span> go" in waiting
    assert "approval</span>" in waiting and "a decision" in waiting
    until = web.sagas.get("wait-000").steps[0].wake_at_ms  # type: ignore[union-attr]
    from celery_sagas._cli_format import iso

    assert iso(until) in waiting


def test_the_queue_is_oldest_first_and_filters_by_kind(web: Web) -> None:
    # given: a review of an unknown charge, then (later) a saga whose step was never run
    in_review(web.shop, "o-review")
    web.shop.clock.advance(5000)
    web.shop.start_order("o-stuck", id="o-stuck")
    past_stale_after(web)

    # when
    everything = text_of(web, "/attention")
    ambiguous = text_of(web, "/attention?kind=ambiguous-execution")
    stale = text_of(web, "/attention?kind=stale")

    # then
    assert everything.index("o-review") < everything.index("o-stuck")
    assert ambiguous.count('<tr class="finding') == 2
    assert stale.count('<tr class="finding') == 0 and "No stale finding." in stale
    assert web.get("/attention?kind=nonsense").status_code == 400


def test_an_overdue_timer_is_stale_not_waiting(web: Web) -> None:
    # given: a saga whose timer fell due long ago and was never woken (no sweep ran)
    @web.sagas.saga("web-sleeper")
    def sleeper(ctx: Any, data: Any) -> Any:
        ctx.sleep(1)

    sleeper.start({}, saga_id="sleepy-1")
    web.shop.driver.run_until_idle()
    past_stale_after(web)
    past_stale_after(web)

    # then
    assert re.search(r'id="attention-waiting">1<', text_of(web, "/"))


def test_the_approval_of_a_cancelled_saga_leaves_the_pending_queue(web: Web) -> None:
    # given
    gated(web.shop, "g-1")
    [pending] = web.sagas.approvals.pending("g-1")
    before = text_of(web, "/")

    # when
    web.post("/actions/cancel", {"saga_id": "g-1"})
    web.shop.driver.run_until_idle()

    # then
    assert web.sagas.get("g-1").state is SagaState.COMPENSATED  # type: ignore[union-attr]
    assert re.search(r'id="approvals-waiting">1<', before)
    assert re.search(r'id="approvals-waiting">0<', text_of(web, "/"))
    assert pending.approval_id not in text_of(web, "/attention")
