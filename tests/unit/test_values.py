"""The bounded traceback summary a failed step or run keeps (issue 26 item 4)."""

from __future__ import annotations

from celery_sagas import _values as values


def test_a_traceback_summary_keeps_the_innermost_frames_bounded_and_names_only() -> None:
    def dive(depth: int, secret: str) -> None:
        if depth == 0:
            raise ValueError(secret)
        dive(depth - 1, secret)

    try:
        dive(30, "card 4111-1111")
    except ValueError as exc:
        summary = values.traceback_text(exc)
    assert summary is not None
    lines = summary.splitlines()
    assert lines[0] == "... 24 earlier frames"
    assert len(lines) == 1 + values.MAX_TRACEBACK_FRAMES
    assert all(line.startswith("unit/test_values.py:") and line.endswith(" in dive")
               for line in lines[1:])
    assert "4111" not in summary and all(len(line) <= values.MAX_FRAME_TEXT for line in lines)


def test_an_exception_never_raised_has_no_traceback_summary() -> None:
    assert values.traceback_text(ValueError("built, not raised")) is None
