"""Store URLs: checked at ``Sagas(...)``, cluster URLs parsed, passwords never shown."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker import control
from redis.exceptions import RedisClusterException

from celery_sagas import Sagas, open_store
from celery_sagas.errors import SagaConfigurationError, StoreError, StoreUnavailable
from celery_sagas.stores._urls import HiddenUrl, redact, redact_text, split_cluster, url_problem

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-s3cret"


def _app(**conf: Any) -> Celery:
    app = Celery("urls-test", set_as_current=False, broker="memory://")
    app.conf.update(task_serializer="json", accept_content=["json"], **conf)
    return app


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:6379/9x", "database must be a number"),
        ("redis://127.0.0.1:6379/0?db=x", "db= must be a number"),
        ("redis:/x", "lacks '//'"),
        ("mongodb://x", "no store for scheme 'mongodb'"),
        ("postgres://u:p@h/db", "did you mean postgresql+psycopg://"),
        ("redis://127.0.0.1:6379/0?cluster=true", "redis+cluster://"),
        ("redis://127.0.0.1:6379/0?colour=blue", "unknown option 'colour'"),
        ("redis://127.0.0.1:port/0", "port must be a number"),
        ("redis+cluster://127.0.0.1:7101,127.0.0.1/", "host:port"),
        ("redis+cluster://127.0.0.1:7101/3", "only database 0"),
        ("redis+cluster://127.0.0.1:7101/?require_full_coverage=maybe", "true or false"),
        ("redis://127.0.0.1:6379/0?require_aof=maybe", "require_aof= must be true or false"),
        ("rediscluster://127.0.0.1:7101", "did you mean redis+cluster://"),
        ("just-a-word", "scheme://"),
    ],
)
def test_a_malformed_store_url_is_refused_at_sagas_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(SagaConfigurationError, match=says.replace("+", r"\+").replace("?", r"\?")):
        Sagas(_app(), store=url)
    with pytest.raises(StoreUnavailable):
        open_store(url)


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "redis://127.0.0.1:6379/3",
        "redis://:pw@127.0.0.1:6379/0?socket_timeout=2&buckets=32",
        "rediss://127.0.0.1:6380/0?ssl_cert_reqs=none",
        "unix:///tmp/redis.sock?db=2",
        "redis+cluster://127.0.0.1:7101,127.0.0.1:7102/",
        "rediss+cluster://u:pw@10.0.0.1:7000/?require_full_coverage=false&ssl_cert_reqs=none",
        "redis://127.0.0.1:6379/1?require_aof=false",
        "redis+cluster://127.0.0.1:7101/?require_aof=no&buckets=8",
        "sqlite:///tmp/sagas.db",
        "postgresql+psycopg://postgres@127.0.0.1:5432/db",
        "mysql+pymysql://root@127.0.0.1:3306/db",
    ],
)
def test_well_formed_store_urls_pass(url: str) -> None:
    assert url_problem(url) is None


def test_a_scheme_of_an_installed_plugin_passes() -> None:
    assert url_problem("mystore://anything", frozenset({"mystore"})) is None
    assert url_problem("mystore://anything") is not None


def test_a_cluster_url_names_every_node_and_keeps_client_options_apart() -> None:
    parsed = split_cluster(
        "rediss+cluster://u:pw@a:7000,b:7001,[::1]:7002/?require_full_coverage=no"
        "&reinitialize_steps=3&socket_timeout=2&buckets=8&require_aof=false"
    )
    assert parsed.nodes == (("a", 7000), ("b", 7001), ("::1", 7002))
    assert parsed.options == {"require_full_coverage": False, "reinitialize_steps": 3}
    assert parsed.node_url == "rediss://u:pw@a:7000/?socket_timeout=2"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://user:{SECRET}@h:6379/0", "redis://user:***@h:6379/0"),
        (f"redis://h/0?password={SECRET}&db=1", "redis://h/0?password=***&db=1"),
        (f"rediss://h/0?ssl_password={SECRET}", "rediss://h/0?ssl_password=***"),
        (f"redis+cluster://:{SECRET}@a:1,b:2/", "redis+cluster://:***@a:1,b:2/"),
        (f"postgresql+psycopg://u:{SECRET}@h/db?sslkey=/k", "postgresql+psycopg://u:***@h/db?sslkey=***"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redact_hides_passwords_in_user_info_and_query(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_free_text_loses_every_password_it_quotes() -> None:
    text = (f"Error connecting to redis://u:{SECRET}@h:6379/0 (password={SECRET}); "
            f"AUTH failed for rediss+cluster://:{SECRET}@a:1,b:2/ and ssl_password={SECRET}")
    shown = redact_text(text)
    assert SECRET not in shown
    assert "redis://u:***@h:6379/0" in shown and "rediss+cluster://:***@a:1,b:2/" in shown


def test_a_redis_error_message_never_carries_the_password() -> None:
    url = f"redis+cluster://:{SECRET}@127.0.0.1:1/"  # nothing listens on port 1
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert SECRET not in str(caught.value)


def test_a_cluster_client_error_becomes_store_error() -> None:
    """RedisClusterException is not a RedisError: it must not escape raw."""
    with pytest.raises(StoreError) as caught:
        open_store("redis+cluster://127.0.0.1:1/")
    assert isinstance(caught.value.__cause__, RedisClusterException)


def test_settings_repr_and_app_conf_hide_the_store_password() -> None:
    url = f"redis://user:{SECRET}@127.0.0.1:6379/1?password={SECRET}"
    app = _app(sagas_store=url)
    sagas = Sagas(app)
    assert sagas.settings.store == url  # the real URL is what the store opens
    assert SECRET not in repr(sagas.settings)
    shown = app.conf["sagas_store"]
    assert SECRET not in str(shown) and SECRET not in repr(shown)
    assert SECRET not in json.dumps(shown)
    # inspect conf: exactly what a worker answers on the broker
    answer = control.conf(SimpleNamespace(app=app))
    assert SECRET not in json.dumps(answer)
    assert "user:***@127.0.0.1" in json.dumps(answer)
    # reading the configuration again (a second Sagas, a copy) still opens the real URL
    assert Sagas(app).settings.store == url
    assert pickle.loads(pickle.dumps(shown)).__dict__["_url"] == url
    assert copy.deepcopy(shown).__dict__["_url"] == url


def test_a_url_without_secrets_stays_a_plain_str() -> None:
    app = _app(sagas_store="redis://127.0.0.1:6379/1")
    Sagas(app)
    assert type(app.conf["sagas_store"]) is str


def test_hidden_url_is_the_redacted_text() -> None:
    assert HiddenUrl(f"redis://:{SECRET}@h/0") == "redis://:***@h/0"


def test_celery_report_never_prints_the_store_password(tmp_path: Path) -> None:
    module = tmp_path / "report_app.py"
    module.write_text(textwrap.dedent(f"""
        from celery import Celery
        from celery_sagas import Sagas

        app = Celery("report_app", broker="memory://")
        app.conf.update(task_serializer="json", accept_content=["json"],
                        sagas_store="redis://user:{SECRET}@127.0.0.1:6379/1?password={SECRET}")
        sagas = Sagas(app)
    """))
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "report_app", "report"],
        cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sagas_store" in done.stdout
    assert SECRET not in done.stdout + done.stderr


class _ClusterFailingClient:
    """A client whose every call raises what redis-py's cluster client raises on a cross-slot
    script or a topology it cannot resolve (RedisClusterException is not a RedisError)."""

    def register_script(self, text: str) -> Any:
        def call(keys: Any = None, args: Any = None) -> Any:
            raise RedisClusterException("EVALSHA - all keys must map to the same key slot")

        return call

    def hgetall(self, key: str) -> Any:
        raise RedisClusterException(f"Redis Cluster cannot be connected: redis://:{SECRET}@h:1/")

    def info(self, section: str) -> dict[str, int]:
        return {"aof_enabled": 1}  # the persistence check of the first use passes


def test_cluster_exceptions_of_any_primitive_become_store_errors_without_the_password() -> None:
    from celery_sagas.stores.base import Envelope
    from celery_sagas.stores.redis import RedisStore

    store = RedisStore(_ClusterFailingClient())
    with pytest.raises(StoreError) as read:
        store.get("saga", "s-1")
    assert SECRET not in str(read.value) and "cannot be connected" in str(read.value)
    with pytest.raises(StoreError, match="same key slot"):
        store.create(Envelope("saga", "s-1", 1, "running", 1, "{}"))
