"""Django configured once for the contrib tests: a SQLite file as ``default`` (auth, sessions
and the saga tables, migrated here), a second SQLite file ``other`` for the migration round
trip, and the shared PostgreSQL test database as ``pg`` (never migrated: tests make and drop
their own saga tables there, under a unique prefix)."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import django
import pytest
from django.conf import settings
from sqlalchemy.engine import make_url

from tests.conftest import POSTGRES_URL

TABLE_PREFIX = "t" + uuid.uuid4().hex[:10] + "_"


def _configure() -> None:
    if settings.configured:
        return
    folder = Path(tempfile.mkdtemp(prefix="sagas-django-"))
    pg = make_url(POSTGRES_URL)
    settings.configure(
        SECRET_KEY="tests-only-" + uuid.uuid4().hex,
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions", "celery_sagas.contrib.django"],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.middleware.csrf.CsrfViewMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware"],
        ROOT_URLCONF="tests.contrib.urls",
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "default.db")},
            "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "other.db")},
            "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": pg.database,
                   "USER": pg.username or "", "PASSWORD": pg.password or "",
                   "HOST": pg.host or "", "PORT": str(pg.port or "")},
        },
        SAGAS={"store": "django://default", "table_prefix": TABLE_PREFIX},
    )
    django.setup()


_configure()


@pytest.fixture(scope="session")
def migrated() -> None:
    """The ``default`` database with every migration applied (the saga tables included)."""
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0)
