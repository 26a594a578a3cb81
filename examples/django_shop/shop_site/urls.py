"""The shop's JSON API, the admin (its login guards the operator UI), and the operator UI."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from orders import views

from celery_sagas.contrib.django.ui import operator_ui_urls

urlpatterns = [
    path("orders/", views.create_order, name="create-order"),
    path("orders/<str:order_id>", views.show_order, name="show-order"),
    path("admin/", admin.site.urls),
    path("ops/sagas/", include(operator_ui_urls())),  # staff only (pip install celery-sagas[web])
]
