"""``configure`` and ``start_on_commit`` (docs/django.md): options from Django settings, and a
saga that exists only once the transaction that asked for it committed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state
from django.db import connection, transaction
from django.test import override_settings

from celery_sagas import Saga, Sagas
from celery_sagas.contrib.django import configure, start_on_commit
from celery_sagas.errors import SagaConfigurationError, SagaValidationError


class Rollback(Exception):
    """Raised to leave an atomic block by rolling it back."""


@pytest.fixture
def sagas(migrated: None) -> Sagas:
    """Sagas over the memory store with a one-step saga (the transactions are Django's)."""
    app = Celery("django-unit", broker="memory://localhost/")
    sagas = Sagas(app, store="memory://", allow_non_durable=True)

    @sagas.step(compensate=None, name="unit.noop")
    def noop(order_id: str) -> None:
        return None

    @sagas.saga("order")
    def order(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(noop, data["order_id"])

    return sagas


def test_nothing_is_recorded_before_the_commit_and_the_saga_starts_at_commit(sagas: Sagas) -> None:
    # when
    with transaction.atomic():
        saga_id = start_on_commit("order", {"order_id": "o-1"}, saga_id="o-1", sagas=sagas)
        recorded_inside = sagas.get(saga_id)

    # then
    assert saga_id == "o-1" and recorded_inside is None
    started = sagas.get("o-1")
    assert started is not None and started.state == "running" and started.input == {"order_id": "o-1"}


def test_a_definition_name_is_looked_up_on_the_current_celery_app_as_the_docs_show(
    sagas: Sagas,
) -> None:
    # given: the project's Celery app is the current one (its celery.py created it), and the
    # view passes only a definition name (issue 25 item 6: a weak reference to Celery's proxy)
    sagas.app.set_current()

    # when
    with transaction.atomic():
        saga_id = start_on_commit("order", {"order_id": "o-6"}, saga_id="o-6")

    # then
    started = sagas.get(saga_id)
    assert started is not None and started.input == {"order_id": "o-6"}


def test_a_request_thread_of_a_threaded_server_finds_the_project_s_sagas(sagas: Sagas) -> None:
    # given: the project's app is the default one, as Celery's Django fixup makes the app
    # docs/django.md's celery.py creates (DJANGO_SETTINGS_MODULE set first). A threaded server
    # (runserver, gunicorn --threads) runs each request in a thread of its own, whose current
    # app is that default: Celery's current app is per thread.
    previous = celery_state.default_app
    sagas.app.set_default()
    started: list[str] = []

    def request() -> None:
        try:
            with transaction.atomic():
                started.append(start_on_commit("order", {"order_id": "o-7"}, saga_id="o-7"))
        finally:
            connection.close()

    # when
    try:
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(timeout=30)
    finally:
        celery_state.set_default_app(previous)

    # then
    assert started == ["o-7"]
    record = sagas.get("o-7")
    assert record is not None and record.input == {"order_id": "o-7"}


def test_a_rolled_back_transaction_starts_nothing(sagas: Sagas) -> None:
    # when
    with pytest.raises(Rollback), transaction.atomic():
        start_on_commit("order", {"order_id": "o-2"}, saga_id="o-2", sagas=sagas)
        raise Rollback

    # then
    assert sagas.get("o-2") is None
    assert sagas.counts()["running"] == 0


def test_a_definition_object_its_input_as_given_and_a_new_id_when_none_is_given(sagas: Sagas) -> None:
    # given
    data = {"order_id": "o-3"}

    # when
    with transaction.atomic():
        saga_id = start_on_commit(Saga(sagas, sagas.registry.definition("order")), data)
        data["order_id"] = "changed later"

    # then
    started = sagas.get(saga_id)
    assert len(saga_id) == 36 and started is not None and started.input == {"order_id": "o-3"}


def test_bad_input_is_refused_at_once_and_nothing_is_scheduled(sagas: Sagas) -> None:
    # when / then
    with transaction.atomic():
        with pytest.raises(SagaValidationError):
            start_on_commit("order", {"order_id": float("nan")}, saga_id="o-4", sagas=sagas)
        with pytest.raises(SagaValidationError):
            start_on_commit("order", {}, saga_id="has space", sagas=sagas)
        with pytest.raises(SagaValidationError):  # an empty form field, not "a random id"
            start_on_commit("order", {}, saga_id="", sagas=sagas)
        with pytest.raises(SagaConfigurationError):
            start_on_commit("no-such-saga", {}, saga_id="o-5", sagas=sagas)
    assert sagas.get("o-4") is None and sagas.get("o-5") is None


def test_outside_a_transaction_it_starts_at_once(sagas: Sagas) -> None:
    # when
    saga_id = start_on_commit("order", {"order_id": "o-6"}, saga_id="o-6", sagas=sagas)

    # then
    assert sagas.get(saga_id) is not None


def test_configure_reads_the_sagas_setting_and_defaults_to_the_django_database() -> None:
    # given
    app = Celery("django-configure", broker="memory://localhost/")

    # when
    with override_settings(SAGAS={"sweep_interval": 7, "table_prefix": "x_"}):
        sagas = configure(app, stale_after=9)

    # then
    assert sagas.settings.sweep_interval_s == 7.0
    assert sagas.settings.timing.stale_ms == 9000
    assert sagas._store_arg == "django://default"


def test_configure_leaves_celery_namespaced_settings_to_sagas() -> None:
    # given: CELERY_SAGAS_* settings, as config_from_object(namespace="CELERY") hands them over
    app = Celery("django-namespace", broker="memory://localhost/")
    app.conf.update(sagas_store="memory://", sagas_allow_non_durable=True, sagas_sweep_interval=3)

    # when
    with override_settings(SAGAS=None):
        sagas = configure(app)

    # then
    assert sagas._store_arg == "memory://" and sagas.settings.sweep_interval_s == 3.0


def test_a_sagas_setting_that_is_not_a_dict_is_refused() -> None:
    with override_settings(SAGAS=["store"]), pytest.raises(SagaConfigurationError, match="dict"):
        configure(Celery("django-bad", broker="memory://localhost/"))
