"""celery_sagas: durable sagas for Celery."""

from __future__ import annotations

from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .stores import MemoryStore, open_store

__all__ = sorted([*_errors_all, "MemoryStore", "open_store"])
__version__ = "0.1.0"
