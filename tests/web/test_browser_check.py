"""Without Chromium the browser tests skip on a laptop and fail in CI (never pass unseen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.web import browser


@pytest.mark.parametrize(("required", "outcome"), [(True, pytest.fail.Exception),
                                                   (False, pytest.skip.Exception)])
def test_a_missing_browser_fails_when_services_are_required(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, required: bool,
        outcome: type[BaseException]) -> None:
    # given
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(browser, "REQUIRE", required)

    # then
    with pytest.raises(outcome, match="apt-get install chromium chromium-driver"):
        browser.need_browser()
