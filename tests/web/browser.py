"""Headless Chromium through Selenium, and the UI served on a free loopback port.

Uses Debian's ``chromium`` and ``chromedriver`` (``.ci/run`` installs them when missing); naming
the driver keeps Selenium Manager from looking for one on the network. A missing browser skips
on a laptop and fails when ``CELERY_SAGAS_REQUIRE_SERVICES=1``. Every wait polls with a
deadline (``tests.e2e.conftest.wait_until``); nothing sleeps to synchronise.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import make_server

from tests.conftest import REQUIRE

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
# Screenshots go to a scratch folder, so a test run leaves the working tree alone; to refresh the
# ones docs/operations.md shows: CELERY_SAGAS_WEB_SCREENSHOTS=docs/images pytest tests/web
SCREENSHOTS = Path(os.environ.get("CELERY_SAGAS_WEB_SCREENSHOTS",
                                  Path(tempfile.gettempdir()) / "celery-sagas-screenshots"))
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--disable-extensions", "--window-size=1280,900")


def need_browser() -> None:
    """Skip (laptop) or fail (CI) without chromium, chromedriver and selenium."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if not missing:
        return
    message = f"browser tests need {', '.join(missing)} (apt-get install chromium chromium-driver)"
    if REQUIRE:
        pytest.fail(f"{message} (CELERY_SAGAS_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(message)


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (its own profile directory), quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


@contextmanager
def serving(app: Flask) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    from celery_sagas.web._serve import Handler  # what `celery sagas web` serves with

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Handler)
    thread = threading.Thread(target=server.serve_forever, name="web-ui", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def screenshot(driver: Any, name: str) -> Path:
    """A full-page PNG of what the browser shows, as docs/images/web-NAME.png."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(600, min(int(height) + 20, 2600)))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"web-{name}.png"
    assert driver.save_screenshot(str(path)), path
    driver.set_window_size(1280, 900)
    return path
