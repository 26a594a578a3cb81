"""Settings of the shop example: PostgreSQL for the shop and its sagas, Redis as the broker.

Environment: SHOP_DB_NAME, SHOP_DB_HOST, SHOP_DB_USER, SHOP_DB_PASSWORD (the database),
SHOP_BROKER (the broker URL), SHOP_QUEUE (the queue the steps use; tests pick a fresh one).
"""

from __future__ import annotations

import os
import uuid

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "django-shop-example-not-a-secret")
DEBUG = os.environ.get("SHOP_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
RUN_ID = uuid.uuid4().hex[:10]  # this process's: a fresh test database and queue per test run

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_sagas.contrib.django",  # its migration creates the saga tables
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "shop_site.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
LOGIN_URL = "/admin/login/"
STATIC_URL = "static/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_DB_NAME", "django_shop"),
        "USER": os.environ.get("SHOP_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("SHOP_DB_PASSWORD", ""),
        "HOST": os.environ.get("SHOP_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("SHOP_DB_PORT", "5432"),
        "TEST": {"NAME": f"test_django_shop_{RUN_ID}"},
    },
}

# Celery, read with namespace="CELERY" (shop_site/celery.py).
CELERY_BROKER_URL = os.environ.get("SHOP_BROKER", "redis://127.0.0.1:6379/10")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SHOP_QUEUE", "django-shop")
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# The sagas: the SQL store on the default database, swept every 5 seconds by beat.
SAGAS = {"store": "django://default", "sweep_interval": 5.0}

TEST_RUNNER = "shop_site.testing.WorkerTestRunner"
