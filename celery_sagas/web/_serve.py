"""Serve the UI with Werkzeug's threaded server (what ``celery sagas web`` runs)."""

from __future__ import annotations

import logging

from flask import Flask
from werkzeug.serving import WSGIRequestHandler, run_simple

__all__ = ["SERVER", "Handler", "serve"]

logger = logging.getLogger("celery_sagas.web")
SERVER = "celery-sagas"


class Handler(WSGIRequestHandler):
    """Werkzeug's handler, naming no server or Python version in ``Server``."""

    def version_string(self) -> str:
        """The ``Server`` header: the product, no version."""
        return SERVER


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8025) -> None:
    """Serve ``app`` on ``host:port`` until interrupted (threaded, no reloader or debugger);
    actions, refusals and failed logins are logged to stderr at INFO unless logging is set up."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.info("celery-sagas web UI on http://%s:%d/", host, port)
    run_simple(host, port, app, threaded=True, use_reloader=False, use_debugger=False,
               request_handler=Handler)
