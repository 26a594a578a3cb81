"""The Celery wiring of ``Sagas``: settings validation, the task options it enforces, beat.

Each test builds a fresh Celery app (not the current one) with a MemoryStore; nothing connects
to a broker.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._celery.messages import SWEEP_TASK
from celery_sagas._celery.settings import SagaSettings
from celery_sagas.errors import SagaConfigurationError

PICKLE = ["pickle", "PICKLE", "application/x-python-serialize"]


def fresh_app(**conf: Any) -> Celery:
    app = Celery("settings-test", set_as_current=False)
    app.conf.update(conf)
    return app


def make(app: Celery | None = None, **options: Any) -> Sagas:
    options.setdefault("allow_non_durable", True)
    return Sagas(app or fresh_app(), store=MemoryStore(), **options)


def reserve(sku: str) -> dict[str, str]:
    return {"sku": sku}


def release(sku: str, *, result: Any = None) -> None:
    return None


# ------------------------------------------------------------ pickle


@pytest.mark.parametrize("serializer", PICKLE)
def test_an_app_whose_task_serializer_is_pickle_is_refused(serializer: str) -> None:
    # given
    app = fresh_app(task_serializer=serializer)

    # when / then
    with pytest.raises(SagaConfigurationError, match="pickle"):
        make(app)


@pytest.mark.parametrize("serializer", PICKLE)
def test_an_app_whose_workers_accept_pickle_is_refused(serializer: str) -> None:
    # given: JSON to send, but workers that would unpickle whatever the broker holds
    app = fresh_app(task_serializer="json", accept_content=["json", serializer])

    # when / then
    with pytest.raises(SagaConfigurationError, match="accept_content"):
        make(app)


def test_a_json_only_app_is_accepted() -> None:
    # given
    app = fresh_app(task_serializer="json", accept_content=["json"])

    # when / then
    assert make(app).settings.queue is None


@pytest.mark.parametrize("decorator", ["step", "compensator"])
def test_a_saga_task_asking_for_pickle_is_refused(decorator: str) -> None:
    # given
    sagas = make()
    options: dict[str, Any] = {"compensate": None} if decorator == "step" else {}

    # when / then
    with pytest.raises(SagaConfigurationError, match="pickle"):
        getattr(sagas, decorator)(name="t.pickled", serializer="pickle", **options)(reserve)


# ------------------------------------------------------------ task options


def test_steps_and_compensators_ack_late_requeue_on_worker_loss_and_speak_json() -> None:
    # given: an app whose defaults are the opposite
    app = fresh_app(task_acks_late=False, task_reject_on_worker_lost=False)
    sagas = make(app)

    # when
    sagas.compensator(name="t.release")(release)
    sagas.step(compensate="t.release", name="t.reserve")(reserve)

    # then
    for name in ("t.reserve", "t.release"):
        task = app.tasks[name]
        assert (task.acks_late, task.reject_on_worker_lost, task.serializer) == (True, True, "json")
        assert task.ignore_result is True


@pytest.mark.parametrize("annotation", [
    {"acks_late": False}, {"reject_on_worker_lost": False}, {"serializer": "pickle"},
], ids=lambda a: next(iter(a)))
def test_task_annotations_that_weaken_a_saga_task_are_refused(annotation: dict[str, Any]) -> None:
    # given: annotations applied to every task when the app finalizes
    app = fresh_app(task_annotations={"*": annotation})
    sagas = make(app)
    sagas.step(compensate=None, name="t.reserve")(reserve)

    # when / then
    with pytest.raises(SagaConfigurationError, match=next(iter(annotation))):
        app.tasks["t.reserve"]


def test_task_annotations_that_keep_a_saga_task_safe_are_applied() -> None:
    # given
    app = fresh_app(task_annotations={"*": {"rate_limit": "10/s"}})
    sagas = make(app)
    sagas.step(compensate=None, name="t.reserve")(reserve)

    # when
    task = app.tasks["t.reserve"]

    # then
    assert (task.rate_limit, task.acks_late) == ("10/s", True)


def test_the_sweep_task_acks_late_and_speaks_json() -> None:
    # given
    app = fresh_app(task_acks_late=False)

    # when
    make(app)

    # then: the sweep is the one internal task (start sends the first step itself)
    internal = sorted(name for name in app.tasks if name.startswith("celery_sagas."))
    assert internal == [SWEEP_TASK]
    assert (app.tasks[SWEEP_TASK].acks_late, app.tasks[SWEEP_TASK].serializer) == (True, "json")


@pytest.mark.parametrize("option", ["acks_late", "reject_on_worker_lost", "autoretry_for",
                                    "max_retries", "retry_backoff"])
def test_celery_retry_and_ack_options_are_refused_on_saga_tasks(option: str) -> None:
    # given
    sagas = make()

    # when / then
    with pytest.raises(SagaConfigurationError, match=option):
        sagas.step(compensate=None, name="t.opt", **{option: False})(reserve)


def test_a_step_without_a_time_limit_gets_the_default_one() -> None:
    # given
    app = fresh_app()
    sagas = make(app, default_time_limit=42.0)

    # when
    sagas.step(compensate=None, name="t.default")(reserve)

    # then
    assert app.tasks["t.default"].time_limit == 42.0
    assert sagas.registry.step("t.default").time_limit_ms == 42_000


def test_a_step_time_limit_in_seconds_is_kept_in_milliseconds() -> None:
    # given
    app = fresh_app()
    sagas = make(app)

    # when
    sagas.step(compensate=None, name="t.limited", time_limit=2.5)(reserve)

    # then
    assert app.tasks["t.limited"].time_limit == 2.5
    assert sagas.registry.step("t.limited").time_limit_ms == 2_500


@pytest.mark.parametrize("decorator", ["step", "compensator"])
@pytest.mark.parametrize("limit", [None, "10", 0, -1, float("nan"), float("inf"), True])
def test_a_time_limit_that_is_not_a_positive_number_of_seconds_is_refused(
    decorator: str, limit: Any
) -> None:
    # given: a saga task needs a hard limit, or a silent attempt is never judged
    app = fresh_app()
    sagas = make(app)
    options: dict[str, Any] = {"compensate": None} if decorator == "step" else {}

    # when / then
    with pytest.raises(SagaConfigurationError, match="time_limit"):
        getattr(sagas, decorator)(name="t.bad-limit", time_limit=limit, **options)(reserve)
    assert "t.bad-limit" not in app.tasks


# ------------------------------------------------------------ beat


def test_the_sweep_is_scheduled_once_every_sweep_interval_on_the_saga_queue() -> None:
    # given
    app = fresh_app()

    # when: created twice on one app (a re-import), the entry is replaced, not doubled
    make(app, sweep_interval=7.0, queue="sagas")
    make(app, sweep_interval=9.0, queue="sagas")

    # then
    entries = [e for e in app.conf.beat_schedule.values() if e["task"] == SWEEP_TASK]
    assert len(entries) == 1
    assert entries[0]["schedule"] == 9.0
    assert entries[0]["options"] == {"queue": "sagas"}
    assert entries[0]["kwargs"] == {"shard": 0, "shards": 1}


def test_beat_sends_one_sweep_per_shard_every_interval() -> None:
    # given
    app = fresh_app()

    # when
    sagas = make(app, sweep_shards=3, sweep_interval=4.0)

    # then
    entries = [e for e in app.conf.beat_schedule.values() if e["task"] == SWEEP_TASK]
    assert sorted((e["kwargs"]["shard"], e["kwargs"]["shards"], e["schedule"]) for e in entries) == [
        (0, 3, 4.0), (1, 3, 4.0), (2, 3, 4.0)]
    assert sagas.settings.sweep_shards == 3


@pytest.mark.parametrize("shards", [0, 65, -1, 1.5, "2", True, None])
def test_sweep_shards_must_be_an_int_from_1_to_64(shards: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="sagas_sweep_shards"):
        make(sweep_shards=shards)


def test_sweep_shards_default_to_one_and_are_read_from_app_conf() -> None:
    assert make().settings.sweep_shards == 1
    assert make(fresh_app(sagas_sweep_shards=64)).settings.sweep_shards == 64


# ------------------------------------------------------------ settings


def test_app_conf_settings_are_read_and_keyword_arguments_win() -> None:
    # given
    app = fresh_app(sagas_sweep_interval=10.0, sagas_queue="from-conf", sagas_stale_after=60)

    # when
    sagas = make(app, queue="from-kwarg")

    # then
    assert sagas.settings.sweep_interval_s == 10.0
    assert sagas.settings.timing.stale_ms == 60_000
    assert sagas.settings.queue == "from-kwarg"


def test_an_unknown_keyword_is_refused_by_name() -> None:
    with pytest.raises(SagaConfigurationError, match="sweep_intervall"):
        make(sweep_intervall=3)


@pytest.mark.parametrize("value", [True, False, None])
def test_the_removed_journal_option_is_refused_saying_why(value: Any) -> None:
    with pytest.raises(SagaConfigurationError, match=r"sagas_journal was removed.*derived from the saga"):
        make(journal=value)


@pytest.mark.parametrize("name", ["sagas_journal", "sagas_metrics_count_cap"])
def test_a_removed_setting_in_the_app_config_is_refused_not_ignored(name: str) -> None:
    with pytest.raises(SagaConfigurationError, match=f"{name} was removed"):
        SagaSettings.load({name: True}, {})


def test_the_removed_metrics_count_cap_is_an_unknown_option() -> None:
    # the gauge counts exactly, from the store's indexes
    with pytest.raises(SagaConfigurationError, match="metrics_count_cap"):
        make(metrics_count_cap=10)


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None])
def test_allow_non_durable_must_be_a_bool(value: Any) -> None:
    # given: a string from the environment must not quietly allow a store that keeps nothing
    app = fresh_app(sagas_allow_non_durable=value)

    # when / then
    with pytest.raises(SagaConfigurationError, match="sagas_allow_non_durable"):
        Sagas(app, store=MemoryStore())


@pytest.mark.parametrize("value", [123, b"sagas", ["sagas"]])
def test_the_queue_must_be_a_name(value: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="sagas_queue"):
        make(queue=value)


@pytest.mark.parametrize("store", [123, {"url": "redis://"}, object()])
def test_a_store_that_is_neither_a_url_nor_a_store_is_refused_at_once(store: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="store"):
        Sagas(fresh_app(), store=store, allow_non_durable=True)


def test_a_missing_store_is_refused_at_once() -> None:
    with pytest.raises(SagaConfigurationError, match="sagas_store"):
        Sagas(fresh_app())


# ------------------------------------------------------------ retention and archive


def test_retention_defaults_to_seven_days_and_none_keeps_forever() -> None:
    # when / then
    assert make().settings.retention_ms == 7 * 24 * 3600 * 1000
    assert make(retention=None).settings.retention_ms is None
    assert make(retention=60).settings.retention_ms == 60_000
    assert make(fresh_app(sagas_retention=0.5)).settings.retention_ms == 500


@pytest.mark.parametrize("bad", [0, -1, True, "7d", float("nan"), float("inf"), 10**12])
def test_a_bad_retention_is_refused(bad: Any) -> None:
    with pytest.raises(SagaConfigurationError, match="sagas_retention"):
        make(retention=bad)


def test_archive_is_a_callable_or_a_dotted_path() -> None:
    # when / then
    assert make(archive=print).settings.archive is print
    assert make(fresh_app(sagas_archive="json:dumps")).settings.archive == "json:dumps"
    for bad in (5, "", object()):
        with pytest.raises(SagaConfigurationError, match="sagas_archive"):
            make(archive=bad)


def test_a_dotted_archive_path_is_imported_and_a_broken_one_raises_when_called() -> None:
    # given
    import json

    from celery_sagas._celery.wiring import resolve_archive

    # when / then
    assert resolve_archive("json:dumps") is json.dumps
    assert resolve_archive("json.dumps") is json.dumps
    for broken in ("no_such_module_x:f", "json:no_such_function", "json:__doc__"):
        archive = resolve_archive(broken)
        assert archive is not None
        with pytest.raises(SagaConfigurationError, match="sagas_archive"):
            archive(None)  # type: ignore[arg-type]
