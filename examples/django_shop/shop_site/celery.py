"""The Celery app and its sagas, configured from the Django settings.

``celery -A shop_site worker`` runs the steps; ``celery -A shop_site beat`` sends the sweeps;
``celery -A shop_site sagas list`` shows the sagas.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_sagas.contrib.django import configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_site.settings")

app = Celery("shop_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
sagas = configure(app)  # settings.SAGAS: the store is the SQL store on the default database
app.autodiscover_tasks()
