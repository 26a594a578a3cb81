"""Why, on every page: what raised, parent and children both ways, the result, signals and
timers with their deadlines; no attempt promised where none will come."""

from __future__ import annotations

from typing import Any

from markupsafe import escape

from celery_sagas import SagaState
from celery_sagas._cli_format import iso
from tests.web.conftest import Web, in_review


def text_of(web: Web, path: str) -> str:
    response = web.get(path)
    assert response.status_code == 200
    return response.get_data(as_text=True)


def test_a_step_that_raised_shows_the_exception_type_and_message(web: Web) -> None:
    # given
    in_review(web.shop)

    # when
    text = text_of(web, "/saga?id=o-1")

    # then
    assert '<code class="exc-type">ConnectionError</code>' in text
    assert "reset after the request left" in text


def test_a_failed_run_shows_what_run_raised(web: Web) -> None:
    # given
    @web.sagas.saga("web-broken")
    def broken(ctx: Any, data: Any) -> Any:
        raise KeyError("missing")

    broken.start({}, saga_id="b-1")
    web.shop.driver.run_until_idle()

    # then
    text = text_of(web, "/saga?id=b-1")
    assert 'id="run-exception"><code class="exc-type">KeyError</code>' in text
    assert escape("'missing'") in text


def test_a_step_and_a_run_that_raised_show_where_frame_by_frame(web: Web) -> None:
    # given: charge raised (in the test's Script); run() raised in ``web_crash``
    in_review(web.shop)

    @web.sagas.saga("web-crash")
    def web_crash(ctx: Any, data: Any) -> Any:
        raise KeyError("missing")

    web_crash.start({}, saga_id="b-2")

    # when
    step_page, run_page = text_of(web, "/saga?id=o-1"), text_of(web, "/saga?id=b-2")

    # then: the recorded summary, escaped, in a block of its own under what raised
    step_frames = web.sagas.get("o-1").steps[1].traceback
    run_frames = web.sagas.get("b-2").traceback
    assert step_frames and run_frames and run_frames.endswith(" in web_crash")
    assert f'<dd class="traceback"><pre>{escape(step_frames)}</pre></dd>' in step_page
    assert f'id="run-traceback"><pre>{escape(run_frames)}</pre></dd>' in run_page


def test_parent_and_child_link_to_each_other_and_waits_show_their_deadlines(web: Web) -> None:
    # given: a parent whose child saga waits for a signal
    sagas = web.sagas

    @sagas.saga("web-child")
    def child(ctx: Any, data: Any) -> Any:
        return ctx.wait_signal("go", timeout=60)

    @sagas.saga("web-parent")
    def parent(ctx: Any, data: Any) -> Any:
        ctx.sleep(0)
        return ctx.child(child, {})

    parent.start({}, saga_id="wp-1")
    web.shop.clock.advance(1000)
    sagas.sweep()
    web.shop.driver.run_until_idle()
    child_id = sagas.get("wp-1").steps[1].kwargs["saga_id"]  # type: ignore[union-attr]
    deadline = sagas.get(child_id).steps[0].wake_at_ms  # type: ignore[union-attr]

    # when
    parent_page = text_of(web, "/saga?id=wp-1")
    child_page = text_of(web, f"/saga?id={child_id}")

    # then
    assert f'id="children"><a href="/saga?id={escape(child_id)}"' in parent_page
    assert 'id="parent"><a href="/saga?id=wp-1">wp-1</a>' in child_page
    assert "signal</span> go" in child_page
    assert f'times out at <span class="time">{iso(deadline)}' in child_page
    assert "child</span>" in parent_page


def test_signals_and_the_result_show_on_the_saga_page(web: Web) -> None:
    # given
    @web.sagas.saga("web-signalled")
    def signalled(ctx: Any, data: Any) -> Any:
        return {"got": ctx.wait_signal("go")}

    signalled.start({}, saga_id="s-1")
    web.shop.driver.run_until_idle()
    web.sagas.signal("s-1", "go", payload={"n": 7}, signal_id="sig-7")
    web.shop.driver.run_until_idle()
    assert web.sagas.get("s-1").state is SagaState.COMPLETED  # type: ignore[union-attr]

    # when
    text = text_of(web, "/saga?id=s-1")

    # then
    assert '<table class="grid signals">' in text and "sig-7" in text
    result = text.split('id="saga-result">', 1)[1].split("</pre>")[0]
    assert "&#34;n&#34;: 7" in result and "&#34;got&#34;" in result
