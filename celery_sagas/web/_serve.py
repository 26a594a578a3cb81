"""Serve the UI with Werkzeug's threaded server (what ``celery sagas web`` runs)."""

from __future__ import annotations

import logging

from flask import Flask
from werkzeug.serving import run_simple

__all__ = ["serve"]

logger = logging.getLogger("celery_sagas.web")


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8025) -> None:
    """Serve ``app`` on ``host:port`` until interrupted (threaded, no reloader or debugger)."""
    logger.info("celery-sagas web UI on http://%s:%d/", host, port)
    run_simple(host, port, app, threaded=True, use_reloader=False, use_debugger=False)
