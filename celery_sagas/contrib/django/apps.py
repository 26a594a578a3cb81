"""The Django app: add ``"celery_sagas.contrib.django"`` to ``INSTALLED_APPS`` for the
migration that creates the saga tables."""

from __future__ import annotations

from django.apps import AppConfig


class SagasConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    """celery_sagas in a Django project (app label ``celery_sagas``)."""

    name = "celery_sagas.contrib.django"
    label = "celery_sagas"
    verbose_name = "Celery sagas"
