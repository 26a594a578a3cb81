"""Integrations with other frameworks: ``celery_sagas.contrib.django`` (docs/django.md)."""
