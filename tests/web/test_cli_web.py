"""`celery -A proj sagas web`: serves create_app(sagas) on the host and port asked for."""

from __future__ import annotations

from typing import Any

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from flask import Flask

from celery_sagas.cli import EXIT_USAGE, sagas
from tests.engine.conftest import Shop


def run_web(shop: Shop, *args: str) -> Result:
    obj = CLIContext(app=shop.sagas.app, no_color=True, workdir=None)
    return CliRunner().invoke(sagas, ["web", *args], obj=obj)


def test_web_serves_the_app_on_the_host_and_port(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    served: list[tuple[Any, ...]] = []
    monkeypatch.setenv("CELERY_SAGAS_WEB_USERS", "olive:pw:operator")
    monkeypatch.setattr("celery_sagas.web.serve", lambda app, host, port: served.append((app, host, port)))

    # when
    default = run_web(shop)
    chosen = run_web(shop, "--host", "0.0.0.0", "--port", "9000")

    # then
    assert default.exit_code == 0 and chosen.exit_code == 0, default.output + chosen.output
    assert [(h, p) for _, h, p in served] == [("127.0.0.1", 8025), ("0.0.0.0", 9000)]
    assert isinstance(served[0][0], Flask)


def test_web_without_users_is_a_usage_error(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.delenv("CELERY_SAGAS_WEB_USERS", raising=False)
    monkeypatch.delenv("CELERY_SAGAS_WEB_USERS_FILE", raising=False)

    # when
    result = run_web(shop)

    # then
    assert result.exit_code == EXIT_USAGE
    assert "the web UI needs users" in result.output


def test_web_without_flask_says_which_extra_to_install(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flask" else real(name, *a))

    # when
    result = run_web(shop)

    # then
    assert result.exit_code == EXIT_USAGE
    assert "pip install 'celery-sagas[web]'" in result.output


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_web_refuses_a_bad_port(shop: Shop, port: str) -> None:
    # then
    assert run_web(shop, "--port", port).exit_code == EXIT_USAGE
