"""The Django project of the shop example; its Celery app loads with Django (Celery's advice)."""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
